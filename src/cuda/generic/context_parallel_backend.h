// src/cuda/generic/context_parallel_backend.h: the portable CUDA context-parallel ops (CONTRACT
// 12), sm_80+ (also in the sm_90a build); they serve both CUDA paths.
//
// Arguments are validated by dispatch (shapes, strides, pointers; every pointer a device pointer);
// device values (lse, positions, list rows) are never read by the host. Everything runs on the
// call's stream without allocation or host synchronisation, launch shapes from (T, H) or the row
// count only (graph-safe).
#pragma once

#include "sparsemla/context_parallel.h"

namespace sparsemla::cuda_generic {

// The rank merge (context_parallel.cu): bit-identical to the CPU backend (src/core/merge_math.h).
// A position outside [0, rope.rows) (rejected by the CPU) is clamped into the table.
void merge_ranks(const RankMergeParams& p);

// The list sharding (lists.cu, beside the builders: count, scan, order-keeping fill). Same lists
// as the CPU backend; a rank's row longer than out.width (the CPU rejects it) keeps its first
// out.width entries.
void shard_list(const ShardListParams& p);

}  // namespace sparsemla::cuda_generic
