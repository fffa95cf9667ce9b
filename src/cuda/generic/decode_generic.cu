// src/cuda/generic/decode_generic.cu: the portable CUDA sparse decode (SPEC 4), sm_80 and newer.
//
// Partial kernel, grid (T, S, ceil(H/16)), 128 threads (4 warps). One block owns a 16-head tile of
// one query row and one split of its keys. The block walks the split's part of the main segment,
// then of the extra segment, 32 keys at a time (a tile never straddles the two). Tile i:
//   1. convert: the raw rows of tile i (already in shared memory) are dequantised FP8 x UE8M0 to
//      bf16, NaN scrubbed to +0, into the K tile (invalid keys: zero rows);
//   2. the raw rows of tile i+1 are requested (cp.async, 16-byte chunks; byte loads for caches not
//      16-byte aligned) and warp 0 starts reading the slot ids of tile i+2 (untrusted: invalid
//      slots are never dereferenced), their row offsets and 8-byte scale words, so that the
//      global-memory latency of later tiles overlaps the matrix work of this one;
//   3. Q.K: each warp multiplies the 16 x 512 Q tile by 8 keys (mma.sync m16n8k16, fp32 acc.);
//   4. online softmax in fp32 (natural-log units, scale applied; invalid keys score -FLT_MAX and
//      get probability 0), probabilities rounded to bf16 for P.V, the denominator sums fp32;
//   5. P.V: each warp owns 128 of the 512 output columns (16 n-tiles x 4 fp32 = 64 registers).
// With S > 1 it writes the partials m, l [T, S, H] and acc [T, S, H, 512] (SPEC 4.3; a split with
// l == 0 writes m = -FLT_MAX, l = 0 and no acc); with S == 1 it finishes the row itself exactly as
// the combine would (sink, normalisation, fused inverse RoPE, lse, bf16 store).
// Combine kernel, grid (T, H), 128 threads x 4 columns: SPEC 4.3 / 4.3a.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <cstdint>
#include <string>

#include "cuda/common/decode_common.cuh"
#include "cuda/common/device_info.h"
#include "cuda/generic/generic_backend.h"
#include "sparsemla/error.h"
#include "sparsemla/plan.h"

namespace sparsemla::cuda_generic {

namespace {

using cuda::DeviceCache;
using cuda::DeviceList;
using cuda::FinishParams;
using cuda::kNoScore;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kHeadTile = 16;             // mma M
constexpr int kKeyTile = 32;              // keys per tile (SPEC 4.4 bk)
constexpr int kDim = Fp8DsMla::kHeadDim;  // 512
constexpr int kRowPitch = kDim + 8;       // bf16 per smem row: +16 bytes, ldmatrix conflict-free
constexpr int kPPitch = kKeyTile + 8;     // bf16 per probability row
constexpr int kSPitch = kKeyTile + 1;     // fp32 per score row
constexpr int kChunksPerRow = Fp8DsMla::kDataBytes / 16;          // 36: 28 NoPE + 8 RoPE
constexpr int kNopeChunks = Fp8DsMla::kNopeBytes / 16;            // 28
constexpr int kGatherJobs = kKeyTile * kChunksPerRow / kThreads;  // 9 chunks per thread
constexpr int kRopeChunks = kChunksPerRow - kNopeChunks;          // 8
constexpr int kNopeJobs = kKeyTile * kNopeChunks / kThreads;      // 7 NoPE chunks per thread
constexpr int kRopeJobs = kKeyTile * kRopeChunks / kThreads;      // 2 RoPE chunks per thread
constexpr int kColsPerWarp = kDim / kWarps;                       // 128
constexpr int kNTilesPerWarp = kColsPerWarp / 8;                  // 16
static_assert(kKeyTile * kChunksPerRow % kThreads == 0);
static_assert(kKeyTile * kNopeChunks % kThreads == 0 && kKeyTile * kRopeChunks % kThreads == 0);
static_assert(kHeadTile == kPlanHeadBlock && kKeyTile == kPlanKeyBlock);

// Shared memory carve-up (bytes, each piece 16-byte aligned).
constexpr int kQBytes = kHeadTile * kRowPitch * 2;    // 16640
constexpr int kKBytes = kKeyTile * kRowPitch * 2;     // 33280
constexpr int kPBytes = kHeadTile * kPPitch * 2;      // 1280
constexpr int kSBytes = kHeadTile * kSPitch * 4;      // 2112
constexpr int kRowBufs = 3;                           // row offsets / scales of tiles i, i+1, i+2
constexpr int kOffBytes = kRowBufs * kKeyTile * 8;    // data offsets
constexpr int kScaleBytes = kRowBufs * kKeyTile * 8;  // scale words
constexpr int kRawBytes = kKeyTile * Fp8DsMla::kDataBytes;  // 18432: raw data rows of tile i+1
constexpr int kRowBytes = 3 * kHeadTile * 4;                // alpha, l, coefficient per head
constexpr int kSmemBytes =
    kQBytes + kKBytes + kPBytes + kSBytes + kOffBytes + kScaleBytes + kRawBytes + kRowBytes;
// Blocks per SM the register budget aims at: 3 where shared memory allows it (228 KiB, sm_90+);
// sm_80 (164 KiB) fits only 2 blocks of kSmemBytes anyway.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kMinBlocksPerSm = 3;
#else
constexpr int kMinBlocksPerSm = 2;
#endif
static_assert(kQBytes % 16 == 0 && kKBytes % 16 == 0 && kPBytes % 16 == 0 && kSBytes % 16 == 0);

struct PartialParams {
  int64_t num_tokens;  // T
  int32_t num_heads;   // H
  int32_t num_splits;  // S
  const __nv_bfloat16* q;
  int64_t q_stride_token;
  int64_t q_stride_head;
  int32_t q_vec16;  // q and its strides allow 16-byte loads
  float scale;
  DeviceCache main_cache;
  DeviceCache extra_cache;
  DeviceList main_list;
  DeviceList extra_list;  // capacity 0: no extra segment
  int32_t scrub_extra;    // the main cache is always scrubbed
  int32_t adaptive;       // SPEC 4.5 active splits
  int32_t one_wave;       // ONE_WAVE (host)
  float* ws_m;            // [T, S, H]  (S > 1)
  float* ws_l;            // [T, S, H]
  float* ws_acc;          // [T, S, H, 512]
  FinishParams finish;    // S == 1
};

struct CombineParams {
  int64_t num_tokens;
  int32_t num_heads;
  int32_t num_splits;
  const float* ws_m;
  const float* ws_l;
  const float* ws_acc;
  FinishParams finish;
};

struct InverseRopeParams {
  __nv_bfloat16* x;
  int64_t num_tokens;
  int32_t num_heads;
  int64_t stride_token;
  int64_t stride_head;
  FinishParams rope;  // positions / rope table only
};

// ---- warp-level matrix primitives (sm_80 mma.sync) ---------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// d += a (16x16 bf16, row) * b (16x8 bf16, col), fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- the partial kernel ------------------------------------------------------------------------
struct Smem {
  __nv_bfloat16* q;   // [16][kRowPitch]
  __nv_bfloat16* k;   // [32][kRowPitch]
  __nv_bfloat16* p;   // [16][kPPitch]
  float* s;           // [16][kSPitch]
  int64_t* data_off;  // [3][32] (-1: invalid key)
  uint2* scale_word;  // [3][32]
  uint8_t* raw;       // [32][576] data rows as stored
  float* alpha;       // [16]
  float* row_l;       // [16]
  float* row_coef;    // [16]
};
__device__ __forceinline__ Smem carve_smem(unsigned char* raw) {
  Smem s;
  s.q = reinterpret_cast<__nv_bfloat16*>(raw);
  s.k = reinterpret_cast<__nv_bfloat16*>(raw + kQBytes);
  s.p = reinterpret_cast<__nv_bfloat16*>(raw + kQBytes + kKBytes);
  s.s = reinterpret_cast<float*>(raw + kQBytes + kKBytes + kPBytes);
  s.data_off = reinterpret_cast<int64_t*>(raw + kQBytes + kKBytes + kPBytes + kSBytes);
  s.scale_word = reinterpret_cast<uint2*>(raw + kQBytes + kKBytes + kPBytes + kSBytes + kOffBytes);
  s.raw = raw + kQBytes + kKBytes + kPBytes + kSBytes + kOffBytes + kScaleBytes;
  s.alpha = reinterpret_cast<float*>(s.raw + kRawBytes);
  s.row_l = s.alpha + kHeadTile;
  s.row_coef = s.row_l + kHeadTile;
  return s;
}

// The split's key ranges of both segments, as a sequence of tiles (main first).
struct SplitWork {
  int64_t main_begin;   // offsets into main indices
  int64_t extra_begin;  // offsets into extra indices
  int32_t main_keys;
  int32_t extra_keys;
  int32_t main_tiles;
  int32_t tiles;
};

struct Tile {
  bool extra;
  int64_t begin;  // offset into the segment's indices
  int32_t keys;   // 1..32
};
__device__ __forceinline__ Tile tile_of(const SplitWork& w, int32_t i) {
  if (i < w.main_tiles) {
    const int32_t k0 = i * kKeyTile;
    return {false, w.main_begin + k0, min(kKeyTile, w.main_keys - k0)};
  }
  const int32_t k0 = (i - w.main_tiles) * kKeyTile;
  return {true, w.extra_begin + k0, min(kKeyTile, w.extra_keys - k0)};
}

__device__ __forceinline__ const DeviceList& list_of(const PartialParams& p, bool extra) {
  return extra ? p.extra_list : p.main_list;
}
__device__ __forceinline__ const DeviceCache& cache_of(const PartialParams& p, bool extra) {
  return extra ? p.extra_cache : p.main_cache;
}

// Warp 0 reads the rows of tile i in three steps spread over the phases of an earlier tile, so
// that each global load has a phase to arrive: slot id -> (row offsets, scale-word load) -> store.
struct PendingRow {
  int32_t slot;
  int64_t data_off;
  uint2 scale_word;
};
__device__ __forceinline__ void stage_rows_begin(const PartialParams& p, const SplitWork& w,
                                                 int32_t i, int lane, PendingRow& r) {
  const Tile tile = tile_of(w, i);
  r.slot = lane < tile.keys ? __ldg(list_of(p, tile.extra).indices + tile.begin + lane) : -1;
}
__device__ __forceinline__ void stage_rows_middle(const PartialParams& p, const SplitWork& w,
                                                  int32_t i, const Smem& sm, int lane,
                                                  PendingRow& r) {
  const DeviceCache& cache = cache_of(p, tile_of(w, i).extra);
  const cuda::RowOffsets off = cuda::row_offsets(cache, r.slot);
  r.data_off = off.data;
  r.scale_word = off.data >= 0 ? cuda::load_scale8(cache, off.scale) : make_uint2(0, 0);
  sm.data_off[(i % kRowBufs) * kKeyTile + lane] = off.data;
}
__device__ __forceinline__ void stage_rows_end(int32_t i, const Smem& sm, int lane,
                                               const PendingRow& r) {
  sm.scale_word[(i % kRowBufs) * kKeyTile + lane] = r.scale_word;
}
__device__ __forceinline__ void stage_rows_now(const PartialParams& p, const SplitWork& w,
                                               int32_t i, const Smem& sm, int lane) {
  PendingRow r;
  stage_rows_begin(p, w, i, lane, r);
  stage_rows_middle(p, w, i, sm, lane, r);
  stage_rows_end(i, sm, lane, r);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// All threads: request the raw data rows of tile i into sm.raw (invalid keys are skipped; the
// conversion writes zeros for them). 16-byte aligned caches: cp.async, completed by
// cp_async_wait_all + a barrier; other caches: byte loads, stored before the next barrier.
__device__ __forceinline__ void load_tile_rows(const PartialParams& p, const SplitWork& w,
                                               int32_t i, const Smem& sm, int tid) {
  const DeviceCache& cache = cache_of(p, tile_of(w, i).extra);
  const int64_t* offs = sm.data_off + (i % kRowBufs) * kKeyTile;
#pragma unroll 3
  for (int j = 0; j < kGatherJobs; ++j) {
    const int job = tid + j * kThreads, key = job / kChunksPerRow, c = job % kChunksPerRow;
    const int64_t off = offs[key];
    if (off < 0) continue;
    uint8_t* dst = sm.raw + key * Fp8DsMla::kDataBytes + 16 * c;
    if (cache.aligned16) {
      cp_async16(dst, cache.base + off + 16 * c);
    } else {
      *reinterpret_cast<uint4*>(dst) = cuda::load_chunk16(cache, off + 16 * c);
    }
  }
}

// All threads: dequantise and scrub the raw rows of tile i into sm.k (invalid keys: zeros). NoPE
// and RoPE chunks are separate loops (7 + 2 per thread) so that warps do not diverge between them.
__device__ __forceinline__ void convert_tile(const PartialParams& p, bool extra, int32_t i,
                                             const Smem& sm, int tid) {
  const bool scrub = extra ? (p.scrub_extra != 0) : true;
  const int64_t* offs = sm.data_off + (i % kRowBufs) * kKeyTile;
  const uint2* scale_words = sm.scale_word + (i % kRowBufs) * kKeyTile;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < kNopeJobs; ++j) {
    const int job = tid + j * kThreads, key = job / kNopeChunks, c = job % kNopeChunks;
    const bool valid = offs[key] >= 0;
    const uint4 raw =
        valid ? *reinterpret_cast<const uint4*>(sm.raw + key * Fp8DsMla::kDataBytes + 16 * c)
              : zero;
    // Invalid keys: zero bytes with code 0 (their scale word is 0) give zeros.
    const uint32_t code = cuda::scale_code(scale_words[key], c / 4);  // 64 bytes per scale tile
    uint4 lo, hi;
    cuda::dequant_nope16_any(raw, code, scrub, &lo, &hi);
    uint4* dst = reinterpret_cast<uint4*>(sm.k + key * kRowPitch + 16 * c);
    dst[0] = lo;
    dst[1] = hi;
  }
#pragma unroll
  for (int j = 0; j < kRopeJobs; ++j) {
    const int job = tid + j * kThreads, key = job / kRopeChunks, c = job % kRopeChunks;
    const bool valid = offs[key] >= 0;
    const uint4 raw = valid ? *reinterpret_cast<const uint4*>(sm.raw + key * Fp8DsMla::kDataBytes +
                                                              Fp8DsMla::kNopeBytes + 16 * c)
                            : zero;
    *reinterpret_cast<uint4*>(sm.k + key * kRowPitch + Fp8DsMla::kNopeDims + 8 * c) =
        cuda::rope_chunk16(raw, scrub);
  }
}

// Q tile (heads h0..h0+15 of row t) into sm.q; heads >= H are zero rows (never written out).
__device__ __forceinline__ void load_q_tile(const PartialParams& p, int64_t t, int32_t h0,
                                            int32_t heads, const Smem& sm, int tid) {
  constexpr int kChunks = kDim / 8;  // 16-byte chunks per head
#pragma unroll
  for (int j = 0; j < kHeadTile * kChunks / kThreads; ++j) {
    const int job = tid + j * kThreads, r = job / kChunks, c = job % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < heads) {
      const __nv_bfloat16* src = p.q + t * p.q_stride_token + (h0 + r) * p.q_stride_head + 8 * c;
      if (p.q_vec16) {
        v = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          w[i] = static_cast<uint32_t>(__ldg(s16 + 2 * i)) |
                 (static_cast<uint32_t>(__ldg(s16 + 2 * i + 1)) << 16);
        }
        v = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    *reinterpret_cast<uint4*>(sm.q + r * kRowPitch + 8 * c) = v;
  }
}

// Warp `warp`: raw scores of 16 heads x keys 8*warp..8*warp+7 into sm.s.
__device__ __forceinline__ void qk_tile(const Smem& sm, int warp, int lane) {
  float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};  // two chains for ILP
  const __nv_bfloat16* a_base = sm.q + (lane % 16) * kRowPitch + (lane / 16) * 8;
  const __nv_bfloat16* b_base = sm.k + (8 * warp + lane % 8) * kRowPitch + (lane / 8) * 8;
#pragma unroll 2
  for (int kk = 0; kk < kDim / 32; ++kk) {
    uint32_t b[4], a0[4], a1[4];
    ldmatrix_x4(b, b_base + 32 * kk);  // dims 32kk..+31 of 8 keys: two k-steps
    ldmatrix_x4(a0, a_base + 32 * kk);
    ldmatrix_x4(a1, a_base + 32 * kk + 16);
    mma_bf16(acc0, a0, b[0], b[1]);
    mma_bf16(acc1, a1, b[2], b[3]);
  }
  const int g = lane / 4, c = 8 * warp + 2 * (lane % 4);
  sm.s[g * kSPitch + c] = acc0[0] + acc1[0];
  sm.s[g * kSPitch + c + 1] = acc0[1] + acc1[1];
  sm.s[(g + 8) * kSPitch + c] = acc0[2] + acc1[2];
  sm.s[(g + 8) * kSPitch + c + 1] = acc0[3] + acc1[3];
}

// Online softmax of one tile: 8 threads per head row, 4 keys each. Updates the row's running
// (m, l), writes bf16 probabilities and the rescale factor alpha of the accumulators.
__device__ __forceinline__ void softmax_tile(const Smem& sm, int buf, float scale, int tid,
                                             float& m_run, float& l_run) {
  const int r = tid / 8, k0 = 4 * (tid % 8);
  float z[4];
  bool valid[4];
  float tmax = kNoScore;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    valid[i] = sm.data_off[buf * kKeyTile + k0 + i] >= 0;
    z[i] = valid[i] ? sm.s[r * kSPitch + k0 + i] * scale : kNoScore;
    tmax = fmaxf(tmax, z[i]);
  }
#pragma unroll
  for (int o = 1; o < 8; o *= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xFFFFFFFFu, tmax, o));
  const float m_new = fmaxf(m_run, tmax);
  const float alpha = m_new == kNoScore ? 1.0f : __expf(m_run - m_new);
  float psum = 0.f, prob[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    prob[i] = valid[i] ? __expf(z[i] - m_new) : 0.0f;
    psum += prob[i];
  }
#pragma unroll
  for (int o = 1; o < 8; o *= 2) psum += __shfl_xor_sync(0xFFFFFFFFu, psum, o);
  l_run = l_run * alpha + psum;
  m_run = m_new;
  uint2 packed =
      make_uint2(cuda::bf16x2_bits(prob[0], prob[1]), cuda::bf16x2_bits(prob[2], prob[3]));
  *reinterpret_cast<uint2*>(sm.p + r * kPPitch + k0) = packed;
  if (tid % 8 == 0) sm.alpha[r] = alpha;
}

// Warp `warp`: acc (16 heads x its 128 columns) = alpha * acc + P (16x32) . V (32 x 128).
__device__ __forceinline__ void pv_tile(const Smem& sm, int warp, int lane,
                                        float (&acc)[kNTilesPerWarp][4]) {
  const int g = lane / 4;
  const float alpha_lo = sm.alpha[g], alpha_hi = sm.alpha[g + 8];
#pragma unroll
  for (int j = 0; j < kNTilesPerWarp; ++j) {
    acc[j][0] *= alpha_lo;
    acc[j][1] *= alpha_lo;
    acc[j][2] *= alpha_hi;
    acc[j][3] *= alpha_hi;
  }
  uint32_t a[2][4];
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    ldmatrix_x4(a[ks], sm.p + (lane % 16) * kPPitch + 16 * ks + (lane / 16) * 8);
  }
  const int key_in = lane % 8 + ((lane / 8) % 2) * 8, col_in = (lane / 16) * 8;
#pragma unroll
  for (int np = 0; np < kNTilesPerWarp / 2; ++np) {
    const int col = kColsPerWarp * warp + 16 * np + col_in;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sm.k + (16 * ks + key_in) * kRowPitch + col);
      mma_bf16(acc[2 * np], a[ks], b[0], b[1]);
      mma_bf16(acc[2 * np + 1], a[ks], b[2], b[3]);
    }
  }
}

__device__ __forceinline__ SplitWork split_work(const PartialParams& p, int64_t t, int32_t s,
                                                int32_t* work) {
  const cuda::RowRange mr = cuda::load_row_range(p.main_list, t);
  const cuda::RowRange xr = cuda::load_row_range(p.extra_list, t);
  *work = p.adaptive ? cuda::adaptive_work(mr.len, xr.len, p.num_splits, p.one_wave) : p.num_splits;
  SplitWork w{};
  if (s >= *work) return w;
  int32_t b, e;
  cuda::split_bounds(mr.len, *work, s, &b, &e);
  w.main_begin = mr.begin + b;
  w.main_keys = e - b;
  cuda::split_bounds(xr.len, *work, s, &b, &e);
  w.extra_begin = xr.begin + b;
  w.extra_keys = e - b;
  w.main_tiles = (w.main_keys + kKeyTile - 1) / kKeyTile;
  w.tiles = w.main_tiles + (w.extra_keys + kKeyTile - 1) / kKeyTile;
  return w;
}

// S > 1: partial m, l (owner threads) and acc (rows with l > 0) into the workspace.
__device__ __forceinline__ void write_partials(const PartialParams& p, const Smem& sm, int64_t t,
                                               int32_t s, int32_t h0, int32_t heads, int tid,
                                               float m_run, float l_run,
                                               const float (&acc)[kNTilesPerWarp][4]) {
  const int64_t row0 = (t * p.num_splits + s) * p.num_heads + h0;
  const int r = tid / 8;
  if (tid % 8 == 0 && r < heads) {
    p.ws_m[row0 + r] = l_run > 0.0f ? m_run : kNoScore;
    p.ws_l[row0 + r] = l_run > 0.0f ? l_run : 0.0f;
  }
  const int warp = tid / 32, lane = tid % 32, g = lane / 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = g + 8 * half;
    if (row >= heads || !(sm.row_l[row] > 0.0f)) continue;
    float* dst = p.ws_acc + (row0 + row) * kDim + kColsPerWarp * warp + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kNTilesPerWarp; ++j) {
      *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(acc[j][2 * half], acc[j][2 * half + 1]);
    }
  }
}

// S == 1: the combine of one split, done in place (sink, normalisation, inverse RoPE, lse, store).
__device__ __forceinline__ void finish_rows(const PartialParams& p, const Smem& sm, int64_t t,
                                            int32_t h0, int32_t heads, int tid, float m_run,
                                            float l_run, const float (&acc)[kNTilesPerWarp][4]) {
  const FinishParams& f = p.finish;
  const int r = tid / 8;
  if (tid % 8 == 0 && r < heads) {
    const float m = l_run > 0.0f ? m_run : kNoScore, l = l_run > 0.0f ? l_run : 0.0f;
    const float big_m = cuda::finish_max(m, f.sink, h0 + r);
    const float w = cuda::split_weight(m, big_m);
    sm.row_coef[r] = w * cuda::finish_factor(w * l, big_m, f.sink, h0 + r);
    cuda::store_lse(f, t, h0 + r, cuda::finish_lse(m, l));
  }
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32, g = lane / 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = g + 8 * half;
    if (row >= heads) continue;
    const float coef = sm.row_coef[row];
#pragma unroll
    for (int j = 0; j < kNTilesPerWarp; ++j) {
      const int col = kColsPerWarp * warp + 8 * j + 2 * (lane % 4);
      const float a = coef == 0.0f ? 0.0f : acc[j][2 * half] * coef;
      const float b = coef == 0.0f ? 0.0f : acc[j][2 * half + 1] * coef;
      cuda::store_out_pair(f, t, h0 + row, col, a, b);
    }
  }
}

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    decode_partial_kernel(const __grid_constant__ PartialParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const Smem sm = carve_smem(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t t = blockIdx.x;
  const int32_t s = blockIdx.y, h0 = blockIdx.z * kHeadTile;
  const int32_t heads = min(kHeadTile, p.num_heads - h0);

  int32_t work;
  const SplitWork w = split_work(p, t, s, &work);
  if (s >= work) {  // inactive under SPEC 4.5: m = -FLT_MAX, l = 0, acc untouched
    if (tid < heads) {
      const int64_t row = (t * p.num_splits + s) * p.num_heads + h0 + tid;
      p.ws_m[row] = kNoScore;
      p.ws_l[row] = 0.0f;
    }
    return;
  }

  float acc[kNTilesPerWarp][4];
#pragma unroll
  for (int j = 0; j < kNTilesPerWarp; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m_run = kNoScore, l_run = 0.0f;  // identical in the 8 threads of a head row

  if (w.tiles > 0) {
    load_q_tile(p, t, h0, heads, sm, tid);
    if (warp == 0) {
      stage_rows_now(p, w, 0, sm, lane);
      if (w.tiles > 1) stage_rows_now(p, w, 1, sm, lane);
    }
    __syncthreads();
    load_tile_rows(p, w, 0, sm, tid);
    cp_async_wait_all();
    __syncthreads();
    PendingRow pending{-1, -1, make_uint2(0, 0)};  // warp 0: rows of tile i + 2
    for (int32_t i = 0; i < w.tiles; ++i) {
      const bool ahead = warp == 0 && i + 2 < w.tiles;
      convert_tile(p, tile_of(w, i).extra, i, sm, tid);
      __syncthreads();  // K tile ready, raw rows consumed
      if (i + 1 < w.tiles) load_tile_rows(p, w, i + 1, sm, tid);
      if (ahead) stage_rows_begin(p, w, i + 2, lane, pending);
      qk_tile(sm, warp, lane);
      if (ahead) stage_rows_middle(p, w, i + 2, sm, lane, pending);
      __syncthreads();
      softmax_tile(sm, i % kRowBufs, p.scale, tid, m_run, l_run);
      if (ahead) stage_rows_end(i + 2, sm, lane, pending);
      __syncthreads();
      pv_tile(sm, warp, lane, acc);
      cp_async_wait_all();
      __syncthreads();  // raw rows of tile i + 1 visible; K, P free
    }
  }
  if (tid % 8 == 0) sm.row_l[tid / 8] = l_run;
  __syncthreads();
  if (p.num_splits > 1) {
    write_partials(p, sm, t, s, h0, heads, tid, m_run, l_run, acc);
  } else {
    finish_rows(p, sm, t, h0, heads, tid, m_run, l_run, acc);
  }
}

// ---- the combine kernel ------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads)
    decode_combine_kernel(const __grid_constant__ CombineParams p) {
  const int64_t t = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int col = 4 * threadIdx.x;
  const int64_t row0 = t * p.num_splits * p.num_heads + h;  // split s at row0 + s*H
  float max_m = kNoScore;
  for (int32_t s = 0; s < p.num_splits; ++s) max_m = fmaxf(max_m, p.ws_m[row0 + s * p.num_heads]);
  const float big_m = cuda::finish_max(max_m, p.finish.sink, h);
  float sum_wl = 0.f, sum_l = 0.f;  // with the sink's maximum / without (lse)
  for (int32_t s = 0; s < p.num_splits; ++s) {
    const float m = p.ws_m[row0 + s * p.num_heads], l = p.ws_l[row0 + s * p.num_heads];
    sum_wl += cuda::split_weight(m, big_m) * l;
    sum_l += cuda::split_weight(m, max_m) * l;
  }
  const float factor = cuda::finish_factor(sum_wl, big_m, p.finish.sink, h);
  float o[4] = {0.f, 0.f, 0.f, 0.f};
  if (factor != 0.0f) {
    for (int32_t s = 0; s < p.num_splits; ++s) {
      const int64_t row = row0 + s * p.num_heads;
      const float m = p.ws_m[row];
      if (m == kNoScore) continue;  // inactive: its acc may hold stale NaN/Inf
      const float c = cuda::split_weight(m, big_m) * factor;
      const float2* src = reinterpret_cast<const float2*>(p.ws_acc + row * kDim + col);
      const float2 v0 = src[0], v1 = src[1];
      o[0] += c * v0.x;
      o[1] += c * v0.y;
      o[2] += c * v1.x;
      o[3] += c * v1.y;
    }
  }
  cuda::store_out_pair(p.finish, t, h, col, o[0], o[1]);
  cuda::store_out_pair(p.finish, t, h, col + 2, o[2], o[3]);
  if (threadIdx.x == 0) cuda::store_lse(p.finish, t, h, cuda::finish_lse(max_m, sum_l));
}

// ---- standalone inverse RoPE -------------------------------------------------------------------
__global__ void inverse_rope_kernel(const __grid_constant__ InverseRopeParams p) {
  constexpr int kPairs = Fp8DsMla::kRopeDims / 2;
  const int64_t total = p.num_tokens * p.num_heads * kPairs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int k = static_cast<int>(i % kPairs);
    const int64_t th = i / kPairs, t = th / p.num_heads;
    const int32_t h = static_cast<int32_t>(th % p.num_heads);
    __nv_bfloat16* x = p.x + t * p.stride_token + h * p.stride_head + Fp8DsMla::kNopeDims + 2 * k;
    float a = __bfloat162float(x[0]), b = __bfloat162float(x[1]);
    cuda::inverse_rope(a, b, cuda::rope_cos_sin(p.rope, t, k));
    x[0] = __float2bfloat16_rn(a);
    x[1] = __float2bfloat16_rn(b);
  }
}

// ---- host side ---------------------------------------------------------------------------------
bool aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

DeviceCache device_cache(const CacheView& c) {
  return {c.base, c.num_blocks * static_cast<int64_t>(c.block_size), c.block_stride, c.block_size,
          aligned(c.base, Fp8DsMla::kFastAlign) && c.block_stride % Fp8DsMla::kFastAlign == 0};
}

DeviceList device_list(const RaggedList& l) {
  return {l.indices, l.indptr, l.capacity};
}

int64_t width_of(const RaggedList& l, int64_t num_tokens) {
  return l.width > 0 ? l.width : l.capacity / num_tokens;
}

FinishParams finish_params(const DecodeParams& p) {
  FinishParams f{};
  const int64_t out_token = p.out_stride_token != 0 ? p.out_stride_token : p.num_heads * 512LL;
  f.sink = p.sink;
  f.positions = p.positions;
  f.rope = p.rope.data;
  f.rope_rows = p.rope.rows;
  f.rope_stride = p.rope.row_stride;
  f.out = reinterpret_cast<__nv_bfloat16*>(p.out);
  f.out_stride_token = out_token;
  f.out_stride_head = p.out_stride_head;
  f.out_pair_aligned = aligned(p.out, 4) && out_token % 2 == 0 && p.out_stride_head % 2 == 0;
  f.lse = p.lse;
  f.lse_stride_token = p.lse_stride_token != 0 ? p.lse_stride_token : p.num_heads;
  f.lse_stride_head = p.lse_stride_head;
  return f;
}

// Dynamic shared memory above 48 KiB needs an opt-in per device (not a stream operation, so it is
// legal during graph capture); done once per device.
void ensure_smem_opt_in() {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices];
  int dev = 0;
  cuda::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < kMaxDevices && done[dev].load(std::memory_order_acquire)) return;
  cuda::check_cuda(cudaFuncSetAttribute(decode_partial_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
                   "cudaFuncSetAttribute(decode_partial_kernel)");
  if (dev < kMaxDevices) done[dev].store(true, std::memory_order_release);
}

PartialParams partial_params(const DecodeParams& p, int32_t num_splits, void* workspace) {
  PartialParams k{};
  const int64_t q_token = p.q_stride_token != 0 ? p.q_stride_token : p.num_heads * 512LL;
  k.num_tokens = p.num_tokens;
  k.num_heads = p.num_heads;
  k.num_splits = num_splits;
  k.q = reinterpret_cast<const __nv_bfloat16*>(p.q);
  k.q_stride_token = q_token;
  k.q_stride_head = p.q_stride_head;
  k.q_vec16 = aligned(p.q, 16) && q_token % 8 == 0 && p.q_stride_head % 8 == 0;
  k.scale = p.scale;
  k.main_cache = device_cache(p.main_cache);
  k.main_list = device_list(p.main_list);
  if (p.has_extra) {
    k.extra_cache = device_cache(p.extra_cache);
    k.extra_list = device_list(p.extra_list);
  }
  // SPEC 5: the generic path never meets the provenance gate, so the extra cache is scrubbed too.
  k.scrub_extra = !may_skip_extra_scrub(
      {/*specialised_path=*/false, true, p.kv_connector, p.has_extra, p.extra_cache_sanitised});
  k.adaptive = p.adaptive_splits ? 1 : 0;
  if (p.adaptive_splits) {
    PlanShape shape{p.num_tokens, p.num_heads, width_of(p.main_list, p.num_tokens),
                    p.has_extra ? width_of(p.extra_list, p.num_tokens) : 0,
                    p.num_sms > 0 ? p.num_sms : cuda::current_device_sms()};
    k.one_wave = adaptive_one_wave(shape, num_splits);
  }
  if (num_splits > 1) {
    const int64_t rows = p.num_tokens * num_splits * p.num_heads;
    k.ws_m = static_cast<float*>(workspace);
    k.ws_l = k.ws_m + rows;
    k.ws_acc = k.ws_l + rows;
  }
  k.finish = finish_params(p);
  return k;
}

}  // namespace

void sparse_decode(const DecodeParams& p, int32_t num_splits, void* workspace) {
  constexpr const char* kOp = "sparse_decode";
  if (p.num_tokens == 0) return;
  SPARSEMLA_CHECK_ARG(p.num_tokens <= INT32_MAX, kOp, "num_tokens", "<= 2^31-1 on the CUDA path",
                      p.num_tokens);
  SPARSEMLA_CHECK_ARG(num_splits >= 1 && num_splits <= 65535, kOp, "num_splits", "in [1, 65535]",
                      num_splits);
  if (num_splits > 1) {
    SPARSEMLA_CHECK_PTR(workspace, kOp, "workspace");
    SPARSEMLA_CHECK_ARG(aligned(workspace, 8), kOp, "workspace", "an 8-byte aligned pointer",
                        workspace);
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  ensure_smem_opt_in();
  const PartialParams kp = partial_params(p, num_splits, workspace);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(num_splits),
                  static_cast<unsigned>(plan_head_blocks(p.num_heads)));
  decode_partial_kernel<<<grid, kThreads, kSmemBytes, stream>>>(kp);
  cuda::check_cuda(cudaGetLastError(), "decode_partial_kernel launch");
  if (num_splits == 1) return;
  const CombineParams cp{p.num_tokens, p.num_heads, num_splits, kp.ws_m,
                         kp.ws_l,      kp.ws_acc,   kp.finish};
  decode_combine_kernel<<<dim3(static_cast<unsigned>(p.num_tokens), p.num_heads), kThreads, 0,
                          stream>>>(cp);
  cuda::check_cuda(cudaGetLastError(), "decode_combine_kernel launch");
}

void inverse_rope_inplace(bf16_bits* x, int64_t num_tokens, int32_t num_heads, int64_t stride_token,
                          int64_t stride_head, const int64_t* positions, const RopeTable& rope,
                          void* stream) {
  if (num_tokens == 0 || num_heads == 0) return;
  InverseRopeParams k{};
  k.x = reinterpret_cast<__nv_bfloat16*>(x);
  k.num_tokens = num_tokens;
  k.num_heads = num_heads;
  k.stride_token = stride_token != 0 ? stride_token : num_heads * 512LL;
  k.stride_head = stride_head;
  k.rope.positions = positions;
  k.rope.rope = rope.data;
  k.rope.rope_rows = rope.rows;
  k.rope.rope_stride = rope.row_stride;
  const int64_t pairs = num_tokens * num_heads * (Fp8DsMla::kRopeDims / 2);
  const int64_t blocks = (pairs + 255) / 256;
  inverse_rope_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0,
                        static_cast<cudaStream_t>(stream)>>>(k);
  cuda::check_cuda(cudaGetLastError(), "inverse_rope_kernel launch");
}

}  // namespace sparsemla::cuda_generic
