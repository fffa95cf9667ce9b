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
// is cut to its best k by a radix select on the rank words (theta rises to the new k-th; cut()
// below); cut_sorted() also sorts them by rank, for the lists and outputs that must be sorted.
// Nothing is ever dropped
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
// a barrier. Bitonic network: log2(P) * (log2(P) + 1) / 2 stages of P / 2 compare-exchanges, one
// barrier each.
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

// One stage of the network above (stride >= 1 of bitonic size `size`) over buf[0, P); no barrier.
template <class Key>
__device__ __forceinline__ void bitonic_stage_shared(uint64_t* buf, int32_t P, int32_t size,
                                                     int32_t stride, Key key) {
  for (int32_t i = threadIdx.x; i < P / 2; i += blockDim.x) {
    const int32_t pos = 2 * i - (i & (stride - 1));
    const uint64_t a = buf[pos], b = buf[pos + stride];
    const uint64_t ka = key(a), kb = key(b);
    const bool descending = (pos & size) == 0;
    if (descending ? ka < kb : ka > kb) {
      buf[pos] = b;
      buf[pos + stride] = a;
    }
  }
}

// The stages of sizes [size_lo, size_hi] whose strides are below Q = 32 * E, in registers: warp w
// holds segments w, w + warps, ... of Q words, lane l word v of a segment at v * 32 + l (strides
// >= 32 inside a lane, strides < 32 by shuffles). At size_lo every stride from min(size_lo, Q) / 2
// down runs, so one call does a whole size's tail or every size up to Q. Ends with a barrier.
template <int E, class Key>
__device__ void bitonic_stages_in_warps(uint64_t* buf, int32_t P, int32_t size_lo, int32_t size_hi,
                                        Key key) {
  constexpr int32_t Q = 32 * E;
  const int32_t lane = static_cast<int32_t>(threadIdx.x & 31);
  const int32_t warps = static_cast<int32_t>(blockDim.x >> 5);
  for (int32_t seg = static_cast<int32_t>(threadIdx.x >> 5) * Q; seg < P; seg += warps * Q) {
    uint64_t x[E];
#pragma unroll
    for (int v = 0; v < E; ++v) x[v] = buf[seg + 32 * v + lane];
    for (int32_t size = size_lo; size <= size_hi; size <<= 1) {
      const int32_t top = (size < Q ? size : Q) >> 1;  // the largest stride of this size here
#pragma unroll
      for (int j = E / 2; j >= 1; j >>= 1) {  // strides 32 j: word v against word v ^ j
        if (32 * j > top) continue;
#pragma unroll
        for (int v = 0; v < E; ++v) {
          if ((v & j) != 0) continue;
          const bool descending = ((seg + 32 * v + lane) & size) == 0;
          const uint64_t a = x[v], b = x[v ^ j];
          const uint64_t ka = key(a), kb = key(b);
          if (descending ? ka < kb : ka > kb) {
            x[v] = b;
            x[v ^ j] = a;
          }
        }
      }
#pragma unroll
      for (int32_t s = 16; s >= 1; s >>= 1) {  // strides < 32: lane l against lane l ^ s
        if (s > top) continue;
        const bool lower = (lane & s) == 0;
#pragma unroll
        for (int v = 0; v < E; ++v) {
          const bool descending = ((seg + 32 * v + lane) & size) == 0;
          const uint64_t y = __shfl_xor_sync(0xFFFFFFFFu, x[v], s);
          const uint64_t kx = key(x[v]), ky = key(y);
          // The lower position keeps the larger key when descending; ties keep their own word.
          const bool take = lower == descending ? ky > kx : ky < kx;
          x[v] = take ? y : x[v];
        }
      }
    }
#pragma unroll
    for (int v = 0; v < E; ++v) buf[seg + 32 * v + lane] = x[v];
  }
  __syncthreads();
}

template <int E, class Key>
__device__ void block_sort_descending_e(uint64_t* buf, int32_t P, Key key) {
  constexpr int32_t Q = 32 * E;
  bitonic_stages_in_warps<E>(buf, P, 2, Q, key);  // every size up to Q
  for (int32_t size = 2 * Q; size <= P; size <<= 1) {
    for (int32_t stride = size >> 1; stride >= Q; stride >>= 1) {
      bitonic_stage_shared(buf, P, size, stride, key);
      __syncthreads();
    }
    bitonic_stages_in_warps<E>(buf, P, size, size, key);  // strides Q / 2 .. 1
  }
}

// The same network, its stages of stride < 32 * E run in registers (E = P / threads words per
// lane, 1..16): about log2(P / 32E) * (log2(P / 32E) + 3) / 2 + 1 barriers instead of one per
// stage (P = 512: 10 at 256 threads, 6 at 128, against 45). Same result as block_sort_descending
// for distinct keys (the network is the same). Block size a multiple of 32; ends with a barrier.
template <class Key>
__device__ void block_sort_descending_fast(uint64_t* buf, int32_t P, Key key) {
  const int32_t per_lane = P / static_cast<int32_t>(blockDim.x);
  if (P < 64) {
    block_sort_descending(buf, P, key);
  } else if (per_lane <= 1) {
    block_sort_descending_e<1>(buf, P, key);
  } else if (per_lane == 2) {
    block_sort_descending_e<2>(buf, P, key);
  } else if (per_lane == 4) {
    block_sort_descending_e<4>(buf, P, key);
  } else if (per_lane == 8) {
    block_sort_descending_e<8>(buf, P, key);
  } else {
    block_sort_descending_e<16>(buf, P, key);
  }
}

constexpr int kRadixBins = 256;  // 8-bit digits of the rank word
constexpr int kMaxWarps = 32;

// Shared-memory state of a TopkBuffer (next to its words): theta and count, then the scratch of
// cut()'s radix select. A multiple of 16 bytes.
struct TopkState {
  uint64_t theta;  // rank word of the k-th best kept (0: fewer than k seen)
  int32_t count;   // live words in the buffer
  int32_t pad;
  uint64_t prefix;    // the k-th's rank word: bits [shift, 64) found so far
  uint64_t min_kept;  // the least rank word kept (the new theta)
  int32_t shift;      // lowest found bit (64: none)
  int32_t want;       // the k-th's place among the words that match prefix on [shift, 64)
  int32_t done;       // the words at or above prefix on [shift, 64) are exactly the k best
  int32_t pad2;
  uint64_t warp_or[kMaxWarps];
  uint64_t warp_and[kMaxWarps];
  int32_t warp_sum[2][kMaxWarps];
  uint32_t hist[2][kRadixBins];
};

// r matches / is at or above prefix on bits [shift, 64) (shift 64: every word).
__device__ __forceinline__ bool radix_in_bucket(uint64_t r, uint64_t prefix, int32_t shift) {
  return shift >= 64 || (r >> shift) == (prefix >> shift);
}
__device__ __forceinline__ bool radix_at_or_above(uint64_t r, uint64_t prefix, int32_t shift) {
  return shift >= 64 || (r >> shift) >= (prefix >> shift);
}

// Block-wide exact top-k over a stream of candidates. Every member function is called by every
// thread of the block (uniform control flow; block size a multiple of 32, at most 1024); state in
// shared memory.
struct TopkBuffer {
  uint64_t* buf;
  TopkState* st;
  int32_t capacity;  // >= next_pow2(k) and >= k + the largest reserve step
  int32_t k;

  static constexpr int kCompactWords = 4;  // words per thread per compaction chunk

  // Call with a barrier between it and any earlier use of the buffer; ends with a barrier.
  __device__ void reset() const {
    if (threadIdx.x == 0) {
      st->theta = 0;
      st->count = 0;
    }
    __syncthreads();
  }

  // Keeps the best k of the live words (in no particular order) when there are more than k... or
  // exactly k; theta becomes the k-th (the least kept), count min(count, k).
  //
  // Radix select from the top: the bits common to every live word are skipped (one OR / AND
  // reduction), then 8-bit digits: a 256-bin histogram of the words that match the digits found
  // so far (shared atomics), one warp scans the bins from the top for the digit of the k-th, and
  // the select stops as soon as the k-th's bin holds exactly the words still wanted (rank words
  // are distinct, so at the last digit it does). The k best are then the words at or above the
  // found prefix; an in-place compaction (block scan of per-thread counts, chunks of
  // kCompactWords * threads words, each written only at or below where it was read) moves them to
  // buf[0, k). No bin has a capacity: any number of equal scores (told apart by ~j) is exact.
  // Barriers: 1 + 2 per digit + 1 per chunk + 2. Starts and ends with a barrier-consistent view
  // of count (every thread reads it before thread 0 writes it after the barriers below).
  __device__ void cut() const {
    const int32_t n = st->count;
    if (n < k) {  // nothing to drop; theta stays 0
      __syncthreads();
      return;
    }
    const RankWord rank;
    const int32_t tid = static_cast<int32_t>(threadIdx.x);
    const int32_t threads = static_cast<int32_t>(blockDim.x);
    const int32_t lane = tid & 31, warp = tid >> 5, warps = threads >> 5;

    // 1. The bits every live word shares.
    uint64_t all_or = 0, all_and = ~uint64_t{0};
    for (int32_t i = tid; i < n; i += threads) {
      const uint64_t r = rank(buf[i]);
      all_or |= r;
      all_and &= r;
    }
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) {
      all_or |= __shfl_xor_sync(0xFFFFFFFFu, all_or, d);
      all_and &= __shfl_xor_sync(0xFFFFFFFFu, all_and, d);
    }
    if (lane == 0) {
      st->warp_or[warp] = all_or;
      st->warp_and[warp] = all_and;
    }
    for (int32_t i = tid; i < kRadixBins; i += threads) st->hist[0][i] = 0;
    if (tid == 0) st->min_kept = ~uint64_t{0};
    __syncthreads();
    all_or = 0, all_and = ~uint64_t{0};
    for (int32_t w = 0; w < warps; ++w) {
      all_or |= st->warp_or[w];
      all_and &= st->warp_and[w];
    }
    const uint64_t differ = all_or ^ all_and;
    // Bits above the highest differing one are every word's (and the k-th's); with none
    // differing there is one word (distinct ranks), k = 1, and it is kept.
    int32_t shift = 64;
    uint64_t prefix = 0;
    bool done = differ == 0;
    if (!done) {
      const int32_t high = 63 - __clzll(static_cast<long long>(differ));
      shift = high + 1;
      prefix = all_and & ~((uint64_t{2} << high) - 1);  // high = 63: 2 << 63 = 0, prefix 0
    }
    uint32_t want = static_cast<uint32_t>(k);

    // 2. Digits from the top until the k-th's bin is exactly what is wanted.
    for (int32_t pass = 0; !done; ++pass) {
      const int32_t lo = shift > 8 ? shift - 8 : 0;
      const uint64_t digit_mask = (uint64_t{1} << (shift - lo)) - 1;
      uint32_t* hist = st->hist[pass & 1];
      for (int32_t i = tid; i < n; i += threads) {
        const uint64_t r = rank(buf[i]);
        if (radix_in_bucket(r, prefix, shift))
          atomicAdd(&hist[static_cast<uint32_t>((r >> lo) & digit_mask)], 1u);
      }
      // The other histogram is free (last read by the previous pass's scan, before its barrier).
      for (int32_t i = tid; i < kRadixBins; i += threads) st->hist[(pass + 1) & 1][i] = 0;
      __syncthreads();
      if (warp == 0) {  // lane l scans bins 255 - 8 l - v, v = 0..7 (from the top)
        uint32_t h[8];
        uint32_t total = 0;
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          h[v] = hist[kRadixBins - 1 - 8 * lane - v];
          total += h[v];
        }
        uint32_t incl = total;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
          const uint32_t t = __shfl_up_sync(0xFFFFFFFFu, incl, d);
          if (lane >= d) incl += t;
        }
        // The bucket holds >= want words, so some lane's inclusive count reaches want.
        const uint32_t reach = __ballot_sync(0xFFFFFFFFu, incl >= want);
        if (lane == __ffs(reach) - 1) {
          uint32_t above = incl - total;  // words in higher bins
          int32_t bin = -1;
          uint32_t in_bin = 0;
#pragma unroll
          for (int v = 0; v < 8; ++v) {
            if (bin >= 0) continue;
            if (above + h[v] >= want) {
              bin = kRadixBins - 1 - 8 * lane - v;
              in_bin = h[v];
            } else {
              above += h[v];
            }
          }
          const uint32_t left = want - above;  // the k-th's place inside its bin
          st->prefix = prefix | (static_cast<uint64_t>(bin) << lo);
          st->shift = lo;
          st->want = static_cast<int32_t>(left);
          st->done = in_bin == left || lo == 0 ? 1 : 0;
        }
      }
      __syncthreads();
      prefix = st->prefix;
      shift = st->shift;
      want = static_cast<uint32_t>(st->want);
      done = st->done != 0;
    }

    // 3. Keep the words at or above prefix on [shift, 64): exactly k of them.
    uint64_t least = ~uint64_t{0};
    int32_t out = 0;
    constexpr int W = kCompactWords;
    for (int32_t base = 0, parity = 0; base < n; base += W * threads, parity ^= 1) {
      uint64_t w[W];
      bool keep[W];
      int32_t mine = 0;
#pragma unroll
      for (int v = 0; v < W; ++v) {
        const int32_t i = base + v * threads + tid;
        w[v] = i < n ? buf[i] : kSentinel;
        const uint64_t r = rank(w[v]);
        keep[v] = i < n && radix_at_or_above(r, prefix, shift);
        if (keep[v]) {
          ++mine;
          least = r < least ? r : least;
        }
      }
      int32_t incl = mine;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int32_t t = __shfl_up_sync(0xFFFFFFFFu, incl, d);
        if (lane >= d) incl += t;
      }
      if (lane == 31) st->warp_sum[parity][warp] = incl;
      __syncthreads();  // also: every word of this chunk is read before any is overwritten
      int32_t before = 0, chunk = 0;
      for (int32_t x = 0; x < warps; ++x) {
        const int32_t c = st->warp_sum[parity][x];
        before += x < warp ? c : 0;
        chunk += c;
      }
      // Destinations lie below out + chunk <= the chunk's end: read already, by every thread.
      int32_t dst = out + before + incl - mine;
#pragma unroll
      for (int v = 0; v < W; ++v) {
        if (keep[v]) buf[dst++] = w[v];
      }
      out += chunk;
      // warp_sum[parity] is written again two chunks on, after the next chunk's barrier (by
      // which every thread has read it).
    }
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) {
      const uint64_t o = __shfl_xor_sync(0xFFFFFFFFu, least, d);
      least = o < least ? o : least;
    }
    if (lane == 0) atomicMin(reinterpret_cast<unsigned long long*>(&st->min_kept), least);
    __syncthreads();
    if (tid == 0) {
      st->theta = st->min_kept;
      st->count = k;
    }
    __syncthreads();
  }

  // cut(), then the kept words sorted by rank (best first) in buf[0, count): a bitonic sort of
  // next_pow2(count) words (sentinels past count, ranking last). For lists that are published
  // sorted (the score kernels' splits) and the ByScore output. Ends with a barrier.
  __device__ void cut_sorted() const {
    cut();
    const int32_t n = st->count;  // stable: nothing writes it before the next barrier below
    const int32_t P = next_pow2(n);
    for (int32_t i = n + static_cast<int32_t>(threadIdx.x); i < P; i += blockDim.x)
      buf[i] = kSentinel;
    __syncthreads();
    block_sort_descending_fast(buf, P, RankWord{});
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
