// src/cuda/common/combine.cu: the split-K combine both CUDA decode paths launch (CONTRACT 4.3 /
// 4.3a). Grid (T, H), 128 threads x 4 columns. On sm_90+ it is launched with programmatic
// dependent launch, so its launch overlaps the partial kernel, and it waits for the partials in
// griddepcontrol.wait; its loads of all splits' m, l (then acc) are in flight together (two L2
// round trips for S <= 16).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_common.cuh"
#include "cuda/common/decode_params.cuh"
#include "cuda/common/device_info.h"

namespace sparsemla::cuda {
namespace {

constexpr int kDim = Fp8DsMla::kHeadDim;  // 512

struct CombineParams {
  int64_t num_tokens;
  int32_t num_heads;
  int32_t num_splits;
  const float* ws_m;
  const float* ws_l;
  const float* ws_acc;
  FinishParams finish;
};

// ---- the combine kernel ------------------------------------------------------------------------
constexpr int kCombineThreads = 128;  // x 4 columns
constexpr int kCombineFast = 16;      // S up to this: every split's loads in flight together

// Waits until the partial kernel (the programmatic primary) has completed and its writes are
// visible; returns at once when launched without programmatic serialisation or before sm_90.
__device__ __forceinline__ void wait_for_partials() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// S <= kN (kN = 2, 4, 8 or kCombineFast): m and l of all splits in one round trip, then the active
// splits' acc in a second one. Same arithmetic as the general loop below. Sized by kN, not by
// kCombineFast: one size for every S took 106 registers, 3.4 warps per scheduler and 1.05 TB/s
// (ncu, C4-Flash B = 32 S = 4, 2026-12-02).
template <int kN>
__device__ __forceinline__ void combine_small(const CombineParams& p, int64_t row0, int32_t h,
                                              int col, float (&o)[4], float* max_m_out,
                                              float* sum_l_out) {
  const int32_t S = p.num_splits, H = p.num_heads;
  float m[kN], l[kN];
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    m[s] = s < S ? __ldcg(p.ws_m + row0 + s * H) : kNoScore;
    l[s] = s < S ? __ldcg(p.ws_l + row0 + s * H) : 0.0f;
  }
  const SplitsFinish fin = finish_splits(m, l, p.finish.sink, h);
  const float big_m = fin.big_m, factor = fin.factor;
  if (factor != 0.0f) {
    o[0] = o[1] = o[2] = o[3] = finish_seed(factor);
    // Inactive splits: acc never read (stale NaN/Inf). The workspace is only 8-byte aligned.
    float2 v0[kN], v1[kN];
#pragma unroll
    for (int s = 0; s < kN; ++s) {
      const float2* src = reinterpret_cast<const float2*>(p.ws_acc + (row0 + s * H) * kDim + col);
      v0[s] = m[s] != kNoScore ? __ldcg(src) : make_float2(0.f, 0.f);
      v1[s] = m[s] != kNoScore ? __ldcg(src + 1) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int s = 0; s < kN; ++s) {
      if (m[s] == kNoScore) continue;
      const float c = split_weight(m[s], big_m) * factor;
      o[0] += c * v0[s].x;
      o[1] += c * v0[s].y;
      o[2] += c * v1[s].x;
      o[3] += c * v1[s].y;
    }
  }
  *max_m_out = fin.max_m;
  *sum_l_out = fin.sum_l;
}

__device__ __forceinline__ void combine_any(const CombineParams& p, int64_t row0, int32_t h,
                                            int col, float (&o)[4], float* max_m_out,
                                            float* sum_l_out) {
  const int32_t S = p.num_splits, H = p.num_heads;
  float max_m = kNoScore;
  for (int32_t s = 0; s < S; ++s) max_m = fmaxf(max_m, __ldcg(p.ws_m + row0 + s * H));
  const float big_m = finish_max(max_m, p.finish.sink, h);
  float sum_wl = 0.f, sum_l = 0.f;
  for (int32_t s = 0; s < S; ++s) {
    const float m = __ldcg(p.ws_m + row0 + s * H), l = __ldcg(p.ws_l + row0 + s * H);
    sum_wl += split_weight(m, big_m) * l;
    sum_l += split_weight(m, max_m) * l;
  }
  const float factor = finish_factor(sum_wl, big_m, p.finish.sink, h);
  if (factor != 0.0f) {
    o[0] = o[1] = o[2] = o[3] = finish_seed(factor);
    for (int32_t s = 0; s < S; ++s) {
      const int64_t row = row0 + s * H;
      const float m = __ldcg(p.ws_m + row);
      if (m == kNoScore) continue;  // inactive: its acc may hold stale NaN/Inf
      const float c = split_weight(m, big_m) * factor;
      const float2* src = reinterpret_cast<const float2*>(p.ws_acc + row * kDim + col);
      const float2 v0 = __ldcg(src), v1 = __ldcg(src + 1);
      o[0] += c * v0.x;
      o[1] += c * v0.y;
      o[2] += c * v1.x;
      o[3] += c * v1.y;
    }
  }
  *max_m_out = max_m;
  *sum_l_out = sum_l;
}

// kN > 0: S <= kN splits (combine_small<kN>); kN == 0: any S (combine_any). One kernel per kN, so
// that each is register-allocated for its own arrays.
template <int kN>
__global__ void __launch_bounds__(kCombineThreads)
    decode_combine_kernel(const __grid_constant__ CombineParams p) {
  const int64_t t = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int col = 4 * threadIdx.x;
  const int64_t row0 = t * p.num_splits * p.num_heads + h;  // split s at row0 + s*H
  wait_for_partials();
  float o[4] = {0.f, 0.f, 0.f, 0.f}, max_m, sum_l;
  if constexpr (kN > 0) {
    combine_small<kN>(p, row0, h, col, o, &max_m, &sum_l);
  } else {
    combine_any(p, row0, h, col, o, &max_m, &sum_l);
  }
  store_out_pair(p.finish, t, h, col, o[0], o[1]);
  store_out_pair(p.finish, t, h, col + 2, o[2], o[3]);
  if (threadIdx.x == 0) store_lse(p.finish, t, h, finish_lse(max_m, sum_l));
}

void launch_combine_kernel(const CombineParams& cp, bool pdl, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(cp.num_tokens), static_cast<unsigned>(cp.num_heads));
  cfg.blockDim = dim3(kCombineThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const int32_t S = cp.num_splits;
  auto* kernel = S <= 2              ? decode_combine_kernel<2>
                 : S <= 4            ? decode_combine_kernel<4>
                 : S <= 8            ? decode_combine_kernel<8>
                 : S <= kCombineFast ? decode_combine_kernel<kCombineFast>
                                     : decode_combine_kernel<0>;
  cuda::check_cuda(cudaLaunchKernelEx(&cfg, kernel, cp), "decode_combine_kernel launch");
}

}  // namespace

void launch_combine(const DecodeKernelParams& k, cudaStream_t stream) {
  const CombineParams cp{k.num_tokens, k.num_heads, k.num_splits, k.ws_m,
                         k.ws_l,       k.ws_acc,    k.finish};
  // Programmatic dependent launch exists from sm_90 on.
  int32_t major = 0, minor = 0;
  current_device_cc(&major, &minor);
#if defined(SPARSEMLA_LAB_NO_COMBINE)  // src/core/tuning.h: wrong outputs, for time differences
#pragma message("SPARSEMLA_LAB_NO_COMBINE: the split combine is not launched (outputs wrong)")
  return;
#endif
  launch_combine_kernel(cp, major >= 9, stream);
}

}  // namespace sparsemla::cuda
