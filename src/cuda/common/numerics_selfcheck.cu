// Device-side instantiation of the shared codecs: decodes and re-encodes every e4m3 byte and every
// UE8M0 code on the GPU so GPU tests can compare them bit for bit with the host table; and the
// fast-path code test of the decode kernels on given scale words (numerics_selfcheck.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_common.cuh"
#include "cuda/common/device_info.h"
#include "cuda/common/numerics_selfcheck.h"
#include "sparsemla/numerics.h"

namespace sparsemla::cuda {

namespace {
__global__ void codec_table_kernel(float* e4m3_values, uint8_t* e4m3_roundtrip,
                                   float* ue8m0_values) {
  const int i = threadIdx.x;  // 256 threads
  const float v = e4m3_to_float(static_cast<uint8_t>(i));
  e4m3_values[i] = v;
  e4m3_roundtrip[i] = float_to_e4m3(v);
  ue8m0_values[i] = ue8m0_to_float(static_cast<uint8_t>(i));
}

__global__ void fast_scale_count_kernel(const uint2* words, int64_t n, uint32_t* count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n && scale_codes_fast(words[i])) atomicAdd(count, 1u);
}
}  // namespace

void device_codec_table(float* e4m3_values, uint8_t* e4m3_roundtrip, float* ue8m0_values,
                        void* stream) {
  codec_table_kernel<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(e4m3_values, e4m3_roundtrip,
                                                                       ue8m0_values);
  check_cuda(cudaGetLastError(), "codec_table_kernel launch");
}

void device_fast_scale_count(const uint64_t* words, int64_t n, uint32_t* count, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  check_cuda(cudaMemsetAsync(count, 0, sizeof(uint32_t), s), "fast_scale_count clear");
  if (n <= 0) return;
  fast_scale_count_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(
      reinterpret_cast<const uint2*>(words), n, count);
  check_cuda(cudaGetLastError(), "fast_scale_count_kernel launch");
}

}  // namespace sparsemla::cuda
