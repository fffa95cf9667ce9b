// The decode's hot loops at the baseline level: the build's default flags (x86-64: SSE2; arm64:
// NEON), 4 fp32 lanes, no FMA (src/cpu/decode_kernels.inc).
#include "cpu/isa/decode_kernels_includes.h"

#define SPARSEMLA_CPU_LANES 4
#define SPARSEMLA_CPU_FMA 0
#define SPARSEMLA_CPU_F16C 0

namespace sparsemla::cpu::baseline {
#include "cpu/decode_kernels.inc"
}  // namespace sparsemla::cpu::baseline
