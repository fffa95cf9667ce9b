// src/dispatch.cpp: the one place that maps a public call to a backend and path.
// Every public operation validates its arguments first (src/core/validate*.cpp), then runs.
#include <string>

#include "core/validate.h"
#include "cpu/cpu_backend.h"
#include "sparsemla/error.h"
#include "sparsemla/version.h"

#if defined(SPARSEMLA_WITH_CUDA)
#include "cuda/common/device_info.h"
#endif

namespace sparsemla {

bool built_with_cuda() {
#if defined(SPARSEMLA_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

namespace {

// Resolves Auto: device pointers go to a CUDA path, host pointers to the CPU.
// `probe` is an output pointer of the call.
Path resolve_path(const char* op, Path requested, const void* probe) {
  if (requested == Path::Cpu) return Path::Cpu;
#if defined(SPARSEMLA_WITH_CUDA)
  const bool on_device = cuda::is_device_pointer(probe);
  if (requested == Path::Auto) return on_device ? Path::CudaGeneric : Path::Cpu;
  SPARSEMLA_CHECK_ARG(on_device, op, "path", "device pointers for a CUDA path", "host pointers");
#else
  (void)probe;
  if (requested == Path::Auto) return Path::Cpu;
#endif
  throw_arg_error(op, "path", "cpu or auto (this build has no CUDA kernels for this operation)",
                  path_name(requested));
}

}  // namespace

void write_window(const WindowWriterParams& p) {
  core::validate(p);
  resolve_path("write_window", p.path, p.cache.base);
  cpu::write_window(p);
}

void write_compressor_state(const StateWriterParams& p) {
  core::validate(p);
  resolve_path("write_compressor_state", p.path, p.state.base);
  cpu::write_compressor_state(p);
}

void compress(const CompressorParams& p) {
  core::validate(p);
  resolve_path("compress", p.path, p.cache.base);
  cpu::compress(p);
}

void compress_indexer(const IndexerCompressorParams& p) {
  core::validate(p);
  resolve_path("compress_indexer", p.path, p.cache.base);
  cpu::compress_indexer(p);
}

void gather_indexer_keys(const GatherParams& p) {
  core::validate(p);
  resolve_path("gather_indexer_keys", p.path, p.k_scale);
  cpu::gather_indexer_keys(p);
}

void build_ragged_from_dense(const DenseToRaggedParams& p) {
  core::validate(p);
  resolve_path("build_ragged_from_dense", p.common.path, p.out.indptr);
  cpu::build_ragged_from_dense(p);
}

void build_window_lists(const WindowListParams& p) {
  core::validate(p);
  resolve_path("build_window_lists", p.common.path, p.out.indptr);
  cpu::build_window_lists(p);
}

void build_topk_lists(const TopkListParams& p) {
  core::validate(p);
  resolve_path("build_topk_lists", p.common.path, p.out.indptr);
  cpu::build_topk_lists(p);
}

void build_compressed_all_lists(const CompressedAllListParams& p) {
  core::validate(p);
  resolve_path("build_compressed_all_lists", p.common.path, p.out.indptr);
  cpu::build_compressed_all_lists(p);
}

}  // namespace sparsemla

// ---- decode (owner: decode) ---------------------------------------------------------------------
namespace sparsemla {
// PLACEHOLDER: the decode owner replaces this block.
size_t decode_workspace_size(int64_t, int32_t, int32_t) {
  throw Error("not implemented");
}
int32_t decode_num_splits(const DecodeParams&) {
  throw Error("not implemented");
}
bool decode_is_supported(const DecodeParams&, const char**) {
  throw Error("not implemented");
}
void sparse_decode(const DecodeParams&, void*, size_t) {
  throw Error("not implemented");
}
void inverse_rope_inplace(bf16_bits*, int64_t, int32_t, int64_t, int64_t, const int64_t*,
                          const RopeTable&, Path, void*) {
  throw Error("not implemented");
}
}  // namespace sparsemla
