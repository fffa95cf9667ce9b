// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "cpu/cpu_backend.h"
#include "sparsemla/error.h"
namespace sparsemla::cpu {
void sparse_decode(const DecodeParams&, int32_t, void*) { throw Error("not implemented"); }
void inverse_rope_inplace(bf16_bits*, int64_t, int32_t, int64_t, int64_t, const int64_t*, const RopeTable&) { throw Error("not implemented"); }
}  // namespace sparsemla::cpu
