// tools/common/problem.h: a realistic DSV4 decode problem for one layer kind, built the way an engine
// builds it: caches filled through the writers from random model-like inputs, index lists through
// the builders. Host memory; `sparsemla run` and `sparsemla bench` mirror it to the GPU when asked.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sparsemla/sparsemla.h"

namespace sparsemla::tools {

// A layer kind of DSV4 (CONTRACT 1).
struct LayerKind {
  std::string name;  // flash-c4 | pro-c4 | flash-c128 | pro-c128 | swa
  int32_t heads;     // query heads before tensor parallelism
  int32_t ratio;     // 0 (window only), 4 or 128
  int32_t topk;      // index top-k for ratio 4
};
// Throws sparsemla::Error for an unknown name.
LayerKind layer_kind(const std::string& name);
std::string layer_kind_names();

struct ProblemConfig {
  std::string layer = "flash-c4";
  int64_t batch = 4;
  int64_t context = 8192;  // tokens per request before the query tokens (lengths jittered by 1/8)
  int32_t heads = 0;       // 0: the layer's own head count
  int32_t mtp = 1;         // query tokens per request
  uint64_t seed = 1;
  int32_t window_page = 64;     // window cache page size
  int32_t compressed_page = 0;  // 0: 64 for ratio 4, 2 for ratio 128
  int64_t chunk = 1024;         // tokens per compressor batch (chunked prefill)
  // Ratio-4 top-k lists: "random" (distinct random completed entries) or "indexer" (the lightning
  // indexer of CONTRACT 11 on the CPU, over random keys placed by the compressed block table).
  std::string topk_source = "random";
  std::function<void(const std::string&)> progress;  // stage messages (may be empty)
};

// One ragged list as built (graph-buffer shaped: capacity rows*W).
struct HostList {
  std::vector<int32_t> indices;
  std::vector<int32_t> indptr;
  int64_t width = 0;
  IndexList view() const {
    return {indices.data(), indptr.data(), static_cast<int64_t>(indices.size()), width};
  }
};

struct HostCache {
  std::vector<uint8_t> bytes;
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  int64_t block_stride = 0;
  CacheView view() const { return {bytes.data(), num_blocks, block_size, block_stride}; }
};

struct Problem {
  ProblemConfig config;
  LayerKind kind;
  int32_t heads = 0;
  int64_t tokens = 0;  // T = batch * mtp
  HostCache window_cache;
  HostCache compressed_cache;  // empty for window-only layers
  HostList main_list;
  HostList extra_list;
  std::vector<bf16_bits> q;        // [T, H, 512]
  std::vector<float> sink;         // [H]
  std::vector<int64_t> positions;  // [T]
  std::vector<float> rope;         // [P, 64] the layer's table
  int64_t rope_rows = 0;
  int64_t attended_keys = 0;       // valid keys over all rows (for FLOP/byte counts)
  double indexer_seconds = 0;      // topk_source "indexer": the indexer step's CPU time (median)
  int64_t indexer_candidates = 0;  // topk_source "indexer": sum of n_t over the rows

  // A DecodeParams over the host buffers (out/lse/path/splits left for the caller).
  DecodeParams params() const;
  double flops() const { return 2.0 * heads * static_cast<double>(attended_keys) * 1024.0; }
  double bytes() const;
};

Problem build_problem(const ProblemConfig& cfg);

}  // namespace sparsemla::tools
