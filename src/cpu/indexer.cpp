// src/cpu/indexer.cpp: the lightning-indexer decode on the CPU (CONTRACT 11), fused form of 11.5.
//
// Rows of one request that sit next to each other (MTP) form a group, whose keys are read once.
// A group's candidates are cut into chunks of kChunk entries; each (group, chunk) work item scores
// its chunk for every row of the group and keeps each row's exact local top-k (11.3 rank); a merge
// then selects the row's top-k from the chunks' survivors. Exact, because every member of the
// global top-k is in its chunk's local top-k. Scores depend only on (q[t], w[t], the key's bytes
// and scale), never on the chunking or the thread count (11.2 batch invariance).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/row_decode.h"
#include "cpu/writer_common.h"

namespace sparsemla::cpu {

namespace {

constexpr int kDim = kIndexerHeadDim;  // 128
constexpr int64_t kChunk = 4096;       // candidates per work item: 16 MFLOP at H = 64
constexpr int kLanes = 16;             // independent fp32 partial sums of a dot (fixed order)

// A selected or surviving candidate: its local index, fp32 score and 11.3 rank key.
struct Candidate {
  int64_t j;
  float score;
  float key;
};

// CONTRACT 11.3: finite scores rank by value (-0 as +0), non-finite ones last.
float rank_key(float score) {
  if (!std::isfinite(score)) return -std::numeric_limits<float>::infinity();
  return score == 0.0f ? 0.0f : score;
}

// Larger key first, then lower index: a strict total order over distinct indices.
bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.key > b.key || (a.key == b.key && a.j < b.j);
}

// Keeps the best `keep` of `c` (in no particular order).
void keep_best(std::vector<Candidate>& c, size_t keep) {
  if (c.size() <= keep) return;
  std::nth_element(c.begin(), c.begin() + static_cast<ptrdiff_t>(keep), c.end(), ranks_before);
  c.resize(keep);
}

// The request's entry j: where its bytes are, or null when its page id is invalid (11.3: not a
// candidate).
struct EntryRef {
  const uint8_t* page = nullptr;
  int32_t row = 0;
};
EntryRef entry_of(const IndexerParams& p, int64_t r, int64_t j) {
  const int32_t ibs = p.cache.block_size;
  const int32_t block = p.block_table[r * p.block_table_stride + j / ibs];
  if (block < 0 || block >= p.cache.num_blocks) return {};
  return {p.cache.base + block * p.cache.block_stride, static_cast<int32_t>(j % ibs)};
}

// The 128 values of an entry as exact fp32 (e4m3 bytes) and its scale.
float decode_entry(const IndexerParams& p, const EntryRef& e, float (&kv)[kDim]) {
  const float* lut = e4m3_value_table().data();
  if (p.cache.layout == IndexerLayout::Normal) {
    const uint8_t* bytes = e.page + int64_t{e.row} * kDim;
    for (int d = 0; d < kDim; ++d) kv[d] = lut[bytes[d]];
  } else {
    for (int d = 0; d < kDim; ++d)
      kv[d] = lut[e.page[indexer_value_offset_in_page(p.cache.layout, e.row, d)]];
  }
  float scale;
  std::memcpy(&scale, e.page + indexer_scale_offset_in_page(p.cache.block_size, e.row), 4);
  return scale;
}

// One query row: its decoded q [H, 128], weights, request and candidate count.
struct Row {
  int64_t t = 0;
  int64_t request = -1;  // -1: padding row
  int64_t n = 0;         // n'_t (clamped)
  std::vector<float> q;  // [H * 128]
  std::vector<float> w;  // [H]
};

Row load_row(const IndexerParams& p, int64_t t) {
  Row row;
  row.t = t;
  const int32_t r = p.row_request[t];
  if (r < 0 || r >= p.num_requests) return row;
  row.request = r;
  const int64_t capacity = int64_t{p.block_table_width} * p.cache.block_size;
  row.n = std::clamp<int64_t>(p.num_candidates[t], 0, capacity);
  const int32_t H = p.num_heads;
  const int64_t sh = p.q_stride_head != 0 ? p.q_stride_head : kDim;
  const int64_t st = p.q_stride_token != 0 ? p.q_stride_token : H * int64_t{kDim};
  const int64_t sw = p.w_stride_token != 0 ? p.w_stride_token : H;
  const float* lut = e4m3_value_table().data();
  row.q.resize(static_cast<size_t>(H) * kDim);
  row.w.assign(p.w + t * sw, p.w + t * sw + H);
  for (int32_t h = 0; h < H; ++h) {
    const uint8_t* src = p.q + t * st + h * sh;
    for (int d = 0; d < kDim; ++d) row.q[static_cast<size_t>(h) * kDim + d] = lut[src[d]];
  }
  return row;
}

// CONTRACT 11.2 in fp32: dot over 128 dims in kLanes fixed partial sums, ReLU (NaN stays), weight,
// head sum in ascending h, one multiply by the scale.
float score_of(const Row& row, int32_t H, const float (&kv)[kDim], float scale) {
  float head_sum = 0.0f;
  for (int32_t h = 0; h < H; ++h) {
    const float* q = row.q.data() + static_cast<size_t>(h) * kDim;
    float lane[kLanes] = {};
    for (int d = 0; d < kDim; d += kLanes) {
      for (int l = 0; l < kLanes; ++l) lane[l] += q[d + l] * kv[d + l];
    }
    for (int width = kLanes / 2; width >= 1; width /= 2) {
      for (int l = 0; l < width; ++l) lane[l] += lane[l + width];
    }
    const float dot = lane[0];
    head_sum += row.w[h] * (dot < 0.0f ? 0.0f : dot);
  }
  return scale * head_sum;
}

// A group: rows [first, first + count) of one request.
struct Group {
  int64_t first, count, request, n_max;
};

std::vector<Group> group_rows(const std::vector<Row>& rows) {
  std::vector<Group> groups;
  for (int64_t t = 0; t < static_cast<int64_t>(rows.size()); ++t) {
    const Row& row = rows[t];
    if (row.request < 0) continue;
    if (!groups.empty() && groups.back().request == row.request &&
        groups.back().first + groups.back().count == t) {
      ++groups.back().count;
      groups.back().n_max = std::max(groups.back().n_max, row.n);
    } else {
      groups.push_back({t, 1, row.request, row.n});
    }
  }
  return groups;
}

// Work item (group g, chunk c): every valid entry of the chunk scored (when `scored`) for the
// group's rows; each row keeps its best k of the chunk. out[i]: row first + i's survivors.
void score_chunk(const IndexerParams& p, const std::vector<Row>& rows, const Group& g, int64_t c,
                 bool scored, std::vector<std::vector<Candidate>>& out) {
  const int64_t begin = c * kChunk, end = std::min(g.n_max, begin + kChunk);
  out.assign(static_cast<size_t>(g.count), {});
  float kv[kDim];
  for (int64_t j = begin; j < end; ++j) {
    const EntryRef e = entry_of(p, g.request, j);
    if (e.page == nullptr) continue;
    const float scale = scored ? decode_entry(p, e, kv) : 0.0f;
    for (int64_t i = 0; i < g.count; ++i) {
      const Row& row = rows[g.first + i];
      if (j >= row.n) continue;
      const float s = scored ? score_of(row, p.num_heads, kv, scale) : 0.0f;
      out[i].push_back({j, s, rank_key(s)});
    }
  }
  for (auto& survivors : out) keep_best(survivors, static_cast<size_t>(p.topk));
}

// Row t's output from its candidates (already its selection when |C_t| <= k).
void write_row(const IndexerParams& p, int64_t t, std::vector<Candidate>& sel) {
  keep_best(sel, static_cast<size_t>(p.topk));
  if (p.order == TopkOrder::ByScore) {
    std::sort(sel.begin(), sel.end(), ranks_before);
  } else {
    std::sort(sel.begin(), sel.end(),
              [](const Candidate& a, const Candidate& b) { return a.j < b.j; });
  }
  const int64_t si = p.indices_stride != 0 ? p.indices_stride : p.width;
  const int64_t ss = p.scores_stride != 0 ? p.scores_stride : p.width;
  int32_t* idx = p.indices + t * si;
  float* score = p.scores != nullptr ? p.scores + t * ss : nullptr;
  const int64_t len = static_cast<int64_t>(sel.size());
  for (int64_t i = 0; i < p.width; ++i) {
    idx[i] = i < len ? static_cast<int32_t>(sel[i].j) : -1;
    if (score != nullptr)
      score[i] = i < len ? sel[i].score : -std::numeric_limits<float>::infinity();
  }
  if (p.lengths != nullptr) p.lengths[t] = static_cast<int32_t>(len);
}

}  // namespace

void indexer_topk(const IndexerParams& p) {
  const int64_t T = p.num_tokens;
  std::vector<Row> rows(static_cast<size_t>(T));
  SPARSEMLA_OMP_PARALLEL_FOR
  for (int64_t t = 0; t < T; ++t) rows[t] = load_row(p, t);
  const std::vector<Group> groups = group_rows(rows);
  // Keys are read when the selection or the output needs scores: always in rank order or with
  // scores requested, otherwise only for rows with more than k candidates (11.3).
  const bool always_scored = p.order == TopkOrder::ByScore || p.scores != nullptr;
  std::vector<int64_t> first_item(groups.size() + 1, 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    first_item[g + 1] = first_item[g] + (groups[g].n_max + kChunk - 1) / kChunk;
  }
  const int64_t items = first_item.back();
  std::vector<std::vector<std::vector<Candidate>>> survivors(static_cast<size_t>(items));
  std::vector<int64_t> item_group(static_cast<size_t>(items));
  for (size_t g = 0; g < groups.size(); ++g)
    for (int64_t i = first_item[g]; i < first_item[g + 1]; ++i)
      item_group[i] = static_cast<int64_t>(g);
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp parallel for schedule(dynamic, 1)
#endif
  for (int64_t i = 0; i < items; ++i) {
    const Group& g = groups[item_group[i]];
    // Without scores or rank order, a group whose rows all have n_t <= k selects every valid
    // candidate: no key is read.
    bool scored = always_scored;
    for (int64_t r = 0; r < g.count && !scored; ++r) scored = rows[g.first + r].n > p.topk;
    score_chunk(p, rows, g, i - first_item[item_group[i]], scored, survivors[i]);
  }
  std::vector<int64_t> group_of_row(static_cast<size_t>(T), -1);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int64_t r = 0; r < groups[g].count; ++r)
      group_of_row[groups[g].first + r] = static_cast<int64_t>(g);
  SPARSEMLA_OMP_PARALLEL_FOR
  for (int64_t t = 0; t < T; ++t) {
    std::vector<Candidate> sel;
    const int64_t g = group_of_row[t];
    if (g >= 0) {
      for (int64_t i = first_item[g]; i < first_item[g + 1]; ++i) {
        const auto& part = survivors[i][t - groups[g].first];
        sel.insert(sel.end(), part.begin(), part.end());
      }
    }
    write_row(p, t, sel);
  }
}

}  // namespace sparsemla::cpu
