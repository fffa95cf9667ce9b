// src/cuda/sm90/pipeline.cuh: the Hopper producer/consumer primitives of the sm90 decode (PTX ISA
// 8.0+, sm_90a only): shared-memory mbarriers (arrive, parity wait), the bulk shared -> global
// copy of the partials, named barriers for a subset of the CTA and warpgroup register
// reallocation.
// Compiled to nothing outside sm_90a (the callers are guarded the same way).
#pragma once

#include <cstdint>

#include "cuda/common/decode_common.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace sparsemla::cuda_sm90 {

// One 8-byte mbarrier in shared memory.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(cuda::smem_u32(bar)), "r"(count)
               : "memory");
#endif
}

// Makes the initialised barriers visible to the async proxy (the bulk copies' complete-tx) and to
// the other threads once the following __syncthreads has run.
__device__ __forceinline__ void mbar_init_fence() {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(cuda::smem_u32(bar)) : "memory");
#endif
}

// Blocks until the phase with this parity (0, 1, 0, ... for the barrier's 1st, 2nd, 3rd phase) has
// completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(cuda::smem_u32(bar)),
      "r"(parity)
      : "memory");
#endif
}

// bytes (multiple of 16, both addresses 16-byte aligned) from shared src to global dst, in this
// thread's bulk async-group (bulk_commit, then bulk_wait_read before src may change or the CTA
// exits). The shared-memory writes it reads must be fenced (fence_proxy_async) and synchronised.
__device__ __forceinline__ void bulk_copy_s2g(void* dst, const void* src, uint32_t bytes) {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
               "r"(cuda::smem_u32(src)), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until every bulk copy this thread committed has read its shared-memory source.
__device__ __forceinline__ void bulk_wait_read() {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Arrival on barrier `id` without waiting (the waiting side uses named_barrier_sync).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Warpgroup register reallocation (all 128 threads of the warpgroup execute it). ptxas honours it
// only with a known entry register count: __launch_bounds__(threads, 1).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef SPARSEMLA_SM90A_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

}  // namespace sparsemla::cuda_sm90
