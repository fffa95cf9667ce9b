// tests/cpp/reference/random.h: fresh random inputs for every test run, with the seed recorded.
//
// Each test draws a new seed (std::random_device) unless SPARSEMLA_TEST_SEED is set; wrap the test
// body with SPARSEMLA_SEED_TRACE(seed) so a failure prints the seed that reproduces it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sparsemla/numerics.h"

namespace sparsemla::test {

uint64_t fresh_seed();

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(gen_); }
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(gen_);
  }
  int64_t randint(int64_t lo, int64_t hi_inclusive) {
    return std::uniform_int_distribution<int64_t>(lo, hi_inclusive)(gen_);
  }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// n bf16 values ~ N(0, sigma^2), never all zero.
std::vector<bf16_bits> random_bf16(Rng& rng, size_t n, double sigma = 1.0);
// n fp32 values ~ N(mean, sigma^2).
std::vector<float> random_f32(Rng& rng, size_t n, double sigma = 1.0, double mean = 0.0);
// n random bytes.
std::vector<uint8_t> random_bytes(Rng& rng, size_t n);

}  // namespace sparsemla::test

#define SPARSEMLA_SEED_TRACE(seed) \
  SCOPED_TRACE("seed=" + std::to_string(seed) + " (reproduce with SPARSEMLA_TEST_SEED=<seed>)")
