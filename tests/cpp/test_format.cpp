// Cache layout tests (CONTRACT 2.1, 2.2, 9.2): byte positions from the contract's formulas written
// here, and a page written by write_window compared byte for byte with a page built by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "reference/e4m3_table.h"
#include "reference/random.h"
#include "sparsemla/error.h"
#include "sparsemla/format.h"
#include "sparsemla/writer.h"

namespace sparsemla {
namespace {

// ---- the traits are consistent (compile-time)
// ----------------------------------------------------
using F = Fp8DsMla;
static_assert(F::kHeadDim == 512 && F::kNopeDims == 448 && F::kRopeDims == 64);
static_assert(F::kNumTiles * F::kTileDims == F::kNopeDims);
static_assert(F::kNopeBytes == F::kNopeDims);      // one e4m3 byte per NoPE dim
static_assert(F::kRopeBytes == 2 * F::kRopeDims);  // one bf16 per RoPE dim
static_assert(F::kDataBytes == F::kNopeBytes + F::kRopeBytes && F::kDataBytes == 576);
static_assert(F::kRopeOffset == F::kNopeBytes);
static_assert(F::kScaleBytes == F::kNumTiles + 1 && F::kPadByte == F::kNumTiles);
static_assert(F::kBytesPerToken == F::kDataBytes + F::kScaleBytes && F::kBytesPerToken == 584);
static_assert(F::kEnginePageAlign == F::kDataBytes && F::kEnginePageAlign % F::kFastAlign == 0);
static_assert(F::kDataBytes % F::kFastAlign == 0 && F::kScaleBytes == 8);
static_assert(IndexerFp8::kValueBytes == IndexerFp8::kHeadDim);
static_assert(IndexerFp8::kBytesPerToken == IndexerFp8::kValueBytes + IndexerFp8::kScaleBytes);
static_assert(IndexerFp8::kShuffleTile * IndexerFp8::kShuffleTile * 8 ==
              IndexerFp8::kShuffleTile * IndexerFp8::kValueBytes);

constexpr int kPageSizes[] = {1, 2, 16, 61, 64, 256};

// Strides: unpadded bs*584, engine padding to a multiple of 576, and an odd extra margin.
std::vector<int64_t> strides_for(int bs) {
  const int64_t raw = int64_t{bs} * 584;
  return {raw, (raw + 575) / 576 * 576, raw + 1000, raw + 3};
}

// ---- fp8_ds_mla offsets
// ---------------------------------------------------------------------------

TEST(CacheLayout, MlaOffsetsFollowSpecFormulasForAllPageSizesAndStrides) {
  for (int bs : kPageSizes) {
    for (int64_t stride : strides_for(bs)) {
      SCOPED_TRACE("bs=" + std::to_string(bs) + " stride=" + std::to_string(stride));
      for (int64_t block : {0, 1, 2, 7}) {
        for (int p = 0; p < bs; ++p) {
          const int64_t slot = block * bs + p;
          const int64_t page = block * stride;
          ASSERT_EQ(mla_data_offset(slot, bs, stride), page + p * 576);
          ASSERT_EQ(mla_scale_offset(slot, bs, stride), page + bs * 576 + p * 8);
        }
      }
    }
  }
}

TEST(CacheLayout, MlaRowsOfOnePageTileThePayloadExactly) {
  // Each payload byte [0, bs*584) of a page belongs to exactly one token's data or scale row.
  for (int bs : kPageSizes) {
    const int64_t stride = strides_for(bs)[1];
    std::vector<int> owner(bs * 584, 0);
    for (int p = 0; p < bs; ++p) {
      const int64_t d = mla_data_offset(int64_t{3} * bs + p, bs, stride) - 3 * stride;
      const int64_t s = mla_scale_offset(int64_t{3} * bs + p, bs, stride) - 3 * stride;
      for (int i = 0; i < 576; ++i) ++owner[d + i];
      for (int i = 0; i < 8; ++i) ++owner[s + i];
    }
    for (int i = 0; i < bs * 584; ++i) ASSERT_EQ(owner[i], 1) << "bs=" << bs << " byte " << i;
  }
}

TEST(CacheLayout, SlotValidityRules) {
  for (int bs : kPageSizes) {
    const int64_t num_blocks = 5, n = num_blocks * bs;
    EXPECT_FALSE(slot_is_valid(-1, num_blocks, bs));
    EXPECT_FALSE(slot_is_valid(-bs, num_blocks, bs));
    EXPECT_FALSE(slot_is_valid(INT64_MIN, num_blocks, bs));
    EXPECT_TRUE(slot_is_valid(0, num_blocks, bs));
    EXPECT_TRUE(slot_is_valid(n - 1, num_blocks, bs));
    EXPECT_FALSE(slot_is_valid(n, num_blocks, bs));
    EXPECT_FALSE(slot_is_valid(n + 1024, num_blocks, bs));
    EXPECT_FALSE(slot_is_valid(INT64_MAX, num_blocks, bs));
    EXPECT_FALSE(slot_is_valid(0, 0, bs));  // empty cache
  }
  // num_blocks * bs beyond 2^31: the product is int64.
  const int64_t big_blocks = int64_t{1} << 26;
  EXPECT_TRUE(slot_is_valid((int64_t{1} << 31) + 7, big_blocks, 64));
  EXPECT_TRUE(slot_is_valid((int64_t{1} << 32) - 1, big_blocks, 64));
  EXPECT_FALSE(slot_is_valid(int64_t{1} << 32, big_blocks, 64));
}

TEST(CacheLayout, OffsetsBeyond2To31AreInt64) {
  const int bs = 64;
  const int64_t stride = 64 * 576 + 576;  // 37440, engine-padded
  const int64_t block = 100000;           // 100000 * 37440 = 3.7e9 > 2^31
  const int64_t slot = block * bs + 5;
  EXPECT_EQ(mla_data_offset(slot, bs, stride), int64_t{3744000000} + 5 * 576);
  EXPECT_EQ(mla_scale_offset(slot, bs, stride), int64_t{3744000000} + 64 * 576 + 5 * 8);
  // A slot id itself beyond 2^31.
  const int64_t slot2 = (int64_t{1} << 33) + 3;  // block 2^27, row 3 at bs 64
  EXPECT_EQ(mla_data_offset(slot2, bs, stride), (int64_t{1} << 27) * stride + 3 * 576);
}

// ---- indexer offsets
// ------------------------------------------------------------------------------

TEST(CacheLayout, IndexerNormalAndShuffleOffsetsFollowSpecFormulas) {
  for (int bs : {16, 32, 64, 256}) {
    std::vector<int> seen(bs * 128, 0);
    for (int p = 0; p < bs; ++p) {
      for (int d = 0; d < 128; ++d) {
        ASSERT_EQ(indexer_value_offset_in_page(IndexerLayout::Normal, p, d), p * 128 + d);
        // SHUFFLE: 16-row groups of 2048 bytes; in a group, 8 tiles of 16x16 bytes by dim block.
        const int64_t expected = (p / 16) * 2048 + (d / 16) * 256 + (p % 16) * 16 + d % 16;
        const int64_t got = indexer_value_offset_in_page(IndexerLayout::Shuffle, p, d);
        ASSERT_EQ(got, expected) << "p=" << p << " d=" << d;
        ++seen[got];
      }
      ASSERT_EQ(indexer_scale_offset_in_page(bs, p), bs * 128 + p * 4);
    }
    for (int i = 0; i < bs * 128; ++i) ASSERT_EQ(seen[i], 1) << "SHUFFLE is not a permutation";
  }
  for (int bs : {1, 2, 61}) {
    EXPECT_EQ(indexer_value_offset_in_page(IndexerLayout::Normal, bs - 1, 127), bs * 128 - 1);
    EXPECT_EQ(indexer_scale_offset_in_page(bs, bs - 1), bs * 132 - 4);
  }
}

// ---- a page written by write_window, byte for byte
// -----------------------------------------------

// One token whose every stored byte is known in advance: NoPE values are e4m3 numbers times 2^e
// with a +-448*2^e element in each tile (so the tile exponent is exactly e and the bytes are the
// chosen ones), and RoPE pairs rotated by quarter turns (exact in fp32).
struct HandToken {
  std::vector<bf16_bits> kv;  // 512 inputs
  uint8_t nope[448];
  uint8_t codes[7];
  uint16_t rope[64];  // stored bf16 bits
  int64_t position;
};

uint16_t bf16_of_exact(float v) {  // v is bf16-exact here; take its top 16 bits
  uint32_t u;
  std::memcpy(&u, &v, 4);
  EXPECT_EQ(u & 0xFFFFu, 0u);
  return static_cast<uint16_t>(u >> 16);
}
float float_of_bf16(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Quarter-turn (c, s) per pair: 0 -> (1,0), 1 -> (0,1), 2 -> (-1,0), 3 -> (0,-1).
constexpr float kCos[4] = {1, 0, -1, 0}, kSin[4] = {0, 1, 0, -1};

HandToken make_hand_token(test::Rng& rng, int64_t position, const int* turns) {
  HandToken t;
  t.kv.resize(512);
  t.position = position;
  for (int tile = 0; tile < 7; ++tile) {
    const int e = static_cast<int>(rng.randint(-15, 15));
    t.codes[tile] = static_cast<uint8_t>(e + 127);
    for (int i = 0; i < 64; ++i) {
      uint8_t b;
      do b = static_cast<uint8_t>(rng.randint(0, 255));
      while (b == 0x7F || b == 0xFF || b == 0x7E || b == 0xFE);  // no NaN; 448 placed below
      t.nope[tile * 64 + i] = b;
    }
    const int top = static_cast<int>(rng.randint(0, 63));
    t.nope[tile * 64 + top] = rng.randint(0, 1) ? 0x7E : 0xFE;
    for (int i = 0; i < 64; ++i) {
      const float v = std::ldexp(test::e4m3_reference_value(t.nope[tile * 64 + i]), e);
      t.kv[tile * 64 + i] = bf16_of_exact(v);  // 3-bit mantissa: exact in bf16
    }
  }
  for (int k = 0; k < 32; ++k) {
    // Non-zero finite inputs, so quarter turns are exact and no signed-zero question arises.
    float a, b;
    do a = round_to_bf16(static_cast<float>(rng.normal() * 2));
    while (a == 0.0f);
    do b = round_to_bf16(static_cast<float>(rng.normal() * 2));
    while (b == 0.0f);
    t.kv[448 + 2 * k] = bf16_of_exact(a);
    t.kv[449 + 2 * k] = bf16_of_exact(b);
    const float c = kCos[turns[k]], s = kSin[turns[k]];
    // a' = a*c - b*s, b' = a*s + b*c with one of c, s zero and the other +-1: exact.
    const float ra = c != 0 ? a * c : -b * s, rb = c != 0 ? b * c : a * s;
    t.rope[2 * k] = bf16_of_exact(ra);
    t.rope[2 * k + 1] = bf16_of_exact(rb);
  }
  return t;
}

// Writes the expected bytes of token `t` at `slot` into a page image.
void place_token(std::vector<uint8_t>& image, const HandToken& t, int64_t slot, int bs,
                 int64_t stride) {
  const int64_t block = slot / bs, p = slot % bs;
  uint8_t* data = image.data() + block * stride + p * 576;  // CONTRACT 2.1 formulas
  uint8_t* scale = image.data() + block * stride + int64_t{bs} * 576 + p * 8;
  std::memcpy(data, t.nope, 448);
  for (int i = 0; i < 64; ++i) {  // little-endian bf16
    data[448 + 2 * i] = static_cast<uint8_t>(t.rope[i] & 0xFF);
    data[449 + 2 * i] = static_cast<uint8_t>(t.rope[i] >> 8);
  }
  std::memcpy(scale, t.codes, 7);
  scale[7] = 0;
}

// Four hand tokens at distinct positions of a 5-row table (row stride 70), in a kv buffer with a
// padded row stride; token 2 has a negative slot, the others distinct random slots.
struct HandBatch {
  static constexpr int kTokens = 4;
  static constexpr int64_t kRopeRows = 5, kRopeStride = 70, kKvStride = 520;
  std::vector<HandToken> tokens;
  std::vector<int64_t> positions, slots;
  std::vector<float> table;
  std::vector<bf16_bits> kv;
};

HandBatch make_hand_batch(test::Rng& rng, int64_t slots_total) {
  HandBatch h;
  // Rows not used by a token keep random values, so reading the wrong row shows.
  h.table = test::random_f32(rng, HandBatch::kRopeRows * HandBatch::kRopeStride, 0.7);
  std::vector<int64_t> row_order = {0, 1, 2, 3, 4};
  std::shuffle(row_order.begin(), row_order.end(), rng.engine());
  std::vector<int64_t> free_slots;
  for (int64_t s = 0; s < slots_total; ++s) free_slots.push_back(s);
  std::shuffle(free_slots.begin(), free_slots.end(), rng.engine());
  size_t next_slot = 0;
  for (int i = 0; i < HandBatch::kTokens; ++i) {
    const int64_t pos = row_order[i];
    float* row = h.table.data() + pos * HandBatch::kRopeStride;
    int turns[32];
    for (int k = 0; k < 32; ++k) {
      turns[k] = static_cast<int>(rng.randint(0, 3));
      row[k] = kCos[turns[k]];
      row[32 + k] = kSin[turns[k]];
    }
    h.tokens.push_back(make_hand_token(rng, pos, turns));
    h.positions.push_back(pos);
    const bool skip = i == 2 || next_slot == free_slots.size();
    h.slots.push_back(skip ? -1 - rng.randint(0, 1000) : free_slots[next_slot++]);
  }
  h.kv.assign(HandBatch::kTokens * HandBatch::kKvStride, float_to_bf16(12345.0f));  // junk gaps
  for (int i = 0; i < HandBatch::kTokens; ++i) {
    std::copy(h.tokens[i].kv.begin(), h.tokens[i].kv.end(),
              h.kv.begin() + i * HandBatch::kKvStride);
  }
  return h;
}

TEST(WindowWriterLayout, PageMatchesHandBuiltFixtureByteForByte) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  for (int bs : kPageSizes) {
    for (int64_t stride : {strides_for(bs)[0], strides_for(bs)[1], strides_for(bs)[3]}) {
      for (bool sanitise : {false, true}) {
        SCOPED_TRACE("bs=" + std::to_string(bs) + " stride=" + std::to_string(stride) +
                     " sanitise=" + std::to_string(sanitise));
        const int64_t num_blocks = 3;
        const int64_t guard = 64;  // bytes past the cache that must stay untouched
        HandBatch h = make_hand_batch(rng, num_blocks * bs);
        std::vector<uint8_t> cache = test::random_bytes(rng, num_blocks * stride + guard);
        std::vector<uint8_t> expected = cache;
        for (int i = 0; i < HandBatch::kTokens; ++i) {
          if (h.slots[i] >= 0) place_token(expected, h.tokens[i], h.slots[i], bs, stride);
        }
        WindowWriterParams p;
        p.num_tokens = HandBatch::kTokens;
        p.kv = h.kv.data();
        p.kv_stride = HandBatch::kKvStride;
        p.positions = h.positions.data();
        p.slots = h.slots.data();
        p.rope = {h.table.data(), HandBatch::kRopeRows, HandBatch::kRopeStride};
        p.cache = {cache.data(), num_blocks, bs, stride};
        p.sanitise = sanitise;
        p.path = Path::Cpu;
        ASSERT_NO_THROW(write_window(p));
        for (size_t i = 0; i < cache.size(); ++i) {
          ASSERT_EQ(int{cache[i]}, int{expected[i]})
              << "byte " << i << " (page " << static_cast<int64_t>(i) / stride << ", offset "
              << static_cast<int64_t>(i) % stride << ")";
        }
      }
    }
  }
}

TEST(WindowWriterLayout, RoundTripThroughDequantizeRow) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  for (int bs : kPageSizes) {
    SCOPED_TRACE("bs=" + std::to_string(bs));
    const int64_t stride = strides_for(bs)[1], num_blocks = 2;
    int turns[32];
    for (int& q : turns) q = static_cast<int>(rng.randint(0, 3));
    std::vector<float> table(64);
    for (int k = 0; k < 32; ++k) table[k] = kCos[turns[k]], table[32 + k] = kSin[turns[k]];
    const HandToken t = make_hand_token(rng, 0, turns);
    const int64_t slot = rng.randint(0, num_blocks * bs - 1);
    std::vector<uint8_t> cache = test::random_bytes(rng, num_blocks * stride);
    WindowWriterParams p;
    p.num_tokens = 1;
    p.kv = t.kv.data();
    p.positions = &t.position;
    p.slots = &slot;
    p.rope = {table.data(), 1, 64};
    p.cache = {cache.data(), num_blocks, bs, stride};
    p.path = Path::Cpu;
    ASSERT_NO_THROW(write_window(p));
    float row[512];
    ASSERT_NO_THROW(dequantize_row(p.cache.as_const(), slot, false, row));
    for (int d = 0; d < 448; ++d) {  // NoPE inputs were exactly representable: exact round trip
      ASSERT_EQ(row[d], float_of_bf16(t.kv[d])) << "dim " << d;
    }
    for (int i = 0; i < 64; ++i) ASSERT_EQ(row[448 + i], float_of_bf16(t.rope[i])) << "rope " << i;
  }
}

TEST(WindowWriterLayout, InvalidSlotsWriteNothing) {
  const uint64_t seed = test::fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  test::Rng rng(seed);
  for (int bs : {1, 16, 61}) {
    SCOPED_TRACE("bs=" + std::to_string(bs));
    const int64_t stride = strides_for(bs)[0], num_blocks = 2, guard = 4096;
    std::vector<float> table = test::random_f32(rng, 64, 0.5);
    std::vector<bf16_bits> kv = test::random_bf16(rng, 512);
    const int64_t pos = 0;
    std::vector<uint8_t> cache = test::random_bytes(rng, num_blocks * stride + guard);
    const std::vector<uint8_t> before = cache;
    WindowWriterParams p;
    p.num_tokens = 1;
    p.kv = kv.data();
    p.positions = &pos;
    p.rope = {table.data(), 1, 64};
    p.cache = {cache.data(), num_blocks, bs, stride};
    p.path = Path::Cpu;
    for (int64_t slot : {int64_t{-1}, int64_t{-2}, -num_blocks * bs, INT64_MIN}) {
      p.slots = &slot;
      ASSERT_NO_THROW(write_window(p)) << "slot " << slot;
      ASSERT_EQ(cache, before) << "slot " << slot;
    }
    // Slots past the cache are invalid too: rejected or skipped, never written.
    for (int64_t slot : {num_blocks * bs, num_blocks * bs + 1, INT64_MAX}) {
      p.slots = &slot;
      try {
        write_window(p);
      } catch (const Error&) {
      }
      ASSERT_EQ(cache, before) << "slot " << slot;
    }
  }
}

}  // namespace
}  // namespace sparsemla
