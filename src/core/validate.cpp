// Shared argument checks for the views that several operations take.
#include "core/validate.h"

#include <cstdint>
#include <limits>
#include <string>

#include "sparsemla/error.h"

namespace sparsemla::core {

namespace {
std::string field(const char* arg, const char* name) {
  return std::string(arg) + "." + name;
}
}  // namespace

void check_nonneg(const char* op, const char* arg, int64_t v) {
  SPARSEMLA_CHECK_ARG(v >= 0, op, arg, ">= 0", v);
}

void check_extent(const char* op, const std::string& arg, int64_t count, int64_t stride,
                  const std::string& what) {
  if (count <= 1 || stride <= 0) return;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  SPARSEMLA_CHECK_ARG(
      count <= kMax / stride, op, arg,
      "a size whose " + what + " fits in int64 (stride " + std::to_string(stride) + ")", count);
}

void check_cache(const char* op, const char* arg, const CacheView& c) {
  SPARSEMLA_CHECK_ARG(c.num_blocks >= 0, op, field(arg, "num_blocks"), ">= 0", c.num_blocks);
  SPARSEMLA_CHECK_ARG(c.block_size >= 1, op, field(arg, "block_size"), ">= 1", c.block_size);
  const int64_t min_stride = int64_t{c.block_size} * Fp8DsMla::kBytesPerToken;
  SPARSEMLA_CHECK_ARG(c.block_stride >= min_stride, op, field(arg, "block_stride"),
                      ">= block_size*584 = " + std::to_string(min_stride), c.block_stride);
  check_extent(op, field(arg, "num_blocks"), c.num_blocks, c.block_stride,
               "num_blocks*block_stride (bytes)");
  SPARSEMLA_CHECK_ARG(c.num_blocks == 0 || c.base != nullptr, op, field(arg, "base"),
                      "a non-null pointer for a non-empty cache", "null");
}

void check_indexer_cache(const char* op, const char* arg, const IndexerCacheView& c) {
  SPARSEMLA_CHECK_ARG(c.num_blocks >= 0, op, field(arg, "num_blocks"), ">= 0", c.num_blocks);
  SPARSEMLA_CHECK_ARG(c.block_size >= 1, op, field(arg, "block_size"), ">= 1", c.block_size);
  const int64_t min_stride = int64_t{c.block_size} * IndexerFp8::kBytesPerToken;
  SPARSEMLA_CHECK_ARG(c.block_stride >= min_stride, op, field(arg, "block_stride"),
                      ">= block_size*132 = " + std::to_string(min_stride), c.block_stride);
  check_extent(op, field(arg, "num_blocks"), c.num_blocks, c.block_stride,
               "num_blocks*block_stride (bytes)");
  SPARSEMLA_CHECK_ARG(c.layout == IndexerLayout::Normal || c.layout == IndexerLayout::Shuffle, op,
                      field(arg, "layout"), "Normal or Shuffle", static_cast<int>(c.layout));
  SPARSEMLA_CHECK_ARG(c.layout != IndexerLayout::Shuffle || c.block_size % 16 == 0, op,
                      field(arg, "block_size"), "a multiple of 16 for the SHUFFLE layout",
                      c.block_size);
  SPARSEMLA_CHECK_ARG(c.num_blocks == 0 || c.base != nullptr, op, field(arg, "base"),
                      "a non-null pointer for a non-empty cache", "null");
}

void check_rope(const char* op, const char* arg, const RopeTable& r) {
  SPARSEMLA_CHECK_ARG(r.data != nullptr, op, field(arg, "data"), "a non-null cos/sin table",
                      "null");
  SPARSEMLA_CHECK_ARG(r.rows >= 1, op, field(arg, "rows"), ">= 1", r.rows);
  SPARSEMLA_CHECK_ARG(r.row_stride >= 64, op, field(arg, "row_stride"), ">= 64", r.row_stride);
  check_extent(op, field(arg, "rows"), r.rows, r.row_stride, "rows*row_stride (elements)");
  check_aligned(op, field(arg, "data"), r.data);
}

void check_state(const char* op, const char* arg, const StateCacheView& s, int64_t row_width) {
  SPARSEMLA_CHECK_ARG(s.base != nullptr, op, field(arg, "base"), "a non-null pointer", "null");
  SPARSEMLA_CHECK_ARG(s.num_blocks >= 1, op, field(arg, "num_blocks"), ">= 1", s.num_blocks);
  SPARSEMLA_CHECK_ARG(s.block_size >= 1, op, field(arg, "block_size"), ">= 1", s.block_size);
  SPARSEMLA_CHECK_ARG(s.row_stride >= row_width, op, field(arg, "row_stride"),
                      ">= 2W = " + std::to_string(row_width), s.row_stride);
  check_extent(op, field(arg, "block_size"), s.block_size, s.row_stride,
               "block_size*row_stride (elements)");
  const int64_t min_block = int64_t{s.block_size} * s.row_stride;
  SPARSEMLA_CHECK_ARG(s.block_stride >= min_block, op, field(arg, "block_stride"),
                      ">= block_size*row_stride = " + std::to_string(min_block), s.block_stride);
  check_extent(op, field(arg, "num_blocks"), s.num_blocks, s.block_stride,
               "num_blocks*block_stride (elements)");
  check_aligned(op, field(arg, "base"), s.base);
}

}  // namespace sparsemla::core
