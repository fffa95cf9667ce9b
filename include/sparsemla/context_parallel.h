// sparsemla/context_parallel.h: decode context parallelism (CONTRACT 12): one request's KV cache
// spread over R ranks (GPUs), each rank decoding only its own slots without the sink, the
// per-rank results merged exactly on their log-sum-exp, the sink applied once after the merge.
//
// Per rank r: sparse_decode with sink = null (CONTRACT 4.2: no sink term) and lse set (CONTRACT
// 4.3a: natural log, without the sink, +inf for a rank without a valid key), on the lists
// shard_list gives it. Then, after an all-gather of (out_r, lse_r), merge_ranks on every rank (or
// one) gives the output of the unsharded decode with the sink, within CONTRACT 9.9.
//
// Interleave rule (vLLM's decode context parallelism, interleave size I): slot ids of the
// unsharded list are *virtual* slots, v = block * (R*bs) + offset, over a virtual block table of
// page size R*bs whose block b is block b of every rank (page size bs there; I divides bs). Slot v
// lives on rank (v / I) % R at local slot (v / (I*R)) * I + v % I. With I = 1: rank v % R, local
// v / R.
#pragma once

#include <cstdint>

#include "sparsemla/backend.h"
#include "sparsemla/lists.h"
#include "sparsemla/numerics.h"
#include "sparsemla/writer.h"

namespace sparsemla {

// ---- natural log with the same bits on host and device -----------------------------------------
// The context-parallel merge's lse (CONTRACT 12.1) on the CPU and the GPU alike. Only IEEE double
// multiply / add and one division (each correctly rounded on both sides, never contracted) and one
// final rounding: x = m 2^e with m in [sqrt(1/2), sqrt(2)) (exact, from the bits), u = (m-1)/(m+1)
// (|u| <= 0.1716), ln m = 2 atanh(u) = 2u (1 + u^2/3 + ... + u^22/23) (truncation < 0.0295^12/25,
// 1e-20 relative), plus e ln2 in two parts (e * hi exact). The double result is within ~1e-16
// relative of ln x, so the float is the correctly rounded one except within ~1e-16 of a rounding
// midpoint -- and in every case the same on host and device. NaN and x < 0 -> NaN, +-0 -> -inf,
// +inf -> +inf.
SPARSEMLA_HOST_DEVICE double exact_ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
SPARSEMLA_HOST_DEVICE float log_portable(float x) {
  if (x != x) return x;
  if (x < 0.0f) return bits_float(0x7FC00000u);
  if (x == 0.0f) return bits_float(0xFF800000u);
  if (x == bits_float(0x7F800000u)) return x;
  uint32_t u = float_bits(x);
  int e = 0;
  if ((u >> 23) == 0) {  // subnormal: scale by 2^24 (exact)
    u = float_bits(x * 16777216.0f);
    e = -24;
  }
  e += static_cast<int>(u >> 23) - 127;
  float m = bits_float((u & 0x007FFFFFu) | 0x3F800000u);  // [1, 2)
  if (m > 1.41421353816986083984f) {  // sqrt(2) rounded down: m lands in [1/sqrt2, sqrt2)
    m *= 0.5f;                        // exact
    ++e;
  }
  constexpr double kLn2Hi = 0.693147180369123816490;  // 0x3FE62E42FEE00000: e * hi exact
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double md = static_cast<double>(m);
  const double r = exact_ddiv(exact_dadd(md, -1.0), exact_dadd(md, 1.0));
  const double r2 = exact_dmul(r, r);
  double poly = 1.0 / 23.0;
  poly = horner_step(poly, r2, 1.0 / 21.0);
  poly = horner_step(poly, r2, 1.0 / 19.0);
  poly = horner_step(poly, r2, 1.0 / 17.0);
  poly = horner_step(poly, r2, 1.0 / 15.0);
  poly = horner_step(poly, r2, 1.0 / 13.0);
  poly = horner_step(poly, r2, 1.0 / 11.0);
  poly = horner_step(poly, r2, 1.0 / 9.0);
  poly = horner_step(poly, r2, 1.0 / 7.0);
  poly = horner_step(poly, r2, 1.0 / 5.0);
  poly = horner_step(poly, r2, 1.0 / 3.0);
  poly = horner_step(poly, r2, 1.0);
  const double ln_m = exact_dmul(exact_dmul(2.0, r), poly);
  const double ed = static_cast<double>(e);
  const double result =
      exact_dadd(exact_dmul(ed, kLn2Hi), exact_dadd(ln_m, exact_dmul(ed, kLn2Lo)));
  return static_cast<float>(result);
}

// ---- the interleave rule ------------------------------------------------------------------------
// Rank of virtual slot v >= 0 (num_ranks R >= 1, interleave I >= 1).
SPARSEMLA_HOST_DEVICE int32_t cp_rank_of_slot(int64_t v, int32_t num_ranks, int32_t interleave) {
  return static_cast<int32_t>((v / interleave) % num_ranks);
}
// Local slot of virtual slot v >= 0 on its rank.
SPARSEMLA_HOST_DEVICE int64_t cp_local_slot(int64_t v, int32_t num_ranks, int32_t interleave) {
  return (v / (int64_t{interleave} * num_ranks)) * interleave + v % interleave;
}
// The virtual slot of local slot l >= 0 of rank r (the inverse of the two above).
SPARSEMLA_HOST_DEVICE int64_t cp_virtual_slot(int64_t l, int32_t rank, int32_t num_ranks,
                                              int32_t interleave) {
  return (l / interleave) * (int64_t{interleave} * num_ranks) + int64_t{rank} * interleave +
         l % interleave;
}

// ---- list sharding (CONTRACT 12.2) --------------------------------------------------------------
// Rank `rank`'s part of a list: row t of the output holds, in their order, the entries v of row t
// of `list` with 0 <= v (< num_slots when given) and cp_rank_of_slot(v) == rank, as local slots
// cp_local_slot(v). Other entries (-1 padding, other ranks' slots, out-of-range values) are
// dropped: on the rank's cache they are not keys of this rank. Rows are packed as the builders of
// CONTRACT 4.6 pack them (indptr[0] = 0, indptr[t+1] = indptr[t] + len(t), padding rows
// (common.row_valid 0) of length 0, indices past indptr[T] untouched), so the planner width of the
// output is out.width and a graph buffer pair stays at stable addresses. Every rank's row must
// fit: len(t) <= out.width (always true with out.width = the input's dense width W, the builders'
// output width). The CPU backend checks it before writing (error naming out.width); on the device
// it is a precondition, and entries past out.width are dropped (never written out of bounds).
struct ShardListParams {
  BuildCommon common;      // num_rows = T rows of `list`; row_valid, path, stream
  IndexList list;          // the unsharded list (ragged or dense), virtual slot ids
  int32_t num_ranks = 1;   // R >= 1
  int32_t rank = 0;        // in [0, R)
  int32_t interleave = 1;  // I >= 1 (vLLM's cp_kv_cache_interleave_size)
  int64_t num_slots = 0;   // virtual slots N (0: no range check); v >= N dropped
  RaggedOut out;           // indices [num_rows * out.width], indptr [num_rows + 1]
};
void shard_list(const ShardListParams& p);

// ---- the merge (CONTRACT 12.1) ------------------------------------------------------------------
// Per (t, h), over the ranks r whose lse_r is finite or NaN (a rank with lse +-inf has no mass:
// it contributes nothing and its out_r is never read):
//   M' = max_r lse_r,  M = max(M', sink_h) (sink given),  w_r = exp(lse_r - M)
//   den = sum_r w_r + exp(sink_h - M)     out = sum_r w_r out_r / den   (then the inverse RoPE)
//   lse = M' + ln(sum_r exp(lse_r - M'))  (+inf without an active rank; never includes the sink)
// The special rows of CONTRACT 4.2 follow: no active rank -> exact 0 (and lse +inf); sink +inf ->
// exact 0; sink -inf = no sink, bit for bit; a NaN sink -> NaN rows of its head; a NaN lse_r ->
// NaN row and NaN lse. The arithmetic (fp32, exp and ln evaluated by exp_portable / log_portable
// of numerics.h, no fused multiply-add, the ranks summed in order 0..R-1) is the same on the CPU
// and the CUDA kernel: their outputs are bit-identical. A rank whose weight underflows to 0 is not
// read either (as an empty split of CONTRACT 4.3).
//
// Rank outputs are bf16 (the decode's output) or fp32 (the more accurate option: bf16 rank
// outputs add one bf16 rounding of each out_r, up to 2^-8 A in total; CONTRACT 12.3).
struct RankMergeParams {
  int64_t num_tokens = 0;  // T
  int32_t num_heads = 0;   // H in [1, 128]
  int32_t num_ranks = 0;   // R >= 1
  // Exactly one of rank_out (bf16) and rank_out_f32: [R, T, H, 512], last dim contiguous.
  const bf16_bits* rank_out = nullptr;
  const float* rank_out_f32 = nullptr;
  int64_t rank_out_stride_rank = 0;   // elements (0: T * the token stride)
  int64_t rank_out_stride_token = 0;  // elements (0: H*512)
  int64_t rank_out_stride_head = 512;
  const float* rank_lse = nullptr;    // [R, T, H] natural log, without the sink
  int64_t rank_lse_stride_rank = 0;   // elements (0: T * the token stride)
  int64_t rank_lse_stride_token = 0;  // elements (0: H)
  int64_t rank_lse_stride_head = 1;

  const float* sink = nullptr;  // [H] natural-log units, or null

  const int64_t* positions = nullptr;  // [T] query positions for the fused inverse RoPE, or null
  RopeTable rope;                      // the layer's table (needed with positions)

  bf16_bits* out = nullptr;      // [T, H, 512]
  int64_t out_stride_token = 0;  // elements (0: H*512)
  int64_t out_stride_head = 512;
  float* lse = nullptr;          // [T, H] or null: merged lse, without the sink
  int64_t lse_stride_token = 0;  // (0: H)
  int64_t lse_stride_head = 1;

  Path path = Path::Auto;  // Auto: host pointers CPU, device pointers the CUDA kernel
  void* stream = nullptr;  // cudaStream_t
};

// Throws sparsemla::Error naming the argument for invalid shapes, strides or pointers, outputs
// overlapping inputs (CONTRACT 12.1), and (host data) for a position outside [0, rope.rows) (on the
// device a documented precondition; positions are clamped into the table). No host synchronisation,
// allocation or pageable copy; CUDA work on p.stream, launch shape from (T, H) only (graph-safe).
void merge_ranks(const RankMergeParams& p);

}  // namespace sparsemla
