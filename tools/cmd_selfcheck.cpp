// placeholder: implemented by its owner
#include "commands.h"
namespace sparsemla::tools {
void register_selfcheck(CLI::App& app) {
  (void)app;
}
}  // namespace sparsemla::tools
