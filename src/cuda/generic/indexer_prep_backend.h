// src/cuda/generic/indexer_prep_backend.h: the portable CUDA indexer query prep (CONTRACT 11.6),
// sm_80+ (also in the sm_90a build); a header of its own so that the op's files stay apart from the
// indexer's (indexer_backend.h).
//
// Arguments are validated by dispatch (shapes, strides, pointers; every pointer a device pointer);
// positions are device values the host never reads. Runs on p.stream without allocation or host
// synchronisation, launch shape from (T, H) only (graph-safe). Bytes and weights are identical to
// the CPU backend's (src/cpu/indexer_prep.cpp: the same fp32 operations, each rounded on its own).
// A row whose position is outside [0, rope.rows) (the CPU rejects >= rope.rows before writing) is
// written as a padding row: 128 zero bytes and weight +0.
#pragma once

#include "sparsemla/indexer_prep.h"

namespace sparsemla::cuda_generic {

void indexer_q_prep(const IndexerQPrepParams& p);

}  // namespace sparsemla::cuda_generic
