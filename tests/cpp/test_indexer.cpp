// The lightning-indexer decode on the CPU against the float64 reference (CONTRACT 11.7, catalogue
// 11.8): exact-arithmetic data bit for bit, planted needles, the near-tie rule on random data,
// invalid device values, NaN keys, ties and low-contrast rows, long rows, MTP groups, determinism
// and the host errors of 11.4.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "reference/decode_fixture.h"
#include "reference/indexer_checks.h"
#include "reference/indexer_reference.h"
#include "reference/random.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer.h"
#include "sparsemla/lists.h"

#if defined(SPARSEMLA_HAVE_OPENMP)
#include <omp.h>
#endif

namespace sparsemla::test {
namespace {

using decode::CacheSpec;
using decode::CaseSpec;
using decode::DecodeCase;
using decode::FastRun;
using decode::TestList;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

constexpr double kCpuEps = 1.0 / 65536;  // 2^-16 for fp32 FMA paths (CONTRACT 11.7)

// 11.8.1 and 11.8.7 on exact data: lengths around k and the page, k, W > k, both orders, layouts,
// page sizes and head counts.
TEST(CpuIndexer, ExactDataMatchesReferenceBitForBitAcrossLengthsAndLayouts) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  struct Shape {
    int32_t H, ibs, k;
    IndexerLayout layout;
  };
  for (const Shape s :
       {Shape{4, 64, 7, IndexerLayout::Normal}, Shape{1, 16, 1, IndexerLayout::Shuffle},
        Shape{16, 61, 7, IndexerLayout::Normal}, Shape{2, 1, 7, IndexerLayout::Normal},
        Shape{64, 64, 512, IndexerLayout::Normal}}) {
    SCOPED_TRACE("H=" + std::to_string(s.H) + " ibs=" + std::to_string(s.ibs) +
                 " k=" + std::to_string(s.k));
    const int32_t k = s.k, ibs = s.ibs;
    const std::vector<int32_t> lengths = {0,     1,       k - 1, k,       k + 1,
                                          2 * k, ibs - 1, ibs,   ibs + 1, 3 * ibs + 5};
    const int64_t T = static_cast<int64_t>(lengths.size());
    const int32_t Wt = (std::max(2 * k, 3 * ibs + 5) + ibs - 1) / ibs;
    IndexerCase c = make_indexer_case(rng, T, s.H, ibs, T, Wt, k, k + 3, s.layout);
    fill_exact(rng, c);
    for (int64_t t = 0; t < T; ++t)
      c.row_req[t] = static_cast<int32_t>(t), c.n[t] = std::max(0, lengths[t]);
    for (const TopkOrder order : {TopkOrder::ByIndex, TopkOrder::ByScore}) {
      const IndexerOut o = run_indexer_cpu(c, order);
      for (int64_t t = 0; t < T; ++t) expect_exact(c, o, t, order);
    }
    const IndexerOut bare = run_indexer_cpu(c, TopkOrder::ByIndex, /*scores=*/false);
    const IndexerOut full = run_indexer_cpu(c, TopkOrder::ByIndex);
    EXPECT_EQ(bare.indices, full.indices) << "the scores output changed the selection";
  }
}

// 11.7 planted top-k: k needles beat every other key by far more than the bound.
TEST(CpuIndexer, PlantedNeedlesAreTheSelection) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t k = 32, ibs = 64, Wt = 40;
  IndexerCase c = make_indexer_case(rng, 3, 8, ibs, 3, Wt, k, k);
  fill_random(rng, c);
  for (int64_t t = 0; t < c.T; ++t) {
    c.row_req[t] = static_cast<int32_t>(t);
    c.n[t] = Wt * ibs - static_cast<int32_t>(rng.randint(0, 100));
    for (int32_t h = 0; h < c.H; ++h) c.w[t * c.H + h] = std::fabs(c.w[t * c.H + h]) + 0.01f;
    // Needles: each key equal to the row's first head query at a large scale.
    std::set<int64_t> needles;
    while (static_cast<int32_t>(needles.size()) < k) needles.insert(rng.randint(0, c.n[t] - 1));
    for (const int64_t j : needles) c.set_entry(t, j, c.q.data() + t * c.H * 128, 1.0f);
  }
  const IndexerOut o = run_indexer_cpu(c, TopkOrder::ByScore);
  for (int64_t t = 0; t < c.T; ++t) {
    expect_within_bounds(c, o, t, kCpuEps);
    std::set<int64_t> want;
    for (const auto& x : ref_select(c, t)) want.insert(x.j);
    std::set<int64_t> got(o.indices.begin() + t * c.W, o.indices.begin() + t * c.W + k);
    EXPECT_EQ(got, want) << "row " << t;
  }
}

// CONTRACT 11.1's fused mode: the ragged ratio-4 list the call writes equals build_topk_lists run
// on its dense output, in both orders, with MTP rows of one request, a padding row (row_valid 0,
// row_request -1), short rows and a compressed table narrower than the indexer's (entries past it
// become -1); the dense output is the unfused call's. Invalid fused arguments fail before anything
// is written.
TEST(CpuIndexer, FusedRaggedListEqualsTheBuilderOnTheDenseOutput) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t k = 24, ibs = 16, Wt = 8, Wc = Wt - 2;
  IndexerCase c = make_indexer_case(rng, 6, 8, ibs, 3, Wt, k, k + 3);
  fill_random(rng, c);
  const int32_t reqs[6] = {0, 0, 1, 2, -1, 2};
  for (int64_t t = 0; t < c.T; ++t) {
    c.row_req[t] = reqs[t];
    c.n[t] = static_cast<int32_t>(rng.randint(1, Wt * ibs));
  }
  c.n[3] = 5;  // fewer candidates than k
  std::vector<uint8_t> valid(static_cast<size_t>(c.T), 1);
  valid[4] = 0;
  std::vector<int32_t> cbt(static_cast<size_t>(c.R * Wc));
  for (auto& b : cbt) b = static_cast<int32_t>(rng.randint(0, 999));
  for (const TopkOrder order : {TopkOrder::ByIndex, TopkOrder::ByScore}) {
    SCOPED_TRACE(order == TopkOrder::ByIndex ? "by_index" : "by_score");
    IndexerOut o;
    o.indices.assign(static_cast<size_t>(c.T * c.W), 0x5EED);
    o.lengths.assign(static_cast<size_t>(c.T), -7);
    std::vector<int32_t> fused(static_cast<size_t>(c.T * c.W), 777), indptr(c.T + 1, 777);
    IndexerParams p = c.params(o.indices.data(), o.lengths.data(), nullptr);
    p.order = order;
    p.fused.out = {fused.data(), indptr.data(), c.W};
    p.fused.row_valid = valid.data();
    p.fused.block_table = cbt.data();
    p.fused.block_table_stride = Wc;
    p.fused.table_width = Wc;
    p.fused.block_size = ibs;
    indexer_topk(p);
    EXPECT_EQ(o.indices, run_indexer_cpu(c, order, false).indices);

    std::vector<int32_t> built(fused.size(), 777), built_indptr(indptr.size(), 777);
    TopkListParams b;
    b.common = {c.T, valid.data(), Path::Cpu, nullptr};
    b.topk = o.indices.data();
    b.topk_stride = c.W;
    b.request_index = c.row_req.data();
    b.block_table = cbt.data();
    b.block_table_stride = Wc;
    b.table_width = Wc;
    b.num_requests = c.R;
    b.block_size = ibs;
    b.out = {built.data(), built_indptr.data(), c.W};
    build_topk_lists(b);
    EXPECT_EQ(indptr, built_indptr);
    EXPECT_EQ(fused, built);
    EXPECT_EQ(indptr[5] - indptr[4], 0) << "the padding row has no keys";
    for (int32_t t : {0, 1, 3}) {  // CONTRACT 4.6's ratio-4 rule, by hand
      const int32_t r = c.row_req[t];
      const int32_t* row = o.indices.data() + t * c.W;
      const auto in_table = [&](int32_t j) { return j >= 0 && j < Wc * ibs; };
      const int32_t len = static_cast<int32_t>(std::count_if(row, row + c.W, in_table));
      ASSERT_EQ(indptr[t + 1] - indptr[t], len) << "row " << t;
      for (int32_t i = 0; i < len; ++i) {
        const int32_t j = row[i];
        const int32_t want = in_table(j) ? cbt[r * Wc + j / ibs] * ibs + j % ibs : -1;
        EXPECT_EQ(fused[indptr[t] + i], want) << "row " << t << " entry " << i;
      }
    }
    EXPECT_GT(
        std::count_if(fused.begin(), fused.begin() + indptr[c.T], [](int32_t v) { return v >= 0; }),
        c.T)
        << "a list of real slots";

    IndexerParams bad = p;
    bad.fused.out.indptr = nullptr;
    std::fill(o.indices.begin(), o.indices.end(), 0x5EED);
    EXPECT_THROW(indexer_topk(bad), Error);
    EXPECT_TRUE(std::all_of(o.indices.begin(), o.indices.end(), [](int32_t v) {
      return v == 0x5EED;
    })) << "a rejected fused call wrote the dense output";
  }
}

// 11.7 near-tie rule on random data, MTP groups of two adjacent rows and a non-adjacent pair.
TEST(CpuIndexer, RandomDataWithinTheNearTieRuleWithMtpRows) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t k = 64, ibs = 16, Wt = 30;
  IndexerCase c = make_indexer_case(rng, 6, 16, ibs, 3, Wt, k, k + 1);
  fill_random(rng, c);
  const int32_t reqs[6] = {0, 0, 1, 2, 1, 2};  // rows 0-1 adjacent; 2 and 4 apart
  for (int64_t t = 0; t < c.T; ++t) {
    c.row_req[t] = reqs[t];
    c.n[t] = static_cast<int32_t>(rng.randint(k, Wt * ibs));
  }
  c.n[1] = c.n[0] + 1;
  double worst = 0.0;
  const IndexerOut o = run_indexer_cpu(c, TopkOrder::ByIndex);
  for (int64_t t = 0; t < c.T; ++t) {
    expect_within_bounds(c, o, t, kCpuEps);
    for (int32_t i = 0; i < o.lengths[t]; ++i) {
      for (const auto& x : ref_candidates(c, t))
        if (x.j == o.indices[t * c.W + i] && x.a > 0)
          worst = std::max(worst, std::fabs(o.scores[t * c.W + i] - x.score) / x.a);
    }
  }
  RecordProperty("worst_score_error_over_A", std::to_string(worst));
  std::printf("[ indexer ] worst |score - ref| / A = %.3g (bound 2^-16 = %.3g)\n", worst, kCpuEps);
}

// 11.8.4: invalid page ids, short tables, padding rows, negative n, duplicate pages, T = 0.
TEST(CpuIndexer, InvalidDeviceValuesFollowTheRule) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 8, Wt = 6, k = 12;
  IndexerCase c = make_indexer_case(rng, 6, 4, ibs, 3, Wt, k, k + 2);
  fill_exact(rng, c);
  const int32_t bad[] = {INT_MIN, -1, static_cast<int32_t>(c.num_blocks),
                         static_cast<int32_t>(c.num_blocks + 1024), INT_MAX};
  for (int32_t b = 0; b < 5; ++b) c.table[0 * c.table_stride + b] = bad[b];  // request 0
  c.table[1 * c.table_stride + 2] = c.table[1 * c.table_stride + 0];         // duplicate page
  const int32_t reqs[6] = {0, 1, -1, 3, 2, 2};
  const int32_t ns[6] = {Wt * ibs, Wt * ibs, 40, 40, -5, Wt * ibs + 1000};
  for (int64_t t = 0; t < c.T; ++t) c.row_req[t] = reqs[t], c.n[t] = ns[t];
  for (const TopkOrder order : {TopkOrder::ByIndex, TopkOrder::ByScore}) {
    const IndexerOut o = run_indexer_cpu(c, order);
    for (int64_t t = 0; t < c.T; ++t) expect_exact(c, o, t, order);
    EXPECT_EQ(o.lengths[0], std::min(k, (Wt - 5) * ibs));  // only page 5 of request 0 is valid
    EXPECT_EQ(o.lengths[2], 0);                            // row_req -1
    EXPECT_EQ(o.lengths[3], 0);                            // row_req >= R
    EXPECT_EQ(o.lengths[4], 0);                            // n < 0
  }
  IndexerCase empty = c;
  empty.T = 0;
  empty.row_req.clear(), empty.n.clear(), empty.q.clear(), empty.w.clear();
  EXPECT_NO_THROW(run_indexer_cpu(empty));
}

// 11.8.5: NaN bytes and a +inf scale rank last; -0 ties +0; NaN in w. Exact data around them.
TEST(CpuIndexer, NanKeysInfScalesAndNanWeightsRankLast) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 16, Wt = 4, k = 20;
  IndexerCase c = make_indexer_case(rng, 3, 4, ibs, 1, Wt, k, k);
  fill_exact(rng, c);
  for (int64_t t = 0; t < c.T; ++t) c.n[t] = Wt * ibs;
  uint8_t bytes[128];
  for (int j = 0; j < 10; ++j) {  // NaN bytes in 10 entries, +inf scale in 10 others
    for (auto& b : bytes) b = small_e4m3(1);
    bytes[rng.randint(0, 127)] = rng.randint(0, 1) ? 0x7F : 0xFF;
    c.set_entry(0, 2 * j, bytes, 1.0f);
    for (auto& b : bytes) b = small_e4m3(1);
    c.set_entry(0, 2 * j + 1, bytes, std::numeric_limits<float>::infinity());
  }
  c.w[2 * c.H + 1] = std::numeric_limits<float>::quiet_NaN();  // row 2: every score NaN
  for (const TopkOrder order : {TopkOrder::ByIndex, TopkOrder::ByScore}) {
    const IndexerOut o = run_indexer_cpu(c, order);
    for (int64_t t = 0; t < c.T; ++t) expect_exact(c, o, t, order);
    // Row 2 ranks every candidate -inf: the lowest k indices win.
    for (int32_t i = 0; i < k; ++i)
      EXPECT_EQ(o.indices[2 * c.W + i], i) << "NaN row, position " << i;
  }
}

// 11.8.6: all-equal rows, all-zero rows (every dot negative), many ties at the k-th value, and a
// low-contrast row of 65,536 candidates in one coarse bin.
TEST(CpuIndexer, TiesAndLowContrastRowsFollowTheTieBreak) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 1024, k = 512;
  IndexerCase c = make_indexer_case(rng, 3, 1, ibs, 1, Wt, k, k);
  // Every key the same bytes: row 0 scores all equal (q = 1), row 1 all zero (q = -1), row 2
  // scores in a narrow band: scale 1 for most entries, one power of two up for every 97th.
  uint8_t bytes[128];
  for (auto& b : bytes) b = small_e4m3(1);
  for (int64_t j = 0; j < int64_t{Wt} * ibs; ++j)
    c.set_entry(0, j, bytes, j % 97 == 5 ? 2.0f : 1.0f);
  for (int d = 0; d < 128; ++d) {
    c.q[0 * 128 + d] = small_e4m3(1);
    c.q[1 * 128 + d] = small_e4m3(-1);
    c.q[2 * 128 + d] = small_e4m3(d % 2 ? 1 : 2);
  }
  for (int64_t t = 0; t < c.T; ++t) c.w[t] = 1.0f / 64, c.n[t] = 65536;
  for (const TopkOrder order : {TopkOrder::ByIndex, TopkOrder::ByScore}) {
    const IndexerOut o = run_indexer_cpu(c, order);
    for (int64_t t = 0; t < c.T; ++t) expect_exact(c, o, t, order);
  }
}

// 11.8.2: a 1M-context row (262,144 candidates) at B = 1 and 4 with k up to 2048.
TEST(CpuIndexer, LongRowsOf262144CandidatesMatchTheReferenceRule) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 4096, k = 2048;
  IndexerCase c = make_indexer_case(rng, 4, 1, ibs, 1, Wt, k, k);
  fill_exact(rng, c);
  // Four requests over the same 4096 pages (34.8 MB), each in its own order.
  share_pages_across_requests(rng, c, 4);
  for (int64_t t = 0; t < c.T; ++t) {
    c.row_req[t] = static_cast<int32_t>(t);
    c.n[t] = t == 0 ? Wt * ibs : static_cast<int32_t>(rng.randint(Wt * ibs / 4, Wt * ibs));
  }
  const IndexerOut o = run_indexer_cpu(c, TopkOrder::ByScore);
  for (int64_t t = 0; t < c.T; ++t) expect_exact(c, o, t, TopkOrder::ByScore);
}

// 11.7 determinism: 20 runs identical, a row's output independent of the other rows and of the
// thread count.
TEST(CpuIndexer, DeterministicAcrossRunsBatchmatesAndThreads) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 80, k = 128;
  IndexerCase c = make_indexer_case(rng, 5, 8, ibs, 5, Wt, k, k);
  fill_random(rng, c);
  for (int64_t t = 0; t < c.T; ++t)
    c.row_req[t] = static_cast<int32_t>(t), c.n[t] = Wt * ibs - int32_t(t);
  const IndexerOut first = run_indexer_cpu(c);
  for (int i = 0; i < 20; ++i) {
    const IndexerOut again = run_indexer_cpu(c);
    ASSERT_EQ(again.indices, first.indices) << "run " << i;
    ASSERT_EQ(0, std::memcmp(again.scores.data(), first.scores.data(), 4 * first.scores.size()));
  }
  IndexerCase alone = c;  // row 3 alone in a batch of one
  alone.T = 1;
  alone.q.assign(c.q.begin() + 3 * c.H * 128, c.q.begin() + 4 * c.H * 128);
  alone.w.assign(c.w.begin() + 3 * c.H, c.w.begin() + 4 * c.H);
  alone.row_req = {3}, alone.n = {c.n[3]};
  const IndexerOut single = run_indexer_cpu(alone);
  EXPECT_TRUE(
      std::equal(single.indices.begin(), single.indices.end(), first.indices.begin() + 3 * c.W));
#if defined(SPARSEMLA_HAVE_OPENMP)
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const IndexerOut one_thread = run_indexer_cpu(c);
  omp_set_num_threads(threads);
  EXPECT_EQ(one_thread.indices, first.indices);
  EXPECT_EQ(0, std::memcmp(one_thread.scores.data(), first.scores.data(), 4 * first.scores.size()));
#endif
}

// The ratio-4 builder of CONTRACT 4.6 on a dense top-k [T, W] (-1 padding), through the table
// the indexer used (ibt = cbt, ibs = cbs): the ragged extra list of the decode.
TestList build_ratio4_list(const IndexerCase& ic, const std::vector<int32_t>& dense) {
  TestList l;
  l.indices.assign(static_cast<size_t>(ic.T * ic.W), 0);
  l.indptr.assign(static_cast<size_t>(ic.T + 1), 0);
  l.width = ic.W;
  TopkListParams p;
  p.common.num_rows = ic.T;
  p.common.path = Path::Cpu;
  p.topk = dense.data();
  p.topk_stride = ic.W;
  p.request_index = ic.row_req.data();
  p.block_table = ic.table.data();
  p.block_table_stride = ic.table_stride;
  p.table_width = ic.Wt;
  p.num_requests = ic.R;
  p.block_size = ic.ibs;
  p.out = {l.indices.data(), l.indptr.data(), l.width};
  build_topk_lists(p);
  return l;
}

// 11.8.9: indexer -> ratio-4 builder -> decode equals the same pipeline fed by the reference
// top-k (identical lists on exact data), and the decode of it matches the float64 decode reference.
TEST(CpuIndexer, PipelineIndexerBuilderDecodeEqualsTheReferenceTopkPipeline) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int64_t T = 4;
  const int32_t ibs = 16, Wt = 12, k = 48;
  IndexerCase ic = make_indexer_case(rng, T, 8, ibs, T, Wt, k, k + 4);
  fill_exact(rng, ic);
  for (int64_t t = 0; t < T; ++t) {
    ic.row_req[t] = static_cast<int32_t>(t);
    ic.n[t] = static_cast<int32_t>(rng.randint(k / 2, Wt * ibs));
  }
  const IndexerOut o = run_indexer_cpu(ic);
  std::vector<int32_t> ref_dense(static_cast<size_t>(T * ic.W), -1);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<RefCandidate> sel = ref_select(ic, t);
    std::sort(sel.begin(), sel.end(), [](const auto& a, const auto& b) { return a.j < b.j; });
    for (size_t i = 0; i < sel.size(); ++i)
      ref_dense[t * ic.W + i] = static_cast<int32_t>(sel[i].j);
  }
  CaseSpec spec;
  spec.T = T;
  spec.H = 8;
  spec.extra = CacheSpec{ic.num_blocks, ibs, 0};  // the compressed KV pages beside the keys
  DecodeCase dc(rng, spec);
  dc.extra_list = build_ratio4_list(ic, o.indices);
  const TestList ref_list = build_ratio4_list(ic, ref_dense);
  ASSERT_EQ(dc.extra_list.indptr, ref_list.indptr);
  ASSERT_EQ(dc.extra_list.indices, ref_list.indices);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(dc.extra_list.indptr[t + 1] - dc.extra_list.indptr[t], o.lengths[t]) << "row " << t;
  }
  const FastRun fast = decode::run_fast(dc, 0);
  DecodeCase ref_case = dc;
  ref_case.extra_list = ref_list;
  const FastRun fed_by_reference = decode::run_fast(ref_case, 0);
  EXPECT_EQ(fast.out, fed_by_reference.out);
  decode::expect_kernel_matches_reference(dc, fast, decode::run_reference(dc));
}

// 11.4 host errors name the argument.
TEST(CpuIndexer, HostErrorsNameTheArgument) {
  Rng rng(7);
  IndexerCase c = make_indexer_case(rng, 2, 4, 16, 2, 4, 8, 8);
  std::vector<int32_t> idx(16);
  const auto expect_error = [&](auto edit, const std::string& arg) {
    IndexerParams p = c.params(idx.data(), nullptr, nullptr);
    edit(p);
    try {
      indexer_topk(p);
      ADD_FAILURE() << "accepted; expected an error naming " << arg;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
    }
  };
  expect_error([](IndexerParams& p) { p.topk = 0; }, "topk");
  expect_error([](IndexerParams& p) { p.topk = 2049, p.width = 4096; }, "topk");
  expect_error([](IndexerParams& p) { p.width = 7; }, "width");
  expect_error([](IndexerParams& p) { p.num_heads = 0; }, "num_heads");
  expect_error([](IndexerParams& p) { p.num_heads = 129; }, "num_heads");
  expect_error([](IndexerParams& p) { p.num_requests = -1; }, "num_requests");
  expect_error([](IndexerParams& p) { p.block_table_stride = 2; }, "block_table_stride");
  expect_error([](IndexerParams& p) { p.q_stride_head = 64; }, "q_stride_head");
  expect_error([](IndexerParams& p) { p.indices_stride = 4; }, "indices_stride");
  expect_error([](IndexerParams& p) { p.q = nullptr; }, "q");
  expect_error([](IndexerParams& p) { p.row_request = nullptr; }, "row_request");
  expect_error([](IndexerParams& p) { p.cache.block_stride = 100; }, "block_stride");
  expect_error([](IndexerParams& p) { p.order = static_cast<TopkOrder>(5); }, "order");
  expect_error([](IndexerParams& p) { p.path = Path::CudaGeneric; }, "path");
}

TEST(CpuIndexer, CandidatesFromPositions) {
  const std::vector<int64_t> pos = {-1, 0, 2,       3,
                                    4,  7, 1048575, std::numeric_limits<int64_t>::min()};
  std::vector<int32_t> n(pos.size(), -9);
  indexer_candidates_from_positions(pos.data(), static_cast<int64_t>(pos.size()), n.data());
  EXPECT_EQ(n, (std::vector<int32_t>{0, 0, 0, 1, 1, 2, 262144, 0}));
  const int64_t huge = int64_t{1} << 40;
  EXPECT_THROW(indexer_candidates_from_positions(&huge, 1, n.data()), Error);
}

}  // namespace
}  // namespace sparsemla::test
