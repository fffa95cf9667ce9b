// src/cuda/sm90/decode_ws.cu: the warp-specialised 64-head partial kernel of the generic path
// (decode_partial_ws.cuh; roles and barriers in docs/GENERIC.md), its launch, its fast-path
// selfcheck and its debug timeline. Compiled for every target; the body exists for sm_90+ only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/tuning.h"
#include "cuda/common/device_info.h"
#include "cuda/sm90/decode_partial_ws.cuh"
#include "cuda/sm90/ws_backend.h"

namespace sparsemla::cuda_generic {
namespace {

// 384 threads, at most 168 registers each. The body is compiled for sm_90+ only (the devices with
// its 206 KiB of shared memory per block); the host launches it only when the loaded cubin is one
// of those (ws_kernel::prepare).
__global__ void __launch_bounds__(partial_ws::kThreads, 1)
    decode_partial_ws_kernel(const __grid_constant__ partial::PartialParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem_raw[];
  partial_ws::partial_ws_body(p, smem_raw);
#endif
}

// The kernel's own predicate on rows of zero data bytes with the given scale words.
__global__ void rows9_fast_count_kernel(const uint2* words, int64_t n, uint32_t* count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  partial_ws::Rows9 rc{};
  rc.scale = words[i];
  if (partial_ws::rows9_fast(rc)) atomicAdd(count, 1u);
}

}  // namespace

namespace ws_kernel {

bool prepare(int max_smem) {
  cudaFuncAttributes attr{};
  cuda::check_cuda(cudaFuncGetAttributes(&attr, decode_partial_ws_kernel),
                   "cudaFuncGetAttributes(decode_partial_ws_kernel)");
  const bool usable = attr.binaryVersion >= 90 && partial_ws::WsSmem::kBytes <= max_smem &&
                      core::tuning().generic_ws;
  if (usable) {
    cuda::check_cuda(
        cudaFuncSetAttribute(decode_partial_ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             partial_ws::WsSmem::kBytes),
        "cudaFuncSetAttribute(decode_partial_ws_kernel)");
  }
  return usable;
}

void launch(dim3 grid, cudaStream_t stream, const cuda::DecodeKernelParams& p) {
  decode_partial_ws_kernel<<<grid, partial_ws::kThreads, partial_ws::WsSmem::kBytes, stream>>>(p);
}

void rows_fast_count(const uint2* words, int64_t n, uint32_t* count, cudaStream_t stream) {
  rows9_fast_count_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(words, n,
                                                                                      count);
}

}  // namespace ws_kernel

#ifdef SPARSEMLA_TIMELINE
// Debug timeline of the warp-specialised kernel (cuda/common/timeline.cuh; generic_backend.h).
void timeline_clear(cudaStream_t stream) {
  cuda::timeline_clear_symbol(partial_ws::g_timeline, stream);
}
void timeline_read(unsigned long long* out) {
  cuda::timeline_read_symbol(partial_ws::g_timeline, out);
}
#endif

}  // namespace sparsemla::cuda_generic
