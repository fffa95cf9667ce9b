// src/cpu/isa.h: the instruction-set level of the CPU backend's hot loops, chosen once per process.
//
// One binary runs everywhere: the hot loops (src/cpu/decode_kernels.inc) are compiled once per
// level into separate namespaces (src/cpu/isa/), and cpu_isa() picks one from cpuid at the first
// CPU call, or the level SPARSEMLA_CPU_ISA forces (src/core/tuning.h).
#pragma once

#include <cstdint>

namespace sparsemla::cpu {

enum class CpuIsa : int32_t {
  Baseline,  // the build's default flags (x86-64: SSE2, 4 fp32 lanes, no FMA)
  Avx2,      // AVX2 + FMA + F16C: 8 lanes, fused multiply-add, F16C dequantisation
  Avx512,    // AVX-512 F/VL/BW/DQ: 16 lanes, 32 vector registers
};

const char* cpu_isa_name(CpuIsa isa);

// Whether this CPU (cpuid, with OS support of the register state) and this build can run the level.
bool cpu_supports(CpuIsa isa);

// The level of this process: SPARSEMLA_CPU_ISA when set (throws sparsemla::Error naming the
// variable when the CPU or the build lacks that level), else the best supported one.
CpuIsa cpu_isa();

}  // namespace sparsemla::cpu
