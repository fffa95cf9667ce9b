// src/cuda/common/numerics_selfcheck.h: the shared codecs evaluated on the GPU (device pointers,
// 256 entries each), for bit-exact comparison with the host codecs in the GPU tests.
#pragma once

#include <cstdint>

namespace sparsemla::cuda {
void device_codec_table(float* e4m3_values, uint8_t* e4m3_roundtrip, float* ue8m0_values,
                        void* stream);
}  // namespace sparsemla::cuda
