// Ragged-list builders (CONTRACT 4.6) against straightforward in-test implementations on random
// inputs, and the graph-buffer contract: persistent buffers reused across steps with a changing
// live batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "reference/random.h"
#include "sparsemla/error.h"
#include "sparsemla/lists.h"

namespace sparsemla {
namespace {

using test::Rng;
using Rows = std::vector<std::vector<int32_t>>;

constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kGuard = 64;  // poisoned elements after each buffer's capacity: must stay intact
const std::vector<int32_t> kPageSizes = {1, 2, 64, 256};

// ---- Output buffers: poisoned before every build, checked after ---------------------------------

struct OutBuffers {
  int64_t rows;
  int64_t width;
  std::vector<int32_t> indices, indptr;          // [rows*width + guard], [rows + 1 + guard]
  std::vector<int32_t> indices_was, indptr_was;  // the poison, to prove what was left untouched

  OutBuffers(int64_t r, int64_t w)
      : rows(r), width(w), indices(r * w + kGuard), indptr(r + 1 + kGuard) {}

  void poison(Rng& rng) {
    for (auto& v : indices) v = static_cast<int32_t>(rng.randint(kI32Min, kI32Max));
    for (auto& v : indptr) v = static_cast<int32_t>(rng.randint(kI32Min, kI32Max));
    indices_was = indices;
    indptr_was = indptr;
  }
  RaggedOut out() { return RaggedOut{indices.data(), indptr.data(), width}; }
};

// Checks the packed ragged output against the expected rows (for `num_rows` rows) and that nothing
// past indptr[R] in indices, nor past indptr[R] in indptr, was written.
void expect_rows(const OutBuffers& b, int64_t num_rows, const Rows& expected) {
  ASSERT_EQ(static_cast<int64_t>(expected.size()), num_rows);
  ASSERT_EQ(b.indptr[0], 0);
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t begin = b.indptr[r], end = b.indptr[r + 1];
    ASSERT_LE(begin, end) << "row " << r;
    ASSERT_LE(end, (r + 1) * b.width) << "row " << r << " ends past (r+1)*W";
    ASSERT_EQ(end - begin, static_cast<int64_t>(expected[r].size())) << "length of row " << r;
    for (int64_t j = 0; j < end - begin; ++j) {
      ASSERT_EQ(b.indices[begin + j], expected[r][j]) << "row " << r << " entry " << j;
    }
  }
  for (size_t i = b.indptr[num_rows]; i < b.indices.size(); ++i) {
    ASSERT_EQ(b.indices[i], b.indices_was[i]) << "indices[" << i << "] past indptr[R] was written";
  }
  for (size_t i = num_rows + 1; i < b.indptr.size(); ++i) {
    ASSERT_EQ(b.indptr[i], b.indptr_was[i]) << "indptr[" << i << "] past R was written";
  }
}

// ---- Shared random inputs
// ---------------------------------------------------------------------------

struct BlockTable {
  int64_t num_requests;
  int32_t width;
  int64_t stride;
  int32_t block_size;
  std::vector<int32_t> data;

  // slot of local entry i of request req, as CONTRACT 4.6 writes it; -1 beyond the table row.
  int32_t slot(int64_t req, int64_t i) const {
    if (i / block_size >= width) return -1;
    return static_cast<int32_t>(int64_t{data[req * stride + i / block_size]} * block_size +
                                i % block_size);
  }
};

// Random block ids (about 5% unallocated: -1) in a table with a padded row stride.
BlockTable random_table(Rng& rng, int64_t num_requests, int32_t width, int32_t block_size) {
  BlockTable t{num_requests, width, width + rng.randint(0, 3), block_size, {}};
  t.data.resize(num_requests * t.stride);
  for (auto& v : t.data)
    v = rng.randint(0, 19) == 0 ? -1 : static_cast<int32_t>(rng.randint(0, 65535));
  return t;
}

// Valid flags: ~20% padding rows.
std::vector<uint8_t> random_valid(Rng& rng, int64_t rows) {
  std::vector<uint8_t> v(rows);
  for (auto& x : v) x = rng.randint(0, 4) != 0;
  return v;
}

// MTP request mapping: s_q consecutive rows per request.
std::vector<int32_t> mtp_requests(int64_t num_requests, int64_t s_q) {
  std::vector<int32_t> req(num_requests * s_q);
  for (size_t r = 0; r < req.size(); ++r) req[r] = static_cast<int32_t>(r / s_q);
  return req;
}

// Padding rows carry garbage that a builder must neither validate nor read into a row.
void garble_padding(Rng& rng, const std::vector<uint8_t>& valid, std::vector<int64_t>* positions,
                    std::vector<int32_t>* request_index) {
  for (size_t r = 0; r < valid.size(); ++r) {
    if (valid[r]) continue;
    if (positions != nullptr) (*positions)[r] = -rng.randint(1, 1000);
    if (request_index != nullptr) (*request_index)[r] = rng.randint(0, 1) ? -1 : kI32Max;
  }
}

// Positions near 0 (window shorter than 128), inside the table and beyond it.
int64_t random_position(Rng& rng, int64_t table_tokens) {
  switch (rng.randint(0, 3)) {
    case 0:
      return rng.randint(0, 130);
    case 1:
      return rng.randint(0, std::max<int64_t>(table_tokens - 1, 0));
    case 2:
      return std::max<int64_t>(table_tokens + rng.randint(-130, 300), 0);  // crosses the end
    default:
      return rng.randint(0, 3 * table_tokens + 500);
  }
}

template <typename Fn>
void expect_arg_error(Fn fn, const std::string& arg) {
  try {
    fn();
    ADD_FAILURE() << "expected sparsemla::Error naming '" << arg << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
  }
}

// ---- Straightforward references (CONTRACT 4.6, written out) -----------------------------------

Rows ref_window(const std::vector<int64_t>& pos, const std::vector<int32_t>& req,
                const std::vector<uint8_t>& valid, const BlockTable& t) {
  Rows rows(pos.size());
  for (size_t r = 0; r < pos.size(); ++r) {
    if (!valid[r]) continue;
    const int64_t start = std::max<int64_t>(pos[r] - 127, 0);
    const int64_t len = std::min<int64_t>(pos[r] + 1, 128);
    for (int64_t j = 0; j < len; ++j) rows[r].push_back(t.slot(req[r], start + j));
  }
  return rows;
}

Rows ref_topk(const std::vector<int32_t>& topk, int64_t stride, int64_t w,
              const std::vector<int32_t>* topk_length, const std::vector<int32_t>& req,
              const std::vector<uint8_t>& valid, const BlockTable& t) {
  const int64_t rows_n = static_cast<int64_t>(req.size());
  const int64_t local = int64_t{t.width} * t.block_size;
  Rows rows(rows_n);
  for (int64_t r = 0; r < rows_n; ++r) {
    if (!valid[r]) continue;
    int64_t counted = w;
    if (topk_length != nullptr) counted = std::min<int64_t>(std::max((*topk_length)[req[r]], 0), w);
    int64_t len = 0;
    for (int64_t j = 0; j < counted; ++j) {
      const int32_t v = topk[r * stride + j];
      if (v >= 0 && v < local) ++len;
    }
    for (int64_t j = 0; j < len; ++j) {
      const int32_t v = topk[r * stride + j];
      rows[r].push_back(v >= 0 && v < local ? t.slot(req[r], v) : -1);
    }
  }
  return rows;
}

Rows ref_compressed_all(const std::vector<int64_t>& pos, const std::vector<int32_t>& req,
                        const std::vector<uint8_t>& valid, const BlockTable& t, int32_t ratio,
                        int64_t max_compressed) {
  Rows rows(pos.size());
  for (size_t r = 0; r < pos.size(); ++r) {
    if (!valid[r]) continue;
    const int64_t n = std::min((pos[r] + 1) / ratio, max_compressed);
    for (int64_t i = 0; i < n; ++i) rows[r].push_back(t.slot(req[r], i));
  }
  return rows;
}

Rows ref_dense(const std::vector<int32_t>& dense, int64_t stride, int64_t w,
               const std::vector<int32_t>& lengths, const std::vector<int32_t>* req,
               const std::vector<uint8_t>& valid, int64_t num_slots) {
  Rows rows(valid.size());
  for (size_t r = 0; r < valid.size(); ++r) {
    if (!valid[r]) continue;
    const int32_t given = lengths[req != nullptr ? (*req)[r] : r];
    const int64_t len = std::min<int64_t>(std::max(given, 0), w);
    for (int64_t j = 0; j < len; ++j) {
      const int32_t v = dense[r * stride + j];
      rows[r].push_back(num_slots > 0 && (v < 0 || v >= num_slots) ? -1 : v);
    }
  }
  return rows;
}

// ---- Per-builder random cases -----------------------------------------------------------------

// One random window-list case with R rows (valid flags given) into `b`; returns the expected rows.
Rows run_window_case(Rng& rng, int32_t bs, const std::vector<uint8_t>& valid, OutBuffers& b) {
  const int64_t rows = static_cast<int64_t>(valid.size());
  const int64_t num_requests = rng.randint(1, 9);
  const int32_t table_width = static_cast<int32_t>(rng.randint(1, 600 / bs + 3));
  const BlockTable t = random_table(rng, num_requests, table_width, bs);
  std::vector<int64_t> pos(rows);
  std::vector<int32_t> req(rows);
  for (int64_t r = 0; r < rows; ++r) {
    pos[r] = random_position(rng, int64_t{table_width} * bs);
    req[r] = static_cast<int32_t>(rng.randint(0, num_requests - 1));
  }
  garble_padding(rng, valid, &pos, &req);

  WindowListParams p;
  p.common.num_rows = rows;
  p.common.row_valid = valid.data();
  p.common.path = Path::Cpu;
  p.positions = pos.data();
  p.request_index = req.data();
  p.block_table = t.data.data();
  p.block_table_stride = t.stride;
  p.table_width = t.width;
  p.num_requests = t.num_requests;
  p.block_size = bs;
  p.out = b.out();
  build_window_lists(p);
  return ref_window(pos, req, valid, t);
}

// A top-k row: valid local ids first (with some invalid ones mixed into that prefix), then mostly
// -1 with the occasional stray valid id (which still counts towards len).
std::vector<int32_t> random_topk(Rng& rng, int64_t rows, int64_t w, int64_t stride, int64_t local) {
  const std::vector<int32_t> junk = {
      -1, -5, kI32Min, static_cast<int32_t>(local), static_cast<int32_t>(local + 7), kI32Max};
  const auto pick_junk = [&] { return junk[rng.randint(0, junk.size() - 1)]; };
  const auto pick_local = [&] { return static_cast<int32_t>(rng.randint(0, local - 1)); };
  std::vector<int32_t> topk(rows * stride);
  for (auto& v : topk) v = pick_junk();  // also fills the stride padding
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t prefix = rng.randint(0, w);
    for (int64_t j = 0; j < w; ++j) {
      const bool in_prefix = j < prefix;
      const bool use_local = in_prefix ? rng.randint(0, 9) != 0 : rng.randint(0, 19) == 0;
      topk[r * stride + j] = use_local ? pick_local() : (in_prefix ? pick_junk() : -1);
    }
  }
  return topk;
}

struct TopkCase {
  int32_t bs;
  int64_t w;
  int64_t s_q;        // rows per request (MTP)
  bool with_lengths;  // per-request topk_length
};

Rows run_topk_case(Rng& rng, const TopkCase& c, const std::vector<uint8_t>& valid, OutBuffers& b) {
  const int64_t rows = static_cast<int64_t>(valid.size());
  const int64_t num_requests = rows / c.s_q;
  const int32_t table_width = static_cast<int32_t>(rng.randint(1, 600 / c.bs + 2));
  const BlockTable t = random_table(rng, num_requests, table_width, c.bs);
  const int64_t stride = c.w + rng.randint(0, 5);
  const auto topk = random_topk(rng, rows, c.w, stride, int64_t{table_width} * c.bs);
  std::vector<int32_t> lengths(num_requests);
  for (auto& l : lengths) l = static_cast<int32_t>(rng.randint(-2, c.w + 3));
  std::vector<int32_t> req = mtp_requests(num_requests, c.s_q);
  const Rows expected =
      ref_topk(topk, stride, c.w, c.with_lengths ? &lengths : nullptr, req, valid, t);
  garble_padding(rng, valid, nullptr, &req);

  TopkListParams p;
  p.common.num_rows = rows;
  p.common.row_valid = valid.data();
  p.common.path = Path::Cpu;
  p.topk = topk.data();
  p.topk_stride = stride;
  p.topk_length = c.with_lengths ? lengths.data() : nullptr;
  p.request_index = req.data();
  p.block_table = t.data.data();
  p.block_table_stride = t.stride;
  p.table_width = t.width;
  p.num_requests = num_requests;
  p.block_size = c.bs;
  p.out = b.out();
  build_topk_lists(p);
  return expected;
}

Rows run_compressed_all_case(Rng& rng, int32_t bs, int32_t ratio, int64_t max_compressed,
                             const std::vector<uint8_t>& valid, OutBuffers& b) {
  const int64_t rows = static_cast<int64_t>(valid.size());
  const int64_t num_requests = rng.randint(1, 6);
  // Tables sometimes shorter than max_compressed: entries beyond them become -1.
  const int32_t table_width =
      static_cast<int32_t>(rng.randint(1, (max_compressed + bs - 1) / bs + 2));
  const BlockTable t = random_table(rng, num_requests, table_width, bs);
  std::vector<int64_t> pos(rows);
  std::vector<int32_t> req(rows);
  for (int64_t r = 0; r < rows; ++r) {
    // Up to well past max_compressed entries (the clamp), plus exact entry boundaries.
    pos[r] = rng.randint(0, 2) == 0
                 ? rng.randint(1, max_compressed + 20) * ratio - 1 + rng.randint(-1, 1)
                 : rng.randint(0, (max_compressed + 40) * ratio);
    pos[r] = std::max<int64_t>(pos[r], 0);
    req[r] = static_cast<int32_t>(rng.randint(0, num_requests - 1));
  }
  garble_padding(rng, valid, &pos, &req);

  CompressedAllListParams p;
  p.common.num_rows = rows;
  p.common.row_valid = valid.data();
  p.common.path = Path::Cpu;
  p.positions = pos.data();
  p.request_index = req.data();
  p.block_table = t.data.data();
  p.block_table_stride = t.stride;
  p.table_width = t.width;
  p.num_requests = num_requests;
  p.block_size = bs;
  p.ratio = ratio;
  p.max_compressed = max_compressed;
  p.out = b.out();
  build_compressed_all_lists(p);
  return ref_compressed_all(pos, req, valid, t, ratio, max_compressed);
}

Rows run_dense_case(Rng& rng, int64_t w, int64_t num_slots, bool per_request,
                    const std::vector<uint8_t>& valid, OutBuffers& b) {
  const int64_t rows = static_cast<int64_t>(valid.size());
  const int64_t stride = w + rng.randint(0, 5);
  const int64_t value_hi = num_slots > 0 ? num_slots + 3 : 100000;
  std::vector<int32_t> dense(rows * stride);
  for (auto& v : dense) {
    v = rng.randint(0, 15) == 0 ? (rng.randint(0, 1) ? kI32Min : kI32Max)
                                : static_cast<int32_t>(rng.randint(-3, value_hi));
  }
  const int64_t num_requests = per_request ? rng.randint(1, 5) : rows;
  std::vector<int32_t> lengths(num_requests);
  for (auto& l : lengths) l = static_cast<int32_t>(rng.randint(-3, w + 3));
  std::vector<int32_t> req(rows);
  for (auto& q : req) q = static_cast<int32_t>(rng.randint(0, num_requests - 1));
  const Rows expected =
      ref_dense(dense, stride, w, lengths, per_request ? &req : nullptr, valid, num_slots);
  if (per_request) garble_padding(rng, valid, nullptr, &req);

  DenseToRaggedParams p;
  p.common.num_rows = rows;
  p.common.row_valid = valid.data();
  p.common.path = Path::Cpu;
  p.dense = dense.data();
  p.dense_stride = stride;
  p.lengths = lengths.data();
  p.request_index = per_request ? req.data() : nullptr;
  p.num_requests = per_request ? num_requests : 0;
  p.num_slots = num_slots;
  p.out = b.out();
  build_ragged_from_dense(p);
  return expected;
}

// ---- Tests: builders against the references
// -------------------------------------------------------

TEST(WindowListsCpu, MatchesReferencePageSizes1_2_64_256) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t bs : kPageSizes) {
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t rows = rng.randint(1, 40);
      OutBuffers b(rows, 128);
      b.poison(rng);
      const auto valid = random_valid(rng, rows);
      const Rows expected = run_window_case(rng, bs, valid, b);
      SCOPED_TRACE("bs=" + std::to_string(bs));
      expect_rows(b, rows, expected);
    }
  }
}

TEST(WindowListsCpu, NearPositionZeroAndPagesBeyondTable) {
  // Hand-checked: bs = 2, table [7, 3] (4 tokens), request 0.
  const std::vector<int32_t> table = {7, 3};
  const std::vector<int64_t> pos = {0, 2, 5, 200};
  OutBuffers b(4, 128);
  Rng rng(test::fresh_seed());
  b.poison(rng);
  WindowListParams p;
  p.common.num_rows = 4;
  p.common.path = Path::Cpu;
  p.positions = pos.data();
  p.block_table = table.data();
  p.block_table_stride = 2;
  p.table_width = 2;
  p.num_requests = 1;
  const std::vector<int32_t> req = {0, 0, 0, 0};  // MTP-like: four rows of one request
  p.request_index = req.data();
  p.block_size = 2;
  p.out = b.out();
  build_window_lists(p);
  Rows expected = {{14}, {14, 15, 6}, {14, 15, 6, 7, -1, -1}, {}};
  expected[3].assign(128, -1);  // positions 73..200: all beyond the 4-token table
  expect_rows(b, 4, expected);
}

TEST(WindowListsCpu, SlotOutsideInt32BecomesInvalid) {
  // bs = 4: block 536870911 holds slots up to 2^31-1 exactly; block 2^29 would start at 2^31.
  const std::vector<int32_t> table = {536870911, 1 << 29};
  const std::vector<int64_t> pos = {7};
  OutBuffers b(1, 128);
  Rng rng(test::fresh_seed());
  b.poison(rng);
  WindowListParams p;
  p.common.num_rows = 1;
  p.common.path = Path::Cpu;
  p.positions = pos.data();
  p.block_table = table.data();
  p.block_table_stride = 2;
  p.table_width = 2;
  p.num_requests = 1;
  p.block_size = 4;
  p.out = b.out();
  build_window_lists(p);
  expect_rows(b, 1, {{kI32Max - 3, kI32Max - 2, kI32Max - 1, kI32Max, -1, -1, -1, -1}});
}

TEST(TopkListsCpu, MatchesReferenceWithInvalidEntriesAndPerRequestLengths) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t bs : kPageSizes) {
    for (int64_t w : {64, 512}) {
      for (int64_t s_q : {1, 2, 3}) {
        for (bool with_lengths : {false, true}) {
          const int64_t rows = rng.randint(1, 12) * s_q;
          OutBuffers b(rows, w);
          b.poison(rng);
          const auto valid = random_valid(rng, rows);
          const Rows expected = run_topk_case(rng, {bs, w, s_q, with_lengths}, valid, b);
          SCOPED_TRACE("bs=" + std::to_string(bs) + " W=" + std::to_string(w) +
                       " s_q=" + std::to_string(s_q) + " lengths=" + std::to_string(with_lengths));
          expect_rows(b, rows, expected);
        }
      }
    }
  }
}

TEST(TopkListsCpu, LengthIsBroadcastToEveryRowOfItsRequest) {
  // Two requests with s_q = 2 (MTP); topk_length is per request [2] = {3, 1}. bs = 1, table
  // width 8: local i -> table[i]. Rows 0, 1 read request 0's length, rows 2, 3 request 1's.
  const std::vector<int32_t> table = {10, 11, 12, 13, 14, 15, 16, 17,   // request 0
                                      20, 21, 22, 23, 24, 25, 26, 27};  // request 1
  const std::vector<int32_t> topk = {0, 1, 2, 3, 5,  9, 4, 1,           // row 1: 9 is out of range
                                     7, 6, 5, 4, -1, 2, 3, 0};
  const std::vector<int32_t> lengths = {3, 1};
  const std::vector<int32_t> req = {0, 0, 1, 1};
  OutBuffers b(4, 4);
  Rng rng(test::fresh_seed());
  b.poison(rng);
  TopkListParams p;
  p.common.num_rows = 4;
  p.common.path = Path::Cpu;
  p.topk = topk.data();
  p.topk_stride = 4;
  p.topk_length = lengths.data();
  p.request_index = req.data();
  p.block_table = table.data();
  p.block_table_stride = 8;
  p.table_width = 8;
  p.num_requests = 2;
  p.block_size = 1;
  p.out = b.out();
  build_topk_lists(p);
  // Row 1 counts 2 valid among {5, 9, 4}: keeps {5, 9 -> -1}. Row 3 counts 0 valid among {-1}.
  expect_rows(b, 4, {{10, 11, 12}, {15, -1}, {27}, {}});
}

TEST(CompressedAllListsCpu, MatchesReferenceWithMaxCompressedClamp) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t bs : kPageSizes) {
    for (int32_t ratio : {128, 4}) {
      for (int64_t max_compressed : {128, 256}) {
        const int64_t rows = rng.randint(1, 16);
        OutBuffers b(rows, max_compressed);
        b.poison(rng);
        const auto valid = random_valid(rng, rows);
        const Rows expected = run_compressed_all_case(rng, bs, ratio, max_compressed, valid, b);
        SCOPED_TRACE("bs=" + std::to_string(bs) + " ratio=" + std::to_string(ratio) +
                     " max_compressed=" + std::to_string(max_compressed));
        expect_rows(b, rows, expected);
      }
    }
  }
}

TEST(CompressedAllListsCpu, EntryBoundariesAndClamp) {
  // bs = 2, table [4, 9, 1] (6 entries); max_compressed 8 (> table: entries 6, 7 are -1).
  const std::vector<int32_t> table = {4, 9, 1};
  const std::vector<int64_t> pos = {0, 126, 127, 383, 128 * 8 - 1, 128 * 50};
  const std::vector<int32_t> req(pos.size(), 0);
  OutBuffers b(6, 8);
  Rng rng(test::fresh_seed());
  b.poison(rng);
  CompressedAllListParams p;
  p.common.num_rows = 6;
  p.common.path = Path::Cpu;
  p.positions = pos.data();
  p.request_index = req.data();
  p.block_table = table.data();
  p.block_table_stride = 3;
  p.table_width = 3;
  p.num_requests = 1;
  p.block_size = 2;
  p.max_compressed = 8;
  p.out = b.out();
  build_compressed_all_lists(p);
  const std::vector<int32_t> all = {8, 9, 18, 19, 2, 3, -1, -1};
  expect_rows(b, 6, {{}, {}, {8}, {8, 9, 18}, all, all});
}

TEST(DenseToRaggedCpu, MatchesReferenceWithClampAndSlotRange) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int64_t w : {1, 7, 64, 512}) {
    for (int64_t num_slots : {0, 1000}) {
      for (bool per_request : {false, true}) {
        const int64_t rows = rng.randint(1, 20);
        OutBuffers b(rows, w);
        b.poison(rng);
        const auto valid = random_valid(rng, rows);
        const Rows expected = run_dense_case(rng, w, num_slots, per_request, valid, b);
        SCOPED_TRACE("W=" + std::to_string(w) + " num_slots=" + std::to_string(num_slots) +
                     " per_request=" + std::to_string(per_request));
        expect_rows(b, rows, expected);
      }
    }
  }
}

TEST(ListBuilders, ZeroRowsWritesOnlyIndptr0) {
  Rng rng(test::fresh_seed());
  OutBuffers b(0, 128);
  b.poison(rng);
  WindowListParams p;
  p.common.num_rows = 0;
  p.common.path = Path::Cpu;
  p.table_width = 1;
  p.block_table_stride = 1;
  p.block_size = 64;
  p.out = b.out();
  p.out.indices = nullptr;  // nothing to write
  build_window_lists(p);
  expect_rows(b, 0, {});
}

TEST(MaxCompressedEntries, RoundsUpToMultipleOf128) {
  EXPECT_EQ(max_compressed_entries(1048576, 128), 8192);
  EXPECT_EQ(max_compressed_entries(0, 128), 0);
  EXPECT_EQ(max_compressed_entries(1, 128), 128);
  EXPECT_EQ(max_compressed_entries(128 * 128, 128), 128);
  EXPECT_EQ(max_compressed_entries(128 * 128 + 1, 128), 256);
  EXPECT_EQ(max_compressed_entries(163840, 128), 1280);
  EXPECT_EQ(max_compressed_entries(1048576, 4), 262144);
  for (int64_t len = 0; len < 70000; len += 997) {
    for (int32_t ratio : {1, 4, 128}) {
      const int64_t entries = (len + ratio - 1) / ratio;
      EXPECT_EQ(max_compressed_entries(len, ratio), (entries + 127) / 128 * 128);
    }
  }
  expect_arg_error([] { max_compressed_entries(-1, 128); }, "max_model_len");
  expect_arg_error([] { max_compressed_entries(1024, 0); }, "ratio");
  expect_arg_error([] { max_compressed_entries(std::numeric_limits<int64_t>::max(), 1); },
                   "max_model_len");
}

// ---- Graph buffers
// --------------------------------------------------------------------------------

// Persistent buffers for the captured row count, reused over steps with a live batch that shrinks
// and grows; rows beyond the live batch are padding. Between steps the buffers are filled with
// garbage, so a row the builder failed to rewrite shows up. The decoder's planner uses W.
template <typename RunStep>
void run_graph_steps(Rng& rng, int64_t captured_rows, int64_t w, RunStep run_step) {
  OutBuffers b(captured_rows, w);
  const int32_t* indices_base = b.indices.data();
  const int32_t* indptr_base = b.indptr.data();
  const std::vector<int64_t> live_batches = {captured_rows, 3, 0, captured_rows - 1, 1,
                                             captured_rows, 2};
  for (int64_t live : live_batches) {
    SCOPED_TRACE("live batch " + std::to_string(live) + " of " + std::to_string(captured_rows));
    b.poison(rng);
    std::vector<uint8_t> valid(captured_rows, 0);
    for (int64_t r = 0; r < live; ++r) valid[r] = rng.randint(0, 7) != 0;  // some live padding too
    const Rows expected = run_step(valid, b);
    ASSERT_EQ(b.indices.data(), indices_base);  // the captured graph's addresses stay valid
    ASSERT_EQ(b.indptr.data(), indptr_base);
    expect_rows(b, captured_rows, expected);
    for (int64_t r = live; r < captured_rows; ++r) ASSERT_EQ(b.indptr[r + 1], b.indptr[r]);
    // The list as the decoder sees it: width W (not capacity / live rows) bounds every row.
    const IndexList list{b.indices.data(), b.indptr.data(), captured_rows * w, w};
    ASSERT_LE(list.indptr[captured_rows], list.capacity);
    for (int64_t r = 0; r < captured_rows; ++r) {
      ASSERT_LE(list.indptr[r + 1] - list.indptr[r], list.width);
    }
  }
}

TEST(GraphBuffers, WindowListsRewriteEveryCapturedRow) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t bs : {1, 64}) {
    run_graph_steps(rng, 24, 128, [&](const std::vector<uint8_t>& valid, OutBuffers& b) {
      return run_window_case(rng, bs, valid, b);
    });
  }
}

TEST(GraphBuffers, TopkListsRewriteEveryCapturedRowMtp2) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  run_graph_steps(rng, 16, 512, [&](const std::vector<uint8_t>& valid, OutBuffers& b) {
    return run_topk_case(rng, {64, 512, 2, true}, valid, b);
  });
}

TEST(GraphBuffers, CompressedAllListsRewriteEveryCapturedRow) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  run_graph_steps(rng, 12, 256, [&](const std::vector<uint8_t>& valid, OutBuffers& b) {
    return run_compressed_all_case(rng, 2, 128, 256, valid, b);
  });
}

TEST(GraphBuffers, DenseToRaggedRewritesEveryCapturedRow) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  run_graph_steps(rng, 10, 64, [&](const std::vector<uint8_t>& valid, OutBuffers& b) {
    return run_dense_case(rng, 64, 5000, true, valid, b);
  });
}

// ---- Validation
// -----------------------------------------------------------------------------------

struct WindowFixture {
  std::vector<int32_t> table = {0, 1, 2, 3};
  std::vector<int64_t> pos = {5, 6, 7, 8};
  std::vector<int32_t> req = {0, 1, 0, 1};
  OutBuffers b{4, 128};
  WindowListParams p;
  WindowFixture() {
    p.common.num_rows = 4;
    p.common.path = Path::Cpu;
    p.positions = pos.data();
    p.request_index = req.data();
    p.block_table = table.data();
    p.block_table_stride = 2;
    p.table_width = 2;
    p.num_requests = 2;
    p.block_size = 64;
    p.out = b.out();
  }
};

TEST(ListValidation, RowInputsNamedWithRowAndNothingWritten) {
  Rng rng(test::fresh_seed());
  {
    WindowFixture f;
    f.b.poison(rng);
    f.req[3] = 2;  // num_requests = 2
    expect_arg_error([&] { build_window_lists(f.p); }, "request_index[3]");
    EXPECT_EQ(f.b.indptr, f.b.indptr_was) << "a rejected call must write nothing";
    EXPECT_EQ(f.b.indices, f.b.indices_was);
  }
  {
    WindowFixture f;
    f.b.poison(rng);
    f.pos[2] = -1;
    expect_arg_error([&] { build_window_lists(f.p); }, "positions[2]");
    EXPECT_EQ(f.b.indptr, f.b.indptr_was);
  }
  {
    WindowFixture f;
    f.p.request_index = nullptr;  // rows 2, 3 would read requests 2, 3 of a 2-request table
    expect_arg_error([&] { build_window_lists(f.p); }, "num_requests");
  }
  {
    WindowFixture f;  // the same bad inputs on padding rows are ignored
    const std::vector<uint8_t> valid = {1, 1, 0, 0};
    f.p.common.row_valid = valid.data();
    f.req[3] = 99;
    f.pos[2] = -1;
    f.b.poison(rng);
    build_window_lists(f.p);
    EXPECT_EQ(f.b.indptr[3] - f.b.indptr[2], 0);
    EXPECT_EQ(f.b.indptr[4] - f.b.indptr[3], 0);
  }
}

TEST(ListValidation, ScalarArgumentsNamed) {
  const auto window_error = [](auto mutate, const std::string& arg) {
    WindowFixture f;
    mutate(f.p);
    expect_arg_error([&] { build_window_lists(f.p); }, arg);
  };
  window_error([](WindowListParams& p) { p.block_size = 0; }, "block_size");
  window_error([](WindowListParams& p) { p.table_width = 0; }, "table_width");
  window_error([](WindowListParams& p) { p.block_table_stride = 1; }, "block_table_stride");
  window_error([](WindowListParams& p) { p.block_table = nullptr; }, "block_table");
  window_error([](WindowListParams& p) { p.positions = nullptr; }, "positions");
  window_error([](WindowListParams& p) { p.out.width = 127; }, "out.width");
  window_error([](WindowListParams& p) { p.out.indptr = nullptr; }, "out.indptr");
  window_error([](WindowListParams& p) { p.out.indices = nullptr; }, "out.indices");
  window_error([](WindowListParams& p) { p.common.num_rows = -1; }, "common.num_rows");
  window_error([](WindowListParams& p) { p.common.num_rows = (int64_t{1} << 31) / 128; },
               "common.num_rows");  // R*W must fit the int32 indptr
  window_error([](WindowListParams& p) { p.window = 0; }, "window");

  std::vector<int32_t> topk(4 * 64, 0), table = {0};
  TopkListParams t;
  t.common.num_rows = 4;
  t.common.path = Path::Cpu;
  t.topk = topk.data();
  t.topk_stride = 63;
  t.block_table = table.data();
  t.block_table_stride = 1;
  t.table_width = 1;
  t.num_requests = 4;
  t.block_size = 64;
  OutBuffers tb(4, 64);
  t.out = tb.out();
  expect_arg_error([&] { build_topk_lists(t); }, "topk_stride");
  t.topk_stride = 64;
  t.topk = nullptr;
  expect_arg_error([&] { build_topk_lists(t); }, "topk");

  std::vector<int64_t> pos = {0};
  CompressedAllListParams c;
  c.common.num_rows = 1;
  c.common.path = Path::Cpu;
  c.positions = pos.data();
  c.block_table = table.data();
  c.block_table_stride = 1;
  c.table_width = 1;
  c.num_requests = 1;
  c.block_size = 2;
  OutBuffers cb(1, 128);
  c.out = cb.out();
  expect_arg_error([&] { build_compressed_all_lists(c); }, "max_compressed");
  c.max_compressed = 256;
  expect_arg_error([&] { build_compressed_all_lists(c); }, "out.width");
  c.max_compressed = 128;
  c.ratio = 0;
  expect_arg_error([&] { build_compressed_all_lists(c); }, "ratio");

  std::vector<int32_t> dense(8, 1), lengths(2, 1);
  DenseToRaggedParams d;
  d.common.num_rows = 2;
  d.common.path = Path::Cpu;
  d.dense = dense.data();
  d.dense_stride = 3;
  d.lengths = lengths.data();
  OutBuffers db(2, 4);
  d.out = db.out();
  expect_arg_error([&] { build_ragged_from_dense(d); }, "dense_stride");
  d.dense_stride = 4;
  d.num_slots = -1;
  expect_arg_error([&] { build_ragged_from_dense(d); }, "num_slots");
  d.num_slots = 0;
  d.lengths = nullptr;
  expect_arg_error([&] { build_ragged_from_dense(d); }, "lengths");
  d.lengths = lengths.data();
  std::vector<int32_t> req = {0, 5};
  d.request_index = req.data();
  d.num_requests = 2;
  expect_arg_error([&] { build_ragged_from_dense(d); }, "request_index[1]");
}

}  // namespace
}  // namespace sparsemla
