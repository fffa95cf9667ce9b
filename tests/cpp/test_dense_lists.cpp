// tests/cpp/test_dense_lists.cpp: the decode reads FlashMLA's dense [T, W] index lists directly
// (CONTRACT 4.6 "Dense lists"): the same bits as the ragged list build_ragged_from_dense makes from
// them, for every way of giving lengths (none with -1 padding, per row, per request with
// rows_per_length = s_q), lengths outside [0, W] and out-of-range entries; plus DecodePlan reuse
// (one plan, several layers) and the plan / call mismatch errors. CPU path; the GPU paths in
// tests/gpu/test_gpu_dense_lists.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "reference/decode_fixture.h"
#include "reference/dense_lists.h"
#include "sparsemla/decode.h"
#include "sparsemla/error.h"

namespace sparsemla::test::decode {
using sparsemla::test::BuiltRagged;
using sparsemla::test::DenseLengths;
using sparsemla::test::DenseList;
namespace {

// The fixture's poisoned fast run (padding checked) with the given lists.
FastRun run_with_lists(const DecodeCase& c, const IndexList& main, const IndexList& extra,
                       int32_t splits) {
  return run_fast(c, splits, [&](DecodeParams& p) {
    p.main_list = main;
    p.extra_list = extra;
  });
}

// Model data (CONTRACT 9.9) on pages of bs rows padded to a multiple of 576 bytes as engines do.
CacheSpec paged_cache(int64_t slots, int32_t bs) {
  CacheSpec c;
  c.block_size = bs;
  c.num_blocks = (slots + bs - 1) / bs;
  c.page_pad = (576 - (bs * 584) % 576) % 576;
  return c;
}

CaseSpec two_segment_case(int64_t T) {
  CaseSpec s;
  s.T = T;
  s.H = 20;  // two head blocks, the second partial
  s.main = paged_cache(64, 64);
  s.extra = paged_cache(300, 2);
  s.main_lengths.assign(static_cast<size_t>(T), 8);  // replaced by the dense lists below
  s.extra_lengths.assign(static_cast<size_t>(T), 8);
  return s;
}

class DenseListsCpu : public ::testing::TestWithParam<DenseLengths> {};

TEST_P(DenseListsCpu, SameBitsAsTheRaggedListTheBuilderMakes) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  constexpr int64_t T = 6;  // 3 requests of s_q = 2 under PerRequest
  const DecodeCase c(rng, two_segment_case(T));
  const int64_t n_main = c.main->num_slots(), n_extra = c.extra->num_slots();
  const DenseList dm = make_dense_list(rng, T, 128, n_main, GetParam());
  const DenseList de = make_dense_list(rng, T, 200, n_extra, GetParam());
  const BuiltRagged rm = ragged_from_dense(dm, T, n_main), re = ragged_from_dense(de, T, n_extra);
  for (const int32_t splits : {1, 3}) {
    SCOPED_TRACE("S = " + std::to_string(splits));
    expect_same_bits(c, run_with_lists(c, dm.host_view(), de.host_view(), splits),
                     run_with_lists(c, rm.host_view(), re.host_view(), splits));
  }
}

INSTANTIATE_TEST_SUITE_P(Lengths, DenseListsCpu,
                         ::testing::Values(DenseLengths::None, DenseLengths::PerRow,
                                           DenseLengths::PerRequest),
                         [](const ::testing::TestParamInfo<DenseLengths>& i) {
                           return std::string(i.param == DenseLengths::None     ? "NoLengths"
                                              : i.param == DenseLengths::PerRow ? "PerRow"
                                                                                : "PerRequest");
                         });

// The planner sees W for a dense list, as for the builder's ragged output (capacity T * W).
TEST(DenseListsCpu, PlannerWidthIsW) {
  Rng rng(7);
  const DecodeCase c(rng, two_segment_case(4));
  const DenseList dm = make_dense_list(rng, 4, 128, c.main->num_slots(), DenseLengths::PerRow);
  std::vector<bf16_bits> out(c.out_elems());
  std::vector<float> lse(c.lse_elems());
  DecodeParams p = c.params(out.data(), lse.data());
  p.main_list = dm.host_view();
  const DecodeShape s = decode_shape(p);
  EXPECT_EQ(s.width_main, 128);
  EXPECT_EQ(s.width_extra, c.extra_list.width > 0
                               ? c.extra_list.width
                               : static_cast<int64_t>(c.extra_list.indices.size()) / 4);
}

TEST(DenseListsCpu, BadDenseListsAreNamed) {
  Rng rng(8);
  const DecodeCase c(rng, two_segment_case(4));
  DenseList dm = make_dense_list(rng, 4, 128, c.main->num_slots(), DenseLengths::PerRequest);
  std::vector<bf16_bits> out(c.out_elems());
  std::vector<float> lse(c.lse_elems());
  const auto expect_named = [&](auto edit, const std::string& arg) {
    DecodeParams p = c.params(out.data(), lse.data());
    p.main_list = dm.host_view();
    edit(p.main_list);
    try {
      sparse_decode(p, nullptr, 0);
      ADD_FAILURE() << "accepted a bad " << arg;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos)
          << e.what();
    }
  };
  expect_named([](IndexList& l) { l.width = 0; }, "main_list.width");
  expect_named([](IndexList& l) { l.dense_stride = 100; }, "main_list.dense_stride");
  expect_named([](IndexList& l) { l.rows_per_length = 0; }, "main_list.rows_per_length");
  expect_named([](IndexList& l) { l.capacity = 3 * l.dense_stride + 127; }, "main_list.capacity");
}

// ---- DecodePlan ---------------------------------------------------------------------------------

// One plan for several layers of the same shapes (different caches and lists): the results are
// those of planning inside each call.
TEST(DecodePlanCpu, OnePlanServesEveryLayerOfTheShape) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  CaseSpec s = two_segment_case(5);
  s.main_lengths = {128, 0, 77, 128, 3};
  s.extra_lengths = {200, 1, 0, 150, 64};
  DecodePlan plan;
  for (int layer = 0; layer < 3; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    DecodeCase c(rng, s);
    c.main_list.width = 128;
    c.extra_list.width = 200;
    std::vector<bf16_bits> out(c.out_elems(), kPoisonBf16);
    std::vector<float> lse(c.lse_elems(), nan_f32());
    DecodeParams p = c.params(out.data(), lse.data());
    if (layer == 0) plan = plan_decode(p);
    EXPECT_GE(plan.num_splits, 1);
    std::vector<float> ws(plan.workspace_bytes / 4 + 1, nan_f32());
    sparse_decode(p, plan, ws.data(), plan.workspace_bytes);
    const FastRun planned_in_call = run_fast(c, 0);
    ASSERT_EQ(planned_in_call.out.size(), out.size());
    int64_t diff = 0;
    for (size_t i = 0; i < out.size(); ++i) diff += out[i] != planned_in_call.out[i];
    EXPECT_EQ(diff, 0);
  }
}

TEST(DecodePlanCpu, PlanOfAnotherShapeIsRejectedByName) {
  Rng rng(9);
  const DecodeCase c(rng, two_segment_case(4));
  std::vector<bf16_bits> out(c.out_elems());
  std::vector<float> lse(c.lse_elems());
  DecodeParams p = c.params(out.data(), lse.data());
  const DecodePlan plan = plan_decode(p);
  std::vector<float> ws(plan.workspace_bytes / 4 + 1);
  const auto expect_named = [&](auto edit, const std::string& arg) {
    DecodeParams q = p;
    edit(q);
    try {
      sparse_decode(q, plan, ws.data(), plan.workspace_bytes);
      ADD_FAILURE() << "ran a plan made for another " << arg;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos)
          << e.what();
    }
  };
  expect_named([](DecodeParams& q) { q.num_tokens = 3; }, "plan.shape.num_tokens");
  expect_named([](DecodeParams& q) { q.num_heads = 19; }, "plan.shape.num_heads");
  expect_named([](DecodeParams& q) { q.main_list.width = 999; }, "plan.shape.width_main");
  expect_named([](DecodeParams& q) { q.num_splits = 2; }, "plan.shape.num_splits");
  expect_named([](DecodeParams& q) { q.deterministic = true; }, "plan.shape.deterministic");
  if (plan.workspace_bytes > 0) {
    try {
      sparse_decode(p, plan, ws.data(), plan.workspace_bytes - 1);
      ADD_FAILURE() << "ran with a workspace below plan.workspace_bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("workspace_bytes"), std::string::npos) << e.what();
    }
  }
}

TEST(DecodePlanCpu, ShapeErrorsNameTheShapeField) {
  DecodeShape s;
  s.num_tokens = 4;
  s.num_heads = 0;
  s.width_main = 128;
  EXPECT_THROW(
      {
        try {
          plan_decode(s);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("argument 'shape.num_heads'"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  s.num_heads = 64;
  s.width_extra = 5;  // without has_extra
  EXPECT_THROW(plan_decode(s), Error);
  s.width_extra = 0;
  s.path = Path::CudaSm90;  // host data
  EXPECT_THROW(plan_decode(s), Error);
  s.path = Path::Auto;
  const DecodePlan plan = plan_decode(s);
  EXPECT_EQ(plan.path, Path::Cpu);
  EXPECT_EQ(plan.workspace_bytes,
            plan.num_splits > 1 ? decode_workspace_size(4, 64, plan.num_splits) : size_t{0});
}

// FlashMLA's lse layout [b, h, s_q] written directly (lse_group = s_q): every value where the
// contiguous [T, H] run puts it, nothing else written.
TEST(DecodeLseGroupsCpu, FlashMlaLayoutWrittenInPlace) {
  Rng rng(11);
  constexpr int64_t T = 6;
  constexpr int32_t kSq = 3;
  const DecodeCase c(rng, two_segment_case(T));
  const int32_t H = c.H;
  std::vector<bf16_bits> out(c.out_elems());
  std::vector<float> flat(static_cast<size_t>(T * H), nan_f32());
  DecodeParams p = c.params(out.data(), flat.data());
  p.lse_stride_token = H;
  p.num_splits = 2;
  std::vector<float> ws(decode_workspace_size(T, H, 2) / 4);
  sparse_decode(p, ws.data(), ws.size() * 4);
  std::vector<float> grouped(static_cast<size_t>(T * H) + 4, nan_f32());
  p.lse = grouped.data();
  p.lse_group = kSq;
  p.lse_stride_token = 1;
  p.lse_stride_head = kSq;
  p.lse_stride_group = int64_t{H} * kSq;
  sparse_decode(p, ws.data(), ws.size() * 4);
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < H; ++h) {
      const float want = flat[t * H + h];
      const float got = grouped[(t / kSq) * H * kSq + h * kSq + t % kSq];
      EXPECT_EQ(std::memcmp(&want, &got, 4), 0) << "t=" << t << " h=" << h;
    }
  }
  for (size_t i = static_cast<size_t>(T * H); i < grouped.size(); ++i) {
    EXPECT_TRUE(std::isnan(grouped[i])) << "written past the lse groups at " << i;
  }
  p.lse_stride_group = int64_t{H} * kSq - 1;  // groups overlap
  try {
    sparse_decode(p, ws.data(), ws.size() * 4);
    ADD_FAILURE() << "accepted overlapping lse groups";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'lse_stride_group'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sparsemla::test::decode
