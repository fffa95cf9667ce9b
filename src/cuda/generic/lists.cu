// src/cuda/generic/lists.cu: the portable CUDA builders of the ragged index lists (CONTRACT 4.6).
//
// Same results as the CPU builders (src/cpu/lists.cpp): indptr[0..R] for every row, row r packed
// at indptr[r], padding rows (row_valid 0) of length 0 with none of their inputs read, indices past
// indptr[R] untouched. They write in place into the caller's buffers, so persistent graph buffers
// keep their base addresses; every launch goes on the caller's stream, nothing is allocated and
// nothing is read back, so a captured graph replays them with the new inputs.
//
// Three steps per call (two for most builders):
//   count   (top-k only) one block per row counts the row's local entries into indptr[r+1];
//   scan    one block computes every row length (or reads the staged count), scans them and writes
//           indptr[0..R];
//   fill    one block per row writes its entries at indptr[r].
// Device inputs are never validated by the host: a valid row whose request index is outside
// [0, num_requests) or whose position is negative (rejected by the CPU backend) gets length 0.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "cuda/common/decode_common.cuh"  // DeviceList, load_row_range: rows as the decode reads them
#include "cuda/common/decode_params.cuh"  // device_list
#include "cuda/common/device_info.h"
#include "cuda/generic/context_parallel_backend.h"
#include "cuda/generic/ops_backend.h"

namespace sparsemla::cuda_generic {

namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kScanThreads = 1024;
constexpr int kFillThreads = 256;
constexpr int32_t kInvalidSlot = -1;
constexpr int64_t kMaxGrid = std::numeric_limits<int32_t>::max();

int grid_for(int64_t items) {
  return static_cast<int>(items < 1 ? 1 : (items < kMaxGrid ? items : kMaxGrid));
}

// ---- shared pieces ------------------------------------------------------------------------------

struct RowsOut {
  int64_t num_rows;
  const uint8_t* row_valid;  // null: all valid
  int32_t* indices;
  int32_t* indptr;
  int64_t width;

  __device__ bool valid(int64_t r) const { return row_valid == nullptr || row_valid[r] != 0; }
};

RowsOut rows_out(const BuildCommon& c, const RaggedOut& out) {
  return RowsOut{c.num_rows, c.row_valid, out.indices, out.indptr, out.width};
}

// Request of row r (request_index[r], or r), -1 when outside [0, num_requests).
__device__ __forceinline__ int64_t request_of(const int32_t* request_index, int64_t num_requests,
                                              int64_t r) {
  const int64_t req = request_index != nullptr ? static_cast<int64_t>(request_index[r]) : r;
  return (req >= 0 && req < num_requests) ? req : -1;
}

// Local entry i (position or compressed index, >= 0) of request req -> global slot through a block
// table: table[req][i / bs] * bs + i % bs; -1 beyond the table row or outside int32.
struct TableMap {
  const int32_t* table;
  int64_t stride;
  int32_t width;
  int32_t block_size;
  int64_t num_requests;

  __device__ int32_t slot(int64_t req, int64_t i) const {
    const int64_t page = i / block_size;
    if (page >= width) return kInvalidSlot;
    const int64_t s =
        static_cast<int64_t>(table[req * stride + page]) * block_size + i % block_size;
    const bool fits =
        s >= std::numeric_limits<int32_t>::min() && s <= std::numeric_limits<int32_t>::max();
    return fits ? static_cast<int32_t>(s) : kInvalidSlot;
  }
};

TableMap table_map(const int32_t* table, int64_t stride, int32_t width, int32_t block_size,
                   int64_t num_requests) {
  return TableMap{table, stride, width, block_size, num_requests};
}

__device__ __forceinline__ int64_t clamp_length(int64_t len, int64_t width) {
  return len < 0 ? 0 : (len > width ? width : len);
}

// Inclusive sum over the block (blockDim.x == kScanThreads); *total gets the block's sum.
__device__ int32_t block_inclusive_scan(int32_t v, int32_t* total) {
  __shared__ int32_t warp_sums[kScanThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int32_t up = __shfl_up_sync(kFullMask, v, d);
    if (lane >= d) v += up;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int32_t w = warp_sums[lane];
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int32_t up = __shfl_up_sync(kFullMask, w, d);
      if (lane >= d) w += up;
    }
    warp_sums[lane] = w;  // inclusive prefix of the warp totals
  }
  __syncthreads();
  const int32_t result = v + (warp > 0 ? warp_sums[warp - 1] : 0);
  *total = warp_sums[kScanThreads / 32 - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return result;
}

// indptr[0] = 0, indptr[r+1] = sum of the lengths of rows 0..r (padding rows 0). One block.
template <typename Builder>
__global__ void __launch_bounds__(kScanThreads) scan_kernel(const RowsOut out, const Builder b) {
  int64_t carry = 0;
  if (threadIdx.x == 0) out.indptr[0] = 0;
  for (int64_t base = 0; base < out.num_rows; base += kScanThreads) {
    const int64_t r = base + threadIdx.x;
    const int32_t len =
        (r < out.num_rows && out.valid(r)) ? static_cast<int32_t>(b.length(out, r)) : 0;
    int32_t chunk_total = 0;
    const int32_t inclusive = block_inclusive_scan(len, &chunk_total);
    // <= R*W <= 2^31-1 (validated on the host), so the int32 store is exact.
    if (r < out.num_rows) out.indptr[r + 1] = static_cast<int32_t>(carry + inclusive);
    carry += chunk_total;
  }
}

// Row r's entries at indptr[r] (written by scan_kernel earlier on the same stream).
template <typename Builder>
__global__ void __launch_bounds__(kFillThreads) fill_kernel(const RowsOut out, const Builder b) {
  for (int64_t r = blockIdx.x; r < out.num_rows; r += gridDim.x) {
    const int64_t begin = out.indptr[r];
    const int64_t len = out.indptr[r + 1] - begin;
    if (len <= 0) continue;  // padding rows and empty rows: nothing read
    const typename Builder::Row row = b.row(r);
    int32_t* dst = out.indices + begin;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) dst[j] = b.entry(row, j);
  }
}

template <typename Builder>
void launch_scan_fill(const RowsOut& out, const Builder& b, cudaStream_t s, const char* op) {
  scan_kernel<Builder><<<1, kScanThreads, 0, s>>>(out, b);
  if (out.num_rows > 0)
    fill_kernel<Builder><<<grid_for(out.num_rows), kFillThreads, 0, s>>>(out, b);
  cuda::check_cuda(cudaGetLastError(), op);
}

// ---- the four builders --------------------------------------------------------------------------

// Dense [R, W] + lengths (per row, or per request through request_index).
struct DenseBuilder {
  const int32_t* dense;
  int64_t dense_stride;
  const int32_t* lengths;
  const int32_t* request_index;
  int64_t num_requests;
  int64_t num_slots;  // 0: no range check

  struct Row {
    const int32_t* src;
  };
  __device__ int64_t length(const RowsOut& out, int64_t r) const {
    int64_t idx = r;
    if (request_index != nullptr) {
      idx = request_of(request_index, num_requests, r);
      if (idx < 0) return 0;
    }
    return clamp_length(lengths[idx], out.width);
  }
  __device__ Row row(int64_t r) const { return Row{dense + r * dense_stride}; }
  __device__ int32_t entry(const Row& row, int64_t j) const {
    const int32_t v = row.src[j];
    const bool in_range = num_slots == 0 || (v >= 0 && v < num_slots);
    return in_range ? v : kInvalidSlot;
  }
};

// Window lists: the last min(pos+1, window) positions through the window block table.
struct WindowBuilder {
  const int64_t* positions;
  const int32_t* request_index;
  TableMap map;
  int64_t window;

  struct Row {
    int64_t req;
    int64_t start;
  };
  __device__ int64_t length(const RowsOut&, int64_t r) const {
    const int64_t pos = positions[r];
    if (pos < 0 || request_of(request_index, map.num_requests, r) < 0) return 0;
    return pos < window ? pos + 1 : window;  // min(pos + 1, window) without forming pos + 1
  }
  __device__ Row row(int64_t r) const {
    const int64_t pos = positions[r];
    const int64_t len = pos < window ? pos + 1 : window;
    return Row{request_of(request_index, map.num_requests, r), pos - len + 1};
  }
  __device__ int32_t entry(const Row& row, int64_t j) const {
    return map.slot(row.req, row.start + j);
  }
};

// Ratio-4 lists from the indexer's local top-k; the length is staged in indptr[r+1] by
// topk_count_kernel.
struct TopkBuilder {
  const int32_t* topk;
  int64_t topk_stride;
  const int32_t* topk_length;  // [num_requests] or null
  const int32_t* request_index;
  TableMap map;

  struct Row {
    int64_t req;
    const int32_t* src;
  };
  __device__ int64_t num_local() const { return static_cast<int64_t>(map.width) * map.block_size; }
  __device__ bool is_local(int32_t v) const { return v >= 0 && v < num_local(); }
  __device__ int64_t length(const RowsOut& out, int64_t r) const { return out.indptr[r + 1]; }
  __device__ Row row(int64_t r) const {
    return Row{request_of(request_index, map.num_requests, r), topk + r * topk_stride};
  }
  __device__ int32_t entry(const Row& row, int64_t j) const {
    const int32_t v = row.src[j];
    return is_local(v) ? map.slot(row.req, v) : kInvalidSlot;
  }
};

// len = number of local entries among the first `counted` of row r, staged in indptr[r+1].
__global__ void __launch_bounds__(kFillThreads)
    topk_count_kernel(const RowsOut out, const TopkBuilder b) {
  for (int64_t r = blockIdx.x; r < out.num_rows; r += gridDim.x) {
    if (!out.valid(r)) continue;  // the scan gives padding rows 0 without reading indptr[r+1]
    const int64_t req = request_of(b.request_index, b.map.num_requests, r);
    int64_t counted = 0;
    if (req >= 0) {
      counted = b.topk_length != nullptr ? clamp_length(b.topk_length[req], out.width) : out.width;
    }
    const int32_t* src = b.topk + r * b.topk_stride;
    int64_t count = 0;
    for (int64_t base = 0; base < counted; base += blockDim.x) {
      const int64_t j = base + threadIdx.x;
      count += __syncthreads_count(j < counted && b.is_local(src[j]));
    }
    if (threadIdx.x == 0) out.indptr[r + 1] = static_cast<int32_t>(count);  // <= W
    __syncthreads();
  }
}

// Ratio-128 lists: every complete compressed entry so far, capped at max_compressed.
struct CompressedAllBuilder {
  const int64_t* positions;
  const int32_t* request_index;
  TableMap map;
  int64_t ratio;
  int64_t max_compressed;

  struct Row {
    int64_t req;
  };
  __device__ int64_t length(const RowsOut&, int64_t r) const {
    const int64_t pos = positions[r];
    if (pos < 0 || request_of(request_index, map.num_requests, r) < 0) return 0;
    // (pos + 1) / ratio entries are complete, written without forming pos + 1, and capped
    // before the carry is added (pos = INT64_MAX with ratio 1 would overflow).
    const int64_t whole = pos / ratio;
    if (whole >= max_compressed) return max_compressed;
    const int64_t complete = whole + (pos % ratio == ratio - 1 ? 1 : 0);
    return complete < max_compressed ? complete : max_compressed;
  }
  __device__ Row row(int64_t r) const {
    return Row{request_of(request_index, map.num_requests, r)};
  }
  __device__ int32_t entry(const Row& row, int64_t i) const { return map.slot(row.req, i); }
};

// ---- list sharding (CONTRACT 12.2)
// --------------------------------------------------------------- Rank `rank`'s entries of each row
// of the unsharded list, as local slots, in their order. The row length (this rank's entries, at
// most out.width) is staged in indptr[r+1] by shard_count_kernel, scanned by scan_kernel, and
// shard_fill_kernel compacts the row at indptr[r] (a ballot per warp, the warps' counts through
// shared memory).
using cuda::DeviceList;
using cuda::load_row_range;
using cuda::RowRange;

struct ShardBuilder {
  DeviceList list;
  int32_t num_ranks, rank, interleave;
  int64_t num_slots;  // 0: no range check

  __device__ bool mine(int32_t v) const {
    return v >= 0 && (num_slots == 0 || v < num_slots) &&
           cp_rank_of_slot(v, num_ranks, interleave) == rank;
  }
  __device__ int64_t length(const RowsOut& out, int64_t r) const { return out.indptr[r + 1]; }
};

__global__ void __launch_bounds__(kFillThreads)
    shard_count_kernel(const RowsOut out, const ShardBuilder b) {
  for (int64_t r = blockIdx.x; r < out.num_rows; r += gridDim.x) {
    if (!out.valid(r)) continue;  // the scan gives padding rows 0 without reading indptr[r+1]
    const RowRange row = load_row_range(b.list, r);
    int64_t count = 0;
    for (int64_t base = 0; base < row.len; base += blockDim.x) {
      const int64_t j = base + threadIdx.x;
      count += __syncthreads_count(j < row.len && b.mine(b.list.indices[row.begin + j]));
    }
    if (threadIdx.x == 0)
      out.indptr[r + 1] = static_cast<int32_t>(count < out.width ? count : out.width);
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kFillThreads)
    shard_fill_kernel(const RowsOut out, const ShardBuilder b) {
  __shared__ int32_t warp_counts[kFillThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t r = blockIdx.x; r < out.num_rows; r += gridDim.x) {
    const int64_t begin = out.indptr[r];
    const int64_t len = out.indptr[r + 1] - begin;
    if (len <= 0) continue;  // padding rows and empty rows: nothing read
    const RowRange row = load_row_range(b.list, r);
    int32_t* dst = out.indices + begin;
    int64_t written = 0;  // the same in every thread
    for (int64_t base = 0; base < row.len && written < len; base += blockDim.x) {
      const int64_t j = base + threadIdx.x;
      const int32_t v = j < row.len ? b.list.indices[row.begin + j] : -1;
      const bool flag = j < row.len && b.mine(v);
      const unsigned ballot = __ballot_sync(kFullMask, flag);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int32_t before = 0, total = 0;
      for (int w = 0; w < kFillThreads / 32; ++w) {
        before += w < warp ? warp_counts[w] : 0;
        total += warp_counts[w];
      }
      const int64_t at = written + before + __popc(ballot & ((1u << lane) - 1u));
      if (flag && at < len) {
        dst[at] = static_cast<int32_t>(cp_local_slot(v, b.num_ranks, b.interleave));
      }
      written += total;
      __syncthreads();  // warp_counts is rewritten by the next chunk
    }
  }
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

}  // namespace

void build_ragged_from_dense(const DenseToRaggedParams& p) {
  const DenseBuilder b{p.dense,         p.dense_stride, p.lengths,
                       p.request_index, p.num_requests, p.num_slots};
  launch_scan_fill(rows_out(p.common, p.out), b, as_stream(p.common.stream),
                   "build_ragged_from_dense launch");
}

void build_window_lists(const WindowListParams& p) {
  const WindowBuilder b{
      p.positions, p.request_index,
      table_map(p.block_table, p.block_table_stride, p.table_width, p.block_size, p.num_requests),
      p.window};
  launch_scan_fill(rows_out(p.common, p.out), b, as_stream(p.common.stream),
                   "build_window_lists launch");
}

void build_topk_lists(const TopkListParams& p) {
  const TopkBuilder b{
      p.topk, p.topk_stride, p.topk_length, p.request_index,
      table_map(p.block_table, p.block_table_stride, p.table_width, p.block_size, p.num_requests)};
  const RowsOut out = rows_out(p.common, p.out);
  const cudaStream_t s = as_stream(p.common.stream);
  if (out.num_rows > 0) topk_count_kernel<<<grid_for(out.num_rows), kFillThreads, 0, s>>>(out, b);
  launch_scan_fill(out, b, s, "build_topk_lists launch");
}

void build_compressed_all_lists(const CompressedAllListParams& p) {
  const CompressedAllBuilder b{
      p.positions, p.request_index,
      table_map(p.block_table, p.block_table_stride, p.table_width, p.block_size, p.num_requests),
      p.ratio, p.max_compressed};
  launch_scan_fill(rows_out(p.common, p.out), b, as_stream(p.common.stream),
                   "build_compressed_all_lists launch");
}

void shard_list(const ShardListParams& p) {
  const ShardBuilder b{cuda::device_list(p.list), p.num_ranks, p.rank, p.interleave, p.num_slots};
  const RowsOut out = rows_out(p.common, p.out);
  const cudaStream_t s = as_stream(p.common.stream);
  if (out.num_rows > 0) shard_count_kernel<<<grid_for(out.num_rows), kFillThreads, 0, s>>>(out, b);
  scan_kernel<ShardBuilder><<<1, kScanThreads, 0, s>>>(out, b);
  if (out.num_rows > 0) shard_fill_kernel<<<grid_for(out.num_rows), kFillThreads, 0, s>>>(out, b);
  cuda::check_cuda(cudaGetLastError(), "shard_list launch");
}

}  // namespace sparsemla::cuda_generic
