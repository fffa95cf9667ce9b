// sparsemla/lists.h: ragged index lists and their builders (CONTRACT 4.6).
//
// A list is indices int32 [cap] + indptr int32 [T + 1]; row t is indices[indptr[t] : indptr[t+1]],
// global slot ids (-1 or any out-of-range value: invalid). Builders write indptr[0..R] for all R
// rows and indices of capacity R*W (so the planner width of their output is W). Rows are packed one
// after the other as the indptr format requires: indptr[0] = 0, indptr[r+1] = indptr[r] + len(r) <=
// (r+1)*W, so row r lies inside [0, (r+1)*W); indices[indptr[R], R*W) are left untouched (never
// read). Padding rows (valid flag 0) get length 0; the builder reads none of their inputs. Graph
// buffers: the caller keeps indices [max_rows*W] and indptr [max_rows+1] at stable addresses;
// builders rewrite every row up to `num_rows` each step (pass num_rows = the captured row count and
// row_valid 0 for rows beyond the live batch).
// Slots are computed in 64 bits as block * bs + offset; a result outside int32 becomes -1.
// Host-data preconditions (request_index in range, positions >= 0 for valid rows) are checked by
// the CPU backend before anything is written.
#pragma once

#include <cstdint>

#include "sparsemla/backend.h"

namespace sparsemla {

// An index list as the decoder reads it (CONTRACT 4.6), in one of two forms:
//  - ragged (indptr set): row t = indices[indptr[t], indptr[t+1]);
//  - dense (indptr null; FlashMLA's [T, W] form, read directly, no conversion): row t = the first
//    len(t) entries of indices[t * dense_stride, + width), len(t) = lengths[t / rows_per_length]
//    clamped to [0, width], or width when lengths is null.
// In either form entries outside the cache's slots (-1 padding included) are skipped, so a dense
// list gives the same results as the ragged list build_ragged_from_dense makes from it.
struct IndexList {
  const int32_t* indices = nullptr;  // ragged [capacity]; dense [T, dense_stride]
  const int32_t* indptr =
      nullptr;               // ragged [T + 1], non-decreasing, indptr[T] <= capacity; null: dense
  int64_t capacity = 0;      // elements of indices (dense: >= (T-1) * dense_stride + width)
  int64_t width = 0;         // W: the planner's row width (ragged 0: capacity / T; dense >= 1)
  int64_t dense_stride = 0;  // dense: elements between rows (0: width)
  const int32_t* lengths = nullptr;  // dense: [ceil(T / rows_per_length)], or null (rows W long)
  int32_t rows_per_length = 1;       // dense: s_q when lengths are per request (topk_length [b])

  bool dense() const { return indptr == nullptr; }
};

// Builder output (graph buffer): indices [num_rows * width], indptr [num_rows + 1].
struct RaggedOut {
  int32_t* indices = nullptr;
  int32_t* indptr = nullptr;
  int64_t width = 0;  // W
};

// Common inputs.
struct BuildCommon {
  int64_t num_rows = 0;                // R (rows written, including padding rows)
  const uint8_t* row_valid = nullptr;  // [R] 0: padding row (length 0); null: all valid
  Path path = Path::Auto;
  void* stream = nullptr;
};

// Dense [R, W] (row stride dense_stride) + lengths -> ragged. Lengths clamped to [0, W]; the
// first len entries kept; with num_slots > 0, kept values outside [0, num_slots) become -1.
// Lengths are per row, or per request (FlashMLA's topk_length [b]) when request_index is given:
// row r then uses lengths[request_index[r]] (broadcast to the s_q rows of that request).
struct DenseToRaggedParams {
  BuildCommon common;
  const int32_t* dense = nullptr;
  int64_t dense_stride = 0;
  const int32_t* lengths = nullptr;        // [R], or [num_requests] with request_index
  const int32_t* request_index = nullptr;  // [R] request of each row, or null (lengths per row)
  int64_t num_requests = 0;                // entries of lengths when request_index is given
  int64_t num_slots = 0;                   // N (0: no range check)
  RaggedOut out;                           // out.width = W
};
void build_ragged_from_dense(const DenseToRaggedParams& p);

// Window lists: start = max(pos-127, 0), len = min(pos+1, 128); entry j -> slot of position start+j
// through the window block table, -1 where the page index is beyond the table row.
struct WindowListParams {
  BuildCommon common;
  const int64_t* positions = nullptr;      // [R] query position of each row
  const int32_t* request_index = nullptr;  // [R] row of the block table (null: row r)
  const int32_t* block_table = nullptr;    // [num_requests, table_width]
  int64_t block_table_stride = 0;
  int32_t table_width = 0;
  int64_t num_requests = 0;
  int32_t block_size = 0;  // wbs
  int32_t window = 128;
  RaggedOut out;  // out.width = W >= window (normally equal)
};
void build_window_lists(const WindowListParams& p);

// Ratio-4 lists from the indexer's local top-k [R, W] (row stride topk_stride): len = number of
// entries in [0, table_width*bs) -- counted over the row; the first len entries kept, local i ->
// cbt[r][i / bs]*bs + i % bs; an entry of that prefix negative or >= table_width*bs becomes -1.
// With topk_length given, only the first topk_length entries (clamped to [0, W]) count; it is per
// request (FlashMLA's topk_length [b]) and broadcast to every row of that request through
// request_index (null request_index: row r is request r).
struct TopkListParams {
  BuildCommon common;
  const int32_t* topk = nullptr;  // [R, W] local compressed indices
  int64_t topk_stride = 0;
  const int32_t* topk_length = nullptr;    // [num_requests] or null
  const int32_t* request_index = nullptr;  // [R] (null: row r)
  const int32_t* block_table = nullptr;    // cbt [num_requests, table_width]
  int64_t block_table_stride = 0;
  int32_t table_width = 0;
  int64_t num_requests = 0;
  int32_t block_size = 0;  // cbs
  RaggedOut out;           // out.width = W
};
void build_topk_lists(const TopkListParams& p);

// Ratio-128 lists ("every compressed entry so far"): n = min((pos+1)/ratio, max_compressed),
// entries i = 0..n-1 mapped as for ratio 4 (-1 where i / bs is beyond the table row).
struct CompressedAllListParams {
  BuildCommon common;
  const int64_t* positions = nullptr;      // [R] query position of each row
  const int32_t* request_index = nullptr;  // [R] (null: row r)
  const int32_t* block_table = nullptr;    // cbt [num_requests, table_width]
  int64_t block_table_stride = 0;
  int32_t table_width = 0;
  int64_t num_requests = 0;
  int32_t block_size = 0;      // cbs
  int32_t ratio = 128;         // tokens per compressed entry
  int64_t max_compressed = 0;  // roundup(ceil(max_model_len / 128), 128), >= 1
  RaggedOut out;               // out.width = W >= max_compressed (normally equal)
};
void build_compressed_all_lists(const CompressedAllListParams& p);

// max_compressed for a model length: roundup(ceil(max_model_len / ratio), 128).
int64_t max_compressed_entries(int64_t max_model_len, int32_t ratio);

}  // namespace sparsemla
