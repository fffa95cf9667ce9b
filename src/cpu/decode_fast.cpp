// The fast CPU decode (CONTRACT 4.2 kernel numerics, split-K partials and combine of 4.3, adaptive
// active splits of 4.5, fused inverse RoPE, optional lse) and the standalone inverse RoPE.
//
// Numerics, as the GPU kernels: q and K as bf16 values (K = the dequantised value rounded to bf16,
// exact for codes >= 8), fp32 accumulation of Q.K and P.V, probabilities rounded to bf16 before
// P.V while l sums the fp32 probabilities, fp32 combine, one bf16 rounding of the output.
//
// The hot loops (dequantise, Q.K, softmax, P.V) are in src/cpu/decode_kernels.inc, compiled per
// instruction-set level; the level is chosen once per process (src/cpu/isa.h).
//
// Structure: one work item = (token t, split s, block of <= 16 heads). Its keys are visited in
// blocks of 32; each block is dequantised once and shared by the heads of the item (keys outer,
// heads inner), with one online-softmax step per (head, block). Every (t, s, h) is computed by one
// thread in a fixed order, so the result does not depend on the number of threads.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "cpu/cpu_backend.h"
#include "cpu/decode_common.h"
#include "cpu/decode_kernels.h"
#include "cpu/isa.h"
#include "sparsemla/plan.h"

namespace sparsemla::cpu {

namespace {

constexpr int kDim = Fp8DsMla::kHeadDim;
constexpr int kNope = Fp8DsMla::kNopeDims;
constexpr int kPairs = Fp8DsMla::kRopeDims / 2;
constexpr int kHeadBlock = kPlanHeadBlock;  // heads sharing one dequantised key block (16)
constexpr int kMaxSplits = kSpecialisedMaxSplits;
constexpr float kNoMass = -FLT_MAX;  // m of a split without mass (CONTRACT 4.3)
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Partials in the caller's workspace: m, l fp32 [T, S, H], then acc fp32 [T, S, H, 512].
struct Partials {
  float* m = nullptr;
  float* l = nullptr;
  float* acc = nullptr;
  int64_t splits = 0;
  int64_t heads = 0;

  Partials(void* workspace, int64_t T, int32_t S, int32_t H) : splits(S), heads(H) {
    if (workspace == nullptr) return;
    const int64_t rows = T * S * H;
    m = static_cast<float*>(workspace);
    l = m + rows;
    acc = l + rows;
  }
  int64_t row(int64_t t, int64_t s, int64_t h) const { return (t * splits + s) * heads + h; }
};

// Everything an item needs, resolved once per call.
struct Job {
  const DecodeParams& p;
  int32_t splits;
  Partials parts;
  bool scrub_extra;
  bool adaptive;
  int32_t one_wave;
  int64_t q_stride_token;
  int64_t out_stride_token;
  int64_t lse_stride_token;
  // The hot loops of this process's level, resolved before any parallel region (cpu_isa() may throw
  // for a bad SPARSEMLA_CPU_ISA, which must not escape an OpenMP region).
  decltype(DecodeKernels::absorb_segment) absorb_segment;

  Job(const DecodeParams& params, const DecodePlan& plan, void* workspace)
      : p(params),
        splits(plan.num_splits),
        parts(workspace, params.num_tokens, plan.num_splits, params.num_heads),
        scrub_extra(decode_scrubs_extra(params)),
        adaptive(plan.adaptive_splits),
        one_wave(plan.one_wave),
        q_stride_token(params.q_stride_token != 0 ? params.q_stride_token
                                                  : int64_t{params.num_heads} * kDim),
        out_stride_token(params.out_stride_token != 0 ? params.out_stride_token
                                                      : int64_t{params.num_heads} * kDim),
        lse_stride_token(params.lse_stride_token != 0 ? params.lse_stride_token : params.num_heads),
        absorb_segment(decode_kernels_for(cpu_isa()).absorb_segment) {}

  // Offset of lse row t (DecodeParams::lse_group: rows in groups, FlashMLA's [b, h, s_q]).
  int64_t lse_row(int64_t t) const {
    if (p.lse_group == 1) return t * lse_stride_token;
    const int64_t sg =
        p.lse_stride_group != 0 ? p.lse_stride_group : p.lse_group * lse_stride_token;
    return (t / p.lse_group) * sg + (t % p.lse_group) * lse_stride_token;
  }

  // Splits that do work for row t (CONTRACT 4.5); all S without the adaptive rule.
  int32_t active_splits(int64_t len_main, int64_t len_extra) const {
    return adaptive ? adaptive_active_splits(len_main, len_extra, splits, one_wave) : splits;
  }
};

// The partials of some splits of one (t, h): split i has m[i*stride], l[i*stride] and its
// accumulator at acc + i*stride*512.
struct SplitSet {
  const float* m;
  const float* l;
  const float* acc;
  int64_t stride;
  int32_t count;
};

// CONTRACT 4.3 combine of one (t, h), then the optional inverse RoPE in fp32 and one bf16 rounding.
// A split with m == -FLT_MAX has weight 0 and its accumulator is never read. With one split this is
// also the direct finish of S = 1, so both give the same bits.
void finish_row(const Job& job, int64_t t, int32_t h, const SplitSet& set) {
  const DecodeParams& p = job.p;
  float m_keys = kNoMass;
  for (int32_t s = 0; s < set.count; ++s) m_keys = std::fmax(m_keys, set.m[s * set.stride]);
  const bool has_sink = p.sink != nullptr;
  const float sink = has_sink ? p.sink[h] : 0.0f;
  const float m_all = has_sink ? std::fmax(m_keys, sink) : m_keys;

  float weight[kMaxSplits];
  float key_mass = 0.0f;
  for (int32_t s = 0; s < set.count; ++s) {
    const float ms = set.m[s * set.stride];
    weight[s] = ms == kNoMass ? 0.0f : std::exp(ms - m_all);
    key_mass += weight[s] * set.l[s * set.stride];
  }

  if (p.lse != nullptr) {  // CONTRACT 4.3a: keys only, +inf without any
    float l_keys = 0.0f;
    for (int32_t s = 0; s < set.count; ++s) {
      const float ms = set.m[s * set.stride];
      if (ms != kNoMass) l_keys += std::exp(ms - m_keys) * set.l[s * set.stride];
    }
    p.lse[job.lse_row(t) + h * p.lse_stride_head] =
        l_keys == 0.0f ? kInf : m_keys + std::log(l_keys);
  }

  bf16_bits* out = p.out + t * job.out_stride_token + h * p.out_stride_head;
  // Special rows (CONTRACT 4.2): NaN when the keys' mass is NaN (a NaN or +inf score) or the sink
  // is NaN, as the quotient is; exact 0 without mass or under a +inf sink (the denominator's limit
  // is +inf, where exp(inf - inf) would say NaN).
  const bool nan_row = std::isnan(key_mass) || (has_sink && std::isnan(sink));
  const float den = key_mass + (has_sink ? std::exp(sink - m_all) : 0.0f);
  const bool zero_row = !(den > 0.0f) || (has_sink && sink == kInf);
  if (nan_row || zero_row) {
    std::fill(out, out + kDim, float_to_bf16(nan_row ? kNaN : 0.0f));
    return;
  }
  float o[kDim] = {};
  for (int32_t s = 0; s < set.count; ++s) {
    if (weight[s] == 0.0f) continue;  // inactive (or fully underflowed): acc not read
    const float w = weight[s];
    const float* acc = set.acc + s * set.stride * kDim;
    for (int d = 0; d < kDim; ++d) o[d] += w * acc[d];
  }
  const float div = std::fmax(den, 1e-30f);
  for (int d = 0; d < kDim; ++d) o[d] /= div;
  if (p.positions != nullptr) {
    const float* cs = p.rope.data + p.positions[t] * p.rope.row_stride;
    for (int k = 0; k < kPairs; ++k) {
      rope_inverse_pair(o[kNope + 2 * k], o[kNope + 2 * k + 1], cs[k], cs[kPairs + k]);
    }
  }
  for (int d = 0; d < kDim; ++d) out[d] = float_to_bf16(o[d]);
}

// A split without mass reports m = -FLT_MAX, l = 0 (CONTRACT 4.3). A split whose scores held a
// NaN (or +inf: exp(inf - inf)) has l = NaN; its m may still be -FLT_MAX (fmax skips NaN), so it
// reports m = NaN, else every combine would take it for an empty split and drop the NaN.
void seal_empty(Scratch& sc, int h) {
  if (sc.l[h] == 0.0f) sc.m[h] = kNoMass;
  if (std::isnan(sc.l[h])) sc.m[h] = kNaN;
}

// One work item: split s of token t for heads [head0, head0 + num_heads).
void run_item(const Job& job, int64_t t, int32_t s, int32_t head0, int num_heads, Scratch& sc) {
  const DecodeParams& p = job.p;
  const ListRow main = list_row(p.main_list, t);
  const ListRow extra = p.has_extra ? list_row(p.extra_list, t) : ListRow{nullptr, 0};
  const int32_t work = job.active_splits(main.length, extra.length);
  for (int h = 0; h < num_heads; ++h) {
    sc.m[h] = kNoMass;
    sc.l[h] = 0.0f;
  }
  if (s < work) {
    for (int h = 0; h < num_heads; ++h) {
      const bf16_bits* qh = p.q + t * job.q_stride_token + (head0 + h) * p.q_stride_head;
      for (int d = 0; d < kDim; ++d) sc.q[h][d] = bf16_to_float(qh[d]);
      std::fill(sc.acc[h], sc.acc[h] + kDim, 0.0f);
    }
    // Active splits cut each segment by `work` (CONTRACT 4.5); main and extra separately (4.3).
    job.absorb_segment(p.main_cache, main, split_range(main.length, work, s), /*scrub=*/true,
                       num_heads, p.scale, sc);
    if (p.has_extra) {
      job.absorb_segment(p.extra_cache, extra, split_range(extra.length, work, s), job.scrub_extra,
                         num_heads, p.scale, sc);
    }
  }
  for (int h = 0; h < num_heads; ++h) {
    seal_empty(sc, h);
    if (job.splits == 1) {
      finish_row(job, t, head0 + h, SplitSet{&sc.m[h], &sc.l[h], sc.acc[h], 1, 1});
      continue;
    }
    const Partials& parts = job.parts;
    const int64_t r = parts.row(t, s, head0 + h);
    parts.m[r] = sc.m[h];
    parts.l[r] = sc.l[h];
    if (sc.m[h] != kNoMass) std::copy(sc.acc[h], sc.acc[h] + kDim, parts.acc + r * kDim);
  }
}

void combine(const Job& job) {
  const int64_t T = job.p.num_tokens, H = job.p.num_heads;
  const Partials& parts = job.parts;
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t i = 0; i < T * H; ++i) {
    const int64_t t = i / H, h = i % H;
    const int64_t r0 = parts.row(t, 0, h);
    finish_row(job, t, static_cast<int32_t>(h),
               SplitSet{parts.m + r0, parts.l + r0, parts.acc + r0 * kDim, H, job.splits});
  }
}

}  // namespace

void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace) {
  const Job job(p, plan, workspace);
  const int32_t num_splits = plan.num_splits;
  const int64_t head_blocks = (p.num_heads + kHeadBlock - 1) / kHeadBlock;
  const int64_t items = p.num_tokens * num_splits * head_blocks;
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp parallel
#endif
  {
    const auto scratch = std::make_unique<Scratch>();
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t i = 0; i < items; ++i) {
      const int64_t hb = i % head_blocks, ts = i / head_blocks;
      const int32_t head0 = static_cast<int32_t>(hb * kHeadBlock);
      const int num_heads = std::min(kHeadBlock, p.num_heads - head0);
      run_item(job, ts / num_splits, static_cast<int32_t>(ts % num_splits), head0, num_heads,
               *scratch);
    }
  }
  if (num_splits > 1) combine(job);
}

void inverse_rope_inplace(bf16_bits* x, int64_t num_tokens, int32_t num_heads, int64_t stride_token,
                          int64_t stride_head, const int64_t* positions, const RopeTable& rope) {
  const int64_t st = stride_token != 0 ? stride_token : int64_t{num_heads} * kDim;
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* cs = rope.data + positions[t] * rope.row_stride;
    for (int32_t h = 0; h < num_heads; ++h) {
      bf16_bits* v = x + t * st + h * stride_head + kNope;
      for (int k = 0; k < kPairs; ++k) {
        float a = bf16_to_float(v[2 * k]), b = bf16_to_float(v[2 * k + 1]);
        rope_inverse_pair(a, b, cs[k], cs[kPairs + k]);
        v[2 * k] = float_to_bf16(a);
        v[2 * k + 1] = float_to_bf16(b);
      }
    }
  }
}

}  // namespace sparsemla::cpu
