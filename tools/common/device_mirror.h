// tools/common/device_mirror.h: device copies of a host Problem (decode) or IndexerProblem and the
// CUDA helpers the tools share (stream, events, graph capture). CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "bench_timer.h"
#include "indexer_problem.h"
#include "problem.h"

namespace sparsemla::tools {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// A non-blocking stream (the library's calls take it as `stream`).
struct CudaStream {
  cudaStream_t s = nullptr;
  CudaStream() { cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"); }
  ~CudaStream() { cudaStreamDestroy(s); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
};

// A start/stop event pair; seconds() waits for stop.
struct CudaEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  CudaEvents() {
    cuda_check(cudaEventCreate(&start), "event");
    cuda_check(cudaEventCreate(&stop), "event");
  }
  ~CudaEvents() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  CudaEvents(const CudaEvents&) = delete;
  CudaEvents& operator=(const CudaEvents&) = delete;
  double seconds() const {
    cuda_check(cudaEventSynchronize(stop), "sync");
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    return ms * 1e-3;
  }
};

// One timed call i on `s`: flush_bytes written to `flush` first (a cold L2; fill byte i), then CUDA
// events around `launch` alone. Seconds (waits for the call).
inline double time_cold_call(cudaStream_t s, CudaEvents& ev, uint8_t* flush, int64_t flush_bytes,
                             int32_t i, const std::function<void()>& launch) {
  if (flush_bytes > 0) {
    cuda_check(cudaMemsetAsync(flush, i & 0xFF, static_cast<size_t>(flush_bytes), s), "flush");
  }
  cuda_check(cudaEventRecord(ev.start, s), "record");
  launch();
  cuda_check(cudaEventRecord(ev.stop, s), "record");
  return ev.seconds();
}

// Captures what `enqueue` launches on `s` into an executable graph (caller destroys it).
inline cudaGraphExec_t capture_graph(cudaStream_t s, const std::function<void()>& enqueue) {
  cudaGraph_t g = nullptr;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(s, &g);  // leave the stream usable; the error is the caller's
    if (g != nullptr) cudaGraphDestroy(g);
    throw;
  }
  cuda_check(cudaStreamEndCapture(s, &g), "end capture");
  cudaGraphExec_t exec;
  cuda_check(cudaGraphInstantiate(&exec, g, 0), "instantiate");
  cudaGraphDestroy(g);
  return exec;
}

// Median seconds of o.reps cold replays (after o.warmup untimed ones) of the graph captured from
// `enqueue` on `s`, each timed with time_cold_call (o.flush_bytes written to `flush` first).
inline double median_cold_graph_seconds(cudaStream_t s, const std::function<void()>& enqueue,
                                        const TimingOptions& o, uint8_t* flush) {
  cudaGraphExec_t exec = capture_graph(s, enqueue);
  CudaEvents ev;
  std::vector<double> sec;
  for (int32_t i = 0; i < o.warmup + o.reps; ++i) {
    const double t = time_cold_call(s, ev, flush, o.flush_bytes, i,
                                    [&] { cuda_check(cudaGraphLaunch(exec, s), "graph launch"); });
    if (i >= o.warmup) sec.push_back(t);
  }
  cudaGraphExecDestroy(exec);
  std::sort(sec.begin(), sec.end());
  return sec[sec.size() / 2];
}

// Owns device allocations; frees them on scope exit.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* copy(const std::vector<T>& v) {
    T* d = alloc<T>(v.size());
    cuda_check(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
    return d;
  }
  template <typename T>
  T* alloc(size_t n) {
    void* d = nullptr;
    cuda_check(cudaMalloc(&d, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    ptrs_.push_back(d);
    return static_cast<T*>(d);
  }

 private:
  std::vector<void*> ptrs_;
};

// DecodeParams whose pointers are device copies of the problem's host buffers (out not set).
inline DecodeParams mirror_problem(const Problem& pb, DeviceArena& a) {
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

// IndexerParams whose inputs are device copies of the problem's host buffers (q, w, keys, table,
// row_request, n); outputs (indices, lengths, scores) left null and path set by the caller.
inline IndexerParams mirror_indexer_problem(IndexerProblem& pb, DeviceArena& a) {
  IndexerParams p = pb.params(Path::CudaGeneric);
  p.q = a.copy(pb.q);
  p.w = a.copy(pb.w);
  p.cache.base = a.copy(pb.cache);
  p.block_table = a.copy(pb.table);
  p.row_request = a.copy(pb.row_request);
  p.num_candidates = a.copy(pb.n);
  p.indices = nullptr;
  p.lengths = nullptr;
  p.scores = nullptr;
  return p;
}

}  // namespace sparsemla::tools
