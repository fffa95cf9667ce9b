// tools/common/indexer_near_tie.h: the near-tie rule of CONTRACT 11.7 for one row of an indexer
// output, shared by the CPU tests (tests/cpp/test_indexer.cpp) and `sparsemla bench --op indexer`
// (paths other than cuda-generic, which must instead equal the CPU backend bit for bit). Header
// only and free of the library and of gtest, so both can include it.
//
// With e(s) = eps * A(t,s): each selected score within e(s) of the reference, and
// min over selected (ref + e) >= max over unselected candidates (ref - e): two candidates may swap
// only when their reference scores are within their bounds. The structure (len, C_t, duplicates,
// -1 padding) is checked by the callers; an index that is not a candidate is reported here too.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace sparsemla::tools {

// `Candidate` has fields j (local index), score (reference score) and a (A(t,s) of 11.7).
// `scores` may be null (the call wrote none: only the selection is checked). Returns "" or the
// first violation.
template <typename Candidate>
std::string near_tie_violation(const std::vector<Candidate>& candidates, const int32_t* indices,
                               const float* scores, int32_t len, double eps) {
  std::unordered_map<int64_t, size_t> at;  // local index -> position in `candidates`
  at.reserve(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) at.emplace(candidates[i].j, i);
  std::vector<bool> selected(candidates.size(), false);
  double worst_selected = std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < len; ++i) {
    const auto it = at.find(indices[i]);
    if (it == at.end()) return "index " + std::to_string(indices[i]) + " is not a candidate";
    const Candidate& x = candidates[it->second];
    selected[it->second] = true;
    // 1e-30: a zero bound (every product 0) still admits the exact score.
    if (scores != nullptr && !(std::fabs(scores[i] - x.score) <= eps * x.a + 1e-30)) {
      return "index " + std::to_string(x.j) + ": score " + std::to_string(scores[i]) +
             ", reference " + std::to_string(x.score) + ", bound " + std::to_string(eps * x.a);
    }
    worst_selected = std::min(worst_selected, x.score + eps * x.a);
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& x = candidates[i];
    if (selected[i] || x.score - eps * x.a <= worst_selected) continue;
    return "unselected index " + std::to_string(x.j) + " (reference " + std::to_string(x.score) +
           ") beats the selection's lowest bound " + std::to_string(worst_selected);
  }
  return "";
}

}  // namespace sparsemla::tools
