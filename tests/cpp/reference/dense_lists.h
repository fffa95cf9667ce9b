// tests/cpp/reference/dense_lists.h: FlashMLA-style dense index lists (CONTRACT 4.6 "Dense lists")
// for the CPU and GPU tests, and the ragged list the library's builder makes from each one. The
// decode must give the same bits for both forms (the builder itself is checked against an
// independent reference in test_lists.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "reference/random.h"
#include "sparsemla/lists.h"

namespace sparsemla::test {

// How a dense list gives its row lengths.
enum class DenseLengths {
  None,        // no lengths: every row is W long (FlashMLA's -1 padding marks the end)
  PerRow,      // lengths [T]
  PerRequest,  // lengths [b], row t uses lengths[t / rows_per_length] (topk_length, s_q > 1)
};

struct DenseList {
  std::vector<int32_t> indices;  // [T, stride]
  std::vector<int32_t> lengths;  // [T], [b] or empty
  int64_t width = 0;
  int64_t stride = 0;
  int32_t rows_per_length = 1;

  IndexList view(const int32_t* idx, const int32_t* len) const {
    IndexList l;
    l.indices = idx;
    l.capacity = static_cast<int64_t>(indices.size());
    l.width = width;
    l.dense_stride = stride;
    l.lengths = lengths.empty() ? nullptr : len;
    l.rows_per_length = rows_per_length;
    return l;
  }
  IndexList host_view() const { return view(indices.data(), lengths.data()); }
};

// T rows of W entries at a row stride of W + 5 (the gap filled with valid slots that must never
// be read). Inside each row's length: valid slots, -1, negative and >= num_slots entries; past it
// (lengths given): valid slots, which the decode must ignore, else -1 padding. Lengths include
// values below 0 and above W (clamped).
inline DenseList make_dense_list(Rng& rng, int64_t T, int64_t W, int64_t num_slots,
                                 DenseLengths form, int32_t rows_per_length = 2) {
  DenseList d;
  d.width = W;
  d.stride = W + 5;
  d.rows_per_length = form == DenseLengths::PerRequest ? rows_per_length : 1;
  const int64_t n_len =
      form == DenseLengths::None ? 0 : (T + d.rows_per_length - 1) / d.rows_per_length;
  for (int64_t i = 0; i < n_len; ++i) {
    const int64_t pick = rng.randint(0, 9);
    int64_t len = rng.randint(0, W);
    if (pick == 0) len = -rng.randint(1, 5);
    if (pick == 1) len = W + rng.randint(1, 40);
    if (pick == 2) len = W;
    d.lengths.push_back(static_cast<int32_t>(len));
  }
  const auto slot = [&] { return static_cast<int32_t>(rng.randint(0, num_slots - 1)); };
  d.indices.assign(static_cast<size_t>(T * d.stride), 0);
  for (int64_t t = 0; t < T; ++t) {
    int64_t len = W;
    if (form == DenseLengths::None) len = rng.randint(0, W);  // then -1 padding
    if (n_len > 0) len = std::clamp<int64_t>(d.lengths[t / d.rows_per_length], 0, W);
    for (int64_t j = 0; j < d.stride; ++j) {
      int32_t v = slot();
      if (j < len) {
        const double u = rng.uniform(0.0, 1.0);
        if (u < 0.04)
          v = -1;
        else if (u < 0.06)
          v = static_cast<int32_t>(num_slots + rng.randint(0, 1000));
        else if (u < 0.07)
          v = static_cast<int32_t>(-rng.randint(2, 1000));
      } else if (j < W && form == DenseLengths::None) {
        v = -1;
      }
      d.indices[t * d.stride + j] = v;
    }
  }
  return d;
}

// The ragged list build_ragged_from_dense (CPU) makes from a dense one: capacity T * W.
struct BuiltRagged {
  std::vector<int32_t> indices, indptr;
  int64_t width = 0;
  IndexList view(const int32_t* idx, const int32_t* ptr) const {
    IndexList l;
    l.indices = idx;
    l.indptr = ptr;
    l.capacity = static_cast<int64_t>(indices.size());
    l.width = width;
    return l;
  }
  IndexList host_view() const { return view(indices.data(), indptr.data()); }
};

inline BuiltRagged ragged_from_dense(const DenseList& d, int64_t T, int64_t num_slots) {
  BuiltRagged r;
  r.width = d.width;
  r.indices.assign(static_cast<size_t>(T * d.width), 0);
  r.indptr.assign(static_cast<size_t>(T + 1), 0);
  std::vector<int32_t> lengths = d.lengths, request(static_cast<size_t>(T));
  if (lengths.empty()) lengths.assign(static_cast<size_t>(T), static_cast<int32_t>(d.width));
  for (int64_t t = 0; t < T; ++t) request[t] = static_cast<int32_t>(t / d.rows_per_length);
  DenseToRaggedParams p;
  p.common.num_rows = T;
  p.common.path = Path::Cpu;
  p.dense = d.indices.data();
  p.dense_stride = d.stride;
  p.lengths = lengths.data();
  p.request_index = request.data();
  p.num_requests = static_cast<int64_t>(lengths.size());
  p.num_slots = num_slots;
  p.out = {r.indices.data(), r.indptr.data(), d.width};
  build_ragged_from_dense(p);
  return r;
}

}  // namespace sparsemla::test
