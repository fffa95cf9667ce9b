// Argument validation of the indexer query prep (CONTRACT 11.6), in the wording of CONTRACT 11.4:
// an error naming the argument before any work.
#include "core/validate_indexer_prep.h"

#include <string>

#include "core/validate.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer.h"

namespace sparsemla::core {

namespace {

constexpr const char* kOp = "indexer_q_prep";
constexpr int64_t kMaxPrepTokens = int64_t{1} << 40;

std::string num(int64_t v) {
  return std::to_string(v);
}

// A stride of `count` rows of `len` elements (0: the dense default `dense`).
void check_stride(const char* arg, int64_t count, int64_t stride, int64_t len, int64_t dense,
                  const char* what) {
  const int64_t s = stride != 0 ? stride : dense;
  SPARSEMLA_CHECK_ARG(count <= 1 || s >= len, kOp, arg, "0 or >= " + num(len), stride);
  check_extent(kOp, arg, count, s > 0 ? s : 1, what);
}

}  // namespace

void validate(const IndexerQPrepParams& p) {
  SPARSEMLA_CHECK_ARG(p.num_tokens >= 0 && p.num_tokens <= kMaxPrepTokens, kOp, "num_tokens",
                      "in [0, 2^40]", p.num_tokens);
  SPARSEMLA_CHECK_ARG(p.num_heads >= 1 && p.num_heads <= 128, kOp, "num_heads", "in [1, 128]",
                      p.num_heads);
  const int64_t T = p.num_tokens, H = p.num_heads, D = kIndexerHeadDim;
  check_stride("q_stride_head", H, p.q_stride_head, D, D, "num_heads*q_stride_head (elements)");
  check_stride("q_stride_token", T, p.q_stride_token, D, H * D,
               "num_tokens*q_stride_token (elements)");
  check_stride("w_raw_stride", T, p.w_raw_stride, H, H, "num_tokens*w_raw_stride (elements)");
  check_stride("q_out_stride_head", H, p.q_out_stride_head, D, D,
               "num_heads*q_out_stride_head (bytes)");
  check_stride("q_out_stride_token", T, p.q_out_stride_token, D, H * D,
               "num_tokens*q_out_stride_token (bytes)");
  check_stride("w_out_stride", T, p.w_out_stride, H, H, "num_tokens*w_out_stride (elements)");
  SPARSEMLA_CHECK_ARG(p.rope.rows >= 0, kOp, "rope.rows", ">= 0", p.rope.rows);
  SPARSEMLA_CHECK_ARG(p.rope.rows <= 1 || p.rope.row_stride >= 64, kOp, "rope.row_stride",
                      ">= 64 (cos x32 | sin x32)", p.rope.row_stride);
  check_extent(kOp, "rope.rows", p.rope.rows, p.rope.row_stride > 0 ? p.rope.row_stride : 1,
               "rope.rows*rope.row_stride (elements)");
  check_aligned(kOp, "q", p.q);
  check_aligned(kOp, "positions", p.positions);
  check_aligned(kOp, "rope", p.rope.data);
  check_aligned(kOp, "w_raw", p.w_raw);
  check_aligned(kOp, "w_out", p.w_out);
  if (T == 0) return;
  SPARSEMLA_CHECK_PTR(p.q, kOp, "q");
  SPARSEMLA_CHECK_PTR(p.positions, kOp, "positions");
  SPARSEMLA_CHECK_PTR(p.w_raw, kOp, "w_raw");
  SPARSEMLA_CHECK_PTR(p.q_out, kOp, "q_out");
  SPARSEMLA_CHECK_PTR(p.w_out, kOp, "w_out");
  if (p.rope.rows > 0) SPARSEMLA_CHECK_PTR(p.rope.data, kOp, "rope");
}

}  // namespace sparsemla::core
