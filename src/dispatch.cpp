// src/dispatch.cpp: the one place that maps a public call to a backend and path.
// Every public operation validates its arguments first (src/core/validate*.cpp), then runs.
#include <string>

#include "core/validate.h"
#include "cpu/cpu_backend.h"
#include "cpu/decode_common.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer.h"
#include "sparsemla/version.h"

#if defined(SPARSEMLA_WITH_CUDA)
#include "cuda/common/device_info.h"
#include "cuda/generic/generic_backend.h"
#include "cuda/generic/indexer_backend.h"
#include "cuda/generic/ops_backend.h"
#include "cuda/sm90/indexer_sm90_backend.h"
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

// The lightning indexer (CONTRACT 11): the CPU backend for host data; for device data the generic
// CUDA path (Auto and CudaGeneric: scores bit-identical to the CPU's) or, asked for by name, the
// Hopper FP8 path (CudaSm90: 11.7's 2^-9 bound). Auto stays on the generic path until the Hopper
// path is measured faster in bench --op indexer (docs/INDEXER.md).
namespace {
enum class IndexerRoute { Cpu, Generic, Sm90 };

IndexerRoute indexer_route(const IndexerParams& p) {
  if (!on_gpu("indexer_topk", p.path, p.indices)) return IndexerRoute::Cpu;
  if (p.path != Path::CudaSm90) return IndexerRoute::Generic;
#if defined(SPARSEMLA_WITH_CUDA)
  const std::string why = cuda_sm90::indexer_unsupported_reason(p);
  if (!why.empty())
    throw_arg_error("indexer_topk", "path", "cuda-sm90 to be given " + why, "cuda-sm90");
#endif
  return IndexerRoute::Sm90;
}

#if defined(SPARSEMLA_WITH_CUDA)
size_t indexer_gpu_workspace(const IndexerParams& p, IndexerRoute route) {
  return route == IndexerRoute::Sm90 ? cuda_sm90::indexer_workspace_size(p)
                                     : cuda_generic::indexer_workspace_size(p);
}
#endif

// The selection alone: the CPU backend, or a CUDA path with the caller's workspace.
void indexer_select(const IndexerParams& p, void* workspace, size_t workspace_bytes) {
  const IndexerRoute route = indexer_route(p);
#if defined(SPARSEMLA_WITH_CUDA)
  if (route != IndexerRoute::Cpu) {
    const size_t need = indexer_gpu_workspace(p, route);
    SPARSEMLA_CHECK_ARG(workspace_bytes >= need, "indexer_topk", "workspace_bytes",
                        ">= indexer_workspace_size(p) = " + std::to_string(need), workspace_bytes);
    if (need > 0) {
      SPARSEMLA_CHECK_ARG(workspace != nullptr, "indexer_topk", "workspace",
                          "a non-null device pointer (" + std::to_string(need) + " bytes)", "null");
      SPARSEMLA_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace) % 8 == 0, "indexer_topk",
                          "workspace", "8-byte alignment", workspace);
    }
    if (route == IndexerRoute::Sm90) return cuda_sm90::indexer_topk(p, workspace);
    return cuda_generic::indexer_topk(p, workspace);
  }
#endif
  (void)route;
  (void)workspace;
  (void)workspace_bytes;  // the CPU backend allocates its own scratch (size query: 0)
  cpu::indexer_topk(p);
}

// The builder call that the fused list of p equals by definition (CONTRACT 11.1).
TopkListParams fused_list_params(const IndexerParams& p) {
  TopkListParams b;
  b.common = {p.num_tokens, p.fused.row_valid, p.path, p.stream};
  b.topk = p.indices;
  b.topk_stride = p.indices_stride != 0 ? p.indices_stride : p.width;
  b.request_index = p.row_request;
  b.block_table = p.fused.block_table;
  b.block_table_stride = p.fused.block_table_stride;
  b.table_width = p.fused.table_width;
  b.num_requests = p.num_requests;
  b.block_size = p.fused.block_size;
  b.out = p.fused.out;
  if (b.out.width == 0) b.out.width = p.width;  // the dense width unless given
  return b;
}
}  // namespace

// Both parts are validated first, then the selection runs, then (fused) the builder on its dense
// output, on the same path and stream.
void indexer_topk(const IndexerParams& p, void* workspace, size_t workspace_bytes) {
  core::validate(p);
  const bool fused = p.fused.out.indices != nullptr;
  if (fused) core::validate(fused_list_params(p));
  indexer_select(p, workspace, workspace_bytes);
  if (fused) build_topk_lists(fused_list_params(p));
}

size_t indexer_workspace_size(const IndexerParams& p) {
  core::validate(p);
  const IndexerRoute route = indexer_route(p);
  if (route == IndexerRoute::Cpu) return 0;  // the CPU backend allocates its own scratch
#if defined(SPARSEMLA_WITH_CUDA)
  return indexer_gpu_workspace(p, route);
#else
  return 0;  // unreachable: resolve_path throws for CUDA paths
#endif
}

void indexer_candidates_from_positions(const int64_t* positions, int64_t num_tokens,
                                       int32_t* num_candidates) {
  constexpr const char* kOp = "indexer_candidates_from_positions";
  core::check_nonneg(kOp, "num_tokens", num_tokens);
  if (num_tokens == 0) return;
  SPARSEMLA_CHECK_PTR(positions, kOp, "positions");
  SPARSEMLA_CHECK_PTR(num_candidates, kOp, "num_candidates");
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t pos = positions[t];
    // floor((pos + 1) / 4) without overflow at INT64_MAX; int32 holds it for pos < 2^33.
    const int64_t n = pos < 0 ? 0 : pos / 4 + (pos % 4 == 3 ? 1 : 0);
    SPARSEMLA_CHECK_ARG(n <= INT32_MAX, kOp, "positions", "< 2^33 (n_t fits int32)", pos);
    num_candidates[t] = static_cast<int32_t>(n);
  }
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
// Who reports a planning error: plan_decode(shape) names "shape.<field>"; a call planned from its
// DecodeParams names the call and the params' field ("path").
struct PlanErrors {
  const char* op;
  const char* prefix;
  std::string arg(const char* field) const { return std::string(prefix) + field; }
};
constexpr PlanErrors kShapeErrors{"plan_decode", "shape."};

#if defined(SPARSEMLA_WITH_CUDA)
bool cache_fast_aligned(const CacheView& c) {
  return reinterpret_cast<uintptr_t>(c.base) % Fp8DsMla::kFastAlign == 0 &&
         c.block_stride % Fp8DsMla::kFastAlign == 0;
}

using cuda::current_device;

// A CUDA shape through the architecture gate (CONTRACT 7): the sm90-specialised kernels on a cc 9.0
// device when this build holds their sm_90a cubin and the caches are 16-byte aligned; the generic
// path otherwise (forcing cuda-sm90 where it cannot run throws). Auto takes sm90 only where it was
// measured faster (auto_prefers_sm90, plan.h).
Path resolve_gpu_path(const DecodeShape& s, const PlanShape& ps, const PlanErrors& e) {
  SPARSEMLA_CHECK_ARG(s.path != Path::Cpu, e.op, e.arg("path"),
                      "a CUDA path or auto for device data (cpu needs host data, device -1)",
                      "cpu with device " + std::to_string(s.device));
  SPARSEMLA_CHECK_ARG(s.device == current_device(), e.op, e.arg("device"),
                      "the current CUDA device " + std::to_string(current_device()) +
                          " (plan and run on the device that holds the data)",
                      s.device);
  ArchGateInputs gate;
  cuda::current_device_cc(&gate.cc_major, &gate.cc_minor);
  gate.have_sm90a_kernels = cuda_sm90::have_sm90a_kernels();
  gate.caches_fast_aligned = s.caches_aligned;
  gate.requested = s.path;
  const Path path = select_gpu_path(gate);
  if (path == Path::CudaSm90 && s.path == Path::Auto && !auto_prefers_sm90(ps, s.deterministic)) {
    return Path::CudaGeneric;
  }
  return path;
}
#endif

Path resolve_plan_path(const DecodeShape& s, const PlanShape& ps, const PlanErrors& e) {
  if (s.device < 0) {
    SPARSEMLA_CHECK_ARG(s.path == Path::Cpu || s.path == Path::Auto, e.op, e.arg("path"),
                        "cpu or auto for host data (device -1: host pointers)", path_name(s.path));
    return Path::Cpu;
  }
#if defined(SPARSEMLA_WITH_CUDA)
  return resolve_gpu_path(s, ps, e);
#else
  (void)ps;
  throw_arg_error(e.op, e.arg("device"), "-1 (host data: this build has no CUDA kernels)",
                  std::to_string(s.device));
#endif
}

void check_decode_shape(const DecodeShape& s) {
  SPARSEMLA_CHECK_ARG(s.num_tokens >= 0 && s.num_tokens <= (int64_t{1} << 40), kShapeErrors.op,
                      "shape.num_tokens", "in [0, 2^40]", s.num_tokens);
  SPARSEMLA_CHECK_ARG(s.num_heads >= 1 && s.num_heads <= 128, kShapeErrors.op, "shape.num_heads",
                      "in [1, 128]", s.num_heads);
  SPARSEMLA_CHECK_ARG(s.width_main >= 0, kShapeErrors.op, "shape.width_main", ">= 0", s.width_main);
  SPARSEMLA_CHECK_ARG(s.width_extra >= 0 && (s.has_extra || s.width_extra == 0), kShapeErrors.op,
                      "shape.width_extra", s.has_extra ? ">= 0" : "0 without has_extra",
                      s.width_extra);
  SPARSEMLA_CHECK_ARG(s.num_splits >= 0 && s.num_splits <= kSpecialisedMaxSplits, kShapeErrors.op,
                      "shape.num_splits", "in [0, 32] (0: the planner)", s.num_splits);
  SPARSEMLA_CHECK_ARG(s.num_sms >= 0, kShapeErrors.op, "shape.num_sms", ">= 0 (0: the path's own)",
                      s.num_sms);
  SPARSEMLA_CHECK_ARG(s.device >= -1, kShapeErrors.op, "shape.device", ">= -1 (-1: host data)",
                      s.device);
}

// CU of the planner and of the adaptive rule: the caller's, else the CPU threads / the SMs.
int32_t plan_sms(const DecodeShape& s) {
  if (s.num_sms > 0) return s.num_sms;
#if defined(SPARSEMLA_WITH_CUDA)
  if (s.device >= 0) return cuda::current_device_sms();
#endif
  return cpu::cpu_thread_count();
}

// S: the caller's, else the path's planner (CONTRACT 4.4; widths = the lists' dense widths).
// Deterministic calls plan as if T = 1, so S of a row never depends on the batch it is in.
int32_t plan_splits(const DecodeShape& s, Path path, PlanShape ps) {
  if (s.num_splits > 0) return s.num_splits;
  if (s.deterministic && ps.num_tokens > 0) ps.num_tokens = 1;
  return path == Path::CudaSm90 ? plan_sm90_tuned(ps) : plan_generic(ps);
}

// The backend-specific decisions (fused combine, head blocks per CTA) of a GPU plan.
void plan_gpu_launch(DecodePlan& plan) {
#if defined(SPARSEMLA_WITH_CUDA)
  const DecodeShape& s = plan.shape;
  if (plan.path == Path::CudaSm90) {
    plan.fused_combine =
        cuda_sm90::plan_fused_combine(s.num_tokens, s.num_heads, plan.num_splits, s.deterministic);
  } else if (plan.path == Path::CudaGeneric && s.num_tokens > 0) {
    plan.head_blocks_per_cta = cuda_generic::plan_head_blocks_per_cta(s.num_tokens, plan.num_splits,
                                                                      s.num_heads, plan.num_sms);
  }
#else
  (void)plan;
#endif
}

// The call's shape must be the plan's (a plan is reused only for calls it was made for).
void check_plan_matches(const DecodePlan& plan, const DecodeShape& s) {
  const DecodeShape& q = plan.shape;
  const auto same = [](const char* f, int64_t planned, int64_t got) {
    SPARSEMLA_CHECK_ARG(planned == got, kDecodeOp, std::string("plan.shape.") + f,
                        "the call's " + std::string(f) + " = " + std::to_string(got) +
                            " (a plan runs only calls of the shape it was made for)",
                        planned);
  };
  same("num_tokens", q.num_tokens, s.num_tokens);
  same("num_heads", q.num_heads, s.num_heads);
  same("width_main", q.width_main, s.width_main);
  same("has_extra", q.has_extra, s.has_extra);
  same("width_extra", q.width_extra, s.width_extra);
  same("device", q.device, s.device);
  same("num_splits", q.num_splits, s.num_splits);
  same("adaptive_splits", q.adaptive_splits, s.adaptive_splits);
  same("deterministic", q.deterministic, s.deterministic);
  same("num_sms", q.num_sms, s.num_sms);
  SPARSEMLA_CHECK_ARG(q.path == s.path, kDecodeOp, "plan.shape.path",
                      std::string("the call's path = ") + path_name(s.path), path_name(q.path));
  SPARSEMLA_CHECK_ARG(plan.path != Path::CudaSm90 || s.caches_aligned, kDecodeOp, "main_cache",
                      "base and block_stride 16-byte aligned (the plan is for cuda-sm90)",
                      "unaligned");
}

// A plan is plain data (Python carries it as ints): its launch fields must be ones plan_decode
// can make, and its workspace at least what its S needs, so no plan makes a kernel write past
// the caller's workspace.
void check_plan_fields(const DecodePlan& plan) {
  const int32_t S = plan.num_splits;
  const bool gpu = plan.path == Path::CudaGeneric || plan.path == Path::CudaSm90;
  SPARSEMLA_CHECK_ARG(plan.path == Path::Cpu || gpu, kDecodeOp, "plan.path",
                      "cpu, cuda-generic or cuda-sm90 (a plan from plan_decode)",
                      path_name(plan.path));
  SPARSEMLA_CHECK_ARG(S >= 1 && S <= kSpecialisedMaxSplits, kDecodeOp, "plan.num_splits",
                      "in [1, 32]", S);
  SPARSEMLA_CHECK_ARG(plan.num_sms >= 1, kDecodeOp, "plan.num_sms", ">= 1", plan.num_sms);
  SPARSEMLA_CHECK_ARG(plan.one_wave >= 1, kDecodeOp, "plan.one_wave", ">= 1", plan.one_wave);
  const int32_t hb = plan.head_blocks_per_cta;
  SPARSEMLA_CHECK_ARG(hb == 1 || hb == 2 || hb == 4, kDecodeOp, "plan.head_blocks_per_cta",
                      "1, 2 or 4", hb);
  // A cluster holds a row's splits: at most 8 (the portable cluster size).
  SPARSEMLA_CHECK_ARG(!plan.fused_combine || (plan.path == Path::CudaSm90 && S >= 2 && S <= 8),
                      kDecodeOp, "plan.fused_combine", "only on cuda-sm90 with S in [2, 8]",
                      "set with S = " + std::to_string(S));
  const DecodeShape& s = plan.shape;
  const size_t need = S > 1 && !plan.fused_combine && s.num_tokens > 0
                          ? decode_workspace_size(s.num_tokens, s.num_heads, S)
                          : 0;
  SPARSEMLA_CHECK_ARG(plan.workspace_bytes >= need, kDecodeOp, "plan.workspace_bytes",
                      ">= decode_workspace_size(T, H, S) = " + std::to_string(need),
                      plan.workspace_bytes);
}

void check_workspace(const DecodePlan& plan, const void* workspace, size_t workspace_bytes) {
  if (plan.workspace_bytes == 0) return;
  const std::string what = "S = " + std::to_string(plan.num_splits) + " > 1";
  SPARSEMLA_CHECK_ARG(workspace != nullptr, kDecodeOp, "workspace",
                      "a non-null pointer (" + what + ")", "null");
  const size_t align = plan.path == Path::Cpu ? alignof(float) : 8;
  SPARSEMLA_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace) % align == 0, kDecodeOp, "workspace",
                      std::to_string(align) + "-byte alignment (fp32 partials)", workspace);
  SPARSEMLA_CHECK_ARG(workspace_bytes >= plan.workspace_bytes, kDecodeOp, "workspace_bytes",
                      ">= plan.workspace_bytes = decode_workspace_size(T, H, S) = " +
                          std::to_string(plan.workspace_bytes) + " (" + what + ")",
                      workspace_bytes);
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
  // m, l fp32 [T, S, H] + acc fp32 [T, S, H, 512] (CONTRACT 4.3).
  const int64_t rows = num_tokens * num_splits * num_heads;
  return static_cast<size_t>(rows) * (2 + Fp8DsMla::kHeadDim) * sizeof(float);
}

DecodeShape decode_shape(const DecodeParams& p) {
  DecodeShape s;
  s.num_tokens = p.num_tokens;
  s.num_heads = p.num_heads;
  s.width_main = cpu::list_plan_width(p.main_list, p.num_tokens);
  s.has_extra = p.has_extra;
  s.width_extra = p.has_extra ? cpu::list_plan_width(p.extra_list, p.num_tokens) : 0;
#if defined(SPARSEMLA_WITH_CUDA)
  s.device = cuda::is_device_pointer(p.out) ? current_device() : -1;
  s.caches_aligned =
      cache_fast_aligned(p.main_cache) && (!p.has_extra || cache_fast_aligned(p.extra_cache));
#endif
  s.path = p.path;
  s.num_splits = p.num_splits;
  s.adaptive_splits = p.adaptive_splits;
  s.deterministic = p.deterministic;
  s.num_sms = p.num_sms;
  return s;
}

namespace {
DecodePlan plan_for(const DecodeShape& shape, const PlanErrors& errors) {
  DecodePlan plan;
  plan.shape = shape;
  plan.num_sms = plan_sms(shape);
  const PlanShape ps{shape.num_tokens, shape.num_heads, shape.width_main, shape.width_extra,
                     plan.num_sms};
  plan.path = resolve_plan_path(shape, ps, errors);
  plan.num_splits = plan_splits(shape, plan.path, ps);
  // Deterministic: every split of a row works (the adaptive ONE_WAVE depends on T).
  plan.adaptive_splits = shape.adaptive_splits && !shape.deterministic;
  plan.one_wave = plan.adaptive_splits ? adaptive_one_wave(ps, plan.num_splits) : plan.num_splits;
  plan_gpu_launch(plan);
  if (plan.num_splits > 1 && !plan.fused_combine && shape.num_tokens > 0) {
    plan.workspace_bytes =
        decode_workspace_size(shape.num_tokens, shape.num_heads, plan.num_splits);
  }
  return plan;
}
}  // namespace

DecodePlan plan_decode(const DecodeShape& shape) {
  check_decode_shape(shape);
  return plan_for(shape, kShapeErrors);
}

DecodePlan plan_decode(const DecodeParams& p) {
  core::validate_decode("plan_decode", p);
  return plan_for(decode_shape(p), {"plan_decode", ""});
}

int32_t decode_num_splits(const DecodeParams& p) {
  core::validate_decode("decode_num_splits", p);
  return plan_for(decode_shape(p), {"decode_num_splits", ""}).num_splits;
}

bool decode_is_supported(const DecodeParams& p, const char** why) {
  try {
    core::validate_decode(kDecodeOp, p);
    if (plan_for(decode_shape(p), {kDecodeOp, ""}).path == Path::Cpu) {
      core::validate_decode_host_data(kDecodeOp, p);
    }
  } catch (const Error& e) {
    thread_local std::string reason;  // valid until the next call on this thread
    reason = e.what();
    if (why != nullptr) *why = reason.c_str();
    return false;
  }
  if (why != nullptr) *why = nullptr;
  return true;
}

// Every check is made before anything runs: shapes, pointers and strides, the plan against the
// call; on the CPU also the host lists and positions (device lists are never read on the host:
// the kernels clamp every row).
namespace {
// The checks that remain once p is validated and the plan is known to be p's, then the backend.
void run_planned(const DecodeParams& p, const DecodePlan& plan, void* workspace,
                 size_t workspace_bytes) {
  check_plan_fields(plan);
  if (plan.path == Path::Cpu) core::validate_decode_host_data(kDecodeOp, p);
  check_workspace(plan, workspace, workspace_bytes);
  if (p.num_tokens == 0) return;  // nothing to do
#if defined(SPARSEMLA_WITH_CUDA)
  if (plan.path == Path::CudaSm90) return cuda_sm90::sparse_decode(p, plan, workspace);
  if (plan.path == Path::CudaGeneric) return cuda_generic::sparse_decode(p, plan, workspace);
#endif
  cpu::sparse_decode(p, plan, workspace);
}
}  // namespace

void sparse_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace,
                   size_t workspace_bytes) {
  core::validate_decode(kDecodeOp, p);
  check_plan_matches(plan, decode_shape(p));
  run_planned(p, plan, workspace, workspace_bytes);
}

// Planned here from the call's own shape: validated and placed once (no second shape check).
void sparse_decode(const DecodeParams& p, void* workspace, size_t workspace_bytes) {
  core::validate_decode(kDecodeOp, p);
  run_planned(p, plan_for(decode_shape(p), {kDecodeOp, ""}), workspace, workspace_bytes);
}

void inverse_rope_inplace(bf16_bits* x, int64_t num_tokens, int32_t num_heads, int64_t stride_token,
                          int64_t stride_head, const int64_t* positions, const RopeTable& rope,
                          Path path, void* stream) {
  const char* op = "inverse_rope_inplace";
  core::validate_inverse_rope(x, num_tokens, num_heads, stride_token, stride_head, positions, rope,
                              /*host_data=*/false);
#if defined(SPARSEMLA_WITH_CUDA)
  SPARSEMLA_CHECK_ARG(path != Path::Cpu || !cuda::is_device_pointer(x), op, "path",
                      "host pointers for the cpu path", "device pointers");
  if (on_gpu(op, path, x)) {
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
