// src/cuda/common/decode_params.cu: the host side both CUDA decode paths share
// (decode_params.cuh): DecodeParams -> the kernels' DecodeKernelParams (caches, lists in either
// form, the finishing parameters, the scrub decision of the provenance gate, the plan's split
// facts) and the launch checks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/tuning.h"
#include "cuda/common/decode_common.cuh"
#include "cuda/common/decode_params.cuh"
#include "sparsemla/backend.h"
#include "sparsemla/error.h"

namespace sparsemla::cuda {

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
  slot_divider(c.block_size > 0 ? c.block_size : 1, &d.slot_magic, &d.slot_shift);
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

DecodeKernelParams decode_kernel_params(const DecodeParams& p, const DecodePlan& plan,
                                        void* workspace, bool specialised) {
  const int32_t num_splits = plan.num_splits;
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

// The plan's fields and the workspace were checked by dispatch (check_plan_fields,
// check_workspace); what is left is the grid's row count.
void check_decode_launch(const DecodeParams& p) {
  SPARSEMLA_CHECK_ARG(p.num_tokens <= INT32_MAX, "sparse_decode", "num_tokens",
                      "<= 2^31-1 on the CUDA path", p.num_tokens);
}

}  // namespace sparsemla::cuda
