// sparsemla/format.h: the byte layouts of the DSV4 KV caches (CONTRACT 2) and slot addressing.
//
// This header is the single source of truth for every size and offset; host and device code use it.
//
// fp8_ds_mla ("MODEL1"), 584 payload bytes per token, page of `bs` tokens at base +
// block*block_stride:
//
//   page + 0                      page + bs*576                 page + bs*584      page +
//   block_stride
//   |<------- data plane ------->|<------ scale plane ------>|<--- padding --->|
//   | token 0 | token 1 | ...    | t0 | t1 | ...             | never touched    |
//
//   data plane, token p at page + p*576:
//     [  0, 448)  448 x fp8 e4m3fn     NoPE dims 0..447, quantised per 64-dim tile
//     [448, 576)   64 x bf16 (LE)      RoPE dims 448..511, already rotated, not quantised
//   scale plane, token p at page + bs*576 + p*8:
//     [0, 7)        7 x UE8M0 code     code i scales NoPE dims [64i, 64i+64)
//     [7]           pad byte, 0
//
// Indexer key cache (ratio-4 layers), 132 bytes per token, page at base + block*block_stride:
//   NORMAL : [bs x 128 fp8 (row-major)][bs x fp32 scale]; value(p, d) at p*128 + d
//   SHUFFLE: 16x16-byte tiles; value(p, d) at (p/16)*2048 + (p%16)*16 + (d/16)*256 + d%16
//            (bs must be a multiple of 16); scales as in NORMAL at bs*128 + p*4
//
// A slot id is block*bs + p; negative slots and slots >= num_blocks*bs are invalid. All offsets
// are int64: block*block_stride exceeds 2^31 at realistic cache sizes.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARSEMLA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPARSEMLA_HOST_DEVICE inline
#endif

namespace sparsemla {

// ---- fp8_ds_mla (CONTRACT 2.1)
// -----------------------------------------------------------------------
struct Fp8DsMla {
  static constexpr int kHeadDim = 512;                             // shared K = V latent
  static constexpr int kNopeDims = 448;                            // quantised part
  static constexpr int kRopeDims = 64;                             // bf16 part, rotated
  static constexpr int kTileDims = 64;                             // one UE8M0 scale per tile
  static constexpr int kNumTiles = kNopeDims / kTileDims;          // 7
  static constexpr int kNopeBytes = kNopeDims;                     // 448 x e4m3
  static constexpr int kRopeBytes = kRopeDims * 2;                 // 64 x bf16
  static constexpr int kDataBytes = kNopeBytes + kRopeBytes;       // 576
  static constexpr int kScaleBytes = 8;                            // 7 codes + pad
  static constexpr int kBytesPerToken = kDataBytes + kScaleBytes;  // 584
  static constexpr int kRopeOffset = kNopeBytes;                   // 448
  static constexpr int kPadByte = kNumTiles;                       // scale byte 7
  static constexpr int kEnginePageAlign = 576;  // engines pad pages to multiples of this
  static constexpr int kFastAlign = 16;         // fast kernels need base/stride % 16 == 0
};
static_assert(Fp8DsMla::kNumTiles == 7);
static_assert(Fp8DsMla::kNopeDims + Fp8DsMla::kRopeDims == Fp8DsMla::kHeadDim);
static_assert(Fp8DsMla::kDataBytes == 576);
static_assert(Fp8DsMla::kBytesPerToken == 584);
static_assert(Fp8DsMla::kNumTiles + 1 == Fp8DsMla::kScaleBytes);
static_assert(Fp8DsMla::kDataBytes % 16 == 0, "data rows must be 16-byte loadable");

// ---- indexer key cache (CONTRACT 2.2)
// ----------------------------------------------------------------
enum class IndexerLayout : int32_t { Normal = 0, Shuffle = 1 };

struct IndexerFp8 {
  static constexpr int kHeadDim = 128;
  static constexpr int kNopeDims = 64;  // dims 0..63 plain, 64..127 rotated
  static constexpr int kRopeDims = 64;
  static constexpr int kValueBytes = 128;                           // e4m3
  static constexpr int kScaleBytes = 4;                             // fp32 power of two
  static constexpr int kBytesPerToken = kValueBytes + kScaleBytes;  // 132
  static constexpr int kShuffleTile = 16;  // rows and bytes per SHUFFLE tile
};
static_assert(IndexerFp8::kBytesPerToken == 132);
static_assert(IndexerFp8::kNopeDims + IndexerFp8::kRopeDims == IndexerFp8::kHeadDim);

// ---- views of a paged cache
// ---------------------------------------------------------------------- A paged fp8_ds_mla cache
// (read side). Byte stride between pages >= block_size * 584.
struct CacheView {
  const uint8_t* base = nullptr;  // page 0
  int64_t num_blocks = 0;         // pages
  int32_t block_size = 0;         // tokens per page (bs)
  int64_t block_stride = 0;       // bytes between pages
};
// The same, writable (writers).
struct MutableCacheView {
  uint8_t* base = nullptr;
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  int64_t block_stride = 0;
  CacheView as_const() const { return {base, num_blocks, block_size, block_stride}; }
};

// A paged indexer key cache.
struct IndexerCacheView {
  uint8_t* base = nullptr;
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  int64_t block_stride = 0;  // bytes, >= block_size * 132
  IndexerLayout layout = IndexerLayout::Normal;
};

// ---- slot addressing (64-bit throughout)
// ---------------------------------------------------------
SPARSEMLA_HOST_DEVICE bool slot_is_valid(int64_t slot, int64_t num_blocks, int32_t block_size) {
  return slot >= 0 && slot < num_blocks * static_cast<int64_t>(block_size);
}
// Byte offset of the data row (576 bytes) of a valid slot.
SPARSEMLA_HOST_DEVICE int64_t mla_data_offset(int64_t slot, int32_t block_size,
                                              int64_t block_stride) {
  const int64_t block = slot / block_size, p = slot % block_size;
  return block * block_stride + p * Fp8DsMla::kDataBytes;
}
// Byte offset of the 8 scale bytes of a valid slot.
SPARSEMLA_HOST_DEVICE int64_t mla_scale_offset(int64_t slot, int32_t block_size,
                                               int64_t block_stride) {
  const int64_t block = slot / block_size, p = slot % block_size;
  return block * block_stride + static_cast<int64_t>(block_size) * Fp8DsMla::kDataBytes +
         p * Fp8DsMla::kScaleBytes;
}
// Byte offset of value (row p, dim d) inside an indexer page.
SPARSEMLA_HOST_DEVICE int64_t indexer_value_offset_in_page(IndexerLayout layout, int32_t p,
                                                           int32_t d) {
  if (layout == IndexerLayout::Normal) return static_cast<int64_t>(p) * IndexerFp8::kValueBytes + d;
  constexpr int t = IndexerFp8::kShuffleTile;
  return static_cast<int64_t>(p / t) * t * IndexerFp8::kValueBytes + (p % t) * t +
         (d / t) * (t * t) + d % t;
}
// Byte offset of the fp32 scale of row p inside an indexer page.
SPARSEMLA_HOST_DEVICE int64_t indexer_scale_offset_in_page(int32_t block_size, int32_t p) {
  return static_cast<int64_t>(block_size) * IndexerFp8::kValueBytes + static_cast<int64_t>(p) * 4;
}

}  // namespace sparsemla
