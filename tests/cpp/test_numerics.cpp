// Codec and quantiser tests (CONTRACT 2.1, 2.3, 9.1) against independent references written here
// and in reference/e4m3_table.cpp (none of them calls sparsemla/numerics.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/e4m3_table.h"
#include "reference/random.h"
#include "sparsemla/numerics.h"

namespace sparsemla {
namespace {

using test::e4m3_reference_encode;
using test::e4m3_reference_table;
using test::e4m3_reference_value;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- the reference itself
// ------------------------------------------------------------------------

TEST(E4m3Reference, PinsKnownValues) {
  // Literal values of the OCP e4m3fn spec, so a mistake in the reference cannot hide.
  EXPECT_EQ(e4m3_reference_value(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_reference_value(0x80)));
  EXPECT_EQ(e4m3_reference_value(0x01), 0.001953125f);  // 2^-9, smallest subnormal
  EXPECT_EQ(e4m3_reference_value(0x07), 0.013671875f);  // 7 * 2^-9, largest subnormal
  EXPECT_EQ(e4m3_reference_value(0x08), 0.015625f);     // 2^-6, smallest normal
  EXPECT_EQ(e4m3_reference_value(0x38), 1.0f);
  EXPECT_EQ(e4m3_reference_value(0x3C), 1.5f);
  EXPECT_EQ(e4m3_reference_value(0x77), 240.0f);
  EXPECT_EQ(e4m3_reference_value(0x78), 256.0f);
  EXPECT_EQ(e4m3_reference_value(0x7E), 448.0f);
  EXPECT_EQ(e4m3_reference_value(0xFE), -448.0f);
  EXPECT_EQ(e4m3_reference_value(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3_reference_value(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_reference_value(0xFF)));
  // Magnitudes strictly increase with the code over the 127 finite non-negative codes.
  for (int b = 1; b <= 0x7E; ++b) EXPECT_LT(e4m3_reference_value(b - 1), e4m3_reference_value(b));
}

// ---- e4m3 decode / encode
// ------------------------------------------------------------------------

TEST(E4m3Codec, DecodesAll256BytesBitExact) {
  for (int b = 0; b < 256; ++b) {
    SCOPED_TRACE("byte=" + std::to_string(b));
    const float ref = e4m3_reference_value(static_cast<uint8_t>(b));
    const float got = e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got));
      EXPECT_TRUE(e4m3_is_nan(static_cast<uint8_t>(b)));
      EXPECT_TRUE(b == 0x7F || b == 0xFF);
    } else {
      EXPECT_EQ(bits_of(got), bits_of(ref));  // bits: -0 must stay -0
      EXPECT_FALSE(e4m3_is_nan(static_cast<uint8_t>(b)));
    }
  }
}

TEST(E4m3Codec, EncodeRoundTripsEveryFiniteByte) {
  for (int b = 0; b < 256; ++b) {
    if (b == 0x7F || b == 0xFF) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_reference_value(static_cast<uint8_t>(b))), b) << "byte " << b;
  }
}

TEST(E4m3Codec, MidpointsRoundToEvenAndNeighboursRoundToNearest) {
  const auto& t = e4m3_reference_table();
  for (int lo = 0; lo < 0x7E; ++lo) {
    const int hi = lo + 1;
    const float mid = (t[lo] + t[hi]) / 2;  // exact: a few significant bits
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(t[lo]) + t[hi]) / 2);
    const int even = (lo % 2 == 0) ? lo : hi;
    for (float sign : {1.0f, -1.0f}) {
      SCOPED_TRACE("lo=" + std::to_string(lo) + " sign=" + std::to_string(sign));
      const int s = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(float_to_e4m3(sign * mid), s | even);
      EXPECT_EQ(float_to_e4m3(sign * std::nextafter(mid, 0.0f)), s | lo);
      EXPECT_EQ(float_to_e4m3(sign * std::nextafter(mid, kInf)), s | hi);
    }
  }
}

TEST(E4m3Codec, SaturatesAt448AndKeepsNaNSign) {
  for (float v : {448.0f, 448.5f, 464.0f, 479.99f, 480.0f, 512.0f, 1e6f,
                  std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(float_to_e4m3(v), 0x7E) << v;
    EXPECT_EQ(float_to_e4m3(-v), 0xFE) << -v;
  }
  EXPECT_EQ(float_to_e4m3(kNaN), 0x7F);
  EXPECT_EQ(float_to_e4m3(-kNaN), 0xFF);
  EXPECT_EQ(float_to_e4m3(float_of(0x7F800001u)), 0x7F);  // signalling-NaN payload
  // Just below the top: 416 = 0x7D exactly, (416+448)/2 = 432 is a tie -> even 0x7E.
  EXPECT_EQ(float_to_e4m3(416.0f), 0x7D);
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(std::nextafter(432.0f, 0.0f)), 0x7D);
}

TEST(E4m3Codec, SubnormalsAndSignedZero) {
  const float two_m9 = std::ldexp(1.0f, -9), two_m10 = std::ldexp(1.0f, -10);
  EXPECT_EQ(float_to_e4m3(two_m9), 0x01);                         // smallest subnormal
  EXPECT_EQ(float_to_e4m3(two_m10), 0x00);                        // tie 0 / 2^-9 -> even 0
  EXPECT_EQ(float_to_e4m3(-two_m10), 0x80);                       // sign kept
  EXPECT_EQ(float_to_e4m3(std::nextafter(two_m10, 1.0f)), 0x01);  // above the tie
  EXPECT_EQ(float_to_e4m3(3 * two_m10), 0x02);                    // tie 2^-9 / 2^-8 -> 2^-8
  EXPECT_EQ(float_to_e4m3(5 * two_m10), 0x02);                    // tie 2^-8 / 3*2^-9 -> even
  EXPECT_EQ(float_to_e4m3(15 * two_m10), 0x08);                   // tie 7*2^-9 / 2^-6 -> 2^-6
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(float_to_e4m3(-1e-30f), 0x80);
}

TEST(E4m3Codec, EncodeMatchesReferenceOnRandomFloats) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  for (int i = 0; i < 100000; ++i) {
    // Log-uniform magnitudes over [2^-14, 2^10]: subnormal, normal and saturating ranges.
    const float mag = static_cast<float>(std::exp2(rng.uniform(-14.0, 10.0)));
    const float x = rng.randint(0, 1) ? -mag : mag;
    ASSERT_EQ(int{float_to_e4m3(x)}, int{e4m3_reference_encode(x)}) << "x=" << x;
  }
}

// ---- UE8M0
// ---------------------------------------------------------------------------------------

TEST(Ue8m0Codec, DecodesAll256CodesToFloat) {
  for (int c = 0; c < 256; ++c) {
    const float ref = c == 255 ? kInf : std::ldexp(1.0f, c - 127);  // 2^-127 is an fp32 subnormal
    EXPECT_EQ(bits_of(ue8m0_to_float(static_cast<uint8_t>(c))), bits_of(ref)) << "code " << c;
  }
  EXPECT_EQ(bits_of(ue8m0_to_float(0)), 0x00400000u);
  EXPECT_EQ(ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(ue8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(ue8m0_to_float(255), kInf);
}

TEST(Ue8m0Codec, DecodesAll256CodesToBf16) {
  for (int c = 0; c < 256; ++c) {
    // A power of two (or +inf) has a zero low half: its bf16 bits are its fp32 bits >> 16.
    const float ref = c == 255 ? kInf : std::ldexp(1.0f, c - 127);
    ASSERT_EQ(bits_of(ref) & 0xFFFFu, 0u);
    EXPECT_EQ(uint32_t{ue8m0_to_bf16(static_cast<uint8_t>(c))}, bits_of(ref) >> 16) << "code " << c;
  }
  EXPECT_EQ(ue8m0_to_bf16(0), 0x0040);
  EXPECT_EQ(ue8m0_to_bf16(1), 1 << 7);
  EXPECT_EQ(ue8m0_to_bf16(255), 0x7F80);
}

// ---- bf16
// ----------------------------------------------------------------------------------------

// Independent bf16 RNE: pick the nearer of the two bf16 neighbours (by value, in double), ties to
// the even one; the neighbour past the largest finite value stands for 2^128 and is +-inf.
uint16_t bf16_reference(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // any quiet NaN, sign kept
  if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
  const uint32_t down = mag & 0xFFFF0000u, up = down + 0x10000u;
  const double a = std::fabs(static_cast<double>(f));
  const double down_v = static_cast<double>(float_of(down));
  const double up_v = up == 0x7F800000u ? std::ldexp(1.0, 128) : static_cast<double>(float_of(up));
  const double below = a - down_v, above = up_v - a;
  uint32_t pick = below < above ? down : up;
  if (below == above) pick = ((down >> 16) & 1u) == 0 ? down : up;
  return static_cast<uint16_t>((sign | pick) >> 16);
}

void expect_bf16_matches(float f) {
  const uint16_t got = float_to_bf16(f), ref = bf16_reference(f);
  if (std::isnan(f)) {
    EXPECT_TRUE(std::isnan(bf16_to_float(got))) << std::hex << bits_of(f);
    EXPECT_EQ(got & 0x8000, ref & 0x8000);
  } else {
    EXPECT_EQ(got, ref) << std::hex << "input bits 0x" << bits_of(f);
  }
}

TEST(Bf16Codec, RneMatchesReferenceOnCraftedFloats) {
  const uint32_t crafted[] = {0x00000000u,
                              0x80000000u,
                              0x3F800000u,
                              0x3F808000u /* tie, even down */,
                              0x3F818000u /* tie, odd: up */,
                              0x3F807FFFu,
                              0x3F808001u,
                              0x7F7FFFFFu /* FLT_MAX -> inf */,
                              0x7F7F8000u /* tie at the top: up to inf */,
                              0x7F7F7FFFu,
                              0x7F7F0000u,
                              0xFF7FFFFFu,
                              0x00000001u /* smallest subnormal */,
                              0x00008000u /* tie -> 0 */,
                              0x00018000u,
                              0x007FFFFFu,
                              0x7F800000u,
                              0xFF800000u,
                              0x7FC00000u,
                              0xFFC00000u,
                              0x7F800001u /* NaN, payload low only */,
                              0xFF800001u,
                              0x7FFFFFFFu,
                              0x3FFFFFFFu,
                              0xBF808000u,
                              0xBF818000u};
  for (uint32_t u : crafted) expect_bf16_matches(float_of(u));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(float_of(0x7F800001u)))));
  EXPECT_EQ(float_to_bf16(float_of(0x7F7FFFFFu)), 0x7F80);
  EXPECT_EQ(float_to_bf16(float_of(0x3F808000u)), 0x3F80);
  EXPECT_EQ(float_to_bf16(float_of(0x3F818000u)), 0x3F82);
}

TEST(Bf16Codec, RneMatchesReferenceOnRandomFloats) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng.randint(0, 0xFFFFFFFFll));
    if (i % 4 == 1) u = (u & 0xFFFF0000u) | 0x8000u;  // exact ties
    if (i % 4 == 2) u = (u & 0xFFFF0000u) | static_cast<uint32_t>(rng.randint(0x7FFE, 0x8001));
    expect_bf16_matches(float_of(u));
    if (HasFailure()) return;
  }
  // Every bf16 value round-trips through fp32.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      ASSERT_TRUE((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0) << h;
      continue;
    }
    ASSERT_EQ(bits_of(f), h << 16);
    ASSERT_EQ(uint32_t{float_to_bf16(f)}, h);
  }
}

// ---- the quantiser (CONTRACT 2.3)
// --------------------------------------------------------------------

// Exact ceil(log2(amax / 448)) by integer reasoning: the smallest e with 448 * 2^e >= amax
// (448 * 2^e and amax are exact in double).
int exponent_reference(float amax) {
  const double a = amax;
  int e = std::ilogb(a) - 8;  // 448 * 2^e ~ 2^(e+8.8)
  while (std::ldexp(448.0, e) < a) ++e;
  while (std::ldexp(448.0, e - 1) >= a) --e;
  return e;
}

TEST(Quantiser, ExponentMatchesExactCeilLog2OnRandomAmax) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  const int64_t lo_bits = bits_of(1e-4f), hi_bits = 0x7F7FFFFF;
  for (int i = 0; i < 200000; ++i) {
    const float amax = float_of(static_cast<uint32_t>(rng.randint(lo_bits, hi_bits)));
    ASSERT_EQ(quant_exponent(amax), exponent_reference(amax)) << "amax=" << amax;
  }
  for (int i = 0; i < 20000; ++i) {  // model-scale values, with the long-double log2 as a witness
    const float amax = static_cast<float>(std::exp2(rng.uniform(-13.28, 20.0)));
    const long double q = static_cast<long double>(amax) / 448.0L;
    const int e = exponent_reference(amax);
    ASSERT_EQ(quant_exponent(amax), e) << "amax=" << amax;
    ASSERT_EQ(static_cast<int>(std::ceil(std::log2(q))), e) << "amax=" << amax;
  }
  EXPECT_EQ(quant_exponent(kInf), kExpInf);
}

TEST(Quantiser, ExponentAtExactPowersOfTwoTimes448) {
  for (int k = -22; k <= 119; ++k) {  // 448 * 2^k within [1e-4, FLT_MAX]
    const float amax = std::ldexp(448.0f, k);
    EXPECT_EQ(quant_exponent(amax), k) << "k=" << k;
    EXPECT_EQ(quant_exponent(std::nextafter(amax, kInf)), k + 1) << "k=" << k;
    EXPECT_EQ(quant_exponent(std::nextafter(amax, 0.0f)), k) << "k=" << k;
    EXPECT_EQ(quant_code(k, kCodeMaxLegacy), k + 127);
  }
  // FLT_MAX = (2 - 2^-23) * 2^127 > 448 * 2^119 = 1.75 * 2^127: e = 120.
  EXPECT_EQ(quant_exponent(std::numeric_limits<float>::max()), 120);
}

TEST(Quantiser, CodesAndScalesClamp) {
  EXPECT_EQ(quant_code(-200, kCodeMaxLegacy), 0);
  EXPECT_EQ(quant_code(-127, kCodeMaxLegacy), 0);
  EXPECT_EQ(quant_code(128, kCodeMaxLegacy), 255);
  EXPECT_EQ(quant_code(127, kCodeMaxSanitising), 254);
  EXPECT_EQ(quant_code(kExpInf, kCodeMaxLegacy), 255);
  EXPECT_EQ(quant_code(kExpInf, kCodeMaxSanitising), 254);
  EXPECT_EQ(quant_inv_scale(kExpInf), 0.0f);
  for (int e = -22; e <= 120; ++e) EXPECT_EQ(quant_inv_scale(e), std::ldexp(1.0f, -e));
  EXPECT_EQ(indexer_scale_of_exponent(kExpInf), kInf);
  EXPECT_EQ(indexer_scale_of_exponent(-22), std::ldexp(1.0f, -22));
  EXPECT_EQ(indexer_scale_of_exponent(5), 32.0f);
}

// Independent quantiser: amax ignoring NaN with the 1e-4 floor, exact exponent, ldexp scaling,
// clamp (NaN -> -448), table encoder. Returns e (kExpInf for a tile with +-inf).
int quantize_reference(const std::vector<float>& x, std::vector<uint8_t>& bytes) {
  float amax = 0.0f;
  bool has_inf = false;
  for (float v : x) {
    if (std::isinf(v)) has_inf = true;
    if (!std::isnan(v) && std::fabs(v) > amax) amax = std::fabs(v);
  }
  if (amax < 1e-4f) amax = 1e-4f;
  const int e = has_inf ? kExpInf : exponent_reference(amax);
  bytes.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    float y = has_inf ? x[i] * 0.0f : std::ldexp(x[i], -e);
    if (std::isnan(y)) y = -448.0f;
    y = std::min(std::max(y, -448.0f), 448.0f);
    bytes[i] = e4m3_reference_encode(y);
  }
  return e;
}

void expect_quantises_like_reference(const std::vector<float>& x) {
  std::vector<uint8_t> got(x.size()), ref;
  const int e = quantize_block(x.data(), static_cast<int>(x.size()), got.data());
  EXPECT_EQ(e, quantize_reference(x, ref));
  EXPECT_EQ(got, ref);
  for (uint8_t b : got) EXPECT_FALSE(b == 0x7F || b == 0xFF) << "NaN byte emitted";
}

TEST(Quantiser, TilesMatchReferenceOnRandomBf16Values) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  for (int i = 0; i < 3000; ++i) {
    const double sigma = std::exp2(rng.uniform(-20.0, 30.0));
    std::vector<float> x(64);
    for (auto& v : x) v = round_to_bf16(static_cast<float>(rng.normal() * sigma));
    expect_quantises_like_reference(x);
    const int e = quant_exponent(quant_amax(x.data(), 64));
    const int code = quant_code(e, kCodeMaxSanitising);
    EXPECT_GE(code, 105);  // finite tiles: codes 105..247
    EXPECT_LE(code, 247);
    if (HasFailure()) return;
  }
}

TEST(Quantiser, AmaxBelowFloorUses1em4) {
  std::vector<float> x(64, 0.0f);
  x[3] = 3e-5f;
  x[10] = -9.9e-5f;
  x[20] = -0.0f;
  EXPECT_EQ(quant_amax(x.data(), 64), 1e-4f);
  std::vector<uint8_t> bytes(64);
  const int e = quantize_block(x.data(), 64, bytes.data());
  EXPECT_EQ(e, -22);  // ceil(log2(1e-4 / 448)) = ceil(-22.09)
  EXPECT_EQ(quant_code(e, kCodeMaxLegacy), 105);
  EXPECT_EQ(bytes[0], 0x00);
  EXPECT_EQ(bytes[20], 0x80);
  EXPECT_EQ(bytes[3], e4m3_reference_encode(std::ldexp(3e-5f, 22)));
  EXPECT_EQ(bytes[10], e4m3_reference_encode(std::ldexp(-9.9e-5f, 22)));
  expect_quantises_like_reference(x);
  // All-zero and all-NaN tiles: amax 1e-4 as well.
  std::vector<float> nan_tile(64, kNaN);
  EXPECT_EQ(quant_amax(nan_tile.data(), 64), 1e-4f);
  EXPECT_EQ(quantize_block(nan_tile.data(), 64, bytes.data()), -22);
  for (uint8_t b : bytes) EXPECT_EQ(b, 0xFE);  // NaN -> -448
}

TEST(Quantiser, ExactPowerOfTwoTileMapsAmaxTo448) {
  for (int k : {-22, -10, -1, 0, 1, 7, 40, 119}) {
    std::vector<float> x = {std::ldexp(448.0f, k), std::ldexp(-448.0f, k), std::ldexp(1.0f, k),
                            std::ldexp(-3.5f, k)};
    std::vector<uint8_t> bytes(x.size());
    EXPECT_EQ(quantize_block(x.data(), 4, bytes.data()), k);
    EXPECT_EQ(bytes[0], 0x7E);
    EXPECT_EQ(bytes[1], 0xFE);
    EXPECT_EQ(bytes[2], 0x38);  // 1.0
    EXPECT_EQ(bytes[3], 0xC6);  // -3.5
    // Just above 448 * 2^k: e = k + 1, so the top element becomes 224 (0x76) or rounds near it.
    x[0] = std::nextafter(x[0], kInf);
    EXPECT_EQ(quantize_block(x.data(), 4, bytes.data()), k + 1);
    EXPECT_EQ(bytes[1], 0xF6);  // -224
    expect_quantises_like_reference(x);
  }
}

TEST(Quantiser, ElementSaturatesAt448AndKeepsNegativeZero) {
  EXPECT_EQ(quant_element(500.0f, 1.0f), 0x7E);
  EXPECT_EQ(quant_element(-1e30f, 1.0f), 0xFE);
  EXPECT_EQ(quant_element(449.0f, 1.0f), 0x7E);
  EXPECT_EQ(quant_element(-0.0f, 1.0f), 0x80);
  EXPECT_EQ(quant_element(-0.0f, 0.0f), 0x80);
  EXPECT_EQ(quant_element(-1e-4f, 1.0f), 0x80);  // rounds to zero, sign kept
  EXPECT_EQ(quant_element(0.0f, 1024.0f), 0x00);
  EXPECT_EQ(quant_element(kNaN, 1.0f), 0xFE);  // NaN -> -448
}

// A tile holding +-inf: e = +inf, code = CODE_MAX, finite elements -> +-0, +-inf/NaN -> 0xFE.
TEST(Quantiser, InfAndNaNTilesInLegacyAndSanitisingModes) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  std::vector<float> x = test::random_f32(rng, 64, 3.0);
  x[5] = kInf;
  x[9] = -kInf;
  x[11] = kNaN;
  x[12] = -kNaN;
  x[13] = -0.0f;
  x[14] = std::numeric_limits<float>::max();
  std::vector<uint8_t> bytes(64);
  const int e = quantize_block(x.data(), 64, bytes.data());
  ASSERT_EQ(e, kExpInf);
  EXPECT_EQ(quant_code(e, kCodeMaxLegacy), 255);
  EXPECT_EQ(quant_code(e, kCodeMaxSanitising), 254);
  for (int i = 0; i < 64; ++i) {
    SCOPED_TRACE("element " + std::to_string(i));
    if (std::isfinite(x[i])) {
      EXPECT_EQ(bytes[i], std::signbit(x[i]) ? 0x80 : 0x00);
    } else {
      EXPECT_EQ(bytes[i], 0xFE);
    }
  }
  expect_quantises_like_reference(x);
  // NaN without inf: NaN ignored by amax, stored as -448 at the finite scale.
  std::vector<float> y = test::random_f32(rng, 64, 3.0);
  y[7] = kNaN;
  expect_quantises_like_reference(y);
  std::vector<uint8_t> ybytes(64);
  const int ey = quantize_block(y.data(), 64, ybytes.data());
  EXPECT_NE(ey, kExpInf);
  EXPECT_EQ(ybytes[7], 0xFE);
  EXPECT_LE(quant_code(ey, kCodeMaxSanitising), 247);
}

// exp_portable (the pooling exp shared by the CPU and GPU compressors) against exp in double
// rounded once to float: equal on random arguments over its whole range (a double-rounding
// disagreement has probability ~2^-29 per sample), and exact at the edges.
TEST(ExpPortable, MatchesDoubleExpRoundedOnceAndEdgeValues) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  int64_t mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>(rng.uniform(-104.0, 89.0));
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    mismatches += exp_portable(x) != want;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(exp_portable(0.0f), 1.0f);
  EXPECT_EQ(exp_portable(-0.0f), 1.0f);
  EXPECT_EQ(exp_portable(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_portable(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(exp_portable(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(exp_portable(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_portable(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace sparsemla
