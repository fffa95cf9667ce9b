// The float64 reference of the sparse decode (CONTRACT 4.2, 4.3a): one softmax over the valid keys
// of main row t then extra row t, the sink, exact zeros for rows without mass, NaN rows for NaN
// (or +inf) scores and NaN sinks, lse without the sink and the fused inverse RoPE (CONTRACT 1),
// all on the dequantised cache with the kernels' scrub decisions. No bf16 rounding anywhere: it is
// the oracle the fast CPU and GPU paths are held to.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/validate.h"
#include "cpu/decode_common.h"
#include "cpu/row_decode.h"
#include "sparsemla/decode.h"
#include "sparsemla/error.h"

namespace sparsemla {

namespace {

constexpr int kDim = Fp8DsMla::kHeadDim;
constexpr int kNope = Fp8DsMla::kNopeDims;
constexpr int kPairs = Fp8DsMla::kRopeDims / 2;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The valid keys of one query row, decoded to double: [count, 512], main then extra, duplicates
// kept.
struct RowKeys {
  std::vector<double> values;
  int64_t count = 0;
};

void append_keys(const CacheView& cache, const IndexList& list, int64_t t, bool scrub,
                 RowKeys& keys) {
  const cpu::ListRow row = cpu::list_row(list, t);
  float decoded[kDim];
  for (int64_t j = 0; j < row.length; ++j) {
    const int64_t slot = row.indices[j];
    if (!slot_is_valid(slot, cache.num_blocks, cache.block_size)) continue;  // contributes nothing
    cpu::decode_row_f32(cache, slot, scrub, decoded);
    keys.values.insert(keys.values.end(), decoded, decoded + kDim);  // fp32 -> double: exact
    ++keys.count;
  }
}

RowKeys gather_row_keys(const DecodeParams& p, int64_t t) {
  RowKeys keys;
  append_keys(p.main_cache, p.main_list, t, /*scrub=*/true, keys);  // window cache: always
  if (p.has_extra) append_keys(p.extra_cache, p.extra_list, t, cpu::decode_scrubs_extra(p), keys);
  return keys;
}

// Inverse rotation of dims 448..511 at `pos` (CONTRACT 1): a' = a*c + b*s, b' = b*c - a*s.
void rotate_back(double* o, const RopeTable& rope, int64_t pos) {
  const float* row = rope.data + pos * rope.row_stride;
  for (int k = 0; k < kPairs; ++k) {
    const double c = row[k], s = row[kPairs + k];
    const double a = o[kNope + 2 * k], b = o[kNope + 2 * k + 1];
    o[kNope + 2 * k] = a * c + b * s;
    o[kNope + 2 * k + 1] = b * c - a * s;
  }
}

// The accuracy scale of verify.h: a[d] = sum_j e^(z_j - zmax) |K_j[d]| / sum_j e^(z_j - zmax) (the
// keys' own softmax, without the sink, so a sink that takes the mass cannot underflow it), then
// rotated like the output: |c| a_a + |s| a_b on both dims of a RoPE pair (an error e of the
// pair before the rotation is at most |c| e_a + |s| e_b after it).
void reference_abs_mean(const DecodeParams& p, const RowKeys& keys, const std::vector<double>& z,
                        double zmax, int64_t t, double* a) {
  double sum = 0.0;
  for (int64_t j = 0; j < keys.count; ++j) {
    const double w = std::exp(z[j] - zmax);
    sum += w;
    const double* k = &keys.values[j * kDim];
    for (int d = 0; d < kDim; ++d) a[d] += w * std::fabs(k[d]);
  }
  for (int d = 0; d < kDim; ++d) a[d] /= sum;
  if (p.positions == nullptr) return;
  const float* row = p.rope.data + p.positions[t] * p.rope.row_stride;
  for (int k = 0; k < kPairs; ++k) {
    const double c = std::fabs(row[k]), s = std::fabs(row[kPairs + k]);
    const double x = a[kNope + 2 * k], y = a[kNope + 2 * k + 1];
    a[kNope + 2 * k] = c * x + s * y;
    a[kNope + 2 * k + 1] = s * x + c * y;
  }
}

// The scores of one (t, h) and what they mean (CONTRACT 4.2, special values): `poisoned` when a
// score is NaN or +inf (exp(z - max) is then NaN: the row's output and lse are NaN); no mass when
// every weight is 0 (no valid key, or every score -inf: exp(-inf) = 0).
struct RowScores {
  std::vector<double> z;
  double zmax = -kInf;  // over the non-NaN scores
  bool poisoned = false;
  bool has_mass() const { return zmax > -kInf; }
};

RowScores score_row(const DecodeParams& p, const RowKeys& keys, int64_t t, int32_t h) {
  const bf16_bits* qh =
      p.q + t * (p.q_stride_token != 0 ? p.q_stride_token : int64_t{p.num_heads} * kDim) +
      h * p.q_stride_head;
  double q[kDim];
  for (int d = 0; d < kDim; ++d) q[d] = bf16_to_float(qh[d]);
  RowScores r;
  r.z.resize(keys.count);
  for (int64_t j = 0; j < keys.count; ++j) {
    const double* k = &keys.values[j * kDim];
    double dot = 0.0;
    for (int d = 0; d < kDim; ++d) dot += q[d] * k[d];
    const double z = static_cast<double>(p.scale) * dot;
    r.z[j] = z;
    r.poisoned = r.poisoned || std::isnan(z) || z == kInf;
    if (z > r.zmax) r.zmax = z;
  }
  return r;
}

// One (t, h): o = sum_j e^(z_j - m) K_j / (sum_j e^(z_j - m) + e^(sink - m)). NaN (every dim)
// for poisoned scores or a NaN sink, as the quotient; exact 0 without mass or under a +inf sink
// (the denominator's limit is +inf).
void reference_head(const DecodeParams& p, const RowKeys& keys, int64_t t, int32_t h, double* o,
                    double* lse, double* abs_mean) {
  const RowScores r = score_row(p, keys, t, h);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // lse over the valid keys only, without the sink; +inf for a row without mass.
  if (lse != nullptr) {
    double sum = 0.0;
    for (double zj : r.z) sum += std::exp(zj - r.zmax);
    *lse = r.poisoned ? nan : r.has_mass() ? r.zmax + std::log(sum) : kInf;
  }
  const bool usable = r.has_mass() && !r.poisoned;
  if (abs_mean != nullptr) {
    for (int d = 0; d < kDim; ++d) abs_mean[d] = 0.0;
    if (usable) reference_abs_mean(p, keys, r.z, r.zmax, t, abs_mean);
  }

  const bool has_sink = p.sink != nullptr;
  const double sink = has_sink ? static_cast<double>(p.sink[h]) : 0.0;
  const bool nan_row = r.poisoned || (has_sink && std::isnan(sink));
  for (int d = 0; d < kDim; ++d) o[d] = nan_row ? nan : 0.0;
  if (nan_row || !usable || (has_sink && sink == kInf)) return;
  const double m = (has_sink && sink > r.zmax) ? sink : r.zmax;
  double den = has_sink ? std::exp(sink - m) : 0.0;
  for (int64_t j = 0; j < keys.count; ++j) {
    const double w = std::exp(r.z[j] - m);
    den += w;
    const double* k = &keys.values[j * kDim];
    for (int d = 0; d < kDim; ++d) o[d] += w * k[d];
  }
  if (!(den > 0.0)) {
    for (int d = 0; d < kDim; ++d) o[d] = 0.0;
    return;
  }
  for (int d = 0; d < kDim; ++d) o[d] /= den;
  if (p.positions != nullptr) rotate_back(o, p.rope, p.positions[t]);
}

}  // namespace

void sparse_decode_reference(const DecodeParams& p, double* out, double* lse, double* abs_mean) {
  const char* op = "sparse_decode_reference";
  core::validate_decode(op, p, /*check_outputs=*/false);  // writes `out` and `lse` below instead
  core::validate_decode_host_data(op, p);
  if (p.num_tokens == 0) return;
  SPARSEMLA_CHECK_PTR(out, op, "out (fp64 [T, H, 512])");
  const int32_t H = p.num_heads;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const RowKeys keys = gather_row_keys(p, t);  // decoded once, shared by every head
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp parallel for schedule(static)
#endif
    for (int32_t h = 0; h < H; ++h) {
      const int64_t row = t * H + h;
      reference_head(p, keys, t, h, out + row * kDim, lse != nullptr ? lse + row : nullptr,
                     abs_mean != nullptr ? abs_mean + row * kDim : nullptr);
    }
  }
}

}  // namespace sparsemla
