// src/cuda/sm90/decode_partial_ws.cuh: the split-K partial kernel of the portable CUDA decode
// for 64-head CTAs on devices with >= 206 KiB of shared memory per block (H100 / H200 / B200),
// warp-specialised; included by decode_ws.cu only. Same math, same per-score summation order
// and the same outputs (bit for bit) as decode_partial.cuh at HB = 4.
//
// One CTA (384 threads, 12 warps) owns one query row t, one split s and 64 heads:
//   8 "PV" warps (threads 0..255): the softmax of tile i (256 threads, 4 per head, as HB = 4) and
//     the P.V of tile i (warp w: columns [64w, +64) of all 64 heads, 128 fp32 accumulators);
//   4 "QK" warps (threads 256..383): the Q.K of tile i+1 (warp ds: all 64 heads x 32 keys over
//     dims [128 ds, +128), the partial set ds), the dequantisation of tile i+2 (4 threads per key,
//     9 of its 36 16-byte chunks each, loaded into registers one tile ahead) and the loads of
//     tile i+3.
// The two groups meet only at named barriers (arrive / sync, no full-CTA barrier in the loop):
//   kBarScores    QK -> PV: the partial scores of tile i are written (and K(i), which they read)
//   kBarPartFree  PV -> QK: the partial scores of tile i are read (the QK warps may overwrite them)
//   kBarKFree0/1  PV -> QK: the P.V of tile k is done, so K buffer k % 3 may take tile k + 3
//                 (two ids by parity of k: the PV warps may arrive for k+1 before the QK warps
//                 wait for k)
// Which tiles take part in which barrier: ws_schedule.h (host-tested for every tile count).
//   kBarPv        PV only: P and alpha of tile i written (bar.red.or: did any head move its m?)
// Three K buffers (K(i) read by P.V, K(i+1) by Q.K, K(i+2) written), two P / alpha buffers, four
// valid-byte slots, the RoPE cos / sin of the row. 211,072 bytes of shared memory.
// Why: the 256-thread kernel runs every phase on all 8 warps between full-CTA barriers, at 2 warps
// per scheduler, so the tensor work of one phase and the ALU work of another never overlap (ncu:
// IPC 1.2, tensor pipe ~25% busy at C4-Flash B = 128); here a scheduler holds 2 PV warps and 1 QK
// warp in different phases, and no warp waits for a barrier it does not need.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/timeline.cuh"
#include "cuda/generic/decode_partial.cuh"
#include "cuda/sm90/ws_schedule.h"

namespace sparsemla::cuda_generic::partial_ws {

#ifdef SPARSEMLA_TIMELINE
// Debug builds only (cuda/common/timeline.cuh): this header has one includer, decode_generic.cu.
__device__ unsigned long long g_timeline[cuda::kTimelineWords];
#endif

using partial::Cfg;
using partial::kKeyTile;
using partial::kNTiles;
using partial::kRowPitch;
using partial::PartialParams;

using C4 = Cfg<4>;
inline constexpr int kPvThreads = 256;  // = partial::kThreads: the HB = 4 softmax and P.V layout
inline constexpr int kQkThreads = 128;
inline constexpr int kThreads = kPvThreads + kQkThreads;
inline constexpr int kThreadsPerKey = kQkThreads / kKeyTile;  // 4 gather threads per key
inline constexpr int kChunksPerThread = 9;                    // of a key's 36 16-byte chunks
static_assert(kPvThreads == partial::kThreads && kThreadsPerKey * kChunksPerThread == 36);

// Named barrier ids (0 is __syncthreads).
inline constexpr int kBarScores = 1;
inline constexpr int kBarPartFree = 2;
inline constexpr int kBarKFree0 = 3;  // and 4
inline constexpr int kBarPv = 5;
inline constexpr int kBarPvEpilogue = 6;

__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// bar.red.or among `count` threads: true when pred holds in any of them.
__device__ __forceinline__ bool bar_red_or(int id, int count, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(count)
      : "memory");
  return r != 0;
}

// ---- shared memory ------------------------------------------------------------------------------
struct WsSmem {
  static constexpr int kKBufs = 3, kPBufs = 2, kFlagSlots = 4;
  static constexpr int kQBytes = C4::kQBytes;              // 66,560
  static constexpr int kKBytes = C4::kKBytes;              // 33,280 each
  static constexpr int kPartialBytes = C4::kPartialBytes;  // 32,768
  static constexpr int kPBytes = C4::kPBytes;              // 5,120 each
  static constexpr int kFlagBytes = kFlagSlots * kKeyTile;
  static constexpr int kAlphaBytes = C4::kHeads * 4;
  static constexpr int kRowBytes = 3 * C4::kHeads * 4;  // m, l, coefficient per head
  static constexpr int kRopeBytes = 2 * 32 * 4;         // cos, sin of the row's 32 RoPE pairs
  static constexpr int kBytes = kQBytes + kKBufs * kKBytes + kPartialBytes + kPBufs * kPBytes +
                                kFlagBytes + kPBufs * kAlphaBytes + kRowBytes + kRopeBytes;

  unsigned char* raw;

  __device__ __forceinline__ __nv_bfloat16* q() const {
    return reinterpret_cast<__nv_bfloat16*>(raw);
  }
  __device__ __forceinline__ __nv_bfloat16* k_buf(int32_t i) const {
    return reinterpret_cast<__nv_bfloat16*>(raw + kQBytes + (i % kKBufs) * kKBytes);
  }
  __device__ __forceinline__ float* partials() const {
    return reinterpret_cast<float*>(raw + kQBytes + kKBufs * kKBytes);
  }
  __device__ __forceinline__ unsigned char* after_partials() const {
    return raw + kQBytes + kKBufs * kKBytes + kPartialBytes;
  }
  __device__ __forceinline__ uint8_t* tile_flags(int32_t i) const {
    return after_partials() + kPBufs * kPBytes + (i % kFlagSlots) * kKeyTile;
  }
  // The HB = 4 kernel's view for tile i: P and alpha of buffer i % 2, Q (staging after the loop),
  // the per-head rows. Its flags / kv / part / zero fields are unused here.
  __device__ __forceinline__ partial::Smem<4> view(int32_t i) const {
    partial::Smem<4> s{};
    unsigned char* p_base = after_partials();
    unsigned char* a_base = p_base + kPBufs * kPBytes + kFlagBytes;
    s.q = q();
    s.p = reinterpret_cast<__nv_bfloat16*>(p_base + (i & 1) * kPBytes);
    s.alpha = reinterpret_cast<float*>(a_base + (i & 1) * kAlphaBytes);
    s.row_m = reinterpret_cast<float*>(a_base + kPBufs * kAlphaBytes);
    s.row_l = s.row_m + C4::kHeads;
    s.row_coef = s.row_l + C4::kHeads;
    return s;
  }
  // The query row's RoPE cos / sin (S = 1 epilogue), fetched in the prologue.
  __device__ __forceinline__ float* rope() const {
    return reinterpret_cast<float*>(raw + kBytes - kRopeBytes);
  }
};
static_assert(WsSmem::kBytes == 211072 && WsSmem::kBytes % 16 == 0);

// ---- the QK warps: gather and dequantisation ---------------------------------------------------
// QK thread c (key c / 4, r = c % 4) owns chunks r + 4j, j = 0..8, of its key's 36: j = 0..6 are
// NoPE chunks of scale tile j, j = 7, 8 the RoPE chunks 28 + r and 32 + r.
struct Rows9 {
  uint4 c[kChunksPerThread];
  uint2 scale;  // 7 UE8M0 codes + pad; zero for an invalid key
};

__device__ __forceinline__ void issue_rows9(const PartialParams& p, const cuda::SplitWork& w,
                                            int32_t i, int32_t slot, const WsSmem& sm, int c,
                                            Rows9& rc) {
  const cuda::DeviceCache& cache = cuda::tile_cache(p, w, i);
  const int r = c % kThreadsPerKey;
  const cuda::RowOffsets off = cuda::row_offsets32(cache, slot);
  const bool valid = off.data >= 0;
#pragma unroll
  for (int j = 0; j < kChunksPerThread; ++j) rc.c[j] = make_uint4(0, 0, 0, 0);
  rc.scale = make_uint2(0, 0);
  if (valid && cache.aligned16) {
    const uint4* row = reinterpret_cast<const uint4*>(cache.base + off.data);
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) rc.c[j] = __ldg(row + r + 4 * j);
    rc.scale = __ldg(reinterpret_cast<const uint2*>(cache.base + off.scale));
  } else if (valid) {  // caches not 16-byte aligned: byte loads (CONTRACT 2.1)
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) {
      rc.c[j] = cuda::load_chunk16(cache, off.data + 16 * (r + 4 * j));
    }
    rc.scale = cuda::load_scale8(cache, off.scale);
  }
  if (r == 0) sm.tile_flags(i)[c / kThreadsPerKey] = valid ? 1 : 0;
}

// True when every scale code <= kFastMaxCode, no NoPE byte is an e4m3 NaN and no RoPE bf16 a NaN.
__device__ __forceinline__ bool rows9_fast(const Rows9& rc) {
  uint32_t nan8 = 0, nan16 = 0;
#pragma unroll
  for (int j = 0; j < 7; ++j) {
    nan8 |= cuda::nan_bytes_acc(rc.c[j].x) | cuda::nan_bytes_acc(rc.c[j].y) |
            cuda::nan_bytes_acc(rc.c[j].z) | cuda::nan_bytes_acc(rc.c[j].w);
  }
#pragma unroll
  for (int j = 7; j < kChunksPerThread; ++j) {
    nan16 |= cuda::nan_bf16_acc(rc.c[j].x) | cuda::nan_bf16_acc(rc.c[j].y) |
             cuda::nan_bf16_acc(rc.c[j].z) | cuda::nan_bf16_acc(rc.c[j].w);
  }
  return (nan8 & cuda::kNanBytesMask) == 0 && (nan16 & cuda::kNanBf16Mask) == 0 &&
         cuda::scale_codes_fast(rc.scale);
}

// The key row's 16-byte pieces: NoPE chunk r + 4j at bf16 16 (r + 4j) (two pieces), RoPE chunk
// 28 + r (+ 4) at 448 + 8 r (+ 32). A quarter warp (2 keys, 1040 bytes apart) stores 8 distinct
// 16-byte bank groups per instruction.
__device__ __forceinline__ void store_rows9(__nv_bfloat16* krow, int r, const uint4 (&lo)[7],
                                            const uint4 (&hi)[7], uint4 rope0, uint4 rope1) {
  uint4* nope = reinterpret_cast<uint4*>(krow + 16 * r);
#pragma unroll
  for (int j = 0; j < 7; ++j) {
    nope[8 * j] = lo[j];
    nope[8 * j + 1] = hi[j];
  }
  uint4* rope = reinterpret_cast<uint4*>(krow + Fp8DsMla::kNopeDims + 8 * r);
  rope[0] = rope0;
  rope[4] = rope1;
}

__device__ __forceinline__ void dequant9(const Rows9& rc, bool fast, bool scrub, int c,
                                         __nv_bfloat16* kbuf) {
  const int r = c % kThreadsPerKey;
  __nv_bfloat16* krow = kbuf + (c / kThreadsPerKey) * kRowPitch;
  uint4 lo[7], hi[7];
  if (fast) {  // chunk by chunk: each converted chunk leaves the registers at once
    uint4* nope = reinterpret_cast<uint4*>(krow + 16 * r);
#pragma unroll
    for (int j = 0; j < 7; ++j) {
      cuda::dequant_nope16_fast(rc.c[j], cuda::scale_code(rc.scale, j), &lo[0], &hi[0]);
      nope[8 * j] = lo[0];
      nope[8 * j + 1] = hi[0];
    }
    uint4* rope = reinterpret_cast<uint4*>(krow + Fp8DsMla::kNopeDims + 8 * r);
    rope[0] = rc.c[7];
    rope[4] = rc.c[8];
  } else {
#pragma unroll
    for (int j = 0; j < 7; ++j) {
      cuda::dequant_nope16_any(rc.c[j], cuda::scale_code(rc.scale, j), scrub, &lo[j], &hi[j]);
    }
    store_rows9(krow, r, lo, hi, cuda::rope_chunk16(rc.c[7], scrub),
                cuda::rope_chunk16(rc.c[8], scrub));
  }
}

// Tile i's rows into its K buffer: the fast conversion when every lane of the warp may take it.
__device__ __forceinline__ void dequant_rows9(const PartialParams& p, const cuda::SplitWork& w,
                                              int32_t i, const Rows9& rc, int c, const WsSmem& sm) {
  const bool fast = __all_sync(0xFFFFFFFFu, rows9_fast(rc));
  dequant9(rc, fast, cuda::tile_scrub(p, w, i), c, sm.k_buf(i));
}

// ---- the two groups' loops ----------------------------------------------------------------------
// QK warps. Entry: K(0), K(1) converted, `rc` holds the rows of tile 2 (in flight), `slot_next`
// the slot id of tile 3, and the CTA barrier passed. The Q.K of tile i+1 and the conversion of
// tile i+2 share one basic block (tensor and ALU work of this one warp per scheduler interleave);
// the fast conversion runs unconditionally and rows that need the exact path are redone after it.
__device__ __forceinline__ void qk_loop(const PartialParams& p, const cuda::SplitWork& w,
                                        const WsSmem& sm, int c, Rows9& rc, int32_t slot_next) {
  const int ds = c / 32, lane = c % 32, key = c / kThreadsPerKey;
  float* dst = sm.partials() + ds * C4::kHeads * kKeyTile;
  const int32_t n = w.tiles;
  cuda::TlLaps laps;
  laps.start();
  partial::qk_block<4, 2>(sm.q(), sm.k_buf(0), dst, 0, 0, 128 * ds, lane);
  laps.lap(2);
  bar_arrive(kBarScores, kThreads);
  for (int32_t i = 0; i + 1 < n; ++i) {  // produces the scores of tile i+1
    // K buffer (i+2) % 3 held tile i-1: wait for its P.V; then for the softmax to have read tile
    // i's scores.
    if (ws_schedule::qk_waits_k_free(i, n)) {
      bar_sync(kBarKFree0 + ws_schedule::k_free_parity(i - 1), kThreads);
    }
    laps.lap(0);
    if (ws_schedule::qk_waits_part_free(i + 1)) bar_sync(kBarPartFree, kThreads);
    laps.lap(1);
    if (ws_schedule::qk_converts(i, n)) {
      // Two 32-head halves (32 accumulators each; the same score chains): register room for the
      // conversion beside them.
      partial::qk_block<2, 2>(sm.q(), sm.k_buf(i + 1), dst, 0, 0, 128 * ds, lane);
      partial::qk_block<2, 2>(sm.q(), sm.k_buf(i + 1), dst, 32, 0, 128 * ds, lane);
      dequant9(rc, true, false, c, sm.k_buf(i + 2));
      if (!__all_sync(0xFFFFFFFFu, rows9_fast(rc))) {
        dequant9(rc, false, cuda::tile_scrub(p, w, i + 2), c, sm.k_buf(i + 2));
      }
    } else {
      partial::qk_block<4, 2>(sm.q(), sm.k_buf(i + 1), dst, 0, 0, 128 * ds, lane);
    }
    laps.lap(2);
    bar_arrive(kBarScores, kThreads);
    if (i + 3 < n) {
      issue_rows9(p, w, i + 3, slot_next, sm, c, rc);
      slot_next = cuda::tile_slot(p, w, i + 4, key);
    }
    laps.lap(3);
  }
  SPARSEMLA_STAMP(c == 0, cuda::kGtQkLoopDone);
  SPARSEMLA_STAMP_SUMS(c == 0, cuda::kGtWaitKFree, laps, 4);  // kGtWaitKFree .. kGtIssue
}

// PV warps: the accumulators of all 64 heads, columns [64 warp, +64).
__device__ __forceinline__ void pv_loop(const PartialParams& p, const cuda::SplitWork& w,
                                        const WsSmem& sm, int tid, float& m_run, float& l_run,
                                        float (&acc)[4][kNTiles][4]) {
  const int warp = tid / 32, lane = tid % 32;
  const int32_t n = w.tiles;
  cuda::TlLaps laps;
  laps.start();
  for (int32_t i = 0; i < n; ++i) {
    bar_sync(kBarScores, kThreads);
    SPARSEMLA_STAMP(tid == 0 && i == 0, cuda::kGtFirstScores);
    laps.lap(0);
    const partial::TileScores<4> ts =
        partial::read_tile_scores<4>(sm.partials(), sm.tile_flags(i), tid);
    if (ws_schedule::pv_arrives_part_free(i, n)) bar_arrive(kBarPartFree, kThreads);
    const partial::Smem<4> v = sm.view(i);
    const bool moved = partial::softmax_tile<4>(v, ts, p.scale, p.rescale_lag, tid, m_run, l_run);
    laps.lap(1);
    // P and alpha of tile i complete; every PV warp is past the P.V of tile i-1, so the other
    // P / alpha buffer may be rewritten by the next softmax.
    if (bar_red_or(kBarPv, kPvThreads, moved)) partial::rescale_acc<4>(v, lane, acc);
    laps.lap(2);
    partial::pv_tile<4>(v, sm.k_buf(i), warp, lane, acc);
    if (ws_schedule::pv_arrives_k_free(i, n)) {
      bar_arrive(kBarKFree0 + ws_schedule::k_free_parity(i), kThreads);
    }
    laps.lap(3);
  }
  SPARSEMLA_STAMP(tid == 0, cuda::kGtPvLoopDone);
  SPARSEMLA_STAMP_SUMS(tid == 0, cuda::kGtWaitScores, laps, 4);  // kGtWaitScores .. kGtPv
}

// ---- the kernel body ----------------------------------------------------------------------------
__device__ __forceinline__ void partial_ws_body(const PartialParams& p, unsigned char* smem_raw) {
  const WsSmem sm{smem_raw};
  const int tid = threadIdx.x;
  const int64_t t = blockIdx.x;
  const int32_t s = blockIdx.y, h0 = blockIdx.z * C4::kHeads;
  const int32_t heads = min(C4::kHeads, p.num_heads - h0);
  partial::allow_dependent_launch();
  SPARSEMLA_STAMP(tid == 0, cuda::kGtEntry);

  int32_t work;
  const cuda::SplitWork w = cuda::split_work(p, t, s, &work);
  SPARSEMLA_STAMP(tid == 0, cuda::kGtSplitWork);
  if (s >= work) {  // inactive under CONTRACT 4.5
    cuda::mark_split_inactive(p, t, s, h0, heads, tid);
    return;
  }
  const bool pv = tid < kPvThreads;
  const int c = tid - kPvThreads;  // QK thread index (QK warps only)
  Rows9 rc{};
  int32_t slot_next = -1;
  if (w.tiles > 0) {
    if (pv) {
      partial::load_q_tile<4>(p, t, h0, heads, sm.view(0), tid);
    } else {
      // Dependent global round trips before the first MMA: indptr (above), the slot ids of tiles
      // 0..3 (together), the rows of tiles 0..2 (together).
      const int key = c / kThreadsPerKey;
      const int32_t slot0 = cuda::tile_slot(p, w, 0, key);
      const int32_t slot1 = cuda::tile_slot(p, w, 1, key);
      const int32_t slot2 = cuda::tile_slot(p, w, 2, key);
      slot_next = cuda::tile_slot(p, w, 3, key);
      Rows9 rc0, rc1{};
      issue_rows9(p, w, 0, slot0, sm, c, rc0);
      if (w.tiles > 1) issue_rows9(p, w, 1, slot1, sm, c, rc1);
      if (w.tiles > 2) issue_rows9(p, w, 2, slot2, sm, c, rc);
      dequant_rows9(p, w, 0, rc0, c, sm);
      SPARSEMLA_STAMP(c == 0, cuda::kGtConv0);
      if (w.tiles > 1) dequant_rows9(p, w, 1, rc1, c, sm);
      SPARSEMLA_STAMP(c == 0, cuda::kGtConv1);
    }
  }
  // The S = 1 epilogue's RoPE cos / sin, off its critical path (two dependent round trips there:
  // the position, then the table row).
  if (pv && p.num_splits == 1 && p.finish.positions != nullptr && tid < 64) {
    cuda::cp_async4(sm.rope() + tid, cuda::rope_row(p.finish, t) + tid);
  }
  cuda::cp_async_wait_all();
  __syncthreads();  // Q, K(0), K(1), RoPE cos / sin, valid bytes of tiles 0..2
  SPARSEMLA_STAMP(tid == 0, cuda::kGtInit);
  if (!pv) {
    if (w.tiles > 0) qk_loop(p, w, sm, c, rc, slot_next);
    return;  // the PV warps' barriers below count 256 threads
  }
  float acc[4][kNTiles][4];
  partial::clear_acc<4>(acc);
  float m_run = cuda::kNoScore, l_run = 0.0f;
  pv_loop(p, w, sm, tid, m_run, l_run, acc);
  const partial::Smem<4> v = sm.view(0);
  if (tid % C4::kThreadsPerHead == 0) {
    const int h = tid / C4::kThreadsPerHead;
    v.row_m[h] = m_run;
    v.row_l[h] = l_run;
  }
  const auto pv_sync = [] { bar_sync(kBarPvEpilogue, kPvThreads); };
  pv_sync();  // rows' m, l written; every Q.K (reads Q, the staging buffer) done before the last
              // kBarScores
  if (p.num_splits > 1) {
    partial::write_partials<4>(p, v, t, s, h0, heads, tid, acc);
  } else {
    partial::finish_rows<4>(p, v, t, h0, heads, tid, acc, pv_sync, sm.rope());
  }
  SPARSEMLA_STAMP(tid == 0, cuda::kGtDone);
}

}  // namespace sparsemla::cuda_generic::partial_ws
