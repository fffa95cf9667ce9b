// src/cuda/generic/kernel_args.cuh: the kernel-side view of a decode call shared by the CUDA decode
// paths (generic and sm90): caches, lists, the scrub decision of the provenance gate (SPEC 5),
// the adaptive-split constants (SPEC 4.5), the workspace partials and the finishing parameters;
// and the split-K combine launch (SPEC 4.3). CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_common.cuh"
#include "sparsemla/decode.h"

namespace sparsemla::cuda_generic {

struct KernelArgs {
  int64_t q_stride_token;  // elements (the default H * 512 resolved)
  int32_t q_vec16;         // q and its strides allow 16-byte loads
  cuda::DeviceCache main_cache;
  cuda::DeviceCache extra_cache;
  cuda::DeviceList main_list;
  cuda::DeviceList extra_list;  // capacity 0: no extra segment
  int32_t scrub_extra;          // the main cache is always scrubbed
  int32_t adaptive;
  int32_t one_wave;
  float* ws_m;  // [T, S, H] (S > 1)
  float* ws_l;
  float* ws_acc;  // [T, S, H, 512]
  cuda::FinishParams finish;
};

// specialised: the call runs on the sm90-specialised path (the provenance gate may then skip the
// extra cache's scrub).
KernelArgs kernel_args(const DecodeParams& p, int32_t num_splits, void* workspace,
                       bool specialised);

// The combine kernel over the workspace partials (S > 1), with programmatic dependent launch on
// sm_90+ (it waits for the preceding partial kernel in griddepcontrol.wait).
void launch_combine(const KernelArgs& a, int64_t num_tokens, int32_t num_heads, int32_t num_splits,
                    cudaStream_t stream);

}  // namespace sparsemla::cuda_generic
