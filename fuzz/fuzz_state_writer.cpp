// Fuzz target: the compressor state writer (CONTRACT 3.2) with garbage slots, positions and
// strides, arbitrary floats (NaN, +-inf) and an optional position bias. Properties checked:
//   - rejected exactly when a stride or the state geometry is invalid, or a token with
//     state_slot >= 0 has state_slot >= capacity or a negative position; then nothing is written;
//   - elements outside the rows of slots >= 0 (other rows, row padding, block padding) are
//     untouched;
//   - a row written by exactly one token holds [kv (W) | score + ape[pos % r] (W)] bit for bit.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/writer.h"

namespace sparsemla::fuzz {

namespace {

struct StateShape {
  int32_t ratio = 4;
  int32_t head_dim = 128;
  int64_t width() const { return (ratio == 4 ? 2 : 1) * int64_t{head_dim}; }
};

// The layer kinds the writer serves, and now and then a ratio / head_dim it must reject: `call`
// goes to the writer, `buffers` sizes the arrays (a sane shape when `call` is invalid).
struct ShapeChoice {
  StateShape call, buffers;
};
ShapeChoice make_shape(Input& in, bool& must_reject) {
  static constexpr StateShape kLayers[] = {{4, 128}, {4, 512}, {128, 512}};
  const int64_t pick = in.range(0, 3);
  if (pick < 3) return {kLayers[pick], kLayers[pick]};
  StateShape call{in.int32_like(1, 200), in.flag() ? 128 : 512};
  if (in.flag()) call.head_dim = in.int32_like(0, 600);
  const bool valid_ratio = call.ratio == 4 || call.ratio == 128;
  const bool valid_head = call.head_dim == 512 || call.head_dim == 128;
  if (!valid_ratio || !valid_head || (call.head_dim == 128 && call.ratio != 4)) must_reject = true;
  return {call, valid_ratio && valid_head ? call : StateShape{4, 128}};
}

float value(Input& in, Bulk& bulk, bool specials) {
  return specials && in.one_in(8) ? in.f32_like() : static_cast<float>(bulk.unit() * 8.0);
}

}  // namespace

int run_state_writer(const uint8_t* data, size_t size) {
  Input in(data, size);
  bool must_reject = false;
  const ShapeChoice choice = make_shape(in, must_reject);
  const StateShape shape = choice.buffers;
  const int64_t W = shape.width();
  const int64_t N = in.range(0, 5);
  int64_t kv_stride = W + in.range(0, 3), score_stride = W + in.range(0, 3);
  const int32_t bs = static_cast<int32_t>(in.range(1, 4));
  const int64_t nb = in.range(1, 3);
  int64_t row_stride = 2 * W + in.range(0, 4);
  int64_t block_stride = bs * row_stride + in.range(0, 8);
  if (in.one_in(12)) {  // one broken stride
    switch (in.range(0, 3)) {
      case 0:
        kv_stride = W - in.range(1, W);
        break;
      case 1:
        score_stride = W - in.range(1, W);
        break;
      case 2:
        row_stride = 2 * W - in.range(1, 2 * W);
        break;
      default:
        block_stride = bs * row_stride - in.range(1, row_stride);
        break;
    }
    must_reject = true;
  }
  Bulk bulk(in.bytes(8));
  const bool specials = in.flag();
  const size_t kv_elems = static_cast<size_t>(N > 0 ? (N - 1) * kv_stride + W : 0);
  const size_t score_elems = static_cast<size_t>(N > 0 ? (N - 1) * score_stride + W : 0);
  std::vector<float> kv(kv_elems), score(score_elems);
  for (auto& v : kv) v = value(in, bulk, specials);
  for (auto& v : score) v = value(in, bulk, specials);
  const bool with_ape = in.flag();
  std::vector<float> ape(static_cast<size_t>(with_ape ? shape.ratio * W : 0));
  for (auto& v : ape) v = value(in, bulk, specials);

  const int64_t capacity = nb * bs;
  std::vector<int64_t> positions(static_cast<size_t>(N)), slots(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    slots[i] = in.int64_like(-1, capacity - 1);
    positions[i] = in.int64_like(0, 1000);
    if (slots[i] >= 0 && (slots[i] >= capacity || positions[i] < 0)) must_reject = true;
  }
  // The state sized for its geometry (a broken stride still gets a buffer it cannot overrun:
  // the call must reject it first).
  const int64_t safe_block = std::max<int64_t>(block_stride, bs * std::max(row_stride, 2 * W));
  std::vector<float> state(static_cast<size_t>(nb * safe_block));
  for (auto& v : state) v = static_cast<float>(bulk.unit());
  const std::vector<float> before = state;

  StateWriterParams p;
  p.num_tokens = N;
  p.ratio = choice.call.ratio;
  p.head_dim = choice.call.head_dim;
  p.kv = kv.empty() ? nullptr : kv.data();
  p.kv_stride = kv_stride;
  p.score = score.empty() ? nullptr : score.data();
  p.score_stride = score_stride;
  p.ape = with_ape ? ape.data() : nullptr;
  p.positions = N > 0 ? positions.data() : nullptr;
  p.state_slots = N > 0 ? slots.data() : nullptr;
  p.state = {state.data(), nb, bs, block_stride, row_stride};
  p.path = Path::Cpu;
  std::string why;
  const bool ok = accepted([&] { write_compressor_state(p); }, &why);
  expect_verdict(ok, must_reject, why, "write_compressor_state");
  if (!ok) {
    SPARSEMLA_FUZZ_CHECK(same_bits(state, before), "rejected write_compressor_state wrote");
    return 0;
  }
  std::map<int64_t, int> writers;  // slot -> tokens writing it
  for (int64_t i = 0; i < N; ++i)
    if (slots[i] >= 0) ++writers[slots[i]];
  const auto row_of = [&](int64_t slot) {
    return (slot / bs) * block_stride + (slot % bs) * row_stride;
  };
  std::vector<uint8_t> writable(state.size(), 0);
  for (const auto& [slot, count] : writers) {
    for (int64_t e = 0; e < 2 * W; ++e) writable[static_cast<size_t>(row_of(slot) + e)] = 1;
  }
  for (size_t e = 0; e < state.size(); ++e) {
    SPARSEMLA_FUZZ_CHECK(
        writable[e] || bits_of(state[e]) == bits_of(before[e]),
        "state element " + std::to_string(e) + " outside the written rows changed");
  }
  for (int64_t i = 0; i < N; ++i) {
    if (slots[i] < 0 || writers[slots[i]] != 1) continue;
    const float* row = state.data() + row_of(slots[i]);
    const float* bias = with_ape ? ape.data() + (positions[i] % shape.ratio) * W : nullptr;
    for (int64_t j = 0; j < W; ++j) {
      const float given = score[i * score_stride + j];
      const float want_score = bias != nullptr ? given + bias[j] : given;
      const bool same_kv = bits_of(row[j]) == bits_of(kv[i * kv_stride + j]);
      const bool same_score = bits_of(row[W + j]) == bits_of(want_score) ||
                              (std::isnan(row[W + j]) && std::isnan(want_score));
      SPARSEMLA_FUZZ_CHECK(same_kv, "kv element " + std::to_string(j) + " not copied exactly");
      SPARSEMLA_FUZZ_CHECK(same_score, "score element " + std::to_string(j) + " != score + ape");
    }
  }
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_state_writer)
