#include "reference.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace sparsemla::tools {

namespace {

constexpr double kProgressSeconds = 10.0;  // between progress lines

// Whether row `slot` can decode to NaN, i.e. whether the scrub (NaN -> 0) can change it: an e4m3
// NaN byte (0x7F/0xFF), a code 255 tile (+inf scale; a zero byte times it is NaN) or a NaN RoPE
// value.
bool row_may_be_nan(const CacheView& c, int64_t slot) {
  const uint8_t* data = c.base + mla_data_offset(slot, c.block_size, c.block_stride);
  const uint8_t* codes = c.base + mla_scale_offset(slot, c.block_size, c.block_stride);
  for (int d = 0; d < Fp8DsMla::kNopeBytes; ++d)
    if ((data[d] & 0x7F) == 0x7F) return true;
  for (int i = 0; i < Fp8DsMla::kNumTiles; ++i)
    if (codes[i] == 255) return true;
  for (int d = 0; d < Fp8DsMla::kRopeDims; ++d) {
    const uint32_t v = data[Fp8DsMla::kRopeOffset + 2 * d] |
                       uint32_t{data[Fp8DsMla::kRopeOffset + 2 * d + 1]} << 8;
    if ((v & 0x7FFF) > 0x7F80) return true;
  }
  return false;
}

bool extra_rows_scrub_free(const Problem& pb) {
  if (pb.kind.ratio == 0) return true;
  const CacheView c = pb.compressed_cache.view();
  const HostList& l = pb.extra_list;
  for (int32_t i = 0; i < l.indptr.back(); ++i)
    if (slot_is_valid(l.indices[i], c.num_blocks, c.block_size) && row_may_be_nan(c, l.indices[i]))
      return false;
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool scrubs_extra(const Problem& pb, Path path) {
  const DecodeParams p = pb.params();
  ProvenanceGateInputs gate;
  gate.specialised_path = path == Path::CudaSm90;
  gate.kv_connector = p.kv_connector;
  gate.has_extra_cache = p.has_extra;
  gate.extra_cache_sanitised = p.extra_cache_sanitised;
  return !may_skip_extra_scrub(gate);
}

Reference compute_reference(const Problem& pb, Path path,
                            const std::function<void(const std::string&)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t T = pb.tokens, row = int64_t{pb.heads} * 512;
  Reference r;
  r.out.resize(static_cast<size_t>(T * row));
  r.abs_mean.resize(r.out.size());
  DecodeParams base = pb.params();
  base.path = path;  // the reference follows the kernel's scrub decisions
  const auto one_row = [&](int64_t t) {
    DecodeParams p = base;
    p.num_tokens = 1;
    p.q += t * p.q_stride_token;
    p.main_list.indptr += t;
    if (p.has_extra) p.extra_list.indptr += t;
    if (p.positions != nullptr) p.positions += t;
    sparse_decode_reference(p, &r.out[t * row], nullptr, &r.abs_mean[t * row]);
  };
  std::atomic<int64_t> done{0};
  double last = 0.0;
  const auto report = [&] {  // one thread at a time
    const double s = seconds_since(t0);
    if (!progress || s - last < kProgressSeconds) return;
    last = s;
    char msg[160];
    std::snprintf(msg, sizeof msg, "reference (float64): %lld/%lld query rows, %.0f s",
                  static_cast<long long>(done.load()), static_cast<long long>(T), s);
    progress(msg);
  };
  if (T == 0) return r;
  one_row(0);  // argument errors surface here, outside any parallel region
  ++done;
  int threads = 1;
#if defined(_OPENMP)
  threads = omp_get_max_threads();
#endif
  if (pb.heads >= threads) {  // the library's threads over heads
    for (int64_t t = 1; t < T; ++t) {
      one_row(t);
      ++done;
      report();
    }
  } else {
    std::exception_ptr error;
    std::mutex error_mutex;
#if defined(_OPENMP)
    const int levels = omp_get_max_active_levels();
    omp_set_max_active_levels(1);  // the library's loop over heads runs inside one thread
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int64_t t = 1; t < T; ++t) {
      try {
        one_row(t);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      ++done;
#if defined(_OPENMP)
      if (omp_get_thread_num() == 0) report();
#endif
    }
#if defined(_OPENMP)
    omp_set_max_active_levels(levels);
#endif
    if (error) std::rethrow_exception(error);
  }
  r.seconds = seconds_since(t0);
  if (progress) {
    char msg[128];
    std::snprintf(msg, sizeof msg, "reference (float64, extra %s): %lld query rows in %.2f s",
                  scrubs_extra(pb, path) ? "scrubbed" : "not scrubbed", static_cast<long long>(T),
                  r.seconds);
    progress(msg);
  }
  return r;
}

ReferenceStore::ReferenceStore(const Problem& pb, std::function<void(const std::string&)> progress)
    : pb_(pb), progress_(std::move(progress)), scrub_free_(extra_rows_scrub_free(pb)) {}

const Reference& ReferenceStore::get(Path path) {
  const int key = scrub_free_ ? 0 : (scrubs_extra(pb_, path) ? 2 : 1);
  auto it = refs_.find(key);
  if (it == refs_.end()) it = refs_.emplace(key, compute_reference(pb_, path, progress_)).first;
  return it->second;
}

}  // namespace sparsemla::tools
