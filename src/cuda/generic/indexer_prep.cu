// src/cuda/generic/indexer_prep.cu: the portable CUDA indexer query prep (CONTRACT 11.6), sm_80
// and newer (also compiled in the sm_90a build).
//
// One warp per (t, h) row, over a grid-stride loop of T * H rows (256 threads: 8 rows per CTA at a
// time). Lane l owns dims [4l, 4l + 4): lanes 0..15 the 64 unrotated dims, lanes 16..31 the 32
// GPT-J pairs of dims 64..127 (two pairs each). Per row, exactly the CPU backend's operations
// (src/cpu/indexer_prep.cpp):
//   1. x = fp32(bf16 q); the rotated lanes apply the forward formula of CONTRACT 1,
//      a' = a*c - b*s, b' = a*s + b*c, every product and sum rounded on its own (__fmul_rn,
//      __fsub_rn, __fadd_rn: nvcc cannot contract them into FMAs the CPU does not do), then round
//      to bf16 (float_to_bf16, RNE, NaN kept).
//   2. amax: per lane `|x| > amax` (NaN ignored, as quant_amax), then a warp max of the
//      non-negative lane maxima (order-free), floored at 1e-4; e = quant_exponent(amax) from the
//      bits (exact ceil(log2(amax / 448)), +inf for a row holding +-inf).
//   3. bytes = quant_element(x, 2^-e) (clamp to +-448, NaN -> -448, e4m3 RNE): the shared
//      host/device codec of sparsemla/numerics.h.
//   4. lane 0: w = ((fp32(w_raw) * 2^e) * 128^-0.5) * 64^-0.5, three rounded products, 2^e from
//      indexer_scale_of_exponent (+inf for e = +inf) and 128^-0.5 the CPU's fp32 constant, passed
//      from the host.
// A row whose position is < 0 (padding) or >= rope.rows (the CPU rejects it; device values are
// never an error here) is written as 128 zero bytes and weight +0; nothing outside the rows is
// written. Offsets are int64 (T up to 2^40).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "cuda/common/device_info.h"
#include "cuda/generic/indexer_prep_backend.h"
#include "sparsemla/indexer.h"
#include "sparsemla/numerics.h"

namespace sparsemla::cuda_generic {

namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kWarpSize = 32;
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarpSize;
constexpr int kDim = kIndexerHeadDim;  // 128
constexpr int kRopeStart = 64;         // dims 64..127 are rotated
constexpr int kRopePairs = 32;
constexpr int kRopeLane0 = kRopeStart / 4;  // lane 16: the first rotated lane
constexpr int64_t kMaxGrid = std::numeric_limits<int32_t>::max();

struct PrepArgs {
  const bf16_bits* q;
  int64_t q_stride_token, q_stride_head;  // elements
  const int64_t* positions;
  const float* rope;
  int64_t rope_rows, rope_stride;
  const bf16_bits* w_raw;
  int64_t w_raw_stride;  // elements
  uint8_t* q_out;
  int64_t q_out_stride_token, q_out_stride_head;  // bytes
  float* w_out;
  int64_t w_out_stride;  // elements
  int64_t num_tokens;
  int32_t num_heads;
  float inv_sqrt_head_dim;  // the CPU's fp32 128^-0.5
};

__device__ __forceinline__ bool aligned_to(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// The lane's 4 bf16 values: one 8-byte load when the address allows it, else 4 loads.
__device__ __forceinline__ void load_bf16x4(const bf16_bits* src, float (&x)[4]) {
  if (aligned_to(src, 8)) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(src));
    x[0] = bf16_to_float(static_cast<bf16_bits>(v.x & 0xFFFFu));
    x[1] = bf16_to_float(static_cast<bf16_bits>(v.x >> 16));
    x[2] = bf16_to_float(static_cast<bf16_bits>(v.y & 0xFFFFu));
    x[3] = bf16_to_float(static_cast<bf16_bits>(v.y >> 16));
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] = bf16_to_float(__ldg(src + j));
}

// 4 bytes little-endian at dst: one word store when aligned, else bytes.
__device__ __forceinline__ void store_bytes4(uint8_t* dst, uint32_t w) {
  if (aligned_to(dst, 4)) {
    *reinterpret_cast<uint32_t*>(dst) = w;
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<uint8_t>(w >> (8 * i));
}

// Forward RoPE of one pair as rope_forward_pair on the host, no FMA.
__device__ __forceinline__ void rope_pair(float& a, float& b, float c, float s) {
  const float na = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  const float nb = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  a = na;
  b = nb;
}

__global__ void __launch_bounds__(kThreads) indexer_q_prep_kernel(const PrepArgs a) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t rows = a.num_tokens * a.num_heads;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
       row < rows; row += warps) {
    // Warp-uniform from here on: every lane holds the same (t, h, pos).
    const int64_t t = row / a.num_heads;
    const int32_t h = static_cast<int32_t>(row % a.num_heads);
    uint8_t* bytes = a.q_out + t * a.q_out_stride_token + h * a.q_out_stride_head + 4 * lane;
    float* w = a.w_out + t * a.w_out_stride + h;
    const int64_t pos = __ldg(a.positions + t);
    if (pos < 0 || pos >= a.rope_rows) {  // padding row (>= rope.rows: the CPU rejects it)
      store_bytes4(bytes, 0u);
      if (lane == 0) *w = 0.0f;
      continue;
    }
    float x[4];
    load_bf16x4(a.q + t * a.q_stride_token + h * a.q_stride_head + 4 * lane, x);
    if (lane >= kRopeLane0) {
      const float* cs = a.rope + pos * a.rope_stride;
      const int k0 = 2 * (lane - kRopeLane0);  // pairs k0 (dims 4l, 4l+1) and k0+1
      rope_pair(x[0], x[1], __ldg(cs + k0), __ldg(cs + kRopePairs + k0));
      rope_pair(x[2], x[3], __ldg(cs + k0 + 1), __ldg(cs + kRopePairs + k0 + 1));
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = round_to_bf16(x[j]);
    }
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float v = fabsf(x[j]);
      if (v > amax) amax = v;  // NaN ignored (quant_amax)
    }
    for (int m = kWarpSize / 2; m > 0; m /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, m));  // non-negative: order-free
    }
    amax = amax > kQuantAmaxFloor ? amax : kQuantAmaxFloor;
    const int e = quant_exponent(amax);
    const float inv = quant_inv_scale(e);
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) word |= static_cast<uint32_t>(quant_element(x[j], inv)) << (8 * j);
    store_bytes4(bytes, word);
    if (lane == 0) {
      const float w_raw = bf16_to_float(__ldg(a.w_raw + t * a.w_raw_stride + h));
      *w = __fmul_rn(__fmul_rn(__fmul_rn(w_raw, indexer_scale_of_exponent(e)), a.inv_sqrt_head_dim),
                     0.125f);
    }
  }
}

}  // namespace

void indexer_q_prep(const IndexerQPrepParams& p) {
  const int64_t T = p.num_tokens, H = p.num_heads;
  if (T == 0) return;
  PrepArgs a{};
  a.q = p.q;
  a.q_stride_token = p.q_stride_token != 0 ? p.q_stride_token : H * kDim;
  a.q_stride_head = p.q_stride_head != 0 ? p.q_stride_head : kDim;
  a.positions = p.positions;
  a.rope = p.rope.data;
  a.rope_rows = p.rope.rows;
  a.rope_stride = p.rope.row_stride;
  a.w_raw = p.w_raw;
  a.w_raw_stride = p.w_raw_stride != 0 ? p.w_raw_stride : H;
  a.q_out = p.q_out;
  a.q_out_stride_token = p.q_out_stride_token != 0 ? p.q_out_stride_token : H * kDim;
  a.q_out_stride_head = p.q_out_stride_head != 0 ? p.q_out_stride_head : kDim;
  a.w_out = p.w_out;
  a.w_out_stride = p.w_out_stride != 0 ? p.w_out_stride : H;
  a.num_tokens = T;
  a.num_heads = p.num_heads;
  a.inv_sqrt_head_dim = static_cast<float>(1.0 / std::sqrt(128.0));  // as the CPU's constant
  const int64_t blocks = (T * H + kRowsPerBlock - 1) / kRowsPerBlock;
  indexer_q_prep_kernel<<<static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid), kThreads, 0,
                          static_cast<cudaStream_t>(p.stream)>>>(a);
  cuda::check_cuda(cudaGetLastError(), "indexer_q_prep_kernel launch");
}

}  // namespace sparsemla::cuda_generic
