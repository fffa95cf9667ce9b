#include <cuda_runtime.h>

#include <string>

#include "cuda/common/device_info.h"
#include "sparsemla/error.h"

namespace sparsemla::cuda {

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of an unknown pointer
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

void check_cuda(int status, const char* what) {
  if (status == cudaSuccess) return;
  throw Error(std::string("sparsemla: CUDA error in ") + what + ": " +
              cudaGetErrorString(static_cast<cudaError_t>(status)));
}

int32_t current_device_sms() {
  int dev = 0, sms = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  return sms;
}

void current_device_cc(int32_t* major, int32_t* minor) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, dev), "cc major");
  check_cuda(cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, dev), "cc minor");
}

}  // namespace sparsemla::cuda
