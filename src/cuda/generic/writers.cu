// src/cuda/generic/writers.cu: the portable CUDA cache writers (CONTRACT 3), sm_80 and newer.
//
// Every kernel mirrors the float arithmetic of the CPU backend (src/cpu/window_writer.cpp,
// compressor.cpp, indexer_compressor.cpp) operation for operation: products and sums are rounded
// separately (__fmul_rn / __fadd_rn, so nvcc cannot contract them into FMAs the CPU does not do),
// sums run in the CPU's order (pooling over rows t = 0..n-1 per channel, the RMSNorm sum of squares
// over d = 0..D-1 in one thread), division and square root are IEEE. The tile amax is a max of
// non-negative values, so its reduction order does not matter. The pooling exp is exp_portable
// (sparsemla/numerics.h, the same bits on host and device); the CPU currently calls std::exp, which
// differs from it on ~1e-4 of the inputs, so GPU and CPU compressor rows can differ in rare bytes
// until the CPU switches. Single pass and two stages share every device function and are
// byte-identical.
//
//   window writer     one warp per token: lane l owns dims [16l, 16l+16): lanes 0..27 the seven
//                     NoPE tiles (4 lanes per tile), lanes 28..31 the 32 RoPE pairs; 16-byte
//                     stores.
//   state writer      one block per token, float4 copies when every pointer and stride allows.
//   compressor        single pass: one block per entry, one thread per channel (512 or 128).
//                     two stages: stage 1 pools 64-channel tiles into the fp32 scratch (one block
//                     per token and tile), stage 2 normalises, rotates, quantises and stores.
//
// Per-token inputs are device data the host never validates: a token whose slot, position,
// request, RoPE row or state page is out of range is skipped (nothing read through it, nothing
// written), and every store lies inside the destination cache.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "cuda/common/device_info.h"
#include "cuda/generic/ops_backend.h"
#include "sparsemla/format.h"
#include "sparsemla/numerics.h"

namespace sparsemla::cuda_generic {

namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kWarpSize = 32;
constexpr int kMlaHead = Fp8DsMla::kHeadDim;        // 512
constexpr int kIndexerHead = IndexerFp8::kHeadDim;  // 128
constexpr int kPoolTile = 64;                       // stage-1 channel tile (as the CPU's)
constexpr int kMaxPoolRows = 128;                   // r = 128: 128 rows; r = 4: 2*4 rows
constexpr int64_t kMaxGrid = std::numeric_limits<int32_t>::max();

int grid_for(int64_t items) {
  return static_cast<int>(items < kMaxGrid ? items : kMaxGrid);
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// ---- device helpers -----------------------------------------------------------------------------

__device__ __forceinline__ bool aligned_to(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Stores 4*N bytes held little-endian in w[]: one vector store when dst allows it, bytes otherwise
// (unpadded page strides, e.g. 61*584 = 8 mod 16, CONTRACT 2.1).
template <int N>
__device__ __forceinline__ void store_words(uint8_t* dst, const uint32_t (&w)[N]) {
  static_assert(N == 1 || N == 2 || N == 4);
  if (aligned_to(dst, 4 * N)) {
    if constexpr (N == 4) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else if constexpr (N == 2) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    } else {
      *reinterpret_cast<uint32_t*>(dst) = w[0];
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 4 * N; ++i) dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
}

__device__ __forceinline__ uint32_t pack_bytes(uint8_t b0, uint8_t b1, uint8_t b2, uint8_t b3) {
  return static_cast<uint32_t>(b0) | (static_cast<uint32_t>(b1) << 8) |
         (static_cast<uint32_t>(b2) << 16) | (static_cast<uint32_t>(b3) << 24);
}

__device__ __forceinline__ uint32_t pack_bf16(bf16_bits lo, bf16_bits hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// Forward RoPE of one pair as the CPU computes it: a' = a*c - b*s, b' = a*s + b*c, every product
// and sum rounded on its own (rope_forward_pair on the host, no FMA).
__device__ __forceinline__ void rope_pair(float& a, float& b, float c, float s) {
  const float na = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  const float nb = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  a = na;
  b = nb;
}

// The bf16 stored for a rotated RoPE value; sanitising turns NaN into +0 (CONTRACT 5).
__device__ __forceinline__ bf16_bits rope_bf16(float v, bool sanitise) {
  return (sanitise && v != v) ? bf16_bits{0} : float_to_bf16(v);
}

// max over the `width` lanes of an aligned lane group (width a power of two <= 32). Every lane of
// the warp must call it. fmaxf of non-negative values: the order does not change the result.
__device__ __forceinline__ float group_max(float v, int width) {
  for (int m = width / 2; m > 0; m /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

// ---- window writer (CONTRACT 3.1) ---------------------------------------------------------------

struct WindowArgs {
  const bf16_bits* kv;
  int64_t kv_stride;
  const int64_t* positions;
  const int64_t* slots;
  const float* rope;
  int64_t rope_rows;
  int64_t rope_stride;
  uint8_t* cache;
  int64_t num_slots;  // num_blocks * block_size
  int64_t block_stride;
  int32_t block_size;
  int32_t code_max;
  int64_t num_tokens;
  bool sanitise;
};

constexpr int kWindowWarps = 4;                                    // tokens per block
constexpr int kDimsPerLane = Fp8DsMla::kHeadDim / kWarpSize;       // 16
constexpr int kNopeLanes = Fp8DsMla::kNopeDims / kDimsPerLane;     // 28
constexpr int kLanesPerTile = Fp8DsMla::kTileDims / kDimsPerLane;  // 4
static_assert(kNopeLanes * kDimsPerLane == Fp8DsMla::kNopeDims);

// The 16 bf16 inputs of one lane (dims [16l, 16l+16)) widened to fp32 (exact).
__device__ __forceinline__ void load_bf16x16(const bf16_bits* src, float (&x)[16]) {
  if (aligned_to(src, 16)) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(src));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(src) + 1);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[2 * j] = bf16_to_float(static_cast<bf16_bits>(w[j] & 0xFFFFu));
      x[2 * j + 1] = bf16_to_float(static_cast<bf16_bits>(w[j] >> 16));
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) x[j] = bf16_to_float(__ldg(src + j));
}

// One fp8_ds_mla row, written by the 32 lanes of one warp.
__device__ void write_window_token(const WindowArgs& a, int64_t i, int lane) {
  const int64_t slot = a.slots[i];
  if (slot < 0 || slot >= a.num_slots) return;  // skip (< 0) or out of the cache (never written)
  const int64_t pos = a.positions[i];
  if (pos < 0 || pos >= a.rope_rows) return;  // no RoPE row: the CPU rejects it, we skip it

  float x[kDimsPerLane];
  load_bf16x16(a.kv + i * a.kv_stride + lane * kDimsPerLane, x);
  uint8_t* data = a.cache + mla_data_offset(slot, a.block_size, a.block_stride);
  uint8_t* scale = a.cache + mla_scale_offset(slot, a.block_size, a.block_stride);

  // NoPE lanes: |x| max of the lane, then of its 4-lane tile (RoPE lanes form their own group).
  float amax = 0.0f;
  if (lane < kNopeLanes) {
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) amax = fmaxf(amax, fabsf(x[j]));
  }
  amax = fmaxf(group_max(amax, kLanesPerTile), kQuantAmaxFloor);
  const int e = quant_exponent(amax);
  const uint8_t code = quant_code(e, a.code_max);

  if (lane < kNopeLanes) {
    const float inv = quant_inv_scale(e);
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = pack_bytes(quant_element(x[4 * j], inv), quant_element(x[4 * j + 1], inv),
                        quant_element(x[4 * j + 2], inv), quant_element(x[4 * j + 3], inv));
    }
    store_words(data + lane * kDimsPerLane, w);
  } else {
    // RoPE lane r = lane - 28 holds pairs k = 8r .. 8r+7 (dims 448 + 16r ..).
    const int r = lane - kNopeLanes;
    const float* cs = a.rope + pos * a.rope_stride;
    uint32_t w[8];
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int k = 8 * r + m;
      float lo = x[2 * m], hi = x[2 * m + 1];
      rope_pair(lo, hi, __ldg(cs + k), __ldg(cs + 32 + k));
      w[m] = pack_bf16(rope_bf16(lo, a.sanitise), rope_bf16(hi, a.sanitise));
    }
    uint8_t* dst = data + Fp8DsMla::kRopeOffset + r * 32;
    const uint32_t w0[4] = {w[0], w[1], w[2], w[3]}, w1[4] = {w[4], w[5], w[6], w[7]};
    store_words(dst, w0);
    store_words(dst + 16, w1);
  }

  // Scale word: codes of tiles 0..6 (lanes 0, 4, .., 24) + pad byte 0, stored by lane 0.
  uint32_t codes[2] = {0, 0};
#pragma unroll
  for (int t = 0; t < Fp8DsMla::kNumTiles; ++t) {
    const uint32_t c = __shfl_sync(kFullMask, static_cast<uint32_t>(code), t * kLanesPerTile);
    codes[t / 4] |= c << (8 * (t % 4));
  }
  if (lane == 0) store_words(scale, codes);
}

__global__ void __launch_bounds__(kWindowWarps* kWarpSize) window_kernel(const WindowArgs a) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWindowWarps;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWindowWarps + threadIdx.x / kWarpSize;
       i < a.num_tokens; i += step) {
    write_window_token(a, i, lane);  // warp-uniform: every lane has the same i
  }
}

// ---- compressor state writer (CONTRACT 3.2) -----------------------------------------------------

struct StateArgs {
  const float* kv;
  int64_t kv_stride;
  const float* score;
  int64_t score_stride;
  const float* ape;  // [r, W] or null
  const int64_t* positions;
  const int64_t* slots;
  float* base;
  int64_t capacity;  // num_blocks * block_size
  int64_t block_stride;
  int64_t row_stride;
  int32_t block_size;
  int32_t ratio;
  int64_t width;  // W
  int64_t num_tokens;
  bool vec4;  // every pointer 16-byte aligned and every stride a multiple of 4
};

constexpr int kStateThreads = 128;

__global__ void __launch_bounds__(kStateThreads) state_kernel(const StateArgs a) {
  for (int64_t i = blockIdx.x; i < a.num_tokens; i += gridDim.x) {
    const int64_t slot = a.slots[i];
    if (slot < 0 || slot >= a.capacity) continue;
    const int64_t pos = a.positions[i];
    if (pos < 0) continue;  // the CPU rejects it; here the token is skipped
    float* row =
        a.base + (slot / a.block_size) * a.block_stride + (slot % a.block_size) * a.row_stride;
    const float* kv = a.kv + i * a.kv_stride;
    const float* score = a.score + i * a.score_stride;
    const float* bias = a.ape != nullptr ? a.ape + (pos % a.ratio) * a.width : nullptr;
    if (a.vec4) {
      const int64_t n4 = a.width / 4;
      for (int64_t j = threadIdx.x; j < n4; j += blockDim.x) {
        reinterpret_cast<float4*>(row)[j] = __ldg(reinterpret_cast<const float4*>(kv) + j);
        float4 s = __ldg(reinterpret_cast<const float4*>(score) + j);
        if (bias != nullptr) {
          const float4 b = __ldg(reinterpret_cast<const float4*>(bias) + j);
          s = make_float4(__fadd_rn(s.x, b.x), __fadd_rn(s.y, b.y), __fadd_rn(s.z, b.z),
                          __fadd_rn(s.w, b.w));
        }
        reinterpret_cast<float4*>(row + a.width)[j] = s;
      }
    } else {
      for (int64_t j = threadIdx.x; j < a.width; j += blockDim.x) {
        row[j] = __ldg(kv + j);
        const float s = __ldg(score + j);
        row[a.width + j] = bias != nullptr ? __fadd_rn(s, __ldg(bias + j)) : s;
      }
    }
  }
}

// ---- compressor: pooling (CONTRACT 3.2 steps 1-2) -----------------------------------------------

// The state cache, its block table and the per-token inputs, as the pooling kernels read them.
struct PoolArgs {
  const int64_t* positions;
  const int32_t* request_index;
  const int64_t* state_slots;
  const int64_t* out_slots;
  int64_t num_tokens;
  int64_t num_requests;
  const float* state;
  int64_t state_capacity;  // num_blocks * block_size
  int64_t state_num_blocks;
  int64_t state_block_stride;  // elements
  int64_t state_row_stride;    // elements
  int32_t state_block_size;
  int32_t table_width;
  const int32_t* table;
  int64_t table_stride;
  int64_t out_capacity;  // slots of the destination cache
  int64_t rope_rows;
  int32_t ratio;
  int32_t head_dim;  // 512 or 128
  int32_t num_rows;  // (1 + overlap) * ratio
  int32_t overlap;   // 1: the older ratio rows read [0, D), the current ones [D, 2D)
};

// Shared state of one entry: the element offset of each window row in the state cache (-1 for
// positions < 0, never read).
struct EntryRows {
  int64_t offset[kMaxPoolRows];
};

// True (for every thread of the block alike) when token i stores an entry whose inputs are all in
// range; fills rows->offset. Contains __syncthreads: call from block-uniform control flow.
__device__ bool load_entry(const PoolArgs& a, int64_t i, int64_t* pos_out, EntryRows* rows) {
  const int64_t state_slot = a.state_slots[i];
  const int64_t pos = a.positions[i];
  const int64_t out = a.out_slots[i];
  const int32_t req = a.request_index[i];
  const bool stores = state_slot >= 0 && state_slot < a.state_capacity && pos >= 0 &&
                      pos % a.ratio == a.ratio - 1 && out >= 0 && out < a.out_capacity &&
                      req >= 0 && req < a.num_requests && (pos / a.ratio) * a.ratio < a.rope_rows;
  if (!stores) return false;  // uniform: every thread read the same values
  const int64_t first = pos - a.num_rows + 1;
  bool rows_ok = true;
  for (int t = threadIdx.x; t < a.num_rows; t += blockDim.x) {
    const int64_t q = first + t;
    int64_t offset = -1;
    if (q >= 0) {
      const int64_t col = q / a.state_block_size;
      const int64_t block =
          col < a.table_width ? static_cast<int64_t>(a.table[req * a.table_stride + col]) : -1;
      if (block < 0 || block >= a.state_num_blocks) {
        rows_ok = false;
      } else {
        offset = block * a.state_block_stride + (q % a.state_block_size) * a.state_row_stride;
      }
    }
    rows->offset[t] = offset;
  }
  *pos_out = pos;
  return __syncthreads_and(rows_ok) != 0;
}

// Channel c of the entry: softmax over the window rows (max first, then exp(score - max) with the
// denominator and the weighted sum accumulated row by row), as the CPU's pool_channels.
__device__ float pool_channel(const PoolArgs& a, const EntryRows& rows, int c) {
  const int64_t score_off = (a.overlap ? 2 : 1) * static_cast<int64_t>(a.head_dim);  // W
  const int64_t current = c + a.head_dim;     // column of the current rows under overlap
  float max_score = bits_float(0xFF800000u);  // -inf
  for (int t = 0; t < a.num_rows; ++t) {
    const int64_t off = rows.offset[t];
    if (off < 0) continue;
    const int64_t col = (a.overlap && t >= a.ratio) ? current : c;
    const float s = __ldg(a.state + off + score_off + col);
    max_score = s > max_score ? s : max_score;  // the CPU's comparison: NaN never wins
  }
  float denom = 0.0f, acc = 0.0f;
  for (int t = 0; t < a.num_rows; ++t) {
    const int64_t off = rows.offset[t];
    if (off < 0) continue;
    const int64_t col = (a.overlap && t >= a.ratio) ? current : c;
    const float w = exp_portable(__fsub_rn(__ldg(a.state + off + score_off + col), max_score));
    denom = __fadd_rn(denom, w);
    acc = __fadd_rn(acc, __fmul_rn(w, __ldg(a.state + off + col)));
  }
  return __fdiv_rn(acc, denom);
}

// ---- compressor: RMSNorm, RoPE, quantise, store (CONTRACT 3.2 steps 3-5) ------------------------

struct FinishArgs {
  const float* norm_weight;  // [D]
  float eps;
  const float* rope;
  int64_t rope_stride;
  uint8_t* cache;
  int64_t block_stride;  // bytes
  int32_t block_size;
  int32_t code_max;  // 254 sanitising, 255 legacy (KV cache only)
  bool sanitise;
};

// RMSNorm of c[0..D) in shared memory, in place: var = sum(c*c)/D with the sum taken by one thread
// in the CPU's order (d = 0..D-1), c = (c * (1/sqrt(var + eps))) * w. blockDim.x == D.
template <int D>
__device__ void rms_norm_shared(const FinishArgs& f, float* c) {
  __shared__ float inv_rms;
  if (threadIdx.x == 0) {
    float sum_sq = 0.0f;
    for (int d = 0; d < D; ++d) sum_sq = __fadd_rn(sum_sq, __fmul_rn(c[d], c[d]));
    const float var = __fdiv_rn(sum_sq, static_cast<float>(D));
    inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, f.eps)));
  }
  __syncthreads();
  const int d = threadIdx.x;
  c[d] = __fmul_rn(__fmul_rn(c[d], inv_rms), __ldg(f.norm_weight + d));
  __syncthreads();
}

// KV entry (D = 512): threads 0..111 quantise 4 NoPE dims each (16 threads per 64-dim tile),
// threads 112..127 rotate 2 RoPE pairs each at the window start, bf16, store.
__device__ void store_mla_entry(const FinishArgs& f, int64_t slot, int64_t window_start,
                                const float* c) {
  constexpr int kNopeThreads = Fp8DsMla::kNopeDims / 4;  // 112
  constexpr int kThreadsPerTile = Fp8DsMla::kTileDims / 4;
  const int tid = threadIdx.x;
  if (tid >= kNopeThreads + Fp8DsMla::kRopeDims / 4) return;  // warps 0..3 only (warp-uniform)
  uint8_t* data = f.cache + mla_data_offset(slot, f.block_size, f.block_stride);
  uint8_t* scale = f.cache + mla_scale_offset(slot, f.block_size, f.block_stride);
  float x[4];
  float amax = 0.0f;
  if (tid < kNopeThreads) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[j] = round_to_bf16(c[4 * tid + j]);
      amax = fmaxf(amax, fabsf(x[j]));
    }
  }
  amax = fmaxf(group_max(amax, kThreadsPerTile), kQuantAmaxFloor);
  if (tid < kNopeThreads) {
    const int e = quant_exponent(amax);
    const float inv = quant_inv_scale(e);
    const uint32_t w[1] = {pack_bytes(quant_element(x[0], inv), quant_element(x[1], inv),
                                      quant_element(x[2], inv), quant_element(x[3], inv))};
    store_words(data + 4 * tid, w);
    if (tid % kThreadsPerTile == 0) scale[tid / kThreadsPerTile] = quant_code(e, f.code_max);
    return;
  }
  const int r = tid - kNopeThreads;  // pairs 2r, 2r+1 = dims 448 + 4r ..
  const float* cs = f.rope + window_start * f.rope_stride;
  float v[4] = {c[Fp8DsMla::kNopeDims + 4 * r], c[Fp8DsMla::kNopeDims + 4 * r + 1],
                c[Fp8DsMla::kNopeDims + 4 * r + 2], c[Fp8DsMla::kNopeDims + 4 * r + 3]};
  rope_pair(v[0], v[1], __ldg(cs + 2 * r), __ldg(cs + 32 + 2 * r));
  rope_pair(v[2], v[3], __ldg(cs + 2 * r + 1), __ldg(cs + 33 + 2 * r));
  const uint32_t w[2] = {pack_bf16(rope_bf16(v[0], f.sanitise), rope_bf16(v[1], f.sanitise)),
                         pack_bf16(rope_bf16(v[2], f.sanitise), rope_bf16(v[3], f.sanitise))};
  store_words(data + Fp8DsMla::kRopeOffset + 8 * r, w);
  if (r == 0) scale[Fp8DsMla::kPadByte] = 0;
}

// Indexer entry (D = 128, NORMAL layout): thread d owns dim d; dims 64..127 are rotated first, then
// all 128 are rounded to bf16 and quantised as one block with an fp32 power-of-two scale.
__device__ void store_indexer_entry(const FinishArgs& f, int64_t slot, int64_t window_start,
                                    const float* c) {
  __shared__ float warp_amax[kIndexerHead / kWarpSize];
  const int d = threadIdx.x;
  float v = c[d];
  const bool rope_dim = d >= IndexerFp8::kNopeDims;
  if (rope_dim) {
    const int k = (d - IndexerFp8::kNopeDims) / 2;
    const float* cs = f.rope + window_start * f.rope_stride;
    float lo = c[IndexerFp8::kNopeDims + 2 * k], hi = c[IndexerFp8::kNopeDims + 2 * k + 1];
    rope_pair(lo, hi, __ldg(cs + k), __ldg(cs + 32 + k));
    v = (d % 2 == 0) ? lo : hi;
  }
  const float x = (f.sanitise && rope_dim && v != v) ? 0.0f : round_to_bf16(v);
  const float lane_max = group_max(fabsf(x), kWarpSize);
  if (d % kWarpSize == 0) warp_amax[d / kWarpSize] = lane_max;
  __syncthreads();
  const float amax = fmaxf(
      fmaxf(fmaxf(warp_amax[0], warp_amax[1]), fmaxf(warp_amax[2], warp_amax[3])), kQuantAmaxFloor);
  const int e = quant_exponent(amax);
  const int32_t row = static_cast<int32_t>(slot % f.block_size);
  uint8_t* page = f.cache + (slot / f.block_size) * f.block_stride;
  page[indexer_value_offset_in_page(IndexerLayout::Normal, row, d)] =
      quant_element(x, quant_inv_scale(e));
  if (d == 0) {
    const uint32_t w[1] = {float_bits(indexer_scale_of_exponent(e))};
    store_words(page + indexer_scale_offset_in_page(f.block_size, row), w);
  }
}

template <int D>
__device__ void finish_entry(const FinishArgs& f, const PoolArgs& a, int64_t i, int64_t pos,
                             float* c) {
  rms_norm_shared<D>(f, c);
  const int64_t window_start = (pos / a.ratio) * a.ratio;
  const int64_t slot = a.out_slots[i];
  if constexpr (D == kMlaHead) {
    store_mla_entry(f, slot, window_start, c);
  } else {
    store_indexer_entry(f, slot, window_start, c);
  }
}

// Single pass: one block of D threads per token, thread c pools channel c.
template <int D>
__global__ void __launch_bounds__(D) compress_single_kernel(const PoolArgs a, const FinishArgs f) {
  __shared__ EntryRows rows;
  __shared__ float c[D];
  for (int64_t i = blockIdx.x; i < a.num_tokens; i += gridDim.x) {
    int64_t pos = 0;
    if (!load_entry(a, i, &pos, &rows)) continue;
    c[threadIdx.x] = pool_channel(a, rows, threadIdx.x);
    __syncthreads();
    finish_entry<D>(f, a, i, pos, c);
    __syncthreads();  // rows and c are reused by the next token of this block
  }
}

// Stage 1: one block of 64 threads per (token, 64-channel tile) -> scratch [N, D].
__global__ void __launch_bounds__(kPoolTile) pool_stage_kernel(const PoolArgs a, float* scratch) {
  __shared__ EntryRows rows;
  const int tiles = a.head_dim / kPoolTile;
  for (int64_t item = blockIdx.x; item < a.num_tokens * tiles; item += gridDim.x) {
    const int64_t i = item / tiles;
    const int c = static_cast<int>(item % tiles) * kPoolTile + threadIdx.x;
    int64_t pos = 0;
    if (load_entry(a, i, &pos, &rows)) scratch[i * a.head_dim + c] = pool_channel(a, rows, c);
    __syncthreads();
  }
}

// Stage 2: one block of D threads per token, from the scratch row (tokens stage 1 skipped are
// skipped again by the same predicate, so unwritten scratch rows are never read).
template <int D>
__global__ void __launch_bounds__(D)
    finish_stage_kernel(const PoolArgs a, const FinishArgs f, const float* scratch) {
  __shared__ EntryRows rows;
  __shared__ float c[D];
  for (int64_t i = blockIdx.x; i < a.num_tokens; i += gridDim.x) {
    int64_t pos = 0;
    if (!load_entry(a, i, &pos, &rows)) continue;
    c[threadIdx.x] = scratch[i * D + threadIdx.x];
    __syncthreads();
    finish_entry<D>(f, a, i, pos, c);
    __syncthreads();
  }
}

// ---- host side ----------------------------------------------------------------------------------

template <typename Params>
PoolArgs pool_args(const Params& p, int32_t ratio, int32_t head_dim, int64_t out_capacity) {
  PoolArgs a{};
  a.positions = p.positions;
  a.request_index = p.request_index;
  a.state_slots = p.state_slots;
  a.out_slots = p.out_slots;
  a.num_tokens = p.num_tokens;
  a.num_requests = p.num_requests;
  a.state = p.state.base;
  a.state_capacity = p.state.num_blocks * int64_t{p.state.block_size};
  a.state_num_blocks = p.state.num_blocks;
  a.state_block_stride = p.state.block_stride;
  a.state_row_stride = p.state.row_stride;
  a.state_block_size = p.state.block_size;
  a.table_width = p.state_table_width;
  a.table = p.state_block_table;
  a.table_stride = p.state_table_stride;
  a.out_capacity = out_capacity;
  a.rope_rows = p.rope.rows;
  a.ratio = ratio;
  a.head_dim = head_dim;
  a.overlap = ratio == 4 ? 1 : 0;
  a.num_rows = (1 + a.overlap) * ratio;
  return a;
}

template <typename Params>
FinishArgs finish_args(const Params& p, uint8_t* cache, int64_t block_stride, int32_t block_size) {
  FinishArgs f{};
  f.norm_weight = p.norm_weight;
  f.eps = p.norm_eps;
  f.rope = p.rope.data;
  f.rope_stride = p.rope.row_stride;
  f.cache = cache;
  f.block_stride = block_stride;
  f.block_size = block_size;
  f.code_max = p.sanitise ? kCodeMaxSanitising : kCodeMaxLegacy;
  f.sanitise = p.sanitise;
  return f;
}

// Launches the single-pass or the two-stage form for head D.
template <int D>
void launch_compressor(const PoolArgs& a, const FinishArgs& f, float* scratch, void* stream,
                       const char* op) {
  static_assert(D % kPoolTile == 0);
  const cudaStream_t s = as_stream(stream);
  if (scratch == nullptr) {
    compress_single_kernel<D><<<grid_for(a.num_tokens), D, 0, s>>>(a, f);
  } else {
    pool_stage_kernel<<<grid_for(a.num_tokens * (D / kPoolTile)), kPoolTile, 0, s>>>(a, scratch);
    finish_stage_kernel<D><<<grid_for(a.num_tokens), D, 0, s>>>(a, f, scratch);
  }
  cuda::check_cuda(cudaGetLastError(), op);
}

__global__ void exp_kernel(const float* x, float* y, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    y[i] = exp_portable(x[i]);
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

void write_window(const WindowWriterParams& p) {
  if (p.num_tokens == 0) return;
  WindowArgs a{};
  a.kv = p.kv;
  a.kv_stride = p.kv_stride;
  a.positions = p.positions;
  a.slots = p.slots;
  a.rope = p.rope.data;
  a.rope_rows = p.rope.rows;
  a.rope_stride = p.rope.row_stride;
  a.cache = p.cache.base;
  a.num_slots = p.cache.num_blocks * int64_t{p.cache.block_size};
  a.block_stride = p.cache.block_stride;
  a.block_size = p.cache.block_size;
  a.code_max = p.sanitise ? kCodeMaxSanitising : kCodeMaxLegacy;
  a.num_tokens = p.num_tokens;
  a.sanitise = p.sanitise;
  const int blocks = grid_for((p.num_tokens + kWindowWarps - 1) / kWindowWarps);
  window_kernel<<<blocks, kWindowWarps * kWarpSize, 0, as_stream(p.stream)>>>(a);
  cuda::check_cuda(cudaGetLastError(), "write_window launch");
}

void write_compressor_state(const StateWriterParams& p) {
  if (p.num_tokens == 0) return;
  StateArgs a{};
  a.kv = p.kv;
  a.kv_stride = p.kv_stride;
  a.score = p.score;
  a.score_stride = p.score_stride;
  a.ape = p.ape;
  a.positions = p.positions;
  a.slots = p.state_slots;
  a.base = p.state.base;
  a.capacity = p.state.num_blocks * int64_t{p.state.block_size};
  a.block_stride = p.state.block_stride;
  a.row_stride = p.state.row_stride;
  a.block_size = p.state.block_size;
  a.ratio = p.ratio;
  a.width = (p.ratio == 4 ? 2 : 1) * int64_t{p.head_dim};
  a.num_tokens = p.num_tokens;
  a.vec4 = aligned16(p.kv) && aligned16(p.score) && (p.ape == nullptr || aligned16(p.ape)) &&
           aligned16(p.state.base) && p.kv_stride % 4 == 0 && p.score_stride % 4 == 0 &&
           p.state.block_stride % 4 == 0 && p.state.row_stride % 4 == 0 && a.width % 4 == 0;
  state_kernel<<<grid_for(p.num_tokens), kStateThreads, 0, as_stream(p.stream)>>>(a);
  cuda::check_cuda(cudaGetLastError(), "write_compressor_state launch");
}

void compress(const CompressorParams& p) {
  if (p.num_tokens == 0) return;
  const PoolArgs a =
      pool_args(p, p.ratio, kMlaHead, p.cache.num_blocks * int64_t{p.cache.block_size});
  const FinishArgs f = finish_args(p, p.cache.base, p.cache.block_stride, p.cache.block_size);
  launch_compressor<kMlaHead>(a, f, p.scratch, p.stream, "compress launch");
}

void compress_indexer(const IndexerCompressorParams& p) {
  if (p.num_tokens == 0) return;
  const PoolArgs a =
      pool_args(p, /*ratio=*/4, kIndexerHead, p.cache.num_blocks * int64_t{p.cache.block_size});
  const FinishArgs f = finish_args(p, p.cache.base, p.cache.block_stride, p.cache.block_size);
  launch_compressor<kIndexerHead>(a, f, p.scratch, p.stream, "compress_indexer launch");
}

void device_exp_portable(const float* x, float* y, int64_t n, void* stream) {
  if (n == 0) return;
  exp_kernel<<<grid_for((n + 255) / 256), 256, 0, as_stream(stream)>>>(x, y, n);
  cuda::check_cuda(cudaGetLastError(), "device_exp_portable launch");
}

}  // namespace sparsemla::cuda_generic
