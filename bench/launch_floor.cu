// bench/launch_floor.cu: `sparsemla bench --launch-floor`: what a decode call costs before any
// work, timed exactly like a bench cell (CUDA-graph replay, L2 written cold before each replay,
// events around the replay). Three graphs of empty kernels:
//   one:      1 CTA of 32 threads;
//   sm90:     16 CTAs of 384 threads with the sm90 kernel's 214 KB of dynamic shared memory
//             (its batch-1 grid);
//   sm90+pdl: that, then a 64-CTA x 256-thread kernel launched with programmatic stream
//             serialisation that waits in griddepcontrol.wait (the combine's launch).
// The difference to a B = 1 decode cell is what the decode's own work and latency chain cost.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "bench_timer.h"
#include "device_mirror.h"

namespace sparsemla::tools {

namespace {

constexpr int kSm90Ctas = 16, kSm90Threads = 384, kSm90SmemBytes = 214 * 1024;
constexpr int kCombineCtas = 64, kCombineThreads = 256;

__global__ void empty_kernel(int* sink) {
  if (sink != nullptr && threadIdx.x == 0) *sink = blockIdx.x;  // never taken: sink is null
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__global__ void waiting_kernel(int* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (sink != nullptr && threadIdx.x == 0) *sink = blockIdx.x;
}

void launch_pdl(dim3 grid, dim3 block, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cuda_check(cudaLaunchKernelEx(&cfg, waiting_kernel, static_cast<int*>(nullptr)), "launch");
}

}  // namespace

void print_launch_floor(const TimingOptions& o) {
  DeviceArena arena;
  CudaStream stream;
  uint8_t* flush = arena.alloc<uint8_t>(static_cast<size_t>(std::max<int64_t>(o.flush_bytes, 1)));
  cuda_check(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSm90SmemBytes),
             "smem attribute");
  int* none = nullptr;
  const cudaStream_t s = stream.s;
  const double one = median_cold_graph_seconds(
      s, [&] { empty_kernel<<<1, 32, 0, s>>>(none); }, o, flush);
  const auto sm90 = [&] { empty_kernel<<<kSm90Ctas, kSm90Threads, kSm90SmemBytes, s>>>(none); };
  const double big = median_cold_graph_seconds(s, sm90, o, flush);
  const double pdl = median_cold_graph_seconds(
      s,
      [&] {
        sm90();
        launch_pdl(dim3(kCombineCtas), dim3(kCombineThreads), s);
      },
      o, flush);
  std::printf("launch floor (graph replay, median of %d, %.0f MiB flushed before each):\n", o.reps,
              static_cast<double>(o.flush_bytes) / (1 << 20));
  std::printf("  one empty kernel (1 x 32)                          %8.2f us\n", one * 1e6);
  std::printf("  sm90-shaped empty kernel (%d x %d, %d KB smem)    %8.2f us\n", kSm90Ctas,
              kSm90Threads, kSm90SmemBytes / 1024, big * 1e6);
  std::printf("  + combine-shaped PDL kernel (%d x %d)              %8.2f us\n", kCombineCtas,
              kCombineThreads, pdl * 1e6);
  std::fflush(stdout);
}

}  // namespace sparsemla::tools
