// src/cuda/generic/indexer_kernels.cuh: the device side of the CUDA generic indexer (CONTRACT 11):
// kernel arguments, shared-memory layout, the score and merge kernels. Included by indexer.cu
// only (which launches them); the schedule and why it is exact are in that file's header and in
// docs/INDEXER.md.
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
static_assert(sizeof(TopkState) == 16, "16-byte parts keep the float4 rows aligned");

inline int32_t pow2_at_least(int64_t n) {
  int32_t p = 1;
  while (p < n) p <<= 1;
  return p;
}
// Buffers hold k plus one step of appends (a tile in the score kernel, a block of list words in
// the merge).
inline int32_t score_capacity(int32_t k) {
  return std::max(64, pow2_at_least(int64_t{k} + kTile));
}
inline int32_t merge_capacity(int32_t k) {
  return pow2_at_least(int64_t{k} + kThreads);
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

// ---- score kernel ------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads, 1) indexer_score_kernel(const KernelArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int32_t H = a.num_heads;
  const int32_t wr_stride = H + 1;  // odd strides for even H: the head sum reads spread banks
  const TopkBuffer top{reinterpret_cast<uint64_t*>(smem),
                       reinterpret_cast<TopkState*>(smem + int64_t{a.score_capacity} * 8),
                       a.score_capacity, a.topk};
  float* kv = reinterpret_cast<float*>(smem + score_smem_values_offset(a.score_capacity));
  float* wr = kv + kTile * kTileStride;
  float* scale = wr + kTile * wr_stride;
  int32_t* index = reinterpret_cast<int32_t*>(scale + kTile);

  const int tid = threadIdx.x;
  // Dot threads: thread (head, group) scores entries group, group + groups, ... of each tile.
  const int32_t groups = min(kThreads / H, kTile);
  const int32_t head = tid % H, group = tid / H;
  const bool dot_thread = group < groups;
  const int64_t table_capacity = int64_t{a.block_table_width} * a.block_size;
  const int64_t items = a.num_tokens * a.num_splits;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t t = item / a.num_splits;
    const int64_t s = item % a.num_splits;
    const int32_t r = __ldg(a.row_request + t);
    const bool live = r >= 0 && r < a.num_requests;
    int64_t n = live ? __ldg(a.num_candidates + t) : 0;
    n = n < 0 ? 0 : (n > table_capacity ? table_capacity : n);
    const int64_t begin = s * a.chunk;
    const int64_t end = min(n, begin + a.chunk);
    if (begin >= end) {  // CTA-uniform; no shared memory touched
      if (tid == 0) a.ws_counts[item] = 0;
      continue;
    }
    // 11.3: with n'_t <= k every candidate is selected; keys are read only for scores or ranks.
    const bool scored = a.always_scored != 0 || n > a.topk;
    float qv[kDim];
    float wh = 0.0f;
    if (scored && dot_thread) {
      const uint8_t* src = a.q + t * a.q_stride_token + int64_t{head} * a.q_stride_head;
#pragma unroll
      for (int run = 0; run < kRuns; ++run) {
        uint32_t wd[4];
        load16(src + 16 * run, wd);
#pragma unroll
        for (int i = 0; i < 16; ++i) qv[16 * run + i] = e4m3_byte(wd[i / 4], i % 4);
      }
      wh = __ldg(a.w + t * a.w_stride_token + head);
    }
    const int32_t* table_row = a.block_table + int64_t{r} * a.block_table_stride;
    top.reset();  // the previous item ended with a barrier

    for (int64_t tile = begin; tile < end; tile += kTile) {
      top.reserve(kTile);  // count is stable: after reset or the previous tile's last barrier
      {                    // stage: thread (entry e, run) decodes 16 values
        const int e = tid / kRuns, run = tid % kRuns;
        const int64_t j = tile + e;
        int32_t cand = -1;
        if (j < end) {
          const int32_t block = __ldg(table_row + j / a.block_size);
          if (block >= 0 && block < a.num_blocks) {
            cand = static_cast<int32_t>(j);  // j < n'_t <= INT32_MAX
            if (scored) {
              const uint8_t* page = a.cache + int64_t{block} * a.block_stride;
              const int32_t row = static_cast<int32_t>(j % a.block_size);
              uint32_t wd[4];
              load16(page + indexer_value_offset_in_page(
                                a.shuffle ? IndexerLayout::Shuffle : IndexerLayout::Normal, row,
                                16 * run),
                     wd);
              float4* dst = reinterpret_cast<float4*>(kv + e * kTileStride + 16 * run);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                dst[i] = make_float4(e4m3_byte(wd[i], 0), e4m3_byte(wd[i], 1), e4m3_byte(wd[i], 2),
                                     e4m3_byte(wd[i], 3));
              }
              if (run == 0)
                scale[e] = load_scale(page + indexer_scale_offset_in_page(a.block_size, row));
            }
          }
        }
        if (run == 0) index[e] = cand;
      }
      __syncthreads();
      if (scored) {
        if (dot_thread) {
          for (int c = group; c < kTile; c += groups) {
            if (index[c] < 0) continue;
            const float dot = dot_cpu_order(qv, kv + c * kTileStride);
            const float relu = dot < 0.0f ? 0.0f : dot;  // NaN stays NaN
            wr[c * wr_stride + head] = __fmul_rn(wh, relu);
          }
        }
        __syncthreads();
      }
      if (tid < kTile && index[tid] >= 0) {
        float score = 0.0f;
        if (scored) {
          const float* row = wr + tid * wr_stride;
          float head_sum = 0.0f;
#pragma unroll 8
          for (int32_t h = 0; h < H; ++h) head_sum = __fadd_rn(head_sum, row[h]);
          score = __fmul_rn(scale[tid], head_sum);
        }
        top.offer(indexer::pack(score, static_cast<uint32_t>(index[tid])));
      }
      __syncthreads();  // appends done; the next tile may restage
    }
    top.cut();  // sorted by rank, count = min(count, k)
    const int32_t kept = top.st->count;
    uint64_t* out = a.ws_pairs + item * a.topk;
    for (int32_t i = tid; i < kept; i += kThreads) out[i] = top.buf[i];
    if (tid == 0) a.ws_counts[item] = kept;
    __syncthreads();  // the buffer is read before the next item resets it
  }
}

// ---- merge kernel ------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) indexer_merge_kernel(const KernelArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const TopkBuffer top{reinterpret_cast<uint64_t*>(smem),
                       reinterpret_cast<TopkState*>(smem + int64_t{a.merge_capacity} * 8),
                       a.merge_capacity, a.topk};
  const int tid = threadIdx.x;
  const indexer::RankWord rank;
  for (int64_t t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
    top.reset();  // the previous row ended with a barrier
    for (int32_t s = 0; s < a.num_splits; ++s) {
      const int64_t item = t * a.num_splits + s;
      const int32_t m = a.ws_counts[item];  // <= k, written by the score kernel of this call
      const uint64_t* part = a.ws_pairs + item * a.topk;
      for (int32_t base = 0; base < m; base += kThreads) {
        top.reserve(kThreads);
        // The list is sorted by rank: once its next word cannot enter, none after it can.
        if (rank(part[base]) <= top.st->theta) break;  // CTA-uniform
        if (base + tid < m) top.offer(part[base + tid]);
        __syncthreads();
      }
    }
    top.cut();
    const int32_t len = top.st->count;  // min(k, |C_t|)
    if (a.by_score == 0) {
      const int32_t P = indexer::next_pow2(len);
      for (int32_t i = len + tid; i < P; i += kThreads) top.buf[i] = kSentinel;
      __syncthreads();
      indexer::block_sort_descending(top.buf, P, indexer::IndexWord{});
    }
    int32_t* idx = a.indices + t * a.indices_stride;
    float* sc = a.scores != nullptr ? a.scores + t * a.scores_stride : nullptr;
    const float neg_inf = __uint_as_float(0xFF800000u);
    for (int32_t i = tid; i < a.width; i += kThreads) {
      const bool sel = i < len;
      const uint64_t e = sel ? top.buf[i] : kSentinel;
      idx[i] = sel ? static_cast<int32_t>(indexer::packed_index(e)) : -1;
      if (sc != nullptr) sc[i] = sel ? indexer::packed_score(e) : neg_inf;
    }
    if (tid == 0 && a.lengths != nullptr) a.lengths[t] = len;
    __syncthreads();
  }
}

}  // namespace sparsemla::cuda_generic::indexer
