// Argument validation of the context-parallel ops (CONTRACT 12): an error naming the argument
// before any work, in the words of the decode's checks (src/core/validate_decode.cpp).
#include "core/validate_context_parallel.h"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "core/validate.h"
#include "sparsemla/error.h"

namespace sparsemla::core {

namespace {

constexpr const char* kMergeOp = "merge_ranks";
constexpr const char* kShardOp = "shard_list";
constexpr int64_t kRow = Fp8DsMla::kHeadDim;
constexpr int64_t kMaxTokens = int64_t{1} << 40;
constexpr int32_t kMaxRanks = 1024;
constexpr int64_t kMaxIndptr = std::numeric_limits<int32_t>::max();

int64_t or_default(int64_t stride, int64_t dense) {
  return stride != 0 ? stride : dense;
}

// Elements from an operand's first to one past its last for T >= 1 tokens of H rows of `row`
// elements (token stride st, row stride sh).
int64_t span_elements(int64_t T, int64_t H, int64_t st, int64_t sh, int64_t row) {
  return (T - 1) * st + (H - 1) * sh + row;
}

// The bytes [lo, hi) an operand of `elements` elements of `bytes` each spans from `ptr`.
struct ByteSpan {
  uintptr_t lo = 0, hi = 0;
};
ByteSpan byte_span(const void* ptr, int64_t elements, size_t bytes) {
  const auto lo = reinterpret_cast<uintptr_t>(ptr);
  return {lo, lo + static_cast<uintptr_t>(elements) * bytes};
}
bool overlap(ByteSpan a, ByteSpan b) {
  return a.lo != 0 && b.lo != 0 && a.lo < b.hi && b.lo < a.hi;
}

// CONTRACT 12.1: the outputs may not overlap the inputs. The CUDA kernel writes a row's merged
// lse before it reads the rank lse again for the weights, so an in-place merge (lse = rank 0's
// slice) would give the GPU other results than the CPU.
void check_outputs_disjoint(const RankMergeParams& p, int64_t rank_out_elems,
                            int64_t rank_lse_elems) {
  const int64_t T = p.num_tokens, H = p.num_heads;
  const ByteSpan rank_out = p.rank_out != nullptr
                                ? byte_span(p.rank_out, rank_out_elems, sizeof(bf16_bits))
                                : byte_span(p.rank_out_f32, rank_out_elems, sizeof(float));
  const ByteSpan rank_lse = byte_span(p.rank_lse, rank_lse_elems, sizeof(float));
  const ByteSpan out = byte_span(
      p.out, span_elements(T, H, or_default(p.out_stride_token, H * kRow), p.out_stride_head, kRow),
      sizeof(bf16_bits));
  SPARSEMLA_CHECK_ARG(!overlap(out, rank_out) && !overlap(out, rank_lse), kMergeOp, "out",
                      "memory disjoint from rank_out / rank_out_f32 and rank_lse (outputs must "
                      "not alias inputs)",
                      "overlapping");
  if (p.lse == nullptr) return;
  const ByteSpan lse =
      byte_span(p.lse, span_elements(T, H, or_default(p.lse_stride_token, H), p.lse_stride_head, 1),
                sizeof(float));
  SPARSEMLA_CHECK_ARG(!overlap(lse, rank_out) && !overlap(lse, rank_lse) && !overlap(lse, out),
                      kMergeOp, "lse",
                      "memory disjoint from rank_out / rank_out_f32, rank_lse and out (outputs "
                      "must not alias inputs)",
                      "overlapping");
}

}  // namespace

void validate(const RankMergeParams& p) {
  const char* op = kMergeOp;
  const int64_t T = p.num_tokens;
  const int32_t H = p.num_heads, R = p.num_ranks;
  SPARSEMLA_CHECK_ARG(T >= 0 && T <= kMaxTokens, op, "num_tokens", "in [0, 2^40]", T);
  SPARSEMLA_CHECK_ARG(H >= 1 && H <= 128, op, "num_heads", "in [1, 128]", H);
  SPARSEMLA_CHECK_ARG(R >= 1 && R <= kMaxRanks, op, "num_ranks", "in [1, 1024]", R);
  SPARSEMLA_CHECK_ARG(p.path >= Path::Auto && p.path <= Path::CudaSm90, op, "path", "a Path value",
                      static_cast<int32_t>(p.path));
  SPARSEMLA_CHECK_ARG(!(p.rank_out != nullptr && p.rank_out_f32 != nullptr), op, "rank_out_f32",
                      "null when rank_out (bf16) is set: one of the two", "set");
  check_aligned(op, "rank_out", p.rank_out);
  check_aligned(op, "rank_out_f32", p.rank_out_f32);
  check_aligned(op, "rank_lse", p.rank_lse);
  check_aligned(op, "sink", p.sink);
  check_aligned(op, "positions", p.positions);
  check_aligned(op, "out", p.out);
  check_aligned(op, "lse", p.lse);
  // Rank outputs: R blocks of [T, H, 512], each read like the decode's q.
  const int64_t out_st = or_default(p.rank_out_stride_token, H * kRow);
  check_read_strides(op, "rank_out_", T, H, out_st, p.rank_out_stride_head);
  const int64_t block = T == 0 ? 0 : span_elements(T, H, out_st, p.rank_out_stride_head, kRow);
  const int64_t out_sr = or_default(p.rank_out_stride_rank, T * out_st);
  SPARSEMLA_CHECK_ARG(R <= 1 || T == 0 || out_sr >= kRow, op, "rank_out_stride_rank",
                      ">= 512 (0: T * rank_out_stride_token)", p.rank_out_stride_rank);
  check_extent(op, "rank_out_stride_rank", R, out_sr > 0 ? out_sr : 1,
               "num_ranks*rank_out_stride_rank (elements)");
  SPARSEMLA_CHECK_ARG(block <= std::numeric_limits<int64_t>::max() - (R - 1) * out_sr, op,
                      "rank_out_stride_rank", "an extent that fits int64", out_sr);
  // Rank lse: R blocks of [T, H].
  const int64_t lse_st = or_default(p.rank_lse_stride_token, H);
  SPARSEMLA_CHECK_ARG(H <= 1 || p.rank_lse_stride_head >= 1, op, "rank_lse_stride_head", ">= 1",
                      p.rank_lse_stride_head);
  SPARSEMLA_CHECK_ARG(T <= 1 || lse_st >= 1, op, "rank_lse_stride_token", ">= 1 (0: H)",
                      p.rank_lse_stride_token);
  const int64_t lse_sr = or_default(p.rank_lse_stride_rank, T * lse_st);
  SPARSEMLA_CHECK_ARG(R <= 1 || T == 0 || lse_sr >= 1, op, "rank_lse_stride_rank",
                      ">= 1 (0: T * rank_lse_stride_token)", p.rank_lse_stride_rank);
  check_extent(op, "rank_lse_stride_rank", R, lse_sr > 0 ? lse_sr : 1,
               "num_ranks*rank_lse_stride_rank (elements)");
  check_extent(op, "rank_lse_stride_token", T, lse_st > 0 ? lse_st : 1,
               "num_tokens*rank_lse_stride_token (elements)");
  check_extent(op, "rank_lse_stride_head", H,
               p.rank_lse_stride_head > 0 ? p.rank_lse_stride_head : 1,
               "num_heads*rank_lse_stride_head (elements)");
  // Outputs: written, rows disjoint.
  check_write_strides(op, "out_", T, H, or_default(p.out_stride_token, H * kRow), p.out_stride_head,
                      kRow);
  if (p.lse != nullptr) {
    check_write_strides(op, "lse_", T, H, or_default(p.lse_stride_token, H), p.lse_stride_head, 1);
  }
  if (p.positions != nullptr) check_rope(op, "rope", p.rope);
  if (T == 0) return;
  SPARSEMLA_CHECK_ARG(p.rank_out != nullptr || p.rank_out_f32 != nullptr, op, "rank_out",
                      "a non-null pointer (or rank_out_f32: fp32 rank outputs)", "null");
  SPARSEMLA_CHECK_PTR(p.rank_lse, op, "rank_lse");
  SPARSEMLA_CHECK_PTR(p.out, op, "out");
  const int64_t lse_block = span_elements(T, H, lse_st, p.rank_lse_stride_head, 1);
  check_outputs_disjoint(p, (R - 1) * out_sr + block, (R - 1) * lse_sr + lse_block);
}

void validate_host_data(const RankMergeParams& p) {
  if (p.positions != nullptr) check_positions(kMergeOp, p.positions, p.num_tokens, p.rope);
}

void validate(const ShardListParams& p) {
  const char* op = kShardOp;
  const BuildCommon& c = p.common;
  SPARSEMLA_CHECK_ARG(c.num_rows >= 0 && c.num_rows <= kMaxTokens, op, "common.num_rows",
                      "in [0, 2^40]", c.num_rows);
  SPARSEMLA_CHECK_ARG(p.num_ranks >= 1 && p.num_ranks <= kMaxRanks, op, "num_ranks", "in [1, 1024]",
                      p.num_ranks);
  SPARSEMLA_CHECK_ARG(p.rank >= 0 && p.rank < p.num_ranks, op, "rank",
                      "in [0, num_ranks = " + std::to_string(p.num_ranks) + ")", p.rank);
  SPARSEMLA_CHECK_ARG(p.interleave >= 1, op, "interleave", ">= 1", p.interleave);
  SPARSEMLA_CHECK_ARG(p.num_slots >= 0, op, "num_slots", ">= 0 (0: no range check)", p.num_slots);
  SPARSEMLA_CHECK_ARG(c.path >= Path::Auto && c.path <= Path::CudaSm90, op, "common.path",
                      "a Path value", static_cast<int32_t>(c.path));
  check_list_shape(op, "list", p.list, c.num_rows);
  SPARSEMLA_CHECK_PTR(p.out.indptr, op, "out.indptr");
  SPARSEMLA_CHECK_ARG(p.out.width >= 1, op, "out.width", ">= 1", p.out.width);
  SPARSEMLA_CHECK_ARG(
      c.num_rows <= kMaxIndptr / p.out.width, op, "common.num_rows",
      "num_rows * out.width <= 2^31-1 (out.width = " + std::to_string(p.out.width) + ")",
      c.num_rows);
  SPARSEMLA_CHECK_ARG(c.num_rows == 0 || p.out.indices != nullptr, op, "out.indices",
                      "a non-null pointer for num_rows > 0", "null");
  check_aligned(op, "out.indices", p.out.indices);
  check_aligned(op, "out.indptr", p.out.indptr);
}

void validate_host_data(const ShardListParams& p) {
  check_list_rows(kShardOp, "list", p.list, p.common.num_rows);
}

}  // namespace sparsemla::core
