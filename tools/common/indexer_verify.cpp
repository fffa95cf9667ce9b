#include "indexer_verify.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "indexer_near_tie.h"
#include "sparsemla/numerics.h"

namespace sparsemla::tools {

namespace {

constexpr double kTensorCoreEps = 1.0 / 512;  // 2^-9: FP8 tensor-core paths (CONTRACT 11.7)

// One candidate of row t: local index, float64 score of 11.2 and A(t,s) of 11.7.
struct RefCandidate {
  int64_t j;
  double score;
  double a;
};

// The float64 reference of row t over C_t = [0, n_t) (every page of a bench problem is valid).
// Each e4m3 product is exact in fp32 (4-bit significands) and every sum exact in float64, so the
// dots are exact; OpenMP over candidates (262,144 of them at 1M, 8,192 products each).
std::vector<RefCandidate> reference_row(const IndexerProblem& pb, int64_t t) {
  const int32_t H = pb.config.heads, ibs = pb.config.page;
  const int64_t r = pb.row_request[t], n = pb.n[t];
  std::vector<float> qv(static_cast<size_t>(H) * 128);
  for (size_t i = 0; i < qv.size(); ++i) qv[i] = e4m3_to_float(pb.q[t * H * 128 + i]);
  const float* w = pb.w.data() + t * H;
  std::vector<RefCandidate> out(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* page =
        pb.cache.data() + int64_t{pb.table[r * pb.table_width + j / ibs]} * pb.block_stride;
    const int64_t p = j % ibs;
    float kv[128];
    for (int d = 0; d < 128; ++d) kv[d] = e4m3_to_float(page[p * 128 + d]);
    float scale;
    std::memcpy(&scale, page + ibs * 128 + p * 4, 4);
    double sum = 0.0, a = 0.0;
    for (int32_t h = 0; h < H; ++h) {
      double dot = 0.0, abs_dot = 0.0;
      for (int d = 0; d < 128; ++d) {
        const double prod = qv[h * 128 + d] * kv[d];
        dot += prod;
        abs_dot += std::fabs(prod);
      }
      sum += w[h] * (dot < 0.0 ? 0.0 : dot);
      a += std::fabs(w[h]) * abs_dot;
    }
    out[static_cast<size_t>(j)] = {j, scale * sum, scale * a};
  }
  return out;
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;  // bits: -0 and +0 differ
}

// The CPU backend on the chosen rows only (their q, w, request and n gathered; the whole cache and
// table): outputs [rows, k], scores always written.
IndexerOutputs cpu_rows(const IndexerProblem& pb, const std::vector<int64_t>& rows) {
  const int32_t H = pb.config.heads, k = pb.config.topk;
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<uint8_t> q(static_cast<size_t>(R * H * 128));
  std::vector<float> w(static_cast<size_t>(R * H));
  std::vector<int32_t> row_request(static_cast<size_t>(R)), n(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) {
    const int64_t t = rows[static_cast<size_t>(i)];
    std::memcpy(&q[i * H * 128], &pb.q[t * H * 128], static_cast<size_t>(H) * 128);
    std::memcpy(&w[i * H], &pb.w[t * H], static_cast<size_t>(H) * 4);
    row_request[i] = pb.row_request[t];
    n[i] = pb.n[t];
  }
  IndexerOutputs o;
  o.indices.assign(static_cast<size_t>(R * k), 0x5EED);
  o.lengths.assign(static_cast<size_t>(R), -7);
  o.scores.assign(static_cast<size_t>(R * k), 12345.0f);
  // params() only takes the problem's addresses; every row pointer and output is replaced here.
  IndexerParams p = const_cast<IndexerProblem&>(pb).params(Path::Cpu);
  p.num_tokens = R;
  p.q = q.data();
  p.w = w.data();
  p.row_request = row_request.data();
  p.num_candidates = n.data();
  p.indices = o.indices.data();
  p.lengths = o.lengths.data();
  p.scores = o.scores.data();
  indexer_topk(p);
  return o;
}

std::string bit_identical_row(const IndexerProblem& pb, const IndexerOutputs& got, int64_t t,
                              const IndexerOutputs& cpu, int64_t i) {
  const int64_t k = pb.config.topk;
  const std::string row = "row " + std::to_string(t);
  if (got.lengths[t] != cpu.lengths[i])
    return row + ": length " + std::to_string(got.lengths[t]) + ", cpu " +
           std::to_string(cpu.lengths[i]);
  for (int64_t x = 0; x < k; ++x) {
    const int32_t g = got.indices[t * k + x], c = cpu.indices[i * k + x];
    if (g != c)
      return row + " position " + std::to_string(x) + ": index " + std::to_string(g) + ", cpu " +
             std::to_string(c);
    if (!got.scores.empty() && !same_float(got.scores[t * k + x], cpu.scores[i * k + x]))
      return row + " position " + std::to_string(x) + ": score " +
             std::to_string(got.scores[t * k + x]) + ", cpu " +
             std::to_string(cpu.scores[i * k + x]);
  }
  return "";
}

std::string near_tie_row(const IndexerProblem& pb, const IndexerOutputs& got, int64_t t) {
  const int64_t k = pb.config.topk;
  const float* scores = got.scores.empty() ? nullptr : got.scores.data() + t * k;
  const std::string bad =
      check_indexer_row(pb, t, got.indices.data() + t * k, got.lengths[t], scores);
  if (!bad.empty()) return bad;
  const std::string tie = near_tie_violation(reference_row(pb, t), got.indices.data() + t * k,
                                             scores, got.lengths[t], kTensorCoreEps);
  return tie.empty() ? "" : "row " + std::to_string(t) + ": " + tie;
}

}  // namespace

std::vector<int64_t> indexer_rows_to_verify(int64_t T, int64_t max_rows) {
  std::vector<int64_t> rows;
  if (max_rows <= 0 || max_rows >= T) {
    for (int64_t t = 0; t < T; ++t) rows.push_back(t);
    return rows;
  }
  if (max_rows == 1) return {0};
  for (int64_t i = 0; i < max_rows; ++i) rows.push_back(i * (T - 1) / (max_rows - 1));
  return rows;
}

IndexerVerdict verify_indexer_outputs(const IndexerProblem& pb, const IndexerOutputs& got,
                                      IndexerCheck check, int64_t max_rows,
                                      const std::function<void(const std::string&)>& progress) {
  IndexerVerdict v;
  const std::vector<int64_t> rows = indexer_rows_to_verify(pb.tokens, max_rows);
  v.rows = static_cast<int64_t>(rows.size());
  const auto t0 = std::chrono::steady_clock::now();
  if (progress) {
    progress("verifying " + std::to_string(v.rows) + " of " + std::to_string(pb.tokens) +
             (check == IndexerCheck::BitIdentical
                  ? " rows: bit-identical to the CPU backend ..."
                  : " rows: near-tie rule (eps 2^-9) against the float64 reference ..."));
  }
  if (check == IndexerCheck::BitIdentical) {
    const IndexerOutputs cpu = cpu_rows(pb, rows);
    for (size_t i = 0; i < rows.size() && v.problem.empty(); ++i)
      v.problem = bit_identical_row(pb, got, rows[i], cpu, static_cast<int64_t>(i));
  } else {
    for (size_t i = 0; i < rows.size() && v.problem.empty(); ++i)
      v.problem = near_tie_row(pb, got, rows[i]);
  }
  if (progress) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress("verified in " + std::to_string(s).substr(0, 6) + " s");
  }
  return v;
}

}  // namespace sparsemla::tools
