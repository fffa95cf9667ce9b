// src/cpu/row_decode.h: host-only decoding of one fp8_ds_mla row (CONTRACT 2.1) for the CPU decode.
//
// Internal to the decode backend (the public dequantize_row lives in src/cpu/dequant.cpp); both
// follow CONTRACT 2.1 and the codecs of numerics.h, so they agree value for value.
#pragma once

#include <array>
#include <cstdint>

#include "sparsemla/format.h"
#include "sparsemla/numerics.h"

namespace sparsemla::cpu {

// The 256 e4m3fn values (NaN for 0x7F/0xFF), built once from numerics.h's codec.
inline const std::array<float, 256>& e4m3_value_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = e4m3_to_float(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

// Decodes the 512 values of a valid slot in fp32. NoPE: e4m3 * 2^(code - 127), exact in fp32
// (the smallest product, 2^-9 * 2^-127, is above the fp32 subnormal step 2^-149); code 255 is +inf,
// so a zero byte there gives NaN. RoPE: the stored bf16 values. scrub: every NaN becomes +0
// (CONTRACT 5), +-inf is kept.
inline void decode_row_f32(const CacheView& cache, int64_t slot, bool scrub, float* out512) {
  const uint8_t* data = cache.base + mla_data_offset(slot, cache.block_size, cache.block_stride);
  const uint8_t* codes = cache.base + mla_scale_offset(slot, cache.block_size, cache.block_stride);
  const std::array<float, 256>& e4m3 = e4m3_value_table();
  for (int tile = 0; tile < Fp8DsMla::kNumTiles; ++tile) {
    const float scale = ue8m0_to_float(codes[tile]);
    const int d0 = tile * Fp8DsMla::kTileDims;
    for (int d = d0; d < d0 + Fp8DsMla::kTileDims; ++d) out512[d] = e4m3[data[d]] * scale;
  }
  const uint8_t* rope = data + Fp8DsMla::kRopeOffset;
  for (int k = 0; k < Fp8DsMla::kRopeDims; ++k) {
    const bf16_bits b = static_cast<bf16_bits>(rope[2 * k] | (rope[2 * k + 1] << 8));  // LE
    out512[Fp8DsMla::kNopeDims + k] = bf16_to_float(b);
  }
  if (scrub) {
    for (int d = 0; d < Fp8DsMla::kHeadDim; ++d) {
      out512[d] = out512[d] != out512[d] ? 0.0f : out512[d];  // NaN -> +0 (branch-free)
    }
  }
}

}  // namespace sparsemla::cpu
