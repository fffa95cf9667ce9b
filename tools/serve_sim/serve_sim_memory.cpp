// tools/serve_sim/serve_sim_memory.cpp: the serving simulation's memory (serve_sim_memory.h): the
// cache geometry under the memory budget, block tables, allocation and the cache fill.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "serve_sim_memory.h"

#include "progress.h"

namespace sparsemla::tools::serve_sim_detail {

void SimMemory::plan_memory() {
  g_.batch = cfg_.batch;
  g_.heads = cfg_.heads;
  g_.topk = cfg_.model.topk;
  g_.indexer = cfg_.indexer;
  g_.max_len = cfg_.mix.max_model_len();
  for (int32_t id : cfg_.layers) {
    const int32_t r = cfg_.model.schedule[id];
    (r == 0 ? g_.n_swa : (r == 4 ? g_.n_c4 : g_.n_c128))++;
  }
  g_.n_out = 1 + static_cast<int32_t>(cfg_.verify_layers.size());
  g_.window_table_width = ceil_div(g_.max_len, kWindowPage);
  g_.c4_logical_pages = ceil_div(ceil_div(g_.max_len, 4), kC4Page);
  g_.c128_width = max_compressed_entries(g_.max_len, 128);
  g_.c128_logical_pages = ceil_div(g_.c128_width, kC128Page);
  g_.state_table_width4 = ceil_div(g_.max_len, kStatePage4);
  g_.state_table_width128 = ceil_div(g_.max_len, kStatePage128);
  g_.c4_pool_pages = g_.c4_logical_pages;
  g_.c128_pool_pages = g_.c128_logical_pages;

  const double budget = cfg_.memory_budget > 0.0 ? cfg_.memory_budget : be_.default_memory_budget();
  const int64_t min4 = std::min(g_.c4_logical_pages, ceil_div(kMinPoolTopk * g_.topk, kC4Page));
  const int64_t min128 = std::min(g_.c128_logical_pages, ceil_div(kMinPool128, kC128Page));
  if (g_.total_bytes() > budget && g_.n_c4 > 0) {
    const double room = budget - g_.fixed_bytes() - g_.c128_pool_bytes(g_.c128_pool_pages);
    const double per_page = g_.c4_pool_bytes(1);
    g_.c4_pool_pages =
        std::clamp(static_cast<int64_t>(std::max(0.0, room) / per_page), min4, g_.c4_pool_pages);
  }
  if (g_.total_bytes() > budget && g_.n_c128 > 0) {
    const double room = budget - g_.fixed_bytes() - g_.c4_pool_bytes(g_.c4_pool_pages);
    const double per_page = g_.c128_pool_bytes(1);
    g_.c128_pool_pages = std::clamp(static_cast<int64_t>(std::max(0.0, room) / per_page), min128,
                                    g_.c128_pool_pages);
  }
  SPARSEMLA_CHECK_ARG(g_.total_bytes() <= budget, "serve-sim", "--mem-gb",
                      ">= " + gib(g_.total_bytes()) + " for B=" + std::to_string(g_.batch) +
                          " with the smallest compressed pools (or lower --batch / --layers)",
                      gib(budget));
  // Slots are int32 in the lists.
  SPARSEMLA_CHECK_ARG(g_.batch * g_.c4_pool_pages * kC4Page < (int64_t{1} << 31), "serve-sim",
                      "--batch", "fewer requests (ratio-4 slots overflow int32)", g_.batch);

  auto& s = result_.simulated;
  result_.c4_pool_entries = g_.n_c4 ? g_.c4_pool_pages * kC4Page : 0;
  result_.c4_logical_entries = g_.n_c4 ? ceil_div(g_.max_len, 4) : 0;
  result_.c128_pool_entries = g_.n_c128 ? g_.c128_pool_pages * kC128Page : 0;
  result_.c128_logical_entries = g_.n_c128 ? g_.c128_width : 0;
  result_.device_bytes = g_.total_bytes();  // an upper bound (workspace for S = 32)
  s.push_back("window caches: " + std::to_string(kWindowRing) + " pages of " +
              std::to_string(kWindowPage) + " tokens per request and layer (a ring: older " +
              "positions are never read)");
  if (g_.n_c4) {
    const bool aliased = g_.c4_pool_pages < g_.c4_logical_pages;
    s.push_back("ratio-4 compressed caches: " + std::to_string(result_.c4_pool_entries) +
                " entries per request and layer" +
                (aliased ? " (aliased: entry i at i mod pool of up to " +
                               std::to_string(result_.c4_logical_entries) +
                               (g_.indexer ? "; the indexer's top-k may name a row twice)"
                                           : "; top-k rows stay distinct)")
                         : " (every reachable entry)") +
                ", top-k " + std::to_string(g_.topk));
  }
  if (g_.n_c128) {
    const bool aliased = g_.c128_pool_pages < g_.c128_logical_pages;
    s.push_back("ratio-128 compressed caches: " + std::to_string(result_.c128_pool_entries) +
                " entries per request and layer" +
                (aliased ? " (aliased: entry i at i mod pool of up to " +
                               std::to_string(result_.c128_logical_entries) + ")"
                         : " (every reachable entry)") +
                ", list width " + std::to_string(g_.c128_width));
  }
  s.push_back("memory: " + gib(g_.total_bytes()) + " (budget " + gib(budget) + ")");
  for (const auto& line : s) report(line);
}

void SimMemory::build_tables() {
  const int64_t B = g_.batch;
  auto paged = [&](int64_t width, int64_t pool) {  // row r, logical page p -> a pool page
    const std::vector<int32_t> phys = permutation(B * pool, rng_);  // fragmented allocator
    std::vector<int32_t> t(static_cast<size_t>(B * width));
    for (int64_t r = 0; r < B; ++r)
      for (int64_t p = 0; p < width; ++p) t[r * width + p] = phys[r * pool + p % pool];
    return t;
  };
  auto ring = [&](int64_t width, int64_t blocks) {
    std::vector<int32_t> t(static_cast<size_t>(B * width));
    for (int64_t r = 0; r < B; ++r)
      for (int64_t i = 0; i < width; ++i)
        t[r * width + i] = static_cast<int32_t>(r * blocks + i % blocks);
    return t;
  };
  window_table_ = paged(g_.window_table_width, kWindowRing);
  window_table_dev_ = upload_new(window_table_);
  if (g_.n_c4) {
    c4_table_ = paged(g_.c4_logical_pages, g_.c4_pool_pages);
    state_table4_ = ring(g_.state_table_width4, kStateRing4);
    c4_table_dev_ = upload_new(c4_table_);
    state_table4_dev_ = upload_new(state_table4_);
  }
  if (g_.n_c128) {
    c128_table_ = paged(g_.c128_logical_pages, g_.c128_pool_pages);
    state_table128_ = ring(g_.state_table_width128, kStateRing128);
    c128_table_dev_ = upload_new(c128_table_);
    state_table128_dev_ = upload_new(state_table128_);
  }
  if (g_.n_swa) {
    rope_window_host_ = build_rope_table(rope_config_window_layer(), g_.max_len);
    rope_window_ = {upload_new(rope_window_host_), g_.max_len, 64};
  }
  if (g_.n_c4 || g_.n_c128) {
    rope_compressed_host_ = build_rope_table(rope_config_compressed_layer(), g_.max_len);
    rope_compressed_ = {upload_new(rope_compressed_host_), g_.max_len, 64};
  }
}

std::vector<bf16_bits> SimMemory::random_latents(int64_t n) {
  std::vector<bf16_bits> v(static_cast<size_t>(n) * 512);
  for (int64_t i = 0; i < n * 512; i += Fp8DsMla::kTileDims) {
    const float gain = std::exp(kTileGainSigma * rng_.normal());
    for (int64_t d = i; d < i + Fp8DsMla::kTileDims; ++d)
      v[d] = float_to_bf16(rng_.normal() * gain);
  }
  return v;
}

void SimMemory::fill_floats(float* dst, int64_t n, float scale) {
  const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 20);
  std::vector<float> tmpl(static_cast<size_t>(chunk));
  for (auto& x : tmpl) x = scale * rng_.normal();
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    be_.upload(dst + at, tmpl.data(), static_cast<size_t>(len) * sizeof(float));
  }
}

// Random finite e4m3 bytes.
void SimMemory::fill_e4m3(uint8_t* dst, int64_t n) {
  const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 22);
  std::vector<uint8_t> tmpl(static_cast<size_t>(chunk));
  for (auto& b : tmpl) b = random_finite_e4m3(rng_);
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    be_.upload(dst + at, tmpl.data(), static_cast<size_t>(len));
  }
}

// Synthetic indexer keys (CONTRACT 2.2 NORMAL pages): random finite e4m3 values and power-of-two
// scales in [2^-8, 2^-4], a template of up to 256 pages repeated over the cache (their values
// change no cost of the scoring, which reads every candidate's 132 bytes).
void SimMemory::fill_indexer_cache(const IndexerCacheView& c) {
  const int64_t stride = c.block_stride, pages = std::min<int64_t>(c.num_blocks, 256);
  std::vector<uint8_t> tmpl(static_cast<size_t>(pages * stride));
  for (int64_t p = 0; p < pages; ++p) {
    uint8_t* page = tmpl.data() + p * stride;
    for (int64_t i = 0; i < int64_t{c.block_size} * kIndexerHeadDim; ++i)
      page[i] = random_finite_e4m3(rng_);
    for (int32_t e = 0; e < c.block_size; ++e) {
      const float s = std::ldexp(1.0f, -4 - static_cast<int>(rng_.below(5)));
      std::memcpy(page + int64_t{c.block_size} * kIndexerHeadDim + 4 * e, &s, 4);
    }
  }
  for (int64_t at = 0; at < c.num_blocks; at += pages) {
    const int64_t n = std::min(pages, c.num_blocks - at);
    be_.upload(c.base + at * stride, tmpl.data(), static_cast<size_t>(n * stride));
  }
}

void SimMemory::allocate() {
  const int64_t B = g_.batch, H = g_.heads;
  size_t bytes = 0;
  carve_meta(nullptr, B, &bytes);
  meta_bytes_ = bytes;
  meta_dev_block_ = alloc<uint8_t>(static_cast<int64_t>(bytes));
  meta_stage_block_ = static_cast<uint8_t*>(be_.alloc_staging(bytes));
  meta_dev_ = carve_meta(meta_dev_block_, B, &bytes);
  meta_stage_ = carve_meta(meta_stage_block_, B, &bytes);

  main_indices_ = alloc<int32_t>(B * kWindow);
  main_indptr_ = alloc<int32_t>(B + 1);
  if (g_.n_c128) {
    c128_indices_ = alloc<int32_t>(B * g_.c128_width);
    c128_indptr_ = alloc<int32_t>(B + 1);
  }
  if (g_.n_c4) {
    const size_t n = static_cast<size_t>(g_.n_c4 * B * g_.topk);
    topk_dev_ = alloc<int32_t>(static_cast<int64_t>(n));
    if (!g_.indexer) topk_stage_ = static_cast<int32_t*>(be_.alloc_staging(n * sizeof(int32_t)));
  }

  // New-token inputs (the model's projections; their values change no cost).
  latent_ = upload_new(random_latents(B));
  auto kind_inputs = [&](int32_t ratio) {
    KindInputs in;
    const int64_t W = state_width(ratio);
    in.kv = alloc<float>(B * W);
    in.score = alloc<float>(B * W);
    in.ape = alloc<float>(ratio * W);
    in.norm_w = alloc<float>(512);
    fill_floats(in.kv, B * W, 1.0f);
    fill_floats(in.score, B * W, 2.0f);
    fill_floats(in.ape, ratio * W, 0.1f);
    // The RMSNorm weight, near 1: the compressor's entries are RMS-normalised, O(1) as the model's.
    std::vector<float> w(512);
    for (auto& x : w) x = std::exp(0.2f * rng_.normal());
    be_.upload(in.norm_w, w.data(), w.size() * sizeof(float));
    return in;
  };
  if (g_.n_c4) in4_ = kind_inputs(4);
  if (g_.n_c128) in128_ = kind_inputs(128);

  std::vector<bf16_bits> q(static_cast<size_t>(B * H * 512));
  for (auto& x : q) x = float_to_bf16(rng_.normal());
  shared_out_ = alloc<bf16_bits>(B * H * 512);
  auto cache = [&](int64_t pages, int32_t bs) {
    MutableCacheView c;
    c.num_blocks = pages;
    c.block_size = bs;
    c.block_stride = page_stride(bs);
    c.base = alloc<uint8_t>(pages * c.block_stride);
    return c;
  };
  int32_t c4_index = 0;
  for (int32_t id : cfg_.layers) {
    Layer l;
    l.id = id;
    l.ratio = cfg_.model.schedule[id];
    l.verified = std::find(cfg_.verify_layers.begin(), cfg_.verify_layers.end(), id) !=
                 cfg_.verify_layers.end();
    l.window = cache(B * kWindowRing, kWindowPage);
    if (l.ratio == 4) l.compressed = cache(B * g_.c4_pool_pages, kC4Page);
    if (l.ratio == 128) l.compressed = cache(B * g_.c128_pool_pages, kC128Page);
    if (l.ratio != 0) {
      const int32_t sbs = l.ratio == 4 ? kStatePage4 : kStatePage128;
      const int64_t blocks = B * (l.ratio == 4 ? kStateRing4 : kStateRing128);
      const int64_t row = 2 * state_width(l.ratio);
      l.state.num_blocks = blocks;
      l.state.block_size = sbs;
      l.state.row_stride = row;
      l.state.block_stride = sbs * row;
      l.state.base = alloc<float>(blocks * sbs * row);
      fill_floats(l.state.base, blocks * sbs * row, 1.0f);  // rows written before the trace
    }
    l.q = upload_new(q);
    std::vector<float> sink(static_cast<size_t>(H));
    for (auto& x : sink) x = rng_.normal();
    l.sink = upload_new(sink);
    l.out = l.verified ? alloc<bf16_bits>(B * H * 512) : shared_out_;
    if (l.ratio == 4) {
      l.c4_index = c4_index++;
      l.topk = topk_dev_ + static_cast<int64_t>(l.c4_index) * B * g_.topk;
      l.extra_indices = alloc<int32_t>(B * g_.topk);
      l.extra_indptr = alloc<int32_t>(B + 1);
      if (g_.indexer) {
        l.icache.num_blocks = B * g_.c4_pool_pages;
        l.icache.block_size = kC4Page;
        l.icache.block_stride = indexer_page_stride();
        l.icache.base = alloc<uint8_t>(l.icache.num_blocks * l.icache.block_stride);
        l.icache.layout = IndexerLayout::Normal;
        fill_indexer_cache(l.icache);
        l.iq = alloc<uint8_t>(B * kIndexerHeads * kIndexerHeadDim);
        fill_e4m3(l.iq, B * kIndexerHeads * kIndexerHeadDim);
        l.iw = alloc<float>(B * kIndexerHeads);
        fill_floats(l.iw, B * kIndexerHeads, 1.0f / 64.0f);
      }
    }
    layers_.push_back(l);
  }
}

void SimMemory::fill_cache(const MutableCacheView& c, const RopeTable& rope, const bf16_bits* tmpl,
                           int64_t chunk, int64_t* pos_dev, int64_t* slot_dev) {
  const int64_t total = c.num_blocks * c.block_size;
  std::vector<int64_t> pos(static_cast<size_t>(chunk)), slot(static_cast<size_t>(chunk));
  for (int64_t at = 0; at < total; at += chunk) {
    const int64_t n = std::min(chunk, total - at);
    for (int64_t i = 0; i < n; ++i) {
      slot[i] = at + i;
      pos[i] = (at + i * 7) % rope.rows;  // vary the RoPE dims between chunks
    }
    be_.upload(slot_dev, slot.data(), static_cast<size_t>(n) * 8);
    be_.upload(pos_dev, pos.data(), static_cast<size_t>(n) * 8);
    WindowWriterParams w;
    w.num_tokens = n;
    w.kv = tmpl;
    w.positions = pos_dev;
    w.slots = slot_dev;
    w.rope = rope;
    w.cache = c;
    w.sanitise = true;
    w.path = ops_path();
    w.stream = be_.stream();
    write_window(w);
  }
}

void SimMemory::fill_caches() {
  const int64_t chunk = g_.fill_chunk();
  const bf16_bits* window_tmpl = upload_new(random_latents(chunk));
  const bf16_bits* compressed_tmpl = upload_new(random_latents(chunk));
  int64_t* pos_dev = alloc<int64_t>(chunk);
  int64_t* slot_dev = alloc<int64_t>(chunk);
  // A GPU sweep fills tens of GiB, a CPU fill of 61 layers takes minutes: progress lines.
  ProgressTicker ticker([this](const std::string& m) { report(m); }, "cache fill, layers");
  int64_t filled = 0;
  for (const auto& l : layers_) {
    ticker.update(filled++, static_cast<int64_t>(layers_.size()));
    fill_cache(l.window, rope_of(l.ratio), window_tmpl, chunk, pos_dev, slot_dev);
    if (l.ratio)
      fill_cache(l.compressed, rope_compressed_, compressed_tmpl, chunk, pos_dev, slot_dev);
  }
}

}  // namespace sparsemla::tools::serve_sim_detail
