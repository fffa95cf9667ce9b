// sparsemla run: the main job. Builds a realistic DSV4 decode problem for one layer kind through
// the writers and list builders, plans splits, runs the decode on the chosen backend, checks it
// against the float64 reference and prints one table row per run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "problem.h"
#include "reference.h"
#include "runner.h"

namespace sparsemla::tools {

namespace {

struct RunOptions {
  ProblemConfig problem = [] {
    ProblemConfig c;
    c.topk_source = "indexer";  // run: ratio-4 lists from the lightning indexer (CONTRACT 11)
    return c;
  }();
  std::string path = "auto";
  int32_t splits = 0;
  int32_t repeat = 3;
  std::string json;
  bool quiet = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void print_header() {
  std::printf("%-10s %5s %5s %4s %9s %-12s %3s %10s %9s %9s %10s %9s %10s %s\n", "layer", "B", "T",
              "H", "keys/row", "path", "S", "time(ms)", "GFLOP/s", "GB/s", "max_err", "err/bound",
              "cos_diff", "verdict");
}

void print_row(const Problem& pb, const DecodeRun& r, const VerifyResult& v) {
  const double keys_per_row =
      static_cast<double>(pb.attended_keys) / static_cast<double>(pb.tokens);
  std::printf("%-10s %5lld %5lld %4d %9.1f %-12s %3d %10.4f %9.2f %9.2f %10.3g %9.3f %10.3g %s\n",
              pb.kind.name.c_str(), static_cast<long long>(pb.config.batch),
              static_cast<long long>(pb.tokens), pb.heads, keys_per_row, path_name(r.path),
              r.splits, r.median_seconds * 1e3, pb.flops() / r.median_seconds * 1e-9,
              pb.bytes() / r.median_seconds * 1e-9, v.max_abs_error, v.max_bound_ratio,
              v.cosine_diff, v.passed ? "PASS" : "FAIL");
}

void write_json(const std::string& file, const Problem& pb, const DecodeRun& r,
                const VerifyResult& v) {
  nlohmann::json j = {{"layer", pb.kind.name},
                      {"batch", pb.config.batch},
                      {"tokens", pb.tokens},
                      {"heads", pb.heads},
                      {"mtp", pb.config.mtp},
                      {"context", pb.config.context},
                      {"attended_keys", pb.attended_keys},
                      {"path", path_name(r.path)},
                      {"splits", r.splits},
                      {"median_ms", r.median_seconds * 1e3},
                      {"min_ms", r.min_seconds * 1e3},
                      {"max_ms", r.max_seconds * 1e3},
                      {"gflops", pb.flops() / r.median_seconds * 1e-9},
                      {"gbps", pb.bytes() / r.median_seconds * 1e-9},
                      {"max_abs_error", v.max_abs_error},
                      {"max_bound_ratio", v.max_bound_ratio},
                      {"cosine_diff", v.cosine_diff},
                      {"passed", v.passed}};
  if (pb.indexer_seconds > 0) {
    j["indexer_ms"] = pb.indexer_seconds * 1e3;
    j["indexer_candidates"] = pb.indexer_candidates;
    j["topk_source"] = "indexer";
  }
  write_output_file("run", "--json", file, j.dump(2) + "\n");
}

int run_main(const RunOptions& o) {
  // Before the build (minutes at long contexts): a bad --json or a missing GPU fails at once.
  if (!o.json.empty()) check_output_file("run", "--json", o.json);
  if (names_cuda_path(o.path)) require_cuda_device("run", "--path", o.path);
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](const std::string& msg) {
    if (!o.quiet) std::fprintf(stderr, "[run %7.2fs] %s\n", seconds_since(t0), msg.c_str());
  };
  if (o.path == "auto" && !cuda_device_available())
    progress("--path auto: " + cuda_device_problem() + ", running on the CPU");
  ProblemConfig cfg = o.problem;
  cfg.progress = progress;
  const Problem pb = build_problem(cfg);
  const DecodeRun r = run_decode(pb, parse_path(o.path), o.splits, o.repeat, progress);
  progress("reference (float64) ...");
  const Reference ref = compute_reference(pb, r.path, progress);  // the kernel's scrub decisions
  const VerifyResult v =
      verify_decode_output(r.out.data(), pb.tokens, pb.heads, int64_t{pb.heads} * 512, 512,
                           ref.out.data(), ref.abs_mean.data());
  progress("verify: " + v.summary());
  print_header();
  print_row(pb, r, v);
  // The indexer step of a ratio-4 layer, its own line: CPU time, and bytes per CONTRACT 11.9 (132
  // per candidate, read once per request).
  if (pb.indexer_seconds > 0) {
    std::printf(
        "%-10s %5lld %5lld %4d %9.1f %-12s %3s %10.4f %9s %9.2f  (indexer step, CPU; "
        "candidates/row, k = %d)\n",
        "indexer", static_cast<long long>(pb.config.batch), static_cast<long long>(pb.tokens), 64,
        static_cast<double>(pb.indexer_candidates) / static_cast<double>(pb.tokens), "cpu", "-",
        pb.indexer_seconds * 1e3, "-",
        132.0 * static_cast<double>(pb.indexer_candidates) / pb.config.mtp / pb.indexer_seconds *
            1e-9,
        pb.kind.topk);
  }
  if (!o.json.empty()) write_json(o.json, pb, r, v);
  return v.passed ? 0 : 3;
}

}  // namespace

void register_run(CLI::App& app) {
  static RunOptions o;
  auto* cmd = app.add_subcommand("run", "Build a DSV4 decode problem, run it, verify it");
  cmd->add_option("--layer", o.problem.layer, "layer kind: " + layer_kind_names());
  cmd->add_option("--batch", o.problem.batch, "requests")->check(integer_in(1, 4096));
  // DSV4's longest context: 1,048,576 tokens (8192 ratio-128 entries)
  cmd->add_option("--context", o.problem.context, "context tokens per request (jittered by 1/8)")
      ->check(integer_in(1, int64_t{1} << 20));
  cmd->add_option("--heads", o.problem.heads,
                  "query heads (0: the layer's own; TP shards: 8/16/32)")
      ->check(integer_in(0, 128));
  cmd->add_option("--mtp", o.problem.mtp, "query tokens per request")->check(integer_in(1, 8));
  cmd->add_option("--seed", o.problem.seed, "random seed");
  cmd->add_option("--path", o.path, "auto | cpu | cuda-generic | cuda-sm90")
      ->check(CLI::IsMember({"auto", "cpu", "cuda-generic", "cuda-sm90"}));
  cmd->add_option("--topk-source", o.problem.topk_source,
                  "ratio-4 top-k lists: indexer (default: the lightning indexer on the CPU over "
                  "random keys, timed on its own line) or random (distinct random entries)")
      ->check(CLI::IsMember({"indexer", "random"}));
  cmd->add_option("--splits", o.splits, "split count (0: planner)")->check(integer_in(0, 32));
  cmd->add_option("--repeat", o.repeat, "timed repetitions (median reported)")
      ->check(integer_in(1, 1000));
  cmd->add_option("--json", o.json, "also write the result as JSON to this file");
  cmd->add_flag("--quiet", o.quiet, "no progress lines");
  cmd->callback([] {
    const int rc = run_main(o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace sparsemla::tools
