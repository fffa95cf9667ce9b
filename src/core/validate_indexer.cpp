// Argument validation of the lightning-indexer decode (CONTRACT 11.4): shapes, strides and
// pointers. Device values (row_request, num_candidates, page ids) are never errors: the backends
// treat them as 11.4 says.
#include <string>

#include "core/validate.h"
#include "sparsemla/error.h"

namespace sparsemla::core {

namespace {

constexpr int64_t kMaxIndexerTokens = int64_t{1} << 40;

std::string num(int64_t v) {
  return std::to_string(v);
}

// A row stride of `count` rows of `len` elements: >= len when there is more than one row, and the
// whole extent addressable.
void check_row_stride(const char* op, const char* arg, int64_t count, int64_t stride, int64_t len,
                      const char* what) {
  SPARSEMLA_CHECK_ARG(count <= 1 || stride >= len, op, arg, ">= " + num(len), stride);
  check_extent(op, arg, count, stride > 0 ? stride : 1, what);
}

void check_queries(const char* op, const IndexerParams& p) {
  const int64_t T = p.num_tokens, H = p.num_heads;
  const int64_t sh = p.q_stride_head != 0 ? p.q_stride_head : kIndexerHeadDim;
  const int64_t st = p.q_stride_token != 0 ? p.q_stride_token : H * kIndexerHeadDim;
  check_row_stride(op, "q_stride_head", H, sh, kIndexerHeadDim, "num_heads*q_stride_head (bytes)");
  check_row_stride(op, "q_stride_token", T, st, kIndexerHeadDim,
                   "num_tokens*q_stride_token (bytes)");
  const int64_t sw = p.w_stride_token != 0 ? p.w_stride_token : H;
  check_row_stride(op, "w_stride_token", T, sw, H, "num_tokens*w_stride_token (elements)");
  check_aligned(op, "w", p.w);
  if (T == 0) return;
  SPARSEMLA_CHECK_PTR(p.q, op, "q");
  SPARSEMLA_CHECK_PTR(p.w, op, "w");
}

void check_table(const char* op, const IndexerParams& p) {
  check_nonneg(op, "num_requests", p.num_requests);
  SPARSEMLA_CHECK_ARG(p.block_table_width >= 0, op, "block_table_width", ">= 0",
                      p.block_table_width);
  SPARSEMLA_CHECK_ARG(p.num_requests <= 1 || p.block_table_stride >= p.block_table_width, op,
                      "block_table_stride", ">= block_table_width = " + num(p.block_table_width),
                      p.block_table_stride);
  check_extent(op, "num_requests", p.num_requests,
               p.block_table_stride > 0 ? p.block_table_stride : 1,
               "num_requests*block_table_stride (elements)");
  check_aligned(op, "block_table", p.block_table);
  if (p.num_tokens > 0 && p.num_requests > 0 && p.block_table_width > 0) {
    SPARSEMLA_CHECK_PTR(p.block_table, op, "block_table");
  }
  check_indexer_cache(op, "cache", p.cache);
}

void check_outputs(const char* op, const IndexerParams& p) {
  SPARSEMLA_CHECK_ARG(p.topk >= 1 && p.topk <= kIndexerMaxTopk, op, "topk",
                      "in [1, " + num(kIndexerMaxTopk) + "]", p.topk);
  SPARSEMLA_CHECK_ARG(p.width >= p.topk, op, "width", ">= topk = " + num(p.topk), p.width);
  const int64_t T = p.num_tokens;
  check_row_stride(op, "indices_stride", T, p.indices_stride != 0 ? p.indices_stride : p.width,
                   p.width, "num_tokens*indices_stride (elements)");
  check_row_stride(op, "scores_stride", T, p.scores_stride != 0 ? p.scores_stride : p.width,
                   p.width, "num_tokens*scores_stride (elements)");
  SPARSEMLA_CHECK_ARG(p.order == TopkOrder::ByIndex || p.order == TopkOrder::ByScore, op, "order",
                      "ByIndex or ByScore", static_cast<int>(p.order));
  check_aligned(op, "row_request", p.row_request);
  check_aligned(op, "num_candidates", p.num_candidates);
  check_aligned(op, "indices", p.indices);
  check_aligned(op, "lengths", p.lengths);
  check_aligned(op, "scores", p.scores);
  if (T == 0) return;
  SPARSEMLA_CHECK_PTR(p.row_request, op, "row_request");
  SPARSEMLA_CHECK_PTR(p.num_candidates, op, "num_candidates");
  SPARSEMLA_CHECK_PTR(p.indices, op, "indices");
}

}  // namespace

void validate(const IndexerParams& p) {
  constexpr const char* kOp = "indexer_topk";
  SPARSEMLA_CHECK_ARG(p.num_tokens >= 0 && p.num_tokens <= kMaxIndexerTokens, kOp, "num_tokens",
                      "in [0, 2^40]", p.num_tokens);
  SPARSEMLA_CHECK_ARG(p.num_heads >= 1 && p.num_heads <= 128, kOp, "num_heads", "in [1, 128]",
                      p.num_heads);
  check_queries(kOp, p);
  check_table(kOp, p);
  check_outputs(kOp, p);
}

}  // namespace sparsemla::core
