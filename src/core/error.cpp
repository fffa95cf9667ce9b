#include "sparsemla/error.h"

namespace sparsemla {

void throw_arg_error(const char* op, const std::string& arg, const std::string& expected,
                     const std::string& got) {
  throw Error(std::string("sparsemla::") + op + ": argument '" + arg + "': expected " + expected +
              ", got " + got);
}

}  // namespace sparsemla
