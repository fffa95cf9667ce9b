// tools/cli/cli_checks.h: what every command checks the same way: option values with readable
// messages, output files (checked before the work and when written), and the CUDA device a path
// needs. Every failure here ends the command with a non-zero exit status.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace sparsemla::tools {

// An integer option in [lo, hi]. CLI11 prefixes the option name: "--batch: expected an integer in
// 1..4096, got 0". (CLI11's Range / PositiveNumber print the bounds of a double: 300 digits.)
CLI::Validator integer_in(int64_t lo, int64_t hi);
// A number option in [lo, hi] (fractions allowed).
CLI::Validator number_in(double lo, double hi);
// An integer count of MiB in [0, max_mib], rewritten as bytes.
CLI::Validator mebibytes_as_bytes(int64_t max_mib);

// Fails (sparsemla::Error naming the option and the file) when `file` cannot be created or written:
// called before a long run so that the run is not lost at the end.
void check_output_file(const char* command, const std::string& option, const std::string& file);
// Writes `text` to `file` and fails the same way when any byte did not reach it.
void write_output_file(const char* command, const std::string& option, const std::string& file,
                       const std::string& text);

// Whether a path name (cuda-generic, cuda-sm90+scrub, ...) runs on the GPU.
bool names_cuda_path(const std::string& path);
// Fails naming the option, the path and the missing device when no CUDA device is usable.
void require_cuda_device(const char* command, const std::string& option, const std::string& path);

}  // namespace sparsemla::tools
