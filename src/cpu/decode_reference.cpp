// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "sparsemla/decode.h"
#include "sparsemla/error.h"
namespace sparsemla {
void sparse_decode_reference(const DecodeParams&, double*, double*) { throw Error("not implemented"); }
}  // namespace sparsemla
