// src/core/merge_math.h: the arithmetic of the context-parallel merge (CONTRACT 12.1), one copy
// for the CPU backend (src/cpu/context_parallel.cpp) and the CUDA kernel
// (src/cuda/generic/context_parallel.cu), so that both give the same bits: fp32 operations each
// rounded on its own (__fmul_rn / __fadd_rn / __fdiv_rn on the device, where nvcc would otherwise
// contract a*b + c into an FMA; plain operators on the host, whose translation unit is compiled
// with -ffp-contract=off), exp and ln from exp_portable / log_portable, ranks summed in order.
// The finish follows the CPU decode's (src/cpu/decode_fast.cpp, finish_row): the same special
// rows of CONTRACT 4.2.
#pragma once

#include <cfloat>
#include <cstdint>

#include "sparsemla/context_parallel.h"
#include "sparsemla/numerics.h"

namespace sparsemla::merge {

inline constexpr float kNoMass = -FLT_MAX;  // the running max before any active rank

SPARSEMLA_HOST_DEVICE float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SPARSEMLA_HOST_DEVICE float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SPARSEMLA_HOST_DEVICE float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
SPARSEMLA_HOST_DEVICE float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
SPARSEMLA_HOST_DEVICE float fmax_(float a, float b) {  // fmaxf: a NaN operand is skipped
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  return std::fmax(a, b);
#endif
}
SPARSEMLA_HOST_DEVICE bool is_nan(float x) {
  return x != x;
}
SPARSEMLA_HOST_DEVICE float pos_inf() {
  return bits_float(0x7F800000u);
}
SPARSEMLA_HOST_DEVICE float quiet_nan() {
  return bits_float(0x7FC00000u);
}

// A rank takes part when its lse is finite or NaN; +inf (no valid key, CONTRACT 4.3a) or -inf (no
// mass) contributes nothing and its output is never read.
SPARSEMLA_HOST_DEVICE bool active(float lse) {
  return (float_bits(lse) & 0x7FFFFFFFu) != 0x7F800000u;
}
// The running max of the active ranks (NaN skipped, as fmaxf does).
SPARSEMLA_HOST_DEVICE float max_step(float running, float lse) {
  return active(lse) ? fmax_(running, lse) : running;
}
// exp(lse - m) for an active rank, else 0.
SPARSEMLA_HOST_DEVICE float weight(float lse, float m) {
  return active(lse) ? exp_portable(fsub(lse, m)) : 0.0f;
}

// The row's finish from the ranks' (M', sum of weights at M): CONTRACT 4.2's special rows first.
struct Finish {
  bool nan_row;   // every output NaN (NaN mass or NaN sink)
  bool zero_row;  // every output 0 (no mass, or a +inf sink)
  float div;      // the denominator max(den, 1e-30) otherwise
};
SPARSEMLA_HOST_DEVICE Finish finish(float sum_w, bool has_sink, float sink, float big_m) {
  Finish f;
  f.nan_row = is_nan(sum_w) || (has_sink && is_nan(sink));
  const float den = has_sink ? fadd(sum_w, exp_portable(fsub(sink, big_m))) : sum_w;
  f.zero_row = !(den > 0.0f) || (has_sink && sink == pos_inf());
  f.div = fmax_(den, 1e-30f);
  return f;
}
SPARSEMLA_HOST_DEVICE float big_max(float max_m, bool has_sink, float sink) {
  return has_sink ? fmax_(max_m, sink) : max_m;
}

// lse without the sink: M' + ln(sum_r exp(lse_r - M')); +inf without mass, NaN when it is NaN.
SPARSEMLA_HOST_DEVICE float merged_lse(float max_m, float sum_l) {
  if (sum_l > 0.0f) return fadd(max_m, log_portable(sum_l));
  return sum_l == 0.0f ? pos_inf() : quiet_nan();
}

// Inverse RoPE of pair (a, b) with (c, s) (CONTRACT 1), each product and sum rounded on its own.
SPARSEMLA_HOST_DEVICE void inverse_rope_pair(float& a, float& b, float c, float s) {
  const float na = fadd(fmul(a, c), fmul(b, s));
  const float nb = fsub(fmul(b, c), fmul(a, s));
  a = na;
  b = nb;
}

}  // namespace sparsemla::merge
