// GPU side of `sparsemla run`: mirrors a host Problem to device memory and times the decode with
// CUDA events (warm-up, then `repeat` timed calls, median reported).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "device_mirror.h"
#include "runner.h"

namespace sparsemla::tools {

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
  DecodeParams p = mirror_problem(pb, arena);
  const size_t out_elems = static_cast<size_t>(pb.tokens) * pb.heads * 512;
  p.out = arena.alloc<bf16_bits>(out_elems);
  cuda_check(cudaMemset(p.out, 0xFF, out_elems * 2), "poison out");  // NaN bf16
  p.path = path;
  p.num_splits = splits;
  DecodeRun r;
  r.splits = decode_num_splits(p);
  p.num_splits = r.splits;
  const size_t ws = decode_workspace_size(pb.tokens, pb.heads, r.splits);
  void* workspace = arena.alloc<uint8_t>(ws);
  cudaStream_t stream;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
  p.stream = stream;
  cudaEvent_t e0, e1;
  cuda_check(cudaEventCreate(&e0), "event");
  cuda_check(cudaEventCreate(&e1), "event");
  sparse_decode(p, workspace, ws);  // warm-up
  std::vector<double> times;
  for (int32_t i = 0; i < repeat; ++i) {
    cuda_check(cudaEventRecord(e0, stream), "record");
    sparse_decode(p, workspace, ws);
    cuda_check(cudaEventRecord(e1, stream), "record");
    cuda_check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    times.push_back(ms * 1e-3);
  }
  std::sort(times.begin(), times.end());
  r.median_seconds = times[times.size() / 2];
  r.min_seconds = times.front();
  r.max_seconds = times.back();
  r.path = path == Path::Auto ? Path::CudaGeneric : path;
  r.out.resize(out_elems);
  cuda_check(cudaMemcpy(r.out.data(), p.out, out_elems * 2, cudaMemcpyDeviceToHost), "copy out");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  return r;
}

}  // namespace sparsemla::tools
