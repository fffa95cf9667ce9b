// Argument validation of the context-parallel ops (CONTRACT 12): the rank merge and the list
// sharding; a header of its own so that the ops' files stay apart from the decode's.
#pragma once

#include "sparsemla/context_parallel.h"

namespace sparsemla::core {

// Shapes, strides and pointers (device-safe: nothing the arrays hold is read).
void validate(const RankMergeParams& p);
void validate(const ShardListParams& p);
// Host data, read by the CPU backend before it writes: the merge's positions against the table;
// the sharded list's rows (indptr) and that every row of this rank fits out.width.
void validate_host_data(const RankMergeParams& p);
void validate_host_data(const ShardListParams& p);

}  // namespace sparsemla::core
