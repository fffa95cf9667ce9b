// tools/serve_sim/serve_sim.h: `sparsemla serve-sim`, the attention part of whole DeepSeek-V4
// decode steps replayed the way an engine runs them (docs/SERVE-SIM.md).
//
// One simulation = one model slice, one captured batch size and a list of paths. Every selected
// layer has its own caches (window cache; compressed cache and compressor state for ratio-4 and
// ratio-128 layers), sized for the batch; a population of requests decodes one token per step,
// finishes and is replaced. One step, per layer and in this order: window writer (the new token),
// state writer + compressor (ratio 4/128), list builders into persistent graph buffers, planner (at
// capture time), decode with the fused inverse RoPE. The paths run the same trace, alternating step
// by step; on CUDA each path's step is one CUDA graph captured at the batch size and replayed while
// lengths change.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fast_rng.h"
#include "sparsemla/sparsemla.h"

namespace sparsemla::tools {

// ---- model (CONTRACT 1) -------------------------------------------------------------------------

struct SimModel {
  std::string name;               // flash | pro
  int32_t total_heads = 0;        // query heads before tensor parallelism
  int32_t topk = 0;               // index top-k of ratio-4 layers
  std::vector<int32_t> schedule;  // compress ratio of every layer: 0 (window only), 4 or 128
};
// Throws sparsemla::Error naming --model for an unknown name.
SimModel sim_model(const std::string& name, bool with_mtp_layer);
// Layer ids of `spec`: "all", "N" (the first N layers) or "A-B" (layers A..B, 0-based, inclusive).
std::vector<int32_t> select_layers(const SimModel& model, const std::string& spec);
const char* layer_kind_label(int32_t ratio);  // swa | c4 | c128

// ---- request mix
// ----------------------------------------------------------------------------------

struct ContextMix {
  std::string name;
  int64_t prompt_min = 0;  // context before the first decoded token, drawn per request
  int64_t prompt_max = 0;
  bool log_uniform = false;  // prompt drawn log-uniformly (long mix), else uniformly
  int64_t output_len = 0;    // tokens a request decodes before it finishes and is replaced
  int64_t max_model_len() const { return prompt_max + output_len; }
};
// "8k1k", "long", "short" or "LO-HI" (prompt range, k/m suffixes: "4k-64k"); output_len > 0
// replaces the mix's own. Throws sparsemla::Error naming --mix / --output-len.
ContextMix context_mix(const std::string& name, int64_t output_len);

// ---- paths
// ----------------------------------------------------------------------------------------

struct SimPath {
  std::string name;           // as printed: "cuda-generic", "cuda-sm90+scrub", ...
  Path path = Path::Cpu;      // never Auto: an A/B names its paths
  bool scrub_forced = false;  // "+scrub": extra_cache_sanitised = false, so the provenance gate
                              // (CONTRACT 5) never skips the extra cache's NaN scrub
};
// "<path>" or "<path>+scrub" with <path> one of cpu, cuda-generic, cuda-sm90 (parse_path's names).
SimPath parse_sim_path(const std::string& name);

// ---- requests
// -------------------------------------------------------------------------------------

struct SimRequest {
  int64_t id = 0;
  int32_t table_row = 0;  // its row of every block table (pages are reused by its successor)
  int64_t prompt = 0;
  int64_t output = 0;
  int64_t generated = 0;
  bool fresh = true;  // created by the last advance (its indexer top-k must be drawn)
  int64_t position() const { return prompt + generated; }  // of the token decoded this step
};

// The live batch of an engine: rows 0..live-1 in arrival order (finished requests leave, new ones
// join at the end), at most max_batch of them.
class RequestTrace {
 public:
  RequestTrace(const ContextMix& mix, int64_t max_batch, int64_t refill_delay, uint64_t seed);
  const std::vector<SimRequest>& live() const { return live_; }
  // Every live request decodes one token; finished ones leave; a freed table row takes a new
  // request after refill_delay steps.
  void advance();
  bool changed() const { return changed_; }  // the live set or its order changed in advance()
  int64_t finished() const { return finished_; }

 private:
  SimRequest draw(int32_t row, bool mid_generation);
  ContextMix mix_;
  int64_t refill_delay_;
  std::vector<SimRequest> live_;
  std::vector<int64_t> idle_;  // per table row: -1 busy, else steps left before a refill
  FastRng rng_;
  int64_t next_id_ = 0;
  int64_t finished_ = 0;
  bool changed_ = true;
};

// ---- where a simulation runs
// ----------------------------------------------------------------------

// One recorded step, replayed: returns the seconds of the step alone (CUDA: events around the
// graph launch; CPU: the wall clock around the calls).
class StepProgram {
 public:
  virtual ~StepProgram() = default;
  virtual double run() = 0;
};

class SimBackend {
 public:
  virtual ~SimBackend() = default;
  virtual bool gpu() const = 0;
  virtual std::string describe() const = 0;
  virtual double default_memory_budget() const = 0;  // bytes
  virtual void* alloc(size_t bytes) = 0;             // where the paths run, zero-filled
  virtual void* alloc_staging(size_t bytes) = 0;     // host memory for per-step uploads
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;  // synchronous
  // Enqueued on the stream before the next step; `staging` comes from alloc_staging.
  virtual void upload_async(void* dst, const void* staging, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;  // waits for the stream
  virtual void* stream() = 0;
  // CUDA: runs `enqueue` once (warm-up), then captures it into one graph; CPU: keeps it.
  virtual std::unique_ptr<StepProgram> record(std::function<void()> enqueue) = 0;
};
std::unique_ptr<SimBackend> make_cpu_sim_backend();
// Throws sparsemla::Error in builds without CUDA or without a usable device.
std::unique_ptr<SimBackend> make_cuda_sim_backend();

// ---- one simulation
// -------------------------------------------------------------------------------

struct SimConfig {
  SimModel model;
  int32_t tp = 1;
  int32_t heads = 0;            // per GPU: total_heads / tp
  std::vector<int32_t> layers;  // selected layer ids
  ContextMix mix;
  int64_t batch = 1;  // captured batch = maximum live batch
  int32_t steps = 0;  // timed steps
  int32_t warmup = 0;
  int64_t refill_delay = 0;
  std::vector<SimPath> paths;
  std::vector<int32_t> verify_layers;  // ids among `layers`
  int64_t verify_rows = 8;             // first rows of the batch checked against the reference
  double memory_budget = 0.0;          // bytes; 0: the backend's default
  // Ratio-4 top-k from the lightning indexer (CONTRACT 11: indexer_topk every step inside the
  // step's graph, over synthetic indexer keys and queries) instead of lists drawn at random when a
  // request joins.
  bool indexer = false;
  uint64_t seed = 1;
  std::function<void(const std::string&)> progress;  // may be empty
};

struct SimPathResult {
  SimPath path;
  bool skipped = false;
  std::string skip_reason;
  std::vector<int32_t> splits;       // S of every selected layer (planner, at capture)
  std::vector<double> step_seconds;  // timed steps, in step order
  std::vector<int64_t> step_tokens;  // live query tokens of each timed step
  std::vector<int32_t> adaptive;     // 1 where the layer runs the CONTRACT 4.5 rule
};

struct SimCheck {
  std::string path;
  int32_t layer = 0;
  int32_t ratio = 0;
  int64_t step = 0;
  int64_t rows = 0;
  VerifyResult result;
};

// --topk-source indexer: the step's ratio-4 top-k of the first rows against the CPU indexer run on
// host copies of the same inputs (the generic CUDA indexer is bit-identical to it,
// docs/INDEXER.md).
struct SimIndexerCheck {
  std::string path;
  int32_t layer = 0;
  int64_t step = 0;
  int64_t rows = 0;
  int64_t mismatched_rows = 0;  // rows whose selection differs
};

struct SimResult {
  int64_t batch = 0;
  std::vector<SimPathResult> paths;
  std::vector<SimCheck> checks;
  std::vector<SimIndexerCheck> indexer_checks;
  std::vector<std::string> simulated;  // what was allocated and aliased, one line each
  double device_bytes = 0.0;
  int64_t c4_pool_entries = 0;     // physical compressed entries per request, ratio 4
  int64_t c4_logical_entries = 0;  // entries the longest request can reach
  int64_t c128_pool_entries = 0;
  int64_t c128_logical_entries = 0;
  int64_t finished_requests = 0;
  double setup_seconds = 0.0;
  double run_seconds = 0.0;
  bool verified_ok() const;
};

SimResult run_serve_sim(const SimConfig& cfg, SimBackend& backend);

}  // namespace sparsemla::tools
