// The NaN provenance gate (CONTRACT 5) and the architecture gate (CONTRACT 7): pure functions,
// tested exhaustively where the inputs allow.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sparsemla/backend.h"
#include "sparsemla/error.h"

namespace sparsemla {
namespace {

// ---- Provenance gate: all 32 combinations of the five inputs ------------------------------------

TEST(ProvenanceGate, FullTruthTableOfFiveInputs) {
  int skipped = 0;
  for (int bits = 0; bits < 32; ++bits) {
    ProvenanceGateInputs in;
    in.specialised_path = (bits & 1) != 0;
    in.format_is_fp8_ds_mla = (bits & 2) != 0;
    in.kv_connector = (bits & 4) != 0;
    in.has_extra_cache = (bits & 8) != 0;
    in.extra_cache_sanitised = (bits & 16) != 0;
    // Exactly one row skips the scrub: specialised, fp8_ds_mla, no connector, extra cache present,
    // asserted sanitised (bits 1, 2, 8, 16 set; bit 4 clear).
    const bool expected = bits == (1 | 2 | 8 | 16);
    EXPECT_EQ(may_skip_extra_scrub(in), expected)
        << "specialised=" << in.specialised_path << " fp8_ds_mla=" << in.format_is_fp8_ds_mla
        << " connector=" << in.kv_connector << " has_extra=" << in.has_extra_cache
        << " sanitised=" << in.extra_cache_sanitised;
    skipped += may_skip_extra_scrub(in) ? 1 : 0;
  }
  EXPECT_EQ(skipped, 1);
}

TEST(ProvenanceGate, DefaultsScrub) {
  // A default-constructed input (generic path, nothing asserted) must scrub.
  EXPECT_FALSE(may_skip_extra_scrub(ProvenanceGateInputs{}));
}

// ---- Architecture gate
// ---------------------------------------------------------------------------

ArchGateInputs arch(int major, int minor, bool kernels, bool aligned, Path requested = Path::Auto) {
  ArchGateInputs in;
  in.cc_major = major;
  in.cc_minor = minor;
  in.have_sm90a_kernels = kernels;
  in.caches_fast_aligned = aligned;
  in.requested = requested;
  return in;
}

TEST(ArchGate, HopperWithSm90aKernelsAndAlignedCachesTakesSm90) {
  EXPECT_EQ(select_gpu_path(arch(9, 0, true, true)), Path::CudaSm90);
  EXPECT_EQ(select_gpu_path(arch(9, 0, true, true, Path::CudaSm90)), Path::CudaSm90);
}

TEST(ArchGate, EverythingElseTakesGeneric) {
  struct Case {
    int major, minor;
    bool kernels, aligned;
    const char* what;
  };
  const std::vector<Case> cases = {
      {8, 0, true, true, "A100 (8.0)"},
      {8, 6, true, true, "8.6"},
      {8, 9, true, true, "Ada (8.9)"},
      {9, 0, true, false, "9.0 with unaligned caches (odd bs, unpadded stride)"},
      {9, 0, false, true, "9.0 without sm_90a kernels in the build"},
      {9, 0, false, false, "9.0 without kernels or alignment"},
      {10, 0, true, true, "Blackwell (10.0)"},
      {10, 3, true, true, "10.3"},
      {12, 0, true, true, "12.0"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(select_gpu_path(arch(c.major, c.minor, c.kernels, c.aligned)), Path::CudaGeneric)
        << c.what;
  }
}

TEST(ArchGate, ForcedGenericAlwaysGeneric) {
  for (int major : {8, 9, 10, 12}) {
    for (bool kernels : {false, true}) {
      for (bool aligned : {false, true}) {
        EXPECT_EQ(select_gpu_path(arch(major, 0, kernels, aligned, Path::CudaGeneric)),
                  Path::CudaGeneric)
            << major << ".0 kernels=" << kernels << " aligned=" << aligned;
      }
    }
  }
}

TEST(ArchGate, ForcedSm90WhereUnsupportedThrowsNamingPath) {
  const std::vector<ArchGateInputs> unsupported = {
      arch(8, 0, true, true, Path::CudaSm90),  arch(8, 9, true, true, Path::CudaSm90),
      arch(9, 0, true, false, Path::CudaSm90), arch(9, 0, false, true, Path::CudaSm90),
      arch(10, 0, true, true, Path::CudaSm90), arch(12, 0, true, true, Path::CudaSm90),
  };
  for (const auto& in : unsupported) {
    try {
      select_gpu_path(in);
      ADD_FAILURE() << "forcing cuda-sm90 on cc " << in.cc_major << "." << in.cc_minor
                    << " kernels=" << in.have_sm90a_kernels << " aligned=" << in.caches_fast_aligned
                    << " must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'path'"), std::string::npos) << e.what();
    }
  }
}

// ---- Path names
// -----------------------------------------------------------------------------------

TEST(PathNames, ParseAndNameRoundTrip) {
  for (Path p : {Path::Auto, Path::Cpu, Path::CudaGeneric, Path::CudaSm90}) {
    EXPECT_EQ(parse_path(path_name(p)), p) << path_name(p);
  }
  EXPECT_EQ(std::string(path_name(Path::Auto)), "auto");
  EXPECT_EQ(std::string(path_name(Path::Cpu)), "cpu");
  EXPECT_EQ(std::string(path_name(Path::CudaGeneric)), "cuda-generic");
  EXPECT_EQ(std::string(path_name(Path::CudaSm90)), "cuda-sm90");
}

TEST(PathNames, UnknownNameThrowsNamingArgument) {
  for (const char* bad : {"", "gpu", "sm90", "cuda_sm90", "cpu "}) {
    try {
      parse_path(bad);
      ADD_FAILURE() << "parse_path(\"" << bad << "\") must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'name'"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace sparsemla
