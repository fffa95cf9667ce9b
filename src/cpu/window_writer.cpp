// CPU window (SWA) writer (CONTRACT 3.1): one fp8_ds_mla row per token with slot >= 0.
#include "cpu/cpu_backend.h"
#include "cpu/writer_common.h"

namespace sparsemla::cpu {

void write_window(const WindowWriterParams& p) {
  const int32_t bs = p.cache.block_size;
  SPARSEMLA_OMP_PARALLEL_FOR
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = p.slots[i];
    if (slot < 0) continue;  // skipped: nothing read at this position, nothing written
    const bf16_bits* kv = p.kv + i * p.kv_stride;
    // bf16 -> fp32 is exact, so the NoPE values are already bf16-rounded.
    float nope[Fp8DsMla::kNopeDims];
    float rope[Fp8DsMla::kRopeDims];
    for (int d = 0; d < Fp8DsMla::kNopeDims; ++d) nope[d] = bf16_to_float(kv[d]);
    for (int d = 0; d < Fp8DsMla::kRopeDims; ++d) {
      rope[d] = bf16_to_float(kv[Fp8DsMla::kNopeDims + d]);
    }
    detail::rotate_pairs(rope, detail::rope_row(p.rope, p.positions[i]));
    detail::encode_mla_row(nope, rope, p.sanitise,
                           p.cache.base + mla_data_offset(slot, bs, p.cache.block_stride),
                           p.cache.base + mla_scale_offset(slot, bs, p.cache.block_stride));
  }
}

}  // namespace sparsemla::cpu
