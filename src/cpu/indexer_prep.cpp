// src/cpu/indexer_prep.cpp: the indexer query prep on the CPU (CONTRACT 11.6).
//
// One (t, h) row at a time: rotate dims 64..127 (fp32, rounded to bf16), then the 128-value block
// of the quantiser of CONTRACT 2.3 (exact exponent, RNE e4m3), then the weight fold in the stated
// order. Rows are independent, so the result does not depend on T or the thread count.
#include "cpu/indexer_prep.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "cpu/writer_common.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer.h"

namespace sparsemla::cpu {

namespace {

constexpr int kDim = kIndexerHeadDim;  // 128
constexpr int kRopeStart = 64;         // dims 64..127 are rotated (CONTRACT 3.2, indexer keys)
// 128^-0.5 and 64^-0.5 as fp32 constants: the factors of the weight fold (CONTRACT 11.1).
const float kInvSqrtHeadDim = static_cast<float>(1.0 / std::sqrt(128.0));
constexpr float kInvSqrtHeads = 0.125f;

void prep_row(const IndexerQPrepParams& p, int64_t t, int32_t h, const float* cos_sin) {
  const int64_t H = p.num_heads;
  const int64_t qst = p.q_stride_token != 0 ? p.q_stride_token : H * kDim;
  const int64_t qsh = p.q_stride_head != 0 ? p.q_stride_head : kDim;
  const int64_t ost = p.q_out_stride_token != 0 ? p.q_out_stride_token : H * kDim;
  const int64_t osh = p.q_out_stride_head != 0 ? p.q_out_stride_head : kDim;
  const int64_t wst = p.w_raw_stride != 0 ? p.w_raw_stride : H;
  const int64_t wos = p.w_out_stride != 0 ? p.w_out_stride : H;
  uint8_t* bytes = p.q_out + t * ost + h * osh;
  float* w = p.w_out + t * wos + h;
  if (cos_sin == nullptr) {  // padding row (position < 0)
    std::memset(bytes, 0, kDim);
    *w = 0.0f;
    return;
  }
  const bf16_bits* src = p.q + t * qst + h * qsh;
  float x[kDim];
  for (int d = 0; d < kDim; ++d) x[d] = bf16_to_float(src[d]);
  detail::rotate_pairs(x + kRopeStart, cos_sin);
  for (int d = kRopeStart; d < kDim; ++d) x[d] = round_to_bf16(x[d]);
  const int e = quantize_block(x, kDim, bytes);
  const float w_raw = bf16_to_float(p.w_raw[t * wst + h]);
  *w = ((w_raw * indexer_scale_of_exponent(e)) * kInvSqrtHeadDim) * kInvSqrtHeads;
}

}  // namespace

void indexer_q_prep(const IndexerQPrepParams& p) {
  const int64_t T = p.num_tokens;
  // Positions first: an out-of-table position fails the call before any output is written.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = p.positions[t];
    SPARSEMLA_CHECK_ARG(pos < p.rope.rows, "indexer_q_prep", "positions[" + std::to_string(t) + "]",
                        "< rope.rows = " + std::to_string(p.rope.rows) + " (< 0: padding row)",
                        pos);
  }
  SPARSEMLA_OMP_PARALLEL_FOR
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = p.positions[t];
    const float* cos_sin = pos < 0 ? nullptr : detail::rope_row(p.rope, pos);
    for (int32_t h = 0; h < p.num_heads; ++h) prep_row(p, t, h, cos_sin);
  }
}

}  // namespace sparsemla::cpu
