// src/cuda/generic/decode_partial.cuh: the split-K partial kernel of the portable CUDA decode
// (CONTRACT 4), sm_80 and newer; included by decode_generic.cu only.
//
// One CTA (256 threads, 8 warps) owns one query row t, one split s and HB head blocks of 16 heads
// (HB = 1, 2 or 4: 16, 32 or 64 heads), so every 32-key tile is gathered and dequantised ONCE for
// all of its heads (one CTA per 16 heads did it 4x at H = 64). Three barrier-separated phases per
// tile i:
//   A. Q.K: warp w computes a 32x32 (HB=4), 16x32 (HB=2) or 16x16 (HB=1) head x key block of
//      scores over one of 4 128-dim slices (mma.sync m16n8k16, bf16 -> fp32); the per-slice partial
//      sums go to shared memory (into the K buffer of tile i+1, idle at that point);
//   B. softmax: 256/(16*HB) threads per head sum the slices, apply the scale and update the head's
//      running (m, l) online in fp32 (m moves whenever the tile's maximum beats it by more
//      than rescale_lag, 0 by default: eager, p <= 1; acc and l always use the same m, and the
//      combine is exact for any m); probabilities rounded to bf16 for P.V while l sums the fp32 ones;
//   C. P.V of tile i (warp w owns output columns [64w, +64) of all the CTA's heads: HB x 8 x 4 fp32
//      accumulators per thread, 128 registers at HB = 4; V read transposed from the K buffer) in
//      one basic block with the dequantisation of tile i+1 (ALU work beside the tensor work): each
//      thread owns 4-5 of the 36 16-byte chunks of one key (8 threads per key), which reached its
//      registers during tile i; FP8 x UE8M0 -> bf16 (NaN scrubbed) into the K buffer of tile i+1.
//      Then the thread issues the global loads of its chunks of tile i+2 (registers again: staging
//      through shared memory would cost 36 KB of shared-memory traffic per tile) and the slot id
//      of tile i+3, so no load waits on another inside the loop.
// With S > 1 the CTA writes the partials m, l [T, S, H] and acc [T, S, H, 512] (a split with
// l == 0 writes m = -FLT_MAX, l = 0 and no acc); with S == 1 it finishes the rows itself exactly as
// the combine would. docs/PERF.md has the measurements and what limits this design ("What limits
// each path"); its history is docs/lab/generic-path.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_common.cuh"
#include "cuda/common/decode_params.cuh"
#include "sparsemla/format.h"
#include "sparsemla/plan.h"

namespace sparsemla::cuda_generic::partial {

using cuda::cp_async16;
using cuda::cp_async_wait_all;
using cuda::DeviceCache;
using cuda::DeviceList;
using cuda::exp2_ftz;
using cuda::FinishParams;
using cuda::kLog2e;
using cuda::kNoScore;
using cuda::ldmatrix_x4;
using cuda::ldmatrix_x4_trans;
using cuda::mma_bf16;
using cuda::smem_u32;
using cuda::split_work;
using cuda::SplitWork;
using cuda::tile_cache;
using cuda::tile_scrub;
using cuda::tile_slot;

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kHeadTile = 16;             // mma M
inline constexpr int kKeyTile = 32;              // keys per tile (CONTRACT 4.4 bk)
inline constexpr int kDim = Fp8DsMla::kHeadDim;  // 512
inline constexpr int kRowPitch = kDim + 8;       // bf16 per smem row: +16 B, ldmatrix conflict-free
inline constexpr int kPPitch = kKeyTile + 8;     // bf16 per probability row (80 B)
inline constexpr int kThreadsPerKey = kThreads / kKeyTile;  // 8 gather threads per key
inline constexpr int kColsPerWarp = kDim / kWarps;          // 64 P.V output columns per warp
inline constexpr int kNTiles = kColsPerWarp / 8;            // 8 mma n-tiles per warp
static_assert(kHeadTile == kPlanHeadBlock && kKeyTile == kPlanKeyBlock);
static_assert(Fp8DsMla::kDataBytes / 16 == 36 && kThreadsPerKey == 8);

// Work split inside one CTA of HB head blocks. Q.K always cuts the 512 dims into 4 slices of 128
// (8 warps = 4 slices x 2 groups: two 32-head groups at HB = 4, the two head blocks at HB = 2, two
// 16-key halves at HB = 1), and every other sum runs in a fixed order, so a row's bits do not
// depend on HB (which the host picks from the grid size) or on the batch.
template <int HB>
struct Cfg {
  static_assert(HB == 1 || HB == 2 || HB == 4);
  static constexpr int kHeads = kHeadTile * HB;
  static constexpr int kDimSplits = 4;                               // partial score sets
  static constexpr int kQkDims = kDim / kDimSplits;                  // 128 dims per Q.K warp
  static constexpr int kQkMTiles = HB == 4 ? 2 : 1;                  // 16-head tiles per Q.K warp
  static constexpr int kQkKeys = HB == 1 ? 16 : kKeyTile;            // keys per Q.K warp
  static constexpr int kThreadsPerHead = kThreads / kHeads;          // softmax: 16, 8, 4
  static constexpr int kKeysPerThread = kKeyTile / kThreadsPerHead;  // 2, 4, 8
  // Shared memory (bytes, every piece a multiple of 16).
  static constexpr int kQBytes = kHeads * kRowPitch * 2;
  static constexpr int kKBytes = kKeyTile * kRowPitch * 2;  // one K buffer: 33280
  static constexpr int kPartialBytes = kDimSplits * kHeads * kKeyTile * 4;
  static constexpr int kPBytes = kHeads * kPPitch * 2;
  static constexpr int kFlagBytes = 2 * kKeyTile + 16;  // key valid bytes of tiles i % 2, zero
  static constexpr int kRowBytes = 4 * kHeads * 4;      // alpha, m, l, coefficient per head
  static constexpr int kSmemBytes = kQBytes + 2 * kKBytes + kPBytes + kFlagBytes + kRowBytes;
  // HB = 1 fits two CTAs per SM (<= 128 registers); HB >= 2 needs more than 128 registers.
  static constexpr int kMinBlocksPerSm = HB == 1 ? 2 : 1;
  static_assert(kWarps == 2 * kDimSplits &&
                kQkMTiles * kHeadTile * kQkKeys * 2 == kHeads * kKeyTile);
  static_assert(kPartialBytes <= kKBytes, "partial scores live in the idle K buffer");
  static_assert(kThreadsPerHead <= 32 && kKeysPerThread >= 2);
};

using PartialParams = cuda::DecodeKernelParams;  // the decode kernels' one parameter struct

// Programmatic dependent launch (sm_90+): let the combine grid be scheduled while this one runs
// (it waits for our completion in griddepcontrol.wait). A no-op elsewhere.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- shared memory ------------------------------------------------------------------------------
template <int HB>
struct Smem {
  __nv_bfloat16* q;   // [kHeads][kRowPitch]
  unsigned char* kv;  // two K buffers [32][kRowPitch] bf16 (partial scores alias the idle one)
  __nv_bfloat16* p;   // [kHeads][kPPitch]
  uint8_t* flags;     // [2][32]: key k of tile i % 2 is valid (1) or not (0)
  uint32_t* zero;     // [4], always 0: see late_zero()
  float* alpha;       // [kHeads]
  float* row_m;       // [kHeads]
  float* row_l;       // [kHeads]
  float* row_coef;    // [kHeads]

  __device__ __forceinline__ __nv_bfloat16* k_buf(int32_t i) const {
    return reinterpret_cast<__nv_bfloat16*>(kv + (i & 1) * Cfg<HB>::kKBytes);
  }
  // Partial scores of tile i: in the K buffer of tile i+1, idle between the barrier after tile i's
  // dequant and the dequant of tile i+1 (which follows tile i's P.V).
  __device__ __forceinline__ float* partials(int32_t i) const {
    return reinterpret_cast<float*>(kv + ((i + 1) & 1) * Cfg<HB>::kKBytes);
  }
};

template <int HB>
__device__ __forceinline__ Smem<HB> carve_smem(unsigned char* raw) {
  using C = Cfg<HB>;
  Smem<HB> s;
  s.q = reinterpret_cast<__nv_bfloat16*>(raw);
  s.kv = raw + C::kQBytes;
  s.p = reinterpret_cast<__nv_bfloat16*>(s.kv + 2 * C::kKBytes);
  s.flags = raw + C::kQBytes + 2 * C::kKBytes + C::kPBytes;
  s.zero = reinterpret_cast<uint32_t*>(s.flags + 2 * kKeyTile);
  s.alpha = reinterpret_cast<float*>(s.flags + C::kFlagBytes);
  s.row_m = s.alpha + C::kHeads;
  s.row_l = s.row_m + C::kHeads;
  s.row_coef = s.row_l + C::kHeads;
  return s;
}

// Partial score (row, key) in a [rows][32] fp32 set: 16-byte chunk index XOR 2*(row % 4), so the
// Q.K float2 stores (rows g = 0..3 of a half warp) and the softmax float4 loads hit distinct banks.
__device__ __forceinline__ int score_index(int row, int key) {
  return row * kKeyTile + ((((key >> 2) ^ (2 * (row & 3))) << 2) | (key & 3));
}

// ---- the split's tiles --------------------------------------------------------------------------
// ---- gather (registers) and dequantisation ------------------------------------------------------
// Thread (key k = tid / 8, r = tid % 8) owns chunks r, r+8, r+16, r+24 and, for r < 4, r+32 of
// its key's 36 16-byte chunks (0..27 NoPE, 28..35 RoPE): 128 contiguous bytes per 8 threads. So
// c[0..2] are NoPE, c[3] is NoPE for r < 4 and RoPE chunk r-4 otherwise, c[4] is RoPE chunk r+4
// (r < 4; zero otherwise).
struct RowChunks {
  uint4 c[5];
  uint2 scale;  // 7 UE8M0 codes + pad; zero for an invalid key (code 0 on zero bytes gives 0)
};

// Issues the loads of tile i's rows (this thread's chunks; zeros for invalid keys) and publishes
// its key's valid flag.
template <int HB>
__device__ __forceinline__ void issue_tile_loads(const PartialParams& p, const SplitWork& w,
                                                 int32_t i, int32_t slot, const Smem<HB>& sm,
                                                 int tid, RowChunks& rc) {
  const DeviceCache& cache = tile_cache(p, w, i);
  const int r = tid % kThreadsPerKey;
  const cuda::RowOffsets off = cuda::row_offsets32(cache, slot);
  const bool valid = off.data >= 0;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < 5; ++j) rc.c[j] = zero;
  rc.scale = make_uint2(0, 0);
  if (valid && cache.aligned16) {
    const uint4* row = reinterpret_cast<const uint4*>(cache.base + off.data);
#pragma unroll
    for (int j = 0; j < 4; ++j) rc.c[j] = __ldg(row + r + 8 * j);
    if (r < 4) rc.c[4] = __ldg(row + r + 32);
    rc.scale = __ldg(reinterpret_cast<const uint2*>(cache.base + off.scale));
  } else if (valid) {  // caches not 16-byte aligned: byte loads (CONTRACT 2.1)
#pragma unroll
    for (int j = 0; j < 4; ++j) rc.c[j] = cuda::load_chunk16(cache, off.data + 16 * (r + 8 * j));
    if (r < 4) rc.c[4] = cuda::load_chunk16(cache, off.data + 16 * (r + 32));
    rc.scale = cuda::load_scale8(cache, off.scale);
  }
  if (r == 0) sm.flags[(i & 1) * kKeyTile + tid / kThreadsPerKey] = valid ? 1 : 0;
}

// 0, read from shared memory: a load ptxas cannot move above the barrier before it. Whatever
// depends on it (the fast-path test of the next tile's rows) stays after that barrier too.
__device__ __forceinline__ uint32_t late_zero(const uint32_t* zero) {
  return *reinterpret_cast<const volatile uint32_t*>(zero);
}

// True when this thread's chunks take the fast conversion: every scale code <= kFastMaxCode, no
// NaN byte in its NoPE chunks and no NaN in its RoPE chunk(s) (so no scrub is needed either).
// z is 0 (late_zero): XOR-ed into the words' first operation (one LOP3 either way), it keeps
// ptxas from scheduling the test, which waits for the rows' loads, before z's load. The pad byte
// is masked after the XOR (scale_codes_fast), so the XOR stays the words' first operation. The
// code test joins with `&`, not `&&`: short-circuited behind the NaN tests, the masked test became
// a branch (BSSY / BRA / BSYNC) in the tile loop; unconditional, the kernel is 6 instructions
// shorter than with the unmasked `&&` test (SASS, sm_80 and sm_90a).
__device__ __forceinline__ bool rows_fast(const RowChunks& rc, int r, uint32_t z) {
  uint32_t nan8 = 0, nan16 = 0;
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    nan8 |= cuda::nan_bytes_acc(rc.c[j].x ^ z) | cuda::nan_bytes_acc(rc.c[j].y ^ z) |
            cuda::nan_bytes_acc(rc.c[j].z ^ z) | cuda::nan_bytes_acc(rc.c[j].w ^ z);
  }
  const uint4 c3 = rc.c[3], c4 = rc.c[4];
  const uint32_t n3 = cuda::nan_bytes_acc(c3.x ^ z) | cuda::nan_bytes_acc(c3.y ^ z) |
                      cuda::nan_bytes_acc(c3.z ^ z) | cuda::nan_bytes_acc(c3.w ^ z);
  const uint32_t b3 = cuda::nan_bf16_acc(c3.x ^ z) | cuda::nan_bf16_acc(c3.y ^ z) |
                      cuda::nan_bf16_acc(c3.z ^ z) | cuda::nan_bf16_acc(c3.w ^ z);
  nan8 |= r < 4 ? n3 : 0u;
  nan16 |= (r < 4 ? 0u : b3) | cuda::nan_bf16_acc(c4.x ^ z) | cuda::nan_bf16_acc(c4.y ^ z) |
           cuda::nan_bf16_acc(c4.z ^ z) | cuda::nan_bf16_acc(c4.w ^ z);
  return ((nan8 & cuda::kNanBytesMask) == 0 && (nan16 & cuda::kNanBf16Mask) == 0) &
         cuda::scale_codes_fast(make_uint2(rc.scale.x ^ z, rc.scale.y ^ z));
}

// NoPE chunk c (16 e4m3 bytes, one scale tile) -> 16 bf16 at dims 16c..16c+15 of the key row.
// Threads r and r+4 of a key store their halves in opposite orders: 8 distinct 16-byte bank
// groups per quarter warp.
__device__ __forceinline__ void store_nope_halves(__nv_bfloat16* krow, int c, uint4 lo, uint4 hi,
                                                  bool swap) {
  uint4* dst = reinterpret_cast<uint4*>(krow + 16 * c);
  dst[swap ? 1 : 0] = swap ? hi : lo;
  dst[swap ? 0 : 1] = swap ? lo : hi;
}
__device__ __forceinline__ uint4* rope_dst(__nv_bfloat16* krow, int c) {
  return reinterpret_cast<uint4*>(krow + Fp8DsMla::kNopeDims + 8 * (c - 28));
}

// Fast conversion (rows_fast held for every lane of the warp): straight-line code, no branch, so
// that it interleaves with the P.V matrix products it is placed beside.
__device__ __forceinline__ void dequant_tile_fast(const RowChunks& rc, int tid,
                                                  __nv_bfloat16* kbuf) {
  const int key = tid / kThreadsPerKey, r = tid % kThreadsPerKey;
  __nv_bfloat16* krow = kbuf + key * kRowPitch;
  const bool swap = (r & 4) != 0, low = r < 4;
  uint4 lo, hi;
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    cuda::dequant_nope16_fast(rc.c[j], cuda::scale_code(rc.scale, (r + 8 * j) / 4), &lo, &hi);
    store_nope_halves(krow, r + 8 * j, lo, hi, swap);
  }
  // c[3]: NoPE chunk 24+r (r < 4; scale tile 6) or RoPE chunk r-4 (r >= 4, stored as is).
  cuda::dequant_nope16_fast(rc.c[3], cuda::scale_code(rc.scale, 6), &lo, &hi);
  uint4* first = low ? reinterpret_cast<uint4*>(krow + 16 * (r + 24)) : rope_dst(krow, r + 24);
  *first = low ? lo : rc.c[3];
  if (low) {
    reinterpret_cast<uint4*>(krow + 16 * (r + 24))[1] = hi;
    *rope_dst(krow, r + 32) = rc.c[4];
  }
}

// Any rows (NaN bytes, codes above kFastMaxCode, NaN RoPE): the exact fp32 path where needed, the
// scrub where required. Rare; per-thread branches.
__device__ __forceinline__ void dequant_tile_any(const RowChunks& rc, bool scrub, int tid,
                                                 __nv_bfloat16* kbuf) {
  const int key = tid / kThreadsPerKey, r = tid % kThreadsPerKey;
  __nv_bfloat16* krow = kbuf + key * kRowPitch;
  const bool swap = (r & 4) != 0;
  uint4 lo, hi;
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const int c = r + 8 * j;
    cuda::dequant_nope16_any(rc.c[j], cuda::scale_code(rc.scale, c / 4), scrub, &lo, &hi);
    store_nope_halves(krow, c, lo, hi, swap);
  }
  if (r < 4) {
    cuda::dequant_nope16_any(rc.c[3], cuda::scale_code(rc.scale, 6), scrub, &lo, &hi);
    store_nope_halves(krow, r + 24, lo, hi, false);
    *rope_dst(krow, r + 32) = cuda::rope_chunk16(rc.c[4], scrub);
  } else {
    *rope_dst(krow, r + 24) = cuda::rope_chunk16(rc.c[3], scrub);
  }
}

// Q rows (heads h0..h0+heads-1 of row t) into sm.q; rows >= heads are zero (never written out).
template <int HB>
__device__ __forceinline__ void load_q_tile(const PartialParams& p, int64_t t, int32_t h0,
                                            int32_t heads, const Smem<HB>& sm, int tid) {
  constexpr int kChunks = kDim / 8;  // 16-byte chunks per head
#pragma unroll 4
  for (int j = 0; j < Cfg<HB>::kHeads * kChunks / kThreads; ++j) {
    const int job = tid + j * kThreads, r = job / kChunks, c = job % kChunks;
    cuda::load_q_chunk(p, t, h0 + r, c, r < heads, sm.q + r * kRowPitch + 8 * c);
  }
}

// ---- Q.K ----------------------------------------------------------------------------------------
// One warp's Q.K block: kMT 16-head tiles from row0 x 16 * kKH keys from key0, over the 128 dims
// [d0, d0 + 128), into the partial score set dst ([rows][32], score_index). Each score is one mma
// accumulation chain over its 128 dims in the same order for every block shape, so a score's bits
// do not depend on the shape.
template <int kMT, int kKH>
__device__ __forceinline__ void qk_block(const __nv_bfloat16* q, const __nv_bfloat16* kbuf,
                                         float* dst, int row0, int key0, int d0, int lane) {
  constexpr int kQkDims = 128;
  float acc[kMT][2 * kKH][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 2 * kKH; ++nt) {
      acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
    }
  }
  const __nv_bfloat16* a_base = q + (row0 + lane % 16) * kRowPitch + d0 + (lane / 16) * 8;
  const __nv_bfloat16* b_base =
      kbuf + (key0 + lane % 8 + (lane / 16) * 8) * kRowPitch + d0 + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < kQkDims / 16; ++kk) {
    uint32_t a[kMT][4], b[kKH][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      ldmatrix_x4(a[mt], a_base + mt * kHeadTile * kRowPitch + 16 * kk);
    }
#pragma unroll
    for (int kh = 0; kh < kKH; ++kh) ldmatrix_x4(b[kh], b_base + kh * 16 * kRowPitch + 16 * kk);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int kh = 0; kh < kKH; ++kh) {
        mma_bf16(acc[mt][2 * kh], a[mt], b[kh][0], b[kh][1]);
        mma_bf16(acc[mt][2 * kh + 1], a[mt], b[kh][2], b[kh][3]);
      }
    }
  }
  const int g = lane / 4, q2 = 2 * (lane % 4);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 2 * kKH; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + mt * kHeadTile + g + 8 * half;
        *reinterpret_cast<float2*>(dst + score_index(row, key0 + 8 * nt + q2)) =
            make_float2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
      }
    }
  }
}

// Warp w = 4 * group + ds: its head / key block (Cfg) over dims [128 ds, +128); the partial sums go
// to partial set ds.
template <int HB>
__device__ __forceinline__ void qk_tile(const Smem<HB>& sm, const __nv_bfloat16* kbuf,
                                        float* partial, int warp, int lane) {
  using C = Cfg<HB>;
  static_assert(C::kQkDims == 128);
  const int group = warp / C::kDimSplits, ds = warp % C::kDimSplits;
  const int row0 = HB == 1 ? 0 : group * C::kQkMTiles * kHeadTile;
  const int key0 = HB == 1 ? group * C::kQkKeys : 0;
  qk_block<C::kQkMTiles, C::kQkKeys / 16>(sm.q, kbuf, partial + ds * C::kHeads * kKeyTile, row0,
                                          key0, ds * C::kQkDims, lane);
}

// ---- softmax ------------------------------------------------------------------------------------
// The raw scores of keys [part*KPT, +KPT) of head h, summed over the partial sets.
template <int HB>
__device__ __forceinline__ void gather_scores(const float* partial, int h, int part,
                                              float (&z)[Cfg<HB>::kKeysPerThread]) {
  using C = Cfg<HB>;
  constexpr int kSet = C::kHeads * kKeyTile;
  if constexpr (C::kKeysPerThread == 8) {
    // Two chunks; odd heads read them in the other order (distinct banks per quarter warp).
    const int odd = h & 1;
    float4 s[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
#pragma unroll
    for (int ds = 0; ds < C::kDimSplits; ++ds) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = 4 * (2 * part + (j ^ odd));
        const float4 v =
            *reinterpret_cast<const float4*>(partial + ds * kSet + score_index(h, key));
        s[j].x += v.x;
        s[j].y += v.y;
        s[j].z += v.z;
        s[j].w += v.w;
      }
    }
    const float4 lo = odd ? s[1] : s[0], hi = odd ? s[0] : s[1];
    z[0] = lo.x, z[1] = lo.y, z[2] = lo.z, z[3] = lo.w;
    z[4] = hi.x, z[5] = hi.y, z[6] = hi.z, z[7] = hi.w;
  } else if constexpr (C::kKeysPerThread == 4) {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int ds = 0; ds < C::kDimSplits; ++ds) {
      const float4 v =
          *reinterpret_cast<const float4*>(partial + ds * kSet + score_index(h, 4 * part));
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    z[0] = s.x, z[1] = s.y, z[2] = s.z, z[3] = s.w;
  } else {
    float2 s = make_float2(0.f, 0.f);
#pragma unroll
    for (int ds = 0; ds < C::kDimSplits; ++ds) {
      const float2 v =
          *reinterpret_cast<const float2*>(partial + ds * kSet + score_index(h, 2 * part));
      s.x += v.x;
      s.y += v.y;
    }
    z[0] = s.x, z[1] = s.y;
  }
}

// One softmax thread's inputs of a tile: the raw scores of its KPT keys (summed over the partial
// sets) and their valid bytes, in registers (so their buffers can be reused before the math runs).
template <int HB>
struct TileScores {
  float z[Cfg<HB>::kKeysPerThread];
  uint32_t fl[2];
};

template <int HB>
__device__ __forceinline__ TileScores<HB> read_tile_scores(const float* partial,
                                                           const uint8_t* flags, int tid) {
  using C = Cfg<HB>;
  constexpr int kTph = C::kThreadsPerHead, kKpt = C::kKeysPerThread;
  const int h = tid / kTph, part = tid % kTph;
  TileScores<HB> ts;
  gather_scores<HB>(partial, h, part, ts.z);
  // The KPT valid bytes of the thread's keys in one load.
  if constexpr (kKpt == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(flags + part * kKpt);
    ts.fl[0] = v.x, ts.fl[1] = v.y;
  } else if constexpr (kKpt == 4) {
    ts.fl[0] = *reinterpret_cast<const uint32_t*>(flags + part * kKpt), ts.fl[1] = 0;
  } else {
    ts.fl[0] = *reinterpret_cast<const uint16_t*>(flags + part * kKpt), ts.fl[1] = 0;
  }
  return ts;
}

// Online softmax of one tile for head h = tid / TPH (TPH threads per head, KPT keys each): updates
// the head's running (m, l) (identical in its TPH threads), writes bf16 probabilities and alpha.
// Returns whether the head's m moved (alpha < 1 then, 0 on the first valid tile). lag: nats m may
// lag the tile max before it moves (DecodeKernelParams::rescale_lag; 0 = eager).
template <int HB>
__device__ __forceinline__ bool softmax_tile(const Smem<HB>& sm, TileScores<HB> ts, float scale,
                                             float lag, int tid, float& m_run, float& l_run) {
  using C = Cfg<HB>;
  constexpr int kTph = C::kThreadsPerHead, kKpt = C::kKeysPerThread;
  const int h = tid / kTph, part = tid % kTph;
  float* z = ts.z;
  const uint32_t* fl = ts.fl;
  bool valid[kKpt];
  float tmax = kNoScore;
#pragma unroll
  for (int i = 0; i < kKpt; ++i) {
    valid[i] = ((fl[i / 4] >> (8 * (i % 4))) & 0xFFu) != 0;
    z[i] = valid[i] ? z[i] * scale : kNoScore;
    tmax = fmaxf(tmax, z[i]);
  }
#pragma unroll
  for (int o = 1; o < kTph; o *= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xFFFFFFFFu, tmax, o));
  // m moves when the tile beats it by > lag (first valid tile: m_run is -FLT_MAX, and
  // -FLT_MAX + lag == -FLT_MAX, so any valid score moves it; alpha = 0 then).
  const bool move = tmax > m_run + lag;
  const float m_use = move ? tmax : m_run;
  const float alpha = move ? exp2_ftz((m_run - tmax) * kLog2e) : 1.0f;
  // p = 2^((z - m) log2 e): exactly 1 for the key that set m (one-key rows output K exactly).
  // Results below 2^-126 flush to 0 (below 1e-38 of the tile's largest p >= e^-lag).
  float prob[kKpt];
#pragma unroll
  for (int i = 0; i < kKpt; ++i) prob[i] = valid[i] ? exp2_ftz((z[i] - m_use) * kLog2e) : 0.0f;
  // l: one balanced pairwise tree over the 32 keys in order (in-thread pairs, then the xor
  // shuffles), the same for every KPT, so l does not depend on HB.
  float pair[kKpt];
#pragma unroll
  for (int i = 0; i < kKpt; ++i) pair[i] = prob[i];
#pragma unroll
  for (int n = kKpt / 2; n >= 1; n /= 2) {
#pragma unroll
    for (int i = 0; i < n; ++i) pair[i] = pair[2 * i] + pair[2 * i + 1];
  }
  float psum = pair[0];
#pragma unroll
  for (int o = 1; o < kTph; o *= 2) psum += __shfl_xor_sync(0xFFFFFFFFu, psum, o);
  l_run = l_run * alpha + psum;
  m_run = m_use;
  uint32_t packed[kKpt / 2];
#pragma unroll
  for (int i = 0; i < kKpt / 2; ++i) packed[i] = cuda::bf16x2_bits(prob[2 * i], prob[2 * i + 1]);
  __nv_bfloat16* dst = sm.p + h * kPPitch + part * kKpt;
  if constexpr (kKpt == 8) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  } else if constexpr (kKpt == 4) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = packed[0];
  }
  if (part == 0) sm.alpha[h] = alpha;
  return move;
}

// ---- P.V ----------------------------------------------------------------------------------------
template <int HB>
__device__ __forceinline__ void clear_acc(float (&acc)[HB][kNTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < HB; ++mt) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
      acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  }
}

// acc *= alpha per head row; called only when some head of the CTA moved its m this tile (after
// the first tiles rare: the running max of random scores grows slowly), the others' alpha being
// exactly 1.
template <int HB>
__device__ __forceinline__ void rescale_acc(const Smem<HB>& sm, int lane,
                                            float (&acc)[HB][kNTiles][4]) {
  const int g = lane / 4;
#pragma unroll
  for (int mt = 0; mt < HB; ++mt) {
    const float alo = sm.alpha[mt * kHeadTile + g], ahi = sm.alpha[mt * kHeadTile + g + 8];
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      acc[mt][j][0] *= alo;
      acc[mt][j][1] *= alo;
      acc[mt][j][2] *= ahi;
      acc[mt][j][3] *= ahi;
    }
  }
}

// Warp w: acc (all heads x columns [64w, +64)) += P (heads x 32) . V (32 x 64).
template <int HB>
__device__ __forceinline__ void pv_tile(const Smem<HB>& sm, const __nv_bfloat16* kbuf, int warp,
                                        int lane, float (&acc)[HB][kNTiles][4]) {
  const int key_in = lane % 8 + ((lane / 8) % 2) * 8, col_in = (lane / 16) * 8;
  const __nv_bfloat16* v_base = kbuf + key_in * kRowPitch + kColsPerWarp * warp + col_in;
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    uint32_t a[HB][4];
#pragma unroll
    for (int mt = 0; mt < HB; ++mt) {
      ldmatrix_x4(a[mt], sm.p + (mt * kHeadTile + lane % 16) * kPPitch + 16 * ks + (lane / 16) * 8);
    }
#pragma unroll
    for (int cg = 0; cg < kNTiles / 2; ++cg) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_base + 16 * ks * kRowPitch + 16 * cg);
#pragma unroll
      for (int mt = 0; mt < HB; ++mt) {
        mma_bf16(acc[mt][2 * cg], a[mt], b[0], b[1]);
        mma_bf16(acc[mt][2 * cg + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// ---- epilogues ----------------------------------------------------------------------------------
// S > 1: partial m, l (threads tid < heads) and acc (rows with l != 0) into the workspace.
template <int HB>
__device__ __forceinline__ void write_partials(const PartialParams& p, const Smem<HB>& sm,
                                               int64_t t, int32_t s, int32_t h0, int32_t heads,
                                               int tid, const float (&acc)[HB][kNTiles][4]) {
  const int64_t row0 = (t * p.num_splits + s) * p.num_heads + h0;
  if (tid < heads) {
    const float l = sm.row_l[tid];
    p.ws_m[row0 + tid] = cuda::reported_m(sm.row_m[tid], l);
    p.ws_l[row0 + tid] = cuda::reported_l(l);
  }
  const int warp = tid / 32, lane = tid % 32, g = lane / 4;
#pragma unroll
  for (int mt = 0; mt < HB; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = mt * kHeadTile + g + 8 * half;
      if (row >= heads || !cuda::split_has_acc(sm.row_l[row])) continue;
      float* dst = p.ws_acc + (row0 + row) * kDim + kColsPerWarp * warp + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(acc[mt][j][2 * half], acc[mt][j][2 * half + 1]);
      }
    }
  }
}

// The finished rows of this thread's accumulators as bf16 pairs into the staging rows (the Q
// buffer). A store's 8 rows (g = lane / 4) are 1040 bytes (4 banks) apart: its 32 lanes hit
// distinct banks.
template <int HB, bool kRope>
__device__ __forceinline__ void stage_rows(const Smem<HB>& sm, int32_t heads, int g, int col0,
                                           const float2 (&cs)[kNTiles],
                                           const float (&acc)[HB][kNTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < HB; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = mt * kHeadTile + g + 8 * half;
      if (row >= heads) continue;
      const float coef = sm.row_coef[row];
      uint32_t* staged = reinterpret_cast<uint32_t*>(sm.q + row * kRowPitch + col0);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        float a = coef == 0.0f ? 0.0f : acc[mt][j][2 * half] * coef;
        float b = coef == 0.0f ? 0.0f : acc[mt][j][2 * half + 1] * coef;
        if constexpr (kRope) cuda::inverse_rope(a, b, cs[j]);
        staged[4 * j] = cuda::bf16x2_bits(a, b);
      }
    }
  }
}

// S == 1: the combine of one split, done in place (sink, normalisation, inverse RoPE, lse, store).
// The finished rows are staged as bf16 in the Q buffer (free after the last Q.K), then leave in
// 16-byte chunks with consecutive threads along a row. The RoPE cos/sin of a thread's column pairs
// are loaded once (a warp's columns are all NoPE or all RoPE: 448 = 7 x 64). ncu, C4-Flash
// B = 128: with one 4-byte store per column pair and per-store address math, position loads and
// branches, this epilogue was ~20% of the stall samples (instruction fetch, store queue).
// `sync` is the barrier of the kThreads threads that hold the accumulators.
template <int HB, class Sync>
__device__ __forceinline__ void finish_rows(const PartialParams& p, const Smem<HB>& sm, int64_t t,
                                            int32_t h0, int32_t heads, int tid,
                                            const float (&acc)[HB][kNTiles][4], Sync sync,
                                            const float* rope_smem = nullptr) {
  static_assert(Fp8DsMla::kNopeDims % kColsPerWarp == 0);
  constexpr int kChunksPerRow = kDim / 8;
  const FinishParams& f = p.finish;
  if (tid < heads) {
    const float l_raw = sm.row_l[tid];
    const float m = cuda::reported_m(sm.row_m[tid], l_raw), l = cuda::reported_l(l_raw);
    sm.row_coef[tid] = cuda::one_split_coef(m, l, cuda::sink_value(f.sink, h0 + tid));
    cuda::store_lse(f, t, h0 + tid, cuda::finish_lse(m, l));
  }
  sync();
  const int warp = tid / 32, lane = tid % 32, g = lane / 4;
  const int col0 = kColsPerWarp * warp + 2 * (lane % 4);  // column of pair j: col0 + 8 j
  const bool rope = f.positions != nullptr && kColsPerWarp * warp >= Fp8DsMla::kNopeDims;
  float2 cs[kNTiles] = {};
  if (rope) {
    const float* rope_row = rope_smem != nullptr ? rope_smem : cuda::rope_row(f, t);
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      const int k = (col0 + 8 * j - Fp8DsMla::kNopeDims) / 2;
      cs[j] = rope_smem != nullptr ? make_float2(rope_row[k], rope_row[32 + k])
                                   : make_float2(__ldg(rope_row + k), __ldg(rope_row + 32 + k));
    }
  }
  // RoPE is warp-uniform (one warp of eight): a branch, so the NoPE warps skip its 6 flops per
  // pair (branch-free code computed and discarded them: 106 SASS instructions per staged row
  // pair instead of 50).
  if (rope) {
    stage_rows<HB, true>(sm, heads, g, col0, cs, acc);
  } else {
    stage_rows<HB, false>(sm, heads, g, col0, cs, acc);
  }
  sync();
#pragma unroll 4
  for (int n = 0; n < Cfg<HB>::kHeads * kChunksPerRow / kThreads; ++n) {
    const int j = tid + kThreads * n, row = j / kChunksPerRow, ch = j % kChunksPerRow;
    if (row >= heads) break;  // rows grow with n
    cuda::store_out_chunk(f, t, h0 + row, ch,
                          *reinterpret_cast<const uint4*>(sm.q + row * kRowPitch + 8 * ch));
  }
}

// ---- the kernel body ----------------------------------------------------------------------------
template <int HB>
__device__ __forceinline__ void partial_body(const PartialParams& p, unsigned char* smem_raw) {
  using C = Cfg<HB>;
  const Smem<HB> sm = carve_smem<HB>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t t = blockIdx.x;
  const int32_t s = blockIdx.y, h0 = blockIdx.z * C::kHeads;
  const int32_t heads = min(C::kHeads, p.num_heads - h0);
  allow_dependent_launch();

  int32_t work;
  const SplitWork w = split_work(p, t, s, &work);
  if (s >= work) {  // inactive under CONTRACT 4.5
    cuda::mark_split_inactive(p, t, s, h0, heads, tid);
    return;
  }

  float acc[HB][kNTiles][4];
  clear_acc<HB>(acc);
  float m_run = kNoScore, l_run = 0.0f;  // softmax threads: identical in the TPH threads of a head

  if (w.tiles > 0) {
    const int key = tid / kThreadsPerKey, r = tid % kThreadsPerKey;
    // Dependent global round trips before the first MMA: indptr (above), the slot ids of tiles
    // 0..2 (together), the rows of tiles 0 and 1 (together); Q travels meanwhile (cp.async).
    const int32_t slot0 = tile_slot(p, w, 0, key);
    const int32_t slot1 = w.tiles > 1 ? tile_slot(p, w, 1, key) : -1;
    int32_t slot_next = w.tiles > 2 ? tile_slot(p, w, 2, key) : -1;
    load_q_tile<HB>(p, t, h0, heads, sm, tid);
    RowChunks rc{}, rc0;  // rc: the rows of the next tile (zero until one is loaded)
    issue_tile_loads<HB>(p, w, 0, slot0, sm, tid, rc0);
    if (w.tiles > 1) issue_tile_loads<HB>(p, w, 1, slot1, sm, tid, rc);
    if (__all_sync(0xFFFFFFFFu, rows_fast(rc0, r, 0u))) {
      dequant_tile_fast(rc0, tid, sm.k_buf(0));
    } else {
      dequant_tile_any(rc0, tile_scrub(p, w, 0), tid, sm.k_buf(0));
    }
    if (tid < 4) sm.zero[tid] = 0;
    cp_async_wait_all();
    __syncthreads();  // Q, K(0), valid bits of tiles 0 and 1, zero
    for (int32_t i = 0; i < w.tiles; ++i) {
      qk_tile<HB>(sm, sm.k_buf(i), sm.partials(i), warp, lane);
      __syncthreads();
      const bool moved = softmax_tile<HB>(
          sm, read_tile_scores<HB>(sm.partials(i), sm.flags + (i & 1) * kKeyTile, tid), p.scale,
          p.rescale_lag, tid, m_run, l_run);
      // The barrier also tells every warp whether any head moved its m (no alpha loads when none).
      if (__syncthreads_or(moved)) rescale_acc<HB>(sm, lane, acc);
      // Tile i+1's rows were loaded after P.V of tile i-1. Tested only now (late_zero), so their
      // latency hides behind Q.K and the softmax; ptxas placed the plain test before the Q.K
      // barrier, where it waited on them in 5.5% of the stall samples (ncu;
      // docs/lab/generic-path.md, "2026-11-30: the fast-path test after the softmax barrier").
      const bool fast_next = __all_sync(0xFFFFFFFFu, rows_fast(rc, r, late_zero(sm.zero)));
      if (i + 1 < w.tiles) {
        // P.V of tile i beside the dequantisation of tile i+1 (tensor and ALU work interleave),
        // then the loads of tile i+2 (registers) and the slot ids of tile i+3.
        if (fast_next) {
          pv_tile<HB>(sm, sm.k_buf(i), warp, lane, acc);
          dequant_tile_fast(rc, tid, sm.k_buf(i + 1));
        } else {
          pv_tile<HB>(sm, sm.k_buf(i), warp, lane, acc);
          dequant_tile_any(rc, tile_scrub(p, w, i + 1), tid, sm.k_buf(i + 1));
        }
        if (i + 2 < w.tiles) {
          issue_tile_loads<HB>(p, w, i + 2, slot_next, sm, tid, rc);
          slot_next = i + 3 < w.tiles ? tile_slot(p, w, i + 3, key) : -1;
        }
      } else {
        pv_tile<HB>(sm, sm.k_buf(i), warp, lane, acc);
      }
      __syncthreads();  // K(i+1) and its valid bits ready; K(i), P, alpha free
    }
  }
  if (tid % C::kThreadsPerHead == 0) {
    const int h = tid / C::kThreadsPerHead;
    sm.row_m[h] = m_run;
    sm.row_l[h] = l_run;
  }
  __syncthreads();
  if (p.num_splits > 1) {
    write_partials<HB>(p, sm, t, s, h0, heads, tid, acc);
  } else {
    finish_rows<HB>(p, sm, t, h0, heads, tid, acc, [] { __syncthreads(); });
  }
}

}  // namespace sparsemla::cuda_generic::partial
