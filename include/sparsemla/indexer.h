// sparsemla/indexer.h: the lightning-indexer decode of CONTRACT 11: per query row, the scores of
// every compressed entry written so far (11.2) and the best k of them by the exact rule of 11.3,
// written as the dense local top-k list the ratio-4 builder of CONTRACT 4.6 reads.
//
// One call scores and selects (the fused form of 11.5): no [T, N] logits buffer. Backends: the CPU
// (host pointers; OpenMP over requests and candidate ranges, keys read once per request for all
// its rows) and the generic CUDA path (device pointers, Path::Auto or Path::CudaGeneric; sm_80+;
// scores, selections and orders bit-identical to the CPU's), and asked for by name Path::CudaSm90,
// the Hopper FP8 path (cc 9.0, H <= 128, 16-byte aligned cache base and block stride; scores
// within CONTRACT 11.7's 2^-9 bound, exact on exact-arithmetic data; otherwise an error naming
// `path`). Workspace: indexer_workspace_size(...)
// bytes (0 on the CPU; on the GPU a function of T, Wt, ibs, k and the SM count, never of device
// values); graph rules of 11.5 (docs/INDEXER.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "sparsemla/backend.h"
#include "sparsemla/format.h"
#include "sparsemla/lists.h"

namespace sparsemla {

// Order of the selected indices within a row (CONTRACT 11.3).
enum class TopkOrder : int32_t {
  ByIndex = 0,  // ascending local index (default: what a threshold-and-compact selection gives)
  ByScore = 1,  // rank order: descending key, then ascending index
};

inline constexpr int32_t kIndexerHeadDim = 128;   // q and key dims (CONTRACT 2.2, 11.1)
inline constexpr int32_t kIndexerMaxTopk = 2048;  // k in 1..2048 (CONTRACT 11.4)

// The optional fused ratio-4 list of CONTRACT 11.1: the ragged global list (CONTRACT 4.6) that
// build_topk_lists makes from the call's dense top-k, written by the same call (on its path and
// stream, after the selection). Row t is request row_request[t] of the compressed block table
// below (usually the indexer's own table: vLLM places both caches in the same blocks). The
// builder's precondition holds: a row with row_valid != 0 names a request in [0, R). Shapes and
// pointers of both parts are checked before anything is written; on the CPU a valid row naming
// no request fails after the dense output was written, before the list is.
struct IndexerFusedList {
  RaggedOut out;                         // indices [T * out.width], indptr [T + 1]; null: not fused
  const uint8_t* row_valid = nullptr;    // [T] 0: padding row (length 0); null: every row valid
  const int32_t* block_table = nullptr;  // cbt [R, table_width]
  int64_t block_table_stride = 0;        // elements (>= table_width)
  int32_t table_width = 0;
  int32_t block_size = 0;  // cbs
};

struct IndexerParams {
  int64_t num_tokens = 0;  // T: query rows
  int32_t num_heads = 0;   // H: 1..128 (DSV4: 64)
  // q: e4m3 [T, H, 128], last dim contiguous; strides in bytes (0: contiguous).
  const uint8_t* q = nullptr;
  int64_t q_stride_token = 0;  // 0: H * 128
  int64_t q_stride_head = 0;   // 0: 128
  // w: fp32 [T, H], heads contiguous; every scale folded in (CONTRACT 11.1). Row stride in
  // elements (0: H).
  const float* w = nullptr;
  int64_t w_stride_token = 0;
  // Keys: the indexer cache (CONTRACT 2.2; NORMAL or SHUFFLE), read only.
  IndexerCacheView cache;
  // ibt: int32 [R, Wt] page ids of each request's entries (entry j: row j % ibs of page
  // ibt[r][j / ibs]); row stride in elements (>= Wt).
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int32_t block_table_width = 0;            // Wt
  int64_t num_requests = 0;                 // R
  const int32_t* row_request = nullptr;     // [T] request of each row; outside [0, R): padding
  const int32_t* num_candidates = nullptr;  // [T] n_t (< 0: 0; clamped to Wt * ibs)
  int32_t topk = 0;                         // k: 1..2048
  // Outputs. indices: int32 [T, W] (W >= k): len_t local indices, then -1 up to W.
  int32_t* indices = nullptr;
  int64_t indices_stride = 0;  // elements (0: W)
  int32_t width = 0;           // W
  int32_t* lengths = nullptr;  // optional [T]: len_t
  float* scores = nullptr;     // optional [T, W]: score of each selected entry, -inf in the padding
  int64_t scores_stride = 0;   // elements (0: W)
  TopkOrder order = TopkOrder::ByIndex;
  IndexerFusedList fused;  // optional (fused.out.indices null: only the dense output)
  Path path = Path::Auto;
  void* stream = nullptr;
};

// Scores and selects (CONTRACT 11.2, 11.3). Throws sparsemla::Error for invalid shapes, strides
// or pointers (11.4); device values (row_request, num_candidates, page ids) never fail a call.
void indexer_topk(const IndexerParams& p, void* workspace = nullptr, size_t workspace_bytes = 0);

// Workspace bytes of indexer_topk for these shapes (0 on the CPU).
size_t indexer_workspace_size(const IndexerParams& p);

// n_t = floor((pos_t + 1) / 4) from each row's position (CONTRACT 11.1); 0 where pos_t < 0
// (padding rows). Host arrays.
void indexer_candidates_from_positions(const int64_t* positions, int64_t num_tokens,
                                       int32_t* num_candidates);

}  // namespace sparsemla
