// src/dispatch_context_parallel.cpp: the public entries of the context-parallel ops (CONTRACT 12):
// validation, then the backend (a file apart from src/dispatch.cpp so that the ops' files stay
// apart from the decode's). As for the list builders: host pointers run on the CPU backend, device
// pointers on the one CUDA implementation (src/cuda/generic/context_parallel.cu, sm_80+), which
// serves both CUDA paths; the probe is the output (out, out.indptr). Every other array must live
// on the same side: a mixed call is refused naming the first array on the wrong side, before any
// work.
#include <string>

#include "core/validate_context_parallel.h"
#include "cpu/context_parallel.h"
#include "sparsemla/context_parallel.h"
#include "sparsemla/error.h"

#if defined(SPARSEMLA_WITH_CUDA)
#include "cuda/common/device_info.h"
#include "cuda/generic/context_parallel_backend.h"
#endif

namespace sparsemla {

namespace {

// Whether the call runs on the GPU: `probe` (an output) decides under Auto; Cpu needs host
// pointers, a CUDA path device pointers.
bool runs_on_gpu(const char* op, const char* path_arg, Path path, const void* probe) {
  bool on_device = false;
#if defined(SPARSEMLA_WITH_CUDA)
  on_device = probe != nullptr && cuda::is_device_pointer(probe);
#else
  (void)probe;
#endif
  if (path == Path::Cpu || (path == Path::Auto && !on_device)) {
    SPARSEMLA_CHECK_ARG(!on_device, op, path_arg, "host pointers for the cpu path",
                        "device pointers");
    return false;
  }
#if defined(SPARSEMLA_WITH_CUDA)
  SPARSEMLA_CHECK_ARG(on_device, op, path_arg, "device pointers for a CUDA path", "host pointers");
  return true;
#else
  throw_arg_error(op, path_arg, "cpu or auto (this build has no CUDA kernels)",
                  path_name(path == Path::Auto ? Path::CudaGeneric : path));
#endif
}

// Every array of the call on the side of the probe (device: device or managed memory).
template <typename Check>
void check_same_side(const char* op, const char* probe_name, bool device, Check each) {
#if defined(SPARSEMLA_WITH_CUDA)
  const std::string expected = std::string(device ? "device" : "host") + " memory (" + probe_name +
                               " is " + (device ? "device" : "host") + " memory)";
  const char* got = device ? "host memory" : "device memory";
  each([&](const char* arg, const void* ptr) {
    if (ptr == nullptr) return;
    SPARSEMLA_CHECK_ARG(cuda::is_device_pointer(ptr) == device, op, arg, expected, got);
  });
#else
  (void)op, (void)probe_name, (void)device, (void)each;
#endif
}

}  // namespace

void merge_ranks(const RankMergeParams& p) {
  const char* op = "merge_ranks";
  core::validate(p);
  if (p.num_tokens == 0) return;  // nothing to read or write, on any path
  const bool gpu = runs_on_gpu(op, "path", p.path, p.out);
  check_same_side(op, "out", gpu, [&](auto check) {
    check("rank_out", p.rank_out);
    check("rank_out_f32", p.rank_out_f32);
    check("rank_lse", p.rank_lse);
    check("sink", p.sink);
    check("positions", p.positions);
    if (p.positions != nullptr) check("rope", p.rope.data);
    check("lse", p.lse);
  });
#if defined(SPARSEMLA_WITH_CUDA)
  if (gpu) return cuda_generic::merge_ranks(p);
#endif
  cpu::merge_ranks(p);
}

void shard_list(const ShardListParams& p) {
  const char* op = "shard_list";
  core::validate(p);
  const bool gpu = runs_on_gpu(op, "common.path", p.common.path, p.out.indptr);
  check_same_side(op, "out.indptr", gpu, [&](auto check) {
    if (p.common.num_rows == 0) return;
    check("list.indices", p.list.indices);
    check("list.indptr", p.list.indptr);
    check("list.lengths", p.list.lengths);
    check("common.row_valid", p.common.row_valid);
    check("out.indices", p.out.indices);
  });
#if defined(SPARSEMLA_WITH_CUDA)
  if (gpu) return cuda_generic::shard_list(p);
#endif
  cpu::shard_list(p);
}

}  // namespace sparsemla
