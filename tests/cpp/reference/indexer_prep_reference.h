// tests/cpp/reference/indexer_prep_reference.h: host test data of the indexer query prep (CONTRACT
// 11.6) and an implementation written independently of the library: the exponent found by search
// over powers of two (not from the fp32 bits), e4m3 bytes by nearest-value search over all 256
// codes with ties to the even code, the rotation in fp32 and the weight fold in the stated order.
// Shared by the CPU test (tests/cpp/test_indexer_prep.cpp) and the GPU test
// (tests/gpu/test_gpu_indexer_prep.cpp), which holds the CUDA kernel to the CPU backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/random.h"
#include "sparsemla/indexer_prep.h"
#include "sparsemla/rope.h"

// Helpers in a namespace of their own: tests/cpp/reference/writer_reference.h has an e4m3_value
// too.

namespace sparsemla::test::prep_ref {

inline constexpr int kPrepDim = 128;

// Exact value of an e4m3fn byte (NaN for 0x7F/0xFF), from the format's definition.
inline double e4m3_value(int b) {
  const int sign = b & 0x80 ? -1 : 1, e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m, -9);
  return sign * std::ldexp(8 + m, e - 10);
}

// RNE to e4m3fn by search: the nearest finite code, ties to the code with an even mantissa;
// |y| <= 448 here (the caller clamps), so saturation never matters.
inline uint8_t e4m3_nearest(double y) {
  int best = -1;
  double best_d = 0;
  for (int b = 0; b < 256; ++b) {
    const double v = e4m3_value(b);
    if (std::isnan(v)) continue;
    if (v == 0.0 && (b == 0x80) != std::signbit(y)) continue;  // zero keeps y's sign
    const double d = std::fabs(v - y);
    if (best < 0 || d < best_d || (d == best_d && (b & 1) == 0 && (best & 1) == 1)) {
      best = b;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best);
}

// The smallest integer e with amax <= 448 * 2^e (amax > 0 finite): ceil(log2(amax/448)).
inline int exponent_by_search(double amax) {
  int e = -200;
  while (448.0 * std::ldexp(1.0, e) < amax) ++e;
  return e;
}

inline float bf16f(bf16_bits b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_bits to_bf16(float f) {  // RNE; the inputs here are finite
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<bf16_bits>((u >> 16) | 0x40);
  return static_cast<bf16_bits>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

struct PrepCase {
  int64_t T = 0;
  int32_t H = 0;
  int64_t q_st = 0, q_sh = 0, o_st = 0, o_sh = 0, w_st = 0, wo_st = 0;  // 0: dense
  std::vector<bf16_bits> q, w_raw;
  std::vector<int64_t> pos;
  std::vector<float> rope;
  int64_t P = 0;
  std::vector<uint8_t> q_out;
  std::vector<float> w_out;

  int64_t qst() const { return q_st ? q_st : int64_t{H} * kPrepDim; }
  int64_t qsh() const { return q_sh ? q_sh : kPrepDim; }
  int64_t ost() const { return o_st ? o_st : int64_t{H} * kPrepDim; }
  int64_t osh() const { return o_sh ? o_sh : kPrepDim; }
  int64_t wst() const { return w_st ? w_st : H; }
  int64_t wost() const { return wo_st ? wo_st : H; }
  bf16_bits& qv(int64_t t, int h, int d) { return q[t * qst() + h * qsh() + d]; }

  IndexerQPrepParams params() {
    IndexerQPrepParams p;
    p.num_tokens = T;
    p.num_heads = H;
    p.q = q.data();
    p.q_stride_token = q_st;
    p.q_stride_head = q_sh;
    p.positions = pos.data();
    p.rope = {rope.data(), P, 64};
    p.w_raw = w_raw.data();
    p.w_raw_stride = w_st;
    p.q_out = q_out.data();
    p.q_out_stride_token = o_st;
    p.q_out_stride_head = o_sh;
    p.w_out = w_out.data();
    p.w_out_stride = wo_st;
    p.path = Path::Cpu;
    return p;
  }
};

inline PrepCase make_case(Rng& rng, int64_t T, int32_t H, bool strided) {
  PrepCase c;
  c.T = T;
  c.H = H;
  if (strided) {
    c.q_sh = kPrepDim + 8;
    c.q_st = c.q_sh * H + 24;
    c.o_sh = kPrepDim + 64;
    c.o_st = c.o_sh * H + 576;
    c.w_st = H + 3;
    c.wo_st = H + 5;
  }
  c.P = 4096;
  c.rope = build_rope_table(rope_config_compressed_layer(), c.P);
  c.q = random_bf16(rng, static_cast<size_t>(T * c.qst() + 16), 2.0);
  c.w_raw = random_bf16(rng, static_cast<size_t>(T * c.wst() + 4), 1.0);
  for (int64_t t = 0; t < T; ++t) c.pos.push_back(rng.randint(0, c.P - 1));
  c.q_out.assign(static_cast<size_t>(T * c.ost() + 8), 0xA5);
  c.w_out.assign(static_cast<size_t>(T * c.wost() + 8), 777.0f);
  return c;
}

// The independent implementation of 11.6 for row (t, h): bytes and weight.
inline void expected_row(PrepCase& c, int64_t t, int h, uint8_t (&bytes)[kPrepDim], float& w) {
  const int64_t pos = c.pos[t];
  if (pos < 0) {
    std::memset(bytes, 0, kPrepDim);
    w = 0.0f;
    return;
  }
  float x[kPrepDim];
  for (int d = 0; d < kPrepDim; ++d) x[d] = bf16f(c.qv(t, h, d));
  const float* cs = c.rope.data() + pos * 64;
  for (int k = 0; k < 32; ++k) {
    const float a = x[64 + 2 * k], b = x[65 + 2 * k], co = cs[k], si = cs[32 + k];
    const float pa = a * co, pb = b * si, qa = a * si, qb = b * co;  // each product rounded
    x[64 + 2 * k] = bf16f(to_bf16(pa - pb));
    x[65 + 2 * k] = bf16f(to_bf16(qa + qb));
  }
  double amax = 0;
  bool has_inf = false;
  for (float v : x) {
    if (std::isinf(v)) has_inf = true;
    if (!std::isnan(v)) amax = std::max(amax, std::fabs(static_cast<double>(v)));
  }
  amax = std::max(amax, static_cast<double>(1e-4f));
  const float w_raw = bf16f(c.w_raw[t * c.wst() + h]);
  if (has_inf) {  // e = +inf: 2^-e = 0, every value NaN or 0 before the clamp (CONTRACT 2.3)
    for (int d = 0; d < kPrepDim; ++d) {
      const double y = static_cast<double>(x[d]) * 0.0;
      bytes[d] = std::isnan(y) ? 0xFE : e4m3_nearest(y);
    }
    w = ((w_raw * std::numeric_limits<float>::infinity()) *
         static_cast<float>(1 / std::sqrt(128.0))) *
        0.125f;
    return;
  }
  const int e = exponent_by_search(amax);
  for (int d = 0; d < kPrepDim; ++d) {
    if (std::isnan(x[d])) {
      bytes[d] = 0xFE;  // NaN -> -448 (CONTRACT 2.3)
      continue;
    }
    const double y = std::clamp(std::ldexp(static_cast<double>(x[d]), -e), -448.0, 448.0);
    bytes[d] = e4m3_nearest(y);
  }
  const float scaled = w_raw * std::ldexp(1.0f, e);
  w = (scaled * static_cast<float>(1 / std::sqrt(128.0))) * 0.125f;
}

// The exponent edges of CONTRACT 11.8 (item 8) in rows 0..5 of c (T >= 6, H >= 3; exponents grow
// with h, so H <= 4 keeps them finite): every position 0 (cos 1, sin 0: values pass unrotated); row
// 0 amax below the 1e-4 floor, row 1 exactly 448 * 2^k, row 2 one bf16 ulp above 448 * 2^k, row 3
// all zero, row 4 a large negative amax among small values, row 5 a NaN (ignored by amax, stored as
// -448), +inf (e = +inf, w = +-inf) and -inf with w_raw 0 (w = NaN).
inline void fill_exponent_edges(PrepCase& c) {
  for (int64_t t = 0; t < c.T; ++t) c.pos[t] = 0;  // cos 1, sin 0: values pass unrotated
  const float k448 = 448.0f;
  for (int h = 0; h < c.H; ++h) {
    for (int d = 0; d < kPrepDim; ++d) {
      c.qv(0, h, d) = to_bf16(1e-6f * static_cast<float>(d % 7));         // amax < 1e-4: the floor
      c.qv(1, h, d) = to_bf16(d == 5 ? std::ldexp(k448, h - 2) : 0.25f);  // exactly 448*2^k
      // one bf16 ulp above 448*2^k
      c.qv(2, h, d) =
          d == 9 ? static_cast<bf16_bits>(to_bf16(std::ldexp(k448, h + 1)) + 1) : to_bf16(-1.0f);
      c.qv(3, h, d) = 0;  // all zero
      c.qv(4, h, d) = to_bf16(d == 3 ? -std::ldexp(k448, 3 * h - 20) : 1e-3f);
    }
  }
  c.qv(5, 0, 7) = 0x7FC0;  // NaN: ignored by amax, stored as -448
  c.qv(5, 1, 2) = 0x7F80;  // +inf: e = +inf, w = +-inf
  c.w_raw[5 * c.wst() + 2] = 0;
  c.qv(5, 2, 2) = 0xFF80;  // -inf with w_raw 0: w = NaN
}

}  // namespace sparsemla::test::prep_ref
