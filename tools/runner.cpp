#include "runner.h"

#include <algorithm>
#include <chrono>

namespace sparsemla::tools {

namespace {

void fill_stats(DecodeRun& r, std::vector<double> times) {
  std::sort(times.begin(), times.end());
  r.min_seconds = times.front();
  r.max_seconds = times.back();
  r.median_seconds = times[times.size() / 2];
}

DecodeRun run_decode_cpu(const Problem& pb, int32_t splits, int32_t repeat) {
  DecodeRun r;
  r.path = Path::Cpu;
  DecodeParams p = pb.params();
  p.path = Path::Cpu;
  p.num_splits = splits;
  r.out.assign(static_cast<size_t>(pb.tokens) * pb.heads * 512, 0x7FC1);  // poisoned: NaN
  p.out = r.out.data();
  r.splits = decode_num_splits(p);
  p.num_splits = r.splits;
  std::vector<uint8_t> workspace(decode_workspace_size(pb.tokens, pb.heads, r.splits));
  std::vector<double> times;
  for (int32_t i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    sparse_decode(p, workspace.data(), workspace.size());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  fill_stats(r, times);
  return r;
}

}  // namespace

DecodeRun run_decode(const Problem& pb, Path path, int32_t splits, int32_t repeat,
                     const std::function<void(const std::string&)>& progress) {
  const bool gpu = path == Path::CudaGeneric || path == Path::CudaSm90 ||
                   (path == Path::Auto && cuda_device_available());
  if (progress) progress(std::string("decode on ") + (gpu ? "the GPU" : "the CPU") + " ...");
  return gpu ? run_decode_cuda(pb, path, splits, repeat) : run_decode_cpu(pb, splits, repeat);
}

#if !defined(SPARSEMLA_WITH_CUDA)
bool cuda_device_available() {
  return false;
}
DecodeRun run_decode_cuda(const Problem&, Path path, int32_t, int32_t) {
  throw_arg_error("run", "--path", "cpu or auto (this build has no CUDA)", path_name(path));
}
#endif

}  // namespace sparsemla::tools
