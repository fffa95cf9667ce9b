#include <cuda_runtime.h>

#include <array>
#include <mutex>
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

namespace {
// Device attributes read once per device: the decode's host path asks for them on every call, and
// cudaDeviceGetAttribute costs microseconds that a 10 us decode cannot spare.
struct DeviceFacts {
  int32_t sms = 0, major = 0, minor = 0;
};
constexpr int kMaxDevices = 64;

const DeviceFacts& device_facts() {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<DeviceFacts, kMaxDevices> facts;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  SPARSEMLA_CHECK_ARG(dev >= 0 && dev < kMaxDevices, "device_facts", "device", "< 64", dev);
  std::call_once(once[dev], [dev] {
    DeviceFacts& f = facts[dev];
    check_cuda(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
    check_cuda(cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, dev),
               "cc major");
    check_cuda(cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, dev),
               "cc minor");
  });
  return facts[dev];
}
}  // namespace

int32_t current_device() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  return dev;
}

int32_t current_device_sms() {
  return device_facts().sms;
}

void current_device_cc(int32_t* major, int32_t* minor) {
  const DeviceFacts& f = device_facts();
  *major = f.major;
  *minor = f.minor;
}

}  // namespace sparsemla::cuda
