// src/cpu/decode_kernels.h: the fast CPU decode's hot loops (dequantise, Q.K, softmax, P.V of one
// key segment), one implementation per instruction-set level (src/cpu/isa.h), all from the single
// source src/cpu/decode_kernels.inc.
#pragma once

#include <cstdint>

#include "cpu/decode_common.h"
#include "cpu/isa.h"
#include "sparsemla/format.h"
#include "sparsemla/plan.h"

namespace sparsemla::cpu {

inline constexpr int kDecodeDim = Fp8DsMla::kHeadDim;
inline constexpr int kDecodeKeyBlock = kPlanKeyBlock;    // keys per online-softmax step (bk = 32)
inline constexpr int kDecodeHeadBlock = kPlanHeadBlock;  // heads sharing one dequantised key block

// Per-thread scratch: one dequantised key block, the head block's q, scores and running state.
struct Scratch {
  alignas(64) float keys[kDecodeKeyBlock][kDecodeDim];
  alignas(64) float q[kDecodeHeadBlock][kDecodeDim];
  alignas(64) float acc[kDecodeHeadBlock][kDecodeDim];
  alignas(64) float score[kDecodeHeadBlock][kDecodeKeyBlock];
  alignas(64) float prob[kDecodeHeadBlock][kDecodeKeyBlock];  // bf16-rounded probabilities
  float alpha[kDecodeHeadBlock];                              // rescale of acc for the block
  float m[kDecodeHeadBlock];
  float l[kDecodeHeadBlock];
};

// One level's entry points. absorb_segment: keys [range.begin, range.end) of one list row into the
// running (m, l, acc) of the scratch's num_heads heads (CONTRACT 4.2 numerics), in blocks of 32
// keys, invalid slots skipped; the result depends on the level, never on the thread count. The two
// others expose the level's dequantisation (K as the decode sees it) and its exp to the tests.
struct DecodeKernels {
  void (*absorb_segment)(const CacheView& cache, const ListRow& row, SplitRange range, bool scrub,
                         int num_heads, float scale, Scratch& sc);
  void (*load_key)(const CacheView& cache, int64_t slot, bool scrub, float* k512);
  void (*exp_values)(const float* x, int n, float* y);
};

#define SPARSEMLA_DECLARE_DECODE_KERNELS(level)                                                 \
  namespace level {                                                                             \
  void absorb_segment(const CacheView& cache, const ListRow& row, SplitRange range, bool scrub, \
                      int num_heads, float scale, Scratch& sc);                                 \
  void load_key_row(const CacheView& cache, int64_t slot, bool scrub, float* k512);             \
  void exp_values(const float* x, int n, float* y);                                             \
  inline constexpr DecodeKernels kKernels{absorb_segment, load_key_row, exp_values};            \
  }
SPARSEMLA_DECLARE_DECODE_KERNELS(baseline)
SPARSEMLA_DECLARE_DECODE_KERNELS(avx2)
SPARSEMLA_DECLARE_DECODE_KERNELS(avx512)
#undef SPARSEMLA_DECLARE_DECODE_KERNELS

// The implementation of a level (src/cpu/isa.cpp); baseline for a level this build lacks.
const DecodeKernels& decode_kernels_for(CpuIsa isa);

}  // namespace sparsemla::cpu
