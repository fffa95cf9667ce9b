// src/cpu/writer_common.h: pieces shared by the CPU cache writers (CONTRACT 3).
//
// The row encoder (quantise NoPE, store RoPE as bf16) is inline here. The compressor's pooling and
// RMSNorm are defined once, in compressor.cpp, and used by both the single-pass and the two-stage
// form and by the indexer compressor, so every form runs the same float operations in the same
// order and their rows are byte-identical.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "sparsemla/format.h"
#include "sparsemla/numerics.h"
#include "sparsemla/writer.h"

#if defined(SPARSEMLA_HAVE_OPENMP)
#define SPARSEMLA_OMP_PARALLEL_FOR _Pragma("omp parallel for schedule(dynamic, 4)")
#else
#define SPARSEMLA_OMP_PARALLEL_FOR
#endif

namespace sparsemla::cpu::detail {

inline constexpr int kRopePairs = 32;  // 64 RoPE dims = 32 GPT-J pairs

// Row `pos` of the cos/sin table: [cos x32 | sin x32].
inline const float* rope_row(const RopeTable& rope, int64_t pos) {
  return rope.data + pos * rope.row_stride;
}

// Forward-rotates the 32 interleaved pairs of x[0..64) in fp32 (CONTRACT 1).
inline void rotate_pairs(float* x, const float* cos_sin) {
  for (int k = 0; k < kRopePairs; ++k) {
    rope_forward_pair(x[2 * k], x[2 * k + 1], cos_sin[k], cos_sin[kRopePairs + k]);
  }
}

// The bf16 stored for a rotated RoPE value; sanitising mode turns NaN into +0 (CONTRACT 5).
inline bf16_bits rope_to_bf16(float v, bool sanitise) {
  return (sanitise && std::isnan(v)) ? bf16_bits{0} : float_to_bf16(v);
}

inline void store_bf16_le(uint8_t* dst, bf16_bits v) {
  dst[0] = static_cast<uint8_t>(v & 0xFF);
  dst[1] = static_cast<uint8_t>(v >> 8);
}

// Encodes one fp8_ds_mla row: `nope` holds 448 bf16-exact values, `rope` 64 rotated fp32 values.
// Writes the 576 data bytes at `data` and the 8 scale bytes at `scale` (CONTRACT 2.1, 2.3).
inline void encode_mla_row(const float* nope, const float* rope, bool sanitise, uint8_t* data,
                           uint8_t* scale) {
  const int code_max = sanitise ? kCodeMaxSanitising : kCodeMaxLegacy;
  for (int t = 0; t < Fp8DsMla::kNumTiles; ++t) {
    const int off = t * Fp8DsMla::kTileDims;
    const int e = quantize_block(nope + off, Fp8DsMla::kTileDims, data + off);
    scale[t] = quant_code(e, code_max);
  }
  scale[Fp8DsMla::kPadByte] = 0;
  for (int d = 0; d < Fp8DsMla::kRopeDims; ++d) {
    store_bf16_le(data + Fp8DsMla::kRopeOffset + 2 * d, rope_to_bf16(rope[d], sanitise));
  }
}

// ---- compressor state and pooling (defined in compressor.cpp)
// ------------------------------------

// Reads state rows of one request through the state block table (CONTRACT 3.2).
struct StateRows {
  const float* base = nullptr;
  int32_t block_size = 1;
  int64_t block_stride = 0;  // elements
  int64_t row_stride = 0;    // elements
  const int32_t* table = nullptr;
  int64_t table_stride = 0;  // elements between table rows

  // The state row of position pos >= 0 of request req.
  const float* row(int32_t req, int64_t pos) const {
    const int32_t block = table[req * table_stride + pos / block_size];
    return base + block * block_stride + (pos % block_size) * row_stride;
  }
};

// The geometry of one pooled entry: `ratio` rows per entry, overlap (ratio 4) doubles the window to
// 2*ratio rows whose older half reads columns [0, head_dim) and current half [head_dim,
// 2*head_dim).
struct PoolShape {
  int32_t ratio = 4;
  int32_t head_dim = 512;
  bool overlap = true;
  int64_t width() const { return (overlap ? 2 : 1) * int64_t{head_dim}; }  // W
};

// Pools channels [c_begin, c_end) of the entry completed by position `pos` of request `req` into
// out[c_begin..c_end): per channel softmax over the window's rows (max-subtracted, fp32) times kv.
// Rows of positions < 0 are never read (score -inf, kv 0). The result of a channel does not depend
// on the channel range, so any column tiling gives the same bits.
void pool_channels(const StateRows& rows, const PoolShape& shape, int32_t req, int64_t pos,
                   int c_begin, int c_end, float* out);

// RMSNorm in place, fp32: var = sum(c*c)/n, c = (c * (1/sqrt(var + eps))) * w.
void rms_norm_inplace(float* c, int n, const float* weight, float eps);

// True when the token completes an entry that is stored: state slot >= 0, (pos+1) % r == 0,
// output slot >= 0.
inline bool stores_entry(int64_t state_slot, int64_t pos, int64_t out_slot, int32_t ratio) {
  return state_slot >= 0 && out_slot >= 0 && pos >= 0 && pos % ratio == ratio - 1;
}

// Channel tile of the two-stage form's stage 1.
inline constexpr int kPoolTile = 64;

// Pools and finishes every entry completed by the call's tokens, for the KV compressor
// (head 512) and the indexer compressor (head 128) alike. scratch == nullptr: single pass, one work
// item per token. Otherwise two stages: (token, 64-column tile) items pool into scratch [N, head],
// then one item per token finishes from its scratch row. Both run the same pool_channels
// arithmetic per column, so their rows are byte-identical. `stores(i)` says whether token i
// completes an entry; `finish(i, c)` normalises, rotates, quantises and stores pooled row c.
template <int kHead, class Params, class Stores, class Finish>
void pool_and_finish(const Params& p, const StateRows& rows, const PoolShape& shape, float* scratch,
                     Stores stores, Finish finish) {
  if (scratch == nullptr) {
    SPARSEMLA_OMP_PARALLEL_FOR
    for (int64_t i = 0; i < p.num_tokens; ++i) {
      if (!stores(i)) continue;
      float c[kHead];
      pool_channels(rows, shape, p.request_index[i], p.positions[i], 0, kHead, c);
      finish(i, c);
    }
    return;
  }
  constexpr int kTiles = kHead / kPoolTile;
  SPARSEMLA_OMP_PARALLEL_FOR
  for (int64_t item = 0; item < p.num_tokens * kTiles; ++item) {
    const int64_t i = item / kTiles;
    if (!stores(i)) continue;  // rows of tokens that store nothing stay untouched
    const int c0 = static_cast<int>(item % kTiles) * kPoolTile;
    pool_channels(rows, shape, p.request_index[i], p.positions[i], c0, c0 + kPoolTile,
                  scratch + i * kHead);
  }
  SPARSEMLA_OMP_PARALLEL_FOR
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    if (!stores(i)) continue;
    float c[kHead];
    std::copy_n(scratch + i * kHead, kHead, c);
    finish(i, c);
  }
}

}  // namespace sparsemla::cpu::detail
