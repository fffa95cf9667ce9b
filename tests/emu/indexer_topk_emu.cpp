// tests/emu/indexer_topk_emu.cpp: the block-wide exact top-k of src/cuda/generic/indexer_select.cuh
// (TopkBuffer reset / reserve / offer / cut / cut_sorted, block_sort_descending_fast) run on the
// host, one std::thread per CUDA thread (shim/cuda_runtime.h: barriers, per-warp shuffles and
// ballots, shared atomics), against a sorted reference: random, all-equal, banded, NaN / inf / -0
// and few-valued scores, k in {1, 7, 33, 64, 100, 512, 2048}, 128 and 256 threads, many cuts per
// row, k > n, both output orders, theta checked. Not part of ctest (about 2-3 minutes):
//   g++ -std=c++20 -O2 -pthread -Itests/emu/shim -Isrc -Iinclude tests/emu/indexer_topk_emu.cpp \
//     -o /tmp/topk_emu && /tmp/topk_emu
#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <thread>
#include <vector>
#include "cuda/generic/indexer_select.cuh"
thread_local Dim3 threadIdx;
Dim3 blockDim;
Emu emu;
using namespace sparsemla::cuda_generic::indexer;

static uint32_t hmono(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static float hkey(float s) {
  if (!std::isfinite(s)) return -std::numeric_limits<float>::infinity();
  return s == 0.0f ? 0.0f : s;
}
struct Cand {
  float s;
  uint32_t j;
};
static bool better(const Cand& a, const Cand& b) {
  uint32_t ka = hmono(hkey(a.s)), kb = hmono(hkey(b.s));
  if (ka != kb) return ka > kb;
  return a.j < b.j;
}

int failures = 0;
void run_case(const char* what, int threads, int k, int step, int capacity,
              const std::vector<Cand>& c, bool by_score) {
  static std::vector<uint64_t> smem;
  smem.assign(capacity + sizeof(TopkState) / 8 + 8, 0x5E5E5E5E5E5E5E5Eull);
  TopkBuffer top{smem.data(), reinterpret_cast<TopkState*>(smem.data() + capacity), capacity, k};
  blockDim.x = threads;
  std::barrier<> block(threads);
  std::vector<std::barrier<>*> wb;
  emu.block = &block;
  for (int w = 0; w < threads / 32; ++w) {
    wb.push_back(new std::barrier<>(32));
    emu.warp[w] = wb.back();
  }
  const int N = (int)c.size();
  std::vector<std::thread> th;
  for (int t = 0; t < threads; ++t)
    th.emplace_back([&, t] {
      threadIdx.x = t;
      top.reset();
      for (int base = 0; base < N; base += step) {
        top.reserve(step);
        for (int i = base + t; i < base + step && i < N; i += threads)
          top.offer(pack(c[i].s, c[i].j));
        __syncthreads();
      }
      if (by_score)
        top.cut_sorted();
      else {
        top.cut();
        const int len = top.st->count;
        const int P = next_pow2(len);
        for (int i = len + t; i < P; i += threads) top.buf[i] = kSentinel;
        __syncthreads();
        block_sort_descending_fast(top.buf, P, IndexWord{});
      }
    });
  for (auto& x : th) x.join();
  for (auto* b : wb) delete b;
  std::vector<Cand> ref = c;
  std::sort(ref.begin(), ref.end(), better);
  const int len = std::min<int>(k, N);
  ref.resize(len);
  if (!by_score)
    std::sort(ref.begin(), ref.end(), [](const Cand& a, const Cand& b) { return a.j < b.j; });
  bool ok = top.st->count == len;
  for (int i = 0; ok && i < len; ++i) {
    uint64_t e = top.buf[i];
    uint32_t sb;
    memcpy(&sb, &ref[i].s, 4);
    if (packed_index(e) != ref[i].j || (uint32_t)(e >> 32) != sb) {
      ok = false;
      printf("  pos %d got j=%u want j=%u\n", i, packed_index(e), ref[i].j);
    }
  }
  if (ok && len == k && N >= k) {  // theta = the k-th's rank word
    Cand kth = ref[0];
    for (auto& r : ref)
      if (better(kth, r)) kth = r;
    uint64_t want = ((uint64_t)hmono(hkey(kth.s)) << 32) | (uint32_t)~kth.j;
    if (top.st->theta != want) {
      ok = false;
      printf("  theta wrong\n");
    }
  }
  printf("%s %s threads=%d k=%d step=%d cap=%d N=%d %s\n", ok ? "ok  " : "FAIL", what, threads, k,
         step, capacity, N, by_score ? "by_score" : "by_index");
  if (!ok) ++failures;
}

int main() {
  std::mt19937_64 rng(12345);
  auto make = [&](int N, int mode) {
    std::vector<Cand> c(N);
    std::vector<uint32_t> js(N);
    for (int i = 0; i < N; ++i) js[i] = i;
    std::shuffle(js.begin(), js.end(), rng);
    std::normal_distribution<float> nd;
    for (int i = 0; i < N; ++i) {
      float s;
      switch (mode) {
        case 0:
          s = nd(rng);
          break;  // random
        case 1:
          s = 1.0f;
          break;  // all equal
        case 2:
          s = (rng() % 97 == 5) ? 2.0f : 1.0f;
          break;  // band
        case 3: {
          int r = rng() % 8;
          s = r == 0   ? NAN
              : r == 1 ? INFINITY
              : r == 2 ? -INFINITY
              : r == 3 ? -0.0f
              : r == 4 ? 0.0f
                       : nd(rng);
          break;
        }
        default:
          s = (float)(rng() % 5);
          break;  // few values
      }
      c[i] = {s, js[i]};
    }
    if (mode == 5)
      std::sort(c.begin(), c.end(),
                [](auto& a, auto& b) { return a.j < b.j; });  // indices ascending
    return c;
  };
  struct K {
    int threads, k, step;
  };
  for (K kk :
       {K{256, 64, 1024}, K{128, 512, 1024}, K{256, 512, 32}, K{128, 512, 64}, K{256, 1, 32},
        K{256, 7, 256}, K{128, 2048, 64}, K{256, 64, 1024}, K{256, 100, 256}, K{128, 33, 64}}) {
    int cap = 1;
    while (cap < kk.k + kk.step) cap <<= 1;
    cap = std::max(cap, 64);
    for (int mode : {0, 1, 2, 3, 4, 5}) {
      for (int N : {0, 1, kk.k - 1, kk.k, kk.k + 1, 3 * kk.k + 17, 20000}) {
        if (N < 0) continue;
        for (bool bs : {true, false})
          run_case(("mode" + std::to_string(mode)).c_str(), kk.threads, kk.k, kk.step, cap,
                   make(N, mode), bs);
      }
    }
    // a big buffer (the merge's 4,096)
    run_case("bigcap", kk.threads, kk.k, kk.step, std::max(cap, 4096), make(30000, 0), true);
    run_case("bigcap-eq", kk.threads, kk.k, kk.step, std::max(cap, 4096), make(30000, 1), false);
  }
  printf("failures: %d\n", failures);
  return failures != 0;
}
