// Fuzz target: the lightning-indexer decode (CONTRACT 11) on the CPU with garbage device values
// (page ids, row requests, candidate counts), odd page sizes, both layouts, strided outputs, NaN
// key bytes and +inf scales, and host arguments outside their ranges. The data is exact (q and key
// values in {-2..2}, power-of-two scales and weights: every fp32 score is exact), so an oracle
// written here in float64 predicts every output bit. Properties checked:
//   - rejected exactly when a host argument is invalid (11.4), and then nothing is written;
//   - each row: len_t, the selected indices in rank or index order, their scores, -1 and -inf
//     padding, all equal to the oracle's (11.3); output elements between rows untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/indexer.h"

namespace sparsemla::fuzz {

namespace {

constexpr int kDim = 128;

// e4m3 bytes of -2, -1, 0, 1, 2 and the two NaN bytes.
uint8_t key_byte(Input& in, Bulk& bulk, bool poison) {
  static const uint8_t kSmall[5] = {0xC0, 0xB8, 0x00, 0x38, 0x40};
  if (poison && in.one_in(64)) return in.flag() ? 0x7F : 0xFF;
  return kSmall[bulk.next() % 5];
}

float small_e4m3_value(uint8_t b) {
  switch (b) {
    case 0xC0:
      return -2.0f;
    case 0xB8:
      return -1.0f;
    case 0x38:
      return 1.0f;
    case 0x40:
      return 2.0f;
    case 0x00:
      return 0.0f;
    default:
      return std::numeric_limits<float>::quiet_NaN();
  }
}

struct Geometry {
  int32_t ibs;
  IndexerLayout layout;
  int64_t num_blocks, block_stride;
  int64_t value_offset(int32_t p, int32_t d) const {
    if (layout == IndexerLayout::Normal) return int64_t{p} * kDim + d;
    return int64_t{p / 16} * 2048 + (p % 16) * 16 + (d / 16) * 256 + d % 16;
  }
  int64_t scale_offset(int32_t p) const { return int64_t{ibs} * kDim + int64_t{p} * 4; }
};

struct Oracle {
  int64_t j;
  double score, key;
};

double oracle_key(double s) {
  return std::isfinite(s) ? (s == 0.0 ? 0.0 : s) : -std::numeric_limits<double>::infinity();
}

}  // namespace

int run_indexer(const uint8_t* data, size_t size) {
  Input in(data, size);
  bool must_reject = false;
  const int64_t T = in.range(0, 4);
  int32_t H = static_cast<int32_t>(in.range(1, 4));
  const IndexerLayout layout = in.one_in(4) ? IndexerLayout::Shuffle : IndexerLayout::Normal;
  const int32_t ibs = layout == IndexerLayout::Shuffle ? 16 : static_cast<int32_t>(in.range(1, 9));
  const Geometry g{ibs, layout, in.range(1, 6), int64_t{ibs} * 132 + in.range(0, 3) * 16};
  const int64_t R = in.range(0, 3);
  const int32_t Wt = static_cast<int32_t>(in.range(0, 4));
  const int64_t table_stride = Wt + in.range(0, 2);
  int32_t k = static_cast<int32_t>(in.range(1, 12));
  int32_t W = k + static_cast<int32_t>(in.range(0, 3));
  const TopkOrder order = in.flag() ? TopkOrder::ByScore : TopkOrder::ByIndex;
  const bool want_scores = in.flag(), want_lengths = in.flag();
  const int64_t out_stride = W + in.range(0, 2);
  if (in.one_in(16)) {  // one host argument out of range
    switch (in.range(0, 3)) {
      case 0:
        k = in.flag() ? 0 : 2049, W = std::max(W, 2049);
        break;
      case 1:
        W = k - static_cast<int32_t>(in.range(1, k));
        break;
      case 2:
        H = in.flag() ? 0 : 129;
        break;
      default:
        k = -static_cast<int32_t>(in.range(1, 5));
        break;
    }
    must_reject = true;
  }
  const int32_t H_buf = std::clamp<int32_t>(H, 1, 4);
  const int32_t W_buf = std::clamp<int32_t>(W, 1, 2049);
  Bulk bulk(in.bytes(8));
  const bool poison = in.one_in(3);
  std::vector<uint8_t> q(static_cast<size_t>(T * H_buf * kDim));
  for (auto& b : q) b = key_byte(in, bulk, false);
  std::vector<float> w(static_cast<size_t>(T * H_buf));
  for (auto& v : w) v = std::ldexp(static_cast<float>(bulk.next() % 9) - 3.0f, -6);
  if (poison && !w.empty() && in.one_in(4)) w[bulk.next() % w.size()] = std::nanf("");
  std::vector<uint8_t> cache(static_cast<size_t>(g.num_blocks * g.block_stride));
  for (int64_t page = 0; page < g.num_blocks; ++page) {
    for (int32_t p = 0; p < ibs; ++p) {
      for (int32_t d = 0; d < kDim; ++d)
        cache[page * g.block_stride + g.value_offset(p, d)] = key_byte(in, bulk, poison);
      float scale = std::ldexp(1.0f, static_cast<int>(bulk.next() % 5) - 2);
      if (poison && in.one_in(32)) scale = std::numeric_limits<float>::infinity();
      std::memcpy(cache.data() + page * g.block_stride + g.scale_offset(p), &scale, 4);
    }
  }
  std::vector<int32_t> table(static_cast<size_t>(std::max<int64_t>(R * table_stride, 0)));
  for (auto& b : table) b = in.int32_like(0, g.num_blocks - 1);
  std::vector<int32_t> row_req(static_cast<size_t>(T)), n(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    row_req[t] = in.int32_like(0, R - 1);
    n[t] = in.int32_like(0, int64_t{Wt} * ibs);
  }
  const size_t out_elems = static_cast<size_t>(T > 0 ? (T - 1) * out_stride + W_buf : 0);
  std::vector<int32_t> indices(out_elems, 0x5EED), lengths(static_cast<size_t>(T), -7);
  std::vector<float> scores(out_elems, 1234.5f);
  const std::vector<int32_t> indices_before = indices;

  IndexerParams p;
  p.num_tokens = T;
  p.num_heads = H;
  p.q = q.empty() ? nullptr : q.data();
  p.w = w.empty() ? nullptr : w.data();
  p.cache = {cache.data(), g.num_blocks, ibs, g.block_stride, layout};
  p.block_table = table.empty() ? nullptr : table.data();
  p.block_table_stride = table_stride;
  p.block_table_width = Wt;
  p.num_requests = R;
  p.row_request = T > 0 ? row_req.data() : nullptr;
  p.num_candidates = T > 0 ? n.data() : nullptr;
  p.topk = k;
  p.indices = indices.empty() ? nullptr : indices.data();
  p.indices_stride = out_stride;
  p.width = W;
  p.lengths = want_lengths && T > 0 ? lengths.data() : nullptr;
  p.scores = want_scores && T > 0 ? scores.data() : nullptr;
  p.scores_stride = out_stride;
  p.order = order;
  p.path = Path::Cpu;
  std::string why;
  const bool ok = accepted([&] { indexer_topk(p); }, &why);
  expect_verdict(ok, must_reject, why, "indexer_topk");
  if (!ok) {
    SPARSEMLA_FUZZ_CHECK(indices == indices_before, "a rejected indexer_topk wrote");
    return 0;
  }
  std::vector<uint8_t> written(out_elems, 0);
  for (int64_t t = 0; t < T; ++t) {
    // The oracle: C_t, float64 scores (exact here), the 11.3 rank.
    std::vector<Oracle> cand;
    const int32_t r = row_req[t];
    if (r >= 0 && r < R) {
      const int64_t nt = std::clamp<int64_t>(n[t], 0, int64_t{Wt} * ibs);
      for (int64_t j = 0; j < nt; ++j) {
        const int32_t page = table[r * table_stride + j / ibs];
        if (page < 0 || page >= g.num_blocks) continue;
        const int32_t pr = static_cast<int32_t>(j % ibs);
        double sum = 0.0;
        for (int32_t h = 0; h < H; ++h) {
          double dot = 0.0;
          for (int32_t d = 0; d < kDim; ++d) {
            dot += double(small_e4m3_value(q[(t * H + h) * kDim + d])) *
                   small_e4m3_value(cache[page * g.block_stride + g.value_offset(pr, d)]);
          }
          sum += double(w[t * H + h]) * (dot < 0.0 ? 0.0 : dot);
        }
        float scale;
        std::memcpy(&scale, cache.data() + page * g.block_stride + g.scale_offset(pr), 4);
        const double s = double(scale) * sum;
        cand.push_back({j, s, oracle_key(s)});
      }
    }
    std::stable_sort(cand.begin(), cand.end(), [](const Oracle& a, const Oracle& b) {
      return a.key > b.key || (a.key == b.key && a.j < b.j);
    });
    const int64_t len = std::min<int64_t>(k, static_cast<int64_t>(cand.size()));
    cand.resize(static_cast<size_t>(len));
    if (order == TopkOrder::ByIndex) {
      std::sort(cand.begin(), cand.end(),
                [](const Oracle& a, const Oracle& b) { return a.j < b.j; });
    }
    const std::string at = " (row " + std::to_string(t) + ")";
    if (want_lengths) SPARSEMLA_FUZZ_CHECK(lengths[t] == len, "len_t" + at);
    for (int32_t i = 0; i < W; ++i) {
      const size_t e = static_cast<size_t>(t * out_stride + i);
      written[e] = 1;
      SPARSEMLA_FUZZ_CHECK(indices[e] == (i < len ? cand[i].j : -1),
                           "index " + std::to_string(i) + at);
      if (!want_scores) continue;
      const float want =
          i < len ? static_cast<float>(cand[i].score) : -std::numeric_limits<float>::infinity();
      SPARSEMLA_FUZZ_CHECK(
          bits_of(scores[e]) == bits_of(want) || (std::isnan(scores[e]) && std::isnan(want)),
          "score " + std::to_string(i) + at);
    }
  }
  for (size_t e = 0; e < out_elems; ++e) {
    SPARSEMLA_FUZZ_CHECK(written[e] || indices[e] == 0x5EED, "index outside the rows written");
  }
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_indexer)
