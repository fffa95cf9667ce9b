// sparsemla/version.h: library version and build facts.
#pragma once

namespace sparsemla {
inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;
// True when this build holds the CUDA kernels.
bool built_with_cuda();
}  // namespace sparsemla
