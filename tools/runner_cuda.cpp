// GPU side of `sparsemla run`: mirrors a host Problem to device memory and times the decode with
// CUDA events (warm-up, then `repeat` timed calls, median reported).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "runner.h"

namespace sparsemla::tools {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("run: CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// Owns device copies of host vectors; frees them on scope exit.
class DeviceArena {
 public:
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* copy(const std::vector<T>& v) {
    T* d = alloc<T>(v.size());
    check(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
    return d;
  }
  template <typename T>
  T* alloc(size_t n) {
    void* d = nullptr;
    check(cudaMalloc(&d, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    ptrs_.push_back(d);
    return static_cast<T*>(d);
  }

 private:
  std::vector<void*> ptrs_;
};

DecodeParams mirror(const Problem& pb, DeviceArena& a) {
  DecodeParams p = pb.params();
  p.q = a.copy(pb.q);
  p.main_cache.base = a.copy(pb.window_cache.bytes);
  p.main_list.indices = a.copy(pb.main_list.indices);
  p.main_list.indptr = a.copy(pb.main_list.indptr);
  if (p.has_extra) {
    p.extra_cache.base = a.copy(pb.compressed_cache.bytes);
    p.extra_list.indices = a.copy(pb.extra_list.indices);
    p.extra_list.indptr = a.copy(pb.extra_list.indptr);
  }
  p.sink = a.copy(pb.sink);
  p.positions = a.copy(pb.positions);
  p.rope.data = a.copy(pb.rope);
  return p;
}

}  // namespace

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

DecodeRun run_decode_cuda(const Problem& pb, Path path, int32_t splits, int32_t repeat) {
  DeviceArena arena;
  DecodeParams p = mirror(pb, arena);
  const size_t out_elems = static_cast<size_t>(pb.tokens) * pb.heads * 512;
  p.out = arena.alloc<bf16_bits>(out_elems);
  check(cudaMemset(p.out, 0xFF, out_elems * 2), "poison out");  // NaN bf16
  p.path = path;
  p.num_splits = splits;
  DecodeRun r;
  r.splits = decode_num_splits(p);
  p.num_splits = r.splits;
  const size_t ws = decode_workspace_size(pb.tokens, pb.heads, r.splits);
  void* workspace = arena.alloc<uint8_t>(ws);
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  p.stream = stream;
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  sparse_decode(p, workspace, ws);  // warm-up
  std::vector<double> times;
  for (int32_t i = 0; i < repeat; ++i) {
    check(cudaEventRecord(e0, stream), "record");
    sparse_decode(p, workspace, ws);
    check(cudaEventRecord(e1, stream), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    times.push_back(ms * 1e-3);
  }
  std::sort(times.begin(), times.end());
  r.median_seconds = times[times.size() / 2];
  r.min_seconds = times.front();
  r.max_seconds = times.back();
  r.path = path == Path::Auto ? Path::CudaGeneric : path;
  r.out.resize(out_elems);
  check(cudaMemcpy(r.out.data(), p.out, out_elems * 2, cudaMemcpyDeviceToHost), "copy out");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  return r;
}

}  // namespace sparsemla::tools
