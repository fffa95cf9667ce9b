// CPU builders of the ragged index lists (CONTRACT 4.6).
//
// Every builder writes indptr[0..R] for all R rows and packs row r at indptr[r] (rows of length
// <= W, so everything stays inside the R*W capacity); indices past indptr[R] are left untouched.
// Padding rows get length 0 and none of their inputs is read.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/validate.h"
#include "cpu/cpu_backend.h"
#include "sparsemla/error.h"

namespace sparsemla::cpu {

namespace {

constexpr int32_t kInvalidSlot = -1;

bool is_valid_row(const BuildCommon& c, int64_t r) {
  return c.row_valid == nullptr || c.row_valid[r] != 0;
}

int64_t request_of(const int32_t* request_index, int64_t r) {
  return request_index != nullptr ? request_index[r] : r;
}

// Maps a request's local entry i (token position or compressed index, i >= 0) to its global slot
// through a block table: table[req][i / bs] * bs + i % bs, -1 beyond the table row or outside
// int32.
struct BlockTableMap {
  const int32_t* table;
  int64_t stride;
  int32_t width;
  int32_t block_size;

  int32_t slot(int64_t req, int64_t i) const {
    const int64_t page = i / block_size;
    if (page >= width) return kInvalidSlot;
    const int64_t s = int64_t{table[req * stride + page]} * block_size + i % block_size;
    const bool fits =
        s >= std::numeric_limits<int32_t>::min() && s <= std::numeric_limits<int32_t>::max();
    return fits ? static_cast<int32_t>(s) : kInvalidSlot;
  }
};

// Packs the rows: fill_row(r, dst) writes row r's entries at dst and returns its length (<= W).
template <typename FillRow>
void pack_rows(const BuildCommon& c, const RaggedOut& out, FillRow fill_row) {
  int64_t offset = 0;
  out.indptr[0] = 0;
  for (int64_t r = 0; r < c.num_rows; ++r) {
    if (is_valid_row(c, r)) offset += fill_row(r, out.indices + offset);
    out.indptr[r + 1] = static_cast<int32_t>(offset);  // <= R*W <= 2^31-1 (validated)
  }
}

int64_t clamp_length(int64_t len, int64_t width) {
  return std::clamp<int64_t>(len, 0, width);
}

}  // namespace

void build_ragged_from_dense(const DenseToRaggedParams& p) {
  core::validate_rows(p);
  const int64_t num_slots = p.num_slots;
  pack_rows(p.common, p.out, [&](int64_t r, int32_t* dst) {
    const int64_t len = clamp_length(p.lengths[request_of(p.request_index, r)], p.out.width);
    const int32_t* src = p.dense + r * p.dense_stride;
    for (int64_t j = 0; j < len; ++j) {
      const bool in_range = num_slots == 0 || (src[j] >= 0 && src[j] < num_slots);
      dst[j] = in_range ? src[j] : kInvalidSlot;
    }
    return len;
  });
}

void build_window_lists(const WindowListParams& p) {
  core::validate_rows(p);
  const BlockTableMap map{p.block_table, p.block_table_stride, p.table_width, p.block_size};
  pack_rows(p.common, p.out, [&](int64_t r, int32_t* dst) {
    const int64_t pos = p.positions[r];
    const int64_t len = pos < p.window ? pos + 1 : p.window;  // min(pos + 1, window), no overflow
    const int64_t start = pos - len + 1;                      // max(pos - window + 1, 0)
    const int64_t req = request_of(p.request_index, r);
    for (int64_t j = 0; j < len; ++j) dst[j] = map.slot(req, start + j);
    return len;
  });
}

void build_topk_lists(const TopkListParams& p) {
  core::validate_rows(p);
  const BlockTableMap map{p.block_table, p.block_table_stride, p.table_width, p.block_size};
  const int64_t num_local = int64_t{p.table_width} * p.block_size;  // local ids in [0, Wt*cbs)
  pack_rows(p.common, p.out, [&](int64_t r, int32_t* dst) {
    const int64_t req = request_of(p.request_index, r);
    const int64_t counted =
        p.topk_length != nullptr ? clamp_length(p.topk_length[req], p.out.width) : p.out.width;
    const int32_t* src = p.topk + r * p.topk_stride;
    const auto is_local = [&](int32_t v) { return v >= 0 && v < num_local; };
    // The indexer's sorted top-k puts valid entries first: len = their count, prefix kept.
    const int64_t len = std::count_if(src, src + counted, is_local);
    for (int64_t j = 0; j < len; ++j)
      dst[j] = is_local(src[j]) ? map.slot(req, src[j]) : kInvalidSlot;
    return len;
  });
}

void build_compressed_all_lists(const CompressedAllListParams& p) {
  core::validate_rows(p);
  const BlockTableMap map{p.block_table, p.block_table_stride, p.table_width, p.block_size};
  pack_rows(p.common, p.out, [&](int64_t r, int32_t* dst) {
    const int64_t pos = p.positions[r];
    // (pos + 1) / ratio entries are complete, written without forming pos + 1, and capped
    // before the carry is added (pos = INT64_MAX with ratio 1 would overflow; fuzz_builders).
    const int64_t whole = pos / p.ratio;
    const int64_t len =
        whole >= p.max_compressed
            ? p.max_compressed
            : std::min(whole + (pos % p.ratio == p.ratio - 1 ? 1 : 0), p.max_compressed);
    const int64_t req = request_of(p.request_index, r);
    for (int64_t i = 0; i < len; ++i) dst[i] = map.slot(req, i);
    return len;
  });
}

}  // namespace sparsemla::cpu

namespace sparsemla {

int64_t max_compressed_entries(int64_t max_model_len, int32_t ratio) {
  const char* op = "max_compressed_entries";
  SPARSEMLA_CHECK_ARG(max_model_len >= 0, op, "max_model_len", ">= 0", max_model_len);
  SPARSEMLA_CHECK_ARG(ratio >= 1, op, "ratio", ">= 1", ratio);
  const int64_t entries = max_model_len / ratio + (max_model_len % ratio != 0 ? 1 : 0);
  const int64_t groups = entries / 128 + (entries % 128 != 0 ? 1 : 0);  // roundup to 128
  SPARSEMLA_CHECK_ARG(groups <= std::numeric_limits<int64_t>::max() / 128, op, "max_model_len",
                      "small enough that the entry count fits int64", max_model_len);
  return groups * 128;
}

}  // namespace sparsemla
