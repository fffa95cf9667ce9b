// The pad byte (CONTRACT 2.1): byte 7 of each token's scale word carries no information, and real
// caches hold anything there (FlashMLA's quantiser leaves it uninitialised), so no reader may let
// it change a result. On the CPU: the fast decode (Path::Cpu, 1 and 3 splits), the float64
// reference (with the scrub decisions of the CPU path and, for sanitised extra caches, of the
// specialised path, whose gate skips the extra scrub: CONTRACT 5) and dequantize_row give the same
// bits with every pad byte 0, random or 0xFF, for every layer kind (reference/pad_byte_problem.h:
// model-magnitude rows from the library's quantiser, a few NaN bytes in scrubbed caches and a few
// tiles at codes 135..140). tests/gpu/test_gpu_pad_byte.cpp holds the same for both CUDA paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "reference/pad_byte_problem.h"
#include "reference/random.h"
#include "sparsemla/decode.h"
#include "sparsemla/writer.h"

namespace sparsemla::test::pad_byte {
namespace {

constexpr int kDim = Fp8DsMla::kHeadDim;
constexpr Pad kOtherPads[] = {Pad::kRandom, Pad::kRandom, Pad::kAllOnes};  // two random draws

struct CpuRun {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
};

CpuRun run_cpu(const Problem& pb, int32_t splits) {
  CpuRun r;
  r.out.assign(static_cast<size_t>(pb.T * pb.H * kDim), bf16_bits{0x7FC1});
  r.lse.assign(static_cast<size_t>(pb.T * pb.H), std::nanf(""));
  DecodeParams p = pb.params();
  p.out = r.out.data();
  p.lse = r.lse.data();
  p.num_splits = splits;
  const size_t bytes = decode_workspace_size(pb.T, pb.H, decode_num_splits(p));
  std::vector<float> workspace(bytes / sizeof(float), std::nanf(""));
  sparse_decode(p, workspace.data(), bytes);
  return r;
}

struct RefRun {
  std::vector<double> out, lse, abs_mean;
};

// path picks the reference's scrub decisions (CONTRACT 5): Cpu always scrubs the extra cache,
// CudaSm90 skips it when the gate holds.
RefRun run_reference(const Problem& pb, Path path) {
  RefRun r;
  const size_t n = static_cast<size_t>(pb.T * pb.H);
  r.out.assign(n * kDim, std::nan(""));
  r.lse.assign(n, std::nan(""));
  r.abs_mean.assign(n * kDim, std::nan(""));
  DecodeParams p = pb.params();
  p.path = path;
  sparse_decode_reference(p, r.out.data(), r.lse.data(), r.abs_mean.data());
  return r;
}

// Index of the first element whose bits differ, or -1.
template <typename T>
int64_t first_bit_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// The outputs are a real decode, not a constant: nearly every element finite and nonzero (NaN only
// where no scrub removes a NaN byte, which these caches never hold unscrubbed).
void expect_real_output(const std::vector<bf16_bits>& out) {
  int64_t live = 0;
  for (bf16_bits b : out) {
    const float v = bf16_to_float(b);
    live += std::isfinite(v) && v != 0.0f;
  }
  EXPECT_GE(live, static_cast<int64_t>(out.size() * 9 / 10)) << "of " << out.size();
}

class PadByteCpu : public ::testing::TestWithParam<Layer> {};

TEST_P(PadByteCpu, FastDecodeBitsIgnorePadBytes) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  ProblemShape shape;
  shape.p_big_tile = 0.02;
  Problem pb(rng, GetParam(), shape);
  for (int32_t splits : {1, 3}) {
    SCOPED_TRACE("splits=" + std::to_string(splits));
    pb.set_pads(Pad::kZero, rng);
    const CpuRun zero = run_cpu(pb, splits);
    expect_real_output(zero.out);
    for (Pad pad : kOtherPads) {
      SCOPED_TRACE(std::string("pad=") + pad_name(pad));
      pb.set_pads(pad, rng);
      const CpuRun other = run_cpu(pb, splits);
      EXPECT_EQ(first_bit_difference(zero.out, other.out), -1) << "out element (t*H + h)*512 + d";
      EXPECT_EQ(first_bit_difference(zero.lse, other.lse), -1) << "lse element t*H + h";
    }
  }
}

TEST_P(PadByteCpu, ReferenceBitsIgnorePadBytes) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  ProblemShape shape;
  shape.T = 2;
  shape.H = 16;
  shape.p_big_tile = 0.02;
  Problem pb(rng, GetParam(), shape);
  // Sanitised extra caches: also the specialised path's decisions, which skip the extra scrub.
  std::vector<Path> paths{Path::Cpu};
  if (pb.sanitised) paths.push_back(Path::CudaSm90);
  for (Path path : paths) {
    SCOPED_TRACE(std::string("scrub decisions of ") + path_name(path));
    pb.set_pads(Pad::kZero, rng);
    const RefRun zero = run_reference(pb, path);
    for (Pad pad : kOtherPads) {
      SCOPED_TRACE(std::string("pad=") + pad_name(pad));
      pb.set_pads(pad, rng);
      const RefRun other = run_reference(pb, path);
      EXPECT_EQ(first_bit_difference(zero.out, other.out), -1) << "out element (t*H + h)*512 + d";
      EXPECT_EQ(first_bit_difference(zero.lse, other.lse), -1) << "lse element t*H + h";
      EXPECT_EQ(first_bit_difference(zero.abs_mean, other.abs_mean), -1) << "abs_mean element";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, PadByteCpu, ::testing::ValuesIn(all_layers()),
                         [](const ::testing::TestParamInfo<Layer>& i) {
                           return std::string(i.param.name);
                         });

// dequantize_row gives the same floats for every one of the 256 pad values, scrubbed or not, on
// rows with NaN bytes, large-code tiles and the code edges 0, 134, 135, 254 and 255 (+inf scale).
TEST(PadByteCpuRow, DequantizeRowIgnoresPadByte) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  CacheShape s;
  s.block_size = 16;
  s.num_blocks = 4;
  s.p_nan_byte = 0.01;
  s.p_big_tile = 0.1;
  Cache cache(rng, s);
  const uint8_t edges[] = {0, 134, 135, 254, 255};
  for (int64_t slot = 0; slot < cache.num_slots(); slot += 3) {
    uint8_t* word = cache.scale_word(slot);
    word[rng.randint(0, Fp8DsMla::kNumTiles - 1)] = edges[rng.randint(0, 4)];
  }
  int64_t differing = 0, rows = 0;
  for (int64_t slot = 0; slot < cache.num_slots(); ++slot) {
    uint8_t& pad = cache.scale_word(slot)[Fp8DsMla::kPadByte];
    for (bool scrub : {false, true}) {
      pad = 0;
      std::vector<float> zero(kDim), other(kDim);
      dequantize_row(cache.view(), slot, scrub, zero.data());
      for (int v = 1; v < 256; ++v) {
        pad = static_cast<uint8_t>(v);
        dequantize_row(cache.view(), slot, scrub, other.data());
        if (std::memcmp(zero.data(), other.data(), kDim * sizeof(float)) != 0) {
          ADD_FAILURE() << "slot " << slot << " scrub " << scrub << " pad " << v;
          if (++differing > 4) return;
        }
      }
      ++rows;
    }
  }
  EXPECT_EQ(rows, 2 * cache.num_slots());
}

}  // namespace
}  // namespace sparsemla::test::pad_byte
