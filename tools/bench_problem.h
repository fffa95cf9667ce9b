// tools/bench_problem.h: the standard benchmark shapes of SPEC 10 and a synthetic problem builder.
//
// Benchmarks fill the caches with random valid rows directly (random e4m3 bytes without NaN, UE8M0
// codes 118..130, random bf16 RoPE) instead of running the writers: at B=128 the writers would take
// minutes on the host, and the decode's cost does not depend on how the bytes were produced.
// Lists follow the measurement method of the incumbent: main = 128 window slots on 64-token pages;
// extra = distinct random slots on 64-entry pages, or for ratio-128 shapes every entry of the
// request on 2-entry pages with per-request lengths between extra_min and extra_max (or, for the
// load-balance companion shape, all equal to the mean of such lengths).
#pragma once

#include <string>
#include <vector>

#include "problem.h"

namespace sparsemla::tools {

struct BenchShape {
  std::string name;  // e.g. "c4-flash"
  int32_t heads;
  int64_t extra_min;  // extra keys per row (top-k, or min length for ratio-128 rows)
  int64_t extra_max;  // == extra_min except for ratio-128 shapes with varying lengths
  bool ratio128;      // extra on 2-entry pages, "all compressed" lists of capacity extra_max
  int32_t mtp;        // query tokens per request
  bool even_lengths = false;  // ratio-128: every request at the mean of the drawn lengths
};

std::vector<BenchShape> standard_bench_shapes();
// Throws sparsemla::Error naming `--shapes` for an unknown name.
BenchShape bench_shape(const std::string& name);

Problem build_bench_problem(const BenchShape& shape, int64_t batch, uint64_t seed);

}  // namespace sparsemla::tools
