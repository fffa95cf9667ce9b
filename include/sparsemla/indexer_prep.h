// sparsemla/indexer_prep.h: the optional query prep of the lightning indexer (CONTRACT 11.6): a
// bf16 indexer query [T, H, 128] after wq_b becomes the e4m3 query and the folded fp32 head
// weights that indexer_topk (sparsemla/indexer.h) reads.
//
// Per (t, h): dims 64..127 rotated as GPT-J pairs at the row's position (the forward formula of
// CONTRACT 1 in fp32, rounded to bf16); amax = max(fmax |x|, 1e-4) over the 128 bf16 values,
// e = ceil(log2(amax / 448)) exactly (the quantiser of CONTRACT 2.3); bytes
// e4m3fn(clamp(x * 2^-e, +-448)), round to nearest even; w = ((fp32(w_raw) * 2^e) * 128^-0.5) *
// 64^-0.5 in that order. No Hadamard rotation. Backends: the CPU (host pointers; Path::Cpu, or
// Auto), the generic CUDA kernel (device pointers; Auto or CudaGeneric, sm_80+, on p.stream,
// graph-safe), bit-identical to each other; Path::CudaSm90 is rejected naming `path` (no
// Hopper-specific prep). Every array must be on the side of w_out (host or device), else an error
// names the first one that is not.
#pragma once

#include <cstdint>

#include "sparsemla/backend.h"
#include "sparsemla/numerics.h"
#include "sparsemla/writer.h"

namespace sparsemla {

struct IndexerQPrepParams {
  int64_t num_tokens = 0;  // T
  int32_t num_heads = 0;   // H: 1..128
  // q: bf16 [T, H, 128], last dim contiguous; strides in elements (0: contiguous).
  const bf16_bits* q = nullptr;
  int64_t q_stride_token = 0;  // 0: H * 128
  int64_t q_stride_head = 0;   // 0: 128
  // positions: int64 [T], the row's position into `rope` ([0, P); < 0: padding row, whose
  // outputs are written as zeros).
  const int64_t* positions = nullptr;
  RopeTable rope;  // fp32 [P, >= 64] (cos x32 | sin x32), the layer's table (CONTRACT 1)
  // w_raw: bf16 [T, H], heads contiguous, the output of weights_proj; row stride in elements
  // (0: H).
  const bf16_bits* w_raw = nullptr;
  int64_t w_raw_stride = 0;
  // Outputs. q_out: e4m3 [T, H, 128], last dim contiguous; strides in bytes (0: contiguous).
  uint8_t* q_out = nullptr;
  int64_t q_out_stride_token = 0;  // 0: H * 128
  int64_t q_out_stride_head = 0;   // 0: 128
  // w_out: fp32 [T, H], heads contiguous; row stride in elements (0: H).
  float* w_out = nullptr;
  int64_t w_out_stride = 0;
  Path path = Path::Auto;
  void* stream = nullptr;
};

// Throws sparsemla::Error for invalid shapes, strides or pointers, and (host memory: the CPU
// backend reads them first) for a position >= rope.rows, naming positions[i]; on the device, where
// the host never reads positions, such a row is written as a padding row (zeros). A row holding
// +-inf gets e = +inf: bytes of -448 (NaN -> -448, CONTRACT 2.3) and w = +-inf (NaN for w_raw = 0),
// so the indexer ranks it last (CONTRACT 11.4).
void indexer_q_prep(const IndexerQPrepParams& p);

}  // namespace sparsemla
