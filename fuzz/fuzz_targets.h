// fuzz/fuzz_targets.h: the fuzz target bodies (one per fuzz/fuzz_<name>.cpp). The libFuzzer
// executables wrap them in LLVMFuzzerTestOneInput; tests/cpp/test_reliability.cpp replays the
// committed corpora through them in the ordinary (and the sanitizer) test build.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sparsemla::fuzz {

int run_builders(const uint8_t* data, size_t size);
int run_gather(const uint8_t* data, size_t size);
int run_decode(const uint8_t* data, size_t size);
int run_dequantize_row(const uint8_t* data, size_t size);
int run_window_writer(const uint8_t* data, size_t size);
int run_state_writer(const uint8_t* data, size_t size);
int run_compress(const uint8_t* data, size_t size);
int run_compress_indexer(const uint8_t* data, size_t size);
int run_inverse_rope(const uint8_t* data, size_t size);
int run_indexer(const uint8_t* data, size_t size);

}  // namespace sparsemla::fuzz

// Defines the libFuzzer entry point of a target when building the fuzzer executable.
#if defined(SPARSEMLA_LIBFUZZER)
#define SPARSEMLA_FUZZ_ENTRY(fn)                                            \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    return ::sparsemla::fuzz::fn(data, size);                               \
  }
#else
#define SPARSEMLA_FUZZ_ENTRY(fn)
#endif
