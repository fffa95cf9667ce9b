// tools/common/indexer_problem.h: a lightning-indexer decode problem (CONTRACT 11) on host memory,
// the standard shapes of CONTRACT 11.9 (`sparsemla bench --op indexer`) and the indexer step of a
// ratio-4 layer (`sparsemla run`): pages of `ibs` entries placed by a random permutation, random
// e4m3 key bytes (no NaN codes) with power-of-two scales, random e4m3 queries and fp32 weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparsemla/indexer.h"

namespace sparsemla::tools {

struct IndexerProblemConfig {
  int64_t batch = 1;       // requests
  int64_t candidates = 0;  // n per request (context / 4)
  bool vary = false;       // per-request lengths varying 4x (n/4 .. n), else all n
  int32_t mtp = 1;         // query rows per request (next_n); row i of a request sees n - (mtp-1-i)
  int32_t heads = 64;      // H
  int32_t topk = 512;      // k (and W)
  int32_t page = 64;       // ibs
  bool scores = false;     // the call also writes the selected scores [T, k]
  uint64_t seed = 1;
};

struct IndexerProblem {
  IndexerProblemConfig config;
  int64_t tokens = 0;      // T = batch * mtp
  std::vector<uint8_t> q;  // [T, H, 128] e4m3
  std::vector<float> w;    // [T, H]
  std::vector<uint8_t> cache;
  int64_t num_blocks = 0, block_stride = 0;
  std::vector<int32_t> table;  // [batch, table_width]
  int32_t table_width = 0;
  std::vector<int32_t> row_request, n;      // [T]
  std::vector<int64_t> request_candidates;  // n of each request (its longest row)
  std::vector<int32_t> indices, lengths;    // outputs [T, k], [T]
  std::vector<float> scores;                // output [T, k] when config.scores, else empty

  // Params over the host buffers (path and outputs set; the CPU backend reads them directly).
  IndexerParams params(Path path);
  // CONTRACT 11.9 counts: keys read once per request (132 B per candidate + 4 B per page id),
  // per row q, w, the output row (twice with scores) and 8 B; FLOPs 2*H*128 per candidate and row.
  double bytes() const;
  double flops() const;
  // The 11.9 memory floor at 4.3 TB/s, seconds.
  double floor_seconds() const { return bytes() / 4.3e12; }
};

IndexerProblem build_indexer_problem(const IndexerProblemConfig& cfg);

// The indexer step of a ratio-4 layer over an existing compressed block table (vLLM places the
// indexer pages next to the compressed ones: ibt = cbt, ibs = cbs): random keys, queries and
// weights (H = 64), n_t from positions (CONTRACT 11.1), k = topk. Writes the dense top-k
// [T, topk] (-1 padded) and lengths; returns the indexer's CPU time in seconds (median of
// `repeat` calls).
double run_indexer_step(const std::vector<int32_t>& table, int32_t table_width,
                        int64_t num_requests, int64_t num_blocks, int32_t block_size,
                        const std::vector<int64_t>& positions,
                        const std::vector<int32_t>& row_request, int32_t topk, uint64_t seed,
                        int32_t repeat, std::vector<int32_t>& indices,
                        std::vector<int32_t>& lengths);

// The structural check of 11.7 on row t of an output of this problem (every page valid, so
// C_t = [0, n_t)): `length` = min(k, n_t), that many distinct indices below n_t, then -1 up to k,
// and with scores (may be null) -inf in the padding. Returns "" or what failed.
std::string check_indexer_row(const IndexerProblem& pb, int64_t t, const int32_t* indices,
                              int32_t length, const float* scores);
// check_indexer_row on every row of the problem's own outputs (the CPU cells).
std::string check_indexer_output(const IndexerProblem& pb);

}  // namespace sparsemla::tools
