// sparsemla bench: the standard shapes of CONTRACT 10 on every requested path, one table, optional
// JSON. Numbers: median of `reps` timed calls (GPU: CUDA-graph replays with a cold L2), p10..p90
// spread, TFLOP/s (2*H*N*1024 per query row), GB/s (584 B per attended key + indices + q/out), and
// the fraction of the roofline floor max(bytes / 4.3 TB/s, flops / 790 TFLOP/s) measured on the
// H200 (GPU paths only). Every cell is verified against the float64 reference (computed once per
// shape, batch and scrub decision); a FAIL or a skipped cell makes the command exit with 3.
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_indexer_timer.h"
#include "bench_problem.h"
#include "bench_timer.h"
#include "cli_checks.h"
#include "commands.h"
#include "indexer_problem.h"
#include "indexer_verify.h"
#include "reference.h"
#include "runner.h"

namespace sparsemla::tools {

namespace {

constexpr double kPeakBytesPerSecond = 4.3e12;  // H200 device copy, measured
constexpr double kPeakFlops = 790e12;           // H200 dense bf16, measured

struct BenchOptions {
  std::vector<std::string> shapes;
  std::vector<int64_t> batches{1, 8, 32, 128};
  std::vector<std::string> paths;
  std::vector<int32_t> splits{0};  // S per cell; 0: the path's planner
  TimingOptions timing;
  int64_t verify_max_batch = std::numeric_limits<int64_t>::max();
  std::string data = kBenchDataNames[0];
  std::string json;
  uint64_t seed = 7;
  bool launch_floor = false;
  bool gather_only = false;
  bool mma_peak = false;
  // --op indexer (CONTRACT 11.9): contexts (n = context / 4), k, next_n, lengths varying 4x.
  std::string op = "decode";
  std::vector<int64_t> contexts{8192, 32768, 131072, 524288, 1048576};
  std::vector<int32_t> topks{512, 1024};
  std::vector<int32_t> mtps{1};
  bool vary = false;
  std::string grid;          // standard or product; empty: standard on a GPU without shapes
  int64_t verify_rows = 32;  // GPU cells: rows checked against the CPU backend (0: all)
  bool scores = false;       // the call also writes the selected scores
};

// Every path but cpu times a CUDA kernel (auto included: the CUDA path rule).
std::vector<Path> bench_paths(const BenchOptions& o) {
  std::vector<Path> paths;
  for (const auto& s : o.paths) {
    if (s != "cpu") require_cuda_device("bench", "--paths", s);
    paths.push_back(parse_path(s));
  }
  if (paths.empty()) paths = {Path::CudaGeneric, Path::CudaSm90};
  return paths;
}

// Without a GPU and without --paths: say so and time a short CPU table (the GPU defaults, 100
// reps of 4 batches x 10 shapes, take over 10 minutes on the CPU); options given explicitly win.
void default_to_short_cpu_table(BenchOptions& o, const CLI::App& cmd) {
  if (!o.paths.empty() || cuda_device_available()) return;
  auto unset = [&](const char* name) { return cmd.count(name) == 0; };
  o.paths = {"cpu"};
  if (unset("--batches")) o.batches = {1};
  if (unset("--reps")) o.timing.reps = 3;
  if (unset("--warmup")) o.timing.warmup = 0;
  std::fprintf(stderr,
               "bench: %s; timing a short CPU table instead (--paths cpu, batch 1, 3 reps unless "
               "given)\n",
               cuda_device_problem().c_str());
}

bool has_gpu_path(const std::vector<Path>& paths) {
  for (Path p : paths)
    if (p != Path::Cpu) return true;
  return false;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string verify_cell(const Problem& pb, const Timing& t, int64_t max_batch,
                        ReferenceStore& refs) {
  if (pb.config.batch > max_batch) return "-";
  const Reference& ref = refs.get(t.path);
  const VerifyResult v =
      verify_decode_output(t.out.data(), pb.tokens, pb.heads, int64_t{pb.heads} * 512, 512,
                           ref.out.data(), ref.abs_mean.data());
  if (!v.passed) {  // the table says FAIL; stderr says where
    std::fprintf(stderr, "verify %s B=%lld %s S=%d: %s\n", pb.kind.name.c_str(),
                 static_cast<long long>(pb.config.batch), path_name(t.path), t.splits,
                 v.summary().c_str());
  }
  return v.passed ? "PASS" : "FAIL";
}

// The roofline columns (floor_us, %floor) only where a GPU path is timed: the floor is the H200's.
void print_header(bool roofline) {
  std::printf("%-13s %4s %5s %8s %-12s %3s %10s %17s %8s %8s ", "shape", "H", "B", "keys/row",
              "path", "S", "median_us", "p10..p90_us", "TFLOP/s", "GB/s");
  if (roofline) std::printf("%9s %6s ", "floor_us", "%floor");
  std::printf("verify\n");
}

// Cells that did not give a PASS / unverified row, for the closing summary and the exit status.
struct CellTally {
  std::vector<std::string> failed;
  std::vector<std::string> skipped;
};

std::string cell_name(const BenchShape& shape, int64_t batch, Path path, int32_t splits) {
  return shape.name + " B=" + std::to_string(batch) + " " + path_name(path) +
         " S=" + std::to_string(splits);
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

// One cell (shape, batch, path, S): times it, prints its row, appends its JSON record and tallies
// it when skipped or failed.
void bench_cell(const BenchShape& shape, int64_t batch, const Problem& pb, Path path,
                int32_t splits, const BenchOptions& o, bool roofline, ReferenceStore& refs,
                nlohmann::json& results, CellTally& tally) {
  const double flops = pb.flops(), bytes = pb.bytes();
  const double floor_s = std::max(bytes / kPeakBytesPerSecond, flops / kPeakFlops);
  TimingOptions timing = o.timing;
  timing.splits = splits;
  Timing t;
  try {
    t = path == Path::Cpu ? time_decode_cpu(pb, timing) : time_decode_cuda(pb, path, timing);
  } catch (const Error& e) {
    std::printf("%-13s %4d %5lld %8s %-12s skipped: %s\n", shape.name.c_str(), shape.heads,
                static_cast<long long>(batch), "", path_name(path), e.what());
    tally.skipped.push_back(cell_name(shape, batch, path, splits));
    return;
  }
  const std::string verdict = verify_cell(pb, t, o.verify_max_batch, refs);
  const double med = t.median();
  const std::string shown =
      t.auto_path ? std::string("auto>") + path_name(t.path) : path_name(t.path);
  const bool gpu_cell = t.path != Path::Cpu;
  std::printf("%-13s %4d %5lld %8.1f %-12s %3d %10.2f %8.2f..%-8.2f %8.2f %8.1f ",
              shape.name.c_str(), shape.heads, static_cast<long long>(batch),
              static_cast<double>(pb.attended_keys) / pb.tokens, shown.c_str(), t.splits, med * 1e6,
              t.quantile(0.1) * 1e6, t.quantile(0.9) * 1e6, flops / med * 1e-12,
              bytes / med * 1e-9);
  if (roofline && gpu_cell) std::printf("%9.2f %5.1f%% ", floor_s * 1e6, 100.0 * floor_s / med);
  if (roofline && !gpu_cell) std::printf("%9s %6s ", "-", "-");
  std::printf("%s\n", verdict.c_str());
  std::fflush(stdout);
  nlohmann::json record = {{"shape", shape.name},
                           {"heads", shape.heads},
                           {"batch", batch},
                           {"mtp", shape.mtp},
                           {"data", o.data},
                           {"path", t.auto_path ? "auto" : path_name(t.path)},
                           {"ran", path_name(t.path)},
                           {"splits", t.splits},
                           {"median_us", med * 1e6},
                           {"p10_us", t.quantile(0.1) * 1e6},
                           {"p90_us", t.quantile(0.9) * 1e6},
                           {"tflops", flops / med * 1e-12},
                           {"gbps", bytes / med * 1e-9},
                           {"verify", verdict}};
  if (gpu_cell) {
    record["floor_us"] = floor_s * 1e6;
    record["floor_fraction"] = floor_s / med;
  }
  results.push_back(std::move(record));
  if (verdict == "FAIL") tally.failed.push_back(cell_name(shape, batch, t.path, t.splits));
}

// The closing summary on stderr; 0 when every cell ran and none failed, else 3.
int report_tally(const CellTally& tally) {
  if (!tally.failed.empty())
    std::fprintf(stderr, "bench: %zu cell(s) FAILED verification: %s\n", tally.failed.size(),
                 joined(tally.failed).c_str());
  if (!tally.skipped.empty())
    std::fprintf(stderr, "bench: %zu cell(s) skipped (not run): %s\n", tally.skipped.size(),
                 joined(tally.skipped).c_str());
  return tally.failed.empty() && tally.skipped.empty() ? 0 : 3;
}

// Per (shape, batch) timed with auto and both CUDA paths: auto's time over the faster path's (the
// path rule auto_prefers_sm90 in plan.h is kept within 3% of the best; docs/PERF.md, "Path rule").
void print_auto_vs_best(const nlohmann::json& results) {
  std::map<std::pair<std::string, int64_t>, std::map<std::string, std::pair<double, std::string>>>
      cells;
  for (const auto& r : results) {
    cells[{r["shape"].get<std::string>(), r["batch"].get<int64_t>()}][r["path"]] = {
        r["median_us"].get<double>(), r["ran"].get<std::string>()};
  }
  bool header = false;
  for (const auto& [key, paths] : cells) {
    const auto a = paths.find("auto"), g = paths.find("cuda-generic"), s = paths.find("cuda-sm90");
    if (a == paths.end() || g == paths.end() || s == paths.end()) continue;
    if (!header) std::printf("\nauto vs best (auto's median / the faster path's):\n");
    header = true;
    const bool sm90_best = s->second.first < g->second.first;
    const double best = sm90_best ? s->second.first : g->second.first;
    const double ratio = a->second.first / best;
    std::printf("auto vs best %-13s B=%-5lld auto>%-12s %8.2f us  best %-12s %8.2f us  %.3f%s\n",
                key.first.c_str(), static_cast<long long>(key.second), a->second.second.c_str(),
                a->second.first, sm90_best ? "cuda-sm90" : "cuda-generic", best, ratio,
                ratio > 1.03 ? "  OVER 3%" : "");
  }
}

// ---- --op indexer: the shapes of CONTRACT 11.9 --------------------------------------------------
// The CPU backend is timed with a steady clock around whole calls; a CUDA path by CUDA events
// around graph replays rotated over enough input sets that the 60 MB L2 cannot hold the keys
// (bench/bench_indexer_cuda.cpp). The memory floor is the 11.9 byte count (keys once per request,
// per-row q, w and output) at 4.3 TB/s, the H200's. CPU cells are checked structurally (the CPU is
// the reference); GPU cells against the CPU backend on the same bytes (indexer_verify.h).

// One cell of the indexer table: a problem shape (H = 64, pages of 64).
struct IndexerCell {
  int64_t context = 0;  // n = context / 4 candidates per request
  int64_t batch = 1;
  int32_t mtp = 1;
  int32_t topk = 512;
};

// The standard table (`--grid standard`, the default with a GPU and no shape option): the floor
// table of 11.9 (k 512, next_n 1; contexts 8K, 128K, 1M at B 1, 32, 128) and next_n 2 at 1M B 1
// and 128K B 32. 11 cells, about 8 GB of keys in all; a few minutes on an H200.
std::vector<IndexerCell> standard_indexer_cells() {
  std::vector<IndexerCell> cells;
  for (int64_t context : {8192, 131072, 1048576})
    for (int64_t batch : {1, 32, 128}) cells.push_back({context, batch, 1, 512});
  cells.push_back({1048576, 1, 2, 512});
  cells.push_back({131072, 32, 2, 512});
  return cells;
}

// `--grid product`: every combination of --contexts, --mtp, --topks, --batches.
std::vector<IndexerCell> product_indexer_cells(const BenchOptions& o) {
  std::vector<IndexerCell> cells;
  for (int64_t context : o.contexts)
    for (int32_t mtp : o.mtps)
      for (int32_t k : o.topks)
        for (int64_t batch : o.batches) cells.push_back({context, batch, mtp, k});
  return cells;
}

void indexer_defaults_for_cpu(BenchOptions& o, const CLI::App& cmd) {
  if (!o.paths.empty() || cuda_device_available()) return;
  auto unset = [&](const char* name) { return cmd.count(name) == 0; };
  o.paths = {"cpu"};
  if (unset("--contexts")) o.contexts = {8192, 32768};
  if (unset("--batches")) o.batches = {1};
  if (unset("--topks")) o.topks = {512};
  if (unset("--reps")) o.timing.reps = 3;
  if (unset("--warmup")) o.timing.warmup = 0;
  std::fprintf(stderr,
               "bench --op indexer: %s; timing a short CPU table instead (--paths cpu, contexts "
               "8192,32768, batch 1, k 512, 3 reps unless given)\n",
               cuda_device_problem().c_str());
}

// Which cells: --grid as given, else standard on a GPU without shape options, else the product.
std::vector<IndexerCell> indexer_cells(const BenchOptions& o, const CLI::App& cmd) {
  bool shape_given = false;
  for (const char* name : {"--contexts", "--batches", "--topks", "--mtp"})
    shape_given = shape_given || cmd.count(name) > 0;
  std::string grid = o.grid;
  if (grid.empty()) grid = shape_given || !cuda_device_available() ? "product" : "standard";
  if (grid == "standard" && shape_given) {
    throw_arg_error("bench", "--grid",
                    "product with --contexts, --batches, --topks or --mtp (standard has its own "
                    "cells)",
                    "standard");
  }
  return grid == "standard" ? standard_indexer_cells() : product_indexer_cells(o);
}

std::string indexer_cell_name(const IndexerCell& c) {
  return "ctx=" + std::to_string(c.context) + " B=" + std::to_string(c.batch) +
         " mtp=" + std::to_string(c.mtp) + " k=" + std::to_string(c.topk);
}

void print_indexer_header() {
  std::printf("%8s %7s %5s %3s %5s %-7s %-12s %10s %17s %8s %9s %9s %8s %9s %s\n", "context", "n",
              "B", "mtp", "k", "lengths", "path", "median_us", "p10..p90_us", "GB/s", "TFLOP/s",
              "floor_us", "%floor", "chain_us", "verify");
}

void print_indexer_prefix(const IndexerCell& c, bool vary, const std::string& path) {
  std::printf("%8lld %7lld %5lld %3d %5d %-7s %-12s ", static_cast<long long>(c.context),
              static_cast<long long>(c.context / 4), static_cast<long long>(c.batch), c.mtp, c.topk,
              vary ? "vary4x" : "uniform", path.c_str());
}

// What one timed cell reports (seconds sorted; chain empty when not timed).
struct IndexerCellResult {
  std::string path;
  std::vector<double> seconds, chain;
  int32_t sets = 1;
  int64_t verified_rows = 0;
  std::string verdict;
};

double sorted_quantile(const std::vector<double>& s, double q) {
  return s[static_cast<size_t>(q * static_cast<double>(s.size() - 1))];
}

// The table row (stdout) and the JSON record of a timed cell.
void report_indexer_cell(const IndexerCell& c, bool vary, const IndexerProblem& pb,
                         const IndexerCellResult& r, nlohmann::json& results) {
  const double med = r.seconds[r.seconds.size() / 2], floor_s = pb.floor_seconds();
  const double chain_med = r.chain.empty() ? 0.0 : r.chain[r.chain.size() / 2];
  print_indexer_prefix(c, vary, r.path);
  std::printf("%10.2f %8.2f..%-8.2f %8.1f %9.3f %9.2f %7.3f%% ", med * 1e6,
              sorted_quantile(r.seconds, 0.1) * 1e6, sorted_quantile(r.seconds, 0.9) * 1e6,
              pb.bytes() / med * 1e-9, pb.flops() / med * 1e-12, floor_s * 1e6,
              100.0 * floor_s / med);
  if (r.chain.empty()) std::printf("%9s ", "-");
  if (!r.chain.empty()) std::printf("%9.2f ", chain_med * 1e6);
  std::printf("%s\n", r.verdict.c_str());
  std::fflush(stdout);
  nlohmann::json record = {{"op", "indexer"},
                           {"context", c.context},
                           {"candidates", c.context / 4},
                           {"batch", c.batch},
                           {"mtp", c.mtp},
                           {"topk", c.topk},
                           {"heads", pb.config.heads},
                           {"lengths", vary ? "vary4x" : "uniform"},
                           {"scores", pb.config.scores},
                           {"path", r.path},
                           {"median_us", med * 1e6},
                           {"p10_us", sorted_quantile(r.seconds, 0.1) * 1e6},
                           {"p90_us", sorted_quantile(r.seconds, 0.9) * 1e6},
                           {"min_us", r.seconds.front() * 1e6},
                           {"max_us", r.seconds.back() * 1e6},
                           {"bytes", pb.bytes()},
                           {"gbps", pb.bytes() / med * 1e-9},
                           {"tflops", pb.flops() / med * 1e-12},
                           {"floor_us", floor_s * 1e6},
                           {"floor_fraction", floor_s / med},
                           {"input_sets", r.sets},
                           {"verified_rows", r.verified_rows},
                           {"verify", r.verdict}};
  if (!r.chain.empty()) {
    record["chain_median_us"] = chain_med * 1e6;
    record["chain_p10_us"] = sorted_quantile(r.chain, 0.1) * 1e6;
    record["chain_p90_us"] = sorted_quantile(r.chain, 0.9) * 1e6;
  }
  results.push_back(std::move(record));
}

// A CPU cell: steady-clock calls, the structural check of 11.7 on every row.
IndexerCellResult time_indexer_cpu_cell(IndexerProblem& pb, const TimingOptions& o) {
  const IndexerParams p = pb.params(Path::Cpu);
  for (int32_t i = 0; i < o.warmup; ++i) indexer_topk(p);
  IndexerCellResult r;
  r.path = "cpu";
  for (int32_t i = 0; i < o.reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    indexer_topk(p);
    r.seconds.push_back(seconds_since(t0));
  }
  std::sort(r.seconds.begin(), r.seconds.end());
  const std::string bad = check_indexer_output(pb);
  if (!bad.empty()) std::fprintf(stderr, "verify cpu: %s\n", bad.c_str());
  r.verified_rows = pb.tokens;
  r.verdict = bad.empty() ? "PASS" : "FAIL";
  return r;
}

// A GPU cell: timed on the device, then checked against the CPU backend (bit-identical for
// cuda-generic, the near-tie rule otherwise) unless the batch is above --verify-max-batch.
IndexerCellResult time_indexer_gpu_cell(IndexerProblem& pb, Path path, const BenchOptions& o,
                                        const std::string& name) {
  IndexerTiming t = time_indexer_cuda(pb, path, o.timing);
  IndexerCellResult r;
  r.path = path_name(path);
  r.seconds = std::move(t.call.seconds);
  r.chain = std::move(t.chain.seconds);
  r.sets = t.sets;
  std::fprintf(stderr, "[bench] %s %s: %d input set(s) of %.1f MB rotated\n", name.c_str(),
               path_name(path), t.sets, t.set_bytes * 1e-6);
  if (!t.chain_problem.empty())
    std::fprintf(stderr, "[bench] %s %s: chain not timed: %s\n", name.c_str(), path_name(path),
                 t.chain_problem.c_str());
  if (pb.config.batch > o.verify_max_batch) {
    r.verdict = "-";
    return r;
  }
  const IndexerCheck check =
      path == Path::CudaGeneric ? IndexerCheck::BitIdentical : IndexerCheck::NearTie;
  const IndexerVerdict v =
      verify_indexer_outputs(pb, t.out, check, o.verify_rows, [&](const std::string& msg) {
        std::fprintf(stderr, "[bench] %s %s: %s\n", name.c_str(), path_name(path), msg.c_str());
      });
  if (!v.problem.empty())
    std::fprintf(stderr, "verify %s %s: %s\n", name.c_str(), path_name(path), v.problem.c_str());
  r.verified_rows = v.rows;
  r.verdict = v.problem.empty() ? "PASS" : "FAIL";
  return r;
}

// One cell on every path: builds the problem once, times and checks each path.
void bench_indexer_cell(const IndexerCell& c, const std::vector<Path>& paths, const BenchOptions& o,
                        nlohmann::json& results, CellTally& tally) {
  IndexerProblemConfig cfg;
  cfg.batch = c.batch;
  cfg.candidates = c.context / 4;
  cfg.vary = o.vary;
  cfg.mtp = c.mtp;
  cfg.topk = c.topk;
  cfg.scores = o.scores;
  cfg.seed = o.seed;
  const std::string name = indexer_cell_name(c);
  const auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "[bench] %s: building indexer data ...\n", name.c_str());
  IndexerProblem pb = build_indexer_problem(cfg);
  std::fprintf(stderr, "[bench] %s: built in %.2f s (%.1f MB of keys)\n", name.c_str(),
               seconds_since(t0), static_cast<double>(pb.cache.size()) * 1e-6);
  for (Path path : paths) {
    IndexerCellResult r;
    try {
      r = path == Path::Cpu ? time_indexer_cpu_cell(pb, o.timing)
                            : time_indexer_gpu_cell(pb, path, o, name);
    } catch (const Error& e) {  // a path the library rejects: skipped, as the decode cells
      print_indexer_prefix(c, o.vary, path_name(path));
      std::printf("skipped: %s\n", e.what());
      std::fflush(stdout);
      tally.skipped.push_back(name + " " + path_name(path));
      continue;
    }
    report_indexer_cell(c, o.vary, pb, r, results);
    if (r.verdict == "FAIL") tally.failed.push_back(name + " " + path_name(path));
  }
}

int bench_indexer_main(BenchOptions& o, const CLI::App& cmd) {
  for (const char* decode_only :
       {"--launch-floor", "--gather-only", "--mma-peak", "--shapes", "--splits", "--data"}) {
    if (cmd.count(decode_only) > 0)
      throw_arg_error("bench", decode_only, "an option of --op decode", "--op indexer");
  }
  if (!o.json.empty()) check_output_file("bench", "--json", o.json);
  if (cmd.count("--batches") == 0) o.batches = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  // The rotation of input sets keeps the L2 cold (bench_indexer_timer.h); a flush on top only if
  // asked for.
  if (cmd.count("--flush-mb") == 0) o.timing.flush_bytes = 0;
  indexer_defaults_for_cpu(o, cmd);
  const std::vector<IndexerCell> cells = indexer_cells(o, cmd);
  const std::vector<Path> paths = bench_paths(o);
  nlohmann::json results = nlohmann::json::array();
  CellTally tally;
  print_indexer_header();
  for (const IndexerCell& c : cells) bench_indexer_cell(c, paths, o, results, tally);
  if (!o.json.empty()) write_output_file("bench", "--json", o.json, results.dump(2) + "\n");
  return report_tally(tally);
}

int bench_main(BenchOptions& o, const CLI::App& cmd) {
  if (o.op == "indexer") return bench_indexer_main(o, cmd);
  for (const char* indexer_only : {"--contexts", "--topks", "--mtp", "--vary-lengths", "--grid",
                                   "--verify-rows", "--scores"}) {
    if (cmd.count(indexer_only) > 0)
      throw_arg_error("bench", indexer_only, "an option of --op indexer", "--op decode");
  }
  // These time GPU kernels: a clear error before any work when there is no device to run them on.
  if (o.launch_floor && !cuda_device_available())
    throw_arg_error("bench", "--launch-floor", "a CUDA device", "none available");
  if (o.gather_only && !cuda_device_available())
    throw_arg_error("bench", "--gather-only", "a CUDA device", "none available");
  if (o.mma_peak && !cuda_device_available())
    throw_arg_error("bench", "--mma-peak", "a CUDA device", "none available");
  if (!o.json.empty()) check_output_file("bench", "--json", o.json);
  std::vector<BenchShape> shapes;
  if (o.shapes.empty()) shapes = standard_bench_shapes();
  for (const auto& n : o.shapes) shapes.push_back(bench_shape(n));
  default_to_short_cpu_table(o, cmd);
  if (o.launch_floor) print_launch_floor(o.timing);
  if (o.mma_peak) print_mma_peak(o.timing);
  const std::vector<Path> paths = bench_paths(o);
  const BenchData data = parse_bench_data(o.data);
  nlohmann::json results = nlohmann::json::array();
  const bool roofline = has_gpu_path(paths);
  print_header(roofline);
  CellTally tally;
  for (const auto& shape : shapes) {
    for (int64_t batch : o.batches) {
      // stderr, so the table on stdout stays one line per cell
      char tag[64];
      std::snprintf(tag, sizeof tag, "%s B=%lld", shape.name.c_str(),
                    static_cast<long long>(batch));
      const auto t0 = std::chrono::steady_clock::now();
      std::fprintf(stderr, "[bench] %s: building %s data ...\n", tag, o.data.c_str());
      const Problem pb = build_bench_problem(shape, batch, o.seed, data);
      std::fprintf(
          stderr, "[bench] %s: %s data built in %.2f s (%.0f MB of caches)\n", tag, o.data.c_str(),
          seconds_since(t0),
          static_cast<double>(pb.window_cache.bytes.size() + pb.compressed_cache.bytes.size()) *
              1e-6);
      ReferenceStore refs(pb, [&](const std::string& msg) {
        std::fprintf(stderr, "[bench] %s: %s\n", tag, msg.c_str());
      });
      if (o.gather_only) print_gather_only(shape.name, pb, o.timing);
      for (Path path : paths) {
        for (int32_t splits : o.splits) {
          bench_cell(shape, batch, pb, path, splits, o, roofline, refs, results, tally);
        }
      }
    }
  }
  print_auto_vs_best(results);
  if (!o.json.empty()) write_output_file("bench", "--json", o.json, results.dump(2) + "\n");
  return report_tally(tally);
}

}  // namespace

void register_bench(CLI::App& app) {
  static BenchOptions o;
  auto* cmd = app.add_subcommand("bench", "Time the decode at the standard shapes (CONTRACT 10)");
  cmd->add_option("--shapes", o.shapes, "shape names (default: all standard shapes)")
      ->delimiter(',');
  cmd->add_option("--batches", o.batches, "batch sizes")
      ->delimiter(',')
      ->check(integer_in(1, 4096));
  cmd->add_option("--paths", o.paths,
                  "paths: cpu, cuda-generic, cuda-sm90, auto (default: both CUDA paths if a "
                  "GPU is present, else a short cpu table; with auto and both CUDA paths an "
                  "'auto vs best' line per cell follows the table)")
      ->delimiter(',')
      ->check(CLI::IsMember({"cpu", "cuda-generic", "cuda-sm90", "auto"}));
  cmd->add_option("--splits", o.splits,
                  "split counts S to time (0: the path's planner; default 0), e.g. 0,4,8,16")
      ->delimiter(',')
      ->check(integer_in(0, 65535));  // the library rejects S > 32: that cell is skipped
  cmd->add_option("--reps", o.timing.reps, "timed calls per cell")->check(integer_in(1, 100000));
  cmd->add_option("--warmup", o.timing.warmup, "untimed calls first")->check(integer_in(0, 100000));
  cmd->add_option("--flush-mb", o.timing.flush_bytes, "bytes written before each GPU call (MiB)")
      ->transform(mebibytes_as_bytes(int64_t{1} << 20));
  cmd->add_flag("!--no-graph", o.timing.graph, "launch directly instead of replaying a CUDA graph");
  cmd->add_option("--data", o.data,
                  "cache data: real (default; as the incumbent's kit and real caches: random pad "
                  "bytes, rows drawn from large shared caches) or writer (the previous synthetic "
                  "data: compact caches, pad bytes 0, as this library's writers leave them)")
      ->check(CLI::IsMember({kBenchDataNames[0], kBenchDataNames[1]}));
  cmd->add_option("--verify-max-batch", o.verify_max_batch,
                  "verify against the float64 reference only up to this batch (default: every "
                  "batch; 0: none)")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
  cmd->add_flag("--launch-floor", o.launch_floor,
                "first print the launch floor: graphs of empty kernels timed like a cell");
  cmd->add_flag("--gather-only", o.gather_only,
                "before each shape and batch, print how fast its rows come back from memory alone "
                "(by index and in order), timed like a cell");
  cmd->add_flag("--mma-peak", o.mma_peak,
                "first print the mma.sync ceiling of the generic path's tensor work (registers "
                "only, and its Q.K block's ldmatrix pattern)");
  cmd->add_option("--op", o.op,
                  "operation: decode (default; CONTRACT 10 shapes) or indexer (the lightning "
                  "indexer, CONTRACT 11.9 shapes: H 64, pages of 64 placed at random)")
      ->check(CLI::IsMember({"decode", "indexer"}));
  cmd->add_option("--contexts", o.contexts,
                  "--op indexer: context tokens (n = context / 4 candidates per request; default "
                  "8192,32768,131072,524288,1048576)")
      ->delimiter(',')
      ->check(integer_in(4, int64_t{1} << 20));
  cmd->add_option("--topks", o.topks, "--op indexer: top-k widths k (default 512,1024)")
      ->delimiter(',')
      ->check(integer_in(1, 2048));
  cmd->add_option("--mtp", o.mtps, "--op indexer: query rows per request, next_n (default 1)")
      ->delimiter(',')
      ->check(integer_in(1, 8));
  cmd->add_flag("--vary-lengths", o.vary,
                "--op indexer: per-request lengths varying 4x (n/4 .. n) instead of uniform");
  cmd->add_option(
         "--grid", o.grid,
         "--op indexer: which cells; standard (the default on a GPU without --contexts, "
         "--batches, --topks or --mtp: k 512, next_n 1, contexts 8K/128K/1M at B 1/32/128, "
         "plus next_n 2 at 1M B 1 and 128K B 32) or product (every combination of those "
         "four options; the default otherwise)")
      ->check(CLI::IsMember({"standard", "product"}));
  cmd->add_option("--verify-rows", o.verify_rows,
                  "--op indexer: rows of a GPU cell checked against the CPU backend, spread over "
                  "the batch (default 32; 0: every row)")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
  cmd->add_flag("--scores", o.scores,
                "--op indexer: the call also writes the selected scores (+4*k bytes per row; "
                "checked too)");
  cmd->add_option("--json", o.json, "write all results as JSON to this file");
  cmd->add_option("--seed", o.seed, "random seed");
  cmd->callback([cmd] {
    const int rc = bench_main(o, *cmd);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace sparsemla::tools
