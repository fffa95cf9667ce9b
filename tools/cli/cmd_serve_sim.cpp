// sparsemla serve-sim: replays the attention part of whole DeepSeek-V4 decode steps as an engine
// runs them, on several paths in one process, and reports per path: attention time per step,
// attention tokens/s, P50/P90/P99 step latency and the ratio to the first path (table, JSON, PNG
// through scripts/plot-serve-sim). Every run checks a sample of layers against the float64
// reference (CONTRACT 9) and prints one verification line. docs/SERVE-SIM.md.
#include <sys/wait.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "runner.h"
#include "serve_sim.h"

#ifndef SPARSEMLA_SOURCE_DIR
#define SPARSEMLA_SOURCE_DIR "."
#endif

namespace sparsemla::tools {

namespace {

struct ServeSimOptions {
  std::string model = "flash";
  int32_t tp = 1;
  std::string mix = "8k1k";
  int64_t output_len = 0;
  std::string layers = "all";
  bool mtp_layer = false;
  std::vector<int64_t> batches{32};
  int32_t steps = 100;
  int32_t warmup = 5;
  int64_t refill_delay = 0;
  std::vector<std::string> paths;
  std::string path;
  std::string verify_layers = "auto";
  int64_t verify_rows = 8;
  double mem_gb = 0.0;
  std::string topk_source = "random";
  uint64_t seed = 1;
  std::string json;
  std::string plot;
  bool smoke = false;
  bool quiet = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct PathStats {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, tokens_per_s = 0;
};

PathStats path_stats(const SimPathResult& r) {
  PathStats s;
  if (r.step_seconds.empty()) return s;
  std::vector<double> t = r.step_seconds;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  auto rank = [&](double q) {  // nearest rank
    const size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
    return t[std::min(n - 1, k > 0 ? k - 1 : 0)];
  };
  const double total = std::accumulate(t.begin(), t.end(), 0.0);
  const double tokens = std::accumulate(r.step_tokens.begin(), r.step_tokens.end(), 0.0);
  s.mean = total / static_cast<double>(n);
  s.p50 = rank(0.50);
  s.p90 = rank(0.90);
  s.p99 = rank(0.99);
  s.tokens_per_s = total > 0 ? tokens / total : 0.0;
  return s;
}

// S of the first layer of each kind: "swa/c4/c128", '-' for a kind not in the slice.
std::string splits_cell(const SimConfig& cfg, const SimPathResult& r) {
  std::string cell;
  for (int32_t ratio : {0, 4, 128}) {
    std::string v = "-";
    for (size_t i = 0; i < cfg.layers.size() && i < r.splits.size(); ++i) {
      if (cfg.model.schedule[cfg.layers[i]] == ratio) {
        v = std::to_string(r.splits[i]);
        break;
      }
    }
    cell += (cell.empty() ? "" : "/") + v;
  }
  return cell;
}

std::string layer_summary(const SimConfig& cfg) {
  int counts[3] = {0, 0, 0};
  for (int32_t id : cfg.layers) {
    const int32_t r = cfg.model.schedule[id];
    ++counts[r == 0 ? 0 : (r == 4 ? 1 : 2)];
  }
  std::ostringstream s;
  s << cfg.layers.size() << " layers " << cfg.layers.front() << "-" << cfg.layers.back() << " ("
    << counts[0] << " swa, " << counts[1] << " c4, " << counts[2] << " c128)";
  return s.str();
}

void print_table_header() {
  std::printf("%5s  %-18s %-12s %9s %9s %9s %9s %9s %12s %7s\n", "B", "path", "S swa/c4/c128",
              "step_ms", "p50_ms", "p90_ms", "p99_ms", "us/layer", "attn_tok/s", "ratio");
}

void print_table_rows(const SimConfig& cfg, const SimResult& res) {
  double first = 0.0;
  for (const auto& r : res.paths) {
    if (r.skipped) {
      std::printf("%5lld  %-18s skipped: %s\n", static_cast<long long>(res.batch),
                  r.path.name.c_str(), r.skip_reason.c_str());
      continue;
    }
    const PathStats s = path_stats(r);
    if (first == 0.0) first = s.mean;
    std::printf("%5lld  %-18s %-12s %9.3f %9.3f %9.3f %9.3f %9.2f %12.0f %7.3f\n",
                static_cast<long long>(res.batch), r.path.name.c_str(), splits_cell(cfg, r).c_str(),
                s.mean * 1e3, s.p50 * 1e3, s.p90 * 1e3, s.p99 * 1e3,
                s.mean * 1e6 / static_cast<double>(cfg.layers.size()), s.tokens_per_s,
                s.mean / first);
  }
  std::fflush(stdout);
}

nlohmann::json run_json(const SimConfig& cfg, const SimResult& res) {
  nlohmann::json paths = nlohmann::json::array();
  double first = 0.0;
  for (const auto& r : res.paths) {
    nlohmann::json j = {{"path", r.path.name},
                        {"base_path", path_name(r.path.path)},
                        {"scrub_forced", r.path.scrub_forced},
                        {"skipped", r.skipped}};
    if (r.skipped) {
      j["skip_reason"] = r.skip_reason;
      paths.push_back(j);
      continue;
    }
    const PathStats s = path_stats(r);
    if (first == 0.0) first = s.mean;
    std::vector<double> ms;
    for (double x : r.step_seconds) ms.push_back(x * 1e3);
    j["splits"] = r.splits;
    j["adaptive"] = r.adaptive;
    j["splits_by_kind"] = splits_cell(cfg, r);
    j["mean_ms"] = s.mean * 1e3;
    j["p50_ms"] = s.p50 * 1e3;
    j["p90_ms"] = s.p90 * 1e3;
    j["p99_ms"] = s.p99 * 1e3;
    j["per_layer_us"] = s.mean * 1e6 / static_cast<double>(cfg.layers.size());
    j["tokens_per_s"] = s.tokens_per_s;
    j["ratio_to_first"] = s.mean / first;
    j["step_ms"] = ms;
    j["step_tokens"] = r.step_tokens;
    paths.push_back(j);
  }
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : res.checks) {
    checks.push_back({{"path", c.path},
                      {"layer", c.layer},
                      {"kind", layer_kind_label(c.ratio)},
                      {"step", c.step},
                      {"rows", c.rows},
                      {"passed", c.result.passed},
                      {"max_abs_error", c.result.max_abs_error},
                      {"max_bound_ratio", c.result.max_bound_ratio},
                      {"cosine_diff", c.result.cosine_diff},
                      {"summary", c.result.summary()}});
  }
  return {{"batch", res.batch},
          {"simulated", res.simulated},
          {"memory_estimate_bytes", res.device_bytes},
          {"c4_pool_entries", res.c4_pool_entries},
          {"c4_logical_entries", res.c4_logical_entries},
          {"c128_pool_entries", res.c128_pool_entries},
          {"c128_logical_entries", res.c128_logical_entries},
          {"finished_requests", res.finished_requests},
          {"setup_s", res.setup_seconds},
          {"run_s", res.run_seconds},
          {"paths", paths},
          {"checks", checks}};
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Draws the PNG with scripts/plot-serve-sim (the C++ tool does not draw); a PNG not drawn is an
// error like any other unwritten output.
void draw_plot(const std::string& json, const std::string& png) {
  const char* env = std::getenv("SPARSEMLA_PLOT_SCRIPT");
  const std::string script =
      env != nullptr ? env : std::string(SPARSEMLA_SOURCE_DIR) + "/scripts/plot-serve-sim";
  const std::string cmd =
      "python3 " + shell_quote(script) + " " + shell_quote(json) + " --out " + shell_quote(png);
  std::fflush(stdout);  // the script prints too
  const bool found = std::ifstream(script).good();
  const int status = found ? std::system(cmd.c_str()) : -1;
  if (status != 0) {
    // std::system returns a wait status: the script's own exit status is in its high byte
    const int exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : status;
    const std::string why = found ? script + " exited with status " + std::to_string(exit_status)
                                  : "no script " + script + " (SPARSEMLA_PLOT_SCRIPT names it)";
    throw_arg_error("serve-sim", "--plot", "a PNG drawn by scripts/plot-serve-sim",
                    png + " not drawn: " + why + "; the JSON is in " + json);
  }
  std::printf("plot: %s\n", png.c_str());
}

std::vector<int32_t> verify_layer_ids(const std::string& spec, const SimModel& model,
                                      const std::vector<int32_t>& layers) {
  std::vector<int32_t> ids;
  if (spec == "none") return ids;
  if (spec == "auto") {  // the first layer of each kind and the last layer of the slice
    for (int32_t ratio : {0, 4, 128}) {
      for (int32_t id : layers) {
        if (model.schedule[id] == ratio) {
          ids.push_back(id);
          break;
        }
      }
    }
    ids.push_back(layers.back());
  } else {
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
      int32_t id = -1;
      try {
        size_t used = 0;
        id = std::stoi(item, &used);
        if (used != item.size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      SPARSEMLA_CHECK_ARG(std::find(layers.begin(), layers.end(), id) != layers.end(), "serve-sim",
                          "--verify-layers", "auto, none or layer ids of the --layers slice", item);
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::string verification_line(const std::vector<SimResult>& results) {
  int64_t checks = 0, failed = 0, rows = 0;
  double worst_abs = 0.0, worst_ratio = 0.0, worst_cos = 0.0;
  std::set<std::string> paths;
  std::set<int32_t> layers;
  const SimCheck* first_bad = nullptr;
  for (const auto& res : results) {
    for (const auto& c : res.checks) {
      ++checks;
      rows = std::max(rows, c.rows);
      paths.insert(c.path);
      layers.insert(c.layer);
      worst_abs = std::max(worst_abs, c.result.max_abs_error);
      worst_ratio = std::max(worst_ratio, c.result.max_bound_ratio);
      worst_cos = std::max(worst_cos, c.result.cosine_diff);
      if (!c.result.passed) {
        ++failed;
        if (first_bad == nullptr) first_bad = &c;
      }
    }
  }
  int64_t indexer_checks = 0, indexer_bad = 0;
  for (const auto& res : results) {
    for (const auto& c : res.indexer_checks) {
      ++indexer_checks;
      indexer_bad += c.mismatched_rows != 0;
    }
  }
  std::ostringstream s;
  if (checks == 0) return "verify: SKIPPED (--verify-layers none)";
  s << "verify: " << (failed == 0 && indexer_bad == 0 ? "PASS" : "FAIL") << " (" << checks - failed
    << "/" << checks << " checks against the float64 reference: " << layers.size() << " layers x "
    << paths.size() << " paths x " << results.size() << " batches, first and last step, first "
    << rows << " rows; max abs err " << worst_abs << ", max err/bound " << worst_ratio
    << ", max cos diff " << worst_cos << ")";
  if (indexer_checks > 0) {
    s << "; indexer top-k: " << indexer_checks - indexer_bad << "/" << indexer_checks
      << " checks identical to the CPU indexer";
  }
  if (first_bad != nullptr)
    s << "; first failure: path " << first_bad->path << " layer " << first_bad->layer << " step "
      << first_bad->step << ": " << first_bad->result.summary();
  return s.str();
}

// 0 when every path ran at every batch and every check passed, else 3; skipped paths are named on
// stderr (the table rows say why).
int closing_status(const std::vector<SimResult>& results) {
  std::string skipped;
  bool verified = true;
  for (const auto& res : results) {
    verified = verified && res.verified_ok();
    for (const auto& r : res.paths)
      if (r.skipped)
        skipped += (skipped.empty() ? "" : ", ") + r.path.name + " B=" + std::to_string(res.batch);
  }
  if (!skipped.empty())
    std::fprintf(stderr, "serve-sim: path(s) skipped (not run): %s\n", skipped.c_str());
  return verified && skipped.empty() ? 0 : 3;
}

// --smoke: the CI preset (CPU, a 3-layer slice with one layer of each kind, small batches, short
// contexts, requests finishing and rows left empty); options given explicitly win.
void apply_smoke(ServeSimOptions& o, const CLI::App& cmd) {
  auto unset = [&](const char* name) { return cmd.count(name) == 0; };
  if (unset("--model")) o.model = "flash";
  if (unset("--tp")) o.tp = 8;
  if (unset("--layers")) o.layers = "1-3";
  if (unset("--batch")) o.batches = {2, 4};
  if (unset("--mix")) o.mix = "short";
  if (unset("--output-len")) o.output_len = 4;
  if (unset("--steps")) o.steps = 6;
  if (unset("--warmup")) o.warmup = 1;
  if (unset("--refill-delay")) o.refill_delay = 1;
  if (unset("--paths") && unset("--path")) o.paths = {"cpu", "cpu+scrub"};
  if (unset("--verify-rows")) o.verify_rows = 4;
  if (unset("--mem-gb")) o.mem_gb = 1.0;
}

int serve_sim_main(ServeSimOptions& o, const CLI::App& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](const std::string& msg) {
    if (!o.quiet) std::fprintf(stderr, "[serve-sim %7.2fs] %s\n", seconds_since(t0), msg.c_str());
  };
  if (o.smoke) apply_smoke(o, cmd);
  if (!o.path.empty()) o.paths.insert(o.paths.begin(), o.path);
  for (const auto& name : o.paths)
    if (names_cuda_path(name)) require_cuda_device("serve-sim", "--paths", name);
  // Before the simulation (minutes on a GPU sweep): an unwritable output fails at once.
  if (!o.json.empty()) check_output_file("serve-sim", "--json", o.json);
  if (!o.plot.empty()) {
    check_output_file("serve-sim", "--plot", o.plot);
    if (o.json.empty()) check_output_file("serve-sim", "--plot", o.plot + ".json");
  }
  if (o.paths.empty() && !cuda_device_available())
    progress("no --paths: " + cuda_device_problem() + ", simulating the cpu path");
  if (o.paths.empty()) {
    o.paths = cuda_device_available()
                  ? std::vector<std::string>{"cuda-generic", "cuda-sm90", "cuda-sm90+scrub"}
                  : std::vector<std::string>{"cpu"};
  }

  SimConfig cfg;
  cfg.model = sim_model(o.model, o.mtp_layer);
  SPARSEMLA_CHECK_ARG(
      o.tp >= 1 && cfg.model.total_heads % o.tp == 0, "serve-sim", "--tp",
      "a divisor of " + std::to_string(cfg.model.total_heads) + " (" + cfg.model.name + " heads)",
      o.tp);
  cfg.tp = o.tp;
  cfg.heads = cfg.model.total_heads / o.tp;
  cfg.layers = select_layers(cfg.model, o.layers);
  cfg.mix = context_mix(o.mix, o.output_len);
  cfg.steps = o.steps;
  cfg.warmup = o.warmup;
  cfg.refill_delay = o.refill_delay;
  cfg.verify_layers = verify_layer_ids(o.verify_layers, cfg.model, cfg.layers);
  cfg.verify_rows = o.verify_rows;
  SPARSEMLA_CHECK_ARG(o.mem_gb >= 0.0, "serve-sim", "--mem-gb", ">= 0 (0: automatic)", o.mem_gb);
  cfg.memory_budget = o.mem_gb * 1024.0 * 1024.0 * 1024.0;
  SPARSEMLA_CHECK_ARG(o.topk_source == "random" || o.topk_source == "indexer", "serve-sim",
                      "--topk-source", "random or indexer", o.topk_source);
  cfg.indexer = o.topk_source == "indexer";
  cfg.seed = o.seed;
  cfg.progress = progress;
  std::set<std::string> seen;
  int cpu_paths = 0;
  for (const auto& name : o.paths) {
    SPARSEMLA_CHECK_ARG(seen.insert(name).second, "serve-sim", "--paths", "distinct paths", name);
    cfg.paths.push_back(parse_sim_path(name));
    cpu_paths += cfg.paths.back().path == Path::Cpu;
  }
  SPARSEMLA_CHECK_ARG(cpu_paths == 0 || cpu_paths == static_cast<int>(cfg.paths.size()),
                      "serve-sim", "--paths",
                      "all cpu or all CUDA paths (one process runs on one backend)",
                      std::to_string(cpu_paths) + " cpu of " + std::to_string(cfg.paths.size()));
  const bool gpu = cpu_paths == 0;
  SPARSEMLA_CHECK_ARG(!o.batches.empty(), "serve-sim", "--batch", "at least one batch size",
                      "none");
  int64_t largest = 0;
  for (int64_t b : o.batches) {
    SPARSEMLA_CHECK_ARG(b >= 1 && b <= 4096, "serve-sim", "--batch", "values in 1..4096", b);
    largest = std::max(largest, b);
  }
  const int64_t rows = static_cast<int64_t>(cfg.layers.size()) * o.steps * largest;
  if (!gpu && !o.smoke && rows > 5000)
    progress("note: " + std::to_string(rows) + " layer-steps x rows on the CPU take a while; " +
             "--smoke is the small CPU preset");
  std::string device;
  {
    const auto probe = gpu ? make_cuda_sim_backend() : make_cpu_sim_backend();
    device = probe->describe();
  }
  std::printf(
      "serve-sim: %s TP%d (%d heads per GPU), %s, mix %s (prompts %lld..%lld%s, %lld output "
      "tokens), %d steps + %d warm-up, refill delay %lld, ratio-4 top-k %s, device %s\n",
      cfg.model.name.c_str(), cfg.tp, cfg.heads, layer_summary(cfg).c_str(), cfg.mix.name.c_str(),
      static_cast<long long>(cfg.mix.prompt_min), static_cast<long long>(cfg.mix.prompt_max),
      cfg.mix.log_uniform ? " log-uniform" : "", static_cast<long long>(cfg.mix.output_len),
      cfg.steps, cfg.warmup, static_cast<long long>(cfg.refill_delay),
      cfg.indexer ? "from the indexer" : "random", device.c_str());
  std::fflush(stdout);

  std::vector<SimResult> results;
  for (size_t bi = 0; bi < o.batches.size(); ++bi) {
    cfg.batch = o.batches[bi];
    progress("B=" + std::to_string(cfg.batch) + ": building " + std::to_string(cfg.layers.size()) +
             " layers ...");
    const auto backend = gpu ? make_cuda_sim_backend() : make_cpu_sim_backend();
    results.push_back(run_serve_sim(cfg, *backend));
    if (bi == 0) print_table_header();
    print_table_rows(cfg, results.back());
  }
  const std::string verdict = verification_line(results);
  std::printf("%s\n", verdict.c_str());

  std::string json_file = o.json;
  if (json_file.empty() && !o.plot.empty()) json_file = o.plot + ".json";
  if (!json_file.empty()) {
    nlohmann::json layers = nlohmann::json::array();
    for (int32_t id : cfg.layers)
      layers.push_back({{"id", id}, {"kind", layer_kind_label(cfg.model.schedule[id])}});
    std::vector<std::string> path_names;
    for (const auto& p : cfg.paths) path_names.push_back(p.name);
    nlohmann::json runs = nlohmann::json::array();
    bool ok = true;
    for (const auto& res : results) {
      runs.push_back(run_json(cfg, res));
      ok = ok && res.verified_ok();
    }
    const nlohmann::json j = {
        {"tool", "sparsemla serve-sim"},
        {"version", std::to_string(kVersionMajor) + "." + std::to_string(kVersionMinor) + "." +
                        std::to_string(kVersionPatch)},
        {"device", device},
        {"config",
         {{"model", cfg.model.name},
          {"tp", cfg.tp},
          {"heads", cfg.heads},
          {"layers", layers},
          {"mix",
           {{"name", cfg.mix.name},
            {"prompt_min", cfg.mix.prompt_min},
            {"prompt_max", cfg.mix.prompt_max},
            {"log_uniform", cfg.mix.log_uniform},
            {"output_len", cfg.mix.output_len}}},
          {"steps", cfg.steps},
          {"warmup", cfg.warmup},
          {"refill_delay", cfg.refill_delay},
          {"topk_source", o.topk_source},
          {"paths", path_names},
          {"verify_rows", cfg.verify_rows},
          {"seed", cfg.seed}}},
        {"runs", runs},
        {"verified", ok},
        {"verification", verdict}};
    write_output_file("serve-sim", o.json.empty() ? "--plot" : "--json", json_file,
                      j.dump(2) + "\n");
    progress("wrote " + json_file);
  }
  if (!o.plot.empty()) draw_plot(json_file, o.plot);
  return closing_status(results);
}

}  // namespace

void register_serve_sim(CLI::App& app) {
  static ServeSimOptions o;
  auto* cmd = app.add_subcommand(
      "serve-sim", "Replay the attention of whole DSV4 decode steps on several paths (A/B)");
  cmd->add_option("--model", o.model, "flash (64 heads) | pro (128 heads)");
  cmd->add_option("--tp", o.tp, "tensor parallelism: heads per GPU = model heads / TP")
      ->check(integer_in(1, 128));
  cmd->add_option("--mix", o.mix,
                  "context mix: 8k1k (8k prompts, 1k output), long (prompts log-uniform 8k..1M), "
                  "short, or LO-HI prompt range (4k-64k)");
  cmd->add_option("--output-len", o.output_len,
                  "tokens each request decodes before it is replaced (0: the mix's own)")
      ->check(integer_in(0, int64_t{1} << 20));
  cmd->add_option("--layers", o.layers, "all | N (first N layers) | A-B (0-based, inclusive)");
  cmd->add_flag("--mtp-layer", o.mtp_layer, "append the window-only MTP layer");
  cmd->add_option("--batch,--batches", o.batches,
                  "captured batch sizes, one simulation each (e.g. 1,8,32,128)")
      ->delimiter(',')
      ->check(integer_in(1, 4096));
  cmd->add_option("--steps", o.steps, "timed steps per path")->check(integer_in(1, 100000));
  cmd->add_option("--warmup", o.warmup, "untimed steps first")->check(integer_in(0, 10000));
  cmd->add_option("--refill-delay", o.refill_delay,
                  "steps a finished request's row stays empty (padding rows)")
      ->check(integer_in(0, 1000000));
  cmd->add_option("--paths", o.paths,
                  "paths, in report order: cpu, cuda-generic, cuda-sm90, each optionally +scrub "
                  "(extra_cache_sanitised=false). Default: cuda-generic,cuda-sm90,cuda-sm90+scrub "
                  "on a GPU, else cpu")
      ->delimiter(',');
  cmd->add_option("--path", o.path, "one more path (as --paths)");
  cmd->add_option("--verify-layers", o.verify_layers,
                  "auto (first layer of each kind + the last) | none | layer ids (1,2,3)");
  cmd->add_option("--verify-rows", o.verify_rows, "rows checked per layer")
      ->check(integer_in(1, 4096));
  cmd->add_option("--mem-gb", o.mem_gb,
                  "memory budget in GiB; compressed pools are aliased to fit (0: 85% of free GPU "
                  "memory, 4 GiB on the CPU)")
      ->check(number_in(0.0, 1e5));
  cmd->add_option("--topk-source", o.topk_source,
                  "random (ratio-4 top-k drawn when a request joins) | indexer (indexer_topk "
                  "every step, CONTRACT 11, over synthetic indexer keys)");
  cmd->add_option("--seed", o.seed, "random seed");
  cmd->add_option("--json", o.json, "write the results as JSON");
  cmd->add_option("--plot", o.plot,
                  "draw a PNG (latency distribution per path and batch) with "
                  "scripts/plot-serve-sim");
  cmd->add_flag("--smoke", o.smoke,
                "CI preset: cpu,cpu+scrub; flash TP8 layers 1-3; batches 2,4; short contexts");
  cmd->add_flag("--quiet", o.quiet, "no progress lines");
  cmd->callback([cmd] {
    const int rc = serve_sim_main(o, *cmd);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace sparsemla::tools
