// tools/common/progress.h: progress lines for loops that run longer than a couple of seconds (the
// compressor fill of a 1M-token context takes ~100 s): the first after 2 s, then one every 10 s,
// so short runs stay quiet and long ones print a few lines, not one per chunk.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace sparsemla::tools {

class ProgressTicker {
 public:
  using Report = std::function<void(const std::string&)>;
  ProgressTicker(Report report, std::string stage, double first_s = 2.0, double every_s = 10.0)
      : report_(std::move(report)),
        stage_(std::move(stage)),
        wait_s_(first_s),
        every_s_(every_s),
        last_(std::chrono::steady_clock::now()) {}

  // `done` of `total` units (tokens, layers) finished; prints once the wait has passed.
  void update(int64_t done, int64_t total) {
    if (!report_) return;
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_).count() < wait_s_) return;
    last_ = now;
    wait_s_ = every_s_;
    char line[96];
    std::snprintf(line, sizeof line, ": %lld / %lld (%.0f%%)", static_cast<long long>(done),
                  static_cast<long long>(total),
                  total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 0.0);
    report_(stage_ + line);
  }

 private:
  Report report_;
  std::string stage_;
  double wait_s_;  // until the next line: first_s, then every_s
  double every_s_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace sparsemla::tools
