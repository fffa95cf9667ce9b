// src/cuda/common/numerics_selfcheck.h: the shared codecs evaluated on the GPU (device pointers,
// 256 entries each), for bit-exact comparison with the host codecs in the GPU tests; and the
// decode kernels' fast-dequantisation predicates evaluated on given scale words, so the GPU tests
// can count which rows take the fast path (CONTRACT 2.1: the pad byte never picks one).
#pragma once

#include <cstdint>

namespace sparsemla::cuda {
void device_codec_table(float* e4m3_values, uint8_t* e4m3_roundtrip, float* ue8m0_values,
                        void* stream);

// Fast-path counts. words: n scale words (device; 8 bytes each, little-endian: the 7 UE8M0 codes
// of a row and its pad byte, byte 7), each taken as the scale word of a row whose 576 data bytes
// are zero (no NaN byte or value, so only the scale word decides); *count (device) is overwritten
// with how many the predicate classifies fast. All run on `stream`, asynchronously.
// The code test every decode kernel calls (scale_codes_fast, decode_common.cuh).
void device_fast_scale_count(const uint64_t* words, int64_t n, uint32_t* count, void* stream);
}  // namespace sparsemla::cuda

namespace sparsemla::cuda_generic {  // src/cuda/generic/decode_generic.cu
// The generic kernels' whole per-thread predicates: ws = false, rows_fast of the 256-thread
// partial kernel (a key is fast when the predicates of all 8 of its threads hold); ws = true,
// rows9_fast of the warp-specialised kernel (its 4 threads of a key test the same words).
void device_rows_fast_count(const uint64_t* words, int64_t n, bool ws, uint32_t* count,
                            void* stream);
}  // namespace sparsemla::cuda_generic

namespace sparsemla::cuda_sm90 {  // src/cuda/sm90/decode_sm90.cu
// part_fast of the sm90 producer, scrubbed tiles (a key's 4 parts test the same word). Returns
// false and launches nothing unless have_sm90a_kernels() (the predicate exists only in the sm_90a
// cubin).
bool device_part_fast_count(const uint64_t* words, int64_t n, uint32_t* count, void* stream);
}  // namespace sparsemla::cuda_sm90
