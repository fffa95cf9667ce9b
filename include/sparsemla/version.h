// sparsemla/version.h: library version and build facts.
#pragma once

namespace sparsemla {
inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;
// True when this build holds the CUDA kernels.
bool built_with_cuda();
// The CPU backend's instruction-set level in this process: "baseline", "avx2" or "avx512" (the best
// the CPU supports, or SPARSEMLA_CPU_ISA; throws sparsemla::Error for a level the CPU lacks).
const char* cpu_isa();
}  // namespace sparsemla
