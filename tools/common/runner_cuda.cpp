// CUDA builds: whether `run` and `bench` can use a GPU.
#include <cuda_runtime.h>

#include "runner.h"

namespace sparsemla::tools {

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

}  // namespace sparsemla::tools
