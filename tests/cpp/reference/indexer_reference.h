// tests/cpp/reference/indexer_reference.h: host test data and the float64 reference of the
// lightning-indexer decode (CONTRACT 11.2 math, 11.3 rule, 11.7 accuracy contract).
//
// IndexerCase holds every host array of one call; the reference scores each candidate of a row in
// float64 from the decoded bytes (written here from CONTRACT 2.2 and the e4m3 bit fields, not from
// the library's addressing) and selects with the rank rule.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/e4m3_table.h"
#include "reference/random.h"
#include "sparsemla/indexer.h"

namespace sparsemla::test {

struct IndexerCase {
  int64_t T = 0;
  int32_t H = 1;
  int32_t ibs = 64;
  IndexerLayout layout = IndexerLayout::Normal;
  int64_t num_blocks = 0;
  int64_t block_stride = 0;  // bytes
  int64_t R = 0;
  int32_t Wt = 0;
  int64_t table_stride = 0;
  int32_t k = 8;
  int32_t W = 8;
  std::vector<uint8_t> q;        // [T, H, 128] contiguous
  std::vector<float> w;          // [T, H]
  std::vector<uint8_t> cache;    // num_blocks pages
  std::vector<int32_t> table;    // [R, table_stride]
  std::vector<int32_t> row_req;  // [T]
  std::vector<int32_t> n;        // [T]

  // Byte offsets of entry row p of a page (CONTRACT 2.2 table).
  int64_t value_offset(int32_t p, int32_t d) const {
    if (layout == IndexerLayout::Normal) return int64_t{p} * 128 + d;
    return int64_t{p / 16} * 2048 + (p % 16) * 16 + (d / 16) * 256 + d % 16;
  }
  int64_t scale_offset(int32_t p) const { return int64_t{ibs} * 128 + int64_t{p} * 4; }

  // Page and row of request r's entry j, or page -1 when the table names no valid page.
  int64_t page_of(int64_t r, int64_t j) const {
    const int32_t b = table[r * table_stride + j / ibs];
    return b >= 0 && b < num_blocks ? b : -1;
  }
  uint8_t* entry_byte(int64_t page, int32_t p, int32_t d) {
    return cache.data() + page * block_stride + value_offset(p, d);
  }
  void set_entry(int64_t r, int64_t j, const uint8_t* bytes, float scale) {
    const int64_t page = page_of(r, j);
    const int32_t p = static_cast<int32_t>(j % ibs);
    for (int32_t d = 0; d < 128; ++d) *entry_byte(page, p, d) = bytes[d];
    std::memcpy(cache.data() + page * block_stride + scale_offset(p), &scale, 4);
  }
  float entry_value(int64_t page, int32_t p, int32_t d) const {
    return e4m3_reference_value(cache[page * block_stride + value_offset(p, d)]);
  }
  float entry_scale(int64_t page, int32_t p) const {
    float s;
    std::memcpy(&s, cache.data() + page * block_stride + scale_offset(p), 4);
    return s;
  }

  IndexerParams params(int32_t* indices, int32_t* lengths, float* scores) const {
    IndexerParams p;
    p.num_tokens = T;
    p.num_heads = H;
    p.q = q.empty() ? nullptr : q.data();
    p.w = w.empty() ? nullptr : w.data();
    p.cache = {const_cast<uint8_t*>(cache.data()), num_blocks, ibs, block_stride, layout};
    p.block_table = table.empty() ? nullptr : table.data();
    p.block_table_stride = table_stride;
    p.block_table_width = Wt;
    p.num_requests = R;
    p.row_request = row_req.empty() ? nullptr : row_req.data();
    p.num_candidates = n.empty() ? nullptr : n.data();
    p.topk = k;
    p.indices = indices;
    p.width = W;
    p.lengths = lengths;
    p.scores = scores;
    p.path = Path::Cpu;
    return p;
  }
};

// Geometry and tables: R requests of Wt pages each, pages assigned in a shuffled order (so entry j
// of a request is not at j of the cache); bytes filled by the caller.
inline IndexerCase make_indexer_case(Rng& rng, int64_t T, int32_t H, int32_t ibs, int64_t R,
                                     int32_t Wt, int32_t k, int32_t W,
                                     IndexerLayout layout = IndexerLayout::Normal) {
  IndexerCase c;
  c.T = T, c.H = H, c.ibs = ibs, c.R = R, c.Wt = Wt, c.k = k, c.W = W, c.layout = layout;
  c.table_stride = Wt + 1;
  c.num_blocks = std::max<int64_t>(1, R * Wt);
  c.block_stride = int64_t{ibs} * 132 + 48;  // padded, as engines align pages
  c.cache.assign(static_cast<size_t>(c.num_blocks * c.block_stride), 0);
  std::vector<int32_t> pages(static_cast<size_t>(R * Wt));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
  std::shuffle(pages.begin(), pages.end(), rng.engine());
  c.table.assign(static_cast<size_t>(R * c.table_stride), -1);
  for (int64_t r = 0; r < R; ++r)
    for (int32_t b = 0; b < Wt; ++b) c.table[r * c.table_stride + b] = pages[r * Wt + b];
  c.q.assign(static_cast<size_t>(T * H * 128), 0);
  c.w.assign(static_cast<size_t>(T * H), 0.0f);
  c.row_req.assign(static_cast<size_t>(T), 0);
  c.n.assign(static_cast<size_t>(T), 0);
  return c;
}

// The e4m3 byte of one of {-2, -1, 0, 1, 2} (exact-arithmetic data, CONTRACT 11.7).
inline uint8_t small_e4m3(int v) {
  static const uint8_t kCodes[5] = {0xC0, 0xB8, 0x00, 0x38, 0x40};  // -2 -1 0 1 2
  return kCodes[v + 2];
}

// Exact-arithmetic data: every q and key byte in {-2..2}, power-of-two scales in 2^-4..2^4,
// weights small integers times 2^-6 (some negative), for every row and every table entry.
inline void fill_exact(Rng& rng, IndexerCase& c) {
  for (auto& b : c.q) b = small_e4m3(static_cast<int>(rng.randint(-2, 2)));
  for (auto& v : c.w) v = std::ldexp(static_cast<float>(rng.randint(-3, 8)), -6);
  uint8_t bytes[128];
  for (int64_t page = 0; page < c.num_blocks; ++page) {
    for (int32_t p = 0; p < c.ibs; ++p) {
      for (auto& b : bytes) b = small_e4m3(static_cast<int>(rng.randint(-2, 2)));
      for (int32_t d = 0; d < 128; ++d) *c.entry_byte(page, p, d) = bytes[d];
      const float scale = std::ldexp(1.0f, static_cast<int>(rng.randint(-4, 4)));
      std::memcpy(c.cache.data() + page * c.block_stride + c.scale_offset(p), &scale, 4);
    }
  }
}

// Random data at model-like magnitudes: e4m3 bytes of N(0, 1) * 16 (no NaN byte), scales
// 2^-8..2^-4, weights N(0, 1) * 2^-7.
inline void fill_random(Rng& rng, IndexerCase& c) {
  const auto byte = [&] { return e4m3_reference_encode(static_cast<float>(rng.normal() * 16.0)); };
  for (auto& b : c.q) b = byte();
  for (auto& v : c.w) v = static_cast<float>(rng.normal() / 128.0);
  for (int64_t page = 0; page < c.num_blocks; ++page) {
    for (int32_t p = 0; p < c.ibs; ++p) {
      for (int32_t d = 0; d < 128; ++d) *c.entry_byte(page, p, d) = byte();
      const float scale = std::ldexp(1.0f, static_cast<int>(rng.randint(-8, -4)));
      std::memcpy(c.cache.data() + page * c.block_stride + c.scale_offset(p), &scale, 4);
    }
  }
}

// R requests over the same Wt pages: request 0's table row copied to rows 1..R-1, each shuffled
// into its own page order (long rows that share keys, as MTP-free batches of one prompt do).
inline void share_pages_across_requests(Rng& rng, IndexerCase& c, int64_t R) {
  c.R = R;
  c.table.resize(static_cast<size_t>(c.R * c.table_stride));
  for (int64_t r = 1; r < c.R; ++r) {
    const auto row = c.table.begin() + r * c.table_stride;
    std::copy_n(c.table.begin(), c.table_stride, row);
    std::shuffle(row, row + c.Wt, rng.engine());
  }
}

// One call's outputs: indices and scores dense [T, W], lengths [T].
struct IndexerOut {
  std::vector<int32_t> indices, lengths;
  std::vector<float> scores;
};

// The CPU backend on the case's host arrays, outputs poisoned first (every element must be
// written).
inline IndexerOut run_indexer_cpu(const IndexerCase& c, TopkOrder order = TopkOrder::ByIndex,
                                  bool scores = true) {
  IndexerOut o;
  o.indices.assign(static_cast<size_t>(c.T * c.W), 0x5EED);
  o.lengths.assign(static_cast<size_t>(c.T), -7);
  if (scores) o.scores.assign(static_cast<size_t>(c.T * c.W), 12345.0f);
  IndexerParams p =
      c.params(o.indices.data(), o.lengths.data(), scores ? o.scores.data() : nullptr);
  p.order = order;
  indexer_topk(p);
  return o;
}

// One candidate of the reference: local index, float64 score and the 11.7 scale A.
struct RefCandidate {
  int64_t j;
  double score;
  double a;
};

// Rank key of CONTRACT 11.3 in float64.
inline double ref_key(double s) {
  return std::isfinite(s) ? (s == 0.0 ? 0.0 : s) : -std::numeric_limits<double>::infinity();
}
inline bool ref_ranks_before(const RefCandidate& x, const RefCandidate& y) {
  const double a = ref_key(x.score), b = ref_key(y.score);
  return a > b || (a == b && x.j < y.j);
}

// C_t with float64 scores (CONTRACT 11.2): empty for a padding row.
inline std::vector<RefCandidate> ref_candidates(const IndexerCase& c, int64_t t) {
  std::vector<RefCandidate> out;
  const int32_t r = c.row_req[t];
  if (r < 0 || r >= c.R) return out;
  const int64_t n = std::clamp<int64_t>(c.n[t], 0, int64_t{c.Wt} * c.ibs);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t page = c.page_of(r, j);
    if (page < 0) continue;
    const int32_t p = static_cast<int32_t>(j % c.ibs);
    double sum = 0.0, a = 0.0;
    for (int32_t h = 0; h < c.H; ++h) {
      double dot = 0.0, abs_dot = 0.0;
      for (int32_t d = 0; d < 128; ++d) {
        const double prod =
            double(e4m3_reference_value(c.q[(t * c.H + h) * 128 + d])) * c.entry_value(page, p, d);
        dot += prod;
        abs_dot += std::fabs(prod);
      }
      const double wh = c.w[t * c.H + h];
      sum += wh * (dot < 0.0 ? 0.0 : dot);
      a += std::fabs(wh) * abs_dot;
    }
    const double scale = c.entry_scale(page, p);
    out.push_back({j, scale * sum, scale * a});
  }
  return out;
}

// The reference selection of row t in rank order (first min(k, |C_t|) of C_t).
inline std::vector<RefCandidate> ref_select(const IndexerCase& c, int64_t t) {
  std::vector<RefCandidate> cand = ref_candidates(c, t);
  std::stable_sort(cand.begin(), cand.end(), ref_ranks_before);
  cand.resize(std::min<size_t>(cand.size(), static_cast<size_t>(c.k)));
  return cand;
}

}  // namespace sparsemla::test
