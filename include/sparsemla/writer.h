// sparsemla/writer.h: the cache writers of CONTRACT 3 and the row decoder.
//
// One plain params struct per operation; pointers are host pointers for Path::Cpu and device
// pointers for the CUDA paths. Every field comments its shape. Strides are in elements unless named
// `*_bytes`/`block_stride` (bytes). Tokens whose slot is < 0 are skipped: nothing read, nothing
// written.
#pragma once

#include <cstdint>

#include "sparsemla/backend.h"
#include "sparsemla/format.h"
#include "sparsemla/numerics.h"

namespace sparsemla {

// A RoPE cos/sin table: fp32 [rows, 64], row p = [cos_0..cos_31 | sin_0..sin_31] (CONTRACT 1).
struct RopeTable {
  const float* data = nullptr;
  int64_t rows = 0;         // P: valid positions are [0, P)
  int64_t row_stride = 64;  // elements between rows (>= 64)
};

// ---- window writer (CONTRACT 3.1)
// --------------------------------------------------------------------
struct WindowWriterParams {
  int64_t num_tokens = 0;         // N
  const bf16_bits* kv = nullptr;  // [N, 512] bf16, RMS-normalised latent, row stride kv_stride
  int64_t kv_stride = 512;
  const int64_t* positions = nullptr;  // [N], each in [0, rope.rows) for tokens with slot >= 0
  const int64_t* slots = nullptr;      // [N], < 0: skip
  RopeTable rope;                      // the layer's table
  MutableCacheView cache;              // fp8_ds_mla destination
  bool sanitise = true;                // clamp codes to 254 and zero NaN RoPE values (CONTRACT 5)
  Path path = Path::Auto;
  void* stream = nullptr;  // cudaStream_t for the CUDA paths
};
void write_window(const WindowWriterParams& p);

// ---- compressor state (CONTRACT 3.2)
// ----------------------------------------------------------------- fp32
// [num_blocks][block_size][2W]: row = [kv (W) | score (W)], W = coff * head_dim.
struct StateCacheView {
  float* base = nullptr;
  int64_t num_blocks = 0;
  int32_t block_size = 0;    // state_bs (any >= 1)
  int64_t block_stride = 0;  // elements between blocks (>= block_size * row_stride)
  int64_t row_stride = 0;    // elements between rows (>= 2W); last dim contiguous
};

struct StateWriterParams {
  int64_t num_tokens = 0;     // N
  int32_t ratio = 4;          // r: 4 (overlap, coff 2) or 128 (coff 1)
  int32_t head_dim = 512;     // 512 (KV compressor) or 128 (indexer compressor)
  const float* kv = nullptr;  // [N, W] fp32, row stride kv_stride
  int64_t kv_stride = 0;
  const float* score = nullptr;  // [N, W] fp32 gate, row stride score_stride
  int64_t score_stride = 0;
  const float* ape = nullptr;            // [r, W] fp32 position bias, or null (already added)
  const int64_t* positions = nullptr;    // [N]
  const int64_t* state_slots = nullptr;  // [N] block*state_bs + row; < 0: skip
  StateCacheView state;
  Path path = Path::Auto;
  void* stream = nullptr;
};
void write_compressor_state(const StateWriterParams& p);

// ---- compressor (CONTRACT 3.2)
// ----------------------------------------------------------------------- Per token: when (pos + 1)
// % r == 0 it completes entry pos / r, pooled from the state rows of positions pos-(1+overlap)*r+1
// .. pos, RMS-normalised, rotated at (pos / r) * r, quantised, stored.
struct CompressorParams {
  int64_t num_tokens = 0;                      // N
  int32_t ratio = 4;                           // 4 or 128
  const int64_t* positions = nullptr;          // [N]
  const int32_t* request_index = nullptr;      // [N] row of state_block_table
  const int64_t* state_slots = nullptr;        // [N] < 0: token skipped
  const int64_t* out_slots = nullptr;          // [N] compressed slot, < 0: nothing stored
  const int32_t* state_block_table = nullptr;  // [R, state_table_width], row stride below
  int64_t state_table_stride = 0;
  int32_t state_table_width = 0;
  int64_t num_requests = 0;            // R
  StateCacheView state;                // read only here
  const float* norm_weight = nullptr;  // [512] RMSNorm weight
  float norm_eps = 1e-6f;
  RopeTable rope;
  MutableCacheView cache;  // fp8_ds_mla destination
  bool sanitise = true;    // CONTRACT 3.2: defaults to on
  // Two-stage form: stage 1 pools into `scratch` fp32 [N, 512] (row stride 512), stage 2 finishes.
  // Byte-identical to the single-pass form. scratch == nullptr: single pass.
  float* scratch = nullptr;
  Path path = Path::Auto;
  void* stream = nullptr;
};
void compress(const CompressorParams& p);

// ---- indexer compressor (CONTRACT 3.2, last paragraph)
// ----------------------------------------------- Same as the compressor with head 128 (ratio 4,
// overlap), rope dims 64..127, one 128-wide block, fp32 power-of-two scale, NORMAL layout
// (cache.layout must be Normal).
struct IndexerCompressorParams {
  int64_t num_tokens = 0;
  const int64_t* positions = nullptr;
  const int32_t* request_index = nullptr;
  const int64_t* state_slots = nullptr;
  const int64_t* out_slots = nullptr;
  const int32_t* state_block_table = nullptr;
  int64_t state_table_stride = 0;
  int32_t state_table_width = 0;
  int64_t num_requests = 0;
  StateCacheView state;                // W = 2 * 128
  const float* norm_weight = nullptr;  // [128]
  float norm_eps = 1e-6f;
  RopeTable rope;
  IndexerCacheView cache;
  bool sanitise = true;
  // Two-stage form as in CompressorParams: fp32 scratch [N, 128] (row stride 128); null: single
  // pass.
  float* scratch = nullptr;
  Path path = Path::Auto;
  void* stream = nullptr;
};
void compress_indexer(const IndexerCompressorParams& p);

// ---- row decoder
// --------------------------------------------------------------------------------- Dequantises
// slot `slot` of an fp8_ds_mla cache into 512 fp32 values. scrub: NaN -> +0 (CONTRACT 5). Throws
// for an invalid slot.
void dequantize_row(const CacheView& cache, int64_t slot, bool scrub, float* out512);

// Dequantises row `slot` of an indexer cache into 128 fp32 values (value * fp32 scale).
void dequantize_indexer_row(const IndexerCacheView& cache, int64_t slot, float* out128);

}  // namespace sparsemla
