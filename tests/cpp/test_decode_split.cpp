// Split-K of the CPU decode (CONTRACT 4.3, 4.5, 9.4): an fp64 split + combine written here
// against the unsplit reference, the fast path's partials in the caller's workspace layout, split
// counts against each other, empty splits, the direct S = 1 finish, and adaptive inactive splits
// whose NaN-poisoned accumulators must never be read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "reference/decode_fixture.h"
#include "sparsemla/decode.h"

namespace sparsemla::test::decode {
namespace {

CacheSpec cache_of(int64_t slots, int32_t bs) {
  CacheSpec c;
  c.block_size = bs;
  c.num_blocks = std::max<int64_t>(2, (slots + bs - 1) / bs);
  c.page_pad = bs % 2 == 0 ? 576 : 0;
  return c;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ---- fp64 split + combine (CONTRACT 4.3), written here
// ------------------------------------------------

struct Fp64Partial {
  bool active = false;  // the split saw at least one valid key
  double m = 0, l = 0;
  std::vector<double> acc = std::vector<double>(kDim, 0.0);
  std::vector<double> abs_acc = std::vector<double>(kDim, 0.0);  // sum_j w_j |K_j|
};

// Split s of `pieces` for (t, h): [s*c, min((s+1)*c, len)), c = ceil(len / pieces), main and
// extra segments cut separately; invalid slots skipped.
Fp64Partial fp64_partial(const DecodeCase& c, int64_t t, int32_t h, int32_t pieces, int32_t s) {
  std::vector<std::vector<double>> keys;
  const auto take = [&](const TestCache& cache, const TestList& list) {
    const std::vector<int32_t> row = list.row(t);
    const int64_t len = static_cast<int64_t>(row.size()), chunk = ceil_div(len, pieces);
    const int64_t begin = std::min(s * chunk, len), end = std::min(begin + chunk, len);
    for (int64_t j = begin; j < end; ++j) {
      if (row[j] < 0 || row[j] >= cache.num_slots()) continue;
      std::vector<double> k(kDim);
      for (int d = 0; d < kDim; ++d) {
        k[d] = cache.value(row[j], d);
        if (std::isnan(k[d])) k[d] = 0.0;
      }
      keys.push_back(std::move(k));
    }
  };
  take(*c.main, c.main_list);
  if (c.extra) take(*c.extra, c.extra_list);
  Fp64Partial part;
  if (keys.empty()) return part;
  std::vector<double> z;
  for (const auto& k : keys) {
    double dot = 0;
    for (int d = 0; d < kDim; ++d) dot += c.q_value(t, h, d) * k[d];
    z.push_back(static_cast<double>(kDefaultSoftmaxScale) * dot);
  }
  part.active = true;
  part.m = *std::max_element(z.begin(), z.end());
  for (size_t j = 0; j < keys.size(); ++j) {
    const double w = std::exp(z[j] - part.m);
    part.l += w;
    for (int d = 0; d < kDim; ++d) {
      part.acc[d] += w * keys[j][d];
      part.abs_acc[d] += w * std::fabs(keys[j][d]);
    }
  }
  return part;
}

// o = sum_s e^(m_s - M) acc_s / (sum_s e^(m_s - M) l_s + e^(sink - M)), 0 unless the
// denominator is > 0, then the inverse RoPE.
std::vector<double> fp64_combine(const DecodeCase& c, int64_t t, int32_t h,
                                 const std::vector<Fp64Partial>& parts) {
  double M = -INFINITY;
  for (const auto& p : parts) {
    if (p.active) M = std::max(M, p.m);
  }
  const double sink = c.use_sink ? c.sink[h] : -INFINITY;
  M = std::max(M, sink);
  double den = std::exp(sink - M);
  std::vector<double> o(kDim, 0.0);
  for (const auto& p : parts) {
    if (!p.active) continue;
    const double w = std::exp(p.m - M);
    den += w * p.l;
    for (int d = 0; d < kDim; ++d) o[d] += w * p.acc[d];
  }
  if (!(den > 0)) return std::vector<double>(kDim, 0.0);
  for (double& v : o) v /= den;
  if (c.use_positions) {
    const float* cs = &c.rope[c.positions[t] * c.rope_stride];
    for (int k = 0; k < 32; ++k) {
      const double a = o[kNope + 2 * k], b = o[kNope + 2 * k + 1];
      o[kNope + 2 * k] = a * cs[k] + b * cs[32 + k];
      o[kNope + 2 * k + 1] = b * cs[k] - a * cs[32 + k];
    }
  }
  return o;
}

// The fast path's partial (t, s, h) in the workspace layout of CONTRACT 4.3 (m, l fp32 [T, S, H],
// then acc fp32 [T, S, H, 512]) against the fp64 partial of the same key range.
void expect_partial_matches(const DecodeCase& c, const FastRun& run, int32_t splits, int64_t t,
                            int32_t s, int32_t h, const Fp64Partial& want) {
  SCOPED_TRACE("t=" + std::to_string(t) + " s=" + std::to_string(s) + " h=" + std::to_string(h));
  const int64_t rows = c.T * splits * c.H, r = (t * splits + s) * c.H + h;
  ASSERT_EQ(run.workspace.size(), static_cast<size_t>(rows * (2 + kDim)));
  const float m = run.workspace[r], l = run.workspace[rows + r];
  const float* acc = &run.workspace[2 * rows + r * kDim];
  if (!want.active) {  // empty, invalid-only or inactive: m = -FLT_MAX, l = 0, acc untouched
    ASSERT_EQ(m, -FLT_MAX);
    ASSERT_EQ(l, 0.0f);
    for (int d = 0; d < kDim; ++d) ASSERT_TRUE(std::isnan(acc[d])) << "acc written, d=" << d;
    return;
  }
  ASSERT_NEAR(m, want.m, 1e-4 * (1 + std::fabs(want.m)));
  ASSERT_NEAR(l, want.l, 1e-4 * want.l);
  // acc / l: each probability in P.V is rounded to bf16 (relative error <= 2^-8) while l sums the
  // fp32 ones, so |error| <= 2^-8 * sum_j w_j |K_j| / l; fp32 sums and scores add ~1e-5 of that.
  for (int d = 0; d < kDim; ++d) {
    const double got = acc[d] / l, ref = want.acc[d] / want.l;
    const double bound = (std::ldexp(1.0, -8) + 1e-4) * want.abs_acc[d] / want.l + 1e-6;
    ASSERT_LE(std::fabs(got - ref), bound) << "d=" << d << " got=" << got << " ref=" << ref;
  }
}

CaseSpec split_case(Rng& rng) {
  CaseSpec s;
  s.main_lengths = {0, 1, 5, 31, 32, 33, 64, 100, 129, 128};
  s.extra_lengths = {3, 0, 200, 65, 1, 64, 0, 300, 129, 31};
  s.T = static_cast<int64_t>(s.main_lengths.size());
  s.H = static_cast<int32_t>(rng.randint(2, 5));
  s.main = cache_of(256, 64);
  s.extra = cache_of(400, 16);
  s.p_invalid = 0.1;
  s.positions = true;
  return s;
}

// ---- tests
// ----------------------------------------------------------------------------------------

TEST(DecodeSplitCpu, Fp64SplitCombineEqualsUnsplitReference) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const DecodeCase c(rng, split_case(rng));
  const RefRun ref = run_reference(c);
  const NaiveRun nv = naive_decode(c);
  for (int32_t splits : {1, 2, 3, 4, 8, 32}) {
    SCOPED_TRACE("S=" + std::to_string(splits));
    for (int64_t t = 0; t < c.T; ++t) {
      const double tol = 1e-12 * std::max(1.0, nv.key_max[t]);
      for (int32_t h = 0; h < c.H; ++h) {
        std::vector<Fp64Partial> parts;
        for (int32_t s = 0; s < splits; ++s) parts.push_back(fp64_partial(c, t, h, splits, s));
        const std::vector<double> o = fp64_combine(c, t, h, parts);
        for (int d = 0; d < kDim; ++d) {
          ASSERT_NEAR(o[d], ref.value(t, h, d), tol) << "t=" << t << " h=" << h << " d=" << d;
        }
      }
    }
  }
}

TEST(DecodeSplitCpu, FastSplitCountsMatchUnsplitAndReference) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (bool peaked : {false, true}) {
    SCOPED_TRACE(peaked ? "peaked softmax" : "queries N(0,1)");
    CaseSpec s = split_case(rng);
    s.peaked = peaked;
    const DecodeCase c(rng, s);
    const RefRun ref = run_reference(c);
    const FastRun unsplit = run_fast(c, 1);
    RefRun unsplit_as_ref = ref;  // the S = 1 output, compared like a reference
    for (int64_t t = 0; t < c.T; ++t) {
      for (int32_t h = 0; h < c.H; ++h) {
        for (int d = 0; d < kDim; ++d)
          unsplit_as_ref.out[(t * c.H + h) * kDim + d] = unsplit.value(t, h, d);
        unsplit_as_ref.lse[t * c.H + h] = unsplit.lse_at(t, h);
      }
    }
    expect_kernel_matches_reference(c, unsplit, ref);
    for (int32_t splits : {2, 3, 4, 8, 32}) {
      SCOPED_TRACE("S=" + std::to_string(splits));
      const FastRun run = run_fast(c, splits);
      expect_kernel_matches_reference(c, run, ref);
      expect_kernel_matches_reference(c, run, unsplit_as_ref, true, /*kernels=*/2);
    }
  }
}

TEST(DecodeSplitCpu, PartialsFollowTheWorkspaceLayout) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  CaseSpec s = split_case(rng);
  s.H = 18;           // two head blocks (16 + 2)
  s.p_invalid = 0.3;  // some splits hold only invalid slots
  const DecodeCase c(rng, s);
  for (int32_t splits : {3, 4}) {
    SCOPED_TRACE("S=" + std::to_string(splits));
    const FastRun run = run_fast(c, splits);
    for (int64_t t = 0; t < c.T; ++t) {
      for (int32_t sp = 0; sp < splits; ++sp) {
        for (int32_t h = 0; h < c.H; ++h) {
          expect_partial_matches(c, run, splits, t, sp, h, fp64_partial(c, t, h, splits, sp));
        }
      }
    }
  }
}

TEST(DecodeSplitCpu, EmptySplitsAndTheDirectFinishAreBitExact) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  CaseSpec s;
  s.H = 5;
  s.main = cache_of(128, 64);
  s.extra = cache_of(128, 2);
  s.p_invalid = 0.3;
  s.positions = true;
  // Every key in split 0 whatever S is: S = 1 (the direct finish) equals the combine of S splits.
  s.main_lengths = {1, 0, 1, 0};
  s.extra_lengths = {0, 1, 1, 0};
  s.T = 4;
  const DecodeCase single(rng, s);
  const FastRun direct = run_fast(single, 1);
  for (int32_t splits : {2, 3, 32}) expect_same_bits(single, run_fast(single, splits), direct);
  // Lengths <= 3: c = 1 for every S >= 3, so S = 3 and S in {4, 8, 32} cut the same ranges and
  // differ only by empty splits, which the combine must ignore.
  s.main_lengths = {3, 2, 3, 1};
  s.extra_lengths = {2, 3, 3, 2};
  const DecodeCase small(rng, s);
  const FastRun three = run_fast(small, 3);
  for (int32_t splits : {4, 8, 32}) expect_same_bits(small, run_fast(small, splits), three);
  expect_kernel_matches_reference(small, three, run_reference(small));
}

// CONTRACT 4.5, written out here: the number of splits that do work for a row.
int32_t expected_work(int64_t len_main, int64_t len_extra, int32_t splits, int32_t one_wave) {
  const auto blocks = [&](int64_t pieces) {
    return ceil_div(len_main, pieces * 32) + ceil_div(len_extra, pieces * 32);
  };
  int32_t work = splits;
  if (4 < one_wave && one_wave < splits && blocks(one_wave) <= 3) work = one_wave;
  if (blocks(4) <= 3) work = 4;
  return std::min(work, splits);
}

TEST(DecodeSplitCpu, AdaptiveInactiveSplitsLeavePoisonedAccUnread) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  constexpr int32_t kSplits = 32, kCu = 256;
  CaseSpec s;
  s.T = 16;
  s.H = 3;  // base = T * ceil(H/16) = 16, so ONE_WAVE = CU / base = 16
  s.main = cache_of(256, 64);
  s.extra = cache_of(600, 64);
  s.main_lengths = {1, 1, 1};
  s.extra_lengths = {64, 512, 1536};  // CONTRACT 4.5's example: 4 / 16 / 32 active splits
  for (int64_t t = 3; t < s.T; ++t) {
    s.main_lengths.push_back(rng.randint(0, 128));
    s.extra_lengths.push_back(rng.randint(0, 1700));
  }
  s.p_invalid = 0.05;
  s.positions = true;
  const DecodeCase c(rng, s);
  const auto adaptive = [](DecodeParams& p) {
    p.adaptive_splits = true;
    p.num_sms = kCu;
  };
  const FastRun run = run_fast(c, kSplits, adaptive);  // workspace poisoned with NaN first
  expect_kernel_matches_reference(c, run, run_reference(c));

  std::vector<int32_t> work(c.T);
  for (int64_t t = 0; t < c.T; ++t) {
    work[t] = expected_work(c.main_list.row(t).size(), c.extra_list.row(t).size(), kSplits, 16);
  }
  EXPECT_EQ(work[0], 4);
  EXPECT_EQ(work[1], 16);
  EXPECT_EQ(work[2], 32);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int32_t sp = 0; sp < kSplits; ++sp) {
      for (int32_t h = 0; h < c.H; ++h) {
        // Splits >= work are inactive; active ones cut each segment by work, not S.
        const Fp64Partial want = sp < work[t] ? fp64_partial(c, t, h, work[t], sp) : Fp64Partial{};
        expect_partial_matches(c, run, kSplits, t, sp, h, want);
      }
    }
  }
  // A row with `work` active splits gives the bits of a plain run with S = work.
  for (int32_t plain_splits : {4, 16, 32}) {
    const FastRun plain = run_fast(c, plain_splits, [](DecodeParams& p) { p.num_sms = kCu; });
    for (int64_t t = 0; t < c.T; ++t) {
      if (work[t] != plain_splits) continue;
      for (int32_t h = 0; h < c.H; ++h) {
        for (int d = 0; d < kDim; ++d) ASSERT_EQ(run.bits(t, h, d), plain.bits(t, h, d));
      }
    }
  }
}

TEST(DecodeSplitCpu, PlannerSplitsMatchReference) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  CaseSpec s;
  s.T = 1;
  s.H = 16;
  s.main = cache_of(256, 64);
  s.extra = cache_of(512, 2);
  s.main_lengths = {128};
  s.extra_lengths = {300};
  s.positions = true;
  const DecodeCase c(rng, s);
  // Widths (128, 8192) on 256 CUs: the generic planner's (1, 1, 128, 8192) -> 16 (CONTRACT 4.4).
  const auto planned = [](DecodeParams& p) {
    p.num_sms = 256;
    p.main_list.width = 128;
    p.extra_list.width = 8192;
  };
  std::vector<bf16_bits> unused(1);  // decode_num_splits reads shapes only
  DecodeParams p = c.params(unused.data(), nullptr);
  planned(p);
  EXPECT_EQ(decode_num_splits(p), 16);
  expect_kernel_matches_reference(c, run_fast(c, 0, planned), run_reference(c));
}

}  // namespace
}  // namespace sparsemla::test::decode
