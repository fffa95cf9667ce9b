// bench/bench_indexer_timer.h: timing one lightning-indexer call of an IndexerProblem on a CUDA
// path (`sparsemla bench --op indexer`, CONTRACT 11.9), and the chain indexer -> ratio-4 builder.
#pragma once

#include <cstdint>

#include "bench_timer.h"
#include "indexer_problem.h"
#include "indexer_verify.h"

namespace sparsemla::tools {

// The H200's L2 (CONTRACT 11.9: 60 MB) and the rotation rule of the bench's input sets (copies
// of one set's keys, q and w at distinct addresses: the L2 caches addresses, not values).
inline constexpr double kL2Bytes = 60e6;
inline constexpr int32_t kMaxInputSets = 1024;
// One set when a set alone is over 2x the L2 (a call then evicts its own first keys before it
// ends, so the next call finds none of them); else enough sets that the rotation spans 4x the L2
// (240 MB: each set comes back after >= 180 MB of other traffic), at most kMaxInputSets (8K, B = 1
// is 0.29 MB a set: 840 sets). Device memory for the rotation is thus at most max(set, 240 MB +
// one set).
int32_t indexer_input_sets(double set_bytes);

struct IndexerTiming {
  Timing call;   // the indexer call alone; path as asked (auto stays auto: no indexer plan)
  Timing chain;  // indexer_topk + build_topk_lists in one graph (seconds empty: not timed)
  std::string chain_problem;  // why the chain was not timed ("" when it was)
  int32_t sets = 1;
  double set_bytes = 0;  // keys + q + w of one input set
  IndexerOutputs out;    // one call on set 0 after the timed ones, outputs poisoned first
};

// CUDA builds only (throws otherwise; a path the library rejects throws its sparsemla::Error):
// CUDA events around graph replays (one graph per input set, rotated call after call), warm-up,
// o.flush_bytes written before each call (0 by default here: the rotation keeps the L2 cold).
IndexerTiming time_indexer_cuda(IndexerProblem& pb, Path path, const TimingOptions& o);

}  // namespace sparsemla::tools
