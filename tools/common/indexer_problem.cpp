#include "indexer_problem.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "fast_rng.h"
#include "sparsemla/format.h"
#include "sparsemla/numerics.h"

namespace sparsemla::tools {

namespace {

// A random e4m3 byte that is not NaN (0x7F / 0xFF): the writer never stores NaN codes.
uint8_t random_e4m3(FastRng& rng) {
  uint8_t b = static_cast<uint8_t>(rng.next());
  if ((b & 0x7F) == 0x7F) b ^= 0x01;
  return b;
}

// Pages of random key bytes and power-of-two scales (2^-4 .. 2^-11), 576-aligned page stride.
void fill_keys(std::vector<uint8_t>& cache, int64_t num_blocks, int64_t ibs, int64_t stride,
               FastRng& rng) {
  cache.assign(static_cast<size_t>(num_blocks * stride), 0);
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    uint8_t* page = cache.data() + blk * stride;
    for (int64_t i = 0; i < ibs * 128; ++i) page[i] = random_e4m3(rng);
    for (int64_t r = 0; r < ibs; ++r) {
      const float scale = indexer_scale_of_exponent(-static_cast<int>(4 + rng.below(8)));
      std::memcpy(page + ibs * 128 + 4 * r, &scale, 4);
    }
  }
}

int64_t page_stride(int64_t ibs) {  // engine padding: a multiple of 576 bytes (CONTRACT 11.1)
  return (ibs * IndexerFp8::kBytesPerToken + 575) / 576 * 576;
}

}  // namespace

double run_indexer_step(const std::vector<int32_t>& table, int32_t table_width,
                        int64_t num_requests, int64_t num_blocks, int32_t block_size,
                        const std::vector<int64_t>& positions,
                        const std::vector<int32_t>& row_request, int32_t topk, uint64_t seed,
                        int32_t repeat, std::vector<int32_t>& indices,
                        std::vector<int32_t>& lengths) {
  constexpr int32_t kHeads = 64;  // DSV4's indexer heads (Flash and Pro)
  FastRng rng(seed ^ 0x1D6E7E5ull);
  const int64_t T = static_cast<int64_t>(positions.size());
  std::vector<uint8_t> cache, q(static_cast<size_t>(T * kHeads * 128));
  fill_keys(cache, num_blocks, block_size, page_stride(block_size), rng);
  for (auto& b : q) b = random_e4m3(rng);
  std::vector<float> w(static_cast<size_t>(T * kHeads));
  for (auto& v : w) v = static_cast<float>(rng.normal() * 0.01);
  std::vector<int32_t> n(static_cast<size_t>(T));
  indexer_candidates_from_positions(positions.data(), T, n.data());
  indices.assign(static_cast<size_t>(T * topk), -1);
  lengths.assign(static_cast<size_t>(T), 0);
  IndexerParams p;
  p.num_tokens = T;
  p.num_heads = kHeads;
  p.q = q.data();
  p.w = w.data();
  p.cache = {cache.data(), num_blocks, block_size, page_stride(block_size), IndexerLayout::Normal};
  p.block_table = table.data();
  p.block_table_stride = table_width;
  p.block_table_width = table_width;
  p.num_requests = num_requests;
  p.row_request = row_request.data();
  p.num_candidates = n.data();
  p.topk = topk;
  p.indices = indices.data();
  p.width = topk;
  p.lengths = lengths.data();
  p.path = Path::Cpu;
  std::vector<double> secs;
  for (int32_t i = 0; i < std::max(repeat, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    indexer_topk(p);
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(secs.begin(), secs.end());
  return secs[secs.size() / 2];
}

IndexerProblem build_indexer_problem(const IndexerProblemConfig& cfg) {
  IndexerProblem pb;
  pb.config = cfg;
  FastRng rng(cfg.seed);
  const int64_t B = cfg.batch, H = cfg.heads, ibs = cfg.page;
  pb.tokens = B * cfg.mtp;
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = cfg.candidates;
    if (cfg.vary && n > 0) n = n / 4 + rng.below(n - n / 4 + 1);
    pb.request_candidates.push_back(n);
  }
  int64_t total = 0;
  for (int64_t n : pb.request_candidates) {
    const int64_t pages = (n + ibs - 1) / ibs;
    pb.table_width = std::max<int32_t>(pb.table_width, static_cast<int32_t>(pages));
    total += pages;
  }
  pb.table_width = std::max(pb.table_width, 1);
  pb.num_blocks = std::max<int64_t>(total, 1);
  pb.block_stride = page_stride(ibs);
  fill_keys(pb.cache, pb.num_blocks, ibs, pb.block_stride, rng);
  std::vector<int32_t> phys(static_cast<size_t>(pb.num_blocks));
  std::iota(phys.begin(), phys.end(), 0);
  for (int64_t i = pb.num_blocks - 1; i > 0; --i) std::swap(phys[i], phys[rng.below(i + 1)]);
  pb.table.assign(static_cast<size_t>(B * pb.table_width), -1);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t pg = 0; pg < (pb.request_candidates[b] + ibs - 1) / ibs; ++pg)
      pb.table[b * pb.table_width + pg] = phys[next++];
  const int64_t T = pb.tokens;
  pb.q.resize(static_cast<size_t>(T * H * 128));
  for (auto& b : pb.q) b = random_e4m3(rng);
  pb.w.resize(static_cast<size_t>(T * H));
  for (auto& v : pb.w) v = static_cast<float>(rng.normal() * 0.01);
  for (int64_t b = 0; b < B; ++b) {
    for (int32_t i = 0; i < cfg.mtp; ++i) {
      pb.row_request.push_back(static_cast<int32_t>(b));
      const int64_t n = pb.request_candidates[b] - (cfg.mtp - 1 - i);
      pb.n.push_back(static_cast<int32_t>(std::max<int64_t>(n, 0)));
    }
  }
  pb.indices.assign(static_cast<size_t>(T * cfg.topk), 0);
  pb.lengths.assign(static_cast<size_t>(T), 0);
  if (cfg.scores) pb.scores.assign(static_cast<size_t>(T * cfg.topk), 0.0f);
  return pb;
}

IndexerParams IndexerProblem::params(Path path) {
  IndexerParams p;
  p.num_tokens = tokens;
  p.num_heads = config.heads;
  p.q = q.data();
  p.w = w.data();
  p.cache = {cache.data(), num_blocks, config.page, block_stride, IndexerLayout::Normal};
  p.block_table = table.data();
  p.block_table_stride = table_width;
  p.block_table_width = table_width;
  p.num_requests = config.batch;
  p.row_request = row_request.data();
  p.num_candidates = n.data();
  p.topk = config.topk;
  p.indices = indices.data();
  p.width = config.topk;
  p.lengths = lengths.data();
  p.scores = scores.empty() ? nullptr : scores.data();
  p.path = path;
  return p;
}

double IndexerProblem::bytes() const {
  double b = 0;
  for (int64_t n : request_candidates)
    b += 132.0 * static_cast<double>(n) +
         4.0 * static_cast<double>((n + config.page - 1) / config.page);
  const double out_row = 4.0 * config.topk * (config.scores ? 2 : 1);
  const double per_row = 128.0 * config.heads + 4.0 * config.heads + out_row + 8.0;
  return b + per_row * static_cast<double>(tokens);
}

double IndexerProblem::flops() const {
  double f = 0;
  for (int32_t v : n) f += 2.0 * config.heads * 128.0 * v;
  return f;
}

std::string check_indexer_row(const IndexerProblem& pb, int64_t t, const int32_t* indices,
                              int32_t length, const float* scores) {
  const int64_t k = pb.config.topk;
  const int64_t want = std::min<int64_t>(k, pb.n[t]);  // every page valid: C_t = [0, n_t)
  const std::string row = "row " + std::to_string(t);
  if (length != want)
    return row + ": length " + std::to_string(length) + ", expected " + std::to_string(want);
  std::set<int32_t> seen;
  for (int64_t i = 0; i < k; ++i) {
    const int32_t j = indices[i];
    const bool ok = i < want ? (j >= 0 && j < pb.n[t] && seen.insert(j).second) : j == -1;
    if (!ok) return row + ": entry " + std::to_string(i) + " = " + std::to_string(j);
    if (scores != nullptr && i >= want && !(std::isinf(scores[i]) && scores[i] < 0))
      return row + ": padding score " + std::to_string(i) + " = " + std::to_string(scores[i]);
  }
  return "";
}

std::string check_indexer_output(const IndexerProblem& pb) {
  const int64_t k = pb.config.topk;
  for (int64_t t = 0; t < pb.tokens; ++t) {
    const float* scores = pb.scores.empty() ? nullptr : pb.scores.data() + t * k;
    const std::string bad =
        check_indexer_row(pb, t, pb.indices.data() + t * k, pb.lengths[t], scores);
    if (!bad.empty()) return bad;
  }
  return "";
}

}  // namespace sparsemla::tools
