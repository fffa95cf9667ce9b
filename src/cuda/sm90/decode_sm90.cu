// src/cuda/sm90/decode_sm90.cu: the Hopper-specialised sparse decode (SPEC 4, 7), sm_90a.
//
// One CTA (256 threads = 2 warpgroups, 1 per SM: 255 registers per thread) owns one query row t,
// one split s and a group of 64 heads (rows past H are zero and never written). Warpgroup c:
//   - Q.K over dims [256c, +256) with wgmma m64n32k16 (Q and K both from shared memory); the two
//     partial score sets are summed through shared memory (identical S in both warpgroups);
//   - the online softmax in registers (lazy rescale, bf16 P, fp32 l);
//   - P.V for output columns [256c, +256) with wgmma m64n256k16 (P from registers, V = the same K
//     stage read MN-major): 128 fp32 accumulators per thread, the CTA's 64 x 512 output in
//     registers.
// The gather runs beside the asynchronous tensor work of the same warps: the copies of tile i+2
// (cp.async into a 3-stage ring of raw 584-byte rows, slot ids loaded a tile earlier) are issued
// while Q.K(i) runs, and tile i+1 is dequantised (FP8 x UE8M0 -> bf16 by bit placement and one
// bf16x2 multiply; NaN bytes and large codes take the exact path and the scrub) into the other
// bf16 K stage while P.V(i) runs. Two barriers per 32-key tile.
// Shared memory (no swizzle: every 16-byte chunk of a core matrix is contiguous, so the
// dequantiser's 16-byte stores and the raw-row reads are bank-conflict free):
//   Q       64 heads x 512 dims bf16, core matrix (head group g, dim chunk c) at (8c + g) * 128
//   K[2]    32 keys x 512 dims bf16, core matrix (key group g, dim chunk c) at (4c + g) * 128
//   raw[3]  32 keys x 592 B (576 data + 8 scale + valid byte + pad)
//   S[2][2] partial scores, 64 x 32 fp32 per warpgroup, fragment order
// Epilogue as the generic path: S > 1 writes the partials m, l, acc (combined by the generic
// combine kernel, launched with programmatic dependent launch), S == 1 finishes the rows in place.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "cuda/common/decode_common.cuh"
#include "cuda/common/decode_params.cuh"
#include "cuda/common/device_info.h"
#include "cuda/sm90/sm90_backend.h"
#include "cuda/sm90/wgmma.cuh"
#include "sparsemla/error.h"
#include "sparsemla/plan.h"

namespace sparsemla::cuda_sm90 {

namespace {

using cuda::cp_async16;
using cuda::cp_async_commit;
using cuda::cp_async_wait;
using cuda::DeviceCache;
using cuda::DeviceList;
using cuda::exp2_ftz;
using cuda::FinishParams;
using cuda::kLazyRescale;
using cuda::kLog2e;
using cuda::kNoScore;
using cuda::smem_u32;
using cuda::split_work;
using cuda::SplitWork;
using cuda::tile_cache;
using cuda::tile_scrub;
using cuda::tile_slot;

constexpr int kHeads = 64;                // wgmma M: heads per CTA
constexpr int kKeys = cuda::kKeyTile;     // keys per tile (SPEC 4.4 bk)
constexpr int kDim = Fp8DsMla::kHeadDim;  // 512
constexpr int kRawRowBytes = 37 * 16;  // 36 data chunks + pad: rows 148 words apart (conflict-free)
// 8 warps: 255 registers per thread (128 fp32 accumulators). A 9th warp would cap every thread at
// 168 (three warps on one of the 4 register-file quarters) and spill; setmaxnreg does not change
// ptxas's allocation, so there is no dedicated producer: the gather and dequantisation run beside
// the asynchronous wgmma of the same warps.
constexpr int kThreads = 256;
constexpr int kRawStages = 2;

constexpr int kQBytes = kHeads * kDim * 2;       // 65536
constexpr int kKBytes = kKeys * kDim * 2;        // 32768
constexpr int kRawBytes = kKeys * kRawRowBytes;  // 18944
constexpr int kScoreBytes = kHeads * kKeys * 4;  // 8192 per warpgroup
constexpr int kFlagBytes = 2 * kKeys;
constexpr int kSmemBytes =
    kQBytes + 2 * kKBytes + kRawStages * kRawBytes + 4 * kScoreBytes + kFlagBytes;
static_assert(kSmemBytes <= 227 * 1024, "fits the 227 KiB opt-in of sm_90");

using Sm90Params = cuda::DecodeKernelParams;  // the decode kernels' one parameter struct

// Device code exists only in the sm_90a cubin (and the host pass); other targets get an empty
// kernel.
#if !defined(__CUDA_ARCH__) || defined(SPARSEMLA_SM90A_DEVICE)
constexpr int kChunks = kDim / 8;  // 16-byte bf16 chunks per row: 64

struct Smem {
  unsigned char* q;
  unsigned char* k;    // [2][kKBytes]
  unsigned char* raw;  // [2][kRawBytes]
  float* scores;       // [2 tiles][2 warpgroups][64 x 32]
  uint8_t* flags;      // [2][32]
  __device__ __forceinline__ unsigned char* k_stage(int32_t i) const {
    return k + (i & 1) * kKBytes;
  }
  __device__ __forceinline__ unsigned char* raw_stage(int32_t i) const {
    return raw + (i % kRawStages) * kRawBytes;
  }
  __device__ __forceinline__ float* score_set(int32_t i, int c) const {
    return scores + ((i & 1) * 2 + c) * (kHeads * kKeys);
  }
};

__device__ __forceinline__ Smem carve(unsigned char* raw) {
  Smem s;
  s.q = raw;
  s.k = raw + kQBytes;
  s.raw = s.k + 2 * kKBytes;
  s.scores = reinterpret_cast<float*>(s.raw + kRawStages * kRawBytes);
  s.flags = reinterpret_cast<uint8_t*>(s.scores + 4 * kHeads * kKeys);
  return s;
}

// Byte offset of the 16-byte chunk (row, chunk c) in a core-matrix operand of `groups` 8-row
// groups.
__device__ __forceinline__ int cm_offset(int row, int c, int groups) {
  return (c * groups + row / 8) * 128 + (row % 8) * 16;
}

// ---- gather and dequantisation (all 256 threads) ------------------------------------------------
// Thread (key, r) of a tile: key = lane % 8 + 8 (warp % 4), r = lane / 8 + 4 (warp / 4). It copies
// 16-byte chunks r, r+8, r+16, r+24 and (r < 4) r+32 of its key's 36 (0..27 NoPE, 28..35 RoPE)
// with cp.async into its raw row, loads the key's scale word into registers, and later
// dequantises exactly those chunks: no thread reads another's copies, so no barrier orders the
// gather. The 8 lanes of a quarter warp hold 8 consecutive keys with the same r: their 16-byte
// raw reads (rows 592 B apart) and K-stage stores (8 rows of one core matrix) are conflict-free.
struct GatherLane {
  int key;
  int r;
};
__device__ __forceinline__ GatherLane gather_lane(int tid) {
  const int lane = tid % 32, warp = tid / 32;
  // (& 7: r < 8 lets the compiler resolve chunks r, r+8, r+16 as NoPE and r+32 as RoPE.)
  return {(lane & 7) + 8 * (warp & 3), ((lane >> 3) + 4 * (warp >> 2)) & 7};
}

// A tile's scale word and validity for this thread's key (registers, loaded with its copies).
struct RowMeta {
  uint2 scale;  // 7 UE8M0 codes + pad; zero for an invalid key
  bool valid;
};

// Issues this thread's copies of tile i (one cp.async group, empty past the last tile) and loads
// its key's scale word.
__device__ __forceinline__ RowMeta issue_rows(const Sm90Params& p, const SplitWork& w, int32_t i,
                                              int32_t slot, const Smem& sm, GatherLane g) {
  RowMeta meta{make_uint2(0, 0), false};
  if (i < w.tiles) {
    const DeviceCache& cache = tile_cache(p, w, i);
    unsigned char* row = sm.raw_stage(i) + g.key * kRawRowBytes;
    const cuda::RowOffsets off = cuda::row_offsets32(cache, slot);
    meta.valid = off.data >= 0;
    const int n = g.r < 4 ? 5 : 4;
    if (meta.valid) {
      const unsigned char* src = cache.base + off.data;
#pragma unroll
      for (int j = 0; j < 5; ++j) {
        if (j < n) cp_async16(row + 16 * (g.r + 8 * j), src + 16 * (g.r + 8 * j));
      }
      meta.scale = __ldg(reinterpret_cast<const uint2*>(cache.base + off.scale));
    } else {
#pragma unroll
      for (int j = 0; j < 5; ++j) {  // invalid: zero K (finite under P = 0), flag 0
        if (j < n) *reinterpret_cast<uint4*>(row + 16 * (g.r + 8 * j)) = make_uint4(0, 0, 0, 0);
      }
    }
  }
  cp_async_commit();
  return meta;
}

// True when every NoPE byte of the thread's chunks is a non-NaN e4m3, every scale code of the row
// is <= kFastMaxCode (all 7 checked: cheaper than selecting) and no RoPE value is a NaN.
__device__ __forceinline__ bool chunks_fast(const uint4 (&c)[5], int n, int r, uint2 scale) {
  uint32_t nan8 = 0, nan16 = 0;
#pragma unroll
  for (int j = 0; j < 5; ++j) {
    if (j >= n) break;
    const bool rope = 8 * j + r >= 28;
    const uint32_t b8 = cuda::nan_bytes_acc(c[j].x) | cuda::nan_bytes_acc(c[j].y) |
                        cuda::nan_bytes_acc(c[j].z) | cuda::nan_bytes_acc(c[j].w);
    const uint32_t b16 = cuda::nan_bf16_acc(c[j].x) | cuda::nan_bf16_acc(c[j].y) |
                         cuda::nan_bf16_acc(c[j].z) | cuda::nan_bf16_acc(c[j].w);
    nan8 |= rope ? 0u : b8;
    nan16 |= rope ? b16 : 0u;
  }
  return (nan8 & cuda::kNanBytesMask) == 0 && (nan16 & cuda::kNanBf16Mask) == 0 &&
         !cuda::any_code_above_fast(scale.x) && !cuda::any_code_above_fast(scale.y);
}

// Tile i: this thread's raw chunks -> the bf16 K stage (core-matrix layout); key flag by r == 0.
// NoPE chunk x gives dims [16x, +16) (bf16 chunks 2x, 2x+1), RoPE chunk x dims 448 + 8 (x - 28).
// Ends with the async-proxy fence: the stage is read by wgmma after the next barrier.
__device__ __forceinline__ void convert_rows(const Smem& sm, int32_t i, bool scrub, RowMeta meta,
                                             GatherLane g) {
  const unsigned char* row = sm.raw_stage(i) + g.key * kRawRowBytes;
  unsigned char* kst = sm.k_stage(i);
  const int n = g.r < 4 ? 5 : 4;
  uint4 c[5];
#pragma unroll
  for (int j = 0; j < 5; ++j) {
    c[j] =
        j < n ? *reinterpret_cast<const uint4*>(row + 16 * (g.r + 8 * j)) : make_uint4(0, 0, 0, 0);
  }
  const bool fast = chunks_fast(c, n, g.r, meta.scale);
#pragma unroll
  for (int j = 0; j < 5; ++j) {
    const int x = g.r + 8 * j;
    if (j >= n) break;
    if (x < 28) {
      uint4 lo, hi;
      const uint32_t code = cuda::scale_code(meta.scale, x / 4);
      if (fast) {
        cuda::dequant_nope16_fast(c[j], code, &lo, &hi);
      } else {
        cuda::dequant_nope16_any(c[j], code, scrub, &lo, &hi);
      }
      *reinterpret_cast<uint4*>(kst + cm_offset(g.key, 2 * x, 4)) = lo;
      *reinterpret_cast<uint4*>(kst + cm_offset(g.key, 2 * x + 1, 4)) = hi;
    } else {
      *reinterpret_cast<uint4*>(kst + cm_offset(g.key, 56 + (x - 28), 4)) =
          fast ? c[j] : cuda::rope_chunk16(c[j], scrub);
    }
  }
  if (g.r == 0) sm.flags[(i & 1) * kKeys + g.key] = meta.valid ? 1 : 0;
  fence_proxy_async();
}

// ---- tensor work and softmax --------------------------------------------------------------------

// Q rows h0.. into the core-matrix layout (zero rows past H): one cp.async group.
__device__ __forceinline__ void load_q(const Sm90Params& p, int64_t t, int32_t h0, int32_t heads,
                                       const Smem& sm, int ctid) {
#pragma unroll 4
  for (int n = 0; n < kHeads * kChunks / kThreads; ++n) {
    const int j = ctid + kThreads * n, h = j / kChunks, c = j % kChunks;
    cuda::load_q_chunk(p, t, h0 + h, c, h < heads, sm.q + cm_offset(h, c, kHeads / 8));
  }
  cp_async_commit();
}

// Q.K of warpgroup c over dims [256c, +256): 16 wgmma k-steps of 16 dims, issued (one group).
__device__ __forceinline__ void qk_issue(const Smem& sm, int32_t i, int c, float (&s)[16]) {
  const uint32_t q_base = smem_u32(sm.q), k_base = smem_u32(sm.k_stage(i));
  constexpr uint32_t kQChunkBytes = (kHeads / 8) * 128, kKChunkBytes = (kKeys / 8) * 128;
  // Step ks moves both start addresses by 2 dim chunks: a constant added to the descriptors'
  // address field (addr >> 4 < 2^14 for all of shared memory, so it never carries out).
  const uint64_t a0 = smem_desc(q_base + 32 * c * kQChunkBytes, kQChunkBytes, 128);
  const uint64_t b0 = smem_desc(k_base + 32 * c * kKChunkBytes, kKChunkBytes, 128);
  const uint32_t a_lo = static_cast<uint32_t>(a0), b_lo = static_cast<uint32_t>(b0);
  const uint64_t a_hi = a0 & ~uint64_t{0xFFFFFFFFu}, b_hi = b0 & ~uint64_t{0xFFFFFFFFu};
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 16; ++ks) {
    wgmma_m64n32k16_ss(s, a_hi | (a_lo + ks * (2 * kQChunkBytes >> 4)),
                       b_hi | (b_lo + ks * (2 * kKChunkBytes >> 4)), ks > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// P.V of warpgroup c: acc (64 x [256c, +256)) += P (64 x 32) . V (32 x 256), issued (one group).
__device__ __forceinline__ void pv_issue(const Smem& sm, int32_t i, int c,
                                         const uint32_t (&pa)[2][4], float (&acc)[128]) {
  const uint32_t k_base = smem_u32(sm.k_stage(i));
  wgmma_fence();
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
    // B: keys [16 kb, +16) (K: key groups 2kb, 2kb+1, LBO 128), dims [256c, +256) (N: 32 chunks,
    // SBO = 4 key groups x 128).
    const uint64_t b =
        smem_desc(k_base + (32 * c * (kKeys / 8) + 2 * kb) * 128, 128, (kKeys / 8) * 128);
    wgmma_m64n256k16_rs(acc, pa[kb], b);
  }
  wgmma_commit();
}

struct RowState {
  float m[2];  // rows r0 = 16 warp + lane / 4 and r0 + 8 (identical in a quad)
  float l[2];
};

// Online softmax of one tile on the summed scores s (fragment: s[4j + 2h + e] = row r_h, key
// 8j + 2 (lane % 4) + e); returns the alphas and the bf16 P fragments of the two 16-key blocks.
__device__ __forceinline__ void softmax_tile(float (&s)[16], const uint8_t* flags, float scale,
                                             int lane, RowState& st, float (&alpha)[2],
                                             uint32_t (&pa)[2][4]) {
  const int t2 = 2 * (lane % 4);
  bool valid[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t f = *reinterpret_cast<const uint16_t*>(flags + 8 * j + t2);
    valid[2 * j] = (f & 0xFFu) != 0;
    valid[2 * j + 1] = (f >> 8) != 0;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tmax = kNoScore;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& z = s[4 * j + 2 * h + e];
        z = valid[2 * j + e] ? z * scale : kNoScore;
        tmax = fmaxf(tmax, z);
      }
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xFFFFFFFFu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xFFFFFFFFu, tmax, 2));
    const bool move = tmax > st.m[h] + kLazyRescale;
    const float m_use = move ? tmax : st.m[h];
    alpha[h] = move ? exp2_ftz((st.m[h] - tmax) * kLog2e) : 1.0f;
    float psum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& z = s[4 * j + 2 * h + e];
        z = valid[2 * j + e] ? exp2_ftz((z - m_use) * kLog2e) : 0.0f;
        psum += z;
      }
    }
    psum += __shfl_xor_sync(0xFFFFFFFFu, psum, 1);
    psum += __shfl_xor_sync(0xFFFFFFFFu, psum, 2);
    st.l[h] = st.l[h] * alpha[h] + psum;
    st.m[h] = m_use;
  }
  // A fragment of keys [16 kb, +16): (r0, 2t), (r1, 2t), (r0, 2t + 8), (r1, 2t + 8).
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
    pa[kb][0] = cuda::bf16x2_bits(s[8 * kb + 0], s[8 * kb + 1]);
    pa[kb][1] = cuda::bf16x2_bits(s[8 * kb + 2], s[8 * kb + 3]);
    pa[kb][2] = cuda::bf16x2_bits(s[8 * kb + 4], s[8 * kb + 5]);
    pa[kb][3] = cuda::bf16x2_bits(s[8 * kb + 6], s[8 * kb + 7]);
  }
}

__device__ __forceinline__ void rescale(float (&acc)[128], const float (&alpha)[2]) {
  if (!__any_sync(0xFFFFFFFFu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    acc[4 * j] *= alpha[0];
    acc[4 * j + 1] *= alpha[0];
    acc[4 * j + 2] *= alpha[1];
    acc[4 * j + 3] *= alpha[1];
  }
}

// Partial scores of warpgroup c to shared memory, the other's back, summed (the same bits in both:
// fp32 addition commutes). Stored as [fragment float4 j][128 threads]: conflict-free.
__device__ __forceinline__ void exchange_scores(const Smem& sm, int32_t i, int c, int wtid,
                                                float (&s)[16]) {
  float4* mine = reinterpret_cast<float4*>(sm.score_set(i, c));
  const float4* other = reinterpret_cast<const float4*>(sm.score_set(i, 1 - c));
#pragma unroll
  for (int j = 0; j < 4; ++j)
    mine[j * 128 + wtid] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 o = other[j * 128 + wtid];
    s[4 * j] += o.x;
    s[4 * j + 1] += o.y;
    s[4 * j + 2] += o.z;
    s[4 * j + 3] += o.w;
  }
}

__device__ __forceinline__ void epilogue(const Sm90Params& p, int64_t t, int32_t s, int32_t h0,
                                         int32_t heads, int c, int wtid, const RowState& st,
                                         const float (&acc)[128]) {
  const int lane = wtid % 32, warp = wtid / 32, t2 = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + lane / 4 + 8 * h;
    if (row >= heads) continue;
    const float l = st.l[h] > 0.0f ? st.l[h] : 0.0f;
    const float m = st.l[h] > 0.0f ? st.m[h] : kNoScore;
    if (p.num_splits > 1) {
      const int64_t r = (t * p.num_splits + s) * p.num_heads + h0 + row;
      if (c == 0 && t2 == 0) {
        p.ws_m[r] = m;
        p.ws_l[r] = l;
      }
      if (!(l > 0.0f)) continue;
      float* dst = p.ws_acc + r * kDim + 256 * c + t2;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    } else {
      const FinishParams& f = p.finish;
      const float big_m = cuda::finish_max(m, f.sink, h0 + row);
      const float wgt = cuda::split_weight(m, big_m);
      const float coef = wgt * cuda::finish_factor(wgt * l, big_m, f.sink, h0 + row);
      if (c == 0 && t2 == 0) cuda::store_lse(f, t, h0 + row, cuda::finish_lse(m, l));
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float a = coef == 0.0f ? 0.0f : acc[4 * j + 2 * h] * coef;
        const float b = coef == 0.0f ? 0.0f : acc[4 * j + 2 * h + 1] * coef;
        cuda::store_out_pair(f, t, h0 + row, 256 * c + 8 * j + t2, a, b);
      }
    }
  }
}

// The tile loop. Per tile i (K(i) ready in its stage):
//   Q.K(i) | scores exchanged (barrier) | softmax | P.V(i) issued | this thread's rows of tile i+1
//   (copied during tile i-1) dequantised into the other K stage beside the tensor work, then the
//   async-proxy fence | copies of tile i+2 and the slot id of tile i+3 issued | P.V waited |
//   barrier. The fence (MEMBAR.CTA) waits for the thread's outstanding loads, so the only loads in
//   flight across it were issued a whole tile earlier and have landed.
__device__ __forceinline__ void decode_loop(const Sm90Params& p, const SplitWork& w, const Smem& sm,
                                            int64_t t, int32_t s, int32_t h0, int32_t heads,
                                            int tid) {
  const int c = tid / 128, wtid = tid % 128, lane = wtid % 32;
  const GatherLane g = gather_lane(tid);
  float acc[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) acc[j] = 0.0f;
  RowState st{{kNoScore, kNoScore}, {0.0f, 0.0f}};
  // Prologue: slot ids of tiles 0..2, rows of tiles 0 and 1, Q; tile 0 dequantised.
  const int32_t slot0 = tile_slot(p, w, 0, g.key), slot1 = tile_slot(p, w, 1, g.key);
  int32_t slot_ahead = tile_slot(p, w, 2, g.key);
  const RowMeta meta0 = issue_rows(p, w, 0, slot0, sm, g);
  RowMeta meta_next = issue_rows(p, w, 1, slot1, sm, g);
  load_q(p, t, h0, heads, sm, tid);
  cp_async_wait<0>();
  if (w.tiles > 0) convert_rows(sm, 0, tile_scrub(p, w, 0), meta0, g);
  fence_proxy_async();  // Q (cp.async writes) for wgmma
  __syncthreads();
  for (int32_t i = 0; i < w.tiles; ++i) {
    float sc[16];
    qk_issue(sm, i, c, sc);
    wgmma_wait<0>();
    exchange_scores(sm, i, c, wtid, sc);
    float alpha[2];
    uint32_t pa[2][4];
    softmax_tile(sc, sm.flags + (i & 1) * kKeys, p.scale, lane, st, alpha, pa);
    rescale(acc, alpha);
    pv_issue(sm, i, c, pa, acc);
    if (i + 1 < w.tiles) {
      cp_async_wait<0>();  // this thread's copies of tile i+1
      convert_rows(sm, i + 1, tile_scrub(p, w, i + 1), meta_next, g);
      meta_next = issue_rows(p, w, i + 2, slot_ahead, sm, g);  // into tile i's raw stage
      slot_ahead = tile_slot(p, w, i + 3, g.key);
    }
    wgmma_wait<0>();
    __syncthreads();  // K(i+1) and its flags ready; K(i) free
  }
  epilogue(p, t, s, h0, heads, c, wtid, st, acc);
}

#endif  // !__CUDA_ARCH__ || SPARSEMLA_SM90A_DEVICE

__global__ void __launch_bounds__(kThreads, 1)
    decode_sm90_kernel(const __grid_constant__ Sm90Params p) {
#ifdef SPARSEMLA_SM90A_DEVICE
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Smem sm = carve(smem_raw);
  const int tid = threadIdx.x;
  const int64_t t = blockIdx.x;
  const int32_t s = blockIdx.y, h0 = blockIdx.z * kHeads;
  const int32_t heads = min(kHeads, p.num_heads - h0);
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  int32_t work;
  const SplitWork w = split_work(p, t, s, &work);
  if (s >= work) {  // inactive (SPEC 4.5): m = -FLT_MAX, l = 0, acc untouched
    if (tid < heads) {
      const int64_t r = (t * p.num_splits + s) * p.num_heads + h0 + tid;
      p.ws_m[r] = kNoScore;
      p.ws_l[r] = 0.0f;
    }
    return;
  }
  decode_loop(p, w, sm, t, s, h0, heads, tid);
#endif
}

// ---- host ---------------------------------------------------------------------------------------
constexpr int kMaxDevices = 64;

void opt_in_once() {
  static std::array<std::once_flag, kMaxDevices> once;
  int dev = 0;
  cuda::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  SPARSEMLA_CHECK_ARG(dev >= 0 && dev < kMaxDevices, "sparse_decode", "device", "< 64", dev);
  std::call_once(once[dev], [] {
    cuda::check_cuda(cudaFuncSetAttribute(decode_sm90_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
                     "cudaFuncSetAttribute(decode_sm90_kernel)");
  });
}

}  // namespace

bool have_sm90a_kernels() {
#if defined(SPARSEMLA_BUILT_SM90A)
  static std::array<int, kMaxDevices> state{};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  if (state[dev] == 0) {
    cudaFuncAttributes attr{};
    // The sm_90a cubin is the one the runtime loads on a cc 9.0 device (binaryVersion 90).
    const bool ok =
        cudaFuncGetAttributes(&attr, decode_sm90_kernel) == cudaSuccess && attr.binaryVersion == 90;
    state[dev] = ok ? 1 : 2;
  }
  return state[dev] == 1;
#else
  return false;
#endif
}

void sparse_decode(const DecodeParams& p, int32_t num_splits, void* workspace) {
  if (p.num_tokens == 0) return;
  cuda::check_decode_launch(p, num_splits, workspace);
  opt_in_once();
  const Sm90Params k = cuda::decode_kernel_params(p, num_splits, workspace, /*specialised=*/true);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(num_splits),
                  static_cast<unsigned>((p.num_heads + kHeads - 1) / kHeads));
  decode_sm90_kernel<<<grid, kThreads, kSmemBytes, stream>>>(k);
  cuda::check_cuda(cudaGetLastError(), "decode_sm90_kernel launch");
  if (num_splits > 1) cuda::launch_combine(k, stream);
}

}  // namespace sparsemla::cuda_sm90
