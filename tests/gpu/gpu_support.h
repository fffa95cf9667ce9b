// tests/gpu/gpu_support.h: CUDA plumbing shared by the GPU suites (device checks, error checks).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace sparsemla::test::gpu_support {

// A cc 9.0 device (H100/H200): the sm90 path's instances run only there.
inline bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

// Throws (failing the test with the CUDA error's text) unless e is cudaSuccess.
inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace sparsemla::test::gpu_support
