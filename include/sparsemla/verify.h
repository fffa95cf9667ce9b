// sparsemla/verify.h: the accuracy contract (CONTRACT 9.9), a function engines and tests can call.
//
// A decode output (bf16) matches the float64 reference (sparse_decode_reference on the dequantised
// cache, same scrub decisions) when
//  1. NaN, +inf and -inf positions match exactly;
//  2. every finite element satisfies |out - ref| <= 2^-7 * A + 2^-8 * |ref| + 1e-6, where
//     A[t,h,j] = sum_i p_i |v_ij| / sum_i p_i is the probability-weighted mean magnitude of value
//     column j (the reference's `abs_mean` output; |ref| <= A);
//  3. the cosine difference 1 - 2*sum(out*ref) / sum(out^2 + ref^2) over the whole output is
//     <= 5e-6 (taken as 0 when sum(ref^2) < 1e-12).
//
// Why rule 2 holds for every correct kernel, whatever the data magnitude: a kernel rounds each
// probability to bf16 before P.V (unit roundoff 2^-8, so p_i moves by at most 2^-8 p_i) while its
// denominator sums the fp32 probabilities, so out_j moves by at most 2^-8 * sum_i p_i |v_ij| /
// sum_i p_i = 2^-8 A; the bf16 store adds at most 2^-8 |out|; the factor 2 on the first term
// covers fp32 accumulation (~1e-6 relative), exp2 approximations and the split-K combine (fp32
// partials, one rescale). The 1e-6 absorbs rows whose output is ~0. Bounding by A instead of |ref|
// is what keeps the rule valid for elements that are small by cancellation between large values:
// the old rule (1e-3 absolute or two bf16 ulps relative) failed correct kernels on 10-17% of random
// decode calls at model magnitudes (O(1) latents). Rule 2 alone misses structural bugs whose effect
// stays within 2^-7 A per element (one dropped key of many, one tile on a wrong scale): rule 3 is
// what catches those, over the whole output.
#pragma once

#include <cstdint>
#include <string>

#include "sparsemla/numerics.h"

namespace sparsemla {

// The constants of the rule (CONTRACT 9.9).
inline constexpr double kVerifyAbsMeanFactor = 1.0 / 128.0;  // 2^-7 * A
inline constexpr double kVerifyRefFactor = 1.0 / 256.0;      // 2^-8 * |ref|
inline constexpr double kVerifyAbsFloor = 1e-6;
inline constexpr double kVerifyCosineTol = 5e-6;
// Rule 3 for a context-parallel merge of bf16 rank outputs (CONTRACT 12.3): the ranks' bf16 store
// and the merge's own store stack two roundings of up to 2^-8 relative each. On FP8 caches (three
// mantissa bits) a row dominated by one key holds few distinct mantissas, so a store's rounding
// errors add coherently over the row (a row-wide scale error, measured up to 3.5e-3 after two
// stores against 1.1e-3 after one), and with few rows such a row carries the output's norm. The
// cosine difference is quadratic in the error: twice the error, four times the tolerance.
inline constexpr double kVerifyCosineTolBf16RankMerge = 4 * kVerifyCosineTol;

// The element bound of rule 2.
inline double verify_element_bound(double ref, double abs_mean) {
  return kVerifyAbsMeanFactor * abs_mean + kVerifyRefFactor * (ref < 0 ? -ref : ref) +
         kVerifyAbsFloor;
}

struct VerifyResult {
  bool passed = false;
  int64_t elements = 0;
  int64_t special_mismatches = 0;  // NaN/inf positions that differ
  int64_t tolerance_failures = 0;  // finite elements outside the element bound
  double max_abs_error = 0.0;      // over finite pairs
  double max_bound_ratio = 0.0;    // max |out - ref| / bound over finite pairs (<= 1 passes)
  double cosine_diff = 0.0;
  int64_t first_bad = -1;      // flat index of the first failing element, -1 if none
  double first_bad_out = 0.0;  // its output and reference values
  double first_bad_ref = 0.0;
  double first_bad_bound = 0.0;
  std::string summary() const;
};

// out: bf16 [T, H, 512] with strides (elements); ref and abs_mean: float64 [T, H, 512] contiguous,
// as sparse_decode_reference writes them.
VerifyResult verify_decode_output(const bf16_bits* out, int64_t num_tokens, int32_t num_heads,
                                  int64_t out_stride_token, int64_t out_stride_head,
                                  const double* ref, const double* abs_mean);

}  // namespace sparsemla
