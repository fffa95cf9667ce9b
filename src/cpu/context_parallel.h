// The CPU backend of the context-parallel ops (CONTRACT 12; src/cpu/context_parallel.cpp).
#pragma once

#include "sparsemla/context_parallel.h"

namespace sparsemla::cpu {

void merge_ranks(const RankMergeParams& p);
void shard_list(const ShardListParams& p);

}  // namespace sparsemla::cpu
