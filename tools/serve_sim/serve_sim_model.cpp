// serve-sim: the DSV4 layer schedules, request mixes, path names and the request trace.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "serve_sim.h"

namespace sparsemla::tools {

namespace {

constexpr int64_t kMaxContext = int64_t{1} << 20;  // CONTRACT 1: 1,048,576 tokens

// "8192", "8k", "1m" -> tokens; -1 when not a number.
int64_t parse_tokens(std::string s) {
  if (s.empty()) return -1;
  int64_t mult = 1;
  const char last = static_cast<char>(std::tolower(static_cast<unsigned char>(s.back())));
  if (last == 'k') mult = 1024;
  if (last == 'm') mult = int64_t{1} << 20;
  if (mult != 1) s.pop_back();
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), ::isdigit)) return -1;
  return std::stoll(s) * mult;
}

}  // namespace

// CONTRACT 1 gives the counts (Flash: 2 window-only, 21 ratio-4, 20 ratio-128; Pro: 0 / 30 / 31,
// each + one window-only MTP layer). The order is the published Flash config's (two window-only
// layers, then ratio 4 and 128 alternating, starting with 4); for Pro we assume the same pattern
// with its first two layers ratio 128. The order changes no timing, only which layers a slice
// takes.
SimModel sim_model(const std::string& name, bool with_mtp_layer) {
  SimModel m;
  m.name = name;
  if (name == "flash") {
    m.total_heads = 64;
    m.topk = 512;
    m.schedule = {0, 0};
    for (int i = 0; i < 41; ++i) m.schedule.push_back(i % 2 == 0 ? 4 : 128);
  } else if (name == "pro") {
    m.total_heads = 128;
    m.topk = 1024;
    m.schedule = {128, 128};
    for (int i = 0; i < 59; ++i) m.schedule.push_back(i % 2 == 0 ? 4 : 128);
  } else {
    throw_arg_error("serve-sim", "--model", "flash or pro", name);
  }
  if (with_mtp_layer) m.schedule.push_back(0);
  return m;
}

std::vector<int32_t> select_layers(const SimModel& model, const std::string& spec) {
  const int64_t n = static_cast<int64_t>(model.schedule.size());
  const std::string expected = "all, N (the first N layers, 1.." + std::to_string(n) +
                               ") or A-B (0-based, inclusive, B < " + std::to_string(n) + ")";
  int64_t first = 0, last = n - 1;
  const size_t dash = spec.find('-');
  if (spec == "all") {
  } else if (dash == std::string::npos) {
    const int64_t count = parse_tokens(spec);
    SPARSEMLA_CHECK_ARG(count >= 1 && count <= n && std::isdigit(spec.back()), "serve-sim",
                        "--layers", expected, spec);
    last = count - 1;
  } else {
    const std::string a = spec.substr(0, dash), b = spec.substr(dash + 1);
    first = parse_tokens(a);
    last = parse_tokens(b);
    const bool digits =
        !a.empty() && !b.empty() && std::isdigit(a.back()) && std::isdigit(b.back());
    SPARSEMLA_CHECK_ARG(digits && first >= 0 && last >= first && last < n, "serve-sim", "--layers",
                        expected, spec);
  }
  std::vector<int32_t> ids;
  for (int64_t i = first; i <= last; ++i) ids.push_back(static_cast<int32_t>(i));
  return ids;
}

const char* layer_kind_label(int32_t ratio) {
  return ratio == 0 ? "swa" : (ratio == 4 ? "c4" : "c128");
}

ContextMix context_mix(const std::string& name, int64_t output_len) {
  ContextMix m;
  m.name = name;
  if (name == "8k1k") {  // 8k prompts decoding 1k tokens: contexts spread over 8k..9k
    m.prompt_min = m.prompt_max = 8192;
    m.output_len = 1024;
  } else if (name == "long") {  // long-context serving: prompts log-uniform over 8k..1M
    m.prompt_min = 8192;
    m.output_len = 1024;
    m.prompt_max = kMaxContext - m.output_len;
    m.log_uniform = true;
  } else if (name == "short") {  // CI smoke: a few hundred tokens
    m.prompt_min = 256;
    m.prompt_max = 768;
    m.output_len = 64;
  } else {
    const size_t dash = name.find('-');
    const std::string expected = "8k1k, long, short or LO-HI (prompt tokens, e.g. 4k-64k)";
    SPARSEMLA_CHECK_ARG(dash != std::string::npos, "serve-sim", "--mix", expected, name);
    m.prompt_min = parse_tokens(name.substr(0, dash));
    m.prompt_max = parse_tokens(name.substr(dash + 1));
    SPARSEMLA_CHECK_ARG(m.prompt_min >= 1 && m.prompt_max >= m.prompt_min, "serve-sim", "--mix",
                        expected, name);
    m.output_len = 1024;
  }
  if (output_len > 0) m.output_len = output_len;
  SPARSEMLA_CHECK_ARG(output_len >= 0, "serve-sim", "--output-len", ">= 0 (0: the mix's own)",
                      output_len);
  SPARSEMLA_CHECK_ARG(m.max_model_len() <= kMaxContext, "serve-sim", "--mix/--output-len",
                      "longest prompt + output <= 1048576 (the DSV4 context)",
                      std::to_string(m.prompt_max) + " + " + std::to_string(m.output_len));
  return m;
}

SimPath parse_sim_path(const std::string& name) {
  SimPath p;
  p.name = name;
  std::string base = name;
  const size_t plus = name.find('+');
  if (plus != std::string::npos) {
    SPARSEMLA_CHECK_ARG(name.substr(plus + 1) == "scrub", "serve-sim", "--paths",
                        "<path> or <path>+scrub", name);
    base = name.substr(0, plus);
    p.scrub_forced = true;
  }
  p.path = parse_path(base);
  SPARSEMLA_CHECK_ARG(p.path != Path::Auto, "serve-sim", "--paths",
                      "a named path (cpu, cuda-generic, cuda-sm90), not auto", name);
  return p;
}

RequestTrace::RequestTrace(const ContextMix& mix, int64_t max_batch, int64_t refill_delay,
                           uint64_t seed)
    : mix_(mix),
      refill_delay_(refill_delay),
      idle_(static_cast<size_t>(max_batch), -1),
      rng_(seed) {
  // The first population is caught mid-generation, so contexts spread over the whole mix.
  for (int64_t row = 0; row < max_batch; ++row)
    live_.push_back(draw(static_cast<int32_t>(row), /*mid_generation=*/true));
}

SimRequest RequestTrace::draw(int32_t row, bool mid_generation) {
  SimRequest r;
  r.id = next_id_++;
  r.table_row = row;
  const double lo = static_cast<double>(mix_.prompt_min), hi = static_cast<double>(mix_.prompt_max);
  if (mix_.log_uniform)
    r.prompt =
        std::llround(std::exp(std::log(lo) + rng_.uniform() * (std::log(hi) - std::log(lo))));
  else
    r.prompt = mix_.prompt_min + rng_.below(mix_.prompt_max - mix_.prompt_min + 1);
  r.prompt = std::clamp(r.prompt, mix_.prompt_min, mix_.prompt_max);
  r.output = mix_.output_len;
  r.generated = mid_generation ? rng_.below(mix_.output_len) : 0;
  r.fresh = true;
  return r;
}

void RequestTrace::advance() {
  changed_ = false;
  std::vector<SimRequest> next;
  for (SimRequest r : live_) {
    r.fresh = false;
    if (++r.generated < r.output) {
      next.push_back(r);
      continue;
    }
    ++finished_;
    idle_[r.table_row] = refill_delay_;
    changed_ = true;
  }
  for (size_t row = 0; row < idle_.size(); ++row) {
    if (idle_[row] < 0) continue;
    if (idle_[row] == 0) {
      next.push_back(draw(static_cast<int32_t>(row), /*mid_generation=*/false));
      idle_[row] = -1;
      changed_ = true;
    } else {
      --idle_[row];
    }
  }
  live_ = std::move(next);
}

}  // namespace sparsemla::tools
