// src/cpu/decode_common.h: host-side decisions shared by the CPU decode, its reference and the
// dispatcher: planner widths and CU, the scrub decision of the provenance gate, list rows.
#pragma once

#include <algorithm>
#include <cstdint>

#include "sparsemla/backend.h"
#include "sparsemla/decode.h"
#include "sparsemla/plan.h"

#if defined(SPARSEMLA_HAVE_OPENMP)
#include <omp.h>
#endif

namespace sparsemla::cpu {

// Threads an OpenMP region of the CPU backend uses (1 without OpenMP).
inline int32_t cpu_thread_count() {
#if defined(SPARSEMLA_HAVE_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Planner width of a list (CONTRACT 4.4): its dense row width W, else capacity / T (exact
// division).
inline int64_t list_plan_width(const IndexList& list, int64_t num_tokens) {
  if (list.width > 0) return list.width;
  return num_tokens > 0 ? list.capacity / num_tokens : 0;
}

// The planner shape of a decode call on the CPU: CU = p.num_sms, else the CPU thread count.
inline PlanShape decode_plan_shape(const DecodeParams& p) {
  PlanShape shape;
  shape.num_tokens = p.num_tokens;
  shape.num_heads = p.num_heads;
  shape.width_main = list_plan_width(p.main_list, p.num_tokens);
  shape.width_extra = p.has_extra ? list_plan_width(p.extra_list, p.num_tokens) : 0;
  shape.num_sms = p.num_sms > 0 ? p.num_sms : cpu_thread_count();
  return shape;
}

// Whether the extra cache is scrubbed (CONTRACT 5): always, unless the provenance gate holds. The
// main (window) cache is always scrubbed. The CPU path is never the specialised one, so it always
// scrubs; the reference follows whatever path p.path names, as the kernel it is compared with.
inline bool decode_scrubs_extra(const DecodeParams& p) {
  ProvenanceGateInputs gate;
  gate.specialised_path = p.path == Path::CudaSm90;
  gate.format_is_fp8_ds_mla = true;  // the only decode cache format
  gate.kv_connector = p.kv_connector;
  gate.has_extra_cache = p.has_extra;
  gate.extra_cache_sanitised = p.extra_cache_sanitised;
  return !may_skip_extra_scrub(gate);
}

// Row t of a list: [begin, end) into indices.
struct ListRow {
  const int32_t* indices;
  int64_t length;
};
inline ListRow list_row(const IndexList& list, int64_t t) {
  if (list.dense()) {  // CONTRACT 4.6 dense form: the first len(t) of the row's W entries
    const int64_t stride = list.dense_stride != 0 ? list.dense_stride : list.width;
    int64_t len = list.width;
    if (list.lengths != nullptr) {
      len = std::clamp<int64_t>(list.lengths[t / list.rows_per_length], 0, list.width);
    }
    return {list.indices + t * stride, len};
  }
  const int64_t begin = list.indptr[t], end = list.indptr[t + 1];
  return {list.indices + begin, end - begin};
}

}  // namespace sparsemla::cpu
