// src/cpu/cpu_backend.h: the CPU implementations. Arguments are already validated by dispatch.
#pragma once

#include "sparsemla/decode.h"
#include "sparsemla/gather.h"
#include "sparsemla/indexer.h"
#include "sparsemla/lists.h"
#include "sparsemla/writer.h"

namespace sparsemla::cpu {

void write_window(const WindowWriterParams& p);
void write_compressor_state(const StateWriterParams& p);
void compress(const CompressorParams& p);
void compress_indexer(const IndexerCompressorParams& p);
void gather_indexer_keys(const GatherParams& p);
void indexer_topk(const IndexerParams& p);  // CONTRACT 11 (src/cpu/indexer.cpp)

void build_ragged_from_dense(const DenseToRaggedParams& p);
void build_window_lists(const WindowListParams& p);
void build_topk_lists(const TopkListParams& p);
void build_compressed_all_lists(const CompressedAllListParams& p);

// Fast CPU decode (CONTRACT 4.2 kernel numerics, split-K of 4.3, adaptive rule of 4.5) as planned.
void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace);
void inverse_rope_inplace(bf16_bits* x, int64_t num_tokens, int32_t num_heads, int64_t stride_token,
                          int64_t stride_head, const int64_t* positions, const RopeTable& rope);

}  // namespace sparsemla::cpu
