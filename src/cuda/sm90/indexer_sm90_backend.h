// src/cuda/sm90/indexer_sm90_backend.h: the Hopper lightning-indexer decode (CONTRACT 11; FP8
// wgmma, sm_90a): Path::CudaSm90 of indexer_topk. Arguments are validated by dispatch; every
// pointer is a device pointer; runs on p.stream without allocation or host synchronisation
// (graph-safe, CONTRACT 11.5). Scores within CONTRACT 11.7's 2^-9 bound of the reference (exact on
// exact-arithmetic data). Design: docs/INDEXER.md ("Hopper path").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/generic/indexer_backend.h"
#include "sparsemla/indexer.h"

namespace sparsemla::cuda_sm90 {

// Empty when this call can take the Hopper path on the current device; otherwise what it needs
// (for the error naming `path` or `cache`): the sm_90a cubin on a cc 9.0 device, num_heads <= 128,
// a 16-byte aligned cache base and block stride.
std::string indexer_unsupported_reason(const IndexerParams& p);

// The Hopper split plan in 64-entry tiles. At T >= 16 one wave: floor(CU * resident_per_sm / T)
// splits per row (the score kernel's CTAs per SM from the occupancy of its shared memory and
// registers); below, the generic path's ~2 CU items (the merge reads S x k words per row). A
// function of (T, Wt * ibs, CU, H, k) only.
cuda_generic::IndexerSplits plan_indexer_splits_sm90(int64_t num_tokens, int64_t max_candidates,
                                                     int32_t sms, int32_t resident_per_sm);

// Workspace bytes: uint64 [T, S, k] + int32 [T, S] (8-byte aligned) with this path's S.
size_t indexer_workspace_size(const IndexerParams& p);

// FP8 wgmma score kernel over (row, split), then the generic merge kernel per row.
void indexer_topk(const IndexerParams& p, void* workspace);

}  // namespace sparsemla::cuda_sm90
