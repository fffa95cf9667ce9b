#include "bench_timer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "bench_indexer_timer.h"

namespace sparsemla::tools {

Timing time_decode_cpu(const Problem& pb, const TimingOptions& o) {
  Timing t;
  DecodeParams p = pb.params();
  p.path = Path::Cpu;
  t.out.assign(static_cast<size_t>(pb.tokens) * pb.heads * 512, 0x7FC1);
  p.out = t.out.data();
  p.num_splits = o.splits;
  t.splits = decode_num_splits(p);
  p.num_splits = t.splits;
  std::vector<uint8_t> ws(decode_workspace_size(pb.tokens, pb.heads, t.splits));
  for (int32_t i = 0; i < o.warmup; ++i) sparse_decode(p, ws.data(), ws.size());
  for (int32_t i = 0; i < o.reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    sparse_decode(p, ws.data(), ws.size());
    t.seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.seconds.begin(), t.seconds.end());
  return t;
}

int32_t indexer_input_sets(double set_bytes) {
  if (set_bytes > 2 * kL2Bytes) return 1;
  const double sets = std::ceil(4 * kL2Bytes / std::max(set_bytes, 1.0));
  return static_cast<int32_t>(std::min<double>(sets, kMaxInputSets));
}

#if !defined(SPARSEMLA_WITH_CUDA)
IndexerTiming time_indexer_cuda(IndexerProblem&, Path path, const TimingOptions&) {
  throw_arg_error("bench", "--paths", "cpu (this build has no CUDA)", path_name(path));
}
Timing time_decode_cuda(const Problem&, Path path, const TimingOptions&) {
  throw_arg_error("bench", "--paths", "cpu (this build has no CUDA)", path_name(path));
}
void print_launch_floor(const TimingOptions&) {
  throw_arg_error("bench", "--launch-floor", "a CUDA build", "a build without CUDA");
}
void print_gather_only(const std::string&, const Problem&, const TimingOptions&) {
  throw_arg_error("bench", "--gather-only", "a CUDA build", "a build without CUDA");
}
void print_mma_peak(const TimingOptions&) {
  throw_arg_error("bench", "--mma-peak", "a CUDA build", "a build without CUDA");
}
#endif

}  // namespace sparsemla::tools
