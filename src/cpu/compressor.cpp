// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "cpu/cpu_backend.h"
#include "sparsemla/error.h"
namespace sparsemla::cpu {
void write_compressor_state(const StateWriterParams&) { throw Error("not implemented"); }
void compress(const CompressorParams&) { throw Error("not implemented"); }
}  // namespace sparsemla::cpu
