// tests/cpp/reference/pad_byte_problem.h: decode problems at model magnitudes whose pad bytes
// (byte 7 of each token's 8-byte scale word, CONTRACT 2.1) can be rewritten in place, shared by the
// pad-byte tests of the CPU (tests/cpp/test_pad_byte.cpp) and of both CUDA paths
// (tests/gpu/test_gpu_pad_byte.cpp). CONTRACT 2.1: no reader may let the pad byte change a result
// or pick a path, so every output must keep its bits when only pad bytes change.
//
// Data (the model regime of CONTRACT 9.9): NoPE latents N(0,1) x a per-(token, 64-dim tile) gain
// exp(0.7 N(0,1)), rounded to bf16 and quantised by the library's quantiser (quantize_block,
// quant_code: CONTRACT 2.3), codes clamped to 254 (sanitising writer) or 255 (legacy); RoPE dims
// the same latents (one more tile gain) stored as bf16; queries N(0,1). Such tiles get codes
// ~105..125, all on the GPU kernels' fast path (codes <= 134). Two options add what real caches
// also hold: NaN bytes (0x7F / 0xFF, only in caches that are scrubbed: CONTRACT 5) and tiles
// quantised at a larger exponent (codes 135..140, the kernels' exact path; bytes x * 2^-e rounded
// by the same quantiser, so values stay near x and no softmax is swamped).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <ostream>
#include <vector>

#include "reference/random.h"
#include "sparsemla/decode.h"
#include "sparsemla/format.h"
#include "sparsemla/numerics.h"

namespace sparsemla::test::pad_byte {

// The layer kinds of DSV4 decode (CONTRACT 1): window only, and window + a ratio-4 (indexer top-k)
// or ratio-128 (every compressed row) extra cache, whose scrub the provenance gate (CONTRACT 5)
// skips when it was written in sanitising mode and asserted so.
enum class Kind { kWindow, kRatio4, kRatio128 };
struct Layer {
  const char* name;
  Kind kind;
  bool sanitised;  // extra cache: sanitising writer (codes <= 254) + extra_cache_sanitised
};
inline void PrintTo(const Layer& l, std::ostream* os) {  // gtest's parameter names
  *os << l.name;
}
inline std::vector<Layer> all_layers() {
  return {{"window", Kind::kWindow, false},
          {"ratio4_scrubbed", Kind::kRatio4, false},
          {"ratio4_sanitised", Kind::kRatio4, true},
          {"ratio128_scrubbed", Kind::kRatio128, false},
          {"ratio128_sanitised", Kind::kRatio128, true}};
}

// What the pad bytes hold: 0 (what this library's writers write), random (what FlashMLA's
// quantiser leaves), or 0xFF (every bit set: a code test that lets byte 7 in sees a code > 134).
enum class Pad { kZero, kRandom, kAllOnes };
inline const char* pad_name(Pad p) {
  return p == Pad::kZero ? "zero" : (p == Pad::kRandom ? "random" : "0xFF");
}

struct CacheShape {
  int32_t block_size = 64;
  int64_t num_blocks = 32;
  bool aligned = true;      // engine page stride (multiple of 576); else bs*584 (odd bs: 8 mod 16)
  int code_max = 255;       // 254: sanitising writer
  double p_nan_byte = 0.0;  // per NoPE byte: 0x7F or 0xFF (scrubbed caches only)
  double p_big_tile = 0.0;  // per tile: quantised at codes 135..140 (the GPU exact path)
};

class Cache {
 public:
  Cache(Rng& rng, const CacheShape& s) : shape_(s) {
    const int64_t raw = int64_t{s.block_size} * Fp8DsMla::kBytesPerToken;
    const int64_t align = Fp8DsMla::kEnginePageAlign;
    stride_ = s.aligned ? (raw + align - 1) / align * align : raw;
    bytes_ = random_bytes(rng, static_cast<size_t>(stride_ * s.num_blocks));  // page padding: junk
    for (int64_t slot = 0; slot < num_slots(); ++slot) write_row(rng, slot);
  }

  CacheView view() const { return {bytes_.data(), shape_.num_blocks, shape_.block_size, stride_}; }
  int64_t num_slots() const { return shape_.num_blocks * shape_.block_size; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  uint8_t* scale_word(int64_t slot) {
    return bytes_.data() + mla_scale_offset(slot, shape_.block_size, stride_);
  }

  void set_pads(Pad pad, Rng& rng) {
    for (int64_t slot = 0; slot < num_slots(); ++slot) {
      uint8_t& b = scale_word(slot)[Fp8DsMla::kPadByte];
      b = static_cast<uint8_t>(
          pad == Pad::kZero ? 0 : (pad == Pad::kAllOnes ? 0xFF : rng.randint(0, 255)));
    }
  }

 private:
  void write_row(Rng& rng, int64_t slot) {
    uint8_t* data = bytes_.data() + mla_data_offset(slot, shape_.block_size, stride_);
    uint8_t* codes = scale_word(slot);
    float x[Fp8DsMla::kTileDims];
    for (int tile = 0; tile < Fp8DsMla::kNumTiles; ++tile) {
      latents(rng, x);
      uint8_t* bytes = data + tile * Fp8DsMla::kTileDims;
      int e = quantize_block(x, Fp8DsMla::kTileDims, bytes);
      if (rng.uniform(0, 1) < shape_.p_big_tile) {  // same quantiser, a larger exponent
        e = static_cast<int>(rng.randint(135, 140)) - 127;
        const float inv = quant_inv_scale(e);
        for (int i = 0; i < Fp8DsMla::kTileDims; ++i) bytes[i] = quant_element(x[i], inv);
      }
      codes[tile] = quant_code(e, shape_.code_max);
      for (int i = 0; i < Fp8DsMla::kTileDims; ++i) {
        if (rng.uniform(0, 1) < shape_.p_nan_byte) bytes[i] = rng.randint(0, 1) != 0 ? 0x7F : 0xFF;
      }
    }
    codes[Fp8DsMla::kPadByte] = 0;  // as this library's writers (CONTRACT 2.3)
    latents(rng, x);
    for (int k = 0; k < Fp8DsMla::kRopeDims; ++k) {
      const bf16_bits b = float_to_bf16(x[k]);  // x is bf16-exact
      data[Fp8DsMla::kRopeOffset + 2 * k] = static_cast<uint8_t>(b & 0xFF);
      data[Fp8DsMla::kRopeOffset + 2 * k + 1] = static_cast<uint8_t>(b >> 8);
    }
  }

  // 64 bf16-exact values N(0,1) x exp(0.7 N(0,1)) (one gain per tile).
  static void latents(Rng& rng, float* x) {
    const double gain = std::exp(0.7 * rng.normal());
    for (int i = 0; i < Fp8DsMla::kTileDims; ++i) {
      x[i] = round_to_bf16(static_cast<float>(rng.normal() * gain));
    }
  }

  CacheShape shape_;
  int64_t stride_ = 0;
  std::vector<uint8_t> bytes_;
};

struct List {
  std::vector<int32_t> indices;
  std::vector<int32_t> indptr{0};
  void add_row(const std::vector<int32_t>& row) {
    indices.insert(indices.end(), row.begin(), row.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  IndexList view() const {
    return {indices.data(), indptr.data(), static_cast<int64_t>(indices.size()), 0};
  }
};

// `len` distinct random slots of [0, n) (len <= n), a fraction p_invalid of them -1 (what the
// indexer and the window lists hold past a short context).
inline std::vector<int32_t> distinct_slots(Rng& rng, int64_t len, int64_t n, double p_invalid) {
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = 0; i < len; ++i) std::swap(all[i], all[rng.randint(i, n - 1)]);
  all.resize(static_cast<size_t>(len));
  for (auto& s : all) {
    if (rng.uniform(0, 1) < p_invalid) s = -1;
  }
  return all;
}

struct ProblemShape {
  int64_t T = 4;
  int32_t H = 32;
  int64_t window = 128;  // window keys per row (DSV4)
  int64_t topk = 512;    // ratio-4 keys per row
  bool aligned = true;   // false: unpadded page strides, odd page sizes (CONTRACT 2.1 byte loads)
  double p_big_tile = 0.0;
};

struct Problem {
  int64_t T = 0;
  int32_t H = 0;
  bool sanitised = false;
  std::vector<bf16_bits> q;  // [T, H, 512]
  std::optional<Cache> main, extra;
  List main_list, extra_list;
  std::vector<float> sink;  // [H]

  Problem(Rng& rng, const Layer& layer, const ProblemShape& s) : T(s.T), H(s.H) {
    sanitised = layer.kind != Kind::kWindow && layer.sanitised;
    q = random_bf16(rng, static_cast<size_t>(T * H * Fp8DsMla::kHeadDim));
    sink = random_f32(rng, static_cast<size_t>(H), 1.0, 0.5);
    CacheShape w;  // window: legacy codes, always scrubbed, so NaN bytes may occur
    w.block_size = s.aligned ? 64 : 61;
    w.num_blocks = 32;
    w.aligned = s.aligned;
    w.p_nan_byte = 2e-4;
    w.p_big_tile = s.p_big_tile;
    main.emplace(rng, w);
    for (int64_t t = 0; t < T; ++t) {
      main_list.add_row(distinct_slots(rng, s.window, main->num_slots(), 0.02));
    }
    if (layer.kind == Kind::kWindow) return;
    CacheShape x;
    x.aligned = s.aligned;
    x.code_max = sanitised ? kCodeMaxSanitising : kCodeMaxLegacy;
    x.p_nan_byte = sanitised ? 0.0 : 2e-4;  // a sanitising writer never emits one (CONTRACT 2.3)
    x.p_big_tile = s.p_big_tile;
    if (layer.kind == Kind::kRatio4) {
      x.block_size = s.aligned ? 64 : 63;
      x.num_blocks = std::max<int64_t>(64, 2 * s.topk / x.block_size);
    } else {  // ratio 128: 2-row pages (or 3, unaligned), every compressed row of the context
      x.block_size = s.aligned ? 2 : 3;
      x.num_blocks = 256;
    }
    extra.emplace(rng, x);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t len = layer.kind == Kind::kRatio4
                              ? s.topk
                              : rng.randint(16, std::min<int64_t>(400, extra->num_slots()));
      extra_list.add_row(
          distinct_slots(rng, len, extra->num_slots(), layer.kind == Kind::kRatio4 ? 0.02 : 0.0));
    }
  }

  void set_pads(Pad pad, Rng& rng) {
    main->set_pads(pad, rng);
    if (extra) extra->set_pads(pad, rng);
  }

  // Host pointers, the CPU path; out / lse / workspace are the caller's.
  DecodeParams params() const {
    DecodeParams p;
    p.num_tokens = T;
    p.num_heads = H;
    p.q = q.data();
    p.main_cache = main->view();
    p.main_list = main_list.view();
    p.has_extra = extra.has_value();
    if (extra) {
      p.extra_cache = extra->view();
      p.extra_list = extra_list.view();
    }
    p.extra_cache_sanitised = sanitised;
    p.sink = sink.data();
    p.path = Path::Cpu;
    return p;
  }
};

}  // namespace sparsemla::test::pad_byte
