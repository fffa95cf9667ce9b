// tests/gpu/test_gpu_indexer.cpp: the CUDA generic lightning-indexer decode (CONTRACT 11) against
// the CPU backend, which tests/cpp/test_indexer.cpp holds to the float64 reference. The generic
// path computes the CPU's fp32 operations in the CPU's order (docs/INDEXER.md), so on every input
// the two are bit-identical: indices, lengths, scores (NaN compared as NaN: payloads differ between
// host and device arithmetic) and both orders. The catalogue of CONTRACT 11.8 on the GPU:
// exact-arithmetic and random model-magnitude data, planted needles, ties and low-contrast rows
// (> 16,384 equal scores), 262,144-candidate rows, invalid pages and device values, NaN keys, MTP
// rows, k > n_t, page offsets beyond 2^31, determinism, CUDA-graph replay with changed n_t, the
// fused ratio-4 list, and the host errors. Every run poisons the outputs and the workspace first;
// output rows are strided so the gaps between rows show any write outside them.
//
// Fresh random data per run (SPARSEMLA_TEST_SEED reproduces one).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "reference/indexer_checks.h"
#include "reference/indexer_reference.h"
#include "reference/random.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer.h"

namespace sparsemla::test::gpu_indexer {
namespace {

using gpu_support::cuda_ok;
using gpu_support::DeviceBuffer;
using gpu_support::to_device;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kGap = 3;                // elements between output rows (poison kept)
constexpr uint8_t kPoisonByte = 0x5E;  // outputs: 0x5E5E5E5E, a finite float, an odd index
constexpr uint32_t kPoisonWord = 0x5E5E5E5Eu;

// The case's inputs on the device. page_shift > 0 moves every page up by that many page slots
// (num_blocks grows with it, the table names the moved pages): page offsets past 2^31 bytes.
struct DeviceIndexerCase {
  const IndexerCase& c;
  int64_t page_shift;
  DeviceBuffer q, w, cache, table, row_req, n;

  explicit DeviceIndexerCase(const IndexerCase& host, int64_t shift = 0)
      : c(host), page_shift(shift) {
    q = to_device(c.q);
    w = to_device(c.w);
    cache = DeviceBuffer(static_cast<size_t>((c.num_blocks + shift) * c.block_stride));
    cache.upload(c.cache.data(), c.cache.size(), static_cast<size_t>(shift * c.block_stride));
    std::vector<int32_t> t = c.table;
    if (shift > 0) {
      for (auto& b : t)
        if (b >= 0 && b < c.num_blocks) b = static_cast<int32_t>(b + shift);
    }
    table = to_device(t);
    row_req = to_device(c.row_req);
    n = to_device(c.n);
  }
  void set_lengths(const std::vector<int32_t>& lengths) {
    n.upload(lengths.data(), lengths.size() * sizeof(int32_t));
  }

  // Device params; outputs strided by W + kGap.
  IndexerParams params(int32_t* indices, int32_t* lengths, float* scores,
                       Path path = Path::CudaGeneric) const {
    IndexerParams p = c.params(nullptr, nullptr, nullptr);
    p.q = c.T > 0 ? q.as<uint8_t>() : nullptr;
    p.w = c.T > 0 ? w.as<float>() : nullptr;
    p.cache.base = cache.as<uint8_t>();
    p.cache.num_blocks = c.num_blocks + page_shift;
    p.block_table = table.as<int32_t>();
    p.row_request = row_req.as<int32_t>();
    p.num_candidates = n.as<int32_t>();
    p.indices = indices;
    p.indices_stride = c.W + kGap;
    p.lengths = lengths;
    p.scores = scores;
    p.scores_stride = c.W + kGap;
    p.path = path;
    return p;
  }
};

// Device outputs of one call, poisoned; download() checks the gaps and returns dense results.
struct DeviceOut {
  const IndexerCase& c;
  bool with_scores;
  DeviceBuffer indices, lengths, scores;
  DeviceOut(const IndexerCase& host, bool scores_out)
      : c(host),
        with_scores(scores_out),
        indices(static_cast<size_t>(std::max<int64_t>(1, c.T * (c.W + kGap))) * 4),
        lengths(static_cast<size_t>(std::max<int64_t>(1, c.T)) * 4),
        scores(scores_out ? static_cast<size_t>(std::max<int64_t>(1, c.T * (c.W + kGap))) * 4 : 0) {
    poison();
  }
  void poison() {
    indices.fill(kPoisonByte);
    lengths.fill(kPoisonByte);
    scores.fill(kPoisonByte);
  }
  IndexerOut download() const {
    const size_t strided = static_cast<size_t>(c.T * (c.W + kGap));
    std::vector<int32_t> idx(strided);
    std::vector<float> sc(with_scores ? strided : 0);
    IndexerOut o;
    o.lengths.resize(static_cast<size_t>(c.T));
    indices.download(idx.data(), strided * 4);
    lengths.download(o.lengths.data(), o.lengths.size() * 4);
    if (with_scores) scores.download(sc.data(), strided * 4);
    for (int64_t t = 0; t < c.T; ++t) {
      for (int32_t i = 0; i < c.W + kGap; ++i) {
        const size_t at = static_cast<size_t>(t * (c.W + kGap) + i);
        if (i >= c.W) {
          EXPECT_EQ(static_cast<uint32_t>(idx[at]), kPoisonWord) << "row " << t << " gap " << i;
          if (with_scores) {
            uint32_t bits;
            std::memcpy(&bits, &sc[at], 4);
            EXPECT_EQ(bits, kPoisonWord) << "scores row " << t << " gap " << i;
          }
          continue;
        }
        o.indices.push_back(idx[at]);
        if (with_scores) o.scores.push_back(sc[at]);
      }
    }
    return o;
  }
};

// A workspace of exactly the size query (plus nothing), poisoned with `poison`.
DeviceBuffer workspace_for(const IndexerParams& p, int poison) {
  DeviceBuffer ws(std::max<size_t>(8, indexer_workspace_size(p)));
  ws.fill(poison);
  return ws;
}

IndexerOut run_gpu(const DeviceIndexerCase& d, TopkOrder order, bool scores, int ws_poison = 0xFF,
                   Path path = Path::CudaGeneric) {
  DeviceOut out(d.c, scores);
  IndexerParams p = d.params(out.indices.as<int32_t>(), out.lengths.as<int32_t>(),
                             scores ? out.scores.as<float>() : nullptr, path);
  p.order = order;
  DeviceBuffer ws = workspace_for(p, ws_poison);
  indexer_topk(p, ws.as<void>(), indexer_workspace_size(p));
  cuda_ok(cudaDeviceSynchronize(), "indexer_topk");
  return out.download();
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;  // bits: -0 and +0 differ
}

// GPU == CPU element for element.
void expect_identical(const IndexerCase& c, const IndexerOut& cpu, const IndexerOut& gpu,
                      const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(cpu.lengths, gpu.lengths);
  int reported = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int32_t i = 0; i < c.W; ++i) {
      const size_t at = static_cast<size_t>(t * c.W + i);
      const bool idx_ok = cpu.indices[at] == gpu.indices[at];
      const bool score_ok = cpu.scores.empty() || same_float(cpu.scores[at], gpu.scores[at]);
      if ((!idx_ok || !score_ok) && reported++ < 10) {
        ADD_FAILURE() << "row " << t << " position " << i << ": cpu (" << cpu.indices[at]
                      << (cpu.scores.empty() ? "" : ", " + std::to_string(cpu.scores[at]))
                      << ") gpu (" << gpu.indices[at]
                      << (gpu.scores.empty() ? "" : ", " + std::to_string(gpu.scores[at])) << ")";
      }
    }
  }
  EXPECT_EQ(reported, 0) << reported << " mismatching elements";
}

// Both orders, with and without scores: GPU == CPU.
void expect_gpu_equals_cpu(const IndexerCase& c, const DeviceIndexerCase& d,
                           const std::string& what, Path path = Path::CudaGeneric) {
  for (const TopkOrder order : {TopkOrder::ByIndex, TopkOrder::ByScore}) {
    for (const bool scores : {true, false}) {
      const std::string tag = what + (order == TopkOrder::ByIndex ? " by_index" : " by_score") +
                              (scores ? " +scores" : "");
      expect_identical(c, run_indexer_cpu(c, order, scores), run_gpu(d, order, scores, 0xFF, path),
                       tag);
    }
  }
}

// ---- exact-arithmetic data (CONTRACT 11.7): every backend bit for bit ---------------------------

// 11.8.1 and 11.8.7: lengths around k and the page, k in {1, 7, 512, 1024, 2048}, W > k, NORMAL
// and SHUFFLE, ibs in {1, 16, 61, 64, 256}, H in {1, 4, 16, 64, 128}.
TEST(GpuIndexerGeneric, ExactDataBitIdenticalToCpuAcrossLengthsLayoutsHeadsAndK) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  struct Shape {
    int32_t H, ibs, k;
    IndexerLayout layout;
  };
  for (const Shape s :
       {Shape{4, 64, 7, IndexerLayout::Normal}, Shape{1, 16, 1, IndexerLayout::Shuffle},
        Shape{16, 61, 7, IndexerLayout::Normal}, Shape{2, 1, 7, IndexerLayout::Normal},
        Shape{64, 64, 512, IndexerLayout::Normal}, Shape{128, 256, 1024, IndexerLayout::Shuffle},
        Shape{8, 64, 2048, IndexerLayout::Normal}}) {
    const std::string what = "H=" + std::to_string(s.H) + " ibs=" + std::to_string(s.ibs) +
                             " k=" + std::to_string(s.k) +
                             (s.layout == IndexerLayout::Shuffle ? " shuffle" : " normal");
    SCOPED_TRACE(what);
    const int32_t k = s.k, ibs = s.ibs;
    const std::vector<int32_t> lengths = {0,     1,       k - 1, k,       k + 1,
                                          2 * k, ibs - 1, ibs,   ibs + 1, 3 * ibs + 5};
    const int64_t T = static_cast<int64_t>(lengths.size());
    const int32_t Wt = (std::max(2 * k, 3 * ibs + 5) + ibs - 1) / ibs;
    IndexerCase c = make_indexer_case(rng, T, s.H, ibs, T, Wt, k, k + 3, s.layout);
    fill_exact(rng, c);
    for (int64_t t = 0; t < T; ++t)
      c.row_req[t] = static_cast<int32_t>(t), c.n[t] = std::max(0, lengths[t]);
    const DeviceIndexerCase d(c);
    expect_gpu_equals_cpu(c, d, what);
  }
}

// 11.7 exact data, all-equal and all-zero rows and the band of 11.8.6 at 65,536 and 262,144
// candidates: 65,536 or more equal scores (far above the 16,384 that overflowed radix bins
// elsewhere), the lowest indices win.
TEST(GpuIndexerGeneric, LowContrastRowsOf65536And262144TiesK512K2048) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 4096;
  for (const int32_t k : {512, 2048}) {
    for (const int32_t n : {65536, 262144}) {
      const std::string what = "k=" + std::to_string(k) + " n=" + std::to_string(n);
      SCOPED_TRACE(what);
      IndexerCase c = make_indexer_case(rng, 3, 1, ibs, 1, Wt, k, k);
      uint8_t bytes[128];
      for (auto& b : bytes) b = small_e4m3(1);
      for (int64_t j = 0; j < n; ++j) c.set_entry(0, j, bytes, j % 97 == 5 ? 2.0f : 1.0f);
      for (int d = 0; d < 128; ++d) {
        c.q[0 * 128 + d] = small_e4m3(1);   // every score equal up to the scale
        c.q[1 * 128 + d] = small_e4m3(-1);  // every dot negative: all scores 0
        c.q[2 * 128 + d] = small_e4m3(d % 2 ? 1 : 2);
      }
      for (int64_t t = 0; t < c.T; ++t) c.w[t] = 1.0f / 64, c.n[t] = n;
      const DeviceIndexerCase d(c);
      expect_gpu_equals_cpu(c, d, what);
      const IndexerOut o = run_gpu(d, TopkOrder::ByIndex, true);
      for (int32_t i = 0; i < k; ++i) {  // the all-zero row: indices 0..k-1
        ASSERT_EQ(o.indices[1 * c.W + i], i) << "all-zero row, position " << i;
      }
    }
  }
}

// 11.8.2: rows of 262,144 candidates (1M context) at B = 1 and 4, k = 2048 and 512, lengths
// varying 4x; exact data, and a row whose scores rise with j (every later split beats every
// earlier one: the merge's worst case).
TEST(GpuIndexerGeneric, LongRowsOf262144CandidatesB1B4K512K2048) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 4096;
  for (const int64_t B : {int64_t{1}, int64_t{4}}) {
    for (const int32_t k : {2048, 512}) {
      const std::string what = "B=" + std::to_string(B) + " k=" + std::to_string(k);
      SCOPED_TRACE(what);
      IndexerCase c = make_indexer_case(rng, B, 2, ibs, 1, Wt, k, k + 5);
      fill_exact(rng, c);
      share_pages_across_requests(rng, c,
                                  B);  // B requests over the same pages, each in its own order
      for (int64_t t = 0; t < c.T; ++t) {
        c.row_req[t] = static_cast<int32_t>(t);
        c.n[t] = t == 0 ? Wt * ibs : static_cast<int32_t>(rng.randint(Wt * ibs / 4, Wt * ibs));
      }
      if (B == 4) {
        // Row 3: scores rise with j (scale 2^(j / 16384 - 8), positive dots). The requests share
        // pages, so rows 0-2 see these keys too (in their own orders): long low-contrast rows.
        uint8_t bytes[128];
        for (auto& b : bytes) b = small_e4m3(1);
        for (int d = 0; d < 128; ++d) c.q[(3 * c.H + 0) * 128 + d] = small_e4m3(1);
        c.w[3 * c.H + 0] = 1.0f / 64, c.w[3 * c.H + 1] = 0.0f;
        for (int64_t j = 0; j < int64_t{Wt} * ibs; ++j)
          c.set_entry(3, j, bytes, std::ldexp(1.0f, static_cast<int>(j / 16384) - 8));
      }
      const DeviceIndexerCase d(c);
      for (const TopkOrder order : {TopkOrder::ByScore, TopkOrder::ByIndex}) {
        expect_identical(c, run_indexer_cpu(c, order, true), run_gpu(d, order, true), what);
      }
    }
  }
}

// ---- random data at model magnitudes ------------------------------------------------------------

// Random bytes of N(0, 1) * 16, scales 2^-8..2^-4, weights N(0, 1) / 128 (fill_random): the CPU's
// fp32 operations reproduced, so scores are equal bit for bit, not only within 2^-16 * A; H = 64
// (DSV4) and the other head counts, pages of 64 in a random permutation.
TEST(GpuIndexerGeneric, RandomModelMagnitudesBitIdenticalToCpuH1H16H64H128) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (const int32_t H : {64, 1, 16, 128}) {
    const std::string what = "H=" + std::to_string(H);
    SCOPED_TRACE(what);
    const int32_t k = H == 64 ? 512 : 64, ibs = 64, Wt = 48;
    IndexerCase c = make_indexer_case(rng, 6, H, ibs, 6, Wt, k, k + 1);
    fill_random(rng, c);
    for (int64_t t = 0; t < c.T; ++t) {
      c.row_req[t] = static_cast<int32_t>(t);
      c.n[t] = static_cast<int32_t>(rng.randint(k / 2, Wt * ibs));
    }
    const DeviceIndexerCase d(c);
    expect_gpu_equals_cpu(c, d, what);
  }
}

// The sm90 path's eps (FP8 tensor-core sums, CONTRACT 11.7).
constexpr double kFp8Eps = 1.0 / 512;  // 2^-9 (CONTRACT 11.7)

// Planted needles: three rows of H = 64, k = 512, whose k planted needles (keys equal to the row's
// query, positive weights) outscore every random key; `needles` gets each row's set.
IndexerCase make_needles_case(Rng& rng, std::vector<std::set<int64_t>>* needles) {
  const int32_t k = 512, ibs = 64, Wt = 128, H = 64;
  IndexerCase c = make_indexer_case(rng, 3, H, ibs, 3, Wt, k, k);
  fill_random(rng, c);
  needles->assign(static_cast<size_t>(c.T), {});
  for (int64_t t = 0; t < c.T; ++t) {
    auto& row = (*needles)[static_cast<size_t>(t)];
    c.row_req[t] = static_cast<int32_t>(t);
    c.n[t] = Wt * ibs - static_cast<int32_t>(rng.randint(0, 100));
    for (int32_t h = 0; h < H; ++h) c.w[t * H + h] = std::fabs(c.w[t * H + h]) + 0.01f;
    while (static_cast<int32_t>(row.size()) < k) row.insert(rng.randint(0, c.n[t] - 1));
    for (const int64_t j : row) c.set_entry(t, j, c.q.data() + t * H * 128, 1.0f);
  }
  return c;
}

// The determinism tests' other batches: row `row` of c alone (T = 1: ~2 CU splits), and `T`
// rows cycling through c's rows (one split each at T = 300).
IndexerCase single_row_case(const IndexerCase& c, int64_t row) {
  const int64_t H = c.H;
  IndexerCase alone = c;
  alone.T = 1;
  alone.q.assign(c.q.begin() + row * H * 128, c.q.begin() + (row + 1) * H * 128);
  alone.w.assign(c.w.begin() + row * H, c.w.begin() + (row + 1) * H);
  alone.row_req = {c.row_req[row]}, alone.n = {c.n[row]};
  return alone;
}
IndexerCase cycled_rows_case(const IndexerCase& c, int64_t T) {
  const int64_t H = c.H;
  IndexerCase big = c;
  big.T = T;
  big.q.clear(), big.w.clear(), big.row_req.clear(), big.n.clear();
  for (int64_t t = 0; t < big.T; ++t) {
    const int64_t src = t % c.T;
    big.q.insert(big.q.end(), c.q.begin() + src * H * 128, c.q.begin() + (src + 1) * H * 128);
    big.w.insert(big.w.end(), c.w.begin() + src * H, c.w.begin() + (src + 1) * H);
    big.row_req.push_back(c.row_req[src]);
    big.n.push_back(c.n[src]);
  }
  return big;
}

// 11.7 planted top-k: k needles beat every other key by far more than the bound; the selection is
// the needles. The generic path also equals the CPU bit for bit; the sm90 path's scores are
// within 11.7's bound of the reference.
void expect_needles_are_the_selection(Path path) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  std::vector<std::set<int64_t>> needles;
  const IndexerCase c = make_needles_case(rng, &needles);
  const DeviceIndexerCase d(c);
  const bool sm90 = path == Path::CudaSm90;
  if (!sm90) expect_gpu_equals_cpu(c, d, "needles");
  const IndexerOut o = run_gpu(d, TopkOrder::ByIndex, sm90, 0xFF, path);
  for (int64_t t = 0; t < c.T; ++t) {
    const std::set<int64_t> got(o.indices.begin() + t * c.W, o.indices.begin() + t * c.W + c.k);
    EXPECT_EQ(got, needles[t]) << "row " << t;
    if (sm90) expect_within_bounds(c, o, t, kFp8Eps);
  }
}

TEST(GpuIndexerGeneric, PlantedNeedlesAreTheSelectionH64K512) {
  expect_needles_are_the_selection(Path::CudaGeneric);
}

// 11.8.3: MTP next_n = 2 (rows of one request adjacent, n equal or differing by one), a request's
// rows apart, and next_n = 4.
TEST(GpuIndexerGeneric, MtpRowsNextN2AndNextN4AdjacentAndApartH64) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t k = 128, ibs = 64, Wt = 40, H = 64;
  IndexerCase c = make_indexer_case(rng, 10, H, ibs, 4, Wt, k, k + 2);
  fill_random(rng, c);
  const int32_t reqs[10] = {0, 0, 1, 1, 2, 3, 2, 3, 3, 3};
  for (int64_t t = 0; t < c.T; ++t) {
    c.row_req[t] = reqs[t];
    c.n[t] = static_cast<int32_t>(rng.randint(k, Wt * ibs - 4));
  }
  c.n[1] = c.n[0] + 1;  // positions p, p + 1 with (p + 2) % 4 == 0
  c.n[3] = c.n[2];
  for (int t = 7; t < 10; ++t) c.n[t] = c.n[6] + (t - 6) / 2;  // next_n = 4 tail
  const DeviceIndexerCase d(c);
  expect_gpu_equals_cpu(c, d, "mtp");
}

// ---- device values and invalid input (CONTRACT 11.4) --------------------------------------------

// 11.8.4: page ids {-2^31, -1, num_blocks, num_blocks + 1024, 2^31 - 1}, duplicate pages, padding
// rows (row_request -1 and >= R), n < 0, n > Wt * ibs, T = 0.
TEST(GpuIndexerGeneric, InvalidPagesPaddingRowsAndOutOfRangeLengths) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 8, Wt = 6, k = 12;
  IndexerCase c = make_indexer_case(rng, 7, 4, ibs, 3, Wt, k, k + 2);
  fill_exact(rng, c);
  const int32_t bad[] = {INT_MIN, -1, static_cast<int32_t>(c.num_blocks),
                         static_cast<int32_t>(c.num_blocks + 1024), INT_MAX};
  for (int32_t b = 0; b < 5; ++b) c.table[0 * c.table_stride + b] = bad[b];  // request 0
  c.table[1 * c.table_stride + 2] = c.table[1 * c.table_stride + 0];         // duplicate page
  c.table[2 * c.table_stride + 3] = -1;                                      // a hole in request 2
  const int32_t reqs[7] = {0, 1, -1, 3, 2, 2, INT_MAX};
  const int32_t ns[7] = {Wt * ibs, Wt * ibs, 40, 40, -5, Wt * ibs + 1000, 10};
  for (int64_t t = 0; t < c.T; ++t) c.row_req[t] = reqs[t], c.n[t] = ns[t];
  const DeviceIndexerCase d(c);
  expect_gpu_equals_cpu(c, d, "invalid");
  const IndexerOut o = run_gpu(d, TopkOrder::ByIndex, true);
  EXPECT_EQ(o.lengths[0], std::min(k, (Wt - 5) * ibs));  // only page 5 of request 0 is valid
  EXPECT_EQ(o.lengths[2], 0);                            // row_request -1
  EXPECT_EQ(o.lengths[3], 0);                            // row_request >= R
  EXPECT_EQ(o.lengths[4], 0);                            // n < 0
  EXPECT_EQ(o.lengths[6], 0);                            // row_request INT_MAX
  for (int32_t i = 0; i < c.W; ++i) {
    EXPECT_EQ(o.indices[2 * c.W + i], -1);
    EXPECT_EQ(o.scores[2 * c.W + i], kNegInf);
  }
  IndexerCase empty = c;  // T = 0: nothing launched, nothing written
  empty.T = 0;
  empty.row_req.clear(), empty.n.clear(), empty.q.clear(), empty.w.clear();
  const DeviceIndexerCase de(empty);
  DeviceOut out(empty, true);
  IndexerParams p =
      de.params(out.indices.as<int32_t>(), out.lengths.as<int32_t>(), out.scores.as<float>());
  EXPECT_EQ(indexer_workspace_size(p), 0u);
  EXPECT_NO_THROW(indexer_topk(p));
  cuda_ok(cudaDeviceSynchronize(), "T = 0");
}

// 11.8.5: NaN bytes (0x7F / 0xFF) and +inf scales rank last, NaN in w makes a row all -inf keys
// (lowest indices win), -0 ties +0; exact data around the poisoned entries.
TEST(GpuIndexerGeneric, NanKeyBytesInfScalesAndNanWeightsRankLast) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 16, Wt = 8, k = 20;
  IndexerCase c = make_indexer_case(rng, 4, 4, ibs, 1, Wt, k, k);
  fill_exact(rng, c);
  for (int64_t t = 0; t < c.T; ++t) c.n[t] = Wt * ibs;
  uint8_t bytes[128];
  // NaN bytes in 30 entries, a +inf scale in 30 others, a scale of -1 in 30 more (a zero head
  // sum then scores -0, which ties +0).
  for (int j = 0; j < 30; ++j) {
    for (auto& b : bytes) b = small_e4m3(static_cast<int>(rng.randint(-2, 2)));
    bytes[rng.randint(0, 127)] = rng.randint(0, 1) ? 0x7F : 0xFF;
    c.set_entry(0, 3 * j, bytes, 1.0f);
    for (auto& b : bytes) b = small_e4m3(static_cast<int>(rng.randint(-2, 2)));
    c.set_entry(0, 3 * j + 1, bytes, std::numeric_limits<float>::infinity());
    for (auto& b : bytes) b = small_e4m3(static_cast<int>(rng.randint(-2, 0)));
    c.set_entry(0, 3 * j + 2, bytes, -1.0f);
  }
  c.w[2 * c.H + 1] = std::numeric_limits<float>::quiet_NaN();  // row 2: every score NaN
  for (int h = 0; h < c.H; ++h) {  // row 3: q = 1 everywhere: dots <= 0 on the -1-scale entries
    c.w[3 * c.H + h] = std::fabs(c.w[3 * c.H + h]);
    for (int d = 0; d < 128; ++d) c.q[(3 * c.H + h) * 128 + d] = small_e4m3(1);
  }
  const DeviceIndexerCase d(c);
  expect_gpu_equals_cpu(c, d, "nan");
  const IndexerOut o = run_gpu(d, TopkOrder::ByScore, true);
  for (int32_t i = 0; i < k; ++i) {
    EXPECT_EQ(o.indices[2 * c.W + i], i) << "NaN row, position " << i;
    EXPECT_TRUE(std::isnan(o.scores[2 * c.W + i]));
  }
}

// 11.3: k > n_t selects every candidate whatever its score; without scores and in index order the
// keys are not read, so unwritten (poisoned) key bytes change nothing.
TEST(GpuIndexerGeneric, KAboveNtSelectsEveryCandidateK2048) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 40, k = 2048;
  IndexerCase c = make_indexer_case(rng, 5, 64, ibs, 5, Wt, k, k + 7);
  fill_random(rng, c);
  const int32_t ns[5] = {0, 1, 700, 2047, 2048};
  for (int64_t t = 0; t < c.T; ++t) c.row_req[t] = static_cast<int32_t>(t), c.n[t] = ns[t];
  c.table[2 * c.table_stride + 4] = -1;  // row 2 loses one page: 636 candidates
  const DeviceIndexerCase d(c);
  expect_gpu_equals_cpu(c, d, "k > n");
  const IndexerOut o = run_gpu(d, TopkOrder::ByIndex, false);
  EXPECT_EQ(o.lengths, (std::vector<int32_t>{0, 1, 700 - 64, 2047, 2048}));
  IndexerCase garbage = c;  // key bytes NaN everywhere: not read in this mode
  std::fill(garbage.cache.begin(), garbage.cache.end(), uint8_t{0xFF});
  const DeviceIndexerCase dg(garbage);
  const IndexerOut og = run_gpu(dg, TopkOrder::ByIndex, false);
  EXPECT_EQ(og.indices, o.indices);
  EXPECT_EQ(og.lengths, o.lengths);
}

// Many cuts per row (the top-k buffer's radix cut and the merges' cuts, indexer_select.cuh): k from
// 1 to 2048 over rows of 65,536 candidates at T = 4 (~66 splits: the lanes merge) and of 16,384 at
// T = 40 (~7 splits: the one-list-at-a-time merge), exact data (bit-identical on every path); row
// pattern t % 4: 0 full length, 1 a zero query (every score +0: the selection decided by index
// alone), 2 a length off the tile grid, 3 fewer candidates than k (k = 1: none). Both orders,
// with and without scores.
void expect_many_cuts_rows_equal_cpu(Rng& rng, Path path) {
  struct Shape {
    int64_t T;
    int32_t Wt;
  };
  const int32_t ibs = 64, H = 4;
  for (const Shape sh : {Shape{4, 1024}, Shape{40, 256}}) {
    for (const int32_t k : {1, 7, 64, 300, 2048}) {
      const std::string what = "T=" + std::to_string(sh.T) + " n=" + std::to_string(sh.Wt * ibs) +
                               " k=" + std::to_string(k);
      SCOPED_TRACE(what);
      IndexerCase c = make_indexer_case(rng, sh.T, H, ibs, 1, sh.Wt, k, k + 3);
      fill_exact(rng, c);
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t pattern = t % 4;
        c.row_req[t] = 0;
        c.n[t] = pattern == 2 ? sh.Wt * ibs - 77 : pattern == 3 ? k / 2 : sh.Wt * ibs;
        if (pattern == 1) {
          for (int64_t i = t * H * 128; i < (t + 1) * H * 128; ++i) c.q[i] = small_e4m3(0);
        }
      }
      const DeviceIndexerCase d(c);
      expect_gpu_equals_cpu(c, d, what, path);
    }
  }
}

TEST(GpuIndexerGeneric, ManyCutsPerRowK1ToK2048AllEqualRowsAndKAboveNBothMerges) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  expect_many_cuts_rows_equal_cpu(rng, Path::CudaGeneric);
}

// 11.8.7: pages placed past byte offset 2^31 of the cache (int64 addressing); the same results as
// the unshifted case on the CPU.
TEST(GpuIndexerGeneric, PageOffsetsBeyond2To31) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 16, k = 64;
  IndexerCase c = make_indexer_case(rng, 2, 16, ibs, 2, Wt, k, k);
  fill_random(rng, c);
  for (int64_t t = 0; t < c.T; ++t) c.row_req[t] = static_cast<int32_t>(t), c.n[t] = Wt * ibs;
  const int64_t shift = (int64_t{1} << 31) / c.block_stride + 1;
  const DeviceIndexerCase d(c, shift);
  for (const TopkOrder order : {TopkOrder::ByIndex, TopkOrder::ByScore})
    expect_identical(c, run_indexer_cpu(c, order, true), run_gpu(d, order, true), "offset > 2^31");
}

// ---- determinism, batch invariance, graphs
// -------------------------------------------------------

// 11.7: 20 runs bit-identical (workspace poisoned differently each time); a row's output does not
// change with its batchmates, T or the split count (T = 1 runs ~2 CU splits per row, T = 300 one).
TEST(GpuIndexerGeneric, DeterministicOver20RunsAndAcrossBatchAndSplitCountH64) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 160, k = 512, H = 64;
  IndexerCase c = make_indexer_case(rng, 5, H, ibs, 5, Wt, k, k);
  fill_random(rng, c);
  for (int64_t t = 0; t < c.T; ++t)
    c.row_req[t] = static_cast<int32_t>(t), c.n[t] = Wt * ibs - static_cast<int32_t>(t);
  const DeviceIndexerCase d(c);
  const IndexerOut first = run_gpu(d, TopkOrder::ByScore, true);
  expect_identical(c, run_indexer_cpu(c, TopkOrder::ByScore, true), first, "first run");
  for (int i = 0; i < 20; ++i) {
    const IndexerOut again = run_gpu(d, TopkOrder::ByScore, true, i % 2 ? 0x00 : 0xA7);
    ASSERT_EQ(again.indices, first.indices) << "run " << i;
    ASSERT_EQ(again.lengths, first.lengths) << "run " << i;
    ASSERT_EQ(0, std::memcmp(again.scores.data(), first.scores.data(), 4 * first.scores.size()))
        << "run " << i;
  }
  // Row 3 alone (T = 1) and in a batch of 300 copies of the five rows.
  const IndexerCase alone = single_row_case(c, 3);
  const IndexerOut single = run_gpu(DeviceIndexerCase(alone), TopkOrder::ByScore, true);
  EXPECT_TRUE(
      std::equal(single.indices.begin(), single.indices.end(), first.indices.begin() + 3 * c.W));
  EXPECT_EQ(0, std::memcmp(single.scores.data(), first.scores.data() + 3 * c.W, 4 * c.W));
  const IndexerCase big = cycled_rows_case(c, 300);
  const IndexerOut batch = run_gpu(DeviceIndexerCase(big), TopkOrder::ByScore, true);
  for (int64_t t = 0; t < big.T; ++t) {
    const int64_t src = t % c.T;
    ASSERT_TRUE(std::equal(first.indices.begin() + src * c.W,
                           first.indices.begin() + (src + 1) * c.W,
                           batch.indices.begin() + t * c.W))
        << "row " << t;
    ASSERT_EQ(0,
              std::memcmp(first.scores.data() + src * c.W, batch.scores.data() + t * c.W, 4 * c.W))
        << "row " << t;
  }
}

// 11.5 graph safety: one call captured at (T, Wt = 4096 pages of 64), replayed with the lengths
// rewritten on the device (short rows, then long ones again, then padding rows): every replay
// equals an eager call on the same lengths and the CPU.
TEST(GpuIndexerGeneric, GraphCaptureReplayWithChangedLengthsEqualsEagerWt4096) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 4096, k = 512;
  IndexerCase c = make_indexer_case(rng, 4, 4, ibs, 1, Wt, k, k);
  fill_exact(rng, c);
  share_pages_across_requests(rng, c, 4);
  for (int64_t t = 0; t < c.T; ++t) c.row_req[t] = static_cast<int32_t>(t), c.n[t] = Wt * ibs;
  DeviceIndexerCase d(c);
  DeviceOut out(c, true);
  IndexerParams p =
      d.params(out.indices.as<int32_t>(), out.lengths.as<int32_t>(), out.scores.as<float>());
  p.order = TopkOrder::ByScore;
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  p.stream = stream;
  const size_t bytes = indexer_workspace_size(p);
  DeviceBuffer ws = workspace_for(p, 0xFF);
  indexer_topk(p, ws.as<void>(), bytes);  // warm-up outside the capture
  cuda_ok(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  indexer_topk(p, ws.as<void>(), bytes);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const std::vector<std::vector<int32_t>> steps = {
      {Wt * ibs, Wt * ibs - 77, 3 * Wt * ibs / 4, Wt * ibs / 2},  // long
      {100, 513, 8192, 0},                                        // short
      {Wt * ibs, 250000, 131072, 65537},                          // long again
      {-3, Wt * ibs + 5, 511, 512}};                              // negative, clamped
  for (size_t step = 0; step < steps.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    c.n = steps[step];
    d.set_lengths(c.n);
    out.poison();
    ws.fill(static_cast<int>(step * 37 + 1));
    cuda_ok(cudaDeviceSynchronize(), "poison");  // memsets on the legacy stream, replay on `stream`
    cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
    cuda_ok(cudaStreamSynchronize(stream), "replay");
    const IndexerOut replayed = out.download();
    const IndexerOut eager = run_gpu(d, TopkOrder::ByScore, true);
    expect_identical(c, eager, replayed, "replay vs eager");
    expect_identical(c, run_indexer_cpu(c, TopkOrder::ByScore, true), replayed, "replay vs cpu");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- the fused ratio-4 list (CONTRACT 11.1)
// ------------------------------------------------------

// IndexerParams::fused on the device: the dense output and the ragged global list equal the CPU
// fused call's, element for element, in both orders, eagerly and in a CUDA-graph replay with
// changed n_t; a padding row (row_valid 0) and a request row with fewer candidates than k; the
// compressed table narrower than the indexer's, so entries past it become -1 (CONTRACT 4.6).
// Outputs poisoned; the list's slack past indptr[T] keeps its poison.
TEST(GpuIndexerGeneric, FusedRaggedListOnTheDeviceEqualsTheCpuFusedCallEagerAndReplayed) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t k = 40, ibs = 16, Wt = 12, Wc = Wt - 3;
  IndexerCase c = make_indexer_case(rng, 6, 16, ibs, 3, Wt, k, k + 5);
  fill_random(rng, c);
  const int32_t reqs[6] = {0, 0, 1, 2, -1, 2};
  for (int64_t t = 0; t < c.T; ++t) {
    c.row_req[t] = reqs[t];
    c.n[t] = static_cast<int32_t>(rng.randint(k, Wt * ibs));
  }
  c.n[3] = 7;  // fewer candidates than k
  std::vector<uint8_t> valid(static_cast<size_t>(c.T), 1);
  valid[4] = 0;
  std::vector<int32_t> cbt(static_cast<size_t>(c.R * Wc));
  for (auto& b : cbt) b = static_cast<int32_t>(rng.randint(0, 4999));
  const size_t list_elems = static_cast<size_t>(c.T * c.W);
  DeviceIndexerCase d(c);
  DeviceBuffer d_valid = to_device(valid), d_cbt = to_device(cbt);
  DeviceBuffer d_list((list_elems + kGap) * 4), d_indptr(static_cast<size_t>(c.T + 1) * 4);
  const auto fuse = [&](IndexerParams& p, int32_t* list, int32_t* indptr, const uint8_t* rv,
                        const int32_t* table) {
    p.fused.out = {list, indptr, c.W};
    p.fused.row_valid = rv;
    p.fused.block_table = table;
    p.fused.block_table_stride = Wc;
    p.fused.table_width = Wc;
    p.fused.block_size = ibs;
  };
  for (const TopkOrder order : {TopkOrder::ByIndex, TopkOrder::ByScore}) {
    SCOPED_TRACE(order == TopkOrder::ByIndex ? "by_index" : "by_score");
    // The CPU fused call: the expected dense output and list.
    std::vector<int32_t> cpu_idx(list_elems, 0), cpu_len(static_cast<size_t>(c.T), 0);
    std::vector<int32_t> cpu_list(list_elems, 777), cpu_indptr(static_cast<size_t>(c.T + 1), 777);
    const auto run_cpu = [&] {
      IndexerParams h = c.params(cpu_idx.data(), cpu_len.data(), nullptr);
      h.order = order;
      fuse(h, cpu_list.data(), cpu_indptr.data(), valid.data(), cbt.data());
      indexer_topk(h);
    };
    DeviceOut out(c, false);
    IndexerParams p = d.params(out.indices.as<int32_t>(), out.lengths.as<int32_t>(), nullptr);
    p.order = order;
    fuse(p, d_list.as<int32_t>(), d_indptr.as<int32_t>(), d_valid.as<uint8_t>(),
         d_cbt.as<int32_t>());
    cudaStream_t stream = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    p.stream = stream;
    const size_t bytes = indexer_workspace_size(p);
    DeviceBuffer ws = workspace_for(p, 0xFF);
    const auto check = [&](const std::string& what) {
      SCOPED_TRACE(what);
      run_cpu();
      const IndexerOut dense = out.download();
      EXPECT_EQ(dense.indices, cpu_idx);
      EXPECT_EQ(dense.lengths, cpu_len);
      std::vector<int32_t> list(list_elems + kGap), indptr(static_cast<size_t>(c.T + 1));
      d_list.download(list.data(), list.size() * 4);
      d_indptr.download(indptr.data(), indptr.size() * 4);
      EXPECT_EQ(indptr, cpu_indptr);
      EXPECT_EQ(indptr[5] - indptr[4], 0) << "the padding row has no keys";
      const int32_t used = cpu_indptr[static_cast<size_t>(c.T)];
      for (int32_t i = 0; i < used; ++i) EXPECT_EQ(list[i], cpu_list[i]) << "entry " << i;
      for (size_t i = static_cast<size_t>(used); i < list.size(); ++i)
        EXPECT_EQ(static_cast<uint32_t>(list[i]), kPoisonWord) << "slack entry " << i;
    };
    const auto poison_all = [&] {
      out.poison();
      d_list.fill(kPoisonByte);
      d_indptr.fill(kPoisonByte);
      cuda_ok(cudaDeviceSynchronize(), "poison");  // memsets on the legacy stream
    };
    poison_all();
    indexer_topk(p, ws.as<void>(), bytes);
    cuda_ok(cudaStreamSynchronize(stream), "eager");
    check("eager");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    indexer_topk(p, ws.as<void>(), bytes);
    cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    const std::vector<std::vector<int32_t>> steps = {{Wt * ibs, 1, 100, 0, 50, Wt * ibs + 9},
                                                     {-2, k, k - 1, 3, Wt * ibs, 64}};
    for (size_t step = 0; step < steps.size(); ++step) {
      c.n = steps[step];
      d.set_lengths(c.n);
      poison_all();
      cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
      cuda_ok(cudaStreamSynchronize(stream), "replay");
      check("replay step " + std::to_string(step));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    for (int64_t t = 0; t < c.T; ++t) c.n[t] = static_cast<int32_t>(rng.randint(k, Wt * ibs));
    c.n[3] = 7;
    d.set_lengths(c.n);
  }
}

// ---- host errors (CONTRACT 11.4)
// -----------------------------------------------------------------

// Workspace below the size query names workspace_bytes, a null one names workspace; cuda-sm90 on a
// cache it cannot take names path. The size depends only on host shapes.
TEST(GpuIndexerGeneric, WorkspaceTooSmallAndSm90PathNameTheArgument) {
  Rng rng(11);
  IndexerCase c = make_indexer_case(rng, 2, 4, 16, 2, 4, 8, 8);
  fill_exact(rng, c);
  for (int64_t t = 0; t < c.T; ++t) c.row_req[t] = static_cast<int32_t>(t), c.n[t] = 60;
  DeviceIndexerCase d(c);
  DeviceOut out(c, false);
  IndexerParams p = d.params(out.indices.as<int32_t>(), nullptr, nullptr);
  const size_t need = indexer_workspace_size(p);
  ASSERT_GT(need, 0u);
  DeviceBuffer ws(need);
  const auto expect_error = [&](const IndexerParams& q, void* w, size_t bytes,
                                const std::string& arg) {
    try {
      indexer_topk(q, w, bytes);
      ADD_FAILURE() << "accepted; expected an error naming " << arg;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
    }
  };
  expect_error(p, ws.as<void>(), need - 1, "workspace_bytes");
  expect_error(p, nullptr, 0, "workspace_bytes");
  expect_error(p, nullptr, need, "workspace");
  expect_error(p, ws.as<uint8_t>(4), need, "workspace");  // misaligned
  {  // cuda-sm90 with a block stride that is not a multiple of 16 (ibs = 61: 8,100 bytes): refused
    // on every device, naming path (the Hopper path copies 16-byte runs).
    IndexerCase odd = make_indexer_case(rng, 1, 4, 61, 1, 2, 8, 8);
    fill_exact(rng, odd);
    odd.n[0] = 100;
    DeviceIndexerCase dodd(odd);
    DeviceOut oodd(odd, false);
    IndexerParams sm90 = dodd.params(oodd.indices.as<int32_t>(), nullptr, nullptr, Path::CudaSm90);
    expect_error(sm90, ws.as<void>(), need, "path");
  }
  IndexerParams host = c.params(nullptr, nullptr, nullptr);
  std::vector<int32_t> idx(static_cast<size_t>(c.T * c.W));
  host.indices = idx.data();
  host.path = Path::CudaGeneric;  // host pointers on a CUDA path
  expect_error(host, ws.as<void>(), need, "path");
  // The size query is a function of host shapes: lengths on the device never change it.
  d.n.fill(0);
  EXPECT_EQ(indexer_workspace_size(p), need);
  IndexerParams auto_path = p;
  auto_path.path = Path::Auto;  // device pointers: the generic path
  EXPECT_EQ(indexer_workspace_size(auto_path), need);
  EXPECT_NO_THROW(indexer_topk(auto_path, ws.as<void>(), need));
  cuda_ok(cudaDeviceSynchronize(), "auto");
}

// ---- the Hopper FP8 path (Path::CudaSm90, CONTRACT 11.7: eps = 2^-9)
// ----------------------------- Exact-arithmetic data must equal the CPU bit for bit on this path
// too (every dot, product and head sum is exact in any accumulator of >= 11 bits); random data is
// held to the near-tie rule against the float64 reference. Pages: block strides multiple of 16 (ibs
// in {8, 16, 64, 256}).

#define SPARSEMLA_REQUIRE_SM90()                                                        \
  do {                                                                                  \
    if (!gpu_support::device_is_sm90()) GTEST_SKIP() << "the Hopper path needs cc 9.0"; \
  } while (0)

// Random data: both orders with scores, every row within 11.7's bounds; returns the worst
// |score - ref| / A seen.
double expect_sm90_within_bounds(const IndexerCase& c, const DeviceIndexerCase& d) {
  double worst = 0.0;
  for (const TopkOrder order : {TopkOrder::ByScore, TopkOrder::ByIndex}) {
    const IndexerOut o = run_gpu(d, order, true, 0xFF, Path::CudaSm90);
    for (int64_t t = 0; t < c.T; ++t) {
      expect_within_bounds(c, o, t, kFp8Eps);
      worst = std::max(worst, worst_relative_error(c, o, t));
    }
  }
  return worst;
}

TEST(GpuIndexerSm90, ExactDataBitIdenticalToCpuAcrossLengthsLayoutsHeadsAndK) {
  SPARSEMLA_REQUIRE_SM90();
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  struct Shape {
    int32_t H, ibs, k;
    IndexerLayout layout;
  };
  for (const Shape s :
       {Shape{4, 64, 7, IndexerLayout::Normal}, Shape{1, 16, 1, IndexerLayout::Shuffle},
        Shape{16, 8, 7, IndexerLayout::Normal}, Shape{64, 64, 512, IndexerLayout::Normal},
        Shape{64, 16, 100, IndexerLayout::Shuffle}, Shape{100, 64, 64, IndexerLayout::Normal},
        Shape{128, 256, 1024, IndexerLayout::Shuffle}, Shape{8, 64, 2048, IndexerLayout::Normal}}) {
    const std::string what = "H=" + std::to_string(s.H) + " ibs=" + std::to_string(s.ibs) +
                             " k=" + std::to_string(s.k) +
                             (s.layout == IndexerLayout::Shuffle ? " shuffle" : " normal");
    SCOPED_TRACE(what);
    const int32_t k = s.k, ibs = s.ibs;
    const std::vector<int32_t> lengths = {0,     1,       k - 1, k,       k + 1,
                                          2 * k, ibs - 1, ibs,   ibs + 1, 3 * ibs + 5};
    const int64_t T = static_cast<int64_t>(lengths.size());
    const int32_t Wt = (std::max(2 * k, 3 * ibs + 5) + ibs - 1) / ibs;
    IndexerCase c = make_indexer_case(rng, T, s.H, ibs, T, Wt, k, k + 3, s.layout);
    fill_exact(rng, c);
    for (int64_t t = 0; t < T; ++t)
      c.row_req[t] = static_cast<int32_t>(t), c.n[t] = std::max(0, lengths[t]);
    const DeviceIndexerCase d(c);
    expect_gpu_equals_cpu(c, d, what, Path::CudaSm90);
  }
}

// Ties at 65,536 and 262,144 candidates (exact data), the long rows of 11.8.2, NaN keys, +inf
// scales, NaN weights, invalid pages and padding rows: the CPU's outputs bit for bit.
TEST(GpuIndexerSm90, TiesLongRowsNanKeysAndInvalidPagesBitIdenticalToCpu) {
  SPARSEMLA_REQUIRE_SM90();
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  {  // ties: all-equal, all-zero and banded rows
    const int32_t ibs = 64, Wt = 4096, k = 512;
    for (const int32_t n : {65536, 262144}) {
      IndexerCase c = make_indexer_case(rng, 3, 1, ibs, 1, Wt, k, k);
      uint8_t bytes[128];
      for (auto& b : bytes) b = small_e4m3(1);
      for (int64_t j = 0; j < n; ++j) c.set_entry(0, j, bytes, j % 97 == 5 ? 2.0f : 1.0f);
      for (int d = 0; d < 128; ++d) {
        c.q[0 * 128 + d] = small_e4m3(1);
        c.q[1 * 128 + d] = small_e4m3(-1);
        c.q[2 * 128 + d] = small_e4m3(d % 2 ? 1 : 2);
      }
      for (int64_t t = 0; t < c.T; ++t) c.w[t] = 1.0f / 64, c.n[t] = n;
      const DeviceIndexerCase d(c);
      expect_gpu_equals_cpu(c, d, "ties n=" + std::to_string(n), Path::CudaSm90);
    }
  }
  {  // 262,144-candidate rows, B = 4, requests sharing pages, k = 2048
    const int32_t ibs = 64, Wt = 4096, k = 2048;
    IndexerCase c = make_indexer_case(rng, 4, 64, ibs, 1, Wt, k, k + 5);
    fill_exact(rng, c);
    share_pages_across_requests(rng, c, 4);
    for (int64_t t = 0; t < c.T; ++t) {
      c.row_req[t] = static_cast<int32_t>(t);
      c.n[t] = t == 0 ? Wt * ibs : static_cast<int32_t>(rng.randint(Wt * ibs / 4, Wt * ibs));
    }
    const DeviceIndexerCase d(c);
    for (const TopkOrder order : {TopkOrder::ByScore, TopkOrder::ByIndex}) {
      expect_identical(c, run_indexer_cpu(c, order, true),
                       run_gpu(d, order, true, 0xFF, Path::CudaSm90), "long rows");
    }
  }
  {  // NaN key bytes, +inf and -1 scales, a NaN weight
    const int32_t ibs = 16, Wt = 8, k = 20;
    IndexerCase c = make_indexer_case(rng, 4, 4, ibs, 1, Wt, k, k);
    fill_exact(rng, c);
    for (int64_t t = 0; t < c.T; ++t) c.n[t] = Wt * ibs;
    uint8_t bytes[128];
    for (int j = 0; j < 30; ++j) {
      for (auto& b : bytes) b = small_e4m3(static_cast<int>(rng.randint(-2, 2)));
      bytes[rng.randint(0, 127)] = rng.randint(0, 1) ? 0x7F : 0xFF;
      c.set_entry(0, 3 * j, bytes, 1.0f);
      for (auto& b : bytes) b = small_e4m3(static_cast<int>(rng.randint(-2, 2)));
      c.set_entry(0, 3 * j + 1, bytes, std::numeric_limits<float>::infinity());
      for (auto& b : bytes) b = small_e4m3(static_cast<int>(rng.randint(-2, 0)));
      c.set_entry(0, 3 * j + 2, bytes, -1.0f);
    }
    c.w[2 * c.H + 1] = std::numeric_limits<float>::quiet_NaN();
    const DeviceIndexerCase d(c);
    expect_gpu_equals_cpu(c, d, "nan", Path::CudaSm90);
  }
  {  // invalid page ids, a duplicate page, holes, padding rows, n out of range
    const int32_t ibs = 8, Wt = 6, k = 12;
    IndexerCase c = make_indexer_case(rng, 7, 4, ibs, 3, Wt, k, k + 2);
    fill_exact(rng, c);
    const int32_t bad[] = {INT_MIN, -1, static_cast<int32_t>(c.num_blocks),
                           static_cast<int32_t>(c.num_blocks + 1024), INT_MAX};
    for (int32_t b = 0; b < 5; ++b) c.table[0 * c.table_stride + b] = bad[b];
    c.table[1 * c.table_stride + 2] = c.table[1 * c.table_stride + 0];
    c.table[2 * c.table_stride + 3] = -1;
    const int32_t reqs[7] = {0, 1, -1, 3, 2, 2, INT_MAX};
    const int32_t ns[7] = {Wt * ibs, Wt * ibs, 40, 40, -5, Wt * ibs + 1000, 10};
    for (int64_t t = 0; t < c.T; ++t) c.row_req[t] = reqs[t], c.n[t] = ns[t];
    const DeviceIndexerCase d(c);
    expect_gpu_equals_cpu(c, d, "invalid", Path::CudaSm90);
  }
}

TEST(GpuIndexerSm90, ManyCutsPerRowK1ToK2048AllEqualRowsAndKAboveNBothMerges) {
  SPARSEMLA_REQUIRE_SM90();
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  expect_many_cuts_rows_equal_cpu(rng, Path::CudaSm90);
}

// Random bytes at model magnitudes (fill_random), H = 64 (DSV4) and 1, 16, 100, 128, MTP rows of
// one request adjacent: every row within 11.7's near-tie rule at eps = 2^-9; the worst relative
// error is printed.
TEST(GpuIndexerSm90, RandomModelMagnitudesWithinTheNearTieRuleH1H16H64H100H128Mtp) {
  SPARSEMLA_REQUIRE_SM90();
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  double worst = 0.0;
  for (const int32_t H : {64, 1, 16, 100, 128}) {
    SCOPED_TRACE("H=" + std::to_string(H));
    const int32_t k = H == 64 ? 512 : 64, ibs = 64, Wt = 48;
    IndexerCase c = make_indexer_case(rng, 8, H, ibs, 5, Wt, k, k + 1);
    fill_random(rng, c);
    const int32_t reqs[8] = {0, 0, 1, 2, 2, 3, 4, 4};
    for (int64_t t = 0; t < c.T; ++t) {
      c.row_req[t] = reqs[t];
      c.n[t] = static_cast<int32_t>(rng.randint(k / 2, Wt * ibs));
    }
    c.n[1] = c.n[0] + 1;
    const DeviceIndexerCase d(c);
    worst = std::max(worst, expect_sm90_within_bounds(c, d));
  }
  std::printf("[ indexer sm90 ] worst |score - ref| / A = %.3g (bound 2^-9 = %.3g)\n", worst,
              kFp8Eps);
}

TEST(GpuIndexerSm90, PlantedNeedlesAreTheSelectionH64K512) {
  SPARSEMLA_REQUIRE_SM90();
  expect_needles_are_the_selection(Path::CudaSm90);
}

// 20 runs bit-identical (workspace poisoned differently); a row's output is the same alone
// (T = 1: ~2 CU splits), in its batch and among 300 rows (one split each).
TEST(GpuIndexerSm90, DeterministicOver20RunsAndAcrossBatchAndSplitCountH64) {
  SPARSEMLA_REQUIRE_SM90();
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 160, k = 512, H = 64;
  IndexerCase c = make_indexer_case(rng, 5, H, ibs, 5, Wt, k, k);
  fill_random(rng, c);
  for (int64_t t = 0; t < c.T; ++t)
    c.row_req[t] = static_cast<int32_t>(t), c.n[t] = Wt * ibs - static_cast<int32_t>(t);
  const DeviceIndexerCase d(c);
  const IndexerOut first = run_gpu(d, TopkOrder::ByScore, true, 0xFF, Path::CudaSm90);
  for (int64_t t = 0; t < c.T; ++t) expect_within_bounds(c, first, t, kFp8Eps);
  for (int i = 0; i < 20; ++i) {
    const IndexerOut again =
        run_gpu(d, TopkOrder::ByScore, true, i % 2 ? 0x00 : 0xA7, Path::CudaSm90);
    ASSERT_EQ(again.indices, first.indices) << "run " << i;
    ASSERT_EQ(0, std::memcmp(again.scores.data(), first.scores.data(), 4 * first.scores.size()))
        << "run " << i;
  }
  const IndexerCase alone = single_row_case(c, 3);
  const IndexerOut single =
      run_gpu(DeviceIndexerCase(alone), TopkOrder::ByScore, true, 0xFF, Path::CudaSm90);
  EXPECT_TRUE(
      std::equal(single.indices.begin(), single.indices.end(), first.indices.begin() + 3 * c.W));
  EXPECT_EQ(0, std::memcmp(single.scores.data(), first.scores.data() + 3 * c.W, 4 * c.W));
  const IndexerCase big = cycled_rows_case(c, 300);
  const IndexerOut batch =
      run_gpu(DeviceIndexerCase(big), TopkOrder::ByScore, true, 0xFF, Path::CudaSm90);
  for (int64_t t = 0; t < big.T; ++t) {
    const int64_t src = t % c.T;
    ASSERT_TRUE(std::equal(first.indices.begin() + src * c.W,
                           first.indices.begin() + (src + 1) * c.W,
                           batch.indices.begin() + t * c.W))
        << "row " << t;
  }
}

// 11.5: captured at (T = 4, Wt = 4096 pages of 64), replayed with lengths rewritten on the device
// (long, short, padding-like 0): every replay equals an eager call on the same lengths.
TEST(GpuIndexerSm90, GraphCaptureReplayWithChangedLengthsEqualsEagerWt4096) {
  SPARSEMLA_REQUIRE_SM90();
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t ibs = 64, Wt = 4096, k = 512;
  IndexerCase c = make_indexer_case(rng, 4, 64, ibs, 1, Wt, k, k);
  fill_random(rng, c);
  share_pages_across_requests(rng, c, 4);
  for (int64_t t = 0; t < c.T; ++t) c.row_req[t] = static_cast<int32_t>(t), c.n[t] = Wt * ibs;
  DeviceIndexerCase d(c);
  DeviceOut out(c, true);
  IndexerParams p = d.params(out.indices.as<int32_t>(), out.lengths.as<int32_t>(),
                             out.scores.as<float>(), Path::CudaSm90);
  p.order = TopkOrder::ByScore;
  const size_t need = indexer_workspace_size(p);
  DeviceBuffer ws(std::max<size_t>(8, need));
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  p.stream = stream;
  cudaGraph_t graph;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  indexer_topk(p, ws.as<void>(), need);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const std::vector<std::vector<int32_t>> steps = {
      {Wt * ibs, 100000, 513, 7}, {1000, 0, Wt * ibs, 262143}, {0, 0, 0, 5}, {Wt * ibs, 1, 2, 3}};
  for (const auto& lengths : steps) {
    d.set_lengths(lengths);
    out.poison();
    ws.fill(0xA5);
    cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
    cuda_ok(cudaStreamSynchronize(stream), "replay");
    const IndexerOut replayed = out.download();
    IndexerCase ce = c;
    ce.n = lengths;
    const IndexerOut eager = run_gpu(d, TopkOrder::ByScore, true, 0x3C, Path::CudaSm90);
    EXPECT_EQ(replayed.indices, eager.indices);
    EXPECT_EQ(replayed.lengths, eager.lengths);
    EXPECT_EQ(0, std::memcmp(replayed.scores.data(), eager.scores.data(), 4 * eager.scores.size()));
    for (int64_t t = 0; t < c.T; ++t) {  // the float64 reference on the shorter rows only
      if (lengths[t] <= 100000) expect_within_bounds(ce, replayed, t, kFp8Eps);
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace sparsemla::test::gpu_indexer
