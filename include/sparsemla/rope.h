// sparsemla/rope.h: a helper that builds the per-layer RoPE cos/sin table of CONTRACT 1.
#pragma once

#include <cstdint>
#include <vector>

namespace sparsemla {

struct RopeConfig {
  double theta = 10000.0;  // window-only layers: 10000; ratio-4/128 layers: 160000 + YaRN
  bool yarn = false;
  double yarn_factor = 16.0;
  int64_t yarn_original_len = 65536;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
};
// The two configurations DSV4 uses.
RopeConfig rope_config_window_layer();
RopeConfig rope_config_compressed_layer();

// fp32 [positions, 64]: row p = [cos(p*f_k) k=0..31 | sin(p*f_k) k=0..31], f_k from theta/YaRN.
std::vector<float> build_rope_table(const RopeConfig& cfg, int64_t positions);

}  // namespace sparsemla
