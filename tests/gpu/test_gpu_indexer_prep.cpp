// tests/gpu/test_gpu_indexer_prep.cpp: the CUDA generic indexer query prep (CONTRACT 11.6) against
// the CPU backend on the same bytes, which tests/cpp/test_indexer_prep.cpp holds to an independent
// implementation. The kernel runs the CPU's fp32 operations one by one (src/cuda/generic/
// indexer_prep.cu), so every output is identical: e4m3 bytes byte for byte, weights bit for bit
// (NaN compared as NaN: its payload differs between host and device arithmetic). Random inputs at
// model magnitudes for H in {1, 16, 64, 128}, dense and strided; the exponent edges of CONTRACT
// 11.8 (item 8; the CPU test's generator, tests/cpp/reference/indexer_prep_reference.h); padding
// rows and positions past the table (device values: a padding row, where the CPU rejects the call);
// CUDA-graph replay with changed positions and queries; rejected calls write nothing. Every device
// output is poisoned first, with the CPU's output buffers poisoned alike, and whole buffers are
// compared, so the gaps of strided outputs show any write outside the rows.
//
// Fresh random data per run (SPARSEMLA_TEST_SEED reproduces one).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "reference/indexer_prep_reference.h"
#include "reference/random.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer_prep.h"

namespace sparsemla::test::gpu_indexer_prep {
namespace {

using gpu_support::cuda_ok;
using gpu_support::DeviceBuffer;
using gpu_support::to_device;
using prep_ref::kPrepDim;
using prep_ref::make_case;
using prep_ref::PrepCase;

// The poison of every output buffer, host and device alike: bytes 0xA5, weights 777.0f (make_case).
constexpr uint8_t kPoisonByte = 0xA5;
constexpr float kPoisonWeight = 777.0f;

// The case's arrays on the device; outputs start as the host case's (poisoned) buffers.
struct DevicePrep {
  DeviceBuffer q, pos, rope, w_raw, q_out, w_out;
  explicit DevicePrep(const PrepCase& c)
      : q(to_device(c.q)),
        pos(to_device(c.pos)),
        rope(to_device(c.rope)),
        w_raw(to_device(c.w_raw)),
        q_out(to_device(c.q_out)),
        w_out(to_device(c.w_out)) {}
  // The outputs back to the poison (not to c's buffers: run_cpu overwrites those with results).
  void poison(const PrepCase& c) {
    q_out.fill(kPoisonByte);
    const std::vector<float> w(c.w_out.size(), kPoisonWeight);
    w_out.upload(w.data(), w.size() * 4);
  }
  IndexerQPrepParams params(PrepCase& c, Path path = Path::CudaGeneric) const {
    IndexerQPrepParams p = c.params();
    p.q = q.as<bf16_bits>();
    p.positions = pos.as<int64_t>();
    p.rope.data = rope.as<float>();
    p.w_raw = w_raw.as<bf16_bits>();
    p.q_out = q_out.as<uint8_t>();
    p.w_out = w_out.as<float>();
    p.path = path;
    return p;
  }
  std::vector<uint8_t> bytes(const PrepCase& c) const {
    std::vector<uint8_t> v(c.q_out.size());
    q_out.download(v.data(), v.size());
    return v;
  }
  std::vector<float> weights(const PrepCase& c) const {
    std::vector<float> v(c.w_out.size());
    w_out.download(v.data(), v.size() * 4);
    return v;
  }
};

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;  // bits: -0 and +0 differ
}

// Whole output buffers (rows and gaps): GPU == CPU.
void expect_identical(const PrepCase& cpu, const std::vector<uint8_t>& gpu_bytes,
                      const std::vector<float>& gpu_w, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(cpu.q_out.size(), gpu_bytes.size());
  ASSERT_EQ(cpu.w_out.size(), gpu_w.size());
  int reported = 0;
  for (size_t i = 0; i < gpu_bytes.size(); ++i) {
    if (cpu.q_out[i] != gpu_bytes[i] && reported++ < 10) {
      ADD_FAILURE() << "q_out byte " << i << " (t " << static_cast<int64_t>(i) / cpu.ost()
                    << "): cpu 0x" << std::hex << int{cpu.q_out[i]} << " gpu 0x"
                    << int{gpu_bytes[i]} << std::dec;
    }
  }
  for (size_t i = 0; i < gpu_w.size(); ++i) {
    if (!same_float(cpu.w_out[i], gpu_w[i]) && reported++ < 20) {
      ADD_FAILURE() << "w_out element " << i << ": cpu " << cpu.w_out[i] << " gpu " << gpu_w[i];
    }
  }
  EXPECT_EQ(reported, 0) << reported << " mismatching elements";
}

// The CPU backend on the host case, its outputs poisoned first.
void run_cpu(PrepCase& c) {
  std::fill(c.q_out.begin(), c.q_out.end(), kPoisonByte);
  std::fill(c.w_out.begin(), c.w_out.end(), kPoisonWeight);
  indexer_q_prep(c.params());
}

// One eager call on the device (poisoned outputs) and the CPU on the same bytes: identical.
void expect_gpu_equals_cpu(PrepCase& c, const std::string& what, Path path = Path::CudaGeneric) {
  DevicePrep d(c);
  indexer_q_prep(d.params(c, path));
  cuda_ok(cudaDeviceSynchronize(), "indexer_q_prep");
  run_cpu(c);
  expect_identical(c, d.bytes(c), d.weights(c), what);
}

// ---- bit-identical to the CPU -------------------------------------------------------------------

// Random rows at model magnitudes (q ~ N(0, 4), w_raw ~ N(0, 1), positions over a 4096-row
// table), H in {1, 16, 64, 128}, dense and strided inputs and outputs; T = 1, 37 and 300 (at H =
// 128: 38,400 rows, 4,800 CTAs of 8 row-warps); then Path::Auto on device pointers.
TEST(GpuIndexerPrepGeneric, RandomModelMagnitudesBitIdenticalToCpuH1H16H64H128DenseAndStrided) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (int32_t H : {1, 16, 64, 128}) {
    for (bool strided : {false, true}) {
      for (int64_t T : {int64_t{1}, int64_t{37}, int64_t{300}}) {
        PrepCase c = make_case(rng, T, H, strided);
        expect_gpu_equals_cpu(c, "H " + std::to_string(H) + (strided ? " strided" : " dense") +
                                     " T " + std::to_string(T));
      }
    }
  }
  // Path::Auto with device pointers takes the CUDA path: the same bytes.
  PrepCase c = make_case(rng, 9, 64, true);
  expect_gpu_equals_cpu(c, "auto", Path::Auto);
}

// The exponent edges of CONTRACT 11.8 (item 8) (amax below 1e-4, exactly 448 * 2^k, one bf16 ulp
// above, all zero, NaN, +inf, -inf with w_raw 0), then padding rows (negative positions) and
// positions at and past the end of the table (device values: written as padding rows; the CPU,
// which rejects them, is given -1 there), dense and strided; also odd strides that defeat the
// kernel's vector loads and stores (q rows at 2-byte, outputs at 1-byte alignment).
TEST(GpuIndexerPrepGeneric, ExponentEdgesPaddingRowsAndOutOfTablePositionsBitIdenticalToCpuH4) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  for (bool strided : {false, true}) {
    SCOPED_TRACE(strided ? "strided" : "dense");
    PrepCase c = make_case(rng, 11, 4, strided);
    prep_ref::fill_exponent_edges(c);  // rows 0..5
    c.pos[6] = -1;
    c.pos[7] = std::numeric_limits<int64_t>::min();
    c.pos[8] = c.P;  // one past the table
    c.pos[9] = std::numeric_limits<int64_t>::max();
    c.pos[10] = c.P - 1;  // the last row of the table
    DevicePrep d(c);
    indexer_q_prep(d.params(c));
    cuda_ok(cudaDeviceSynchronize(), "indexer_q_prep");
    PrepCase host = c;
    host.pos[8] = -1;
    host.pos[9] = -1;
    run_cpu(host);
    const std::vector<uint8_t> bytes = d.bytes(c);
    const std::vector<float> w = d.weights(c);
    expect_identical(host, bytes, w, "edges");
    EXPECT_EQ(bytes[1 * c.ost() + 5], 0x7E);  // 448 * 2^k scales to exactly 448
    EXPECT_EQ(bytes[2 * c.ost() + 9], 0x76);  // one ulp above: e = k + 1
    EXPECT_TRUE(std::isinf(w[5 * c.wost() + 1]));
    EXPECT_TRUE(std::isnan(w[5 * c.wost() + 2]));
    for (int64_t t : {6, 7, 8, 9}) {
      for (int h = 0; h < c.H; ++h) {
        for (int dd = 0; dd < kPrepDim; ++dd) {
          ASSERT_EQ(bytes[t * c.ost() + h * c.osh() + dd], 0) << "t " << t << " h " << h;
        }
        EXPECT_EQ(w[t * c.wost() + h], 0.0f) << "t " << t << " h " << h;
      }
    }
  }
  // Unaligned rows: q at odd element offsets (2-byte aligned), outputs at odd byte offsets.
  PrepCase c = make_case(rng, 13, 16, false);
  c.q_sh = kPrepDim + 1;
  c.q_st = c.q_sh * c.H + 3;
  c.o_sh = kPrepDim + 3;
  c.o_st = c.o_sh * c.H + 5;
  c.q = random_bf16(rng, static_cast<size_t>(c.T * c.qst() + 16), 2.0);
  c.q_out.assign(static_cast<size_t>(c.T * c.ost() + 8), kPoisonByte);
  expect_gpu_equals_cpu(c, "unaligned strides");
}

// ---- graphs -------------------------------------------------------------------------------------

// One call captured on a stream (T = 64, H = 64, strided), replayed after positions and queries
// are rewritten on the device (new rows, then padding and out-of-table rows): every replay equals
// an eager call on the same inputs and the CPU.
TEST(GpuIndexerPrepGeneric, GraphCaptureReplayWithChangedPositionsAndQueriesEqualsEagerT64H64) {
  const uint64_t seed = fresh_seed();
  SPARSEMLA_SEED_TRACE(seed);
  Rng rng(seed);
  PrepCase c = make_case(rng, 64, 64, true);
  DevicePrep d(c);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  IndexerQPrepParams p = d.params(c);
  p.stream = stream;
  indexer_q_prep(p);  // warm-up outside the capture
  cuda_ok(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  indexer_q_prep(p);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    PrepCase next = make_case(rng, c.T, c.H, true);  // same shapes and strides, new values
    c.q = next.q;
    c.w_raw = next.w_raw;
    c.pos = next.pos;
    if (step == 2) {
      for (int64_t t = 0; t < c.T; t += 5) c.pos[t] = -1;
    }
    d.q.upload(c.q.data(), c.q.size() * 2);
    d.w_raw.upload(c.w_raw.data(), c.w_raw.size() * 2);
    d.pos.upload(c.pos.data(), c.pos.size() * 8);
    d.poison(c);
    cuda_ok(cudaDeviceSynchronize(), "inputs");  // copies on the legacy stream, replay on `stream`
    cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
    cuda_ok(cudaStreamSynchronize(stream), "replay");
    const std::vector<uint8_t> replay_bytes = d.bytes(c);
    const std::vector<float> replay_w = d.weights(c);
    d.poison(c);
    indexer_q_prep(p);
    cuda_ok(cudaStreamSynchronize(stream), "eager");
    run_cpu(c);
    expect_identical(c, replay_bytes, replay_w, "replay vs cpu");
    expect_identical(c, d.bytes(c), d.weights(c), "eager vs cpu");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- host errors --------------------------------------------------------------------------------

// Rejected calls name the argument and write nothing: cuda-sm90 (no Hopper-specific prep), host
// pointers on cuda-generic, device pointers on the cpu path, arrays on both sides (each input
// named), invalid shapes on device pointers. T = 0 on cuda-generic needs no pointers.
TEST(GpuIndexerPrepGeneric, RejectedCallsNameTheArgumentAndWriteNothing) {
  Rng rng(11);
  PrepCase c = make_case(rng, 5, 8, true);
  DevicePrep d(c);
  const auto expect_error = [&](const IndexerQPrepParams& p, const std::string& arg) {
    try {
      indexer_q_prep(p);
      ADD_FAILURE() << "accepted; expected an error naming " << arg;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos)
          << e.what();
    }
  };
  const IndexerQPrepParams dev = d.params(c);
  IndexerQPrepParams p = dev;
  p.path = Path::CudaSm90;
  expect_error(p, "path");
  p = dev;
  p.path = Path::Cpu;  // device pointers on the cpu path
  expect_error(p, "path");
  p = c.params();
  p.path = Path::CudaGeneric;  // host pointers on a CUDA path
  expect_error(p, "path");
  const PrepCase& hc = c;
  p = dev;
  p.q = hc.q.data();
  expect_error(p, "q");
  p = dev;
  p.positions = hc.pos.data();
  expect_error(p, "positions");
  p = dev;
  p.rope.data = hc.rope.data();
  expect_error(p, "rope");
  p = dev;
  p.w_raw = hc.w_raw.data();
  expect_error(p, "w_raw");
  p = dev;
  p.path = Path::Auto;
  p.q_out = c.q_out.data();  // device w_out, host q_out
  expect_error(p, "q_out");
  p = c.params();
  p.path = Path::Auto;
  p.q = d.q.as<bf16_bits>();  // host w_out (the cpu path), device q
  expect_error(p, "q");
  p = dev;
  p.num_heads = 0;
  expect_error(p, "num_heads");
  p = dev;
  p.w_out_stride = 2;
  expect_error(p, "w_out_stride");
  cuda_ok(cudaDeviceSynchronize(), "rejected calls");
  const std::vector<uint8_t> bytes = d.bytes(c);
  const std::vector<float> w = d.weights(c);
  EXPECT_EQ(bytes, c.q_out) << "a rejected call wrote q_out";
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(w[i], kPoisonWeight) << "w_out " << i;
  IndexerQPrepParams empty;
  empty.num_heads = 64;
  empty.path = Path::CudaGeneric;
  EXPECT_NO_THROW(indexer_q_prep(empty));
  // And the accepted call on the same buffers afterwards equals the CPU.
  indexer_q_prep(dev);
  cuda_ok(cudaDeviceSynchronize(), "accepted call");
  run_cpu(c);
  expect_identical(c, d.bytes(c), d.weights(c), "after the rejected calls");
}

}  // namespace
}  // namespace sparsemla::test::gpu_indexer_prep
