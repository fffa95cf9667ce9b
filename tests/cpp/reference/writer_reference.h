// tests/cpp/reference/writer_reference.h: an independent, straightforward float64 implementation of
// the cache writers of CONTRACT 3 (window writer, compressor r=4 / r=128, indexer compressor),
// written from the contract without the library's writer code or codecs, and the comparison rules
// of CONTRACT 9.3.
//
// It reads the same public params structs as the library (ARCHITECTURE: "fill the struct twice").
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "reference/random.h"
#include "sparsemla/error.h"
#include "sparsemla/writer.h"

namespace sparsemla::test::ref {

// ---- codecs (float64, by definition)
// -------------------------------------------------------------
double bf16_round(double x);       // nearest bf16 value, ties to even; overflow -> +-inf; NaN kept
uint16_t bf16_bits_of(double x);   // bits of bf16_round(x) (NaN -> 0x7FC0 with the sign of x)
double bf16_value(uint16_t bits);  // decode
double bf16_ulp(double x);         // spacing of bf16 values at |x| (2^-133 below 2^-126)
double e4m3_value(uint8_t byte);   // decode; NaN for 0x7F / 0xFF
uint8_t e4m3_encode(double y);     // nearest of the 253 finite values, ties to the even code;
                                   // |y| > 448 saturates, sign kept (also for results of 0)
double ue8m0_value(uint8_t code);  // 2^(code-127); +inf for 255

// The quantiser of CONTRACT 2.3 on bf16-exact values.
struct QuantBlock {
  double amax = 0;            // max(|x| ignoring NaN, 1e-4f)
  bool exponent_inf = false;  // amax = +inf
  int exponent = 0;           // ceil(log2(amax / 448)) when finite
  std::vector<uint8_t> bytes;
};
QuantBlock quantize(const double* x, int n);
// clamp(e + 127, 0, code_max); code_max for an infinite exponent.
uint8_t quant_code(const QuantBlock& q, int code_max);

// ---- one expected row
// ----------------------------------------------------------------------------
struct MlaRow {
  std::array<double, 448> nope{};     // bf16-rounded values that are quantised
  std::array<uint8_t, 448> bytes{};   // their e4m3 bytes
  std::array<QuantBlock, 7> tiles{};  // per 64-dim tile
  std::array<uint8_t, 7> codes{};
  std::array<double, 64> rope{};         // rotated values before bf16 rounding
  std::array<uint16_t, 64> rope_bits{};  // stored bf16 (after the sanitising NaN -> 0)
};

struct IndexerRow {
  std::array<double, 128> x{};    // bf16-rounded values that are quantised (rope dims rotated)
  std::array<double, 64> rope{};  // rotated dims 64..127 before bf16 rounding
  QuantBlock block;
  double scale = 0;  // 2^e, +inf for an infinite exponent
};

// Window writer row of one token: kv512 bf16 bits, cos_sin = the table row of its position.
MlaRow window_row(const uint16_t* kv512, const float* cos_sin, bool sanitise);
// Row of the fp8_ds_mla compressor from normalised values; cos_sin = the window-start table row.
MlaRow mla_row_from_normed(const double* normed512, const float* cos_sin, bool sanitise);
IndexerRow indexer_row_from_normed(const double* normed128, const float* cos_sin, bool sanitise);

// ---- compressor math
// ----------------------------------------------------------------------------- Per-channel softmax
// pooling of the entry completed by `pos` of request `req` (CONTRACT 3.2 step 1-2), reading the
// state cache through the state block table; positions < 0 contribute nothing.
std::vector<double> pool(const StateCacheView& state, const int32_t* table, int64_t table_stride,
                         int32_t req, int64_t pos, int ratio, int head_dim);
// RMSNorm: c / sqrt(sum(c^2)/n + eps) * w.
std::vector<double> rms_norm(const std::vector<double>& c, const float* weight, double eps);

// The rows a writer call must produce: token index, destination slot and the expected row.
struct MlaEntry {
  int64_t token = 0;
  int64_t slot = 0;
  MlaRow row;
};
struct IndexerEntry {
  int64_t token = 0;
  int64_t slot = 0;
  IndexerRow row;
};
std::vector<MlaEntry> write_window(const WindowWriterParams& p);
std::vector<MlaEntry> compress(const CompressorParams& p);
std::vector<IndexerEntry> compress_indexer(const IndexerCompressorParams& p);

// ---- comparisons (CONTRACT 9.3)
// ---------------------------------------------------------------------- Window writer: NoPE bytes
// and codes exactly equal, pad byte 0, RoPE within 2 bf16 ulps of the pair's magnitude.
::testing::AssertionResult window_row_matches(const MlaRow& ref, const uint8_t* data,
                                              const uint8_t* scale);
// Compressor: codes equal except +-1 where the reference's tile amax lies within one bf16 ulp of
// 448*2^k; NoPE decoded values within 16*2^e + one bf16 ulp of the reference's bf16-rounded value
// (e the larger of the two exponents); RoPE within 2 bf16 ulps of the pair's magnitude; pad byte 0.
::testing::AssertionResult mla_row_close(const MlaRow& ref, const uint8_t* data,
                                         const uint8_t* scale);
// Indexer compressor: exponent as above; values within 16*2^e plus one bf16 ulp of the element
// (NoPE dims) or two bf16 ulps of the pair's magnitude (RoPE dims).
::testing::AssertionResult indexer_row_close(const IndexerRow& ref, const uint8_t* values,
                                             float scale);

// How often a writer's bytes equal the float64 reference's exactly. The tolerances above cannot see
// a systematic relative error below ~2^-9 (e.g. var = sum/511); exact agreement of almost every
// bf16 RoPE value and e4m3 byte can, since fp32 and float64 results differ by a few fp32 ulps and
// change a bf16 rounding only about once in 10^4 values.
struct Agreement {
  int64_t rope_values = 0, rope_equal = 0;    // bf16 RoPE bits (MLA rows)
  int64_t quant_values = 0, quant_equal = 0;  // e4m3 bytes of tiles whose exponents agree
  void add(const MlaRow& ref, const uint8_t* data, const uint8_t* scale);
  void add(const IndexerRow& ref, const uint8_t* values, float scale);
  // Both fractions (where counted) at least `fraction`.
  ::testing::AssertionResult at_least(double fraction) const;
};

}  // namespace sparsemla::test::ref

// ---- fixtures shared by the writer tests
// ---------------------------------------------------------
namespace sparsemla::test {

// A random cos/sin table: row p = [cos(a_pk) x32 | sin(a_pk) x32], a_pk uniform in [-pi, pi];
// padding columns (row_stride > 64) hold NaN so that a stray read shows.
struct RopeBuffer {
  std::vector<float> data;
  int64_t rows = 0;
  int64_t row_stride = 64;
  RopeTable table() const { return {data.data(), rows, row_stride}; }
  float* row(int64_t p) { return data.data() + p * row_stride; }
};
RopeBuffer random_rope(Rng& rng, int64_t rows, int64_t row_stride);

// An fp8_ds_mla cache filled with random bytes (page padding included).
struct MlaCacheBuffer {
  std::vector<uint8_t> bytes;
  int64_t num_blocks = 0;
  int32_t block_size = 1;
  int64_t block_stride = 0;
  MutableCacheView view() { return {bytes.data(), num_blocks, block_size, block_stride}; }
  CacheView cview() const { return {bytes.data(), num_blocks, block_size, block_stride}; }
  int64_t capacity() const { return num_blocks * block_size; }
  const uint8_t* data(int64_t slot) const;   // 576 data bytes of the slot (CONTRACT 2.1, by hand)
  const uint8_t* scale(int64_t slot) const;  // 8 scale bytes
};
MlaCacheBuffer random_mla_cache(Rng& rng, int64_t num_blocks, int32_t block_size,
                                int64_t block_stride);

// An indexer key cache filled with random bytes.
struct IndexerCacheBuffer {
  std::vector<uint8_t> bytes;
  int64_t num_blocks = 0;
  int32_t block_size = 1;
  int64_t block_stride = 0;
  IndexerLayout layout = IndexerLayout::Normal;
  IndexerCacheView view() { return {bytes.data(), num_blocks, block_size, block_stride, layout}; }
  int64_t capacity() const { return num_blocks * block_size; }
  const uint8_t* normal_values(int64_t slot) const;  // 128 bytes (NORMAL layout)
  float scale(int64_t slot) const;
};
IndexerCacheBuffer random_indexer_cache(Rng& rng, int64_t num_blocks, int32_t block_size,
                                        int64_t block_stride, IndexerLayout layout);

// Every byte of `after` outside the rows (data + scale bytes) of `slots` equals `before`.
::testing::AssertionResult only_rows_changed(const std::vector<uint8_t>& before,
                                             const MlaCacheBuffer& after,
                                             const std::vector<int64_t>& slots);
::testing::AssertionResult only_rows_changed(const std::vector<uint8_t>& before,
                                             const IndexerCacheBuffer& after,
                                             const std::vector<int64_t>& slots);

// Sanitising contract (CONTRACT 5), for every slot: the sanitised row has codes <= 254 and no NaN
// byte (nor has the legacy row), and decodes without scrub to values IEEE-equal to the legacy row
// decoded with scrub, none NaN. Returns how many legacy values were NaN before the scrub, so that a
// caller can require that the poison produced the hazard at all.
int check_sanitised_equivalence(const MlaCacheBuffer& legacy, const MlaCacheBuffer& sanitised,
                                const std::vector<int64_t>& slots);

// Expects `fn` to throw sparsemla::Error whose message contains `needle`.
template <typename Fn>
void expect_error_naming(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace sparsemla::test
