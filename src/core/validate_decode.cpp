// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "core/validate.h"
#include "sparsemla/error.h"
namespace sparsemla::core {
void validate(const DecodeParams&) {
  throw Error("not implemented");
}
}  // namespace sparsemla::core
