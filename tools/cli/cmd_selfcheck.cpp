// sparsemla selfcheck: a quick end-to-end check of the writer, the row decoder and the gather on
// random model-like data. Expected values are re-derived here from CONTRACT 2 and 3.1 without the
// library's codecs; prints one table row per check and fails (exit code 1) on any mismatch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "sparsemla/format.h"
#include "sparsemla/gather.h"
#include "sparsemla/rope.h"
#include "sparsemla/writer.h"

namespace sparsemla::tools {

namespace {

struct SelfcheckOptions {
  int64_t tokens = 512;
  uint64_t seed = 0;  // 0: fresh
  int32_t block_size = 64;
};

struct CheckRow {
  std::string name;
  int64_t rows = 0;
  double max_error = 0;  // in the unit named by `unit`
  double bound = 0;
  std::string unit;
  bool pass() const { return max_error <= bound; }
};

// ---- independent numerics
// ------------------------------------------------------------------------

// Round to the nearest bf16 (8 significant bits), ties to even, via a double nearbyint at the
// value's ulp; overflow gives +-inf through the final float conversion.
float bf16_round(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int ex;
  std::frexp(static_cast<double>(x), &ex);     // |x| = m * 2^ex, m in [0.5, 1)
  const int ulp_exp = std::max(ex - 8, -133);  // bf16 subnormal spacing is 2^-133
  const double r = std::nearbyint(std::ldexp(static_cast<double>(x), -ulp_exp));
  return static_cast<float>(std::ldexp(r, ulp_exp));
}
float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t bf16_bits_of(float bf16_exact) {
  uint32_t u;
  std::memcpy(&u, &bf16_exact, 4);
  return static_cast<uint16_t>(u >> 16);
}
// One bf16 ulp at magnitude m (8 significant bits).
double bf16_ulp(double m) {
  if (m == 0) return std::ldexp(1.0, -133);
  int ex;
  std::frexp(m, &ex);
  return std::ldexp(1.0, std::max(ex - 8, -133));
}
// The quantiser's exponent: the smallest e with 448 * 2^e >= max(amax, 1e-4f).
int tile_exponent(float amax) {
  const double a = std::max(amax, 1e-4f);
  int e = std::ilogb(a) - 9;
  while (std::ldexp(448.0, e) < a) ++e;
  return e;
}
// Half an e4m3 step at |y| (y = x * 2^-e in [-448, 448]): steps are 2^-9 below 2^-6, else 8 per
// binade.
double half_e4m3_step(double y) {
  const double a = std::fabs(y);
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -10);
  int ex;
  std::frexp(a, &ex);  // a in [2^(ex-1), 2^ex)
  return std::ldexp(1.0, ex - 1 - 4);
}
double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80) ? -v : v;
}

// ---- the window-writer check
// ---------------------------------------------------------------------

struct WindowCase {
  int32_t bs = 64;
  int64_t num_blocks = 0, stride = 0;
  std::vector<uint8_t> cache, cache_before;
  std::vector<uint16_t> kv;  // [N, 512]
  std::vector<int64_t> positions, slots;
  std::vector<float> table;  // [P, 64]
  int64_t rope_rows = 0;
};

WindowCase make_window_case(std::mt19937_64& rng, int64_t tokens, int32_t bs) {
  WindowCase c;
  c.bs = bs;
  c.num_blocks = (tokens + tokens / 4) / bs + 2;
  const int64_t raw = int64_t{bs} * Fp8DsMla::kBytesPerToken;
  const int64_t padded = (raw + 575) / 576 * 576;
  c.stride = std::uniform_int_distribution<int>(0, 1)(rng) ? padded : raw;
  c.cache.resize(c.num_blocks * c.stride);
  for (auto& b : c.cache) b = static_cast<uint8_t>(rng());
  c.cache_before = c.cache;
  c.rope_rows = 4096;
  c.table = build_rope_table(rope_config_compressed_layer(), c.rope_rows);
  // Latents like an RMS-normalised model row: N(0, 1) with a few outliers per token.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  c.kv.resize(tokens * 512);
  for (int64_t i = 0; i < tokens * 512; ++i) {
    const float scale = (rng() % 97 == 0) ? 30.0f : 1.0f;
    c.kv[i] = bf16_bits_of(bf16_round(normal(rng) * scale));
  }
  std::vector<int64_t> free_slots(c.num_blocks * bs);
  for (size_t i = 0; i < free_slots.size(); ++i) free_slots[i] = static_cast<int64_t>(i);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  for (int64_t t = 0; t < tokens; ++t) {
    c.positions.push_back(static_cast<int64_t>(rng() % c.rope_rows));
    c.slots.push_back(rng() % 16 == 0 ? -1 : free_slots[t]);  // 1 in 16 tokens skipped
  }
  return c;
}

void run_window_writer(WindowCase& c) {
  WindowWriterParams p;
  p.num_tokens = static_cast<int64_t>(c.slots.size());
  p.kv = c.kv.data();
  p.positions = c.positions.data();
  p.slots = c.slots.data();
  p.rope = {c.table.data(), c.rope_rows, 64};
  p.cache = {c.cache.data(), c.num_blocks, c.bs, c.stride};
  p.sanitise = true;
  p.path = Path::Cpu;
  write_window(p);
}

// Codes, NoPE values, RoPE values and untouched bytes of every token against CONTRACT 2.3 / 3.1.
std::vector<CheckRow> check_window(const WindowCase& c) {
  CheckRow codes{"window: scale codes + pad", 0, 0, 0, "code diff"};
  CheckRow nope{"window: NoPE values", 0, 0, 1, "x half e4m3 step"};
  CheckRow rope{"window: RoPE values", 0, 0, 2, "bf16 ulp of |pair|"};
  CheckRow untouched{"window: other bytes untouched", 0, 0, 0, "bytes changed"};
  std::vector<uint8_t> expected_image = c.cache_before;
  const CacheView view{c.cache.data(), c.num_blocks, c.bs, c.stride};
  for (size_t t = 0; t < c.slots.size(); ++t) {
    const int64_t slot = c.slots[t];
    if (slot < 0) continue;
    const uint16_t* x = c.kv.data() + t * 512;
    float decoded[512];
    dequantize_row(view, slot, false, decoded);
    const uint8_t* page = c.cache.data() + (slot / c.bs) * c.stride;
    const uint8_t* data = page + (slot % c.bs) * 576;
    const uint8_t* scale = page + int64_t{c.bs} * 576 + (slot % c.bs) * 8;
    // The written row is expected to change; copy it into the image for the untouched check.
    std::memcpy(expected_image.data() + (data - c.cache.data()), data, 576);
    std::memcpy(expected_image.data() + (scale - c.cache.data()), scale, 8);
    for (int tile = 0; tile < 7; ++tile) {
      float amax = 0;
      for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(bf16_value(x[tile * 64 + i])));
      const int e = tile_exponent(amax);
      codes.max_error =
          std::max(codes.max_error, std::fabs(static_cast<double>(scale[tile]) - (e + 127)));
      for (int i = 0; i < 64; ++i) {
        const int d = tile * 64 + i;
        const double xv = bf16_value(x[d]);
        const double bound = half_e4m3_step(std::ldexp(xv, -e)) * std::ldexp(1.0, e);
        const double from_bytes = e4m3_value(data[d]) * std::ldexp(1.0, scale[tile] - 127);
        double err = std::fabs(decoded[d] - xv) / bound;
        if (from_bytes != decoded[d]) err = 1e9;  // the decoder must agree with the bytes
        nope.max_error = std::max(nope.max_error, err);
      }
    }
    codes.max_error = std::max(codes.max_error, static_cast<double>(scale[7]));  // pad byte 0
    const float* cs = c.table.data() + c.positions[t] * 64;
    for (int k = 0; k < 32; ++k) {
      const float a = bf16_value(x[448 + 2 * k]), b = bf16_value(x[449 + 2 * k]);
      const float ra = bf16_round(a * cs[k] - b * cs[32 + k]);
      const float rb = bf16_round(a * cs[32 + k] + b * cs[k]);
      const double ulp = bf16_ulp(std::hypot(double{ra}, double{rb}));
      rope.max_error = std::max(rope.max_error, std::fabs(decoded[448 + 2 * k] - ra) / ulp);
      rope.max_error = std::max(rope.max_error, std::fabs(decoded[449 + 2 * k] - rb) / ulp);
    }
    ++codes.rows, ++nope.rows, ++rope.rows;
  }
  for (size_t i = 0; i < c.cache.size(); ++i)
    untouched.max_error += c.cache[i] != expected_image[i];
  untouched.rows = static_cast<int64_t>(c.slots.size()) - codes.rows;  // skipped tokens
  return {codes, nope, rope, untouched};
}

// ---- the gather check
// ----------------------------------------------------------------------------

CheckRow check_gather(std::mt19937_64& rng, IndexerLayout layout, int64_t tokens) {
  CheckRow row{layout == IndexerLayout::Normal ? "gather: NORMAL layout" : "gather: SHUFFLE layout",
               0, 0, 0, "bytes differing"};
  const int32_t bs = 64;
  const int64_t num_blocks = tokens / bs + 4, stride = bs * 132 + 64;
  std::vector<uint8_t> cache(num_blocks * stride);
  for (auto& b : cache) b = static_cast<uint8_t>(rng());
  // Sequences of random lengths; a page-table row per sequence with a few invalid ids.
  std::vector<int32_t> cu = {0};
  while (cu.back() < tokens) {
    const int64_t len =
        std::min<int64_t>(tokens - cu.back(), 1 + rng() % (4 * bs));  // some run past the table
    cu.push_back(static_cast<int32_t>(cu.back() + len));
  }
  const int64_t batches = static_cast<int64_t>(cu.size()) - 1, width = 3;
  std::vector<int32_t> table(batches * width), tts(tokens + 8, -1);
  for (auto& id : table) id = rng() % 10 == 0 ? -1 : static_cast<int32_t>(rng() % num_blocks);
  for (int64_t b = 0; b < batches; ++b)
    for (int32_t t = cu[b]; t < cu[b + 1]; ++t) tts[t] = static_cast<int32_t>(b);
  const int64_t n = tokens + 8;  // 8 over-allocated padding rows
  std::vector<uint8_t> k_fp8(n * 128, 0xA5), expected_fp8 = k_fp8;
  std::vector<float> k_scale(n, -1.0f), expected_scale = k_scale;
  GatherParams p;
  p.num_tokens = n;
  p.num_batches = batches;
  p.token_to_seq = tts.data();
  p.cu_seqlen = cu.data();
  p.block_table = table.data();
  p.block_table_stride = width;
  p.block_table_width = static_cast<int32_t>(width);
  p.cache = {cache.data(), num_blocks, bs, stride, layout};
  p.k_fp8 = k_fp8.data();
  p.k_scale = k_scale.data();
  p.path = Path::Cpu;
  gather_indexer_keys(p);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t b = tts[t], o = t - cu[b], page = o / bs, r = o % bs;
    const int32_t id = page < width ? table[b * width + page] : -1;
    if (id < 0) {
      expected_scale[t] = 0.0f;
      continue;
    }
    const uint8_t* base = cache.data() + id * stride;
    for (int d = 0; d < 128; ++d) {
      const int64_t off = layout == IndexerLayout::Normal
                              ? r * 128 + d
                              : (r / 16) * 2048 + (r % 16) * 16 + (d / 16) * 256 + d % 16;
      expected_fp8[t * 128 + d] = base[off];
    }
    std::memcpy(&expected_scale[t], base + bs * 128 + r * 4, 4);
    ++row.rows;
  }
  for (int64_t i = 0; i < n * 128; ++i) row.max_error += k_fp8[i] != expected_fp8[i];
  row.max_error += std::memcmp(k_scale.data(), expected_scale.data(), n * 4) != 0 ? 1 : 0;
  return row;
}

// ---- driver
// --------------------------------------------------------------------------------------

int run_selfcheck(const SelfcheckOptions& opt) {
  const uint64_t seed =
      opt.seed != 0 ? opt.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  std::mt19937_64 rng(seed);
  std::printf("sparsemla selfcheck: %lld tokens, block size %d, seed %llu\n",
              static_cast<long long>(opt.tokens), opt.block_size,
              static_cast<unsigned long long>(seed));
  WindowCase wc = make_window_case(rng, opt.tokens, opt.block_size);
  run_window_writer(wc);
  std::vector<CheckRow> rows = check_window(wc);
  rows.push_back(check_gather(rng, IndexerLayout::Normal, opt.tokens));
  rows.push_back(check_gather(rng, IndexerLayout::Shuffle, opt.tokens));

  std::printf("%-32s %7s %11s %8s  %-20s %s\n", "check", "rows", "max error", "bound", "unit",
              "verdict");
  bool ok = true;
  for (const CheckRow& r : rows) {
    std::printf("%-32s %7lld %11.4g %8.4g  %-20s %s\n", r.name.c_str(),
                static_cast<long long>(r.rows), r.max_error, r.bound, r.unit.c_str(),
                r.pass() ? "ok" : "FAIL");
    ok = ok && r.pass();
  }
  std::printf("%s\n", ok ? "selfcheck passed" : "selfcheck FAILED");
  return ok ? 0 : 1;
}

}  // namespace

void register_selfcheck(CLI::App& app) {
  auto* cmd = app.add_subcommand("selfcheck", "Write, decode and gather random rows; check them");
  static SelfcheckOptions opt;
  cmd->add_option("--tokens", opt.tokens, "tokens written and gathered")
      ->check(integer_in(1, int64_t{1} << 20));
  cmd->add_option("--seed", opt.seed, "random seed (0: fresh)");
  cmd->add_option("--block-size", opt.block_size, "tokens per window-cache page")
      ->check(integer_in(1, 4096));
  cmd->callback([] {
    if (run_selfcheck(opt) != 0) throw CLI::RuntimeError(1);
  });
}

}  // namespace sparsemla::tools
