// Window writer (CONTRACT 3.1), row decoders (CONTRACT 2.1, 2.2) and the sanitising contract
// (CONTRACT 5) on the CPU, against the float64 reference of tests/cpp/reference/writer_reference.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "reference/random.h"
#include "reference/writer_reference.h"
#include "sparsemla/error.h"
#include "sparsemla/writer.h"

namespace sparsemla::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Inputs of one window-writer batch; params() points into them.
struct WindowBatch {
  std::vector<bf16_bits> kv;  // [N, kv_stride], padding bf16 NaN
  int64_t kv_stride = 520;
  std::vector<int64_t> positions, slots;
  RopeBuffer rope;
  bool sanitise = true;

  WindowWriterParams params(MlaCacheBuffer& cache) {
    WindowWriterParams p;
    p.num_tokens = static_cast<int64_t>(slots.size());
    p.kv = kv.data();
    p.kv_stride = kv_stride;
    p.positions = positions.data();
    p.slots = slots.data();
    p.rope = rope.table();
    p.cache = cache.view();
    p.sanitise = sanitise;
    p.path = Path::Cpu;
    return p;
  }
  std::vector<int64_t> written_slots() const {
    std::vector<int64_t> s;
    for (int64_t v : slots) {
      if (v >= 0) s.push_back(v);
    }
    return s;
  }
};

// n tokens with distinct random slots of a cache of `capacity` slots (about 1 in 5 skipped with a
// negative slot), random positions and latents whose magnitude varies by 2^+-12 between tokens.
WindowBatch random_window_batch(Rng& rng, int64_t n, int64_t capacity, int64_t rope_rows) {
  WindowBatch b;
  b.rope = random_rope(rng, rope_rows, rng.randint(0, 1) ? 64 : 72);
  b.kv.assign(n * b.kv_stride, 0x7FC0);
  std::vector<int64_t> all(capacity);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng.engine());
  for (int64_t i = 0; i < n; ++i) {
    const auto row = random_bf16(rng, 512, std::ldexp(1.0, static_cast<int>(rng.randint(-12, 12))));
    std::copy(row.begin(), row.end(), b.kv.begin() + i * b.kv_stride);
    b.positions.push_back(rng.randint(0, rope_rows - 1));
    b.slots.push_back(rng.randint(0, 4) == 0 ? -rng.randint(1, 3) : all[i % capacity]);
  }
  return b;
}

int64_t padded_stride(int32_t bs) {
  // Engine padding: a multiple of 576 bytes, plus one more 576 so the padding is never empty.
  const int64_t raw = int64_t{bs} * 584;
  return (raw + 575) / 576 * 576 + 576;
}

std::string case_name(int32_t bs, int64_t stride) {
  return "bs=" + std::to_string(bs) + " block_stride=" + std::to_string(stride);
}

// ---- window writer vs reference
// ------------------------------------------------------------------

TEST(WindowWriterCpu, MatchesReferenceBs1To256UnpaddedAndPaddedStrides) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t bs : {1, 2, 16, 61, 64, 256}) {
    for (int64_t stride : {int64_t{bs} * 584, padded_stride(bs)}) {
      SCOPED_TRACE(case_name(bs, stride));
      const int64_t num_blocks = 64 / bs + 2;
      MlaCacheBuffer cache = random_mla_cache(rng, num_blocks, bs, stride);
      const std::vector<uint8_t> before = cache.bytes;
      WindowBatch batch = random_window_batch(rng, 40, cache.capacity(), 300);
      batch.sanitise = rng.randint(0, 1) == 1;
      const WindowWriterParams p = batch.params(cache);
      write_window(p);
      const auto expected = ref::write_window(p);
      ASSERT_FALSE(expected.empty());
      for (const auto& e : expected) {
        EXPECT_TRUE(ref::window_row_matches(e.row, cache.data(e.slot), cache.scale(e.slot)))
            << "token " << e.token << " slot " << e.slot;
      }
      EXPECT_TRUE(only_rows_changed(before, cache, batch.written_slots()));
    }
  }
}

TEST(WindowWriterCpu, HandBuiltRowBs2PaddedStride) {
  // Slot 3 of a cache with 2-token pages: page 1, row 1. Stride 2*584 + 32 (padded).
  constexpr int32_t kBs = 2;
  constexpr int64_t kStride = kBs * 584 + 32;
  MlaCacheBuffer cache;
  cache.bytes.assign(2 * kStride, 0xAB);
  cache.num_blocks = 2;
  cache.block_size = kBs;
  cache.block_stride = kStride;
  std::vector<bf16_bits> kv(512, 0);
  kv[0] = 0x3F80;    // 1.0   tile 0: amax 1 -> e = -8 (448*2^-9 < 1 <= 448*2^-8), code 119
  kv[1] = 0xBF00;    // -0.5  -> -128 -> 0xF0
  kv[128] = 0x43E0;  // 448   tile 2: e = 0, code 127, byte 0x7E
  kv[129] = 0x4040;  // 3.0   -> 0x44 (1.5 * 2^1)
  kv[384] = 0xC000;  // -2.0  tile 6: e = -7 (1.75 < 2 <= 3.5), code 120; -256 -> 0xF8
  kv[448] = 0x3F80;  // RoPE pair 0 = (1, 2), rotated by 90 degrees -> (-2, 1)
  kv[449] = 0x4000;
  for (int d = 450; d < 512; d += 2) {
    kv[d] = 0x3F00;      // 0.5, pairs 1..31 unrotated
    kv[d + 1] = 0xBE80;  // -0.25
  }
  RopeBuffer rope;
  rope.rows = 4;
  rope.data.assign(4 * 64, 0.0f);
  for (int k = 0; k < 32; ++k) rope.row(3)[k] = 1.0f;  // cos 1, sin 0
  rope.row(3)[0] = 0.0f;                               // pair 0: cos 0, sin 1
  rope.row(3)[32] = 1.0f;
  const int64_t position = 3, slot = 3;
  WindowWriterParams p;
  p.num_tokens = 1;
  p.kv = kv.data();
  p.positions = &position;
  p.slots = &slot;
  p.rope = rope.table();
  p.cache = cache.view();
  p.path = Path::Cpu;
  write_window(p);

  std::vector<uint8_t> want(2 * kStride, 0xAB);
  uint8_t* data = want.data() + kStride + 576;             // page 1, row 1
  uint8_t* scale = want.data() + kStride + kBs * 576 + 8;  // page 1 scale plane, row 1
  std::fill_n(data, 448, 0x00);
  data[0] = 0x78;  // 256 = 2^8: exponent field 15, mantissa 0
  data[1] = 0xF0;  // -128
  data[128] = 0x7E;
  data[129] = 0x44;
  data[384] = 0xF8;
  const uint8_t rope_bytes[4] = {0x00, 0xC0, 0x80, 0x3F};  // -2.0, 1.0 little-endian
  std::copy_n(rope_bytes, 4, data + 448);
  for (int k = 1; k < 32; ++k) {
    const uint8_t pair[4] = {0x00, 0x3F, 0x80, 0xBE};
    std::copy_n(pair, 4, data + 448 + 4 * k);
  }
  // Tiles 1, 3, 4, 5 are all zero: amax floor 1e-4 -> e = -22, code 105.
  const uint8_t codes[8] = {119, 105, 127, 105, 105, 105, 120, 0};
  std::copy_n(codes, 8, scale);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(cache.bytes[i], want[i]) << "byte " << i;
  }
}

TEST(WindowWriterCpu, NegativeSlotsReadAndWriteNothing) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  MlaCacheBuffer cache = random_mla_cache(rng, 3, 16, padded_stride(16));
  const std::vector<uint8_t> before = cache.bytes;
  WindowBatch batch = random_window_batch(rng, 6, cache.capacity(), 10);
  // Skipped tokens: any negative slot; their positions are outside the table and their latents
  // NaN, so reading either would show (or fault).
  batch.slots = {-1, -2, std::numeric_limits<int64_t>::min(), -1, 5, -7};
  batch.positions = {-5, 1'000'000'000'000, 10, std::numeric_limits<int64_t>::max(), 4, -1};
  std::fill_n(batch.kv.begin(), batch.kv_stride, 0x7FC0);
  const WindowWriterParams p = batch.params(cache);
  write_window(p);
  const auto expected = ref::write_window(p);
  ASSERT_EQ(expected.size(), 1u);
  EXPECT_TRUE(ref::window_row_matches(expected[0].row, cache.data(5), cache.scale(5)));
  EXPECT_TRUE(only_rows_changed(before, cache, {5}));
}

TEST(WindowWriterCpu, EmptyBatchWithNullPointersIsANoOp) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  MlaCacheBuffer cache = random_mla_cache(rng, 2, 4, 4 * 584);
  const std::vector<uint8_t> before = cache.bytes;
  RopeBuffer rope = random_rope(rng, 8, 64);
  WindowWriterParams p;
  p.rope = rope.table();
  p.cache = cache.view();
  p.path = Path::Cpu;
  write_window(p);
  EXPECT_EQ(cache.bytes, before);
}

// ---- sanitising contract (CONTRACT 5)
// ----------------------------------------------------------------

TEST(WindowWriterCpu, SanitisingModeOnPoisonedInputsEqualsScrubbedLegacyRows) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const int32_t bs = 16;
  MlaCacheBuffer legacy = random_mla_cache(rng, 4, bs, padded_stride(bs));
  MlaCacheBuffer sanitised = legacy;
  WindowBatch batch = random_window_batch(rng, 48, legacy.capacity(), 64);
  const bf16_bits kPoison[3] = {0x7F80, 0xFF80, 0x7FC0};  // +inf, -inf, NaN
  int poisoned_nope = 0;
  for (size_t i = 0; i < batch.slots.size(); ++i) {
    bf16_bits* row = batch.kv.data() + i * batch.kv_stride;
    const int kind = static_cast<int>(i % 4);  // 0: clean, 1: NoPE poison, 2: RoPE poison, 3: both
    if (kind & 1) {
      for (int j = 0; j < 3; ++j) row[rng.randint(0, 447)] = kPoison[rng.randint(0, 2)];
    }
    if (kind & 2) row[448 + rng.randint(0, 63)] = kPoison[rng.randint(0, 2)];
    if (kind == 3) batch.rope.row(batch.positions[i])[rng.randint(0, 63)] = kNaN;
  }
  for (int64_t i = 0; i < static_cast<int64_t>(batch.slots.size()); ++i) {
    if (batch.slots[i] >= 0 && (i % 4) % 2 == 1) ++poisoned_nope;
  }
  ASSERT_GT(poisoned_nope, 0);
  batch.sanitise = false;
  write_window(batch.params(legacy));
  batch.sanitise = true;
  write_window(batch.params(sanitised));

  const auto slots = batch.written_slots();
  EXPECT_GT(check_sanitised_equivalence(legacy, sanitised, slots), 0)
      << "the poison never produced a NaN in the legacy rows: the test would prove nothing";
  // Every +-inf/NaN input element of the NoPE part is stored as 0xFE in both modes; in a tile
  // holding +-inf it decodes to -inf, the legacy code being 255 there and the sanitised one 254.
  int inf_tiles = 0;
  for (size_t i = 0; i < batch.slots.size(); ++i) {
    if (batch.slots[i] < 0) continue;
    const bf16_bits* row = batch.kv.data() + i * batch.kv_stride;
    for (int d = 0; d < 448; ++d) {
      if (std::isfinite(bf16_to_float(row[d]))) continue;
      EXPECT_EQ(legacy.data(batch.slots[i])[d], 0xFE);
      EXPECT_EQ(sanitised.data(batch.slots[i])[d], 0xFE);
      if (std::isinf(bf16_to_float(row[d]))) {
        EXPECT_EQ(legacy.scale(batch.slots[i])[d / 64], 255);
        EXPECT_EQ(sanitised.scale(batch.slots[i])[d / 64], 254);
        ++inf_tiles;
      }
    }
  }
  EXPECT_GT(inf_tiles, 0);
}

// ---- validation
// ----------------------------------------------------------------------------------

struct WindowValidateFixture {
  Rng rng{fresh_seed()};
  MlaCacheBuffer cache = random_mla_cache(rng, 2, 8, 8 * 584);
  std::vector<uint8_t> before = cache.bytes;
  WindowBatch batch = random_window_batch(rng, 4, 16, 20);
  WindowValidateFixture() { batch.slots = {0, 1, 2, 3}; }
};

TEST(WindowWriterValidate, SlotBeyondCacheNamesTokenAndWritesNothing) {
  WindowValidateFixture f;
  f.batch.slots[2] = 16;  // capacity is 2*8
  expect_error_naming([&] { write_window(f.batch.params(f.cache)); }, "'slots[2]'");
  EXPECT_EQ(f.cache.bytes, f.before) << "token 0 and 1 were valid but must not be written";
}

TEST(WindowWriterValidate, PositionOutsideRopeTableNamesToken) {
  WindowValidateFixture f;
  f.batch.positions[1] = 20;  // rope.rows = 20
  expect_error_naming([&] { write_window(f.batch.params(f.cache)); }, "'positions[1]'");
  f.batch.positions[1] = -1;
  expect_error_naming([&] { write_window(f.batch.params(f.cache)); }, "'positions[1]'");
  EXPECT_EQ(f.cache.bytes, f.before);
}

TEST(WindowWriterValidate, BadStridesAndPointersNameTheArgument) {
  WindowValidateFixture f;
  auto p = f.batch.params(f.cache);
  auto q = p;
  q.cache.block_stride = 8 * 584 - 1;
  expect_error_naming([&] { write_window(q); }, "'cache.block_stride'");
  q = p;
  q.kv_stride = 511;
  expect_error_naming([&] { write_window(q); }, "'kv_stride'");
  q = p;
  q.kv = nullptr;
  expect_error_naming([&] { write_window(q); }, "'kv'");
  q = p;
  q.rope.row_stride = 32;
  expect_error_naming([&] { write_window(q); }, "'rope.row_stride'");
  q = p;
  q.num_tokens = -1;
  expect_error_naming([&] { write_window(q); }, "'num_tokens'");
  EXPECT_EQ(f.cache.bytes, f.before);
}

// ---- row decoders
// --------------------------------------------------------------------------------

TEST(DequantizeRow, DecodesHandBuiltRowIncludingCodes0And255) {
  // Slot 4 of a cache of 3-token pages: page 1, row 1; padded stride.
  constexpr int32_t kBs = 3;
  constexpr int64_t kStride = kBs * 584 + 16;
  std::vector<uint8_t> bytes(2 * kStride, 0x00);
  uint8_t* data = bytes.data() + kStride + 576;
  uint8_t* scale = bytes.data() + kStride + kBs * 576 + 8;
  const uint8_t codes[8] = {0, 255, 127, 130, 127, 127, 127, 0};
  std::copy_n(codes, 8, scale);
  data[0] = 0x38;    // 1.0 * 2^-127: the fp32 subnormal, not flushed
  data[1] = 0x08;    // 2^-6 * 2^-127 = 2^-133
  data[64] = 0x00;   // 0 * inf = NaN
  data[65] = 0x38;   // 1 * inf = inf
  data[66] = 0xB8;   // -1 * inf = -inf
  data[128] = 0x7F;  // NaN byte
  data[129] = 0x01;  // 2^-9
  data[130] = 0xFF;  // NaN byte
  data[192] = 0x7E;  // 448 * 8
  data[193] = 0xC4;  // -3 * 8
  const uint8_t rope[6] = {0xC0, 0x7F, 0x80, 0xFF, 0x80, 0x3F};  // NaN, -inf, 1.0
  std::copy_n(rope, 6, data + 448);
  const CacheView cache{bytes.data(), 2, kBs, kStride};

  float out[512];
  dequantize_row(cache, 4, /*scrub=*/false, out);
  EXPECT_EQ(out[0], std::ldexp(1.0f, -127));
  EXPECT_EQ(out[1], std::ldexp(1.0f, -133));
  EXPECT_EQ(out[2], 0.0f);  // byte 0 with code 0
  EXPECT_TRUE(std::isnan(out[64]));
  EXPECT_EQ(out[65], kInf);
  EXPECT_EQ(out[66], -kInf);
  EXPECT_TRUE(std::isnan(out[67]));  // remaining zero bytes of the code-255 tile
  EXPECT_TRUE(std::isnan(out[128]));
  EXPECT_EQ(out[129], std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(out[130]));
  EXPECT_EQ(out[192], 3584.0f);
  EXPECT_EQ(out[193], -24.0f);
  EXPECT_TRUE(std::isnan(out[448]));
  EXPECT_EQ(out[449], -kInf);
  EXPECT_EQ(out[450], 1.0f);
  EXPECT_EQ(out[451], 0.0f);

  float scrubbed[512];
  dequantize_row(cache, 4, /*scrub=*/true, scrubbed);
  for (int d = 0; d < 512; ++d) {
    if (std::isnan(out[d])) {
      EXPECT_EQ(scrubbed[d], 0.0f) << d;
      EXPECT_FALSE(std::signbit(scrubbed[d])) << "scrub gives +0, dim " << d;
    } else {
      EXPECT_EQ(scrubbed[d], out[d]) << d;  // +-inf and finite values kept
    }
  }
}

TEST(DequantizeRow, RejectsInvalidSlotsAndCaches) {
  std::vector<uint8_t> bytes(2 * 4 * 584, 0);
  const CacheView cache{bytes.data(), 2, 4, 4 * 584};
  float out[512];
  for (int64_t slot : {int64_t{-1}, int64_t{8}, std::numeric_limits<int64_t>::max()}) {
    expect_error_naming([&] { dequantize_row(cache, slot, true, out); }, "'slot'");
  }
  CacheView bad = cache;
  bad.block_stride = 100;
  expect_error_naming([&] { dequantize_row(bad, 0, true, out); }, "'cache.block_stride'");
  expect_error_naming([&] { dequantize_row(cache, 0, true, nullptr); }, "'out512'");
}

TEST(DequantizeIndexerRow, NormalAndShuffleLayoutsByHand) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  constexpr int32_t kBs = 32;
  constexpr int64_t kStride = kBs * 132 + 64;
  constexpr int64_t kSlot = kBs + 17;  // page 1, row 17: second 16-row tile of the SHUFFLE layout
  const float kScale = 0.25f;
  for (IndexerLayout layout : {IndexerLayout::Normal, IndexerLayout::Shuffle}) {
    SCOPED_TRACE(layout == IndexerLayout::Normal ? "NORMAL" : "SHUFFLE");
    IndexerCacheBuffer c = random_indexer_cache(rng, 2, kBs, kStride, layout);
    uint8_t* page = c.bytes.data() + kStride;
    std::vector<uint8_t> row(128);
    for (int d = 0; d < 128; ++d) {
      row[d] = static_cast<uint8_t>(rng.randint(0, 255));
      if ((row[d] & 0x7F) == 0x7F) row[d] = 0x3A;  // keep values finite
      const int64_t off = layout == IndexerLayout::Normal
                              ? 17 * 128 + d
                              : 1 * 16 * 128 + 1 * 16 + (d / 16) * 256 + d % 16;
      page[off] = row[d];
    }
    std::memcpy(page + kBs * 128 + 17 * 4, &kScale, 4);
    float out[128];
    dequantize_indexer_row(c.view(), kSlot, out);
    for (int d = 0; d < 128; ++d) {
      EXPECT_EQ(out[d], static_cast<float>(ref::e4m3_value(row[d]) * kScale)) << "dim " << d;
    }
  }
  IndexerCacheBuffer c = random_indexer_cache(rng, 2, kBs, kStride, IndexerLayout::Normal);
  float out[128];
  expect_error_naming([&] { dequantize_indexer_row(c.view(), 2 * kBs, out); }, "'slot'");
}

}  // namespace
}  // namespace sparsemla::test
