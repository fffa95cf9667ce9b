// tests/cpp/reference/cp_reference.h: decode context parallelism (CONTRACT 12) for the tests, CPU
// and GPU alike: the interleave rule written independently of the library (by the offset inside
// an interleave round), the per-rank caches an engine would hold, the sharded lists, a float64
// merge, and the whole pipeline (shard -> decode without the sink on every rank -> merge with the
// sink) whose output is compared with the unsharded decode's reference (decode_fixture.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/decode_fixture.h"
#include "sparsemla/context_parallel.h"
#include "sparsemla/decode.h"
#include "sparsemla/lists.h"

namespace sparsemla::test::cp {

using decode::DecodeCase;
using decode::FastRun;
using decode::kDim;
using decode::TestCache;
using decode::TestList;

// ---- the interleave rule, written by the round: slot v sits in round v / (I R) at offset
// o = v % (I R); the offset's I-wide group o / I is the rank, and the local slot is the round's
// I slots of that rank plus the position inside the group.
inline int32_t rank_of(int64_t v, int32_t R, int32_t I) {
  return static_cast<int32_t>((v % (int64_t{I} * R)) / I);
}
inline int64_t local_of(int64_t v, int32_t R, int32_t I) {
  const int64_t round = v / (int64_t{I} * R), o = v % (int64_t{I} * R);
  return round * I + o % I;
}

// Rank r's part of the ragged rows: entries v >= 0 (< num_slots when > 0) of rank r, as local
// slots, in order.
inline std::vector<std::vector<int32_t>> shard_rows(const std::vector<std::vector<int32_t>>& rows,
                                                    int32_t R, int32_t r, int32_t I,
                                                    int64_t num_slots = 0) {
  std::vector<std::vector<int32_t>> out(rows.size());
  for (size_t t = 0; t < rows.size(); ++t) {
    for (const int32_t v : rows[t]) {
      if (v < 0 || (num_slots > 0 && v >= num_slots) || rank_of(v, R, I) != r) continue;
      out[t].push_back(static_cast<int32_t>(local_of(v, R, I)));
    }
  }
  return out;
}

inline std::vector<std::vector<int32_t>> rows_of(const TestList& l) {
  std::vector<std::vector<int32_t>> rows(l.indptr.size() - 1);
  for (size_t t = 0; t + 1 < l.indptr.size(); ++t) rows[t] = l.row(t);
  return rows;
}

// The widest row (>= 1): the out.width that always fits.
inline int64_t max_row(const TestList& l) {
  int64_t w = 1;
  for (size_t t = 0; t + 1 < l.indptr.size(); ++t)
    w = std::max<int64_t>(w, l.indptr[t + 1] - l.indptr[t]);
  return w;
}

// ---- a rank's cache: rank r's pages of the virtual cache (page size R*bs there, bs here) ----
struct RankCache {
  std::vector<uint8_t> bytes;
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  int64_t stride = 0;
  CacheView view() const { return {bytes.data(), num_blocks, block_size, stride}; }
};

// Local slot l of rank r holds the bytes of virtual slot (l / I) * I R + r I + l % I. Needs
// R*I | the virtual page size.
inline RankCache rank_cache(const TestCache& v, int64_t num_blocks, int32_t R, int32_t r,
                            int32_t I) {
  EXPECT_EQ(v.block_size() % (R * I), 0) << "test setup: the virtual page size must be a "
                                            "multiple of R*I";
  RankCache c;
  c.num_blocks = num_blocks;
  c.block_size = v.block_size() / R;
  c.stride = int64_t{c.block_size} * decode::kTokenBytes;
  c.bytes.assign(static_cast<size_t>(c.stride * num_blocks), 0xA5);
  for (int64_t l = 0; l < num_blocks * c.block_size; ++l) {
    const int64_t slot = (l / I) * (int64_t{I} * R) + int64_t{r} * I + l % I;
    uint8_t* page = c.bytes.data() + (l / c.block_size) * c.stride;
    std::memcpy(page + (l % c.block_size) * 576, v.data_row(slot), 576);
    std::memcpy(page + int64_t{c.block_size} * 576 + (l % c.block_size) * 8, v.code_row(slot), 8);
  }
  return c;
}

// ---- float64 merge (CONTRACT 12.1)
// --------------------------------------------------------------- rank outputs as doubles
// [R][T*H*512], lse [R][T*H]; writes out [T*H*512] and lse [T*H] and, per element, the scale sum_r
// w_r |out_r| / den of the fp32 merge's accumulation error.
struct Merged64 {
  std::vector<double> out, lse, scale;
};
inline Merged64 merge_reference(const std::vector<std::vector<double>>& out_r,
                                const std::vector<std::vector<double>>& lse_r, int64_t T, int32_t H,
                                const float* sink, const int64_t* positions, const float* rope,
                                int64_t rope_stride) {
  const size_t R = out_r.size();
  const double inf = std::numeric_limits<double>::infinity();
  Merged64 m;
  m.out.assign(static_cast<size_t>(T * H * kDim), 0.0);
  m.scale.assign(m.out.size(), 0.0);
  m.lse.assign(static_cast<size_t>(T * H), inf);
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < H; ++h) {
      const size_t i = static_cast<size_t>(t * H + h);
      double mx = -inf;
      bool nan = false;
      for (size_t r = 0; r < R; ++r) {
        const double l = lse_r[r][i];
        if (std::isnan(l)) nan = true;
        if (std::isfinite(l)) mx = std::max(mx, l);
      }
      double sum = 0;
      for (size_t r = 0; r < R; ++r)
        if (std::isfinite(lse_r[r][i])) sum += std::exp(lse_r[r][i] - mx);
      m.lse[i] = nan ? std::nan("") : (sum > 0 ? mx + std::log(sum) : inf);
      const double s = sink != nullptr ? sink[h] : -inf;
      double* o = &m.out[i * kDim];
      double* sc = &m.scale[i * kDim];
      if (nan || std::isnan(s)) {
        std::fill(o, o + kDim, std::nan(""));
        continue;
      }
      if (sum == 0 || s == inf) continue;  // exact zeros
      const double big = std::max(mx, s);
      double den = std::exp(s - big);
      for (size_t r = 0; r < R; ++r)
        if (std::isfinite(lse_r[r][i])) den += std::exp(lse_r[r][i] - big);
      for (size_t r = 0; r < R; ++r) {
        if (!std::isfinite(lse_r[r][i])) continue;
        const double w = std::exp(lse_r[r][i] - big) / den;
        for (int d = 0; d < kDim; ++d) {
          o[d] += w * out_r[r][i * kDim + d];
          sc[d] += w * std::fabs(out_r[r][i * kDim + d]);
        }
      }
      if (positions != nullptr) {
        const float* cs = rope + positions[t] * rope_stride;
        for (int k = 0; k < 32; ++k) {
          const double a = o[448 + 2 * k], b = o[449 + 2 * k], c = cs[k], sn = cs[32 + k];
          o[448 + 2 * k] = a * c + b * sn;
          o[449 + 2 * k] = b * c - a * sn;
          const double sa = sc[448 + 2 * k], sb = sc[449 + 2 * k];
          sc[448 + 2 * k] = sa * std::fabs(c) + sb * std::fabs(sn);
          sc[449 + 2 * k] = sb * std::fabs(c) + sa * std::fabs(sn);
        }
      }
    }
  }
  return m;
}

// ---- synthetic rank results (the merge alone)
// ---------------------------------------------------- R ranks' outputs (model-like latent
// mixtures, bf16 and the fp32 they round from), lse ~ N(5, 3)
// (+inf with probability p_empty), sinks ~ N(4, 1), a RoPE table of 50 rows and positions.
struct Synthetic {
  int64_t T;
  int32_t H, R;
  std::vector<bf16_bits> out;  // [R, T, H, 512]
  std::vector<float> out_f32;
  std::vector<float> lse;  // [R, T, H]
  std::vector<float> sink;
  std::vector<int64_t> positions;
  std::vector<float> rope;  // [P, 64]
};

inline Synthetic synthetic(Rng& rng, int64_t T, int32_t H, int32_t R, double p_empty) {
  Synthetic s{T, H, R, {}, {}, {}, {}, {}, {}};
  s.out.resize(static_cast<size_t>(R * T * H * kDim));
  s.out_f32.resize(s.out.size());
  for (size_t i = 0; i < s.out.size(); i += 64) {
    const double gain = std::exp(0.7 * rng.normal());
    for (size_t j = i; j < i + 64; ++j) {
      s.out_f32[j] = static_cast<float>(rng.normal() * gain * 0.3);
      s.out[j] = float_to_bf16(s.out_f32[j]);
    }
  }
  s.lse.resize(static_cast<size_t>(R * T * H));
  for (auto& l : s.lse)
    l = rng.uniform(0, 1) < p_empty ? std::numeric_limits<float>::infinity()
                                    : static_cast<float>(rng.normal() * 3 + 5);
  s.sink = random_f32(rng, static_cast<size_t>(H), 1.0, 4.0);
  const int64_t P = 50;
  s.rope.resize(static_cast<size_t>(P * 64));
  for (int64_t p = 0; p < P; ++p) {
    for (int k = 0; k < 32; ++k) {
      const double a = rng.uniform(-4, 4);
      s.rope[p * 64 + k] = static_cast<float>(std::cos(a));
      s.rope[p * 64 + 32 + k] = static_cast<float>(std::sin(a));
    }
  }
  s.positions.resize(T);
  for (auto& p : s.positions) p = rng.randint(0, P - 1);
  return s;
}

// ---- the pipeline on the CPU backend ------------------------------------------------------------
struct PipelineSpec {
  int32_t R = 2;
  int32_t I = 1;
  bool shard_main = true;     // false: the window list stays whole on rank 0 (others get none)
  bool use_num_slots = true;  // shard_list drops v >= N (else the rank caches' bounds do)
  int32_t splits = 0;         // the ranks' decode S (0: planner)
};

// Per rank, in the layout the merge reads: out [R, T, H, 512], lse [R, T, H].
struct RankRuns {
  std::vector<bf16_bits> out;  // [R, T, H, 512]
  std::vector<float> lse;      // [R, T, H]
  std::vector<TestList> main, extra;
  std::vector<RankCache> main_cache, extra_cache;
};

// The decode params of rank r (its caches and lists, no sink, no inverse RoPE, lse on).
inline DecodeParams rank_params(const DecodeCase& c, const RankRuns& rr, int32_t r, bf16_bits* out,
                                float* lse) {
  DecodeParams p = c.params(out, lse);
  p.main_cache = rr.main_cache[r].view();
  p.main_list = rr.main[r].view();
  if (c.extra) {
    p.extra_cache = rr.extra_cache[r].view();
    p.extra_list = rr.extra[r].view();
  }
  p.sink = nullptr;
  p.positions = nullptr;
  p.out_stride_token = int64_t{c.H} * kDim;
  p.out_stride_head = kDim;
  p.lse = lse;
  p.lse_stride_token = c.H;
  return p;
}

// Rank r's decode (CPU) into its slices of rr.out and rr.lse: without the sink, as the pipeline
// runs it, or with it (`with_sink`: a planted bug, the sink applied by every rank).
inline void decode_rank(const DecodeCase& c, RankRuns& rr, int32_t r, int32_t splits,
                        bool with_sink = false) {
  const size_t row = static_cast<size_t>(c.T * c.H);
  DecodeParams p = rank_params(c, rr, r, rr.out.data() + r * row * kDim, rr.lse.data() + r * row);
  p.num_splits = splits;
  if (with_sink) p.sink = c.sink.data();
  const size_t bytes = decode_workspace_size(c.T, c.H, decode_num_splits(p));
  std::vector<float> ws(bytes / 4 + 1, decode::nan_f32());
  sparse_decode(p, ws.data(), bytes);
}

// Shards the lists of rank r with the library (CPU backend) into a TestList.
inline TestList shard_with_library(const TestList& l, int64_t T, int32_t R, int32_t r, int32_t I,
                                   int64_t num_slots, bool keep) {
  TestList out;
  out.width = max_row(l);
  out.indices.assign(static_cast<size_t>(T * out.width), -7);
  out.indptr.assign(static_cast<size_t>(T + 1), -7);
  ShardListParams p;
  p.common.num_rows = T;
  p.common.path = Path::Cpu;
  p.list = l.view();
  p.num_ranks = keep ? 1 : R;
  p.rank = keep ? 0 : r;
  p.interleave = I;
  p.num_slots = num_slots;
  p.out = {out.indices.data(), out.indptr.data(), out.width};
  if (keep && r != 0) {  // the whole list on rank 0, empty rows elsewhere
    std::fill(out.indptr.begin(), out.indptr.end(), 0);
    return out;
  }
  shard_list(p);
  return out;
}

// Rank caches and lists; then every rank's decode (CPU) without the sink.
inline RankRuns run_ranks(const DecodeCase& c, const PipelineSpec& s) {
  RankRuns rr;
  const int64_t T = c.T;
  const size_t row = static_cast<size_t>(T * c.H);
  rr.out.assign(s.R * row * kDim, decode::kPoisonBf16);
  rr.lse.assign(s.R * row, decode::nan_f32());
  for (int32_t r = 0; r < s.R; ++r) {
    if (s.shard_main) {
      rr.main_cache.push_back(rank_cache(*c.main, c.main->view().num_blocks, s.R, r, s.I));
    } else {  // the window cache whole on every rank (only rank 0 reads it)
      RankCache whole;
      const CacheView v = c.main->view();
      whole.num_blocks = v.num_blocks;
      whole.block_size = v.block_size;
      whole.stride = v.block_stride;
      whole.bytes.assign(v.base, v.base + v.block_stride * v.num_blocks);
      rr.main_cache.push_back(std::move(whole));
    }
    rr.main.push_back(shard_with_library(c.main_list, T, s.R, r, s.I,
                                         s.use_num_slots ? c.main->num_slots() : 0, !s.shard_main));
    if (c.extra) {
      rr.extra_cache.push_back(rank_cache(*c.extra, c.extra->view().num_blocks, s.R, r, s.I));
      rr.extra.push_back(shard_with_library(c.extra_list, T, s.R, r, s.I,
                                            s.use_num_slots ? c.extra->num_slots() : 0, false));
    }
  }
  for (int32_t r = 0; r < s.R; ++r) decode_rank(c, rr, r, s.splits);
  return rr;
}

// The merge params over rank outputs [R, T, H, 512] (bf16 or fp32) into a FastRun laid out as the
// case's own output (strides of c), sink and inverse RoPE from the case.
inline RankMergeParams merge_params(const DecodeCase& c, int32_t R, const bf16_bits* out_bf16,
                                    const float* out_f32, const float* lse, FastRun& run) {
  run.out.assign(c.out_elems(), decode::kPoisonBf16);
  run.lse.assign(c.lse_elems(), decode::nan_f32());
  run.out_stride_token = c.out_stride_token;
  run.out_stride_head = c.out_stride_head;
  run.lse_stride_token = c.lse_stride_token;
  RankMergeParams m;
  m.num_tokens = c.T;
  m.num_heads = c.H;
  m.num_ranks = R;
  m.rank_out = out_bf16;
  m.rank_out_f32 = out_f32;
  m.rank_lse = lse;
  m.sink = c.use_sink ? c.sink.data() : nullptr;
  if (c.use_positions) {
    m.positions = c.positions.data();
    m.rope = {c.rope.data(), c.rope_rows, c.rope_stride};
  }
  m.out = run.out.data();
  m.out_stride_token = c.out_stride_token;
  m.out_stride_head = c.out_stride_head;
  m.lse = run.lse.data();
  m.lse_stride_token = c.lse_stride_token;
  m.path = Path::Cpu;
  return m;
}

// CONTRACT 9.9's rule for a merged output against the unsharded reference (CONTRACT 12.3): rule 3
// takes the two-rounding threshold when the ranks' outputs were bf16 (verify.h), the decode's
// otherwise.
inline decode::Verdict compare_merged(const DecodeCase& c, const FastRun& merged,
                                      const decode::RefRun& ref, bool bf16_ranks) {
  decode::Verdict v = decode::compare_with_reference(c, merged, ref);
  if (bf16_ranks) v.cosine_tol = kVerifyCosineTolBf16RankMerge;
  return v;
}

}  // namespace sparsemla::test::cp
