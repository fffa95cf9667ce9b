// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "cpu/cpu_backend.h"
#include "sparsemla/error.h"
namespace sparsemla::cpu {
void build_ragged_from_dense(const DenseToRaggedParams&) { throw Error("not implemented"); }
void build_window_lists(const WindowListParams&) { throw Error("not implemented"); }
void build_topk_lists(const TopkListParams&) { throw Error("not implemented"); }
void build_compressed_all_lists(const CompressedAllListParams&) { throw Error("not implemented"); }
}  // namespace sparsemla::cpu
namespace sparsemla {
int64_t max_compressed_entries(int64_t, int32_t) { throw Error("not implemented"); }
}  // namespace sparsemla
