// sparsemla/numerics.h: bit-exact codecs (bf16, OCP e4m3fn, UE8M0) and the quantiser
// (CONTRACT 2.3).
//
// Everything here is pure bit manipulation, callable from host and device, and independent of the
// rounding mode of the surrounding code. Tests check every codec against an independent 256-entry
// table (tests/cpp/test_numerics.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "sparsemla/format.h"

namespace sparsemla {

// ---- raw float bits
// ------------------------------------------------------------------------------
SPARSEMLA_HOST_DEVICE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
SPARSEMLA_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bf16 (raw bits in uint16_t)
// -----------------------------------------------------------------
using bf16_bits = uint16_t;

SPARSEMLA_HOST_DEVICE float bf16_to_float(bf16_bits b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

// Round to nearest, ties to even. NaN stays NaN (quiet, sign kept); overflow rounds to +-inf.
SPARSEMLA_HOST_DEVICE bf16_bits float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<bf16_bits>((u >> 16) | 0x0040u);
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>(rounded >> 16);
}
SPARSEMLA_HOST_DEVICE float round_to_bf16(float f) {
  return bf16_to_float(float_to_bf16(f));
}

// ---- OCP e4m3fn
// ---------------------------------------------------------------------------------- s eeee mmm,
// bias 7, no inf, 0x7F/0xFF are NaN, max 448 (0x7E), min subnormal 2^-9.
struct E4m3 {
  static constexpr float kMax = 448.0f;
  static constexpr uint8_t kMaxByte = 0x7E;
  static constexpr uint8_t kNegMaxByte = 0xFE;
};

SPARSEMLA_HOST_DEVICE bool e4m3_is_nan(uint8_t b) {
  return (b & 0x7F) == 0x7F;
}

SPARSEMLA_HOST_DEVICE float e4m3_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80) << 24;
  const uint32_t e = (b >> 3) & 0xF, m = b & 0x7;
  if (e == 0xF && m == 0x7) return bits_float(sign | 0x7FC00000u);
  if (e == 0) {
    // subnormal: m * 2^-9, exact in fp32
    const float v = static_cast<float>(m) * 0.001953125f;
    return bits_float(float_bits(v) | sign);
  }
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

// Round to nearest even, saturating to +-448, subnormals kept, NaN -> 0x7F (sign kept).
SPARSEMLA_HOST_DEVICE uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7F);
  if (a >= 0x43E00000u)
    return static_cast<uint8_t>(sign | E4m3::kMaxByte);  // |f| >= 448 (incl. inf)
  const int exp = static_cast<int>(a >> 23) - 127;
  uint32_t q;
  if (exp < -6) {
    // Subnormal range: value = k * 2^-9 with k = RNE(|f| * 2^9) in [0, 8] (k == 8 is the min
    // normal, encoded correctly by the same bits). Shift the significand so bit 0 weighs 2^-9;
    // 2^-10 is a tie that rounds to the even 0.
    const uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;
    const int shift = 14 - exp;  // 21 at exp = -7
    if (shift >= 32) {
      q = 0;
    } else {
      const uint32_t kept = sig >> shift, rem = sig & ((1u << shift) - 1u),
                     half = 1u << (shift - 1);
      q = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
    }
  } else {
    const uint32_t mant = a & 0x7FFFFFu, kept = mant >> 20, rem = mant & 0xFFFFFu;
    q = (static_cast<uint32_t>(exp + 7) << 3) + kept;
    if (rem > 0x80000u || (rem == 0x80000u && (kept & 1u))) q += 1;  // carry may bump the exponent
    if (q > E4m3::kMaxByte) q = E4m3::kMaxByte;
  }
  return static_cast<uint8_t>(sign | q);
}

// ---- UE8M0 (CONTRACT 2.1)
// ---------------------------------------------------------------------------- scale = 2^(code-127)
// exactly; code 0 is the fp32 subnormal 2^-127; code 255 decodes to +inf.
SPARSEMLA_HOST_DEVICE float ue8m0_to_float(uint8_t code) {
  return bits_float(code == 0 ? 0x00400000u : static_cast<uint32_t>(code) << 23);
}
SPARSEMLA_HOST_DEVICE bf16_bits ue8m0_to_bf16(uint8_t code) {
  return static_cast<bf16_bits>(code == 0 ? 0x0040u : static_cast<uint32_t>(code) << 7);
}

// ---- the quantiser (CONTRACT 2.3)
// -------------------------------------------------------------------- Code limits: legacy writers
// clamp to 255, sanitising writers to 254 (CONTRACT 5).
inline constexpr int kCodeMaxLegacy = 255;
inline constexpr int kCodeMaxSanitising = 254;
// Exponent value standing for e = +inf (a tile holding +-inf).
inline constexpr int kExpInf = std::numeric_limits<int>::max();
inline constexpr float kQuantAmaxFloor = 1e-4f;

// ceil(log2(amax / 448)) exactly, for amax >= 1e-4 (normal fp32) or +inf.
SPARSEMLA_HOST_DEVICE int quant_exponent(float amax) {
  const uint32_t u = float_bits(amax);
  if (u >= 0x7F800000u) return kExpInf;
  const int big_e = static_cast<int>(u >> 23);
  const uint32_t m = u & 0x7FFFFFu;
  return big_e - 135 + (m > 0x600000u ? 1 : 0);  // 448 = 1.75 * 2^8, 1.75 = mantissa 0x600000
}

// 2^-e as fp32 (0 when e = +inf). e is within [-22, 120] for amax in [1e-4, FLT_MAX]: exact,
// normal.
SPARSEMLA_HOST_DEVICE float quant_inv_scale(int e) {
  return e == kExpInf ? 0.0f : bits_float(static_cast<uint32_t>(127 - e) << 23);
}

// UE8M0 code of exponent e: clamp(e + 127, 0, code_max).
SPARSEMLA_HOST_DEVICE uint8_t quant_code(int e, int code_max) {
  if (e == kExpInf) return static_cast<uint8_t>(code_max);
  const int c = e + 127;
  return static_cast<uint8_t>(c < 0 ? 0 : (c > code_max ? code_max : c));
}

// max(fmax-reduce |x_i|, 1e-4), NaN ignored. A comparison rather than fmaxf: fmaxf may return NaN
// for a *signaling* NaN operand (IEEE maxNum; glibc does), which would restart the reduction after
// it (found by the window-writer fuzz target: a bf16 0xFFB5 input hid an inf). `a > amax` is false
// for every NaN, quiet or signaling, on host and device alike.
SPARSEMLA_HOST_DEVICE float quant_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(x[i]);
    if (a > amax) amax = a;
  }
  return amax > kQuantAmaxFloor ? amax : kQuantAmaxFloor;
}

// One element: y = clamp(x * 2^-e, -448, 448) (NaN -> -448), then e4m3 RNE.
SPARSEMLA_HOST_DEVICE uint8_t quant_element(float x, float inv_scale) {
  const float y = fminf(fmaxf(x * inv_scale, -E4m3::kMax), E4m3::kMax);
  return float_to_e4m3(y);
}

// Quantises n bf16-exact values into bytes; returns the exponent e (kExpInf for a tile with +-inf).
SPARSEMLA_HOST_DEVICE int quantize_block(const float* x, int n, uint8_t* bytes) {
  const int e = quant_exponent(quant_amax(x, n));
  const float inv = quant_inv_scale(e);
  for (int i = 0; i < n; ++i) bytes[i] = quant_element(x[i], inv);
  return e;
}

// The fp32 scale the indexer stores: 2^e, +inf for e = +inf (not clamped).
SPARSEMLA_HOST_DEVICE float indexer_scale_of_exponent(int e) {
  if (e == kExpInf) return bits_float(0x7F800000u);
  return ldexpf(1.0f, e);
}

// ---- RoPE (CONTRACT 1): GPT-J interleaved pairs, table row [cos x32 | sin x32]
// -------------------------- Forward rotation of pair k: a' = a*c - b*s, b' = a*s + b*c (fp32,
// plain multiply-add).
SPARSEMLA_HOST_DEVICE void rope_forward_pair(float& a, float& b, float c, float s) {
  const float na = a * c - b * s, nb = a * s + b * c;
  a = na;
  b = nb;
}
// Inverse rotation: a' = a*c + b*s, b' = b*c - a*s.
SPARSEMLA_HOST_DEVICE void rope_inverse_pair(float& a, float& b, float c, float s) {
  const float na = a * c + b * s, nb = b * c - a * s;
  a = na;
  b = nb;
}

// ---- exp with the same bits on host and device -------------------------------------------------
// The compressor's pooling softmax (CONTRACT 3.2) needs an exp that the CPU and the GPU evaluate to
// the same float: glibc's std::exp and CUDA's expf differ (glibc is not correctly rounded for ~1e-4
// of the inputs, expf is off by up to 2 ulp). This one uses only IEEE double multiply/add (never
// contracted: __dmul_rn/__dadd_rn on the device, one operation per call on the host) and one final
// rounding: k = floor(x/ln2 + 0.5), r = x - k*ln2 (Cody-Waite split, |r| <= 0.35), Taylor series
// to degree 12 (truncation < 1e-14 relative), times 2^k. It gave the correctly rounded value on
// all 330M inputs sampled (every 13th float). NaN -> NaN, -inf -> 0, +inf -> +inf.
SPARSEMLA_HOST_DEVICE double exact_dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
SPARSEMLA_HOST_DEVICE double exact_dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
// poly * r + c, rounded twice (no FMA).
SPARSEMLA_HOST_DEVICE double horner_step(double poly, double r, double c) {
  return exact_dadd(exact_dmul(poly, r), c);
}
SPARSEMLA_HOST_DEVICE float exp_portable(float x) {
  if (x != x) return x;
  if (x > 89.0f) return bits_float(0x7F800000u);  // above ln(FLT_MAX) = 88.72: +inf
  if (x < -104.0f) return 0.0f;                   // below ln(2^-150) = -103.97: rounds to 0
  constexpr double kInvLn2 = 1.4426950408889634;
  constexpr double kLn2Hi = 0.693147180369123816490;     // 0x3FE62E42FEE00000: k*hi is exact
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln2 - hi
  const double xd = static_cast<double>(x);
#if defined(__CUDA_ARCH__)
  const double kd = floor(exact_dadd(exact_dmul(xd, kInvLn2), 0.5));
#else
  const double kd = std::floor(exact_dadd(exact_dmul(xd, kInvLn2), 0.5));
#endif
  const double r = exact_dadd(exact_dadd(xd, -exact_dmul(kd, kLn2Hi)), -exact_dmul(kd, kLn2Lo));
  double poly = 1.0 / 479001600.0;  // 1/12!
  poly = horner_step(poly, r, 1.0 / 39916800.0);
  poly = horner_step(poly, r, 1.0 / 3628800.0);
  poly = horner_step(poly, r, 1.0 / 362880.0);
  poly = horner_step(poly, r, 1.0 / 40320.0);
  poly = horner_step(poly, r, 1.0 / 5040.0);
  poly = horner_step(poly, r, 1.0 / 720.0);
  poly = horner_step(poly, r, 1.0 / 120.0);
  poly = horner_step(poly, r, 1.0 / 24.0);
  poly = horner_step(poly, r, 1.0 / 6.0);
  poly = horner_step(poly, r, 0.5);
  poly = horner_step(poly, r, 1.0);
  poly = horner_step(poly, r, 1.0);
  const int k = static_cast<int>(kd);  // [-150, 129]: 2^k is a normal double
  const uint64_t two_k_bits = static_cast<uint64_t>(k + 1023) << 52;
#if defined(__CUDA_ARCH__)
  const double two_k = __longlong_as_double(static_cast<long long>(two_k_bits));
#else
  double two_k;
  std::memcpy(&two_k, &two_k_bits, 8);
#endif
  return static_cast<float>(exact_dmul(poly, two_k));
}
}  // namespace sparsemla
