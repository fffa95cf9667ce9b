// Error messages of public entries (SPEC 8): a sparsemla::Error naming the operation, the argument
// and what was expected, and nothing written.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "reference/random.h"
#include "sparsemla/backend.h"
#include "sparsemla/error.h"
#include "sparsemla/gather.h"
#include "sparsemla/writer.h"

namespace sparsemla {
namespace {

// Runs `call`, expects a sparsemla::Error whose message holds every string of `needles`.
void expect_error(const std::function<void()>& call, const std::vector<std::string>& needles) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needles.front() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// A valid gather call on a small cache; tests break one field at a time.
struct GatherFixture {
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 16 * 132, 3);
  std::vector<int32_t> cu = {0, 3, 5, 8};
  std::vector<int32_t> tts = {0, 0, 0, 1, 1, 2, 2, 2};
  std::vector<int32_t> table = {0, 1, 1, 0, 0, 1};
  std::vector<uint8_t> k_fp8 = std::vector<uint8_t>(8 * 128, 0xAB);
  std::vector<float> k_scale = std::vector<float>(8, 2.0f);
  GatherParams p;
  GatherFixture() {
    p.num_tokens = 8;
    p.num_batches = 3;
    p.token_to_seq = tts.data();
    p.cu_seqlen = cu.data();
    p.block_table = table.data();
    p.block_table_stride = 2;
    p.block_table_width = 2;
    p.cache = {cache.data(), 2, 16, 16 * 132, IndexerLayout::Normal};
    p.k_fp8 = k_fp8.data();
    p.k_scale = k_scale.data();
    p.path = Path::Cpu;
  }
  // Expects the error and that the outputs were not touched.
  void expect(const std::vector<std::string>& needles) {
    const auto fp8_before = k_fp8;
    const auto scale_before = k_scale;
    expect_error([&] { gather_indexer_keys(p); }, needles);
    EXPECT_EQ(k_fp8, fp8_before);
    EXPECT_EQ(k_scale, scale_before);
  }
};

TEST(ErrorMessages, GatherValidFixtureRuns) {
  GatherFixture f;
  EXPECT_NO_THROW(gather_indexer_keys(f.p));
  const uint8_t scale_bytes[4] = {3, 3, 3, 3};  // every cache byte is 3
  EXPECT_EQ(std::memcmp(&f.k_scale[7], scale_bytes, 4), 0);
  EXPECT_EQ(f.k_fp8[0], 3);
}

TEST(ErrorMessages, GatherNamesTheBadArgument) {
  const std::string op = "gather_indexer_keys";
  {
    GatherFixture f;
    f.p.k_fp8_stride = 64;
    f.expect({op, "k_fp8_stride", "expected", ">= 128", "64"});
  }
  {
    GatherFixture f;
    f.p.token_to_seq = nullptr;
    f.expect({op, "token_to_seq", "expected", "null"});
  }
  {
    GatherFixture f;
    f.p.k_scale = nullptr;
    f.expect({op, "k_scale", "expected"});
  }
  {
    GatherFixture f;
    f.p.block_table = nullptr;
    f.expect({op, "block_table", "expected"});
  }
  {
    GatherFixture f;
    f.p.block_table_stride = 1;
    f.expect({op, "block_table_stride", "expected", "block_table_width"});
  }
  {
    GatherFixture f;
    f.p.num_tokens = -1;
    f.expect({op, "num_tokens", "expected"});
  }
  {
    GatherFixture f;
    f.p.cache.block_stride = 16 * 132 - 1;
    f.expect({op, "cache.block_stride", "expected", "2111"});
  }
  {
    GatherFixture f;
    f.p.cache.layout = IndexerLayout::Shuffle;
    f.p.cache.block_size = 8;
    f.expect({op, "cache.block_size", "expected", "multiple of 16"});
  }
  {
    GatherFixture f;
    f.cu[2] = 2;  // cu_seqlen = {0, 3, 2, 8}
    f.expect({op, "cu_seqlen[2]", "expected", "non-decreasing"});
  }
  {
    GatherFixture f;
    f.cu[0] = -1;
    f.expect({op, "cu_seqlen[0]", "expected", ">= 0"});
  }
}

TEST(ErrorMessages, GatherAcceptsEmptyAndUnusedInputs) {
  GatherFixture f;
  f.p.num_tokens = 0;
  f.p.token_to_seq = nullptr;
  f.p.k_fp8 = nullptr;
  f.p.k_scale = nullptr;
  EXPECT_NO_THROW(gather_indexer_keys(f.p));
  GatherFixture g;
  g.p.num_batches = 0;  // every token is padding; the block table is never read
  g.p.block_table = nullptr;
  EXPECT_NO_THROW(gather_indexer_keys(g.p));
  EXPECT_EQ(g.k_scale, std::vector<float>(8, 2.0f));
}

// A valid window-writer call; tests break one field at a time.
struct WindowFixture {
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 4 * 584, 0x5A);
  std::vector<bf16_bits> kv = std::vector<bf16_bits>(512, 0x3F80);  // 1.0
  std::vector<float> table = std::vector<float>(64, 0.5f);
  std::vector<int64_t> positions = {0};
  std::vector<int64_t> slots = {5};
  WindowWriterParams p;
  WindowFixture() {
    p.num_tokens = 1;
    p.kv = kv.data();
    p.positions = positions.data();
    p.slots = slots.data();
    p.rope = {table.data(), 1, 64};
    p.cache = {cache.data(), 2, 4, 4 * 584};
    p.path = Path::Cpu;
  }
  void expect(const std::vector<std::string>& needles) {
    const auto before = cache;
    expect_error([&] { write_window(p); }, needles);
    EXPECT_EQ(cache, before);
  }
};

TEST(ErrorMessages, WindowWriterNamesTheBadArgument) {
  const std::string op = "write_window";
  {
    WindowFixture f;
    f.p.cache.block_stride = 4 * 584 - 8;
    f.expect({op, "cache.block_stride", "expected", "2336", "2328"});
  }
  {
    WindowFixture f;
    f.p.kv = nullptr;
    f.expect({op, "kv", "expected"});
  }
  {
    WindowFixture f;
    f.p.cache.base = nullptr;
    f.expect({op, "cache.base", "expected"});
  }
  {
    WindowFixture f;
    f.p.rope.data = nullptr;
    f.expect({op, "rope", "expected"});
  }
}

TEST(ErrorMessages, ParsePathNamesTheArgumentAndTheChoices) {
  expect_error([] { parse_path("bogus"); }, {"parse_path", "name", "expected", "cpu", "bogus"});
  EXPECT_EQ(parse_path("cpu"), Path::Cpu);
}

}  // namespace
}  // namespace sparsemla
