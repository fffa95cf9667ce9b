// src/cuda/generic/indexer_backend.h: the portable CUDA lightning-indexer decode (CONTRACT 11),
// sm_80+ (also in the sm_90a build). Arguments are validated by dispatch; every pointer is a device
// pointer; device values (row_request, num_candidates, page ids) are read only on the device. Runs
// on p.stream without allocation or host synchronisation (graph-safe, CONTRACT 11.5). Scores are
// bit-identical to the CPU backend's (src/cpu/indexer.cpp: same fp32 operations in the same
// order), so selections and both orders are too. Design: docs/INDEXER.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sparsemla/indexer.h"

namespace sparsemla::cuda_generic {

// How a call's candidate range [0, Wt * ibs) is cut: S splits per row, `chunk` candidates each (a
// multiple of the 32-entry tile). A function of (T, Wt, ibs, CU) only, never of device values.
struct IndexerSplits {
  int32_t num_splits = 1;
  int64_t chunk = 0;
};
IndexerSplits plan_indexer_splits(int64_t num_tokens, int64_t max_candidates, int32_t sms);
// The same rule for a path with other tiles (the Hopper path: 64 entries, splits of >= 4 tiles)
// and about items_per_sm * CU items in all.
IndexerSplits plan_indexer_splits_tiled(int64_t num_tokens, int64_t max_candidates, int32_t sms,
                                        int64_t tile, int64_t min_tiles_per_split,
                                        int64_t items_per_sm = 2);

// Workspace bytes of S splits per row, for either CUDA path: (score, index) pairs uint64
// [T, S, k] + counts int32 [T, S] (8-byte aligned).
size_t indexer_workspace_bytes(int64_t T, int32_t S, int32_t k);

// Workspace bytes of a call on the current device: (score, index) pairs uint64 [T, S, k] + counts
// int32 [T, S] (8-byte aligned); 0 when T = 0.
size_t indexer_workspace_size(const IndexerParams& p);

// Score kernel over (row, split) then merge kernel per row (indexer.cu). workspace: at least
// indexer_workspace_size(p) bytes, 8-byte aligned; fully rewritten by every call before it is read.
void indexer_topk(const IndexerParams& p, void* workspace);

}  // namespace sparsemla::cuda_generic
