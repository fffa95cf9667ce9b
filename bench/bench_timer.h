// bench/bench_timer.h: timing one decode call of a Problem on a path (`sparsemla bench` and `run`).
#pragma once

#include <string>
#include <vector>

#include "problem.h"

namespace sparsemla::tools {

struct TimingOptions {
  int32_t warmup = 10;
  int32_t reps = 100;
  int64_t flush_bytes = int64_t{512} << 20;  // written before every timed call: cold L2 (GPU)
  bool graph = true;                         // time CUDA-graph replays of one whole call
  int32_t splits = 0;                        // S; 0: the path's planner
};

struct Timing {
  Path path = Path::Cpu;   // the path that ran (auto resolved by the plan)
  bool auto_path = false;  // the cell asked for auto
  int32_t splits = 1;
  std::vector<double> seconds;  // sorted
  std::vector<bf16_bits> out;   // output of the last call, host copy
  double median() const { return seconds[seconds.size() / 2]; }
  double quantile(double q) const { return seconds[static_cast<size_t>(q * (seconds.size() - 1))]; }
};

Timing time_decode_cpu(const Problem& pb, const TimingOptions& o);
// CUDA builds only (throws otherwise): events around graph replays, L2 flushed before each.
Timing time_decode_cuda(const Problem& pb, Path path, const TimingOptions& o);
// CUDA builds only: prints the launch floor (graphs of empty kernels timed like a cell).
void print_launch_floor(const TimingOptions& o);
// CUDA builds only: prints how fast the rows of the problem's decode come back from memory alone
// (by index and in order; bench/gather_only.cu), timed like a cell.
void print_gather_only(const std::string& shape, const Problem& pb, const TimingOptions& o);
// CUDA builds only: prints the mma.sync ceiling of the generic path's tensor work
// (bench/mma_peak.cu).
void print_mma_peak(const TimingOptions& o);

}  // namespace sparsemla::tools
