// src/core/validate.h: argument validation of every public operation (throws sparsemla::Error).
// One function per params struct; shared checks for the views they contain.
#pragma once

#include <cstdint>
#include <string>

#include "sparsemla/decode.h"
#include "sparsemla/error.h"
#include "sparsemla/gather.h"
#include "sparsemla/indexer.h"
#include "sparsemla/lists.h"
#include "sparsemla/writer.h"

namespace sparsemla::core {

// Shared pieces (src/core/validate.cpp).
void check_cache(const char* op, const char* arg, const CacheView& c);
void check_indexer_cache(const char* op, const char* arg, const IndexerCacheView& c);
void check_rope(const char* op, const char* arg, const RopeTable& r);
void check_state(const char* op, const char* arg, const StateCacheView& s, int64_t row_width);
void check_nonneg(const char* op, const char* arg, int64_t v);
// count rows `stride` apart stay addressable: count * stride fits in int64 (stride >= 1), so no
// index computation of the operation can overflow. `what` names the product in the message.
void check_extent(const char* op, const std::string& arg, int64_t count, int64_t stride,
                  const std::string& what);

// A typed pointer is aligned to its element type (misaligned typed loads are undefined behaviour
// on the host and fault on the GPU).
template <typename T>
void check_aligned(const char* op, const std::string& arg, const T* ptr) {
  SPARSEMLA_CHECK_ARG(reinterpret_cast<uintptr_t>(ptr) % alignof(T) == 0, op, arg,
                      std::to_string(alignof(T)) + "-byte alignment (its element type)",
                      static_cast<const void*>(ptr));
}

// The decode's operand and list checks (src/core/validate_decode.cpp), shared with the
// context-parallel ops (src/core/validate_context_parallel.cpp). A [T, H, 512] operand read
// (rows at least 512 apart) or written (rows also disjoint); prefix names the stride fields
// ("q_" -> q_stride_head, q_stride_token).
void check_read_strides(const char* op, const char* prefix, int64_t T, int32_t H, int64_t st,
                        int64_t sh);
void check_write_strides(const char* op, const char* prefix, int64_t T, int32_t H, int64_t st,
                         int64_t sh, int64_t row_len);
// A list of T rows (CONTRACT 4.6): shape and pointers (device-safe); check_list_rows also reads a
// ragged list's host indptr[0..T]; check_positions every position against the table.
void check_list_shape(const char* op, const char* name, const IndexList& list, int64_t T);
void check_list_rows(const char* op, const char* name, const IndexList& list, int64_t T);
void check_positions(const char* op, const int64_t* positions, int64_t T, const RopeTable& rope);

// Per operation (src/core/validate_writers.cpp, validate_gather.cpp, validate_decode.cpp,
// validate_lists.cpp).
// Writers: host_data = false skips the per-token checks that read slots, positions, request
// indices and block tables (device pointers on the CUDA paths; the kernels skip bad tokens).
void validate(const WindowWriterParams& p, bool host_data = true);
void validate(const StateWriterParams& p, bool host_data = true);
void validate(const CompressorParams& p, bool host_data = true);
void validate(const IndexerCompressorParams& p, bool host_data = true);
void validate(const GatherParams& p);
void validate(const DecodeParams& p);
void validate(const DenseToRaggedParams& p);
void validate(const WindowListParams& p);
void validate(const TopkListParams& p);
void validate(const CompressedAllListParams& p);
void validate(const IndexerParams& p);  // src/core/validate_indexer.cpp (CONTRACT 11.4)

// Host-data checks of the list builders (request_index in range, positions >= 0 for valid rows),
// which read the row inputs: the CPU backend runs them before writing anything.
void validate_rows(const DenseToRaggedParams& p);
void validate_rows(const WindowListParams& p);
void validate_rows(const TopkListParams& p);
void validate_rows(const CompressedAllListParams& p);

// Decode (src/core/validate_decode.cpp). validate(DecodeParams) checks shapes, pointers and
// strides under the name "sparse_decode"; validate_decode does the same under another name, and
// without out/lse when check_outputs is false (the reference writes its own arrays).
// validate_decode_host_data reads the host lists and positions (indptr[0] >= 0,
// non-decreasing, indptr[T] <= capacity; positions in [0, rope.rows)): the CPU path and the
// reference run it before reading anything else.
void validate_decode(const char* op, const DecodeParams& p, bool check_outputs = true);
void validate_decode_host_data(const char* op, const DecodeParams& p);
// The standalone inverse RoPE; host_data: also checks every position against the table.
void validate_inverse_rope(const bf16_bits* x, int64_t num_tokens, int32_t num_heads,
                           int64_t stride_token, int64_t stride_head, const int64_t* positions,
                           const RopeTable& rope, bool host_data);

}  // namespace sparsemla::core
