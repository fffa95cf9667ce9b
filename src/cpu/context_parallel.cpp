// CPU backend of the context-parallel ops (CONTRACT 12): the rank merge (12.1) and the list
// sharding (12.2). The merge's arithmetic is src/core/merge_math.h, shared with the CUDA kernel
// (bit-identical results); this file is compiled with -ffp-contract=off so that no product and sum
// fuse here either.
#include "cpu/context_parallel.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/merge_math.h"
#include "core/validate_context_parallel.h"
#include "cpu/decode_common.h"
#include "sparsemla/error.h"

namespace sparsemla::cpu {

namespace {

constexpr int kDim = Fp8DsMla::kHeadDim;
constexpr int kNope = Fp8DsMla::kNopeDims;
constexpr int kPairs = Fp8DsMla::kRopeDims / 2;

struct Strides {
  int64_t out_rank, out_token, out_head, lse_rank, lse_token, lse_head;
};

Strides rank_strides(const RankMergeParams& p) {
  Strides s;
  s.out_head = p.rank_out_stride_head;
  s.out_token =
      p.rank_out_stride_token != 0 ? p.rank_out_stride_token : p.num_heads * int64_t{kDim};
  s.out_rank = p.rank_out_stride_rank != 0 ? p.rank_out_stride_rank : p.num_tokens * s.out_token;
  s.lse_head = p.rank_lse_stride_head;
  s.lse_token = p.rank_lse_stride_token != 0 ? p.rank_lse_stride_token : p.num_heads;
  s.lse_rank = p.rank_lse_stride_rank != 0 ? p.rank_lse_stride_rank : p.num_tokens * s.lse_token;
  return s;
}

// Value d of rank r's row (t, h), as fp32.
float rank_value(const RankMergeParams& p, int64_t row, int d) {
  return p.rank_out != nullptr ? bf16_to_float(p.rank_out[row + d]) : p.rank_out_f32[row + d];
}

void merge_row(const RankMergeParams& p, const Strides& s, int64_t t, int32_t h,
               std::vector<float>& w) {
  const int32_t R = p.num_ranks;
  const auto lse_of = [&](int32_t r) {
    return p.rank_lse[r * s.lse_rank + t * s.lse_token + h * s.lse_head];
  };
  float max_m = merge::kNoMass;
  for (int32_t r = 0; r < R; ++r) max_m = merge::max_step(max_m, lse_of(r));
  const bool has_sink = p.sink != nullptr;
  const float sink = has_sink ? p.sink[h] : 0.0f;
  const float big_m = merge::big_max(max_m, has_sink, sink);
  float sum_w = 0.0f, sum_l = 0.0f;
  for (int32_t r = 0; r < R; ++r) {
    const float l = lse_of(r);
    w[r] = merge::weight(l, big_m);
    sum_w = merge::fadd(sum_w, w[r]);
    sum_l = merge::fadd(sum_l, merge::weight(l, max_m));
  }
  if (p.lse != nullptr) {
    const int64_t st = p.lse_stride_token != 0 ? p.lse_stride_token : p.num_heads;
    p.lse[t * st + h * p.lse_stride_head] = merge::merged_lse(max_m, sum_l);
  }
  const int64_t out_st = p.out_stride_token != 0 ? p.out_stride_token : p.num_heads * int64_t{kDim};
  bf16_bits* out = p.out + t * out_st + h * p.out_stride_head;
  const merge::Finish f = merge::finish(sum_w, has_sink, sink, big_m);
  if (f.nan_row || f.zero_row) {
    std::fill(out, out + kDim, float_to_bf16(f.nan_row ? merge::quiet_nan() : 0.0f));
    return;
  }
  float o[kDim] = {};
  for (int32_t r = 0; r < R; ++r) {
    if (w[r] == 0.0f) continue;  // inactive or underflowed: its output is not read
    const int64_t row = r * s.out_rank + t * s.out_token + h * s.out_head;
    for (int d = 0; d < kDim; ++d)
      o[d] = merge::fadd(o[d], merge::fmul(w[r], rank_value(p, row, d)));
  }
  for (int d = 0; d < kDim; ++d) o[d] = merge::fdiv(o[d], f.div);
  if (p.positions != nullptr) {
    const float* cs = p.rope.data + p.positions[t] * p.rope.row_stride;
    for (int k = 0; k < kPairs; ++k) {
      merge::inverse_rope_pair(o[kNope + 2 * k], o[kNope + 2 * k + 1], cs[k], cs[kPairs + k]);
    }
  }
  for (int d = 0; d < kDim; ++d) out[d] = float_to_bf16(o[d]);
}

bool mine(const ShardListParams& p, int32_t v) {
  return v >= 0 && (p.num_slots == 0 || v < p.num_slots) &&
         cp_rank_of_slot(v, p.num_ranks, p.interleave) == p.rank;
}

bool row_valid(const BuildCommon& c, int64_t t) {
  return c.row_valid == nullptr || c.row_valid[t] != 0;
}

}  // namespace

void merge_ranks(const RankMergeParams& p) {
  core::validate_host_data(p);
  const int64_t T = p.num_tokens, H = p.num_heads;
  const Strides s = rank_strides(p);
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp parallel
#endif
  {
    std::vector<float> w(static_cast<size_t>(p.num_ranks));
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp for schedule(static)
#endif
    for (int64_t i = 0; i < T * H; ++i) merge_row(p, s, i / H, static_cast<int32_t>(i % H), w);
  }
}

void shard_list(const ShardListParams& p) {
  core::validate_host_data(p);
  const BuildCommon& c = p.common;
  // Every row of this rank must fit out.width: checked for all rows before anything is written.
  for (int64_t t = 0; t < c.num_rows; ++t) {
    if (!row_valid(c, t)) continue;
    const ListRow row = list_row(p.list, t);
    const int64_t len =
        std::count_if(row.indices, row.indices + row.length, [&](int32_t v) { return mine(p, v); });
    SPARSEMLA_CHECK_ARG(len <= p.out.width, "shard_list", "out.width",
                        ">= the " + std::to_string(len) + " entries of rank " +
                            std::to_string(p.rank) + " in row " + std::to_string(t),
                        p.out.width);
  }
  int64_t offset = 0;
  p.out.indptr[0] = 0;
  for (int64_t t = 0; t < c.num_rows; ++t) {
    if (row_valid(c, t)) {
      const ListRow row = list_row(p.list, t);
      for (int64_t j = 0; j < row.length; ++j) {
        const int32_t v = row.indices[j];
        if (!mine(p, v)) continue;
        p.out.indices[offset++] = static_cast<int32_t>(cp_local_slot(v, p.num_ranks, p.interleave));
      }
    }
    p.out.indptr[t + 1] = static_cast<int32_t>(offset);  // <= T * out.width <= 2^31-1
  }
}

}  // namespace sparsemla::cpu
