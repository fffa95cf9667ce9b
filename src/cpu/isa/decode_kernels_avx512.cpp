// The decode's hot loops at the AVX-512 level: AVX-512 F/VL/BW/DQ + FMA + F16C, 16 fp32 lanes and
// 32 vector registers (src/cpu/decode_kernels.inc). Only called where cpu_supports(Avx512).
#include "cpu/isa/decode_kernels_includes.h"

#define SPARSEMLA_CPU_LANES 16
#define SPARSEMLA_CPU_FMA 1
#define SPARSEMLA_CPU_F16C 1

// After the includes: only the functions defined below get the target (see the includes header).
#if defined(__clang__)
#pragma clang attribute push(                                                    \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")
#endif

namespace sparsemla::cpu::avx512 {
#include "cpu/decode_kernels.inc"
}  // namespace sparsemla::cpu::avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
