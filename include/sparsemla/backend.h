// sparsemla/backend.h: where an operation runs, the architecture gate (CONTRACT 7) and the NaN
// provenance gate (CONTRACT 5). All are pure functions of their inputs.
#pragma once

#include <cstdint>
#include <string>

namespace sparsemla {

// Which implementation runs a call. Auto picks the fastest one that supports the inputs: the CPU
// for host pointers, the CUDA paths for device pointers (sm90 only where the architecture gate
// holds).
enum class Path : int32_t { Auto = 0, Cpu = 1, CudaGeneric = 2, CudaSm90 = 3 };

const char* path_name(Path p);
// Parses "auto", "cpu", "cuda-generic", "cuda-sm90"; throws sparsemla::Error otherwise.
Path parse_path(const std::string& name);

// Inputs of the architecture gate (CONTRACT 7).
struct ArchGateInputs {
  int32_t cc_major = 0;  // device compute capability
  int32_t cc_minor = 0;
  bool have_sm90a_kernels = false;   // this build holds sm_90a cubins for the specialised kernels
  bool caches_fast_aligned = false;  // base and block_stride of every cache % 16 == 0
  Path requested = Path::Auto;       // user override (Cpu is not a GPU path)
};
// The GPU path a CUDA call takes: CudaSm90 only on cc 9.0 with sm_90a kernels and aligned caches,
// or when forced (forcing sm90 where it cannot run throws). Everything else: CudaGeneric.
Path select_gpu_path(const ArchGateInputs& in);

// Inputs of the NaN provenance gate (CONTRACT 5).
struct ProvenanceGateInputs {
  bool specialised_path = false;       // the call runs on the sm90-specialised path
  bool format_is_fp8_ds_mla = true;    // the extra cache is in the fp8_ds_mla format
  bool kv_connector = false;           // rows may be imported by a KV-transfer connector
  bool has_extra_cache = false;        // an extra (compressed) cache exists
  bool extra_cache_sanitised = false;  // caller: every reachable extra row was written sanitised
};
// True when the decoder may skip the NaN scrub of the extra cache. The window cache is always
// scrubbed.
bool may_skip_extra_scrub(const ProvenanceGateInputs& in);

}  // namespace sparsemla
