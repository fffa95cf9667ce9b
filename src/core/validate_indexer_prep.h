// Argument validation of the indexer query prep (CONTRACT 11.6); a header of its own so that the
// op's files stay apart from the indexer's (src/core/validate.h).
#pragma once

#include "sparsemla/indexer_prep.h"

namespace sparsemla::core {

// Shapes, strides and pointers (device values are the backend's: the CPU checks positions).
void validate(const IndexerQPrepParams& p);

}  // namespace sparsemla::core
