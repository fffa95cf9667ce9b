// GPU timing for `sparsemla bench`: one whole decode call (partials + combine) captured in a CUDA
// graph, replayed `reps` times; before each replay 512 MB are written to another buffer so the 60
// MB L2 is cold, and CUDA events bracket the replay alone. Median and spread are reported.
#include <algorithm>

#include "bench_timer.h"
#include "device_mirror.h"

namespace sparsemla::tools {

Timing time_decode_cuda(const Problem& pb, Path path, const TimingOptions& o) {
  DeviceArena arena;
  CudaStream stream;
  CudaEvents ev;
  DecodeParams p = mirror_problem(pb, arena);
  const size_t out_elems = static_cast<size_t>(pb.tokens) * pb.heads * 512;
  p.out = arena.alloc<bf16_bits>(out_elems);
  cuda_check(cudaMemset(p.out, 0xFF, out_elems * 2), "poison out");
  p.path = path;
  p.stream = stream.s;
  Timing t;
  t.path = path;
  p.num_splits = o.splits;
  t.splits = decode_num_splits(p);
  p.num_splits = t.splits;
  const size_t ws = decode_workspace_size(pb.tokens, pb.heads, t.splits);
  void* workspace = arena.alloc<uint8_t>(ws);
  uint8_t* flush = arena.alloc<uint8_t>(static_cast<size_t>(o.flush_bytes));
  for (int32_t i = 0; i < o.warmup; ++i) sparse_decode(p, workspace, ws);
  cudaGraphExec_t exec =
      o.graph ? capture_graph(stream.s, [&] { sparse_decode(p, workspace, ws); }) : nullptr;
  for (int32_t i = 0; i < o.reps; ++i) {
    if (o.flush_bytes > 0) {
      cuda_check(cudaMemsetAsync(flush, i & 0xFF, static_cast<size_t>(o.flush_bytes), stream.s),
                 "flush");
    }
    cuda_check(cudaEventRecord(ev.start, stream.s), "record");
    if (exec)
      cuda_check(cudaGraphLaunch(exec, stream.s), "graph launch");
    else
      sparse_decode(p, workspace, ws);
    cuda_check(cudaEventRecord(ev.stop, stream.s), "record");
    t.seconds.push_back(ev.seconds());
  }
  if (exec) cudaGraphExecDestroy(exec);
  std::sort(t.seconds.begin(), t.seconds.end());
  t.out.resize(out_elems);
  cuda_check(cudaMemcpy(t.out.data(), p.out, out_elems * 2, cudaMemcpyDeviceToHost), "copy out");
  return t;
}

}  // namespace sparsemla::tools
