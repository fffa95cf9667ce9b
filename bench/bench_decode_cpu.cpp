// CPU sparse decode throughput at the CONTRACT 10 shapes that fit a small machine.
//
// Counters (per second of wall time, OpenMP threads included):
//   GFLOP/s = 2 * H * N * (512 + 512) per query token, N = attended keys (CONTRACT 10);
//   GB/s    = 584 bytes per attended key + 4 bytes per index + q and out in bf16.
// Caches hold model-like rows (random_cache below: CONTRACT 9.9 magnitudes, random pad bytes);
// every request has its own window pages and its own compressed entries, so the batch really
// streams batch * N rows.
// Built with the library's default flags (no -march=native), as CI and users get it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cpu/isa.h"
#include "sparsemla/decode.h"
#include "sparsemla/numerics.h"

namespace {

using sparsemla::bf16_bits;

constexpr int kDim = 512;
constexpr int kTokenBytes = 584;
constexpr int32_t kPage = 64;  // tokens per page, both caches

struct Shape {
  const char* name;
  int32_t heads;
  int64_t main_len;
  int64_t extra_max;           // dense width of the extra list
  int64_t extra_min;           // per-request lengths vary in [extra_min, extra_max]
  int64_t tokens_per_request;  // 2: MTP
};

// A paged fp8_ds_mla cache of `slots` rows like a real cache's (CONTRACT 9.9, 10): latents N(0,1) x
// a per-(token, 64-dim tile) gain exp(0.7 N(0,1)), rounded to bf16 and quantised by the library's
// quantiser (codes ~115..125), the RoPE tile likewise as bf16, pad bytes random (readers ignore
// them, CONTRACT 2.1).
std::vector<uint8_t> random_cache(std::mt19937_64& rng, int64_t slots) {
  const int64_t blocks = (slots + kPage - 1) / kPage;
  std::vector<uint8_t> bytes(static_cast<size_t>(blocks * kPage * kTokenBytes));
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float tile[64];
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* page = bytes.data() + b * kPage * kTokenBytes;
    for (int p = 0; p < kPage; ++p) {
      uint8_t* row = page + p * 576;
      uint8_t* codes = page + kPage * 576 + p * 8;
      for (int i = 0; i < 7; ++i) {
        const float gain = std::exp(0.7f * normal(rng));
        for (float& v : tile) v = sparsemla::round_to_bf16(gain * normal(rng));
        const int e = sparsemla::quantize_block(tile, 64, row + 64 * i);
        codes[i] = sparsemla::quant_code(e, sparsemla::kCodeMaxSanitising);
      }
      const float rope_gain = std::exp(0.7f * normal(rng));
      for (int k = 0; k < 64; ++k) {
        const bf16_bits r = sparsemla::float_to_bf16(rope_gain * normal(rng));
        row[448 + 2 * k] = static_cast<uint8_t>(r & 0xFF);
        row[449 + 2 * k] = static_cast<uint8_t>(r >> 8);
      }
      codes[7] = static_cast<uint8_t>(byte(rng));
    }
  }
  return bytes;
}

struct Problem {
  std::vector<uint8_t> main_cache, extra_cache;
  std::vector<int32_t> main_indices, main_indptr, extra_indices, extra_indptr;
  std::vector<bf16_bits> q, out;
  std::vector<float> sink, lse, workspace;
  sparsemla::DecodeParams params;
  double flops = 0, bytes = 0;
};

void build(Problem& pr, const Shape& s, int64_t batch) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t T = batch * s.tokens_per_request, H = s.heads;
  pr.main_cache = random_cache(rng, batch * s.main_len);
  pr.extra_cache = random_cache(rng, batch * s.extra_max);
  std::uniform_int_distribution<int64_t> extra_len(s.extra_min, s.extra_max);
  pr.main_indptr = {0};
  pr.extra_indptr = {0};
  int64_t keys = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t len = extra_len(rng);
    std::vector<int32_t> mine(static_cast<size_t>(s.extra_max));  // this request's entries
    for (int64_t i = 0; i < s.extra_max; ++i) mine[i] = static_cast<int32_t>(r * s.extra_max + i);
    for (int64_t tok = 0; tok < s.tokens_per_request; ++tok) {
      for (int64_t j = 0; j < s.main_len; ++j) {  // the window: consecutive slots of the request
        pr.main_indices.push_back(static_cast<int32_t>(r * s.main_len + j));
      }
      std::shuffle(mine.begin(), mine.end(), rng);  // top-k: any order, own entries
      pr.extra_indices.insert(pr.extra_indices.end(), mine.begin(), mine.begin() + len);
      pr.main_indptr.push_back(static_cast<int32_t>(pr.main_indices.size()));
      pr.extra_indptr.push_back(static_cast<int32_t>(pr.extra_indices.size()));
      keys += s.main_len + len;
    }
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  pr.q.resize(static_cast<size_t>(T * H * kDim));
  for (auto& v : pr.q) v = sparsemla::float_to_bf16(normal(rng));
  pr.sink.resize(static_cast<size_t>(H));
  for (auto& v : pr.sink) v = normal(rng);
  pr.out.assign(static_cast<size_t>(T * H * kDim), 0x7FC1);
  pr.lse.assign(static_cast<size_t>(T * H), 0.0f);

  sparsemla::DecodeParams& p = pr.params;
  p.num_tokens = T;
  p.num_heads = s.heads;
  p.q = pr.q.data();
  const auto view = [](const std::vector<uint8_t>& c) {
    return sparsemla::CacheView{c.data(), static_cast<int64_t>(c.size()) / (kPage * kTokenBytes),
                                kPage, int64_t{kPage} * kTokenBytes};
  };
  p.main_cache = view(pr.main_cache);
  p.main_list = {pr.main_indices.data(), pr.main_indptr.data(),
                 static_cast<int64_t>(pr.main_indices.size()), s.main_len};
  p.has_extra = true;
  p.extra_cache = view(pr.extra_cache);
  p.extra_list = {pr.extra_indices.data(), pr.extra_indptr.data(),
                  static_cast<int64_t>(pr.extra_indices.size()), s.extra_max};
  p.sink = pr.sink.data();
  p.out = pr.out.data();
  p.lse = pr.lse.data();
  p.path = sparsemla::Path::Cpu;
  const int32_t splits = sparsemla::decode_num_splits(p);
  pr.workspace.resize(sparsemla::decode_workspace_size(T, s.heads, splits) / sizeof(float));

  pr.flops = 2.0 * H * keys * (512 + 512);
  pr.bytes = keys * (kTokenBytes + 4.0) + 2.0 * T * H * kDim * 2;
}

void bm_decode(benchmark::State& state, Shape shape) {
  Problem pr;
  build(pr, shape, state.range(0));
  for (auto _ : state) {
    sparsemla::sparse_decode(pr.params, pr.workspace.data(), pr.workspace.size() * sizeof(float));
    benchmark::DoNotOptimize(pr.out.data());
    benchmark::ClobberMemory();
  }
  using benchmark::Counter;
  // Rates: the console shows them as GFLOP=<x>/s and GB=<y>/s.
  state.counters["GFLOP"] = Counter(pr.flops * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["GB"] = Counter(pr.bytes * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["S"] = sparsemla::decode_num_splits(pr.params);
}

void register_all() {
  // CONTRACT 10 standard shapes; C128 sized for a small CPU (extra 512..2048, lengths varying 4x).
  const Shape shapes[] = {
      {"C4Flash_H64_128+512", 64, 128, 512, 512, 1},
      {"C4Pro_H128_128+1024", 128, 128, 1024, 1024, 1},
      {"C128_H64_128+512..2048", 64, 128, 2048, 512, 1},
      {"TP16_H16_128+1024", 16, 128, 1024, 1024, 1},
      {"MTP2_C4Flash_H64_128+512", 64, 128, 512, 512, 2},
  };
  for (const Shape& s : shapes) {
    auto* b = benchmark::RegisterBenchmark(s.name, bm_decode, s);
    b->Arg(1)->Arg(8)->Arg(32)->ArgName("batch")->Unit(benchmark::kMillisecond)->UseRealTime();
    if (std::string(s.name).rfind("C4Flash", 0) == 0) b->Arg(128);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  // The level the decode runs at (SPARSEMLA_CPU_ISA forces one): PERF.md's table has one per level.
  benchmark::AddCustomContext("cpu_isa", sparsemla::cpu::cpu_isa_name(sparsemla::cpu::cpu_isa()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
