#include "runner.h"

#include "bench_timer.h"

namespace sparsemla::tools {

// `run` times with the bench's timers: no L2 flush and no graph (one eager call as an engine
// makes it), one warm-up call on the GPU (module load), none on the CPU.
DecodeRun run_decode(const Problem& pb, Path path, int32_t splits, int32_t repeat,
                     const std::function<void(const std::string&)>& progress) {
  const bool gpu = path == Path::CudaGeneric || path == Path::CudaSm90 ||
                   (path == Path::Auto && cuda_device_available());
  if (progress) progress(std::string("decode on ") + (gpu ? "the GPU" : "the CPU") + " ...");
  TimingOptions o;
  o.warmup = gpu ? 1 : 0;
  o.reps = repeat;
  o.flush_bytes = 0;
  o.graph = false;
  o.splits = splits;
  Timing t = gpu ? time_decode_cuda(pb, path, o) : time_decode_cpu(pb, o);
  DecodeRun r;
  r.path = gpu && path == Path::Auto ? Path::CudaGeneric : (gpu ? path : Path::Cpu);
  r.splits = t.splits;
  r.min_seconds = t.seconds.front();
  r.max_seconds = t.seconds.back();
  r.median_seconds = t.median();
  r.out = std::move(t.out);
  return r;
}

#if !defined(SPARSEMLA_WITH_CUDA)
std::string cuda_device_problem() {
  return "no CUDA device (this build has no CUDA: SPARSEMLA_ENABLE_CUDA=OFF)";
}
#endif

}  // namespace sparsemla::tools
