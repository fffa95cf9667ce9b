// fuzz/fuzz_compressor_common.h: the inputs both compressor targets share (fuzz_compress,
// fuzz_compress_indexer): a paged state cache with a block table, tokens with garbage positions,
// slots and request rows, and the oracle's verdict on them (CONTRACT 3.2). The properties the
// targets then check, on both the single-pass and the two-stage (scratch) form:
//   - rejected exactly when the verdict says so, and then neither cache nor state changed;
//   - the state is only read; cache bytes outside the rows of the storing tokens are untouched;
//   - the two forms write byte-identical caches;
//   - in sanitising mode no stored e4m3 byte is NaN (0x7F/0xFF).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "sparsemla/writer.h"

namespace sparsemla::fuzz {

// One compressor call's host arrays; the spans below point into them.
struct CompressorCase {
  int32_t ratio = 4;
  int32_t head_dim = 512;
  int64_t num_tokens = 0;
  int64_t num_requests = 0;
  std::vector<int64_t> positions, state_slots, out_slots;
  std::vector<int32_t> request_index, block_table;
  int64_t table_stride = 0;
  int32_t table_width = 0;
  std::vector<float> state;
  StateCacheView state_view;
  std::vector<float> norm_weight, rope_table;
  RopeTable rope;
  float norm_eps = 1e-6f;
  bool sanitise = true;
  bool must_reject = false;

  bool overlap() const { return ratio == 4; }
  int64_t state_width() const { return (overlap() ? 2 : 1) * int64_t{head_dim}; }
  // Whether token i completes and stores an entry (the verdict assumed it valid).
  bool stores(int64_t i) const {
    return state_slots[i] >= 0 && positions[i] % ratio == ratio - 1 && out_slots[i] >= 0;
  }
};

// The verdict on one storing token: its request row, rope row and every state row it pools.
inline bool window_is_valid(const CompressorCase& c, int64_t i) {
  const int64_t pos = c.positions[i];
  const int32_t req = c.request_index[i];
  if (req < 0 || req >= c.num_requests) return false;
  if ((pos / c.ratio) * c.ratio >= c.rope.rows) return false;
  const int64_t first = pos - (c.overlap() ? 2 : 1) * int64_t{c.ratio} + 1;
  for (int64_t q = std::max<int64_t>(first, 0); q <= pos; ++q) {
    const int64_t col = q / c.state_view.block_size;
    if (col >= c.table_width) return false;
    const int32_t block = c.block_table[req * c.table_stride + col];
    if (block < 0 || block >= c.state_view.num_blocks) return false;
  }
  return true;
}

// Tokens, tables and state for `ratio` / `head_dim`; `capacity`: the output cache's slots.
inline CompressorCase make_compressor_case(Input& in, Bulk& bulk, int32_t ratio, int32_t head_dim,
                                           int64_t capacity) {
  CompressorCase c;
  c.ratio = ratio;
  c.head_dim = head_dim;
  c.num_tokens = in.range(0, 4);
  c.num_requests = in.range(1, 2);
  const int32_t state_bs =
      ratio == 4 ? static_cast<int32_t>(in.range(1, 8)) : (in.flag() ? 128 : 256);
  const int64_t max_pos = 3 * int64_t{ratio} - 1;
  c.table_width = static_cast<int32_t>(max_pos / state_bs + 1 - (in.one_in(8) ? 1 : 0));
  c.table_stride = c.table_width + in.range(0, 2);
  const int64_t state_blocks = in.range(1, c.table_width + 1);
  c.block_table.resize(static_cast<size_t>(c.num_requests * c.table_stride));
  for (auto& b : c.block_table) b = in.int32_like(0, state_blocks - 1);
  const int64_t row_stride = 2 * c.state_width() + in.range(0, 2);
  c.state.resize(static_cast<size_t>(state_blocks * state_bs * row_stride));
  const double magnitude = in.one_in(16) ? 1e30 : 2.0;  // sometimes near fp32 overflow
  for (auto& v : c.state) v = static_cast<float>(bulk.unit() * magnitude);
  if (in.one_in(8) && !c.state.empty()) c.state[bulk.next() % c.state.size()] = in.f32_like();
  c.state_view = {c.state.data(), state_blocks, state_bs, state_bs * row_stride, row_stride};
  c.norm_weight.resize(static_cast<size_t>(head_dim));
  const bool odd_weights = in.one_in(16);  // a few NaN, inf, zero or huge norm weights
  for (auto& w : c.norm_weight) {
    w = odd_weights && bulk.next() % 8 == 0 ? in.f32_like()
                                            : 1.0f + 0.1f * static_cast<float>(bulk.unit());
  }
  const int64_t rope_rows = in.one_in(8) ? in.range(1, max_pos) : max_pos + 1;
  c.rope_table.resize(static_cast<size_t>(rope_rows * 64));
  for (auto& v : c.rope_table) v = static_cast<float>(bulk.unit());
  c.rope = {c.rope_table.data(), rope_rows, 64};
  c.sanitise = in.flag();
  if (in.one_in(16)) {
    c.norm_eps = in.flag() ? -1.0f : std::numeric_limits<float>::quiet_NaN();
    c.must_reject = true;
  }
  const int64_t state_capacity = state_blocks * state_bs;
  for (int64_t i = 0; i < c.num_tokens; ++i) {
    c.positions.push_back(in.int64_like(0, max_pos));
    c.state_slots.push_back(in.int64_like(-1, state_capacity - 1));
    c.out_slots.push_back(in.int64_like(-1, capacity - 1));
    c.request_index.push_back(in.int32_like(0, c.num_requests - 1));
    const int64_t ss = c.state_slots.back(), pos = c.positions.back();
    if (ss < 0) continue;
    if (ss >= state_capacity || pos < 0) {
      c.must_reject = true;
      continue;
    }
    if (!c.stores(i)) continue;
    if (c.out_slots.back() >= capacity || !window_is_valid(c, i)) c.must_reject = true;
  }
  return c;
}

// The common fields of either params struct, pointing into `c`.
template <typename Params>
void fill_compressor_params(Params& p, const CompressorCase& c) {
  const bool any = c.num_tokens > 0;
  p.num_tokens = c.num_tokens;
  p.positions = any ? c.positions.data() : nullptr;
  p.request_index = any ? c.request_index.data() : nullptr;
  p.state_slots = any ? c.state_slots.data() : nullptr;
  p.out_slots = any ? c.out_slots.data() : nullptr;
  p.state_block_table = any ? c.block_table.data() : nullptr;
  p.state_table_stride = c.table_stride;
  p.state_table_width = c.table_width;
  p.num_requests = c.num_requests;
  p.state = c.state_view;
  p.norm_weight = c.norm_weight.data();
  p.norm_eps = c.norm_eps;
  p.rope = c.rope;
  p.sanitise = c.sanitise;
  p.path = Path::Cpu;
}

// Marks the bytes a storing token's row may change: `rows` (offset, length) per stored slot.
inline void mark(std::vector<uint8_t>& writable, int64_t offset, int64_t length) {
  std::fill_n(writable.begin() + offset, length, uint8_t{1});
}

// Runs `call(scratch)` with a null scratch and with a scratch of [N, head_dim] on copies of the
// cache; checks the verdict, the untouched state and bytes, the equal forms. `writable(cache)`:
// the bytes the storing tokens may change. Returns the single-pass cache (empty when rejected).
template <typename Call, typename Writable>
std::vector<uint8_t> run_both_forms(const CompressorCase& c, const std::vector<uint8_t>& cache0,
                                    const char* op, Call&& call, Writable&& writable) {
  std::vector<uint8_t> single = cache0, staged = cache0;
  std::vector<float> scratch(static_cast<size_t>(std::max<int64_t>(1, c.num_tokens) * c.head_dim));
  const std::vector<float> state_before = c.state;
  std::string why;
  const bool ok = accepted([&] { call(single.data(), nullptr); }, &why);
  expect_verdict(ok, c.must_reject, why, op);
  SPARSEMLA_FUZZ_CHECK(same_bits(c.state, state_before), std::string(op) + " wrote its state");
  if (!ok) {
    SPARSEMLA_FUZZ_CHECK(single == cache0, std::string("a rejected ") + op + " wrote the cache");
    return {};
  }
  call(staged.data(), scratch.data());
  SPARSEMLA_FUZZ_CHECK(single == staged, std::string(op) + ": two-stage form differs");
  const std::vector<uint8_t> may_change = writable();
  for (size_t b = 0; b < single.size(); ++b) {
    SPARSEMLA_FUZZ_CHECK(
        may_change[b] || single[b] == cache0[b],
        std::string(op) + ": byte " + std::to_string(b) + " outside the rows changed");
  }
  return single;
}

}  // namespace sparsemla::fuzz
