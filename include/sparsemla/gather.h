// sparsemla/gather.h: the indexer-key gather of CONTRACT 6.
//
// Gathers the paged indexer cache of a prefill chunk into contiguous k_fp8 [N, 128] + k_scale [N].
// Token tid belongs to sequence b = token_to_seq[tid] at position o = tid - cu_seqlen[b]; its row
// is page block_table[b][o / bs], row o % bs.
//   - invalid token (b outside [0, num_batches) or tid outside [cu_seqlen[b], cu_seqlen[b+1])):
//     nothing is written (over-allocated outputs keep their contents);
//   - valid token whose page is invalid (o/bs >= block_table_width, or block id outside
//     [0, num_blocks)): k_scale = 0, the value row is left untouched.
// The batch count is a run-time value; addressing is 64-bit.
#pragma once

#include <cstdint>

#include "sparsemla/backend.h"
#include "sparsemla/format.h"

namespace sparsemla {

struct GatherParams {
  int64_t num_tokens = 0;                 // N: output rows
  int64_t num_batches = 0;                // B
  const int32_t* token_to_seq = nullptr;  // [N], -1 (or any out-of-range value): padding token
  const int32_t* cu_seqlen = nullptr;     // [B + 1], non-decreasing
  const int32_t* block_table = nullptr;   // [B, block_table_width], row stride block_table_stride
  int64_t block_table_stride = 0;
  int32_t block_table_width = 0;
  IndexerCacheView cache;    // source (read only)
  uint8_t* k_fp8 = nullptr;  // [N, 128] e4m3, row stride k_fp8_stride bytes
  int64_t k_fp8_stride = 128;
  float* k_scale = nullptr;  // [N]
  Path path = Path::Auto;
  void* stream = nullptr;
};
void gather_indexer_keys(const GatherParams& p);

}  // namespace sparsemla
