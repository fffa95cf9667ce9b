// src/cuda/generic/decode_generic.cu: the portable CUDA sparse decode (CONTRACT 4), sm_80 and
// newer.
//
// Partial kernel (decode_partial.cuh), grid (T, S, ceil(hb / HB)), 256 threads: one CTA per query
// row, split and group of HB head blocks (HB = 4, 2 or 1; 16 heads per block), chosen on the host
// from the grid size (fewer heads per CTA when the grid would leave SMs idle) and the device's
// shared memory. S always comes from plan_generic (CONTRACT 4.4). HB = 4 on devices with >= 206 KiB
// of shared memory per block and an sm_90+ cubin runs the warp-specialised shape instead
// (decode_partial_ws.cuh, 384 threads; same outputs bit for bit).
// Combine kernel, grid (T, H), 128 threads x 4 columns: CONTRACT 4.3 / 4.3a. On sm_90+ it is
// launched with programmatic dependent launch, so its launch overlaps the partial kernel, and it
// waits for the partials in griddepcontrol.wait; its loads of all splits' m, l (then acc) are in
// flight together (two L2 round trips for S <= 16).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/tuning.h"
#include "cuda/common/decode_common.cuh"
#include "cuda/common/decode_params.cuh"
#include "cuda/common/device_info.h"
#include "cuda/common/numerics_selfcheck.h"
#include "cuda/generic/decode_partial.cuh"
#include "cuda/generic/decode_partial_ws.cuh"
#include "cuda/generic/generic_backend.h"
#include "sparsemla/error.h"
#include "sparsemla/plan.h"

namespace sparsemla::cuda_generic {

namespace {

using cuda::DeviceCache;
using cuda::DeviceList;
using cuda::FinishParams;
using cuda::kNoScore;
using partial::Cfg;
using partial::PartialParams;

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

struct InverseRopeParams {
  __nv_bfloat16* x;
  int64_t num_tokens;
  int32_t num_heads;
  int64_t stride_token;
  int64_t stride_head;
  FinishParams rope;  // positions / rope table only
};

// ---- the partial kernel ------------------------------------------------------------------------
template <int HB>
__global__ void __launch_bounds__(partial::kThreads, Cfg<HB>::kMinBlocksPerSm)
    decode_partial_kernel(const __grid_constant__ PartialParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  partial::partial_body<HB>(p, smem_raw);
}

// HB = 4 where shared memory allows: the warp-specialised shape (decode_partial_ws.cuh), 384
// threads, at most 168 registers each. Its body is compiled for sm_90+ only (the devices with its
// 206 KiB of shared memory per block); the host launches it only when the loaded cubin is one of
// those (LaunchFacts::ws).
__global__ void __launch_bounds__(partial_ws::kThreads, 1)
    decode_partial_ws_kernel(const __grid_constant__ PartialParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem_raw[];
  partial_ws::partial_ws_body(p, smem_raw);
#endif
}

// ---- fast-path selfcheck (numerics_selfcheck.h) ------------------------------------------------
// The kernels' own predicates on rows of zero data bytes with the given scale words: one word per
// thread, counted when every thread of the key would take the fast conversion.
__global__ void rows_fast_count_kernel(const uint2* words, int64_t n, bool ws, uint32_t* count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  bool fast = true;
  if (ws) {
    partial_ws::Rows9 rc{};
    rc.scale = words[i];
    fast = partial_ws::rows9_fast(rc);
  } else {
    partial::RowChunks rc{};
    rc.scale = words[i];
    for (int r = 0; r < partial::kThreadsPerKey; ++r) fast = fast && partial::rows_fast(rc, r, 0u);
  }
  if (fast) atomicAdd(count, 1u);
}

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

// S <= kCombineFast: m and l of all splits in one round trip, then the active splits' acc in a
// second one. Same arithmetic as the general loop below.
__device__ __forceinline__ void combine_small(const CombineParams& p, int64_t row0, int32_t h,
                                              int col, float (&o)[4], float* max_m_out,
                                              float* sum_l_out) {
  const int32_t S = p.num_splits, H = p.num_heads;
  float m[kCombineFast], l[kCombineFast];
#pragma unroll
  for (int s = 0; s < kCombineFast; ++s) {
    m[s] = s < S ? __ldcg(p.ws_m + row0 + s * H) : kNoScore;
    l[s] = s < S ? __ldcg(p.ws_l + row0 + s * H) : 0.0f;
  }
  const cuda::SplitsFinish fin = cuda::finish_splits(m, l, p.finish.sink, h);
  const float big_m = fin.big_m, factor = fin.factor;
  if (factor != 0.0f) {
    // Inactive splits: acc never read (stale NaN/Inf). The workspace is only 8-byte aligned.
    float2 v0[kCombineFast], v1[kCombineFast];
#pragma unroll
    for (int s = 0; s < kCombineFast; ++s) {
      const float2* src = reinterpret_cast<const float2*>(p.ws_acc + (row0 + s * H) * kDim + col);
      v0[s] = m[s] != kNoScore ? __ldcg(src) : make_float2(0.f, 0.f);
      v1[s] = m[s] != kNoScore ? __ldcg(src + 1) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int s = 0; s < kCombineFast; ++s) {
      if (m[s] == kNoScore) continue;
      const float c = cuda::split_weight(m[s], big_m) * factor;
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
  const float big_m = cuda::finish_max(max_m, p.finish.sink, h);
  float sum_wl = 0.f, sum_l = 0.f;
  for (int32_t s = 0; s < S; ++s) {
    const float m = __ldcg(p.ws_m + row0 + s * H), l = __ldcg(p.ws_l + row0 + s * H);
    sum_wl += cuda::split_weight(m, big_m) * l;
    sum_l += cuda::split_weight(m, max_m) * l;
  }
  const float factor = cuda::finish_factor(sum_wl, big_m, p.finish.sink, h);
  if (factor != 0.0f) {
    for (int32_t s = 0; s < S; ++s) {
      const int64_t row = row0 + s * H;
      const float m = __ldcg(p.ws_m + row);
      if (m == kNoScore) continue;  // inactive: its acc may hold stale NaN/Inf
      const float c = cuda::split_weight(m, big_m) * factor;
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

__global__ void __launch_bounds__(kCombineThreads)
    decode_combine_kernel(const __grid_constant__ CombineParams p) {
  const int64_t t = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int col = 4 * threadIdx.x;
  const int64_t row0 = t * p.num_splits * p.num_heads + h;  // split s at row0 + s*H
  wait_for_partials();
  float o[4] = {0.f, 0.f, 0.f, 0.f}, max_m, sum_l;
  if (p.num_splits <= kCombineFast) {
    combine_small(p, row0, h, col, o, &max_m, &sum_l);
  } else {
    combine_any(p, row0, h, col, o, &max_m, &sum_l);
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
  DeviceCache d{};
  d.base = c.base;
  d.num_slots = c.num_blocks * static_cast<int64_t>(c.block_size);
  d.block_stride = c.block_stride;
  d.block_size = c.block_size;
  d.aligned16 = aligned(c.base, Fp8DsMla::kFastAlign) && c.block_stride % Fp8DsMla::kFastAlign == 0;
  cuda::slot_divider(c.block_size > 0 ? c.block_size : 1, &d.slot_magic, &d.slot_shift);
  return d;
}

DeviceList device_list(const IndexList& l) {
  if (!l.dense()) return {l.indices, l.indptr, l.capacity, 0, nullptr, 1, 0};
  return {l.indices,
          nullptr,
          l.capacity,
          l.dense_stride != 0 ? l.dense_stride : l.width,
          l.lengths,
          l.rows_per_length,
          static_cast<int32_t>(l.width)};
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
  f.out_chunk_aligned = aligned(p.out, 16) && out_token % 8 == 0 && p.out_stride_head % 8 == 0;
  f.lse = p.lse;
  f.lse_stride_token = p.lse_stride_token != 0 ? p.lse_stride_token : p.num_heads;
  f.lse_stride_head = p.lse_stride_head;
  f.lse_group = p.lse_group;
  f.lse_stride_group =
      p.lse_stride_group != 0 ? p.lse_stride_group : p.lse_group * f.lse_stride_token;
  return f;
}

// ---- launch configuration ----------------------------------------------------------------------
// Per-device facts of the launch: the shared-memory opt-in limit and programmatic dependent launch
// (sm_90+). Read once per device (attribute queries cost microseconds per call).
struct LaunchFacts {
  int max_smem = 0;
  bool pdl = false;
  bool ws = false;  // HB = 4 runs decode_partial_ws_kernel
};
constexpr int kMaxDevices = 64;

template <int HB>
void opt_in_smem() {
  cuda::check_cuda(
      cudaFuncSetAttribute(decode_partial_kernel<HB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           Cfg<HB>::kSmemBytes),
      "cudaFuncSetAttribute(decode_partial_kernel)");
}

// Dynamic shared memory above 48 KiB needs an opt-in per device and kernel (not a stream
// operation, so it is legal during graph capture); done once per device for the configurations
// that fit.
const LaunchFacts& launch_facts() {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<LaunchFacts, kMaxDevices> facts;
  int dev = 0;
  cuda::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  SPARSEMLA_CHECK_ARG(dev >= 0 && dev < kMaxDevices, "sparse_decode", "device", "< 64", dev);
  std::call_once(once[dev], [dev] {
    LaunchFacts& f = facts[dev];
    cuda::check_cuda(
        cudaDeviceGetAttribute(&f.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "max shared memory");
    int32_t major = 0, minor = 0;
    cuda::current_device_cc(&major, &minor);
    f.pdl = major >= 9;
    if (Cfg<1>::kSmemBytes <= f.max_smem) opt_in_smem<1>();
    if (Cfg<2>::kSmemBytes <= f.max_smem) opt_in_smem<2>();
    if (Cfg<4>::kSmemBytes <= f.max_smem) opt_in_smem<4>();
    cudaFuncAttributes ws_attr{};
    cuda::check_cuda(cudaFuncGetAttributes(&ws_attr, decode_partial_ws_kernel),
                     "cudaFuncGetAttributes(decode_partial_ws_kernel)");
    f.ws = ws_attr.binaryVersion >= 90 && partial_ws::WsSmem::kBytes <= f.max_smem &&
           core::tuning().generic_ws;
    if (f.ws) {
      cuda::check_cuda(cudaFuncSetAttribute(decode_partial_ws_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            partial_ws::WsSmem::kBytes),
                       "cudaFuncSetAttribute(decode_partial_ws_kernel)");
    }
  });
  return facts[dev];
}

int smem_bytes_of(int32_t heads_blocks) {
  return heads_blocks == 4 ? Cfg<4>::kSmemBytes
                           : (heads_blocks == 2 ? Cfg<2>::kSmemBytes : Cfg<1>::kSmemBytes);
}

// Head blocks per CTA: the most (fewest gathers and dequantisations per key) whose grid still
// covers at least 3/4 of the SMs; small grids (small batch) take fewer heads per CTA and more
// CTAs, which shortens each CTA's critical path.
int32_t head_blocks_per_cta(int64_t num_tokens, int32_t splits, int32_t num_heads, int32_t sms,
                            int max_smem) {
  const int64_t hb = plan_head_blocks(num_heads);
  const int32_t forced = core::tuning().generic_head_blocks;  // measurement knob
  if (forced != 0 && smem_bytes_of(forced) <= max_smem) return forced;
  const int32_t cap = hb >= 3 ? 4 : static_cast<int32_t>(hb);
  for (int32_t n = cap; n > 1; n /= 2) {
    if (smem_bytes_of(n) > max_smem) continue;
    const int64_t ctas = num_tokens * splits * ((hb + n - 1) / n);
    if (4 * ctas >= 3 * static_cast<int64_t>(sms)) return n;
  }
  SPARSEMLA_CHECK_ARG(
      smem_bytes_of(1) <= max_smem, "sparse_decode", "device",
      "a GPU with >= " + std::to_string(smem_bytes_of(1)) + " bytes of shared memory per block",
      max_smem);
  return 1;
}

void launch_partial(int32_t heads_blocks, bool ws, dim3 grid, cudaStream_t stream,
                    const PartialParams& kp) {
  switch (heads_blocks) {
    case 4:
      if (ws) {
        decode_partial_ws_kernel<<<grid, partial_ws::kThreads, partial_ws::WsSmem::kBytes,
                                   stream>>>(kp);
      } else {
        decode_partial_kernel<4><<<grid, partial::kThreads, Cfg<4>::kSmemBytes, stream>>>(kp);
      }
      break;
    case 2:
      decode_partial_kernel<2><<<grid, partial::kThreads, Cfg<2>::kSmemBytes, stream>>>(kp);
      break;
    default:
      decode_partial_kernel<1><<<grid, partial::kThreads, Cfg<1>::kSmemBytes, stream>>>(kp);
      break;
  }
  cuda::check_cuda(cudaGetLastError(), "decode_partial_kernel launch");
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
  cuda::check_cuda(cudaLaunchKernelEx(&cfg, decode_combine_kernel, cp),
                   "decode_combine_kernel launch");
}

}  // namespace

int32_t plan_head_blocks_per_cta(int64_t num_tokens, int32_t num_splits, int32_t num_heads,
                                 int32_t sms) {
  return head_blocks_per_cta(num_tokens, num_splits, num_heads, sms, launch_facts().max_smem);
}

void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace) {
  if (p.num_tokens == 0) return;
  const int32_t num_splits = plan.num_splits;
  cuda::check_decode_launch(p, plan, workspace);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const LaunchFacts& facts = launch_facts();
  const PartialParams kp = cuda::decode_kernel_params(p, plan, workspace, false);
  const int32_t per_cta = plan.head_blocks_per_cta;
  const int64_t hb = plan_head_blocks(p.num_heads);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(num_splits),
                  static_cast<unsigned>((hb + per_cta - 1) / per_cta));
  launch_partial(per_cta, facts.ws, grid, stream, kp);
  if (num_splits == 1) return;
  cuda::launch_combine(kp, stream);
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

void device_rows_fast_count(const uint64_t* words, int64_t n, bool ws, uint32_t* count,
                            void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cuda::check_cuda(cudaMemsetAsync(count, 0, sizeof(uint32_t), s), "rows_fast_count clear");
  if (n <= 0) return;
  rows_fast_count_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(
      reinterpret_cast<const uint2*>(words), n, ws, count);
  cuda::check_cuda(cudaGetLastError(), "rows_fast_count_kernel launch");
}

#ifdef SPARSEMLA_TIMELINE
// Debug timeline of the warp-specialised kernel (cuda/common/timeline.cuh).
void timeline_clear(cudaStream_t stream) {
  cuda::timeline_clear_symbol(partial_ws::g_timeline, stream);
}
void timeline_read(unsigned long long* out) {
  cuda::timeline_read_symbol(partial_ws::g_timeline, out);
}
#endif

}  // namespace sparsemla::cuda_generic

// The decode kernels' shared host side (src/cuda/common/decode_params.cuh), defined here beside
// the combine kernel.
namespace sparsemla::cuda {

DecodeKernelParams decode_kernel_params(const DecodeParams& p, const DecodePlan& plan,
                                        void* workspace, bool specialised) {
  const int32_t num_splits = plan.num_splits;
  using namespace cuda_generic;
  DecodeKernelParams k{};
  k.num_tokens = p.num_tokens;
  k.num_heads = p.num_heads;
  k.num_splits = num_splits;
  k.q = reinterpret_cast<const __nv_bfloat16*>(p.q);
  k.q_stride_head = p.q_stride_head;
  k.scale = p.scale;
  k.rescale_lag = core::tuning().rescale_lag;
  k.q_stride_token = p.q_stride_token != 0 ? p.q_stride_token : p.num_heads * 512LL;
  k.q_vec16 = aligned(p.q, 16) && k.q_stride_token % 8 == 0 && p.q_stride_head % 8 == 0;
  k.main_cache = device_cache(p.main_cache);
  k.main_list = device_list(p.main_list);
  if (p.has_extra) {
    k.extra_cache = device_cache(p.extra_cache);
    k.extra_list = device_list(p.extra_list);
  }
  // CONTRACT 5: only the specialised path may skip the extra cache's scrub, and only when the gate
  // says.
  k.scrub_extra = !may_skip_extra_scrub(
      {specialised, true, p.kv_connector, p.has_extra, p.extra_cache_sanitised});
  k.adaptive = plan.adaptive_splits ? 1 : 0;
  k.one_wave = plan.one_wave;
  if (num_splits > 1 && workspace != nullptr) {
    const int64_t rows = p.num_tokens * num_splits * p.num_heads;
    k.ws_m = static_cast<float*>(workspace);
    k.ws_l = k.ws_m + rows;
    k.ws_acc = k.ws_l + rows;
  }
  k.finish = finish_params(p);
  return k;
}

void check_decode_launch(const DecodeParams& p, const DecodePlan& plan, const void* workspace) {
  constexpr const char* kOp = "sparse_decode";
  const int32_t num_splits = plan.num_splits;
  SPARSEMLA_CHECK_ARG(p.num_tokens <= INT32_MAX, kOp, "num_tokens", "<= 2^31-1 on the CUDA path",
                      p.num_tokens);
  SPARSEMLA_CHECK_ARG(num_splits >= 1 && num_splits <= 65535, kOp, "num_splits", "in [1, 65535]",
                      num_splits);
  if (plan.workspace_bytes > 0) {
    SPARSEMLA_CHECK_PTR(workspace, kOp, "workspace");
    SPARSEMLA_CHECK_ARG(cuda_generic::aligned(workspace, 8), kOp, "workspace",
                        "an 8-byte aligned pointer", workspace);
  }
}

void launch_combine(const DecodeKernelParams& k, cudaStream_t stream) {
  const cuda_generic::CombineParams cp{k.num_tokens, k.num_heads, k.num_splits, k.ws_m,
                                       k.ws_l,       k.ws_acc,    k.finish};
  cuda_generic::launch_combine_kernel(cp, cuda_generic::launch_facts().pdl, stream);
}

}  // namespace sparsemla::cuda
