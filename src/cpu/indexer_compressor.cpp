// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "cpu/cpu_backend.h"
#include "sparsemla/error.h"
namespace sparsemla::cpu {
void compress_indexer(const IndexerCompressorParams&) { throw Error("not implemented"); }
}  // namespace sparsemla::cpu
