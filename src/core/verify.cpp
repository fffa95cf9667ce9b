// The CONTRACT 9.9 accuracy contract (include/sparsemla/verify.h has the rule and its argument).
#include "sparsemla/verify.h"

#include <cmath>
#include <cstdio>

#include "sparsemla/error.h"

namespace sparsemla {

namespace {

bool same_special(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return true;
}
}  // namespace

std::string VerifyResult::summary() const {
  char buf[448];
  const int n = std::snprintf(
      buf, sizeof(buf),
      "%s: %lld elements, max abs err %.3g, max err/bound %.3g, cos diff %.3g, %lld special "
      "mismatches, %lld out of tolerance",
      passed ? "PASS" : "FAIL", static_cast<long long>(elements), max_abs_error, max_bound_ratio,
      cosine_diff, static_cast<long long>(special_mismatches),
      static_cast<long long>(tolerance_failures));
  if (first_bad >= 0 && n > 0 && n < static_cast<int>(sizeof(buf)))
    std::snprintf(buf + n, sizeof(buf) - n,
                  "; first at flat index %lld (dim %lld): out %.6g, ref %.6g, bound %.3g",
                  static_cast<long long>(first_bad), static_cast<long long>(first_bad % 512),
                  first_bad_out, first_bad_ref, first_bad_bound);
  return buf;
}

VerifyResult verify_decode_output(const bf16_bits* out, int64_t num_tokens, int32_t num_heads,
                                  int64_t out_stride_token, int64_t out_stride_head,
                                  const double* ref, const double* abs_mean) {
  const char* op = "verify_decode_output";
  SPARSEMLA_CHECK_ARG(num_tokens >= 0 && num_tokens <= (int64_t{1} << 40), op, "num_tokens",
                      "in [0, 2^40]", num_tokens);
  SPARSEMLA_CHECK_ARG(num_heads >= 1 && num_heads <= 128, op, "num_heads", "in [1, 128]",
                      num_heads);
  if (num_tokens > 0) {
    SPARSEMLA_CHECK_PTR(out, op, "out");
    SPARSEMLA_CHECK_PTR(ref, op, "ref");
    SPARSEMLA_CHECK_PTR(abs_mean, op, "abs_mean");
    SPARSEMLA_CHECK_ARG(num_heads <= 1 || out_stride_head >= 512, op, "out_stride_head", ">= 512",
                        out_stride_head);
    SPARSEMLA_CHECK_ARG(num_tokens <= 1 || out_stride_token >= 512, op, "out_stride_token",
                        ">= 512", out_stride_token);
  }
  VerifyResult r;
  double dot = 0.0, norms = 0.0, ref_sq = 0.0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int32_t h = 0; h < num_heads; ++h) {
      const bf16_bits* o = out + t * out_stride_token + h * out_stride_head;
      const double* e = ref + (t * num_heads + h) * 512;
      const double* m = abs_mean + (t * num_heads + h) * 512;
      for (int d = 0; d < 512; ++d, ++r.elements) {
        const double a = bf16_to_float(o[d]), b = e[d];
        const int64_t flat = (t * num_heads + h) * 512 + d;
        if (!same_special(a, b)) {
          ++r.special_mismatches;
          if (r.first_bad < 0) r.first_bad = flat, r.first_bad_out = a, r.first_bad_ref = b;
          continue;
        }
        if (!std::isfinite(a)) continue;
        const double diff = std::fabs(a - b);
        // A non-finite A (a row holding +-inf: outside the contract, CONTRACT 9.9) bounds nothing.
        const double bound = std::isfinite(m[d]) ? verify_element_bound(b, m[d]) : HUGE_VAL;
        r.max_abs_error = std::fmax(r.max_abs_error, diff);
        r.max_bound_ratio = std::fmax(r.max_bound_ratio, diff / bound);
        if (!(diff <= bound)) {
          ++r.tolerance_failures;
          if (r.first_bad < 0)
            r.first_bad = flat, r.first_bad_out = a, r.first_bad_ref = b, r.first_bad_bound = bound;
        }
        dot += a * b;
        norms += a * a + b * b;
        ref_sq += b * b;
      }
    }
  }
  r.cosine_diff = (ref_sq < 1e-12 || norms == 0.0) ? 0.0 : 1.0 - 2.0 * dot / norms;
  r.passed = r.special_mismatches == 0 && r.tolerance_failures == 0 && r.cosine_diff <= kVerifyCosineTol;
  return r;
}

}  // namespace sparsemla
