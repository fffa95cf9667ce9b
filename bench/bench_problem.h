// bench/bench_problem.h: the standard benchmark shapes of CONTRACT 10 and their problems.
//
// Two kinds of data (`sparsemla bench --data`), both with model-magnitude rows (CONTRACT 9.9:
// latents N(0,1) times a gain exp(0.7 N(0,1)) per (token, 64-dim tile), the 7 NoPE tiles quantised
// by the library's quantiser, the RoPE tile stored bf16) and the same window lists (128 consecutive
// positions per query row on 64-row pages):
// - real (default), as the incumbent's kit (shared/anchors/flashmla) and real caches hold them
//   (CONTRACT 10): pad bytes random; the window on 3 random pages of a 384-page cache; ratio-4
//   extra = top-k distinct random rows, in random order, of the request's own 8192 rows, which sit
//   on 128 random pages of one 16,384-page cache of 64 rows; ratio-128 extra = every row of the
//   request on 2-row pages placed at random in a 32,768-page cache (caches grow when a batch needs
//   more). Only rows a list reaches are quantised; the other rows are copies of a small pool of
//   model rows (never read; quantising 1M rows would take ~10 s per cell).
// - writer: the previous synthetic data, shaped as this library's writers leave a cache: pad
//   bytes 0 and compact caches holding only the pages the lists reach (ratio 4: 4x top-k rows per
//   request on 64-row pages; ratio 128: the request's rows on 2-row pages; window: 4 pages per
//   request). Data made this way hid a pad-byte slow path worth 1.6x (issue 22).
// Rows are filled directly instead of through the writers (`sparsemla run` uses those): at B=128
// the compressor would take minutes on the host, and the decode's cost and numerics depend on the
// bytes it reads, not on how they were produced.
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

enum class BenchData { Real, Writer };
inline constexpr const char* kBenchDataNames[] = {"real", "writer"};
BenchData parse_bench_data(const std::string& name);  // throws sparsemla::Error naming `--data`
const char* bench_data_name(BenchData d);

std::vector<BenchShape> standard_bench_shapes();
// Throws sparsemla::Error naming `--shapes` for an unknown name.
BenchShape bench_shape(const std::string& name);

Problem build_bench_problem(const BenchShape& shape, int64_t batch, uint64_t seed,
                            BenchData data = BenchData::Real);

}  // namespace sparsemla::tools
