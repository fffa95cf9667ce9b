// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "cpu/cpu_backend.h"
#include "sparsemla/error.h"
namespace sparsemla::cpu {
void gather_indexer_keys(const GatherParams&) { throw Error("not implemented"); }
}  // namespace sparsemla::cpu
