// Argument validation of the ragged-list builders (CONTRACT 4.6).
//
// validate(...) checks sizes and pointers only (safe for device pointers); validate_rows(...) reads
// the per-row host inputs (request_index, positions) and is run by the CPU backend before it
// writes.
#include <cstdint>
#include <limits>
#include <string>

#include "core/validate.h"
#include "sparsemla/error.h"

namespace sparsemla::core {

namespace {

constexpr int64_t kMaxIndptr = std::numeric_limits<int32_t>::max();

std::string indexed(const char* arg, int64_t i) {
  return std::string(arg) + "[" + std::to_string(i) + "]";
}

// R >= 0, the output buffers, W >= 1 and R*W within int32 (indptr values are int32).
void check_common(const char* op, const BuildCommon& c, const RaggedOut& out) {
  SPARSEMLA_CHECK_ARG(c.num_rows >= 0, op, "common.num_rows", ">= 0", c.num_rows);
  SPARSEMLA_CHECK_PTR(out.indptr, op, "out.indptr");
  SPARSEMLA_CHECK_ARG(out.width >= 1, op, "out.width", ">= 1", out.width);
  SPARSEMLA_CHECK_ARG(
      c.num_rows <= kMaxIndptr / out.width, op, "common.num_rows",
      "num_rows * out.width <= 2^31-1 (out.width = " + std::to_string(out.width) + ")", c.num_rows);
  SPARSEMLA_CHECK_ARG(c.num_rows == 0 || out.indices != nullptr, op, "out.indices",
                      "a non-null pointer for num_rows > 0", "null");
  check_aligned(op, "out.indices", out.indices);
  check_aligned(op, "out.indptr", out.indptr);
}

void check_block_table(const char* op, const int32_t* table, int64_t stride, int32_t width,
                       int64_t num_requests, int32_t block_size) {
  SPARSEMLA_CHECK_ARG(block_size >= 1, op, "block_size", ">= 1", block_size);
  SPARSEMLA_CHECK_ARG(width >= 1, op, "table_width", ">= 1", width);
  SPARSEMLA_CHECK_ARG(stride >= width, op, "block_table_stride",
                      ">= table_width = " + std::to_string(width), stride);
  SPARSEMLA_CHECK_ARG(num_requests >= 0, op, "num_requests", ">= 0", num_requests);
  SPARSEMLA_CHECK_ARG(num_requests == 0 || table != nullptr, op, "block_table",
                      "a non-null pointer for num_requests > 0", "null");
  check_extent(op, "num_requests", num_requests, stride,
               "num_requests*block_table_stride (elements)");
  check_aligned(op, "block_table", table);
}

template <typename T>
void check_needed(const char* op, const T* ptr, int64_t num_rows, const char* arg) {
  SPARSEMLA_CHECK_ARG(num_rows == 0 || ptr != nullptr, op, arg,
                      "a non-null pointer for num_rows > 0", "null");
  check_aligned(op, arg, ptr);
}

bool is_valid_row(const BuildCommon& c, int64_t r) {
  return c.row_valid == nullptr || c.row_valid[r] != 0;
}

// Every valid row's request (request_index[r], or r when absent) lies in [0, num_requests).
void check_requests(const char* op, const BuildCommon& c, const int32_t* request_index,
                    int64_t num_requests) {
  const std::string expected = "in [0, num_requests = " + std::to_string(num_requests) + ")";
  for (int64_t r = 0; r < c.num_rows; ++r) {
    if (!is_valid_row(c, r)) continue;
    const int64_t req = request_index != nullptr ? request_index[r] : r;
    if (req >= 0 && req < num_requests) continue;
    if (request_index != nullptr)
      throw_arg_error(op, indexed("request_index", r), expected, std::to_string(req));
    throw_arg_error(op, "num_requests",
                    "> " + std::to_string(r) + " (request_index is null, so row " +
                        std::to_string(r) + " reads request " + std::to_string(r) + ")",
                    std::to_string(num_requests));
  }
}

void check_positions(const char* op, const BuildCommon& c, const int64_t* positions) {
  for (int64_t r = 0; r < c.num_rows; ++r) {
    if (!is_valid_row(c, r)) continue;
    SPARSEMLA_CHECK_ARG(positions[r] >= 0, op, indexed("positions", r), ">= 0 for a valid row",
                        positions[r]);
  }
}

}  // namespace

void validate(const DenseToRaggedParams& p) {
  const char* op = "build_ragged_from_dense";
  check_common(op, p.common, p.out);
  check_needed(op, p.dense, p.common.num_rows, "dense");
  check_needed(op, p.lengths, p.common.num_rows, "lengths");
  SPARSEMLA_CHECK_ARG(p.dense_stride >= p.out.width, op, "dense_stride",
                      ">= out.width = " + std::to_string(p.out.width), p.dense_stride);
  check_extent(op, "common.num_rows", p.common.num_rows, p.dense_stride,
               "num_rows*dense_stride (elements)");
  check_aligned(op, "request_index", p.request_index);
  SPARSEMLA_CHECK_ARG(p.num_slots >= 0, op, "num_slots", ">= 0 (0: no range check)", p.num_slots);
  SPARSEMLA_CHECK_ARG(p.request_index == nullptr || p.num_requests >= 0, op, "num_requests", ">= 0",
                      p.num_requests);
}

void validate(const WindowListParams& p) {
  const char* op = "build_window_lists";
  check_common(op, p.common, p.out);
  check_needed(op, p.positions, p.common.num_rows, "positions");
  check_aligned(op, "request_index", p.request_index);
  check_block_table(op, p.block_table, p.block_table_stride, p.table_width, p.num_requests,
                    p.block_size);
  SPARSEMLA_CHECK_ARG(p.window >= 1, op, "window", ">= 1", p.window);
  SPARSEMLA_CHECK_ARG(p.out.width >= p.window, op, "out.width",
                      ">= window = " + std::to_string(p.window), p.out.width);
}

void validate(const TopkListParams& p) {
  const char* op = "build_topk_lists";
  check_common(op, p.common, p.out);
  check_needed(op, p.topk, p.common.num_rows, "topk");
  SPARSEMLA_CHECK_ARG(p.topk_stride >= p.out.width, op, "topk_stride",
                      ">= out.width = " + std::to_string(p.out.width), p.topk_stride);
  check_extent(op, "common.num_rows", p.common.num_rows, p.topk_stride,
               "num_rows*topk_stride (elements)");
  check_aligned(op, "topk_length", p.topk_length);
  check_aligned(op, "request_index", p.request_index);
  check_block_table(op, p.block_table, p.block_table_stride, p.table_width, p.num_requests,
                    p.block_size);
}

void validate(const CompressedAllListParams& p) {
  const char* op = "build_compressed_all_lists";
  check_common(op, p.common, p.out);
  check_needed(op, p.positions, p.common.num_rows, "positions");
  check_aligned(op, "request_index", p.request_index);
  check_block_table(op, p.block_table, p.block_table_stride, p.table_width, p.num_requests,
                    p.block_size);
  SPARSEMLA_CHECK_ARG(p.ratio >= 1, op, "ratio", ">= 1", p.ratio);
  SPARSEMLA_CHECK_ARG(p.max_compressed >= 1, op, "max_compressed", ">= 1", p.max_compressed);
  SPARSEMLA_CHECK_ARG(p.out.width >= p.max_compressed, op, "out.width",
                      ">= max_compressed = " + std::to_string(p.max_compressed), p.out.width);
}

void validate_rows(const DenseToRaggedParams& p) {
  if (p.request_index == nullptr) return;  // lengths per row: nothing indexes through data
  check_requests("build_ragged_from_dense", p.common, p.request_index, p.num_requests);
}

void validate_rows(const WindowListParams& p) {
  check_requests("build_window_lists", p.common, p.request_index, p.num_requests);
  check_positions("build_window_lists", p.common, p.positions);
}

void validate_rows(const TopkListParams& p) {
  check_requests("build_topk_lists", p.common, p.request_index, p.num_requests);
}

void validate_rows(const CompressedAllListParams& p) {
  check_requests("build_compressed_all_lists", p.common, p.request_index, p.num_requests);
  check_positions("build_compressed_all_lists", p.common, p.positions);
}

}  // namespace sparsemla::core
