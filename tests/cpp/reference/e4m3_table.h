// tests/cpp/reference/e4m3_table.h: an independent OCP e4m3fn reference for the codec tests.
//
// The 256 values are computed from the bit fields (sign, 4-bit exponent with bias 7, 3-bit
// mantissa; exponent field 0 is subnormal m * 2^-9; 0x7F/0xFF are NaN) with std::ldexp, without
// using sparsemla/numerics.h. The encoder searches that table (round to nearest, ties to the even
// code, saturating at +-448), so it shares no arithmetic with the library's bit-twiddling codec.
#pragma once

#include <array>
#include <cstdint>

namespace sparsemla::test {

// All 256 e4m3fn values, indexed by byte (NaN for 0x7F and 0xFF, -0.0f for 0x80).
const std::array<float, 256>& e4m3_reference_table();

inline float e4m3_reference_value(uint8_t byte) {
  return e4m3_reference_table()[byte];
}

// Saturating round-to-nearest-even encoder: |x| >= 448 (and +-inf) -> 0x7E/0xFE, NaN -> 0x7F/0xFF
// (sign kept), values that round to zero keep their sign (0x00/0x80).
uint8_t e4m3_reference_encode(float x);

}  // namespace sparsemla::test
