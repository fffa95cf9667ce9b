// Float64 reference of the cache writers (CONTRACT 2.3, 3) and the comparison rules of
// CONTRACT 9.3. Nothing here calls the library's codecs or writers: every value is computed from
// its definition.
#include "reference/writer_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>

namespace sparsemla::test::ref {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kE4m3Max = 448.0;
constexpr uint8_t kE4m3MaxCode = 0x7E;
constexpr int kPairs = 32;

uint16_t load_bf16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

std::string hex(unsigned v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// Rotates the 32 interleaved pairs of x[0..64) by the table row, in float64 (CONTRACT 1).
std::array<double, 64> rotate(const double* x, const float* cos_sin) {
  std::array<double, 64> out{};
  for (int k = 0; k < kPairs; ++k) {
    const double a = x[2 * k], b = x[2 * k + 1];
    const double c = cos_sin[k], s = cos_sin[kPairs + k];
    out[2 * k] = a * c - b * s;
    out[2 * k + 1] = a * s + b * c;
  }
  return out;
}

// True when amax lies within one bf16 ulp of some 448*2^k (where fp32 and float64 may disagree).
bool near_scale_boundary(double amax) {
  if (!std::isfinite(amax)) return false;
  const int k0 = static_cast<int>(std::floor(std::log2(amax / kE4m3Max)));
  for (int k = k0 - 1; k <= k0 + 2; ++k) {
    const double boundary = std::ldexp(kE4m3Max, k);
    if (std::fabs(amax - boundary) <= bf16_ulp(boundary)) return true;
  }
  return false;
}

// Checks the codes of a tile pair: equal, or +-1 near a scale boundary.
bool exponents_agree(int got, int want, double ref_amax) {
  return got == want || (std::abs(got - want) == 1 && near_scale_boundary(ref_amax));
}

// RoPE value j of a row: non-finite reference values (and sanitised NaN, stored as 0) must match
// exactly; finite ones within 2 bf16 ulps of the pair's magnitude.
bool rope_value_close(double got, double exact, uint16_t want_bits, double pair_magnitude) {
  const double want = bf16_value(want_bits);
  if (!std::isfinite(want) || !std::isfinite(exact) || !std::isfinite(pair_magnitude)) {
    return (std::isnan(got) && std::isnan(want)) || got == want;
  }
  return std::fabs(got - exact) <= 2.0 * bf16_ulp(pair_magnitude);
}

::testing::AssertionResult check_rope(const MlaRow& ref, const uint8_t* data) {
  for (int j = 0; j < 64; ++j) {
    const double got = bf16_value(load_bf16(data + 448 + 2 * j));
    const int k = j / 2;
    const double mag = std::hypot(ref.rope[2 * k], ref.rope[2 * k + 1]);
    if (!rope_value_close(got, ref.rope[j], ref.rope_bits[j], mag)) {
      return ::testing::AssertionFailure()
             << "RoPE dim " << 448 + j << ": got " << got << ", reference " << ref.rope[j]
             << " (pair magnitude " << mag << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

// ---- codecs
// --------------------------------------------------------------------------------------

double bf16_round(double x) {
  if (!std::isfinite(x) || x == 0.0) return x;
  const double a = std::fabs(x);
  int ex = 0;
  std::frexp(a, &ex);                          // a = m * 2^ex, m in [0.5, 1): leading bit 2^(ex-1)
  const int lsb = std::max(ex - 1 - 7, -133);  // 8 significant bits; subnormal spacing 2^-133
  const double q = std::ldexp(1.0, lsb);
  double r = std::nearbyint(a / q) * q;  // default rounding mode: ties to even
  if (r >= std::ldexp(1.0, 128)) r = kInf;
  return std::copysign(r, x);
}

uint16_t bf16_bits_of(double x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xFFC0 : 0x7FC0;
  const float f = static_cast<float>(bf16_round(x));  // exact: a bf16 value is an fp32 value
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

double bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double bf16_ulp(double x) {
  const double a = std::fabs(x);
  if (!(a >= std::ldexp(1.0, -126))) return std::ldexp(1.0, -133);
  int ex = 0;
  std::frexp(a, &ex);
  return std::ldexp(1.0, ex - 1 - 7);
}

double e4m3_value(uint8_t byte) {
  const int sign = byte >> 7, e = (byte >> 3) & 0xF, m = byte & 0x7;
  if (e == 0xF && m == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return sign ? -mag : mag;
}

uint8_t e4m3_encode(double y) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  const double a = std::fabs(y);
  if (a >= kE4m3Max) return sign | kE4m3MaxCode;
  // lo = the largest code with value <= a: codes 0x00..0x7E increase in magnitude, so a binary
  // search over them (7 steps instead of up to 126: the decode tests quantise ~10^8 model values).
  int lo = 0, hi = kE4m3MaxCode;  // value(lo) <= a < value(hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (e4m3_value(static_cast<uint8_t>(mid)) <= a ? lo : hi) = mid;
  }
  const double below = a - e4m3_value(static_cast<uint8_t>(lo));
  if (below == 0.0) return sign | static_cast<uint8_t>(lo);
  const double above = e4m3_value(static_cast<uint8_t>(lo + 1)) - a;
  int code = below < above ? lo : lo + 1;
  if (below == above) code = (lo % 2 == 0) ? lo : lo + 1;
  return sign | static_cast<uint8_t>(code);
}

double ue8m0_value(uint8_t code) {
  return code == 255 ? kInf : std::ldexp(1.0, code - 127);
}

QuantBlock quantize(const double* x, int n) {
  QuantBlock q;
  q.amax = static_cast<double>(1e-4f);
  for (int i = 0; i < n; ++i) {
    if (!std::isnan(x[i])) q.amax = std::max(q.amax, std::fabs(x[i]));
  }
  double inv_scale = 0.0;  // 2^-e; 0 for e = +inf
  if (std::isinf(q.amax)) {
    q.exponent_inf = true;
  } else {
    int e = static_cast<int>(std::ceil(std::log2(q.amax / kE4m3Max)));
    while (std::ldexp(kE4m3Max, e) < q.amax) ++e;  // smallest e with amax <= 448*2^e
    while (std::ldexp(kE4m3Max, e - 1) >= q.amax) --e;
    q.exponent = e;
    inv_scale = std::ldexp(1.0, -e);
  }
  q.bytes.resize(n);
  for (int i = 0; i < n; ++i) {
    double y = x[i] * inv_scale;  // inf * 0 and NaN give NaN
    y = std::isnan(y) ? -kE4m3Max : std::clamp(y, -kE4m3Max, kE4m3Max);
    q.bytes[i] = e4m3_encode(y);
  }
  return q;
}

uint8_t quant_code(const QuantBlock& q, int code_max) {
  if (q.exponent_inf) return static_cast<uint8_t>(code_max);
  return static_cast<uint8_t>(std::clamp(q.exponent + 127, 0, code_max));
}

// ---- rows
// ----------------------------------------------------------------------------------------

namespace {

MlaRow mla_row(const double* nope_bf16, const double* rope_in, const float* cos_sin,
               bool sanitise) {
  MlaRow row;
  const int code_max = sanitise ? 254 : 255;
  std::copy_n(nope_bf16, 448, row.nope.begin());
  for (int t = 0; t < 7; ++t) {
    row.tiles[t] = quantize(row.nope.data() + 64 * t, 64);
    row.codes[t] = quant_code(row.tiles[t], code_max);
    std::copy(row.tiles[t].bytes.begin(), row.tiles[t].bytes.end(), row.bytes.begin() + 64 * t);
  }
  row.rope = rotate(rope_in, cos_sin);
  for (int j = 0; j < 64; ++j) {
    row.rope_bits[j] = (sanitise && std::isnan(row.rope[j])) ? 0 : bf16_bits_of(row.rope[j]);
  }
  return row;
}

}  // namespace

MlaRow window_row(const uint16_t* kv512, const float* cos_sin, bool sanitise) {
  double x[512];
  for (int d = 0; d < 512; ++d) x[d] = bf16_value(kv512[d]);
  return mla_row(x, x + 448, cos_sin, sanitise);
}

MlaRow mla_row_from_normed(const double* normed512, const float* cos_sin, bool sanitise) {
  double nope[448];
  for (int d = 0; d < 448; ++d) nope[d] = bf16_round(normed512[d]);
  return mla_row(nope, normed512 + 448, cos_sin, sanitise);
}

IndexerRow indexer_row_from_normed(const double* normed128, const float* cos_sin, bool sanitise) {
  IndexerRow row;
  row.rope = rotate(normed128 + 64, cos_sin);
  for (int d = 0; d < 64; ++d) row.x[d] = bf16_round(normed128[d]);
  for (int j = 0; j < 64; ++j) {
    row.x[64 + j] = (sanitise && std::isnan(row.rope[j])) ? 0.0 : bf16_round(row.rope[j]);
  }
  row.block = quantize(row.x.data(), 128);
  row.scale = row.block.exponent_inf ? kInf : std::ldexp(1.0, row.block.exponent);
  return row;
}

// ---- compressor math
// -----------------------------------------------------------------------------

std::vector<double> pool(const StateCacheView& state, const int32_t* table, int64_t table_stride,
                         int32_t req, int64_t pos, int ratio, int head_dim) {
  const bool overlap = ratio == 4;
  const int rows = (overlap ? 2 : 1) * ratio;
  const int64_t width = (overlap ? 2 : 1) * int64_t{head_dim};
  std::vector<const float*> row_ptr(rows, nullptr);
  for (int t = 0; t < rows; ++t) {
    const int64_t q = pos - rows + 1 + t;
    if (q < 0) continue;
    const int64_t block = table[req * table_stride + q / state.block_size];
    row_ptr[t] =
        state.base + block * state.block_stride + (q % state.block_size) * state.row_stride;
  }
  std::vector<double> c(head_dim);
  for (int d = 0; d < head_dim; ++d) {
    double m = -kInf;
    for (int t = 0; t < rows; ++t) {
      if (row_ptr[t] == nullptr) continue;
      const int col = d + ((overlap && t >= ratio) ? head_dim : 0);
      m = std::max(m, static_cast<double>(row_ptr[t][width + col]));
    }
    double denom = 0.0, num = 0.0;
    for (int t = 0; t < rows; ++t) {
      if (row_ptr[t] == nullptr) continue;  // score -inf: weight 0
      const int col = d + ((overlap && t >= ratio) ? head_dim : 0);
      const double w = std::exp(row_ptr[t][width + col] - m);
      denom += w;
      num += w * row_ptr[t][col];
    }
    c[d] = num / denom;
  }
  return c;
}

std::vector<double> rms_norm(const std::vector<double>& c, const float* weight, double eps) {
  double sum_sq = 0.0;
  for (double v : c) sum_sq += v * v;
  const double rms = std::sqrt(sum_sq / static_cast<double>(c.size()) + eps);
  std::vector<double> out(c.size());
  for (size_t d = 0; d < c.size(); ++d) out[d] = c[d] / rms * weight[d];
  return out;
}

std::vector<MlaEntry> write_window(const WindowWriterParams& p) {
  std::vector<MlaEntry> out;
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    if (p.slots[i] < 0) continue;
    const float* cs = p.rope.data + p.positions[i] * p.rope.row_stride;
    out.push_back({i, p.slots[i], window_row(p.kv + i * p.kv_stride, cs, p.sanitise)});
  }
  return out;
}

std::vector<MlaEntry> compress(const CompressorParams& p) {
  std::vector<MlaEntry> out;
  const int r = p.ratio;
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t pos = p.positions[i];
    if (p.state_slots[i] < 0 || p.out_slots[i] < 0 || (pos + 1) % r != 0) continue;
    const auto pooled =
        pool(p.state, p.state_block_table, p.state_table_stride, p.request_index[i], pos, r, 512);
    const auto normed = rms_norm(pooled, p.norm_weight, p.norm_eps);
    const float* cs = p.rope.data + (pos / r) * r * p.rope.row_stride;
    out.push_back({i, p.out_slots[i], mla_row_from_normed(normed.data(), cs, p.sanitise)});
  }
  return out;
}

std::vector<IndexerEntry> compress_indexer(const IndexerCompressorParams& p) {
  std::vector<IndexerEntry> out;
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t pos = p.positions[i];
    if (p.state_slots[i] < 0 || p.out_slots[i] < 0 || (pos + 1) % 4 != 0) continue;
    const auto pooled =
        pool(p.state, p.state_block_table, p.state_table_stride, p.request_index[i], pos, 4, 128);
    const auto normed = rms_norm(pooled, p.norm_weight, p.norm_eps);
    const float* cs = p.rope.data + (pos / 4) * 4 * p.rope.row_stride;
    out.push_back({i, p.out_slots[i], indexer_row_from_normed(normed.data(), cs, p.sanitise)});
  }
  return out;
}

// ---- comparisons
// ---------------------------------------------------------------------------------

::testing::AssertionResult window_row_matches(const MlaRow& ref, const uint8_t* data,
                                              const uint8_t* scale) {
  for (int d = 0; d < 448; ++d) {
    if (data[d] != ref.bytes[d]) {
      return ::testing::AssertionFailure()
             << "NoPE byte " << d << ": got " << hex(data[d]) << ", want " << hex(ref.bytes[d])
             << " (value " << ref.nope[d] << ")";
    }
  }
  for (int t = 0; t < 7; ++t) {
    if (scale[t] != ref.codes[t]) {
      return ::testing::AssertionFailure() << "scale code of tile " << t << ": got "
                                           << int{scale[t]} << ", want " << int{ref.codes[t]};
    }
  }
  if (scale[7] != 0) return ::testing::AssertionFailure() << "pad byte " << int{scale[7]};
  return check_rope(ref, data);
}

::testing::AssertionResult mla_row_close(const MlaRow& ref, const uint8_t* data,
                                         const uint8_t* scale) {
  for (int t = 0; t < 7; ++t) {
    const int got = scale[t], want = ref.codes[t];
    if (!exponents_agree(got, want, ref.tiles[t].amax)) {
      return ::testing::AssertionFailure()
             << "scale code of tile " << t << ": got " << got << ", want " << want
             << " (reference amax " << ref.tiles[t].amax << ")";
    }
    const double step = std::ldexp(16.0, std::max(got, want) - 127);  // half an e4m3 step at 448
    for (int d = 64 * t; d < 64 * t + 64; ++d) {
      const double value = e4m3_value(data[d]) * ue8m0_value(scale[t]);
      const double tol = step + bf16_ulp(ref.nope[d]);
      if (!(std::fabs(value - ref.nope[d]) <= tol)) {
        return ::testing::AssertionFailure()
               << "NoPE dim " << d << ": got " << value << ", reference " << ref.nope[d]
               << " (tolerance " << tol << ")";
      }
    }
  }
  if (scale[7] != 0) return ::testing::AssertionFailure() << "pad byte " << int{scale[7]};
  return check_rope(ref, data);
}

::testing::AssertionResult indexer_row_close(const IndexerRow& ref, const uint8_t* values,
                                             float scale) {
  int got_e = 0;
  const double frac = std::frexp(static_cast<double>(scale), &got_e);
  if (!(frac == 0.5)) return ::testing::AssertionFailure() << "scale " << scale << " not 2^e";
  --got_e;  // scale = 0.5 * 2^got_e
  if (ref.block.exponent_inf || !exponents_agree(got_e, ref.block.exponent, ref.block.amax)) {
    return ::testing::AssertionFailure()
           << "scale 2^" << got_e << ", reference 2^" << ref.block.exponent << " (amax "
           << ref.block.amax << ")";
  }
  const double step = std::ldexp(16.0, std::max(got_e, ref.block.exponent));
  for (int d = 0; d < 128; ++d) {
    const double value = e4m3_value(values[d]) * scale;
    double want = ref.x[d], tol = step + bf16_ulp(ref.x[d]);
    if (d >= 64 && !std::isfinite(ref.rope[d - 64])) {
      // A non-finite rotated value (sanitised to 0 or not): the quantised byte must match.
      if (values[d] == ref.block.bytes[d]) continue;
      return ::testing::AssertionFailure() << "dim " << d << ": byte " << hex(values[d])
                                           << ", reference " << hex(ref.block.bytes[d]);
    }
    if (d >= 64) {
      const int k = (d - 64) / 2;
      want = ref.rope[d - 64];
      tol = step + 2.0 * bf16_ulp(std::hypot(ref.rope[2 * k], ref.rope[2 * k + 1]));
    }
    if (!(std::fabs(value - want) <= tol)) {
      return ::testing::AssertionFailure() << "dim " << d << ": got " << value << ", reference "
                                           << want << " (tolerance " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

void Agreement::add(const MlaRow& ref, const uint8_t* data, const uint8_t* scale) {
  for (int j = 0; j < 64; ++j) {
    if (!std::isfinite(bf16_value(ref.rope_bits[j]))) continue;
    ++rope_values;
    rope_equal += load_bf16(data + 448 + 2 * j) == ref.rope_bits[j] ? 1 : 0;
  }
  for (int t = 0; t < 7; ++t) {
    if (scale[t] != ref.codes[t]) continue;
    for (int d = 64 * t; d < 64 * t + 64; ++d) {
      ++quant_values;
      quant_equal += data[d] == ref.bytes[d] ? 1 : 0;
    }
  }
}

void Agreement::add(const IndexerRow& ref, const uint8_t* values, float scale) {
  if (ref.block.exponent_inf || static_cast<double>(scale) != ref.scale) return;
  for (int d = 0; d < 128; ++d) {
    ++quant_values;
    quant_equal += values[d] == ref.block.bytes[d] ? 1 : 0;
  }
}

::testing::AssertionResult Agreement::at_least(double fraction) const {
  const auto ok = [&](int64_t equal, int64_t total) {
    return total == 0 || static_cast<double>(equal) >= fraction * static_cast<double>(total);
  };
  if (ok(rope_equal, rope_values) && ok(quant_equal, quant_values)) {
    return ::testing::AssertionSuccess() << "agreement: RoPE " << rope_equal << "/" << rope_values
                                         << ", e4m3 " << quant_equal << "/" << quant_values;
  }
  return ::testing::AssertionFailure()
         << "exact agreement with the float64 reference below " << fraction << ": RoPE bf16 "
         << rope_equal << "/" << rope_values << ", e4m3 bytes " << quant_equal << "/"
         << quant_values;
}

}  // namespace sparsemla::test::ref

// ---- fixtures
// ------------------------------------------------------------------------------------
namespace sparsemla::test {

namespace {

// First differing byte of two equally long buffers, as an assertion.
::testing::AssertionResult same_bytes(const std::vector<uint8_t>& want,
                                      const std::vector<uint8_t>& got) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      return ::testing::AssertionFailure()
             << "byte " << i << " outside the written rows changed: " << int{want[i]} << " -> "
             << int{got[i]};
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

RopeBuffer random_rope(Rng& rng, int64_t rows, int64_t row_stride) {
  RopeBuffer r;
  r.rows = rows;
  r.row_stride = row_stride;
  r.data.assign(rows * row_stride, std::numeric_limits<float>::quiet_NaN());
  for (int64_t p = 0; p < rows; ++p) {
    for (int k = 0; k < 32; ++k) {
      const double angle = rng.uniform(-3.14159265358979, 3.14159265358979);
      r.row(p)[k] = static_cast<float>(std::cos(angle));
      r.row(p)[32 + k] = static_cast<float>(std::sin(angle));
    }
  }
  return r;
}

const uint8_t* MlaCacheBuffer::data(int64_t slot) const {
  return bytes.data() + (slot / block_size) * block_stride + (slot % block_size) * 576;
}
const uint8_t* MlaCacheBuffer::scale(int64_t slot) const {
  return bytes.data() + (slot / block_size) * block_stride + int64_t{block_size} * 576 +
         (slot % block_size) * 8;
}

MlaCacheBuffer random_mla_cache(Rng& rng, int64_t num_blocks, int32_t block_size,
                                int64_t block_stride) {
  MlaCacheBuffer c;
  c.bytes = random_bytes(rng, num_blocks * block_stride);
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.block_stride = block_stride;
  return c;
}

const uint8_t* IndexerCacheBuffer::normal_values(int64_t slot) const {
  return bytes.data() + (slot / block_size) * block_stride + (slot % block_size) * 128;
}
float IndexerCacheBuffer::scale(int64_t slot) const {
  float s;
  std::memcpy(&s,
              bytes.data() + (slot / block_size) * block_stride + int64_t{block_size} * 128 +
                  (slot % block_size) * 4,
              4);
  return s;
}

IndexerCacheBuffer random_indexer_cache(Rng& rng, int64_t num_blocks, int32_t block_size,
                                        int64_t block_stride, IndexerLayout layout) {
  IndexerCacheBuffer c;
  c.bytes = random_bytes(rng, num_blocks * block_stride);
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.block_stride = block_stride;
  c.layout = layout;
  return c;
}

::testing::AssertionResult only_rows_changed(const std::vector<uint8_t>& before,
                                             const MlaCacheBuffer& after,
                                             const std::vector<int64_t>& slots) {
  std::vector<uint8_t> masked = after.bytes;
  for (int64_t slot : slots) {
    const size_t data = after.data(slot) - after.bytes.data();
    const size_t scale = after.scale(slot) - after.bytes.data();
    std::copy_n(before.begin() + data, 576, masked.begin() + data);
    std::copy_n(before.begin() + scale, 8, masked.begin() + scale);
  }
  return same_bytes(before, masked);
}

::testing::AssertionResult only_rows_changed(const std::vector<uint8_t>& before,
                                             const IndexerCacheBuffer& after,
                                             const std::vector<int64_t>& slots) {
  std::vector<uint8_t> masked = after.bytes;
  for (int64_t slot : slots) {
    const int64_t page = (slot / after.block_size) * after.block_stride;
    const int64_t p = slot % after.block_size;
    for (int d = 0; d < 128; ++d) {
      // NORMAL: p*128 + d; SHUFFLE: 16x16 tiles (CONTRACT 2.2), written out here by hand.
      const int64_t off = after.layout == IndexerLayout::Normal
                              ? p * 128 + d
                              : (p / 16) * 2048 + (p % 16) * 16 + (d / 16) * 256 + d % 16;
      masked[page + off] = before[page + off];
    }
    const int64_t scale = page + int64_t{after.block_size} * 128 + p * 4;
    std::copy_n(before.begin() + scale, 4, masked.begin() + scale);
  }
  return same_bytes(before, masked);
}

int check_sanitised_equivalence(const MlaCacheBuffer& legacy, const MlaCacheBuffer& sanitised,
                                const std::vector<int64_t>& slots) {
  int legacy_nans = 0;
  for (int64_t slot : slots) {
    SCOPED_TRACE("slot " + std::to_string(slot));
    for (int t = 0; t < 7; ++t) EXPECT_LE(sanitised.scale(slot)[t], 254) << "tile " << t;
    for (int d = 0; d < 448; ++d) {
      EXPECT_NE(sanitised.data(slot)[d] & 0x7F, 0x7F) << "NaN byte in the sanitised row, dim " << d;
      EXPECT_NE(legacy.data(slot)[d] & 0x7F, 0x7F) << "NaN byte in the legacy row, dim " << d;
    }
    float clean[512], scrubbed[512], raw_legacy[512];
    dequantize_row(sanitised.cview(), slot, /*scrub=*/false, clean);
    dequantize_row(legacy.cview(), slot, /*scrub=*/true, scrubbed);
    dequantize_row(legacy.cview(), slot, /*scrub=*/false, raw_legacy);
    for (int d = 0; d < 512; ++d) {
      EXPECT_FALSE(std::isnan(clean[d])) << "dim " << d;
      EXPECT_TRUE(clean[d] == scrubbed[d])
          << "dim " << d << ": " << clean[d] << " vs " << scrubbed[d];
      legacy_nans += std::isnan(raw_legacy[d]) ? 1 : 0;
    }
  }
  return legacy_nans;
}

}  // namespace sparsemla::test
