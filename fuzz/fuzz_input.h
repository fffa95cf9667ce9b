// fuzz/fuzz_input.h: turning fuzzer bytes into call arguments, and the failure convention.
//
// Every target is `int sparsemla::fuzz::run_<name>(const uint8_t*, size_t)`: it reads its
// arguments from the bytes (an exhausted input reads as zeros, which map to small valid values, so
// the empty input is a valid call), calls public APIs only, treats sparsemla::Error as a legitimate
// outcome, and checks what the call did against an independent oracle written in the target. A
// broken property throws fuzz::Broken, which no target catches: libFuzzer reports it as a crash
// (uncaught exception -> abort), and the corpus replay test in tests/cpp reports it as a failure.
// Crashes, ASan/UBSan reports and out-of-bounds accesses (every buffer is allocated at its exact
// size) are failures too.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "sparsemla/error.h"

namespace sparsemla::fuzz {

// A property of the library that did not hold.
class Broken : public std::logic_error {
 public:
  explicit Broken(const std::string& what) : std::logic_error(what) {}
};

#define SPARSEMLA_FUZZ_CHECK(cond, what)                                                       \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ::sparsemla::fuzz::Broken(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                      ": " + (what));                                          \
  } while (0)

// The reader of the fuzzer's bytes: LLVM's FuzzedDataProvider underneath (its header ships with
// clang's libFuzzer runtime, libclang-rt-<N>-dev), plus the value distributions the targets share.
// Its exhausted input reads as the low end of every range (false, 0, lo).
class Input {
 public:
  Input(const uint8_t* data, size_t size) : fdp_(data, size) {}

  uint8_t u8() { return fdp_.ConsumeIntegral<uint8_t>(); }
  // n (1..8) bytes of raw bits.
  uint64_t bytes(int n) {
    const uint64_t max = n >= 8 ? UINT64_MAX : (uint64_t{1} << (8 * n)) - 1;
    return fdp_.ConsumeIntegralInRange<uint64_t>(0, max);
  }
  bool flag() { return fdp_.ConsumeBool(); }
  // True with probability ~1/n (false on an exhausted input when n > 1).
  bool one_in(int n) { return n <= 1 || fdp_.ConsumeIntegralInRange<int>(0, n - 1) == n - 1; }

  // An integer in [lo, hi] (lo on an exhausted input).
  int64_t range(int64_t lo, int64_t hi) {
    return hi <= lo ? lo : fdp_.ConsumeIntegralInRange<int64_t>(lo, hi);
  }

  // Mostly in [lo, hi]; sometimes just outside it, an extreme, or raw bits: garbage data (slots,
  // indptr, positions, block ids) that the library must survive.
  int64_t int64_like(int64_t lo, int64_t hi) {
    const uint8_t mode = u8();
    if (mode < 200) return range(lo, hi);
    if (mode < 236) return range(lo, hi) + (mode % 2 ? 1 : -1) * range(1, 4);
    if (mode < 248) {
      const int64_t extremes[] = {std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max(),
                                  std::numeric_limits<int32_t>::min(),
                                  std::numeric_limits<int32_t>::max(),
                                  -1,
                                  0};
      return extremes[mode % 6];
    }
    return static_cast<int64_t>(bytes(8));
  }
  int32_t int32_like(int64_t lo, int64_t hi) {
    const int64_t v = int64_like(lo, hi);
    return static_cast<int32_t>(v);  // wraps the int64 extremes into int32 garbage
  }

  // A float: moderate values most of the time, sometimes +-0, +-inf, NaN or raw bits.
  float f32_like(float scale = 1.0f) {
    const uint8_t mode = u8();
    if (mode < 224) return scale * (static_cast<float>(range(-1000, 1000)) / 500.0f);
    const float specials[] = {0.0f,
                              -0.0f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::max(),
                              std::numeric_limits<float>::denorm_min(),
                              1e-30f};
    if (mode < 248) return specials[mode % 8];
    const uint32_t bits = static_cast<uint32_t>(bytes(4));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }

 private:
  FuzzedDataProvider fdp_;
};

// Bulk data (cache pages, queries) from a seed the input chooses: splitmix64.
class Bulk {
 public:
  explicit Bulk(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint8_t byte() { return static_cast<uint8_t>(next()); }
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  // Uniform in [-1, 1).
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0; }
  // N(0, 1) (Box-Muller; u1 in (0, 1]).
  double normal() {
    const double u1 = static_cast<double>((next() >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  void fill(std::vector<uint8_t>& v) {
    for (auto& b : v) b = byte();
  }

 private:
  uint64_t s_;
};

// Runs `call`: true when it returned, false when it threw sparsemla::Error (a legitimate
// rejection, whose message is kept in *why). Anything else propagates.
template <typename Call>
bool accepted(Call&& call, std::string* why = nullptr) {
  try {
    call();
    return true;
  } catch (const Error& e) {
    if (why != nullptr) *why = e.what();
    return false;
  }
}

// The outcome must match the oracle's verdict on the inputs: rejected exactly when they are bad.
inline void expect_verdict(bool ok, bool must_reject, const std::string& why, const char* op) {
  SPARSEMLA_FUZZ_CHECK(!(ok && must_reject), std::string(op) + " accepted an invalid call");
  SPARSEMLA_FUZZ_CHECK(ok || must_reject, std::string(op) + " rejected a valid call: " + why);
}

// Two arrays hold the same bytes (NaN payloads included; empty arrays are equal).
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Bit patterns of floats (NaN-aware comparisons in the oracles).
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace sparsemla::fuzz
