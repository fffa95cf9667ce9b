// src/cuda/common/decode_params.cuh: the one parameter struct of the CUDA decode kernels (generic
// and sm90 partial kernels alike) and what both do with it: the split of a row into key tiles
// (CONTRACT 4.3, the adaptive active splits of CONTRACT 4.5), the slot id of a tile's key, the
// scrub decision of the provenance gate (CONTRACT 5). Host: building the struct from DecodeParams,
// the launch checks (decode_params.cu) and the split-K combine (CONTRACT 4.3; combine.cu). CUDA
// translation units only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_common.cuh"
#include "sparsemla/decode.h"
#include "sparsemla/plan.h"

namespace sparsemla::cuda {

struct DecodeKernelParams {
  int64_t num_tokens;  // T
  int32_t num_heads;   // H
  int32_t num_splits;  // S
  const __nv_bfloat16* q;
  int64_t q_stride_token;  // elements (the default H * 512 resolved)
  int64_t q_stride_head;
  int32_t q_vec16;  // q and its strides allow 16-byte loads
  float scale;
  float rescale_lag;  // nats the running max may lag (core::Tuning::rescale_lag, default 0)
  DeviceCache main_cache;
  DeviceCache extra_cache;
  DeviceList main_list;
  DeviceList extra_list;  // capacity 0: no extra segment
  int32_t scrub_extra;    // the main cache is always scrubbed
  int32_t adaptive;       // CONTRACT 4.5 active splits
  int32_t one_wave;       // ONE_WAVE (host)
  int32_t fused_combine;  // sm90: the row's splits are one cluster (S = 2 by policy, <= 8)
  float* ws_m;            // [T, S, H]  (S > 1)
  float* ws_l;            // [T, S, H]
  float* ws_acc;          // [T, S, H, 512]
  FinishParams finish;    // S == 1
};

// ---- host
// -----------------------------------------------------------------------------------------
// specialised: the call runs on the sm90-specialised path (the provenance gate may then skip the
// extra cache's scrub).
DecodeKernelParams decode_kernel_params(const DecodeParams& p, const DecodePlan& plan,
                                        void* workspace, bool specialised);

// An index list (ragged or dense) as the kernels read it (DeviceList); also the shard kernels'
// input (cuda/generic/lists.cu).
DeviceList device_list(const IndexList& l);

// The check every CUDA decode launch makes beyond dispatch's: T fits the grid.
void check_decode_launch(const DecodeParams& p);

// The combine kernel over the workspace partials (S > 1), with programmatic dependent launch on
// sm_90+ (it waits for the preceding partial kernel in griddepcontrol.wait).
void launch_combine(const DecodeKernelParams& k, cudaStream_t stream);

// ---- device: the split's key tiles
// ---------------------------------------------------------------
inline constexpr int kKeyTile = kPlanKeyBlock;  // 32 keys per tile (CONTRACT 4.4 bk)
inline constexpr int kMaxFusedSplits = 8;       // portable thread-block cluster size

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

// Split s of row t; *work = the splits that do work for the row (all S unless adaptive).
__device__ __forceinline__ SplitWork split_work(const DecodeKernelParams& p, int64_t t, int32_t s,
                                                int32_t* work) {
  const RowRange mr = load_row_range(p.main_list, t);
  const RowRange xr = load_row_range(p.extra_list, t);
  *work = p.adaptive ? adaptive_work(mr.len, xr.len, p.num_splits, p.one_wave) : p.num_splits;
  SplitWork w{};
  if (s >= *work) return w;
  int32_t b, e;
  split_bounds(mr.len, *work, s, &b, &e);
  w.main_begin = mr.begin + b;
  w.main_keys = e - b;
  split_bounds(xr.len, *work, s, &b, &e);
  w.extra_begin = xr.begin + b;
  w.extra_keys = e - b;
  w.main_tiles = (w.main_keys + kKeyTile - 1) / kKeyTile;
  w.tiles = w.main_tiles + (w.extra_keys + kKeyTile - 1) / kKeyTile;
  return w;
}

// An inactive split (CONTRACT 4.5: s >= work): m = -FLT_MAX, l = 0 for its heads
// h0 .. h0 + heads - 1 (threads tid < heads write one each); its acc is never read.
__device__ __forceinline__ void mark_split_inactive(const DecodeKernelParams& p, int64_t t,
                                                    int32_t s, int32_t h0, int32_t heads, int tid) {
  if (tid < heads) {
    const int64_t row = (t * p.num_splits + s) * p.num_heads + h0 + tid;
    p.ws_m[row] = kNoScore;
    p.ws_l[row] = 0.0f;
  }
}

// Slot id of key `key` of tile i (untrusted; -1 past the tile's end or past the last tile).
__device__ __forceinline__ int32_t tile_slot(const DecodeKernelParams& p, const SplitWork& w,
                                             int32_t i, int key) {
  if (i >= w.tiles) return -1;
  const Tile tile = tile_of(w, i);
  const DeviceList& list = tile.extra ? p.extra_list : p.main_list;
  return key < tile.keys ? __ldg(list.indices + tile.begin + key) : -1;
}

// The cache of tile i and whether its rows are scrubbed (the window cache always is).
__device__ __forceinline__ const DeviceCache& tile_cache(const DecodeKernelParams& p,
                                                         const SplitWork& w, int32_t i) {
  return tile_of(w, i).extra ? p.extra_cache : p.main_cache;
}
__device__ __forceinline__ bool tile_scrub(const DecodeKernelParams& p, const SplitWork& w,
                                           int32_t i) {
  return tile_of(w, i).extra ? (p.scrub_extra != 0) : true;
}

// 16-byte chunk of Q at src into shared memory at dst: cp.async when q allows 16-byte loads
// (vec16; the caller commits and waits), 2-byte loads otherwise; zeros for a head past H (live
// false), which no output row reads.
__device__ __forceinline__ void load_q_chunk_at(const __nv_bfloat16* src, bool vec16, bool live,
                                                void* dst) {
  if (!live) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    return;
  }
  if (vec16) {
    cp_async16(dst, src);
    return;
  }
  const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = static_cast<uint32_t>(__ldg(s16 + 2 * i)) |
           (static_cast<uint32_t>(__ldg(s16 + 2 * i + 1)) << 16);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// 16-byte chunk c (dims 8c..8c+7) of query row t, head h (see load_q_chunk_at).
__device__ __forceinline__ void load_q_chunk(const DecodeKernelParams& p, int64_t t, int32_t h,
                                             int c, bool live, void* dst) {
  const __nv_bfloat16* src = p.q + t * p.q_stride_token + h * p.q_stride_head + 8 * c;
  load_q_chunk_at(src, p.q_vec16, live, dst);
}

}  // namespace sparsemla::cuda
