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
// - The ratio-4 top-k: by default drawn when a request joins (distinct random compressed entries
//   it has completed) and fixed for its lifetime, uploaded before the step like the engine's other
//   step inputs; with --topk-source indexer (SimConfig::indexer) every step runs indexer_topk
//   (CONTRACT 11) inside the step, over synthetic indexer keys in the compressed pages' blocks.
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
#include "serve_sim_memory.h"

namespace sparsemla::tools {

namespace {

using namespace serve_sim_detail;

// The decode step of the simulation (staging the step's inputs, the paths' plans, enqueueing the
// step, timing, verification) on top of its memory (SimMemory, serve_sim_memory.h).
class Simulation : private SimMemory {
 public:
  Simulation(const SimConfig& cfg, SimBackend& be)
      : SimMemory(cfg, be),
        trace_(cfg.mix, cfg.batch, cfg.refill_delay, cfg.seed + static_cast<uint64_t>(cfg.batch)) {}

  SimResult run();

 private:
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

  void draw_topk(const SimRequest& r);
  IndexerParams indexer_params(const Layer& l) const;
  void stage_step();
  DecodeParams decode_params(const Layer& l, const SimPath& path) const;
  void plan_paths();
  void enqueue_step(const PathPlan& plan);
  SimCheck verify(const Layer& l, const PathPlan& plan, int64_t step);
  SimIndexerCheck verify_indexer(const Layer& l, const PathPlan& plan, int64_t step);

  RequestTrace trace_;
  std::vector<PathPlan> plans_;
};

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
  const bool drawn = g_.n_c4 && !g_.indexer;  // lists drawn on the host, not by the indexer
  for (const auto& r : live)
    if (r.fresh && drawn) draw_topk(r);
  auto slot = [](const std::vector<int32_t>& table, int64_t width, int32_t row, int64_t entry,
                 int32_t bs) -> int64_t {
    return int64_t{table[row * width + entry / bs]} * bs + entry % bs;
  };
  for (int64_t i = 0; i < B; ++i) {
    if (i >= static_cast<int64_t>(live.size())) {  // padding rows: nothing read or written
      m.positions[i] = 0;
      m.request_index[i] = 0;
      m.row_valid[i] = 0;
      m.row_request[i] = -1;
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
    m.row_request[i] = row;
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
  // n_t of CONTRACT 11.1 from the positions (padding rows sit at position 0: no candidates).
  if (g_.indexer) indexer_candidates_from_positions(m.positions, B, m.num_candidates);
  be_.upload_async(meta_dev_block_, meta_stage_block_, meta_bytes_);
  if (drawn && trace_.changed()) {  // rows moved or joined: restage every layer's top-k
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

// The indexer call of a ratio-4 layer (--topk-source indexer): its 64-head queries against the
// layer's indexer cache through the ratio-4 block table, the top-k into the layer's dense buffer
// that the ratio-4 builder reads. On the generic CUDA path whatever the decode path (the Hopper
// indexer path is not built).
IndexerParams Simulation::indexer_params(const Layer& l) const {
  IndexerParams p;
  p.num_tokens = g_.batch;
  p.num_heads = kIndexerHeads;
  p.q = l.iq;
  p.w = l.iw;
  p.cache = l.icache;
  p.block_table = c4_table_dev_;
  p.block_table_stride = g_.c4_logical_pages;
  p.block_table_width = static_cast<int32_t>(g_.c4_logical_pages);
  p.num_requests = g_.batch;
  p.row_request = meta_dev_.row_request;
  p.num_candidates = meta_dev_.num_candidates;
  p.topk = g_.topk;
  p.indices = l.topk;
  p.width = g_.topk;
  p.path = ops_path();
  p.stream = be_.stream();
  return p;
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
  if (g_.indexer) {  // the same shapes in every ratio-4 layer
    for (const Layer& l : layers_) {
      if (l.ratio != 4) continue;
      indexer_workspace_bytes_ = indexer_workspace_size(indexer_params(l));
      break;
    }
    if (indexer_workspace_bytes_ > 0) indexer_workspace_ = be_.alloc(indexer_workspace_bytes_);
  }
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
    if (l.ratio == 4 && g_.indexer) {
      indexer_topk(indexer_params(l), indexer_workspace_, indexer_workspace_bytes_);
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

// The device's indexer selection of the first rows against the CPU indexer on host copies of its
// inputs: the queries, weights, candidate counts and only the indexer pages those rows can read
// (remapped onto a compact host cache, as host_slice does for the decode).
SimIndexerCheck Simulation::verify_indexer(const Layer& l, const PathPlan& plan, int64_t step) {
  const int64_t T = std::min(cfg_.verify_rows, g_.batch), K = g_.topk;
  const int64_t Wt = g_.c4_logical_pages, stride = l.icache.block_stride;
  const int32_t ibs = l.icache.block_size;
  std::vector<int32_t> got(static_cast<size_t>(T * K)), rreq(static_cast<size_t>(T)),
      n(static_cast<size_t>(T));
  std::vector<uint8_t> q(static_cast<size_t>(T * kIndexerHeads * kIndexerHeadDim));
  std::vector<float> w(static_cast<size_t>(T * kIndexerHeads));
  be_.download(got.data(), l.topk, got.size() * 4);
  be_.download(rreq.data(), meta_dev_.row_request, rreq.size() * 4);
  be_.download(n.data(), meta_dev_.num_candidates, n.size() * 4);
  be_.download(q.data(), l.iq, q.size());
  be_.download(w.data(), l.iw, w.size() * 4);
  std::vector<int32_t> table(static_cast<size_t>(T * Wt), -1), host_req(static_cast<size_t>(T));
  std::unordered_map<int64_t, int32_t> compact;
  std::vector<uint8_t> pages;
  for (int64_t t = 0; t < T; ++t) {
    host_req[t] = rreq[t] >= 0 ? static_cast<int32_t>(t) : -1;
    if (rreq[t] < 0) continue;
    const int64_t used = std::min<int64_t>(ceil_div(std::max(n[t], 0), ibs), Wt);
    for (int64_t j = 0; j < used; ++j) {
      const int64_t phys = c4_table_[rreq[t] * Wt + j];
      auto [it, fresh] = compact.emplace(phys, static_cast<int32_t>(compact.size()));
      if (fresh) {
        pages.resize(pages.size() + static_cast<size_t>(stride));
        be_.download(pages.data() + pages.size() - stride, l.icache.base + phys * stride,
                     static_cast<size_t>(stride));
      }
      table[t * Wt + j] = it->second;
    }
  }
  std::vector<int32_t> want(got.size(), 0);
  IndexerParams p;
  p.num_tokens = T;
  p.num_heads = kIndexerHeads;
  p.q = q.data();
  p.w = w.data();
  if (pages.empty()) pages.assign(static_cast<size_t>(stride), 0);  // no row reads a page
  p.cache = {pages.data(), static_cast<int64_t>(pages.size()) / stride, ibs, stride,
             l.icache.layout};
  p.block_table = table.data();
  p.block_table_stride = Wt;
  p.block_table_width = static_cast<int32_t>(Wt);
  p.num_requests = T;
  p.row_request = host_req.data();
  p.num_candidates = n.data();
  p.topk = static_cast<int32_t>(K);
  p.indices = want.data();
  p.width = static_cast<int32_t>(K);
  p.path = Path::Cpu;
  indexer_topk(p);
  SimIndexerCheck c;
  c.path = plan.path.name;
  c.layer = l.id;
  c.step = step;
  c.rows = T;
  for (int64_t t = 0; t < T; ++t) {
    c.mismatched_rows +=
        !std::equal(got.begin() + t * K, got.begin() + (t + 1) * K, want.begin() + t * K);
  }
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
      for (const Layer& l : layers_) {
        if (!l.verified) continue;
        result_.checks.push_back(verify(l, plan, step));
        if (l.ratio == 4 && g_.indexer)
          result_.indexer_checks.push_back(verify_indexer(l, plan, step));
      }
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
                     [](const SimCheck& c) { return c.result.passed; }) &&
         std::all_of(indexer_checks.begin(), indexer_checks.end(),
                     [](const SimIndexerCheck& c) { return c.mismatched_rows == 0; });
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
