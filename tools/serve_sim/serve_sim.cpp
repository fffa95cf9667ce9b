// serve-sim: one simulation (one batch size, every path): per-layer state, the step, timing,
// verification. The CPU backend lives here; the CUDA one in serve_sim_cuda.cpp.
//
// What is simulated and what is synthetic (docs/SERVE-SIM.md):
// - Caches are filled once, at setup, with valid model-like rows written by the window writer
//   from random latents (sanitising mode), instead of prefilling every request's context through
//   the compressor: the decode's cost and its numerics depend on which rows it reads, not on how
//   they were produced. From then on every step writes its new token through the real writers:
//   window writer, compressor state writer, compressor (which stores an entry every 4 / 128
//   tokens).
// - Memory is an engine's: a request's window cache is a ring of 3 pages (positions older than the
//   window are never read again), its compressor state a ring of the rows still needed, and its
//   compressed cache a pool of pages. When the pools every layer would need for the longest
//   request do not fit the memory budget (a 1M-token mix at B=128 would need terabytes), logical
//   compressed entry i of a request is stored at physical entry i mod P (P = pool entries): every
//   list entry still names a valid, written row, and the top-k draws distinct rows mod P, so no
//   row is read twice within a list and the bytes moved are those of the real workload.
// - The indexer (scores, top-k) is not part of this library: each ratio-4 layer's top-k is drawn
//   when a request joins (distinct random compressed entries it has completed) and stays fixed
//   for its lifetime; it is uploaded before the step, like the engine's other step inputs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "serve_sim.h"

namespace sparsemla::tools {

namespace {

constexpr int32_t kWindow = 128;
constexpr int32_t kWindowPage = 64;  // vLLM's window pages
// Pages of the window ring per request: positions pos-127..pos span at most 3 pages of 64, which
// are then distinct mod 3.
constexpr int32_t kWindowRing = 3;
constexpr int32_t kC4Page = 64;     // compressed entries per page, ratio 4
constexpr int32_t kC128Page = 2;    // ratio 128
constexpr int32_t kStatePage4 = 4;  // vLLM's compressor state block sizes
constexpr int32_t kStatePage128 = 8;
constexpr int32_t kStateRing4 = 4;     // rows pos-7..pos: at most 3 blocks of 4
constexpr int32_t kStateRing128 = 18;  // rows pos-127..pos: at most 17 blocks of 8
constexpr int64_t kFillChunk = 65536;  // tokens per writer call while filling caches
constexpr int64_t kMinPoolTopk = 4;    // aliased ratio-4 pools keep >= 4x top-k entries
constexpr int64_t kMinPool128 = 2048;  // aliased ratio-128 pools keep >= 2048 entries
// Latents at model magnitude (CONTRACT 9.9): N(0,1) times a gain exp(0.7 N(0,1)) per (token, 64-dim
// tile). The CONTRACT 9.9 rule bounds each element by the probability-weighted mean magnitude of
// its value column, so it holds at any magnitude: no shrunk RMS (the earlier 0.125 was chosen to
// pass the old fixed 1e-3 bound).
constexpr float kTileGainSigma = 0.7f;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
int64_t page_stride(int32_t bs) {
  return ceil_div(int64_t{bs} * Fp8DsMla::kBytesPerToken, Fp8DsMla::kEnginePageAlign) *
         Fp8DsMla::kEnginePageAlign;
}
int64_t state_width(int32_t ratio) {
  return (ratio == 4 ? 2 : 1) * 512;
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / kGiB);
  return buf;
}

// Per-step inputs an engine prepares on the host and copies into persistent buffers before it
// replays its graph; one block, the same layout on the host (staging) and where the paths run.
struct Meta {
  int64_t* positions = nullptr;       // [B] position of the token decoded (0 on padding rows)
  int64_t* window_slots = nullptr;    // [B] window slot of the new token (-1: padding)
  int64_t* state_slots4 = nullptr;    // [B] compressor state slots, ratio 4
  int64_t* out_slots4 = nullptr;      // [B] compressed slot when the token completes an entry
  int64_t* state_slots128 = nullptr;  // [B] ratio 128
  int64_t* out_slots128 = nullptr;    // [B]
  int32_t* request_index = nullptr;   // [B] block-table row of each query row
  uint8_t* row_valid = nullptr;       // [B] 0: padding row beyond the live batch
};

Meta carve_meta(uint8_t* base, int64_t batch, size_t* bytes) {
  size_t off = 0;
  auto take = [&](size_t n) {
    uint8_t* p = base != nullptr ? base + off : nullptr;
    off += (n + 63) / 64 * 64;
    return p;
  };
  Meta m;
  const size_t b = static_cast<size_t>(batch);
  m.positions = reinterpret_cast<int64_t*>(take(b * 8));
  m.window_slots = reinterpret_cast<int64_t*>(take(b * 8));
  m.state_slots4 = reinterpret_cast<int64_t*>(take(b * 8));
  m.out_slots4 = reinterpret_cast<int64_t*>(take(b * 8));
  m.state_slots128 = reinterpret_cast<int64_t*>(take(b * 8));
  m.out_slots128 = reinterpret_cast<int64_t*>(take(b * 8));
  m.request_index = reinterpret_cast<int32_t*>(take(b * 4));
  m.row_valid = take(b);
  *bytes = off;
  return m;
}

// Sizes of one simulation.
struct Geometry {
  int64_t batch = 0;
  int32_t heads = 0;
  int32_t topk = 0;
  int64_t max_len = 0;  // max_model_len: RoPE rows and table widths
  int32_t n_swa = 0, n_c4 = 0, n_c128 = 0;
  int32_t n_out = 1;  // output buffers: one shared + one per verified layer
  int64_t window_table_width = 0;
  int64_t c4_logical_pages = 0, c4_pool_pages = 0;
  int64_t c128_width = 0, c128_logical_pages = 0, c128_pool_pages = 0;
  int64_t state_table_width4 = 0, state_table_width128 = 0;

  int32_t layers() const { return n_swa + n_c4 + n_c128; }
  // Tokens per writer call while filling caches: the largest cache, at most kFillChunk.
  int64_t fill_chunk() const {
    int64_t most = batch * kWindowRing * kWindowPage;
    if (n_c4) most = std::max(most, batch * c4_pool_pages * kC4Page);
    if (n_c128) most = std::max(most, batch * c128_pool_pages * kC128Page);
    return std::min(kFillChunk, most);
  }
  double c4_pool_bytes(int64_t pages) const {
    return double(n_c4) * batch * pages * page_stride(kC4Page);
  }
  double c128_pool_bytes(int64_t pages) const {
    return double(n_c128) * batch * pages * page_stride(kC128Page);
  }
  // Everything but the compressed pools (an upper bound: workspace for S = 32).
  double fixed_bytes() const {
    const double B = double(batch), qo = B * heads * 512 * 2;
    double b = layers() * (B * kWindowRing * page_stride(kWindowPage) + qo + heads * 4.0);
    b += n_c4 * (B * kStateRing4 * kStatePage4 * 2 * state_width(4) * 4.0 + B * topk * 8.0);
    b += n_c128 * (B * kStateRing128 * kStatePage128 * 2 * state_width(128) * 4.0);
    b += n_out * qo;
    b += B * 4.0 *
         (window_table_width + c4_logical_pages + c128_logical_pages + state_table_width4 +
          state_table_width128);
    b += 2.0 * max_len * 64 * 4;                       // RoPE tables
    b += B * 4.0 * (kWindow + c128_width) + 16.0 * B;  // shared lists
    b += B * 512 * 2.0 + B * 4.0 * 2 * (1024 + 512);   // new-token inputs
    b += double(B) * 32 * heads * (2 + 512) * 4.0;     // workspace bound
    b += 2.0 * fill_chunk() * (512 * 2 + 16);          // fill templates
    return b;
  }
  double total_bytes() const {
    return fixed_bytes() + c4_pool_bytes(c4_pool_pages) + c128_pool_bytes(c128_pool_pages);
  }
};

// k distinct values of [0, m), in random order.
std::vector<int64_t> distinct_sample(int64_t m, int64_t k, FastRng& rng) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(k));
  if (m <= 4 * k) {  // partial Fisher-Yates
    std::vector<int64_t> all(static_cast<size_t>(m));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t i = 0; i < k; ++i) {
      std::swap(all[i], all[i + rng.below(m - i)]);
      out.push_back(all[i]);
    }
    return out;
  }
  std::unordered_set<int64_t> seen;  // Floyd's algorithm: O(k) for k << m
  seen.reserve(static_cast<size_t>(2 * k));
  for (int64_t j = m - k; j < m; ++j) {
    const int64_t t = rng.below(j + 1);
    const int64_t v = seen.insert(t).second ? t : j;
    if (v == j) seen.insert(j);
    out.push_back(v);
  }
  for (int64_t i = k - 1; i > 0; --i) std::swap(out[i], out[rng.below(i + 1)]);
  return out;
}

std::vector<int32_t> permutation(int64_t n, FastRng& rng) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(i + 1)]);
  return v;
}

class Simulation {
 public:
  Simulation(const SimConfig& cfg, SimBackend& be)
      : cfg_(cfg),
        be_(be),
        rng_(cfg.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(cfg.batch)),
        trace_(cfg.mix, cfg.batch, cfg.refill_delay, cfg.seed + static_cast<uint64_t>(cfg.batch)) {}

  SimResult run();

 private:
  struct Layer {
    int32_t id = 0;
    int32_t ratio = 0;
    int32_t c4_index = -1;  // among ratio-4 layers (top-k staging)
    bool verified = false;
    MutableCacheView window;
    MutableCacheView compressed;
    StateCacheView state;
    bf16_bits* q = nullptr;  // [B, H, 512]
    float* sink = nullptr;   // [H]
    bf16_bits* out = nullptr;
    int32_t* topk = nullptr;           // [B, topk] indexer output (ratio 4)
    int32_t* extra_indices = nullptr;  // graph buffers of its top-k list (ratio 4)
    int32_t* extra_indptr = nullptr;
  };
  struct KindInputs {         // the new tokens' compressor inputs (model projections), per ratio
    float* kv = nullptr;      // [B, W]
    float* score = nullptr;   // [B, W]
    float* ape = nullptr;     // [r, W]
    float* norm_w = nullptr;  // [512]
  };
  struct PathPlan {
    SimPath path;
    bool skipped = false;
    std::string skip_reason;
    std::vector<int32_t> splits;
    std::vector<int32_t> adaptive;
    std::unique_ptr<StepProgram> program;
    std::vector<double> seconds;
    std::vector<int64_t> tokens;
  };

  void report(const std::string& msg) const {
    if (cfg_.progress) cfg_.progress(msg);
  }
  template <typename T>
  T* alloc(int64_t n) {
    return static_cast<T*>(be_.alloc(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
  }
  template <typename T>
  T* upload_new(const std::vector<T>& v) {
    T* d = alloc<T>(static_cast<int64_t>(v.size()));
    if (!v.empty()) be_.upload(d, v.data(), v.size() * sizeof(T));
    return d;
  }
  Path ops_path() const { return be_.gpu() ? Path::CudaGeneric : Path::Cpu; }
  const RopeTable& rope_of(int32_t ratio) const {
    return ratio == 0 ? rope_window_ : rope_compressed_;
  }

  void plan_memory();
  void build_tables();
  void allocate();
  void fill_caches();
  void fill_cache(const MutableCacheView& c, const RopeTable& rope, const bf16_bits* tmpl,
                  int64_t chunk, int64_t* pos_dev, int64_t* slot_dev);
  void fill_floats(float* dst, int64_t n, float scale);
  std::vector<bf16_bits> random_latents(int64_t n);  // CONTRACT 9.9 magnitudes, [n, 512]
  void draw_topk(const SimRequest& r);
  void stage_step();
  DecodeParams decode_params(const Layer& l, const SimPath& path) const;
  void plan_paths();
  void enqueue_step(const PathPlan& plan);
  SimCheck verify(const Layer& l, const PathPlan& plan, int64_t step);

  const SimConfig& cfg_;
  SimBackend& be_;
  FastRng rng_;
  RequestTrace trace_;
  Geometry g_;
  SimResult result_;

  std::vector<Layer> layers_;
  std::vector<PathPlan> plans_;
  KindInputs in4_, in128_;
  bf16_bits* latent_ = nullptr;  // [B, 512] the new tokens' KV latents
  bf16_bits* shared_out_ = nullptr;

  // Block tables (host copies compute each step's slots), shared by the layers of a kind as in
  // an engine's KV-cache groups: every layer has its own cache with the same page ids.
  std::vector<int32_t> window_table_, c4_table_, c128_table_, state_table4_, state_table128_;
  int32_t* window_table_dev_ = nullptr;
  int32_t* c4_table_dev_ = nullptr;
  int32_t* c128_table_dev_ = nullptr;
  int32_t* state_table4_dev_ = nullptr;
  int32_t* state_table128_dev_ = nullptr;
  std::vector<float> rope_window_host_, rope_compressed_host_;
  RopeTable rope_window_, rope_compressed_;

  // Graph buffers of the lists built once per step (window lists and ratio-128 lists do not
  // depend on the layer).
  int32_t* main_indices_ = nullptr;
  int32_t* main_indptr_ = nullptr;
  int32_t* c128_indices_ = nullptr;
  int32_t* c128_indptr_ = nullptr;

  Meta meta_dev_, meta_stage_;
  uint8_t* meta_dev_block_ = nullptr;
  uint8_t* meta_stage_block_ = nullptr;
  size_t meta_bytes_ = 0;
  int32_t* topk_dev_ = nullptr;  // [n_c4, B, topk]
  int32_t* topk_stage_ = nullptr;
  std::vector<std::vector<int32_t>> topk_store_;  // per table row: [n_c4, topk]

  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

void Simulation::plan_memory() {
  g_.batch = cfg_.batch;
  g_.heads = cfg_.heads;
  g_.topk = cfg_.model.topk;
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
                               "; top-k rows stay distinct)"
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

void Simulation::build_tables() {
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

std::vector<bf16_bits> Simulation::random_latents(int64_t n) {
  std::vector<bf16_bits> v(static_cast<size_t>(n) * 512);
  for (int64_t i = 0; i < n * 512; i += Fp8DsMla::kTileDims) {
    const float gain = std::exp(kTileGainSigma * rng_.normal());
    for (int64_t d = i; d < i + Fp8DsMla::kTileDims; ++d)
      v[d] = float_to_bf16(rng_.normal() * gain);
  }
  return v;
}

void Simulation::fill_floats(float* dst, int64_t n, float scale) {
  const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 20);
  std::vector<float> tmpl(static_cast<size_t>(chunk));
  for (auto& x : tmpl) x = scale * rng_.normal();
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    be_.upload(dst + at, tmpl.data(), static_cast<size_t>(len) * sizeof(float));
  }
}

void Simulation::allocate() {
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
    topk_stage_ = static_cast<int32_t*>(be_.alloc_staging(n * sizeof(int32_t)));
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
    }
    layers_.push_back(l);
  }
}

void Simulation::fill_cache(const MutableCacheView& c, const RopeTable& rope, const bf16_bits* tmpl,
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

void Simulation::fill_caches() {
  const int64_t chunk = g_.fill_chunk();
  const bf16_bits* window_tmpl = upload_new(random_latents(chunk));
  const bf16_bits* compressed_tmpl = upload_new(random_latents(chunk));
  int64_t* pos_dev = alloc<int64_t>(chunk);
  int64_t* slot_dev = alloc<int64_t>(chunk);
  for (const auto& l : layers_) {
    fill_cache(l.window, rope_of(l.ratio), window_tmpl, chunk, pos_dev, slot_dev);
    if (l.ratio)
      fill_cache(l.compressed, rope_compressed_, compressed_tmpl, chunk, pos_dev, slot_dev);
  }
}

// The indexer's top-k of a request for every ratio-4 layer: distinct completed entries, distinct
// physical rows (residues mod the pool), -1 after the last valid one.
void Simulation::draw_topk(const SimRequest& r) {
  auto& store = topk_store_[r.table_row];
  store.assign(static_cast<size_t>(g_.n_c4) * g_.topk, -1);
  const int64_t n = (r.position() + 1) / 4;  // entries completed up to this token
  const int64_t pool = g_.c4_pool_pages * kC4Page;
  const int64_t m = std::min(pool, n), k = std::min<int64_t>(g_.topk, m);
  for (int32_t c = 0; c < g_.n_c4; ++c) {
    const std::vector<int64_t> residues = distinct_sample(m, k, rng_);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t res = residues[i];
      const int64_t wraps = (n - 1 - res) / pool;  // logical entries res + u*pool < n
      store[c * g_.topk + i] = static_cast<int32_t>(res + rng_.below(wraps + 1) * pool);
    }
  }
}

void Simulation::stage_step() {
  const auto& live = trace_.live();
  const int64_t B = g_.batch;
  const Meta& m = meta_stage_;
  for (const auto& r : live)
    if (r.fresh && g_.n_c4) draw_topk(r);
  auto slot = [](const std::vector<int32_t>& table, int64_t width, int32_t row, int64_t entry,
                 int32_t bs) -> int64_t {
    return int64_t{table[row * width + entry / bs]} * bs + entry % bs;
  };
  for (int64_t i = 0; i < B; ++i) {
    if (i >= static_cast<int64_t>(live.size())) {  // padding rows: nothing read or written
      m.positions[i] = 0;
      m.request_index[i] = 0;
      m.row_valid[i] = 0;
      m.window_slots[i] = m.state_slots4[i] = m.out_slots4[i] = -1;
      m.state_slots128[i] = m.out_slots128[i] = -1;
      continue;
    }
    const SimRequest& r = live[i];
    const int64_t pos = r.position();
    const int32_t row = r.table_row;
    m.positions[i] = pos;
    m.request_index[i] = row;
    m.row_valid[i] = 1;
    m.window_slots[i] = slot(window_table_, g_.window_table_width, row, pos, kWindowPage);
    m.state_slots4[i] = m.out_slots4[i] = m.state_slots128[i] = m.out_slots128[i] = -1;
    if (g_.n_c4) {
      m.state_slots4[i] = slot(state_table4_, g_.state_table_width4, row, pos, kStatePage4);
      if ((pos + 1) % 4 == 0)
        m.out_slots4[i] = slot(c4_table_, g_.c4_logical_pages, row, pos / 4, kC4Page);
    }
    if (g_.n_c128) {
      m.state_slots128[i] = slot(state_table128_, g_.state_table_width128, row, pos, kStatePage128);
      if ((pos + 1) % 128 == 0 && pos / 128 < g_.c128_width)
        m.out_slots128[i] = slot(c128_table_, g_.c128_logical_pages, row, pos / 128, kC128Page);
    }
  }
  be_.upload_async(meta_dev_block_, meta_stage_block_, meta_bytes_);
  if (g_.n_c4 && trace_.changed()) {  // rows moved or joined: restage every layer's top-k
    const int64_t K = g_.topk;
    for (int32_t c = 0; c < g_.n_c4; ++c) {
      int32_t* dst = topk_stage_ + static_cast<int64_t>(c) * B * K;
      std::fill(dst, dst + B * K, -1);
      for (size_t i = 0; i < live.size(); ++i) {
        const auto& store = topk_store_[live[i].table_row];
        std::copy(store.begin() + c * K, store.begin() + (c + 1) * K, dst + i * K);
      }
    }
    be_.upload_async(topk_dev_, topk_stage_, static_cast<size_t>(g_.n_c4 * B * K) * 4);
  }
}

DecodeParams Simulation::decode_params(const Layer& l, const SimPath& path) const {
  const int64_t B = g_.batch;
  DecodeParams p;
  p.num_tokens = B;
  p.num_heads = g_.heads;
  p.q = l.q;
  p.q_stride_token = int64_t{g_.heads} * 512;
  p.main_cache = {l.window.base, l.window.num_blocks, l.window.block_size, l.window.block_stride};
  p.main_list = {main_indices_, main_indptr_, B * kWindow, kWindow};
  p.has_extra = l.ratio != 0;
  if (p.has_extra) {
    p.extra_cache = {l.compressed.base, l.compressed.num_blocks, l.compressed.block_size,
                     l.compressed.block_stride};
    if (l.ratio == 4)
      p.extra_list = {l.extra_indices, l.extra_indptr, B * g_.topk, g_.topk};
    else
      p.extra_list = {c128_indices_, c128_indptr_, B * g_.c128_width, g_.c128_width};
    // Every extra row was written by this library's writers in sanitising mode.
    p.extra_cache_sanitised = !path.scrub_forced;
  }
  p.sink = l.sink;
  p.positions = meta_dev_.positions;
  p.rope = rope_of(l.ratio);
  p.out = l.out;
  p.out_stride_token = int64_t{g_.heads} * 512;
  p.path = path.path;
  p.stream = be_.stream();
  return p;
}

// S of every layer, chosen once (at capture) from the captured batch and the lists' dense widths
// (CONTRACT 4.4, 4.6); the adaptive rule of CONTRACT 4.5 where it applies.
void Simulation::plan_paths() {
  size_t ws = 0;
  plans_.reserve(cfg_.paths.size());
  for (const SimPath& path : cfg_.paths) {
    PathPlan plan;
    plan.path = path;
    for (const Layer& l : layers_) {
      DecodeParams p = decode_params(l, path);
      const char* why = nullptr;
      if (!decode_is_supported(p, &why)) {
        plan.skipped = true;
        plan.skip_reason = why != nullptr ? why : "unsupported";
        break;
      }
      const int32_t S = decode_num_splits(p);
      const int64_t base = std::max<int64_t>(1, g_.batch * plan_head_blocks(g_.heads));
      plan.splits.push_back(S);
      plan.adaptive.push_back(path.path == Path::CudaSm90 && l.ratio == 128 && base >= 16 && S > 4);
      ws = std::max(ws, decode_workspace_size(g_.batch, g_.heads, S));
    }
    if (plan.skipped) report("path " + path.name + " skipped: " + plan.skip_reason);
    plans_.push_back(std::move(plan));
  }
  workspace_bytes_ = ws;
  workspace_ = ws > 0 ? be_.alloc(ws) : nullptr;
}

void Simulation::enqueue_step(const PathPlan& plan) {
  const int64_t B = g_.batch;
  void* stream = be_.stream();
  const Path ops = ops_path();
  const Meta& m = meta_dev_;
  BuildCommon common;
  common.num_rows = B;  // every captured row is rewritten; padding rows get length 0
  common.row_valid = m.row_valid;
  common.path = ops;
  common.stream = stream;

  WindowListParams wl;
  wl.common = common;
  wl.positions = m.positions;
  wl.request_index = m.request_index;
  wl.block_table = window_table_dev_;
  wl.block_table_stride = g_.window_table_width;
  wl.table_width = static_cast<int32_t>(g_.window_table_width);
  wl.num_requests = B;
  wl.block_size = kWindowPage;
  wl.out = {main_indices_, main_indptr_, kWindow};
  build_window_lists(wl);
  if (g_.n_c128) {
    CompressedAllListParams cl;
    cl.common = common;
    cl.positions = m.positions;
    cl.request_index = m.request_index;
    cl.block_table = c128_table_dev_;
    cl.block_table_stride = g_.c128_logical_pages;
    cl.table_width = static_cast<int32_t>(g_.c128_logical_pages);
    cl.num_requests = B;
    cl.block_size = kC128Page;
    cl.ratio = 128;
    cl.max_compressed = g_.c128_width;
    cl.out = {c128_indices_, c128_indptr_, g_.c128_width};
    build_compressed_all_lists(cl);
  }

  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    WindowWriterParams w;
    w.num_tokens = B;
    w.kv = latent_;
    w.positions = m.positions;
    w.slots = m.window_slots;
    w.rope = rope_of(l.ratio);
    w.cache = l.window;
    w.sanitise = true;
    w.path = ops;
    w.stream = stream;
    write_window(w);
    if (l.ratio != 0) {
      const bool r4 = l.ratio == 4;
      const KindInputs& in = r4 ? in4_ : in128_;
      const int64_t W = state_width(l.ratio);
      StateWriterParams sw;
      sw.num_tokens = B;
      sw.ratio = l.ratio;
      sw.kv = in.kv;
      sw.kv_stride = W;
      sw.score = in.score;
      sw.score_stride = W;
      sw.ape = in.ape;
      sw.positions = m.positions;
      sw.state_slots = r4 ? m.state_slots4 : m.state_slots128;
      sw.state = l.state;
      sw.path = ops;
      sw.stream = stream;
      write_compressor_state(sw);
      CompressorParams c;
      c.num_tokens = B;
      c.ratio = l.ratio;
      c.positions = m.positions;
      c.request_index = m.request_index;
      c.state_slots = sw.state_slots;
      c.out_slots = r4 ? m.out_slots4 : m.out_slots128;
      c.state_block_table = r4 ? state_table4_dev_ : state_table128_dev_;
      c.state_table_stride = r4 ? g_.state_table_width4 : g_.state_table_width128;
      c.state_table_width = static_cast<int32_t>(c.state_table_stride);
      c.num_requests = B;
      c.state = l.state;
      c.norm_weight = in.norm_w;
      c.rope = rope_compressed_;
      c.cache = l.compressed;
      c.sanitise = true;
      c.path = ops;
      c.stream = stream;
      compress(c);
    }
    if (l.ratio == 4) {
      TopkListParams tl;
      tl.common = common;
      tl.topk = l.topk;
      tl.topk_stride = g_.topk;
      tl.request_index = m.request_index;
      tl.block_table = c4_table_dev_;
      tl.block_table_stride = g_.c4_logical_pages;
      tl.table_width = static_cast<int32_t>(g_.c4_logical_pages);
      tl.num_requests = B;
      tl.block_size = kC4Page;
      tl.out = {l.extra_indices, l.extra_indptr, g_.topk};
      build_topk_lists(tl);
    }
    DecodeParams p = decode_params(l, plan.path);
    p.num_splits = plan.splits[li];
    p.adaptive_splits = plan.adaptive[li] != 0;
    sparse_decode(p, workspace_, workspace_bytes_);
  }
}

// Host copy of the rows a list's first T rows reach, with the list remapped onto it: the
// reference then needs only those pages (an aliased pool can be gigabytes).
struct HostSlice {
  std::vector<int32_t> indptr, indices;
  std::vector<uint8_t> bytes;
  CacheView cache;
  IndexList list;
};

HostSlice host_slice(SimBackend& be, const MutableCacheView& c, const int32_t* indices,
                     const int32_t* indptr, int64_t T, int64_t width) {
  HostSlice s;
  s.indptr.resize(static_cast<size_t>(T + 1));
  be.download(s.indptr.data(), indptr, s.indptr.size() * 4);
  const int64_t n = s.indptr[T];
  s.indices.resize(static_cast<size_t>(std::max<int64_t>(n, 1)), -1);
  if (n > 0) be.download(s.indices.data(), indices, static_cast<size_t>(n) * 4);
  std::unordered_map<int64_t, int32_t> page_of;
  std::vector<int64_t> pages;
  for (int64_t i = 0; i < n; ++i) {
    int32_t& slot = s.indices[i];
    if (!slot_is_valid(slot, c.num_blocks, c.block_size)) {
      slot = -1;  // invalid stays invalid
      continue;
    }
    const int64_t page = slot / c.block_size;
    const auto [it, added] = page_of.emplace(page, static_cast<int32_t>(pages.size()));
    if (added) pages.push_back(page);
    slot = it->second * c.block_size + slot % c.block_size;
  }
  s.bytes.resize(static_cast<size_t>(std::max<int64_t>(1, pages.size()) * c.block_stride));
  for (size_t i = 0; i < pages.size(); ++i)
    be.download(s.bytes.data() + i * c.block_stride, c.base + pages[i] * c.block_stride,
                static_cast<size_t>(c.block_stride));
  s.cache = {s.bytes.data(), std::max<int64_t>(1, static_cast<int64_t>(pages.size())), c.block_size,
             c.block_stride};
  s.list = {s.indices.data(), s.indptr.data(), static_cast<int64_t>(s.indices.size()), width};
  return s;
}

SimCheck Simulation::verify(const Layer& l, const PathPlan& plan, int64_t step) {
  const int64_t T = std::min(cfg_.verify_rows, g_.batch);
  const int32_t H = g_.heads;
  const size_t elems = static_cast<size_t>(T) * H * 512;
  std::vector<bf16_bits> q(elems), out(elems);
  std::vector<float> sink(static_cast<size_t>(H));
  std::vector<int64_t> pos(static_cast<size_t>(T));
  be_.download(q.data(), l.q, elems * 2);
  be_.download(out.data(), l.out, elems * 2);
  be_.download(sink.data(), l.sink, sink.size() * 4);
  be_.download(pos.data(), meta_dev_.positions, pos.size() * 8);
  const HostSlice main = host_slice(be_, l.window, main_indices_, main_indptr_, T, kWindow);
  HostSlice extra;
  if (l.ratio == 4)
    extra = host_slice(be_, l.compressed, l.extra_indices, l.extra_indptr, T, g_.topk);
  if (l.ratio == 128)
    extra = host_slice(be_, l.compressed, c128_indices_, c128_indptr_, T, g_.c128_width);
  DecodeParams p;
  p.num_tokens = T;
  p.num_heads = H;
  p.q = q.data();
  p.q_stride_token = int64_t{H} * 512;
  p.main_cache = main.cache;
  p.main_list = main.list;
  p.has_extra = l.ratio != 0;
  if (p.has_extra) {
    p.extra_cache = extra.cache;
    p.extra_list = extra.list;
    p.extra_cache_sanitised = !plan.path.scrub_forced;
  }
  p.sink = sink.data();
  p.positions = pos.data();
  const std::vector<float>& rope = l.ratio == 0 ? rope_window_host_ : rope_compressed_host_;
  p.rope = {rope.data(), g_.max_len, 64};
  p.path = plan.path.path;  // the reference follows the kernel's scrub decisions
  std::vector<double> ref(elems), abs_mean(elems);
  sparse_decode_reference(p, ref.data(), nullptr, abs_mean.data());
  SimCheck c;
  c.path = plan.path.name;
  c.layer = l.id;
  c.ratio = l.ratio;
  c.step = step;
  c.rows = T;
  c.result =
      verify_decode_output(out.data(), T, H, int64_t{H} * 512, 512, ref.data(), abs_mean.data());
  return c;
}

SimResult Simulation::run() {
  const auto t0 = std::chrono::steady_clock::now();
  result_.batch = cfg_.batch;
  plan_memory();
  build_tables();
  allocate();
  report("filling caches through the window writer ...");
  fill_caches();
  topk_store_.resize(static_cast<size_t>(g_.batch));
  stage_step();
  plan_paths();
  for (size_t i = 0; i < plans_.size(); ++i) {
    if (plans_[i].skipped) continue;
    plans_[i].program = be_.record([this, i] { enqueue_step(plans_[i]); });
  }
  result_.setup_seconds = seconds_since(t0);
  char took[32];
  std::snprintf(took, sizeof(took), "%.2f s", result_.setup_seconds);
  report(std::string("setup done in ") + took + "; " +
         (be_.gpu() ? "one CUDA graph per path captured at B=" + std::to_string(g_.batch)
                    : std::string("CPU steps")));

  std::vector<size_t> active;
  std::string reasons;
  for (size_t i = 0; i < plans_.size(); ++i) {
    if (!plans_[i].skipped) active.push_back(i);
    if (plans_[i].skipped) reasons += "; " + plans_[i].path.name + ": " + plans_[i].skip_reason;
  }
  if (active.empty()) throw Error("serve-sim: no path can run here" + reasons);
  const int32_t total = cfg_.warmup + cfg_.steps;
  const int32_t every = std::max(1, total / 10);
  const auto t_run = std::chrono::steady_clock::now();
  for (int32_t step = 0; step < total; ++step) {
    if (step > 0) {
      trace_.advance();
      stage_step();
    }
    const int64_t live = static_cast<int64_t>(trace_.live().size());
    const bool check = step == 0 || step == total - 1;
    std::string line;
    for (size_t j = 0; j < active.size(); ++j) {  // rotate the order: no path always goes first
      PathPlan& plan = plans_[active[(static_cast<size_t>(step) + j) % active.size()]];
      const double s = plan.program->run();
      if (step >= cfg_.warmup) {
        plan.seconds.push_back(s);
        plan.tokens.push_back(live);
      }
      char buf[96];
      std::snprintf(buf, sizeof(buf), " %s %.3f ms", plan.path.name.c_str(), s * 1e3);
      line += buf;
      if (!check) continue;
      for (const Layer& l : layers_)
        if (l.verified) result_.checks.push_back(verify(l, plan, step));
    }
    if ((step + 1) % every == 0 || step + 1 == total)
      report("B=" + std::to_string(g_.batch) + " step " + std::to_string(step + 1) + "/" +
             std::to_string(total) + " (live " + std::to_string(live) + "):" + line);
  }
  result_.run_seconds = seconds_since(t_run);
  result_.finished_requests = trace_.finished();
  for (auto& plan : plans_) {
    SimPathResult r;
    r.path = plan.path;
    r.skipped = plan.skipped;
    r.skip_reason = plan.skip_reason;
    r.splits = plan.splits;
    r.adaptive = plan.adaptive;
    r.step_seconds = std::move(plan.seconds);
    r.step_tokens = std::move(plan.tokens);
    result_.paths.push_back(std::move(r));
  }
  plans_.clear();  // graphs go before the memory they name
  return std::move(result_);
}

// ---- CPU backend
// ----------------------------------------------------------------------------------

class CpuStepProgram : public StepProgram {
 public:
  explicit CpuStepProgram(std::function<void()> f) : f_(std::move(f)) {}
  double run() override {
    const auto t0 = std::chrono::steady_clock::now();
    f_();
    return seconds_since(t0);
  }

 private:
  std::function<void()> f_;
};

class CpuSimBackend : public SimBackend {
 public:
  ~CpuSimBackend() override {
    for (void* p : blocks_) std::free(p);
  }
  bool gpu() const override { return false; }
  std::string describe() const override {
    return "CPU (" + std::to_string(std::thread::hardware_concurrency()) + " hardware threads)";
  }
  double default_memory_budget() const override { return 4.0 * kGiB; }
  void* alloc(size_t bytes) override {
    const size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n);
    if (p == nullptr)
      throw Error("serve-sim: out of host memory (" + std::to_string(n) + " bytes)");
    std::memset(p, 0, n);
    blocks_.push_back(p);
    return p;
  }
  void* alloc_staging(size_t bytes) override { return alloc(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void upload_async(void* dst, const void* staging, size_t bytes) override {
    std::memcpy(dst, staging, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void* stream() override { return nullptr; }
  std::unique_ptr<StepProgram> record(std::function<void()> enqueue) override {
    return std::make_unique<CpuStepProgram>(std::move(enqueue));
  }

 private:
  std::vector<void*> blocks_;
};

}  // namespace

bool SimResult::verified_ok() const {
  return std::all_of(checks.begin(), checks.end(),
                     [](const SimCheck& c) { return c.result.passed; });
}

SimResult run_serve_sim(const SimConfig& cfg, SimBackend& backend) {
  Simulation sim(cfg, backend);
  return sim.run();
}

std::unique_ptr<SimBackend> make_cpu_sim_backend() {
  return std::make_unique<CpuSimBackend>();
}

#if !defined(SPARSEMLA_WITH_CUDA)
std::unique_ptr<SimBackend> make_cuda_sim_backend() {
  throw_arg_error("serve-sim", "--paths", "cpu (this build has no CUDA)", "a CUDA path");
}
#endif

}  // namespace sparsemla::tools
