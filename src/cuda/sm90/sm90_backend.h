// src/cuda/sm90/sm90_backend.h: the Hopper-specialised CUDA decode (sm_90a; SPEC 7 picks it).
// Arguments are validated by dispatch; every pointer is a device pointer; caches are 16-byte
// aligned (the architecture gate's precondition); everything runs on the caller's stream without
// allocation or host synchronisation.
#pragma once

#include <cstdint>

#include "sparsemla/decode.h"

namespace sparsemla::cuda_sm90 {

// Whether this build holds the sm_90a kernels and the current device runs them (cc 9.0; the
// sm_90a cubin is the one loaded). Cached per device after the first call.
bool have_sm90a_kernels();

// Split-K decode with S = num_splits (the caller plans it with plan_sm90_tuned): the warp-
// specialised wgmma kernel (grid T x S x ceil(H / 64)), then the combine when S > 1. The extra
// cache's scrub is skipped exactly when the provenance gate (SPEC 5) holds for the call. Same
// workspace layout as the generic path.
void sparse_decode(const DecodeParams& p, int32_t num_splits, void* workspace);

}  // namespace sparsemla::cuda_sm90
