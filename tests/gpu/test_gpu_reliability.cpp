// tests/gpu/test_gpu_reliability.cpp: reliability of the CUDA path (issue 7), with printed
// figures for docs/RELIABILITY.md:
//   - deterministic decode: a row's bits do not depend on its batchmates or on the run, and what
//     that costs (time with and without deterministic mode);
//   - scale: caches larger than 4 GiB whose used slots sit beyond the 2^31- and 2^32-byte
//     offsets, written there by the GPU window writer and decoded from there; a ratio-128 layer at
//     the full 1,048,576-token context (8192 compressed entries per row, lists built on the GPU)
//     for batch 1 and 64;
//   - NaN provenance end to end: the GPU compressor in sanitising and legacy modes, the GPU decode
//     of both, the float64 reference with the extra scrub skipped (the specialised path's gate),
//     and poisoned rows with the gate closed.
// Data at model magnitudes (CONTRACT 9.9, decode_fixture.h); decode outputs are held to the rule
// of CONTRACT 9.9 (include/sparsemla/verify.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "reference/decode_fixture.h"
#include "reference/random.h"
#include "reference/reliability_fixture.h"
#include "sparsemla/decode.h"
#include "sparsemla/lists.h"
#include "sparsemla/plan.h"
#include "sparsemla/verify.h"
#include "sparsemla/writer.h"

namespace sparsemla::test::gpu_reliability {
namespace {

using decode::CacheSpec;
using decode::CaseSpec;
using decode::DecodeCase;
using decode::FastRun;
using decode::kPoisonBf16;
using decode::RefRun;
using decode::TestCache;
using decode::TestList;
using reliability::Batch;
using reliability::CompressorInputs;
using reliability::count_value_differences;
using reliability::Poison;
using reliability::RowPool;

// ---- CUDA plumbing (gpu_support.h)
// -------------------------------------------------------------------------------
using gpu_support::cuda_ok;
using Device = gpu_support::DeviceBuffer;

bool reduced() {  // SPARSEMLA_GPU_TEST_REDUCED=1: fewer shapes (compute-sanitizer runs)
  const char* s = std::getenv("SPARSEMLA_GPU_TEST_REDUCED");
  return s != nullptr && *s != '\0' && std::string(s) != "0";
}

template <typename T>
Device upload(const std::vector<T>& v) {
  Device d(std::max<size_t>(v.size(), 1) * sizeof(T));
  d.upload(v.data(), v.size() * sizeof(T));
  return d;
}
template <typename T>
std::vector<T> download(const Device& d, size_t n) {
  std::vector<T> v(n);
  d.download(v.data(), n * sizeof(T));
  return v;
}

int64_t engine_stride(int32_t bs) {  // bs*584 rounded up to a multiple of 576
  return (int64_t{bs} * 584 + 575) / 576 * 576;
}

// A cache of model data (decode_fixture.h) on engine-padded pages.
CacheSpec engine_cache(int32_t bs, int64_t blocks) {
  CacheSpec s;
  s.block_size = bs;
  s.num_blocks = blocks;
  s.page_pad = engine_stride(bs) - int64_t{bs} * 584;
  return s;
}

// A device run of host-described params: the caller maps pointers; out/lse/workspace poisoned.
struct GpuOut {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
  int32_t splits = 0;
};
GpuOut run_decode(DecodeParams p, int64_t out_elems, int64_t lse_elems) {
  GpuOut r;
  Device out(out_elems * 2), lse(std::max<int64_t>(lse_elems, 1) * 4);
  out.fill(0xFF);
  lse.fill(0xFF);
  p.out = out.as<bf16_bits>();
  p.lse = lse_elems > 0 ? lse.as<float>() : nullptr;
  r.splits = decode_num_splits(p);
  const size_t bytes = decode_workspace_size(p.num_tokens, p.num_heads, r.splits);
  Device ws(bytes);
  ws.fill(0xFF);
  sparse_decode(p, ws.as<void>(), bytes);
  cuda_ok(cudaDeviceSynchronize(), "decode");
  r.out = download<bf16_bits>(out, static_cast<size_t>(out_elems));
  r.lse = download<float>(lse, static_cast<size_t>(lse_elems));
  return r;
}

// Median milliseconds of `reps` launches after 3 warm-up launches (CUDA events, default stream).
double time_decode(const DecodeParams& p, void* ws, size_t ws_bytes, int reps) {
  for (int i = 0; i < 3; ++i) sparse_decode(p, ws, ws_bytes);
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "event");
  cuda_ok(cudaEventCreate(&b), "event");
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cuda_ok(cudaEventRecord(a), "record");
    sparse_decode(p, ws, ws_bytes);
    cuda_ok(cudaEventRecord(b), "record");
    cuda_ok(cudaEventSynchronize(b), "sync");
    float t = 0;
    cuda_ok(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// ---- determinism
// --------------------------------------------------------------------------------- The pool's
// caches live on the device once; each batch uploads its q and lists.
struct DevicePool {
  Device main, extra;
  Device sink;
  explicit DevicePool(const RowPool& pool) {
    const CacheView m = pool.main->view(), x = pool.extra->view();
    main = Device(static_cast<size_t>(m.num_blocks * m.block_stride));
    main.upload(m.base, main.bytes());
    extra = Device(static_cast<size_t>(x.num_blocks * x.block_stride));
    extra.upload(x.base, extra.bytes());
    sink = upload(pool.sink);
  }
};

struct DeviceBatch {
  Device q, mi, mp, xi, xp;
  explicit DeviceBatch(const Batch& b)
      : q(upload(b.q)),
        mi(upload(b.main_list.indices)),
        mp(upload(b.main_list.indptr)),
        xi(upload(b.extra_list.indices)),
        xp(upload(b.extra_list.indptr)) {}
  DecodeParams params(const RowPool& pool, const DevicePool& dp, const Batch& b) const {
    DecodeParams p = b.params(pool, nullptr, nullptr);
    p.q = q.as<bf16_bits>();
    p.main_cache.base = dp.main.as<uint8_t>();
    p.main_list.indices = mi.as<int32_t>();
    p.main_list.indptr = mp.as<int32_t>();
    p.extra_cache.base = dp.extra.as<uint8_t>();
    p.extra_list.indices = xi.as<int32_t>();
    p.extra_list.indptr = xp.as<int32_t>();
    p.sink = dp.sink.as<float>();
    p.path = Path::CudaGeneric;
    return p;
  }
};

struct RowBits {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
  bool same(const RowBits& o) const {
    return out == o.out && std::memcmp(lse.data(), o.lse.data(), lse.size() * 4) == 0;
  }
};

GpuOut decode_batch(const RowPool& pool, const DevicePool& dp, const Batch& b, bool det) {
  const DeviceBatch db(b);
  DecodeParams p = db.params(pool, dp, b);
  p.deterministic = det;
  return run_decode(p, b.T() * pool.H * 512, b.T() * pool.H);
}
RowBits row_of(const GpuOut& r, int64_t t, int32_t H) {
  RowBits rb;
  rb.out.assign(r.out.begin() + t * H * 512, r.out.begin() + (t + 1) * H * 512);
  rb.lse.assign(r.lse.begin() + t * H, r.lse.begin() + (t + 1) * H);
  return rb;
}

// A row alone and inside batches of 2..128 rows (random batchmates at random places), each twice,
// plus repeated runs of one batch: with deterministic = true no bit of a row's output or lse
// changes. deterministic = false is run on the same batches to show the comparison can fail (the
// planner's S follows the batch: 16 alone, 1..2 in a batch of 64 at H = 64 on 132 SMs).
TEST(GpuReliability, DeterministicRowsIgnoreBatchmatesAndRuns) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t H = reduced() ? 16 : 64;
  RowPool pool(rng, reduced() ? 40 : 160, H, engine_cache(64, 8), engine_cache(2, 700), 1024);
  const DevicePool dp(pool);
  std::vector<int64_t> probes;
  for (int64_t r = 0; r < pool.size(); ++r)
    if (pool.extra_rows[r].size() >= 300) probes.push_back(r);
  std::shuffle(probes.begin(), probes.end(), rng.engine());
  probes.resize(std::min<size_t>(probes.size(), reduced() ? 2 : 8));
  const std::vector<int64_t> sizes =
      reduced() ? std::vector<int64_t>{3, 17} : std::vector<int64_t>{2, 7, 33, 64, 128};
  int64_t runs = 0, compared = 0, differences = 0, nondet_differences = 0, nondet_compared = 0;
  for (int64_t probe : probes) {
    const Batch alone(rng, pool, {probe});
    const RowBits want = row_of(decode_batch(pool, dp, alone, true), 0, H);
    const RowBits want_nondet = row_of(decode_batch(pool, dp, alone, false), 0, H);
    for (int64_t size : sizes) {
      if (size > pool.size()) continue;
      for (int rep = 0; rep < 2; ++rep) {
        const Batch b(rng, pool, reliability::batch_with(rng, pool.size(), probe, size));
        const int64_t at = std::find(b.ids.begin(), b.ids.end(), probe) - b.ids.begin();
        ++runs, ++compared, ++nondet_compared;
        differences += !row_of(decode_batch(pool, dp, b, true), at, H).same(want);
        nondet_differences += !row_of(decode_batch(pool, dp, b, false), at, H).same(want_nondet);
      }
    }
    const Batch b(rng, pool, reliability::batch_with(rng, pool.size(), probe, 33));
    const GpuOut first = decode_batch(pool, dp, b, true);
    for (int rep = 0; rep < 3; ++rep) {
      const GpuOut again = decode_batch(pool, dp, b, true);
      ++runs;
      for (int64_t t = 0; t < b.T(); ++t) {
        ++compared;
        differences += !row_of(again, t, H).same(row_of(first, t, H));
      }
    }
  }
  std::printf(
      "[ determinism ] GPU H=%d: %lld runs, %lld rows compared, %lld differences "
      "(deterministic=false: %lld of %lld batch comparisons differ)\n",
      H, static_cast<long long>(runs), static_cast<long long>(compared),
      static_cast<long long>(differences), static_cast<long long>(nondet_differences),
      static_cast<long long>(nondet_compared));
  RecordProperty("rows_compared", static_cast<int>(compared));
  RecordProperty("differences", static_cast<int>(differences));
  ASSERT_GT(compared, 10);
  EXPECT_EQ(differences, 0);
  if (!reduced()) {
    EXPECT_GT(nondet_differences, 0) << "the comparison could not tell split counts apart";
  }
}

// What deterministic mode costs on the GPU: the planner's S for T = 1 at every batch size.
TEST(GpuReliability, DeterministicModeCost) {
  if (reduced()) GTEST_SKIP() << "timing only";
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  struct Shape {
    const char* name;
    int32_t H;
    int64_t extra_width;
  };
  const std::vector<Shape> shapes = {
      {"C4-Flash", 64, 512}, {"C4-Pro", 128, 1024}, {"C128", 64, 8192}};
  std::printf("[ determinism cost ] %-9s %5s %4s %4s %10s %10s %7s\n", "shape", "T", "S", "S_det",
              "ms", "ms_det", "ratio");
  for (const Shape& sh : shapes) {
    for (int64_t T : {1, 8, 64, 128}) {
      // Full rows (lengths = widths): the planner's widths and the work agree.
      CacheSpec ms = engine_cache(64, 4), xs = engine_cache(2, sh.extra_width / 2 + 8);
      TestCache main(rng, ms), extra(rng, xs);
      std::vector<std::vector<int32_t>> mains, extras;
      for (int64_t t = 0; t < T; ++t) {
        mains.push_back(decode::random_row(rng, 128, main.num_slots()));
        extras.push_back(decode::random_row(rng, sh.extra_width, extra.num_slots()));
      }
      TestList ml = TestList::from_rows(rng, mains), xl = TestList::from_rows(rng, extras);
      const std::vector<bf16_bits> q = random_bf16(rng, static_cast<size_t>(T * sh.H * 512));
      Device dq = upload(q), dm(main.view().num_blocks * main.view().block_stride),
             dx(extra.view().num_blocks * extra.view().block_stride), dmi = upload(ml.indices),
             dmp = upload(ml.indptr), dxi = upload(xl.indices), dxp = upload(xl.indptr),
             out(T * sh.H * 512 * 2);
      dm.upload(main.view().base, dm.bytes());
      dx.upload(extra.view().base, dx.bytes());
      DecodeParams p;
      p.num_tokens = T;
      p.num_heads = sh.H;
      p.q = dq.as<bf16_bits>();
      p.main_cache = {dm.as<uint8_t>(), ms.num_blocks, 64, engine_stride(64)};
      p.main_list = {dmi.as<int32_t>(), dmp.as<int32_t>(), static_cast<int64_t>(ml.indices.size()),
                     128};
      p.has_extra = true;
      p.extra_cache = {dx.as<uint8_t>(), xs.num_blocks, 2, engine_stride(2)};
      p.extra_list = {dxi.as<int32_t>(), dxp.as<int32_t>(), static_cast<int64_t>(xl.indices.size()),
                      sh.extra_width};
      p.out = out.as<bf16_bits>();
      p.path = Path::CudaGeneric;
      double ms_run[2];
      int32_t splits[2];
      for (int det = 0; det < 2; ++det) {
        p.deterministic = det == 1;
        splits[det] = decode_num_splits(p);
        const size_t bytes = decode_workspace_size(T, sh.H, splits[det]);
        Device ws(bytes);
        ms_run[det] = time_decode(p, ws.as<void>(), bytes, 30);
      }
      std::printf("[ determinism cost ] %-9s %5lld %4d %4d %10.4f %10.4f %7.2f\n", sh.name,
                  static_cast<long long>(T), splits[0], splits[1], ms_run[0], ms_run[1],
                  ms_run[1] / ms_run[0]);
      EXPECT_GT(ms_run[0], 0.0);
    }
  }
}

// ---- scale: caches beyond 4 GiB
// ------------------------------------------------------------------ Per CONTRACT 9.4 / issue 7:
// both caches are > 4 GiB device buffers (the rest filled with 0x7E bytes, values 224 * 2^-1: any
// mis-addressed read changes the result); the used pages sit at block ids whose byte offsets exceed
// 2^31 and 2^32. The host holds only the used pages (a compact cache); the device lists address the
// same rows through the large block ids. The GPU window writer then writes 16 tokens into high
// slots of the large window cache (compared byte for byte with the CPU writer on the compact cache)
// before the decode reads them.
TEST(GpuReliability, CachesBeyond4GiBUse64BitOffsetsEndToEnd) {
  if (reduced()) GTEST_SKIP() << "allocates 9 GiB";
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int64_t kBytes = (int64_t{9} << 29);  // 4.5 GiB per cache
  struct Geometry {
    int32_t bs;
    int64_t stride, blocks;
    std::vector<int64_t> used;  // large block id of compact page k
  };
  Geometry gm{64, engine_stride(64), 0, {}}, gx{2, engine_stride(2), 0, {}};
  for (Geometry* g : {&gm, &gx}) {
    g->blocks = kBytes / g->stride;
    const int64_t above_2g = (int64_t{1} << 31) / g->stride + 1;
    const int64_t above_4g = (int64_t{1} << 32) / g->stride + 1;
    const int64_t pages = g->bs == 64 ? 6 : 300;
    for (int64_t k = 0; k < pages; ++k) {
      // Two thirds beyond 4 GiB, the rest between 2 and 4 GiB; the last page of the cache too.
      const int64_t lo = k % 3 == 0 ? above_2g : above_4g,
                    hi = k % 3 == 0 ? above_4g - 1 : g->blocks - 1;
      int64_t b;
      do {
        b = k == 0 ? g->blocks - 1 : rng.randint(lo, hi);
      } while (std::find(g->used.begin(), g->used.end(), b) != g->used.end());
      g->used.push_back(b);
    }
  }
  CaseSpec s;
  s.T = 6;
  s.H = 64;
  s.main = engine_cache(gm.bs, static_cast<int64_t>(gm.used.size()));
  s.extra = engine_cache(gx.bs, static_cast<int64_t>(gx.used.size()));
  s.main_lengths = std::vector<int64_t>(6, 128);
  s.extra_lengths = std::vector<int64_t>(6, 500);
  s.p_invalid = 0.02;
  DecodeCase c(rng, s);

  // The large device caches hold the compact pages at their high block ids (the window cache as
  // it is before the writer runs).
  Device big_main(static_cast<size_t>(gm.blocks * gm.stride)),
      big_extra(static_cast<size_t>(gx.blocks * gx.stride));
  ASSERT_GT(big_main.bytes(), size_t{1} << 32);
  ASSERT_GT(big_extra.bytes(), size_t{1} << 32);
  big_main.fill(0x7E);
  big_extra.fill(0x7E);
  const auto put_pages = [](Device& dev, const TestCache& cache, const Geometry& g) {
    const CacheView v = cache.view();
    for (size_t k = 0; k < g.used.size(); ++k) {
      dev.upload(v.base + k * v.block_stride, static_cast<size_t>(v.block_stride),
                 static_cast<size_t>(g.used[k] * g.stride));
    }
  };
  put_pages(big_main, *c.main, gm);
  put_pages(big_extra, *c.extra, gx);

  // The window writer: 16 tokens of model latents into distinct main slots, by the CPU into the
  // compact host cache (what the reference reads) and by the GPU into the large slots.
  const int64_t N = 16;
  std::vector<int64_t> compact_slots, large_slots, positions;
  while (static_cast<int64_t>(compact_slots.size()) < N) {
    const int64_t slot = rng.randint(0, c.main->num_slots() - 1);
    if (std::find(compact_slots.begin(), compact_slots.end(), slot) != compact_slots.end())
      continue;
    compact_slots.push_back(slot);
    large_slots.push_back(gm.used[slot / gm.bs] * gm.bs + slot % gm.bs);
    positions.push_back(rng.randint(0, 999));
  }
  const std::vector<bf16_bits> kv = decode::model_latents(rng, N);
  std::vector<float> table;
  for (int64_t p = 0; p < 1000; ++p) {
    for (int k = 0; k < 32; ++k) table.push_back(static_cast<float>(std::cos(0.001 * p * (k + 1))));
    for (int k = 0; k < 32; ++k) table.push_back(static_cast<float>(std::sin(0.001 * p * (k + 1))));
  }
  {
    WindowWriterParams w;
    w.num_tokens = N;
    w.kv = kv.data();
    w.positions = positions.data();
    w.slots = compact_slots.data();
    w.rope = {table.data(), 1000, 64};
    const CacheView v = c.main->view();
    w.cache = {const_cast<uint8_t*>(v.base), v.num_blocks, v.block_size, v.block_stride};
    w.path = Path::Cpu;
    write_window(w);
  }
  Device dkv = upload(kv), dpos = upload(positions), dslots = upload(large_slots),
         dtable = upload(table);
  WindowWriterParams w;
  w.num_tokens = N;
  w.kv = dkv.as<bf16_bits>();
  w.positions = dpos.as<int64_t>();
  w.slots = dslots.as<int64_t>();
  w.rope = {dtable.as<float>(), 1000, 64};
  w.cache = {big_main.as<uint8_t>(), gm.blocks, gm.bs, gm.stride};
  w.path = Path::CudaGeneric;
  write_window(w);
  cuda_ok(cudaDeviceSynchronize(), "window writer");
  int64_t max_offset = 0;
  for (int64_t i = 0; i < N; ++i) {  // the GPU-written rows equal the CPU-written ones
    const int64_t off = gm.used[compact_slots[i] / gm.bs] * gm.stride;
    const int64_t row = compact_slots[i] % gm.bs;
    std::vector<uint8_t> data(576), codes(8);
    big_main.download(data.data(), 576, static_cast<size_t>(off + row * 576));
    big_main.download(codes.data(), 8, static_cast<size_t>(off + int64_t{gm.bs} * 576 + row * 8));
    const uint8_t* want = c.main->data_row(compact_slots[i]);
    EXPECT_EQ(std::memcmp(data.data(), want, 576), 0) << "token " << i;
    EXPECT_EQ(std::memcmp(codes.data(), c.main->code_row(compact_slots[i]), 8), 0) << "token " << i;
    max_offset = std::max(max_offset, off + row * 576);
  }

  // Device lists: compact slot -> large slot. Invalid values stay invalid: negatives as they are,
  // values past the compact cache (n, n + 1024, INT32_MAX) to the same distance past the large one
  // (which has far more slots, so n itself would be a valid large slot).
  const auto remap = [](const std::vector<int32_t>& v, const Geometry& g, int64_t n) {
    std::vector<int32_t> out(v);
    const int64_t large_slots = g.blocks * g.bs;
    for (auto& s : out) {
      if (s >= 0 && s < n) {
        s = static_cast<int32_t>(g.used[s / g.bs] * g.bs + s % g.bs);
      } else if (s >= n) {
        s = static_cast<int32_t>(std::min<int64_t>(decode::kInt32Max, large_slots + (s - n)));
      }
    }
    return out;
  };
  Device dq = upload(c.q), dmi = upload(remap(c.main_list.indices, gm, c.main->num_slots())),
         dmp = upload(c.main_list.indptr),
         dxi = upload(remap(c.extra_list.indices, gx, c.extra->num_slots())),
         dxp = upload(c.extra_list.indptr), dsink = upload(c.sink);
  for (const Geometry& g : {gm, gx}) {
    for (int64_t b : g.used) max_offset = std::max(max_offset, b * g.stride);
  }
  DecodeParams p = c.params(nullptr, nullptr);
  p.q = dq.as<bf16_bits>();
  p.main_cache = {big_main.as<uint8_t>(), gm.blocks, gm.bs, gm.stride};
  p.main_list.indices = dmi.as<int32_t>();
  p.main_list.indptr = dmp.as<int32_t>();
  p.extra_cache = {big_extra.as<uint8_t>(), gx.blocks, gx.bs, gx.stride};
  p.extra_list.indices = dxi.as<int32_t>();
  p.extra_list.indptr = dxp.as<int32_t>();
  p.sink = dsink.as<float>();
  p.path = Path::CudaGeneric;
  const RefRun ref = decode::run_reference(c, [](DecodeParams& q) { q.path = Path::CudaGeneric; });
  for (int32_t splits : {0, 1, 7}) {
    SCOPED_TRACE("S=" + std::to_string(splits));
    DecodeParams ps = p;
    ps.num_splits = splits;
    FastRun run;
    const GpuOut g =
        run_decode(ps, static_cast<int64_t>(c.out_elems()), static_cast<int64_t>(c.lse_elems()));
    run.out = g.out;
    run.lse = g.lse;
    run.out_stride_token = c.out_stride_token;
    run.out_stride_head = c.out_stride_head;
    run.lse_stride_token = c.lse_stride_token;
    decode::expect_kernel_matches_reference(c, run, ref);
  }
  std::printf(
      "[ large cache ] window cache %.2f GiB, compressed cache %.2f GiB, highest used "
      "byte offset %.3f GiB (> 2^32): GPU writer rows equal the CPU's (%lld), decode "
      "within the CONTRACT 9 tolerance for S = planner, 1, 7\n",
      big_main.bytes() / 1073741824.0, big_extra.bytes() / 1073741824.0, max_offset / 1073741824.0,
      static_cast<long long>(N));
  EXPECT_GT(max_offset, int64_t{1} << 32);
}

// ---- scale: a ratio-128 layer at the full context --------------------------------------------
// 1,048,576 tokens: max_compressed_entries = 8192 per row. Window and compressed lists are built
// on the GPU (positions 1,048,575 for every row: all 8192 entries complete), compared with the CPU
// builders, and the decode (H = 64) is compared with the float64 reference for batch 1 and 64.
TEST(GpuReliability, Ratio128FullContextBatch1And64) {
  if (reduced()) GTEST_SKIP() << "full-context shapes";
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int64_t kContext = 1048576;
  const int64_t W = max_compressed_entries(kContext, 128);
  ASSERT_EQ(W, 8192);
  for (int64_t T : {1, 64}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const int32_t cbs = 2, wbs = 64;
    const int64_t cpages = W / cbs;  // per request
    CaseSpec s;
    s.T = T;
    s.H = 64;
    s.main = engine_cache(wbs, 2 * T + 3);
    s.extra = engine_cache(cbs, cpages * T + 5);
    s.main_lengths = std::vector<int64_t>(T, 1);
    s.extra_lengths = std::vector<int64_t>(T, 1);
    s.positions = false;
    DecodeCase c(rng, s);
    // Block tables: every request its own shuffled pages.
    std::vector<int32_t> cpage_ids(static_cast<size_t>(cpages * T + 5));
    for (size_t i = 0; i < cpage_ids.size(); ++i) cpage_ids[i] = static_cast<int32_t>(i);
    std::shuffle(cpage_ids.begin(), cpage_ids.end(), rng.engine());
    std::vector<int32_t> cbt(cpage_ids.begin(), cpage_ids.begin() + cpages * T);
    const int32_t wt_width = static_cast<int32_t>(kContext / wbs);  // the window table row
    std::vector<int32_t> wbt(static_cast<size_t>(T * wt_width), -7);
    for (int64_t r = 0; r < T; ++r) {  // the last two pages hold positions 1,048,448..575
      wbt[r * wt_width + wt_width - 2] = static_cast<int32_t>(2 * r);
      wbt[r * wt_width + wt_width - 1] = static_cast<int32_t>(2 * r + 1);
    }
    const std::vector<int64_t> positions(static_cast<size_t>(T), kContext - 1);
    // CPU lists (the reference's) and GPU lists (the decode's), compared entry for entry.
    TestList main_cpu, extra_cpu;
    main_cpu.indices.assign(static_cast<size_t>(T * 128), 0);
    main_cpu.indptr.assign(static_cast<size_t>(T + 1), 0);
    extra_cpu.indices.assign(static_cast<size_t>(T * W), 0);
    extra_cpu.indptr.assign(static_cast<size_t>(T + 1), 0);
    main_cpu.width = 128;
    extra_cpu.width = W;
    Device dpos = upload(positions), dwbt = upload(wbt), dcbt = upload(cbt), dmi(T * 128 * 4),
           dmp((T + 1) * 4), dxi(T * W * 4), dxp((T + 1) * 4);
    for (bool gpu : {false, true}) {
      WindowListParams wl;
      wl.common.num_rows = T;
      wl.common.path = gpu ? Path::CudaGeneric : Path::Cpu;
      wl.positions = gpu ? dpos.as<int64_t>() : positions.data();
      wl.block_table = gpu ? dwbt.as<int32_t>() : wbt.data();
      wl.block_table_stride = wt_width;
      wl.table_width = wt_width;
      wl.num_requests = T;
      wl.block_size = wbs;
      wl.out = {gpu ? dmi.as<int32_t>() : main_cpu.indices.data(),
                gpu ? dmp.as<int32_t>() : main_cpu.indptr.data(), 128};
      build_window_lists(wl);
      CompressedAllListParams cl;
      cl.common.num_rows = T;
      cl.common.path = wl.common.path;
      cl.positions = wl.positions;
      cl.block_table = gpu ? dcbt.as<int32_t>() : cbt.data();
      cl.block_table_stride = cpages;
      cl.table_width = static_cast<int32_t>(cpages);
      cl.num_requests = T;
      cl.block_size = cbs;
      cl.ratio = 128;
      cl.max_compressed = W;
      cl.out = {gpu ? dxi.as<int32_t>() : extra_cpu.indices.data(),
                gpu ? dxp.as<int32_t>() : extra_cpu.indptr.data(), W};
      build_compressed_all_lists(cl);
    }
    cuda_ok(cudaDeviceSynchronize(), "builders");
    EXPECT_EQ(download<int32_t>(dmp, T + 1), main_cpu.indptr);
    EXPECT_EQ(download<int32_t>(dxp, T + 1), extra_cpu.indptr);
    EXPECT_EQ(download<int32_t>(dmi, T * 128), main_cpu.indices);
    EXPECT_EQ(download<int32_t>(dxi, T * W), extra_cpu.indices);
    ASSERT_EQ(extra_cpu.indptr[1], W) << "8192 compressed entries per row";
    ASSERT_EQ(main_cpu.indptr[1], 128);
    c.main_list = main_cpu;
    c.extra_list = extra_cpu;

    Device dq = upload(c.q), dsink = upload(c.sink),
           dm(static_cast<size_t>(c.main->view().num_blocks * c.main->view().block_stride)),
           dx(static_cast<size_t>(c.extra->view().num_blocks * c.extra->view().block_stride));
    dm.upload(c.main->view().base, dm.bytes());
    dx.upload(c.extra->view().base, dx.bytes());
    DecodeParams p = c.params(nullptr, nullptr);
    p.q = dq.as<bf16_bits>();
    p.main_cache.base = dm.as<uint8_t>();
    p.main_list = {dmi.as<int32_t>(), dmp.as<int32_t>(), T * 128, 128};
    p.extra_cache.base = dx.as<uint8_t>();
    p.extra_list = {dxi.as<int32_t>(), dxp.as<int32_t>(), T * W, W};
    p.sink = dsink.as<float>();
    p.path = Path::CudaGeneric;
    const RefRun ref =
        decode::run_reference(c, [](DecodeParams& q) { q.path = Path::CudaGeneric; });
    const GpuOut g =
        run_decode(p, static_cast<int64_t>(c.out_elems()), static_cast<int64_t>(c.lse_elems()));
    FastRun run;
    run.out = g.out;
    run.lse = g.lse;
    run.out_stride_token = c.out_stride_token;
    run.out_stride_head = c.out_stride_head;
    run.lse_stride_token = c.lse_stride_token;
    decode::expect_kernel_matches_reference(c, run, ref);
    // Its time (lists and caches as above; out written to a scratch buffer).
    Device out(c.out_elems() * 2);
    p.out = out.as<bf16_bits>();
    p.lse = nullptr;
    const size_t bytes = decode_workspace_size(T, 64, g.splits);
    Device ws(bytes);
    const double ms = time_decode(p, ws.as<void>(), bytes, 20);
    std::printf(
        "[ full context ] ratio 128, 1,048,576 tokens: T=%lld H=64, %lld compressed + 128 "
        "window entries per row, S=%d: matches the float64 reference; %.3f ms\n",
        static_cast<long long>(T), static_cast<long long>(W), g.splits, ms);
  }
}

// ---- NaN provenance end to end
// ------------------------------------------------------------------- The decode problem over a
// compressed cache (as in the CPU test): T rows, a window list over a clean main cache and every
// compressed entry, shuffled, plus two invalid slots.
struct ProvenanceProblem {
  int64_t T = 4;
  int32_t H = 16;
  std::optional<TestCache> main;
  std::vector<bf16_bits> q;
  TestList main_list, extra_list;
  std::vector<float> sink;
  const CompressorInputs* in;

  ProvenanceProblem(Rng& rng, const CompressorInputs& inputs) : in(&inputs) {
    main.emplace(rng, engine_cache(16, 4));
    q = random_bf16(rng, static_cast<size_t>(T * H * 512));
    sink = random_f32(rng, H);
    std::vector<std::vector<int32_t>> mains, extras;
    for (int64_t t = 0; t < T; ++t) {
      mains.push_back(decode::random_row(rng, 40, main->num_slots(), 0.05));
      std::vector<int32_t> all;
      for (int64_t j = 0; j < inputs.entries; ++j) all.push_back(static_cast<int32_t>(j));
      all.push_back(-1);
      all.push_back(static_cast<int32_t>(inputs.num_cblocks * 2 + 3));
      std::shuffle(all.begin(), all.end(), rng.engine());
      extras.push_back(all);
    }
    main_list = TestList::from_rows(rng, mains);
    extra_list = TestList::from_rows(rng, extras);
  }
  DecodeParams host_params(const std::vector<uint8_t>& cache) const {
    DecodeParams p;
    p.num_tokens = T;
    p.num_heads = H;
    p.q = q.data();
    p.main_cache = main->view();
    p.main_list = main_list.view();
    p.has_extra = true;
    p.extra_cache = {cache.data(), in->num_cblocks, CompressorInputs::kCbs,
                     CompressorInputs::kCstride};
    p.extra_list = extra_list.view();
    p.sink = sink.data();
    p.path = Path::Cpu;
    return p;
  }
  // abs_mean (or null) receives the reference's A (verify.h).
  std::vector<double> reference(const std::vector<uint8_t>& cache, bool skip_scrub,
                                std::vector<double>* abs_mean = nullptr) const {
    DecodeParams p = host_params(cache);
    p.path = skip_scrub ? Path::CudaSm90 : Path::CudaGeneric;
    p.extra_cache_sanitised = true;
    std::vector<double> out(static_cast<size_t>(T * H * 512));
    if (abs_mean != nullptr) abs_mean->assign(out.size(), 0.0);
    sparse_decode_reference(p, out.data(), nullptr,
                            abs_mean != nullptr ? abs_mean->data() : nullptr);
    return out;
  }
  // The generic GPU decode of `cache` (uploaded here).
  std::vector<bf16_bits> gpu(const std::vector<uint8_t>& cache, int32_t splits, bool sanitised,
                             bool connector) const {
    Device dq = upload(q),
           dm(static_cast<size_t>(main->view().num_blocks * main->view().block_stride)),
           dx = upload(cache), dmi = upload(main_list.indices), dmp = upload(main_list.indptr),
           dxi = upload(extra_list.indices), dxp = upload(extra_list.indptr), ds = upload(sink);
    dm.upload(main->view().base, dm.bytes());
    DecodeParams p = host_params(cache);
    p.q = dq.as<bf16_bits>();
    p.main_cache.base = dm.as<uint8_t>();
    p.main_list.indices = dmi.as<int32_t>();
    p.main_list.indptr = dmp.as<int32_t>();
    p.extra_cache.base = dx.as<uint8_t>();
    p.extra_list.indices = dxi.as<int32_t>();
    p.extra_list.indptr = dxp.as<int32_t>();
    p.sink = ds.as<float>();
    p.num_splits = splits;
    p.extra_cache_sanitised = sanitised;
    p.kv_connector = connector;
    p.path = Path::CudaGeneric;
    return run_decode(p, T * H * 512, 0).out;
  }
};

// The GPU state writer + compressor, writing a fresh cache (padding random).
std::vector<uint8_t> compress_on_gpu(Rng& rng, const CompressorInputs& in, bool sanitise) {
  Device kv = upload(in.kv), score = upload(in.score), pos = upload(in.positions),
         sslots = upload(in.state_slots), oslots = upload(in.out_slots), req = upload(in.requests),
         table = upload(in.state_table), weight = upload(in.norm_weight), rope = upload(in.rope),
         state(in.state_floats() * 4), cache = upload(random_bytes(rng, in.cache_bytes()));
  state.fill(0xFF);
  StateWriterParams sw = in.state_params(kv.as<float>(), score.as<float>(), pos.as<int64_t>(),
                                         sslots.as<int64_t>(), state.as<float>());
  sw.path = Path::CudaGeneric;
  write_compressor_state(sw);
  CompressorParams cp =
      in.compress_params(pos.as<int64_t>(), req.as<int32_t>(), sslots.as<int64_t>(),
                         oslots.as<int64_t>(), table.as<int32_t>(), state.as<float>(),
                         weight.as<float>(), rope.as<float>(), cache.as<uint8_t>(), sanitise);
  cp.path = Path::CudaGeneric;
  compress(cp);
  cuda_ok(cudaDeviceSynchronize(), "compressor");
  return download<uint8_t>(cache, in.cache_bytes());
}

// The CONTRACT 9.9 rule between a GPU output [T, H, 512] and the float64 reference with its A.
void expect_spec9(const std::vector<bf16_bits>& out, int64_t T, int32_t H,
                  const std::vector<double>& ref, const std::vector<double>& abs_mean) {
  const VerifyResult v =
      verify_decode_output(out.data(), T, H, int64_t{H} * 512, 512, ref.data(), abs_mean.data());
  EXPECT_TRUE(v.passed) << v.summary();
}

// CONTRACT 5 end to end on the GPU: the sanitising GPU compressor's rows decoded without the scrub
// equal the legacy GPU compressor's rows decoded with it; the GPU decode (generic path: always
// scrubs) of both caches gives equal values, and it matches the float64 reference that skips the
// extra scrub under the gate (the specialised path's decision). NaN-only poison: all finite.
TEST(GpuReliability, NanProvenanceSanitisedGpuCompressorToDecode) {
  for (Poison poison : {Poison::kNanOnly, Poison::kNanAndInf}) {
    const uint64_t seed = fresh_seed();
    SPARSEMLA_SEED_TRACE(seed);
    SCOPED_TRACE(poison == Poison::kNanOnly ? "NaN poison" : "NaN and inf poison");
    Rng rng(seed);
    const CompressorInputs in(rng, reduced() ? 12 : 40, poison);
    const std::vector<uint8_t> sanitised = compress_on_gpu(rng, in, true);
    const std::vector<uint8_t> legacy = compress_on_gpu(rng, in, false);
    const CacheView sv{sanitised.data(), in.num_cblocks, CompressorInputs::kCbs,
                       CompressorInputs::kCstride};
    const CacheView lv{legacy.data(), in.num_cblocks, CompressorInputs::kCbs,
                       CompressorInputs::kCstride};
    int64_t rows_differing = 0, legacy_nan_rows = 0;
    for (int64_t slot = 0; slot < in.entries; ++slot) {
      std::vector<float> raw(512), legacy_scrubbed(512), legacy_raw(512);
      dequantize_row(sv, slot, false, raw.data());
      dequantize_row(lv, slot, true, legacy_scrubbed.data());
      dequantize_row(lv, slot, false, legacy_raw.data());
      EXPECT_EQ(reliability::count_nan(raw), 0) << "slot " << slot;
      rows_differing += count_value_differences(raw, legacy_scrubbed) != 0;
      legacy_nan_rows += reliability::count_nan(legacy_raw) > 0;
    }
    EXPECT_EQ(rows_differing, 0);
    EXPECT_GT(legacy_nan_rows, 0);
    const ProvenanceProblem pb(rng, in);
    std::vector<double> skipped_abs_mean;
    const std::vector<double> skipped =
        pb.reference(sanitised, /*skip_scrub=*/true, &skipped_abs_mean);
    EXPECT_EQ(count_value_differences(skipped, pb.reference(sanitised, false)), 0);
    int64_t nan_out = 0;
    for (int32_t splits : {1, 5}) {
      const std::vector<bf16_bits> a = pb.gpu(sanitised, splits, true, false);
      const std::vector<bf16_bits> b = pb.gpu(legacy, splits, true, false);
      EXPECT_EQ(count_value_differences(reliability::bf16_values(a), reliability::bf16_values(b)),
                0)
          << "S=" << splits;
      // +-inf keys (inf poison) are outside the accuracy contract (CONTRACT 9): values only there.
      if (poison == Poison::kNanOnly) expect_spec9(a, pb.T, pb.H, skipped, skipped_abs_mean);
      nan_out += reliability::count_nan(reliability::bf16_values(a));
    }
    if (poison == Poison::kNanOnly) {
      EXPECT_EQ(nan_out, 0);
    }
    std::printf(
        "[ nan provenance ] GPU compressor, %s: %lld entries, %lld legacy rows with NaN, "
        "sanitised rows unscrubbed == legacy rows scrubbed, decodes equal\n",
        poison == Poison::kNanOnly ? "NaN poison" : "NaN+inf poison",
        static_cast<long long>(in.entries), static_cast<long long>(legacy_nan_rows));
  }
}

// Rows poisoned after the fact (NaN bytes, code 255 over zero bytes, NaN RoPE) decoded on the GPU
// with the gate closed -- whatever the caller asserts, with or without a connector: the result
// equals the decode of the explicitly scrubbed twin and holds no NaN.
TEST(GpuReliability, NanProvenancePoisonedRowsGateClosedGiveScrubbedResult) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const CompressorInputs in(rng, reduced() ? 16 : 40, Poison::kNone);
  std::vector<uint8_t> cache = compress_on_gpu(rng, in, true), twin;
  int64_t poisoned = 0;
  reliability::poison_scrubbably(rng, cache, twin, in.num_cblocks, CompressorInputs::kCbs,
                                 CompressorInputs::kCstride, &poisoned);
  ASSERT_GT(poisoned, 2);
  const ProvenanceProblem pb(rng, in);
  std::vector<double> want_abs_mean;
  const std::vector<double> want = pb.reference(twin, /*skip_scrub=*/true, &want_abs_mean);
  for (bool sanitised : {false, true}) {
    for (bool connector : {false, true}) {
      for (int32_t splits : {1, 4}) {
        SCOPED_TRACE("asserted=" + std::to_string(sanitised) +
                     " connector=" + std::to_string(connector) + " S=" + std::to_string(splits));
        const auto got = reliability::bf16_values(pb.gpu(cache, splits, sanitised, connector));
        EXPECT_EQ(reliability::count_nan(got), 0);
        EXPECT_EQ(count_value_differences(
                      got, reliability::bf16_values(pb.gpu(twin, splits, sanitised, connector))),
                  0);
      }
    }
  }
  expect_spec9(pb.gpu(cache, 0, true, false), pb.T, pb.H, want, want_abs_mean);
  std::printf(
      "[ nan provenance ] GPU, %lld poisoned rows, gate closed: no NaN, equal to the "
      "scrubbed twin\n",
      static_cast<long long>(poisoned));
}

}  // namespace
}  // namespace sparsemla::test::gpu_reliability
