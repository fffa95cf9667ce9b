// The decode's hot loops at the AVX2 level: AVX2 + FMA + F16C, 8 fp32 lanes, fused multiply-add
// (src/cpu/decode_kernels.inc). Only called where cpu_supports(CpuIsa::Avx2) (src/cpu/isa.cpp).
#include "cpu/isa/decode_kernels_includes.h"

#define SPARSEMLA_CPU_LANES 8
#define SPARSEMLA_CPU_FMA 1
#define SPARSEMLA_CPU_F16C 1

// After the includes: only the functions defined below get the target (see the includes header).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace sparsemla::cpu::avx2 {
#include "cpu/decode_kernels.inc"
}  // namespace sparsemla::cpu::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
