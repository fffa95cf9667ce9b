// Fuzz target: the standalone inverse RoPE (CONTRACT 1, 4.3) on a strided bf16 [T, H, 512] tensor
// with every bf16 bit pattern, arbitrary tables and garbage positions. Properties checked:
//   - rejected exactly when num_heads is outside [1, 128], a position is outside the table, a
//     stride lets rows overlap, or the table is malformed (T > 0); then nothing is written;
//   - only dims 448..511 of the T x H rows change; every other element (dims 0..447, the gaps
//     between strided rows) keeps its bits;
//   - each rotated pair equals a' = a*c + b*s, b' = b*c - a*s (float64 here) within one bf16 ulp
//     (the library rounds once from fp32), with NaN exactly where the float64 value is NaN.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/decode.h"
#include "sparsemla/numerics.h"

namespace sparsemla::fuzz {

namespace {

constexpr int64_t kRow = 512, kNope = 448, kPairs = 32;

// Extent of n rows of len elements, stride apart.
int64_t span(int64_t n, int64_t stride, int64_t len) {
  return n <= 0 ? 0 : (n - 1) * stride + len;
}

// One bf16 value against its float64 target: equal, or at most one bf16 ulp from it.
bool within_one_ulp(bf16_bits got_bits, double want) {
  const float got = bf16_to_float(got_bits);
  if (std::isnan(want)) return std::isnan(got);
  if (std::isnan(got)) return false;
  const float want_bf16 = bf16_to_float(float_to_bf16(static_cast<float>(want)));
  if (std::isinf(got) || std::isinf(want_bf16)) {
    // Overflow near the bf16 maximum rounds either way.
    return got == want_bf16 || std::fabs(want) >= 3.38e38;
  }
  int exp = 0;
  std::frexp(std::fmax(std::fabs(want), 1e-38), &exp);
  const double ulp = std::ldexp(1.0, exp - 8);  // bf16: 8 significant bits
  return std::fabs(static_cast<double>(got) - want) <= 1.5 * ulp;
}

// The bf16 rounding of an fp32 result, NaN matching any NaN.
bool same_value(bf16_bits got, float want) {
  const bf16_bits w = float_to_bf16(want);
  return got == w || (std::isnan(bf16_to_float(got)) && std::isnan(bf16_to_float(w)));
}

bf16_bits element(Input& in, Bulk& bulk, int mode) {
  if (mode == 0) return float_to_bf16(static_cast<float>(bulk.unit() * 16.0));
  if (mode == 1) return static_cast<bf16_bits>(bulk.next());  // every bit pattern
  return float_to_bf16(in.f32_like(4.0f));
}

}  // namespace

int run_inverse_rope(const uint8_t* data, size_t size) {
  Input in(data, size);
  bool must_reject = false;
  const int64_t T = in.range(0, 4);
  int32_t H = static_cast<int32_t>(in.range(1, 4));
  if (in.one_in(24)) {
    H = in.flag() ? 0 : 129;
    must_reject = true;
  }
  const int32_t H_buf = std::max<int32_t>(1, std::min<int32_t>(H, 4));
  int64_t sh = kRow + in.range(0, 8);
  int64_t st = H_buf * sh + in.range(0, 16);
  const bool default_token_stride = in.one_in(4);
  if (default_token_stride) sh = kRow, st = 0;  // 0: H*512
  if (in.one_in(12)) {                          // rows that overlap
    if (in.flag() && H_buf > 1) {
      sh = kRow - in.range(1, kRow);
      if (T > 0) must_reject = true;
    } else if (T > 1) {
      st = in.range(1, kRow - 1);
      must_reject = true;
    }
  }
  const int64_t st_eff = st != 0 ? st : int64_t{H_buf} * kRow;
  // A stride pair can also overlap rows through the token stride's relation to the heads' span.
  const bool disjoint =
      T <= 1 || H_buf <= 1 || st_eff >= span(H_buf, sh, kRow) || sh >= span(T, st_eff, kRow);
  if (T > 0 && !disjoint) must_reject = true;
  const int64_t rows = in.range(1, 6), row_stride = 64 + in.range(0, 3);
  Bulk bulk(in.bytes(8));
  std::vector<float> table(static_cast<size_t>(rows * row_stride));
  const bool table_specials = in.one_in(4);
  for (auto& v : table) v = table_specials ? in.f32_like() : static_cast<float>(bulk.unit());
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (auto& pos : positions) {
    pos = in.int64_like(0, rows - 1);
    if (pos < 0 || pos >= rows) must_reject = true;
  }
  const int mode = static_cast<int>(in.range(0, 2));
  const int64_t extent = T == 0 ? 0 : span(T, st_eff, span(H_buf, std::max<int64_t>(sh, 0), kRow));
  std::vector<bf16_bits> x(static_cast<size_t>(std::max<int64_t>(extent, 0)));
  for (auto& v : x) v = element(in, bulk, mode);
  const std::vector<bf16_bits> before = x;

  const RopeTable rope{table.data(), rows, row_stride};
  std::string why;
  const bool ok = accepted(
      [&] {
        inverse_rope_inplace(x.empty() ? nullptr : x.data(), T, H, st, sh,
                             T > 0 ? positions.data() : nullptr, rope, Path::Cpu);
      },
      &why);
  expect_verdict(ok, must_reject, why, "inverse_rope_inplace");
  if (!ok || T == 0) {
    SPARSEMLA_FUZZ_CHECK(same_bits(x, before), "a rejected or empty inverse_rope_inplace wrote");
    return 0;
  }
  std::vector<uint8_t> rotated(x.size(), 0);
  for (int64_t t = 0; t < T; ++t) {
    const float* cs = table.data() + positions[t] * row_stride;
    for (int32_t h = 0; h < H; ++h) {
      const int64_t base = t * st_eff + h * sh + kNope;
      for (int64_t k = 0; k < kPairs; ++k) {
        const int64_t ia = base + 2 * k, ib = ia + 1;
        rotated[ia] = rotated[ib] = 1;
        const double a = bf16_to_float(before[ia]), b = bf16_to_float(before[ib]);
        const double c = cs[k], s = cs[kPairs + k];
        const std::string at = " (token " + std::to_string(t) + ", head " + std::to_string(h) +
                               ", pair " + std::to_string(k) + ")";
        // The fp32 evaluation (products rounded separately) decides where fp32 overflows.
        const float fa = static_cast<float>(a), fb = static_cast<float>(b);
        const float fc = static_cast<float>(c), fs = static_cast<float>(s);
        const float a32 = fa * fc + fb * fs, b32 = fb * fc - fa * fs;
        SPARSEMLA_FUZZ_CHECK(same_value(x[ia], a32) || within_one_ulp(x[ia], a * c + b * s),
                             "a' = a*c + b*s" + at);
        SPARSEMLA_FUZZ_CHECK(same_value(x[ib], b32) || within_one_ulp(x[ib], b * c - a * s),
                             "b' = b*c - a*s" + at);
      }
    }
  }
  for (size_t e = 0; e < x.size(); ++e) {
    SPARSEMLA_FUZZ_CHECK(rotated[e] || x[e] == before[e],
                         "element " + std::to_string(e) + " outside the rotated dims changed");
  }
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_inverse_rope)
