// GPU timing for `sparsemla bench`: one whole decode call (partials + combine) captured in a CUDA
// graph, replayed `reps` times; before each replay 512 MB are written to another buffer so the 60
// MB L2 is cold, and CUDA events bracket the replay alone. Median and spread are reported.
#include <algorithm>

#include "bench_timer.h"
#include "device_mirror.h"

#ifdef SPARSEMLA_TIMELINE
#include <cstdio>

#include "cuda/common/timeline.cuh"  // (the library's source tree: debug builds only)
#endif

namespace sparsemla::tools {

#ifdef SPARSEMLA_TIMELINE
namespace {
using cuda::kTimelineCtas;
using cuda::kTimelineEvents;

// One path's timeline: its event names, where the cycle sums start, and how to read it.
struct TimelineKind {
  const char* const* names;
  int first_sum, used;
  void (*clear)(cudaStream_t);
  void (*read)(unsigned long long*);
};
// The kernels that stamp a timeline: the sm90 kernel and the generic warp-specialised kernel.
const TimelineKind* timeline_kind(Path path) {
  static const TimelineKind sm90{cuda::kTimelineNames, cuda::kTlFirstSum, cuda::kTlEventsUsed,
                                 sparsemla::cuda_sm90::timeline_clear,
                                 sparsemla::cuda_sm90::timeline_read};
  static const TimelineKind generic{cuda::kGenericTimelineNames, cuda::kGtFirstSum,
                                    cuda::kGtEventsUsed, sparsemla::cuda_generic::timeline_clear,
                                    sparsemla::cuda_generic::timeline_read};
  if (path == Path::CudaSm90) return &sm90;
  if (path == Path::CudaGeneric) return &generic;
  return nullptr;
}

// Per event over the CTAs that stamped it: globaltimer (us after the earliest entry) min / median
// / max, and the median of SM cycles after the CTA's own entry.
void print_timeline(const TimelineKind& kind) {
  std::vector<unsigned long long> buf(cuda::kTimelineWords);
  kind.read(buf.data());
  const auto at = [&](int cta, int e, int k) {
    return buf[(static_cast<size_t>(cta) * kTimelineEvents + e) * 2 + k];
  };
  unsigned long long g0 = ~0ull;
  for (int c = 0; c < kTimelineCtas; ++c) {
    if (at(c, 0, 0) != 0) g0 = std::min(g0, at(c, 0, 0));
  }
  if (g0 == ~0ull) return;
  std::printf("timeline (last call; us after the first CTA entry; cycles after the CTA's entry)\n");
  for (int e = 0; e < kind.first_sum; ++e) {
    std::vector<double> us, cyc;
    for (int c = 0; c < kTimelineCtas; ++c) {
      if (at(c, e, 0) == 0 || at(c, 0, 0) == 0) continue;
      us.push_back(static_cast<double>(at(c, e, 0) - g0) * 1e-3);
      cyc.push_back(static_cast<double>(static_cast<long long>(at(c, e, 1) - at(c, 0, 1))));
    }
    if (us.empty()) continue;
    std::sort(us.begin(), us.end());
    std::sort(cyc.begin(), cyc.end());
    std::printf("  %-16s n=%5zu  us min %7.2f  med %7.2f  max %7.2f   cycles med %9.0f\n",
                kind.names[e], us.size(), us.front(), us[us.size() / 2], us.back(),
                cyc[cyc.size() / 2]);
  }
  for (int e = kind.first_sum; e < kind.used; ++e) {  // cycle sums over the tile loop
    std::vector<double> cyc;
    for (int c = 0; c < kTimelineCtas; ++c) {
      if (at(c, e, 0) == 1) cyc.push_back(static_cast<double>(static_cast<long long>(at(c, e, 1))));
    }
    if (cyc.empty()) continue;
    std::sort(cyc.begin(), cyc.end());
    std::printf("  %-16s n=%5zu  loop cycles min %9.0f  med %9.0f  max %9.0f\n", kind.names[e],
                cyc.size(), cyc.front(), cyc[cyc.size() / 2], cyc.back());
  }
}
}  // namespace
#endif

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
  p.num_splits = o.splits;
  // Planned once, as an engine plans a step (auto resolves to a path here).
  const DecodePlan plan = plan_decode(p);
  Timing t;
  t.path = plan.path;
  t.auto_path = path == Path::Auto;
  t.splits = plan.num_splits;
  const size_t ws = plan.workspace_bytes;
  void* workspace = arena.alloc<uint8_t>(ws);
  uint8_t* flush = arena.alloc<uint8_t>(static_cast<size_t>(o.flush_bytes));
  for (int32_t i = 0; i < o.warmup; ++i) sparse_decode(p, plan, workspace, ws);
  cudaGraphExec_t exec =
      o.graph ? capture_graph(stream.s, [&] { sparse_decode(p, plan, workspace, ws); }) : nullptr;
  for (int32_t i = 0; i < o.reps; ++i) {
#ifdef SPARSEMLA_TIMELINE
    if (i + 1 == o.reps && timeline_kind(path)) timeline_kind(path)->clear(stream.s);
#endif
    t.seconds.push_back(time_cold_call(stream.s, ev, flush, o.flush_bytes, i, [&] {
      if (exec)
        cuda_check(cudaGraphLaunch(exec, stream.s), "graph launch");
      else
        sparse_decode(p, plan, workspace, ws);
    }));
  }
  if (exec) cudaGraphExecDestroy(exec);
#ifdef SPARSEMLA_TIMELINE
  if (timeline_kind(path)) print_timeline(*timeline_kind(path));
#endif
  std::sort(t.seconds.begin(), t.seconds.end());
  t.out.resize(out_elems);
  cuda_check(cudaMemcpy(t.out.data(), p.out, out_elems * 2, cudaMemcpyDeviceToHost), "copy out");
  return t;
}

}  // namespace sparsemla::tools
