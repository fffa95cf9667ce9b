// The split-count planners of CONTRACT 4.4 and the adaptive active-split rule of CONTRACT 4.5.
//
// Pure functions of shapes. Every quantity is an exact 64-bit integer: the generic cost
// waves(s) * (1/s + 0.04) is compared as the rational waves(s) * (25 + s) / (25 s), so ties are
// real ties (and keep the smaller s), never artefacts of rounding 0.04.
#include <algorithm>
#include <string>

#include "sparsemla/error.h"
#include "sparsemla/plan.h"

namespace sparsemla {

namespace {

// T * hb * 32 * 41 must stay far below 2^63; 2^40 tokens is beyond any batch.
constexpr int64_t kMaxPlanTokens = int64_t{1} << 40;
constexpr int64_t kCostDenominator = 25;  // 0.04 = 1/25

// ceil(a / b) for a >= 0, b >= 1, without forming a + b - 1 (no overflow near INT64_MAX).
int64_t ceil_div(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

void check_heads(const char* op, const std::string& arg, int32_t num_heads) {
  SPARSEMLA_CHECK_ARG(num_heads >= 1 && num_heads <= 128, op, arg, "in [1, 128]", num_heads);
}

void check_widths(const char* op, const std::string& prefix, int64_t width_main,
                  int64_t width_extra) {
  SPARSEMLA_CHECK_ARG(width_main >= 0, op, prefix + "width_main", ">= 0", width_main);
  SPARSEMLA_CHECK_ARG(width_extra >= 0, op, prefix + "width_extra", ">= 0", width_extra);
}

void check_shape(const char* op, const PlanShape& shape) {
  SPARSEMLA_CHECK_ARG(shape.num_tokens >= 0 && shape.num_tokens <= kMaxPlanTokens, op,
                      "shape.num_tokens", "in [0, 2^40]", shape.num_tokens);
  check_heads(op, "shape.num_heads", shape.num_heads);
  check_widths(op, "shape.", shape.width_main, shape.width_extra);
  SPARSEMLA_CHECK_ARG(shape.num_sms >= 1, op, "shape.num_sms", ">= 1", shape.num_sms);
}

int64_t iters_of(int64_t width_main, int64_t width_extra, int64_t s) {
  int64_t it = 0;
  if (width_main > 0) it += ceil_div(ceil_div(width_main, s), kPlanKeyBlock);
  if (width_extra > 0) it += ceil_div(ceil_div(width_extra, s), kPlanKeyBlock);
  return it;
}

// The quantities of CONTRACT 4.4 for one (validated) shape.
struct Planner {
  int64_t base;  // max(1, T * hb)
  int64_t cu;
  int64_t width_main;
  int64_t width_extra;

  explicit Planner(const PlanShape& shape)
      : base(std::max<int64_t>(1, shape.num_tokens * plan_head_blocks(shape.num_heads))),
        cu(shape.num_sms),
        width_main(shape.width_main),
        width_extra(shape.width_extra) {}

  int64_t waves(int64_t s) const { return ceil_div(base * s, cu); }
  int64_t iters(int64_t s) const { return iters_of(width_main, width_extra, s); }

  // The smallest s < splits doing the same waves and iterations as `splits`, else `splits`.
  int64_t shrink_equivalent(int64_t splits) const {
    for (int64_t s = 1; s < splits; ++s) {
      if (waves(s) == waves(splits) && iters(s) == iters(splits)) return s;
    }
    return splits;
  }
};

// waves(a) * (1/a + 1/25) < waves(b) * (1/b + 1/25), exactly.
bool cheaper(const Planner& pl, int64_t a, int64_t b) {
  return pl.waves(a) * (kCostDenominator + a) * b < pl.waves(b) * (kCostDenominator + b) * a;
}

}  // namespace

int64_t plan_head_blocks(int32_t num_heads) {
  check_heads("plan_head_blocks", "num_heads", num_heads);
  return ceil_div(num_heads, kPlanHeadBlock);
}

int64_t plan_iters(int64_t width_main, int64_t width_extra, int64_t s) {
  check_widths("plan_iters", "", width_main, width_extra);
  SPARSEMLA_CHECK_ARG(s >= 1, "plan_iters", "s", ">= 1", s);
  return iters_of(width_main, width_extra, s);
}

int32_t plan_generic(const PlanShape& shape) {
  check_shape("plan_generic", shape);
  if (shape.num_tokens == 0) return 1;  // nothing is launched
  const Planner pl(shape);
  int64_t best = 1;
  for (int64_t s = 2; s <= kGenericMaxSplits; ++s) {
    if (cheaper(pl, s, best)) best = s;  // strict: ties keep the smaller s
  }
  if (best > 1 && (pl.width_main > 0 || pl.width_extra > 0)) best = pl.shrink_equivalent(best);
  return static_cast<int32_t>(best);
}

int32_t plan_specialised_ref(const PlanShape& shape) {
  check_shape("plan_specialised_ref", shape);
  if (shape.num_tokens == 0) return 1;
  const Planner pl(shape);
  int64_t splits =
      std::min<int64_t>(kSpecialisedMaxSplits, std::max<int64_t>(1, ceil_div(2 * pl.cu, pl.base)));
  // Short rows: 4 splits already finish them in <= 3 key blocks each.
  if (pl.base >= 16 && splits > 4 && pl.iters(4) <= 3) return 4;
  if (pl.base >= 16 && pl.base < 64) {
    const int64_t one_wave = std::max<int64_t>(1, pl.cu / pl.base);
    const int64_t target_waves = pl.iters(one_wave) <= 9 ? 1 : 2;
    splits = std::min(splits, std::max<int64_t>(1, target_waves * pl.cu / pl.base));
  }
  if (pl.base >= 16 && splits > 1) splits = pl.shrink_equivalent(splits);
  return static_cast<int32_t>(splits);
}

// Tuned on the H200 (docs/PERF.md, "Splits on the sm90 path"; the re-tune of 2026-11-29 in
// docs/lab/planner.md): the sm90 kernel runs one CTA per SM,
// each covering 64 heads (G = ceil(hb / 4) CTAs per row and split), so S is sized to fill one
// wave, CU / (T * G), with at least two 32-key tiles per split (a CTA's fixed cost, ~8-20 us of
// cold loads and epilogue, needs work to amortise; more splits also write more partials), capped
// at 16 (the combine keeps every split's loads in flight together up to 16). Grids of < 8 CTAs per
// split are latency-bound: there one tile per split. The reference (16-head blocks as CTAs) left
// half the SMs idle at c128-h64 B = 8 (S = 8: 64 CTAs; 74 us against 54 us at S = 16) and B = 32
// (S = 3: 96 CTAs; 198 against 160 us at S = 4). Stays in [1, 32] (CONTRACT 4.4).
constexpr int32_t kSm90TunedMaxSplits = 16;
constexpr int64_t kSm90HeadsPerCta = 64;
constexpr int64_t kSm90LatencyBoundCtas = 8;

namespace {
// CTAs of the sm90 kernel per split: one per query row and group of 64 heads.
int64_t sm90_ctas_per_split(const PlanShape& shape) {
  return shape.num_tokens * ceil_div(shape.num_heads, kSm90HeadsPerCta);
}
}  // namespace

int32_t plan_sm90_tuned(const PlanShape& shape) {
  check_shape("plan_sm90_tuned", shape);
  if (shape.num_tokens == 0) return 1;
  const int64_t ctas = sm90_ctas_per_split(shape);
  const int64_t keys = shape.width_main + shape.width_extra;
  const int64_t s = ctas < kSm90LatencyBoundCtas
                        ? keys / kPlanKeyBlock
                        : std::min<int64_t>(shape.num_sms / ctas, keys / (2 * kPlanKeyBlock));
  return static_cast<int32_t>(std::clamp<int64_t>(s, 1, kSm90TunedMaxSplits));
}

// Measured (docs/PERF.md, "Path rule"; the cells below are from the 2026-11-29 tables of
// docs/lab/sm90-path.md and docs/lab/planner.md): sm90 wins every
// H >= 64 cell with >= 16 CTAs of 64 heads (1.1x at mtp-flash B=8 .. 3.6x at c128-h64 B=32) and
// the 8-CTA cells with long rows (c128-fixed B=8: 33.1 vs 46.4 us, c128-h64 B=8: 47.9 vs 123.6
// us); it loses with 8 CTAs of 640-key rows (c4-flash B=8: 24.5 vs 22.4 us) and at batch 1 (the
// first gather and the combine dominate). Below 64 heads (the 64-row tile computes 2-8x the heads)
// it wins from 32 query rows at 16 and 32 heads (tp-h16 B=32: 30.3 vs 33.9 us, B=128: 74.3 vs
// 90.8; tp-h32 B=32: 35.0 vs 55.3, B=128: 74.5 vs 105.4) and loses at B=8 (21.1 vs 20.7, 23.9 vs
// 23.7 us). 8 heads too, measured with the re-tuned S (record 2026-11-29T23:04Z): tp-h8 B=32
// 30.0 vs 33.0 us, B=128 74.1 vs 89.7 us (B=8: 21.2 vs 18.7, generic). The narrow rule counts
// 16-head blocks, T * ceil(H / 16) >= 32, from the head sweep of record
// docs/gpu-runs/2026-12-02T0058Z-main-f244efa.txt (c4-hH-1024, us, sm90 / generic): at B=16
// sm90 wins from 24 heads (h24 26.0 / 30.4, h32 26.8 / 30.9, h48 31.3 / 57.1) and loses at 8 and
// 16 heads (generic 22.3, 23.6 us); from B=32 sm90 wins or ties (h8 B=32 32.3 / 32.1) at every
// head count; B=8 stays generic (tp-h16 22.5 / 19.5, tp-h32 24.4 / 22.5, record
// 2026-12-02T0018Z).
constexpr int64_t kSm90MinCtas = 16;
constexpr int64_t kSm90MinCtasLongRows = 8;
constexpr int64_t kSm90LongRowKeys = 2048;
constexpr int32_t kSm90MinNarrowHeads = 8;
constexpr int64_t kSm90MinNarrowHeadBlocks = 32;

bool auto_prefers_sm90(const PlanShape& shape, bool deterministic) {
  check_shape("auto_prefers_sm90", shape);
  if (deterministic) return false;
  if (shape.num_heads < 64) {
    return shape.num_heads >= kSm90MinNarrowHeads &&
           shape.num_tokens * plan_head_blocks(shape.num_heads) >= kSm90MinNarrowHeadBlocks;
  }
  const int64_t ctas = sm90_ctas_per_split(shape);
  const int64_t keys = shape.width_main + shape.width_extra;
  return ctas >= kSm90MinCtas || (ctas >= kSm90MinCtasLongRows && keys >= kSm90LongRowKeys);
}

int32_t adaptive_one_wave(const PlanShape& shape, int32_t splits) {
  check_shape("adaptive_one_wave", shape);
  SPARSEMLA_CHECK_ARG(splits >= 1, "adaptive_one_wave", "splits", ">= 1", splits);
  const Planner pl(shape);
  if (pl.base >= 16 && pl.base < 64) {
    return static_cast<int32_t>(std::max<int64_t>(1, pl.cu / pl.base));
  }
  return splits;
}

int32_t adaptive_active_splits(int64_t len_main, int64_t len_extra, int32_t splits,
                               int32_t one_wave) {
  const char* op = "adaptive_active_splits";
  SPARSEMLA_CHECK_ARG(len_main >= 0, op, "len_main", ">= 0", len_main);
  SPARSEMLA_CHECK_ARG(len_extra >= 0, op, "len_extra", ">= 0", len_extra);
  SPARSEMLA_CHECK_ARG(splits >= 1, op, "splits", ">= 1", splits);
  SPARSEMLA_CHECK_ARG(one_wave >= 1, op, "one_wave", ">= 1", one_wave);
  const auto blocks_with = [&](int64_t pieces) {
    const int64_t keys_per_piece = pieces * kPlanKeyBlock;
    return ceil_div(len_main, keys_per_piece) + ceil_div(len_extra, keys_per_piece);
  };
  int32_t work = splits;
  if (one_wave > 4 && one_wave < splits && blocks_with(one_wave) <= 3) work = one_wave;
  if (blocks_with(4) <= 3) work = 4;
  return std::min(work, splits);
}

}  // namespace sparsemla
