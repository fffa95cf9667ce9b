// Row decoders of the two cache formats (CONTRACT 2.1, 2.2) and the NaN scrub (CONTRACT 5).
#include <cmath>
#include <cstring>
#include <string>

#include "core/validate.h"
#include "sparsemla/error.h"
#include "sparsemla/writer.h"

#if defined(SPARSEMLA_WITH_CUDA)
#include "cuda/common/device_info.h"
#endif

namespace sparsemla {

namespace {

// The row decoders run on the CPU: a device pointer would be dereferenced on the host.
void check_host(const char* op, const char* arg, const void* p) {
#if defined(SPARSEMLA_WITH_CUDA)
  SPARSEMLA_CHECK_ARG(!cuda::is_device_pointer(p), op, arg,
                      "host memory (the row decoder runs on "
                      "the CPU)",
                      "device memory");
#else
  (void)op, (void)arg, (void)p;
#endif
}

void check_slot(const char* op, int64_t slot, int64_t num_blocks, int32_t block_size) {
  SPARSEMLA_CHECK_ARG(
      slot_is_valid(slot, num_blocks, block_size), op, "slot",
      "in [0, num_blocks*block_size = " + std::to_string(num_blocks * int64_t{block_size}) + ")",
      slot);
}

}  // namespace

void dequantize_row(const CacheView& cache, int64_t slot, bool scrub, float* out512) {
  constexpr const char* kOp = "dequantize_row";
  core::check_cache(kOp, "cache", cache);
  SPARSEMLA_CHECK_PTR(out512, kOp, "out512");
  check_host(kOp, "cache.base", cache.base);
  check_host(kOp, "out512", out512);
  check_slot(kOp, slot, cache.num_blocks, cache.block_size);
  const uint8_t* data = cache.base + mla_data_offset(slot, cache.block_size, cache.block_stride);
  const uint8_t* scale = cache.base + mla_scale_offset(slot, cache.block_size, cache.block_stride);
  for (int d = 0; d < Fp8DsMla::kNopeDims; ++d) {
    // Exact in fp32: an e4m3 value (4 significant bits) times a power of two, incl. 2^-127.
    out512[d] = e4m3_to_float(data[d]) * ue8m0_to_float(scale[d / Fp8DsMla::kTileDims]);
  }
  for (int d = 0; d < Fp8DsMla::kRopeDims; ++d) {
    const uint8_t* b = data + Fp8DsMla::kRopeOffset + 2 * d;
    out512[Fp8DsMla::kNopeDims + d] = bf16_to_float(static_cast<bf16_bits>(b[0] | (b[1] << 8)));
  }
  if (!scrub) return;
  for (int d = 0; d < Fp8DsMla::kHeadDim; ++d) {
    if (std::isnan(out512[d])) out512[d] = 0.0f;  // +0; +-inf kept
  }
}

void dequantize_indexer_row(const IndexerCacheView& cache, int64_t slot, float* out128) {
  constexpr const char* kOp = "dequantize_indexer_row";
  core::check_indexer_cache(kOp, "cache", cache);
  SPARSEMLA_CHECK_PTR(out128, kOp, "out128");
  check_host(kOp, "cache.base", cache.base);
  check_host(kOp, "out128", out128);
  check_slot(kOp, slot, cache.num_blocks, cache.block_size);
  const int32_t row = static_cast<int32_t>(slot % cache.block_size);
  const uint8_t* page = cache.base + (slot / cache.block_size) * cache.block_stride;
  float scale;
  std::memcpy(&scale, page + indexer_scale_offset_in_page(cache.block_size, row), sizeof(scale));
  for (int d = 0; d < IndexerFp8::kHeadDim; ++d) {
    out128[d] = e4m3_to_float(page[indexer_value_offset_in_page(cache.layout, row, d)]) * scale;
  }
}

}  // namespace sparsemla
