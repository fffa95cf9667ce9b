// tools/common/reference.h: the float64 reference of a Problem (CONTRACT 9.9) for the tools'
// verdicts, with progress lines, and a store that computes it once per problem and scrub decision.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "problem.h"

namespace sparsemla::tools {

struct Reference {
  std::vector<double> out;       // [T, H, 512]
  std::vector<double> abs_mean;  // [T, H, 512]: A of verify.h
  double seconds = 0.0;
};

// sparse_decode_reference over pb with the scrub decisions of `path`, in slices of query rows so
// that `progress` (may be empty) hears about long runs: every ~10 s, and once at the end. Threads:
// over heads inside the library (OpenMP), over rows here when there are fewer heads than threads
// (tp-h8 on 16 cores would otherwise leave half of them idle).
Reference compute_reference(const Problem& pb, Path path,
                            const std::function<void(const std::string&)>& progress);

// Whether the decode of pb on `path` scrubs the extra cache (CONTRACT 5; the window cache always).
bool scrubs_extra(const Problem& pb, Path path);

// The reference of one problem for any path: computed on first use per scrub decision, then
// reused across paths and split counts. When no row the lists reach can decode to NaN (no e4m3
// NaN byte, no code 255, no NaN RoPE value: always so for bench data), both decisions give the
// same reference and one is computed.
class ReferenceStore {
 public:
  ReferenceStore(const Problem& pb, std::function<void(const std::string&)> progress);
  const Reference& get(Path path);

 private:
  const Problem& pb_;
  std::function<void(const std::string&)> progress_;
  bool scrub_free_;
  std::map<int, Reference> refs_;
};

}  // namespace sparsemla::tools
