// The per-layer RoPE cos/sin table of CONTRACT 1 (GPT-J pairs over 64 dims, optional YaRN).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "sparsemla/error.h"
#include "sparsemla/rope.h"

namespace sparsemla {

namespace {
constexpr int kRopeDims = 64;
constexpr int kPairs = kRopeDims / 2;

// Dimension index at which a wavelength completes `rotations` turns over the original length.
double yarn_correction_dim(double rotations, double base, double original_len) {
  return kRopeDims * std::log(original_len / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

std::vector<double> rope_frequencies(const RopeConfig& cfg) {
  std::vector<double> f(kPairs);
  for (int k = 0; k < kPairs; ++k) f[k] = 1.0 / std::pow(cfg.theta, 2.0 * k / kRopeDims);
  if (!cfg.yarn) return f;
  const double n0 = static_cast<double>(cfg.yarn_original_len);
  double lo = std::floor(yarn_correction_dim(cfg.yarn_beta_fast, cfg.theta, n0));
  double hi = std::ceil(yarn_correction_dim(cfg.yarn_beta_slow, cfg.theta, n0));
  lo = std::max(lo, 0.0);
  hi = std::min(hi, double{kRopeDims - 1});
  if (lo == hi) hi += 0.001;
  for (int k = 0; k < kPairs; ++k) {
    const double ramp = std::clamp((k - lo) / (hi - lo), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // 1: high frequency, unchanged; 0: fully interpolated
    f[k] = f[k] / cfg.yarn_factor * (1.0 - keep) + f[k] * keep;
  }
  return f;
}
}  // namespace

RopeConfig rope_config_window_layer() {
  return RopeConfig{};
}

RopeConfig rope_config_compressed_layer() {
  RopeConfig c;
  c.theta = 160000.0;
  c.yarn = true;
  return c;
}

std::vector<float> build_rope_table(const RopeConfig& cfg, int64_t positions) {
  const char* op = "build_rope_table";
  // 2^31 rows (2^39 bytes) bounds the table far above any context and keeps P*64 inside size_t.
  SPARSEMLA_CHECK_ARG(positions >= 1 && positions <= (int64_t{1} << 31), op, "positions",
                      "in [1, 2^31]", positions);
  SPARSEMLA_CHECK_ARG(cfg.theta > 1.0 && std::isfinite(cfg.theta), op, "cfg.theta",
                      "a finite value > 1", cfg.theta);
  if (cfg.yarn) {
    SPARSEMLA_CHECK_ARG(cfg.yarn_factor >= 1.0 && std::isfinite(cfg.yarn_factor), op,
                        "cfg.yarn_factor", "a finite value >= 1", cfg.yarn_factor);
    SPARSEMLA_CHECK_ARG(cfg.yarn_original_len >= 1, op, "cfg.yarn_original_len", ">= 1",
                        cfg.yarn_original_len);
    SPARSEMLA_CHECK_ARG(cfg.yarn_beta_slow > 0.0 && std::isfinite(cfg.yarn_beta_slow), op,
                        "cfg.yarn_beta_slow", "a finite value > 0", cfg.yarn_beta_slow);
    SPARSEMLA_CHECK_ARG(
        cfg.yarn_beta_fast > cfg.yarn_beta_slow && std::isfinite(cfg.yarn_beta_fast), op,
        "cfg.yarn_beta_fast", "a finite value > cfg.yarn_beta_slow", cfg.yarn_beta_fast);
  }
  const std::vector<double> f = rope_frequencies(cfg);
  std::vector<float> table(static_cast<size_t>(positions) * kRopeDims);
  for (int64_t p = 0; p < positions; ++p) {
    float* row = table.data() + p * kRopeDims;
    for (int k = 0; k < kPairs; ++k) {
      const double angle = static_cast<double>(p) * f[k];
      row[k] = static_cast<float>(std::cos(angle));
      row[kPairs + k] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

}  // namespace sparsemla
