// tools/serve_sim/serve_sim_memory.h: the serving simulation's memory, one of its two
// responsibilities: the geometry of every cache (rings, pools, the budget), the block tables, the
// per-layer buffers and the graph buffers of the lists, and filling the caches with model-like rows
// (serve_sim_memory.cpp). The other, the decode step with its timing and verification, is
// Simulation (serve_sim.cpp), which derives from SimMemory. Internal to serve-sim.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <unordered_set>
#include <vector>

#include "serve_sim.h"

namespace sparsemla::tools::serve_sim_detail {

constexpr int32_t kWindow = 128;
constexpr int32_t kWindowPage = 64;  // vLLM's window pages
// Pages of the window ring per request: positions pos-127..pos span at most 3 pages of 64, which
// are then distinct mod 3.
constexpr int32_t kWindowRing = 3;
constexpr int32_t kC4Page = 64;        // compressed entries per page, ratio 4
constexpr int32_t kC128Page = 2;       // ratio 128
constexpr int32_t kIndexerHeads = 64;  // DSV4's indexer heads (replicated under TP, CONTRACT 11.1)
// Indexer cache page of kC4Page entries (CONTRACT 2.2: 128 e4m3 bytes + an fp32 scale each), in the
// same blocks as the compressed pages (vLLM), so the ratio-4 block table serves both.
inline int64_t indexer_page_stride() {
  return int64_t{kC4Page} * (kIndexerHeadDim + 4);
}
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

// A random finite e4m3 byte (the NaN codes 0x7F / 0xFF moved to their neighbours).
inline uint8_t random_finite_e4m3(FastRng& rng) {
  const auto b = static_cast<uint8_t>(rng.below(256));
  return (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 1) : b;
}
inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
inline int64_t page_stride(int32_t bs) {
  return ceil_div(int64_t{bs} * Fp8DsMla::kBytesPerToken, Fp8DsMla::kEnginePageAlign) *
         Fp8DsMla::kEnginePageAlign;
}
inline int64_t state_width(int32_t ratio) {
  return (ratio == 4 ? 2 : 1) * 512;
}
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
inline std::string gib(double bytes) {
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
  int32_t* row_request = nullptr;     // [B] indexer: request_index, -1 on padding rows
  int32_t* num_candidates = nullptr;  // [B] indexer: (pos + 1) / 4 entries written (0: padding)
};

inline Meta carve_meta(uint8_t* base, int64_t batch, size_t* bytes) {
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
  m.row_request = reinterpret_cast<int32_t*>(take(b * 4));
  m.num_candidates = reinterpret_cast<int32_t*>(take(b * 4));
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
  int32_t n_out = 1;     // output buffers: one shared + one per verified layer
  bool indexer = false;  // ratio-4 layers also keep indexer caches, queries and weights
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
    const double page = double(page_stride(kC4Page)) + (indexer ? indexer_page_stride() : 0);
    return double(n_c4) * batch * pages * page;
  }
  double c128_pool_bytes(int64_t pages) const {
    return double(n_c128) * batch * pages * page_stride(kC128Page);
  }
  // Everything but the compressed pools (an upper bound: workspace for S = 32).
  double fixed_bytes() const {
    const double B = double(batch), qo = B * heads * 512 * 2;
    double b = layers() * (B * kWindowRing * page_stride(kWindowPage) + qo + heads * 4.0);
    b += n_c4 * (B * kStateRing4 * kStatePage4 * 2 * state_width(4) * 4.0 + B * topk * 8.0);
    if (indexer) b += n_c4 * B * kIndexerHeads * (kIndexerHeadDim + 4.0);  // queries, weights
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
inline std::vector<int64_t> distinct_sample(int64_t m, int64_t k, FastRng& rng) {
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

inline std::vector<int32_t> permutation(int64_t n, FastRng& rng) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(i + 1)]);
  return v;
}

class SimMemory {
 protected:
  SimMemory(const SimConfig& cfg, SimBackend& be)
      : cfg_(cfg),
        be_(be),
        rng_(cfg.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(cfg.batch)) {}

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
    IndexerCacheView icache;           // --topk-source indexer: the layer's indexer cache
    uint8_t* iq = nullptr;             // [B, 64, 128] e4m3 indexer queries
    float* iw = nullptr;               // [B, 64] head weights
    int32_t* extra_indices = nullptr;  // graph buffers of its top-k list (ratio 4)
    int32_t* extra_indptr = nullptr;
  };
  struct KindInputs {         // the new tokens' compressor inputs (model projections), per ratio
    float* kv = nullptr;      // [B, W]
    float* score = nullptr;   // [B, W]
    float* ape = nullptr;     // [r, W]
    float* norm_w = nullptr;  // [512]
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
  void fill_e4m3(uint8_t* dst, int64_t n);  // random finite e4m3 bytes
  void fill_indexer_cache(const IndexerCacheView& c);
  std::vector<bf16_bits> random_latents(int64_t n);  // CONTRACT 9.9 magnitudes, [n, 512]

  const SimConfig& cfg_;
  SimBackend& be_;
  FastRng rng_;
  Geometry g_;
  SimResult result_;

  std::vector<Layer> layers_;
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
  int32_t* topk_dev_ = nullptr;    // [n_c4, B, topk]
  int32_t* topk_stage_ = nullptr;  // drawn lists only (not with --topk-source indexer)
  std::vector<std::vector<int32_t>> topk_store_;  // per table row: [n_c4, topk]

  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* indexer_workspace_ = nullptr;  // indexer_workspace_size of the ratio-4 layers' call
  size_t indexer_workspace_bytes_ = 0;
};

}  // namespace sparsemla::tools::serve_sim_detail
