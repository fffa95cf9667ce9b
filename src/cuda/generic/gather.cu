// src/cuda/generic/gather.cu: the portable CUDA indexer-key gather (CONTRACT 6), sm_80 and newer.
//
// Paged indexer cache -> contiguous k_fp8 [N, 128] + k_scale [N]. Eight lanes per token, each
// copying one 16-byte run of the 128-byte value row: in the NORMAL layout the runs are contiguous,
// in SHUFFLE run j (dims 16j..16j+15) sits at row + j*256 (one 16x16 tile per run). Vector loads
// and stores when both addresses are 16-byte aligned, bytes otherwise (odd page strides).
//
// One compiled kernel serves every batch shape: the batch count, the table width and the token
// count are kernel arguments, never template parameters. All address arithmetic is int64
// (block id x block_stride exceeds 2^31 at realistic cache sizes).
//
// Validity, as the CPU (src/cpu/gather.cpp): b = token_to_seq[tid] must lie in [0, B) and tid in
// [cu_seqlen[b], cu_seqlen[b+1]), else nothing is written; a valid token whose page index is beyond
// the table row or whose block id is outside [0, num_blocks) gets k_scale = 0 and no value bytes.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "cuda/common/device_info.h"
#include "cuda/generic/ops_backend.h"
#include "sparsemla/format.h"

namespace sparsemla::cuda_generic {

namespace {

constexpr int kLanesPerToken = IndexerFp8::kValueBytes / 16;  // 8
constexpr int kThreads = 256;
constexpr int kTokensPerBlock = kThreads / kLanesPerToken;  // 32
constexpr int64_t kMaxGrid = std::numeric_limits<int32_t>::max();

struct GatherArgs {
  int64_t num_tokens;
  int64_t num_batches;
  const int32_t* token_to_seq;
  const int32_t* cu_seqlen;
  const int32_t* block_table;
  int64_t block_table_stride;
  int32_t block_table_width;
  const uint8_t* cache;
  int64_t num_blocks;
  int64_t block_stride;
  int32_t block_size;
  int32_t shuffle;  // IndexerLayout::Shuffle
  uint8_t* k_fp8;
  int64_t k_fp8_stride;
  float* k_scale;
};

__device__ __forceinline__ bool aligned_to(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

__device__ __forceinline__ void copy16(const uint8_t* src, uint8_t* dst) {
  if (aligned_to(src, 16) && aligned_to(dst, 16)) {
    *reinterpret_cast<uint4*>(dst) = __ldg(reinterpret_cast<const uint4*>(src));
    return;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) dst[i] = __ldg(src + i);
}

// The 4 scale bytes of a row (the scale plane is unaligned for page strides not a multiple of 4).
__device__ __forceinline__ float load_scale(const uint8_t* src) {
  if (aligned_to(src, 4)) return __ldg(reinterpret_cast<const float*>(src));
  uint32_t u = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) u |= static_cast<uint32_t>(__ldg(src + i)) << (8 * i);
  return __uint_as_float(u);
}

// Page of the valid token at output position o of sequence b, or null for an invalid page.
__device__ __forceinline__ const uint8_t* page_of(const GatherArgs& a, int64_t b, int64_t o) {
  const int64_t page_index = o / a.block_size;
  if (page_index >= a.block_table_width) return nullptr;
  const int64_t block = __ldg(a.block_table + b * a.block_table_stride + page_index);
  if (block < 0 || block >= a.num_blocks) return nullptr;
  return a.cache + block * a.block_stride;
}

__global__ void __launch_bounds__(kThreads) gather_kernel(const GatherArgs a) {
  const int lane = threadIdx.x % kLanesPerToken;  // run j of the row
  const int64_t step = static_cast<int64_t>(gridDim.x) * kTokensPerBlock;
  for (int64_t tid =
           static_cast<int64_t>(blockIdx.x) * kTokensPerBlock + threadIdx.x / kLanesPerToken;
       tid < a.num_tokens; tid += step) {
    const int64_t b = __ldg(a.token_to_seq + tid);
    if (b < 0 || b >= a.num_batches) continue;  // padding token: nothing written
    const int64_t begin = __ldg(a.cu_seqlen + b), end = __ldg(a.cu_seqlen + b + 1);
    if (tid < begin || tid >= end) continue;
    const int64_t o = tid - begin;
    const uint8_t* page = page_of(a, b, o);
    if (page == nullptr) {
      if (lane == 0) a.k_scale[tid] = 0.0f;  // value row left untouched
      continue;
    }
    const int32_t row = static_cast<int32_t>(o % a.block_size);
    const int32_t dim = lane * 16;
    const int64_t src = indexer_value_offset_in_page(
        a.shuffle ? IndexerLayout::Shuffle : IndexerLayout::Normal, row, dim);
    copy16(page + src, a.k_fp8 + tid * a.k_fp8_stride + dim);
    if (lane == 0)
      a.k_scale[tid] = load_scale(page + indexer_scale_offset_in_page(a.block_size, row));
  }
}

}  // namespace

void gather_indexer_keys(const GatherParams& p) {
  if (p.num_tokens == 0) return;
  GatherArgs a{};
  a.num_tokens = p.num_tokens;
  a.num_batches = p.num_batches;
  a.token_to_seq = p.token_to_seq;
  a.cu_seqlen = p.cu_seqlen;
  a.block_table = p.block_table;
  a.block_table_stride = p.block_table_stride;
  a.block_table_width = p.block_table_width;
  a.cache = p.cache.base;
  a.num_blocks = p.cache.num_blocks;
  a.block_stride = p.cache.block_stride;
  a.block_size = p.cache.block_size;
  a.shuffle = p.cache.layout == IndexerLayout::Shuffle ? 1 : 0;
  a.k_fp8 = p.k_fp8;
  a.k_fp8_stride = p.k_fp8_stride;
  a.k_scale = p.k_scale;
  const int64_t blocks = (p.num_tokens + kTokensPerBlock - 1) / kTokensPerBlock;
  const int grid = static_cast<int>(blocks < kMaxGrid ? blocks : kMaxGrid);
  gather_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(a);
  cuda::check_cuda(cudaGetLastError(), "gather_indexer_keys launch");
}

}  // namespace sparsemla::cuda_generic
