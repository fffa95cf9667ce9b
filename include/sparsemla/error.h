// sparsemla/error.h: the one exception type of the library and the argument-check helpers.
//
// Every public entry validates its arguments and throws sparsemla::Error whose message names the
// operation, the argument, what was expected and what was got, e.g.
//   "sparsemla::write_window: argument 'cache.block_stride': expected >= block_size*584 = 37376,
//   got 37000"
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace sparsemla {

class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

// Builds the standard message and throws. `op` is the public operation, `arg` the argument path.
[[noreturn]] void throw_arg_error(const char* op, const std::string& arg,
                                  const std::string& expected, const std::string& got);

namespace detail {
template <typename T>
std::string to_text(const T& v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
}  // namespace detail

}  // namespace sparsemla

// Checks `cond`; on failure throws sparsemla::Error naming op, arg, expected and the got value.
#define SPARSEMLA_CHECK_ARG(cond, op, arg, expected, got)                                 \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::sparsemla::throw_arg_error(op, arg, expected, ::sparsemla::detail::to_text(got)); \
  } while (0)

// Checks that a required pointer is present.
#define SPARSEMLA_CHECK_PTR(ptr, op, arg) \
  SPARSEMLA_CHECK_ARG((ptr) != nullptr, op, arg, "a non-null pointer", "null")
