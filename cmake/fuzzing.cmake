# Fuzzing build (SPARSEMLA_BUILD_FUZZERS=ON): clang only, CPU only. Every target defined after this
# point is compiled with libFuzzer's coverage instrumentation plus AddressSanitizer and
# UndefinedBehaviorSanitizer (any report aborts); fuzz/CMakeLists.txt links the fuzz targets with
# libFuzzer's main.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "SPARSEMLA_BUILD_FUZZERS needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++ (got ${CMAKE_CXX_COMPILER_ID})")
endif()
if(SPARSEMLA_HAS_CUDA)
  message(FATAL_ERROR "SPARSEMLA_BUILD_FUZZERS fuzzes the CPU library: configure with "
                      "-DSPARSEMLA_ENABLE_CUDA=OFF")
endif()
set(SPARSEMLA_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer -g)
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>
                    "$<$<COMPILE_LANGUAGE:CXX>:${SPARSEMLA_SANITIZER_FLAGS}>")
add_link_options(-fsanitize=address,undefined)
