// The architecture gate (CONTRACT 7) and the NaN provenance gate (CONTRACT 5): pure functions.
#include <string>

#include "sparsemla/backend.h"
#include "sparsemla/error.h"

namespace sparsemla {

const char* path_name(Path p) {
  switch (p) {
    case Path::Auto:
      return "auto";
    case Path::Cpu:
      return "cpu";
    case Path::CudaGeneric:
      return "cuda-generic";
    case Path::CudaSm90:
      return "cuda-sm90";
  }
  return "unknown";
}

Path parse_path(const std::string& name) {
  for (Path p : {Path::Auto, Path::Cpu, Path::CudaGeneric, Path::CudaSm90}) {
    if (name == path_name(p)) return p;
  }
  throw_arg_error("parse_path", "name", "one of auto, cpu, cuda-generic, cuda-sm90", name);
}

Path select_gpu_path(const ArchGateInputs& in) {
  const bool sm90_ok =
      in.cc_major == 9 && in.cc_minor == 0 && in.have_sm90a_kernels && in.caches_fast_aligned;
  if (in.requested == Path::CudaGeneric) return Path::CudaGeneric;
  if (in.requested == Path::CudaSm90) {
    SPARSEMLA_CHECK_ARG(sm90_ok, "select_gpu_path", "path",
                        "cuda-sm90 only on a cc 9.0 device with sm_90a kernels and 16-byte "
                        "aligned caches",
                        "cc " + std::to_string(in.cc_major) + "." + std::to_string(in.cc_minor));
    return Path::CudaSm90;
  }
  return sm90_ok ? Path::CudaSm90 : Path::CudaGeneric;
}

bool may_skip_extra_scrub(const ProvenanceGateInputs& in) {
  return in.specialised_path && in.format_is_fp8_ds_mla && !in.kv_connector && in.has_extra_cache &&
         in.extra_cache_sanitised;
}

}  // namespace sparsemla
