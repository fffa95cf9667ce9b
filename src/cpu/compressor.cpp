// CPU compressor state writer and KV compressor (CONTRACT 3.2), single-pass and two-stage.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/cpu_backend.h"
#include "cpu/writer_common.h"

namespace sparsemla::cpu {

namespace detail {

namespace {
constexpr int kMaxChannels = Fp8DsMla::kHeadDim;  // callers pool at most 512 channels at once
}  // namespace

void pool_channels(const StateRows& rows, const PoolShape& shape, int32_t req, int64_t pos,
                   int c_begin, int c_end, float* out) {
  const int n = c_end - c_begin;
  const int num_rows = (shape.overlap ? 2 : 1) * shape.ratio;
  const int64_t first = pos - num_rows + 1;
  const int64_t score_off = shape.width();
  // Column of channel c_begin in row t: with overlap the older `ratio` rows read [0, D) and the
  // current ones [D, 2D); without overlap every row reads its only half [0, D).
  auto column = [&](int t) {
    return c_begin + ((shape.overlap && t >= shape.ratio) ? shape.head_dim : 0);
  };
  float max_score[kMaxChannels], denom[kMaxChannels], acc[kMaxChannels];
  std::fill_n(max_score, n, -std::numeric_limits<float>::infinity());
  std::fill_n(denom, n, 0.0f);
  std::fill_n(acc, n, 0.0f);
  for (int t = 0; t < num_rows; ++t) {
    if (first + t < 0) continue;  // score -inf: weight exactly 0
    const float* score = rows.row(req, first + t) + score_off + column(t);
    for (int c = 0; c < n; ++c) max_score[c] = score[c] > max_score[c] ? score[c] : max_score[c];
  }
  for (int t = 0; t < num_rows; ++t) {
    if (first + t < 0) continue;
    const float* row = rows.row(req, first + t);
    const float* kv = row + column(t);
    const float* score = row + score_off + column(t);
    for (int c = 0; c < n; ++c) {
      // exp_portable: the same bits on host and device, so CPU and GPU rows are byte-identical.
      const float w = exp_portable(score[c] - max_score[c]);
      denom[c] += w;
      acc[c] += w * kv[c];
    }
  }
  for (int c = 0; c < n; ++c) out[c_begin + c] = acc[c] / denom[c];
}

void rms_norm_inplace(float* c, int n, const float* weight, float eps) {
  float sum_sq = 0.0f;
  for (int d = 0; d < n; ++d) sum_sq += c[d] * c[d];
  const float var = sum_sq / static_cast<float>(n);
  const float inv_rms = 1.0f / std::sqrt(var + eps);
  for (int d = 0; d < n; ++d) c[d] = (c[d] * inv_rms) * weight[d];
}

}  // namespace detail

namespace {

using detail::PoolShape;
using detail::StateRows;

constexpr int kHead = Fp8DsMla::kHeadDim;

PoolShape mla_shape(int32_t ratio) {
  return {ratio, kHead, ratio == 4};
}

StateRows state_rows(const CompressorParams& p) {
  return {p.state.base,       p.state.block_size,  p.state.block_stride,
          p.state.row_stride, p.state_block_table, p.state_table_stride};
}

bool stores_entry(const CompressorParams& p, int64_t i) {
  return detail::stores_entry(p.state_slots[i], p.positions[i], p.out_slots[i], p.ratio);
}

// Stage 2 (and the tail of the single pass): RMSNorm, RoPE at the window start, quantise, store.
// `c` holds the 512 pooled values and is normalised in place.
void finish_entry(const CompressorParams& p, int64_t i, float* c) {
  detail::rms_norm_inplace(c, kHead, p.norm_weight, p.norm_eps);
  float nope[Fp8DsMla::kNopeDims];
  for (int d = 0; d < Fp8DsMla::kNopeDims; ++d) nope[d] = round_to_bf16(c[d]);
  float* rope = c + Fp8DsMla::kNopeDims;  // rotated from the fp32 normed values
  const int64_t window_start = (p.positions[i] / p.ratio) * p.ratio;
  detail::rotate_pairs(rope, detail::rope_row(p.rope, window_start));
  const int64_t slot = p.out_slots[i];
  const int32_t bs = p.cache.block_size;
  detail::encode_mla_row(nope, rope, p.sanitise,
                         p.cache.base + mla_data_offset(slot, bs, p.cache.block_stride),
                         p.cache.base + mla_scale_offset(slot, bs, p.cache.block_stride));
}

}  // namespace

void write_compressor_state(const StateWriterParams& p) {
  const int64_t width = (p.ratio == 4 ? 2 : 1) * int64_t{p.head_dim};  // W = coff * head_dim
  const int32_t bs = p.state.block_size;
  SPARSEMLA_OMP_PARALLEL_FOR
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = p.state_slots[i];
    if (slot < 0) continue;
    float* row =
        p.state.base + (slot / bs) * p.state.block_stride + (slot % bs) * p.state.row_stride;
    const float* kv = p.kv + i * p.kv_stride;
    const float* score = p.score + i * p.score_stride;
    std::copy_n(kv, width, row);
    float* score_dst = row + width;
    if (p.ape == nullptr) {
      std::copy_n(score, width, score_dst);
    } else {
      const float* bias = p.ape + (p.positions[i] % p.ratio) * width;
      for (int64_t j = 0; j < width; ++j) score_dst[j] = score[j] + bias[j];
    }
  }
}

void compress(const CompressorParams& p) {
  detail::pool_and_finish<kHead>(
      p, state_rows(p), mla_shape(p.ratio), p.scratch,
      [&](int64_t i) { return stores_entry(p, i); },
      [&](int64_t i, float* c) { finish_entry(p, i, c); });
}

}  // namespace sparsemla::cpu
