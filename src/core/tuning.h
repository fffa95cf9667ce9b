// src/core/tuning.h: every measurement knob of the library, in one place. Each is read once per
// process (at the first decode that needs it), checked, and has a documented default; nothing
// else in the library reads the environment. The defaults are what the measurements in
// docs/PERF.md chose; the knobs exist only to re-measure the alternatives (scripts/gpu-check,
// `sparsemla bench`).
#pragma once

#include <cstdint>

// Compile-time knob (the sm90 kernel is instantiated for 2..N fused splits): the most splits of a
// row that combine in their thread-block cluster. -DSPARSEMLA_SM90_FUSED_MAX_SPLITS=N widens the
// host rule and the instantiations for measurements; the default 2 was measured best.
#ifndef SPARSEMLA_SM90_FUSED_MAX_SPLITS
#define SPARSEMLA_SM90_FUSED_MAX_SPLITS 2
#endif

// Lab-only compile definitions, for differences of call times (H200.md: no hardware timeline on
// the device machine); they make outputs wrong and never go into a product build:
// SPARSEMLA_LAB_NO_COMBINE skips the split combine kernel's launch (src/cuda/common/combine.cu),
// SPARSEMLA_LAB_NO_ACC_STORE the sm90 partials' acc bulk stores (src/cuda/sm90/decode_sm90.cu).
// Each prints a compiler message where it applies.

namespace sparsemla::core {

inline constexpr int32_t kSm90FusedMaxSplits = SPARSEMLA_SM90_FUSED_MAX_SPLITS;
static_assert(kSm90FusedMaxSplits >= 2 && kSm90FusedMaxSplits <= 8,
              "a cluster fuses 2..8 splits (the portable cluster size)");

// Instruction-set level of the CPU backend's hot loops (src/cpu/isa.h). Auto: the best the CPU
// supports (cpuid, once per process).
enum class CpuIsaChoice : int32_t { Auto, Baseline, Avx2, Avx512 };

struct Tuning {
  // SPARSEMLA_GENERIC_WS=0: the generic path's HB = 4 calls run the 256-thread kernel instead of
  // the warp-specialised one on sm_90+ (default: warp-specialised, docs/GENERIC.md).
  bool generic_ws = true;
  // SPARSEMLA_COMBINE_LEAN=0: the split combine keeps one head row per 128-thread block (4
  // columns per thread) even where the lean kernel applies (16-byte aligned acc, S <= 16; default:
  // the lean kernel, src/cuda/common/combine.cu).
  bool combine_lean = true;
  // SPARSEMLA_GENERIC_HB=1|2|4: forces the generic kernel's 16-head blocks per CTA where the
  // configuration fits the device (default 0: the plan's rule, head_blocks_per_cta).
  int32_t generic_head_blocks = 0;
  // SPARSEMLA_RESCALE_LAG=<nats in [0, 64]>: how far the running max may lag before acc and l are
  // rescaled (default 0: eager, docs/NUMERICS.md section 6; 8 was the previous lazy rescale).
  float rescale_lag = 0.0f;
  // SPARSEMLA_CPU_ISA=baseline|avx2|avx512: forces the CPU backend's instruction-set level (tests
  // run the CPU suite once per level the machine has; a level the CPU lacks is an error at the
  // first CPU call). Default auto: the best level cpuid reports (docs/PERF.md, CPU backend).
  CpuIsaChoice cpu_isa = CpuIsaChoice::Auto;
};

// The knobs, read from the environment on first use (throws sparsemla::Error naming the variable
// when a value is malformed).
const Tuning& tuning();

// The parse behind tuning(): env(name) is the variable's value or null (tests pass their own).
Tuning parse_tuning(const char* (*env)(const char* name));

}  // namespace sparsemla::core
