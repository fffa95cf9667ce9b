// bench/gather_only.cu: `sparsemla bench --gather-only`: how fast the memory system returns the
// rows one decode call reads, with nothing else done with them. For each bench cell, the same
// caches and index lists as the decode (every attended key's 576 data bytes and 8-byte scale word),
// timed exactly like a cell (CUDA-graph replay, L2 written cold first, median):
//   rows by index: 16-byte loads at full occupancy (256-thread CTAs, one per 128 keys of a row;
//               8 threads per key, 4 keys per thread group with all loads issued together), the
//               bytes XOR-folded so nothing is dropped;
//   without scale words: the same, data rows only;
//   keys in slot order: each row's key count read as consecutive slots from its first key's slot
//               (what the rows cost when they are not scattered);
//   contiguous: the same number of bytes read in order from the start of the caches (the
//               sequential-read reference of the same kernel shape).
// A reference, not a proven floor (a better gather may be faster): the gap between the decode and
// "rows by index" is what the decode's own work and pipeline add to reading its rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "bench_timer.h"
#include "device_mirror.h"
#include "sparsemla/format.h"

namespace sparsemla::tools {

namespace {

constexpr int kTileKeys = 32, kThreads = 256, kLanesPerKey = kThreads / kTileKeys;  // 8
constexpr int kKeysPerGroup = 4, kCtaKeys = kTileKeys * kKeysPerGroup;              // 128
constexpr int kRowChunks = Fp8DsMla::kDataBytes / 16;                               // 36

// A list's rows and the cache they index (the decode's own public views, by value).
struct GatherSource {
  IndexList list;
  CacheView cache;
};

// CTA (block y of row x of list l: kCtaKeys keys) folds its keys' rows; each 8-lane group owns
// kKeysPerGroup keys and issues all their loads before using any (indices first, then ~18
// 16-byte row loads and the scale words in flight per thread). One word per CTA is written only
// if the fold hits a value it practically never does (the loads cannot be dropped).
enum class GatherMode { kRowsAndScales, kRowsOnly, kSlotOrder };

template <GatherMode kMode>
__global__ void gather_rows_kernel(GatherSource main, GatherSource extra, int32_t main_blocks,
                                   uint32_t* sink) {
  const bool is_extra = blockIdx.y >= static_cast<uint32_t>(main_blocks);
  const IndexList& l = is_extra ? extra.list : main.list;
  const CacheView& cache = is_extra ? extra.cache : main.cache;
  const int64_t num_slots = cache.num_blocks * cache.block_size;
  const int32_t block_y = is_extra ? blockIdx.y - main_blocks : blockIdx.y;
  const int32_t begin = l.indptr[blockIdx.x], end = l.indptr[blockIdx.x + 1];
  const int32_t k0 = begin + block_y * kCtaKeys + static_cast<int32_t>(threadIdx.x) / kLanesPerKey;
  const int lane = static_cast<int>(threadIdx.x) % kLanesPerKey;
  int32_t slot[kKeysPerGroup];
#pragma unroll
  for (int u = 0; u < kKeysPerGroup; ++u) {
    const int32_t k = k0 + u * kTileKeys;
    // kSlotOrder: the row's keys as consecutive slots from its first one (same count, in order)
    slot[u] = k >= end ? -1
              : kMode == GatherMode::kSlotOrder
                  ? static_cast<int32_t>((l.indices[begin] + int64_t{k - begin}) % num_slots)
                  : l.indices[k];
  }
  uint32_t fold = 0;
#pragma unroll
  for (int u = 0; u < kKeysPerGroup; ++u) {
    if (!slot_is_valid(slot[u], cache.num_blocks, cache.block_size)) continue;
    const uint4* row = reinterpret_cast<const uint4*>(
        cache.base + mla_data_offset(slot[u], cache.block_size, cache.block_stride));
#pragma unroll
    for (int c = lane; c < kRowChunks; c += kLanesPerKey) {
      const uint4 v = __ldg(row + c);
      fold ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (kMode != GatherMode::kRowsOnly && lane == 0) {
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(
          cache.base + mla_scale_offset(slot[u], cache.block_size, cache.block_stride)));
      fold ^= w.x ^ w.y;
    }
  }
  if (fold == 0x9E3779B9u) sink[blockIdx.x] = fold;
}

__global__ void read_contiguous_kernel(const uint4* src, int64_t chunks, uint32_t* sink) {
  uint32_t fold = 0;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < chunks;
       c += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldg(src + c);
    fold ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (fold == 0x9E3779B9u) sink[blockIdx.x] = fold;
}

int32_t max_blocks(const HostList& l, int64_t rows) {
  int32_t m = 0;
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t keys = l.indptr.empty() ? 0 : l.indptr[t + 1] - l.indptr[t];
    m = std::max(m, (keys + kCtaKeys - 1) / kCtaKeys);
  }
  return m;
}

}  // namespace

void print_gather_only(const std::string& shape, const Problem& pb, const TimingOptions& o) {
  DeviceArena arena;
  CudaStream stream;
  const cudaStream_t s = stream.s;
  const DecodeParams d = mirror_problem(pb, arena);
  uint8_t* flush = arena.alloc<uint8_t>(static_cast<size_t>(std::max<int64_t>(o.flush_bytes, 1)));
  const int64_t rows = pb.tokens;
  const int32_t main_blocks = max_blocks(pb.main_list, rows);
  const int32_t extra_blocks = d.has_extra ? max_blocks(pb.extra_list, rows) : 0;
  uint32_t* sink = arena.alloc<uint32_t>(static_cast<size_t>(rows));
  const GatherSource main{d.main_list, d.main_cache};
  const GatherSource extra = d.has_extra ? GatherSource{d.extra_list, d.extra_cache} : main;
  const dim3 grid(static_cast<uint32_t>(rows), static_cast<uint32_t>(main_blocks + extra_blocks));
  const auto time_mode = [&](auto kernel) {
    return median_cold_graph_seconds(
        s, [&] { kernel<<<grid, kThreads, 0, s>>>(main, extra, main_blocks, sink); }, o, flush);
  };
  const double gather = time_mode(gather_rows_kernel<GatherMode::kRowsAndScales>);
  const double rows_only = time_mode(gather_rows_kernel<GatherMode::kRowsOnly>);
  const double slot_order = time_mode(gather_rows_kernel<GatherMode::kSlotOrder>);
  // The same bytes in order (from the larger cache; whole 16-byte chunks).
  const double bytes = static_cast<double>(pb.attended_keys) * Fp8DsMla::kBytesPerToken;
  const HostCache& big = pb.compressed_cache.bytes.size() > pb.window_cache.bytes.size()
                             ? pb.compressed_cache
                             : pb.window_cache;
  const uint8_t* big_base = &big == &pb.compressed_cache ? d.extra_cache.base : d.main_cache.base;
  const int64_t chunks =
      std::min(static_cast<int64_t>(bytes / 16), static_cast<int64_t>(big.bytes.size() / 16));
  int dev = 0, sms = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  const int blocks =  // grid-stride: 8 CTAs per SM keep every SM's loads in flight
      static_cast<int>(std::min<int64_t>((chunks + kThreads - 1) / kThreads, int64_t{sms} * 8));
  const double contiguous = median_cold_graph_seconds(
      s,
      [&] {
        read_contiguous_kernel<<<blocks, kThreads, 0, s>>>(reinterpret_cast<const uint4*>(big_base),
                                                           chunks, sink);
      },
      o, flush);
  cuda_check(cudaGetLastError(), "gather-only kernels");
  std::printf(
      "gather only %-10s B=%-4lld %8.2f MB: rows by index %8.2f us (%6.0f GB/s), without "
      "scale words %8.2f us, keys in slot order %8.2f us, contiguous %8.2f us (%6.0f GB/s)\n",
      shape.c_str(), static_cast<long long>(pb.config.batch), bytes * 1e-6, gather * 1e6,
      bytes / gather * 1e-9, rows_only * 1e6, slot_order * 1e6, contiguous * 1e6,
      static_cast<double>(chunks) * 16 / contiguous * 1e-9);
  std::fflush(stdout);
}

}  // namespace sparsemla::tools
