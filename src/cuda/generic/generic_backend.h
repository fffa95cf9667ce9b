// src/cuda/generic/generic_backend.h: the portable CUDA decode (sm_80+). Arguments are validated
// by dispatch; every pointer is a device pointer; everything runs on the caller's stream without
// allocation or host synchronisation.
#pragma once

#include <cstdint>

#include "sparsemla/decode.h"

namespace sparsemla::cuda_generic {

// Split-K decode with S = plan.num_splits (1..65535): partial kernel (grid T x S x ceil(hb / HB),
// HB = 4, 2 or 1 head blocks of 16 per CTA: plan.head_blocks_per_cta), then the combine when S > 1
// (with programmatic dependent launch on sm_90+). workspace: partials m, l fp32 [T, S, H] and acc
// fp32 [T, S, H, 512] (decode_workspace_size bytes, 8-byte aligned); unused (may be null) when S
// == 1. With plan.adaptive_splits the rows run the active-split rule of CONTRACT 4.5
// (plan.one_wave). A row's output bits do not depend on HB. SPARSEMLA_GENERIC_HB=1|2|4 forces HB
// (tests and measurement; ignored when it does not fit the device).
void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace);

// Head blocks per CTA (1, 2 or 4) of a (T, S, H) call on the current device with CU = sms: the
// most whose grid still covers 3/4 of the SMs and fits its shared memory (DecodePlan field).
int32_t plan_head_blocks_per_cta(int64_t num_tokens, int32_t num_splits, int32_t num_heads,
                                 int32_t sms);

// Standalone inverse RoPE on a bf16 [T, H, 512] tensor in place (dims 448..511).
void inverse_rope_inplace(bf16_bits* x, int64_t num_tokens, int32_t num_heads, int64_t stride_token,
                          int64_t stride_head, const int64_t* positions, const RopeTable& rope,
                          void* stream);

}  // namespace sparsemla::cuda_generic
