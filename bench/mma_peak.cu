// bench/mma_peak.cu: `sparsemla bench --mma-peak`: the ceiling of the portable decode path's
// tensor work on this GPU. The generic partial kernel (src/cuda/generic/) runs every Q.K and P.V
// as mma.sync m16n8k16 (bf16 in, fp32 accumulate); on Hopper that instruction does not reach the
// wgmma peak, so the roofline floor of CONTRACT 10 (wgmma peak, HBM bandwidth) is not what bounds
// it. Both kernels use the decode's own wrappers (src/cuda/common/warp_mma.cuh); one CTA per SM, W
// warps per CTA, each warp `iters` rounds:
//   regs:     8 independent m16n8k16 chains on operands already in registers (the pipe alone);
//   ldmatrix: the Q.K block of the generic kernel: per 16-wide k-step 4 ldmatrix.x4 of A (64
//             heads) and 2 of B (32 keys) from padded shared rows, then 16 mma (128 mma per
//             128-dim block: one QK warp's work per tile).
// Printed: TFLOP/s, and the time one C4-Flash B = 128 call's mma work (10.7 GFLOP) would take at
// that rate on 128 of the SMs (the generic kernel's grid there).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>

#include "bench_timer.h"
#include "cuda/common/warp_mma.cuh"
#include "device_mirror.h"

namespace sparsemla::tools {

namespace {

constexpr int kPitch = 520;  // bf16 per shared row, as the generic kernel (512 + 8)
constexpr int kQRows = 64, kKRows = 32;
constexpr int kLdsmSmemBytes = (kQRows + kKRows) * kPitch * 2;

// Keeps the accumulators alive: the sink is written only if their sum is exactly `never`.
__device__ __forceinline__ void keep(float sum, float never, float* sink) {
  if (sum == never) sink[blockIdx.x] = sum;
}

__global__ void mma_regs_kernel(int iters, float never, float* sink) {
  uint32_t a[4], b0 = threadIdx.x * 0x00010001u, b1 = b0 ^ 0x3f803f80u;
  for (int i = 0; i < 4; ++i) a[i] = (threadIdx.x + i) * 0x00030003u;
  float acc[8][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < 8; ++c) cuda::mma_bf16(acc[c], a, b0, b1);
  }
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < 8; ++c) sum += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  keep(sum, never, sink);
}

__global__ void mma_ldsm_kernel(int iters, float never, float* sink) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* rows = reinterpret_cast<uint16_t*>(smem);
  for (int i = threadIdx.x; i < (kQRows + kKRows) * kPitch; i += blockDim.x) {
    rows[i] = static_cast<uint16_t>(0x3c00u + (i & 0xff));
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, d0 = 128 * ((threadIdx.x / 32) % 4);
  const uint16_t* a_base = rows + (lane % 16) * kPitch + d0 + (lane / 16) * 8;
  const uint16_t* b_base =
      rows + (kQRows + lane % 8 + (lane / 16) * 8) * kPitch + d0 + ((lane / 8) % 2) * 8;
  float acc[4][4][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      uint32_t a[4][4], b[2][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) cuda::ldmatrix_x4(a[mt], a_base + mt * 16 * kPitch + 16 * kk);
#pragma unroll
      for (int kh = 0; kh < 2; ++kh) cuda::ldmatrix_x4(b[kh], b_base + kh * 16 * kPitch + 16 * kk);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int kh = 0; kh < 2; ++kh) {
          cuda::mma_bf16(acc[mt][2 * kh], a[mt], b[kh][0], b[kh][1]);
          cuda::mma_bf16(acc[mt][2 * kh + 1], a[mt], b[kh][2], b[kh][3]);
        }
      }
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) sum += acc[mt][nt][0] + acc[mt][nt][3];
  }
  keep(sum, never, sink);
}

void print_row(const char* kind, int warps, double flops, double seconds, int sms) {
  constexpr double kC4FlashB128Flops = 2.0 * 128 * 64 * 640 * 1024;  // Q.K + P.V, D = 512
  const double tflops = flops / seconds * 1e-12;
  const double c4_us = kC4FlashB128Flops / (flops / seconds * 128.0 / sms) * 1e6;
  std::printf("  %-9s %2d warps/SM  %8.1f TFLOP/s   C4-Flash B=128 mma work alone %6.2f us\n", kind,
              warps, tflops, c4_us);
}

}  // namespace

void print_mma_peak(const TimingOptions& o) {
  DeviceArena arena;
  CudaStream stream;
  int dev = 0, sms = 0;
  cuda_check(cudaGetDevice(&dev), "device");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  float* sink = arena.alloc<float>(static_cast<size_t>(sms));
  cuda_check(cudaFuncSetAttribute(mma_ldsm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kLdsmSmemBytes),
             "smem attribute");
  const cudaStream_t s = stream.s;
  // Timed like a bench cell (CUDA-graph replay, median), without the L2 flush: operands live in
  // registers and shared memory; at most 20 repetitions of these ~1-2 ms kernels.
  TimingOptions t_opt = o;
  t_opt.reps = std::max(3, std::min(o.reps, 20));
  t_opt.warmup = 2;
  t_opt.flush_bytes = 0;
  const auto median_seconds = [&](const std::function<void()>& launch) {
    return median_cold_graph_seconds(s, launch, t_opt, nullptr);
  };
  constexpr int kRegIters = 1 << 14, kLdsmIters = 1 << 10;
  std::printf("mma.sync m16n8k16 bf16 -> fp32 ceiling (%d SMs, 1 CTA each, median of %d):\n", sms,
              t_opt.reps);
  for (int warps : {4, 8, 12, 16}) {
    const double t =
        median_seconds([&] { mma_regs_kernel<<<sms, 32 * warps, 0, s>>>(kRegIters, -1.f, sink); });
    print_row("regs", warps, 4096.0 * 8 * kRegIters * warps * sms, t, sms);
  }
  for (int warps : {4, 8, 12}) {
    const double t = median_seconds(
        [&] { mma_ldsm_kernel<<<sms, 32 * warps, kLdsmSmemBytes, s>>>(kLdsmIters, -1.f, sink); });
    print_row("ldmatrix", warps, 4096.0 * 128 * kLdsmIters * warps * sms, t, sms);
  }
  std::fflush(stdout);
}

}  // namespace sparsemla::tools
