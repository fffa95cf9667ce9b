// The indexer query prep (CONTRACT 11.6) on the CPU against an independent implementation written
// here (catalogue 11.8.8): the exponent found by search over powers of two (not from the fp32
// bits), e4m3 bytes by nearest-value search over all 256 codes with ties to the even code, the
// rotation in fp32 and the weight fold in the stated order; bit for bit. Edge cases: amax below
// 1e-4, amax exactly 448*2^k and one bf16 ulp above, NaN and inf values, padding rows, strides,
// and the host errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "reference/indexer_prep_reference.h"
#include "reference/random.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer_prep.h"
#include "sparsemla/rope.h"

namespace sparsemla::test {
namespace {

using namespace prep_ref;  // NOLINT: the shared case and the independent implementation
constexpr int kDim = kPrepDim;

void expect_matches(PrepCase& c) {
  for (int64_t t = 0; t < c.T; ++t) {
    for (int h = 0; h < c.H; ++h) {
      uint8_t want[kDim];
      float w;
      expected_row(c, t, h, want, w);
      const uint8_t* got = c.q_out.data() + t * c.ost() + h * c.osh();
      for (int d = 0; d < kDim; ++d) {
        ASSERT_EQ(got[d], want[d]) << "t=" << t << " h=" << h << " d=" << d;
      }
      const float gw = c.w_out[t * c.wost() + h];
      if (std::isnan(w)) {
        EXPECT_TRUE(std::isnan(gw)) << "t=" << t << " h=" << h;
      } else {
        uint32_t a, b;
        std::memcpy(&a, &gw, 4);
        std::memcpy(&b, &w, 4);
        ASSERT_EQ(a, b) << "t=" << t << " h=" << h << " got " << gw << " want " << w;
      }
    }
  }
}

TEST(IndexerPrepCpu, RandomRowsBitExactAcrossHeadsAndStrides) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t H : {1, 16, 64, 128}) {
    for (bool strided : {false, true}) {
      PrepCase c = make_case(rng, 7, H, strided);
      indexer_q_prep(c.params());
      expect_matches(c);
      // Untouched outside the rows: the gaps of strided outputs keep their bytes.
      if (strided) {
        EXPECT_EQ(c.q_out[kDim], 0xA5);
      }
    }
  }
}

TEST(IndexerPrepCpu, ExponentEdgesAmaxFloorPowersOf448AndOneUlpAbove) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  PrepCase c = make_case(rng, 6, 4, false);
  fill_exponent_edges(c);
  indexer_q_prep(c.params());
  expect_matches(c);
  const uint8_t* row1 = c.q_out.data() + 1 * c.ost();
  EXPECT_EQ(row1[5], 0x7E);  // 448*2^k scales to exactly 448
  const uint8_t* row2 = c.q_out.data() + 2 * c.ost();
  // One bf16 ulp above 448*2^k is 450*2^k: e = k + 1, 225 -> 224 (step 16 there), byte 0x76.
  EXPECT_EQ(row2[9], 0x76);
  EXPECT_TRUE(std::isinf(c.w_out[5 * c.H + 1]));
}

TEST(IndexerPrepCpu, PaddingRowsAreZeroAndResultsDoNotDependOnT) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  PrepCase c = make_case(rng, 9, 8, true);
  c.pos[2] = -1;
  c.pos[7] = std::numeric_limits<int64_t>::min();
  indexer_q_prep(c.params());
  expect_matches(c);
  // Row 4 alone gives the same bytes and weights as inside the batch.
  PrepCase one = c;
  std::vector<uint8_t> batch_out = c.q_out;
  IndexerQPrepParams p = one.params();
  p.num_tokens = 1;
  p.q = one.q.data() + 4 * one.qst();
  p.positions = one.pos.data() + 4;
  p.w_raw = one.w_raw.data() + 4 * one.wst();
  std::vector<uint8_t> q1(static_cast<size_t>(one.ost()));
  std::vector<float> w1(static_cast<size_t>(one.wost()));
  p.q_out = q1.data();
  p.w_out = w1.data();
  indexer_q_prep(p);
  for (int h = 0; h < c.H; ++h) {
    EXPECT_EQ(0, std::memcmp(q1.data() + h * c.osh(), batch_out.data() + 4 * c.ost() + h * c.osh(),
                             kDim));
    EXPECT_EQ(w1[h], c.w_out[4 * c.wost() + h]);
  }
}

TEST(IndexerPrepCpu, HostErrorsNameTheArgument) {
  Rng rng(11);
  PrepCase c = make_case(rng, 3, 4, false);
  const auto expect_error = [&](auto edit, const std::string& arg) {
    IndexerQPrepParams p = c.params();
    edit(p);
    try {
      indexer_q_prep(p);
      ADD_FAILURE() << "accepted; expected an error naming " << arg;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos)
          << e.what();
    }
  };
  expect_error([](IndexerQPrepParams& p) { p.num_heads = 0; }, "num_heads");
  expect_error([](IndexerQPrepParams& p) { p.num_heads = 129; }, "num_heads");
  expect_error([](IndexerQPrepParams& p) { p.num_tokens = -1; }, "num_tokens");
  expect_error([](IndexerQPrepParams& p) { p.q_stride_head = 64; }, "q_stride_head");
  expect_error([](IndexerQPrepParams& p) { p.q_stride_token = 100; }, "q_stride_token");
  expect_error([](IndexerQPrepParams& p) { p.q_out_stride_token = 127; }, "q_out_stride_token");
  expect_error([](IndexerQPrepParams& p) { p.w_raw_stride = 3; }, "w_raw_stride");
  expect_error([](IndexerQPrepParams& p) { p.w_out_stride = 2; }, "w_out_stride");
  expect_error([](IndexerQPrepParams& p) { p.rope.row_stride = 32; }, "rope.row_stride");
  expect_error([](IndexerQPrepParams& p) { p.q = nullptr; }, "q");
  expect_error([](IndexerQPrepParams& p) { p.positions = nullptr; }, "positions");
  expect_error([](IndexerQPrepParams& p) { p.w_raw = nullptr; }, "w_raw");
  expect_error([](IndexerQPrepParams& p) { p.q_out = nullptr; }, "q_out");
  expect_error([](IndexerQPrepParams& p) { p.w_out = nullptr; }, "w_out");
  expect_error([](IndexerQPrepParams& p) { p.path = Path::CudaGeneric; }, "path");
  expect_error([](IndexerQPrepParams& p) { p.path = Path::CudaSm90; }, "path");
  // A position past the table fails before any output is written.
  c.pos[1] = c.P;
  std::vector<uint8_t> before = c.q_out;
  expect_error([](IndexerQPrepParams&) {}, "positions[1]");
  EXPECT_EQ(c.q_out, before);
  // T = 0 needs no pointers.
  IndexerQPrepParams empty;
  empty.num_heads = 64;
  EXPECT_NO_THROW(indexer_q_prep(empty));
}

}  // namespace
}  // namespace sparsemla::test
