// src/cuda/generic/indexer.cu: the portable CUDA lightning-indexer decode (CONTRACT 11), fused
// form of 11.5, sm_80 and newer. Design and numbers: docs/INDEXER.md ("CUDA generic path").
//
// Two kernels on the caller's stream:
//  1. score: one CTA per work item (row t, split s) over a grid-stride loop of T * S items. The
//     split's candidate range [s * chunk, (s + 1) * chunk) is clipped on the device to the row's
//     live n'_t (11.3: n < 0 -> 0, clamped to Wt * ibs; padding rows have none), so a graph
//     captured at (T, Wt) serves every n_t (11.5) and items past the live length exit at once.
//     Tiles of 32 entries are staged in shared memory as exact fp32 (e4m3 decode); each thread
//     holds one head's query in registers and computes whole 128-term dots; the head sum runs per
//     entry in ascending h. The split keeps its exact local top-k (indexer_select.cuh) and
//     publishes it sorted by rank, with its count, in the workspace.
//  2. merge: one CTA per row streams the splits' sorted lists through the same exact top-k
//     (leaving each list at its first member that cannot enter) and writes indices [T, W]
//     (-1 padding), optional lengths and scores (-inf padding), ByIndex or ByScore.
//
// Scores equal the CPU backend's bit for bit (src/cpu/indexer.cpp, CONTRACT 11.2): 16 partial sums
// per dot (lane l takes dims l, l+16, ..., l+112 in order, from +0), the fixed pairwise tree over
// the 16 lanes, relu, w * relu rounded, head sum from +0 in ascending h, one multiply by the
// entry scale. Products of two e4m3 values are exact in fp32 (<= 8 significant bits, exponents in
// [-18, 17]), so fmaf(q, k, acc) rounds exactly as the CPU's acc + q * k; every other operation is
// an explicit __fadd_rn / __fmul_rn (no contraction).
//
// All offsets are int64 (page id x block_stride and t x strides exceed 2^31). Page ids outside
// [0, num_blocks) are never dereferenced; their entries are not candidates (11.4).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>

#include "cuda/common/device_info.h"
#include "cuda/generic/indexer_backend.h"
#include "cuda/generic/indexer_kernels.cuh"
#include "sparsemla/error.h"
#include "sparsemla/format.h"
#include "sparsemla/numerics.h"

namespace sparsemla::cuda_generic {

namespace {

using namespace indexer;  // the kernels, their arguments and shared-memory layout

constexpr int64_t kMinTilesPerSplit = 8;
constexpr int64_t kMaxSplits = 1024;
constexpr int64_t kMaxGrid = std::numeric_limits<int32_t>::max();

// ---- host side ---------------------------------------------------------------------------------
constexpr int32_t kMaxCapacity = 4096;  // score_capacity / merge_capacity at k = 2048
static_assert(kIndexerMaxTopk + kThreads * kMergeWordsPerThread <= kMaxCapacity &&
                  kIndexerMaxTopk + kThreads * kMergeWordsPerLane <= kMaxCapacity &&
                  kMergeMinCapacity <= kMaxCapacity,
              "buffers at k = 2048");
constexpr int64_t kMaxScoreSmem = score_smem_bytes(kMaxCapacity, 128);

// The score kernel's dynamic shared memory can pass 48 KiB (66.4 KB at k = 2048, H = 128): opt in
// once per device (not a stream operation, legal during graph capture).
void prepare_device() {
  constexpr int kMaxDevices = 64;
  static std::array<std::once_flag, kMaxDevices> once;
  int dev = 0;
  cuda::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  SPARSEMLA_CHECK_ARG(dev >= 0 && dev < kMaxDevices, "indexer_topk", "device", "< 64", dev);
  std::call_once(once[dev], [dev] {
    int max_smem = 0;
    cuda::check_cuda(
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "max shared memory");
    SPARSEMLA_CHECK_ARG(
        max_smem >= kMaxScoreSmem, "indexer_topk", "device",
        "a GPU with >= " + std::to_string(kMaxScoreSmem) + " bytes of shared memory per block",
        max_smem);
    cuda::check_cuda(
        cudaFuncSetAttribute(indexer_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kMaxScoreSmem)),
        "cudaFuncSetAttribute(indexer_score_kernel)");
  });
}

int64_t max_candidates(const IndexerParams& p) {
  return int64_t{p.block_table_width} * p.cache.block_size;
}

}  // namespace

IndexerSplits plan_indexer_splits(int64_t num_tokens, int64_t max_candidates, int32_t sms) {
  return plan_indexer_splits_tiled(num_tokens, max_candidates, sms, kTile, kMinTilesPerSplit);
}

size_t indexer_workspace_bytes(int64_t T, int32_t S, int32_t k) {
  const int64_t items = T * S;
  const int64_t counts = (items * 4 + 7) / 8 * 8;
  return static_cast<size_t>(items * k * 8 + counts);
}

IndexerSplits plan_indexer_splits_tiled(int64_t num_tokens, int64_t max_candidates, int32_t sms,
                                        int64_t tile, int64_t min_tiles_per_split,
                                        int64_t items_per_sm) {
  // About items_per_sm * CU items in all (CONTRACT 11.5: T x S bounded by about max(T, 2 CU)),
  // splits of at least min_tiles_per_split tiles, no empty split at the full width.
  const int64_t tiles = std::max<int64_t>(1, (max_candidates + tile - 1) / tile);
  const int64_t T = std::max<int64_t>(1, num_tokens);
  const int64_t want = (std::max<int64_t>(items_per_sm, 1) * std::max(sms, 1) + T - 1) / T;
  const int64_t most =
      std::min(kMaxSplits, (tiles + min_tiles_per_split - 1) / min_tiles_per_split);
  const int64_t S0 = std::clamp<int64_t>(want, 1, std::max<int64_t>(1, most));
  const int64_t per = (tiles + S0 - 1) / S0;
  IndexerSplits out;
  out.num_splits = static_cast<int32_t>((tiles + per - 1) / per);
  out.chunk = per * tile;
  return out;
}

size_t indexer_workspace_size(const IndexerParams& p) {
  if (p.num_tokens == 0) return 0;
  const IndexerSplits sp =
      plan_indexer_splits(p.num_tokens, max_candidates(p), cuda::current_device_sms());
  return indexer_workspace_bytes(p.num_tokens, sp.num_splits, p.topk);
}

indexer::KernelArgs make_indexer_args(const IndexerParams& p, const IndexerSplits& sp,
                                      void* workspace) {
  const int32_t H = p.num_heads;
  KernelArgs a{};
  a.num_tokens = p.num_tokens;
  a.num_heads = H;
  a.q = p.q;
  a.q_stride_head = p.q_stride_head != 0 ? p.q_stride_head : kDim;
  a.q_stride_token = p.q_stride_token != 0 ? p.q_stride_token : int64_t{H} * kDim;
  a.w = p.w;
  a.w_stride_token = p.w_stride_token != 0 ? p.w_stride_token : H;
  a.cache = p.cache.base;
  a.num_blocks = p.cache.num_blocks;
  a.block_stride = p.cache.block_stride;
  a.block_size = p.cache.block_size;
  a.shuffle = p.cache.layout == IndexerLayout::Shuffle ? 1 : 0;
  a.block_table = p.block_table;
  a.block_table_stride = p.block_table_stride;
  a.block_table_width = p.block_table_width;
  a.num_requests = p.num_requests;
  a.row_request = p.row_request;
  a.num_candidates = p.num_candidates;
  a.topk = p.topk;
  a.always_scored = p.order == TopkOrder::ByScore || p.scores != nullptr ? 1 : 0;
  a.num_splits = sp.num_splits;
  a.chunk = sp.chunk;
  a.score_capacity = score_capacity(p.topk);
  a.merge_capacity = merge_capacity(p.topk);
  a.ws_pairs = static_cast<uint64_t*>(workspace);
  a.ws_counts = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(workspace) +
                                           p.num_tokens * sp.num_splits * int64_t{p.topk} * 8);
  a.indices = p.indices;
  a.indices_stride = p.indices_stride != 0 ? p.indices_stride : p.width;
  a.width = p.width;
  a.lengths = p.lengths;
  a.scores = p.scores;
  a.scores_stride = p.scores_stride != 0 ? p.scores_stride : p.width;
  a.by_score = p.order == TopkOrder::ByScore ? 1 : 0;
  return a;
}

// Many splits (small T): the lists read in parallel, one lane per list; few: one list at a time
// (each list's first step is then one read, and the lanes kernel's wider steps cut more often).
constexpr int32_t kLanesMergeMinSplits = 16;

void launch_indexer_merge(const KernelArgs& a, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>(std::min(a.num_tokens, kMaxGrid));
  if (a.num_splits >= kLanesMergeMinSplits) {
    KernelArgs lanes = a;
    lanes.merge_capacity = merge_lanes_capacity(a.topk);
    const auto smem = static_cast<size_t>(merge_smem_bytes(lanes.merge_capacity));
    indexer_merge_lanes_kernel<<<grid, kThreads, smem, stream>>>(lanes);
    cuda::check_cuda(cudaGetLastError(), "indexer_merge_lanes_kernel launch");
    return;
  }
  const auto merge_smem = static_cast<size_t>(merge_smem_bytes(a.merge_capacity));
  indexer_merge_kernel<<<grid, kThreads, merge_smem, stream>>>(a);
  cuda::check_cuda(cudaGetLastError(), "indexer_merge_kernel launch");
}

void indexer_topk(const IndexerParams& p, void* workspace) {
  if (p.num_tokens == 0) return;
  prepare_device();
  const IndexerSplits sp =
      plan_indexer_splits(p.num_tokens, max_candidates(p), cuda::current_device_sms());
  const KernelArgs a = make_indexer_args(p, sp, workspace);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const int64_t items = p.num_tokens * sp.num_splits;
  const auto score_smem = static_cast<size_t>(score_smem_bytes(a.score_capacity, p.num_heads));
  indexer_score_kernel<<<static_cast<unsigned>(std::min(items, kMaxGrid)), kThreads, score_smem,
                         stream>>>(a);
  cuda::check_cuda(cudaGetLastError(), "indexer_score_kernel launch");
  launch_indexer_merge(a, stream);
}

}  // namespace sparsemla::cuda_generic
