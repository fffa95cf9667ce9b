// The split-count planners (CONTRACT 4.4), the adaptive active-split rule (CONTRACT 4.5) and split
// ranges (CONTRACT 4.3): conformance values, range properties and a straightforward in-test
// transcription of the contract's pseudo-code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sparsemla/error.h"
#include "sparsemla/plan.h"

namespace sparsemla {
namespace {

// ---- A literal transcription of CONTRACT 4.4 / 4.5 (independent of src/core/plan.cpp) -----------

struct RefShape {
  long long t, hb, w_main, w_extra, cu;
};

long long ref_ceil(long long a, long long b) {
  return (a + b - 1) / b;
}  // small values only

long long ref_iters(const RefShape& x, long long s) {
  long long it = 0;
  if (x.w_main > 0) it += ref_ceil(ref_ceil(x.w_main, s), 32);
  if (x.w_extra > 0) it += ref_ceil(ref_ceil(x.w_extra, s), 32);
  return it;
}
long long ref_base(const RefShape& x) {
  return std::max(1LL, x.t * x.hb);
}
long long ref_waves(const RefShape& x, long long s) {
  return ref_ceil(ref_base(x) * s, x.cu);
}

long long ref_shrink(const RefShape& x, long long best) {
  for (long long s = 1; s < best; ++s) {
    if (ref_waves(x, s) == ref_waves(x, best) && ref_iters(x, s) == ref_iters(x, best)) return s;
  }
  return best;
}

long long ref_generic(const RefShape& x) {
  if (x.t == 0) return 1;
  // The cost in doubles, exactly as the contract writes it; differences below 1e-9 are real ties
  // (the costs are rationals with denominators <= 25*16), which keep the smaller s.
  long long best = 1;
  double best_cost = ref_waves(x, 1) * (1.0 + 0.04);
  for (long long s = 2; s <= 16; ++s) {
    const double cost = ref_waves(x, s) * (1.0 / s + 0.04);
    if (cost < best_cost - 1e-9 * best_cost) best = s, best_cost = cost;
  }
  if (best > 1 && (x.w_main > 0 || x.w_extra > 0)) best = ref_shrink(x, best);
  return best;
}

long long ref_specialised(const RefShape& x) {
  if (x.t == 0) return 1;
  const long long base = ref_base(x);
  long long s = std::min(32LL, std::max(1LL, ref_ceil(2 * x.cu, base)));
  if (base >= 16 && s > 4 && ref_iters(x, 4) <= 3) return 4;
  if (16 <= base && base < 64) {
    const long long ow = std::max(1LL, x.cu / base);
    const long long tw = ref_iters(x, ow) <= 9 ? 1 : 2;
    s = std::min(s, std::max(1LL, tw * x.cu / base));
  }
  if (base >= 16 && s > 1) s = ref_shrink(x, s);
  return s;
}

long long ref_active(long long len_main, long long len_extra, long long s, long long one_wave) {
  const long long it4 = ref_ceil(len_main, 4 * 32) + ref_ceil(len_extra, 4 * 32);
  long long work = s;
  if (4 < one_wave && one_wave < s &&
      ref_ceil(len_main, one_wave * 32) + ref_ceil(len_extra, one_wave * 32) <= 3) {
    work = one_wave;
  }
  if (it4 <= 3) work = 4;
  return std::min(work, s);
}

// hb = 1 for any H in [1, 16]; the conformance tuples give hb, so H = 16 * hb (and H = 16*hb - 15).
PlanShape shape_of(int64_t t, int32_t hb, int64_t w_main, int64_t w_extra, int32_t cu,
                   bool smallest_heads = false) {
  PlanShape s;
  s.num_tokens = t;
  s.num_heads = smallest_heads ? 16 * hb - 15 : 16 * hb;
  s.width_main = w_main;
  s.width_extra = w_extra;
  s.num_sms = cu;
  return s;
}

struct Conformance {
  int64_t t;
  int32_t hb;
  int64_t w_main, w_extra;
  int32_t expected;
};

std::string describe(const Conformance& c) {
  return "(T=" + std::to_string(c.t) + ", hb=" + std::to_string(c.hb) +
         ", w_main=" + std::to_string(c.w_main) + ", w_extra=" + std::to_string(c.w_extra) + ")";
}

// The sweep the range/agreement tests run over.
std::vector<int64_t> sweep_tokens() {
  std::vector<int64_t> t;
  for (int64_t i = 0; i <= 70; ++i) t.push_back(i);
  for (int64_t v : {96, 127, 128, 129, 200, 255, 256, 257, 300, 511, 512, 1024, 4096, 65536}) {
    t.push_back(v);
  }
  return t;
}
const std::vector<int32_t> kSweepHeads = {1, 8, 16, 17, 32, 33, 64, 100, 128};
const std::vector<int64_t> kSweepMain = {0, 1, 127, 128};
const std::vector<int64_t> kSweepExtra = {0,   1,    32,   33,   64,   256, 512,
                                          781, 1024, 2048, 3906, 7812, 8192};
const std::vector<int32_t> kSweepCu = {1, 3, 78, 108, 132, 256};

template <typename Fn>
void for_each_sweep_shape(Fn fn) {
  for (int32_t cu : kSweepCu) {
    for (int64_t t : sweep_tokens()) {
      for (int32_t h : kSweepHeads) {
        for (int64_t wm : kSweepMain) {
          for (int64_t we : kSweepExtra) {
            PlanShape s;
            s.num_tokens = t, s.num_heads = h, s.width_main = wm, s.width_extra = we;
            s.num_sms = cu;
            fn(s, RefShape{t, (h + 15) / 16, wm, we, cu});
          }
        }
      }
    }
  }
}

std::string text(const PlanShape& s) {
  return "T=" + std::to_string(s.num_tokens) + " H=" + std::to_string(s.num_heads) +
         " w_main=" + std::to_string(s.width_main) + " w_extra=" + std::to_string(s.width_extra) +
         " CU=" + std::to_string(s.num_sms);
}

template <typename Fn>
void expect_arg_error(Fn fn, const std::string& arg) {
  try {
    fn();
    ADD_FAILURE() << "expected sparsemla::Error naming '" << arg << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
  }
}

// ---- Conformance (CONTRACT 4.4, CU = 256) -------------------------------------------------------

TEST(PlanConformance, SpecialisedReferenceCu256PinnedValues) {
  const std::vector<Conformance> cases = {
      {1, 1, 128, 8192, 32}, {1, 1, 128, 32, 32},    {8, 1, 128, 32, 32},   {1, 1, 128, 7812, 32},
      {8, 1, 128, 7812, 32}, {17, 1, 128, 32, 4},    {16, 1, 128, 781, 13}, {48, 1, 128, 3906, 10},
      {64, 1, 128, 32, 4},   {64, 1, 128, 256, 4},   {64, 1, 128, 781, 7},  {64, 1, 128, 3906, 8},
      {64, 1, 128, 7812, 8}, {512, 1, 128, 7812, 1},
  };
  for (const auto& c : cases) {
    for (bool smallest : {false, true}) {
      EXPECT_EQ(plan_specialised_ref(shape_of(c.t, c.hb, c.w_main, c.w_extra, 256, smallest)),
                c.expected)
          << describe(c) << " H=" << (smallest ? 1 : 16);
    }
  }
}

TEST(PlanConformance, GenericReferenceCu256PinnedValues) {
  const std::vector<Conformance> cases = {
      {256, 1, 128, 0, 1},
      {1, 1, 128, 8192, 16},
      {8, 1, 128, 8192, 16},
      {64, 1, 128, 8192, 4},
  };
  for (const auto& c : cases) {
    for (bool smallest : {false, true}) {
      EXPECT_EQ(plan_generic(shape_of(c.t, c.hb, c.w_main, c.w_extra, 256, smallest)), c.expected)
          << describe(c);
    }
  }
}

TEST(PlanConformance, HeadBlocksAndItersValues) {
  EXPECT_EQ(plan_head_blocks(1), 1);
  EXPECT_EQ(plan_head_blocks(16), 1);
  EXPECT_EQ(plan_head_blocks(17), 2);
  EXPECT_EQ(plan_head_blocks(64), 4);
  EXPECT_EQ(plan_head_blocks(127), 8);
  EXPECT_EQ(plan_head_blocks(128), 8);
  EXPECT_EQ(plan_iters(0, 0, 1), 0);
  EXPECT_EQ(plan_iters(128, 0, 1), 4);
  EXPECT_EQ(plan_iters(128, 8192, 16), 1 + 16);
  EXPECT_EQ(plan_iters(128, 781, 13), 1 + 2);  // ceil(781/13) = 61 -> 2 blocks of 32
  EXPECT_EQ(plan_iters(1, 1, 32), 2);          // a non-empty segment costs at least one block
  EXPECT_EQ(plan_iters(0, 33, 1), 2);
  // Exact 64-bit arithmetic near the top of the range (no a + b - 1 overflow).
  const int64_t big = INT64_MAX;
  EXPECT_EQ(plan_iters(big, 0, 1), big / 32 + 1);
  for (int64_t wm : {0, 1, 31, 32, 33, 128, 1000}) {
    for (int64_t we : {0, 1, 64, 781, 8192}) {
      for (int64_t s = 1; s <= 40; ++s) {
        EXPECT_EQ(plan_iters(wm, we, s), ref_iters(RefShape{1, 1, wm, we, 1}, s));
      }
    }
  }
}

// ---- Agreement with the transcription and range properties --------------------------------------

TEST(PlanGeneric, MatchesSpecTranscriptionAndStaysIn1To16OverSweep) {
  for_each_sweep_shape([](const PlanShape& s, const RefShape& r) {
    const int32_t got = plan_generic(s);
    ASSERT_GE(got, 1) << text(s);
    ASSERT_LE(got, kGenericMaxSplits) << text(s);
    ASSERT_EQ(got, ref_generic(r)) << text(s);
  });
}

TEST(PlanSpecialisedRef, MatchesSpecTranscriptionAndStaysIn1To32OverSweep) {
  for_each_sweep_shape([](const PlanShape& s, const RefShape& r) {
    const int32_t got = plan_specialised_ref(s);
    ASSERT_GE(got, 1) << text(s);
    ASSERT_LE(got, kSpecialisedMaxSplits) << text(s);
    ASSERT_EQ(got, ref_specialised(r)) << text(s);
  });
}

TEST(PlanZeroTokens, EveryPlannerReturnsOne) {
  for (int32_t cu : {1, 132, 256}) {
    for (int64_t we : {0, 512, 8192}) {
      const PlanShape s = shape_of(0, 4, 128, we, cu);
      EXPECT_EQ(plan_generic(s), 1);
      EXPECT_EQ(plan_specialised_ref(s), 1);
      EXPECT_EQ(plan_sm90_tuned(s), 1);
    }
  }
}

TEST(PlanValidation, ErrorsNameTheArgument) {
  const PlanShape good = shape_of(4, 1, 128, 512, 132);
  using Planner = int32_t (*)(const PlanShape&);
  for (Planner plan : {&plan_generic, &plan_specialised_ref, &plan_sm90_tuned}) {
    PlanShape s = good;
    s.num_sms = 0;
    expect_arg_error([&] { plan(s); }, "shape.num_sms");
    s = good, s.num_heads = 0;
    expect_arg_error([&] { plan(s); }, "shape.num_heads");
    s = good, s.num_heads = 129;
    expect_arg_error([&] { plan(s); }, "shape.num_heads");
    s = good, s.width_main = -1;
    expect_arg_error([&] { plan(s); }, "shape.width_main");
    s = good, s.width_extra = -8;
    expect_arg_error([&] { plan(s); }, "shape.width_extra");
    s = good, s.num_tokens = -1;
    expect_arg_error([&] { plan(s); }, "shape.num_tokens");
    s = good, s.num_sms = 0, s.num_tokens = 0;  // T = 0 is still validated
    expect_arg_error([&] { plan(s); }, "shape.num_sms");
  }
  expect_arg_error([] { plan_head_blocks(0); }, "num_heads");
  expect_arg_error([] { plan_head_blocks(129); }, "num_heads");
  expect_arg_error([] { plan_iters(-1, 0, 1); }, "width_main");
  expect_arg_error([] { plan_iters(0, -1, 1); }, "width_extra");
  expect_arg_error([] { plan_iters(128, 0, 0); }, "s");
  expect_arg_error([&] { adaptive_one_wave(good, 0); }, "splits");
  expect_arg_error([] { adaptive_active_splits(-1, 0, 8, 4); }, "len_main");
  expect_arg_error([] { adaptive_active_splits(0, -1, 8, 4); }, "len_extra");
  expect_arg_error([] { adaptive_active_splits(1, 1, 0, 4); }, "splits");
  expect_arg_error([] { adaptive_active_splits(1, 1, 8, 0); }, "one_wave");
}

// The re-tunable policy of the specialised path (CONTRACT 4.4: range [1, 32] and sanity, not
// values).
TEST(PlanSm90Tuned, RangeAndSanityOnCu132Sweep) {
  for_each_sweep_shape([](const PlanShape& s0, const RefShape&) {
    PlanShape s = s0;
    s.num_sms = 132;
    const int32_t got = plan_sm90_tuned(s);
    ASSERT_GE(got, 1) << text(s);
    ASSERT_LE(got, kSpecialisedMaxSplits) << text(s);
    // The H200 tuning (docs/PERF.md, "Splits on the sm90 path"): at most 16 splits (the combine
    // keeps every split's loads in flight together); one wave of 64-head CTAs; >= 2 key tiles per
    // split unless the grid is latency-bound (< 8 CTAs per split), >= 1 tile there.
    ASSERT_LE(got, 16) << text(s);
    const int64_t ctas = s.num_tokens * ((s.num_heads + 63) / 64);
    const int64_t keys = s.width_main + s.width_extra;
    if (got > 1) {
      ASSERT_LE(ctas * got, std::max<int64_t>(132, ctas)) << "more than one wave: " << text(s);
      ASSERT_GE(keys, (ctas < 8 ? 32 : 64) * int64_t{got}) << "splits without work: " << text(s);
    }
    // And not fewer splits than that allows (the SMs are filled where the rows have the keys).
    const int64_t room = ctas < 8 ? keys / 32 : std::min<int64_t>(132 / ctas, keys / 64);
    if (s.num_tokens > 0) {
      ASSERT_EQ(got, std::clamp<int64_t>(room, 1, 16)) << text(s);
    }
    ASSERT_EQ(plan_sm90_tuned(s), got) << "a pure function of the shape: " << text(s);
    // Only hb = ceil(H/16) matters, whatever the tile shape (CONTRACT 4.4).
    PlanShape same_hb = s;
    same_hb.num_heads = (s.num_heads + 15) / 16 * 16;
    ASSERT_EQ(plan_sm90_tuned(same_hb), got) << text(s);
    // With 32 full waves of (row, head block) work, splitting cannot pay for the combine.
    if (s.num_tokens * ((s.num_heads + 15) / 16) >= 32 * 132) {
      ASSERT_LE(got, 2) << text(s);
    }
  });
}

// The cells the `auto` rule was read from (docs/PERF.md, "Path rule"; the 2026-11-29 tables of
// docs/lab/sm90-path.md and docs/lab/planner.md, the 2026-12-02 head sweep): true exactly where
// sm90 measured faster than the generic path. Widths as the bench passes them (the lists' dense
// widths: 8192 for the c128-h64/h128 lists of 2048..8192 entries).
TEST(AutoPrefersSm90, MatchesTheMeasuredCellsOnTheH200) {
  struct Cell {
    int64_t T;
    int32_t H;
    int64_t main, extra;
    bool sm90_faster;
  };
  const Cell cells[] = {
      {1, 64, 128, 512, false},
      {8, 64, 128, 512, false},  // c4-flash B=1, 8
      {32, 64, 128, 512, true},
      {128, 64, 128, 512, true},  // c4-flash B=32, 128
      {1, 128, 128, 1024, false},
      {8, 128, 128, 1024, true},  // c4-pro B=1, 8
      {1, 64, 128, 2048, false},
      {8, 64, 128, 2048, true},  // c128-fixed B=1, 8
      {8, 64, 128, 8192, true},
      {1, 128, 128, 8192, false},  // c128-h64 B=8, c128-h128 B=1
      {16, 64, 128, 512, true},    // mtp-flash B=8 (T = 16)
      {128, 16, 128, 1024, true},
      {32, 32, 128, 1024, true},  // tp-h16 B=128, tp-h32 B=32
      {32, 16, 128, 1024, true},
      {128, 32, 128, 1024, true},  // tp-h16 B=32, tp-h32 B=128
      {8, 16, 128, 1024, false},
      {8, 32, 128, 1024, false},  // tp-h16 / tp-h32 B=8
      {32, 8, 128, 1024, true},
      {128, 8, 128, 1024, true},  // tp-h8 B=32, 128
      {8, 8, 128, 1024, false},
      {128, 4, 128, 1024, false},  // tp-h8 B=8; 4 heads: unmeasured
      // head sweep c4-hH-1024 (record 2026-12-02T0058Z): B=16 sm90 from 24 heads
      {16, 8, 128, 1024, false},
      {16, 16, 128, 1024, false},  // h8 / h16 B=16: generic
      {16, 24, 128, 1024, true},
      {16, 32, 128, 1024, true},  // h24 / h32 B=16
      {16, 48, 128, 1024, true},
      {64, 16, 128, 1024, true},  // h48 B=16, h16 B=64
  };
  for (const Cell& c : cells) {
    PlanShape s;
    s.num_tokens = c.T;
    s.num_heads = c.H;
    s.width_main = c.main;
    s.width_extra = c.extra;
    s.num_sms = 132;
    EXPECT_EQ(auto_prefers_sm90(s, false), c.sm90_faster) << text(s);
    EXPECT_FALSE(auto_prefers_sm90(s, true)) << "deterministic calls stay generic: " << text(s);
  }
}

// ---- Adaptive active splits (CONTRACT 4.5) ------------------------------------------------------

TEST(AdaptiveSplits, SpecExampleS32OneWave16) {
  EXPECT_EQ(adaptive_active_splits(1, 64, 32, 16), 4);
  EXPECT_EQ(adaptive_active_splits(1, 512, 32, 16), 16);
  EXPECT_EQ(adaptive_active_splits(1, 1536, 32, 16), 32);
  // ONE_WAVE for that example: T*hb = 16 rows on 256 CUs.
  EXPECT_EQ(adaptive_one_wave(shape_of(16, 1, 128, 8192, 256), 32), 16);
}

TEST(AdaptiveSplits, MatchesSpecTranscriptionAndStaysIn1ToS) {
  std::vector<int64_t> lens = {0,   1,    2,    31,   32,   33,   64,   127, 128,
                               129, 255,  256,  257,  383,  384,  385,  511, 512,
                               513, 1024, 1535, 1536, 1537, 2048, 4096, 8192};
  for (int32_t s : {1, 2, 3, 4, 5, 8, 13, 16, 31, 32}) {
    for (int32_t ow : {1, 2, 4, 5, 6, 8, 13, 16, 32, 33}) {
      for (int64_t lm : {0, 1, 100, 128}) {
        for (int64_t le : lens) {
          const int32_t got = adaptive_active_splits(lm, le, s, ow);
          ASSERT_GE(got, 1);
          ASSERT_LE(got, s);
          ASSERT_EQ(got, ref_active(lm, le, s, ow))
              << "len_main=" << lm << " len_extra=" << le << " S=" << s << " ONE_WAVE=" << ow;
        }
      }
    }
  }
}

TEST(AdaptiveOneWave, CuOverBaseOnlyForBase16To63) {
  for (int32_t cu : {1, 8, 132, 256}) {
    for (int64_t t = 0; t <= 80; ++t) {
      for (int32_t h : {1, 16, 17, 64}) {
        const PlanShape s = shape_of(t, 1, 128, 512, cu);
        PlanShape sh = s;
        sh.num_heads = h;
        const int64_t base = std::max<int64_t>(1, t * ((h + 15) / 16));
        const int32_t expected =
            (base >= 16 && base < 64) ? static_cast<int32_t>(std::max<int64_t>(1, cu / base)) : 24;
        ASSERT_EQ(adaptive_one_wave(sh, 24), expected) << text(sh);
      }
    }
  }
  EXPECT_EQ(adaptive_one_wave(shape_of(48, 1, 128, 3906, 256), 10), 5);
  EXPECT_EQ(adaptive_one_wave(shape_of(20, 1, 128, 512, 8), 32), 1);  // CU / base = 0 -> 1
}

// ---- Split ranges (CONTRACT 4.3) ----------------------------------------------------------------

TEST(SplitRange, CoversSegmentExactlyAndDisjointly) {
  std::vector<int64_t> lens;
  for (int64_t l = 0; l <= 300; ++l) lens.push_back(l);
  for (int64_t l : {1023, 1024, 1025, 8191, 8192, 100000}) lens.push_back(l);
  for (int64_t len : lens) {
    for (int32_t pieces = 1; pieces <= 40; ++pieces) {
      const int64_t c = (len + pieces - 1) / pieces;
      int64_t covered_to = 0;
      for (int32_t s = 0; s < pieces; ++s) {
        const SplitRange r = split_range(len, pieces, s);
        ASSERT_LE(r.begin, r.end);
        ASSERT_EQ(r.begin, covered_to) << "len=" << len << " S=" << pieces << " s=" << s;
        ASSERT_LE(r.end - r.begin, c);
        // [s*c, min((s+1)*c, len)) of CONTRACT 4.3, empty once s*c >= len.
        ASSERT_EQ(r.begin, std::min<int64_t>(s * c, len));
        ASSERT_EQ(r.end, std::min<int64_t>((s + 1) * c, len));
        covered_to = r.end;
      }
      ASSERT_EQ(covered_to, len) << "len=" << len << " S=" << pieces;
    }
  }
}

TEST(SplitRange, EmptySplitsWhenMoreSplitsThanKeys) {
  for (int64_t len = 0; len <= 31; ++len) {
    for (int32_t pieces = static_cast<int32_t>(len) + 1; pieces <= 32; ++pieces) {
      int64_t non_empty = 0, total = 0;
      for (int32_t s = 0; s < pieces; ++s) {
        const SplitRange r = split_range(len, pieces, s);
        non_empty += r.end > r.begin;
        total += r.end - r.begin;
      }
      EXPECT_EQ(total, len);
      EXPECT_EQ(non_empty, len) << "one key per split, the rest empty: len=" << len;
      EXPECT_LT(non_empty, pieces);
    }
  }
}

}  // namespace
}  // namespace sparsemla
