// The library's measurement knobs (src/core/tuning.h), read once per process.
#include "core/tuning.h"

#include <cstdlib>
#include <string>

#include "sparsemla/error.h"

namespace sparsemla::core {
namespace {

const char* process_env(const char* name) {
  return std::getenv(name);
}

}  // namespace

Tuning parse_tuning(const char* (*lookup)(const char* name)) {
  const auto env = [lookup](const char* name) -> const char* {
    const char* s = lookup(name);
    return s != nullptr && s[0] != '\0' ? s : nullptr;
  };
  Tuning t;
  if (const char* s = env("SPARSEMLA_GENERIC_WS")) {
    const std::string v(s);
    SPARSEMLA_CHECK_ARG(v == "0" || v == "1", "tuning", "SPARSEMLA_GENERIC_WS", "0 or 1", v);
    t.generic_ws = v == "1";
  }
  if (const char* s = env("SPARSEMLA_COMBINE_LEAN")) {
    const std::string v(s);
    SPARSEMLA_CHECK_ARG(v == "0" || v == "1", "tuning", "SPARSEMLA_COMBINE_LEAN", "0 or 1", v);
    t.combine_lean = v == "1";
  }
  if (const char* s = env("SPARSEMLA_GENERIC_HB")) {
    const std::string v(s);
    SPARSEMLA_CHECK_ARG(v == "1" || v == "2" || v == "4", "tuning", "SPARSEMLA_GENERIC_HB",
                        "1, 2 or 4", v);
    t.generic_head_blocks = std::stoi(v);
  }
  if (const char* s = env("SPARSEMLA_RESCALE_LAG")) {
    char* end = nullptr;
    const float v = std::strtof(s, &end);
    SPARSEMLA_CHECK_ARG(end != s && *end == '\0' && v >= 0.0f && v <= 64.0f, "tuning",
                        "SPARSEMLA_RESCALE_LAG", "a number of nats in [0, 64]", s);
    t.rescale_lag = v;
  }
  if (const char* s = env("SPARSEMLA_CPU_ISA")) {
    const std::string v(s);
    SPARSEMLA_CHECK_ARG(v == "auto" || v == "baseline" || v == "avx2" || v == "avx512", "tuning",
                        "SPARSEMLA_CPU_ISA", "auto, baseline, avx2 or avx512", v);
    t.cpu_isa = v == "baseline" ? CpuIsaChoice::Baseline
                : v == "avx2"   ? CpuIsaChoice::Avx2
                : v == "avx512" ? CpuIsaChoice::Avx512
                                : CpuIsaChoice::Auto;
  }
  return t;
}

const Tuning& tuning() {
  static const Tuning t = parse_tuning(process_env);
  return t;
}

}  // namespace sparsemla::core
