// src/cuda/sm90/cluster.cuh: thread-block cluster primitives of sm_90 (PTX ISA 8.0): the CTA's rank
// in its cluster, the cluster-wide barrier, and loads from a peer CTA's shared memory (distributed
// shared memory). Used by the fused combine of the sm90 decode (docs/SM90.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sparsemla::cuda_sm90 {

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster; the writes to shared memory before it are visible to
// the peers' loads after it. Warp-uniform (.aligned).
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// The shared::cluster address of `p` (this CTA's shared memory) in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t peer_address(const void* p, uint32_t rank) {
  uint32_t a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(a)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))), "r"(rank));
  return a;
}

__device__ __forceinline__ float load_peer_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t load_peer_u32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
  return v;
}

__device__ __forceinline__ float4 load_peer_f32x4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(a)
               : "memory");
  return v;
}

}  // namespace sparsemla::cuda_sm90
