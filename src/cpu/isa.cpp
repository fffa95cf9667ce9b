// The CPU backend's instruction-set level (src/cpu/isa.h).
#include "cpu/isa.h"

#include <string>

#include "core/tuning.h"
#include "cpu/decode_kernels.h"
#include "sparsemla/error.h"
#include "sparsemla/version.h"

namespace sparsemla::cpu {

namespace {

CpuIsa best_supported() {
  if (cpu_supports(CpuIsa::Avx512)) return CpuIsa::Avx512;
  if (cpu_supports(CpuIsa::Avx2)) return CpuIsa::Avx2;
  return CpuIsa::Baseline;
}

CpuIsa resolve_cpu_isa() {
  const core::CpuIsaChoice choice = core::tuning().cpu_isa;
  if (choice == core::CpuIsaChoice::Auto) return best_supported();
  const CpuIsa forced = choice == core::CpuIsaChoice::Baseline ? CpuIsa::Baseline
                        : choice == core::CpuIsaChoice::Avx2   ? CpuIsa::Avx2
                                                               : CpuIsa::Avx512;
  SPARSEMLA_CHECK_ARG(cpu_supports(forced), "cpu backend", "SPARSEMLA_CPU_ISA",
                      std::string("a level this CPU and build support (best: ") +
                          cpu_isa_name(best_supported()) + ")",
                      cpu_isa_name(forced));
  return forced;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Avx512:
      return "avx512";
    default:
      return "baseline";
  }
}

bool cpu_supports(CpuIsa isa) {
  if (isa == CpuIsa::Baseline) return true;
#if defined(SPARSEMLA_CPU_X86_LEVELS)
  // __builtin_cpu_supports also checks that the OS saves the YMM/ZMM state (XGETBV). Every CPU with
  // AVX2 also has F16C (Ivy Bridge, a generation earlier; every AVX2 AMD part).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == CpuIsa::Avx2) return avx2;
#if defined(SPARSEMLA_CPU_HAVE_AVX512)
  return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#endif
#endif
  return false;
}

CpuIsa cpu_isa() {
  static const CpuIsa isa = resolve_cpu_isa();  // a throw leaves it unset: the next call throws too
  return isa;
}

}  // namespace sparsemla::cpu

namespace sparsemla {
const char* cpu_isa() {
  return cpu::cpu_isa_name(cpu::cpu_isa());
}
}  // namespace sparsemla

namespace sparsemla::cpu {

const DecodeKernels& decode_kernels_for(CpuIsa isa) {
#if defined(SPARSEMLA_CPU_X86_LEVELS)
  if (isa == CpuIsa::Avx2) return avx2::kKernels;
#if defined(SPARSEMLA_CPU_HAVE_AVX512)
  if (isa == CpuIsa::Avx512) return avx512::kKernels;
#endif
#endif
  (void)isa;
  return baseline::kKernels;
}

}  // namespace sparsemla::cpu
