// tests/emu/shim/cuda_runtime.h: host shim that runs the block-level device code of
// indexer_select.cuh with one std::thread per CUDA thread (barriers for __syncthreads, per-warp
// exchange for shuffles / ballots).
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
struct Dim3 {
  unsigned x;
};
extern thread_local Dim3 threadIdx;
extern Dim3 blockDim;
struct Emu {
  std::barrier<>* block;
  std::barrier<>* warp[32];
  uint64_t slot[32][32];
};
extern Emu emu;
inline void __syncthreads() {
  emu.block->arrive_and_wait();
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
using std::isfinite;
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz((unsigned)x);
}
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
inline int __ffs(unsigned x) {
  return __builtin_ffs((int)x);
}
template <class T>
inline T emu_xchg(T v, int src_lane) {
  const unsigned l = threadIdx.x & 31, w = threadIdx.x >> 5;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu.slot[w][l] = bits;
  emu.warp[w]->arrive_and_wait();
  uint64_t got = emu.slot[w][src_lane];
  emu.warp[w]->arrive_and_wait();
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int d) {
  return emu_xchg(v, (threadIdx.x & 31) ^ d);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, int d) {
  int l = threadIdx.x & 31;
  return emu_xchg(v, l >= d ? l - d : l);
}
inline unsigned __ballot_sync(unsigned, bool p) {
  const unsigned w = threadIdx.x >> 5;
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) {
    bool q = emu_xchg<uint32_t>(p ? 1u : 0u, i) != 0;
    r |= q ? 1u << i : 0;
  }
  (void)w;
  return r;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline int atomicAdd(int* p, int v) {
  return std::atomic_ref<int>(*p).fetch_add(v);
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long o = a.load();
  while (v < o && !a.compare_exchange_weak(o, v)) {
  }
  return o;
}
