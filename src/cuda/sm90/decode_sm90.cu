// src/cuda/sm90/decode_sm90.cu: the Hopper-specialised sparse decode (CONTRACT 4, 7), sm_90a.
//
// One CTA (384 threads = 3 warpgroups, 1 per SM) owns one query row t, one split s and a group of
// 64 heads (rows past H are zero and never written).
//   - Warpgroup 2, the producer (72 registers after setmaxnreg): each warp copies its 8 keys of a
//     tile (4 threads per row, 16-byte cp.async: a warp instruction covers 8 rows x 64 bytes, and
//     its scale words) into a 2-stage raw ring, two tiles ahead, and dequantises them
//     (FP8 x UE8M0 -> bf16 by bit placement and one bf16x2 multiply; NaN bytes and large codes take
//     the exact path and the scrub) into a 3-stage bf16 K ring; a stage is published by its `full`
//     mbarrier.
//   - Warpgroups 0 and 1, the consumers (216 registers): warpgroup c computes Q.K over dims
//     [256c, +256) with wgmma m64n32k16 (Q and K from shared memory), the two partial score sets
//     are summed through shared memory, the online softmax runs in registers (eager rescale, bf16
//     P, fp32 l), and P.V for output columns [256c, +256) runs as wgmma m64n256k16 (P from
//     registers, V = the same K stage read MN-major; 128 fp32 accumulators per thread). Q.K of the
//     next tile and P.V of this one are issued back to back after the softmax, and the next
//     tile's exchange and softmax run beside that P.V; a stage goes back to the producer (`empty`
//     mbarrier) once its P.V has completed.
// Shared memory (no swizzle: every 16-byte chunk of a core matrix is contiguous, so the
// dequantiser's 16-byte stores and the raw-row reads are bank-conflict free):
//   Q       64 heads x 512 dims bf16, core matrix (head group g, dim chunk c) at (8c + g) * 128
//   K[3]    32 keys x 512 dims bf16, core matrix (key group g, dim chunk c) at (4c + g) * 128
//   raw[2]  32 keys x 592 B (576 data bytes, the 8-byte scale word, pad: rows 37 chunks apart,
//           conflict-free)
//   S[2]    partial scores, 64 x 32 fp32 per consumer warpgroup, fragment order
//   flags[3][32], rope[64] (cos / sin), slots[4][32], mbarriers full[3], empty[3]
// Epilogue: S > 1 writes the partials m, l, acc (acc rows staged in shared memory and written by
// one bulk copy per head when the workspace allows; combined by the generic combine kernel,
// launched with programmatic dependent launch), or, with the fused combine (S = 2 by the host's
// policy), the row's S CTAs are one cluster and combine through distributed shared memory; S == 1
// finishes the rows in place (sink and RoPE cos / sin loaded with Q), stages them as bf16 in the Q
// buffer and writes 16-byte chunks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "core/tuning.h"
#include "cuda/common/decode_common.cuh"
#include "cuda/common/decode_params.cuh"
#include "cuda/common/device_info.h"
#include "cuda/common/numerics_selfcheck.h"
#include "cuda/common/timeline.cuh"
#include "cuda/sm90/cluster.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/sm90_backend.h"
#include "cuda/sm90/wgmma.cuh"
#include "sparsemla/error.h"
#include "sparsemla/plan.h"

namespace sparsemla::cuda_sm90 {

#ifdef SPARSEMLA_TIMELINE
__device__ unsigned long long g_timeline[cuda::kTimelineWords];
#endif

namespace {

using cuda::cp_async_wait;
using cuda::DeviceCache;
using cuda::DeviceList;
using cuda::exp2_ftz;
using cuda::FinishParams;
using cuda::kLog2e;
using cuda::kNoScore;
using cuda::smem_u32;
using cuda::split_work;
using cuda::SplitWork;
using cuda::tile_cache;
using cuda::tile_scrub;

constexpr int kHeads = 64;                // wgmma M: heads per CTA
constexpr int kKeys = cuda::kKeyTile;     // keys per tile (CONTRACT 4.4 bk)
constexpr int kDim = Fp8DsMla::kHeadDim;  // 512
// 36 data chunks + the scale word (8 bytes) + pad: rows 148 words apart (conflict-free)
constexpr int kRawRowBytes = 37 * 16;
constexpr int kConsumers = 256;  // warpgroups 0, 1
constexpr int kProducers = 128;  // warpgroup 2
constexpr int kThreads = kConsumers + kProducers;
// Three K stages let the producer run two tiles ahead of the tensor work; the raw ring then fits
// two stages (copies two tiles ahead of the dequantisation) and the score exchange one buffer.
constexpr int kKStages = 3;
constexpr int kRawStages = 2;

constexpr int kQBytes = kHeads * kDim * 2;       // 65536
constexpr int kKBytes = kKeys * kDim * 2;        // 32768
constexpr int kRawBytes = kKeys * kRawRowBytes;  // 18944
constexpr int kScoreBytes = kHeads * kKeys * 4;  // 8192 per warpgroup
constexpr int kFlagBytes = kKStages * kKeys;
constexpr int kRopeBytes = 64 * 4;  // cos x32 | sin x32 of the row's position (fused inverse RoPE)
constexpr int kSlotStages = 4;      // slot-id ring of the producer (a tile's 32 slot ids per stage)
constexpr int kSlotBytes = kSlotStages * kKeys * 4;
constexpr int kBarrierBytes = 2 * kKStages * 8;
// Every region before the mbarriers, in carve() order; the barriers come last.
constexpr int kBarrierOffset = kQBytes + kKStages * kKBytes + kRawStages * kRawBytes +
                               2 * kScoreBytes + kFlagBytes + kRopeBytes + kSlotBytes;
constexpr int kSmemBytes = kBarrierOffset + kBarrierBytes;
static_assert(kSmemBytes <= 227 * 1024, "fits the 227 KiB opt-in of sm_90");
static_assert(kBarrierOffset % 8 == 0, "mbarriers are 8-byte aligned");

using Sm90Params = cuda::DecodeKernelParams;  // the decode kernels' one parameter struct

// The most splits the fused combine takes (the host rule below; the kernel is instantiated for
// 2..kFusedMaxSplits only): a compile-time knob of src/core/tuning.h.
constexpr int32_t kFusedMaxSplits = core::kSm90FusedMaxSplits;
static_assert(kFusedMaxSplits <= cuda::kMaxFusedSplits, "the kernel fuses 2..8 splits");

// Device code exists only in the sm_90a cubin (and the host pass); other targets get an empty
// kernel.
#if !defined(__CUDA_ARCH__) || defined(SPARSEMLA_SM90A_DEVICE)
constexpr int kChunks = kDim / 8;                // 16-byte bf16 chunks per row: 64
constexpr int kRowBytes = Fp8DsMla::kDataBytes;  // 576 copied per key
static_assert(kRowBytes + Fp8DsMla::kScaleBytes <= kRawRowBytes,
              "a raw row holds data + scale word");
// Register split (ptxas budget at entry: 65536 / 384 = 168 per thread): the producer holds a
// thread's 9 raw chunks (36 registers) at once, the consumers 128 accumulators + 16 scores + 8 P +
// state: 72 + 2 * 216 = 3 * 168 (56 / 224 spills the producer).
constexpr int kProducerRegs = 72;
constexpr int kConsumerRegs = 216;
constexpr int kEntryRegs = 168;  // __launch_bounds__(384, 1): 65536 / 384, rounded down to 8
// setmaxnreg only moves registers inside the CTA's pool: the consumers' increase can be served
// only if the producer's decrease frees at least as much (otherwise setmaxnreg.inc waits forever).
static_assert(kProducers * kProducerRegs + kConsumers * kConsumerRegs <= kThreads * kEntryRegs,
              "register reallocation must fit the CTA's entry allocation");
// Named barrier ids: the score exchange of the consumers and "warpgroup c's score buffer has been
// read" (arrived at by the reader, waited for by the writer); 3 and 4.
constexpr uint32_t kExchangeBarrier = 1, kScoresReadBarrier = 3;

struct Smem {
  unsigned char* q;
  unsigned char* k;    // [kKStages][kKBytes]
  unsigned char* raw;  // [kRawStages][kRawBytes]
  float* scores;       // [2 warpgroups][64 x 32]
  uint8_t* flags;      // [kKStages][32]
  float* rope;         // [64]: cos x32 | sin x32 at the row's position (loaded with Q)
  int32_t* slots;      // [kSlotStages][32]: the producer's slot ids of a tile (-1: no key)
  uint64_t* full;      // [kKStages]: K stage written (count: 128 producer threads)
  uint64_t* empty;     // [kKStages]: K stage read (count: 256 consumer threads)
  __device__ __forceinline__ unsigned char* k_stage(int32_t i) const {
    return k + (i % kKStages) * kKBytes;
  }
  __device__ __forceinline__ unsigned char* raw_stage(int32_t i) const {
    return raw + (i % kRawStages) * kRawBytes;
  }
  __device__ __forceinline__ float* score_set(int c) const { return scores + c * (kHeads * kKeys); }
  __device__ __forceinline__ uint8_t* flag_set(int32_t i) const {
    return flags + (i % kKStages) * kKeys;
  }
  __device__ __forceinline__ int32_t* slot_set(int32_t i) const {
    return slots + (i % kSlotStages) * kKeys;
  }
};

__device__ __forceinline__ Smem carve(unsigned char* base) {
  Smem s;
  s.q = base;
  s.k = base + kQBytes;
  s.raw = s.k + kKStages * kKBytes;
  s.scores = reinterpret_cast<float*>(s.raw + kRawStages * kRawBytes);
  s.flags = reinterpret_cast<uint8_t*>(s.scores + 2 * kHeads * kKeys);
  s.rope = reinterpret_cast<float*>(s.flags + kFlagBytes);
  s.slots = reinterpret_cast<int32_t*>(s.rope + kRopeBytes / 4);
  s.full = reinterpret_cast<uint64_t*>(s.slots + kSlotBytes / 4);
  s.empty = s.full + kKStages;
  return s;
}

// Parity of the phase a ring stage completes for the (i / stages)-th time.
template <int kStages>
__device__ __forceinline__ uint32_t use_parity(int32_t i) {
  return static_cast<uint32_t>(i / kStages) & 1u;
}

// Byte offset of the 16-byte chunk (row, chunk c) in a core-matrix operand of `groups` 8-row
// groups.
__device__ __forceinline__ int cm_offset(int row, int c, int groups) {
  return (c * groups + row / 8) * 128 + (row % 8) * 16;
}

// ---- producer: gather and dequantisation (warpgroup 2) ------------------------------------------
// Producer thread (warp w, lane l) owns key 8w + l % 8 of every tile and its row part l / 8: raw
// chunks x = part + 4j, j = 0..8 (j < 7: NoPE chunks of scale tile j; j = 7, 8: the RoPE chunks
// 28 + part, 32 + part). It copies exactly those chunks from global memory (16-byte cp.async) and
// dequantises them, so a warp depends on nothing but its own 8 keys: no producer barrier, no
// mbarrier for the rows. A warp instruction covers 8 rows x 64 contiguous bytes (16 whole
// sectors); the earlier mapping (key = lane, part = warp) touched 32 rows x 16 bytes per
// instruction, half of every sector (step 6.4 in docs/lab/sm90-path.md measured that form slower
// than the bulk copies). Shared memory: a warp's raw reads (8 rows 37 chunks apart x 4 chunks)
// and its K-stage stores (4 core matrices) are conflict-free in every 8-lane phase.
struct ProducerLane {
  int key;   // 8 warp + lane % 8
  int part;  // lane / 8
};

// Where the row of a key of tile i lives: the global addresses of its 576 data bytes and of its
// scale word, or data == nullptr (no row: past the split's tiles, or a slot outside the cache).
// Every producer thread of the key computes it, two tiles ahead, in the basic block of the
// conversion's loads and checks (lever P1, docs/lab/sm90-path.md: the copy and the validity used
// to compute it twice).
struct RowSource {
  const unsigned char* data;
  const unsigned char* scale;
};
__device__ __forceinline__ RowSource row_source(const Sm90Params& p, const SplitWork& w, int32_t i,
                                                int32_t slot) {
  // Branch-free (a branch here closes the basic block, and the chain then runs on its own):
  // slot 0 stands in for a key without a row, and the result is selected away.
  const DeviceCache& cache = tile_cache(p, w, i);
  const bool ok = i < w.tiles && slot >= 0 && slot < cache.num_slots;
  const cuda::RowOffsets off = cuda::row_offsets32_in_range(cache, ok ? slot : 0u);
  const unsigned char* data = cache.base + off.data;
  const unsigned char* scale = cache.base + off.scale;
  return {ok ? data : nullptr, ok ? scale : nullptr};
}

// This thread's part of key `g.key`'s row of tile i into raw stage i: its 9 chunks (16-byte
// cp.async, L2 only) and, by part 0, the 8-byte scale word into the row's pad; nothing for a key
// without a row. Part of the caller's cp.async group.
__device__ __forceinline__ void copy_part(int32_t i, const RowSource& src, const Smem& sm,
                                          ProducerLane g) {
  if (src.data == nullptr) return;
  unsigned char* row = sm.raw_stage(i) + g.key * kRawRowBytes;
#pragma unroll
  for (int j = 0; j < 9; ++j) {
    const int x = g.part + 4 * j;
    cuda::cp_async16(row + 16 * x, src.data + 16 * x);
  }
  if (g.part == 0) cuda::cp_async8(row + kRowBytes, src.scale);
}

// True when the whole row part takes the fast dequantisation: every scale code of the row is
// <= kFastMaxCode (all 7 checked: cheaper than selecting) and, when the tile is scrubbed, no NoPE
// byte is an e4m3 NaN and no RoPE value a bf16 NaN. Unscrubbed tiles (the provenance gate of
// CONTRACT 5: the writer guarantees no NaN) skip the per-element NaN checks.
__device__ __forceinline__ bool part_fast(const uint4 (&c)[9], uint2 scale, bool scrub) {
  uint32_t nan8 = 0, nan16 = 0;
#pragma unroll
  for (int j = 0; j < 7; ++j) {
    nan8 |= cuda::nan_bytes_acc(c[j].x) | cuda::nan_bytes_acc(c[j].y) |
            cuda::nan_bytes_acc(c[j].z) | cuda::nan_bytes_acc(c[j].w);
  }
#pragma unroll
  for (int j = 7; j < 9; ++j) {
    nan16 |= cuda::nan_bf16_acc(c[j].x) | cuda::nan_bf16_acc(c[j].y) | cuda::nan_bf16_acc(c[j].z) |
             cuda::nan_bf16_acc(c[j].w);
  }
  const bool clean = (nan8 & cuda::kNanBytesMask) == 0 && (nan16 & cuda::kNanBf16Mask) == 0;
  return (clean || !scrub) && cuda::scale_codes_fast(scale);
}

// Byte offsets in the K stage of NoPE raw chunk x (bf16 chunks 2x, 2x+1: dims [16x, +16)) and of
// RoPE raw chunk x (bf16 chunk 28 + x: dims 448 + 8 (x - 28)).
__device__ __forceinline__ int nope_lo_offset(int key, int x) {
  return cm_offset(key, 2 * x, 4);
}
__device__ __forceinline__ int nope_hi_offset(int key, int x) {
  return cm_offset(key, 2 * x + 1, 4);
}
__device__ __forceinline__ int rope_offset(int key, int x) {
  return cm_offset(key, 28 + x, 4);
}

// The exact path of a row part (rare: a scale code > kFastMaxCode or a NaN in a scrubbed tile):
// chunk by chunk from shared memory, not unrolled (keeps the producer's code small).
__device__ __noinline__ void convert_part_exact(const unsigned char* row, unsigned char* kst,
                                                uint2 scale, bool scrub, ProducerLane g) {
#pragma unroll 1
  for (int j = 0; j < 9; ++j) {
    const int x = g.part + 4 * j;
    const uint4 v = *reinterpret_cast<const uint4*>(row + 16 * x);
    if (j < 7) {
      uint4 lo, hi;
      cuda::dequant_nope16_any(v, cuda::scale_code(scale, j), scrub, &lo, &hi);
      *reinterpret_cast<uint4*>(kst + nope_lo_offset(g.key, x)) = lo;
      *reinterpret_cast<uint4*>(kst + nope_hi_offset(g.key, x)) = hi;
    } else {
      *reinterpret_cast<uint4*>(kst + rope_offset(g.key, x)) = cuda::rope_chunk16(v, scrub);
    }
  }
}

// Tile i: this thread's raw chunks -> the bf16 K stage (core-matrix layout), zeros for an invalid
// key (finite under P = 0: its chunks and scale word read as zero, which the fast path turns into
// +0 bits); key flag by part 0. The 9 chunks are loaded first and checked once, so the common
// case runs as straight-line code with 7 independent dequantisation chains, and the caller's
// address arithmetic of a later tile (row_source) can interleave with these loads and checks:
// no branch separates them.
__device__ __forceinline__ void convert_rows(const Smem& sm, int32_t i, bool scrub, bool valid,
                                             ProducerLane g) {
  const unsigned char* row = sm.raw_stage(i) + g.key * kRawRowBytes;
  unsigned char* kst = sm.k_stage(i);
  if (g.part == 0) sm.flag_set(i)[g.key] = valid ? 1 : 0;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 c[9];
#pragma unroll
  for (int j = 0; j < 9; ++j) {
    c[j] = valid ? *reinterpret_cast<const uint4*>(row + 16 * (g.part + 4 * j)) : zero;
  }
  // 7 codes + pad; an invalid key's code 0 is on the fast path
  const uint2 scale = valid ? *reinterpret_cast<const uint2*>(row + kRowBytes) : make_uint2(0, 0);
  if (!part_fast(c, scale, scrub)) {
    convert_part_exact(row, kst, scale, scrub, g);
    return;
  }
#pragma unroll
  for (int j = 0; j < 7; ++j) {
    const int x = g.part + 4 * j;
    uint4 lo, hi;
    cuda::dequant_nope16_fast(c[j], cuda::scale_code(scale, j), &lo, &hi);
    *reinterpret_cast<uint4*>(kst + nope_lo_offset(g.key, x)) = lo;
    *reinterpret_cast<uint4*>(kst + nope_hi_offset(g.key, x)) = hi;
  }
#pragma unroll
  for (int j = 7; j < 9; ++j) {
    *reinterpret_cast<uint4*>(kst + rope_offset(g.key, g.part + 4 * j)) = c[j];
  }
}

// The slot id of key g.key of tile i into its slot-ring stage, by part 0 (lanes 0..7 of each
// warp: the warp's own 8 keys): a cp.async (-1 stored for a key past the tile, or for a tile past
// the last). Part of the caller's cp.async group. Slot ids kept in registers cost a DRAM latency
// per tile: rotating them through registers makes ptxas move a just-loaded register at the top of
// the loop (ncu, 2026-11-29, commit b8b481f).
__device__ __forceinline__ void load_slot(const Sm90Params& p, const SplitWork& w, int32_t i,
                                          const Smem& sm, ProducerLane g) {
  if (g.part != 0) return;
  int32_t* dst = sm.slot_set(i) + g.key;
  if (i >= w.tiles) {
    *dst = -1;
    return;
  }
  const cuda::Tile tile = cuda::tile_of(w, i);
  const DeviceList& list = tile.extra ? p.extra_list : p.main_list;
  if (g.key < tile.keys) {
    cuda::cp_async4(dst, list.indices + tile.begin + g.key);
  } else {
    *dst = -1;
  }
}

// The producer's tile loop; each warp runs it for its own 8 keys, synchronised only by
// __syncwarp. One cp.async group per tile: group i holds tile i's rows and tile i + 2's slot ids
// (issued in iteration i - 2). Per tile i: wait for group i (one younger group may stay in flight)
// and a free K stage (empty); where tile i + 2's rows live (row_source); dequantise tile i,
// async-proxy fence (MEMBAR.CTA), publish (full); __syncwarp (raw stage i read by every lane, the
// scale words included); copy tile i + 2's rows into raw stage i and load tile i + 4's slot ids
// (group i + 2).
__device__ __forceinline__ void producer_loop(const Sm90Params& p, const SplitWork& w,
                                              const Smem& sm, int ptid) {
  static_assert(kRawStages == 2 && kSlotStages == 4, "the look-ahead below");
  const int lane = ptid % 32;
  const ProducerLane g{8 * (ptid / 32) + lane % 8, lane / 8};
  load_slot(p, w, 0, sm, g);
  load_slot(p, w, 1, sm, g);
  cuda::cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();  // slot ids of tiles 0, 1 visible to the warp
  SPARSEMLA_STAMP(ptid == 0, cuda::kTlSlots);
  const RowSource r0 = row_source(p, w, 0, sm.slot_set(0)[g.key]);
  const RowSource r1 = row_source(p, w, 1, sm.slot_set(1)[g.key]);
  copy_part(0, r0, sm, g);
  load_slot(p, w, 2, sm, g);
  cuda::cp_async_commit();  // group 0
  copy_part(1, r1, sm, g);
  load_slot(p, w, 3, sm, g);
  cuda::cp_async_commit();  // group 1
  bool valid = r0.data != nullptr, valid_next = r1.data != nullptr;
  cuda::TlLaps laps;
  laps.start();
  for (int32_t i = 0; i < w.tiles; ++i) {
    cp_async_wait<1>();  // group i: tile i's rows, tile i + 2's slot ids
    __syncwarp();
    SPARSEMLA_STAMP(ptid == 0 && i == 0, cuda::kTlRaw0);
    laps.lap(0);
    if (i >= kKStages) mbar_wait(sm.empty + i % kKStages, use_parity<kKStages>(i) ^ 1u);
    laps.lap(1);
    const RowSource r2 = row_source(p, w, i + 2, sm.slot_set(i + 2)[g.key]);
    convert_rows(sm, i, tile_scrub(p, w, i), valid, g);
    fence_proxy_async();
    mbar_arrive(sm.full + i % kKStages);
    SPARSEMLA_STAMP(ptid == 0 && i == 0, cuda::kTlFull0);
    laps.lap(2);   // lap 3 (the cp.async wait of the bulk-copy producer) stays 0
    __syncwarp();  // every lane has read raw stage i (the scale word: part 0 overwrites it)
    laps.lap(4);
    copy_part(i + 2, r2, sm, g);    // nothing past the last tile (r2.data == nullptr)
    load_slot(p, w, i + 4, sm, g);  // ring stage of tile i: read in iteration i - 2
    cuda::cp_async_commit();        // group i + 2
    valid = valid_next;
    valid_next = r2.data != nullptr;
    laps.lap(5);
  }
  cp_async_wait<0>();  // nothing in flight at exit (the last groups hold only slot ids)
  SPARSEMLA_STAMP_SUMS(ptid == 0, cuda::kTlWaitRaw, laps, 6);  // kTlWaitRaw .. kTlIssue
}

// ---- tensor work and softmax --------------------------------------------------------------------

// Q rows h0.. into the core-matrix layout (zero rows past H) and, with fused inverse RoPE, the
// cos / sin row of position t: one cp.async group, issued before the epilogue's inputs are needed
// (read after the last tile, these cold loads used to stall the epilogue ~1 us).
__device__ __forceinline__ void load_q(const Sm90Params& p, int64_t t, int32_t h0, int32_t heads,
                                       const Smem& sm, int ctid) {
  // Thread ctid: chunk c = ctid % 64 of heads hb + 4n, n < 16 (a warp reads 512 contiguous
  // bytes); pointers advance by constants (the per-chunk index arithmetic was ~900 instructions
  // per warp, a quarter of a batch-1 CTA's consumer samples, ncu 2026-11-30).
  constexpr int kHeadsPerPass = kConsumers / kChunks;  // 4
  static_assert(kHeads % (2 * kHeadsPerPass) == 0 && kHeadsPerPass * 2 == 8,
                "two passes per group");
  const int c = ctid % kChunks, hb = ctid / kChunks;
  const __nv_bfloat16* src = p.q + t * p.q_stride_token + (h0 + hb) * p.q_stride_head + 8 * c;
  const int64_t step = kHeadsPerPass * p.q_stride_head;
  unsigned char* dst = sm.q + cm_offset(hb, c, kHeads / 8);  // (c * 8 + h / 8) * 128 + h % 8 * 16
  const bool vec16 = p.q_vec16;
#pragma unroll
  for (int n = 0; n < kHeads / kHeadsPerPass; ++n) {
    const int h = hb + kHeadsPerPass * n;
    // h = hb + 8m (n = 2m) or hb + 4 + 8m (n = 2m + 1): row group m, row hb or hb + 4.
    unsigned char* d = dst + (n / 2) * 128 + (n % 2) * kHeadsPerPass * 16;
    cuda::load_q_chunk_at(src + n * step, vec16, h < heads, d);
  }
  const cuda::FinishParams& f = p.finish;
  const bool finishes_here = p.num_splits == 1 || p.fused_combine;
  if (finishes_here && f.positions != nullptr && ctid < 64) {
    cuda::cp_async4(sm.rope + ctid, cuda::rope_row(f, t) + ctid);
  }
  cuda::cp_async_commit();
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
// 8j + 2 (lane % 4) + e): s becomes the fp32 probabilities; returns the alphas.
__device__ __forceinline__ void softmax_tile(float (&s)[16], const uint8_t* flags, float scale,
                                             float lag, int lane, RowState& st, float (&alpha)[2]) {
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
    const bool move = tmax > st.m[h] + lag;
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
}

// The probabilities as the bf16 A fragments of P.V's two 16-key blocks: keys [16 kb, +16) hold
// (r0, 2t), (r1, 2t), (r0, 2t + 8), (r1, 2t + 8).
__device__ __forceinline__ void pack_p(const float (&s)[16], uint32_t (&pa)[2][4]) {
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
    pa[kb][0] = cuda::bf16x2_bits(s[8 * kb + 0], s[8 * kb + 1]);
    pa[kb][1] = cuda::bf16x2_bits(s[8 * kb + 2], s[8 * kb + 3]);
    pa[kb][2] = cuda::bf16x2_bits(s[8 * kb + 4], s[8 * kb + 5]);
    pa[kb][3] = cuda::bf16x2_bits(s[8 * kb + 6], s[8 * kb + 7]);
  }
}

// Whether a row of the warp moved its running maximum (warp-uniform).
__device__ __forceinline__ bool needs_rescale(const float (&alpha)[2]) {
  return __any_sync(0xFFFFFFFFu, alpha[0] != 1.0f || alpha[1] != 1.0f);
}
__device__ __forceinline__ void rescale(float (&acc)[128], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    acc[4 * j] *= alpha[0];
    acc[4 * j + 1] *= alpha[0];
    acc[4 * j + 2] *= alpha[1];
    acc[4 * j + 3] *= alpha[1];
  }
}

// Partial scores of warpgroup c to shared memory, the other's back, summed (the same bits in both:
// fp32 addition commutes). Stored as [fragment float4 j][128 threads]: conflict-free. One buffer
// per warpgroup: before overwriting its buffer a warpgroup waits until the other has read the
// previous tile's scores from it (kScoresReadBarrier + c; `more` = another tile follows).
__device__ __forceinline__ void exchange_scores(const Smem& sm, int32_t i, bool more, int c,
                                                int wtid, float (&s)[16]) {
  float4* mine = reinterpret_cast<float4*>(sm.score_set(c));
  const float4* other = reinterpret_cast<const float4*>(sm.score_set(1 - c));
  if (i > 0) named_barrier_sync(kScoresReadBarrier + c, kConsumers);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    mine[j * 128 + wtid] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
  named_barrier_sync(kExchangeBarrier, kConsumers);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 o = other[j * 128 + wtid];
    s[4 * j] += o.x;
    s[4 * j + 1] += o.y;
    s[4 * j + 2] += o.z;
    s[4 * j + 3] += o.w;
  }
  if (more) named_barrier_arrive(kScoresReadBarrier + (1 - c), kConsumers);
}

// Head row of a consumer thread's accumulator fragment half h (wgmma m64 layout: 16 rows per
// warp, lane / 4 within them, + 8 for the second half).
__device__ __forceinline__ int fragment_row(int warp, int lane, int h) {
  return 16 * warp + lane / 4 + 8 * h;
}

// Byte offset of the 16-byte output chunk (row, ch) in the staging tile (64 rows x 1 KiB, in the
// Q buffer once every Q.K has completed): chunk ch ^ (row % 8), so both the fragment writes (8 rows
// x 4 lanes of a warp) and the row-wise 16-byte reads are conflict-free.
__device__ __forceinline__ int stage_offset(int row, int ch) {
  return row * (kDim * 2) + (ch ^ (row & 7)) * 16;
}

// A thread's accumulator half h (its row's 64 columns, pairs 8 floats apart) as fp32 pairs at dst
// (the row's first column of this thread).
__device__ __forceinline__ void store_acc_half(float* dst, int h, const float (&acc)[128]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    *reinterpret_cast<float2*>(dst + 8 * j) =
        make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  }
}

// S > 1: the partials m, l, acc of this split (combined by the combine kernel).
__device__ __forceinline__ void write_partials(const Sm90Params& p, int64_t t, int32_t s,
                                               int32_t h0, int32_t heads, int c, int wtid,
                                               const RowState& st, const float (&acc)[128]) {
  const int lane = wtid % 32, t2 = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = fragment_row(wtid / 32, lane, h);
    if (row >= heads) continue;
    const float l = cuda::reported_l(st.l[h]);
    const int64_t r = (t * p.num_splits + s) * p.num_heads + h0 + row;
    if (c == 0 && t2 == 0) {
      p.ws_m[r] = cuda::reported_m(st.m[h], st.l[h]);
      p.ws_l[r] = l;
    }
    if (!cuda::split_has_acc(l)) continue;
    float* dst = p.ws_acc + r * kDim + 256 * c + t2;
    store_acc_half(dst, h, acc);
  }
}

// S == 1, step 1: finished rows (sink, 1 / L, inverse RoPE with the cos / sin staged with Q) as
// bf16 into the staging tile; lse.
__device__ __forceinline__ void stage_finished(const Sm90Params& p, int64_t t, int32_t h0,
                                               int32_t heads, int c, int wtid, const RowState& st,
                                               const float (&sink_v)[2], const float (&acc)[128],
                                               const Smem& sm) {
  const cuda::FinishParams& f = p.finish;
  const int lane = wtid % 32, t2 = 2 * (lane % 4);
  const bool rope = f.positions != nullptr && c == 1;  // dims 448.. are warpgroup 1's last 64
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = fragment_row(wtid / 32, lane, h);
    const float l = cuda::reported_l(st.l[h]);
    const float m = cuda::reported_m(st.m[h], st.l[h]);
    const float coef = cuda::one_split_coef(m, l, sink_v[h]);
    if (c == 0 && t2 == 0 && row < heads) cuda::store_lse(f, t, h0 + row, cuda::finish_lse(m, l));
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      float a = coef == 0.0f ? 0.0f : acc[4 * j + 2 * h] * coef;
      float b = coef == 0.0f ? 0.0f : acc[4 * j + 2 * h + 1] * coef;
      if (j >= 24 && rope) {  // dim 256 + 8j + t2 = 448 + 2k
        const int k = 4 * (j - 24) + lane % 4;
        cuda::inverse_rope(a, b, make_float2(sm.rope[k], sm.rope[32 + k]));
      }
      *reinterpret_cast<uint32_t*>(sm.q + stage_offset(row, 32 * c + j) + 2 * t2) =
          cuda::bf16x2_bits(a, b);
    }
  }
}

// S == 1, step 2: the staged rows h0.. to out, 16-byte chunks with consecutive threads along a
// row (pair or element stores where out is not 16-byte aligned).
__device__ __forceinline__ void write_staged(const cuda::FinishParams& f, int64_t t, int32_t h0,
                                             int32_t heads, const Smem& sm, int ctid) {
#pragma unroll 4
  for (int n = 0; n < kHeads * kChunks / kConsumers; ++n) {
    const int j = ctid + kConsumers * n, row = j / kChunks, ch = j % kChunks;
    if (row >= heads) break;  // rows grow with n
    cuda::store_out_chunk(f, t, h0 + row, ch,
                          *reinterpret_cast<const uint4*>(sm.q + stage_offset(row, ch)));
  }
}

// ---- 2 <= S <= 8 (the host uses S = 2): a row's splits as one cluster, combined there -------
// Each CTA stages its m, l and acc (fp32) in its own Q + K space (free after the last P.V). After
// a cluster barrier, thread r < 64 of each CTA folds head r's S (m, l) pairs, read from the peers'
// shared memory, into the coefficients of CONTRACT 4.3 (the combine kernel's arithmetic), and the
// CTA of rank r finishes 8-column chunks [r * ceil(64 / S), ...) of every head from the S peers'
// acc, with the inverse RoPE, into out. No partials reach global memory and no second kernel runs.
constexpr int kMaxFused = cuda::kMaxFusedSplits;
constexpr int kAccStride = 520;  // floats per staged acc row: consecutive rows 8 banks apart
static_assert((kHeads * kAccStride + kHeads * (3 + kMaxFused)) * 4 <= kQBytes + kKStages * kKBytes,
              "the fused combine's staging fits in Q and the K ring");

struct FusedTile {
  float* acc;     // [64][kAccStride]
  float* m;       // [64]
  float* l;       // [64]
  float* coef;    // [64][kMaxFused]: weight x 1 / L of each split
  uint32_t* act;  // [64]: bit s set when split s's acc is read; kNaNRow when the row is NaN
};
constexpr uint32_t kNaNRow = 1u << 31;  // the factor is NaN (CONTRACT 4.2): the sum starts at NaN
static_assert(kMaxFused < 31, "split bits and the NaN-row bit of FusedTile::act are disjoint");
__device__ __forceinline__ FusedTile fused_tile(const Smem& sm) {
  FusedTile f;
  f.acc = reinterpret_cast<float*>(sm.q);  // Q, then the K ring (contiguous)
  f.m = f.acc + kHeads * kAccStride;
  f.l = f.m + kHeads;
  f.coef = f.l + kHeads;
  f.act = reinterpret_cast<uint32_t*>(f.coef + kHeads * kMaxFused);
  return f;
}

// This split's m, l, acc into the staging tile (fragment order as write_partials).
__device__ __forceinline__ void fused_stage(const FusedTile& ft, int c, int wtid,
                                            const RowState& st, const float (&acc)[128]) {
  const int lane = wtid % 32, t2 = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = fragment_row(wtid / 32, lane, h);
    if (c == 0 && t2 == 0) {
      ft.m[row] = cuda::reported_m(st.m[h], st.l[h]);
      ft.l[row] = cuda::reported_l(st.l[h]);
    }
    float* dst = ft.acc + row * kAccStride + 256 * c + t2;
    store_acc_half(dst, h, acc);
  }
}

// Head row `row`: the coefficients of the S splits and which are active (combine_small's math);
// rank 0 stores lse.
__device__ __forceinline__ void fused_coefficients(const Sm90Params& p, const FusedTile& ft,
                                                   int64_t t, int32_t h0, int32_t heads, int row,
                                                   uint32_t rank) {
  const int32_t S = p.num_splits;
  float m[kMaxFused], l[kMaxFused];
#pragma unroll
  for (int s = 0; s < kMaxFused; ++s) {
    m[s] = s < S ? load_peer_f32(peer_address(ft.m + row, s)) : kNoScore;
    l[s] = s < S ? load_peer_f32(peer_address(ft.l + row, s)) : 0.0f;
  }
  const int32_t h = h0 + min(row, heads - 1);  // rows past H: any valid sink, never stored
  const cuda::SplitsFinish fin = cuda::finish_splits(m, l, p.finish.sink, h);
  uint32_t act = 0;
#pragma unroll
  for (int s = 0; s < kMaxFused; ++s) {
    ft.coef[row * kMaxFused + s] = cuda::split_weight(m[s], fin.big_m) * fin.factor;
    if (fin.factor != 0.0f && m[s] != kNoScore) act |= 1u << s;
  }
  if (isnan(fin.factor)) act |= kNaNRow;
  ft.act[row] = act;
  if (rank == 0 && row < heads)
    cuda::store_lse(p.finish, t, h0 + row, cuda::finish_lse(fin.max_m, fin.sum_l));
}

// This rank's 8-column chunks of every head: sum of coef x acc over the active peers, inverse
// RoPE on dims 448.., one bf16 rounding, 16-byte stores (pairs / elements when out is unaligned).
// A thread takes kGroup = 8 / S consecutive chunks per round and issues the distributed-shared-
// memory loads of all of them (8 x 32 bytes) before using any: one round trip per round instead
// of one per (chunk, peer) (~0.5 us each way, measured: the serial form cost ~5 us at S = 8).
template <int kS>
__device__ __forceinline__ void fused_finish_columns(const Sm90Params& p, const FusedTile& ft,
                                                     const Smem& sm, int64_t t, int32_t h0,
                                                     int32_t heads, uint32_t rank, int ctid) {
  constexpr int kGroup = kMaxFused / kS, kPer = (kChunks + kS - 1) / kS;
  const cuda::FinishParams& f = p.finish;
  const int ch0 = static_cast<int>(rank) * kPer;
  const int n = max(0, min(kChunks, ch0 + kPer) - ch0);
  const int items = heads * n;  // (row, chunk) pairs, rows below H only
  // Round r: items base + g * 256 + ctid (consecutive threads on consecutive chunks: 2-way bank
  // conflicts at most; a thread on kGroup consecutive chunks was 8-way at S = 2).
  for (int base = 0; base < items; base += kConsumers * kGroup) {
    float4 v[kGroup][kS][2];
    uint32_t act[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int it = min(base + g * kConsumers + ctid, items - 1), row = it / n;
      const int ch = ch0 + it % n;
      act[g] = ft.act[row];
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        v[g][s][0] = v[g][s][1] = make_float4(0.f, 0.f, 0.f, 0.f);
        if ((act[g] >> s) & 1u) {  // inactive: its acc is never read
          const uint32_t a = peer_address(ft.acc + row * kAccStride + 8 * ch, s);
          v[g][s][0] = load_peer_f32x4(a);
          v[g][s][1] = load_peer_f32x4(a + 16);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int it = base + g * kConsumers + ctid;
      if (it >= items) break;
      const int row = it / n, ch = ch0 + it % n;
      const float o0 = (act[g] & kNaNRow) != 0u ? cuda::quiet_nan() : 0.0f;
      float o[8] = {o0, o0, o0, o0, o0, o0, o0, o0};
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        if (((act[g] >> s) & 1u) == 0) continue;
        const float cf = ft.coef[row * kMaxFused + s];
        const float4 a = v[g][s][0], b = v[g][s][1];
        o[0] += cf * a.x;
        o[1] += cf * a.y;
        o[2] += cf * a.z;
        o[3] += cf * a.w;
        o[4] += cf * b.x;
        o[5] += cf * b.y;
        o[6] += cf * b.z;
        o[7] += cf * b.w;
      }
      if (f.positions != nullptr && 8 * ch >= Fp8DsMla::kNopeDims) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int k = (8 * ch - Fp8DsMla::kNopeDims) / 2 + i;
          cuda::inverse_rope(o[2 * i], o[2 * i + 1], make_float2(sm.rope[k], sm.rope[32 + k]));
        }
      }
      const uint4 w = make_uint4(cuda::bf16x2_bits(o[0], o[1]), cuda::bf16x2_bits(o[2], o[3]),
                                 cuda::bf16x2_bits(o[4], o[5]), cuda::bf16x2_bits(o[6], o[7]));
      cuda::store_out_chunk(f, t, h0 + row, ch, w);
    }
  }
}

// fused_finish_columns<num_splits>, instantiated for S .. kFusedMaxSplits only (the host never
// fuses more splits).
template <int S>
__device__ __forceinline__ void fused_finish_columns_any(const Sm90Params& p, const FusedTile& ft,
                                                         const Smem& sm, int64_t t, int32_t h0,
                                                         int32_t heads, uint32_t rank, int ctid) {
  if constexpr (S < kFusedMaxSplits) {
    if (p.num_splits != S) {
      fused_finish_columns_any<S + 1>(p, ft, sm, t, h0, heads, rank, ctid);
      return;
    }
  }
  fused_finish_columns<S>(p, ft, sm, t, h0, heads, rank, ctid);
}

// The consumers' side of the fused combine (the producer warps take part in both cluster
// barriers). Every CTA of the cluster runs it, inactive splits included (m = -FLT_MAX).
__device__ __forceinline__ void fused_combine(const Sm90Params& p, const Smem& sm, int64_t t,
                                              int32_t h0, int32_t heads, int c, int wtid,
                                              const RowState& st, const float (&acc)[128],
                                              int tid) {
  named_barrier_sync(kExchangeBarrier, kConsumers);  // both warpgroups' wgmma retired: Q, K free
  const FusedTile ft = fused_tile(sm);
  fused_stage(ft, c, wtid, st, acc);
  cluster_sync();
  const uint32_t rank = cluster_rank();
  if (tid < kHeads) fused_coefficients(p, ft, t, h0, heads, tid, rank);
  named_barrier_sync(kExchangeBarrier, kConsumers);
  fused_finish_columns_any<2>(p, ft, sm, t, h0, heads, rank, tid);
  cluster_sync();  // no CTA leaves while a peer may still read its shared memory
}

// S > 1 with a 16-byte aligned workspace: the partials staged in Q + K as for the fused combine,
// then each head row's acc (2 KiB) leaves with one bulk copy (lanes 0..7 of each consumer warp
// take a row each). ncu, batch 1: the 64 float2 stores per thread of write_partials spent a
// quarter of the consumers' samples throttled on the store queue (lg).
__device__ __forceinline__ void write_partials_bulk(const Sm90Params& p, const Smem& sm, int64_t t,
                                                    int32_t s, int32_t h0, int32_t heads, int c,
                                                    int wtid, const RowState& st,
                                                    const float (&acc)[128], int tid) {
  named_barrier_sync(kExchangeBarrier, kConsumers);  // both warpgroups' wgmma retired: Q, K free
  const FusedTile ft = fused_tile(sm);
  fused_stage(ft, c, wtid, st, acc);
  fence_proxy_async();  // the staged rows, for the bulk copies (async proxy)
  named_barrier_sync(kExchangeBarrier, kConsumers);
  const int lane = tid % 32, row = (tid / 32) * 8 + lane;
  if (lane >= 8 || row >= heads) return;
  const int64_t r = (t * p.num_splits + s) * p.num_heads + h0 + row;
  const float l = ft.l[row];
  p.ws_m[r] = ft.m[row];
  p.ws_l[r] = l;
  if (!cuda::split_has_acc(l)) return;   // m = -FLT_MAX: the combine never reads this acc
#if defined(SPARSEMLA_LAB_NO_ACC_STORE)  // src/core/tuning.h: wrong outputs, for time differences
#pragma message("SPARSEMLA_LAB_NO_ACC_STORE: the sm90 partials' acc is not stored (outputs wrong)")
  return;
#endif
  bulk_copy_s2g(p.ws_acc + r * kDim, ft.acc + row * kAccStride, kDim * 4);
  bulk_commit();
  bulk_wait_read();  // the CTA's shared memory must outlive the copy's reads
}

// One tile of the consumers' pipeline. `sc` holds Q.K(i) (complete); P.V(i-1) may still run.
//   scores exchanged (consumer barrier) | softmax into P (beside P.V(i-1)) | wait for P.V(i-1);
//   K stage i-1 goes back to the producer; rescale (rare) | Q.K(i+1) into `sc`, then P.V(i),
//   issued back to back | wait for Q.K(i+1); the next tile's exchange and softmax run beside
//   P.V(i).
struct ConsumerCtx {
  const Sm90Params& p;
  const SplitWork& w;
  const Smem& sm;
  int c, wtid, lane;
  cuda::TlLaps& laps;  // debug timeline only (empty otherwise)
};

// P (P.V's A operand, in registers `pa`, carried from tile to tile) is packed only after P.V(i-1)
// retired: wgmma register operands must not change before then, and `pa` is kept live until that
// wait (wgmma_fence_operands), so ptxas cannot put anything else in those registers either. When
// P was a per-tile temporary packed in the softmax, ptxas placed the next tile's P and the
// exchange's loads in the registers P.V(i-1) was still reading (found by the bench's verify:
// C4-Pro B = 8 at S >= 5 under graph replay, errors 2-3x the tolerance in whole 8-row groups,
// depending on timing; the tests' cases had not hit it).
template <bool kMore>  // another tile follows
__device__ __forceinline__ void consumer_tile(const ConsumerCtx& x, int32_t i, RowState& st,
                                              float (&acc)[128], float (&sc)[16],
                                              uint32_t (&pa)[2][4]) {
  exchange_scores(x.sm, i, kMore, x.c, x.wtid, sc);
  x.laps.lap(0);
  float alpha[2];
  softmax_tile(sc, x.sm.flag_set(i), x.p.scale, x.p.rescale_lag, x.lane, st, alpha);
  x.laps.lap(1);
  // P.V(i-1) has run beside the exchange and softmax; wait for it before acc may be rescaled
  // (wgmma.wait_group must be warpgroup-uniform, the rescale test is only warp-uniform) and
  // before its A registers are rewritten.
  wgmma_wait<0>();
  wgmma_fence_operands(acc);
  wgmma_fence_operands(pa);
  // P.V(i-1), the last reader of K stage i - 1, has retired: the stage goes back to the producer
  // now, a Q.K earlier than after Q.K(i+1)'s wait (the producer waited ~530 cycles per tile for
  // it, timeline 2026-12-04).
  if (kMore && i > 0) mbar_arrive(x.sm.empty + (i - 1) % kKStages);
  pack_p(sc, pa);  // before Q.K(i+1) reuses sc as its accumulator
  if (needs_rescale(alpha)) rescale(acc, alpha);
  x.laps.lap(2);
  if (kMore) {
    mbar_wait(x.sm.full + (i + 1) % kKStages, use_parity<kKStages>(i + 1));
    x.laps.lap(3);
    qk_issue(x.sm, i + 1, x.c, sc);  // tile i's probabilities are in pa now
  }
  pv_issue(x.sm, i, x.c, pa, acc);
  if (kMore) {
    wgmma_wait<1>();  // Q.K(i+1)
    wgmma_fence_operands(sc);
  }
  x.laps.lap(4);
}

__device__ __forceinline__ void consumer_loop(const Sm90Params& p, const SplitWork& w,
                                              const Smem& sm, int64_t t, int32_t s, int32_t h0,
                                              int32_t heads, int tid) {
  cuda::TlLaps laps;
  const ConsumerCtx x{p, w, sm, tid / 128, tid % 128, tid % 32, laps};
  float acc[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) acc[j] = 0.0f;
  wgmma_fence_operands(acc);  // zeroed here, not sunk below the first Q.K (C7515 serialisation)
  RowState st{{kNoScore, kNoScore}, {0.0f, 0.0f}};
  float sink_v[2];  // loaded now: a cold load at the end would stall the epilogue
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = fragment_row(x.wtid / 32, x.lane, h);
    sink_v[h] = p.num_splits == 1 && row < heads ? cuda::sink_value(p.finish.sink, h0 + row)
                                                 : -__int_as_float(0x7F800000);
  }
  load_q(p, t, h0, heads, sm, tid);
  cp_async_wait<0>();
  fence_proxy_async();  // Q (cp.async writes) for wgmma
  named_barrier_sync(kExchangeBarrier, kConsumers);
  SPARSEMLA_STAMP(tid == 0, cuda::kTlQ);
  float sc[16];
  if (w.tiles > 0) {
    mbar_wait(sm.full, 0);
    SPARSEMLA_STAMP(tid == 0, cuda::kTlFirstTile);
    laps.start();
    qk_issue(sm, 0, x.c, sc);
    wgmma_wait<0>();
    wgmma_fence_operands(sc);
  }
  // Every tile with a successor, then the last one: the wgmma groups in flight are then the same
  // on every path through the loop, which ptxas needs to keep the wgmma asynchronous (with the
  // successor test inside the tile it serialised every wgmma: C7515).
  uint32_t pa[2][4] = {};
  for (int32_t i = 0; i + 1 < w.tiles; ++i) consumer_tile<true>(x, i, st, acc, sc, pa);
  if (w.tiles > 0) consumer_tile<false>(x, w.tiles - 1, st, acc, sc, pa);
  wgmma_wait<0>();
  wgmma_fence_operands(acc);
  SPARSEMLA_STAMP(tid == 0, cuda::kTlLoopDone);
  SPARSEMLA_STAMP_SUMS(tid == 0, cuda::kTlExchange, laps, 5);  // kTlExchange .. kTlQk
  if (p.fused_combine) {
    fused_combine(p, sm, t, h0, heads, x.c, x.wtid, st, acc, tid);
    SPARSEMLA_STAMP(tid == 0, cuda::kTlDone);
    return;
  }
  if (p.num_splits > 1) {
    if ((reinterpret_cast<uintptr_t>(p.ws_acc) & 15) == 0) {
      write_partials_bulk(p, sm, t, s, h0, heads, x.c, x.wtid, st, acc, tid);
    } else {
      write_partials(p, t, s, h0, heads, x.c, x.wtid, st, acc);
    }
    SPARSEMLA_STAMP(tid == 0, cuda::kTlDone);
    return;
  }
  // Every Q.K has completed: each warpgroup waited for its last one before the last exchange,
  // whose barrier both passed. The Q buffer becomes the staging tile.
  stage_finished(p, t, h0, heads, x.c, x.wtid, st, sink_v, acc, sm);
  named_barrier_sync(kExchangeBarrier, kConsumers);
  write_staged(p.finish, t, h0, heads, sm, tid);
  SPARSEMLA_STAMP(tid == 0, cuda::kTlDone);
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
  SPARSEMLA_STAMP(tid == 0, cuda::kTlEntry);
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  int32_t work;
  const SplitWork w = split_work(p, t, s, &work);
  SPARSEMLA_STAMP(tid == 0, cuda::kTlSplitWork);
  if (s >= work && !p.fused_combine) {  // inactive (CONTRACT 4.5)
    cuda::mark_split_inactive(p, t, s, h0, heads, tid);
    return;
  }
  if (tid == 0) {
    for (int k = 0; k < kKStages; ++k) {
      mbar_init(sm.full + k, kProducers);
      mbar_init(sm.empty + k, kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();
  SPARSEMLA_STAMP(tid == 0, cuda::kTlInit);
  if (tid >= kConsumers) {
    setmaxnreg_dec<kProducerRegs>();
    producer_loop(p, w, sm, tid - kConsumers);
    SPARSEMLA_STAMP(tid == kConsumers, cuda::kTlProducerDone);
    if (p.fused_combine) {  // the consumers' two cluster barriers (fused_combine)
      __syncwarp();
      cluster_sync();
      cluster_sync();
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    consumer_loop(p, w, sm, t, s, h0, heads, tid);
  }
#endif
}

// Fast-path selfcheck (numerics_selfcheck.h): part_fast on rows of zero data bytes with the given
// scale words, scrubbed; one word per thread (the 4 parts of a key test the same word).
__global__ void part_fast_count_kernel(const uint2* words, int64_t n, uint32_t* count) {
#ifdef SPARSEMLA_SM90A_DEVICE
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  uint4 c[9];
  for (int j = 0; j < 9; ++j) c[j] = make_uint4(0, 0, 0, 0);
  if (part_fast(c, words[i], /*scrub=*/true)) atomicAdd(count, 1u);
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

cudaLaunchConfig_t launch_config(dim3 grid, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  return cfg;
}

// A row's S splits as one cluster (grid (T, S, head groups)).
cudaLaunchAttribute row_cluster(int32_t splits) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = static_cast<unsigned>(splits);
  attr.val.clusterDim.z = 1;
  return attr;
}

// How many clusters of `splits` CTAs of this kernel can be resident at once on the current device
// (one CTA per SM, a cluster within one GPC; 0 when refused); asked once per device and size.
int fused_cluster_capacity(int32_t splits) {
  if (splits < 2 || splits > cuda::kMaxFusedSplits) return 0;
  static std::array<std::array<std::once_flag, cuda::kMaxFusedSplits + 1>, kMaxDevices> once;
  static std::array<std::array<int, cuda::kMaxFusedSplits + 1>, kMaxDevices> capacity{};
  int dev = 0;
  cuda::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  std::call_once(once[dev][splits], [dev, splits] {
    cudaLaunchConfig_t cfg = launch_config(dim3(1, splits, 1), nullptr);
    cudaLaunchAttribute attr = row_cluster(splits);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, decode_sm90_kernel, &cfg) != cudaSuccess) {
      clusters = 0;
      cudaGetLastError();  // a refusal only means "not fused"
    }
    capacity[dev][splits] = clusters;
  });
  return capacity[dev][splits];
}

// The fused combine runs at S = 2 when every cluster of the grid is resident in one wave (a
// cluster needs S free SMs of one GPC at once: 66 clusters of 2 fit on the H200). Measured
// (docs/PERF.md, "Fused combine on the sm90 path"): S = 2 fused is faster (C4-Pro B = 32:
// 73 -> 53 us, MTP-Flash
// B = 32: 57.5 -> 40 us); S = 4..8 fused was slower than the combine kernel in every cell measured
// (C4-Flash B = 8 S = 8: 28.5 against 25.1 us at the planner's S = 10; a second wave of clusters
// doubled C4-Pro B = 8 S = 8: 56.8 against 34.8 us). The kernel handles S up to kMaxFusedSplits.
// SPARSEMLA_SM90_FUSED_MAX_SPLITS (kFusedMaxSplits, above) widens the rule to 2..N for
// measurements.

bool use_fused_combine(int64_t clusters, int32_t splits) {
  return splits >= 2 && splits <= kFusedMaxSplits && clusters <= fused_cluster_capacity(splits);
}

void launch_clustered(const Sm90Params& k, dim3 grid, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = launch_config(grid, stream);
  cudaLaunchAttribute attr = row_cluster(static_cast<int32_t>(grid.y));
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cuda::check_cuda(cudaLaunchKernelEx(&cfg, decode_sm90_kernel, k),
                   "decode_sm90_kernel launch (clusters)");
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

bool plan_fused_combine(int64_t num_tokens, int32_t num_heads, int32_t num_splits,
                        bool deterministic) {
  if (deterministic || num_tokens == 0) return false;
  opt_in_once();
  return use_fused_combine(num_tokens * ((num_heads + kHeads - 1) / kHeads), num_splits);
}

void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace) {
  if (p.num_tokens == 0) return;
  const int32_t num_splits = plan.num_splits;
  cuda::check_decode_launch(p);
  opt_in_once();
  Sm90Params k = cuda::decode_kernel_params(p, plan, workspace, /*specialised=*/true);
  // The producer's 16-byte cp.async needs 16-byte aligned rows (the architecture gate routes other
  // caches to the generic path; this keeps a direct call from faulting).
  SPARSEMLA_CHECK_ARG(k.main_cache.aligned16 != 0, "sparse_decode", "main_cache",
                      "base and block_stride 16-byte aligned on the sm90 path", "unaligned");
  SPARSEMLA_CHECK_ARG(k.extra_list.capacity == 0 || k.extra_cache.aligned16 != 0, "sparse_decode",
                      "extra_cache", "base and block_stride 16-byte aligned on the sm90 path",
                      "unaligned");
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(num_splits),
                  static_cast<unsigned>((p.num_heads + kHeads - 1) / kHeads));
  k.fused_combine = plan.fused_combine ? 1 : 0;
  if (k.fused_combine) {  // one launch: the splits of a row combine in their cluster
    launch_clustered(k, grid, stream);
    return;
  }
  decode_sm90_kernel<<<grid, kThreads, kSmemBytes, stream>>>(k);
  cuda::check_cuda(cudaGetLastError(), "decode_sm90_kernel launch");
  if (num_splits > 1) cuda::launch_combine(k, stream);
}

bool device_part_fast_count(const uint64_t* words, int64_t n, uint32_t* count, void* stream) {
  if (!have_sm90a_kernels()) return false;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cuda::check_cuda(cudaMemsetAsync(count, 0, sizeof(uint32_t), s), "part_fast_count clear");
  if (n <= 0) return true;
  part_fast_count_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(
      reinterpret_cast<const uint2*>(words), n, count);
  cuda::check_cuda(cudaGetLastError(), "part_fast_count_kernel launch");
  return true;
}

#ifdef SPARSEMLA_TIMELINE
// Debug timeline (cuda/common/timeline.cuh): zero it on `stream`; copy it out (synchronous).
void timeline_clear(cudaStream_t stream) {
  cuda::timeline_clear_symbol(g_timeline, stream);
}
void timeline_read(unsigned long long* out) {
  cuda::timeline_read_symbol(g_timeline, out);
}
#endif

}  // namespace sparsemla::cuda_sm90
