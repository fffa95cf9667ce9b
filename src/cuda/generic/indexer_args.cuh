// src/cuda/generic/indexer_args.cuh: what the CUDA indexer kernels share (CONTRACT 11): kernel
// arguments, the generic score kernel's shared-memory layout, buffer capacities and the key and
// scale loads. No kernels: the generic path's are in indexer_kernels.cuh (launched by indexer.cu),
// the Hopper score kernel in src/cuda/sm90/indexer_sm90.cu, which runs the generic merge through
// launch_indexer_merge. Design: docs/INDEXER.md.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/generic/indexer_select.cuh"
#include "sparsemla/format.h"
#include "sparsemla/indexer.h"
#include "sparsemla/numerics.h"

namespace sparsemla::cuda_generic::indexer {

constexpr int kThreads = 256;
constexpr int kDim = kIndexerHeadDim;  // 128
constexpr int kLanes = 16;             // partial sums of a dot (the CPU's kLanes)
constexpr int kTile = 32;              // entries staged per step
constexpr int kRuns = kDim / 16;       // 16-byte runs of an entry's values: 8
constexpr int kTileStride = kDim + 4;  // floats per staged entry: 16-byte rows, banks staggered
static_assert(kTile * kRuns == kThreads, "one 16-byte run per thread stages a tile");

struct KernelArgs {
  int64_t num_tokens;
  int32_t num_heads;
  const uint8_t* q;
  int64_t q_stride_token;  // bytes
  int64_t q_stride_head;   // bytes
  const float* w;
  int64_t w_stride_token;  // elements
  const uint8_t* cache;
  int64_t num_blocks;
  int64_t block_stride;
  int32_t block_size;
  int32_t shuffle;
  const int32_t* block_table;
  int64_t block_table_stride;
  int32_t block_table_width;
  int64_t num_requests;
  const int32_t* row_request;
  const int32_t* num_candidates;
  int32_t topk;
  int32_t always_scored;  // ByScore or scores requested: keys are read even when n'_t <= k
  int32_t num_splits;
  int64_t chunk;
  int32_t score_capacity;  // words of the score kernel's buffer
  int32_t merge_capacity;  // words of the merge kernel's buffer
  uint64_t* ws_pairs;      // [T, S, k]
  int32_t* ws_counts;      // [T, S]
  int32_t* indices;
  int64_t indices_stride;
  int32_t width;
  int32_t* lengths;
  float* scores;
  int64_t scores_stride;
  int32_t by_score;
};

// ---- shared memory -----------------------------------------------------------------------------
// Score kernel: buffer words | TopkState | staged values [kTile][kTileStride] | weighted relus
// [kTile][H + 1] | scales [kTile] | indices [kTile] (-1: not a candidate). Every part is a multiple
// of 16 bytes long.
__host__ __device__ constexpr int64_t score_smem_values_offset(int32_t capacity) {
  return int64_t{capacity} * 8 + int64_t{sizeof(TopkState)};
}
__host__ __device__ constexpr int64_t score_smem_bytes(int32_t capacity, int32_t heads) {
  return score_smem_values_offset(capacity) + int64_t{kTile} * kTileStride * 4 +
         int64_t{kTile} * (heads + 1) * 4 + int64_t{kTile} * 8;
}
constexpr int64_t merge_smem_bytes(int32_t capacity) {
  return int64_t{capacity} * 8 + int64_t{sizeof(TopkState)};
}
static_assert(sizeof(TopkState) % 16 == 0, "16-byte parts keep the float4 rows aligned");

inline int32_t pow2_at_least(int64_t n) {
  int32_t p = 1;
  while (p < n) p <<= 1;
  return p;
}
// Buffers hold k plus one step of appends (a tile in the score kernel, a block of list words in
// the merge), a power of two (>= next_pow2(k): cut_sorted sorts next_pow2(k) words in place).
inline int32_t score_capacity(int32_t k) {
  return std::max(64, pow2_at_least(int64_t{k} + kTile));
}
// The one-list-at-a-time merge reads kMergeWordsPerThread words per thread and step; its buffer is
// at least 4,096 words (32 KB: under the 48 KB of shared memory that needs no opt-in), so at k =
// 512 a row of 8 lists of 512 is cut once, at the end.
constexpr int kMergeWordsPerThread = 4;
constexpr int32_t kMergeMinCapacity = 4096;
inline int32_t merge_capacity(int32_t k) {
  return std::max(kMergeMinCapacity,
                  pow2_at_least(int64_t{k} + int64_t{kThreads} * kMergeWordsPerThread));
}

// ---- device helpers ----------------------------------------------------------------------------
// 16 bytes at src (any alignment), as four little-endian words.
__device__ __forceinline__ void load16(const uint8_t* src, uint32_t (&w)[4]) {
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) w[i] |= static_cast<uint32_t>(__ldg(src + 4 * i + b)) << (8 * b);
  }
}

__device__ __forceinline__ float e4m3_byte(uint32_t word, int b) {
  return e4m3_to_float(static_cast<uint8_t>(word >> (8 * b)));
}

// The fp32 scale of an entry (the scale plane is unaligned for page strides not a multiple of 4).
__device__ __forceinline__ float load_scale(const uint8_t* src) {
  if ((reinterpret_cast<uintptr_t>(src) & 3) == 0)
    return __ldg(reinterpret_cast<const float*>(src));
  uint32_t u = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) u |= static_cast<uint32_t>(__ldg(src + i)) << (8 * i);
  return __uint_as_float(u);
}

// CONTRACT 11.2 dot of one head's query (registers) with one staged entry, in the CPU's order.
__device__ __forceinline__ float dot_cpu_order(const float (&qv)[kDim], const float* k_row) {
  float lane[kLanes];
#pragma unroll
  for (int l = 0; l < kLanes; ++l) lane[l] = 0.0f;
#pragma unroll
  for (int d = 0; d < kDim; d += kLanes) {
#pragma unroll
    for (int l = 0; l < kLanes; l += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(k_row + d + l);
      // Exact products: fmaf rounds once, as the CPU's lane += q * k does.
      lane[l + 0] = fmaf(qv[d + l + 0], k4.x, lane[l + 0]);
      lane[l + 1] = fmaf(qv[d + l + 1], k4.y, lane[l + 1]);
      lane[l + 2] = fmaf(qv[d + l + 2], k4.z, lane[l + 2]);
      lane[l + 3] = fmaf(qv[d + l + 3], k4.w, lane[l + 3]);
    }
  }
  // The CPU's tree: widths 8, 4, 2, 1 (spelled out: a loop over widths kept lane[] in local
  // memory).
  static_assert(kLanes == 16, "the tree below is for 16 lanes");
#pragma unroll
  for (int l = 0; l < 8; ++l) lane[l] = __fadd_rn(lane[l], lane[l + 8]);
#pragma unroll
  for (int l = 0; l < 4; ++l) lane[l] = __fadd_rn(lane[l], lane[l + 4]);
#pragma unroll
  for (int l = 0; l < 2; ++l) lane[l] = __fadd_rn(lane[l], lane[l + 2]);
  return __fadd_rn(lane[0], lane[1]);
}

}  // namespace sparsemla::cuda_generic::indexer

namespace sparsemla::cuda_generic {
// The merge kernel of indexer_kernels.cuh over a.num_tokens rows (grid-stride, 256 threads) on
// `stream`: reads a.ws_counts / a.ws_pairs as any score kernel wrote them ([T, S] sorted lists of
// at most k words), writes the outputs. Defined in indexer.cu.
void launch_indexer_merge(const indexer::KernelArgs& a, cudaStream_t stream);
// The arguments of a call planned as `sp` (both paths' kernels read the same struct; the score
// kernel of each path sets its own score_capacity where its step differs). Defined in indexer.cu.
struct IndexerSplits;
indexer::KernelArgs make_indexer_args(const IndexerParams& p, const IndexerSplits& sp,
                                      void* workspace);
}  // namespace sparsemla::cuda_generic
