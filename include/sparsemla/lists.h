// sparsemla/lists.h: ragged index lists and their builders (SPEC 4.6).
//
// A list is indices int32 [cap] + indptr int32 [T + 1]; row t is indices[indptr[t] : indptr[t+1]],
// global slot ids (-1 or any out-of-range value: invalid). Builders write indptr[0..R] for all R rows
// and indices of capacity R*W, row r at r*W (so the planner width of their output is W). Padding rows
// (valid flag 0) get length 0. Graph buffers: the caller keeps indices [max_rows*W] and
// indptr [max_rows+1] at stable addresses; builders rewrite every row up to `num_rows` each step.
#pragma once

#include <cstdint>

#include "sparsemla/backend.h"

namespace sparsemla {

// A ragged list as the decoder reads it.
struct RaggedList {
  const int32_t* indices = nullptr;  // [capacity]
  const int32_t* indptr = nullptr;   // [T + 1], non-decreasing, indptr[T] <= capacity
  int64_t capacity = 0;              // elements of indices
  int64_t width = 0;                 // dense row width W for the planner; 0: capacity / T
};

// Builder output (graph buffer): indices [num_rows * width], indptr [num_rows + 1].
struct RaggedOut {
  int32_t* indices = nullptr;
  int32_t* indptr = nullptr;
  int64_t width = 0;  // W
};

// Common inputs.
struct BuildCommon {
  int64_t num_rows = 0;                 // R (rows written, including padding rows)
  const uint8_t* row_valid = nullptr;   // [R] 0: padding row (length 0); null: all valid
  Path path = Path::Auto;
  void* stream = nullptr;
};

// Dense [R, W] (row stride dense_stride) + lengths [R] -> ragged. Lengths clamped to [0, W]; the
// first len entries kept; with num_slots > 0, kept values outside [0, num_slots) become -1.
struct DenseToRaggedParams {
  BuildCommon common;
  const int32_t* dense = nullptr;
  int64_t dense_stride = 0;
  const int32_t* lengths = nullptr;  // [R]
  int64_t num_slots = 0;             // N (0: no range check)
  RaggedOut out;                     // out.width = W
};
void build_ragged_from_dense(const DenseToRaggedParams& p);

// Window lists: start = max(pos-127, 0), len = min(pos+1, 128); entry j -> slot of position start+j
// through the window block table, -1 where the page index is beyond the table row.
struct WindowListParams {
  BuildCommon common;
  const int64_t* positions = nullptr;        // [R] query position of each row
  const int32_t* request_index = nullptr;    // [R] row of the block table (null: row r)
  const int32_t* block_table = nullptr;      // [num_requests, table_width]
  int64_t block_table_stride = 0;
  int32_t table_width = 0;
  int64_t num_requests = 0;
  int32_t block_size = 0;                    // wbs
  int32_t window = 128;
  RaggedOut out;                             // out.width = window
};
void build_window_lists(const WindowListParams& p);

// Ratio-4 lists from the indexer's local top-k [R, W] (row stride topk_stride): len = number of
// entries in [0, table_width*bs) -- counted over the row; the first len entries kept, local i ->
// cbt[r][i / bs]*bs + i % bs; an entry of that prefix negative or >= table_width*bs becomes -1.
// With topk_length (per row, clamped to [0, W]) given, only the first topk_length entries count.
struct TopkListParams {
  BuildCommon common;
  const int32_t* topk = nullptr;             // [R, W] local compressed indices
  int64_t topk_stride = 0;
  const int32_t* topk_length = nullptr;      // [R] or null
  const int32_t* request_index = nullptr;    // [R] (null: row r)
  const int32_t* block_table = nullptr;      // cbt [num_requests, table_width]
  int64_t block_table_stride = 0;
  int32_t table_width = 0;
  int64_t num_requests = 0;
  int32_t block_size = 0;                    // cbs
  RaggedOut out;                             // out.width = W
};
void build_topk_lists(const TopkListParams& p);

// Ratio-128 lists: n = min((pos+1)/128, max_compressed), entries i = 0..n-1 mapped as for ratio 4.
struct CompressedAllListParams {
  BuildCommon common;
  const int64_t* positions = nullptr;
  const int32_t* request_index = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int32_t table_width = 0;
  int64_t num_requests = 0;
  int32_t block_size = 0;
  int32_t ratio = 128;
  int64_t max_compressed = 0;                // W = roundup(ceil(max_model_len / 128), 128)
  RaggedOut out;                             // out.width = max_compressed
};
void build_compressed_all_lists(const CompressedAllListParams& p);

// max_compressed for a model length: roundup(ceil(max_model_len / ratio), 128).
int64_t max_compressed_entries(int64_t max_model_len, int32_t ratio);

}  // namespace sparsemla
