// Indexer-key gather tests (CONTRACT 6, 9.8) against a straightforward gather written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "reference/random.h"
#include "sparsemla/gather.h"

namespace sparsemla {
namespace {

// Byte offset of value (row p, dim d) in a page, written out from CONTRACT 2.2.
int64_t value_offset(IndexerLayout layout, int64_t p, int64_t d) {
  if (layout == IndexerLayout::Normal) return p * 128 + d;
  return (p / 16) * 16 * 128 + (p % 16) * 16 + (d / 16) * 256 + d % 16;
}

// What the reference saw, so tests can require that every rule was exercised.
struct GatherStats {
  int64_t copied = 0, invalid_page = 0, padding = 0;
};

// The reference gather: one token at a time, every rule of CONTRACT 6 spelled out.
GatherStats reference_gather(const GatherParams& p, std::vector<uint8_t>& k_fp8,
                             std::vector<float>& k_scale) {
  GatherStats st;
  for (int64_t tid = 0; tid < p.num_tokens; ++tid) {
    const int64_t b = p.token_to_seq[tid];
    const bool in_batch = b >= 0 && b < p.num_batches;
    if (!in_batch || tid < p.cu_seqlen[b] || tid >= p.cu_seqlen[b + 1]) {
      ++st.padding;
      continue;
    }
    const int64_t o = tid - p.cu_seqlen[b];
    const int64_t page_index = o / p.cache.block_size, row = o % p.cache.block_size;
    int64_t block = -1;
    if (page_index < p.block_table_width)
      block = p.block_table[b * p.block_table_stride + page_index];
    if (block < 0 || block >= p.cache.num_blocks) {
      k_scale[tid] = 0.0f;
      ++st.invalid_page;
      continue;
    }
    const uint8_t* page = p.cache.base + block * p.cache.block_stride;
    for (int d = 0; d < 128; ++d)
      k_fp8[tid * p.k_fp8_stride + d] = page[value_offset(p.cache.layout, row, d)];
    std::memcpy(&k_scale[tid], page + p.cache.block_size * 128 + row * 4, 4);
    ++st.copied;
  }
  return st;
}

// A random multi-sequence problem with every kind of invalid token and page.
struct Problem {
  int32_t bs = 16;
  IndexerLayout layout = IndexerLayout::Normal;
  int64_t num_blocks = 0, block_stride = 0;
  std::vector<uint8_t> cache;
  int64_t num_batches = 0;
  std::vector<int32_t> cu_seqlen, token_to_seq, block_table;
  int32_t table_width = 0;
  int64_t table_stride = 0;
  int64_t num_tokens = 0;  // over-allocated: more rows than cu_seqlen[B]
  int64_t k_fp8_stride = 128;
};

Problem make_problem(test::Rng& rng, int32_t bs, IndexerLayout layout, int64_t num_batches) {
  Problem pr;
  pr.bs = bs;
  pr.layout = layout;
  pr.num_blocks = rng.randint(2, 9);
  pr.block_stride = int64_t{bs} * 132 + rng.randint(0, 2) * 36;  // unpadded and padded pages
  pr.cache = test::random_bytes(rng, pr.num_blocks * pr.block_stride);
  pr.num_batches = num_batches;
  pr.table_width = static_cast<int32_t>(rng.randint(1, 4));
  pr.table_stride = pr.table_width + rng.randint(0, 3);
  // Lengths include empty sequences and sequences longer than width*bs (pages beyond the table).
  pr.cu_seqlen = {static_cast<int32_t>(rng.randint(0, 3))};  // cu_seqlen[0] > 0: leading padding
  for (int64_t b = 0; b < num_batches; ++b) {
    const int64_t len = rng.randint(0, 3) == 0 ? 0 : rng.randint(1, pr.table_width * bs + bs);
    pr.cu_seqlen.push_back(static_cast<int32_t>(pr.cu_seqlen.back() + len));
  }
  pr.num_tokens = pr.cu_seqlen.back() + rng.randint(1, 9);
  pr.token_to_seq.assign(pr.num_tokens, -1);
  for (int64_t b = 0; b < num_batches; ++b)
    for (int32_t t = pr.cu_seqlen[b]; t < pr.cu_seqlen[b + 1]; ++t) pr.token_to_seq[t] = int32_t(b);
  // Padding tokens of every kind: -1, >= B, INT32_MIN, and a valid b whose range excludes tid.
  const int32_t kinds[] = {-1,
                           static_cast<int32_t>(num_batches),
                           static_cast<int32_t>(num_batches) + 7,
                           INT32_MIN,
                           INT32_MAX,
                           0};
  for (int64_t t = 0; t < pr.num_tokens; ++t)
    if (pr.token_to_seq[t] < 0) pr.token_to_seq[t] = kinds[rng.randint(0, 5)];
  // Block table: mostly valid ids, some -1, some >= num_blocks, junk beyond the width.
  pr.block_table.resize(std::max<int64_t>(num_batches, 1) * pr.table_stride);
  for (auto& id : pr.block_table) {
    const int64_t kind = rng.randint(0, 9);
    id = static_cast<int32_t>(kind == 0 ? -1
                                        : (kind == 1 ? pr.num_blocks + rng.randint(0, 5)
                                                     : rng.randint(0, pr.num_blocks - 1)));
  }
  pr.k_fp8_stride = 128 + rng.randint(0, 2) * 16;
  return pr;
}

GatherParams params_of(Problem& pr, uint8_t* k_fp8, float* k_scale) {
  GatherParams p;
  p.num_tokens = pr.num_tokens;
  p.num_batches = pr.num_batches;
  p.token_to_seq = pr.token_to_seq.data();
  p.cu_seqlen = pr.cu_seqlen.data();
  p.block_table = pr.block_table.data();
  p.block_table_stride = pr.table_stride;
  p.block_table_width = pr.table_width;
  p.cache = {pr.cache.data(), pr.num_blocks, pr.bs, pr.block_stride, pr.layout};
  p.k_fp8 = k_fp8;
  p.k_fp8_stride = pr.k_fp8_stride;
  p.k_scale = k_scale;
  p.path = Path::Cpu;
  return p;
}

// Runs the library and the reference on outputs pre-filled with the same random bytes; compares
// every output byte (gaps between rows and rows of padding tokens included).
GatherStats run_and_compare(test::Rng& rng, Problem& pr) {
  GatherStats st;
  const size_t fp8_bytes = pr.num_tokens * pr.k_fp8_stride;
  std::vector<uint8_t> k_fp8 = test::random_bytes(rng, fp8_bytes);
  std::vector<float> k_scale(pr.num_tokens);
  std::vector<uint8_t> scale_fill = test::random_bytes(rng, pr.num_tokens * 4);
  std::memcpy(k_scale.data(), scale_fill.data(), scale_fill.size());
  std::vector<uint8_t> ref_fp8 = k_fp8;
  std::vector<float> ref_scale = k_scale;
  const std::vector<uint8_t> cache_before = pr.cache;

  GatherParams p = params_of(pr, k_fp8.data(), k_scale.data());
  EXPECT_NO_THROW(gather_indexer_keys(p));
  st = reference_gather(p, ref_fp8, ref_scale);

  EXPECT_EQ(pr.cache, cache_before) << "the source cache was modified";
  for (size_t i = 0; i < fp8_bytes; ++i) {
    if (k_fp8[i] == ref_fp8[i]) continue;
    ADD_FAILURE() << "k_fp8 row " << i / pr.k_fp8_stride << " byte " << i % pr.k_fp8_stride;
    break;
  }
  for (int64_t t = 0; t < pr.num_tokens; ++t)
    EXPECT_EQ(std::memcmp(&k_scale[t], &ref_scale[t], 4), 0) << "k_scale row " << t;
  return st;
}

void expect_all_rules_exercised(const GatherStats& total) {
  EXPECT_GT(total.copied, 0);
  EXPECT_GT(total.invalid_page, 0);
  EXPECT_GT(total.padding, 0);
}

TEST(GatherCpu, MatchesReferenceMultiSequenceNormalLayout) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  GatherStats total;
  for (int32_t bs : {1, 2, 16, 61, 64}) {
    for (int rep = 0; rep < 6; ++rep) {
      SCOPED_TRACE("bs=" + std::to_string(bs) + " rep=" + std::to_string(rep));
      Problem pr = make_problem(rng, bs, IndexerLayout::Normal, rng.randint(1, 6));
      const GatherStats st = run_and_compare(rng, pr);
      total.copied += st.copied, total.invalid_page += st.invalid_page, total.padding += st.padding;
      if (HasFailure()) return;
    }
  }
  expect_all_rules_exercised(total);
}

TEST(GatherCpu, MatchesReferenceMultiSequenceShuffleLayout) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  GatherStats total;
  for (int32_t bs : {16, 32, 64}) {
    for (int rep = 0; rep < 6; ++rep) {
      SCOPED_TRACE("bs=" + std::to_string(bs) + " rep=" + std::to_string(rep));
      Problem pr = make_problem(rng, bs, IndexerLayout::Shuffle, rng.randint(1, 6));
      const GatherStats st = run_and_compare(rng, pr);
      total.copied += st.copied, total.invalid_page += st.invalid_page, total.padding += st.padding;
      if (HasFailure()) return;
    }
  }
  expect_all_rules_exercised(total);
}

// Hand-checked expectations on one small problem: each rule of CONTRACT 6 on a known token.
TEST(GatherCpu, PaddingTokensAndInvalidPagesFollowTheRules) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  const int32_t bs = 2;
  const int64_t num_blocks = 3, stride = bs * 132;
  std::vector<uint8_t> cache = test::random_bytes(rng, num_blocks * stride);
  // Sequence 0: tokens 1..5 (o = 0..4), pages {2, -1, 7}: o 0,1 -> block 2; o 2,3 -> block -1;
  // o 4 -> block 7 (>= num_blocks). Sequence 1: tokens 6..8 (o = 0..2), width 1: page {0},
  // o 2 is beyond the table. Token 0 and 9: padding (-1 and b = 2 = B); token 10: b = 0, outside.
  const std::vector<int32_t> cu = {1, 6, 9};
  const std::vector<int32_t> tts = {-1, 0, 0, 0, 0, 0, 1, 1, 1, 2, 0};
  const std::vector<int32_t> table = {2, -1, 7, 0, 99, 99};  // stride 3; width 3 for row 0 ...
  GatherParams p;
  p.num_tokens = 11;
  p.num_batches = 2;
  p.token_to_seq = tts.data();
  p.cu_seqlen = cu.data();
  p.block_table = table.data();
  p.block_table_stride = 3;
  p.block_table_width = 3;
  p.cache = {cache.data(), num_blocks, bs, stride, IndexerLayout::Normal};
  std::vector<uint8_t> k_fp8 = test::random_bytes(rng, 11 * 128);
  std::vector<float> k_scale(11, -7.0f);
  const std::vector<uint8_t> fp8_before = k_fp8;
  p.k_fp8 = k_fp8.data();
  p.k_scale = k_scale.data();
  p.path = Path::Cpu;
  ASSERT_NO_THROW(gather_indexer_keys(p));

  auto row_equals = [&](int64_t tid, const uint8_t* src) {
    return std::memcmp(k_fp8.data() + tid * 128, src, 128) == 0;
  };
  auto row_untouched = [&](int64_t tid) { return row_equals(tid, fp8_before.data() + tid * 128); };
  auto scale_at = [&](int64_t block, int64_t row) {
    float s;
    std::memcpy(&s, cache.data() + block * stride + bs * 128 + row * 4, 4);
    return s;
  };
  // Valid rows: block 2, rows 0 and 1.
  EXPECT_TRUE(row_equals(1, cache.data() + 2 * stride));
  EXPECT_TRUE(row_equals(2, cache.data() + 2 * stride + 128));
  auto scale_equals = [&](int64_t tid, int64_t block, int64_t row) {
    const float s = scale_at(block, row);
    return std::memcmp(&k_scale[tid], &s, 4) == 0;
  };
  EXPECT_TRUE(scale_equals(1, 2, 0));
  EXPECT_TRUE(scale_equals(2, 2, 1));
  // Invalid pages: scale 0, row untouched.
  for (int64_t tid : {3, 4, 5}) {
    EXPECT_EQ(k_scale[tid], 0.0f) << tid;
    EXPECT_TRUE(row_untouched(tid)) << tid;
  }
  // Sequence 1 (table row 1 = {0, 99, 99}): o 0,1 -> block 0; o 2 -> block 99 (invalid).
  EXPECT_TRUE(row_equals(6, cache.data()));
  EXPECT_TRUE(row_equals(7, cache.data() + 128));
  EXPECT_TRUE(scale_equals(6, 0, 0));
  EXPECT_TRUE(scale_equals(7, 0, 1));
  EXPECT_EQ(k_scale[8], 0.0f);
  EXPECT_TRUE(row_untouched(8));
  // Padding tokens: nothing written.
  for (int64_t tid : {0, 9, 10}) {
    EXPECT_EQ(k_scale[tid], -7.0f) << tid;
    EXPECT_TRUE(row_untouched(tid)) << tid;
  }
  // The same with a narrower table: o/bs beyond the width of 1 is an invalid page too.
  p.block_table_width = 1;
  std::fill(k_scale.begin(), k_scale.end(), -7.0f);
  ASSERT_NO_THROW(gather_indexer_keys(p));
  for (int64_t tid : {3, 4, 5, 8}) EXPECT_EQ(k_scale[tid], 0.0f) << tid;
  EXPECT_TRUE(scale_equals(1, 2, 0));
  EXPECT_TRUE(scale_equals(7, 0, 1));
  EXPECT_EQ(k_scale[0], -7.0f);
}

// One function serves every batch count: the same arrays gathered with B = 1, 2, ..., all against
// the reference (the batch count is a run-time value, CONTRACT 6).
TEST(GatherCpu, BatchCountIsARuntimeValue) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  Problem pr = make_problem(rng, 16, IndexerLayout::Normal, 7);
  for (int64_t b = 0; b <= 7; ++b) {
    SCOPED_TRACE("B=" + std::to_string(b));
    Problem sub = pr;
    sub.num_batches = b;  // cu_seqlen[0..B] is a prefix; tokens of later sequences become padding
    const GatherStats st = run_and_compare(rng, sub);
    EXPECT_EQ(st.copied + st.invalid_page, sub.cu_seqlen[b] - sub.cu_seqlen[0]);
  }
}

// A page whose byte offset exceeds 2^31: block 2048 with a 1 MiB + 4 KiB stride sits at
// 2^31 + 8 MiB. The buffer (~2.15 GB) is left uninitialised (new[] of a trivial type), so only the
// pages written here are touched.
TEST(GatherCpu, BlockOffsetBeyond2To31Uses64BitAddressing) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  const int32_t bs = 16;
  const int64_t stride = (int64_t{1} << 20) + 4096, far_block = 2048, num_blocks = far_block + 1;
  ASSERT_GT(far_block * stride, int64_t{1} << 31);
  const int64_t bytes = far_block * stride + bs * 132;  // the last page needs only its payload
  std::unique_ptr<uint8_t[]> cache(new (std::nothrow) uint8_t[bytes]);
  ASSERT_NE(cache.get(), nullptr) << "could not reserve " << bytes << " bytes";
  // The three pages used: 0, 1 and far_block (whose 32-bit-truncated offset would be
  // (2^31 + 8 MiB) mod 2^32, i.e. negative or some other page).
  for (int64_t block : {int64_t{0}, int64_t{1}, far_block}) {
    const std::vector<uint8_t> page = test::random_bytes(rng, bs * 132);
    std::memcpy(cache.get() + block * stride, page.data(), page.size());
  }
  for (IndexerLayout layout : {IndexerLayout::Normal, IndexerLayout::Shuffle}) {
    const std::vector<int32_t> cu = {0, 20, 40};
    const std::vector<int32_t> table = {static_cast<int32_t>(far_block), 0, 1,
                                        static_cast<int32_t>(far_block)};
    std::vector<int32_t> tts(40);
    for (int t = 0; t < 40; ++t) tts[t] = t < 20 ? 0 : 1;
    GatherParams p;
    p.num_tokens = 40;
    p.num_batches = 2;
    p.token_to_seq = tts.data();
    p.cu_seqlen = cu.data();
    p.block_table = table.data();
    p.block_table_stride = 2;
    p.block_table_width = 2;
    p.cache = {cache.get(), num_blocks, bs, stride, layout};
    std::vector<uint8_t> k_fp8 = test::random_bytes(rng, 40 * 128), ref_fp8 = k_fp8;
    std::vector<float> k_scale(40, 5.0f), ref_scale = k_scale;
    p.k_fp8 = k_fp8.data();
    p.k_scale = k_scale.data();
    p.path = Path::Cpu;
    ASSERT_NO_THROW(gather_indexer_keys(p));
    reference_gather(p, ref_fp8, ref_scale);
    EXPECT_EQ(k_fp8, ref_fp8);
    EXPECT_EQ(std::memcmp(k_scale.data(), ref_scale.data(), 40 * 4), 0);
  }
}

}  // namespace
}  // namespace sparsemla
