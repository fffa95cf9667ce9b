// src/cuda/common/timeline.cuh: a debug timeline of the sm90 decode kernel and of the generic
// path's warp-specialised kernel (build with -DSPARSEMLA_TIMELINE=ON; compiled out otherwise).
// Thread 0 of a role stamps %globaltimer (ns) and clock64 (SM cycles) at fixed events of each CTA
// into a device array `g_timeline` of the kernel's namespace; `sparsemla bench` prints per-event
// statistics of the last timed call. Not for production builds: one static 1 MiB device array per
// path, written by every call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sparsemla::cuda {

inline constexpr int kTimelineEvents = 24;
inline constexpr int kTimelineCtas = 4096;
inline constexpr int kTimelineWords = kTimelineCtas * kTimelineEvents * 2;

// The events of the sm90 kernel (docs/SM90.md), in the order of a CTA's life.
enum TimelineEvent : int {
  kTlEntry = 0,         // kernel entry
  kTlSplitWork = 1,     // split_work (the index pointers) done
  kTlInit = 2,          // barriers initialised (__syncthreads)
  kTlSlots = 3,         // producer: slot ids of tiles 0, 1 visible
  kTlRaw0 = 4,          // producer: tile 0's rows landed
  kTlFull0 = 5,         // producer: tile 0 converted and published
  kTlProducerDone = 6,  // producer: last tile published
  kTlQ = 7,             // consumers: Q in shared memory
  kTlFirstTile = 8,     // consumers: tile 0 available
  kTlLoopDone = 9,      // consumers: last P.V retired
  kTlDone = 10,         // consumers: epilogue done (thread 0)
  // Cycle sums over the tile loop (thread 0 of the role), producer (TlLaps index):
  kTlWaitRaw = 11,    // 0: waiting for a tile's rows (the thread's cp.async group, __syncwarp)
  kTlWaitEmpty = 12,  // 1: waiting for a free K stage (empty)
  kTlConvert = 13,    // 2: dequantisation, fence, publish
  kTlAsyncWait = 14,  // 3: unused since the per-warp gather (0)
  kTlBarrier = 15,    // 4: the __syncwarp before the raw stage is refilled
  kTlIssue = 16,      // 5: the next copies and slot ids
  // consumers:
  kTlExchange = 17,  // 0: score exchange (barrier, shared memory)
  kTlSoftmax = 18,   // 1: softmax
  kTlWaitPv = 19,    // 2: wait for P.V(i-1), pack P, rescale
  kTlWaitFull = 20,  // 3: waiting for a converted tile (full)
  kTlQk = 21,        // 4: issue Q.K(i+1) and P.V(i), wait for Q.K(i+1)
  kTlEventsUsed = 22
};
static_assert(kTlEventsUsed <= kTimelineEvents);
inline constexpr int kTlFirstSum = kTlWaitRaw;  // events from here on hold cycle sums

// The events' names, as `sparsemla bench` prints them.
inline constexpr const char* kTimelineNames[kTlEventsUsed] = {
    "entry",        "split_work", "init",         "p:slots",    "p:raw0",  "p:full0",
    "p:loopdone",   "c:q",        "c:firsttile",  "c:loopdone", "c:done",  "p:wait_raw",
    "p:wait_empty", "p:convert",  "p:async_wait", "p:barrier",  "p:issue", "c:exchange",
    "c:softmax",    "c:wait_pv",  "c:wait_full",  "c:qk"};

// The events of the generic path's warp-specialised kernel (docs/GENERIC.md).
enum GenericTimelineEvent : int {
  kGtEntry = 0,        // kernel entry
  kGtSplitWork = 1,    // split_work (the index pointers) done
  kGtConv0 = 2,        // QK warps: tile 0's rows landed and converted
  kGtConv1 = 3,        // QK warps: tile 1 converted
  kGtInit = 4,         // CTA barrier passed (Q, K(0), K(1) in shared memory)
  kGtFirstScores = 5,  // PV warps: scores of tile 0 available
  kGtPvLoopDone = 6,   // PV warps: last P.V done
  kGtDone = 7,         // PV warps: epilogue done (thread 0)
  kGtQkLoopDone = 8,   // QK warps: last scores written
  // Cycle sums over the tile loop (thread 0 of the group), PV warps (TlLaps index):
  kGtWaitScores = 9,  // 0: waiting for the tile's scores (kBarScores)
  kGtSoftmax = 10,    // 1: reading the scores, softmax, P and alpha written
  kGtPvBarrier = 11,  // 2: the PV barrier (bar.red.or) and the rescale
  kGtPv = 12,         // 3: P.V and the K-free arrival
  // QK warps:
  kGtWaitKFree = 13,     // 0: waiting for a free K buffer (kBarKFree)
  kGtWaitPartFree = 14,  // 1: waiting for the score buffer (kBarPartFree)
  kGtQkConvert = 15,     // 2: Q.K of tile i+1 beside the conversion of tile i+2
  kGtIssue = 16,         // 3: the scores' arrival and the loads of tile i+3
  kGtEventsUsed = 17
};
static_assert(kGtEventsUsed <= kTimelineEvents);
inline constexpr int kGtFirstSum = kGtWaitScores;
inline constexpr const char* kGenericTimelineNames[kGtEventsUsed] = {
    "entry",      "split_work",  "qk:conv0", "qk:conv1",      "init",
    "pv:scores0", "pv:loopdone", "pv:done",  "qk:loopdone",   "pv:wait_scores",
    "pv:softmax", "pv:barrier",  "pv:pv",    "qk:wait_kfree", "qk:wait_partfree",
    "qk:qk_conv", "qk:issue"};

#if defined(SPARSEMLA_TIMELINE) && defined(__CUDACC__)
// This CTA's slot in the timeline (linear block index).
__device__ __forceinline__ int64_t timeline_cta() {
  return (blockIdx.z * gridDim.y + blockIdx.y) * int64_t{gridDim.x} + blockIdx.x;
}
__device__ __forceinline__ void timeline_stamp(unsigned long long* buf, int64_t cta, int event) {
  if (cta >= kTimelineCtas) return;
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  const long long c = clock64();
  buf[(cta * kTimelineEvents + event) * 2] = g;
  buf[(cta * kTimelineEvents + event) * 2 + 1] = static_cast<unsigned long long>(c);
}
// A cycle sum (kTlWaitRaw..): a marker in the timer word, the sum in the clock word.
__device__ __forceinline__ void timeline_value(unsigned long long* buf, int64_t cta, int event,
                                               long long value) {
  if (cta >= kTimelineCtas) return;
  buf[(cta * kTimelineEvents + event) * 2] = 1;
  buf[(cta * kTimelineEvents + event) * 2 + 1] = static_cast<unsigned long long>(value);
}
#endif

// Cycle sums of a role's phases (lap(k) adds the cycles since the previous lap to sum k); an empty
// struct unless SPARSEMLA_TIMELINE.
struct TlLaps {
#if defined(SPARSEMLA_TIMELINE) && defined(__CUDACC__)
  // 32-bit counters (wrap-safe differences; a CTA's loop is far below 2^32 cycles): half the
  // registers of clock64 in kernels that sit at their register cap.
  unsigned last = 0, sum[6] = {0, 0, 0, 0, 0, 0};
  __device__ __forceinline__ void start() {
    last = static_cast<unsigned>(clock());
  }
  __device__ __forceinline__ void lap(int k) {
    const unsigned now = static_cast<unsigned>(clock());
    sum[k] += now - last;
    last = now;
  }
#else
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void lap(int) {}
#endif
};

}  // namespace sparsemla::cuda

// Stamps into the `g_timeline` array of the enclosing namespace (a kernel's translation unit).
#if defined(SPARSEMLA_TIMELINE) && defined(__CUDACC__)
#define SPARSEMLA_STAMP(cond, event)                                         \
  do {                                                                       \
    if (cond) cuda::timeline_stamp(g_timeline, cuda::timeline_cta(), event); \
  } while (0)
#define SPARSEMLA_STAMP_VALUE(cond, event, value)                                   \
  do {                                                                              \
    if (cond) cuda::timeline_value(g_timeline, cuda::timeline_cta(), event, value); \
  } while (0)
// The n cycle sums of `laps` as the consecutive events first, first + 1, ...
#define SPARSEMLA_STAMP_SUMS(cond, first, laps, n)                                              \
  do {                                                                                          \
    for (int k_ = 0; k_ < (n); ++k_) SPARSEMLA_STAMP_VALUE(cond, (first) + k_, (laps).sum[k_]); \
  } while (0)
#else
#define SPARSEMLA_STAMP(cond, event) ((void)0)
#define SPARSEMLA_STAMP_VALUE(cond, event, value) ((void)0)
#define SPARSEMLA_STAMP_SUMS(cond, first, laps, n) ((void)0)
#endif

#ifdef SPARSEMLA_TIMELINE
namespace sparsemla::cuda_sm90 {  // src/cuda/sm90/decode_sm90.cu
// Zeroes the sm90 kernel's timeline on `stream`; copies it out (kTimelineWords, synchronous).
void timeline_clear(cudaStream_t stream);
void timeline_read(unsigned long long* out);
}  // namespace sparsemla::cuda_sm90
namespace sparsemla::cuda_generic {  // src/cuda/generic/decode_generic.cu: the same, ws kernel
void timeline_clear(cudaStream_t stream);
void timeline_read(unsigned long long* out);
}  // namespace sparsemla::cuda_generic
#if defined(__CUDACC__)
#include "cuda/common/device_info.h"  // check_cuda
namespace sparsemla::cuda {
// timeline_clear / timeline_read of a kernel's `g_timeline` symbol.
template <class Symbol>
void timeline_clear_symbol(const Symbol& symbol, cudaStream_t stream) {
  void* ptr = nullptr;
  check_cuda(cudaGetSymbolAddress(&ptr, symbol), "timeline address");
  check_cuda(cudaMemsetAsync(ptr, 0, sizeof(symbol), stream), "timeline clear");
}
template <class Symbol>
void timeline_read_symbol(const Symbol& symbol, unsigned long long* out) {
  check_cuda(cudaMemcpyFromSymbol(out, symbol, sizeof(symbol)), "timeline read");
}
}  // namespace sparsemla::cuda
#endif
#endif
