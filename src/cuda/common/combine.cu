// src/cuda/common/combine.cu: the split-K combine both CUDA decode paths launch (CONTRACT 4.3 /
// 4.3a). Grid (T, H), 128 threads x 4 columns. On sm_90+ it is launched with programmatic
// dependent launch, so its launch overlaps the partial kernel, and it waits for the partials in
// griddepcontrol.wait; its loads of all splits' m, l (then acc) are in flight together (two L2
// round trips for S <= 16).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/tuning.h"
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

// ---- the lean combine: warps per head sized by S, 16-byte loads ---------------------------------
// Where acc is 16-byte aligned and S <= 16. A head row is W = max(1, kN / 4) warps; each thread
// takes 4 / W chunks of 4 columns (lane-consecutive: coalesced 16-byte loads), so every split's
// loads of all chunks stay in flight together (kN x 4 / W = 16 float4 per thread). Split s's
// (m, l) is loaded by lane s alone and shuffled to the warp; the finish inputs the decode kernel
// does not write (sink, the RoPE cos / sin) are loaded before griddepcontrol.wait. Same
// arithmetic, in the same order, as combine_small: the outputs are bit-identical to it. Why:
// by differences the one-row kernel costs 7-8 us of a graph-replayed call (docs/lab/sm90-path.md,
// record 2026-12-02T2313Z) while its bytes take ~2-3 us; its ~670 instructions per warp are
// mostly every thread recomputing the row's split weights and 64-bit addresses for 4 columns.
constexpr int kLeanThreads = 256;  // 8 warps

template <int kN>
constexpr int lean_warps_per_head() {
  return kN <= 4 ? 1 : kN / 4;
}

template <int kN>
__global__ void __launch_bounds__(kLeanThreads)
    decode_combine_lean_kernel(const __grid_constant__ CombineParams p) {
  constexpr int kW = lean_warps_per_head<kN>();
  constexpr int kHeadsPerBlock = kLeanThreads / 32 / kW;
  constexpr int kChunks = 4 / kW;  // chunks of 4 columns per thread
  const int64_t t = blockIdx.x;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t h = static_cast<int32_t>(blockIdx.y) * kHeadsPerBlock + warp / kW;
  if (h >= p.num_heads) return;           // whole warps; no block-wide barrier below
  const int q = (warp % kW) * 32 + lane;  // thread within the head row: chunk q + 32 kW j
  const FinishParams& f = p.finish;
  const bool rope = f.positions != nullptr;
  float2 cs[kChunks][2];  // cos / sin of the chunk's two pairs (RoPE dims only)
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int col = 4 * (q + 32 * kW * j);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int d = col + 2 * e;
      cs[j][e] = rope && d >= Fp8DsMla::kNopeDims
                     ? rope_cos_sin(f, t, (d - Fp8DsMla::kNopeDims) / 2)
                     : make_float2(1.f, 0.f);
    }
  }
  if (f.sink != nullptr) (void)sink_value(f.sink, h);  // into L1 for finish_splits' reads
  const int32_t S = p.num_splits, H = p.num_heads;
  const int64_t row0 = t * S * H + h;  // split s at row0 + s*H
  wait_for_partials();
  const float my_m = lane < S ? __ldcg(p.ws_m + row0 + lane * H) : kNoScore;
  const float my_l = lane < S ? __ldcg(p.ws_l + row0 + lane * H) : 0.0f;
  float m[kN], l[kN];
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    m[s] = __shfl_sync(0xFFFFFFFFu, my_m, s);
    l[s] = __shfl_sync(0xFFFFFFFFu, my_l, s);
  }
  const SplitsFinish fin = finish_splits(m, l, f.sink, h);
  float o[kChunks][4];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  if (fin.factor != 0.0f) {
    const float seed = finish_seed(fin.factor);
    float4 v[kN][kChunks];
#pragma unroll
    for (int s = 0; s < kN; ++s) {
      const float4* src = reinterpret_cast<const float4*>(p.ws_acc + (row0 + s * H) * kDim) + q;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        // Inactive splits: acc never read (stale NaN/Inf).
        v[s][j] = m[s] != kNoScore ? __ldcg(src + 32 * kW * j) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = seed;
#pragma unroll
    for (int s = 0; s < kN; ++s) {
      if (m[s] == kNoScore) continue;
      const float c = split_weight(m[s], fin.big_m) * fin.factor;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        o[j][0] += c * v[s][j].x;
        o[j][1] += c * v[s][j].y;
        o[j][2] += c * v[s][j].z;
        o[j][3] += c * v[s][j].w;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int col = 4 * (q + 32 * kW * j);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float a = o[j][2 * e], b = o[j][2 * e + 1];
      const int d = col + 2 * e;
      if (rope && d >= Fp8DsMla::kNopeDims) inverse_rope(a, b, cs[j][e]);
      store_out_value_pair(f, t, h, d, a, b);
    }
  }
  if (q == 0) store_lse(f, t, h, finish_lse(fin.max_m, fin.sum_l));
}

// The lean kernel for S <= kN, if the tuning and the workspace allow it.
bool launch_lean_combine(const CombineParams& cp, cudaLaunchConfig_t cfg) {
  const int32_t S = cp.num_splits;
  if ((reinterpret_cast<uintptr_t>(cp.ws_acc) & 15) != 0 || S > kCombineFast ||
      !core::tuning().combine_lean) {
    return false;
  }
  const auto launch = [&](auto kernel, int warps_per_head) {
    const int heads_per_block = kLeanThreads / 32 / warps_per_head;
    cfg.gridDim =
        dim3(static_cast<unsigned>(cp.num_tokens),
             static_cast<unsigned>((cp.num_heads + heads_per_block - 1) / heads_per_block));
    cfg.blockDim = dim3(kLeanThreads);
    cuda::check_cuda(cudaLaunchKernelEx(&cfg, kernel, cp), "decode_combine_lean_kernel launch");
  };
  if (S <= 2) {
    launch(decode_combine_lean_kernel<2>, lean_warps_per_head<2>());
  } else if (S <= 4) {
    launch(decode_combine_lean_kernel<4>, lean_warps_per_head<4>());
  } else if (S <= 8) {
    launch(decode_combine_lean_kernel<8>, lean_warps_per_head<8>());
  } else {
    launch(decode_combine_lean_kernel<kCombineFast>, lean_warps_per_head<kCombineFast>());
  }
  return true;
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
  if (launch_lean_combine(cp, cfg)) return;
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
