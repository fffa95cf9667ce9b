// Fuzz target: the indexer compressor (CONTRACT 3.2, last paragraph; ratio 4, head 128, the
// NORMAL layout of CONTRACT 2.2), with the inputs and properties of fuzz/fuzz_compressor_common.h;
// a SHUFFLE-layout destination is rejected; in sanitising mode a stored row holds no NaN byte and
// its scale is a power of two (+inf for a row that held +-inf, CONTRACT 2.3).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_compressor_common.h"
#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/writer.h"

namespace sparsemla::fuzz {

namespace {

constexpr int64_t kValueBytes = 128, kScaleBytes = 4, kTokenBytes = 132;

struct IndexerGeometry {
  int32_t block_size;
  int64_t num_blocks, block_stride;
  int64_t value_offset(int64_t slot) const {
    return (slot / block_size) * block_stride + (slot % block_size) * kValueBytes;
  }
  int64_t scale_offset(int64_t slot) const {
    return (slot / block_size) * block_stride + block_size * kValueBytes +
           (slot % block_size) * kScaleBytes;
  }
};

void check_sanitised_row(const std::vector<uint8_t>& cache, const IndexerGeometry& g,
                         int64_t slot) {
  const std::string at = " (slot " + std::to_string(slot) + ")";
  for (int64_t d = 0; d < kValueBytes; ++d) {
    SPARSEMLA_FUZZ_CHECK((cache[g.value_offset(slot) + d] & 0x7F) != 0x7F, "NaN e4m3 byte" + at);
  }
  float scale;
  std::memcpy(&scale, cache.data() + g.scale_offset(slot), 4);
  int exp = 0;  // 2^e, not clamped: +inf for a row that held +-inf (CONTRACT 2.3)
  const bool power_of_two = std::isinf(scale) || std::frexp(scale, &exp) == 0.5f;
  SPARSEMLA_FUZZ_CHECK(scale > 0.0f && power_of_two, "scale not 2^e or +inf" + at);
}

}  // namespace

int run_compress_indexer(const uint8_t* data, size_t size) {
  Input in(data, size);
  IndexerGeometry geo{static_cast<int32_t>(16 * in.range(1, 2)), in.range(1, 3), 0};
  geo.block_stride = int64_t{geo.block_size} * kTokenBytes + in.range(0, 16);
  const bool shuffle = in.one_in(16);
  Bulk bulk(in.bytes(8));
  CompressorCase c = make_compressor_case(in, bulk, 4, 128, geo.num_blocks * geo.block_size);
  if (shuffle) c.must_reject = true;
  std::vector<uint8_t> cache0(static_cast<size_t>(geo.num_blocks * geo.block_stride));
  bulk.fill(cache0);

  const auto call = [&](uint8_t* cache, float* scratch) {
    IndexerCompressorParams p;
    fill_compressor_params(p, c);
    p.cache = {cache, geo.num_blocks, geo.block_size, geo.block_stride,
               shuffle ? IndexerLayout::Shuffle : IndexerLayout::Normal};
    p.scratch = scratch;
    compress_indexer(p);
  };
  const auto writable = [&] {
    std::vector<uint8_t> w(cache0.size(), 0);
    for (int64_t i = 0; i < c.num_tokens; ++i) {
      if (!c.stores(i)) continue;
      mark(w, geo.value_offset(c.out_slots[i]), kValueBytes);
      mark(w, geo.scale_offset(c.out_slots[i]), kScaleBytes);
    }
    return w;
  };
  const std::vector<uint8_t> out = run_both_forms(c, cache0, "compress_indexer", call, writable);
  if (out.empty() || !c.sanitise) return 0;
  for (int64_t i = 0; i < c.num_tokens; ++i) {
    if (c.stores(i)) check_sanitised_row(out, geo, c.out_slots[i]);
  }
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_compress_indexer)
