// Fuzz target: the window writer (CONTRACT 3.1) with arbitrary bf16 latents (every bit pattern:
// NaN, +-inf, subnormals), arbitrary RoPE tables, garbage positions and slots, both sanitising
// modes. Properties checked on the written cache (CONTRACT 2.1, 2.3, 5):
//   - rejected exactly when a token with slot >= 0 has slot >= capacity or a position outside the
//     table, and then nothing is written;
//   - bytes outside the rows of slots >= 0 (other rows, scale pads of other rows, page padding)
//     are untouched;
//   - a written row holds no NaN byte (0x7F/0xFF) among its 448 e4m3 bytes, its pad byte is 0, and
//     each code is CODE_MAX (255 legacy, 254 sanitising) when its 64 inputs hold +-inf, else in
//     [105, 247]; in sanitising mode no stored RoPE value is NaN.
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/numerics.h"
#include "sparsemla/writer.h"

namespace sparsemla::fuzz {

namespace {

bf16_bits kv_value(Input& in, Bulk& bulk, int mode) {
  if (mode == 0) return float_to_bf16(static_cast<float>(bulk.unit() * 4.0));
  if (mode == 1) return static_cast<bf16_bits>(bulk.next());  // any bit pattern
  const uint8_t r = static_cast<uint8_t>(bulk.next() % 64);   // mostly sane, some specials
  if (r == 0) return 0x7F80;                                  // +inf
  if (r == 1) return 0xFF80;                                  // -inf
  if (r == 2) return 0x7FC0;                                  // NaN
  (void)in;
  return float_to_bf16(static_cast<float>(bulk.unit() * 100.0));
}

void check_row(const uint8_t* data, const uint8_t* codes, const bf16_bits* kv, bool sanitise,
               bool exact_codes, int64_t slot) {
  const std::string at = " (slot " + std::to_string(slot) + ")";
  for (int d = 0; d < 448; ++d) {
    SPARSEMLA_FUZZ_CHECK((data[d] & 0x7F) != 0x7F, "NaN e4m3 byte stored" + at);
  }
  SPARSEMLA_FUZZ_CHECK(codes[7] == 0, "scale pad byte not 0" + at);
  const int code_max = sanitise ? 254 : 255;
  for (int t = 0; t < 7; ++t) {
    SPARSEMLA_FUZZ_CHECK(codes[t] <= code_max, "code above CODE_MAX" + at);
    if (!exact_codes) continue;
    bool has_inf = false;
    for (int d = 64 * t; d < 64 * t + 64; ++d)
      has_inf = has_inf || std::isinf(bf16_to_float(kv[d]));
    if (has_inf) {
      SPARSEMLA_FUZZ_CHECK(codes[t] == code_max, "tile with inf not at CODE_MAX" + at);
    } else {
      SPARSEMLA_FUZZ_CHECK(codes[t] >= 105 && codes[t] <= 247,
                           "finite tile code out of 105..247" + at);
    }
  }
  if (!sanitise) return;
  for (int k = 0; k < 64; ++k) {
    const bf16_bits b = static_cast<bf16_bits>(data[448 + 2 * k] | data[449 + 2 * k] << 8);
    SPARSEMLA_FUZZ_CHECK(!std::isnan(bf16_to_float(b)), "sanitised RoPE value is NaN" + at);
  }
}

}  // namespace

int run_window_writer(const uint8_t* data, size_t size) {
  Input in(data, size);
  bool must_reject = false;
  const int64_t N = in.range(0, 6);
  const int32_t bs = static_cast<int32_t>(in.range(1, 20));
  const int64_t nb = in.range(1, 3);
  int64_t stride = int64_t{bs} * 584 + in.range(0, 24);
  int64_t kv_stride = 512 + in.range(0, 3);
  const int64_t rows = in.range(1, 12), row_stride = 64 + in.range(0, 2);
  Bulk bulk(in.bytes(8));
  const int kv_mode = static_cast<int>(in.range(0, 2));
  std::vector<bf16_bits> kv(static_cast<size_t>(N * kv_stride));
  for (auto& v : kv) v = kv_value(in, bulk, kv_mode);
  std::vector<float> table(static_cast<size_t>(rows * row_stride));
  const bool table_specials = in.one_in(4);
  for (auto& v : table) v = table_specials ? in.f32_like() : static_cast<float>(bulk.unit());
  const int64_t capacity = nb * bs;
  std::vector<int64_t> positions(static_cast<size_t>(N)), slots(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    slots[i] = in.int64_like(-1, capacity - 1);
    positions[i] = in.int64_like(0, rows - 1);
    if (slots[i] >= 0 && (slots[i] >= capacity || positions[i] < 0 || positions[i] >= rows)) {
      must_reject = true;
    }
  }
  if (in.one_in(16)) {
    if (in.flag()) {
      stride = int64_t{bs} * 584 - in.range(1, 100);
    } else {
      kv_stride = 512 - in.range(1, 512);
    }
    must_reject = true;
  }
  std::vector<uint8_t> cache(static_cast<size_t>(nb * (int64_t{bs} * 584 + 24)));
  bulk.fill(cache);
  const std::vector<uint8_t> before = cache;

  WindowWriterParams p;
  p.num_tokens = N;
  p.kv = kv.empty() ? nullptr : kv.data();
  p.kv_stride = kv_stride;
  p.positions = positions.data();
  p.slots = slots.data();
  p.rope = {table.data(), rows, row_stride};
  p.cache = {cache.data(), nb, bs, stride};
  p.sanitise = in.flag();
  p.path = Path::Cpu;
  if (N == 0) p.kv = nullptr, p.positions = nullptr, p.slots = nullptr;
  std::string why;
  const bool ok = accepted([&] { write_window(p); }, &why);
  expect_verdict(ok, must_reject, why, "write_window");
  if (!ok) {
    SPARSEMLA_FUZZ_CHECK(cache == before, "rejected write_window wrote the cache");
    return 0;
  }
  // Which bytes may change: the data and scale rows of every slot written.
  std::vector<uint8_t> writable(cache.size(), 0);
  std::multiset<int64_t> written;
  for (int64_t i = 0; i < N; ++i) {
    if (slots[i] < 0) continue;
    written.insert(slots[i]);
    const int64_t page = (slots[i] / bs) * stride, row = slots[i] % bs;
    for (int64_t b = 0; b < 576; ++b) writable[page + row * 576 + b] = 1;
    for (int64_t b = 0; b < 8; ++b) writable[page + int64_t{bs} * 576 + row * 8 + b] = 1;
  }
  for (size_t b = 0; b < cache.size(); ++b) {
    SPARSEMLA_FUZZ_CHECK(writable[b] || cache[b] == before[b],
                         "byte " + std::to_string(b) + " outside the written rows changed");
  }
  for (int64_t i = 0; i < N; ++i) {
    if (slots[i] < 0) continue;
    const int64_t page = (slots[i] / bs) * stride, row = slots[i] % bs;
    check_row(cache.data() + page + row * 576, cache.data() + page + int64_t{bs} * 576 + row * 8,
              kv.data() + i * kv_stride, p.sanitise, written.count(slots[i]) == 1, slots[i]);
  }
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_window_writer)
