// Argument validation of the indexer-key gather (CONTRACT 6).
#include <string>

#include "core/validate.h"
#include "sparsemla/error.h"

#if defined(SPARSEMLA_WITH_CUDA)
#include "cuda/common/device_info.h"
#endif

namespace sparsemla::core {

namespace {

constexpr const char* kOp = "gather_indexer_keys";

// True when the call will run on the CPU, so its index arrays are host memory we may read here.
// Mirrors dispatch: Auto goes to the CPU for host pointers (k_scale is the probe there too).
bool runs_on_host(const GatherParams& p) {
  if (p.path == Path::Cpu) return true;
  if (p.path != Path::Auto) return false;
#if defined(SPARSEMLA_WITH_CUDA)
  return !cuda::is_device_pointer(p.k_scale);
#else
  return true;
#endif
}

// cu_seqlen [B+1]: cu_seqlen[0] >= 0 and non-decreasing (the CPU reads it; on the GPU it is a
// documented precondition, since checking would need a device-to-host copy).
void check_cu_seqlen(const GatherParams& p) {
  SPARSEMLA_CHECK_ARG(p.cu_seqlen[0] >= 0, kOp, "cu_seqlen[0]", ">= 0", p.cu_seqlen[0]);
  for (int64_t b = 0; b < p.num_batches; ++b) {
    SPARSEMLA_CHECK_ARG(p.cu_seqlen[b + 1] >= p.cu_seqlen[b], kOp,
                        "cu_seqlen[" + std::to_string(b + 1) + "]",
                        "non-decreasing: >= cu_seqlen[" + std::to_string(b) +
                            "] = " + std::to_string(p.cu_seqlen[b]),
                        p.cu_seqlen[b + 1]);
  }
}

}  // namespace

void validate(const GatherParams& p) {
  check_nonneg(kOp, "num_tokens", p.num_tokens);
  check_nonneg(kOp, "num_batches", p.num_batches);
  check_nonneg(kOp, "block_table_width", p.block_table_width);
  SPARSEMLA_CHECK_ARG(p.block_table_stride >= p.block_table_width, kOp, "block_table_stride",
                      ">= block_table_width = " + std::to_string(p.block_table_width),
                      p.block_table_stride);
  SPARSEMLA_CHECK_ARG(p.k_fp8_stride >= IndexerFp8::kValueBytes, kOp, "k_fp8_stride", ">= 128",
                      p.k_fp8_stride);
  check_indexer_cache(kOp, "cache", p.cache);
  check_extent(kOp, "num_tokens", p.num_tokens, p.k_fp8_stride, "num_tokens*k_fp8_stride (bytes)");
  check_extent(kOp, "num_batches", p.num_batches, p.block_table_stride,
               "num_batches*block_table_stride (elements)");
  check_aligned(kOp, "token_to_seq", p.token_to_seq);
  check_aligned(kOp, "cu_seqlen", p.cu_seqlen);
  check_aligned(kOp, "block_table", p.block_table);
  check_aligned(kOp, "k_scale", p.k_scale);
  if (p.num_tokens == 0) return;  // nothing is read or written
  SPARSEMLA_CHECK_PTR(p.token_to_seq, kOp, "token_to_seq");
  SPARSEMLA_CHECK_PTR(p.cu_seqlen, kOp, "cu_seqlen");
  SPARSEMLA_CHECK_PTR(p.k_fp8, kOp, "k_fp8");
  SPARSEMLA_CHECK_PTR(p.k_scale, kOp, "k_scale");
  if (p.num_batches > 0 && p.block_table_width > 0) {
    SPARSEMLA_CHECK_PTR(p.block_table, kOp, "block_table");
  }
  if (runs_on_host(p)) check_cu_seqlen(p);
}

}  // namespace sparsemla::core
