#include "reference/random.h"

#include <cstdlib>

namespace sparsemla::test {

uint64_t fresh_seed() {
  if (const char* s = std::getenv("SPARSEMLA_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::vector<bf16_bits> random_bf16(Rng& rng, size_t n, double sigma) {
  std::vector<bf16_bits> v(n);
  for (auto& x : v) x = float_to_bf16(static_cast<float>(rng.normal() * sigma));
  if (n > 0 && bf16_to_float(v[0]) == 0.0f) v[0] = float_to_bf16(static_cast<float>(sigma));
  return v;
}

std::vector<float> random_f32(Rng& rng, size_t n, double sigma, double mean) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(mean + rng.normal() * sigma);
  return v;
}

std::vector<uint8_t> random_bytes(Rng& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng.randint(0, 255));
  return v;
}

}  // namespace sparsemla::test
