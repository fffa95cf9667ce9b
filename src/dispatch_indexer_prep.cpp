// src/dispatch_indexer_prep.cpp: the public entry of the indexer query prep (CONTRACT 11.6):
// validation, then the backend. Only the CPU backend exists; device pointers or a CUDA path are
// rejected with an error naming `path` (a file apart from src/dispatch.cpp so that the op's files
// stay apart from the indexer's).
#include "core/validate_indexer_prep.h"
#include "cpu/indexer_prep.h"
#include "sparsemla/error.h"
#include "sparsemla/indexer_prep.h"

#if defined(SPARSEMLA_WITH_CUDA)
#include "cuda/common/device_info.h"
#endif

namespace sparsemla {

void indexer_q_prep(const IndexerQPrepParams& p) {
  core::validate(p);
  bool on_device = false;
#if defined(SPARSEMLA_WITH_CUDA)
  on_device = p.num_tokens > 0 && cuda::is_device_pointer(p.w_out);
#endif
  if (p.path == Path::Cpu || (p.path == Path::Auto && !on_device)) {
    SPARSEMLA_CHECK_ARG(!on_device, "indexer_q_prep", "path", "host pointers for the cpu path",
                        "device pointers");
    cpu::indexer_q_prep(p);
    return;
  }
  throw_arg_error("indexer_q_prep", "path", "cpu (the CUDA query prep is not built yet)",
                  path_name(p.path == Path::Auto ? Path::CudaGeneric : p.path));
}

}  // namespace sparsemla
