// Builds a DSV4 decode problem through the library's own writers and list builders.
#include "problem.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "fast_rng.h"
#include "indexer_problem.h"
#include "progress.h"

namespace sparsemla::tools {

namespace {

constexpr int kTile = Fp8DsMla::kTileDims;  // 64: one scale per tile
constexpr float kTileGainSigma = 0.7f;      // per-(token, tile) gain exp(0.7 N(0,1)), CONTRACT 9.9

void report(const ProblemConfig& cfg, const std::string& msg) {
  if (cfg.progress) cfg.progress(msg);
}

// Physical pages in a random order, as a fragmented engine allocator hands them out.
std::vector<int32_t> shuffled_pages(int64_t n, FastRng& rng) {
  std::vector<int32_t> pages(static_cast<size_t>(n));
  std::iota(pages.begin(), pages.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(pages[i], pages[rng.below(i + 1)]);
  return pages;
}

HostCache make_cache(int64_t num_blocks, int32_t block_size, FastRng& rng) {
  HostCache c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  // Engine padding: page stride rounded up to a multiple of 576 bytes (keeps 16-byte alignment).
  const int64_t raw = int64_t{block_size} * Fp8DsMla::kBytesPerToken;
  c.block_stride = (raw + Fp8DsMla::kEnginePageAlign - 1) / Fp8DsMla::kEnginePageAlign *
                   Fp8DsMla::kEnginePageAlign;
  c.bytes.resize(static_cast<size_t>(num_blocks * c.block_stride));
  for (auto& b : c.bytes) b = static_cast<uint8_t>(rng.next());  // unwritten bytes are garbage
  return c;
}

struct Requests {
  std::vector<int64_t> length;  // context length of each request, query tokens included
};

Requests make_requests(const ProblemConfig& cfg, FastRng& rng) {
  Requests r;
  for (int64_t b = 0; b < cfg.batch; ++b) {
    const int64_t jitter = cfg.context / 8 > 0 ? rng.below(cfg.context / 8 + 1) : 0;
    r.length.push_back(std::max<int64_t>(1, cfg.context - jitter) + cfg.mtp);
  }
  return r;
}

// Window cache: only the pages that hold the last window of each request exist.
void fill_window(Problem& pb, const Requests& req, FastRng& rng) {
  const ProblemConfig& cfg = pb.config;
  const int32_t wbs = cfg.window_page;
  const int64_t first_needed_of = 128 + cfg.mtp;  // positions older than this never read
  int64_t table_width = 0, pages_total = 0;
  std::vector<std::pair<int64_t, int64_t>> page_range(req.length.size());
  for (size_t b = 0; b < req.length.size(); ++b) {
    const int64_t lo = std::max<int64_t>(0, req.length[b] - first_needed_of) / wbs;
    const int64_t hi = (req.length[b] - 1) / wbs;
    page_range[b] = {lo, hi};
    table_width = std::max(table_width, hi + 1);
    pages_total += hi - lo + 1;
  }
  pb.window_cache = make_cache(pages_total, wbs, rng);
  const std::vector<int32_t> phys = shuffled_pages(pages_total, rng);
  std::vector<int32_t> table(req.length.size() * table_width, -1);
  int64_t next = 0;
  for (size_t b = 0; b < req.length.size(); ++b)
    for (int64_t pg = page_range[b].first; pg <= page_range[b].second; ++pg)
      table[b * table_width + pg] = phys[next++];

  // Tokens through the window writer, at model magnitude (CONTRACT 9.9): latents N(0,1) times a
  // gain exp(0.7 N(0,1)) per (token, 64-dim tile), the RoPE tile included.
  std::vector<bf16_bits> kv;
  std::vector<int64_t> pos, slot;
  for (size_t b = 0; b < req.length.size(); ++b) {
    for (int64_t p = std::max<int64_t>(0, req.length[b] - first_needed_of); p < req.length[b];
         ++p) {
      pos.push_back(p);
      slot.push_back(int64_t{table[b * table_width + p / wbs]} * wbs + p % wbs);
      for (int tile = 0; tile < 512 / kTile; ++tile) {
        const float gain = std::exp(kTileGainSigma * rng.normal());
        for (int d = 0; d < kTile; ++d) kv.push_back(float_to_bf16(rng.normal() * gain));
      }
    }
  }
  WindowWriterParams w;
  w.num_tokens = static_cast<int64_t>(pos.size());
  w.kv = kv.data();
  w.positions = pos.data();
  w.slots = slot.data();
  w.rope = {pb.rope.data(), pb.rope_rows, 64};
  w.cache = {pb.window_cache.bytes.data(), pb.window_cache.num_blocks, wbs,
             pb.window_cache.block_stride};
  w.path = Path::Cpu;
  write_window(w);
  report(cfg, "window writer: " + std::to_string(pos.size()) + " tokens");

  // Window lists for every query row.
  WindowListParams l;
  l.common.num_rows = pb.tokens;
  std::vector<int32_t> req_of_row(pb.tokens);
  for (int64_t t = 0; t < pb.tokens; ++t) req_of_row[t] = static_cast<int32_t>(t / cfg.mtp);
  l.positions = pb.positions.data();
  l.request_index = req_of_row.data();
  l.block_table = table.data();
  l.block_table_stride = table_width;
  l.table_width = static_cast<int32_t>(table_width);
  l.num_requests = cfg.batch;
  l.block_size = wbs;
  pb.main_list.width = 128;
  pb.main_list.indices.assign(pb.tokens * 128, -1);
  pb.main_list.indptr.assign(pb.tokens + 1, 0);
  l.out = {pb.main_list.indices.data(), pb.main_list.indptr.data(), 128};
  l.common.path = Path::Cpu;
  build_window_lists(l);
}

// Compressed cache through the state writer + compressor, in chunks (chunked prefill) with a ring
// of state blocks per request, the way an engine keeps only the state rows that are still needed.
struct StateRing {
  int32_t state_bs;
  int64_t ring_blocks;
  std::vector<float> rows;
  StateCacheView view;
  std::vector<int32_t> table;  // [batch, table_width]
  int64_t table_width;
};

StateRing make_state_ring(const ProblemConfig& cfg, int32_t ratio, int64_t W, int64_t max_len) {
  StateRing s;
  s.state_bs = ratio == 4 ? 4 : 8;
  s.ring_blocks = (cfg.chunk + 2 * ratio) / s.state_bs + 2;
  const int64_t row = 2 * W, nblocks = s.ring_blocks * cfg.batch;
  s.rows.assign(static_cast<size_t>(nblocks * s.state_bs * row), 0.0f);
  s.view = {s.rows.data(), nblocks, s.state_bs, s.state_bs * row, row};
  s.table_width = (max_len + s.state_bs - 1) / s.state_bs;
  s.table.resize(cfg.batch * s.table_width);
  for (int64_t b = 0; b < cfg.batch; ++b)
    for (int64_t i = 0; i < s.table_width; ++i)
      s.table[b * s.table_width + i] = static_cast<int32_t>(b * s.ring_blocks + i % s.ring_blocks);
  return s;
}

struct CompressedTable {
  std::vector<int32_t> table;
  int64_t width;
};

CompressedTable make_compressed_cache(Problem& pb, const Requests& req, int32_t ratio,
                                      FastRng& rng) {
  const int32_t cbs =
      pb.config.compressed_page > 0 ? pb.config.compressed_page : (ratio == 4 ? 64 : 2);
  int64_t width = 0, total = 0;
  for (int64_t len : req.length) {
    const int64_t pages = (len / ratio + cbs - 1) / cbs;
    width = std::max(width, pages);
    total += pages;
  }
  pb.compressed_cache = make_cache(std::max<int64_t>(total, 1), cbs, rng);
  const std::vector<int32_t> phys = shuffled_pages(std::max<int64_t>(total, 1), rng);
  CompressedTable ct{std::vector<int32_t>(req.length.size() * std::max<int64_t>(width, 1), -1),
                     std::max<int64_t>(width, 1)};
  int64_t next = 0;
  for (size_t b = 0; b < req.length.size(); ++b)
    for (int64_t pg = 0; pg < (req.length[b] / ratio + cbs - 1) / cbs; ++pg)
      ct.table[b * ct.width + pg] = phys[next++];
  return ct;
}

void run_compressor(Problem& pb, const Requests& req, int32_t ratio, const CompressedTable& ct,
                    FastRng& rng) {
  const ProblemConfig& cfg = pb.config;
  const int64_t W = (ratio == 4 ? 2 : 1) * 512;
  const int64_t max_len = *std::max_element(req.length.begin(), req.length.end());
  StateRing ring = make_state_ring(cfg, ratio, W, max_len);
  // The compressor's own weights: an RMSNorm weight near 1 (its entries are RMS-normalised, O(1)
  // like the model's) and a small positional bias.
  std::vector<float> norm_w(512), ape(ratio * W);
  for (auto& w : norm_w) w = std::exp(0.2f * rng.normal());
  for (auto& a : ape) a = 0.1f * rng.normal();
  const int32_t cbs = pb.compressed_cache.block_size;
  int64_t entries = 0;
  ProgressTicker ticker(cfg.progress,
                        "compressor (ratio " + std::to_string(ratio) + ") fill, tokens");
  for (int64_t start = 0; start < max_len; start += cfg.chunk) {
    ticker.update(start, max_len);
    std::vector<int64_t> pos, sslot, cslot;
    std::vector<int32_t> reqi;
    for (int64_t b = 0; b < cfg.batch; ++b) {
      for (int64_t p = start; p < std::min(start + cfg.chunk, req.length[b]); ++p) {
        pos.push_back(p);
        reqi.push_back(static_cast<int32_t>(b));
        sslot.push_back(int64_t{ring.table[b * ring.table_width + p / ring.state_bs]} *
                            ring.state_bs +
                        p % ring.state_bs);
        const int64_t j = p / ratio;
        const bool completes = (p + 1) % ratio == 0;
        cslot.push_back(completes ? int64_t{ct.table[b * ct.width + j / cbs]} * cbs + j % cbs : -1);
        entries += completes;
      }
    }
    const int64_t n = static_cast<int64_t>(pos.size());
    // Inputs at model magnitude (CONTRACT 9.9): N(0,1) times a gain exp(0.7 N(0,1)) per (token,
    // 64-dim tile), so the pooled, normalised entries keep tiles of unequal scale.
    std::vector<float> kv(n * W), score(n * W);
    for (int64_t i = 0; i < n * W; i += kTile) {
      const float gain = std::exp(kTileGainSigma * rng.normal());
      for (int64_t d = i; d < i + kTile; ++d) kv[d] = rng.normal() * gain;
    }
    for (auto& v : score) v = 2.0f * rng.normal();
    StateWriterParams sw;
    sw.num_tokens = n;
    sw.ratio = ratio;
    sw.kv = kv.data();
    sw.kv_stride = W;
    sw.score = score.data();
    sw.score_stride = W;
    sw.ape = ape.data();
    sw.positions = pos.data();
    sw.state_slots = sslot.data();
    sw.state = ring.view;
    sw.path = Path::Cpu;
    write_compressor_state(sw);
    CompressorParams c;
    c.num_tokens = n;
    c.ratio = ratio;
    c.positions = pos.data();
    c.request_index = reqi.data();
    c.state_slots = sslot.data();
    c.out_slots = cslot.data();
    c.state_block_table = ring.table.data();
    c.state_table_stride = ring.table_width;
    c.state_table_width = static_cast<int32_t>(ring.table_width);
    c.num_requests = cfg.batch;
    c.state = ring.view;
    c.norm_weight = norm_w.data();
    c.rope = {pb.rope.data(), pb.rope_rows, 64};
    c.cache = {pb.compressed_cache.bytes.data(), pb.compressed_cache.num_blocks, cbs,
               pb.compressed_cache.block_stride};
    c.sanitise = true;
    c.path = Path::Cpu;
    compress(c);
  }
  report(cfg, "compressor (ratio " + std::to_string(ratio) + "): " + std::to_string(entries) +
                  " entries from " + std::to_string(max_len) + " positions/request max");
}

// Ratio-4 extra lists: the indexer's top-k, here distinct random entries among those completed.
// With topk_source "indexer" the indexer picks them (CONTRACT 11; vLLM's indexer pages sit next to
// the compressed ones, so its block table is the compressed one).
void build_topk(Problem& pb, const CompressedTable& ct, FastRng& rng) {
  const int64_t W = pb.kind.topk, T = pb.tokens;
  std::vector<int32_t> topk(T * W, -1), req_of_row(T);
  for (int64_t t = 0; t < T; ++t) req_of_row[t] = static_cast<int32_t>(t / pb.config.mtp);
  const bool indexer = pb.config.topk_source == "indexer";
  if (indexer) {
    std::vector<int32_t> lengths;
    pb.indexer_seconds = run_indexer_step(
        ct.table, static_cast<int32_t>(ct.width), pb.config.batch, pb.compressed_cache.num_blocks,
        pb.compressed_cache.block_size, pb.positions, req_of_row, static_cast<int32_t>(W),
        pb.config.seed, 3, topk, lengths);
    for (int64_t t = 0; t < T; ++t) pb.indexer_candidates += (pb.positions[t] + 1) / 4;
    report(pb.config, "indexer (CPU): " + std::to_string(pb.indexer_candidates) +
                          " candidates over " + std::to_string(T) +
                          " rows, k = " + std::to_string(W) + ", " +
                          std::to_string(pb.indexer_seconds * 1e3) + " ms");
  }
  for (int64_t t = 0; t < T && !indexer; ++t) {
    const int64_t n = (pb.positions[t] + 1) / 4;
    std::vector<int32_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    const int64_t k = std::min<int64_t>(W, n);
    for (int64_t i = 0; i < k; ++i) std::swap(all[i], all[i + rng.below(n - i)]);
    std::copy(all.begin(), all.begin() + k, topk.begin() + t * W);
  }
  TopkListParams l;
  l.common.num_rows = T;
  l.common.path = Path::Cpu;
  l.topk = topk.data();
  l.topk_stride = W;
  l.request_index = req_of_row.data();
  l.block_table = ct.table.data();
  l.block_table_stride = ct.width;
  l.table_width = static_cast<int32_t>(ct.width);
  l.num_requests = pb.config.batch;
  l.block_size = pb.compressed_cache.block_size;
  pb.extra_list.width = W;
  pb.extra_list.indices.assign(T * W, -1);
  pb.extra_list.indptr.assign(T + 1, 0);
  l.out = {pb.extra_list.indices.data(), pb.extra_list.indptr.data(), W};
  build_topk_lists(l);
}

// Ratio-128 extra lists: every compressed entry so far.
void build_all_compressed(Problem& pb, const CompressedTable& ct, int64_t max_model_len) {
  const int64_t T = pb.tokens, W = max_compressed_entries(max_model_len, 128);
  std::vector<int32_t> req_of_row(T);
  for (int64_t t = 0; t < T; ++t) req_of_row[t] = static_cast<int32_t>(t / pb.config.mtp);
  CompressedAllListParams l;
  l.common.num_rows = T;
  l.common.path = Path::Cpu;
  l.positions = pb.positions.data();
  l.request_index = req_of_row.data();
  l.block_table = ct.table.data();
  l.block_table_stride = ct.width;
  l.table_width = static_cast<int32_t>(ct.width);
  l.num_requests = pb.config.batch;
  l.block_size = pb.compressed_cache.block_size;
  l.ratio = 128;
  l.max_compressed = W;
  pb.extra_list.width = W;
  pb.extra_list.indices.assign(T * W, -1);
  pb.extra_list.indptr.assign(T + 1, 0);
  l.out = {pb.extra_list.indices.data(), pb.extra_list.indptr.data(), W};
  build_compressed_all_lists(l);
}

int64_t count_valid(const HostList& l, const HostCache& c) {
  int64_t n = 0;
  for (size_t t = 0; t + 1 < l.indptr.size(); ++t)
    for (int32_t i = l.indptr[t]; i < l.indptr[t + 1]; ++i)
      n += slot_is_valid(l.indices[i], c.num_blocks, c.block_size);
  return n;
}

}  // namespace

LayerKind layer_kind(const std::string& name) {
  static const LayerKind kinds[] = {{"flash-c4", 64, 4, 512},
                                    {"pro-c4", 128, 4, 1024},
                                    {"flash-c128", 64, 128, 0},
                                    {"pro-c128", 128, 128, 0},
                                    {"swa", 64, 0, 0}};
  for (const auto& k : kinds)
    if (k.name == name) return k;
  throw_arg_error("run", "--layer", "one of " + layer_kind_names(), name);
}

std::string layer_kind_names() {
  return "flash-c4, pro-c4, flash-c128, pro-c128, swa";
}

DecodeParams Problem::params() const {
  DecodeParams p;
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.q = q.data();
  p.q_stride_token = int64_t{heads} * 512;
  p.main_cache = window_cache.view();
  p.main_list = main_list.view();
  p.has_extra = kind.ratio != 0;
  if (p.has_extra) {
    p.extra_cache = compressed_cache.view();
    p.extra_list = extra_list.view();
    p.extra_cache_sanitised = true;  // written by our compressor in sanitising mode
  }
  p.sink = sink.data();
  p.positions = positions.data();
  p.rope = {rope.data(), rope_rows, 64};
  p.out_stride_token = int64_t{heads} * 512;
  return p;
}

double Problem::bytes() const {
  const double idx = static_cast<double>(main_list.indptr.back()) +
                     (extra_list.indptr.empty() ? 0.0 : extra_list.indptr.back());
  return 584.0 * static_cast<double>(attended_keys) + 4.0 * idx + 2.0 * 2.0 * tokens * heads * 512;
}

Problem build_problem(const ProblemConfig& cfg) {
  SPARSEMLA_CHECK_ARG(cfg.batch >= 1, "run", "--batch", ">= 1", cfg.batch);
  SPARSEMLA_CHECK_ARG(cfg.context >= 1, "run", "--context", ">= 1", cfg.context);
  SPARSEMLA_CHECK_ARG(cfg.mtp >= 1 && cfg.mtp <= 8, "run", "--mtp", "1..8", cfg.mtp);
  Problem pb;
  pb.config = cfg;
  pb.kind = layer_kind(cfg.layer);
  pb.heads = cfg.heads > 0 ? cfg.heads : pb.kind.heads;
  SPARSEMLA_CHECK_ARG(pb.heads >= 1 && pb.heads <= 128, "run", "--heads", "1..128", pb.heads);
  SPARSEMLA_CHECK_ARG(cfg.topk_source == "random" || cfg.topk_source == "indexer", "run",
                      "--topk-source", "random or indexer", cfg.topk_source);
  pb.tokens = cfg.batch * cfg.mtp;
  FastRng rng(cfg.seed);
  const Requests req = make_requests(cfg, rng);
  const int64_t max_len = *std::max_element(req.length.begin(), req.length.end());
  pb.rope_rows = max_len + 1;
  pb.rope = build_rope_table(
      pb.kind.ratio == 0 ? rope_config_window_layer() : rope_config_compressed_layer(),
      pb.rope_rows);
  for (int64_t b = 0; b < cfg.batch; ++b)
    for (int32_t i = 0; i < cfg.mtp; ++i) pb.positions.push_back(req.length[b] - cfg.mtp + i);
  fill_window(pb, req, rng);
  if (pb.kind.ratio != 0) {
    const CompressedTable ct = make_compressed_cache(pb, req, pb.kind.ratio, rng);
    run_compressor(pb, req, pb.kind.ratio, ct, rng);
    if (pb.kind.ratio == 4)
      build_topk(pb, ct, rng);
    else
      build_all_compressed(pb, ct, max_len);
  }
  pb.q.resize(pb.tokens * pb.heads * 512);
  for (auto& v : pb.q) v = float_to_bf16(rng.normal());
  pb.sink.resize(pb.heads);
  for (auto& s : pb.sink) s = rng.normal();
  pb.attended_keys = count_valid(pb.main_list, pb.window_cache) +
                     (pb.kind.ratio ? count_valid(pb.extra_list, pb.compressed_cache) : 0);
  report(cfg, "lists built: " + std::to_string(pb.attended_keys) + " valid keys over " +
                  std::to_string(pb.tokens) + " query rows");
  return pb;
}

}  // namespace sparsemla::tools
