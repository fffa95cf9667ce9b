// Fuzz target: the KV compressor (CONTRACT 3.2) at ratio 4 (overlapping windows) and 128, with
// garbage tokens, block tables and slots, extreme and NaN state values, NaN norm weights. The
// properties are those of fuzz/fuzz_compressor_common.h; in sanitising mode each stored row also
// holds scale codes <= 254 (CONTRACT 5).
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_compressor_common.h"
#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/writer.h"

namespace sparsemla::fuzz {

namespace {

constexpr int64_t kDataBytes = 576, kScaleBytes = 8, kTokenBytes = 584;

struct MlaCache {
  int32_t block_size;
  int64_t num_blocks, block_stride;
  int64_t data_offset(int64_t slot) const {
    return (slot / block_size) * block_stride + (slot % block_size) * kDataBytes;
  }
  int64_t scale_offset(int64_t slot) const {
    return (slot / block_size) * block_stride + block_size * kDataBytes +
           (slot % block_size) * kScaleBytes;
  }
};

void check_sanitised_row(const std::vector<uint8_t>& cache, const MlaCache& g, int64_t slot) {
  const std::string at = " (slot " + std::to_string(slot) + ")";
  for (int64_t d = 0; d < 448; ++d) {
    SPARSEMLA_FUZZ_CHECK((cache[g.data_offset(slot) + d] & 0x7F) != 0x7F, "NaN e4m3 byte" + at);
  }
  for (int64_t t = 0; t < 7; ++t) {
    SPARSEMLA_FUZZ_CHECK(cache[g.scale_offset(slot) + t] <= 254, "code 255 when sanitising" + at);
  }
}

}  // namespace

int run_compress(const uint8_t* data, size_t size) {
  Input in(data, size);
  const int32_t ratio = in.one_in(4) ? 128 : 4;  // ratio-128 windows cost 16x more per entry
  const MlaCache g{static_cast<int32_t>(in.range(1, 6)), in.range(1, 3), 0};
  MlaCache geo = g;
  geo.block_stride = int64_t{g.block_size} * kTokenBytes + in.range(0, 16);
  Bulk bulk(in.bytes(8));
  CompressorCase c = make_compressor_case(in, bulk, ratio, 512, geo.num_blocks * geo.block_size);
  std::vector<uint8_t> cache0(static_cast<size_t>(geo.num_blocks * geo.block_stride));
  bulk.fill(cache0);

  const auto call = [&](uint8_t* cache, float* scratch) {
    CompressorParams p;
    fill_compressor_params(p, c);
    p.ratio = ratio;
    p.cache = {cache, geo.num_blocks, geo.block_size, geo.block_stride};
    p.scratch = scratch;
    compress(p);
  };
  const auto writable = [&] {
    std::vector<uint8_t> w(cache0.size(), 0);
    for (int64_t i = 0; i < c.num_tokens; ++i) {
      if (!c.stores(i)) continue;
      mark(w, geo.data_offset(c.out_slots[i]), kDataBytes);
      mark(w, geo.scale_offset(c.out_slots[i]), kScaleBytes);
    }
    return w;
  };
  const std::vector<uint8_t> out = run_both_forms(c, cache0, "compress", call, writable);
  if (out.empty() || !c.sanitise) return 0;
  for (int64_t i = 0; i < c.num_tokens; ++i) {
    if (c.stores(i)) check_sanitised_row(out, geo, c.out_slots[i]);
  }
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_compress)
