// src/cuda/common/device_info.h: host-side CUDA facts (pointer kinds, SM counts, error checks).
#pragma once

#include <cstdint>

namespace sparsemla::cuda {

// True when p is device (or managed) memory; host and unregistered pointers give false.
bool is_device_pointer(const void* p);
// The current device's ordinal (cudaGetDevice).
int32_t current_device();
// Multiprocessor count and compute capability of the current device.
int32_t current_device_sms();
void current_device_cc(int32_t* major, int32_t* minor);
// Throws sparsemla::Error naming `what` when `status` (a cudaError_t) is not success.
void check_cuda(int status, const char* what);

}  // namespace sparsemla::cuda
