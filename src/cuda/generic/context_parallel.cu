// src/cuda/generic/context_parallel.cu: the rank merge of decode context parallelism (CONTRACT
// 12.1) on the GPU. One warp per (t, h) row, 4 rows per 128-thread block, grid (T, ceil(H / 4)).
// Lane i holds columns 4 (i + 32 j) .. +3 for j = 0..3 (coalesced 8-byte bf16 / 16-byte fp32
// loads). The ranks' lse are loaded one per lane (32 at a time); every lane then sums the weights
// in rank order from shuffles, so the sums are the CPU backend's, operation for operation
// (src/core/merge_math.h): the outputs are bit-identical to it. Ranks are read two at a time (both
// loads in flight before either is accumulated, in order). Memory-bound: R*T*H*1 KiB (bf16) read,
// T*H*1 KiB written; at DCP sizes (R <= 8) it is ~1/R of the decode's own key bytes or less.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "core/merge_math.h"
#include "cuda/common/device_info.h"
#include "cuda/generic/context_parallel_backend.h"
#include "sparsemla/error.h"
#include "sparsemla/format.h"

namespace sparsemla::cuda_generic {

namespace {

constexpr int kDim = Fp8DsMla::kHeadDim;
constexpr int kNope = Fp8DsMla::kNopeDims;
constexpr int kRowsPerBlock = 4;  // warps
constexpr unsigned kFullMask = 0xFFFFFFFFu;

struct MergeArgs {
  int64_t num_tokens;
  int32_t num_heads, num_ranks;
  const uint16_t* rank_out;  // bf16 bits, or null
  const float* rank_out_f32;
  int64_t out_sr, out_st, out_sh;  // rank output strides (elements)
  int32_t in_vec;                  // rank outputs allow 8-byte (bf16) / 16-byte (fp32) loads
  const float* rank_lse;
  int64_t lse_sr, lse_st, lse_sh;
  const float* sink;
  const int64_t* positions;
  const float* rope;
  int64_t rope_rows, rope_stride;
  uint16_t* out;
  int64_t o_st, o_sh;
  int32_t out_vec;  // 8-byte stores of 4 bf16
  float* lse;
  int64_t l_st, l_sh;
};

// Columns c..c+3 of rank r's row (t, h), as fp32.
__device__ __forceinline__ float4 load4(const MergeArgs& a, int64_t row, int c) {
  if (a.rank_out != nullptr) {
    const uint16_t* src = a.rank_out + row + c;
    uint16_t b[4];
    if (a.in_vec) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(src));
      b[0] = static_cast<uint16_t>(v.x & 0xFFFFu);
      b[1] = static_cast<uint16_t>(v.x >> 16);
      b[2] = static_cast<uint16_t>(v.y & 0xFFFFu);
      b[3] = static_cast<uint16_t>(v.y >> 16);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = __ldg(src + i);
    }
    return make_float4(bf16_to_float(b[0]), bf16_to_float(b[1]), bf16_to_float(b[2]),
                       bf16_to_float(b[3]));
  }
  const float* src = a.rank_out_f32 + row + c;
  if (a.in_vec) return __ldg(reinterpret_cast<const float4*>(src));
  return make_float4(__ldg(src), __ldg(src + 1), __ldg(src + 2), __ldg(src + 3));
}

__device__ __forceinline__ void accumulate(float (&o)[16], float w, const float4 (&v)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    o[4 * j + 0] = merge::fadd(o[4 * j + 0], merge::fmul(w, v[j].x));
    o[4 * j + 1] = merge::fadd(o[4 * j + 1], merge::fmul(w, v[j].y));
    o[4 * j + 2] = merge::fadd(o[4 * j + 2], merge::fmul(w, v[j].z));
    o[4 * j + 3] = merge::fadd(o[4 * j + 3], merge::fmul(w, v[j].w));
  }
}

__device__ __forceinline__ float rank_lse(const MergeArgs& a, int32_t r, int64_t t, int32_t h) {
  return r < a.num_ranks ? __ldg(a.rank_lse + r * a.lse_sr + t * a.lse_st + h * a.lse_sh)
                         : merge::pos_inf();  // past the last rank: inactive
}

__global__ void __launch_bounds__(32 * kRowsPerBlock) merge_ranks_kernel(const MergeArgs a) {
  const int64_t t = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t h =
      static_cast<int32_t>(blockIdx.y) * kRowsPerBlock + static_cast<int32_t>(threadIdx.x) / 32;
  if (h >= a.num_heads) return;  // whole warps; no block-wide barrier below
  const int32_t R = a.num_ranks;

  // M' over the active ranks (exact whatever the order), then the sums in rank order.
  float max_m = merge::kNoMass;
  for (int32_t base = 0; base < R; base += 32) {
    max_m = merge::max_step(max_m, rank_lse(a, base + lane, t, h));
  }
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) max_m = fmaxf(max_m, __shfl_xor_sync(kFullMask, max_m, d));
  const bool has_sink = a.sink != nullptr;
  const float sink = has_sink ? __ldg(a.sink + h) : 0.0f;
  const float big_m = merge::big_max(max_m, has_sink, sink);
  float sum_w = 0.0f, sum_l = 0.0f;
  for (int32_t base = 0; base < R; base += 32) {
    const float l = rank_lse(a, base + lane, t, h);
    const float w = merge::weight(l, big_m), wl = merge::weight(l, max_m);
    const int n = R - base < 32 ? R - base : 32;
    for (int i = 0; i < n; ++i) {
      sum_w = merge::fadd(sum_w, __shfl_sync(kFullMask, w, i));
      sum_l = merge::fadd(sum_l, __shfl_sync(kFullMask, wl, i));
    }
  }
  if (a.lse != nullptr && lane == 0) {
    a.lse[t * a.l_st + h * a.l_sh] = merge::merged_lse(max_m, sum_l);
  }
  const merge::Finish f = merge::finish(sum_w, has_sink, sink, big_m);

  float o[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) o[k] = 0.0f;
  const bool special = f.nan_row || f.zero_row;
  if (special) {
#pragma unroll
    for (int k = 0; k < 16; ++k) o[k] = f.nan_row ? merge::quiet_nan() : 0.0f;
  } else {
    const int64_t row0 = t * a.out_st + h * a.out_sh;
    for (int32_t base = 0; base < R; base += 32) {
      const float w = merge::weight(rank_lse(a, base + lane, t, h), big_m);
      const int n = R - base < 32 ? R - base : 32;
      for (int i = 0; i < n; i += 2) {
        // Two ranks' loads in flight, then accumulated in rank order (skipping weight 0: an
        // inactive or underflowed rank is not read).
        const float w0 = __shfl_sync(kFullMask, w, i);
        const float w1 = __shfl_sync(kFullMask, w, i + 1 < n ? i + 1 : i);
        const bool has1 = i + 1 < n && w1 != 0.0f;
        float4 v0[4], v1[4];
        const int64_t r0 = row0 + (base + i) * a.out_sr, r1 = r0 + a.out_sr;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = 4 * (lane + 32 * j);
          v0[j] = w0 != 0.0f ? load4(a, r0, c) : make_float4(0.f, 0.f, 0.f, 0.f);
          v1[j] = has1 ? load4(a, r1, c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        if (w0 != 0.0f) accumulate(o, w0, v0);
        if (has1) accumulate(o, w1, v1);
      }
    }
#pragma unroll
    for (int k = 0; k < 16; ++k) o[k] = merge::fdiv(o[k], f.div);
    if (a.positions != nullptr && lane >= 16) {  // j = 3, lanes 16..31: columns 448..511
      int64_t pos = __ldg(a.positions + t);
      pos = pos < 0 ? 0 : (pos >= a.rope_rows ? a.rope_rows - 1 : pos);
      const float* cs = a.rope + pos * a.rope_stride;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int pair = (4 * (lane + 96) - kNope) / 2 + e;
        merge::inverse_rope_pair(o[12 + 2 * e], o[13 + 2 * e], __ldg(cs + pair),
                                 __ldg(cs + 32 + pair));
      }
    }
  }
  uint16_t* dst = a.out + t * a.o_st + h * a.o_sh;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = 4 * (lane + 32 * j);
    uint16_t b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) b[i] = float_to_bf16(o[4 * j + i]);
    if (a.out_vec) {
      *reinterpret_cast<uint2*>(dst + c) = make_uint2(uint32_t{b[0]} | (uint32_t{b[1]} << 16),
                                                      uint32_t{b[2]} | (uint32_t{b[3]} << 16));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) dst[c + i] = b[i];
    }
  }
}

bool multiple_of(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

}  // namespace

void merge_ranks(const RankMergeParams& p) {
  SPARSEMLA_CHECK_ARG(p.num_tokens <= INT_MAX, "merge_ranks", "num_tokens",
                      "<= 2^31-1 on the CUDA path (the grid's x extent)", p.num_tokens);
  MergeArgs a{};
  a.num_tokens = p.num_tokens;
  a.num_heads = p.num_heads;
  a.num_ranks = p.num_ranks;
  a.rank_out = p.rank_out;
  a.rank_out_f32 = p.rank_out_f32;
  a.out_sh = p.rank_out_stride_head;
  a.out_st = p.rank_out_stride_token != 0 ? p.rank_out_stride_token : p.num_heads * int64_t{kDim};
  a.out_sr = p.rank_out_stride_rank != 0 ? p.rank_out_stride_rank : p.num_tokens * a.out_st;
  // 4 values per load: 8 bytes of bf16, 16 bytes of fp32; every row offset a multiple of 4.
  const bool bf16 = p.rank_out != nullptr;
  const void* base = bf16 ? static_cast<const void*>(p.rank_out) : p.rank_out_f32;
  a.in_vec = multiple_of(base, bf16 ? 8 : 16) && a.out_sh % 4 == 0 && a.out_st % 4 == 0 &&
             a.out_sr % 4 == 0;
  a.rank_lse = p.rank_lse;
  a.lse_sh = p.rank_lse_stride_head;
  a.lse_st = p.rank_lse_stride_token != 0 ? p.rank_lse_stride_token : p.num_heads;
  a.lse_sr = p.rank_lse_stride_rank != 0 ? p.rank_lse_stride_rank : p.num_tokens * a.lse_st;
  a.sink = p.sink;
  a.positions = p.positions;
  a.rope = p.rope.data;
  a.rope_rows = p.rope.rows;
  a.rope_stride = p.rope.row_stride;
  a.out = p.out;
  a.o_sh = p.out_stride_head;
  a.o_st = p.out_stride_token != 0 ? p.out_stride_token : p.num_heads * int64_t{kDim};
  a.out_vec = multiple_of(p.out, 8) && a.o_sh % 4 == 0 && a.o_st % 4 == 0;
  a.lse = p.lse;
  a.l_sh = p.lse_stride_head;
  a.l_st = p.lse_stride_token != 0 ? p.lse_stride_token : p.num_heads;
  const dim3 grid(static_cast<unsigned>(p.num_tokens),
                  static_cast<unsigned>((p.num_heads + kRowsPerBlock - 1) / kRowsPerBlock));
  merge_ranks_kernel<<<grid, 32 * kRowsPerBlock, 0, static_cast<cudaStream_t>(p.stream)>>>(a);
  cuda::check_cuda(cudaGetLastError(), "merge_ranks_kernel launch");
}

}  // namespace sparsemla::cuda_generic
