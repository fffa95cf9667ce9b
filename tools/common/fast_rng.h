// tools/common/fast_rng.h: the tools' random source (`run`'s problems, `serve-sim`'s caches and traces).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace sparsemla::tools {

// xoshiro256** with a Box-Muller normal: the compressor inputs are tens of millions of floats, and
// std::normal_distribution would dominate the run time (~25 ns each).
class FastRng {
 public:
  explicit FastRng(uint64_t seed) {
    for (auto& s : s_) s = seed = splitmix(seed);
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0], s_[3] ^= s_[1], s_[1] ^= s_[2], s_[0] ^= s_[3], s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  int64_t below(int64_t n) { return static_cast<int64_t>(uniform() * static_cast<double>(n)); }
  float normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double u = std::max(uniform(), 1e-300), v = uniform();
    const double r = std::sqrt(-2.0 * std::log(u)), a = 6.283185307179586 * v;
    spare_ = static_cast<float>(r * std::sin(a));
    have_spare_ = true;
    return static_cast<float>(r * std::cos(a));
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  uint64_t s_[4];
  float spare_ = 0.0f;
  bool have_spare_ = false;
};

}  // namespace sparsemla::tools
