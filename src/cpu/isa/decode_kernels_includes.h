// src/cpu/isa/decode_kernels_includes.h: every header src/cpu/decode_kernels.inc uses. Included by
// each level's file *before* its target pragma, so that the inline functions and templates of these
// headers keep the baseline target: one level's instructions never end up in a function that the
// linker may pick for another level (an ODR-merged inline compiled with AVX-512 would fault on
// AVX2-only CPUs).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/decode_kernels.h"
#include "cpu/row_decode.h"
#include "sparsemla/format.h"
#include "sparsemla/numerics.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif
