// Fuzz target: the four CPU ragged-list builders (CONTRACT 4.6) with garbage lengths, request
// indices, positions, top-k entries and block tables, padding rows, and bad shapes. Oracle: each
// builder written out here from CONTRACT 4.6; indptr[0..R] and the packed rows must match it
// exactly, indices past indptr[R] stay untouched; a call is rejected exactly when a shape is bad or
// a valid row's request / position is out of range, and a rejected call writes nothing.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/lists.h"

namespace sparsemla::fuzz {

namespace {

constexpr int32_t kCanary = 0x5EED5EED;

struct Table {
  std::vector<int32_t> ids;
  int64_t stride = 0;
  int32_t width = 0;
  int64_t requests = 0;
  int32_t block_size = 1;

  // CONTRACT 4.6: local entry i of request req -> table[req][i / bs] * bs + i % bs; -1 beyond the
  // row; -1 when the slot does not fit int32.
  int32_t slot(int64_t req, int64_t i) const {
    const int64_t page = i / block_size;
    if (page >= width) return -1;
    const int64_t s = int64_t{ids[req * stride + page]} * block_size + i % block_size;
    return s < std::numeric_limits<int32_t>::min() || s > std::numeric_limits<int32_t>::max()
               ? -1
               : static_cast<int32_t>(s);
  }
};

Table make_table(Input& in, bool& must_reject) {
  Table t;
  t.width = static_cast<int32_t>(in.range(1, 6));
  t.stride = t.width + in.range(0, 2);
  t.requests = in.range(0, 6);
  t.block_size = static_cast<int32_t>(in.range(1, 64));
  t.ids.resize(static_cast<size_t>(std::max<int64_t>(1, t.requests * t.stride)));
  for (auto& v : t.ids) v = in.int32_like(0, 40);
  if (in.one_in(16)) {
    const int which = static_cast<int>(in.range(0, 2));
    if (which == 0) t.block_size = static_cast<int32_t>(-in.range(0, 2));
    if (which == 1) t.stride = t.width - 1;
    if (which == 2) t.requests = -1;
    must_reject = true;
  }
  return t;
}

template <typename Params>
void set_table(Params& p, const Table& t) {
  p.block_table = t.ids.data();
  p.block_table_stride = t.stride;
  p.table_width = t.width;
  p.num_requests = t.requests;
  p.block_size = t.block_size;
}

struct Rows {
  int64_t R = 0, W = 1;
  std::vector<uint8_t> valid;  // empty: all rows valid
  std::vector<int32_t> request_index;
  bool is_valid(int64_t r) const { return valid.empty() || valid[r] != 0; }
  int64_t request(int64_t r) const { return request_index.empty() ? r : request_index[r]; }
};

// Rows, padding flags and request indices; a valid row whose request is outside [0, requests)
// makes the call invalid.
Rows make_rows(Input& in, int64_t requests, bool with_index, bool& must_reject) {
  Rows rows;
  rows.R = in.range(0, 24);
  rows.W = in.range(1, 160);
  if (in.flag()) {
    rows.valid.resize(static_cast<size_t>(rows.R));
    for (auto& v : rows.valid) v = static_cast<uint8_t>(in.range(0, 3) != 0 ? 1 : 0);
  }
  if (with_index) {
    rows.request_index.resize(static_cast<size_t>(rows.R));
    for (auto& v : rows.request_index) v = in.int32_like(0, std::max<int64_t>(0, requests - 1));
  }
  for (int64_t r = 0; r < rows.R; ++r) {
    const int64_t req = rows.request(r);
    if (rows.is_valid(r) && (req < 0 || req >= requests)) must_reject = true;
  }
  return rows;
}

// Runs a builder into exact-size canary-filled buffers and checks it against `expected_rows`
// (one vector per row, empty for padding rows).
template <typename Call>
void check_builder(const char* op, Call call, const Rows& rows, bool must_reject,
                   const std::vector<std::vector<int32_t>>& expected_rows, RaggedOut& out,
                   std::vector<int32_t>& indices, std::vector<int32_t>& indptr) {
  const std::vector<int32_t> indices_before = indices, indptr_before = indptr;
  std::string why;
  const bool ok = accepted(call, &why);
  expect_verdict(ok, must_reject, why, op);
  if (!ok) {
    SPARSEMLA_FUZZ_CHECK(indices == indices_before && indptr == indptr_before,
                         std::string(op) + " wrote before rejecting");
    return;
  }
  (void)out;
  int64_t offset = 0;
  SPARSEMLA_FUZZ_CHECK(indptr[0] == 0, std::string(op) + ": indptr[0] != 0");
  for (int64_t r = 0; r < rows.R; ++r) {
    const auto& want = expected_rows[r];
    for (size_t j = 0; j < want.size(); ++j) {
      SPARSEMLA_FUZZ_CHECK(indices[offset + j] == want[j],
                           std::string(op) + ": row " + std::to_string(r) + " entry " +
                               std::to_string(j) + " differs from CONTRACT 4.6");
    }
    offset += static_cast<int64_t>(want.size());
    SPARSEMLA_FUZZ_CHECK(indptr[r + 1] == offset,
                         std::string(op) + ": indptr[" + std::to_string(r + 1) + "] differs");
  }
  for (int64_t i = offset; i < static_cast<int64_t>(indices.size()); ++i) {
    SPARSEMLA_FUZZ_CHECK(indices[i] == indices_before[i],
                         std::string(op) + ": indices past indptr[R] were written");
  }
}

void fuzz_dense(Input& in) {
  bool must_reject = false;
  const bool per_request = in.flag();
  const int64_t requests = in.range(0, 6);
  Rows rows = make_rows(in, per_request ? requests : std::numeric_limits<int64_t>::max(),
                        per_request, must_reject);
  const int64_t stride = rows.W + in.range(0, 3);
  std::vector<int32_t> dense(static_cast<size_t>(rows.R * stride));
  for (auto& v : dense) v = in.int32_like(-1, 50);
  // At least one element: a null `lengths` is rejected even when every row is padding.
  std::vector<int32_t> lengths(
      static_cast<size_t>(std::max<int64_t>(1, per_request ? requests : rows.R)));
  for (auto& v : lengths) v = in.int32_like(0, rows.W);
  const int64_t num_slots = in.range(0, 50);
  std::vector<std::vector<int32_t>> want(static_cast<size_t>(rows.R));
  for (int64_t r = 0; r < rows.R && !must_reject; ++r) {
    if (!rows.is_valid(r)) continue;
    const int64_t len = std::clamp<int64_t>(lengths[rows.request(r)], 0, rows.W);
    for (int64_t j = 0; j < len; ++j) {
      const int32_t v = dense[r * stride + j];
      want[r].push_back(num_slots == 0 || (v >= 0 && v < num_slots) ? v : -1);
    }
  }
  std::vector<int32_t> indices(static_cast<size_t>(rows.R * rows.W), kCanary);
  std::vector<int32_t> indptr(static_cast<size_t>(rows.R + 1), kCanary);
  DenseToRaggedParams p;
  p.common.num_rows = rows.R;
  p.common.row_valid = rows.valid.empty() ? nullptr : rows.valid.data();
  p.common.path = Path::Cpu;
  p.dense = dense.data();
  p.dense_stride = stride;
  p.lengths = lengths.data();
  p.request_index = per_request ? rows.request_index.data() : nullptr;
  p.num_requests = requests;
  p.num_slots = num_slots;
  p.out = {indices.data(), indptr.data(), rows.W};
  if (in.one_in(16)) {
    p.dense_stride = rows.W - in.range(1, 3);
    must_reject = true;
  }
  check_builder(
      "build_ragged_from_dense", [&] { build_ragged_from_dense(p); }, rows, must_reject, want,
      p.out, indices, indptr);
}

void fuzz_window(Input& in) {
  bool must_reject = false;
  const Table t = make_table(in, must_reject);
  const bool with_index = in.flag();
  Rows rows = make_rows(in, t.requests, with_index, must_reject);
  int64_t window = in.range(1, rows.W);
  std::vector<int64_t> positions(static_cast<size_t>(rows.R));
  for (auto& v : positions) v = in.int64_like(0, 1000);
  for (int64_t r = 0; r < rows.R; ++r) {
    if (rows.is_valid(r) && positions[r] < 0) must_reject = true;
  }
  if (in.one_in(16)) {
    window = in.flag() ? 0 : rows.W + 1;
    must_reject = true;
  }
  std::vector<std::vector<int32_t>> want(static_cast<size_t>(rows.R));
  for (int64_t r = 0; r < rows.R && !must_reject; ++r) {
    if (!rows.is_valid(r)) continue;
    const int64_t pos = positions[r];
    const int64_t len = std::min<int64_t>(pos, window - 1) + 1;  // min(pos + 1, window)
    const int64_t start = pos - len + 1;                         // max(pos - window + 1, 0)
    for (int64_t j = 0; j < len; ++j) want[r].push_back(t.slot(rows.request(r), start + j));
  }
  std::vector<int32_t> indices(static_cast<size_t>(rows.R * rows.W), kCanary);
  std::vector<int32_t> indptr(static_cast<size_t>(rows.R + 1), kCanary);
  WindowListParams p;
  p.common.num_rows = rows.R;
  p.common.row_valid = rows.valid.empty() ? nullptr : rows.valid.data();
  p.common.path = Path::Cpu;
  p.positions = positions.data();
  p.request_index = with_index ? rows.request_index.data() : nullptr;
  set_table(p, t);
  p.window = static_cast<int32_t>(window);
  p.out = {indices.data(), indptr.data(), rows.W};
  check_builder(
      "build_window_lists", [&] { build_window_lists(p); }, rows, must_reject, want, p.out, indices,
      indptr);
}

void fuzz_topk(Input& in) {
  bool must_reject = false;
  const Table t = make_table(in, must_reject);
  const bool with_index = in.flag();
  Rows rows = make_rows(in, t.requests, with_index, must_reject);
  const int64_t stride = rows.W + in.range(0, 2);
  const int64_t num_local = int64_t{t.width} * std::max(t.block_size, 1);
  std::vector<int32_t> topk(static_cast<size_t>(rows.R * stride));
  for (auto& v : topk) v = in.int32_like(-1, num_local);
  std::vector<int32_t> topk_length;
  if (in.flag()) {
    topk_length.resize(static_cast<size_t>(std::max<int64_t>(t.requests, 1)));
    for (auto& v : topk_length) v = in.int32_like(0, rows.W);
  }
  std::vector<std::vector<int32_t>> want(static_cast<size_t>(rows.R));
  for (int64_t r = 0; r < rows.R && !must_reject; ++r) {
    if (!rows.is_valid(r)) continue;
    const int64_t req = rows.request(r);
    const int64_t counted =
        topk_length.empty() ? rows.W : std::clamp<int64_t>(topk_length[req], 0, rows.W);
    const int32_t* src = topk.data() + r * stride;
    int64_t len = 0;
    for (int64_t j = 0; j < counted; ++j) len += src[j] >= 0 && src[j] < num_local;
    for (int64_t j = 0; j < len; ++j) {
      want[r].push_back(src[j] >= 0 && src[j] < num_local ? t.slot(req, src[j]) : -1);
    }
  }
  std::vector<int32_t> indices(static_cast<size_t>(rows.R * rows.W), kCanary);
  std::vector<int32_t> indptr(static_cast<size_t>(rows.R + 1), kCanary);
  TopkListParams p;
  p.common.num_rows = rows.R;
  p.common.row_valid = rows.valid.empty() ? nullptr : rows.valid.data();
  p.common.path = Path::Cpu;
  p.topk = topk.data();
  p.topk_stride = stride;
  p.topk_length = topk_length.empty() ? nullptr : topk_length.data();
  p.request_index = with_index ? rows.request_index.data() : nullptr;
  set_table(p, t);
  p.out = {indices.data(), indptr.data(), rows.W};
  check_builder(
      "build_topk_lists", [&] { build_topk_lists(p); }, rows, must_reject, want, p.out, indices,
      indptr);
}

void fuzz_compressed_all(Input& in) {
  bool must_reject = false;
  const Table t = make_table(in, must_reject);
  const bool with_index = in.flag();
  Rows rows = make_rows(in, t.requests, with_index, must_reject);
  int32_t ratio = static_cast<int32_t>(in.range(1, 200));
  int64_t max_compressed = in.range(1, rows.W);
  std::vector<int64_t> positions(static_cast<size_t>(rows.R));
  for (auto& v : positions) v = in.int64_like(0, 30000);
  for (int64_t r = 0; r < rows.R; ++r) {
    if (rows.is_valid(r) && positions[r] < 0) must_reject = true;
  }
  if (in.one_in(16)) {
    const int which = static_cast<int>(in.range(0, 2));
    if (which == 0) ratio = 0;
    if (which == 1) max_compressed = 0;
    if (which == 2) max_compressed = rows.W + 1;
    must_reject = true;
  }
  std::vector<std::vector<int32_t>> want(static_cast<size_t>(rows.R));
  for (int64_t r = 0; r < rows.R && !must_reject; ++r) {
    if (!rows.is_valid(r)) continue;
    const int64_t pos = positions[r];
    // min((pos + 1) / ratio, max_compressed), in 128-bit arithmetic (pos may be INT64_MAX).
    const auto complete = (static_cast<__int128>(pos) + 1) / ratio;
    const int64_t n = static_cast<int64_t>(std::min<__int128>(complete, max_compressed));
    for (int64_t i = 0; i < n; ++i) want[r].push_back(t.slot(rows.request(r), i));
  }
  std::vector<int32_t> indices(static_cast<size_t>(rows.R * rows.W), kCanary);
  std::vector<int32_t> indptr(static_cast<size_t>(rows.R + 1), kCanary);
  CompressedAllListParams p;
  p.common.num_rows = rows.R;
  p.common.row_valid = rows.valid.empty() ? nullptr : rows.valid.data();
  p.common.path = Path::Cpu;
  p.positions = positions.data();
  p.request_index = with_index ? rows.request_index.data() : nullptr;
  set_table(p, t);
  p.ratio = ratio;
  p.max_compressed = max_compressed;
  p.out = {indices.data(), indptr.data(), rows.W};
  check_builder(
      "build_compressed_all_lists", [&] { build_compressed_all_lists(p); }, rows, must_reject, want,
      p.out, indices, indptr);
}

}  // namespace

int run_builders(const uint8_t* data, size_t size) {
  Input in(data, size);
  switch (in.range(0, 3)) {
    case 0:
      fuzz_dense(in);
      break;
    case 1:
      fuzz_window(in);
      break;
    case 2:
      fuzz_topk(in);
      break;
    default:
      fuzz_compressed_all(in);
      break;
  }
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_builders)
