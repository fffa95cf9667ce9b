// src/cuda/generic/ops_backend.h: the portable CUDA (sm_80+) writers, gather and list builders.
//
// Arguments are validated by dispatch for shapes and pointers only: per-token values live on the
// device and are never read by the host, so every kernel is harmless on bad values (a token whose
// slot, position, request or page is out of range is skipped; nothing is written out of bounds).
// Results are byte-identical to the CPU backend (same float operations in the same order), except
// the compressor's pooling exp while the CPU uses std::exp (see writers.cu). Everything runs on
// `p.stream` (or `p.common.stream`) without allocation or host synchronisation, so it can be
// captured in a CUDA graph.
#pragma once

#include <cstdint>

#include "sparsemla/gather.h"
#include "sparsemla/lists.h"
#include "sparsemla/writer.h"

namespace sparsemla::cuda_generic {

// Writers (CONTRACT 3); writers.cu.
void write_window(const WindowWriterParams& p);
void write_compressor_state(const StateWriterParams& p);
void compress(const CompressorParams& p);  // single pass, or two stages when p.scratch is set
void compress_indexer(const IndexerCompressorParams& p);

// Indexer-key gather (CONTRACT 6); gather.cu. One kernel for every batch count.
void gather_indexer_keys(const GatherParams& p);

// Ragged list builders (CONTRACT 4.6); lists.cu. They write in place into the caller's (graph)
// buffers.
void build_ragged_from_dense(const DenseToRaggedParams& p);
void build_window_lists(const WindowListParams& p);
void build_topk_lists(const TopkListParams& p);
void build_compressed_all_lists(const CompressedAllListParams& p);

// Test hook: y[i] = exp_portable(x[i]) evaluated on the device (n device floats each), so tests
// can compare it bit for bit with the host evaluation.
void device_exp_portable(const float* x, float* y, int64_t n, void* stream);

}  // namespace sparsemla::cuda_generic
