# SPARSEMLA_FDP_INCLUDE: the folder holding fuzzer/FuzzedDataProvider.h, the byte reader of the
# fuzz targets (fuzz/fuzz_input.h). The header ships with clang's libFuzzer runtime (Debian:
# libclang-rt-<N>-dev, installed by scripts/install-deps); the CPU test build needs it too, since
# the corpus replay test runs the target bodies (tests/cpp/test_reliability.cpp). A GPU machine
# without clang gets it from the deps folder of `scripts/gpu-check --prepare-deps`.
if(NOT SPARSEMLA_FDP_INCLUDE)
  set(_fdp_hints "")
  find_program(SPARSEMLA_CLANGXX NAMES clang++)
  if(SPARSEMLA_CLANGXX)
    execute_process(COMMAND ${SPARSEMLA_CLANGXX} -print-resource-dir
                    OUTPUT_VARIABLE _clang_resource_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                    ERROR_QUIET)
    list(APPEND _fdp_hints "${_clang_resource_dir}/include")
  endif()
  file(GLOB _llvm_includes /usr/lib/llvm-*/lib/clang/*/include)
  list(APPEND _fdp_hints ${_llvm_includes})
  find_path(SPARSEMLA_FDP_INCLUDE fuzzer/FuzzedDataProvider.h HINTS ${_fdp_hints})
endif()
if(NOT SPARSEMLA_FDP_INCLUDE)
  message(FATAL_ERROR
          "fuzzer/FuzzedDataProvider.h not found (the fuzz targets' byte reader, shipped with "
          "clang's libFuzzer runtime): run scripts/install-deps (Debian: libclang-rt-<N>-dev), "
          "pass -DSPARSEMLA_FDP_INCLUDE=<folder holding fuzzer/>, or -DSPARSEMLA_BUILD_TESTS=OFF")
endif()
# Only that header goes on the include path (clang's resource folder also holds its own stddef.h
# and friends, which must not shadow the host compiler's).
configure_file(${SPARSEMLA_FDP_INCLUDE}/fuzzer/FuzzedDataProvider.h
               ${CMAKE_BINARY_DIR}/fuzzed-data-provider/fuzzer/FuzzedDataProvider.h COPYONLY)
set(SPARSEMLA_FDP_INCLUDE_DIR ${CMAKE_BINARY_DIR}/fuzzed-data-provider)
