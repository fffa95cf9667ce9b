// tests/cpp/test_cpu_isa.cpp: the CPU backend's instruction-set levels (src/cpu/isa.h). Every level
// this CPU supports is checked against the baseline here, in one process; scripts/test also runs
// the whole CPU suite once per level through SPARSEMLA_CPU_ISA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/tuning.h"
#include "cpu/decode_kernels.h"
#include "cpu/isa.h"
#include "sparsemla/format.h"

namespace sparsemla::cpu {
namespace {

std::vector<CpuIsa> supported_levels() {
  std::vector<CpuIsa> levels;
  for (CpuIsa isa : {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (cpu_supports(isa)) levels.push_back(isa);
  }
  return levels;
}

TEST(CpuIsa, TheProcessRunsTheForcedOrTheBestLevel) {
  ASSERT_TRUE(cpu_supports(CpuIsa::Baseline));
  const core::CpuIsaChoice forced = core::tuning().cpu_isa;
  const CpuIsa best = supported_levels().back();
  const CpuIsa expected = forced == core::CpuIsaChoice::Baseline ? CpuIsa::Baseline
                          : forced == core::CpuIsaChoice::Avx2   ? CpuIsa::Avx2
                          : forced == core::CpuIsaChoice::Avx512 ? CpuIsa::Avx512
                                                                 : best;
  EXPECT_EQ(cpu_isa(), expected) << cpu_isa_name(cpu_isa());
  // A wider level implies the narrower ones (the dispatcher falls back in that order).
  if (cpu_supports(CpuIsa::Avx512)) {
    EXPECT_TRUE(cpu_supports(CpuIsa::Avx2));
  }
}

// One page of `rows` rows: every e4m3 byte value in every NoPE tile position, every scale code
// class (0: subnormal scale, < 8: bf16-rounded tiles, 246/247: the two multiply paths, 254, 255:
// +inf), RoPE bf16 values with NaN, +-inf and -0 among them.
struct TestPage {
  static constexpr int kRows = 64;
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kRows * Fp8DsMla::kBytesPerToken);
  CacheView view() const { return {bytes.data(), 1, kRows, static_cast<int64_t>(bytes.size())}; }
  TestPage() {
    const uint8_t codes[] = {0, 1, 7, 8, 100, 127, 140, 246, 247, 250, 254, 255};
    const uint16_t rope_specials[] = {0x7FC0, 0xFF81, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x3F80};
    std::mt19937 rng(29);
    for (int r = 0; r < kRows; ++r) {
      uint8_t* data = bytes.data() + mla_data_offset(r, kRows, bytes.size());
      uint8_t* scale = bytes.data() + mla_scale_offset(r, kRows, bytes.size());
      for (int d = 0; d < Fp8DsMla::kNopeDims; ++d) data[d] = static_cast<uint8_t>(d * 7 + r * 5);
      for (int t = 0; t < Fp8DsMla::kNumTiles; ++t)
        scale[t] = codes[(r + 3 * t) % std::size(codes)];
      for (int k = 0; k < Fp8DsMla::kRopeDims; ++k) {
        const uint16_t v = k % 9 == 0 ? rope_specials[(k / 9 + r) % std::size(rope_specials)]
                                      : static_cast<uint16_t>(rng());
        data[Fp8DsMla::kRopeOffset + 2 * k] = static_cast<uint8_t>(v & 0xFF);
        data[Fp8DsMla::kRopeOffset + 2 * k + 1] = static_cast<uint8_t>(v >> 8);
      }
    }
  }
};

bool same_value(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;  // bits: -0 and +0 differ
}

// The F16C dequantisation of the wider levels is value for value the baseline table's.
TEST(CpuIsa, EveryLevelDequantisesKeysLikeTheBaseline) {
  const TestPage page;
  for (CpuIsa isa : supported_levels()) {
    for (bool scrub : {false, true}) {
      for (int r = 0; r < TestPage::kRows; ++r) {
        float want[kDecodeDim], got[kDecodeDim];
        baseline::kKernels.load_key(page.view(), r, scrub, want);
        decode_kernels_for(isa).load_key(page.view(), r, scrub, got);
        for (int d = 0; d < kDecodeDim; ++d) {
          ASSERT_TRUE(same_value(got[d], want[d]))
              << cpu_isa_name(isa) << " scrub " << scrub << " row " << r << " dim " << d << ": "
              << got[d] << " vs " << want[d];
          if (scrub) {
            ASSERT_FALSE(std::isnan(got[d]));
          }
        }
      }
    }
  }
}

// The softmax's exp: <= 4 ulp from e^x on [-87.3, 0] (the probabilities are then rounded to bf16,
// 2^-8 relative, CONTRACT 9.9), exactly 1 at 0, 0 below ln(FLT_MIN) and at -inf, NaN kept.
TEST(CpuIsa, EveryLevelsExpIsAccurateAndKeepsTheSpecialValues) {
  std::vector<float> x;
  for (float v = -87.3f; v <= 0.0f; v += 0.0137f) x.push_back(v);
  x.push_back(0.0f);
  x.push_back(-0.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {-inf, -88.0f, -1e30f, std::nanf(""), 10.0f, 100.0f};
  for (CpuIsa isa : supported_levels()) {
    std::vector<float> y(x.size()), ys(specials.size());
    decode_kernels_for(isa).exp_values(x.data(), static_cast<int>(x.size()), y.data());
    double worst_ulps = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(static_cast<double>(x[i]));
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
      worst_ulps = std::max(worst_ulps, std::fabs(y[i] - want) / ulp);
    }
    EXPECT_LE(worst_ulps, 4.0) << cpu_isa_name(isa);
    EXPECT_EQ(y.back(), 1.0f);
    decode_kernels_for(isa).exp_values(specials.data(), static_cast<int>(specials.size()),
                                       ys.data());
    EXPECT_EQ(ys[0], 0.0f);
    EXPECT_EQ(ys[1], 0.0f);
    EXPECT_EQ(ys[2], 0.0f);
    EXPECT_TRUE(std::isnan(ys[3]));
    EXPECT_NEAR(ys[4], std::exp(10.0f), 4e-7 * std::exp(10.0f));
    EXPECT_EQ(ys[5], inf);
  }
}

}  // namespace
}  // namespace sparsemla::cpu
