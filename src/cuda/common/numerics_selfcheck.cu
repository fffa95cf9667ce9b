// Device-side instantiation of the shared codecs: decodes and re-encodes every e4m3 byte and every
// UE8M0 code on the GPU so GPU tests can compare them bit for bit with the host table.
#include <cuda_runtime.h>

#include <cstdint>

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
}  // namespace

void device_codec_table(float* e4m3_values, uint8_t* e4m3_roundtrip, float* ue8m0_values,
                        void* stream) {
  codec_table_kernel<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(e4m3_values, e4m3_roundtrip,
                                                                       ue8m0_values);
  check_cuda(cudaGetLastError(), "codec_table_kernel launch");
}

}  // namespace sparsemla::cuda
