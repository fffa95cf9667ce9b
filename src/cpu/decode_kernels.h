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

// Absorbs keys [range.begin, range.end) of one list row into the running (m, l, acc) of the
// scratch's num_heads heads (CONTRACT 4.2 numerics), in blocks of 32 keys; invalid slots are
// skipped. The result depends on the level, never on the thread count.
using AbsorbSegmentFn = void (*)(const CacheView& cache, const ListRow& row, SplitRange range,
                                 bool scrub, int num_heads, float scale, Scratch& sc);

namespace baseline {
void absorb_segment(const CacheView& cache, const ListRow& row, SplitRange range, bool scrub,
                    int num_heads, float scale, Scratch& sc);
}
namespace avx2 {
void absorb_segment(const CacheView& cache, const ListRow& row, SplitRange range, bool scrub,
                    int num_heads, float scale, Scratch& sc);
}
namespace avx512 {
void absorb_segment(const CacheView& cache, const ListRow& row, SplitRange range, bool scrub,
                    int num_heads, float scale, Scratch& sc);
}

// The implementation of a level; only called for levels cpu_supports() says this build has.
inline AbsorbSegmentFn absorb_segment_for(CpuIsa isa) {
#if defined(SPARSEMLA_CPU_X86_LEVELS)
  if (isa == CpuIsa::Avx2) return avx2::absorb_segment;
#if defined(SPARSEMLA_CPU_HAVE_AVX512)
  if (isa == CpuIsa::Avx512) return avx512::absorb_segment;
#endif
#endif
  (void)isa;
  return baseline::absorb_segment;
}

}  // namespace sparsemla::cpu
