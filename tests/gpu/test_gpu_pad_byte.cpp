// tests/gpu/test_gpu_pad_byte.cpp: the pad byte on the CUDA paths (CONTRACT 2.1). Byte 7 of each
// token's scale word is padding that real caches fill with anything (FlashMLA's quantiser leaves
// it uninitialised); the kernels test the scale word word-wise for their fast dequantisation, and
// when byte 7 took part about half the rows of such caches took the exact path (issue 22: whole
// decodes 1.6-1.75x slower). Two properties:
//  - PadByteGpu.*: every layer kind gives the same bits with pad bytes random or 0xFF as with 0,
//    on both paths, at batches that run each generic partial kernel and at 1, 2 and 3 splits.
//    The fast and exact dequantisations agree on every value (codes <= 134), so this catches a
//    pad byte that changes a value, not one that only picks the slower path; hence
//  - PadByteGpuFastPath.*: the kernels' own fast-path predicates (numerics_selfcheck.h), run on
//    the device over given scale words, accept every row whose 7 codes are <= 134 whatever its
//    pad byte, and no row with a code above.
// Data: reference/pad_byte_problem.h (model magnitudes from the library's quantiser, a few NaN
// bytes in scrubbed caches, a few tiles at codes 135..140 on the exact path).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/common/numerics_selfcheck.h"
#include "gpu_support.h"
#include "reference/pad_byte_problem.h"
#include "reference/random.h"
#include "sparsemla/decode.h"
#include "sparsemla/plan.h"

namespace sparsemla::test::pad_byte {
namespace {

constexpr int kDim = Fp8DsMla::kHeadDim;
// The SM count the calls plan and pick kernels for (the H200's), so that a batch runs the same
// generic kernel on every GPU.
constexpr int32_t kSms = 132;

using gpu_support::cuda_ok;
using gpu_support::device_is_sm90;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) cuda_ok(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size() * sizeof(T)) {
    upload(v.data());
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void upload(const void* src) {
    if (bytes_ > 0) cuda_ok(cudaMemcpy(ptr_, src, bytes_, cudaMemcpyHostToDevice), "upload");
  }
  template <typename T>
  void download(std::vector<T>& v) const {
    v.resize(bytes_ / sizeof(T));
    if (bytes_ > 0) cuda_ok(cudaMemcpy(v.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "download");
  }
  void fill(int byte) {
    if (bytes_ > 0) cuda_ok(cudaMemset(ptr_, byte, bytes_), "cudaMemset");
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The problem's inputs on the device; upload_caches() after the host pad bytes change.
struct DeviceProblem {
  DeviceBuffer q, main_cache, main_indices, main_indptr, sink;
  DeviceBuffer extra_cache, extra_indices, extra_indptr;
  const Problem& pb;

  explicit DeviceProblem(const Problem& problem)
      : q(problem.q),
        main_cache(problem.main->bytes()),
        main_indices(problem.main_list.indices),
        main_indptr(problem.main_list.indptr),
        sink(problem.sink),
        extra_cache(problem.extra ? problem.extra->bytes() : std::vector<uint8_t>{}),
        extra_indices(problem.extra ? problem.extra_list.indices : std::vector<int32_t>{}),
        extra_indptr(problem.extra ? problem.extra_list.indptr : std::vector<int32_t>{}),
        pb(problem) {}

  void upload_caches() {
    main_cache.upload(pb.main->bytes().data());
    if (pb.extra) extra_cache.upload(pb.extra->bytes().data());
  }

  DecodeParams params() const {
    DecodeParams p = pb.params();
    p.q = q.as<bf16_bits>();
    p.main_cache.base = main_cache.as<uint8_t>();
    p.main_list.indices = main_indices.as<int32_t>();
    p.main_list.indptr = main_indptr.as<int32_t>();
    if (p.has_extra) {
      p.extra_cache.base = extra_cache.as<uint8_t>();
      p.extra_list.indices = extra_indices.as<int32_t>();
      p.extra_list.indptr = extra_indptr.as<int32_t>();
    }
    p.sink = sink.as<float>();
    p.num_sms = kSms;
    return p;
  }
};

struct GpuRun {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
};

GpuRun run_gpu(const DeviceProblem& d, Path path, int32_t splits) {
  const int64_t rows = d.pb.T * d.pb.H;
  DeviceBuffer out(static_cast<size_t>(rows * kDim) * 2), lse(static_cast<size_t>(rows) * 4);
  out.fill(0xFF);  // NaN poison
  lse.fill(0xFF);
  DecodeParams p = d.params();
  p.path = path;
  p.num_splits = splits;
  p.out = out.as<bf16_bits>();
  p.lse = lse.as<float>();
  const size_t bytes = decode_workspace_size(d.pb.T, d.pb.H, splits);
  DeviceBuffer ws(bytes);
  ws.fill(0xFF);
  sparse_decode(p, ws.as<void>(), bytes);
  cuda_ok(cudaDeviceSynchronize(), "decode");
  GpuRun r;
  out.download(r.out);
  lse.download(r.lse);
  return r;
}

// The generic partial kernel a call runs (head_blocks_per_cta, decode_generic.cu): the most head
// blocks per CTA, 4 then 2, whose grid T x S x ceil(hb / n) still covers 3/4 of the SMs, else 1.
// HB = 4 is the warp-specialised kernel on sm_90+ (unless SPARSEMLA_GENERIC_WS=0, read once per
// process: run this suite again with it set to cover the 256-thread HB = 4 kernel there) and the
// 256-thread one elsewhere.
int32_t generic_head_blocks(int64_t T, int32_t S, int32_t H) {
  const int64_t hb = plan_head_blocks(H);
  for (int32_t n = hb >= 3 ? 4 : static_cast<int32_t>(hb); n > 1; n /= 2) {
    if (4 * T * S * ((hb + n - 1) / n) >= 3 * int64_t{kSms}) return n;
  }
  return 1;
}

template <typename T>
int64_t first_bit_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

struct Cell {
  int64_t T;
  int32_t H;
  int64_t topk;
};

// Batches 2 / 32 / 128 at 64 heads run HB = 1 / 2 / 4 at one split and at three (T x S = 96 is
// still HB = 2); the 128-head cell is the pro shape.
const std::vector<Cell> kCells = {{2, 64, 512}, {32, 64, 512}, {128, 64, 512}, {64, 128, 1024}};

class PadByteGpu : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    if (GetParam() == Path::CudaSm90 && !device_is_sm90()) {
      GTEST_SKIP() << "the cuda-sm90 path runs on cc 9.0 GPUs only";
    }
  }

  // Every layer kind at every cell and split count: pads random (two draws) and 0xFF against 0.
  void check_layers(bool aligned) {
    const uint64_t seed = fresh_seed();
    SPARSEMLA_SEED_TRACE(seed);
    Rng rng(seed);
    std::set<int32_t> head_blocks_run;
    for (const Layer& layer : all_layers()) {
      for (const Cell& cell : kCells) {
        ProblemShape shape;
        shape.T = cell.T;
        shape.H = cell.H;
        shape.topk = cell.topk;
        shape.aligned = aligned;
        shape.p_big_tile = 0.01;
        Problem pb(rng, layer, shape);
        DeviceProblem d(pb);
        for (int32_t splits : {1, 2, 3}) {
          const int32_t hb = generic_head_blocks(cell.T, splits, cell.H);
          if (GetParam() == Path::CudaGeneric) head_blocks_run.insert(hb);
          SCOPED_TRACE(std::string(layer.name) + " T=" + std::to_string(cell.T) +
                       " H=" + std::to_string(cell.H) + " S=" + std::to_string(splits) +
                       " generic HB=" + std::to_string(hb));
          pb.set_pads(Pad::kZero, rng);
          d.upload_caches();
          const GpuRun zero = run_gpu(d, GetParam(), splits);
          for (Pad pad : {Pad::kRandom, Pad::kRandom, Pad::kAllOnes}) {
            SCOPED_TRACE(std::string("pad=") + pad_name(pad));
            pb.set_pads(pad, rng);
            d.upload_caches();
            const GpuRun other = run_gpu(d, GetParam(), splits);
            ASSERT_EQ(first_bit_difference(zero.out, other.out), -1) << "out (t*H + h)*512 + d";
            ASSERT_EQ(first_bit_difference(zero.lse, other.lse), -1) << "lse t*H + h";
          }
        }
      }
    }
    if (GetParam() == Path::CudaGeneric) {
      EXPECT_EQ(head_blocks_run, (std::set<int32_t>{1, 2, 4})) << "a generic kernel not run";
    }
  }
};
INSTANTIATE_TEST_SUITE_P(Paths, PadByteGpu, ::testing::Values(Path::CudaGeneric, Path::CudaSm90),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return std::string(info.param == Path::CudaSm90 ? "Sm90" : "Generic");
                         });

TEST_P(PadByteGpu, EveryLayerKindBitsIgnorePadBytes) {
  check_layers(/*aligned=*/true);
}

// Unpadded page strides with odd page sizes (8 mod 16): the generic kernels' byte-wise loads of
// the scale word (load_scale8, CONTRACT 2.1). The sm90 path needs aligned caches.
TEST_P(PadByteGpu, UnalignedCachesBitsIgnorePadBytes) {
  if (GetParam() == Path::CudaSm90) GTEST_SKIP() << "the sm90 path takes 16-byte aligned caches";
  check_layers(/*aligned=*/false);
}

// ---- the fast-path predicates, counted ----------------------------------------------------------
// A scale word (little-endian) of 7 codes and a pad byte.
uint64_t scale_word(const uint8_t (&codes)[7], uint8_t pad) {
  uint64_t w = uint64_t{pad} << 56;
  for (int i = 0; i < 7; ++i) w |= uint64_t{codes[i]} << (8 * i);
  return w;
}

struct Counts {
  uint32_t shared = 0, generic = 0, generic_ws = 0, sm90 = 0;
  bool sm90_ran = false;
};

Counts device_counts(const std::vector<uint64_t>& words) {
  DeviceBuffer w(words), count(4 * sizeof(uint32_t));
  const int64_t n = static_cast<int64_t>(words.size());
  uint32_t* c = count.as<uint32_t>();
  cuda::device_fast_scale_count(w.as<uint64_t>(), n, c, nullptr);
  cuda_generic::device_rows_fast_count(w.as<uint64_t>(), n, /*ws=*/false, c + 1, nullptr);
  cuda_generic::device_rows_fast_count(w.as<uint64_t>(), n, /*ws=*/true, c + 2, nullptr);
  Counts r;
  r.sm90_ran = cuda_sm90::device_part_fast_count(w.as<uint64_t>(), n, c + 3, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "fast-path counts");
  std::vector<uint32_t> host;
  count.download(host);
  r.shared = host[0];
  r.generic = host[1];
  r.generic_ws = host[2];
  r.sm90 = r.sm90_ran ? host[3] : 0;
  return r;
}

void expect_counts(const std::vector<uint64_t>& words, uint32_t want) {
  const Counts c = device_counts(words);
  EXPECT_EQ(c.shared, want) << "scale_codes_fast";
  EXPECT_EQ(c.generic, want) << "rows_fast (256-thread kernel)";
  EXPECT_EQ(c.generic_ws, want) << "rows9_fast (warp-specialised kernel)";
  if (c.sm90_ran) {
    EXPECT_EQ(c.sm90, want) << "part_fast (sm90 kernel)";
  } else {
    EXPECT_FALSE(device_is_sm90()) << "the sm90 predicate did not run on a cc 9.0 GPU";
  }
}

// Codes 105..134 (every finite tile a writer emits at model magnitudes, up to the fast limit):
// every row fast, whatever its pad byte: random, 0xFF, or 135..255 (a pad byte that a word-wise
// code test would read as a code above 134).
TEST(PadByteGpuFastPath, RowsWithCodesUpTo134AreFastWhateverThePadByte) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int pads = 0; pads < 3; ++pads) {
    SCOPED_TRACE(pads == 0 ? "random pads" : (pads == 1 ? "pads 0xFF" : "pads 135..255"));
    std::vector<uint64_t> words(4096);
    for (auto& w : words) {
      uint8_t codes[7];
      for (auto& c : codes) c = static_cast<uint8_t>(rng.randint(105, 134));
      const int64_t pad =
          pads == 0 ? rng.randint(0, 255) : (pads == 1 ? 255 : rng.randint(135, 255));
      w = scale_word(codes, static_cast<uint8_t>(pad));
    }
    expect_counts(words, static_cast<uint32_t>(words.size()));
  }
}

// One tile at a code of 135..255 (the others at 105..134), any pad byte: no row fast.
TEST(PadByteGpuFastPath, RowsWithOneCodeAbove134AreNeverFast) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  std::vector<uint64_t> words(4096);
  for (size_t i = 0; i < words.size(); ++i) {
    uint8_t codes[7];
    for (auto& c : codes) c = static_cast<uint8_t>(rng.randint(105, 134));
    codes[i % 7] = static_cast<uint8_t>(i < 7 * 121 ? 135 + i / 7 : rng.randint(135, 255));
    words[i] = scale_word(codes, static_cast<uint8_t>(rng.randint(0, 255)));
  }
  expect_counts(words, 0);
}

// Every code 0..255 at every tile position, pads random: fast exactly when all 7 codes <= 134.
TEST(PadByteGpuFastPath, MixedRowsCountAsTheirCodesSay) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  std::vector<uint64_t> words;
  uint32_t want = 0;
  for (int tile = 0; tile < 7; ++tile) {
    for (int code = 0; code < 256; ++code) {
      uint8_t codes[7];
      for (auto& c : codes)
        c = static_cast<uint8_t>(rng.uniform(0, 1) < 0.9 ? rng.randint(0, 134)
                                                         : rng.randint(0, 255));
      codes[tile] = static_cast<uint8_t>(code);
      bool fast = true;
      for (uint8_t c : codes) fast = fast && c <= 134;
      want += fast ? 1 : 0;
      words.push_back(scale_word(codes, static_cast<uint8_t>(rng.randint(0, 255))));
    }
  }
  expect_counts(words, want);
}

}  // namespace
}  // namespace sparsemla::test::pad_byte
