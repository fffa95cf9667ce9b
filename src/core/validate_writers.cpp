// Argument validation of the cache writers (CONTRACT 3). Everything a writer will read or write is
// checked here, before anything is written, so a rejected call leaves no partial results.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/validate.h"
#include "sparsemla/error.h"

namespace sparsemla::core {

namespace {

std::string at(const char* name, int64_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}
std::string num(int64_t v) {
  return std::to_string(v);
}

// A destination slot of token i: negative skips, otherwise below the cache's capacity.
void check_slot(const char* op, const char* name, int64_t i, int64_t slot, int64_t capacity) {
  SPARSEMLA_CHECK_ARG(slot < capacity, op, at(name, i),
                      "< num_blocks*block_size = " + num(capacity) + " (or < 0 to skip the token)",
                      slot);
}

// A RoPE position (the token's own, or its window start) inside the table.
void check_rope_position(const char* op, int64_t i, int64_t pos, const RopeTable& rope,
                         const std::string& what) {
  SPARSEMLA_CHECK_ARG(pos >= 0 && pos < rope.rows, op, at("positions", i),
                      what + " in [0, rope.rows = " + num(rope.rows) + ")", pos);
}

int64_t state_width(int32_t ratio, int32_t head_dim) {
  return (ratio == 4 ? 2 : 1) * int64_t{head_dim};  // W = coff * head_dim
}

void check_ratio(const char* op, int32_t ratio) {
  SPARSEMLA_CHECK_ARG(ratio == 4 || ratio == 128, op, "ratio", "4 or 128", ratio);
}

// The fields the KV compressor and the indexer compressor share.
template <typename Params>
void check_compressor_common(const char* op, const Params& p, int32_t ratio, int32_t head_dim) {
  check_nonneg(op, "num_tokens", p.num_tokens);
  check_nonneg(op, "num_requests", p.num_requests);
  SPARSEMLA_CHECK_ARG(p.state_table_width >= 0, op, "state_table_width", ">= 0",
                      p.state_table_width);
  SPARSEMLA_CHECK_ARG(p.state_table_stride >= p.state_table_width, op, "state_table_stride",
                      ">= state_table_width = " + num(p.state_table_width), p.state_table_stride);
  check_extent(op, "num_requests", p.num_requests, p.state_table_stride,
               "num_requests*state_table_stride (elements)");
  check_aligned(op, "positions", p.positions);
  check_aligned(op, "request_index", p.request_index);
  check_aligned(op, "state_slots", p.state_slots);
  check_aligned(op, "out_slots", p.out_slots);
  check_aligned(op, "state_block_table", p.state_block_table);
  check_aligned(op, "norm_weight", p.norm_weight);
  check_aligned(op, "scratch", p.scratch);
  check_extent(op, "num_tokens", p.num_tokens, head_dim, "num_tokens*head_dim (scratch elements)");
  if (p.num_tokens > 0) {
    SPARSEMLA_CHECK_PTR(p.positions, op, "positions");
    SPARSEMLA_CHECK_PTR(p.request_index, op, "request_index");
    SPARSEMLA_CHECK_PTR(p.state_slots, op, "state_slots");
    SPARSEMLA_CHECK_PTR(p.out_slots, op, "out_slots");
    SPARSEMLA_CHECK_PTR(p.state_block_table, op, "state_block_table");
  }
  check_state(op, "state", p.state, 2 * state_width(ratio, head_dim));
  SPARSEMLA_CHECK_PTR(p.norm_weight, op, "norm_weight");
  SPARSEMLA_CHECK_ARG(std::isfinite(p.norm_eps) && p.norm_eps >= 0.0f, op, "norm_eps",
                      "a finite value >= 0", p.norm_eps);
  check_rope(op, "rope", p.rope);
}

// The state rows an entry reads: positions pos-(1+overlap)*r+1 .. pos that are >= 0, each through
// state_block_table[req][q / state_bs], which must hold a block of the state cache.
template <typename Params>
void check_window_rows(const char* op, const Params& p, int64_t i, int32_t ratio) {
  const int64_t pos = p.positions[i];
  const int32_t req = p.request_index[i];
  const int64_t num_rows = (ratio == 4 ? 2 : 1) * int64_t{ratio};
  const int32_t bs = p.state.block_size;
  for (int64_t q = pos - num_rows + 1; q <= pos; ++q) {
    if (q < 0) continue;  // never read
    const int64_t col = q / bs;
    const std::string reader =
        " (token " + num(i) + " reads position " + num(q) + " of request " + num(req) + ")";
    SPARSEMLA_CHECK_ARG(col < p.state_table_width, op, "state_table_width",
                        "> " + num(col) + reader, p.state_table_width);
    const int32_t block = p.state_block_table[req * p.state_table_stride + col];
    SPARSEMLA_CHECK_ARG(
        block >= 0 && block < p.state.num_blocks, op,
        "state_block_table[" + num(req) + "][" + num(col) + "]",
        "a block id in [0, state.num_blocks = " + num(p.state.num_blocks) + ")" + reader, block);
  }
}

// Per-token checks of both compressors; `capacity` is the output cache's slot count.
template <typename Params>
void check_compressor_tokens(const char* op, const Params& p, int32_t ratio, int64_t capacity) {
  const int64_t state_capacity = p.state.num_blocks * int64_t{p.state.block_size};
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t state_slot = p.state_slots[i];
    if (state_slot < 0) continue;  // token skipped
    check_slot(op, "state_slots", i, state_slot, state_capacity);
    const int64_t pos = p.positions[i];
    SPARSEMLA_CHECK_ARG(pos >= 0, op, at("positions", i), ">= 0 for a token with a state slot",
                        pos);
    if (pos % ratio != ratio - 1 || p.out_slots[i] < 0) continue;  // stores nothing
    check_slot(op, "out_slots", i, p.out_slots[i], capacity);
    const int32_t req = p.request_index[i];
    SPARSEMLA_CHECK_ARG(req >= 0 && req < p.num_requests, op, at("request_index", i),
                        "in [0, num_requests = " + num(p.num_requests) + ")", req);
    check_rope_position(op, i, (pos / ratio) * ratio, p.rope,
                        "a window start (pos/r)*r = " + num((pos / ratio) * ratio));
    check_window_rows(op, p, i, ratio);
  }
}

}  // namespace

void validate(const WindowWriterParams& p, bool host_data) {
  constexpr const char* kOp = "write_window";
  check_nonneg(kOp, "num_tokens", p.num_tokens);
  SPARSEMLA_CHECK_ARG(p.kv_stride >= Fp8DsMla::kHeadDim, kOp, "kv_stride", ">= 512", p.kv_stride);
  check_extent(kOp, "num_tokens", p.num_tokens, p.kv_stride, "num_tokens*kv_stride (elements)");
  check_aligned(kOp, "kv", p.kv);
  check_aligned(kOp, "positions", p.positions);
  check_aligned(kOp, "slots", p.slots);
  if (p.num_tokens > 0) {
    SPARSEMLA_CHECK_PTR(p.kv, kOp, "kv");
    SPARSEMLA_CHECK_PTR(p.positions, kOp, "positions");
    SPARSEMLA_CHECK_PTR(p.slots, kOp, "slots");
  }
  check_rope(kOp, "rope", p.rope);
  check_cache(kOp, "cache", p.cache.as_const());
  if (!host_data) return;
  const int64_t capacity = p.cache.num_blocks * int64_t{p.cache.block_size};
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    if (p.slots[i] < 0) continue;  // skipped: its position is never read
    check_slot(kOp, "slots", i, p.slots[i], capacity);
    check_rope_position(kOp, i, p.positions[i], p.rope, "a position");
  }
}

void validate(const StateWriterParams& p, bool host_data) {
  constexpr const char* kOp = "write_compressor_state";
  check_nonneg(kOp, "num_tokens", p.num_tokens);
  check_ratio(kOp, p.ratio);
  SPARSEMLA_CHECK_ARG(p.head_dim == 512 || p.head_dim == 128, kOp, "head_dim",
                      "512 (KV compressor) or 128 (indexer compressor)", p.head_dim);
  SPARSEMLA_CHECK_ARG(p.head_dim == 512 || p.ratio == 4, kOp, "ratio",
                      "4 for head_dim 128 (the indexer exists in ratio-4 layers only)", p.ratio);
  const int64_t width = state_width(p.ratio, p.head_dim);
  SPARSEMLA_CHECK_ARG(p.kv_stride >= width, kOp, "kv_stride", ">= W = " + num(width), p.kv_stride);
  SPARSEMLA_CHECK_ARG(p.score_stride >= width, kOp, "score_stride", ">= W = " + num(width),
                      p.score_stride);
  check_extent(kOp, "num_tokens", p.num_tokens, std::max(p.kv_stride, p.score_stride),
               "num_tokens*max(kv_stride, score_stride) (elements)");
  check_aligned(kOp, "kv", p.kv);
  check_aligned(kOp, "score", p.score);
  check_aligned(kOp, "ape", p.ape);
  check_aligned(kOp, "positions", p.positions);
  check_aligned(kOp, "state_slots", p.state_slots);
  if (p.num_tokens > 0) {
    SPARSEMLA_CHECK_PTR(p.kv, kOp, "kv");
    SPARSEMLA_CHECK_PTR(p.score, kOp, "score");
    SPARSEMLA_CHECK_PTR(p.positions, kOp, "positions");
    SPARSEMLA_CHECK_PTR(p.state_slots, kOp, "state_slots");
  }
  check_state(kOp, "state", p.state, 2 * width);
  if (!host_data) return;
  const int64_t capacity = p.state.num_blocks * int64_t{p.state.block_size};
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    if (p.state_slots[i] < 0) continue;
    check_slot(kOp, "state_slots", i, p.state_slots[i], capacity);
    SPARSEMLA_CHECK_ARG(p.positions[i] >= 0, kOp, at("positions", i),
                        ">= 0 for a token with a state slot", p.positions[i]);
  }
}

void validate(const CompressorParams& p, bool host_data) {
  constexpr const char* kOp = "compress";
  check_ratio(kOp, p.ratio);
  check_compressor_common(kOp, p, p.ratio, Fp8DsMla::kHeadDim);
  check_cache(kOp, "cache", p.cache.as_const());
  if (host_data) {
    check_compressor_tokens(kOp, p, p.ratio, p.cache.num_blocks * int64_t{p.cache.block_size});
  }
}

void validate(const IndexerCompressorParams& p, bool host_data) {
  constexpr const char* kOp = "compress_indexer";
  constexpr int32_t kRatio = 4;
  check_compressor_common(kOp, p, kRatio, IndexerFp8::kHeadDim);
  check_indexer_cache(kOp, "cache", p.cache);
  SPARSEMLA_CHECK_ARG(p.cache.layout == IndexerLayout::Normal, kOp, "cache.layout",
                      "Normal (the indexer compressor writes the NORMAL layout)",
                      static_cast<int>(p.cache.layout));
  if (host_data) {
    check_compressor_tokens(kOp, p, kRatio, p.cache.num_blocks * int64_t{p.cache.block_size});
  }
}

}  // namespace sparsemla::core
