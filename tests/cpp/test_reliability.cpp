// Reliability on the CPU (issue 7): the committed fuzz corpora replayed through the fuzz targets
// (and fresh random inputs), regression tests of what fuzzing found, deterministic (batch
// invariant) decode, and NaN provenance end to end (CONTRACT 5: sanitising compressor -> cache ->
// decode with and without the scrub).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "reference/decode_fixture.h"
#include "reference/random.h"
#include "reference/reliability_fixture.h"
#include "sparsemla/decode.h"
#include "sparsemla/error.h"
#include "sparsemla/lists.h"
#include "sparsemla/plan.h"
#include "sparsemla/writer.h"

namespace sparsemla::test {
namespace {

using decode::CacheSpec;
using decode::TestCache;
using decode::TestList;
using reliability::Batch;
using reliability::CompressorInputs;
using reliability::count_value_differences;
using reliability::Poison;
using reliability::RowPool;

// ---- fuzz corpora
// --------------------------------------------------------------------------------
struct FuzzTarget {
  const char* name;
  int (*run)(const uint8_t*, size_t);
};
const FuzzTarget kTargets[] = {
    {"fuzz_builders", fuzz::run_builders},
    {"fuzz_gather", fuzz::run_gather},
    {"fuzz_decode", fuzz::run_decode},
    {"fuzz_dequantize_row", fuzz::run_dequantize_row},
    {"fuzz_window_writer", fuzz::run_window_writer},
    {"fuzz_state_writer", fuzz::run_state_writer},
    {"fuzz_compress", fuzz::run_compress},
    {"fuzz_compress_indexer", fuzz::run_compress_indexer},
    {"fuzz_inverse_rope", fuzz::run_inverse_rope},
    {"fuzz_indexer", fuzz::run_indexer},
};

// Runs one input; a broken property (fuzz::Broken) or any other escaping exception fails.
void run_input(const FuzzTarget& target, const std::vector<uint8_t>& bytes,
               const std::string& what) {
  try {
    target.run(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    ADD_FAILURE() << target.name << " on " << what << ": " << e.what();
  }
}

// Every committed corpus file (fuzz/corpus/<target>/) and the empty input run clean through the
// target bodies: crashes found by fuzzing stay fixed (their inputs are committed there), and the
// ASan/UBSan build replays them under the sanitizers.
TEST(FuzzCorpus, CommittedInputsReplayCleanly) {
  namespace fs = std::filesystem;
  int64_t total = 0;
  for (const FuzzTarget& t : kTargets) {
    const fs::path dir = fs::path(SPARSEMLA_FUZZ_CORPUS_DIR) / t.name;
    ASSERT_TRUE(fs::is_directory(dir)) << "no committed corpus for " << t.name << " in " << dir;
    int64_t files = 0;
    run_input(t, {}, "the empty input");
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream f(entry.path(), std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                                       std::istreambuf_iterator<char>());
      run_input(t, bytes, entry.path().string());
      ++files;
    }
    EXPECT_GE(files, 4) << t.name << ": the seed corpus should hold a few inputs";
    std::printf("[ fuzz corpus ] %-22s %4lld inputs replayed\n", t.name,
                static_cast<long long>(files));
    total += files;
  }
  RecordProperty("corpus_inputs", static_cast<int>(total));
}

// Fresh random inputs (a few hundred per target) through the same bodies: a small fuzz run in
// every test build, including gcc builds without libFuzzer.
TEST(FuzzCorpus, FreshRandomInputsRunCleanly) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (const FuzzTarget& t : kTargets) {
    // The decode and the compressors (ratio-128 windows pool 128 state rows) cost the most per
    // input.
    const std::string name = t.name;
    const int n = name == "fuzz_decode" ? 150 : name.rfind("fuzz_compress", 0) == 0 ? 60 : 400;
    for (int i = 0; i < n; ++i) {
      const auto bytes = random_bytes(rng, static_cast<size_t>(rng.randint(0, 400)));
      run_input(t, bytes, "random input " + std::to_string(i));
    }
  }
}

// ---- regressions found by fuzzing
// ---------------------------------------------------------------- fuzz_builders: ratio 1 and
// position INT64_MAX made (pos / ratio) + 1 overflow int64 (UBSan); in a plain build the length
// wrapped negative and indptr went backwards.
TEST(FuzzRegression, CompressedAllListsRatio1PositionInt64MaxCapsWithoutOverflow) {
  const std::vector<int32_t> table = {7, 3};
  const std::vector<int64_t> positions = {std::numeric_limits<int64_t>::max(), 2};
  std::vector<int32_t> indices(2 * 4, 0x5EED), indptr(3, 0x5EED);
  CompressedAllListParams p;
  p.common.num_rows = 2;
  p.common.path = Path::Cpu;
  p.positions = positions.data();
  p.block_table = table.data();
  p.block_table_stride = 2;
  p.table_width = 2;
  p.num_requests = 1;
  const std::vector<int32_t> requests = {0, 0};
  p.request_index = requests.data();
  p.block_size = 2;
  p.ratio = 1;
  p.max_compressed = 4;
  p.out = {indices.data(), indptr.data(), 4};
  build_compressed_all_lists(p);
  // Row 0: min(INT64_MAX + 1, 4) = 4 entries, i -> table[i / 2] * 2 + i % 2; row 1: 3 entries.
  EXPECT_EQ(indptr, (std::vector<int32_t>{0, 4, 7}));
  EXPECT_EQ(std::vector<int32_t>(indices.begin(), indices.begin() + 7),
            (std::vector<int32_t>{14, 15, 6, 7, 14, 15, 6}));
  EXPECT_EQ(indices[7], 0x5EED);
}

// ---- determinism
// ---------------------------------------------------------------------------------
struct RowBits {
  std::vector<bf16_bits> out;  // [H, 512]
  std::vector<uint32_t> lse;   // [H]
  bool operator==(const RowBits&) const = default;
};

struct Decoded {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
  int32_t splits = 0;
  RowBits row(int64_t t, int32_t H) const {
    RowBits r;
    r.out.assign(out.begin() + t * H * 512, out.begin() + (t + 1) * H * 512);
    for (int32_t h = 0; h < H; ++h) {
      uint32_t b;
      std::memcpy(&b, &lse[t * H + h], 4);
      r.lse.push_back(b);
    }
    return r;
  }
};

Decoded decode_batch(const RowPool& pool, const Batch& b, bool deterministic, int32_t num_sms) {
  Decoded d;
  d.out.assign(static_cast<size_t>(b.T() * pool.H * 512), decode::kPoisonBf16);
  d.lse.assign(static_cast<size_t>(b.T() * pool.H), std::nanf(""));
  DecodeParams p = b.params(pool, d.out.data(), d.lse.data());
  p.deterministic = deterministic;
  p.num_sms = num_sms;
  d.splits = decode_num_splits(p);
  std::vector<float> ws(decode_workspace_size(b.T(), pool.H, d.splits) / 4, std::nanf(""));
  sparse_decode(p, ws.data(), ws.size() * 4);
  return d;
}

// A row decoded alone and inside batches of 2..64 rows (random batchmates, random position,
// shuffled), each configuration twice: with deterministic = true its output and lse bits never
// change. With deterministic = false the split count follows the batch (at CU = 132: S = 16 alone,
// 4 in a batch of 33, 2 in a batch of 64), so the same comparison finds differences: the check can
// fail.
TEST(DeterministicDecodeCpu, RowBitsIndependentOfBatchmatesAndRepeatable) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  CacheSpec main_spec, extra_spec;
  main_spec.num_blocks = 8;
  main_spec.block_size = 64;
  extra_spec.num_blocks = 400;
  extra_spec.block_size = 2;
  extra_spec.page_pad = 1728 - 1168;
  const RowPool pool(rng, 80, 4, main_spec, extra_spec, 512);
  std::vector<int64_t> long_rows;  // probes: rows long enough for several splits
  for (int64_t r = 0; r < pool.size(); ++r)
    if (pool.extra_rows[r].size() >= 200) long_rows.push_back(r);
  std::shuffle(long_rows.begin(), long_rows.end(), rng.engine());
  ASSERT_GE(long_rows.size(), 4u);
  const std::vector<int64_t> sizes = {2, 7, 64};
  for (int32_t cu : {132, 0}) {  // a GPU-like CU, and the CPU's own (its thread count)
    SCOPED_TRACE("num_sms=" + std::to_string(cu));
    int64_t compared = 0, differences = 0, nondet_differences = 0, runs = 0;
    for (int probe_i = 0; probe_i < 4; ++probe_i) {
      const int64_t probe = long_rows[probe_i];
      const Batch alone(rng, pool, {probe});
      const RowBits want = decode_batch(pool, alone, true, cu).row(0, pool.H);
      const RowBits want_nondet = decode_batch(pool, alone, false, cu).row(0, pool.H);
      for (int64_t size : sizes) {
        for (int rep = 0; rep < 2; ++rep) {
          const Batch b(rng, pool, reliability::batch_with(rng, pool.size(), probe, size));
          const int64_t at = std::find(b.ids.begin(), b.ids.end(), probe) - b.ids.begin();
          const Decoded det = decode_batch(pool, b, true, cu);
          ++runs;
          ++compared;
          differences += !(det.row(at, pool.H) == want);
          nondet_differences += !(decode_batch(pool, b, false, cu).row(at, pool.H) == want_nondet);
        }
      }
      // Repeated runs of the same batch.
      const Batch b(rng, pool, reliability::batch_with(rng, pool.size(), probe, 33));
      const Decoded first = decode_batch(pool, b, true, cu);
      for (int rep = 0; rep < 3; ++rep) {
        ++runs;
        compared += b.T();
        const Decoded again = decode_batch(pool, b, true, cu);
        for (int64_t t = 0; t < b.T(); ++t)
          differences += !(again.row(t, pool.H) == first.row(t, pool.H));
      }
    }
    std::printf(
        "[ determinism ] CPU, num_sms=%d: %lld runs, %lld rows compared, %lld differences "
        "(deterministic=false: %lld of the batch comparisons differ)\n",
        cu, static_cast<long long>(runs), static_cast<long long>(compared),
        static_cast<long long>(differences), static_cast<long long>(nondet_differences));
    ASSERT_GT(compared, 40);
    EXPECT_EQ(differences, 0);
    if (cu == 132) {
      EXPECT_GT(nondet_differences, 0) << "the comparison could not tell S apart";
    }
  }
}

// The rule itself: with deterministic = true S is what the planner gives for T = 1 (same H, widths
// and CU), for every T; S = 0 otherwise follows the batch.
TEST(DeterministicDecodeCpu, SplitCountIsTheSingleRowPlanForEveryBatchSize) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  CacheSpec spec;
  spec.num_blocks = 4;
  const RowPool pool(rng, 70, 64, spec, spec, 8192);
  std::vector<bf16_bits> out(64 * 64 * 512);  // never written: only S is asked for
  for (int32_t cu : {132, 2, 7}) {
    PlanShape shape{1, 64, pool.main_width, pool.extra_width, cu};
    const int32_t s1 = plan_generic(shape);
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < 64; ++t) {
      ids.push_back(t);
      if (t + 1 != 1 && t + 1 != 8 && t + 1 != 64) continue;
      const Batch b(rng, pool, ids);
      DecodeParams p = b.params(pool, out.data(), nullptr);
      p.num_sms = cu;
      p.deterministic = true;
      EXPECT_EQ(decode_num_splits(p), s1) << "T=" << t + 1 << " CU=" << cu;
      p.deterministic = false;
      shape.num_tokens = t + 1;
      EXPECT_EQ(decode_num_splits(p), plan_generic(shape)) << "T=" << t + 1 << " CU=" << cu;
    }
  }
}

// What deterministic mode costs on the CPU: a batch of 64 long rows, median of 5 runs each way.
TEST(DeterministicDecodeCpu, CostOfDeterministicModeIsMeasured) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  CacheSpec main_spec, extra_spec;
  main_spec.num_blocks = 8;
  main_spec.block_size = 64;
  extra_spec.num_blocks = 600;
  extra_spec.block_size = 2;
  const RowPool pool(rng, 64, 16, main_spec, extra_spec, 512);
  std::vector<int64_t> ids(64);
  for (int64_t i = 0; i < 64; ++i) ids[i] = i;
  const Batch b(rng, pool, ids);
  for (int32_t cu : {0, 132}) {
    double median[2];
    int32_t splits[2];
    for (int det = 0; det < 2; ++det) {
      std::vector<double> ms;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        splits[det] = decode_batch(pool, b, det == 1, cu).splits;
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      std::sort(ms.begin(), ms.end());
      median[det] = ms[2];
    }
    std::printf(
        "[ determinism cost ] CPU T=64 H=16 widths 128+512 num_sms=%d: S %d -> %d, "
        "%.2f ms -> %.2f ms (x%.2f)\n",
        cu, splits[0], splits[1], median[0], median[1], median[1] / median[0]);
    RecordProperty(cu == 0 ? "cost_ratio_cpu_threads" : "cost_ratio_cu132",
                   std::to_string(median[1] / median[0]));
    EXPECT_GT(median[0], 0.0);
  }
}

// ---- NaN provenance end to end -----------------------------------------------------------------
// One decode problem over a compressed cache: T rows, each attending a random window list over a
// clean main cache and every compressed entry (shuffled, a few invalid slots) of `cache`.
struct ProvenanceCase {
  int64_t T = 4;
  int32_t H = 8;
  std::optional<TestCache> main;
  std::vector<bf16_bits> q;
  TestList main_list, extra_list;
  std::vector<float> sink;
  const CompressorInputs* in = nullptr;

  ProvenanceCase(Rng& rng, const CompressorInputs& inputs) : in(&inputs) {
    CacheSpec spec;
    main.emplace(rng, spec);
    q = random_bf16(rng, static_cast<size_t>(T * H * 512));
    sink = random_f32(rng, H);
    std::vector<std::vector<int32_t>> mains, extras;
    for (int64_t t = 0; t < T; ++t) {
      mains.push_back(decode::random_row(rng, 40, main->num_slots(), 0.05));
      std::vector<int32_t> all;
      for (int64_t j = 0; j < inputs.entries; ++j) all.push_back(static_cast<int32_t>(j));
      all.push_back(-1);
      all.push_back(static_cast<int32_t>(inputs.num_cblocks * 2 + 5));
      std::shuffle(all.begin(), all.end(), rng.engine());
      extras.push_back(all);
    }
    main_list = TestList::from_rows(rng, mains);
    extra_list = TestList::from_rows(rng, extras);
  }
  DecodeParams params(const std::vector<uint8_t>& cache) const {
    DecodeParams p;
    p.num_tokens = T;
    p.num_heads = H;
    p.q = q.data();
    p.main_cache = main->view();
    p.main_list = main_list.view();
    p.has_extra = true;
    p.extra_cache = {cache.data(), in->num_cblocks, CompressorInputs::kCbs,
                     CompressorInputs::kCstride};
    p.extra_list = extra_list.view();
    p.sink = sink.data();
    p.path = Path::Cpu;
    return p;
  }
  // float64 reference; `skip_scrub`: the specialised path with the gate open (CONTRACT 5), else the
  // gate closed by `connector` or by the path.
  std::vector<double> reference(const std::vector<uint8_t>& cache, bool skip_scrub,
                                bool connector = false) const {
    DecodeParams p = params(cache);
    p.path = skip_scrub || connector ? Path::CudaSm90 : Path::CudaGeneric;
    p.extra_cache_sanitised = true;
    p.kv_connector = connector;
    std::vector<double> out(static_cast<size_t>(T * H * 512));
    sparse_decode_reference(p, out.data(), nullptr);
    return out;
  }
  std::vector<bf16_bits> fast(const std::vector<uint8_t>& cache, int32_t splits) const {
    std::vector<bf16_bits> out(static_cast<size_t>(T * H * 512), decode::kPoisonBf16);
    DecodeParams p = params(cache);
    p.out = out.data();
    p.num_splits = splits;
    p.extra_cache_sanitised = true;  // asserted, but the CPU path is not the specialised one
    std::vector<float> ws(decode_workspace_size(T, H, splits) / 4, std::nanf(""));
    sparse_decode(p, ws.data(), ws.size() * 4);
    return out;
  }
};

// CONTRACT 5 end to end: the compressor in sanitising mode writes a cache whose rows decoded
// without the scrub equal the legacy rows decoded with it (row decoder, scrub = false vs true), and
// a decode that skips the extra scrub under the gate (the reference with the specialised path's
// decisions) equals the scrubbed decode -- exactly. With NaN-only poison everything stays finite;
// with +-inf poison the affected rows are -inf in both and the outputs NaN in the same places.
// The legacy cache decoded with the scrub skipped decodes differently (its NaN keys make a row's
// denominator NaN, hence the row 0 by CONTRACT 4.2): the skip is real.
TEST(NanProvenanceCpu, SanitisedCompressorCacheDecodesEqualWithAndWithoutScrub) {
  for (Poison poison : {Poison::kNanOnly, Poison::kNanAndInf}) {
    const uint64_t seed = fresh_seed();
    SPARSEMLA_SEED_TRACE(seed);
    SCOPED_TRACE(poison == Poison::kNanOnly ? "NaN poison" : "NaN and inf poison");
    Rng rng(seed);
    const CompressorInputs in(rng, 24, poison);
    const std::vector<uint8_t> sanitised = in.compress_on_cpu(rng, true);
    const std::vector<uint8_t> legacy = in.compress_on_cpu(rng, false);
    const CacheView s_view{sanitised.data(), in.num_cblocks, CompressorInputs::kCbs,
                           CompressorInputs::kCstride};
    const CacheView l_view{legacy.data(), in.num_cblocks, CompressorInputs::kCbs,
                           CompressorInputs::kCstride};
    int64_t legacy_nan_rows = 0, code_255 = 0;
    for (int64_t slot = 0; slot < in.entries; ++slot) {
      std::vector<float> raw(512), scrubbed(512), legacy_scrubbed(512), legacy_raw(512);
      dequantize_row(s_view, slot, false, raw.data());
      dequantize_row(s_view, slot, true, scrubbed.data());
      dequantize_row(l_view, slot, true, legacy_scrubbed.data());
      dequantize_row(l_view, slot, false, legacy_raw.data());
      EXPECT_EQ(reliability::count_nan(raw), 0) << "slot " << slot;
      EXPECT_EQ(count_value_differences(raw, legacy_scrubbed), 0) << "slot " << slot;
      EXPECT_EQ(std::memcmp(raw.data(), scrubbed.data(), 512 * 4), 0) << "slot " << slot;
      legacy_nan_rows += reliability::count_nan(legacy_raw) > 0;
      const uint8_t* codes =
          sanitised.data() + (slot / 2) * CompressorInputs::kCstride + 2 * 576 + (slot % 2) * 8;
      for (int t = 0; t < 7; ++t) code_255 += codes[t] == 255;
    }
    EXPECT_EQ(code_255, 0);
    EXPECT_GT(legacy_nan_rows, 0) << "the poison must reach the legacy cache";

    const ProvenanceCase c(rng, in);
    const std::vector<double> skipped = c.reference(sanitised, /*skip_scrub=*/true);
    const std::vector<double> scrubbed = c.reference(sanitised, false);
    const std::vector<double> legacy_scrubbed = c.reference(legacy, false);
    EXPECT_EQ(count_value_differences(skipped, scrubbed), 0);
    EXPECT_EQ(count_value_differences(skipped, legacy_scrubbed), 0);
    if (poison == Poison::kNanOnly) {
      EXPECT_EQ(reliability::count_nan(skipped), 0);
    }
    EXPECT_GT(count_value_differences(c.reference(legacy, /*skip_scrub=*/true), scrubbed), 0)
        << "the legacy cache without the scrub must decode differently (else no skip happened)";
    // The fast CPU decode always scrubs: sanitised and legacy caches give equal values.
    for (int32_t splits : {1, 3}) {
      const auto a = reliability::bf16_values(c.fast(sanitised, splits));
      const auto b = reliability::bf16_values(c.fast(legacy, splits));
      EXPECT_EQ(count_value_differences(a, b), 0) << "S=" << splits;
      if (poison == Poison::kNanOnly) {
        EXPECT_EQ(reliability::count_nan(a), 0);
      }
    }
  }
}

// A cache whose rows were poisoned after the fact (as rows imported by a connector could be: NaN
// bytes, code 255 over zero bytes, NaN RoPE): with the gate closed -- a connector present, the
// caller not asserting sanitised rows, or a path that is not the specialised one -- every decode
// equals the decode of the explicitly scrubbed twin and holds no NaN; with the gate wrongly open
// the NaN rows change the result (which is why the gate exists).
TEST(NanProvenanceCpu, PoisonedRowsWithTheGateClosedGiveTheScrubbedResult) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  const CompressorInputs in(rng, 40, Poison::kNone);
  std::vector<uint8_t> cache = in.compress_on_cpu(rng, true), twin;
  int64_t poisoned = 0;
  reliability::poison_scrubbably(rng, cache, twin, in.num_cblocks, CompressorInputs::kCbs,
                                 CompressorInputs::kCstride, &poisoned);
  ASSERT_GT(poisoned, 3);
  const ProvenanceCase c(rng, in);
  const std::vector<double> want =
      c.reference(twin, /*skip_scrub=*/true);  // twin: nothing to scrub
  ASSERT_EQ(reliability::count_nan(want), 0);
  EXPECT_EQ(count_value_differences(c.reference(cache, false, /*connector=*/true), want), 0);
  EXPECT_EQ(count_value_differences(c.reference(cache, false), want), 0);
  {
    DecodeParams p = c.params(cache);  // specialised path, caller does not assert sanitised rows
    p.path = Path::CudaSm90;
    p.extra_cache_sanitised = false;
    std::vector<double> out(static_cast<size_t>(c.T * c.H * 512));
    sparse_decode_reference(p, out.data(), nullptr);
    EXPECT_EQ(count_value_differences(out, want), 0);
  }
  for (int32_t splits : {1, 4}) {
    const auto got = reliability::bf16_values(c.fast(cache, splits));
    EXPECT_EQ(reliability::count_nan(got), 0) << "S=" << splits;
    EXPECT_EQ(count_value_differences(got, reliability::bf16_values(c.fast(twin, splits))), 0)
        << "S=" << splits;
  }
  EXPECT_GT(count_value_differences(c.reference(cache, /*skip_scrub=*/true), want), 0)
      << "gate wrongly open on poisoned rows: the NaN rows must change the result";
}

}  // namespace
}  // namespace sparsemla::test

namespace sparsemla::test {
namespace {

// Regression (found by fuzz_window_writer): fmaxf returns NaN for a signaling-NaN operand on glibc,
// so an fmaxf reduction restarted after a bf16 0xFFB5 input and a tile holding -inf got a finite
// scale code. The amax must ignore every NaN, quiet or signaling.
TEST(QuantiserRegression, SignalingNanNeverHidesLargerValues) {
  const float snan = bits_float(0xFFB50000u);  // bf16 0xFFB5 widened: quiet bit clear
  ASSERT_TRUE(std::isnan(snan));
  float x[64];
  uint8_t bytes[64];
  for (float& v : x) v = 1.0f;
  x[10] = -std::numeric_limits<float>::infinity();
  x[20] = snan;
  EXPECT_EQ(quantize_block(x, 64, bytes), kExpInf);
  EXPECT_EQ(quant_code(kExpInf, kCodeMaxSanitising), kCodeMaxSanitising);
  for (float& v : x) v = 1.0f;
  x[3] = 1000.0f;
  x[40] = snan;
  EXPECT_EQ(quant_amax(x, 64), 1000.0f);
  EXPECT_EQ(quantize_block(x, 64, bytes), quant_exponent(1000.0f));
  EXPECT_EQ(bytes[40], E4m3::kNegMaxByte);  // NaN element -> -448 (CONTRACT 2.3)
}

}  // namespace
}  // namespace sparsemla::test
