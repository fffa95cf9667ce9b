// The CPU backend of the indexer query prep (CONTRACT 11.6; src/cpu/indexer_prep.cpp).
#pragma once

#include "sparsemla/indexer_prep.h"

namespace sparsemla::cpu {

void indexer_q_prep(const IndexerQPrepParams& p);

}  // namespace sparsemla::cpu
