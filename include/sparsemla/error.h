// sparsemla/error.h: the one exception type of the library and the argument-check helpers.
//
// Every public entry validates its arguments and throws sparsemla::Error whose message names the
// operation, the argument, what was expected and what was got, e.g.
//   "sparsemla::write_window: argument 'cache.block_stride': expected >= block_size*584 = 37376,
//   got 37000"
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace sparsemla {

class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

// Builds the standard message and throws. `op` is the public operation, `arg` the argument path.
[[noreturn]] void throw_arg_error(const char* op, const std::string& arg,
                                  const std::string& expected, const std::string& got);

namespace detail {
// Formats the "got" value of an error without iostreams: std::ostream needs an initialised locale,
// and inside a Python extension loaded next to another C++ runtime (torch) that is not guaranteed
// (seen on the GPU machine: a segfault in ostream::_M_insert<long> while building an error).
template <typename T>
std::string to_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    if constexpr (std::is_enum_v<T>) {
      return std::to_string(static_cast<long long>(v));
    } else if constexpr (std::is_signed_v<T>) {
      return std::to_string(static_cast<long long>(v));
    } else {
      return std::to_string(static_cast<unsigned long long>(v));
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
    return buf;
  } else if constexpr (std::is_pointer_v<T> && !std::is_convertible_v<T, const char*>) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%p", static_cast<const void*>(v));
    return buf;
  } else {
    return std::string(v);  // strings and string literals
  }
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
