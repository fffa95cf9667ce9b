// tools/common/runner.h: runs a built Problem's decode on a path and times it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "problem.h"

namespace sparsemla::tools {

struct DecodeRun {
  Path path = Path::Cpu;  // the path that ran
  int32_t splits = 1;
  double median_seconds = 0.0;
  double min_seconds = 0.0;
  double max_seconds = 0.0;
  std::vector<bf16_bits> out;  // [T, H, 512] on the host
};

// Auto picks the fastest available path: the GPU when this build has CUDA and a device is present.
DecodeRun run_decode(const Problem& pb, Path path, int32_t splits, int32_t repeat,
                     const std::function<void(const std::string&)>& progress);

// Why no CUDA device is usable ("no CUDA device (...)": a build without CUDA, the runtime's
// error or 0 devices); empty when one is. Implemented in runner_cuda.cpp when CUDA is built.
std::string cuda_device_problem();
inline bool cuda_device_available() {
  return cuda_device_problem().empty();
}

}  // namespace sparsemla::tools
