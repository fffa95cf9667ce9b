#include "reference/e4m3_table.h"

#include <cmath>
#include <limits>

namespace sparsemla::test {

namespace {

constexpr int kBias = 7;
constexpr uint8_t kMaxFiniteCode = 0x7E;  // 448

float decode_fields(uint8_t byte) {
  const int sign = byte >> 7, exponent = (byte >> 3) & 0xF, mantissa = byte & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  // Normal: (1 + m/8) * 2^(E-7) = (8 + m) * 2^(E-10); subnormal: (m/8) * 2^(1-7) = m * 2^-9.
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa), 1 - kBias - 3)
                              : std::ldexp(static_cast<float>(8 + mantissa), exponent - kBias - 3);
  return sign ? -magnitude : magnitude;
}

std::array<float, 256> build_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) t[b] = decode_fields(static_cast<uint8_t>(b));
  return t;
}

}  // namespace

const std::array<float, 256>& e4m3_reference_table() {
  static const std::array<float, 256> table = build_table();
  return table;
}

uint8_t e4m3_reference_encode(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const double a = std::fabs(static_cast<double>(x));
  const auto& t = e4m3_reference_table();
  if (a >= t[kMaxFiniteCode]) return sign | kMaxFiniteCode;
  // Codes 0x00..0x7E are increasing magnitudes: find the neighbours lo <= a < hi.
  int lo = 0;
  while (lo + 1 <= kMaxFiniteCode && t[lo + 1] <= a) ++lo;
  if (t[lo] == a) return sign | static_cast<uint8_t>(lo);
  const int hi = lo + 1;
  const double below = a - t[lo], above = t[hi] - a;  // exact in double
  int code = below < above ? lo : hi;
  if (below == above) code = (lo % 2 == 0) ? lo : hi;  // tie: the even code (mantissa LSB 0)
  return sign | static_cast<uint8_t>(code);
}

}  // namespace sparsemla::test
