// tools/common/indexer_verify.h: checks one indexer call's outputs on an IndexerProblem
// (`sparsemla bench --op indexer`) against the CPU backend on the same bytes, on every row or on
// a spread sample of rows (the CPU scores 16,384 FLOP per candidate and row: 32 rows of a 1M
// context are 137 GFLOP, seconds on 16 cores; a whole B = 128 batch would be minutes).
//  - BitIdentical (cuda-generic, docs/INDEXER.md): indices, lengths and scores equal the CPU
//    backend's bit for bit.
//  - NearTie (every other GPU path): the structure of CONTRACT 11.7 exactly and the near-tie rule
//    (indexer_near_tie.h) at eps = 2^-9, against a float64 reference of 11.2 with A(t,s) of 11.7.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "indexer_problem.h"

namespace sparsemla::tools {

// Host copy of one call's outputs: indices [T, k], lengths [T], scores [T, k] (empty: none).
struct IndexerOutputs {
  std::vector<int32_t> indices, lengths;
  std::vector<float> scores;
};

enum class IndexerCheck { BitIdentical, NearTie };

struct IndexerVerdict {
  int64_t rows = 0;     // rows checked
  std::string problem;  // "" when every checked row passed, else the first failure
};

// Rows to check: all when max_rows is 0 or >= T, else max_rows rows spread evenly over [0, T)
// (the first and the last included).
std::vector<int64_t> indexer_rows_to_verify(int64_t T, int64_t max_rows);

// `progress` (may be empty) hears what is being computed on long runs.
IndexerVerdict verify_indexer_outputs(const IndexerProblem& pb, const IndexerOutputs& got,
                                      IndexerCheck check, int64_t max_rows,
                                      const std::function<void(const std::string&)>& progress);

}  // namespace sparsemla::tools
