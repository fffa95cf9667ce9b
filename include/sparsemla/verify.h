// sparsemla/verify.h: the accuracy contract of SPEC 9, as a function engines and tests can call.
//
// A decode output (bf16) matches a reference (float64 on the dequantised cache, same scrub
// decisions) when NaN, +inf and -inf positions match exactly, every finite element satisfies |out -
// ref| < 1e-3 or |out - ref| / (|ref| + 1e-6) < 2.01/128 (two bf16 ulps: the probabilities are
// rounded to bf16 before P.V and the output is stored once in bf16), and the cosine difference
// 1 - 2*sum(out*ref) / sum(out^2 + ref^2) over the whole output is <= 5e-6 (0 when sum(ref^2) <
// 1e-12).
#pragma once

#include <cstdint>
#include <string>

#include "sparsemla/numerics.h"

namespace sparsemla {

struct VerifyResult {
  bool passed = false;
  int64_t elements = 0;
  int64_t special_mismatches = 0;  // NaN/inf positions that differ
  int64_t tolerance_failures = 0;  // finite elements outside both bounds
  double max_abs_error = 0.0;      // over finite pairs
  double cosine_diff = 0.0;
  int64_t first_bad = -1;      // flat index of the first failing element, -1 if none
  double first_bad_out = 0.0;  // its output and reference values
  double first_bad_ref = 0.0;
  std::string summary() const;
};

// out: bf16 [T, H, 512] with strides (elements); ref: float64 [T, H, 512] contiguous.
VerifyResult verify_decode_output(const bf16_bits* out, int64_t num_tokens, int32_t num_heads,
                                  int64_t out_stride_token, int64_t out_stride_head,
                                  const double* ref);

}  // namespace sparsemla
