// Bad inputs at every public entry (CONTRACT 8, issue 7): one table per entry point. Each row
// breaks one field of an otherwise valid call and expects a sparsemla::Error whose message names
// the operation, the argument and what was expected -- and that nothing was written. Every table
// first checks that its unbroken fixture runs, so a row can only pass because of the field it
// breaks. Each test prints "[ bad inputs ] <entry>: N rejected"; docs/RELIABILITY.md lists the
// counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "reference/random.h"
#include "sparsemla/backend.h"
#include "sparsemla/decode.h"
#include "sparsemla/error.h"
#include "sparsemla/gather.h"
#include "sparsemla/lists.h"
#include "sparsemla/plan.h"
#include "sparsemla/rope.h"
#include "sparsemla/verify.h"
#include "sparsemla/writer.h"

namespace sparsemla {
namespace {

using test::fresh_seed;
using test::Rng;

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr Path kBogusPath = static_cast<Path>(7);

// Runs `call`, expects a sparsemla::Error whose message holds every string of `needles`.
void expect_error(const std::function<void()>& call, const std::vector<std::string>& needles) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needles.back() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// A misaligned pointer of type T (never dereferenced: validation rejects it first).
template <typename T>
T* misaligned() {
  alignas(64) static uint8_t bytes[64];
  return reinterpret_cast<T*>(bytes + 1);
}

// One row of a table: how the fixture is broken, and what the message must name.
template <typename F>
struct Bad {
  std::string what;
  std::function<void(F&)> edit;
  std::vector<std::string> needles;
};

// Checks the valid fixture, then every row; prints and records the count under `entry` (the
// public function called; default: op, the operation its messages name).
template <typename F>
void check_table(const std::string& op, const std::vector<Bad<F>>& table,
                 const std::string& entry = "") {
  {
    F valid;
    ASSERT_NO_THROW(valid.call()) << "the unbroken " << op << " fixture must run";
  }
  for (const Bad<F>& bad : table) {
    SCOPED_TRACE(op + ": " + bad.what);
    F f;
    bad.edit(f);
    const std::vector<uint8_t> before = f.outputs();
    std::vector<std::string> needles = {"sparsemla::" + op, "expected"};
    needles.insert(needles.end(), bad.needles.begin(), bad.needles.end());
    expect_error([&] { f.call(); }, needles);
    EXPECT_EQ(f.outputs(), before) << "outputs written before the call was rejected";
  }
  std::printf("[ bad inputs ] %-28s %3zu rejected\n", (entry.empty() ? op : entry).c_str(),
              table.size());
  ::testing::Test::RecordProperty("bad_inputs", static_cast<int>(table.size()));
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <typename... Vs>
std::vector<uint8_t> concat(const Vs&... vs) {
  std::vector<uint8_t> all;
  (
      [&] {
        const auto b = as_bytes(vs);
        all.insert(all.end(), b.begin(), b.end());
      }(),
      ...);
  return all;
}

// ---- decode ------------------------------------------------------------------------------------
// T = 2, H = 3, window cache (bs 4) + extra cache (bs 2), sink, fused inverse RoPE, lse, S = 2.
struct DecodeFixture {
  Rng rng{fresh_seed()};
  std::vector<bf16_bits> q = test::random_bf16(rng, 2 * 3 * 512);
  std::vector<uint8_t> main_cache = test::random_bytes(rng, 2 * 4 * 584);
  std::vector<uint8_t> extra_cache = test::random_bytes(rng, 3 * 2 * 584);
  std::vector<int32_t> main_indices = {0, 1, 2, 3, 4, 5, -1, 7};
  std::vector<int32_t> main_indptr = {0, 4, 8};
  std::vector<int32_t> extra_indices = {0, 1, 2, 3, 4, 5};
  std::vector<int32_t> extra_indptr = {0, 3, 6};
  std::vector<float> sink = test::random_f32(rng, 3);
  std::vector<float> rope = test::random_f32(rng, 4 * 64);
  std::vector<int64_t> positions = {1, 3};
  std::vector<bf16_bits> out = std::vector<bf16_bits>(2 * 3 * 512, 0x7FC1);
  std::vector<float> lse = std::vector<float>(6, kNaN);
  std::vector<float> workspace =
      std::vector<float>(decode_workspace_size(2, 3, 32) / sizeof(float), kNaN);
  size_t workspace_bytes = workspace.size() * sizeof(float);
  void* ws = nullptr;
  std::vector<double> ref_out = std::vector<double>(2 * 3 * 512);
  DecodeParams p;

  DecodeFixture() {
    p.num_tokens = 2;
    p.num_heads = 3;
    p.q = q.data();
    p.main_cache = {main_cache.data(), 2, 4, 4 * 584};
    p.main_list = {main_indices.data(), main_indptr.data(), 8, 4};
    p.has_extra = true;
    p.extra_cache = {extra_cache.data(), 3, 2, 2 * 584};
    p.extra_list = {extra_indices.data(), extra_indptr.data(), 6, 3};
    p.sink = sink.data();
    p.positions = positions.data();
    p.rope = {rope.data(), 4, 64};
    p.out = out.data();
    p.lse = lse.data();
    p.num_splits = 2;
    p.path = Path::Cpu;
    ws = workspace.data();
  }
  void call() { sparse_decode(p, ws, workspace_bytes); }
  std::vector<uint8_t> outputs() const { return concat(out, lse); }
};

template <typename F>
std::vector<Bad<F>> decode_shape_rows() {
  return {
      {"T negative", [](F& f) { f.p.num_tokens = -1; }, {"num_tokens", "-1"}},
      {"T above 2^40", [](F& f) { f.p.num_tokens = int64_t{1} << 41; }, {"num_tokens"}},
      {"H zero", [](F& f) { f.p.num_heads = 0; }, {"num_heads", "[1, 128]"}},
      {"H 129", [](F& f) { f.p.num_heads = 129; }, {"num_heads", "129"}},
      {"q null", [](F& f) { f.p.q = nullptr; }, {"'q'", "null"}},
      {"q misaligned", [](F& f) { f.p.q = misaligned<const bf16_bits>(); }, {"'q'", "alignment"}},
      {"q head stride below a row", [](F& f) { f.p.q_stride_head = 511; }, {"q_stride_head"}},
      {"q token stride below a row", [](F& f) { f.p.q_stride_token = 100; }, {"q_stride_token"}},
      {"q extent overflows int64",
       [](F& f) { f.p.q_stride_token = kI64Max - 1000; },
       {"q_stride_token", "fits in int64"}},
      {"main cache stride below bs*584",
       [](F& f) { f.p.main_cache.block_stride = 4 * 584 - 1; },
       {"main_cache.block_stride", "2336", "2335"}},
      {"main cache page size 0",
       [](F& f) { f.p.main_cache.block_size = 0; },
       {"main_cache.block_size"}},
      {"main cache negative blocks",
       [](F& f) { f.p.main_cache.num_blocks = -1; },
       {"main_cache.num_blocks"}},
      {"main cache base null", [](F& f) { f.p.main_cache.base = nullptr; }, {"main_cache.base"}},
      {"main cache bytes overflow int64",
       [](F& f) { f.p.main_cache.num_blocks = kI64Max / 1000; },
       {"main_cache.num_blocks", "fits in int64"}},
      {"extra cache stride below bs*584",
       [](F& f) { f.p.extra_cache.block_stride = 1000; },
       {"extra_cache.block_stride", "1168"}},
      {"main indices null", [](F& f) { f.p.main_list.indices = nullptr; }, {"main_list.indices"}},
      // indptr null selects the dense form (CONTRACT 4.6), which needs the row width W.
      {"main indptr null, no width",
       [](F& f) {
         f.p.main_list.indptr = nullptr;
         f.p.main_list.width = 0;
       },
       {"main_list.width", "dense form"}},
      {"main indices misaligned",
       [](F& f) { f.p.main_list.indices = misaligned<const int32_t>(); },
       {"main_list.indices", "alignment"}},
      {"main capacity negative", [](F& f) { f.p.main_list.capacity = -1; }, {"main_list.capacity"}},
      {"main width negative", [](F& f) { f.p.main_list.width = -1; }, {"main_list.width"}},
      {"extra indices null",
       [](F& f) { f.p.extra_list.indices = nullptr; },
       {"extra_list.indices"}},
      {"scale NaN", [](F& f) { f.p.scale = kNaN; }, {"'scale'", "finite"}},
      {"scale inf", [](F& f) { f.p.scale = kInf; }, {"'scale'", "finite"}},
      {"sink misaligned",
       [](F& f) { f.p.sink = misaligned<const float>(); },
       {"'sink'", "alignment"}},
      {"positions misaligned",
       [](F& f) { f.p.positions = misaligned<const int64_t>(); },
       {"'positions'", "alignment"}},
      {"rope table null with positions", [](F& f) { f.p.rope.data = nullptr; }, {"rope.data"}},
      {"rope row stride 32", [](F& f) { f.p.rope.row_stride = 32; }, {"rope.row_stride"}},
      {"rope rows 0", [](F& f) { f.p.rope.rows = 0; }, {"rope.rows"}},
      {"S 33", [](F& f) { f.p.num_splits = 33; }, {"num_splits", "33"}},
      {"S negative", [](F& f) { f.p.num_splits = -1; }, {"num_splits"}},
      {"CU negative", [](F& f) { f.p.num_sms = -1; }, {"num_sms"}},
      {"path out of the enum", [](F& f) { f.p.path = kBogusPath; }, {"path"}},
  };
}

// Rows that read the host lists and positions (checked before anything is read on the CPU).
template <typename F>
std::vector<Bad<F>> decode_host_data_rows() {
  return {
      {"main indptr[0] negative", [](F& f) { f.main_indptr[0] = -1; }, {"main_list.indptr[0]"}},
      {"main indptr decreasing",
       [](F& f) {
         f.main_indptr = {0, 5, 4};
       },
       {"main_list.indptr[2]", "non-decreasing"}},
      {"main indptr[T] beyond capacity",
       [](F& f) {
         f.main_indptr = {0, 4, 9};
       },
       {"main_list.indptr[2]", "capacity = 8"}},
      {"main rows beyond a shrunk capacity",
       [](F& f) { f.p.main_list.capacity = 5; },
       {"main_list.indptr[2]", "capacity = 5"}},
      {"extra indptr decreasing",
       [](F& f) {
         f.extra_indptr = {0, 4, 2};
       },
       {"extra_list.indptr[2]", "non-decreasing"}},
      {"extra indptr[T] beyond capacity",
       [](F& f) {
         f.extra_indptr = {0, 3, 7};
       },
       {"extra_list.indptr[2]"}},
      {"position past the rope table",
       [](F& f) { f.positions[1] = 4; },
       {"positions[1]", "[0, 4)"}},
      {"position negative", [](F& f) { f.positions[0] = -1; }, {"positions[0]"}},
  };
}

TEST(BadInputs, SparseDecode) {
  using F = DecodeFixture;
  auto table = decode_shape_rows<F>();
  const auto host = decode_host_data_rows<F>();
  table.insert(table.end(), host.begin(), host.end());
  const std::vector<Bad<F>> more = {
      {"out null", [](F& f) { f.p.out = nullptr; }, {"'out'", "null"}},
      {"out misaligned", [](F& f) { f.p.out = misaligned<bf16_bits>(); }, {"'out'", "alignment"}},
      {"out head stride below a row", [](F& f) { f.p.out_stride_head = 256; }, {"out_stride_head"}},
      {"out rows overlap",
       [](F& f) { f.p.out_stride_token = 512; },
       {"out_stride_token", "non-overlapping"}},
      {"lse head stride 0", [](F& f) { f.p.lse_stride_head = 0; }, {"lse_stride_head"}},
      {"lse misaligned", [](F& f) { f.p.lse = misaligned<float>(); }, {"'lse'", "alignment"}},
      {"workspace null with S = 2", [](F& f) { f.ws = nullptr; }, {"'workspace'", "S = 2"}},
      {"workspace too small",
       [](F& f) { f.workspace_bytes = 100; },
       {"workspace_bytes", "decode_workspace_size"}},
      {"workspace misaligned",
       [](F& f) { f.ws = misaligned<float>(); },
       {"'workspace'", "alignment"}},
      {"CUDA path with host pointers", [](F& f) { f.p.path = Path::CudaGeneric; }, {"path"}},
  };
  table.insert(table.end(), more.begin(), more.end());
  check_table("sparse_decode", table);
}

struct ReferenceFixture : DecodeFixture {
  double* ref = ref_out.data();
  void call() { sparse_decode_reference(p, ref, nullptr); }
  std::vector<uint8_t> outputs() const { return as_bytes(ref_out); }
};

TEST(BadInputs, SparseDecodeReference) {
  using F = ReferenceFixture;
  auto table = decode_shape_rows<F>();
  const auto host = decode_host_data_rows<F>();
  table.insert(table.end(), host.begin(), host.end());
  table.push_back({"fp64 out null", [](F& f) { f.ref = nullptr; }, {"out (fp64"}});
  check_table("sparse_decode_reference", table);
}

struct NumSplitsFixture : DecodeFixture {
  void call() { (void)decode_num_splits(p); }
  std::vector<uint8_t> outputs() const { return {}; }
};

TEST(BadInputs, DecodeNumSplits) {
  check_table("decode_num_splits", decode_shape_rows<NumSplitsFixture>());
}

// decode_is_supported reports the same checks (host data included) as false plus the message.
struct SupportedFixture : DecodeFixture {
  void call() {
    const char* why = "unset";
    if (!decode_is_supported(p, &why)) throw Error(why);
    if (why != nullptr) throw std::logic_error("why must be null when supported");
  }
  std::vector<uint8_t> outputs() const { return {}; }
};

TEST(BadInputs, DecodeIsSupported) {
  using F = SupportedFixture;
  auto table = decode_shape_rows<F>();
  const auto host = decode_host_data_rows<F>();
  table.insert(table.end(), host.begin(), host.end());
  check_table("sparse_decode", table, "decode_is_supported");  // messages name the decode
}

struct WorkspaceSizeFixture {
  int64_t T = 4;
  int32_t H = 64, S = 8;
  void call() { EXPECT_EQ(decode_workspace_size(T, H, S), size_t{4 * 8 * 64 * 514 * 4}); }
  std::vector<uint8_t> outputs() const { return {}; }
};

TEST(BadInputs, DecodeWorkspaceSize) {
  using F = WorkspaceSizeFixture;
  check_table<F>("decode_workspace_size",
                 {
                     {"T negative", [](F& f) { f.T = -1; }, {"num_tokens"}},
                     {"T above 2^40", [](F& f) { f.T = int64_t{1} << 41; }, {"num_tokens"}},
                     {"H zero", [](F& f) { f.H = 0; }, {"num_heads"}},
                     {"H 129", [](F& f) { f.H = 129; }, {"num_heads"}},
                     {"S zero", [](F& f) { f.S = 0; }, {"num_splits", "[1, 32]"}},
                     {"S 33", [](F& f) { f.S = 33; }, {"num_splits"}},
                 });
}

struct InverseRopeFixture {
  Rng rng{fresh_seed()};
  std::vector<bf16_bits> x = test::random_bf16(rng, 2 * 3 * 512);
  std::vector<float> rope = test::random_f32(rng, 4 * 64);
  std::vector<int64_t> positions = {0, 3};
  bf16_bits* xp = x.data();
  const int64_t* pos = positions.data();
  int64_t T = 2, stride_token = 0, stride_head = 512;
  int32_t H = 3;
  RopeTable table{rope.data(), 4, 64};
  Path path = Path::Cpu;
  void call() { inverse_rope_inplace(xp, T, H, stride_token, stride_head, pos, table, path); }
  std::vector<uint8_t> outputs() const { return as_bytes(x); }
};

TEST(BadInputs, InverseRopeInplace) {
  using F = InverseRopeFixture;
  check_table<F>(
      "inverse_rope_inplace",
      {
          {"T negative", [](F& f) { f.T = -1; }, {"num_tokens"}},
          {"H zero", [](F& f) { f.H = 0; }, {"num_heads"}},
          {"x null", [](F& f) { f.xp = nullptr; }, {"'x'"}},
          {"x misaligned", [](F& f) { f.xp = misaligned<bf16_bits>(); }, {"'x'", "alignment"}},
          {"positions null", [](F& f) { f.pos = nullptr; }, {"'positions'"}},
          {"head stride below a row", [](F& f) { f.stride_head = 100; }, {"stride_head"}},
          {"rows overlap", [](F& f) { f.stride_token = 600; }, {"stride_token", "non-overlapping"}},
          {"rope table null", [](F& f) { f.table.data = nullptr; }, {"rope.data"}},
          {"rope row stride 63", [](F& f) { f.table.row_stride = 63; }, {"rope.row_stride"}},
          {"position past the table", [](F& f) { f.positions[1] = 4; }, {"positions[1]"}},
          {"position negative", [](F& f) { f.positions[0] = -7; }, {"positions[0]"}},
          {"path out of the enum", [](F& f) { f.path = kBogusPath; }, {"path"}},
      });
}

// ---- writers -----------------------------------------------------------------------------------
struct WindowFixture {
  Rng rng{fresh_seed()};
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 4 * 584, 0x5A);
  std::vector<bf16_bits> kv = test::random_bf16(rng, 2 * 512);
  std::vector<float> table = test::random_f32(rng, 3 * 64);
  std::vector<int64_t> positions = {0, 2};
  std::vector<int64_t> slots = {5, -1};
  WindowWriterParams p;
  WindowFixture() {
    p.num_tokens = 2;
    p.kv = kv.data();
    p.positions = positions.data();
    p.slots = slots.data();
    p.rope = {table.data(), 3, 64};
    p.cache = {cache.data(), 2, 4, 4 * 584};
    p.path = Path::Cpu;
  }
  void call() { write_window(p); }
  std::vector<uint8_t> outputs() const { return cache; }
};

TEST(BadInputs, WriteWindow) {
  using F = WindowFixture;
  check_table<F>(
      "write_window",
      {
          {"N negative", [](F& f) { f.p.num_tokens = -1; }, {"num_tokens"}},
          {"kv null", [](F& f) { f.p.kv = nullptr; }, {"'kv'"}},
          {"kv misaligned",
           [](F& f) { f.p.kv = misaligned<const bf16_bits>(); },
           {"'kv'", "alignment"}},
          {"kv stride below 512", [](F& f) { f.p.kv_stride = 511; }, {"kv_stride", ">= 512"}},
          {"kv extent overflows int64",
           [](F& f) { f.p.kv_stride = kI64Max / 2 + 1; },
           {"num_tokens", "fits in int64"}},
          {"positions null", [](F& f) { f.p.positions = nullptr; }, {"'positions'"}},
          {"slots null", [](F& f) { f.p.slots = nullptr; }, {"'slots'"}},
          {"slots misaligned",
           [](F& f) { f.p.slots = misaligned<const int64_t>(); },
           {"'slots'", "alignment"}},
          {"cache stride below bs*584",
           [](F& f) { f.p.cache.block_stride = 4 * 584 - 8; },
           {"cache.block_stride", "2336", "2328"}},
          {"cache base null", [](F& f) { f.p.cache.base = nullptr; }, {"cache.base"}},
          {"cache page size 0", [](F& f) { f.p.cache.block_size = 0; }, {"cache.block_size"}},
          {"rope table null", [](F& f) { f.p.rope.data = nullptr; }, {"rope.data"}},
          {"rope rows 0", [](F& f) { f.p.rope.rows = 0; }, {"rope.rows"}},
          {"slot past the cache", [](F& f) { f.slots[0] = 8; }, {"slots[0]", "< num_blocks"}},
          {"slot far past the cache", [](F& f) { f.slots[1] = kI64Max; }, {"slots[1]"}},
          {"position past the rope table", [](F& f) { f.positions[0] = 3; }, {"positions[0]"}},
          {"position negative", [](F& f) { f.positions[0] = -1; }, {"positions[0]"}},
          {"path out of the enum", [](F& f) { f.p.path = kBogusPath; }, {"path"}},
      });
}

// Ratio 4, head 512: W = 1024, state rows of 2W = 2048 floats, state pages of 4 rows.
struct StateWriterFixture {
  Rng rng{fresh_seed()};
  std::vector<float> kv = test::random_f32(rng, 2 * 1024);
  std::vector<float> score = test::random_f32(rng, 2 * 1024);
  std::vector<float> ape = test::random_f32(rng, 4 * 1024);
  std::vector<int64_t> positions = {0, 5};
  std::vector<int64_t> state_slots = {0, 5};
  std::vector<float> state = std::vector<float>(2 * 4 * 2048, kNaN);
  StateWriterParams p;
  StateWriterFixture() {
    p.num_tokens = 2;
    p.ratio = 4;
    p.head_dim = 512;
    p.kv = kv.data();
    p.kv_stride = 1024;
    p.score = score.data();
    p.score_stride = 1024;
    p.ape = ape.data();
    p.positions = positions.data();
    p.state_slots = state_slots.data();
    p.state = {state.data(), 2, 4, 4 * 2048, 2048};
    p.path = Path::Cpu;
  }
  void call() { write_compressor_state(p); }
  std::vector<uint8_t> outputs() const { return as_bytes(state); }
};

TEST(BadInputs, WriteCompressorState) {
  using F = StateWriterFixture;
  check_table<F>(
      "write_compressor_state",
      {
          {"N negative", [](F& f) { f.p.num_tokens = -1; }, {"num_tokens"}},
          {"ratio 3", [](F& f) { f.p.ratio = 3; }, {"ratio", "4 or 128"}},
          {"head dim 256", [](F& f) { f.p.head_dim = 256; }, {"head_dim"}},
          {"indexer head with ratio 128",
           [](F& f) { f.p.head_dim = 128, f.p.ratio = 128; },
           {"ratio", "indexer"}},
          {"kv stride below W", [](F& f) { f.p.kv_stride = 1023; }, {"kv_stride", "1024"}},
          {"score stride below W", [](F& f) { f.p.score_stride = 512; }, {"score_stride"}},
          {"kv null", [](F& f) { f.p.kv = nullptr; }, {"'kv'"}},
          {"score null", [](F& f) { f.p.score = nullptr; }, {"'score'"}},
          {"ape misaligned",
           [](F& f) { f.p.ape = misaligned<const float>(); },
           {"'ape'", "alignment"}},
          {"positions null", [](F& f) { f.p.positions = nullptr; }, {"'positions'"}},
          {"state slots null", [](F& f) { f.p.state_slots = nullptr; }, {"state_slots"}},
          {"state base null", [](F& f) { f.p.state.base = nullptr; }, {"state.base"}},
          {"state rows below 2W",
           [](F& f) { f.p.state.row_stride = 2047; },
           {"state.row_stride", "2048"}},
          {"state pages below bs rows",
           [](F& f) { f.p.state.block_stride = 3 * 2048; },
           {"state.block_stride"}},
          {"state without pages", [](F& f) { f.p.state.num_blocks = 0; }, {"state.num_blocks"}},
          {"state page size 0", [](F& f) { f.p.state.block_size = 0; }, {"state.block_size"}},
          {"state extent overflows int64",
           [](F& f) { f.p.state.num_blocks = kI64Max / 4096; },
           {"state.num_blocks", "fits in int64"}},
          {"state slot past the state cache",
           [](F& f) { f.state_slots[1] = 8; },
           {"state_slots[1]"}},
          {"negative position with a slot", [](F& f) { f.positions[0] = -4; }, {"positions[0]"}},
      });
}

// Ratio 4, head 512, state pages of 4 rows; one token at position 7 completes entry 1 and reads
// positions 0..7 through the state block table {0, 1}; compressed pages of 2 entries.
struct CompressFixture {
  Rng rng{fresh_seed()};
  std::vector<float> state = test::random_f32(rng, 2 * 4 * 2048);
  std::vector<int32_t> state_table = {0, 1};
  std::vector<int64_t> positions = {7};
  std::vector<int32_t> requests = {0};
  std::vector<int64_t> state_slots = {7};
  std::vector<int64_t> out_slots = {1};
  std::vector<float> norm_weight = test::random_f32(rng, 512, 0.1, 1.0);
  std::vector<float> rope = test::random_f32(rng, 8 * 64);
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 584, 0xA5);
  CompressorParams p;
  CompressFixture() {
    p.num_tokens = 1;
    p.ratio = 4;
    p.positions = positions.data();
    p.request_index = requests.data();
    p.state_slots = state_slots.data();
    p.out_slots = out_slots.data();
    p.state_block_table = state_table.data();
    p.state_table_stride = 2;
    p.state_table_width = 2;
    p.num_requests = 1;
    p.state = {state.data(), 2, 4, 4 * 2048, 2048};
    p.norm_weight = norm_weight.data();
    p.rope = {rope.data(), 8, 64};
    p.cache = {cache.data(), 1, 2, 2 * 584};
    p.path = Path::Cpu;
  }
  void call() { compress(p); }
  std::vector<uint8_t> outputs() const { return cache; }
};

TEST(BadInputs, Compress) {
  using F = CompressFixture;
  check_table<F>(
      "compress",
      {
          {"ratio 5", [](F& f) { f.p.ratio = 5; }, {"ratio", "4 or 128"}},
          {"N negative", [](F& f) { f.p.num_tokens = -1; }, {"num_tokens"}},
          {"requests negative", [](F& f) { f.p.num_requests = -1; }, {"num_requests"}},
          {"table stride below width",
           [](F& f) { f.p.state_table_stride = 1; },
           {"state_table_stride"}},
          {"table extent overflows int64",
           [](F& f) { f.p.num_requests = 3, f.p.state_table_stride = kI64Max / 2; },
           {"num_requests", "fits in int64"}},
          {"positions null", [](F& f) { f.p.positions = nullptr; }, {"'positions'"}},
          {"request index null", [](F& f) { f.p.request_index = nullptr; }, {"request_index"}},
          {"state slots null", [](F& f) { f.p.state_slots = nullptr; }, {"state_slots"}},
          {"out slots null", [](F& f) { f.p.out_slots = nullptr; }, {"out_slots"}},
          {"state block table null",
           [](F& f) { f.p.state_block_table = nullptr; },
           {"state_block_table"}},
          {"state block table misaligned",
           [](F& f) { f.p.state_block_table = misaligned<const int32_t>(); },
           {"state_block_table", "alignment"}},
          {"scratch misaligned",
           [](F& f) { f.p.scratch = misaligned<float>(); },
           {"scratch", "alignment"}},
          {"norm weight null", [](F& f) { f.p.norm_weight = nullptr; }, {"norm_weight"}},
          {"norm eps NaN", [](F& f) { f.p.norm_eps = kNaN; }, {"norm_eps"}},
          {"norm eps negative", [](F& f) { f.p.norm_eps = -1e-6f; }, {"norm_eps"}},
          {"rope table null", [](F& f) { f.p.rope.data = nullptr; }, {"rope.data"}},
          {"state rows below 2W",
           [](F& f) { f.p.state.row_stride = 1024; },
           {"state.row_stride", "2048"}},
          {"cache stride below bs*584",
           [](F& f) { f.p.cache.block_stride = 584; },
           {"cache.block_stride", "1168"}},
          {"out slot past the cache", [](F& f) { f.out_slots[0] = 2; }, {"out_slots[0]"}},
          {"state slot past the state cache",
           [](F& f) { f.state_slots[0] = 8; },
           {"state_slots[0]"}},
          {"negative position with a state slot",
           [](F& f) { f.positions[0] = -1; },
           {"positions[0]"}},
          {"request out of range", [](F& f) { f.requests[0] = 1; }, {"request_index[0]"}},
          {"window start past the rope table",
           [](F& f) { f.p.rope.rows = 4; },
           {"positions[0]", "window start"}},
          {"state table row too short",
           [](F& f) { f.p.state_table_width = 1; },
           {"state_table_width", "reads position 4"}},
          {"state block id past the state cache",
           [](F& f) { f.state_table[1] = 2; },
           {"state_block_table[0][1]"}},
          {"state block id negative",
           [](F& f) { f.state_table[0] = -1; },
           {"state_block_table[0][0]"}},
      });
}

// The indexer compressor: head 128, ratio 4 (W = 256, rows of 512), NORMAL pages of 16 rows.
struct IndexerCompressFixture {
  Rng rng{fresh_seed()};
  std::vector<float> state = test::random_f32(rng, 2 * 4 * 512);
  std::vector<int32_t> state_table = {0, 1};
  std::vector<int64_t> positions = {7};
  std::vector<int32_t> requests = {0};
  std::vector<int64_t> state_slots = {7};
  std::vector<int64_t> out_slots = {1};
  std::vector<float> norm_weight = test::random_f32(rng, 128, 0.1, 1.0);
  std::vector<float> rope = test::random_f32(rng, 8 * 64);
  std::vector<uint8_t> cache = std::vector<uint8_t>(16 * 132, 0xA5);
  IndexerCompressorParams p;
  IndexerCompressFixture() {
    p.num_tokens = 1;
    p.positions = positions.data();
    p.request_index = requests.data();
    p.state_slots = state_slots.data();
    p.out_slots = out_slots.data();
    p.state_block_table = state_table.data();
    p.state_table_stride = 2;
    p.state_table_width = 2;
    p.num_requests = 1;
    p.state = {state.data(), 2, 4, 4 * 512, 512};
    p.norm_weight = norm_weight.data();
    p.rope = {rope.data(), 8, 64};
    p.cache = {cache.data(), 1, 16, 16 * 132, IndexerLayout::Normal};
    p.path = Path::Cpu;
  }
  void call() { compress_indexer(p); }
  std::vector<uint8_t> outputs() const { return cache; }
};

TEST(BadInputs, CompressIndexer) {
  using F = IndexerCompressFixture;
  check_table<F>(
      "compress_indexer",
      {
          {"SHUFFLE destination",
           [](F& f) { f.p.cache.layout = IndexerLayout::Shuffle; },
           {"cache.layout", "Normal"}},
          {"layout out of the enum",
           [](F& f) { f.p.cache.layout = static_cast<IndexerLayout>(9); },
           {"cache.layout"}},
          {"cache stride below bs*132",
           [](F& f) { f.p.cache.block_stride = 2111; },
           {"cache.block_stride", "2112"}},
          {"cache base null", [](F& f) { f.p.cache.base = nullptr; }, {"cache.base"}},
          {"state rows below 2W",
           [](F& f) { f.p.state.row_stride = 511; },
           {"state.row_stride", "512"}},
          {"norm weight null", [](F& f) { f.p.norm_weight = nullptr; }, {"norm_weight"}},
          {"out slot past the cache", [](F& f) { f.out_slots[0] = 16; }, {"out_slots[0]"}},
          {"request out of range", [](F& f) { f.requests[0] = -3; }, {"request_index[0]"}},
          {"state block id past the state cache",
           [](F& f) { f.state_table[0] = 7; },
           {"state_block_table[0][0]"}},
          {"window start past the rope table",
           [](F& f) { f.p.rope.rows = 3; },
           {"positions[0]", "window start"}},
      });
}

// ---- row decoders ------------------------------------------------------------------------------
struct DequantizeRowFixture {
  Rng rng{fresh_seed()};
  std::vector<uint8_t> bytes = test::random_bytes(rng, 3 * (5 * 584 + 8));
  std::vector<float> out = std::vector<float>(512, kNaN);
  CacheView cache{bytes.data(), 3, 5, 5 * 584 + 8};
  int64_t slot = 14;
  float* dst = out.data();
  void call() { dequantize_row(cache, slot, true, dst); }
  std::vector<uint8_t> outputs() const { return as_bytes(out); }
};

TEST(BadInputs, DequantizeRow) {
  using F = DequantizeRowFixture;
  check_table<F>(
      "dequantize_row",
      {
          {"slot -1", [](F& f) { f.slot = -1; }, {"'slot'", "[0, num_blocks*block_size = 15)"}},
          {"slot = capacity", [](F& f) { f.slot = 15; }, {"'slot'", "15"}},
          {"slot INT64_MAX", [](F& f) { f.slot = kI64Max; }, {"'slot'"}},
          {"slot INT64_MIN", [](F& f) { f.slot = kI64Min; }, {"'slot'"}},
          {"out null", [](F& f) { f.dst = nullptr; }, {"out512"}},
          {"stride below bs*584",
           [](F& f) { f.cache.block_stride = 5 * 584 - 1; },
           {"cache.block_stride"}},
          {"page size 0", [](F& f) { f.cache.block_size = 0; }, {"cache.block_size"}},
          {"negative blocks", [](F& f) { f.cache.num_blocks = -2; }, {"cache.num_blocks"}},
          {"base null", [](F& f) { f.cache.base = nullptr; }, {"cache.base"}},
          {"cache bytes overflow int64",
           [](F& f) { f.cache.num_blocks = kI64Max / 2000; },
           {"cache.num_blocks", "fits in int64"}},
      });
}

struct DequantizeIndexerRowFixture {
  Rng rng{fresh_seed()};
  std::vector<uint8_t> bytes = test::random_bytes(rng, 2 * 16 * 132);
  std::vector<float> out = std::vector<float>(128, kNaN);
  IndexerCacheView cache{bytes.data(), 2, 16, 16 * 132, IndexerLayout::Shuffle};
  int64_t slot = 31;
  float* dst = out.data();
  void call() { dequantize_indexer_row(cache, slot, dst); }
  std::vector<uint8_t> outputs() const { return as_bytes(out); }
};

TEST(BadInputs, DequantizeIndexerRow) {
  using F = DequantizeIndexerRowFixture;
  check_table<F>("dequantize_indexer_row",
                 {
                     {"slot -1", [](F& f) { f.slot = -1; }, {"'slot'"}},
                     {"slot = capacity", [](F& f) { f.slot = 32; }, {"'slot'", "32"}},
                     {"out null", [](F& f) { f.dst = nullptr; }, {"out128"}},
                     {"SHUFFLE page of 8 rows",
                      [](F& f) { f.cache.block_size = 8; },
                      {"cache.block_size", "multiple of 16"}},
                     {"stride below bs*132",
                      [](F& f) { f.cache.block_stride = 16 * 132 - 4; },
                      {"cache.block_stride"}},
                     {"layout out of the enum",
                      [](F& f) { f.cache.layout = static_cast<IndexerLayout>(2); },
                      {"cache.layout"}},
                     {"base null", [](F& f) { f.cache.base = nullptr; }, {"cache.base"}},
                 });
}

// ---- gather ------------------------------------------------------------------------------------
struct GatherFixture {
  Rng rng{fresh_seed()};
  std::vector<uint8_t> cache = test::random_bytes(rng, 2 * 16 * 132);
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
  void call() { gather_indexer_keys(p); }
  std::vector<uint8_t> outputs() const { return concat(k_fp8, k_scale); }
};

TEST(BadInputs, GatherIndexerKeys) {
  using F = GatherFixture;
  check_table<F>(
      "gather_indexer_keys",
      {
          {"N negative", [](F& f) { f.p.num_tokens = -1; }, {"num_tokens"}},
          {"B negative", [](F& f) { f.p.num_batches = -1; }, {"num_batches"}},
          {"table width negative", [](F& f) { f.p.block_table_width = -1; }, {"block_table_width"}},
          {"table stride below width",
           [](F& f) { f.p.block_table_stride = 1; },
           {"block_table_stride", "block_table_width"}},
          {"table extent overflows int64",
           [](F& f) { f.p.block_table_stride = kI64Max / 2; },
           {"num_batches", "fits in int64"}},
          {"k_fp8 stride 64", [](F& f) { f.p.k_fp8_stride = 64; }, {"k_fp8_stride", ">= 128"}},
          {"output extent overflows int64",
           [](F& f) { f.p.k_fp8_stride = kI64Max / 4; },
           {"num_tokens", "fits in int64"}},
          {"token_to_seq null", [](F& f) { f.p.token_to_seq = nullptr; }, {"token_to_seq", "null"}},
          {"cu_seqlen null", [](F& f) { f.p.cu_seqlen = nullptr; }, {"cu_seqlen"}},
          {"k_fp8 null", [](F& f) { f.p.k_fp8 = nullptr; }, {"k_fp8"}},
          {"k_scale null", [](F& f) { f.p.k_scale = nullptr; }, {"k_scale"}},
          {"k_scale misaligned",
           [](F& f) { f.p.k_scale = misaligned<float>(); },
           {"k_scale", "alignment"}},
          {"cu_seqlen misaligned",
           [](F& f) { f.p.cu_seqlen = misaligned<const int32_t>(); },
           {"cu_seqlen", "alignment"}},
          {"block table null", [](F& f) { f.p.block_table = nullptr; }, {"block_table"}},
          {"cache stride below bs*132",
           [](F& f) { f.p.cache.block_stride = 16 * 132 - 1; },
           {"cache.block_stride", "2111"}},
          {"SHUFFLE page of 8 rows",
           [](F& f) { f.p.cache.layout = IndexerLayout::Shuffle, f.p.cache.block_size = 8; },
           {"cache.block_size", "multiple of 16"}},
          {"cache negative blocks", [](F& f) { f.p.cache.num_blocks = -1; }, {"cache.num_blocks"}},
          {"cache base null", [](F& f) { f.p.cache.base = nullptr; }, {"cache.base"}},
          {"cu_seqlen decreasing", [](F& f) { f.cu[2] = 2; }, {"cu_seqlen[2]", "non-decreasing"}},
          {"cu_seqlen[0] negative", [](F& f) { f.cu[0] = -1; }, {"cu_seqlen[0]", ">= 0"}},
          {"path out of the enum", [](F& f) { f.p.path = kBogusPath; }, {"path"}},
      });
}

TEST(BadInputs, GatherAcceptsEmptyAndUnusedInputs) {
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

// ---- ragged builders ---------------------------------------------------------------------------
// Three rows of width 4 into graph buffers; outputs start as a canary pattern.
struct BuilderOutputs {
  std::vector<int32_t> indices = std::vector<int32_t>(3 * 4, 0x5EED);
  std::vector<int32_t> indptr = std::vector<int32_t>(4, 0x5EED);
  std::vector<uint8_t> bytes() const { return concat(indices, indptr); }
};

struct DenseFixture {
  std::vector<int32_t> dense = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  std::vector<int32_t> lengths = {4, 2};
  std::vector<int32_t> requests = {1, 0, 1};
  BuilderOutputs o;
  DenseToRaggedParams p;
  DenseFixture() {
    p.common.num_rows = 3;
    p.common.path = Path::Cpu;
    p.dense = dense.data();
    p.dense_stride = 4;
    p.lengths = lengths.data();
    p.request_index = requests.data();
    p.num_requests = 2;
    p.num_slots = 6;
    p.out = {o.indices.data(), o.indptr.data(), 4};
  }
  void call() { build_ragged_from_dense(p); }
  std::vector<uint8_t> outputs() const { return o.bytes(); }
};

// Rows shared by every builder (the common output checks).
template <typename F>
std::vector<Bad<F>> builder_common_rows() {
  return {
      {"R negative", [](F& f) { f.p.common.num_rows = -1; }, {"common.num_rows"}},
      {"indptr null", [](F& f) { f.p.out.indptr = nullptr; }, {"out.indptr"}},
      {"indptr misaligned",
       [](F& f) { f.p.out.indptr = misaligned<int32_t>(); },
       {"out.indptr", "alignment"}},
      {"indices null", [](F& f) { f.p.out.indices = nullptr; }, {"out.indices"}},
      {"width 0", [](F& f) { f.p.out.width = 0; }, {"out.width", ">= 1"}},
      {"R*W beyond int32",
       [](F& f) { f.p.common.num_rows = int64_t{1} << 30; },
       {"common.num_rows", "2^31-1"}},
      {"path out of the enum", [](F& f) { f.p.common.path = kBogusPath; }, {"path"}},
  };
}

TEST(BadInputs, BuildRaggedFromDense) {
  using F = DenseFixture;
  auto table = builder_common_rows<F>();
  const std::vector<Bad<F>> more = {
      {"dense null", [](F& f) { f.p.dense = nullptr; }, {"'dense'"}},
      {"dense misaligned",
       [](F& f) { f.p.dense = misaligned<const int32_t>(); },
       {"'dense'", "alignment"}},
      {"lengths null", [](F& f) { f.p.lengths = nullptr; }, {"lengths"}},
      {"dense stride below width", [](F& f) { f.p.dense_stride = 3; }, {"dense_stride"}},
      {"dense extent overflows int64",
       [](F& f) { f.p.dense_stride = kI64Max / 2; },
       {"common.num_rows", "fits in int64"}},
      {"slot count negative", [](F& f) { f.p.num_slots = -1; }, {"num_slots"}},
      {"requests negative", [](F& f) { f.p.num_requests = -1; }, {"num_requests"}},
      {"request out of range", [](F& f) { f.requests[2] = 2; }, {"request_index[2]"}},
      {"request negative", [](F& f) { f.requests[0] = -1; }, {"request_index[0]"}},
  };
  table.insert(table.end(), more.begin(), more.end());
  check_table("build_ragged_from_dense", table);
}

// Block table of 2 requests x 3 pages (row stride 4), page size 2.
struct TableInputs {
  std::vector<int32_t> table = {4, 1, 0, -9, 2, 3, 5, -9};
  std::vector<int32_t> requests = {1, 0, 1};
};

template <typename F>
std::vector<Bad<F>> block_table_rows() {
  return {
      {"page size 0", [](F& f) { f.p.block_size = 0; }, {"block_size"}},
      {"table width 0", [](F& f) { f.p.table_width = 0; }, {"table_width"}},
      {"table stride below width",
       [](F& f) { f.p.block_table_stride = 2; },
       {"block_table_stride"}},
      {"table extent overflows int64",
       [](F& f) { f.p.block_table_stride = kI64Max / 2 + 1; },
       {"num_requests", "fits in int64"}},
      {"requests negative", [](F& f) { f.p.num_requests = -1; }, {"num_requests"}},
      {"table null", [](F& f) { f.p.block_table = nullptr; }, {"block_table"}},
      {"table misaligned",
       [](F& f) { f.p.block_table = misaligned<const int32_t>(); },
       {"block_table", "alignment"}},
      {"request out of range", [](F& f) { f.t.requests[1] = 2; }, {"request_index[1]"}},
      {"no request index, too few requests",
       [](F& f) { f.p.request_index = nullptr; },
       {"num_requests", "request_index is null"}},
  };
}

template <typename Params>
void set_table(Params& p, TableInputs& t) {
  p.block_table = t.table.data();
  p.block_table_stride = 4;
  p.table_width = 3;
  p.num_requests = 2;
  p.block_size = 2;
  p.request_index = t.requests.data();
}

struct WindowListFixture {
  TableInputs t;
  std::vector<int64_t> positions = {0, 5, 3};
  BuilderOutputs o;
  WindowListParams p;
  WindowListFixture() {
    p.common.num_rows = 3;
    p.common.path = Path::Cpu;
    p.positions = positions.data();
    set_table(p, t);
    p.window = 4;
    p.out = {o.indices.data(), o.indptr.data(), 4};
  }
  void call() { build_window_lists(p); }
  std::vector<uint8_t> outputs() const { return o.bytes(); }
};

TEST(BadInputs, BuildWindowLists) {
  using F = WindowListFixture;
  auto table = builder_common_rows<F>();
  const auto tables = block_table_rows<F>();
  table.insert(table.end(), tables.begin(), tables.end());
  const std::vector<Bad<F>> more = {
      {"positions null", [](F& f) { f.p.positions = nullptr; }, {"'positions'"}},
      {"positions misaligned",
       [](F& f) { f.p.positions = misaligned<const int64_t>(); },
       {"'positions'", "alignment"}},
      {"window 0", [](F& f) { f.p.window = 0; }, {"window"}},
      {"width below the window", [](F& f) { f.p.window = 5; }, {"out.width", "window = 5"}},
      {"negative position", [](F& f) { f.positions[2] = -1; }, {"positions[2]"}},
  };
  table.insert(table.end(), more.begin(), more.end());
  check_table("build_window_lists", table);
}

struct TopkListFixture {
  TableInputs t;
  std::vector<int32_t> topk = {0, 5, 2, -1, 1, 4, 3, 7, 2, 2, 0, 1};
  std::vector<int32_t> topk_length = {3, 4};
  BuilderOutputs o;
  TopkListParams p;
  TopkListFixture() {
    p.common.num_rows = 3;
    p.common.path = Path::Cpu;
    p.topk = topk.data();
    p.topk_stride = 4;
    p.topk_length = topk_length.data();
    set_table(p, t);
    p.out = {o.indices.data(), o.indptr.data(), 4};
  }
  void call() { build_topk_lists(p); }
  std::vector<uint8_t> outputs() const { return o.bytes(); }
};

TEST(BadInputs, BuildTopkLists) {
  using F = TopkListFixture;
  auto table = builder_common_rows<F>();
  const auto tables = block_table_rows<F>();
  table.insert(table.end(), tables.begin(), tables.end());
  const std::vector<Bad<F>> more = {
      {"topk null", [](F& f) { f.p.topk = nullptr; }, {"'topk'"}},
      {"topk stride below width", [](F& f) { f.p.topk_stride = 3; }, {"topk_stride"}},
      {"topk extent overflows int64",
       [](F& f) { f.p.topk_stride = kI64Max / 2; },
       {"common.num_rows", "fits in int64"}},
      {"topk_length misaligned",
       [](F& f) { f.p.topk_length = misaligned<const int32_t>(); },
       {"topk_length", "alignment"}},
  };
  table.insert(table.end(), more.begin(), more.end());
  check_table("build_topk_lists", table);
}

struct CompressedAllFixture {
  TableInputs t;
  std::vector<int64_t> positions = {7, 30, 1};
  BuilderOutputs o;
  CompressedAllListParams p;
  CompressedAllFixture() {
    p.common.num_rows = 3;
    p.common.path = Path::Cpu;
    p.positions = positions.data();
    set_table(p, t);
    p.ratio = 8;
    p.max_compressed = 4;
    p.out = {o.indices.data(), o.indptr.data(), 4};
  }
  void call() { build_compressed_all_lists(p); }
  std::vector<uint8_t> outputs() const { return o.bytes(); }
};

TEST(BadInputs, BuildCompressedAllLists) {
  using F = CompressedAllFixture;
  auto table = builder_common_rows<F>();
  const auto tables = block_table_rows<F>();
  table.insert(table.end(), tables.begin(), tables.end());
  const std::vector<Bad<F>> more = {
      {"positions null", [](F& f) { f.p.positions = nullptr; }, {"'positions'"}},
      {"ratio 0", [](F& f) { f.p.ratio = 0; }, {"ratio"}},
      {"max_compressed 0", [](F& f) { f.p.max_compressed = 0; }, {"max_compressed"}},
      {"width below max_compressed",
       [](F& f) { f.p.max_compressed = 5; },
       {"out.width", "max_compressed = 5"}},
      {"negative position", [](F& f) { f.positions[0] = -8; }, {"positions[0]"}},
  };
  table.insert(table.end(), more.begin(), more.end());
  check_table("build_compressed_all_lists", table);
}

// ---- pure helpers: planners, table builders, verification, paths
// ---------------------------------
struct PlanFixture {
  PlanShape shape{4, 64, 128, 512, 132};
  std::function<int32_t(const PlanShape&)> fn = plan_generic;
  void call() { (void)fn(shape); }
  std::vector<uint8_t> outputs() const { return {}; }
};

template <typename F>
std::vector<Bad<F>> plan_rows() {
  return {
      {"T negative", [](F& f) { f.shape.num_tokens = -1; }, {"shape.num_tokens"}},
      {"T above 2^40", [](F& f) { f.shape.num_tokens = int64_t{1} << 41; }, {"shape.num_tokens"}},
      {"H zero", [](F& f) { f.shape.num_heads = 0; }, {"shape.num_heads"}},
      {"H 129", [](F& f) { f.shape.num_heads = 129; }, {"shape.num_heads"}},
      {"main width negative", [](F& f) { f.shape.width_main = -1; }, {"shape.width_main"}},
      {"extra width negative", [](F& f) { f.shape.width_extra = -1; }, {"shape.width_extra"}},
      {"CU zero", [](F& f) { f.shape.num_sms = 0; }, {"shape.num_sms"}},
  };
}

TEST(BadInputs, Planners) {
  struct Generic : PlanFixture {};
  struct Specialised : PlanFixture {
    Specialised() { fn = plan_specialised_ref; }
  };
  struct Tuned : PlanFixture {
    Tuned() { fn = plan_sm90_tuned; }
  };
  struct OneWave : PlanFixture {
    OneWave() {
      fn = [](const PlanShape& s) { return adaptive_one_wave(s, 8); };
    }
  };
  check_table("plan_generic", plan_rows<Generic>());
  check_table("plan_specialised_ref", plan_rows<Specialised>());
  check_table("plan_sm90_tuned", plan_rows<Tuned>());
  auto one_wave = plan_rows<OneWave>();
  one_wave.push_back(
      {"splits 0",
       [](OneWave& f) { f.fn = [](const PlanShape& s) { return adaptive_one_wave(s, 0); }; },
       {"splits"}});
  check_table("adaptive_one_wave", one_wave);
}

struct ActiveSplitsFixture {
  int64_t len_main = 100, len_extra = 3000;
  int32_t splits = 32, one_wave = 16;
  void call() { (void)adaptive_active_splits(len_main, len_extra, splits, one_wave); }
  std::vector<uint8_t> outputs() const { return {}; }
};

TEST(BadInputs, AdaptiveActiveSplitsAndPlanHelpers) {
  using F = ActiveSplitsFixture;
  check_table<F>("adaptive_active_splits",
                 {
                     {"main length negative", [](F& f) { f.len_main = -1; }, {"len_main"}},
                     {"extra length negative", [](F& f) { f.len_extra = -1; }, {"len_extra"}},
                     {"splits 0", [](F& f) { f.splits = 0; }, {"splits"}},
                     {"one_wave 0", [](F& f) { f.one_wave = 0; }, {"one_wave"}},
                 });
  struct Iters {
    int64_t wm = 128, we = 512, s = 4;
    void call() { (void)plan_iters(wm, we, s); }
    std::vector<uint8_t> outputs() const { return {}; }
  };
  check_table<Iters>("plan_iters",
                     {
                         {"s 0", [](Iters& f) { f.s = 0; }, {"'s'"}},
                         {"main width negative", [](Iters& f) { f.wm = -5; }, {"width_main"}},
                         {"extra width negative", [](Iters& f) { f.we = -5; }, {"width_extra"}},
                     });
  struct HeadBlocks {
    int32_t H = 64;
    void call() { (void)plan_head_blocks(H); }
    std::vector<uint8_t> outputs() const { return {}; }
  };
  check_table<HeadBlocks>("plan_head_blocks",
                          {
                              {"H zero", [](HeadBlocks& f) { f.H = 0; }, {"num_heads"}},
                              {"H 200", [](HeadBlocks& f) { f.H = 200; }, {"num_heads"}},
                          });
  struct MaxCompressed {
    int64_t len = 1048576;
    int32_t ratio = 128;
    void call() { EXPECT_EQ(max_compressed_entries(len, ratio), 8192); }
    std::vector<uint8_t> outputs() const { return {}; }
  };
  check_table<MaxCompressed>(
      "max_compressed_entries",
      {
          {"length negative", [](MaxCompressed& f) { f.len = -1; }, {"max_model_len"}},
          {"ratio 0", [](MaxCompressed& f) { f.ratio = 0; }, {"ratio"}},
      });
}

struct RopeTableFixture {
  RopeConfig cfg = rope_config_compressed_layer();
  int64_t positions = 16;
  void call() { EXPECT_EQ(build_rope_table(cfg, positions).size(), size_t(16 * 64)); }
  std::vector<uint8_t> outputs() const { return {}; }
};

TEST(BadInputs, BuildRopeTable) {
  using F = RopeTableFixture;
  check_table<F>(
      "build_rope_table",
      {
          {"no positions", [](F& f) { f.positions = 0; }, {"positions"}},
          {"2^58 positions (P*64 would wrap size_t)",
           [](F& f) { f.positions = int64_t{1} << 58; },
           {"positions", "2^31"}},
          {"theta 1", [](F& f) { f.cfg.theta = 1.0; }, {"cfg.theta"}},
          {"theta NaN", [](F& f) { f.cfg.theta = std::nan(""); }, {"cfg.theta"}},
          {"theta inf", [](F& f) { f.cfg.theta = HUGE_VAL; }, {"cfg.theta"}},
          {"YaRN factor 0", [](F& f) { f.cfg.yarn_factor = 0.0; }, {"cfg.yarn_factor"}},
          {"YaRN original length 0",
           [](F& f) { f.cfg.yarn_original_len = 0; },
           {"cfg.yarn_original_len"}},
          {"YaRN beta_slow 0", [](F& f) { f.cfg.yarn_beta_slow = 0.0; }, {"cfg.yarn_beta_slow"}},
          {"YaRN beta_fast below beta_slow",
           [](F& f) { f.cfg.yarn_beta_fast = 0.5; },
           {"cfg.yarn_beta_fast"}},
      });
}

struct VerifyFixture {
  Rng rng{fresh_seed()};
  std::vector<bf16_bits> out = test::random_bf16(rng, 2 * 2 * 512);
  std::vector<double> ref = std::vector<double>(2 * 2 * 512, 0.25);
  std::vector<double> abs_mean = std::vector<double>(2 * 2 * 512, 0.5);
  const bf16_bits* o = out.data();
  const double* r = ref.data();
  const double* a = abs_mean.data();
  int64_t T = 2, stride_token = 1024, stride_head = 512;
  int32_t H = 2;
  void call() { (void)verify_decode_output(o, T, H, stride_token, stride_head, r, a); }
  std::vector<uint8_t> outputs() const { return {}; }
};

TEST(BadInputs, VerifyDecodeOutput) {
  using F = VerifyFixture;
  check_table<F>(
      "verify_decode_output",
      {
          {"T negative", [](F& f) { f.T = -1; }, {"num_tokens"}},
          {"H zero", [](F& f) { f.H = 0; }, {"num_heads"}},
          {"out null", [](F& f) { f.o = nullptr; }, {"'out'"}},
          {"ref null", [](F& f) { f.r = nullptr; }, {"'ref'"}},
          {"abs_mean null", [](F& f) { f.a = nullptr; }, {"'abs_mean'"}},
          {"head stride below a row", [](F& f) { f.stride_head = 0; }, {"out_stride_head"}},
          {"token stride below a row", [](F& f) { f.stride_token = 0; }, {"out_stride_token"}},
      });
}

TEST(BadInputs, PathsAndArchitectureGate) {
  struct ParsePath {
    std::string name = "cuda-sm90";
    void call() { EXPECT_EQ(parse_path(name), Path::CudaSm90); }
    std::vector<uint8_t> outputs() const { return {}; }
  };
  check_table<ParsePath>(
      "parse_path",
      {
          {"unknown name", [](ParsePath& f) { f.name = "bogus"; }, {"name", "cpu", "bogus"}},
          {"empty name", [](ParsePath& f) { f.name = ""; }, {"name"}},
          {"wrong case", [](ParsePath& f) { f.name = "CPU"; }, {"name", "CPU"}},
      });
  struct Gate {
    ArchGateInputs in{9, 0, true, true, Path::CudaSm90};
    void call() { EXPECT_EQ(select_gpu_path(in), Path::CudaSm90); }
    std::vector<uint8_t> outputs() const { return {}; }
  };
  check_table<Gate>(
      "select_gpu_path",
      {
          {"forced sm90 on cc 8.0", [](Gate& f) { f.in.cc_major = 8; }, {"path", "cc 8.0"}},
          {"forced sm90 on cc 10.0", [](Gate& f) { f.in.cc_major = 10; }, {"path", "cc 10.0"}},
          {"forced sm90 without sm_90a kernels",
           [](Gate& f) { f.in.have_sm90a_kernels = false; },
           {"path"}},
          {"forced sm90 on unaligned caches",
           [](Gate& f) { f.in.caches_fast_aligned = false; },
           {"path", "aligned"}},
      });
}

}  // namespace
}  // namespace sparsemla
