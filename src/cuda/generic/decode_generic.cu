// src/cuda/generic/decode_generic.cu: the portable CUDA sparse decode (CONTRACT 4), sm_80 and
// newer.
//
// Partial kernel (decode_partial.cuh), grid (T, S, ceil(hb / HB)), 256 threads: one CTA per query
// row, split and group of HB head blocks (HB = 4, 2 or 1; 16 heads per block), chosen on the host
// from the grid size (fewer heads per CTA when the grid would leave SMs idle) and the device's
// shared memory. S always comes from plan_generic (CONTRACT 4.4). HB = 4 on devices with >= 206 KiB
// of shared memory per block and an sm_90+ cubin runs the warp-specialised shape instead
// (src/cuda/sm90/decode_partial_ws.cuh and decode_ws.cu, 384 threads; same outputs bit for bit).
// The combine kernel and the host side both paths share are in src/cuda/common/ (combine.cu,
// decode_params.cu).
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
#include "cuda/generic/generic_backend.h"
#include "cuda/sm90/ws_backend.h"
#include "sparsemla/error.h"
#include "sparsemla/plan.h"

namespace sparsemla::cuda_generic {

namespace {

using cuda::FinishParams;
using partial::Cfg;
using partial::PartialParams;


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

// ---- fast-path selfcheck (numerics_selfcheck.h) ------------------------------------------------
// The kernels' own predicates on rows of zero data bytes with the given scale words: one word per
// thread, counted when every thread of the key would take the fast conversion.
// (The warp-specialised kernel's own predicate: ws_kernel::rows_fast_count in decode_ws.cu.)
__global__ void rows_fast_count_kernel(const uint2* words, int64_t n, uint32_t* count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  bool fast = true;
  partial::RowChunks rc{};
  rc.scale = words[i];
  for (int r = 0; r < partial::kThreadsPerKey; ++r) fast = fast && partial::rows_fast(rc, r, 0u);
  if (fast) atomicAdd(count, 1u);
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
    f.ws = ws_kernel::prepare(f.max_smem);
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
        ws_kernel::launch(grid, stream, kp);
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

}  // namespace

int32_t plan_head_blocks_per_cta(int64_t num_tokens, int32_t num_splits, int32_t num_heads,
                                 int32_t sms) {
  return head_blocks_per_cta(num_tokens, num_splits, num_heads, sms, launch_facts().max_smem);
}

void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace) {
  if (p.num_tokens == 0) return;
  const int32_t num_splits = plan.num_splits;
  cuda::check_decode_launch(p);
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
  if (ws) {
    ws_kernel::rows_fast_count(reinterpret_cast<const uint2*>(words), n, count, s);
  } else {
    rows_fast_count_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(
        reinterpret_cast<const uint2*>(words), n, count);
  }
  cuda::check_cuda(cudaGetLastError(), "rows_fast_count_kernel launch");
}

}  // namespace sparsemla::cuda_generic
