// src/dispatch.cpp: the one place that maps a public call to a backend and path.
// Every public operation validates its arguments first (src/core/validate*.cpp), then runs.
#include <string>

#include "core/validate.h"
#include "cpu/cpu_backend.h"
#include "cpu/decode_common.h"
#include "sparsemla/error.h"
#include "sparsemla/version.h"

#if defined(SPARSEMLA_WITH_CUDA)
#include "cuda/common/device_info.h"
#include "cuda/generic/generic_backend.h"
#include "cuda/generic/ops_backend.h"
#include "cuda/sm90/sm90_backend.h"
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
  if (requested == Path::CudaGeneric || requested == Path::CudaSm90) return requested;
#else
  (void)probe;
  if (requested == Path::Auto) return Path::Cpu;
#endif
  throw_arg_error(op, "path", "cpu or auto (this build has no CUDA kernels for this operation)",
                  path_name(requested));
}

// True when a writer, gather or builder call runs on the GPU. These operations have one CUDA
// implementation (src/cuda/generic, sm_80+), which serves both CUDA paths.
bool on_gpu(const char* op, Path requested, const void* probe) {
  const Path path = resolve_path(op, requested, probe);
  return path == Path::CudaGeneric || path == Path::CudaSm90;
}

}  // namespace

#if defined(SPARSEMLA_WITH_CUDA)
#define SPARSEMLA_GPU_CALL(fn, p) cuda_generic::fn(p)
#else
#define SPARSEMLA_GPU_CALL(fn, p) (void)(p)  // unreachable: resolve_path throws for CUDA paths
#endif

// Writers: on the GPU the per-token values are device data, so only shapes and pointers are
// validated (the kernels skip tokens with out-of-range values); the CPU path also checks every
// token before writing anything.

void write_window(const WindowWriterParams& p) {
  core::validate(p, /*host_data=*/false);
  if (on_gpu("write_window", p.path, p.cache.base)) return SPARSEMLA_GPU_CALL(write_window, p);
  core::validate(p);
  cpu::write_window(p);
}

void write_compressor_state(const StateWriterParams& p) {
  core::validate(p, /*host_data=*/false);
  if (on_gpu("write_compressor_state", p.path, p.state.base)) {
    return SPARSEMLA_GPU_CALL(write_compressor_state, p);
  }
  core::validate(p);
  cpu::write_compressor_state(p);
}

void compress(const CompressorParams& p) {
  core::validate(p, /*host_data=*/false);
  if (on_gpu("compress", p.path, p.cache.base)) return SPARSEMLA_GPU_CALL(compress, p);
  core::validate(p);
  cpu::compress(p);
}

void compress_indexer(const IndexerCompressorParams& p) {
  core::validate(p, /*host_data=*/false);
  if (on_gpu("compress_indexer", p.path, p.cache.base)) {
    return SPARSEMLA_GPU_CALL(compress_indexer, p);
  }
  core::validate(p);
  cpu::compress_indexer(p);
}

// The gather's validation reads host cu_seqlen only when the call runs on the CPU.
void gather_indexer_keys(const GatherParams& p) {
  core::validate(p);
  if (on_gpu("gather_indexer_keys", p.path, p.k_scale)) {
    return SPARSEMLA_GPU_CALL(gather_indexer_keys, p);
  }
  cpu::gather_indexer_keys(p);
}

// Builders: validate() checks shapes only; the CPU backend checks its host rows itself.
void build_ragged_from_dense(const DenseToRaggedParams& p) {
  core::validate(p);
  if (on_gpu("build_ragged_from_dense", p.common.path, p.out.indptr)) {
    return SPARSEMLA_GPU_CALL(build_ragged_from_dense, p);
  }
  cpu::build_ragged_from_dense(p);
}

void build_window_lists(const WindowListParams& p) {
  core::validate(p);
  if (on_gpu("build_window_lists", p.common.path, p.out.indptr)) {
    return SPARSEMLA_GPU_CALL(build_window_lists, p);
  }
  cpu::build_window_lists(p);
}

void build_topk_lists(const TopkListParams& p) {
  core::validate(p);
  if (on_gpu("build_topk_lists", p.common.path, p.out.indptr)) {
    return SPARSEMLA_GPU_CALL(build_topk_lists, p);
  }
  cpu::build_topk_lists(p);
}

void build_compressed_all_lists(const CompressedAllListParams& p) {
  core::validate(p);
  if (on_gpu("build_compressed_all_lists", p.common.path, p.out.indptr)) {
    return SPARSEMLA_GPU_CALL(build_compressed_all_lists, p);
  }
  cpu::build_compressed_all_lists(p);
}

}  // namespace sparsemla

// ---- decode (owner: decode; CUDA branch: cuda) --------------------------------------------------
namespace sparsemla {
namespace {

constexpr char kDecodeOp[] = "sparse_decode";

#if defined(SPARSEMLA_WITH_CUDA)
bool cache_fast_aligned(const CacheView& c) {
  return reinterpret_cast<uintptr_t>(c.base) % Fp8DsMla::kFastAlign == 0 &&
         c.block_stride % Fp8DsMla::kFastAlign == 0;
}

// Host pointers (or Path::Cpu) run on the CPU; device pointers go through the architecture gate
// (SPEC 7): the sm90-specialised kernels on a cc 9.0 device when this build holds their sm_90a
// cubin and the caches are 16-byte aligned; the generic path otherwise (forcing cuda-sm90 where it
// cannot run throws).
Path resolve_decode_device_path(const char* op, Path requested, const void* probe,
                                bool caches_aligned) {
  const bool on_device = cuda::is_device_pointer(probe);
  if (requested == Path::Cpu || (requested == Path::Auto && !on_device)) {
    SPARSEMLA_CHECK_ARG(!on_device, op, "path", "host pointers for the cpu path",
                        "device pointers");
    return Path::Cpu;
  }
  SPARSEMLA_CHECK_ARG(on_device, op, "path", "device pointers for a CUDA path", "host pointers");
  ArchGateInputs gate;
  cuda::current_device_cc(&gate.cc_major, &gate.cc_minor);
  gate.have_sm90a_kernels = cuda_sm90::have_sm90a_kernels();
  gate.caches_fast_aligned = caches_aligned;
  gate.requested = requested;
  return select_gpu_path(gate);
}

// Where Auto may take the sm90 path, whether it pays for this call (measured rule: plan.h).
bool auto_takes_sm90(const DecodeParams& p) {
  return auto_prefers_sm90(cpu::decode_plan_shape(p), p.deterministic);
}
#endif

// The path a decode call runs on: the CPU for host pointers, a CUDA path for device pointers.
Path resolve_decode_path(const char* op, const DecodeParams& p) {
#if defined(SPARSEMLA_WITH_CUDA)
  const Path path = resolve_decode_device_path(
      op, p.path, p.out,
      cache_fast_aligned(p.main_cache) && (!p.has_extra || cache_fast_aligned(p.extra_cache)));
  if (path == Path::CudaSm90 && p.path == Path::Auto && !auto_takes_sm90(p)) {
    return Path::CudaGeneric;
  }
  return path;
#else
  const Path path = resolve_path(op, p.path, p.out);
  SPARSEMLA_CHECK_ARG(path == Path::Cpu, op, "path",
                      "cpu or auto with host pointers (no CUDA decode kernels in this build)",
                      path_name(path));
  return path;
#endif
}

// S of a validated call: the caller's, else the generic planner with CU = p.num_sms, or the CPU
// threads / the device's SMs (SPEC 4.4; widths = the lists' dense widths). Deterministic calls
// plan as if T = 1, so S of a row never depends on the batch it is in.
int32_t decode_splits(const DecodeParams& p, Path path) {
  if (p.num_splits > 0) return p.num_splits;
  PlanShape shape = cpu::decode_plan_shape(p);
  if (p.deterministic && shape.num_tokens > 0) shape.num_tokens = 1;
#if defined(SPARSEMLA_WITH_CUDA)
  if (path != Path::Cpu && p.num_sms == 0) shape.num_sms = cuda::current_device_sms();
#else
  (void)path;
#endif
  return path == Path::CudaSm90 ? plan_sm90_tuned(shape) : plan_generic(shape);
}

// Every check made before anything runs: shapes, pointers and strides; on the CPU also the host
// lists and positions (device lists are never read on the host: the kernels clamp every row).
Path validate_decode_call(const char* op, const DecodeParams& p) {
  core::validate_decode(op, p);
  const Path path = resolve_decode_path(op, p);
  if (path == Path::Cpu) core::validate_decode_host_data(op, p);
  return path;
}

}  // namespace

size_t decode_workspace_size(int64_t num_tokens, int32_t num_heads, int32_t num_splits) {
  const char* op = "decode_workspace_size";
  SPARSEMLA_CHECK_ARG(num_tokens >= 0 && num_tokens <= (int64_t{1} << 40), op, "num_tokens",
                      "in [0, 2^40]", num_tokens);
  SPARSEMLA_CHECK_ARG(num_heads >= 1 && num_heads <= 128, op, "num_heads", "in [1, 128]",
                      num_heads);
  SPARSEMLA_CHECK_ARG(num_splits >= 1 && num_splits <= kSpecialisedMaxSplits, op, "num_splits",
                      "in [1, 32]", num_splits);
  // m, l fp32 [T, S, H] + acc fp32 [T, S, H, 512] (SPEC 4.3).
  const int64_t rows = num_tokens * num_splits * num_heads;
  return static_cast<size_t>(rows) * (2 + Fp8DsMla::kHeadDim) * sizeof(float);
}

int32_t decode_num_splits(const DecodeParams& p) {
  core::validate_decode("decode_num_splits", p);
  return decode_splits(p, resolve_decode_path("decode_num_splits", p));
}

bool decode_is_supported(const DecodeParams& p, const char** why) {
  try {
    validate_decode_call(kDecodeOp, p);
  } catch (const Error& e) {
    thread_local std::string reason;  // valid until the next call on this thread
    reason = e.what();
    if (why != nullptr) *why = reason.c_str();
    return false;
  }
  if (why != nullptr) *why = nullptr;
  return true;
}

void sparse_decode(const DecodeParams& params, void* workspace, size_t workspace_bytes) {
  const Path path = validate_decode_call(kDecodeOp, params);
  if (params.num_tokens == 0) return;  // nothing to do
  const int32_t splits = decode_splits(params, path);
  // Deterministic: every split of a row works (the adaptive ONE_WAVE depends on T).
  DecodeParams p = params;
  if (p.deterministic) p.adaptive_splits = false;
  if (splits > 1) {
    const size_t need = decode_workspace_size(p.num_tokens, p.num_heads, splits);
    const std::string what = "S = " + std::to_string(splits) + " > 1";
    SPARSEMLA_CHECK_ARG(workspace != nullptr, kDecodeOp, "workspace",
                        "a non-null pointer (" + what + ")", "null");
    SPARSEMLA_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace) % alignof(float) == 0, kDecodeOp,
                        "workspace", "4-byte alignment (fp32 partials)", workspace);
    SPARSEMLA_CHECK_ARG(
        workspace_bytes >= need, kDecodeOp, "workspace_bytes",
        ">= decode_workspace_size(T, H, S) = " + std::to_string(need) + " (" + what + ")",
        workspace_bytes);
  }
#if defined(SPARSEMLA_WITH_CUDA)
  if (path != Path::Cpu) {
    SPARSEMLA_CHECK_ARG(splits == 1 || reinterpret_cast<uintptr_t>(workspace) % 8 == 0, kDecodeOp,
                        "workspace", "8-byte alignment on the GPU (fp32 pairs)", workspace);
    if (path == Path::CudaSm90) {
      cuda_sm90::sparse_decode(p, splits, workspace);
    } else {
      cuda_generic::sparse_decode(p, splits, workspace);
    }
    return;
  }
#endif
  cpu::sparse_decode(p, splits, workspace);
}

void inverse_rope_inplace(bf16_bits* x, int64_t num_tokens, int32_t num_heads, int64_t stride_token,
                          int64_t stride_head, const int64_t* positions, const RopeTable& rope,
                          Path path, void* stream) {
  const char* op = "inverse_rope_inplace";
  core::validate_inverse_rope(x, num_tokens, num_heads, stride_token, stride_head, positions, rope,
                              /*host_data=*/false);
#if defined(SPARSEMLA_WITH_CUDA)
  if (resolve_decode_device_path(op, path, x, /*caches_aligned=*/false) != Path::Cpu) {
    cuda_generic::inverse_rope_inplace(x, num_tokens, num_heads, stride_token, stride_head,
                                       positions, rope, stream);
    return;
  }
#else
  (void)stream;
  const Path resolved = resolve_path(op, path, x);
  SPARSEMLA_CHECK_ARG(resolved == Path::Cpu, op, "path",
                      "cpu or auto with host pointers (no CUDA kernels in this build)",
                      path_name(resolved));
#endif
  core::validate_inverse_rope(x, num_tokens, num_heads, stride_token, stride_head, positions, rope,
                              /*host_data=*/true);
  if (num_tokens == 0) return;
  cpu::inverse_rope_inplace(x, num_tokens, num_heads, stride_token, stride_head, positions, rope);
}
}  // namespace sparsemla
