// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "sparsemla/error.h"
#include "sparsemla/writer.h"
namespace sparsemla {
void dequantize_row(const CacheView&, int64_t, bool, float*) { throw Error("not implemented"); }
void dequantize_indexer_row(const IndexerCacheView&, int64_t, float*) { throw Error("not implemented"); }
}  // namespace sparsemla
