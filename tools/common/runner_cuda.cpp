// CUDA builds: whether `run` and `bench` can use a GPU, and if not, why (a machine without a
// driver reports "CUDA driver version is insufficient", which does not say that no GPU is there).
#include <cuda_runtime.h>

#include <string>

#include "runner.h"

namespace sparsemla::tools {

std::string cuda_device_problem() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later CPU-only work is unaffected
    return std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
  }
  return n > 0 ? std::string() : std::string("no CUDA device (cudaGetDeviceCount: 0 devices)");
}

}  // namespace sparsemla::tools
