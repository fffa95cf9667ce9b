// Fuzz target: the cache-row decoders dequantize_row (fp8_ds_mla, CONTRACT 2.1, scrub of
// CONTRACT 5) and dequantize_indexer_row (CONTRACT 2.2) on random page geometries, random or
// poisoned bytes and garbage slots. Oracle: the row decoded here from the bytes (e4m3 from its bit
// fields, UE8M0 by ldexp, code 255 = +inf), compared bit for bit; rejected exactly when the
// geometry or the slot is invalid; nothing outside the 512 (128) outputs written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/format.h"
#include "sparsemla/writer.h"

namespace sparsemla::fuzz {

namespace {

// e4m3fn from its fields: S.EEEE.MMM, bias 7, subnormals at E = 0, NaN only for E = 15, M = 7.
double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80) ? -mag : mag;
}

double ue8m0_value(uint8_t code) {
  return code == 255 ? std::numeric_limits<double>::infinity() : std::ldexp(1.0, code - 127);
}

// Page bytes: random, or rows with sane codes, or rows heavy in NaN bytes and extreme codes.
void fill_pages(Bulk& bulk, int mode, std::vector<uint8_t>& bytes) {
  bulk.fill(bytes);
  if (mode == 0) return;
  for (auto& b : bytes) {
    const uint64_t r = bulk.next() % 16;
    if (mode == 1 && (b & 0x7F) == 0x7F) b ^= 1;  // no NaN bytes
    if (mode == 2 && r < 3) b = r == 0 ? 0x7F : (r == 1 ? 0xFF : (r == 2 ? 0x00 : b));
    if (mode == 2 && r == 3) b = 255;
  }
}

// The decoded value of row `slot` dim d must have these bits (NaN: any NaN, or +0 when scrubbed).
void check_value(float got, double want, bool scrub, int d) {
  const std::string at = "dim " + std::to_string(d);
  if (std::isnan(want)) {
    if (scrub) {
      SPARSEMLA_FUZZ_CHECK(bits_of(got) == 0u, "scrubbed NaN is not +0 at " + at);
    } else {
      SPARSEMLA_FUZZ_CHECK(std::isnan(got), "NaN lost at " + at);
    }
    return;
  }
  SPARSEMLA_FUZZ_CHECK(bits_of(got) == bits_of(static_cast<float>(want)), "value differs at " + at);
}

void fuzz_mla_row(Input& in) {
  bool must_reject = false;
  int32_t bs = static_cast<int32_t>(in.range(1, 80));
  int64_t nb = in.range(0, 3);
  int64_t stride = int64_t{bs} * 584 + in.range(0, 40);
  std::vector<uint8_t> bytes(static_cast<size_t>(nb * stride));
  Bulk bulk(in.bytes(8));
  fill_pages(bulk, static_cast<int>(in.range(0, 2)), bytes);
  if (in.one_in(12)) {  // a geometry the library must reject (the buffer stays as allocated)
    const int which = static_cast<int>(in.range(0, 3));
    if (which == 0) stride = int64_t{bs} * 584 - in.range(1, 600);
    if (which == 1) bs = static_cast<int32_t>(-in.range(0, 3));
    if (which == 2) nb = -in.range(1, 5);
    if (which == 3) nb = std::numeric_limits<int64_t>::max() / stride + 1;
    must_reject = true;
  }
  const int64_t capacity = int64_t{bs} * std::max<int64_t>(nb, 0);
  const int64_t slot = in.int64_like(0, capacity - 1);
  const bool scrub = in.flag();
  must_reject = must_reject || slot < 0 || slot >= capacity;
  const CacheView view{bytes.empty() && nb > 0 ? nullptr : bytes.data(), nb, bs, stride};
  std::vector<float> out(512);
  const std::vector<float> before = out;
  std::string why;
  const bool ok = accepted([&] { dequantize_row(view, slot, scrub, out.data()); }, &why);
  expect_verdict(ok, must_reject, why, "dequantize_row");
  if (!ok) {
    SPARSEMLA_FUZZ_CHECK(std::memcmp(out.data(), before.data(), 512 * 4) == 0,
                         "rejected dequantize_row wrote its output");
    return;
  }
  const uint8_t* page = bytes.data() + (slot / bs) * stride;
  const uint8_t* data = page + (slot % bs) * 576;
  const uint8_t* codes = page + int64_t{bs} * 576 + (slot % bs) * 8;
  for (int d = 0; d < 448; ++d) {
    check_value(out[d], e4m3_value(data[d]) * ue8m0_value(codes[d / 64]), scrub, d);
  }
  for (int k = 0; k < 64; ++k) {
    const uint32_t b = (uint32_t{data[448 + 2 * k]} | uint32_t{data[449 + 2 * k]} << 8) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    check_value(out[448 + k], f, scrub, 448 + k);
  }
}

void fuzz_indexer_row(Input& in) {
  bool must_reject = false;
  const bool shuffle = in.flag();
  int32_t bs = static_cast<int32_t>(shuffle ? 16 * in.range(1, 3) : in.range(1, 40));
  const int64_t nb = in.range(0, 3);
  int64_t stride = int64_t{bs} * 132 + in.range(0, 20);
  std::vector<uint8_t> bytes(static_cast<size_t>(nb * stride));
  Bulk bulk(in.bytes(8));
  fill_pages(bulk, static_cast<int>(in.range(0, 2)), bytes);
  if (in.one_in(12)) {
    if (shuffle && in.flag()) {
      bs -= static_cast<int32_t>(in.range(1, 15));  // SHUFFLE pages must be multiples of 16
    } else {
      stride = int64_t{bs} * 132 - in.range(1, 100);
    }
    must_reject = true;
  }
  const int64_t capacity = int64_t{bs} * nb;
  const int64_t slot = in.int64_like(0, capacity - 1);
  must_reject = must_reject || slot < 0 || slot >= capacity;
  const IndexerCacheView view{bytes.empty() ? nullptr : bytes.data(), nb, bs, stride,
                              shuffle ? IndexerLayout::Shuffle : IndexerLayout::Normal};
  std::vector<float> out(128);
  std::string why;
  const bool ok = accepted([&] { dequantize_indexer_row(view, slot, out.data()); }, &why);
  expect_verdict(ok, must_reject, why, "dequantize_indexer_row");
  if (!ok) return;
  const uint8_t* page = bytes.data() + (slot / bs) * stride;
  const int64_t p = slot % bs;
  float scale;
  std::memcpy(&scale, page + int64_t{bs} * 128 + p * 4, 4);
  for (int d = 0; d < 128; ++d) {
    // CONTRACT 2.2: NORMAL p*128 + d; SHUFFLE (p/16)*2048 + (p%16)*16 + (d/16)*256 + d%16.
    const int64_t off =
        shuffle ? (p / 16) * 2048 + (p % 16) * 16 + (d / 16) * 256 + d % 16 : p * 128 + d;
    const float want = static_cast<float>(e4m3_value(page[off])) * scale;  // fp32, as specified
    if (std::isnan(want)) {
      SPARSEMLA_FUZZ_CHECK(std::isnan(out[d]), "indexer NaN lost at dim " + std::to_string(d));
    } else {
      SPARSEMLA_FUZZ_CHECK(bits_of(out[d]) == bits_of(want),
                           "indexer value differs at dim " + std::to_string(d));
    }
  }
}

}  // namespace

int run_dequantize_row(const uint8_t* data, size_t size) {
  Input in(data, size);
  if (in.flag()) {
    fuzz_indexer_row(in);
  } else {
    fuzz_mla_row(in);
  }
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_dequantize_row)
