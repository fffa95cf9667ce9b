#include "bench_problem.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>

#include "fast_rng.h"

namespace sparsemla::tools {

namespace {

constexpr int32_t kWindow = 128;
constexpr int32_t kWindowPage = 64;
constexpr int32_t kC4Page = 64;
constexpr int32_t kC128Page = 2;
// The kit's cache sizes (side_by_side.py): 384 window pages (3 per request at B=128), 16,384 C4
// pages (128 per request at B=128), 32,768 C128 pages. A batch that needs more pages gets more.
constexpr int64_t kRealWindowPages = 384;
constexpr int64_t kRealC4Pages = 16384;
constexpr int64_t kRealC128Pages = 32768;
constexpr int64_t kC4RowsPerRequest = 8192;  // a request's rows in the C4 cache: 128 pages of 64
constexpr float kTileGainSigma = 0.7f;       // per-(token, tile) gain exp(0.7 N(0,1)), CONTRACT 9.9
// Rows no list reaches are copies of this many model rows: they are never read, and quantising
// all 1M rows of the C4 cache (5 us each) would cost ~5 s per cell; copying costs ~0.2 s.
constexpr int64_t kPoolRows = 1024;

constexpr int kRow = Fp8DsMla::kBytesPerToken;  // 584: 576 data + 8 scale bytes (pool layout)

uint64_t mix(uint64_t seed, uint64_t tag, uint64_t i) {
  return seed ^ (tag * 0xD1B54A32D192ED03ull) ^ (i * 0x9E3779B97F4A7C15ull);
}

// Two N(0,1) floats from one 64-bit draw (Box-Muller in fp32, tails to 5.9 sigma): half the cost
// of FastRng::normal (6 vs 12 us per row of 512), which dominates quantising ~700k rows at B=128.
void normal_pair(FastRng& rng, float& a, float& b) {
  const uint64_t x = rng.next();
  const float u = (static_cast<float>(x >> 40) + 0.5f) * 0x1.0p-24f;  // (0, 1)
  const float v = static_cast<float>((x >> 16) & 0xFFFFFF) * 0x1.0p-24f;
  const float r = std::sqrt(-2.0f * std::log(u)), angle = 6.28318531f * v;
  a = r * std::cos(angle);
  b = r * std::sin(angle);
}

// One model-like token (CONTRACT 9.9): per 64-dim tile (7 NoPE tiles, then the RoPE tile) a gain
// exp(0.7 N(0,1)) times N(0,1) values, rounded to bf16 as a model's latents are; NoPE tiles through
// the library's quantiser (sanitising code limit 254), the RoPE tile stored as bf16. The pad byte
// is the caller's.
void model_row(uint8_t* data, uint8_t* scales, FastRng& rng) {
  float tile[Fp8DsMla::kTileDims], g[2];
  for (int i = 0; i <= Fp8DsMla::kNumTiles; ++i) {
    if (i % 2 == 0) normal_pair(rng, g[0], g[1]);
    const float gain = std::exp(kTileGainSigma * g[i % 2]);
    for (int d = 0; d < Fp8DsMla::kTileDims; d += 2) normal_pair(rng, tile[d], tile[d + 1]);
    for (auto& v : tile) v = round_to_bf16(v * gain);
    if (i < Fp8DsMla::kNumTiles) {
      const int e = quantize_block(tile, Fp8DsMla::kTileDims, data + i * Fp8DsMla::kTileDims);
      scales[i] = quant_code(e, kCodeMaxSanitising);
      continue;
    }
    for (int d = 0; d < Fp8DsMla::kRopeDims; ++d) {
      const bf16_bits v = float_to_bf16(tile[d]);
      data[Fp8DsMla::kRopeOffset + 2 * d] = static_cast<uint8_t>(v & 0xFF);
      data[Fp8DsMla::kRopeOffset + 2 * d + 1] = static_cast<uint8_t>(v >> 8);
    }
  }
}

// Rows of a cache (slot ids) that a list reaches.
void mark_reached(const HostList& l, std::vector<uint8_t>& reached) {
  for (int32_t i = 0; i < l.indptr.back(); ++i)
    if (l.indices[i] >= 0 && l.indices[i] < static_cast<int64_t>(reached.size()))
      reached[l.indices[i]] = 1;
}

// A cache of num_blocks pages of bs rows, the page stride padded to a multiple of 576 bytes as
// engines (and the kit) pad it. Rows marked in `reached` get fresh model rows; the others copies of
// the pool. real: pad bytes and page padding random (real caches hold anything there; FlashMLA's
// quantiser leaves them uninitialised), else 0 (as this library's writers leave them). One random
// stream per page: the bytes do not depend on the thread count.
HostCache model_cache(int64_t num_blocks, int32_t bs, const std::vector<uint8_t>& reached,
                      bool real, uint64_t seed) {
  HostCache c;
  c.num_blocks = num_blocks;
  c.block_size = bs;
  const int64_t raw = int64_t{bs} * kRow;
  c.block_stride = (raw + Fp8DsMla::kEnginePageAlign - 1) / Fp8DsMla::kEnginePageAlign *
                   Fp8DsMla::kEnginePageAlign;
  c.bytes.resize(static_cast<size_t>(num_blocks * c.block_stride));
  const int64_t rows = num_blocks * bs;
  const int64_t pool_rows = std::min(kPoolRows, rows);
  std::vector<uint8_t> pool(static_cast<size_t>(pool_rows * kRow));
  FastRng pool_rng(mix(seed, 1, 0));
  for (int64_t i = 0; i < pool_rows; ++i)
    model_row(&pool[i * kRow], &pool[i * kRow + Fp8DsMla::kDataBytes], pool_rng);
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 16)
#endif
  for (int64_t b = 0; b < num_blocks; ++b) {
    FastRng rng(mix(seed, 2, static_cast<uint64_t>(b)));
    uint8_t* page = c.bytes.data() + b * c.block_stride;
    for (int32_t p = 0; p < bs; ++p) {
      uint8_t* data = page + int64_t{p} * Fp8DsMla::kDataBytes;
      uint8_t* sc = page + int64_t{bs} * Fp8DsMla::kDataBytes + int64_t{p} * Fp8DsMla::kScaleBytes;
      if (reached[b * bs + p]) {
        model_row(data, sc, rng);
      } else {
        const uint8_t* src = &pool[rng.below(pool_rows) * kRow];
        std::memcpy(data, src, Fp8DsMla::kDataBytes);
        std::memcpy(sc, src + Fp8DsMla::kDataBytes, Fp8DsMla::kNumTiles);
      }
      sc[Fp8DsMla::kPadByte] = real ? static_cast<uint8_t>(rng.next() >> 56) : 0;
    }
    if (real)
      for (int64_t i = raw; i < c.block_stride; ++i)
        page[i] = static_cast<uint8_t>(rng.next() >> 56);
  }
  return c;
}

// The first k of a random permutation of 0..n-1 (partial Fisher-Yates): k distinct values in
// random order.
std::vector<int32_t> sample_distinct(int64_t n, int64_t k, FastRng& rng) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  for (int64_t i = 0; i < k; ++i) std::swap(v[i], v[i + rng.below(n - i)]);
  v.resize(static_cast<size_t>(k));
  return v;
}

void start_list(HostList& l, int64_t rows, int64_t width) {
  l.width = width;
  l.indices.assign(static_cast<size_t>(rows * width), -1);
  l.indptr.assign(static_cast<size_t>(rows + 1), 0);
}

// Main lists: query row i of request b covers 128 consecutive positions starting at start_b + i,
// on the request's window pages. real (the kit): 3 random pages of a 384-page cache, start in
// [0, 192 - 128 - mtp]; writer: 4 pages per request in a compact cache, start in [0, 63].
// Returns the window cache's page count.
int64_t build_window(Problem& pb, bool real, FastRng& rng) {
  const int64_t B = pb.config.batch, mtp = pb.config.mtp;
  const int64_t span = kWindow + mtp - 1;  // positions a request's rows read
  const int64_t per_req = real ? std::max<int64_t>(3, (span + kWindowPage - 1) / kWindowPage)
                               : (kWindow + mtp + kWindowPage - 1) / kWindowPage + 1;
  const int64_t pages = real ? std::max(kRealWindowPages, B * per_req) : B * per_req;
  const std::vector<int32_t> phys = sample_distinct(pages, B * per_req, rng);
  const int64_t max_start = real ? per_req * kWindowPage - kWindow - mtp : kWindowPage - 1;
  start_list(pb.main_list, pb.tokens, kWindow);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = rng.below(max_start + 1);
    for (int64_t i = 0; i < mtp; ++i) {
      const int64_t t = b * mtp + i;
      for (int32_t j = 0; j < kWindow; ++j) {
        const int64_t q = start + i + j;
        pb.main_list.indices[t * kWindow + j] = phys[b * per_req + q / kWindowPage] * kWindowPage +
                                                static_cast<int32_t>(q % kWindowPage);
      }
      pb.main_list.indptr[t + 1] = static_cast<int32_t>((t + 1) * kWindow);
    }
  }
  return pages;
}

// Ratio-4 extra lists: per query row, top-k distinct random rows in random order of the request's
// own rows. real (the kit): 8192 rows per request on 128 random pages of a 16,384-page cache;
// writer: 4x top-k rows per request in a compact cache. Returns the cache's page count.
int64_t build_topk_extra(Problem& pb, const BenchShape& s, bool real, FastRng& rng) {
  const int64_t B = pb.config.batch, K = s.extra_min;
  const int64_t rows = real ? kC4RowsPerRequest : 4 * K, per_req = rows / kC4Page;
  const int64_t pages = real ? std::max(kRealC4Pages, B * per_req) : B * per_req;
  const std::vector<int32_t> phys = sample_distinct(pages, B * per_req, rng);
  start_list(pb.extra_list, pb.tokens, K);
  for (int64_t t = 0; t < pb.tokens; ++t) {
    const int64_t b = t / pb.config.mtp;
    const std::vector<int32_t> local = sample_distinct(rows, K, rng);
    for (int64_t j = 0; j < K; ++j)
      pb.extra_list.indices[t * K + j] =
          phys[b * per_req + local[j] / kC4Page] * kC4Page + local[j] % kC4Page;
    pb.extra_list.indptr[t + 1] = static_cast<int32_t>((t + 1) * K);
  }
  return pages;
}

// Ratio-128 extra lists: every row of the request in order, on 2-row pages placed at random (real:
// in a 32,768-page cache, as the kit; writer: a compact cache), lengths varying between extra_min
// and extra_max (or all at their mean). Every query row of a request reads the same rows.
int64_t build_all_extra(Problem& pb, const BenchShape& s, bool real, FastRng& rng) {
  const int64_t B = pb.config.batch, W = s.extra_max;
  std::vector<int64_t> len(static_cast<size_t>(B));
  for (auto& l : len) l = s.extra_min + rng.below(s.extra_max - s.extra_min + 1);
  if (s.even_lengths) {  // the same total work, every request at the mean length
    const int64_t mean = (std::accumulate(len.begin(), len.end(), int64_t{0}) + B / 2) / B;
    std::fill(len.begin(), len.end(), mean);
  }
  int64_t need = 0;
  for (const int64_t l : len) need += (l + kC128Page - 1) / kC128Page;
  const int64_t pages = real ? std::max(kRealC128Pages, need) : need;
  const std::vector<int32_t> phys = sample_distinct(pages, need, rng);
  start_list(pb.extra_list, pb.tokens, W);
  int64_t page0 = 0, used = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < pb.config.mtp; ++i) {
      const int64_t t = b * pb.config.mtp + i;
      for (int64_t j = 0; j < len[b]; ++j)
        pb.extra_list.indices[used + j] = phys[page0 + j / kC128Page] * kC128Page + j % kC128Page;
      used += len[b];
      pb.extra_list.indptr[t + 1] = static_cast<int32_t>(used);
    }
    page0 += (len[b] + kC128Page - 1) / kC128Page;
  }
  return pages;
}

HostCache cache_for(const HostList& l, int64_t pages, int32_t bs, bool real, uint64_t seed) {
  std::vector<uint8_t> reached(static_cast<size_t>(pages * bs), real ? 0 : 1);
  if (real) mark_reached(l, reached);  // writer: every row was written
  return model_cache(pages, bs, reached, real, seed);
}

}  // namespace

BenchData parse_bench_data(const std::string& name) {
  if (name == kBenchDataNames[0]) return BenchData::Real;
  if (name == kBenchDataNames[1]) return BenchData::Writer;
  throw_arg_error("bench", "--data", "real or writer", name);
}

const char* bench_data_name(BenchData d) {
  return kBenchDataNames[d == BenchData::Real ? 0 : 1];
}

std::vector<BenchShape> standard_bench_shapes() {
  return {{"c4-flash", 64, 512, 512, false, 1},
          {"c4-pro", 128, 1024, 1024, false, 1},
          {"c128-h64", 64, 2048, 8192, true, 1},
          {"c128-h128", 128, 2048, 8192, true, 1},
          {"c128-fixed", 64, 2048, 2048, true, 1},
          {"tp-h8", 8, 1024, 1024, false, 1},
          {"tp-h16", 16, 1024, 1024, false, 1},
          {"tp-h32", 32, 1024, 1024, false, 1},
          {"mtp-flash", 64, 512, 512, false, 2},
          // Load balance (issue 6): c128-h64's lengths drawn the same way, then all set to their
          // mean: the same total work with equal lengths.
          {"c128-h64-even", 64, 2048, 8192, true, 1, true}};
}

// "c4-h<H>-<K>": a ratio-4 layer of H heads attending 128 window keys + a top-K list (head-count
// sweeps of the path rule, e.g. c4-h24-1024).
std::optional<BenchShape> parametric_shape(const std::string& name) {
  int heads = 0, topk = 0, used = 0;
  if (std::sscanf(name.c_str(), "c4-h%d-%d%n", &heads, &topk, &used) != 2 ||
      used != static_cast<int>(name.size()) || heads < 1 || heads > 128 || topk < 1) {
    return std::nullopt;
  }
  return BenchShape{name, heads, topk, topk, false, 1};
}

BenchShape bench_shape(const std::string& name) {
  if (auto s = parametric_shape(name)) return *s;
  std::string names = "c4-h<H>-<K>";
  for (const auto& s : standard_bench_shapes()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  throw_arg_error("bench", "--shapes", "one of " + names, name);
}

Problem build_bench_problem(const BenchShape& shape, int64_t batch, uint64_t seed, BenchData data) {
  const bool real = data == BenchData::Real;
  uint64_t cell = static_cast<uint64_t>(batch);  // each (shape, batch) its own bytes and lists
  for (const char ch : shape.name) cell = (cell ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
  seed = mix(seed, 6, cell);
  FastRng rng(mix(seed, 3, 0));
  Problem pb;
  pb.config.layer = shape.name;
  pb.config.batch = batch;
  pb.config.mtp = shape.mtp;
  pb.kind = {shape.name, shape.heads, shape.ratio128 ? 128 : 4,
             static_cast<int32_t>(shape.extra_min)};
  pb.heads = shape.heads;
  pb.tokens = batch * shape.mtp;
  const int64_t window_pages = build_window(pb, real, rng);
  const int64_t extra_pages = shape.ratio128 ? build_all_extra(pb, shape, real, rng)
                                             : build_topk_extra(pb, shape, real, rng);
  pb.window_cache = cache_for(pb.main_list, window_pages, kWindowPage, real, mix(seed, 4, 0));
  pb.compressed_cache = cache_for(pb.extra_list, extra_pages, shape.ratio128 ? kC128Page : kC4Page,
                                  real, mix(seed, 5, 0));
  pb.q.resize(static_cast<size_t>(pb.tokens * pb.heads * 512));
  for (auto& v : pb.q) v = float_to_bf16(rng.normal());
  pb.sink.resize(static_cast<size_t>(pb.heads));
  for (auto& v : pb.sink) v = rng.normal();
  pb.rope_rows = 1 << 16;
  pb.rope = build_rope_table(rope_config_compressed_layer(), pb.rope_rows);
  for (int64_t t = 0; t < pb.tokens; ++t) pb.positions.push_back(rng.below(pb.rope_rows));
  pb.attended_keys = static_cast<int64_t>(pb.main_list.indptr.back()) + pb.extra_list.indptr.back();
  return pb;
}

}  // namespace sparsemla::tools
