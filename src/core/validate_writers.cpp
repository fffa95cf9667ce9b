// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "core/validate.h"
#include "sparsemla/error.h"
namespace sparsemla::core {
void validate(const WindowWriterParams&) { throw Error("not implemented"); }
void validate(const StateWriterParams&) { throw Error("not implemented"); }
void validate(const CompressorParams&) { throw Error("not implemented"); }
void validate(const IndexerCompressorParams&) { throw Error("not implemented"); }
}  // namespace sparsemla::core
