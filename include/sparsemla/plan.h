// sparsemla/plan.h: choosing the split count S from shapes only (CONTRACT 4.4) and the adaptive
// active-split rule (CONTRACT 4.5). Pure functions; nothing is read from the GPU.
#pragma once

#include <cstdint>

namespace sparsemla {

inline constexpr int32_t kPlanKeyBlock = 32;   // bk
inline constexpr int32_t kPlanHeadBlock = 16;  // heads per head block: hb = ceil(H / 16)
inline constexpr int32_t kGenericMaxSplits = 16;
inline constexpr int32_t kSpecialisedMaxSplits = 32;

struct PlanShape {
  int64_t num_tokens = 0;   // T
  int32_t num_heads = 0;    // H (hb = ceil(H/16))
  int64_t width_main = 0;   // dense width of the main list (cap / T)
  int64_t width_extra = 0;  // dense width of the extra list (0: none)
  int32_t num_sms = 0;      // CU
};

int64_t plan_head_blocks(int32_t num_heads);
// iters(s) of CONTRACT 4.4.
int64_t plan_iters(int64_t width_main, int64_t width_extra, int64_t s);

// The generic selector (cap 16). T = 0 returns 1 (nothing is launched).
int32_t plan_generic(const PlanShape& shape);
// The specialised selector exactly as in CONTRACT 4.4 (reference; conformance-pinned; cap 32).
int32_t plan_specialised_ref(const PlanShape& shape);
// The policy the specialised path launches with on our 132-SM GPU (CONTRACT 4.4: separately named,
// re-tuned by measurement, constants and evidence in docs/PERF.md, "Splits on the sm90 path"):
// one wave of 64-head CTAs,
// CU / (T * ceil(hb / 4)), with >= 2 key tiles per split (>= 1 when fewer than 8 CTAs per split),
// capped at 16. Always in [1, 32]; T = 0 -> 1.
int32_t plan_sm90_tuned(const PlanShape& shape);

// Whether `auto` takes the sm90-specialised path where the architecture gate allows it: where it
// was measured faster than the generic path on the H200 (docs/PERF.md, "Path rule"): >= 64
// heads and either >= 16 CTAs of 64 heads (T * ceil(H / 64)), or >= 8 such CTAs with rows of
// >= 2048 keys (width_main + width_extra); 8..63 heads from T * ceil(H / 16) >= 32 (so 8..16 heads
// from T >= 32, 17..32 from T >= 16). Deterministic calls stay
// generic (their S may not depend on T, and the rule does).
bool auto_prefers_sm90(const PlanShape& shape, bool deterministic);

// ONE_WAVE of CONTRACT 4.5: max(1, CU / base) when 16 <= base < 64, else S.
int32_t adaptive_one_wave(const PlanShape& shape, int32_t splits);
// Number of splits that do work for a row with true lengths (len_main, len_extra) (CONTRACT 4.5).
int32_t adaptive_active_splits(int64_t len_main, int64_t len_extra, int32_t splits,
                               int32_t one_wave);

// Split s of a segment of length len cut into `pieces`: [begin, end), c = ceil(len / pieces).
struct SplitRange {
  int64_t begin;
  int64_t end;
};
inline SplitRange split_range(int64_t len, int32_t pieces, int32_t s) {
  const int64_t c = (len + pieces - 1) / pieces;
  int64_t b = s * c, e = b + c;
  if (b > len) b = len;
  if (e > len) e = len;
  return {b, e};
}

}  // namespace sparsemla
