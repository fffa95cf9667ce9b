// Argument checks of the sparse decode (CONTRACT 4.1, 4.3, 4.6) and of the standalone inverse RoPE.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/validate.h"
#include "sparsemla/error.h"

namespace sparsemla::core {

namespace {

constexpr int64_t kRow = Fp8DsMla::kHeadDim;  // 512 elements per (token, head) row
constexpr int32_t kMaxHeads = 128;
constexpr int32_t kMaxSplits = 32;
constexpr int64_t kMaxTokens = int64_t{1} << 40;  // keeps T * H * 512 far inside int64

std::string field(const char* arg, const char* name) {
  return std::string(arg) + "." + name;
}
std::string element(const std::string& arg, int64_t i) {
  return arg + "[" + std::to_string(i) + "]";
}

void check_shape(const char* op, int64_t num_tokens, int32_t num_heads) {
  SPARSEMLA_CHECK_ARG(num_tokens >= 0 && num_tokens <= kMaxTokens, op, "num_tokens", "in [0, 2^40]",
                      num_tokens);
  SPARSEMLA_CHECK_ARG(num_heads >= 1 && num_heads <= kMaxHeads, op, "num_heads", "in [1, 128]",
                      num_heads);
}

// (n-1)*stride + len for stride >= 0, saturating at INT64_MAX (no signed overflow).
int64_t span(int64_t n, int64_t stride, int64_t len) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (n <= 1 || stride <= 0) return len;
  if (n - 1 > (kMax - len) / stride) return kMax;
  return (n - 1) * stride + len;
}

// The elements a [T, H, row_len] operand spans, (T-1)*st + (H-1)*sh + row_len, fit in int64, so
// no element offset t*st + h*sh + d can overflow.
void check_operand_extent(const char* op, const std::string& s, int64_t T, int32_t H, int64_t st,
                          int64_t sh, int64_t row_len) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t extent = span(T, st, span(H, sh, row_len));
  SPARSEMLA_CHECK_ARG(extent < kMax, op, s + "token",
                      "strides whose extent (T-1)*" + s + "token + (H-1)*" + s + "head + " +
                          std::to_string(row_len) + " fits in int64",
                      st);
}

}  // namespace

// A read-only [T, H, row] operand: heads and tokens at least one row apart (aliasing is harmless).
void check_read_strides(const char* op, const char* prefix, int64_t T, int32_t H, int64_t st,
                        int64_t sh) {
  const std::string s = std::string(prefix) + "stride_";
  SPARSEMLA_CHECK_ARG(H <= 1 || sh >= kRow, op, s + "head", ">= 512", sh);
  SPARSEMLA_CHECK_ARG(T <= 1 || st >= kRow, op, s + "token", ">= 512 (0: H*512)", st);
  check_operand_extent(op, s, T, H, st, sh, kRow);
}

// A written [T, H, row_len] operand: no two rows may overlap, so the heads of a token end before
// the next token starts (st >= (H-1)*sh + row_len), or the tokens of a head before the next head.
void check_write_strides(const char* op, const char* prefix, int64_t T, int32_t H, int64_t st,
                         int64_t sh, int64_t row_len) {
  const std::string s = std::string(prefix) + "stride_";
  const std::string len = std::to_string(row_len);
  SPARSEMLA_CHECK_ARG(H <= 1 || sh >= row_len, op, s + "head", ">= " + len, sh);
  SPARSEMLA_CHECK_ARG(T <= 1 || st >= row_len, op, s + "token", ">= " + len, st);
  check_operand_extent(op, s, T, H, st, sh, row_len);
  const int64_t heads_span = span(H, sh, row_len), tokens_span = span(T, st, row_len);
  const bool disjoint = T <= 1 || H <= 1 || st >= heads_span || sh >= tokens_span;
  SPARSEMLA_CHECK_ARG(disjoint, op, s + "token",
                      "non-overlapping rows: >= (H-1)*" + s + "head + " + len + " = " +
                          std::to_string(heads_span) + " (or " + s +
                          "head >= " + std::to_string(tokens_span) + ")",
                      st);
}

namespace {

int64_t token_stride(int64_t stride, int32_t H, int64_t row) {
  return stride != 0 ? stride : H * row;
}

// lse [T, H] in groups of g rows: each group a non-overlapping [g, H], groups one group apart.
void check_lse_layout(const char* op, const DecodeParams& p) {
  const int64_t T = p.num_tokens, st = token_stride(p.lse_stride_token, p.num_heads, 1);
  const int32_t g = p.lse_group;
  SPARSEMLA_CHECK_ARG(g >= 1, op, "lse_group", ">= 1", g);
  if (g == 1) return check_write_strides(op, "lse_", T, p.num_heads, st, p.lse_stride_head, 1);
  check_write_strides(op, "lse_", std::min<int64_t>(T, g), p.num_heads, st, p.lse_stride_head, 1);
  const int64_t group_span =
      span(std::min<int64_t>(T, g), st, span(p.num_heads, p.lse_stride_head, 1));
  const int64_t sg = p.lse_stride_group != 0 ? p.lse_stride_group : g * st;
  const int64_t groups = (T + g - 1) / g;
  SPARSEMLA_CHECK_ARG(
      groups <= 1 || sg >= group_span, op, "lse_stride_group",
      ">= one group's extent " + std::to_string(group_span) + " (0: lse_group * lse_stride_token)",
      p.lse_stride_group);
  check_operand_extent(op, "lse_stride_", groups, 1, sg, 0, group_span);
}

// The dense form (FlashMLA's [T, W] indices + optional lengths, CONTRACT 4.6): W >= 1 (it is the
// planner's width and every row's length bound), rows inside indices [0, capacity), rows_per_length
// >= 1. Rows must not overlap (stride >= W) so that a row is exactly its W entries.
void check_dense_list(const char* op, const char* name, const IndexList& list, int64_t T) {
  SPARSEMLA_CHECK_ARG(list.width >= 1 && list.width <= std::numeric_limits<int32_t>::max(), op,
                      field(name, "width"),
                      "in [1, 2^31) (dense form, indptr null: the row width W)", list.width);
  const int64_t stride = list.dense_stride != 0 ? list.dense_stride : list.width;
  SPARSEMLA_CHECK_ARG(stride >= list.width, op, field(name, "dense_stride"),
                      ">= width = " + std::to_string(list.width) + " (or 0: width)",
                      list.dense_stride);
  SPARSEMLA_CHECK_ARG(list.rows_per_length >= 1, op, field(name, "rows_per_length"), ">= 1",
                      list.rows_per_length);
  const int64_t need = span(T, stride, list.width);
  SPARSEMLA_CHECK_ARG(list.capacity >= need, op, field(name, "capacity"),
                      ">= (T-1)*dense_stride + width = " + std::to_string(need), list.capacity);
  if (list.lengths != nullptr) check_aligned(op, field(name, "lengths"), list.lengths);
}

}  // namespace

void check_list_shape(const char* op, const char* name, const IndexList& list, int64_t T) {
  SPARSEMLA_CHECK_ARG(list.capacity >= 0, op, field(name, "capacity"), ">= 0", list.capacity);
  SPARSEMLA_CHECK_ARG(list.width >= 0, op, field(name, "width"), ">= 0", list.width);
  if (T == 0) return;
  SPARSEMLA_CHECK_PTR(list.indices, op, field(name, "indices"));
  check_aligned(op, field(name, "indices"), list.indices);
  if (list.dense()) return check_dense_list(op, name, list, T);
  SPARSEMLA_CHECK_ARG(list.lengths == nullptr && list.dense_stride == 0, op, field(name, "lengths"),
                      "null with indptr (lengths and dense_stride belong to the dense form)",
                      "set");
  check_aligned(op, field(name, "indptr"), list.indptr);
}

// Reads indptr[0..T]: rows must lie inside indices [0, capacity).
void check_list_rows(const char* op, const char* name, const IndexList& list, int64_t T) {
  if (T == 0 || list.dense()) return;  // dense rows: every length is clamped to [0, W]
  const std::string indptr = field(name, "indptr");
  SPARSEMLA_CHECK_ARG(list.indptr[0] >= 0, op, element(indptr, 0), ">= 0", list.indptr[0]);
  for (int64_t t = 0; t < T; ++t) {
    SPARSEMLA_CHECK_ARG(list.indptr[t + 1] >= list.indptr[t], op, element(indptr, t + 1),
                        ">= " + element(indptr, t) + " = " + std::to_string(list.indptr[t]) +
                            " (non-decreasing; row " + std::to_string(t) + ")",
                        list.indptr[t + 1]);
  }
  SPARSEMLA_CHECK_ARG(list.indptr[T] <= list.capacity, op, element(indptr, T),
                      "<= " + field(name, "capacity") + " = " + std::to_string(list.capacity) +
                          " (row " + std::to_string(T - 1) + " ends there)",
                      list.indptr[T]);
}

void check_positions(const char* op, const int64_t* positions, int64_t T, const RopeTable& rope) {
  for (int64_t t = 0; t < T; ++t) {
    SPARSEMLA_CHECK_ARG(positions[t] >= 0 && positions[t] < rope.rows, op, element("positions", t),
                        "in [0, rope.rows) = [0, " + std::to_string(rope.rows) + ")", positions[t]);
  }
}

void validate_decode(const char* op, const DecodeParams& p, bool check_outputs) {
  const int64_t T = p.num_tokens;
  check_shape(op, T, p.num_heads);
  const int32_t H = p.num_heads;
  if (T > 0) SPARSEMLA_CHECK_PTR(p.q, op, "q");
  check_aligned(op, "q", p.q);
  check_aligned(op, "sink", p.sink);
  check_aligned(op, "positions", p.positions);
  check_read_strides(op, "q_", T, H, token_stride(p.q_stride_token, H, kRow), p.q_stride_head);
  if (check_outputs) {
    if (T > 0) SPARSEMLA_CHECK_PTR(p.out, op, "out");
    check_aligned(op, "out", p.out);
    check_aligned(op, "lse", p.lse);
    check_write_strides(op, "out_", T, H, token_stride(p.out_stride_token, H, kRow),
                        p.out_stride_head, kRow);
    if (p.lse != nullptr) check_lse_layout(op, p);
  }
  check_cache(op, "main_cache", p.main_cache);
  check_list_shape(op, "main_list", p.main_list, T);
  if (p.has_extra) {
    check_cache(op, "extra_cache", p.extra_cache);
    check_list_shape(op, "extra_list", p.extra_list, T);
  }
  SPARSEMLA_CHECK_ARG(std::isfinite(p.scale), op, "scale", "a finite value", p.scale);
  if (p.positions != nullptr) check_rope(op, "rope", p.rope);
  SPARSEMLA_CHECK_ARG(p.num_splits >= 0 && p.num_splits <= kMaxSplits, op, "num_splits",
                      "in [0, 32] (0: planner)", p.num_splits);
  SPARSEMLA_CHECK_ARG(p.num_sms >= 0, op, "num_sms", ">= 0 (0: the path's own)", p.num_sms);
  SPARSEMLA_CHECK_ARG(p.path >= Path::Auto && p.path <= Path::CudaSm90, op, "path", "a Path value",
                      static_cast<int32_t>(p.path));
}

void validate(const DecodeParams& p) {
  validate_decode("sparse_decode", p);
}

void validate_decode_host_data(const char* op, const DecodeParams& p) {
  check_list_rows(op, "main_list", p.main_list, p.num_tokens);
  if (p.has_extra) check_list_rows(op, "extra_list", p.extra_list, p.num_tokens);
  if (p.positions != nullptr) check_positions(op, p.positions, p.num_tokens, p.rope);
}

void validate_inverse_rope(const bf16_bits* x, int64_t num_tokens, int32_t num_heads,
                           int64_t stride_token, int64_t stride_head, const int64_t* positions,
                           const RopeTable& rope, bool host_data) {
  const char* op = "inverse_rope_inplace";
  check_shape(op, num_tokens, num_heads);
  if (num_tokens == 0) return;
  SPARSEMLA_CHECK_PTR(x, op, "x");
  SPARSEMLA_CHECK_PTR(positions, op, "positions");
  check_aligned(op, "x", x);
  check_aligned(op, "positions", positions);
  check_write_strides(op, "", num_tokens, num_heads, token_stride(stride_token, num_heads, kRow),
                      stride_head, kRow);
  check_rope(op, "rope", rope);
  if (host_data) check_positions(op, positions, num_tokens, rope);
}

}  // namespace sparsemla::core
