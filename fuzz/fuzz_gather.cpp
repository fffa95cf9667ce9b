// Fuzz target: the indexer-key gather (CONTRACT 6) on the CPU with garbage token_to_seq, cu_seqlen
// and block tables, NORMAL and SHUFFLE pages, padded strides and over-allocated outputs. Oracle:
// the gather written out here from CONTRACT 6 -- invalid tokens write nothing, valid tokens on an
// invalid page get scale 0 and an untouched value row, the others a copy of their row -- compared
// byte for byte over both outputs; rejected exactly when a shape is bad or cu_seqlen is not a
// non-decreasing sequence from >= 0 (the CPU path reads it).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_targets.h"
#include "sparsemla/gather.h"

namespace sparsemla::fuzz {

int run_gather(const uint8_t* data, size_t size) {
  Input in(data, size);
  bool must_reject = false;
  const int64_t B = in.range(0, 5), N = in.range(0, 40);
  const bool shuffle = in.flag();
  int32_t bs = static_cast<int32_t>(shuffle ? 16 * in.range(1, 2) : in.range(1, 40));
  const int64_t nb = in.range(0, 4);
  int64_t stride = int64_t{bs} * 132 + in.range(0, 20);
  const int32_t tw = static_cast<int32_t>(in.range(0, 4));
  int64_t table_stride = tw + in.range(0, 2);
  int64_t k_stride = 128 + in.range(0, 8);

  std::vector<int32_t> cu(static_cast<size_t>(B + 1));
  cu[0] = static_cast<int32_t>(in.range(0, 3));
  for (int64_t b = 0; b < B; ++b) cu[b + 1] = cu[b] + static_cast<int32_t>(in.range(0, 12));
  if (in.one_in(6)) cu[in.range(0, B)] = in.int32_like(-5, 60);  // garbage entry
  bool cu_ok = cu[0] >= 0;
  for (int64_t b = 0; b < B; ++b) cu_ok = cu_ok && cu[b + 1] >= cu[b];
  must_reject = N > 0 && !cu_ok;

  std::vector<int32_t> tts(static_cast<size_t>(N));
  for (auto& v : tts) v = in.int32_like(-1, B);
  std::vector<int32_t> table(static_cast<size_t>(B * table_stride));
  for (auto& v : table) v = in.int32_like(-1, nb);
  Bulk bulk(in.bytes(8));
  std::vector<uint8_t> cache(static_cast<size_t>(nb * stride));
  bulk.fill(cache);
  std::vector<uint8_t> k_fp8(static_cast<size_t>(N * k_stride));
  bulk.fill(k_fp8);
  std::vector<float> k_scale(static_cast<size_t>(N));
  for (auto& s : k_scale) s = static_cast<float>(bulk.unit());

  if (in.one_in(12)) {  // a shape the library must reject
    const int which = static_cast<int>(in.range(0, 3));
    if (which == 0) k_stride = 128 - in.range(1, 128);
    if (which == 1) table_stride = tw - in.range(1, 3);
    if (which == 2) stride = int64_t{bs} * 132 - in.range(1, 50);
    if (which == 3) bs = shuffle ? bs - 8 : 0;
    must_reject = true;
  }
  GatherParams p;
  p.num_tokens = N;
  p.num_batches = B;
  p.token_to_seq = tts.data();
  p.cu_seqlen = cu.data();
  p.block_table = table.empty() ? nullptr : table.data();
  p.block_table_stride = table_stride;
  p.block_table_width = tw;
  p.cache = {cache.empty() ? nullptr : cache.data(), nb, bs, stride,
             shuffle ? IndexerLayout::Shuffle : IndexerLayout::Normal};
  p.k_fp8 = k_fp8.data();
  p.k_fp8_stride = k_stride;
  p.k_scale = k_scale.data();
  p.path = Path::Cpu;
  if (N == 0) p.token_to_seq = nullptr, p.k_fp8 = nullptr, p.k_scale = nullptr;

  std::vector<uint8_t> want_fp8 = k_fp8;
  std::vector<float> want_scale = k_scale;
  std::string why;
  const bool ok = accepted([&] { gather_indexer_keys(p); }, &why);
  expect_verdict(ok, must_reject, why, "gather_indexer_keys");
  if (ok) {
    for (int64_t tid = 0; tid < N; ++tid) {
      const int32_t b = tts[tid];
      if (b < 0 || b >= B || tid < cu[b] || tid >= cu[b + 1]) continue;  // writes nothing
      const int64_t o = tid - cu[b];
      const int64_t page = o / bs;
      const int32_t block = page < tw ? table[b * table_stride + page] : -1;
      if (block < 0 || block >= nb) {
        want_scale[tid] = 0.0f;
        continue;
      }
      const uint8_t* base = cache.data() + block * stride;
      const int64_t r = o % bs;
      for (int d = 0; d < 128; ++d) {
        const int64_t off =
            shuffle ? (r / 16) * 2048 + (r % 16) * 16 + (d / 16) * 256 + d % 16 : r * 128 + d;
        want_fp8[tid * k_stride + d] = base[off];
      }
      std::memcpy(&want_scale[tid], base + int64_t{bs} * 128 + r * 4, 4);
    }
  }
  SPARSEMLA_FUZZ_CHECK(k_fp8 == want_fp8, "k_fp8 differs from the CONTRACT 6 oracle");
  SPARSEMLA_FUZZ_CHECK(same_bits(k_scale, want_scale),
                       "k_scale differs from the CONTRACT 6 oracle");
  return 0;
}

}  // namespace sparsemla::fuzz

SPARSEMLA_FUZZ_ENTRY(run_gather)
