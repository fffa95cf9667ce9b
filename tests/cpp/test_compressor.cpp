// Compressor state writer, KV compressor (r=4 with overlap, r=128) and indexer compressor
// (CONTRACT 3.2) on the CPU, against the float64 reference of
// tests/cpp/reference/writer_reference.h, with the tolerance rules of CONTRACT 9.3; the two-stage
// form byte for byte against the single pass; and the sanitising contract of CONTRACT 5 on poisoned
// inputs.
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

std::vector<int32_t> shuffled_ids(Rng& rng, int64_t n) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng.engine());
  return ids;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// A batch for the compressor: R requests with context lengths L_r, a state cache holding every
// row of positions < L_r (reached through a shuffled state block table with padded strides; all
// padding NaN), and one chunk of consecutive positions per request ending at L_r - 1 (MTP-sized for
// short chunks, a prefill chunk for long ones), tokens shuffled across requests.
struct Scenario {
  int32_t ratio = 4, head_dim = 512, state_bs = 1;
  // state cache
  std::vector<float> state;
  int64_t num_state_blocks = 0, row_stride = 0, block_stride = 0;
  std::vector<int32_t> table;
  int64_t table_stride = 0;
  int32_t table_width = 0;
  std::vector<int64_t> context;
  // compressed destination: entry j of request r -> ctable[r][j / cbs] * cbs + j % cbs
  int32_t cbs = 1;
  int64_t num_cblocks = 0, ctable_width = 0;
  std::vector<int32_t> ctable;
  int32_t spare_cblock = 0;  // a block no entry maps to
  // tokens
  std::vector<int64_t> positions, state_slots, out_slots;
  std::vector<int32_t> requests;
  RopeBuffer rope;
  std::vector<float> norm_weight;
  bool sanitise = true;

  int64_t width() const { return (ratio == 4 ? 2 : 1) * int64_t{head_dim}; }
  int64_t num_requests() const { return static_cast<int64_t>(context.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(positions.size()); }
  StateCacheView state_view() {
    return {state.data(), num_state_blocks, state_bs, block_stride, row_stride};
  }
  int64_t state_slot_of(int32_t req, int64_t pos) const {
    return int64_t{table[req * table_stride + pos / state_bs]} * state_bs + pos % state_bs;
  }
  float* state_row(int32_t req, int64_t pos) {
    const int64_t slot = state_slot_of(req, pos);
    return state.data() + (slot / state_bs) * block_stride + (slot % state_bs) * row_stride;
  }
  int64_t out_slot_of(int32_t req, int64_t entry) const {
    return int64_t{ctable[req * ctable_width + entry / cbs]} * cbs + entry % cbs;
  }
  bool completes(int64_t i) const { return positions[i] % ratio == ratio - 1; }

  template <typename Params>
  void fill_common(Params& p) {
    p.num_tokens = num_tokens();
    p.positions = positions.data();
    p.request_index = requests.data();
    p.state_slots = state_slots.data();
    p.out_slots = out_slots.data();
    p.state_block_table = table.data();
    p.state_table_stride = table_stride;
    p.state_table_width = table_width;
    p.num_requests = num_requests();
    p.state = state_view();
    p.norm_weight = norm_weight.data();
    p.rope = rope.table();
    p.sanitise = sanitise;
    p.path = Path::Cpu;
  }
  CompressorParams params(MlaCacheBuffer& cache, float* scratch = nullptr) {
    CompressorParams p;
    fill_common(p);
    p.ratio = ratio;
    p.cache = cache.view();
    p.scratch = scratch;
    return p;
  }
  IndexerCompressorParams indexer_params(IndexerCacheBuffer& cache, float* scratch = nullptr) {
    IndexerCompressorParams p;
    fill_common(p);
    p.cache = cache.view();
    p.scratch = scratch;
    return p;
  }
  MlaCacheBuffer mla_cache(Rng& rng) {
    const int64_t raw = int64_t{cbs} * 584;
    const int64_t stride = rng.randint(0, 1) ? raw : (raw + 575) / 576 * 576 + 576;
    return random_mla_cache(rng, num_cblocks, cbs, stride);
  }
  IndexerCacheBuffer indexer_cache(Rng& rng) {
    const int64_t stride = int64_t{cbs} * 132 + (rng.randint(0, 1) ? 0 : 64);
    return random_indexer_cache(rng, num_cblocks, cbs, stride, IndexerLayout::Normal);
  }
};

// `max_chunk`: the longest chunk of one request in the batch (1..3 is MTP-like).
Scenario make_scenario(Rng& rng, int32_t ratio, int32_t head_dim, int32_t state_bs, int32_t cbs,
                       int64_t max_chunk) {
  Scenario s;
  s.ratio = ratio;
  s.head_dim = head_dim;
  s.state_bs = state_bs;
  s.cbs = cbs;
  const int64_t num_requests = rng.randint(2, 4);
  std::vector<int64_t> chunk(num_requests);
  for (int64_t r = 0; r < num_requests; ++r) {
    // Request 0 completes its first entry (for r=4 its window reaches positions < 0); the others
    // complete entry k-1 somewhere inside their chunk.
    const int64_t k = r == 0 ? 1 : rng.randint(1, ratio == 4 ? 40 : 4);
    chunk[r] = rng.randint(1, max_chunk);
    s.context.push_back(ratio * k + rng.randint(0, chunk[r] - 1));
    chunk[r] = std::min(chunk[r], s.context[r]);
  }
  const int64_t max_len = *std::max_element(s.context.begin(), s.context.end());

  // State cache and its block table (padded rows, blocks and table rows).
  s.row_stride = 2 * s.width() + (rng.randint(0, 1) ? 0 : 3);
  s.block_stride = state_bs * s.row_stride + (rng.randint(0, 1) ? 0 : 5);
  s.table_width = static_cast<int32_t>(ceil_div(max_len, state_bs) + 1);
  s.table_stride = s.table_width + 3;
  int64_t needed = 0;
  for (int64_t len : s.context) needed += ceil_div(len, state_bs);
  s.num_state_blocks = needed + 2;
  const auto block_ids = shuffled_ids(rng, s.num_state_blocks);
  s.table.assign(num_requests * s.table_stride, -1);
  int64_t next = 0;
  for (int64_t r = 0; r < num_requests; ++r) {
    for (int64_t c = 0; c < ceil_div(s.context[r], state_bs); ++c) {
      s.table[r * s.table_stride + c] = block_ids[next++];
    }
  }
  s.state.assign(s.num_state_blocks * s.block_stride, kNaN);
  for (int32_t r = 0; r < num_requests; ++r) {
    const double kv_sigma = std::ldexp(1.0, static_cast<int>(rng.randint(-6, 6)));
    for (int64_t q = 0; q < s.context[r]; ++q) {
      float* row = s.state_row(r, q);
      for (int64_t j = 0; j < s.width(); ++j) {
        row[j] = static_cast<float>(rng.normal() * kv_sigma);
        row[s.width() + j] = static_cast<float>(rng.normal() * 2.0);
      }
    }
  }

  // Compressed destination.
  s.ctable_width = ceil_div(max_len / ratio + 1, cbs);
  s.num_cblocks = num_requests * s.ctable_width + 1;
  const auto cblock_ids = shuffled_ids(rng, s.num_cblocks);
  s.ctable.assign(cblock_ids.begin(), cblock_ids.end() - 1);
  s.spare_cblock = cblock_ids.back();

  // Tokens.
  for (int32_t r = 0; r < num_requests; ++r) {
    for (int64_t pos = s.context[r] - chunk[r]; pos < s.context[r]; ++pos) {
      s.positions.push_back(pos);
      s.requests.push_back(r);
    }
  }
  const auto order = shuffled_ids(rng, s.num_tokens());
  std::vector<int64_t> positions(s.num_tokens());
  std::vector<int32_t> requests(s.num_tokens());
  for (int64_t i = 0; i < s.num_tokens(); ++i) {
    positions[i] = s.positions[order[i]];
    requests[i] = s.requests[order[i]];
  }
  s.positions = positions;
  s.requests = requests;
  for (int64_t i = 0; i < s.num_tokens(); ++i) {
    const int32_t r = s.requests[i];
    const int64_t pos = s.positions[i];
    s.state_slots.push_back(rng.randint(0, 9) == 0 ? -1 : s.state_slot_of(r, pos));
    int64_t out = -1;
    if (s.completes(i)) {
      if (rng.randint(0, 9) != 0) out = s.out_slot_of(r, pos / ratio);
    } else if (rng.randint(0, 1) == 0) {
      out = int64_t{s.spare_cblock} * cbs + rng.randint(0, cbs - 1);  // must stay untouched
    }
    s.out_slots.push_back(out);
  }
  // Request 0's tokens always reach the state and its completing token is always stored, so every
  // batch stores an entry whose window holds only written rows (with a skipped token in that
  // window the entry pools NaN, and a batch could then have nothing finite to compare).
  for (int64_t i = 0; i < s.num_tokens(); ++i) {
    if (s.requests[i] != 0) continue;
    s.state_slots[i] = s.state_slot_of(0, s.positions[i]);
    if (s.completes(i)) s.out_slots[i] = s.out_slot_of(0, s.positions[i] / ratio);
  }

  s.rope = random_rope(rng, max_len + 1, rng.randint(0, 1) ? 64 : 72);
  for (int d = 0; d < head_dim; ++d) {
    s.norm_weight.push_back(static_cast<float>(1.0 + 0.25 * rng.normal()));
  }
  return s;
}

template <typename Entries>
std::vector<int64_t> slots_of(const Entries& entries) {
  std::vector<int64_t> slots;
  for (const auto& e : entries) slots.push_back(e.slot);
  return slots;
}

std::string shape_name(int32_t ratio, int32_t state_bs, int32_t cbs) {
  return "ratio=" + std::to_string(ratio) + " state_bs=" + std::to_string(state_bs) +
         " cbs=" + std::to_string(cbs);
}

// ---- state writer
// --------------------------------------------------------------------------------

TEST(CompressorStateWriterCpu, StoresKvAndBiasedScoreStateBs1_4_8PaddedStrides) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  struct Shape {
    int32_t ratio, head_dim;
  };
  for (Shape shape : {Shape{4, 512}, Shape{128, 512}, Shape{4, 128}}) {
    for (int32_t bs : {1, 4, 8}) {
      for (bool with_ape : {false, true}) {
        SCOPED_TRACE(shape_name(shape.ratio, bs, 0) + " head_dim=" +
                     std::to_string(shape.head_dim) + (with_ape ? " ape" : " no ape"));
        const int64_t w = (shape.ratio == 4 ? 2 : 1) * int64_t{shape.head_dim};
        StateCacheView view;
        view.num_blocks = 5;
        view.block_size = bs;
        view.row_stride = 2 * w + 3;
        view.block_stride = bs * view.row_stride + 7;
        std::vector<float> state = random_f32(rng, view.num_blocks * view.block_stride);
        const std::vector<float> before = state;
        view.base = state.data();
        const int64_t n = std::min<int64_t>(12, view.num_blocks * bs);
        const auto slot_ids = shuffled_ids(rng, view.num_blocks * bs);
        std::vector<int64_t> slots, positions;
        for (int64_t i = 0; i < n; ++i) {
          slots.push_back(rng.randint(0, 4) == 0 ? -1 : slot_ids[i]);
          positions.push_back(rng.randint(0, 1000));
        }
        const int64_t kv_stride = w + 2, score_stride = w + 5;
        const auto kv = random_f32(rng, n * kv_stride);
        const auto score = random_f32(rng, n * score_stride, 2.0);
        const auto ape = random_f32(rng, shape.ratio * w, 0.5);

        StateWriterParams p;
        p.num_tokens = n;
        p.ratio = shape.ratio;
        p.head_dim = shape.head_dim;
        p.kv = kv.data();
        p.kv_stride = kv_stride;
        p.score = score.data();
        p.score_stride = score_stride;
        p.ape = with_ape ? ape.data() : nullptr;
        p.positions = positions.data();
        p.state_slots = slots.data();
        p.state = view;
        p.path = Path::Cpu;
        write_compressor_state(p);

        std::vector<float> want = before;  // the contract's formula, element by element
        for (int64_t i = 0; i < n; ++i) {
          if (slots[i] < 0) continue;
          float* row =
              want.data() + (slots[i] / bs) * view.block_stride + (slots[i] % bs) * view.row_stride;
          for (int64_t j = 0; j < w; ++j) {
            row[j] = kv[i * kv_stride + j];
            const float bias = with_ape ? ape[(positions[i] % shape.ratio) * w + j] : 0.0f;
            row[w + j] =
                with_ape ? score[i * score_stride + j] + bias : score[i * score_stride + j];
          }
        }
        ASSERT_EQ(std::memcmp(want.data(), state.data(), state.size() * sizeof(float)), 0);
      }
    }
  }
}

// ---- KV compressor vs the float64 reference
// ------------------------------------------------------

void expect_compressor_matches_reference(Rng& rng, int32_t ratio, int64_t max_chunk,
                                         ref::Agreement& agreement) {
  for (int32_t state_bs : {1, 4, 8}) {
    const int32_t cbs = std::vector<int32_t>{1, 2, 16, 61, 64}[rng.randint(0, 4)];
    SCOPED_TRACE(shape_name(ratio, state_bs, cbs));
    Scenario s = make_scenario(rng, ratio, 512, state_bs, cbs, max_chunk);
    s.sanitise = rng.randint(0, 1) == 1;
    MlaCacheBuffer cache = s.mla_cache(rng);
    const std::vector<uint8_t> before = cache.bytes;
    const CompressorParams p = s.params(cache);
    compress(p);
    const auto expected = ref::compress(p);
    ASSERT_FALSE(expected.empty());
    for (const auto& e : expected) {
      EXPECT_TRUE(ref::mla_row_close(e.row, cache.data(e.slot), cache.scale(e.slot)))
          << "token " << e.token << " position " << s.positions[e.token] << " slot " << e.slot;
      agreement.add(e.row, cache.data(e.slot), cache.scale(e.slot));
    }
    EXPECT_TRUE(only_rows_changed(before, cache, slots_of(expected)));
  }
}

TEST(CompressorCpu, Ratio4OverlapMatchesFloat64ReferenceStateBs1_4_8) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  ref::Agreement agreement;
  expect_compressor_matches_reference(rng, 4, 3, agreement);   // MTP-sized chunks
  expect_compressor_matches_reference(rng, 4, 40, agreement);  // prefill chunks
  EXPECT_TRUE(agreement.at_least(0.99));
}

TEST(CompressorCpu, Ratio128MatchesFloat64ReferenceStateBs1_4_8) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  ref::Agreement agreement;
  expect_compressor_matches_reference(rng, 128, 3, agreement);
  expect_compressor_matches_reference(rng, 128, 200, agreement);
  EXPECT_TRUE(agreement.at_least(0.99));
}

TEST(CompressorCpu, TwoStageIsByteIdenticalToSinglePassRatio4AndRatio128) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t ratio : {4, 128}) {
    for (int32_t state_bs : {1, 4, 8}) {
      SCOPED_TRACE(shape_name(ratio, state_bs, 16));
      Scenario s = make_scenario(rng, ratio, 512, state_bs, 16, ratio == 4 ? 24 : 200);
      s.sanitise = rng.randint(0, 1) == 1;
      MlaCacheBuffer single = s.mla_cache(rng);
      MlaCacheBuffer two_stage = single;
      std::vector<float> scratch(s.num_tokens() * 512, kNaN);
      compress(s.params(single));
      compress(s.params(two_stage, scratch.data()));
      const auto expected = ref::compress(s.params(single));
      ASSERT_FALSE(expected.empty());
      EXPECT_EQ(single.bytes, two_stage.bytes) << "whole caches differ";
    }
  }
}

TEST(CompressorCpu, RopeUsesWindowStartPositionNotTokenPosition) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t ratio : {4, 128}) {
    SCOPED_TRACE("ratio=" + std::to_string(ratio));
    Scenario s = make_scenario(rng, ratio, 512, 4, 16, ratio == 4 ? 12 : 160);
    // Only window-start rows (multiples of r) hold a table; any other row read gives NaN RoPE.
    for (int64_t pos = 0; pos < s.rope.rows; ++pos) {
      if (pos % ratio != 0) std::fill_n(s.rope.row(pos), 64, kNaN);
    }
    s.sanitise = false;  // a NaN would be stored as NaN, not hidden as 0
    MlaCacheBuffer cache = s.mla_cache(rng);
    const CompressorParams p = s.params(cache);
    compress(p);
    const auto expected = ref::compress(p);
    ASSERT_FALSE(expected.empty());
    for (const auto& e : expected) {
      EXPECT_TRUE(ref::mla_row_close(e.row, cache.data(e.slot), cache.scale(e.slot)))
          << "position " << s.positions[e.token];
    }
  }
}

TEST(CompressorCpu, StateWriterThenCompressInOneMtpBatch) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t ratio : {4, 128}) {
    SCOPED_TRACE("ratio=" + std::to_string(ratio));
    Scenario s = make_scenario(rng, ratio, 512, ratio == 4 ? 4 : 8, 2, 3);
    // The batch's own rows are not in the state yet: the state writer stores them first.
    std::vector<float> want_state = s.state;
    for (int64_t i = 0; i < s.num_tokens(); ++i) {
      std::fill_n(s.state_row(s.requests[i], s.positions[i]), 2 * s.width(), kNaN);
    }
    const int64_t w = s.width();
    const auto kv = random_f32(rng, s.num_tokens() * w);
    const auto score = random_f32(rng, s.num_tokens() * w, 2.0);
    const auto ape = random_f32(rng, ratio * w, 0.5);
    StateWriterParams sw;
    sw.num_tokens = s.num_tokens();
    sw.ratio = ratio;
    sw.kv = kv.data();
    sw.kv_stride = w;
    sw.score = score.data();
    sw.score_stride = w;
    sw.ape = ape.data();
    sw.positions = s.positions.data();
    sw.state_slots = s.state_slots.data();
    sw.state = s.state_view();
    sw.path = Path::Cpu;
    write_compressor_state(sw);

    // Expected state: skipped tokens (state slot < 0) keep the NaN rows and are not compressed.
    for (int64_t i = 0; i < s.num_tokens(); ++i) {
      const int64_t slot = s.state_slot_of(s.requests[i], s.positions[i]);
      float* row = want_state.data() + (slot / s.state_bs) * s.block_stride +
                   (slot % s.state_bs) * s.row_stride;
      for (int64_t j = 0; j < w; ++j) {
        const bool written = s.state_slots[i] >= 0;
        row[j] = written ? kv[i * w + j] : kNaN;
        row[w + j] = written ? score[i * w + j] + ape[(s.positions[i] % ratio) * w + j] : kNaN;
      }
    }
    ASSERT_EQ(std::memcmp(want_state.data(), s.state.data(), s.state.size() * sizeof(float)), 0);

    MlaCacheBuffer cache = s.mla_cache(rng);
    const std::vector<uint8_t> before = cache.bytes;
    const CompressorParams p = s.params(cache);
    compress(p);
    // A completing token whose window holds a skipped token's NaN row pools NaN; the reference
    // reads the same state, so compare only the entries whose rows are all finite.
    const auto expected = ref::compress(p);
    ASSERT_FALSE(expected.empty());
    int compared = 0;
    for (const auto& e : expected) {
      const bool finite = std::all_of(e.row.nope.begin(), e.row.nope.end(),
                                      [](double v) { return std::isfinite(v); });
      if (!finite) continue;
      ++compared;
      EXPECT_TRUE(ref::mla_row_close(e.row, cache.data(e.slot), cache.scale(e.slot)))
          << "token " << e.token << " position " << s.positions[e.token];
    }
    EXPECT_GT(compared, 0);
    EXPECT_TRUE(only_rows_changed(before, cache, slots_of(expected)));
  }
}

// ---- sanitising contract on poisoned inputs (CONTRACT 5)
// ---------------------------------------------

TEST(CompressorCpu, SanitisingModeOnPoisonedInputsEqualsScrubbedLegacyRows) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t ratio : {4, 128}) {
    SCOPED_TRACE("ratio=" + std::to_string(ratio));
    Scenario s = make_scenario(rng, ratio, 512, 4, 16, ratio == 4 ? 24 : 160);
    // inf / NaN norm weights in NoPE and RoPE dims: +-inf tiles and NaN elements in every entry.
    s.norm_weight[3] = kInf;
    s.norm_weight[70] = kNaN;
    s.norm_weight[200] = -kInf;
    s.norm_weight[460] = kNaN;
    s.norm_weight[470] = kInf;
    // +-inf / NaN state elements (kv and score) in request 1's rows: NaN entries there.
    for (int64_t q = 0; q < s.context[1]; q += 3) {
      float* row = s.state_row(1, q);
      row[rng.randint(0, s.width() - 1)] = kInf;
      row[rng.randint(0, s.width() - 1)] = -kInf;
      row[rng.randint(0, s.width() - 1)] = kNaN;
      row[s.width() + rng.randint(0, s.width() - 1)] = kInf;
      row[s.width() + rng.randint(0, s.width() - 1)] = kNaN;
    }
    // NaN RoPE: a NaN cos or sin in every window-start row.
    for (int64_t pos = 0; pos < s.rope.rows; pos += ratio)
      s.rope.row(pos)[rng.randint(0, 63)] = kNaN;

    MlaCacheBuffer legacy = s.mla_cache(rng);
    MlaCacheBuffer sanitised = legacy;
    s.sanitise = false;
    compress(s.params(legacy));
    s.sanitise = true;
    compress(s.params(sanitised));
    const auto slots = slots_of(ref::compress(s.params(sanitised)));
    ASSERT_FALSE(slots.empty());
    EXPECT_GT(check_sanitised_equivalence(legacy, sanitised, slots), 0)
        << "the poison never produced a NaN in the legacy rows: the test would prove nothing";
    int code255 = 0;
    for (int64_t slot : slots) {
      for (int t = 0; t < 7; ++t) code255 += legacy.scale(slot)[t] == 255 ? 1 : 0;
    }
    EXPECT_GT(code255, 0) << "no +-inf tile in the legacy rows";
  }
}

// ---- indexer compressor
// --------------------------------------------------------------------------

TEST(IndexerCompressorCpu, MatchesFloat64ReferenceStateBs1_4_8NormalLayout) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  ref::Agreement agreement;
  for (int32_t state_bs : {1, 4, 8}) {
    for (int32_t cbs : {1, 16, 64}) {
      SCOPED_TRACE(shape_name(4, state_bs, cbs));
      Scenario s = make_scenario(rng, 4, 128, state_bs, cbs, rng.randint(0, 1) ? 3 : 30);
      s.sanitise = rng.randint(0, 1) == 1;
      IndexerCacheBuffer cache = s.indexer_cache(rng);
      const std::vector<uint8_t> before = cache.bytes;
      const IndexerCompressorParams p = s.indexer_params(cache);
      compress_indexer(p);
      const auto expected = ref::compress_indexer(p);
      ASSERT_FALSE(expected.empty());
      for (const auto& e : expected) {
        EXPECT_TRUE(ref::indexer_row_close(e.row, cache.normal_values(e.slot), cache.scale(e.slot)))
            << "token " << e.token << " position " << s.positions[e.token];
        agreement.add(e.row, cache.normal_values(e.slot), cache.scale(e.slot));
      }
      EXPECT_TRUE(only_rows_changed(before, cache, slots_of(expected)));
    }
  }
  EXPECT_TRUE(agreement.at_least(0.99));
}

TEST(IndexerCompressorCpu, TwoStageIsByteIdenticalToSinglePass) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t state_bs : {1, 4, 8}) {
    SCOPED_TRACE(shape_name(4, state_bs, 16));
    Scenario s = make_scenario(rng, 4, 128, state_bs, 16, 30);
    IndexerCacheBuffer single = s.indexer_cache(rng);
    IndexerCacheBuffer two_stage = single;
    std::vector<float> scratch(s.num_tokens() * 128, kNaN);
    compress_indexer(s.indexer_params(single));
    compress_indexer(s.indexer_params(two_stage, scratch.data()));
    ASSERT_FALSE(ref::compress_indexer(s.indexer_params(single)).empty());
    EXPECT_EQ(single.bytes, two_stage.bytes);
  }
}

TEST(IndexerCompressorCpu, SanitisingZeroesNaNRopeBeforeQuantising) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  Scenario s = make_scenario(rng, 4, 128, 4, 16, 30);
  constexpr int kPair = 5;  // cos of pair 5 is NaN in every window-start row: dims 74, 75 NaN
  for (int64_t pos = 0; pos < s.rope.rows; pos += 4) s.rope.row(pos)[kPair] = kNaN;
  IndexerCacheBuffer legacy = s.indexer_cache(rng);
  IndexerCacheBuffer sanitised = legacy;
  s.sanitise = false;
  compress_indexer(s.indexer_params(legacy));
  s.sanitise = true;
  compress_indexer(s.indexer_params(sanitised));
  const auto expected = ref::compress_indexer(s.indexer_params(sanitised));
  ASSERT_FALSE(expected.empty());
  for (const auto& e : expected) {
    SCOPED_TRACE("slot " + std::to_string(e.slot));
    const uint8_t* clean = sanitised.normal_values(e.slot);
    const uint8_t* raw = legacy.normal_values(e.slot);
    for (int d = 0; d < 128; ++d) {
      EXPECT_NE(clean[d] & 0x7F, 0x7F) << d;
      EXPECT_NE(raw[d] & 0x7F, 0x7F) << d;
      const bool nan_dim = d == 64 + 2 * kPair || d == 65 + 2 * kPair;
      EXPECT_EQ(clean[d], nan_dim ? 0x00 : raw[d]) << d;  // NaN -> 0 -> byte 0; the rest unchanged
      if (nan_dim) {
        EXPECT_EQ(raw[d], 0xFE) << d;  // legacy: NaN -> -448
      }
    }
    EXPECT_EQ(sanitised.scale(e.slot), legacy.scale(e.slot));  // NaN never counts in amax
    EXPECT_TRUE(ref::indexer_row_close(e.row, clean, sanitised.scale(e.slot)));
  }
}

// ---- validation
// ----------------------------------------------------------------------------------

// A small valid ratio-4 batch and the index of a token that stores an entry.
struct CompressorValidateFixture {
  Rng rng{fresh_seed()};
  Scenario s = make_scenario(rng, 4, 512, 4, 16, 12);
  MlaCacheBuffer cache = s.mla_cache(rng);
  std::vector<uint8_t> before = cache.bytes;
  int64_t storing = last_storing_token();

  int64_t last_storing_token() const {
    int64_t k = -1;
    for (int64_t i = 0; i < s.num_tokens(); ++i) {
      if (s.state_slots[i] >= 0 && s.out_slots[i] >= 0 && s.completes(i)) k = i;
    }
    return k;
  }
  std::string at(const char* name) const {
    return "'" + std::string(name) + "[" + std::to_string(storing) + "]'";
  }
};

TEST(CompressorValidate, RequestIndexOutOfRangeNamesTokenAndWritesNothing) {
  CompressorValidateFixture f;
  ASSERT_GE(f.storing, 0);
  f.s.requests[f.storing] = static_cast<int32_t>(f.s.num_requests());
  expect_error_naming([&] { compress(f.s.params(f.cache)); }, f.at("request_index"));
  f.s.requests[f.storing] = -1;
  expect_error_naming([&] { compress(f.s.params(f.cache)); }, f.at("request_index"));
  EXPECT_EQ(f.cache.bytes, f.before);
}

TEST(CompressorValidate, StateBlockIdOutsideStateCacheNamesTableEntry) {
  CompressorValidateFixture f;
  ASSERT_GE(f.storing, 0);
  const int32_t req = f.s.requests[f.storing];
  const int64_t col = f.s.positions[f.storing] / f.s.state_bs;
  f.s.table[req * f.s.table_stride + col] = static_cast<int32_t>(f.s.num_state_blocks);
  expect_error_naming(
      [&] { compress(f.s.params(f.cache)); },
      "'state_block_table[" + std::to_string(req) + "][" + std::to_string(col) + "]'");
  EXPECT_EQ(f.cache.bytes, f.before);
}

TEST(CompressorValidate, OutAndStateSlotsBeyondTheirCachesNameTheToken) {
  CompressorValidateFixture f;
  ASSERT_GE(f.storing, 0);
  const int64_t out = f.s.out_slots[f.storing];
  f.s.out_slots[f.storing] = f.cache.capacity();
  expect_error_naming([&] { compress(f.s.params(f.cache)); }, f.at("out_slots"));
  f.s.out_slots[f.storing] = out;
  f.s.state_slots[f.storing] = f.s.num_state_blocks * f.s.state_bs;
  expect_error_naming([&] { compress(f.s.params(f.cache)); }, f.at("state_slots"));
  EXPECT_EQ(f.cache.bytes, f.before);
}

TEST(CompressorValidate, WindowStartOutsideRopeTableNamesPositions) {
  CompressorValidateFixture f;
  ASSERT_GE(f.storing, 0);
  // Still completing an entry (pos % 4 == 3), but its window start 4*rows is outside the table.
  f.s.positions[f.storing] = 4 * f.s.rope.rows + 3;
  expect_error_naming([&] { compress(f.s.params(f.cache)); }, f.at("positions"));
  EXPECT_EQ(f.cache.bytes, f.before);
}

TEST(CompressorValidate, RatioStridesAndPointersNameTheArgument) {
  CompressorValidateFixture f;
  const auto p = f.s.params(f.cache);
  auto q = p;
  q.ratio = 8;
  expect_error_naming([&] { compress(q); }, "'ratio'");
  q = p;
  q.norm_weight = nullptr;
  expect_error_naming([&] { compress(q); }, "'norm_weight'");
  q = p;
  q.state.row_stride = 2 * 1024 - 1;
  expect_error_naming([&] { compress(q); }, "'state.row_stride'");
  q = p;
  q.state_table_stride = q.state_table_width - 1;
  expect_error_naming([&] { compress(q); }, "'state_table_stride'");
  q = p;
  q.out_slots = nullptr;
  expect_error_naming([&] { compress(q); }, "'out_slots'");
  q = p;
  q.cache.block_stride = 16 * 584 - 8;
  expect_error_naming([&] { compress(q); }, "'cache.block_stride'");
  EXPECT_EQ(f.cache.bytes, f.before);
}

TEST(IndexerCompressorValidate, RejectsShuffleLayoutAndOutSlotsBeyondCache) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  Scenario s = make_scenario(rng, 4, 128, 4, 16, 12);
  IndexerCacheBuffer cache = s.indexer_cache(rng);
  const std::vector<uint8_t> before = cache.bytes;
  auto p = s.indexer_params(cache);
  p.cache.layout = IndexerLayout::Shuffle;
  expect_error_naming([&] { compress_indexer(p); }, "'cache.layout'");
  for (int64_t i = 0; i < s.num_tokens(); ++i) {
    if (s.state_slots[i] >= 0 && s.out_slots[i] >= 0 && s.completes(i)) {
      s.out_slots[i] = cache.capacity() + 3;
      expect_error_naming([&] { compress_indexer(s.indexer_params(cache)); },
                          "'out_slots[" + std::to_string(i) + "]'");
      break;
    }
  }
  EXPECT_EQ(cache.bytes, before);
}

TEST(StateWriterValidate, BadSlotsPositionsAndShapesNameTheArgument) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  StateCacheView view{nullptr, 3, 4, 4 * 2048, 2048};
  std::vector<float> state = random_f32(rng, 3 * 4 * 2048);
  const std::vector<float> before = state;
  view.base = state.data();
  const auto kv = random_f32(rng, 3 * 1024), score = random_f32(rng, 3 * 1024);
  std::vector<int64_t> slots = {0, 5, 12}, positions = {0, 1, 2};  // capacity 3*4 = 12
  StateWriterParams p;
  p.num_tokens = 3;
  p.kv = kv.data();
  p.kv_stride = 1024;
  p.score = score.data();
  p.score_stride = 1024;
  p.positions = positions.data();
  p.state_slots = slots.data();
  p.state = view;
  p.path = Path::Cpu;
  expect_error_naming([&] { write_compressor_state(p); }, "'state_slots[2]'");
  slots[2] = 11;
  positions[1] = -4;
  expect_error_naming([&] { write_compressor_state(p); }, "'positions[1]'");
  EXPECT_EQ(std::memcmp(before.data(), state.data(), state.size() * sizeof(float)), 0)
      << "token 0 was valid but must not be written";
  positions[1] = 1;
  auto q = p;
  q.head_dim = 128;
  q.ratio = 128;
  expect_error_naming([&] { write_compressor_state(q); }, "'ratio'");
  q = p;
  q.head_dim = 256;
  expect_error_naming([&] { write_compressor_state(q); }, "'head_dim'");
  q = p;
  q.score_stride = 1000;
  expect_error_naming([&] { write_compressor_state(q); }, "'score_stride'");
  q = p;
  q.state.block_stride = 4 * 2048 - 1;
  expect_error_naming([&] { write_compressor_state(q); }, "'state.block_stride'");
}

}  // namespace
}  // namespace sparsemla::test
