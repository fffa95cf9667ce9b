// src/cuda/common/timeline.cuh: a debug timeline of the sm90 decode kernel (build with
// -DSPARSEMLA_TIMELINE=ON; compiled out otherwise). Thread 0 of a role stamps %globaltimer (ns)
// and clock64 (SM cycles) at fixed events of each CTA into a device array; `sparsemla bench`
// prints per-event statistics of the last timed call. Not for production builds: one static
// 1 MiB device array, written by every call.
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
  kTlSlots = 3,         // producer: slot ids of tiles 0..2 visible
  kTlRaw0 = 4,          // producer: tile 0's rows landed
  kTlFull0 = 5,         // producer: tile 0 converted and published
  kTlProducerDone = 6,  // producer: last tile published
  kTlQ = 7,             // consumers: Q in shared memory
  kTlFirstTile = 8,     // consumers: tile 0 available
  kTlLoopDone = 9,      // consumers: last P.V retired
  kTlDone = 10,         // consumers: epilogue done (thread 0)
  // Cycle sums over the tile loop (thread 0 of the role), producer (TlLaps index):
  kTlWaitRaw = 11,    // 0: waiting for a tile's rows (raw_full)
  kTlWaitEmpty = 12,  // 1: waiting for a free K stage (empty)
  kTlConvert = 13,    // 2: dequantisation, fence, publish
  kTlAsyncWait = 14,  // 3: cp.async.wait_group (scale words, slot ids)
  kTlBarrier = 15,    // 4: the producer barrier
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
  long long last = 0, sum[6] = {0, 0, 0, 0, 0, 0};
  __device__ __forceinline__ void start() {
    last = clock64();
  }
  __device__ __forceinline__ void lap(int k) {
    const long long now = clock64();
    sum[k] += now - last;
    last = now;
  }
#else
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void lap(int) {}
#endif
};

}  // namespace sparsemla::cuda

#ifdef SPARSEMLA_TIMELINE
namespace sparsemla::cuda_sm90 {  // src/cuda/sm90/decode_sm90.cu
// Zeroes the sm90 kernel's timeline on `stream`; copies it out (kTimelineWords, synchronous).
void timeline_clear(cudaStream_t stream);
void timeline_read(unsigned long long* out);
}  // namespace sparsemla::cuda_sm90
#endif
