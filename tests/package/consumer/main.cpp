// A downstream project: find_package(sparsemla) and one call through the installed headers.
#include <sparsemla/sparsemla.h>

#include <cstdio>

int main() {
  const uint8_t b = sparsemla::float_to_e4m3(1.5f);
  std::printf("sparsemla %d.%d: e4m3(1.5) = 0x%02x, bytes/token = %d\n", sparsemla::kVersionMajor,
              sparsemla::kVersionMinor, b, sparsemla::Fp8DsMla::kBytesPerToken);
  return b == 0x3C ? 0 : 1;
}
