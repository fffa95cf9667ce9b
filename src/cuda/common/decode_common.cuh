// src/cuda/common/decode_common.cuh: device helpers shared by the GPU decode paths (CONTRACT 2.1,
// 4, 5): untrusted ragged-row ranges, fp8_ds_mla row loads (16-byte vector loads when the cache is
// 16-byte aligned, a byte-wise fallback otherwise), exact dequantisation with the NaN scrub, the
// adaptive active-split rule of CONTRACT 4.5 and the split-K combine / finish math of CONTRACT 4.3.
//
// Numerics: every helper here is exact or rounds once (bf16 RNE). Build without --use_fast_math /
// -ftz=true: e4m3 subnormals and UE8M0 code 0 (2^-127) pass through fp32 denormals.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda/common/warp_mma.cuh"  // smem_u32
#include "sparsemla/format.h"
#include "sparsemla/numerics.h"

namespace sparsemla::cuda {

// ---- kernel-side views (plain structs, copied into kernel params)
// -------------------------------- A paged fp8_ds_mla cache as the kernels read it.
struct DeviceCache {
  const uint8_t* base;
  int64_t num_slots;     // num_blocks * block_size: slots outside [0, num_slots) are invalid
  int64_t block_stride;  // bytes
  int32_t block_size;
  int32_t aligned16;    // base and block_stride are multiples of 16: vector loads allowed
  uint32_t slot_magic;  // slot / block_size = (slot * slot_magic) >> slot_shift for 0 <= slot
  int32_t slot_shift;   // < 2^31 (slot_divider); saves a 64-bit division per row load
};

// Host: the multiplier and shift of DeviceCache for block_size d >= 1. With l = ceil(log2 d) and
// m = ceil(2^(31+l) / d) (< 2^32), floor(n * m / 2^(31+l)) = floor(n / d) for every 0 <= n < 2^31:
// the error n * (m - 2^(31+l)/d) / 2^(31+l) < 2^-l <= 1/d never carries past the next multiple.
inline void slot_divider(int32_t d, uint32_t* magic, int32_t* shift) {
  int32_t l = 0;
  while ((int64_t{1} << l) < d) ++l;
  const uint64_t num = uint64_t{1} << (31 + l);
  *magic = static_cast<uint32_t>((num + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
  *shift = 31 + l;
}

// A ragged index list as the kernels read it; indptr and indices are never trusted.
struct DeviceList {
  const int32_t* indices;   // ragged [capacity]; dense [T, dense_stride]
  const int32_t* indptr;    // ragged [T + 1]; null: dense (CONTRACT 4.6, FlashMLA's form)
  int64_t capacity;         // 0 with null pointers: an absent list (every row empty)
  int64_t dense_stride;     // dense: elements between rows (>= width)
  const int32_t* lengths;   // dense: [ceil(T / rows_per_length)] or null (rows width long)
  int32_t rows_per_length;  // dense: >= 1
  int32_t width;            // dense: W
};

// Output finishing (sink, normalisation, fused inverse RoPE, lse, bf16 store), shared by the
// combine kernel and the one-split partial kernel.
struct FinishParams {
  const float* sink;         // [H] or null
  const int64_t* positions;  // [T] or null: no inverse RoPE
  const float* rope;         // [rope_rows, rope_stride] fp32: cos x32 | sin x32
  int64_t rope_rows;
  int64_t rope_stride;
  __nv_bfloat16* out;        // [T, H, 512]
  int64_t out_stride_token;  // elements
  int64_t out_stride_head;
  int32_t out_pair_aligned;   // out and both strides allow 4-byte (bf16 pair) stores
  int32_t out_chunk_aligned;  // out and both strides allow 16-byte (8 x bf16) stores
  float* lse;                 // [T, H] or null
  int64_t lse_stride_token;
  int64_t lse_stride_head;
  int64_t lse_stride_group;  // rows in groups of lse_group (DecodeParams::lse_group)
  int32_t lse_group;
};

inline constexpr float kNoScore = -FLT_MAX;  // score of invalid keys, m of an inactive split

// ---- ragged rows --------------------------------------------------------------------------------
struct RowRange {
  int64_t begin;  // offset into indices
  int32_t len;
};

// Row t of a list, clamped into [0, capacity] (a row that ends before it begins is empty).
__device__ __forceinline__ RowRange load_row_range(const DeviceList& list, int64_t t) {
  if (list.indices == nullptr || list.capacity <= 0) return {0, 0};
  if (list.indptr == nullptr) {  // dense: the first len(t) of row t's W entries (clamped)
    int32_t len = list.width;
    if (list.lengths != nullptr) {
      // 32-bit division (T < 2^31 on the CUDA paths): a 64-bit one is a call with a stack frame,
      // which made the warp-specialised kernel spill.
      const int32_t l = __ldg(list.lengths + static_cast<uint32_t>(t) /
                                                 static_cast<uint32_t>(list.rows_per_length));
      len = l < 0 ? 0 : (l > list.width ? list.width : l);
    }
    return {t * list.dense_stride, len};
  }
  int64_t b = __ldg(list.indptr + t), e = __ldg(list.indptr + t + 1);
  b = b < 0 ? 0 : (b > list.capacity ? list.capacity : b);
  e = e < b ? b : (e > list.capacity ? list.capacity : e);
  return {b, static_cast<int32_t>(e - b)};
}

// Split s of `pieces` over a segment of length len: [begin, end), c = ceil(len / pieces).
__device__ __forceinline__ void split_bounds(int32_t len, int32_t pieces, int32_t s, int32_t* begin,
                                             int32_t* end) {
  const int64_t c = (static_cast<int64_t>(len) + pieces - 1) / pieces;
  const int64_t b = s * c, e = b + c;
  *begin = static_cast<int32_t>(b < len ? b : len);
  *end = static_cast<int32_t>(e < len ? e : len);
}

__device__ __forceinline__ int32_t ceil_div_i64(int64_t a, int64_t b) {
  return static_cast<int32_t>((a + b - 1) / b);
}

// CONTRACT 4.5: how many of the S splits do work for a row with these true lengths.
__device__ __forceinline__ int32_t adaptive_work(int32_t len_main, int32_t len_extra,
                                                 int32_t splits, int32_t one_wave) {
  constexpr int64_t kBk = 32;
  const int32_t it4 = ceil_div_i64(len_main, 4 * kBk) + ceil_div_i64(len_extra, 4 * kBk);
  int32_t work = splits;
  if (4 < one_wave && one_wave < splits &&
      ceil_div_i64(len_main, one_wave * kBk) + ceil_div_i64(len_extra, one_wave * kBk) <= 3) {
    work = one_wave;
  }
  if (it4 <= 3) work = 4;
  return work < splits ? work : splits;
}

// ---- shared memory, async copies, online-softmax constants (both decode kernels)
// -----------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
// 8 bytes (both addresses 8-byte aligned), through L1: a row's scale word.
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
// 4 bytes (both addresses 4-byte aligned), through L1: small tables read once per CTA.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

inline constexpr float kLog2e = 1.4426950408889634f;
// 2^x (MUFU.EX2; denormal results flush to 0).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- slot addressing ----------------------------------------------------------------------------
// Byte offsets of a slot's data row and scale word; data < 0 marks an invalid slot (never read).
struct RowOffsets {
  int64_t data;
  int64_t scale;
};
__device__ __forceinline__ RowOffsets row_offsets(const DeviceCache& c, int64_t slot) {
  if (slot < 0 || slot >= c.num_slots) return {-1, -1};
  return {mla_data_offset(slot, c.block_size, c.block_stride),
          mla_scale_offset(slot, c.block_size, c.block_stride)};
}

// The offsets of a slot known to be in [0, c.num_slots), with no test (branch-free: callers that
// select the result themselves let the scheduler interleave it with other work).
__device__ __forceinline__ RowOffsets row_offsets32_in_range(const DeviceCache& c, uint32_t slot) {
  const uint32_t block =
      static_cast<uint32_t>((static_cast<uint64_t>(slot) * c.slot_magic) >> c.slot_shift);
  const int64_t page = static_cast<int64_t>(block) * c.block_stride;
  const int32_t p = static_cast<int32_t>(slot - block * static_cast<uint32_t>(c.block_size));
  return {page + static_cast<int64_t>(p) * Fp8DsMla::kDataBytes,
          page + static_cast<int64_t>(c.block_size) * Fp8DsMla::kDataBytes +
              static_cast<int64_t>(p) * Fp8DsMla::kScaleBytes};
}

// Same for a 32-bit slot id (index lists hold int32), without a 64-bit division.
__device__ __forceinline__ RowOffsets row_offsets32(const DeviceCache& c, int32_t slot) {
  if (slot < 0 || slot >= c.num_slots) return {-1, -1};
  return row_offsets32_in_range(c, static_cast<uint32_t>(slot));
}

// ---- loads --------------------------------------------------------------------------------------
// 16 bytes at base + off: one vector load when the cache is 16-byte aligned (every data-row chunk
// then is), byte loads otherwise (unpadded strides such as 61*584 = 8 mod 16, CONTRACT 2.1).
__device__ __forceinline__ uint4 load_chunk16(const DeviceCache& c, int64_t off) {
  if (c.aligned16) return __ldg(reinterpret_cast<const uint4*>(c.base + off));
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* p = c.base + off + 4 * i;
    w[i] = static_cast<uint32_t>(__ldg(p)) | (static_cast<uint32_t>(__ldg(p + 1)) << 8) |
           (static_cast<uint32_t>(__ldg(p + 2)) << 16) |
           (static_cast<uint32_t>(__ldg(p + 3)) << 24);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 8 scale bytes of a row (7 UE8M0 codes + pad): one 8-byte load when aligned.
__device__ __forceinline__ uint2 load_scale8(const DeviceCache& c, int64_t off) {
  if (c.aligned16) return __ldg(reinterpret_cast<const uint2*>(c.base + off));
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint8_t* p = c.base + off + 4 * i;
    w[i] = static_cast<uint32_t>(__ldg(p)) | (static_cast<uint32_t>(__ldg(p + 1)) << 8) |
           (static_cast<uint32_t>(__ldg(p + 2)) << 16) |
           (static_cast<uint32_t>(__ldg(p + 3)) << 24);
  }
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ uint32_t scale_code(uint2 word, int tile) {
  const uint32_t w = tile < 4 ? word.x : word.y;
  return (w >> (8 * (tile & 3))) & 0xFFu;
}

// ---- dequantisation and scrub (CONTRACT 2.1, 5)
// ------------------------------------------------------ UE8M0 as fp32 bits (code 0 = the subnormal
// 2^-127, 255 = +inf); never __nv_cvt_e8m0 (255 -> NaN).
__device__ __forceinline__ float ue8m0_scale(uint32_t code) {
  return ue8m0_to_float(static_cast<uint8_t>(code));
}

__device__ __forceinline__ float scrub_nan(float v) {
  return v != v ? 0.0f : v;
}

// e4m3 byte * scale, exact in fp32. The byte's bits placed into fp32 as (sign << 31) |
// ((b & 0x7F) << 20) are exactly value * 2^-120 (normals and subnormals alike), so one multiply by
// 2^120 restores it; the second multiply applies the scale (+inf for code 255: 0 * inf = NaN).
// NaN bytes (0x7F / 0xFF) would come out finite and are handled explicitly: +0 when scrubbing,
// NaN otherwise. Scrubbing also turns 0 * inf into +0 (CONTRACT 5: every NaN -> +0, +-inf kept).
__device__ __forceinline__ float dequant_e4m3(uint32_t b, float scale, bool scrub) {
  const float unit = __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7Fu) << 20)) * 0x1p120f;
  const float v = unit * scale;
  if ((b & 0x7Fu) == 0x7Fu) return scrub ? 0.0f : __uint_as_float(0x7FC00000u);
  return scrub ? scrub_nan(v) : v;
}

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 16 NoPE bytes (one scale tile) -> 16 bf16 values (two 16-byte words). Exact for codes >= 8.
__device__ __forceinline__ void dequant_nope16(uint4 bytes, float scale, bool scrub, uint4* lo,
                                               uint4* hi) {
  const uint32_t w[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float v0 = dequant_e4m3(w[i] & 0xFFu, scale, scrub);
    const float v1 = dequant_e4m3((w[i] >> 8) & 0xFFu, scale, scrub);
    const float v2 = dequant_e4m3((w[i] >> 16) & 0xFFu, scale, scrub);
    const float v3 = dequant_e4m3(w[i] >> 24, scale, scrub);
    o[2 * i] = bf16x2_bits(v0, v1);
    o[2 * i + 1] = bf16x2_bits(v2, v3);
  }
  *lo = make_uint4(o[0], o[1], o[2], o[3]);
  *hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// ---- fast dequantisation (codes <= 134, no NaN byte)
// --------------------------------------------- An e4m3 byte placed into bf16 bits as (sign << 15)
// | ((b & 0x7F) << 4) is exactly value * 2^-120 (normals and subnormals alike), so one bf16x2
// multiply by 2^(code - 7) = scale * 2^120 gives value * scale, rounded once (exact for codes >=
// 8). 2^(code - 7) is a normal bf16 for codes 0..134 (exponent field code + 120 <= 254); products
// stay below 448 * 2^7 and are never NaN. Other tiles (codes 135..255, NaN bytes) take the exact
// fp32 path above, which also scrubs.
inline constexpr uint32_t kFastMaxCode = 134;

// True when one of the 4 bytes of w is an e4m3 NaN (low 7 bits 0x7F): adding 1 to the low 7 bits
// carries into bit 7 only for 0x7F, never across bytes.
__device__ __forceinline__ bool has_nan_byte(uint32_t w) {
  return (((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0;
}
__device__ __forceinline__ bool chunk_has_nan_byte(uint4 v) {
  return has_nan_byte(v.x) || has_nan_byte(v.y) || has_nan_byte(v.z) || has_nan_byte(v.w);
}

// Two e4m3 bytes of w -> the bf16x2 bits of value * 2^-120: (sign << 15) | ((b & 0x7F) << 4).
// prmt places byte b in the low byte of a 16-bit lane and its sign, replicated, in the high byte
// (selector nibbles with bit 3 set); shifting by 4 then puts the sign at bit 15 and the 7 value
// bits at [4, 11), and one mask clears the sign copies at bits 11..14 (and the bits the shift moved
// from lane 0 into lane 1). Three instructions per pair (was four with a sign move by multiply).
template <uint32_t kSel>
__device__ __forceinline__ uint32_t e4m3x2_scaled_bf16x2(uint32_t w) {
  uint32_t t;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(t) : "r"(w), "n"(kSel));
  return (t << 4) & 0x87F087F0u;
}
inline constexpr uint32_t kE4m3Lo = 0x9180;  // bytes 0, 1 of a word (with their signs)
inline constexpr uint32_t kE4m3Hi = 0xB3A2;  // bytes 2, 3

// SWAR checks of the fast path, accumulated over words and tested once (carry-free per lane):
// bit 7 of a byte of nan_bytes_acc(w) is set iff the byte is an e4m3 NaN (low 7 bits 0x7F);
__device__ __forceinline__ uint32_t nan_bytes_acc(uint32_t w) {
  return (w & 0x7F7F7F7Fu) + 0x01010101u;
}
inline constexpr uint32_t kNanBytesMask = 0x80808080u;
// bit 15 of a lane of nan_bf16_acc(w) is set iff the bf16 is a NaN ((h & 0x7FFF) > 0x7F80);
__device__ __forceinline__ uint32_t nan_bf16_acc(uint32_t w) {
  return (w & 0x7FFF7FFFu) + 0x007F007Fu;
}
inline constexpr uint32_t kNanBf16Mask = 0x80008000u;
// true iff a byte (UE8M0 code) of w is above kFastMaxCode = 134: b >= 135 <=> bit 7 set and
// (b & 0x7F) >= 7.
__device__ __forceinline__ bool any_code_above_fast(uint32_t w) {
  return ((((w & 0x7F7F7F7Fu) + 0x79797979u) & w) & 0x80808080u) != 0;
}
// true iff all 7 UE8M0 codes of a row's scale word are <= kFastMaxCode: the fast-path code test of
// every decode kernel. Byte 7 is the pad byte (CONTRACT 2.1): real caches hold anything there
// (FlashMLA's quantiser leaves it uninitialised), and tested with the codes it sent about half the
// rows of such caches down the exact path (whole decodes 1.6-1.75x slower, issue 22). The mask
// folds into the test's constants (0x007F7F7F, 0x00808080); SASS against the unmasked test: +1
// instruction in the sm90 kernel, +-0 in the ws kernel (sm_90a), -6 in the 256-thread kernel
// (sm_80, sm_90a; rows_fast says why).
__device__ __forceinline__ bool scale_codes_fast(uint2 scale) {
  return !any_code_above_fast(scale.x) && !any_code_above_fast(scale.y & 0x00FFFFFFu);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// 16 NoPE bytes of a tile with code <= kFastMaxCode and no NaN byte -> 16 bf16 (two 16-byte words).
__device__ __forceinline__ void dequant_nope16_fast(uint4 bytes, uint32_t code, uint4* lo,
                                                    uint4* hi) {
  const uint32_t f = (code + 120u) << 7, factor = f | (f << 16);  // bf16x2 of 2^(code - 7)
  const uint32_t w[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = bf16x2_mul(e4m3x2_scaled_bf16x2<kE4m3Lo>(w[i]), factor);
    o[2 * i + 1] = bf16x2_mul(e4m3x2_scaled_bf16x2<kE4m3Hi>(w[i]), factor);
  }
  *lo = make_uint4(o[0], o[1], o[2], o[3]);
  *hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// The whole NoPE chunk: the fast path when it applies, the exact fp32 path otherwise.
__device__ __forceinline__ void dequant_nope16_any(uint4 bytes, uint32_t code, bool scrub,
                                                   uint4* lo, uint4* hi) {
  if (code <= kFastMaxCode && !chunk_has_nan_byte(bytes)) {
    dequant_nope16_fast(bytes, code, lo, hi);
  } else {
    dequant_nope16(bytes, ue8m0_scale(code), scrub, lo, hi);
  }
}

// One bf16 of a packed pair: NaN -> +0, everything else (+-inf too) unchanged.
__device__ __forceinline__ uint32_t scrub_bf16_half(uint32_t h) {
  return (h & 0x7FFFu) > 0x7F80u ? 0u : h;
}
__device__ __forceinline__ uint32_t scrub_bf16x2(uint32_t w) {
  return scrub_bf16_half(w & 0xFFFFu) | (scrub_bf16_half(w >> 16) << 16);
}

// 8 stored RoPE bf16 values (16 bytes), scrubbed when required.
__device__ __forceinline__ uint4 rope_chunk16(uint4 v, bool scrub) {
  if (!scrub) return v;
  return make_uint4(scrub_bf16x2(v.x), scrub_bf16x2(v.y), scrub_bf16x2(v.z), scrub_bf16x2(v.w));
}

// ---- combine / finish math (CONTRACT 4.3, 4.3a) -------------------------------------------------
// Weight of a split relative to the running maximum M: 0 for an inactive split (m == -FLT_MAX),
// whose acc must never be read.
__device__ __forceinline__ float split_weight(float m, float big_m) {
  return m == kNoScore ? 0.0f : __expf(m - big_m);
}

__device__ __forceinline__ float quiet_nan() {
  return __uint_as_float(0x7FC00000u);
}

// What a split reports for its running (m, l) (CONTRACT 4.3): (m, l) when l > 0; an empty split
// (l == 0) reports m = -FLT_MAX, l = 0 and leaves its acc unwritten; a split whose l is NaN (a NaN
// or +inf score) reports m = NaN, which split_weight turns into a NaN weight in every combine.
__device__ __forceinline__ float reported_m(float m, float l) {
  return l > 0.0f ? m : (l == 0.0f ? kNoScore : quiet_nan());
}
__device__ __forceinline__ float reported_l(float l) {
  return l == 0.0f ? 0.0f : l;
}
__device__ __forceinline__ bool split_has_acc(float l) {
  return !(l == 0.0f);
}

// Folds the sink into (M, L) of the valid keys. L is not > 0 for empty rows and for sink = +inf
// (exp(inf - inf) = NaN), both of which output 0, and for a NaN sink or mass (output NaN).
struct FinishScale {
  float big_m;   // max(max_s m_s, sink)
  float factor;  // multiplier of sum_s w_s acc_s: 1 / max(L, 1e-30), or 0 when L is not > 0
};
__device__ __forceinline__ float finish_max(float max_m, const float* sink, int32_t h) {
  return sink != nullptr ? fmaxf(max_m, __ldg(sink + h)) : max_m;
}
// 1 / L when L > 0. Otherwise 0 for an empty row or a +inf sink (the denominator's limit is +inf),
// and NaN when the keys' mass or the sink is NaN (CONTRACT 4.2): the caller's output is then NaN,
// rows without keys included (finish_seed).
__device__ __forceinline__ float factor_of_total(float total, float sum_wl, float sink_v) {
  if (total > 0.0f) return 1.0f / fmaxf(total, 1e-30f);
  return isnan(sum_wl) || isnan(sink_v) ? quiet_nan() : 0.0f;
}
__device__ __forceinline__ float finish_factor(float sum_wl, float big_m, const float* sink,
                                               int32_t h) {
  if (sink == nullptr) return factor_of_total(sum_wl, sum_wl, 0.0f);
  const float sink_v = __ldg(sink + h);
  return factor_of_total(sum_wl + __expf(sink_v - big_m), sum_wl, sink_v);
}
// The starting value of a finished output sum: NaN when the factor is NaN (so that a row with no
// active split is NaN too), else 0.
__device__ __forceinline__ float finish_seed(float factor) {
  return isnan(factor) ? quiet_nan() : 0.0f;
}

// CONTRACT 4.3's finish of N splits (m_s, l_s) of row head h: M' = max m_s (for lse), the maximum
// with the sink, L' (for lse) and the multiplier 1 / L; split s's acc then weighs
// split_weight(m_s, big_m) * factor. Splits past the real count pass m = -FLT_MAX, l = 0.
struct SplitsFinish {
  float max_m;
  float big_m;
  float factor;
  float sum_l;
};
template <int N>
__device__ __forceinline__ SplitsFinish finish_splits(const float (&m)[N], const float (&l)[N],
                                                      const float* sink, int32_t h) {
  SplitsFinish r;
  r.max_m = kNoScore;
#pragma unroll
  for (int s = 0; s < N; ++s) r.max_m = fmaxf(r.max_m, m[s]);
  r.big_m = finish_max(r.max_m, sink, h);
  float sum_wl = 0.f, sum_l = 0.f;  // with the sink's maximum / without (lse)
#pragma unroll
  for (int s = 0; s < N; ++s) {
    sum_wl += split_weight(m[s], r.big_m) * l[s];
    sum_l += split_weight(m[s], r.max_m) * l[s];
  }
  r.factor = finish_factor(sum_wl, r.big_m, sink, h);
  r.sum_l = sum_l;
  return r;
}

// Head h's sink as a value: -inf when there is none (max(m, -inf) = m and exp(-inf - M) = 0, so
// the finish below gives the same bits as without a sink). Lets a kernel load it long before use.
__device__ __forceinline__ float sink_value(const float* sink, int32_t h) {
  return sink != nullptr ? __ldg(sink + h) : -__int_as_float(0x7F800000);
}

// The multiplier of acc that finishes a row computed by a single split (S == 1, done in place by
// the partial kernels): the combine above with one split of running max m and sum l; sink_v from
// sink_value.
__device__ __forceinline__ float one_split_coef(float m, float l, float sink_v) {
  const float big_m = fmaxf(m, sink_v);
  const float w = split_weight(m, big_m);
  const float sum_wl = w * l;
  return w * factor_of_total(sum_wl + __expf(sink_v - big_m), sum_wl, sink_v);
}

// lse without the sink: M' + ln(L') over the active splits, +inf when L' = 0, NaN when L' is.
__device__ __forceinline__ float finish_lse(float max_m, float sum_l) {
  if (sum_l > 0.0f) return max_m + logf(sum_l);
  return sum_l == 0.0f ? __uint_as_float(0x7F800000u) : quiet_nan();
}

// The RoPE table row (cos x32 | sin x32) at the query position of row t, clamped into the table (a
// GPU precondition, but never an out-of-bounds read).
__device__ __forceinline__ const float* rope_row(const FinishParams& f, int64_t t) {
  int64_t pos = __ldg(f.positions + t);
  pos = pos < 0 ? 0 : (pos >= f.rope_rows ? f.rope_rows - 1 : pos);
  return f.rope + pos * f.rope_stride;
}

// cos / sin of RoPE pair k at the query position of row t.
__device__ __forceinline__ float2 rope_cos_sin(const FinishParams& f, int64_t t, int k) {
  const float* row = rope_row(f, t);
  return make_float2(__ldg(row + k), __ldg(row + 32 + k));
}

// Inverse rotation of pair (a, b), plain multiply-add as the CPU reference (no FMA contraction).
__device__ __forceinline__ void inverse_rope(float& a, float& b, float2 cs) {
  const float na = __fadd_rn(__fmul_rn(a, cs.x), __fmul_rn(b, cs.y));
  const float nb = __fsub_rn(__fmul_rn(b, cs.x), __fmul_rn(a, cs.y));
  a = na;
  b = nb;
}

// 8 bf16 output values (16 bytes) to dst when out is not 16-byte aligned: pairs or elements.
inline __device__ __noinline__ void store_out_chunk_unaligned(const FinishParams& f,
                                                              __nv_bfloat16* dst, uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (f.out_pair_aligned) {
      *reinterpret_cast<uint32_t*>(dst + 2 * i) = w[i];
    } else {
      dst[2 * i] = __ushort_as_bfloat16(static_cast<unsigned short>(w[i] & 0xFFFFu));
      dst[2 * i + 1] = __ushort_as_bfloat16(static_cast<unsigned short>(w[i] >> 16));
    }
  }
}

// 8 bf16 output values of row (t, h), dims [8 ch, +8): one 16-byte store when out allows it.
__device__ __forceinline__ void store_out_chunk(const FinishParams& f, int64_t t, int32_t h, int ch,
                                                uint4 v) {
  __nv_bfloat16* dst = f.out + t * f.out_stride_token + h * f.out_stride_head + 8 * ch;
  if (f.out_chunk_aligned) {
    *reinterpret_cast<uint4*>(dst) = v;
  } else {
    store_out_chunk_unaligned(f, dst, v);
  }
}

// Stores the output pair (dims d, d + 1; d even) of row (t, h), rotating it back first when d is a
// RoPE dim and positions are given.
// The output pair (dims d, d + 1) of row (t, h) as given (already rotated back where needed).
__device__ __forceinline__ void store_out_value_pair(const FinishParams& f, int64_t t, int32_t h,
                                                     int d, float a, float b) {
  __nv_bfloat16* dst = f.out + t * f.out_stride_token + h * f.out_stride_head + d;
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  if (f.out_pair_aligned) {
    *reinterpret_cast<__nv_bfloat162*>(dst) = v;
  } else {
    dst[0] = v.x;
    dst[1] = v.y;
  }
}

__device__ __forceinline__ void store_out_pair(const FinishParams& f, int64_t t, int32_t h, int d,
                                               float a, float b) {
  if (f.positions != nullptr && d >= Fp8DsMla::kNopeDims) {
    inverse_rope(a, b, rope_cos_sin(f, t, (d - Fp8DsMla::kNopeDims) / 2));
  }
  store_out_value_pair(f, t, h, d, a, b);
}

__device__ __forceinline__ void store_lse(const FinishParams& f, int64_t t, int32_t h, float v) {
  if (f.lse == nullptr) return;
  const uint32_t g = static_cast<uint32_t>(f.lse_group), tt = static_cast<uint32_t>(t);
  const int64_t row =
      g == 1 ? t * f.lse_stride_token
             : int64_t{tt / g} * f.lse_stride_group + int64_t{tt % g} * f.lse_stride_token;
  f.lse[row + h * f.lse_stride_head] = v;
}

}  // namespace sparsemla::cuda
