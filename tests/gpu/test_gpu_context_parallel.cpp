// tests/gpu/test_gpu_context_parallel.cpp: decode context parallelism (CONTRACT 12) on one GPU.
//  - merge_ranks: the CUDA kernel against the CPU backend on the same inputs, bit for bit (both
//    evaluate src/core/merge_math.h: fp32 operations rounded one by one, exp_portable /
//    log_portable, ranks summed in order; NaN compared as NaN, whose payload may differ), over
//    R in {1, 2, 3, 8, 40}, H in {1, 16, 64, 128}, bf16 and fp32 rank outputs, aligned and
//    unaligned strides, sinks (+-inf and NaN among them), inverse RoPE, empty / -inf /
//    underflowed / NaN ranks; under CUDA-graph replay with new inputs.
//  - shard_list: the CUDA kernels against the CPU backend, every list byte (ragged and dense
//    inputs, padding rows, indices past indptr[T] untouched).
//  - the pipeline on the device (lists sharded into R = 2, 3, 8 pieces on the GPU, every rank's
//    decode on the path under test without the sink, the merge with it) against the float64
//    reference of the unsharded decode (CONTRACT 9.9, lse 9.4), and the device merge against the
//    CPU merge of the same device rank outputs, bit for bit.
// Fresh random data per run (SPARSEMLA_TEST_SEED reproduces one).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "reference/cp_reference.h"
#include "reference/decode_fixture.h"
#include "reference/random.h"
#include "sparsemla/context_parallel.h"
#include "sparsemla/decode.h"

namespace sparsemla::test::gpu_cp {
namespace {

using cp::Synthetic;
using decode::kDim;
using decode::kPoisonBf16;
using gpu_support::cuda_ok;
using gpu_support::device_is_sm90;
using gpu_support::DeviceBuffer;
using gpu_support::to_device;

constexpr float kInf = std::numeric_limits<float>::infinity();

bool same_float(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, 4) == 0;
}
bool same_bf16(bf16_bits a, bf16_bits b) {
  return std::isnan(bf16_to_float(a)) ? std::isnan(bf16_to_float(b)) : a == b;
}

// The merge of `s` with output strides (token, head) on the CPU and on the GPU.
struct MergeLayout {
  bool f32 = false, sink = true, rope = true, lse = true;
  int64_t out_pad = 0;  // elements after each head row of out (odd: no 8-byte stores)
  int64_t in_pad = 0;   // elements after each head row of the rank outputs (odd: no vector loads)
};

struct MergeResult {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
};

// Rank outputs re-laid with in_pad; returns the params over host arrays held in `keep`.
struct HostMerge {
  std::vector<bf16_bits> out_r;
  std::vector<float> out_r32;
  RankMergeParams p;
  MergeResult res;
};

HostMerge host_merge(const Synthetic& s, const MergeLayout& l) {
  HostMerge m;
  const int64_t sh = kDim + l.in_pad, st = s.H * sh, sr = s.T * st;
  m.out_r.assign(static_cast<size_t>(s.R * sr), kPoisonBf16);
  m.out_r32.assign(m.out_r.size(), decode::nan_f32());
  for (int32_t r = 0; r < s.R; ++r)
    for (int64_t t = 0; t < s.T; ++t)
      for (int32_t h = 0; h < s.H; ++h)
        for (int d = 0; d < kDim; ++d) {
          const size_t src = static_cast<size_t>(((r * s.T + t) * s.H + h) * kDim + d);
          const size_t dst = static_cast<size_t>(r * sr + t * st + h * sh + d);
          m.out_r[dst] = s.out[src];
          m.out_r32[dst] = s.out_f32[src];
        }
  const int64_t osh = kDim + l.out_pad, ost = s.H * osh;
  m.res.out.assign(static_cast<size_t>(s.T * ost), kPoisonBf16);
  m.res.lse.assign(static_cast<size_t>(s.T * s.H), decode::nan_f32());
  RankMergeParams& p = m.p;
  p.num_tokens = s.T;
  p.num_heads = s.H;
  p.num_ranks = s.R;
  if (l.f32) {
    p.rank_out_f32 = m.out_r32.data();
  } else {
    p.rank_out = m.out_r.data();
  }
  p.rank_out_stride_head = sh;
  p.rank_out_stride_token = st;
  p.rank_out_stride_rank = sr;
  p.rank_lse = s.lse.data();
  p.sink = l.sink ? s.sink.data() : nullptr;
  if (l.rope) {
    p.positions = s.positions.data();
    p.rope = {s.rope.data(), static_cast<int64_t>(s.rope.size() / 64), 64};
  }
  p.out = m.res.out.data();
  p.out_stride_head = osh;
  p.out_stride_token = ost;
  p.lse = l.lse ? m.res.lse.data() : nullptr;
  p.path = Path::Cpu;
  return m;
}

// The same call on device copies of every array (outputs poisoned alike).
struct DeviceMerge {
  DeviceBuffer out_r, lse_r, sink, pos, rope, out, lse;
  RankMergeParams p;
  DeviceMerge(const HostMerge& h, const Synthetic& s, const MergeLayout& l) {
    out_r = l.f32 ? to_device(h.out_r32) : to_device(h.out_r);
    lse_r = to_device(s.lse);
    sink = to_device(s.sink);
    pos = to_device(s.positions);
    rope = to_device(s.rope);
    const std::vector<bf16_bits> poison_out(h.res.out.size(), kPoisonBf16);
    const std::vector<float> poison_lse(h.res.lse.size(), decode::nan_f32());
    out = to_device(poison_out);
    lse = to_device(poison_lse);
    p = h.p;
    p.rank_out = l.f32 ? nullptr : out_r.as<bf16_bits>();
    p.rank_out_f32 = l.f32 ? out_r.as<float>() : nullptr;
    p.rank_lse = lse_r.as<float>();
    p.sink = l.sink ? sink.as<float>() : nullptr;
    if (l.rope) {
      p.positions = pos.as<int64_t>();
      p.rope.data = rope.as<float>();
    }
    p.out = out.as<bf16_bits>();
    p.lse = l.lse ? lse.as<float>() : nullptr;
    p.path = Path::CudaGeneric;
  }
  MergeResult result() const {
    MergeResult r;
    r.out.resize(out.bytes() / 2);
    r.lse.resize(lse.bytes() / 4);
    out.download(r.out.data(), out.bytes());
    lse.download(r.lse.data(), lse.bytes());
    return r;
  }
};

void expect_same(const MergeResult& gpu, const MergeResult& cpu, const std::string& what) {
  ASSERT_EQ(gpu.out.size(), cpu.out.size());
  int64_t diff = 0, first = -1;
  for (size_t i = 0; i < cpu.out.size(); ++i) {
    if (!same_bf16(gpu.out[i], cpu.out[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++diff;
    }
  }
  EXPECT_EQ(diff, 0) << what << ": first at " << first << " gpu=0x" << std::hex
                     << (first >= 0 ? gpu.out[first] : 0) << " cpu=0x"
                     << (first >= 0 ? cpu.out[first] : 0);
  for (size_t i = 0; i < cpu.lse.size(); ++i) {
    ASSERT_TRUE(same_float(gpu.lse[i], cpu.lse[i]))
        << what << ": lse " << i << " gpu=" << gpu.lse[i] << " cpu=" << cpu.lse[i];
  }
}

// Special values planted among the ranks and sinks of `s`.
void plant_specials(test::Rng& rng, Synthetic& s) {
  const size_t row = static_cast<size_t>(s.T * s.H);
  for (size_t i = 0; i < s.lse.size(); ++i) {
    const double u = rng.uniform(0, 1);
    if (u < 0.05)
      s.lse[i] = -kInf;
    else if (u < 0.08)
      s.lse[i] -= 150.0f;  // underflows against the row's max
    else if (u < 0.09)
      s.lse[i] = decode::nan_f32();
  }
  if (s.R > 1) {  // one row with every rank empty
    for (int32_t r = 0; r < s.R; ++r) s.lse[r * row] = kInf;
  }
  if (s.H >= 4) {
    s.sink[1] = kInf;
    s.sink[2] = -kInf;
    s.sink[3] = decode::nan_f32();
  }
}

TEST(GpuCpMerge, BitIdenticalToTheCpu) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  for (const int32_t R : {1, 2, 3, 8, 40}) {
    for (const int32_t H : {1, 16, 64, 128}) {
      Synthetic s = cp::synthetic(rng, R >= 8 ? 5 : 33, H, R, 0.1);
      plant_specials(rng, s);
      for (int variant = 0; variant < 6; ++variant) {
        MergeLayout l;
        l.f32 = variant % 2 == 1;
        l.sink = variant != 2;
        l.rope = variant != 3;
        l.lse = variant != 4;
        if (variant == 5) l.out_pad = 3, l.in_pad = 1;  // scalar loads and stores
        const std::string what = "R=" + std::to_string(R) + " H=" + std::to_string(H) +
                                 " variant=" + std::to_string(variant);
        HostMerge h = host_merge(s, l);
        DeviceMerge d(h, s, l);
        merge_ranks(h.p);
        merge_ranks(d.p);
        cuda_ok(cudaDeviceSynchronize(), "merge_ranks");
        expect_same(d.result(), h.res, what);
      }
    }
  }
}

TEST(GpuCpMerge, GraphReplayWithNewInputs) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  const MergeLayout l;
  Synthetic s = cp::synthetic(rng, 8, 32, 2, 0.1);
  HostMerge h = host_merge(s, l);
  DeviceMerge d(h, s, l);
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "stream");
  d.p.stream = stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  merge_ranks(d.p);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int step = 0; step < 3; ++step) {
    const Synthetic next = cp::synthetic(rng, 8, 32, 2, 0.1);  // new values, same addresses
    s.out = next.out;
    s.lse = next.lse;
    HostMerge hn = host_merge(s, l);
    d.out_r.upload(hn.out_r.data(), hn.out_r.size() * 2);
    d.lse_r.upload(s.lse.data(), s.lse.size() * 4);
    cuda_ok(cudaGraphLaunch(exec, stream), "replay");
    cuda_ok(cudaStreamSynchronize(stream), "sync");
    merge_ranks(hn.p);
    expect_same(d.result(), hn.res, "replay " + std::to_string(step));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(GpuCpShardList, EqualsTheCpu) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  const int64_t T = 37, N = 5000, W = 700;  // rows longer than one 256-thread chunk
  for (const int32_t R : {1, 2, 3, 8}) {
    for (const int32_t I : {1, 4}) {
      for (const bool dense : {false, true}) {
        std::vector<std::vector<int32_t>> rows(T);
        std::vector<int32_t> dense_idx(static_cast<size_t>(T * W), -1), lengths(T);
        std::vector<uint8_t> valid(T, 1);
        valid[5] = 0;
        for (int64_t t = 0; t < T; ++t) {
          lengths[t] = static_cast<int32_t>(t == 3 ? 0 : rng.randint(1, W));
          rows[t] = decode::random_row(rng, lengths[t], N, 0.1);
          std::copy(rows[t].begin(), rows[t].end(), dense_idx.begin() + t * W);
        }
        const decode::TestList ragged = decode::TestList::from_rows(rng, rows, 5);
        const DeviceBuffer d_idx = to_device(dense ? dense_idx : ragged.indices);
        const DeviceBuffer d_ptr = to_device(ragged.indptr);
        const DeviceBuffer d_len = to_device(lengths);
        const DeviceBuffer d_valid = to_device(valid);
        for (int32_t r = 0; r < R; ++r) {
          ShardListParams p;
          p.common.num_rows = T;
          p.num_ranks = R;
          p.rank = r;
          p.interleave = I;
          p.num_slots = r % 2 == 0 ? N : 0;
          if (dense) {
            p.list = {dense_idx.data(), nullptr, static_cast<int64_t>(dense_idx.size()), W, 0,
                      lengths.data(),   1};
          } else {
            p.list = ragged.view();
          }
          std::vector<int32_t> idx(static_cast<size_t>(T * W), -7), ptr(T + 1, -7);
          p.common.row_valid = valid.data();
          p.out = {idx.data(), ptr.data(), W};
          shard_list(p);  // CPU
          DeviceBuffer o_idx = to_device(std::vector<int32_t>(idx.size(), -7));
          DeviceBuffer o_ptr = to_device(std::vector<int32_t>(ptr.size(), -7));
          p.list.indices = d_idx.as<int32_t>();
          if (dense) {
            p.list.lengths = d_len.as<int32_t>();
          } else {
            p.list.indptr = d_ptr.as<int32_t>();
          }
          p.common.row_valid = d_valid.as<uint8_t>();
          p.out = {o_idx.as<int32_t>(), o_ptr.as<int32_t>(), W};
          shard_list(p);  // GPU
          std::vector<int32_t> g_idx(idx.size()), g_ptr(ptr.size());
          o_idx.download(g_idx.data(), g_idx.size() * 4);
          o_ptr.download(g_ptr.data(), g_ptr.size() * 4);
          ASSERT_EQ(g_ptr, ptr) << "R=" << R << " I=" << I << " dense=" << dense << " r=" << r;
          ASSERT_EQ(g_idx, idx) << "R=" << R << " I=" << I << " dense=" << dense << " r=" << r;
        }
      }
    }
  }
}

// ---- the pipeline on the device -----------------------------------------------------------------
class GpuCpDecode : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    if (GetParam() == Path::CudaSm90 && !device_is_sm90()) {
      GTEST_SKIP() << "the cuda-sm90 path runs on cc 9.0 GPUs only";
    }
  }
};
INSTANTIATE_TEST_SUITE_P(Paths, GpuCpDecode, ::testing::Values(Path::CudaGeneric, Path::CudaSm90),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return std::string(info.param == Path::CudaSm90 ? "Sm90" : "Generic");
                         });

decode::CaseSpec gpu_layer_spec(bool c128, int32_t R, int64_t T, int32_t H) {
  decode::CaseSpec s;
  s.T = T;
  s.H = H;
  const int32_t bs = 64 * R;  // rank pages of 64 (FlashMLA-like), virtual pages of 64 R
  s.main.block_size = bs;
  s.main.num_blocks = 4;
  decode::CacheSpec extra;
  extra.block_size = bs;
  extra.num_blocks = (c128 ? 8192 : 4096) / bs + 2;
  s.extra = extra;
  s.main_lengths.assign(T, 128);
  s.extra_lengths.resize(T);
  for (int64_t t = 0; t < T; ++t) s.extra_lengths[t] = c128 ? 1 + (t * 977) % 8000 : 1024;
  s.sink = true;
  s.positions = true;
  s.p_invalid = 0.02;
  return s;
}

TEST_P(GpuCpDecode, ShardedDecodesMergedEqualTheUnshardedDecode) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  for (const bool c128 : {false, true}) {
    for (const int32_t R : {2, 3, 8}) {
      SCOPED_TRACE(std::string(c128 ? "C128" : "C4-Pro") + " R=" + std::to_string(R));
      decode::DecodeCase c(rng, gpu_layer_spec(c128, R, 4, c128 ? 16 : 64));
      for (auto& sk : c.sink) sk = static_cast<float>(rng.uniform(5.0, 10.0));  // 5-70% of the mass
      const int64_t T = c.T;
      const size_t row = static_cast<size_t>(T * c.H);
      // The ranks' caches and lists on the host (the lists by the CPU shard_list), then on the
      // device, where the lists are sharded again by the GPU and must be the same.
      cp::PipelineSpec ps;
      ps.R = R;
      cp::RankRuns rr;
      std::vector<DeviceBuffer> d_cache_main, d_cache_extra, d_main, d_extra;
      DeviceBuffer d_vmain_idx = to_device(c.main_list.indices),
                   d_vmain_ptr = to_device(c.main_list.indptr),
                   d_vextra_idx = to_device(c.extra_list.indices),
                   d_vextra_ptr = to_device(c.extra_list.indptr);
      DeviceBuffer d_out = to_device(std::vector<bf16_bits>(R * row * kDim, kPoisonBf16));
      DeviceBuffer d_lse = to_device(std::vector<float>(R * row, decode::nan_f32()));
      for (int32_t r = 0; r < R; ++r) {
        rr.main_cache.push_back(cp::rank_cache(*c.main, c.main->view().num_blocks, R, r, 1));
        rr.extra_cache.push_back(cp::rank_cache(*c.extra, c.extra->view().num_blocks, R, r, 1));
        rr.main.push_back(
            cp::shard_with_library(c.main_list, T, R, r, 1, c.main->num_slots(), false));
        rr.extra.push_back(
            cp::shard_with_library(c.extra_list, T, R, r, 1, c.extra->num_slots(), false));
        d_cache_main.push_back(to_device(rr.main_cache[r].bytes));
        d_cache_extra.push_back(to_device(rr.extra_cache[r].bytes));
        for (const bool extra : {false, true}) {
          const decode::TestList& v = extra ? c.extra_list : c.main_list;
          const decode::TestList& want = extra ? rr.extra[r] : rr.main[r];
          DeviceBuffer buf(static_cast<size_t>(want.indices.size() + want.indptr.size()) * 4);
          ShardListParams sp;
          sp.common.num_rows = T;
          sp.list = {(extra ? d_vextra_idx : d_vmain_idx).as<int32_t>(),
                     (extra ? d_vextra_ptr : d_vmain_ptr).as<int32_t>(),
                     static_cast<int64_t>(v.indices.size()), 0};
          sp.num_ranks = R;
          sp.rank = r;
          sp.num_slots = (extra ? c.extra : c.main)->num_slots();
          sp.out = {buf.as<int32_t>(), buf.as<int32_t>(want.indices.size() * 4), want.width};
          shard_list(sp);
          std::vector<int32_t> got_ptr(want.indptr.size());
          buf.download(got_ptr.data(), got_ptr.size() * 4, want.indices.size() * 4);
          ASSERT_EQ(got_ptr, want.indptr) << "device shard_list, rank " << r;
          (extra ? d_extra : d_main).push_back(std::move(buf));
        }
      }
      for (int32_t r = 0; r < R; ++r) {
        DecodeParams p = cp::rank_params(c, rr, r, d_out.as<bf16_bits>(r * row * kDim * 2),
                                         d_lse.as<float>(r * row * 4));
        DeviceBuffer d_q = to_device(c.q);
        p.q = d_q.as<bf16_bits>();
        p.main_cache.base = d_cache_main[r].as<uint8_t>();
        p.extra_cache.base = d_cache_extra[r].as<uint8_t>();
        p.main_list.indices = d_main[r].as<int32_t>();
        p.main_list.indptr = d_main[r].as<int32_t>(rr.main[r].indices.size() * 4);
        p.extra_list.indices = d_extra[r].as<int32_t>();
        p.extra_list.indptr = d_extra[r].as<int32_t>(rr.extra[r].indices.size() * 4);
        p.main_list.width = rr.main[r].width;
        p.extra_list.width = rr.extra[r].width;
        p.path = GetParam();
        const DecodePlan plan = plan_decode(p);
        DeviceBuffer ws(plan.workspace_bytes);
        ws.fill(0xFF);  // NaN: stale partials must never be read
        sparse_decode(p, plan, ws.get(), ws.bytes());
        cuda_ok(cudaDeviceSynchronize(), "rank decode");
      }
      // The merge on the device, and on the CPU from the device's rank outputs.
      rr.out.resize(R * row * kDim);
      rr.lse.resize(R * row);
      d_out.download(rr.out.data(), rr.out.size() * 2);
      d_lse.download(rr.lse.data(), rr.lse.size() * 4);
      decode::FastRun cpu_merged, gpu_merged;
      const RankMergeParams hp =
          cp::merge_params(c, R, rr.out.data(), nullptr, rr.lse.data(), cpu_merged);
      merge_ranks(hp);
      RankMergeParams dp = cp::merge_params(c, R, nullptr, nullptr, nullptr, gpu_merged);
      DeviceBuffer d_sink = to_device(c.sink), d_pos = to_device(c.positions),
                   d_rope = to_device(c.rope), d_mout = to_device(gpu_merged.out),
                   d_mlse = to_device(gpu_merged.lse);
      dp.rank_out = d_out.as<bf16_bits>();
      dp.rank_lse = d_lse.as<float>();
      dp.sink = d_sink.as<float>();
      dp.positions = d_pos.as<int64_t>();
      dp.rope.data = d_rope.as<float>();
      dp.out = d_mout.as<bf16_bits>();
      dp.lse = d_mlse.as<float>();
      dp.path = Path::Auto;
      merge_ranks(dp);
      cuda_ok(cudaDeviceSynchronize(), "merge");
      d_mout.download(gpu_merged.out.data(), gpu_merged.out.size() * 2);
      d_mlse.download(gpu_merged.lse.data(), gpu_merged.lse.size() * 4);
      EXPECT_EQ(gpu_merged.out, cpu_merged.out) << "device merge vs CPU merge (same inputs)";
      const decode::RefRun ref =
          decode::run_reference(c, [&](DecodeParams& q) { q.path = GetParam(); });
      const decode::Verdict v = cp::compare_merged(c, gpu_merged, ref, /*bf16_ranks=*/true);
      EXPECT_TRUE(v.passed()) << v.describe();
      std::printf("[ cp ] %s R=%d: %s\n", c128 ? "C128" : "C4-Pro", R, v.describe().c_str());
    }
  }
}

}  // namespace
}  // namespace sparsemla::test::gpu_cp
