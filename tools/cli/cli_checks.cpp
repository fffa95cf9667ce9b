#include "cli_checks.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "runner.h"
#include "sparsemla/error.h"

namespace sparsemla::tools {

namespace {

// The value as given, cut short: a pasted 300-digit number should not fill the terminal.
std::string shown(const std::string& input) {
  constexpr size_t kMaxShown = 32;
  return input.size() <= kMaxShown ? input : input.substr(0, kMaxShown) + "...";
}

std::string range_text(const char* what, const std::string& lo, const std::string& hi) {
  return std::string("expected ") + what + " in " + lo + ".." + hi;
}

// Whole-string int64 parse; false on junk, on a fraction and on overflow.
bool parse_int64(const std::string& s, int64_t& value) {
  const char* first = s.data();
  const char* last = s.data() + s.size();
  if (first != last && *first == '+') ++first;  // from_chars takes '-' only
  const auto [end, ec] = std::from_chars(first, last, value);
  return ec == std::errc() && end == last && first != last;
}

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The directory a new file would be created in ("." for a bare name).
std::filesystem::path parent_of(const std::string& file) {
  const std::filesystem::path parent = std::filesystem::path(file).parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

[[noreturn]] void throw_unwritable(const char* command, const std::string& option,
                                   const std::string& file, const std::string& why) {
  throw_arg_error(command, option, "a writable file", file + " (" + why + ")");
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string expected = range_text("an integer", std::to_string(lo), std::to_string(hi));
  return CLI::Validator(
      [lo, hi, expected](std::string& input) -> std::string {
        int64_t v = 0;
        if (parse_int64(input, v) && v >= lo && v <= hi) return {};
        return expected + ", got " + shown(input);
      },
      std::to_string(lo) + ".." + std::to_string(hi));
}

CLI::Validator number_in(double lo, double hi) {
  const std::string expected = range_text("a number", number_text(lo), number_text(hi));
  return CLI::Validator(
      [lo, hi, expected](std::string& input) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(input, v) && v >= lo && v <= hi) return {};
        return expected + ", got " + shown(input);
      },
      number_text(lo) + ".." + number_text(hi));
}

CLI::Validator mebibytes_as_bytes(int64_t max_mib) {
  const std::string expected = range_text("an integer (MiB)", "0", std::to_string(max_mib));
  CLI::Validator v(
      [max_mib, expected](std::string& input) -> std::string {
        int64_t mib = 0;
        if (!parse_int64(input, mib) || mib < 0 || mib > max_mib)
          return expected + ", got " + shown(input);
        input = std::to_string(mib << 20);
        return {};
      },
      "0.." + std::to_string(max_mib));
  return v;
}

void check_output_file(const char* command, const std::string& option, const std::string& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    throw_unwritable(command, option, file, "a directory");
  if (std::filesystem::exists(file, ec)) {
    if (::access(file.c_str(), W_OK) != 0)
      throw_unwritable(command, option, file, std::strerror(errno));
    return;
  }
  const std::filesystem::path dir = parent_of(file);
  if (!std::filesystem::is_directory(dir, ec))
    throw_unwritable(command, option, file, "no directory " + dir.string());
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw_unwritable(command, option, file, dir.string() + ": " + std::strerror(errno));
}

void write_output_file(const char* command, const std::string& option, const std::string& file,
                       const std::string& text) {
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (f == nullptr) throw_unwritable(command, option, file, std::strerror(errno));
  // fclose flushes: a full disk (ENOSPC, e.g. /dev/full) shows up there, not in fwrite
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed)
    throw_unwritable(command, option, file, std::strerror(written ? errno : write_errno));
}

bool names_cuda_path(const std::string& path) {
  return path.rfind("cuda", 0) == 0;
}

void require_cuda_device(const char* command, const std::string& option, const std::string& path) {
  const std::string problem = cuda_device_problem();
  if (!problem.empty()) throw_arg_error(command, option, "a CUDA device for " + path, problem);
}

}  // namespace sparsemla::tools
