// src/cuda/sm90/ws_backend.h: the generic path's warp-specialised 64-head partial kernel
// (decode_partial_ws.cuh, decode_ws.cu). It needs sm_90+ (its 206 KiB of shared memory per block),
// so it lives in the sm90 folder; the generic backend (decode_generic.cu) picks it for HB = 4 calls
// where it can run and launches it through these functions. Host code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_params.cuh"

namespace sparsemla::cuda_generic::ws_kernel {

// Whether the kernel runs on the current device with max_smem bytes of opt-in shared memory (an
// sm_90+ cubin is the one loaded, and core::Tuning::generic_ws); when it does, its shared-memory
// opt-in is made. Once per device (the caller caches it).
bool prepare(int max_smem);

// Grid (T, S, ceil(hb / 4)), 384 threads, on `stream`.
void launch(dim3 grid, cudaStream_t stream, const cuda::DecodeKernelParams& p);

// Selfcheck (numerics_selfcheck.h): counts the scale words whose rows the kernel's own fast-path
// predicate accepts (count must be zeroed on `stream` first).
void rows_fast_count(const uint2* words, int64_t n, uint32_t* count, cudaStream_t stream);

}  // namespace sparsemla::cuda_generic::ws_kernel
