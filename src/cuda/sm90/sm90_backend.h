// src/cuda/sm90/sm90_backend.h: the Hopper-specialised CUDA decode (sm_90a; CONTRACT 7 picks it).
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

// Split-K decode with S = plan.num_splits (planned with plan_sm90_tuned): the warp-specialised
// wgmma kernel (grid T x S x ceil(H / 64)), then the combine when S > 1 unless
// plan.fused_combine (the row's splits combine in their thread-block cluster). The extra
// cache's scrub is skipped exactly when the provenance gate (CONTRACT 5) holds for the call. Same
// workspace layout as the generic path.
void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace);

// Whether a (T, H, S) call combines in-kernel (S = 2 clusters that fit the current device at
// once; never for deterministic calls, whose bits may not depend on T). DecodePlan field.
bool plan_fused_combine(int64_t num_tokens, int32_t num_heads, int32_t num_splits,
                        bool deterministic);

}  // namespace sparsemla::cuda_sm90
