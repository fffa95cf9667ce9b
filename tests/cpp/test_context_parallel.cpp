// Decode context parallelism (CONTRACT 12) on the CPU backend: the interleave rule, log_portable,
// shard_list against an independent split, merge_ranks against a float64 merge and on its exact
// edge cases, and the acceptance pipeline: a request's lists sharded into R = 2, 3, 8 pieces, each
// decoded without the sink on its own rank's cache, merged with the sink, compared with the float64
// reference of the unsharded decode (CONTRACT 9.9's rule with the naive oracle's A; lse within
// 9.4's tolerance). Fresh random data per run (SPARSEMLA_TEST_SEED reproduces one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "reference/cp_reference.h"
#include "reference/decode_fixture.h"
#include "reference/random.h"
#include "sparsemla/context_parallel.h"
#include "sparsemla/error.h"

namespace sparsemla::test::cp {
namespace {

using test::fresh_seed;
using test::random_f32;
using test::Rng;

using decode::CacheSpec;
using decode::CaseSpec;
using decode::inf_f32;
using decode::kPoisonBf16;
using decode::nan_f32;
using decode::run_reference;
using decode::Verdict;

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- the rule
// -------------------------------------------------------------------------------------
TEST(CpInterleave, LibraryRuleEqualsTheRoundRuleAndInverts) {
  for (const int32_t R : {1, 2, 3, 8}) {
    for (const int32_t I : {1, 2, 4, 64}) {
      std::vector<int64_t> next_local(static_cast<size_t>(R), 0);
      for (int64_t v = 0; v < 4096; ++v) {
        const int32_t r = cp_rank_of_slot(v, R, I);
        const int64_t l = cp_local_slot(v, R, I);
        ASSERT_EQ(r, rank_of(v, R, I)) << "R=" << R << " I=" << I << " v=" << v;
        ASSERT_EQ(l, local_of(v, R, I)) << "R=" << R << " I=" << I << " v=" << v;
        ASSERT_EQ(cp_virtual_slot(l, r, R, I), v);
        // A rank's slots, in increasing virtual order, are its local slots 0, 1, 2, ...
        ASSERT_EQ(l, next_local[r]++) << "R=" << R << " I=" << I << " v=" << v;
      }
    }
  }
  // vLLM's example: R = 2, I = 4: tokens 0-3 on rank 0, 4-7 on rank 1, 8-11 on rank 0 again.
  EXPECT_EQ(cp_rank_of_slot(5, 2, 4), 1);
  EXPECT_EQ(cp_rank_of_slot(9, 2, 4), 0);
  EXPECT_EQ(cp_local_slot(9, 2, 4), 5);
}

TEST(CpLogPortable, CorrectlyRoundedOnSamplesAndSpecialValues) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  int64_t off = 0;
  for (int i = 0; i < 200000; ++i) {
    // Whole float range, and [1, 1024] where the merge evaluates it (sums of R weights <= 1).
    const uint32_t bits = i % 2 == 0 ? static_cast<uint32_t>(rng.randint(1, 0x7F7FFFFF))
                                     : float_bits(static_cast<float>(rng.uniform(1.0, 1024.0)));
    const float x = bits_float(bits);
    const float got = log_portable(x);
    const double want = std::log(static_cast<double>(x));
    const float rounded = static_cast<float>(want);
    if (got != rounded) {
      ++off;  // allowed only at a near-tie: within 1e-15 relative of the midpoint
      const double mid = (static_cast<double>(got) + static_cast<double>(rounded)) / 2;
      ASSERT_LT(std::fabs(want - mid), 1e-14 * std::fabs(want) + 1e-300)
          << "x=" << x << " got=" << got << " want=" << want;
    }
  }
  EXPECT_LE(off, 2);
  EXPECT_EQ(log_portable(1.0f), 0.0f);
  EXPECT_EQ(log_portable(kInf), kInf);
  EXPECT_EQ(log_portable(0.0f), -kInf);
  EXPECT_EQ(log_portable(-0.0f), -kInf);
  EXPECT_TRUE(std::isnan(log_portable(-1.0f)));
  EXPECT_TRUE(std::isnan(log_portable(nan_f32())));
  EXPECT_NEAR(log_portable(bits_float(1)), std::log(std::ldexp(1.0, -149)), 1e-5);  // subnormal
}

// ---- shard_list ---------------------------------------------------------------------------------
TEST(ShardListCpu, EqualsTheIndependentSplitRaggedAndDense) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int64_t T = 9, N = 600, W = 80;
  for (const int32_t R : {1, 2, 3, 8}) {
    for (const int32_t I : {1, 2, 4}) {
      for (const bool dense : {false, true}) {
        for (const int64_t num_slots : {int64_t{0}, N}) {
          SCOPED_TRACE("R=" + std::to_string(R) + " I=" + std::to_string(I) + " dense=" +
                       std::to_string(dense) + " num_slots=" + std::to_string(num_slots));
          std::vector<std::vector<int32_t>> rows(T);
          std::vector<int32_t> dense_idx(static_cast<size_t>(T * (W + 3)), -1);
          std::vector<int32_t> lengths(T);
          std::vector<uint8_t> valid(T, 1);
          valid[4] = 0;  // a padding row
          for (int64_t t = 0; t < T; ++t) {
            lengths[t] = static_cast<int32_t>(t == 2 ? 0 : rng.randint(1, W));
            rows[t] = decode::random_row(rng, lengths[t], N, 0.2);
            std::copy(rows[t].begin(), rows[t].end(), dense_idx.begin() + t * (W + 3));
          }
          const TestList ragged = TestList::from_rows(rng, rows, /*lead=*/2);
          std::vector<std::vector<int32_t>> want_rows = rows;
          want_rows[4].clear();
          int64_t kept_total = 0;
          for (int32_t r = 0; r < R; ++r) {
            const auto want = shard_rows(want_rows, R, r, I, num_slots);
            std::vector<int32_t> idx(static_cast<size_t>(T * W), -7), ptr(T + 1, -7);
            ShardListParams p;
            p.common.num_rows = T;
            p.common.row_valid = valid.data();
            p.num_ranks = R;
            p.rank = r;
            p.interleave = I;
            p.num_slots = num_slots;
            if (dense) {
              p.list.indices = dense_idx.data();
              p.list.capacity = static_cast<int64_t>(dense_idx.size());
              p.list.width = W;
              p.list.dense_stride = W + 3;
              p.list.lengths = lengths.data();
            } else {
              p.list = ragged.view();
            }
            p.out = {idx.data(), ptr.data(), W};
            shard_list(p);
            ASSERT_EQ(ptr[0], 0);
            for (int64_t t = 0; t < T; ++t) {
              const std::vector<int32_t> got(idx.begin() + ptr[t], idx.begin() + ptr[t + 1]);
              ASSERT_EQ(got, want[t]) << "rank " << r << " row " << t;
              kept_total += static_cast<int64_t>(got.size());
            }
            for (size_t j = static_cast<size_t>(ptr[T]); j < idx.size(); ++j)
              ASSERT_EQ(idx[j], -7) << "written past indptr[T]";
          }
          // Every valid entry lands on exactly one rank.
          int64_t valid_total = 0;
          for (int64_t t = 0; t < T; ++t) {
            if (t == 4) continue;
            for (const int32_t v : rows[t]) valid_total += v >= 0 && (num_slots == 0 || v < N);
          }
          EXPECT_EQ(kept_total, valid_total);
        }
      }
    }
  }
}

// ---- merge_ranks on synthetic rank results
// -------------------------------------------------------
struct MergeOut {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
};

MergeOut run_merge(const Synthetic& s, bool f32, bool sink, bool rope,
                   const std::function<void(RankMergeParams&)>& edit = nullptr) {
  MergeOut m;
  m.out.assign(static_cast<size_t>(s.T * s.H * kDim), kPoisonBf16);
  m.lse.assign(static_cast<size_t>(s.T * s.H), nan_f32());
  RankMergeParams p;
  p.num_tokens = s.T;
  p.num_heads = s.H;
  p.num_ranks = s.R;
  if (f32) {
    p.rank_out_f32 = s.out_f32.data();
  } else {
    p.rank_out = s.out.data();
  }
  p.rank_lse = s.lse.data();
  p.sink = sink ? s.sink.data() : nullptr;
  if (rope) {
    p.positions = s.positions.data();
    p.rope = {s.rope.data(), static_cast<int64_t>(s.rope.size() / 64), 64};
  }
  p.out = m.out.data();
  p.lse = m.lse.data();
  p.path = Path::Cpu;
  if (edit) edit(p);
  merge_ranks(p);
  return m;
}

Merged64 reference_of(const Synthetic& s, bool f32, bool sink, bool rope) {
  std::vector<std::vector<double>> out(s.R), lse(s.R);
  const size_t row = static_cast<size_t>(s.T * s.H);
  for (int32_t r = 0; r < s.R; ++r) {
    for (size_t i = 0; i < row * kDim; ++i) {
      const size_t j = r * row * kDim + i;
      out[r].push_back(f32 ? s.out_f32[j] : bf16_to_float(s.out[j]));
    }
    for (size_t i = 0; i < row; ++i) lse[r].push_back(s.lse[r * row + i]);
  }
  return merge_reference(out, lse, s.T, s.H, sink ? s.sink.data() : nullptr,
                         rope ? s.positions.data() : nullptr, s.rope.data(), 64);
}

TEST(MergeRanksCpu, MatchesTheFloat64MergeBf16AndFp32) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (const int32_t R : {1, 2, 3, 8, 40}) {
    const Synthetic s = synthetic(rng, 3, 5, R, 0.15);
    for (const bool f32 : {false, true}) {
      for (const bool sink : {false, true}) {
        for (const bool rope : {false, true}) {
          SCOPED_TRACE("R=" + std::to_string(R) + " f32=" + std::to_string(f32) +
                       " sink=" + std::to_string(sink) + " rope=" + std::to_string(rope));
          const MergeOut m = run_merge(s, f32, sink, rope);
          const Merged64 ref = reference_of(s, f32, sink, rope);
          for (size_t i = 0; i < m.out.size(); ++i) {
            const double got = bf16_to_float(m.out[i]), want = ref.out[i];
            // The bf16 store (2^-8 |ref|) plus fp32 rounding of the weights and the sums (R + 10
            // roundings of 2^-24 each, relative to sum_r w_r |out_r|): 2^-16 of the scale.
            ASSERT_LE(std::fabs(got - want),
                      std::ldexp(std::fabs(want), -8) + std::ldexp(ref.scale[i], -16) + 1e-30)
                << "i=" << i << " got=" << got << " want=" << want;
          }
          for (size_t i = 0; i < m.lse.size(); ++i) {
            if (std::isinf(ref.lse[i])) {
              ASSERT_EQ(m.lse[i], kInf) << "i=" << i;
            } else {
              ASSERT_NEAR(m.lse[i], ref.lse[i], 1e-6 * (1 + std::fabs(ref.lse[i]))) << "i=" << i;
            }
          }
        }
      }
    }
  }
}

bool same_bits(const MergeOut& a, const MergeOut& b) {
  return a.out == b.out && std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

TEST(MergeRanksCpu, EdgeCasesAreExact) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int64_t T = 2;
  const int32_t H = 3;
  Synthetic s = synthetic(rng, T, H, 3, 0.0);
  const size_t row = static_cast<size_t>(T * H);

  // An empty rank (lse +inf, output poisoned: never read) changes nothing, bit for bit; so does
  // an lse of -inf; a rank whose weight underflows to 0 is not read either.
  Synthetic two = synthetic(rng, T, H, 2, 0.0);
  Synthetic three = two;
  three.R = 3;
  three.out.resize(3 * row * kDim);
  three.out_f32.resize(3 * row * kDim);
  three.lse.resize(3 * row);
  for (size_t i = 0; i < row; ++i) three.lse[2 * row + i] = i % 3 == 0 ? -kInf : kInf;
  three.lse[2 * row + 1] = two.lse[1] - 200.0f;  // exp(-200) underflows in fp32
  std::fill(three.out.begin() + 2 * row * kDim, three.out.end(), bf16_bits{0x7FC0});
  std::fill(three.out_f32.begin() + 2 * row * kDim, three.out_f32.end(), nan_f32());
  for (const bool f32 : {false, true}) {
    for (const bool sink : {false, true}) {
      EXPECT_TRUE(same_bits(run_merge(two, f32, sink, true), run_merge(three, f32, sink, true)))
          << "f32=" << f32 << " sink=" << sink;
    }
  }

  // All ranks empty: exact 0 (with or without sink, RoPE or not), lse +inf.
  Synthetic empty = s;
  std::fill(empty.lse.begin(), empty.lse.end(), kInf);
  std::fill(empty.out.begin(), empty.out.end(), bf16_bits{0x7FC0});
  for (const bool sink : {false, true}) {
    const MergeOut m = run_merge(empty, false, sink, true);
    for (const bf16_bits b : m.out) ASSERT_EQ(bf16_to_float(b), 0.0f);
    for (const float l : m.lse) ASSERT_EQ(l, kInf);
  }

  // Sink -inf is no sink, bit for bit; +inf gives exact 0 and leaves lse alone; NaN gives NaN
  // rows of its head and leaves lse alone.
  const MergeOut none = run_merge(s, false, false, true);
  for (const float v : {-kInf, kInf, nan_f32()}) {
    Synthetic t = s;
    std::fill(t.sink.begin(), t.sink.end(), 1.0f);
    t.sink[1] = v;
    const MergeOut m = run_merge(t, false, true, true);
    for (int64_t tt = 0; tt < T; ++tt) {
      const size_t i = static_cast<size_t>(tt * H + 1);
      ASSERT_EQ(std::memcmp(&m.lse[i], &none.lse[i], 4), 0) << "sink never changes lse";
      for (int d = 0; d < kDim; ++d) {
        const float got = bf16_to_float(m.out[i * kDim + d]);
        if (v == -kInf) {
          ASSERT_EQ(m.out[i * kDim + d], none.out[i * kDim + d]) << "d=" << d;
        } else if (v == kInf) {
          ASSERT_EQ(got, 0.0f) << "d=" << d;
        } else {
          ASSERT_TRUE(std::isnan(got)) << "d=" << d;
        }
      }
    }
  }

  // A NaN lse on one rank: NaN row and NaN lse (a NaN score in that rank's decode).
  Synthetic n = s;
  n.lse[row + 4] = nan_f32();
  const MergeOut m = run_merge(n, false, true, false);
  EXPECT_TRUE(std::isnan(m.lse[4]));
  for (int d = 0; d < kDim; ++d) ASSERT_TRUE(std::isnan(bf16_to_float(m.out[4 * kDim + d])));
  EXPECT_FALSE(std::isnan(m.lse[3]));

  // One rank, no sink, no RoPE: the rank's own bf16 output and lse, bit for bit.
  Synthetic one = synthetic(rng, T, H, 1, 0.0);
  const MergeOut o = run_merge(one, false, false, false);
  EXPECT_EQ(o.out, one.out);
  for (size_t i = 0; i < row; ++i) EXPECT_EQ(o.lse[i], one.lse[i]);
}

// Every argument is named when it is wrong, and nothing is written.
void expect_error(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MergeRanksCpu, BadInputsNameTheArgument) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const Synthetic s = synthetic(rng, 2, 4, 2, 0.0);
  const auto run = [&](const std::function<void(RankMergeParams&)>& edit) {
    return [&s, edit] {
      const MergeOut m = run_merge(s, false, true, true, edit);
      for (const bf16_bits b : m.out) ASSERT_EQ(b, kPoisonBf16) << "written before the error";
    };
  };
  run_merge(s, false, true, true, nullptr);  // the unbroken call runs
  const struct {
    const char* arg;
    std::function<void(RankMergeParams&)> edit;
  } rows[] = {
      {"'num_tokens'", [](RankMergeParams& p) { p.num_tokens = -1; }},
      {"'num_heads'", [](RankMergeParams& p) { p.num_heads = 0; }},
      {"'num_heads'", [](RankMergeParams& p) { p.num_heads = 129; }},
      {"'num_ranks'", [](RankMergeParams& p) { p.num_ranks = 0; }},
      {"'num_ranks'", [](RankMergeParams& p) { p.num_ranks = 1025; }},
      {"'rank_out'", [](RankMergeParams& p) { p.rank_out = nullptr; }},
      {"'rank_out_f32'", [&](RankMergeParams& p) { p.rank_out_f32 = s.out_f32.data(); }},
      {"'rank_lse'", [](RankMergeParams& p) { p.rank_lse = nullptr; }},
      {"'out'", [](RankMergeParams& p) { p.out = nullptr; }},
      {"'rank_out_stride_head'", [](RankMergeParams& p) { p.rank_out_stride_head = 511; }},
      {"'rank_out_stride_token'", [](RankMergeParams& p) { p.rank_out_stride_token = 100; }},
      {"'rank_out_stride_rank'", [](RankMergeParams& p) { p.rank_out_stride_rank = -5; }},
      {"'rank_lse_stride_head'", [](RankMergeParams& p) { p.rank_lse_stride_head = 0; }},
      {"'rank_lse_stride_rank'", [](RankMergeParams& p) { p.rank_lse_stride_rank = -1; }},
      {"'out_stride_head'", [](RankMergeParams& p) { p.out_stride_head = 256; }},
      {"'out_stride_token'", [](RankMergeParams& p) { p.out_stride_token = 1024; }},
      {"'lse_stride_head'", [](RankMergeParams& p) { p.lse_stride_head = 0; }},
      {"'rope.data'", [](RankMergeParams& p) { p.rope.data = nullptr; }},
      {"'positions[1]'",
       [](RankMergeParams& p) {
         static const int64_t bad[2] = {0, 99};  // the table has 50 rows
         p.positions = bad;
       }},
      {"'path'", [](RankMergeParams& p) { p.path = static_cast<Path>(7); }},
      {"'rank_lse'",
       [](RankMergeParams& p) {
         p.rank_lse = reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(p.rank_lse) + 1);
       }},
      // Outputs aliasing inputs (CONTRACT 12.1): an in-place merge into rank 1's slice.
      {"'lse'",
       [](RankMergeParams& p) {
         p.lse = const_cast<float*>(p.rank_lse) + p.num_tokens * p.num_heads;
       }},
      {"'out'", [](RankMergeParams& p) { p.out = const_cast<bf16_bits*>(p.rank_out); }},
      {"'lse'", [](RankMergeParams& p) { p.lse = reinterpret_cast<float*>(p.out) + 8; }},
  };
  for (const auto& r : rows) expect_error(run(r.edit), r.arg);
}

TEST(ShardListCpu, BadInputsNameTheArgument) {
  std::vector<int32_t> in = {0, 1, 2, 3, 4, 5, 6, 7}, iptr = {0, 4, 8};
  std::vector<int32_t> idx(8, -7), ptr(3, -7);
  const auto base = [&] {
    ShardListParams p;
    p.common.num_rows = 2;
    p.list = {in.data(), iptr.data(), 8, 4};
    p.num_ranks = 2;
    p.rank = 1;
    p.out = {idx.data(), ptr.data(), 4};
    return p;
  };
  shard_list(base());  // the unbroken call runs
  EXPECT_EQ(ptr, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + 4), (std::vector<int32_t>{0, 1, 2, 3}));
  std::fill(ptr.begin(), ptr.end(), -7);
  const struct {
    const char* arg;
    std::function<void(ShardListParams&)> edit;
  } rows[] = {
      {"'num_ranks'", [](ShardListParams& p) { p.num_ranks = 0; }},
      {"'rank'", [](ShardListParams& p) { p.rank = 2; }},
      {"'rank'", [](ShardListParams& p) { p.rank = -1; }},
      {"'interleave'", [](ShardListParams& p) { p.interleave = 0; }},
      {"'num_slots'", [](ShardListParams& p) { p.num_slots = -1; }},
      {"'common.num_rows'", [](ShardListParams& p) { p.common.num_rows = -1; }},
      {"'out.indptr'", [](ShardListParams& p) { p.out.indptr = nullptr; }},
      {"'out.indices'", [](ShardListParams& p) { p.out.indices = nullptr; }},
      {"'out.width'", [](ShardListParams& p) { p.out.width = 0; }},
      {"'out.width'", [](ShardListParams& p) { p.out.width = 1; }},  // a row of 2 on rank 1
      {"'list.indices'", [](ShardListParams& p) { p.list.indices = nullptr; }},
      {"'list.indptr[2]'", [](ShardListParams& p) { p.list.capacity = 7; }},
      {"'common.path'", [](ShardListParams& p) { p.common.path = static_cast<Path>(7); }},
  };
  for (const auto& r : rows) {
    expect_error(
        [&] {
          ShardListParams p = base();
          r.edit(p);
          shard_list(p);
        },
        r.arg);
    EXPECT_EQ(ptr, (std::vector<int32_t>(3, -7))) << r.arg << ": written before the error";
  }
}

// ---- the pipeline: shard, decode each rank without the sink, merge with it
// -----------------------
CaseSpec layer_spec(bool c128, int32_t R, int32_t I, int64_t T, int32_t H) {
  CaseSpec s;
  s.T = T;
  s.H = H;
  const int32_t bs = 8 * R * I;  // a virtual page of R pages of 8*I slots (I | the rank's page)
  s.main.block_size = bs;
  s.main.num_blocks = (256 + bs - 1) / bs;
  CacheSpec extra;
  extra.block_size = bs;
  extra.num_blocks = (c128 ? 1200 : 2400) / bs + 1;
  s.extra = extra;
  s.main_lengths.assign(T, 128);
  s.extra_lengths.resize(T);
  for (int64_t t = 0; t < T; ++t)
    s.extra_lengths[t] = c128 ? 1 + (t * 389) % 1024 : 1024;  // C4-Pro top-k
  s.sink = true;
  s.positions = true;
  s.p_invalid = 0.03;
  return s;
}

// Sinks near the rows' lse (~ln(keys) + 1.3 at model magnitudes), so that the sink holds 5-70% of
// the mass: a sink applied per rank, or not at all, is then far outside the tolerance (the
// fixture's sinks of ~N(0.5, 1) weigh ~1e-3 of a 1152-key row and would hide it).
void heavy_sinks(Rng& rng, DecodeCase& c, double lo, double hi) {
  for (auto& s : c.sink) s = static_cast<float>(rng.uniform(lo, hi));
}

Verdict merged_vs_unsharded(Rng& rng, const CaseSpec& spec, const PipelineSpec& ps,
                            FastRun* merged_out = nullptr) {
  DecodeCase c(rng, spec);
  heavy_sinks(rng, c, 5.0, 9.0);
  const RankRuns rr = run_ranks(c, ps);
  FastRun merged;
  merge_ranks(merge_params(c, ps.R, rr.out.data(), nullptr, rr.lse.data(), merged));
  const decode::RefRun ref = run_reference(c);
  const Verdict v = compare_merged(c, merged, ref, /*bf16_ranks=*/true);
  if (merged_out != nullptr) *merged_out = merged;
  return v;
}

TEST(CpDecodeCpu, ShardedDecodesMergedEqualTheUnshardedDecode) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (const bool c128 : {false, true}) {
    for (const int32_t R : {2, 3, 8}) {
      for (const int32_t I : {1, 2}) {
        PipelineSpec ps;
        ps.R = R;
        ps.I = I;
        ps.use_num_slots = I == 1;
        ps.splits = R == 3 ? 3 : 0;
        SCOPED_TRACE(std::string(c128 ? "C128" : "C4-Pro") + " R=" + std::to_string(R) +
                     " I=" + std::to_string(I));
        CaseSpec spec = layer_spec(c128, R, I, 3, 16);
        const Verdict v = merged_vs_unsharded(rng, spec, ps);
        EXPECT_TRUE(v.passed()) << v.describe();
        std::printf("[ cp ] %s R=%d I=%d: %s\n", c128 ? "C128" : "C4-Pro", R, I,
                    v.describe().c_str());
        spec.peaked = true;  // a few keys hold most of the mass
        const Verdict vp = merged_vs_unsharded(rng, spec, ps);
        EXPECT_TRUE(vp.passed()) << "peaked: " << vp.describe();
        std::printf("[ cp ] %s R=%d I=%d peaked: %s\n", c128 ? "C128" : "C4-Pro", R, I,
                    vp.describe().c_str());
      }
    }
  }
}

// Rule 3 at the merge's two-rounding threshold (CONTRACT 12.3) still fails the pipeline's own
// structural bugs, with every correct run of the same data passing it.
TEST(CpDecodeCpu, PlantedMergeBugsFailTheMergeRule) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  PipelineSpec ps;
  ps.R = 3;
  DecodeCase c(rng, layer_spec(false, ps.R, 1, 3, 16));
  heavy_sinks(rng, c, 5.0, 9.0);
  const RankRuns rr = run_ranks(c, ps);
  const decode::RefRun ref = run_reference(c);
  const auto merged_verdict = [&](const RankRuns& ranks, bool sink) {
    FastRun m;
    RankMergeParams mp = merge_params(c, ps.R, ranks.out.data(), nullptr, ranks.lse.data(), m);
    if (!sink) mp.sink = nullptr;
    merge_ranks(mp);
    return compare_merged(c, m, ref, /*bf16_ranks=*/true);
  };
  const Verdict ok = merged_verdict(rr, true);
  EXPECT_TRUE(ok.passed()) << ok.describe();
  const size_t row = static_cast<size_t>(c.T * c.H);
  RankRuns lost = rr, doubled = rr, sunk = rr;
  for (size_t i = 0; i < row; ++i) {
    lost.lse[2 * row + i] = kInf;  // rank 2's all-gather slot read as an empty rank
    std::fill_n(lost.out.begin() + (2 * row + i) * kDim, kDim, bf16_bits{0});
    doubled.lse[row + i] += std::log(2.0f);  // rank 1 weighed twice
  }
  for (int32_t r = 0; r < ps.R; ++r) decode_rank(c, sunk, r, ps.splits, /*with_sink=*/true);
  const struct {
    const char* name;
    Verdict v;
  } bugs[] = {{"sink not applied", merged_verdict(rr, false)},
              {"sink applied by every rank and by the merge", merged_verdict(sunk, true)},
              {"rank 2 lost", merged_verdict(lost, true)},
              {"rank 1 weighed twice", merged_verdict(doubled, true)}};
  for (const auto& b : bugs) {
    EXPECT_FALSE(b.v.cosine_pass()) << b.name << ": " << b.v.describe();
    std::printf("[ cp ] planted %s: cos diff %.3g (correct %.3g, tol %.3g)\n", b.name,
                b.v.cosine_diff, ok.cosine_diff, ok.cosine_tol);
  }
}

TEST(CpDecodeCpu, WindowListWholeOnRankZero) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  PipelineSpec ps;
  ps.R = 3;
  ps.shard_main = false;
  const Verdict v = merged_vs_unsharded(rng, layer_spec(false, 3, 1, 4, 8), ps);
  EXPECT_TRUE(v.passed()) << v.describe();
}

TEST(CpDecodeCpu, EmptyRanksAndEmptyRequests) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  // Rows of 0..3 keys over R = 8: most ranks empty in every row; row 0 has no key anywhere.
  CaseSpec spec = layer_spec(true, 8, 1, 4, 8);
  spec.main_lengths = {0, 1, 2, 0};
  spec.extra_lengths = {0, 0, 1, 3};
  spec.p_invalid = 0;
  PipelineSpec ps;
  ps.R = 8;
  const DecodeCase c(rng, spec);
  const RankRuns rr = run_ranks(c, ps);
  int64_t empty_ranks = 0;
  for (const float l : rr.lse) empty_ranks += l == kInf;
  EXPECT_GE(empty_ranks,
            8 * 4 * 8 - 7 * 8);  // 7 keys: at most 7 (rank, row) pairs per head hold one
  FastRun merged;
  merge_ranks(merge_params(c, 8, rr.out.data(), nullptr, rr.lse.data(), merged));
  const Verdict v = compare_merged(c, merged, run_reference(c), /*bf16_ranks=*/true);
  EXPECT_TRUE(v.passed()) << v.describe();
  for (int32_t h = 0; h < c.H; ++h) {
    EXPECT_EQ(merged.lse_at(0, h), kInf);
    for (int d = 0; d < kDim; ++d) ASSERT_EQ(merged.value(0, h, d), 0.0f);
  }
  // Every row empty: zeros and +inf, as the unsharded decode gives.
  spec.main_lengths.assign(4, 0);
  spec.extra_lengths.assign(4, 0);
  const DecodeCase e(rng, spec);
  const RankRuns er = run_ranks(e, ps);
  FastRun m;
  merge_ranks(merge_params(e, 8, er.out.data(), nullptr, er.lse.data(), m));
  for (int64_t t = 0; t < 4; ++t) {
    for (int32_t h = 0; h < e.H; ++h) {
      EXPECT_EQ(m.lse_at(t, h), kInf);
      for (int d = 0; d < kDim; ++d) ASSERT_EQ(m.value(t, h, d), 0.0f);
    }
  }
}

// fp32 rank outputs (here the float64 reference of each rank's decode, rounded to fp32) skip the
// ranks' bf16 store: the merged output is then within the final store's 2^-8 |ref| (plus fp32
// noise) of the unsharded reference, not only within 9.9's 2^-7 A.
TEST(CpDecodeCpu, Fp32RankOutputsMergeWithinOneBf16Rounding) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (const int32_t R : {2, 3, 8}) {
    PipelineSpec ps;
    ps.R = R;
    DecodeCase c(rng, layer_spec(false, R, 1, 2, 8));
    heavy_sinks(rng, c, 5.0, 9.0);
    const RankRuns rr = run_ranks(c, ps);
    const size_t row = static_cast<size_t>(c.T * c.H);
    std::vector<float> out32(R * row * kDim), lse32(R * row);
    for (int32_t r = 0; r < R; ++r) {
      std::vector<double> o(row * kDim), l(row);
      sparse_decode_reference(rank_params(c, rr, r, nullptr, nullptr), o.data(), l.data());
      for (size_t i = 0; i < o.size(); ++i) out32[r * row * kDim + i] = static_cast<float>(o[i]);
      for (size_t i = 0; i < l.size(); ++i) lse32[r * row + i] = static_cast<float>(l[i]);
    }
    FastRun merged;
    merge_ranks(merge_params(c, R, nullptr, out32.data(), lse32.data(), merged));
    const decode::RefRun ref = run_reference(c);
    const Verdict v = compare_merged(c, merged, ref, /*bf16_ranks=*/false);
    EXPECT_TRUE(v.passed()) << v.describe();
    std::printf("[ cp ] fp32 ranks R=%d: %s\n", R, v.describe().c_str());
    double worst = 0;
    for (int64_t t = 0; t < c.T; ++t) {
      for (int32_t h = 0; h < c.H; ++h) {
        for (int d = 0; d < kDim; ++d) {
          const double want = ref.value(t, h, d);
          const double a = ref.oracle_abs_mean[(t * c.H + h) * kDim + d];
          const double bound = std::ldexp(std::fabs(want), -8) + 1e-5 * a + 1e-6;
          worst = std::max(worst, std::fabs(merged.value(t, h, d) - want) / bound);
        }
      }
    }
    EXPECT_LE(worst, 1.0) << "R=" << R;
  }
}

}  // namespace
}  // namespace sparsemla::test::cp
