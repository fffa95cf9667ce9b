// tests/gpu/gpu_support.h: CUDA plumbing shared by the GPU suites (device checks, error checks, an
// owning device buffer).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

// An owning cudaMalloc buffer: move-only, byte-offset views, synchronous copies, memset fills.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) cuda_ok(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return ptr_ == nullptr ? nullptr
                           : reinterpret_cast<T*>(static_cast<uint8_t*>(ptr_) + byte_offset);
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* src, size_t bytes, size_t offset = 0) {
    if (bytes > 0)
      cuda_ok(cudaMemcpy(as<uint8_t>(offset), src, bytes, cudaMemcpyHostToDevice), "upload");
  }
  void download(void* dst, size_t bytes, size_t offset = 0) const {
    if (bytes > 0)
      cuda_ok(cudaMemcpy(dst, as<uint8_t>(offset), bytes, cudaMemcpyDeviceToHost), "download");
  }
  void fill(int byte) {
    if (bytes_ > 0) cuda_ok(cudaMemset(ptr_, byte, bytes_), "cudaMemset");
  }

 private:
  void swap(DeviceBuffer& o) {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer to_device(const std::vector<T>& v, size_t lead_bytes = 0) {
  DeviceBuffer b(lead_bytes + v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T), lead_bytes);
  return b;
}

}  // namespace sparsemla::test::gpu_support
