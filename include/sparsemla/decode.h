// sparsemla/decode.h: the sparse MLA decode of CONTRACT 4 (one softmax over the main and extra
// lists, attention sink, split-K partials + combine, fused inverse RoPE, NaN scrub per the
// provenance gate).
//
// Shapes: q bf16 [T, H, 512]; out bf16 [T, H, 512]; lse fp32 [T, H] (optional). Strides in
// elements, last dim contiguous. Pointers live where the path runs (host for Cpu, device for CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "sparsemla/backend.h"
#include "sparsemla/format.h"
#include "sparsemla/lists.h"
#include "sparsemla/numerics.h"
#include "sparsemla/writer.h"

namespace sparsemla {

inline constexpr float kDefaultSoftmaxScale = 0.04419417382415922f;  // 512^-0.5

struct DecodeParams {
  int64_t num_tokens = 0;        // T query rows (several per request under MTP)
  int32_t num_heads = 0;         // H in [1, 128]
  const bf16_bits* q = nullptr;  // [T, H, 512]
  int64_t q_stride_token = 0;    // elements (0: H*512)
  int64_t q_stride_head = 512;

  CacheView main_cache;    // window cache (always scrubbed)
  IndexList main_list;     // T rows
  bool has_extra = false;  // ratio-4 / ratio-128 layers
  CacheView extra_cache;   // compressed cache
  IndexList extra_list;    // T rows

  const float* sink = nullptr;  // [H] natural-log units, or null
  float scale = kDefaultSoftmaxScale;

  const int64_t* positions = nullptr;  // [T] query positions for the fused inverse RoPE, or null
  RopeTable rope;                      // the layer's table (needed with positions)

  bf16_bits* out = nullptr;      // [T, H, 512]
  int64_t out_stride_token = 0;  // elements (0: H*512)
  int64_t out_stride_head = 512;
  float* lse = nullptr;          // [T, H] or null: log-sum-exp without the sink, +inf if no key
  int64_t lse_stride_token = 0;  // (0: H)
  int64_t lse_stride_head = 1;
  // Rows in groups of lse_group (FlashMLA's lse [b, h, s_q]: lse_group = s_q, stride_group = h*s_q,
  // stride_token = 1, stride_head = s_q): lse[t, h] lives at (t / g) * lse_stride_group +
  // (t % g) * lse_stride_token + h * lse_stride_head. g = 1: t * lse_stride_token.
  int32_t lse_group = 1;
  int64_t lse_stride_group = 0;  // (0: lse_group * the token stride)

  // Provenance gate inputs (CONTRACT 5); the extra scrub is skipped only when the gate holds.
  bool extra_cache_sanitised = false;
  bool kv_connector = false;

  int32_t num_splits = 0;        // S; 0: the path's planner picks it
  bool adaptive_splits = false;  // CONTRACT 4.5 (specialised path)
  int32_t num_sms = 0;           // CU of the planner and of the adaptive rule (CONTRACT 4.4/4.5);
                                 // 0: the path's own (CPU: OpenMP threads; GPU: its SMs)
  // Batch invariance: a row's output (and lse) is bitwise identical across runs and whatever its
  // batchmates. With num_splits == 0 the planner then sees T = 1, so S depends only on H, the
  // lists' dense widths (set main_list.width / extra_list.width: capacity / T varies with T) and
  // CU (num_sms, else the path's own: fix num_sms for the same bits on other machines); the
  // adaptive rule (whose ONE_WAVE depends on T) is not applied. docs/RELIABILITY.md has the cost.
  bool deterministic = false;
  Path path = Path::Auto;
  void* stream = nullptr;  // cudaStream_t for the CUDA paths
};

// Workspace bytes for (T, H, S): partials m, l fp32 [T, S, H] and acc fp32 [T, S, H, 512].
size_t decode_workspace_size(int64_t num_tokens, int32_t num_heads, int32_t num_splits);

// ---- plan once, run many (CONTRACT 4.4) --------------------------------------------------------
// What a decode plan depends on: shapes and placement only, never list contents or GPU memory.
// An engine plans once per step and runs every layer with the same shapes from the plan.
struct DecodeShape {
  int64_t num_tokens = 0;   // T
  int32_t num_heads = 0;    // H in [1, 128]
  int64_t width_main = 0;   // W of the main list (>= 0)
  int64_t width_extra = 0;  // W of the extra list (0 when has_extra is false)
  bool has_extra = false;
  int32_t device = -1;         // CUDA device ordinal of the data; -1: host data (CPU path)
  bool caches_aligned = true;  // both caches' base and page stride 16-byte aligned (sm90 needs it)
  Path path = Path::Auto;      // requested path
  int32_t num_splits = 0;      // S forced by the caller; 0: the path's planner
  bool adaptive_splits = false;  // CONTRACT 4.5 (sm90 path; ignored when deterministic)
  bool deterministic = false;    // DecodeParams::deterministic
  int32_t num_sms = 0;           // CU; 0: the path's own (CPU: OpenMP threads; GPU: its SMs)
};

// Everything a call decides before it launches. Plain data: copy it, keep it in a captured graph.
struct DecodePlan {
  DecodeShape shape;             // what it was planned for (sparse_decode checks the params match)
  Path path = Path::Cpu;         // resolved: Cpu, CudaGeneric or CudaSm90
  int32_t num_splits = 1;        // S
  int32_t num_sms = 1;           // CU used by the planner and by the adaptive rule
  bool adaptive_splits = false;  // CONTRACT 4.5 applies (shape.adaptive_splits && !deterministic)
  int32_t one_wave = 1;          // ONE_WAVE of CONTRACT 4.5 (when adaptive_splits)
  bool fused_combine = false;    // sm90: a row's S = 2 splits combine in-kernel (no workspace)
  int32_t head_blocks_per_cta = 1;  // cuda-generic: 16-head blocks per CTA (1, 2 or 4)
  size_t workspace_bytes = 0;       // the workspace sparse_decode needs (0: none)
};

// The shape of a call (placement from its pointers: device data -> the current CUDA device).
DecodeShape decode_shape(const DecodeParams& p);
// The plan for a shape. Throws sparsemla::Error naming the field when the shape is invalid or
// the requested path cannot run it.
DecodePlan plan_decode(const DecodeShape& shape);
// plan_decode(decode_shape(p)) after validating p (errors name p's fields).
DecodePlan plan_decode(const DecodeParams& p);

// The split count the call will use: plan_decode(p).num_splits.
int32_t decode_num_splits(const DecodeParams& p);

// Whether the path can run the call; on false `why` (if given) says which input is unsupported
// (the full validation message; valid until the next call on this thread), on true it is null.
bool decode_is_supported(const DecodeParams& p, const char** why = nullptr);

// Runs the decode with a plan made for the call's shape (the same T, H, list widths, placement
// and options; otherwise a clear error). workspace: >= plan.workspace_bytes, may be null when
// that is 0; its contents need no clearing between calls (compute-sanitizer initcheck users: fill
// it once after allocating, docs/RELIABILITY.md 3). No host synchronisation, allocation or
// pageable copy; everything on p.stream.
void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace,
                   size_t workspace_bytes);
// The same, planning inside the call: sparse_decode(p, plan_decode(p), workspace, bytes).
void sparse_decode(const DecodeParams& p, void* workspace, size_t workspace_bytes);

// Reference: float64 on the dequantised cache (scrub decisions as the kernels), no bf16 rounding of
// probabilities; writes fp64 out [T, H, 512] (contiguous) and lse [T, H] (or null) instead of
// p.out / p.lse (ignored). abs_mean (or null), fp64 [T, H, 512] contiguous: the accuracy scale A of
// verify.h, A[t,h,j] = sum_i p_i |v_ij| / sum_i p_i over the row's valid keys (probabilities
// without the sink; on dims rotated by the fused inverse RoPE, |c| A_a + |s| A_b of the pair), 0
// for a row without keys. CPU pointers.
void sparse_decode_reference(const DecodeParams& p, double* out, double* lse,
                             double* abs_mean = nullptr);

// Standalone inverse RoPE on a bf16 [T, H, 512] tensor in place (dims 448..511, from bf16 values,
// fp32 rotation, one bf16 rounding). Strides in elements; stride_token 0: H*512.
void inverse_rope_inplace(bf16_bits* x, int64_t num_tokens, int32_t num_heads, int64_t stride_token,
                          int64_t stride_head, const int64_t* positions, const RopeTable& rope,
                          Path path = Path::Auto, void* stream = nullptr);

}  // namespace sparsemla
