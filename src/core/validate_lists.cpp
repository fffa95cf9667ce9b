// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "core/validate.h"
#include "sparsemla/error.h"
namespace sparsemla::core {
void validate(const DenseToRaggedParams&) { throw Error("not implemented"); }
void validate(const WindowListParams&) { throw Error("not implemented"); }
void validate(const TopkListParams&) { throw Error("not implemented"); }
void validate(const CompressedAllListParams&) { throw Error("not implemented"); }
}  // namespace sparsemla::core
