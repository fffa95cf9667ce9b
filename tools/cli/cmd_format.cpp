// sparsemla format: prints the cache layout tables of CONTRACT 2 from the traits header.
#include <cstdio>

#include "cli_checks.h"
#include "commands.h"
#include "sparsemla/format.h"

namespace sparsemla::tools {

namespace {
void print_format(int block_size) {
  using F = Fp8DsMla;
  std::printf("fp8_ds_mla (DSV4 MODEL1): %d bytes per token, page of %d tokens = %lld bytes\n",
              F::kBytesPerToken, block_size,
              static_cast<long long>(block_size) * F::kBytesPerToken);
  std::printf("  %-12s %-22s %-8s %s\n", "plane", "offset in page", "bytes", "content");
  std::printf("  %-12s %-22s %-8d %s\n", "data", "p*576 + [0,448)", F::kNopeBytes,
              "448 x e4m3fn, NoPE dims 0..447");
  std::printf("  %-12s %-22s %-8d %s\n", "data", "p*576 + [448,576)", F::kRopeBytes,
              "64 x bf16 LE, RoPE dims 448..511 (rotated)");
  std::printf("  %-12s %-22s %-8d %s\n", "scale", "bs*576 + p*8 + [0,7)", F::kNumTiles,
              "7 x UE8M0, code i scales dims [64i, 64i+64)");
  std::printf("  %-12s %-22s %-8d %s\n", "scale", "bs*576 + p*8 + 7", 1, "pad byte, 0");
  std::printf("  %-12s %-22s %-8s %s\n", "padding", "[bs*584, stride)", "-", "never touched");
  std::printf(
      "  UE8M0: scale = 2^(code-127); code 0 -> 2^-127 (fp32 subnormal); code 255 -> +inf\n");
  std::printf("\nindexer keys (ratio-4 layers): %d bytes per token\n", IndexerFp8::kBytesPerToken);
  std::printf("  NORMAL : value(p,d) at p*128 + d; fp32 scale at bs*128 + p*4\n");
  std::printf(
      "  SHUFFLE: value(p,d) at (p/16)*2048 + (p%%16)*16 + (d/16)*256 + d%%16 "
      "(bs %% 16 == 0); scales as NORMAL\n");
}
}  // namespace

void register_format(CLI::App& app) {
  auto* cmd = app.add_subcommand("format", "Print the KV-cache byte layouts");
  static int block_size = 64;
  cmd->add_option("--block-size", block_size, "tokens per page for the page-size line")
      ->check(integer_in(1, 1 << 20));
  cmd->callback([] { print_format(block_size); });
}

}  // namespace sparsemla::tools
