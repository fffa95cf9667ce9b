// src/cuda/generic/indexer_kernels.cuh: the CUDA generic indexer's kernels (CONTRACT 11): score
// and merge. Included by indexer.cu only (which launches them); arguments and layout in
// indexer_args.cuh; the schedule and why it is exact are in indexer.cu's header and in
// docs/INDEXER.md.
#pragma once

#include "cuda/generic/indexer_args.cuh"

namespace sparsemla::cuda_generic::indexer {

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
    top.cut_sorted();  // sorted by rank (the merge leaves a list at its first word that cannot
                       // enter), count = min(count, k)
    const int32_t kept = top.st->count;
    uint64_t* out = a.ws_pairs + item * a.topk;
    for (int32_t i = tid; i < kept; i += kThreads) out[i] = top.buf[i];
    if (tid == 0) a.ws_counts[item] = kept;
    __syncthreads();  // the buffer is read before the next item resets it
  }
}

// ---- merge kernels ------------------------------------------------------------------------------
// The row's last cut, then its output order in buf[0, count): ByScore by rank (cut_sorted), ByIndex
// the unordered cut sorted by index. Ends with a barrier.
__device__ __forceinline__ void finish_row(const TopkBuffer& top, bool by_score) {
  if (by_score) {
    top.cut_sorted();
    return;
  }
  top.cut();
  const int32_t len = top.st->count;
  const int32_t P = indexer::next_pow2(len);
  for (int32_t i = len + static_cast<int32_t>(threadIdx.x); i < P; i += kThreads)
    top.buf[i] = kSentinel;
  __syncthreads();
  indexer::block_sort_descending_fast(top.buf, P, indexer::IndexWord{});
}

// Few splits: one list at a time, kMergeWordsPerThread * kThreads words of it per step (one
// dependent read), through a buffer of merge_capacity(k) words (indexer_args.cuh).
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
      for (int32_t base = 0; base < m; base += kThreads * kMergeWordsPerThread) {
        const int32_t step = min(kThreads * kMergeWordsPerThread, m - base);  // CTA-uniform
        top.reserve(step);
        uint64_t w[kMergeWordsPerThread];  // every load issued before the exit test uses one
#pragma unroll
        for (int v = 0; v < kMergeWordsPerThread; ++v) {
          const int32_t i = base + v * kThreads + tid;
          w[v] = i < m ? part[i] : kSentinel;
        }
        // The list is sorted by rank: once its next word cannot enter, none after it can.
        if (rank(part[base]) <= top.st->theta) break;  // CTA-uniform
#pragma unroll
        for (int v = 0; v < kMergeWordsPerThread; ++v) {
          if (base + v * kThreads + tid < m) top.offer(w[v]);
        }
        __syncthreads();
      }
    }
    finish_row(top, a.by_score != 0);
    const int32_t len = top.st->count;  // min(k, |C_t|)
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

// ---- merge kernel for many splits
// ---------------------------------------------------------------- The same selection with the
// lists read in parallel: lane s of a 256-list round owns list base + s and offers
// kMergeWordsPerLane words of it per step (every load issued before any is used); a list leaves
// at its first word that cannot enter (sorted by rank, so none after it can). A step is one
// dependent read for all 256 lists instead of one per list: at T = 1 and S = 2 CU = 264 lists the
// sequential kernel above pays ~264 L2 round trips, this one ~4-6 (random data). Same output, bit
// for bit: the selection of the first min(k, |C_t|) of a total order is unique.
constexpr int kMergeWordsPerLane = 4;
inline int32_t merge_lanes_capacity(int32_t k) {
  return pow2_at_least(int64_t{k} + int64_t{kThreads} * kMergeWordsPerLane);
}

__global__ void __launch_bounds__(kThreads) indexer_merge_lanes_kernel(const KernelArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const TopkBuffer top{reinterpret_cast<uint64_t*>(smem),
                       reinterpret_cast<TopkState*>(smem + int64_t{a.merge_capacity} * 8),
                       a.merge_capacity, a.topk};
  const int tid = threadIdx.x;
  const indexer::RankWord rank;
  for (int64_t t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
    top.reset();  // the previous row ended with a barrier
    for (int32_t base = 0; base < a.num_splits; base += kThreads) {
      const int32_t s = base + tid;
      const int64_t item = t * a.num_splits + s;
      const int32_t m = s < a.num_splits ? a.ws_counts[item] : 0;  // <= k
      const uint64_t* part = a.ws_pairs + item * a.topk;
      int32_t pos = 0;
      for (;;) {
        top.reserve(kThreads * kMergeWordsPerLane);
        bool more = false;
        if (pos < m) {
          uint64_t w[kMergeWordsPerLane];
#pragma unroll
          for (int v = 0; v < kMergeWordsPerLane; ++v)
            w[v] = pos + v < m ? part[pos + v] : kSentinel;
          const uint64_t theta = top.st->theta;  // stable between reserve and the next barrier
#pragma unroll
          for (int v = 0; v < kMergeWordsPerLane; ++v) {
            if (pos >= m) break;
            if (rank(w[v]) <= theta) {
              pos = m;  // sorted: nothing after this word can enter
              break;
            }
            top.offer(w[v]);
            ++pos;
          }
          more = pos < m;
        }
        if (__syncthreads_or(more) == 0) break;  // also orders the appends before the reserve
      }
    }
    finish_row(top, a.by_score != 0);
    const int32_t len = top.st->count;  // min(k, |C_t|)
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
