// src/cuda/sm90/indexer_sm90.cu: the Hopper lightning-indexer decode (CONTRACT 11), FP8 tensor
// cores (sm_90a). Design and numbers: docs/INDEXER.md ("Hopper path").
//
// The schedule, workspace and merge are the generic path's (src/cuda/generic/indexer.cu): work
// items (row t, split s) over a grid-stride loop, each split's exact local top-k published sorted
// in the workspace, then the generic merge kernel per row. What differs is the score kernel:
//  - one warpgroup (128 threads) per CTA, several CTAs per SM (shared memory ~50-75 KB each);
//  - tiles of 64 entries: each thread copies 4 of an entry's 16-byte runs (cp.async, zero-filled
//    for entries that are not candidates) and the entry's fp32 scale into a kStages-deep ring,
//    kStages - 1 tiles ahead; the page ids of the tile after that are loaded into registers one
//    iteration earlier, so no issue waits on the block table;
//  - the row's query [H, 128] e4m3 stays in shared memory; per tile 4 x wgmma m64nNk32 e4m3 x e4m3
//    with fp32 accumulators give dot[entry][head] (N = 64 or 128 padded heads, zero q and w);
//  - ReLU, the weight and the head sum run on the accumulators (each thread's 2 rows x N / 4
//    columns, then the 4 lanes of a row by shuffles), then the entry's scale; lane 0 of a row
//    offers (score, j) to the split's top-k buffer (cuda/generic/indexer_select.cuh).
// Accuracy: the tensor cores accumulate e4m3 products with ~14-bit alignment over 4 MMA steps of
// 32 products, hence CONTRACT 11.7's eps = 2^-9 for this path (the generic path is bit-identical
// to the CPU). On exact-arithmetic data (11.7) every sum is exact, so scores, selections and
// orders equal the CPU's bit for bit there too.
//
// Preconditions (checked by cuda_sm90::indexer_supported before dispatch): a device that runs the
// sm_90a cubin, H <= 128, a 16-byte aligned cache base and block stride (cp.async of 16-byte
// runs; the scale plane is then 4-byte aligned).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/common/decode_common.cuh"
#include "cuda/common/device_info.h"
#include "cuda/generic/indexer_args.cuh"
#include "cuda/generic/indexer_backend.h"
#include "cuda/sm90/indexer_sm90_backend.h"
#include "cuda/sm90/sm90_backend.h"
#include "cuda/sm90/wgmma.cuh"
#include "sparsemla/error.h"
#include "sparsemla/format.h"

namespace sparsemla::cuda_sm90 {

namespace {

using cuda_generic::IndexerSplits;
using cuda_generic::indexer::KernelArgs;
using cuda_generic::indexer::TopkBuffer;
using cuda_generic::indexer::TopkState;

constexpr int kThreads = 128;  // one warpgroup
constexpr int kTile = 64;      // entries per tile: the wgmma's M
constexpr int kDim = kIndexerHeadDim;
constexpr int kRunsPerThread = 4;  // 16-byte runs of an entry per thread: 2 threads per entry
constexpr int kStages = 4;  // tiles in the ring: 3 in flight, 25 KB; 4 CTAs per SM at k = 512
static_assert(kTile * (kDim / 16) == kThreads * kRunsPerThread, "a tile's runs over the CTA");
constexpr int kTileBytes = kTile * kDim;  // 8 KiB of e4m3 values
constexpr int64_t kMinTilesPerSplit = 4;
constexpr int64_t kMaxGrid = std::numeric_limits<int32_t>::max();

// Buffer words: k plus one tile of appends, a power of two.
int32_t score_capacity(int32_t k) {
  int32_t c = 64;
  while (c < k + kTile) c <<= 1;
  return c;
}

// ---- shared memory
// ------------------------------------------------------------------------------- Q [kN x 128 e4m3]
// | K ring [kStages][64 x 128 e4m3] | scales [kStages][64] | indices [kStages][64] | w [kN] |
// buffer words [capacity] | TopkState. Operands in the no-swizzle canonical layout
// (cuda/sm90/wgmma.cuh): 16-byte run c of row r at ((c * rows / 8) + r / 8) * 128
// + (r % 8) * 16, so a k-step (32 bytes: runs 2ks, 2ks + 1) starts 2ks * rows * 16 bytes in, LBO =
// rows * 16 (the next run), SBO = 128 (the next 8 rows).
struct Layout {
  int64_t q, k, scale, index, w, buf, state, bytes;
};
__host__ __device__ constexpr Layout layout(int32_t kN, int32_t capacity) {
  Layout l{};
  l.q = 0;
  l.k = l.q + int64_t{kN} * kDim;
  l.scale = l.k + int64_t{kStages} * kTileBytes;
  l.index = l.scale + int64_t{kStages} * kTile * 4;
  l.w = l.index + int64_t{kStages} * kTile * 4;
  l.buf = l.w + int64_t{kN} * 4;
  l.state = l.buf + int64_t{capacity} * 8;
  l.bytes = l.state + int64_t{sizeof(TopkState)};
  return l;
}
// ---- device helpers (sm_90a device code only) ---------------------------------------------------
#ifdef SPARSEMLA_SM90A_DEVICE
__device__ __forceinline__ uint32_t operand_offset(int32_t rows, int32_t r, int32_t run) {
  return static_cast<uint32_t>(((run * (rows / 8)) + r / 8) * 128 + (r % 8) * 16);
}

// 16 bytes from global memory, or 16 zero bytes (src_bytes = 0: nothing is read).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}

// What one thread copies of a tile: entry e = tid / 2, runs [4 * (tid % 2), +4), and (tid even)
// the entry's scale and candidate index. All offsets are 32-bit: j < n'_t <= INT32_MAX and a
// page's bytes fit 32 bits (bs * 132 <= block_stride).
struct TileIssue {
  const uint8_t* values;  // the thread's first run of the entry, or null (not a candidate: zero
                          // fill, index -1)
  const uint8_t* scale;   // the entry's fp32 scale
  int32_t cand;           // local index j, or -1
};

// max(x, 0) with NaN propagated (PTX max.NaN, sm_80+): x < 0 ? 0 : x for every x but -0, where
// it may give +0 (the product with the weight is a zero either way, and the sums start at +0).
__device__ __forceinline__ float relu_nan(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ TileIssue locate(const KernelArgs& a, const int32_t* table_row,
                                            uint32_t j, uint32_t end, uint32_t first_run_offset) {
  TileIssue it{nullptr, nullptr, -1};
  if (j >= end) return it;
  const uint32_t bs = static_cast<uint32_t>(a.block_size);
  const uint32_t page_index = j / bs;
  const int32_t block = __ldg(table_row + page_index);
  if (block < 0 || block >= a.num_blocks) return it;
  const uint32_t row = j - page_index * bs;
  const uint8_t* page = a.cache + int64_t{block} * a.block_stride;
  // The page offsets of format.h (the one definition of NORMAL and SHUFFLE), then the thread's
  // first run.
  const auto layout = a.shuffle != 0 ? IndexerLayout::Shuffle : IndexerLayout::Normal;
  it.values =
      page + indexer_value_offset_in_page(layout, static_cast<int32_t>(row), 0) + first_run_offset;
  it.scale = page + indexer_scale_offset_in_page(a.block_size, static_cast<int32_t>(row));
  it.cand = static_cast<int32_t>(j);
  return it;
}

#endif  // SPARSEMLA_SM90A_DEVICE

// ---- score kernel
// --------------------------------------------------------------------------------
template <int kN>
__global__ void __launch_bounds__(kThreads) indexer_sm90_score_kernel(const KernelArgs a) {
#ifdef SPARSEMLA_SM90A_DEVICE
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = layout(kN, a.score_capacity);
  uint8_t* q_s = smem + L.q;
  float* scale_s = reinterpret_cast<float*>(smem + L.scale);
  int32_t* index_s = reinterpret_cast<int32_t*>(smem + L.index);
  float* w_s = reinterpret_cast<float*>(smem + L.w);
  const TopkBuffer top{reinterpret_cast<uint64_t*>(smem + L.buf),
                       reinterpret_cast<TopkState*>(smem + L.state), a.score_capacity, a.topk};
  const uint32_t q_addr = cuda::smem_u32(q_s);
  const uint32_t k_addr = cuda::smem_u32(smem + L.k);
  const uint32_t scale_addr = cuda::smem_u32(scale_s);

  const int tid = threadIdx.x;
  const int e_issue = tid / 2, run0 = (tid % 2) * kRunsPerThread;
  const int32_t H = a.num_heads;
  const int64_t table_capacity = int64_t{a.block_table_width} * a.block_size;
  const int64_t items = a.num_tokens * a.num_splits;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t t = item / a.num_splits;
    const int64_t s = item % a.num_splits;
    const int32_t r = __ldg(a.row_request + t);
    const bool live = r >= 0 && r < a.num_requests;
    int64_t n = live ? __ldg(a.num_candidates + t) : 0;
    n = n < 0 ? 0 : (n > table_capacity ? table_capacity : n);
    const int64_t begin = s * a.chunk;
    const int64_t end = min(n, begin + a.chunk);
    if (begin >= end) {  // CTA-uniform; no shared memory touched
      if (tid == 0) a.ws_counts[item] = 0;
      continue;
    }
    // 11.3: with n'_t <= k every candidate is selected; keys are read only for scores or ranks.
    const bool scored = a.always_scored != 0 || n > a.topk;
    const int32_t* table_row = a.block_table + int64_t{r} * a.block_table_stride;
    const auto tiles = static_cast<int32_t>((end - begin + kTile - 1) / kTile);

    if (scored) {  // the row's query (zero rows past H) and weights (0 past H)
      const uint8_t* q_row = a.q + t * a.q_stride_token;
      for (int i = tid; i < kN * (kDim / 16); i += kThreads) {
        const int h = i / (kDim / 16), run = i % (kDim / 16);
        uint32_t wd[4] = {0, 0, 0, 0};
        if (h < H)
          cuda_generic::indexer::load16(q_row + int64_t{h} * a.q_stride_head + 16 * run, wd);
        *reinterpret_cast<uint4*>(q_s + operand_offset(kN, h, run)) =
            make_uint4(wd[0], wd[1], wd[2], wd[3]);
      }
      for (int h = tid; h < kN; h += kThreads)
        w_s[h] = h < H ? __ldg(a.w + t * a.w_stride_token + h) : 0.0f;
    }
    top.reset();  // barrier: the previous item's reads of the buffer and the ring are done

    // The weights of this thread's accumulator columns (heads 8c + hc, + 1), kept in registers.
    const int hc = 2 * (tid % 4);
    float wr[kN / 8][2];
#pragma unroll
    for (int c = 0; c < kN / 8; ++c) {
      wr[c][0] = scored ? w_s[8 * c + hc] : 0.0f;  // w_s is written only for scored rows
      wr[c][1] = scored ? w_s[8 * c + hc + 1] : 0.0f;
    }

    // Issue of tile i into `stage`; `next` holds the located entry of tile i, found one iteration
    // before its issue. A run of SHUFFLE pages is 256 bytes after the previous one, of NORMAL 16.
    const auto run_stride = static_cast<uint32_t>(indexer_value_offset_in_page(
        a.shuffle != 0 ? IndexerLayout::Shuffle : IndexerLayout::Normal, 0, 16));
    const uint32_t first_run = run0 * run_stride;
    const uint32_t k_dst = k_addr + operand_offset(kTile, e_issue, run0);
    auto issue = [&](int32_t i, int stage, const TileIssue& it) {
      if (i < tiles) {
        if (scored) {
          const bool have = it.values != nullptr;
          const uint32_t bytes = have ? 16u : 0u;
#pragma unroll
          for (int c = 0; c < kRunsPerThread; ++c)  // run + 1 is 8 core matrices (1 KiB) further
            cp_async16_zfill(k_dst + stage * kTileBytes + c * (kTile / 8) * 128,
                             have ? it.values + c * run_stride : a.cache, bytes);
          if (run0 == 0)
            cp_async4_zfill(scale_addr + (stage * kTile + e_issue) * 4, have ? it.scale : a.cache,
                            have ? 4u : 0u);
        }
        if (run0 == 0) index_s[stage * kTile + e_issue] = it.cand;
      }
      cuda::cp_async_commit();  // one group per call, empty or not: wait_group counts stay uniform
    };
    const uint32_t end32 = static_cast<uint32_t>(end);
    const uint32_t first_entry = static_cast<uint32_t>(begin) + e_issue;
    auto locate_tile = [&](int32_t i) {
      return i < tiles ? locate(a, table_row, first_entry + i * kTile, end32, first_run)
                       : TileIssue{nullptr, nullptr, -1};
    };

#pragma unroll 1
    for (int32_t i = 0; i < kStages - 1; ++i) issue(i, i, locate_tile(i));
    TileIssue next = locate_tile(kStages - 1);

    // Register copies of the buffer's state, the same in every thread: count advances by the
    // appends each barrier counts (a thread appends at most one word per tile), theta changes only
    // in cut(). So one barrier per tile orders the copies, frees a stage and counts the appends.
    int32_t count = 0;
    uint64_t theta = 0;
    bool appended = false;
    int stage = 0, issue_stage = kStages - 1;
    const int lane = tid % 32;
    const int e0 = 16 * (tid / 32) + lane / 4;  // rows e0 and e0 + 8 of the accumulator fragment
    const int quad = tid % 4;
#pragma unroll 1
    for (int32_t i = 0; i < tiles; ++i) {
      cuda::cp_async_wait<kStages - 2>();  // this thread's copies of tile i landed
      fence_proxy_async();                 // ... and are visible to the wgmma (async proxy)
      // Everyone's copies of tile i; tile i - 1's stage is free; its appends are done and counted.
      count += __syncthreads_count(appended);
      issue(i + kStages - 1, issue_stage, next);
      next = locate_tile(i + kStages);
      if (count + kTile > top.capacity) {  // CTA-uniform; cut() starts after the barrier above
        top.cut();
        count = count < top.k ? count : top.k;
        theta = top.st->theta;  // written only inside cut(), before its closing barrier
      }

      float score0 = 0.0f, score1 = 0.0f;
      if (scored) {
        float d[kN / 2];
#pragma unroll
        for (int x = 0; x < kN / 2; ++x) d[x] = 0.0f;
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kDim / 32; ++ks) {
          const uint64_t a_desc =
              smem_desc(k_addr + stage * kTileBytes + 2 * ks * kTile * 16, kTile * 16, 128);
          const uint64_t b_desc = smem_desc(q_addr + 2 * ks * kN * 16, kN * 16, 128);
          wgmma_e4m3<kN>(d, a_desc, b_desc, ks);
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands(d);
        // Accumulator fragment: d[4c + {0, 1}] = (e0, 8c + hc + {0, 1}), d[4c + {2, 3}] = (e0 + 8,
        // the same heads).
        // ReLU as the CPU writes it (NaN stays NaN: max.NaN), then two FMA chains per row for
        // instruction-level parallelism. The order differs from the CPU's: within 11.7's eps,
        // and exact (so bit-identical) on exact-arithmetic data.
        float sum0 = 0.0f, sum1 = 0.0f, sum0b = 0.0f, sum1b = 0.0f;
#pragma unroll
        for (int c = 0; c < kN / 8; ++c) {
          sum0 = fmaf(wr[c][0], relu_nan(d[4 * c + 0]), sum0);
          sum0b = fmaf(wr[c][1], relu_nan(d[4 * c + 1]), sum0b);
          sum1 = fmaf(wr[c][0], relu_nan(d[4 * c + 2]), sum1);
          sum1b = fmaf(wr[c][1], relu_nan(d[4 * c + 3]), sum1b);
        }
        sum0 += sum0b;
        sum1 += sum1b;
        sum0 += __shfl_xor_sync(0xFFFFFFFFu, sum0, 1);
        sum1 += __shfl_xor_sync(0xFFFFFFFFu, sum1, 1);
        sum0 += __shfl_xor_sync(0xFFFFFFFFu, sum0, 2);
        sum1 += __shfl_xor_sync(0xFFFFFFFFu, sum1, 2);
        score0 = scale_s[stage * kTile + e0] * sum0;
        score1 = scale_s[stage * kTile + e0 + 8] * sum1;
      }
      // Lane 0 of a row quad offers row e0, lane 1 row e0 + 8; a warp's appends take one atomic.
      const int e = quad == 1 ? e0 + 8 : e0;
      const int32_t j = quad < 2 ? index_s[stage * kTile + e] : -1;
      const uint64_t word =
          cuda_generic::indexer::pack(quad == 1 ? score1 : score0, static_cast<uint32_t>(j));
      appended = j >= 0 && cuda_generic::indexer::RankWord{}(word) > theta;
      const uint32_t want = __ballot_sync(0xFFFFFFFFu, appended);
      if (want != 0) {  // warp-uniform
        const int leader = __ffs(want) - 1;
        int32_t base = 0;
        if (lane == leader) base = atomicAdd(&top.st->count, __popc(want));
        base = __shfl_sync(0xFFFFFFFFu, base, leader);
        if (appended) top.buf[base + __popc(want & ((1u << lane) - 1u))] = word;
      }
      stage = stage + 1 == kStages ? 0 : stage + 1;
      issue_stage = issue_stage + 1 == kStages ? 0 : issue_stage + 1;
      // The next iteration's barrier orders these appends before its cut.
    }
    cuda::cp_async_wait_all();  // the trailing empty groups
    __syncthreads();            // appends done
    top.cut_sorted();           // sorted by rank (the merge needs it), count = min(count, k)
    const int32_t kept = top.st->count;
    uint64_t* out = a.ws_pairs + item * a.topk;
    for (int32_t i = tid; i < kept; i += kThreads) out[i] = top.buf[i];
    if (tid == 0) a.ws_counts[item] = kept;
    __syncthreads();  // the buffer is read before the next item resets it
  }
#else
  (void)a;
#endif
}

// ---- host side ---------------------------------------------------------------------------------
// From how many rows the plan takes one wave of resident CTAs: below 16 rows the generic rule
// (about 2 CU items) is faster, since the merge reads S x k words per row (record 1228Z: one wave
// at 1M B = 1 75.3 us against 69.0). Two items per SM: three were slower (record 0912Z).
constexpr int64_t kOneWaveFromRows = 16;
constexpr int64_t kItemsPerSmBelowOneWave = 2;

int64_t max_candidates(const IndexerParams& p) {
  return int64_t{p.block_table_width} * p.cache.block_size;
}

int32_t padded_heads(int32_t H) {
  return H <= 64 ? 64 : 128;
}

// Every instantiation's largest shared memory (k = 2048) is opted in once per device.
void prepare_device() {
  constexpr int kMaxDevices = 64;
  static std::array<std::once_flag, kMaxDevices> once;
  int dev = 0;
  cuda::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  SPARSEMLA_CHECK_ARG(dev >= 0 && dev < kMaxDevices, "indexer_topk", "device", "< 64", dev);
  std::call_once(once[dev], [] {
    const int cap = score_capacity(kIndexerMaxTopk);
    cuda::check_cuda(cudaFuncSetAttribute(indexer_sm90_score_kernel<64>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(layout(64, cap).bytes)),
                     "cudaFuncSetAttribute(indexer_sm90_score_kernel<64>)");
    cuda::check_cuda(cudaFuncSetAttribute(indexer_sm90_score_kernel<128>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(layout(128, cap).bytes)),
                     "cudaFuncSetAttribute(indexer_sm90_score_kernel<128>)");
  });
}

// Score-kernel CTAs resident per SM at this call's (H, k): from the occupancy calculator, which
// is host arithmetic on the kernel's registers and shared memory (no device work).
int32_t resident_per_sm(const IndexerParams& p) {
  prepare_device();
  const int32_t kN = padded_heads(p.num_heads);
  const int32_t capacity = score_capacity(p.topk);
  int dev = 0;
  cuda::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  static std::mutex mu;
  static std::map<std::tuple<int, int32_t, int32_t>, int32_t> known;  // (device, kN, capacity)
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, kN, capacity);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  const auto smem = static_cast<size_t>(layout(kN, capacity).bytes);
  int n = 0;
  const cudaError_t e = kN == 64 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                       &n, indexer_sm90_score_kernel<64>, kThreads, smem)
                                 : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                       &n, indexer_sm90_score_kernel<128>, kThreads, smem);
  cuda::check_cuda(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor(indexer_sm90_score_kernel)");
  return known[key] = std::max(n, 1);
}

}  // namespace

IndexerSplits plan_indexer_splits_sm90(int64_t num_tokens, int64_t max_candidates, int32_t sms,
                                       int32_t resident_per_sm) {
  if (num_tokens < kOneWaveFromRows)  // the generic rule: about 2 * CU items (CONTRACT 11.5)
    return cuda_generic::plan_indexer_splits_tiled(num_tokens, max_candidates, sms, kTile,
                                                   kMinTilesPerSplit, kItemsPerSmBelowOneWave);
  // One wave of resident CTAs: S = floor(slots / T) (rounding up would start a second wave for
  // a few items), so items_per_sm = slots / CU rounded down over the rows.
  const int64_t slots = int64_t{std::max(sms, 1)} * std::max(resident_per_sm, 1);
  const int64_t per_row = std::max<int64_t>(1, slots / num_tokens);
  const int64_t tiles = std::max<int64_t>(1, (max_candidates + kTile - 1) / kTile);
  const int64_t most = std::max<int64_t>(1, (tiles + kMinTilesPerSplit - 1) / kMinTilesPerSplit);
  const int64_t S0 = std::min(per_row, most);
  const int64_t per = (tiles + S0 - 1) / S0;
  IndexerSplits out;
  out.num_splits = static_cast<int32_t>((tiles + per - 1) / per);
  out.chunk = per * kTile;
  return out;
}

std::string indexer_unsupported_reason(const IndexerParams& p) {
  if (!have_sm90a_kernels()) return "a device running this build's sm_90a kernels (cc 9.0)";
  if (p.num_heads > 128) return "num_heads <= 128";
  const auto base = reinterpret_cast<uintptr_t>(p.cache.base);
  if (base % 16 != 0 || p.cache.block_stride % 16 != 0)
    return "a 16-byte aligned cache base and block_stride";
  return {};
}

size_t indexer_workspace_size(const IndexerParams& p) {
  if (p.num_tokens == 0) return 0;
  const IndexerSplits sp = plan_indexer_splits_sm90(p.num_tokens, max_candidates(p),
                                                    cuda::current_device_sms(), resident_per_sm(p));
  return cuda_generic::indexer_workspace_bytes(p.num_tokens, sp.num_splits, p.topk);
}

void indexer_topk(const IndexerParams& p, void* workspace) {
  if (p.num_tokens == 0) return;
  prepare_device();
  const IndexerSplits sp = plan_indexer_splits_sm90(p.num_tokens, max_candidates(p),
                                                    cuda::current_device_sms(), resident_per_sm(p));
  KernelArgs a = cuda_generic::make_indexer_args(p, sp, workspace);
  a.score_capacity = score_capacity(p.topk);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const int64_t items = p.num_tokens * sp.num_splits;
  const int32_t kN = padded_heads(p.num_heads);
  const auto smem = static_cast<size_t>(layout(kN, a.score_capacity).bytes);
  const auto grid = static_cast<unsigned>(std::min(items, kMaxGrid));
  if (kN == 64) {
    indexer_sm90_score_kernel<64><<<grid, kThreads, smem, stream>>>(a);
  } else {
    indexer_sm90_score_kernel<128><<<grid, kThreads, smem, stream>>>(a);
  }
  cuda::check_cuda(cudaGetLastError(), "indexer_sm90_score_kernel launch");
  cuda_generic::launch_indexer_merge(a, stream);
}

}  // namespace sparsemla::cuda_sm90
