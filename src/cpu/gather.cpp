// The CPU indexer-key gather (CONTRACT 6): paged indexer cache -> k_fp8 [N, 128] + k_scale [N].
#include <cstdint>
#include <cstring>

#include "cpu/cpu_backend.h"
#include "sparsemla/format.h"

namespace sparsemla::cpu {

namespace {

constexpr int kDims = IndexerFp8::kValueBytes;   // 128
constexpr int kTile = IndexerFp8::kShuffleTile;  // 16

// Copies the 128 value bytes of row p of a page into dst.
void copy_value_row(const uint8_t* page, IndexerLayout layout, int32_t p, uint8_t* dst) {
  if (layout == IndexerLayout::Normal) {
    std::memcpy(dst, page + static_cast<int64_t>(p) * kDims, kDims);
    return;
  }
  // SHUFFLE: the row is 8 runs of 16 contiguous bytes, one per 16x16 tile (dims 16j..16j+15).
  const uint8_t* row = page + indexer_value_offset_in_page(layout, p, 0);
  for (int j = 0; j < kDims / kTile; ++j)
    std::memcpy(dst + j * kTile, row + j * kTile * kTile, kTile);
}

// Page base of the valid token at output position o of sequence b, or nullptr for an invalid page.
const uint8_t* page_of(const GatherParams& p, int32_t b, int64_t o) {
  const int64_t page_index = o / p.cache.block_size;
  if (page_index >= p.block_table_width) return nullptr;
  const int64_t block = p.block_table[static_cast<int64_t>(b) * p.block_table_stride + page_index];
  if (block < 0 || block >= p.cache.num_blocks) return nullptr;
  return p.cache.base + block * p.cache.block_stride;  // int64: exceeds 2^31 at realistic sizes
}

void gather_token(const GatherParams& p, int64_t tid) {
  const int32_t b = p.token_to_seq[tid];
  if (b < 0 || b >= p.num_batches) return;  // padding token: write nothing
  const int64_t begin = p.cu_seqlen[b], end = p.cu_seqlen[static_cast<int64_t>(b) + 1];
  if (tid < begin || tid >= end) return;
  const int64_t o = tid - begin;
  const uint8_t* page = page_of(p, b, o);
  if (page == nullptr) {
    p.k_scale[tid] = 0.0f;  // value row left untouched
    return;
  }
  const int32_t row = static_cast<int32_t>(o % p.cache.block_size);
  copy_value_row(page, p.cache.layout, row, p.k_fp8 + tid * p.k_fp8_stride);
  // The scale plane may be unaligned for odd strides: copy the 4 bytes.
  std::memcpy(&p.k_scale[tid], page + indexer_scale_offset_in_page(p.cache.block_size, row), 4);
}

}  // namespace

void gather_indexer_keys(const GatherParams& p) {
#if defined(SPARSEMLA_HAVE_OPENMP)
#pragma omp parallel for schedule(static) if (p.num_tokens >= 4096)
#endif
  for (int64_t tid = 0; tid < p.num_tokens; ++tid) gather_token(p, tid);
}

}  // namespace sparsemla::cpu
