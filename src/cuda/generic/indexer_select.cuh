// src/cuda/generic/indexer_select.cuh: the exact block-wide top-k of the CUDA indexer
// (CONTRACT 11.3), shared by its score and merge kernels (indexer.cu).
//
// A candidate travels as one 64-bit word: fp32 score bits (high) and local index j (low). Its rank
// word makes the 11.3 order an unsigned comparison: high 32 bits the order-preserving bits of the
// rank key (non-finite -> -inf, -0 -> +0), low 32 bits ~j (lower index first). Rank words of
// distinct indices differ, so "the first k in rank order" has one answer however the candidates
// arrive (atomic appends in any order give the same selection and the same sorted output).
//
// A TopkBuffer streams candidates into a shared-memory buffer of `capacity` words (a power of two
// >= k + the most one step appends). A candidate is appended only when it ranks before theta, the
// rank word of the k-th best kept so far (0 until k are known): anything at or after it has k
// better candidates already and cannot be selected. When the next step could overflow, the buffer
// is bitonic-sorted and cut to its best k (theta rises to the new k-th). Nothing is ever dropped
// that could belong to the top k, and no bin has a fixed capacity, so low-contrast rows (tens of
// thousands of equal scores) select exactly.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sparsemla::cuda_generic::indexer {

// A buffer slot past the live count: score bits NaN, index 0xFFFFFFFF. Its rank word (rank key
// -inf, ~j = 0) is below every real candidate's (j <= INT32_MAX - 1, so ~j >= 2^31), and its index
// word is below every real index word.
constexpr uint64_t kSentinel = ~uint64_t{0};

__device__ __forceinline__ uint64_t pack(float score, uint32_t j) {
  return (static_cast<uint64_t>(__float_as_uint(score)) << 32) | j;
}
__device__ __forceinline__ float packed_score(uint64_t e) {
  return __uint_as_float(static_cast<uint32_t>(e >> 32));
}
__device__ __forceinline__ uint32_t packed_index(uint64_t e) {
  return static_cast<uint32_t>(e);
}

// CONTRACT 11.3 rank key: finite scores by value (-0 as +0), non-finite ones as -inf.
__device__ __forceinline__ float rank_key(float score) {
  if (!isfinite(score)) return __uint_as_float(0xFF800000u);
  return score == 0.0f ? 0.0f : score;
}

// Unsigned bits increasing with the float value (no NaN reaches here).
__device__ __forceinline__ uint32_t monotone_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// Larger = ranks first: rank key, then lower index.
struct RankWord {
  __device__ __forceinline__ uint64_t operator()(uint64_t e) const {
    return (static_cast<uint64_t>(monotone_bits(rank_key(packed_score(e)))) << 32) |
           static_cast<uint32_t>(~packed_index(e));
  }
};
// Larger = lower index (the ByIndex output order); sentinels last.
struct IndexWord {
  __device__ __forceinline__ uint64_t operator()(uint64_t e) const {
    return static_cast<uint32_t>(~packed_index(e));
  }
};

__device__ __forceinline__ int32_t next_pow2(int32_t n) {
  return n <= 1 ? 1 : 1 << (32 - __clz(n - 1));
}

// Sorts buf[0, P) descending by key (P a power of two) with every thread of the block; ends with
// a barrier. Bitonic network: log2(P) * (log2(P) + 1) / 2 stages of P / 2 compare-exchanges.
template <class Key>
__device__ void block_sort_descending(uint64_t* buf, int32_t P, Key key) {
  for (int32_t size = 2; size <= P; size <<= 1) {
    for (int32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int32_t i = threadIdx.x; i < P / 2; i += blockDim.x) {
        const int32_t pos = 2 * i - (i & (stride - 1));  // (i / stride) * 2 * stride + i % stride
        const uint64_t a = buf[pos], b = buf[pos + stride];
        const uint64_t ka = key(a), kb = key(b);
        const bool descending = (pos & size) == 0;  // the whole range at size == P
        if (descending ? ka < kb : ka > kb) {
          buf[pos] = b;
          buf[pos + stride] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Shared-memory state of a TopkBuffer (next to its words).
struct TopkState {
  uint64_t theta;  // rank word of the k-th best kept (0: fewer than k seen)
  int32_t count;   // live words in the buffer
  int32_t pad;
};

// Block-wide exact top-k over a stream of candidates. Every member function is called by every
// thread of the block (uniform control flow); state in shared memory.
struct TopkBuffer {
  uint64_t* buf;
  TopkState* st;
  int32_t capacity;  // power of two
  int32_t k;

  // Call with a barrier between it and any earlier use of the buffer; ends with a barrier.
  __device__ void reset() const {
    if (threadIdx.x == 0) {
      st->theta = 0;
      st->count = 0;
    }
    __syncthreads();
  }

  // Sorts the live words by rank and keeps the best k; theta becomes the k-th when k are kept.
  // Starts and ends with a barrier-consistent view of count (all threads read it before any
  // thread writes it: thread 0 writes only after the sort's barriers).
  __device__ void cut() const {
    const int32_t n = st->count;
    const int32_t P = next_pow2(n);
    for (int32_t i = n + threadIdx.x; i < P; i += blockDim.x) buf[i] = kSentinel;
    __syncthreads();
    block_sort_descending(buf, P, RankWord{});
    if (threadIdx.x == 0) {
      if (n >= k) st->theta = RankWord{}(buf[k - 1]);
      st->count = n < k ? n : k;
    }
    __syncthreads();
  }

  // Makes room for `step` more appends. Call where count is stable (after a barrier that follows
  // the last appends); ends with a barrier, so every thread has read count before any thread
  // appends again (without it a late reader could see a fast thread's append and cut alone).
  __device__ void reserve(int32_t step) const {
    const bool full = st->count + step > capacity;  // then count > capacity - step >= k
    __syncthreads();
    if (full) cut();  // theta rises to the k-th
  }

  // Offers one candidate from this thread (any subset of threads; at most `step` of reserve
  // between barriers). The caller puts a barrier before the next reserve / cut.
  __device__ void offer(uint64_t e) const {
    if (RankWord{}(e) <= st->theta) return;
    const int32_t slot = atomicAdd(&st->count, 1);
    buf[slot] = e;
  }
};

}  // namespace sparsemla::cuda_generic::indexer
