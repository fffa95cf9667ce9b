// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "cpu/cpu_backend.h"
#include "sparsemla/error.h"
namespace sparsemla::cpu {
void write_window(const WindowWriterParams&) { throw Error("not implemented"); }
}  // namespace sparsemla::cpu
