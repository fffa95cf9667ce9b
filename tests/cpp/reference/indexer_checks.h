// tests/cpp/reference/indexer_checks.h: the CONTRACT 11.7 checks of an indexer output against the
// float64 reference, shared by the CPU tests (tests/cpp/test_indexer.cpp) and the GPU tests
// (tests/gpu/test_gpu_indexer.cpp): the always-exact structure, exact data bit for bit, and the
// near-tie rule with a path's eps (2^-16 fp32 FMA paths, 2^-9 FP8 tensor-core paths).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "common/indexer_near_tie.h"
#include "reference/indexer_reference.h"

namespace sparsemla::test {

// Always exact (11.7): len, indices inside C_t without duplicates, -1 and -inf padding.
inline void expect_structure(const IndexerCase& c, const IndexerOut& o, int64_t t) {
  const std::vector<RefCandidate> cand = ref_candidates(c, t);
  std::set<int64_t> members;
  for (const auto& x : cand) members.insert(x.j);
  const int64_t len = std::min<int64_t>(c.k, static_cast<int64_t>(cand.size()));
  ASSERT_EQ(o.lengths[t], len) << "row " << t;
  std::set<int32_t> seen;
  for (int32_t i = 0; i < c.W; ++i) {
    const int32_t j = o.indices[t * c.W + i];
    if (i >= len) {
      EXPECT_EQ(j, -1) << "row " << t << " padding at " << i;
      if (!o.scores.empty()) {
        EXPECT_EQ(o.scores[t * c.W + i], -std::numeric_limits<float>::infinity()) << "row " << t;
      }
      continue;
    }
    EXPECT_TRUE(members.count(j)) << "row " << t << ": index " << j << " is not a candidate";
    EXPECT_TRUE(seen.insert(j).second) << "row " << t << ": index " << j << " twice";
  }
}

// Exact data: the selection, its order and the scores equal the reference bit for bit.
inline void expect_exact(const IndexerCase& c, const IndexerOut& o, int64_t t, TopkOrder order) {
  expect_structure(c, o, t);
  std::vector<RefCandidate> sel = ref_select(c, t);
  if (order == TopkOrder::ByIndex) {
    std::sort(sel.begin(), sel.end(), [](const auto& a, const auto& b) { return a.j < b.j; });
  }
  for (size_t i = 0; i < sel.size(); ++i) {
    ASSERT_EQ(o.indices[t * c.W + i], sel[i].j) << "row " << t << " position " << i;
    if (o.scores.empty()) continue;
    const float want = static_cast<float>(sel[i].score), got = o.scores[t * c.W + i];
    EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
        << "row " << t << " index " << sel[i].j << ": " << got << " vs " << want;
  }
}

// Random data (11.7): scores within eps * A, and no unselected candidate beats a selected one by
// more than their bounds (the rule is tools/common/indexer_near_tie.h, shared with
// `sparsemla bench --op indexer`).
inline void expect_within_bounds(const IndexerCase& c, const IndexerOut& o, int64_t t, double eps) {
  expect_structure(c, o, t);
  EXPECT_EQ(
      tools::near_tie_violation(ref_candidates(c, t), &o.indices[t * c.W],
                                o.scores.empty() ? nullptr : &o.scores[t * c.W], o.lengths[t], eps),
      "")
      << "row " << t;
}

// The largest |score - ref| / A over row t's selected entries (0 when none has A > 0): a drift
// toward a path's bound is visible in the test log (11.7).
inline double worst_relative_error(const IndexerCase& c, const IndexerOut& o, int64_t t) {
  const std::vector<RefCandidate> cand = ref_candidates(c, t);
  std::vector<const RefCandidate*> by_j(static_cast<size_t>(c.Wt) * c.ibs, nullptr);
  for (const auto& x : cand) by_j[x.j] = &x;
  double worst = 0.0;
  for (int32_t i = 0; i < o.lengths[t]; ++i) {
    const int32_t j = o.indices[t * c.W + i];
    if (j < 0 || by_j[j] == nullptr || !(by_j[j]->a > 0.0)) continue;
    worst = std::max(worst, std::fabs(o.scores[t * c.W + i] - by_j[j]->score) / by_j[j]->a);
  }
  return worst;
}

}  // namespace sparsemla::test
