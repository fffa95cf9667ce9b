// src/dispatch_indexer_prep.cpp: the public entry of the indexer query prep (CONTRACT 11.6):
// validation, then the backend (a file apart from src/dispatch.cpp so that the op's files stay
// apart from the indexer's). The decision is indexer_topk's (src/dispatch.cpp): host pointers go to
// the CPU backend, device pointers with Auto or CudaGeneric to the generic CUDA kernel
// (src/cuda/generic/indexer_prep.cu, sm_80+, also in the sm_90a build); the probe is the output
// w_out. CudaSm90 is refused naming `path`, as for indexer_topk (no Hopper-specific prep exists;
// cuda-generic runs on the H100/H200). Beyond the probe, every other array must live on the same
// side (host or device): a mixed call is refused naming the first array on the wrong side, before
// any work.
#include <string>

#include "core/validate_indexer_prep.h"
#include "cpu/indexer_prep.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer_prep.h"

#if defined(SPARSEMLA_WITH_CUDA)
#include "cuda/common/device_info.h"
#include "cuda/generic/indexer_prep_backend.h"
#endif

namespace sparsemla {

namespace {

constexpr const char* kOp = "indexer_q_prep";

#if defined(SPARSEMLA_WITH_CUDA)
// Every array of the call on the side of the probe (device: device or managed memory).
void check_same_side(const IndexerQPrepParams& p, bool device) {
  const std::string expected =
      device ? "device memory (w_out is device memory)" : "host memory (w_out is host memory)";
  const char* got = device ? "host memory" : "device memory";
  const auto check = [&](const char* arg, const void* ptr) {
    if (ptr == nullptr) return;
    SPARSEMLA_CHECK_ARG(cuda::is_device_pointer(ptr) == device, kOp, arg, expected, got);
  };
  check("q", p.q);
  check("positions", p.positions);
  if (p.rope.rows > 0) check("rope", p.rope.data);
  check("w_raw", p.w_raw);
  check("q_out", p.q_out);
}
#endif

}  // namespace

void indexer_q_prep(const IndexerQPrepParams& p) {
  core::validate(p);
  bool on_device = false;
#if defined(SPARSEMLA_WITH_CUDA)
  on_device = p.num_tokens > 0 && cuda::is_device_pointer(p.w_out);
#endif
  if (p.path == Path::Cpu || (p.path == Path::Auto && !on_device)) {
    SPARSEMLA_CHECK_ARG(!on_device, kOp, "path", "host pointers for the cpu path",
                        "device pointers");
#if defined(SPARSEMLA_WITH_CUDA)
    if (p.num_tokens > 0) check_same_side(p, false);
#endif
    cpu::indexer_q_prep(p);
    return;
  }
#if defined(SPARSEMLA_WITH_CUDA)
  SPARSEMLA_CHECK_ARG(p.path != Path::CudaSm90, kOp, "path",
                      "auto, cpu or cuda-generic (no Hopper-specific query prep: cuda-generic "
                      "runs on sm90)",
                      path_name(p.path));
  if (p.num_tokens == 0) return;  // nothing to read or write
  SPARSEMLA_CHECK_ARG(on_device, kOp, "path", "device pointers for a CUDA path", "host pointers");
  check_same_side(p, true);
  cuda_generic::indexer_q_prep(p);
#else
  throw_arg_error(kOp, "path", "cpu or auto (this build has no CUDA kernels)",
                  path_name(p.path == Path::Auto ? Path::CudaGeneric : p.path));
#endif
}

}  // namespace sparsemla
