#include "bench_problem.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace sparsemla::tools {

namespace {

constexpr int32_t kWindow = 128;
constexpr int32_t kWindowPage = 64;
constexpr float kWindowRms = 0.5f;  // as `sparsemla run`'s window latents
constexpr float kExtraRms = 1.0f;   // RMS-normalised compressed entries

// Random model-like fp8_ds_mla rows: latents ~ N(0, rms^2) quantised by the library's quantiser
// (so tiles look like real ones: amax near the top of the e4m3 range, scale codes ~118..124), and
// N(0, rms^2) bf16 RoPE. Why not random bytes: uniform e4m3 bytes make |V| span 2^-9..448 times the
// scale, which is unlike any writer's output and breaks the premise of the SPEC 9 tolerance
// (bf16 probabilities cost ~2^-9 * |V| per output element).
HostCache random_cache(int64_t num_blocks, int32_t block_size, float rms, std::mt19937_64& rng) {
  HostCache c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  const int64_t raw = int64_t{block_size} * Fp8DsMla::kBytesPerToken;
  c.block_stride = (raw + 575) / 576 * 576;
  c.bytes.resize(static_cast<size_t>(num_blocks * c.block_stride));
  std::normal_distribution<float> normal(0.0f, rms);
  float tile[Fp8DsMla::kTileDims];
  for (int64_t b = 0; b < num_blocks; ++b) {
    uint8_t* page = c.bytes.data() + b * c.block_stride;
    for (int32_t p = 0; p < block_size; ++p) {
      uint8_t* row = page + p * Fp8DsMla::kDataBytes;
      uint8_t* sc = page + int64_t{block_size} * Fp8DsMla::kDataBytes + p * Fp8DsMla::kScaleBytes;
      for (int i = 0; i < Fp8DsMla::kNumTiles; ++i) {
        for (auto& v : tile) v = round_to_bf16(normal(rng));
        const int e = quantize_block(tile, Fp8DsMla::kTileDims, row + i * Fp8DsMla::kTileDims);
        sc[i] = quant_code(e, kCodeMaxSanitising);
      }
      sc[Fp8DsMla::kPadByte] = 0;
      for (int d = 0; d < Fp8DsMla::kRopeDims; ++d) {
        const bf16_bits v = float_to_bf16(normal(rng));
        row[Fp8DsMla::kRopeOffset + 2 * d] = static_cast<uint8_t>(v & 0xFF);
        row[Fp8DsMla::kRopeOffset + 2 * d + 1] = static_cast<uint8_t>(v >> 8);
      }
    }
  }
  return c;
}

std::vector<int32_t> permutation(int64_t n, std::mt19937_64& rng) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// Main lists: each request owns 3 window pages; row i of request b covers 128 consecutive
// positions.
void build_window(Problem& pb, std::mt19937_64& rng) {
  const int64_t B = pb.config.batch, mtp = pb.config.mtp;
  const int64_t pages_per_req = (kWindow + mtp + kWindowPage - 1) / kWindowPage + 1;
  pb.window_cache = random_cache(B * pages_per_req, kWindowPage, kWindowRms, rng);
  const std::vector<int32_t> phys = permutation(B * pages_per_req, rng);
  pb.main_list.width = kWindow;
  pb.main_list.indices.assign(pb.tokens * kWindow, -1);
  pb.main_list.indptr.assign(pb.tokens + 1, 0);
  std::uniform_int_distribution<int> offset(0, kWindowPage - 1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = offset(rng);
    for (int64_t i = 0; i < mtp; ++i) {
      const int64_t t = b * mtp + i;
      for (int32_t j = 0; j < kWindow; ++j) {
        const int64_t q = start + i + j;
        pb.main_list.indices[t * kWindow + j] =
            phys[b * pages_per_req + q / kWindowPage] * kWindowPage +
            static_cast<int32_t>(q % kWindowPage);
      }
      pb.main_list.indptr[t + 1] = static_cast<int32_t>((t + 1) * kWindow);
    }
  }
}

// Extra lists for ratio-4 shapes: extra_min distinct random slots of a 64-entry-page cache holding
// 4x as many entries per request as the top-k.
void build_topk_extra(Problem& pb, const BenchShape& s, std::mt19937_64& rng) {
  const int64_t B = pb.config.batch, W = s.extra_min, entries = 4 * W, cbs = 64;
  const int64_t pages_per_req = entries / cbs;
  pb.compressed_cache = random_cache(B * pages_per_req, static_cast<int32_t>(cbs), kExtraRms, rng);
  const std::vector<int32_t> phys = permutation(B * pages_per_req, rng);
  pb.extra_list.width = W;
  pb.extra_list.indices.assign(pb.tokens * W, -1);
  pb.extra_list.indptr.assign(pb.tokens + 1, 0);
  for (int64_t t = 0; t < pb.tokens; ++t) {
    const int64_t b = t / pb.config.mtp;
    std::vector<int32_t> local = permutation(entries, rng);
    for (int64_t j = 0; j < W; ++j)
      pb.extra_list.indices[t * W + j] =
          phys[b * pages_per_req + local[j] / cbs] * static_cast<int32_t>(cbs) + local[j] % cbs;
    pb.extra_list.indptr[t + 1] = static_cast<int32_t>((t + 1) * W);
  }
}

// Extra lists for ratio-128 shapes: every entry of the request, on 2-entry pages, lengths varying.
void build_all_extra(Problem& pb, const BenchShape& s, std::mt19937_64& rng) {
  const int64_t B = pb.config.batch, W = s.extra_max, cbs = 2;
  std::uniform_int_distribution<int64_t> len_dist(s.extra_min, s.extra_max);
  std::vector<int64_t> len(B);
  for (auto& l : len) l = len_dist(rng);
  if (s.even_lengths) {  // the same total work, every request at the mean length
    const int64_t mean = (std::accumulate(len.begin(), len.end(), int64_t{0}) + B / 2) / B;
    std::fill(len.begin(), len.end(), mean);
  }
  int64_t total_pages = 0;
  for (const int64_t l : len) total_pages += (l + cbs - 1) / cbs;
  pb.compressed_cache = random_cache(total_pages, static_cast<int32_t>(cbs), kExtraRms, rng);
  const std::vector<int32_t> phys = permutation(total_pages, rng);
  pb.extra_list.width = W;
  pb.extra_list.indices.assign(pb.tokens * W, -1);
  pb.extra_list.indptr.assign(pb.tokens + 1, 0);
  int64_t page0 = 0, used = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < pb.config.mtp; ++i) {
      const int64_t t = b * pb.config.mtp + i;
      for (int64_t j = 0; j < len[b]; ++j)
        pb.extra_list.indices[used + j] =
            phys[page0 + j / cbs] * static_cast<int32_t>(cbs) + j % cbs;
      used += len[b];
      pb.extra_list.indptr[t + 1] = static_cast<int32_t>(used);
    }
    page0 += (len[b] + cbs - 1) / cbs;
  }
}

}  // namespace

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

BenchShape bench_shape(const std::string& name) {
  std::string names;
  for (const auto& s : standard_bench_shapes()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  throw_arg_error("bench", "--shapes", "one of " + names, name);
}

Problem build_bench_problem(const BenchShape& shape, int64_t batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem pb;
  pb.config.batch = batch;
  pb.config.mtp = shape.mtp;
  pb.kind = {shape.name, shape.heads, shape.ratio128 ? 128 : 4,
             static_cast<int32_t>(shape.extra_min)};
  pb.heads = shape.heads;
  pb.tokens = batch * shape.mtp;
  build_window(pb, rng);
  if (shape.ratio128)
    build_all_extra(pb, shape, rng);
  else
    build_topk_extra(pb, shape, rng);
  pb.q.resize(pb.tokens * pb.heads * 512);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : pb.q) v = float_to_bf16(normal(rng));
  pb.sink.resize(pb.heads);
  for (auto& v : pb.sink) v = normal(rng);
  pb.rope_rows = 1 << 16;
  pb.rope = build_rope_table(rope_config_compressed_layer(), pb.rope_rows);
  std::uniform_int_distribution<int64_t> pos(0, pb.rope_rows - 1);
  for (int64_t t = 0; t < pb.tokens; ++t) pb.positions.push_back(pos(rng));
  pb.attended_keys = static_cast<int64_t>(pb.main_list.indptr.back()) + pb.extra_list.indptr.back();
  return pb;
}

}  // namespace sparsemla::tools
