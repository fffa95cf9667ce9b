// CPU indexer-key compressor (CONTRACT 3.2, last paragraph): the KV compressor with head 128,
// ratio 4 with overlap (W = 256), RoPE dims 64..127 rotated before one 128-wide quantiser block,
// fp32 scale, NORMAL page layout.
#include <algorithm>
#include <cstring>

#include "cpu/cpu_backend.h"
#include "cpu/writer_common.h"

namespace sparsemla::cpu {

namespace {

using detail::PoolShape;
using detail::StateRows;

constexpr int kHead = IndexerFp8::kHeadDim;  // 128
constexpr int kRatio = 4;
constexpr PoolShape kShape{kRatio, kHead, true};

StateRows state_rows(const IndexerCompressorParams& p) {
  return {p.state.base,       p.state.block_size,  p.state.block_stride,
          p.state.row_stride, p.state_block_table, p.state_table_stride};
}

bool stores_entry(const IndexerCompressorParams& p, int64_t i) {
  return detail::stores_entry(p.state_slots[i], p.positions[i], p.out_slots[i], kRatio);
}

// RMSNorm, RoPE on dims 64..127 at the window start, bf16 rounding, quantise, store (NORMAL).
void finish_entry(const IndexerCompressorParams& p, int64_t i, float* c) {
  detail::rms_norm_inplace(c, kHead, p.norm_weight, p.norm_eps);
  const int64_t window_start = (p.positions[i] / kRatio) * kRatio;
  detail::rotate_pairs(c + IndexerFp8::kNopeDims, detail::rope_row(p.rope, window_start));
  float x[kHead];
  for (int d = 0; d < kHead; ++d) {
    const bool rope_dim = d >= IndexerFp8::kNopeDims;
    x[d] = (p.sanitise && rope_dim && std::isnan(c[d])) ? 0.0f : round_to_bf16(c[d]);
  }
  const int64_t slot = p.out_slots[i];
  const int32_t bs = p.cache.block_size;
  const int32_t row = static_cast<int32_t>(slot % bs);
  uint8_t* page = p.cache.base + (slot / bs) * p.cache.block_stride;
  const int e =
      quantize_block(x, kHead, page + indexer_value_offset_in_page(p.cache.layout, row, 0));
  const float scale = indexer_scale_of_exponent(e);
  std::memcpy(page + indexer_scale_offset_in_page(bs, row), &scale, sizeof(scale));
}

}  // namespace

void compress_indexer(const IndexerCompressorParams& p) {
  detail::pool_and_finish<kHead>(
      p, state_rows(p), kShape, p.scratch, [&](int64_t i) { return stores_entry(p, i); },
      [&](int64_t i, float* c) { finish_entry(p, i, c); });
}

}  // namespace sparsemla::cpu
