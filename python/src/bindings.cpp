// python/src/bindings.cpp: the nanobind extension `sparsemla._C`.
//
// Thin on purpose: every function takes arrays through DLPack (nb::ndarray: numpy arrays, torch
// tensors, anything with __dlpack__), checks dtype, shape, layout and device with an error that
// names the argument, fills the library's params struct with the arrays' own pointers and strides
// (zero copy) and calls the public C++ API, which validates again and picks the backend (host
// pointers: CPU; device pointers: CUDA, on the stream passed in as an integer). Outputs are
// allocated by the Python layer (python/sparsemla/_ops.py), never here, except the decode
// workspace, which is requested through a Python callback once the split count is known.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sparsemla/sparsemla.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace sparsemla::py {
namespace {

using In = nb::ndarray<nb::ro>;  // read-only view; writable arrays are accepted too
using Out = nb::ndarray<>;       // written in place

// ---- dtypes ------------------------------------------------------------------------------------
enum class Kind { U8, I32, I64, F32, F64, Bf16, AnyBytes };
using Code = nb::dlpack::dtype_code;
struct KindInfo {
  const char* name;
  Code code;
  int bits;
};
constexpr KindInfo kKinds[] = {
    {"uint8", Code::UInt, 8},        {"int32", Code::Int, 32},     {"int64", Code::Int, 64},
    {"float32", Code::Float, 32},    {"float64", Code::Float, 64},
    {"bf16 (torch.bfloat16, or uint16 holding raw bf16 bits)", Code::Bfloat, 16},
    {"any (contiguous bytes)", Code::UInt, 0}};

const char* kind_name(Kind k) { return kKinds[static_cast<int>(k)].name; }

bool dtype_is(nb::dlpack::dtype d, Kind k) {
  const KindInfo& want = kKinds[static_cast<int>(k)];
  const auto code = static_cast<Code>(d.code);
  if (d.lanes != 1) return false;
  if (k == Kind::AnyBytes) return d.bits % 8 == 0;
  if (k == Kind::Bf16 && code == Code::UInt && d.bits == 16) return true;  // raw bf16 bits
  return code == want.code && d.bits == want.bits;
}

std::string dtype_text(nb::dlpack::dtype d) {
  const auto code = static_cast<Code>(d.code);
  if (code == Code::Bool) return "bool";
  const char* name = code == Code::Int     ? "int"
                     : code == Code::UInt  ? "uint"
                     : code == Code::Float ? "float"
                     : code == Code::Bfloat ? "bfloat"
                                           : nullptr;
  const std::string base = name ? name : "dtype-code-" + std::to_string(d.code) + "-";
  return base + std::to_string(d.bits) + (d.lanes != 1 ? "x" + std::to_string(d.lanes) : "");
}

template <class A>
std::string shape_text(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

template <class T, class A>
T* ptr(const A& a) {
  return reinterpret_cast<T*>(const_cast<void*>(static_cast<const void*>(a.data())));
}

// ---- one call's argument checks ----------------------------------------------------------------
// Collects the device side of every array (all host, or all on one CUDA device) and throws
// sparsemla::Error (Python: sparsemla.Error, a ValueError) naming the op and the argument.
class Call {
 public:
  explicit Call(const char* op) : op_(op) {}

  [[noreturn]] void fail(const std::string& arg, const std::string& expected,
                         const std::string& got) const {
    throw_arg_error(op_.c_str(), arg, expected, got);
  }

  // dtype, rank (ndim < 0: any) and device of a present array.
  template <class A>
  void check(const std::string& name, const A& a, Kind kind, int ndim) {
    if (!a.is_valid()) fail(name, "an array", "None");
    if (!dtype_is(a.dtype(), kind)) {
      fail(name, std::string("dtype ") + kind_name(kind), dtype_text(a.dtype()));
    }
    if (ndim >= 0 && static_cast<int>(a.ndim()) != ndim) {
      fail(name, std::to_string(ndim) + "-D array",
           std::to_string(a.ndim()) + "-D, shape " + shape_text(a));
    }
    note_device(name, a);
  }
  template <class A>
  void dim(const std::string& name, const A& a, int axis, int64_t expected,
           const std::string& what) {
    if (static_cast<int64_t>(a.shape(axis)) != expected) {
      fail(name,
           "shape[" + std::to_string(axis) + "] == " + what + " = " + std::to_string(expected),
           "shape " + shape_text(a));
    }
  }
  template <class A>
  void min_dim(const std::string& name, const A& a, int axis, int64_t minimum,
               const std::string& what) {
    if (static_cast<int64_t>(a.shape(axis)) < minimum) {
      fail(name, "shape[" + std::to_string(axis) + "] >= " + what + " = " + std::to_string(minimum),
           "shape " + shape_text(a));
    }
  }
  // The last axis has unit stride (rows may be strided).
  template <class A>
  void last_contiguous(const std::string& name, const A& a) {
    if (a.size() == 0) return;  // empty: strides are meaningless
    const size_t n = a.ndim();
    if (n > 0 && a.shape(n - 1) > 1 && a.stride(n - 1) != 1) {
      fail(name, "a unit-stride last dimension", "stride " + std::to_string(a.stride(n - 1)));
    }
  }
  // Axes [from, ndim) form one dense C-ordered block (size-1 axes ignored).
  template <class A>
  void contiguous_from(const std::string& name, const A& a, size_t from) {
    for (size_t i = 0; i < a.ndim(); ++i) {
      if (a.shape(i) == 0) return;  // empty: no element is addressed
    }
    int64_t expected = 1;
    for (size_t i = a.ndim(); i-- > from;) {
      if (a.shape(i) == 1) continue;
      if (a.stride(i) != expected) {
        fail(name,
             "C-contiguous " + std::string(from ? "rows (dimensions after the first)" : "data"),
             "shape " + shape_text(a) + " with stride[" + std::to_string(i) +
                 "] = " + std::to_string(a.stride(i)));
      }
      expected *= static_cast<int64_t>(a.shape(i));
    }
  }
  // A contiguous 1-D vector of n elements (n < 0: any length); returns its length.
  template <class A>
  int64_t vec(const std::string& name, const A& a, Kind kind, int64_t n, const std::string& what) {
    check(name, a, kind, 1);
    if (n >= 0) dim(name, a, 0, n, what);
    contiguous_from(name, a, 0);
    return static_cast<int64_t>(a.shape(0));
  }
  // Optional vector: null when None.
  template <class T, class A>
  T* opt_vec(const std::string& name, const A& a, Kind kind, int64_t n, const std::string& what) {
    if (!a.is_valid()) return nullptr;
    vec(name, a, kind, n, what);
    return ptr<T>(a);
  }
  // Stride of axis i, or 0 ("the default") for an axis of extent <= 1, where it is never used.
  template <class A>
  static int64_t stride_or_default(const A& a, size_t i) {
    return a.shape(i) <= 1 ? 0 : a.stride(i);
  }
  template <class A>
  void positive_strides(const std::string& name, const A& a) {
    if (a.size() == 0) return;
    for (size_t i = 0; i < a.ndim(); ++i) {
      if (a.shape(i) > 1 && a.stride(i) <= 0) {
        fail(name, "positive strides",
             "stride[" + std::to_string(i) + "] = " + std::to_string(a.stride(i)));
      }
    }
  }

  bool on_device() const { return side_ == 1; }
  const char* op() const { return op_.c_str(); }

 private:
  template <class A>
  void note_device(const std::string& name, const A& a) {
    const int type = a.device_type();
    const bool device = type == nb::device::cuda::value || type == nb::device::cuda_managed::value;
    const bool host = type == nb::device::cpu::value || type == nb::device::cuda_host::value;
    if (!device && !host)
      fail(name, "a CPU or CUDA array", "DLPack device type " + std::to_string(type));
    const int side = device ? 1 : 0;
    const int id = device ? a.device_id() : -1;
    if (side_ < 0) {
      side_ = side;
      device_id_ = id;
      first_ = name;
      return;
    }
    if (side != side_ || id != device_id_) {
      fail(name,
           "an array on the same device as '" + first_ + "' (" + where(side_, device_id_) + ")",
           where(side, id));
    }
  }
  static std::string where(int side, int id) {
    return side == 1 ? "CUDA device " + std::to_string(id) : "host memory";
  }

  std::string op_;
  int side_ = -1;
  int device_id_ = -1;
  std::string first_;
};

Path path_of(const std::string& name) {
  return parse_path(name);
}
void* stream_of(uintptr_t stream) {
  return reinterpret_cast<void*>(stream);
}

IndexerLayout layout_of(Call& c, const std::string& name) {
  if (name == "normal") return IndexerLayout::Normal;
  if (name == "shuffle") return IndexerLayout::Shuffle;
  c.fail("layout", "'normal' or 'shuffle'", "'" + name + "'");
}

// ---- views of caches and tables -----------------------------------------------------------------
// A paged cache: uint8, first axis = pages (page stride = stride(0) bytes), the other axes one
// dense C-ordered page of >= block_size * bytes_per_token bytes (e.g. FlashMLA's
// [num_blocks, bs, 1, 584], vLLM's [num_blocks, bs, 584], or [num_blocks, padded_page_bytes]).
// block_size <= 0: taken from shape[1] of a >= 3-D array.
struct Paged {
  uint8_t* base;
  int64_t num_blocks;
  int32_t block_size;
  int64_t block_stride;
};
// The argument that holds a cache's page size: main_cache -> main_block_size, cache -> block_size.
std::string block_size_arg(const std::string& cache) {
  const std::string suffix = "_cache";
  const bool prefixed = cache.size() > suffix.size() &&
                        cache.compare(cache.size() - suffix.size(), suffix.size(), suffix) == 0;
  return prefixed ? cache.substr(0, cache.size() - suffix.size()) + "_block_size" : "block_size";
}

template <class A>
Paged paged(Call& c, const std::string& name, const A& a, int64_t block_size, int bytes_per_token) {
  const std::string bs_arg = block_size_arg(name);
  c.check(name, a, Kind::U8, -1);
  if (a.ndim() < 2) {
    c.fail(name, "a paged cache [num_blocks, ...] with >= 2 dimensions", "shape " + shape_text(a));
  }
  c.contiguous_from(name, a, 1);
  int64_t page = 1;
  for (size_t i = 1; i < a.ndim(); ++i) page *= static_cast<int64_t>(a.shape(i));
  // [num_blocks, bs, 584] and [num_blocks, bs, 1, 584] name their page size: shape[1]. An
  // explicit block_size that differs would read every page with the wrong row layout.
  const bool rows_of_tokens = a.ndim() >= 3 && page == int64_t(a.shape(1)) * bytes_per_token;
  if (block_size > 0 && rows_of_tokens && block_size != int64_t(a.shape(1))) {
    c.fail(bs_arg,
           "None or shape[1] = " + std::to_string(a.shape(1)) + " of a cache [num_blocks, " +
               "block_size, ..., " + std::to_string(bytes_per_token) + "]",
           std::to_string(block_size));
  }
  if (block_size <= 0) {
    if (a.ndim() < 3) {
      c.fail(bs_arg, "an explicit block_size for a 2-D cache [num_blocks, page_bytes]", "none");
    }
    block_size = static_cast<int64_t>(a.shape(1));
  }
  if (block_size > INT32_MAX) c.fail(bs_arg, "<= 2^31-1", std::to_string(block_size));
  const int64_t need = block_size * bytes_per_token;
  if (page < need) {
    c.fail(name,
           "pages of >= block_size*" + std::to_string(bytes_per_token) + " = " +
               std::to_string(need) + " bytes (dimensions after the first)",
           std::to_string(page) + " bytes, shape " + shape_text(a));
  }
  const int64_t nb = static_cast<int64_t>(a.shape(0));
  int64_t stride = nb <= 1 ? page : a.stride(0);
  if (stride < page) {
    c.fail(name, "a page stride (stride[0]) >= the page size " + std::to_string(page),
           std::to_string(stride));
  }
  return {ptr<uint8_t>(a), nb, static_cast<int32_t>(block_size), stride};
}

template <class A>
CacheView mla_cache(Call& c, const std::string& name, const A& a, int64_t block_size) {
  const Paged p = paged(c, name, a, block_size, Fp8DsMla::kBytesPerToken);
  return {p.base, p.num_blocks, p.block_size, p.block_stride};
}
MutableCacheView mla_cache_mut(Call& c, const std::string& name, const Out& a, int64_t block_size) {
  const Paged p = paged(c, name, a, block_size, Fp8DsMla::kBytesPerToken);
  return {p.base, p.num_blocks, p.block_size, p.block_stride};
}
template <class A>
IndexerCacheView indexer_cache(Call& c, const std::string& name, const A& a, int64_t block_size,
                               const std::string& layout) {
  const Paged p = paged(c, name, a, block_size, IndexerFp8::kBytesPerToken);
  return {p.base, p.num_blocks, p.block_size, p.block_stride, layout_of(c, layout)};
}

// RoPE table fp32 [P, >= 64], rows strided.
RopeTable rope_table(Call& c, const std::string& name, const In& a) {
  c.check(name, a, Kind::F32, 2);
  c.min_dim(name, a, 1, 64, "64 (cos x32 | sin x32)");
  c.last_contiguous(name, a);
  c.positive_strides(name, a);
  return {ptr<const float>(a), static_cast<int64_t>(a.shape(0)),
          a.shape(0) <= 1 ? 64 : a.stride(0)};
}

// Compressor state fp32 [num_blocks, state_bs, >= 2W], last axis contiguous.
// row_width = 2W, the elements of a row the operation reads or writes.
StateCacheView state_cache(Call& c, const std::string& name, const Out& a, int64_t row_width) {
  c.check(name, a, Kind::F32, 3);
  c.min_dim(name, a, 2, row_width, "2W (kv | score)");
  c.last_contiguous(name, a);
  c.positive_strides(name, a);
  StateCacheView s;
  s.base = ptr<float>(a);
  s.num_blocks = static_cast<int64_t>(a.shape(0));
  s.block_size = static_cast<int32_t>(a.shape(1));
  s.row_stride = a.shape(1) <= 1 ? static_cast<int64_t>(a.shape(2)) : a.stride(1);
  s.block_stride = a.shape(0) <= 1 ? s.row_stride * s.block_size : a.stride(0);
  return s;
}

// int32 [rows, width] table, rows strided.
struct Table {
  const int32_t* data;
  int64_t rows;
  int32_t width;
  int64_t stride;
};
Table table(Call& c, const std::string& name, const In& a) {
  c.check(name, a, Kind::I32, 2);
  c.last_contiguous(name, a);
  c.positive_strides(name, a);
  const int64_t w = static_cast<int64_t>(a.shape(1));
  return {ptr<const int32_t>(a), static_cast<int64_t>(a.shape(0)), static_cast<int32_t>(w),
          a.shape(0) <= 1 ? w : a.stride(0)};
}

// The block table of a list builder (window, ratio-4 and ratio-128 lists alike), stored into its
// params: data, row stride, width and request count.
template <class BuilderParams>
Table list_table(Call& c, const In& block_table, BuilderParams& p) {
  const Table t = table(c, "block_table", block_table);
  p.block_table = t.data;
  p.block_table_stride = t.stride;
  p.table_width = t.width;
  p.num_requests = t.rows;
  return t;
}

// A [N, width] row matrix with strided rows; returns the row stride in elements.
template <class A>
int64_t rows(Call& c, const std::string& name, const A& a, Kind kind, int64_t n, int64_t width,
             const std::string& what) {
  c.check(name, a, kind, 2);
  c.dim(name, a, 0, n, what);
  if (width >= 0) c.dim(name, a, 1, width, std::to_string(width));
  c.last_contiguous(name, a);
  c.positive_strides(name, a);
  return a.shape(0) <= 1 ? static_cast<int64_t>(a.shape(1)) : a.stride(0);
}

// A bf16 [T, H, 512] operand (q, out, x): last axis contiguous, positive strides; T, H < 0: any.
template <class A>
void heads(Call& c, const std::string& name, const A& a, int64_t T = -1, int64_t H = -1) {
  c.check(name, a, Kind::Bf16, 3);
  c.last_contiguous(name, a);
  c.positive_strides(name, a);
  if (T >= 0) c.dim(name, a, 0, T, "T (q.shape[0])");
  if (H >= 0) c.dim(name, a, 1, H, "H (q.shape[1])");
  c.dim(name, a, 2, Fp8DsMla::kHeadDim, "512");
}

// ---- quantiser and row dequantisers (CPU) -------------------------------------------------------
void py_quantize(const In& x, const Out& bytes, const Out& codes, int64_t block, int code_max) {
  Call c("quantize");
  c.check("x", x, Kind::Bf16, 2);
  c.contiguous_from("x", x, 0);
  const int64_t n = static_cast<int64_t>(x.shape(0)), d = static_cast<int64_t>(x.shape(1));
  if (block < 1 || d % block != 0) {
    c.fail("block", "a divisor of x.shape[1] = " + std::to_string(d), std::to_string(block));
  }
  if (code_max != kCodeMaxLegacy && code_max != kCodeMaxSanitising) {
    c.fail("code_max", "254 (sanitising) or 255 (legacy)", std::to_string(code_max));
  }
  rows(c, "out_bytes", bytes, Kind::U8, n, d, "x.shape[0]");
  c.contiguous_from("out_bytes", bytes, 0);
  rows(c, "out_codes", codes, Kind::U8, n, d / block, "x.shape[0]");
  c.contiguous_from("out_codes", codes, 0);
  if (c.on_device())
    c.fail("x", "host arrays (the standalone quantiser runs on the CPU)", "CUDA arrays");
  const bf16_bits* in = ptr<const bf16_bits>(x);
  uint8_t* b = ptr<uint8_t>(bytes);
  uint8_t* k = ptr<uint8_t>(codes);
  nb::gil_scoped_release release;
  std::vector<float> tile(static_cast<size_t>(block));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t t = 0; t < d / block; ++t) {
      const int64_t o = r * d + t * block;
      for (int64_t i = 0; i < block; ++i) tile[i] = bf16_to_float(in[o + i]);
      const int e = quantize_block(tile.data(), static_cast<int>(block), b + o);
      k[r * (d / block) + t] = quant_code(e, code_max);
    }
  }
}

void py_quantize_indexer(const In& x, const Out& bytes, const Out& scale) {
  Call c("quantize_indexer");
  c.check("x", x, Kind::Bf16, 2);
  c.contiguous_from("x", x, 0);
  c.dim("x", x, 1, IndexerFp8::kHeadDim, "128");
  const int64_t n = static_cast<int64_t>(x.shape(0));
  rows(c, "out_bytes", bytes, Kind::U8, n, IndexerFp8::kHeadDim, "x.shape[0]");
  c.contiguous_from("out_bytes", bytes, 0);
  c.vec("out_scale", scale, Kind::F32, n, "x.shape[0]");
  if (c.on_device())
    c.fail("x", "host arrays (the standalone quantiser runs on the CPU)", "CUDA arrays");
  const bf16_bits* in = ptr<const bf16_bits>(x);
  uint8_t* b = ptr<uint8_t>(bytes);
  float* s = ptr<float>(scale);
  nb::gil_scoped_release release;
  float row[IndexerFp8::kHeadDim];
  for (int64_t r = 0; r < n; ++r) {
    for (int i = 0; i < IndexerFp8::kHeadDim; ++i) row[i] = bf16_to_float(in[r * 128 + i]);
    s[r] = indexer_scale_of_exponent(quantize_block(row, IndexerFp8::kHeadDim, b + r * 128));
  }
}

// Decodes the rows of `slots` into out fp32 [N, width] (CPU): row(slot, out_row) each.
template <class Row>
void decode_rows(Call& c, const In& slots, const Out& out, int64_t width, Row row) {
  const int64_t n = c.vec("slots", slots, Kind::I64, -1, "");
  rows(c, "out", out, Kind::F32, n, width, "slots.shape[0]");
  c.contiguous_from("out", out, 0);
  if (c.on_device())
    c.fail("cache", "host arrays (the row decoder runs on the CPU)", "CUDA arrays");
  const int64_t* s = ptr<const int64_t>(slots);
  float* o = ptr<float>(out);
  nb::gil_scoped_release release;
  for (int64_t i = 0; i < n; ++i) row(s[i], o + i * width);
}

void py_dequantize_rows(const In& cache, int64_t block_size, const In& slots, bool scrub,
                        const Out& out) {
  Call c("dequantize_rows");
  const CacheView view = mla_cache(c, "cache", cache, block_size);
  decode_rows(c, slots, out, Fp8DsMla::kHeadDim,
              [&](int64_t s, float* o) { dequantize_row(view, s, scrub, o); });
}

void py_dequantize_indexer_rows(const In& cache, int64_t block_size, const std::string& layout,
                                const In& slots, const Out& out) {
  Call c("dequantize_indexer_rows");
  const IndexerCacheView view = indexer_cache(c, "cache", cache, block_size, layout);
  decode_rows(c, slots, out, IndexerFp8::kHeadDim,
              [&](int64_t s, float* o) { dequantize_indexer_row(view, s, o); });
}

// ---- writers -----------------------------------------------------------------------------------
void py_write_window(const In& kv, const In& positions, const In& slots, const In& rope,
                     const Out& cache, int64_t block_size, bool sanitise, const std::string& path,
                     uintptr_t stream) {
  Call c("write_window");
  WindowWriterParams p;
  p.cache = mla_cache_mut(c, "cache", cache, block_size);
  c.check("kv", kv, Kind::Bf16, 2);
  p.num_tokens = static_cast<int64_t>(kv.shape(0));
  p.kv_stride = rows(c, "kv", kv, Kind::Bf16, p.num_tokens, Fp8DsMla::kHeadDim, "N");
  p.kv = ptr<const bf16_bits>(kv);
  p.positions = ptr<const int64_t>(positions);
  c.vec("positions", positions, Kind::I64, p.num_tokens, "kv.shape[0]");
  c.vec("slots", slots, Kind::I64, p.num_tokens, "kv.shape[0]");
  p.slots = ptr<const int64_t>(slots);
  p.rope = rope_table(c, "rope", rope);
  p.sanitise = sanitise;
  p.path = path_of(path);
  p.stream = stream_of(stream);
  nb::gil_scoped_release release;
  write_window(p);
}

void py_write_compressor_state(const In& kv, const In& score, const In& ape, const In& positions,
                               const In& state_slots, const Out& state, int32_t ratio,
                               int32_t head_dim, const std::string& path, uintptr_t stream) {
  Call c("write_compressor_state");
  StateWriterParams p;
  p.ratio = ratio;
  p.head_dim = head_dim;
  const int64_t w = (ratio == 4 ? 2 : 1) * static_cast<int64_t>(head_dim);
  p.state = state_cache(c, "state", state, 2 * w);
  c.check("kv", kv, Kind::F32, 2);
  p.num_tokens = static_cast<int64_t>(kv.shape(0));
  const std::string width = "W = " + std::to_string(w) + " (coff*head_dim)";
  if (static_cast<int64_t>(kv.shape(1)) != w)
    c.fail("kv", "shape[1] == " + width, "shape " + shape_text(kv));
  p.kv_stride = rows(c, "kv", kv, Kind::F32, p.num_tokens, w, "N");
  p.kv = ptr<const float>(kv);
  p.score_stride = rows(c, "score", score, Kind::F32, p.num_tokens, w, "kv.shape[0]");
  p.score = ptr<const float>(score);
  if (ape.is_valid()) {
    rows(c, "ape", ape, Kind::F32, ratio, w, "ratio");
    c.contiguous_from("ape", ape, 0);
    p.ape = ptr<const float>(ape);
  }
  c.vec("positions", positions, Kind::I64, p.num_tokens, "kv.shape[0]");
  p.positions = ptr<const int64_t>(positions);
  c.vec("state_slots", state_slots, Kind::I64, p.num_tokens, "kv.shape[0]");
  p.state_slots = ptr<const int64_t>(state_slots);
  p.path = path_of(path);
  p.stream = stream_of(stream);
  nb::gil_scoped_release release;
  write_compressor_state(p);
}

// Fields the KV and the indexer compressor share.
template <class P>
void compressor_common(Call& c, P& p, const In& positions, const In& request_index,
                       const In& state_slots, const In& out_slots, const In& state_block_table,
                       const Out& state, int64_t state_row, const In& norm_weight, int64_t head_dim,
                       const In& rope, float norm_eps, bool sanitise, const Out& scratch,
                       const std::string& path, uintptr_t stream) {
  p.state = state_cache(c, "state", state, state_row);
  p.num_tokens = c.vec("positions", positions, Kind::I64, -1, "");
  p.positions = ptr<const int64_t>(positions);
  c.vec("request_index", request_index, Kind::I32, p.num_tokens, "positions.shape[0]");
  p.request_index = ptr<const int32_t>(request_index);
  c.vec("state_slots", state_slots, Kind::I64, p.num_tokens, "positions.shape[0]");
  p.state_slots = ptr<const int64_t>(state_slots);
  c.vec("out_slots", out_slots, Kind::I64, p.num_tokens, "positions.shape[0]");
  p.out_slots = ptr<const int64_t>(out_slots);
  const Table t = table(c, "state_block_table", state_block_table);
  p.state_block_table = t.data;
  p.state_table_stride = t.stride;
  p.state_table_width = t.width;
  p.num_requests = t.rows;
  c.vec("norm_weight", norm_weight, Kind::F32, head_dim, std::to_string(head_dim));
  p.norm_weight = ptr<const float>(norm_weight);
  p.norm_eps = norm_eps;
  p.rope = rope_table(c, "rope", rope);
  p.sanitise = sanitise;
  if (scratch.is_valid()) {
    rows(c, "scratch", scratch, Kind::F32, p.num_tokens, head_dim, "positions.shape[0]");
    c.contiguous_from("scratch", scratch, 0);
    p.scratch = ptr<float>(scratch);
  }
  p.path = path_of(path);
  p.stream = stream_of(stream);
}

void py_compress(const In& positions, const In& request_index, const In& state_slots,
                 const In& out_slots, const In& state_block_table, const Out& state,
                 const In& norm_weight, const In& rope, const Out& cache, int64_t block_size,
                 int32_t ratio, float norm_eps, bool sanitise, const Out& scratch,
                 const std::string& path, uintptr_t stream) {
  Call c("compress");
  CompressorParams p;
  p.cache = mla_cache_mut(c, "cache", cache, block_size);
  p.ratio = ratio;
  compressor_common(c, p, positions, request_index, state_slots, out_slots, state_block_table,
                    state, 2 * (ratio == 4 ? 2 : 1) * Fp8DsMla::kHeadDim, norm_weight,
                    Fp8DsMla::kHeadDim, rope, norm_eps, sanitise, scratch, path, stream);
  nb::gil_scoped_release release;
  compress(p);
}

void py_compress_indexer(const In& positions, const In& request_index, const In& state_slots,
                         const In& out_slots, const In& state_block_table, const Out& state,
                         const In& norm_weight, const In& rope, const Out& cache,
                         int64_t block_size, float norm_eps, bool sanitise, const Out& scratch,
                         const std::string& path, uintptr_t stream) {
  Call c("compress_indexer");
  IndexerCompressorParams p;
  const Paged pg = paged(c, "cache", cache, block_size, IndexerFp8::kBytesPerToken);
  p.cache = {pg.base, pg.num_blocks, pg.block_size, pg.block_stride, IndexerLayout::Normal};
  compressor_common(c, p, positions, request_index, state_slots, out_slots, state_block_table,
                    state, 2 * 2 * IndexerFp8::kHeadDim, norm_weight, IndexerFp8::kHeadDim, rope,
                    norm_eps, sanitise, scratch, path, stream);
  nb::gil_scoped_release release;
  compress_indexer(p);
}

// ---- gather ------------------------------------------------------------------------------------
void py_gather_indexer_keys(const In& token_to_seq, const In& cu_seqlen, const In& block_table,
                            const In& cache, int64_t block_size, const std::string& layout,
                            const Out& k_fp8, const Out& k_scale, const std::string& path,
                            uintptr_t stream) {
  Call c("gather_indexer_keys");
  GatherParams p;
  // The cache is only read; the library's view type is shared with the (mutable) writer side.
  p.cache = indexer_cache(c, "cache", cache, block_size, layout);
  p.num_tokens = c.vec("token_to_seq", token_to_seq, Kind::I32, -1, "");
  p.token_to_seq = ptr<const int32_t>(token_to_seq);
  const int64_t b1 = c.vec("cu_seqlen", cu_seqlen, Kind::I32, -1, "");
  if (b1 < 1) c.fail("cu_seqlen", "B + 1 >= 1 entries", "0");
  p.num_batches = b1 - 1;
  p.cu_seqlen = ptr<const int32_t>(cu_seqlen);
  const Table t = table(c, "block_table", block_table);
  if (t.rows < p.num_batches) {
    c.fail("block_table",
           "shape[0] >= B = cu_seqlen.shape[0] - 1 = " + std::to_string(p.num_batches),
           "shape " + shape_text(block_table));
  }
  p.block_table = t.data;
  p.block_table_stride = t.stride;
  p.block_table_width = t.width;
  p.k_fp8_stride = rows(c, "k_fp8", k_fp8, Kind::U8, p.num_tokens, IndexerFp8::kHeadDim,
                        "token_to_seq.shape[0]");
  p.k_fp8 = ptr<uint8_t>(k_fp8);
  c.vec("k_scale", k_scale, Kind::F32, p.num_tokens, "token_to_seq.shape[0]");
  p.k_scale = ptr<float>(k_scale);
  p.path = path_of(path);
  p.stream = stream_of(stream);
  nb::gil_scoped_release release;
  gather_indexer_keys(p);
}

// ---- list builders -----------------------------------------------------------------------------
// Output buffers of a builder writing R rows of width W: indices >= R*W, indptr >= R+1.
RaggedOut ragged_out(Call& c, const Out& indices, const Out& indptr, int64_t num_rows,
                     int64_t width) {
  c.check("out_indices", indices, Kind::I32, 1);
  c.contiguous_from("out_indices", indices, 0);
  c.min_dim("out_indices", indices, 0, num_rows * width, "num_rows * width");
  c.check("out_indptr", indptr, Kind::I32, 1);
  c.contiguous_from("out_indptr", indptr, 0);
  c.min_dim("out_indptr", indptr, 0, num_rows + 1, "num_rows + 1");
  return {ptr<int32_t>(indices), ptr<int32_t>(indptr), width};
}

BuildCommon build_common(Call& c, int64_t num_rows, const In& row_valid, const std::string& path,
                         uintptr_t stream) {
  BuildCommon b;
  b.num_rows = num_rows;
  b.row_valid = c.opt_vec<const uint8_t>("row_valid", row_valid, Kind::U8, num_rows, "num_rows");
  b.path = path_of(path);
  b.stream = stream_of(stream);
  return b;
}

void py_build_ragged_from_dense(const In& dense, const In& lengths, const In& request_index,
                                int64_t num_slots, const In& row_valid, const Out& out_indices,
                                const Out& out_indptr, const std::string& path, uintptr_t stream) {
  Call c("build_ragged_from_dense");
  DenseToRaggedParams p;
  c.check("dense", dense, Kind::I32, 2);
  const int64_t r = static_cast<int64_t>(dense.shape(0)), w = static_cast<int64_t>(dense.shape(1));
  p.dense_stride = rows(c, "dense", dense, Kind::I32, r, w, "R");
  p.dense = ptr<const int32_t>(dense);
  if (request_index.is_valid()) {
    c.vec("request_index", request_index, Kind::I32, r, "dense.shape[0]");
    p.request_index = ptr<const int32_t>(request_index);
    p.num_requests = c.vec("lengths", lengths, Kind::I32, -1, "");
  } else {
    c.vec("lengths", lengths, Kind::I32, r,
          "dense.shape[0] (per row; pass request_index for per-request lengths)");
  }
  p.lengths = ptr<const int32_t>(lengths);
  p.num_slots = num_slots;
  p.common = build_common(c, r, row_valid, path, stream);
  p.out = ragged_out(c, out_indices, out_indptr, r, w);
  nb::gil_scoped_release release;
  build_ragged_from_dense(p);
}

void py_build_window_lists(const In& positions, const In& request_index, const In& block_table,
                           int64_t block_size, int32_t window, int64_t width, const In& row_valid,
                           const Out& out_indices, const Out& out_indptr, const std::string& path,
                           uintptr_t stream) {
  Call c("build_window_lists");
  WindowListParams p;
  const int64_t r = c.vec("positions", positions, Kind::I64, -1, "");
  p.positions = ptr<const int64_t>(positions);
  p.request_index =
      c.opt_vec<const int32_t>("request_index", request_index, Kind::I32, r, "positions.shape[0]");
  list_table(c, block_table, p);
  p.block_size = static_cast<int32_t>(block_size);
  p.window = window;
  p.common = build_common(c, r, row_valid, path, stream);
  p.out = ragged_out(c, out_indices, out_indptr, r, width);
  nb::gil_scoped_release release;
  build_window_lists(p);
}

void py_build_topk_lists(const In& topk, const In& topk_length, const In& request_index,
                         const In& block_table, int64_t block_size, const In& row_valid,
                         const Out& out_indices, const Out& out_indptr, const std::string& path,
                         uintptr_t stream) {
  Call c("build_topk_lists");
  TopkListParams p;
  c.check("topk", topk, Kind::I32, 2);
  const int64_t r = static_cast<int64_t>(topk.shape(0)), w = static_cast<int64_t>(topk.shape(1));
  p.topk_stride = rows(c, "topk", topk, Kind::I32, r, w, "R");
  p.topk = ptr<const int32_t>(topk);
  const Table t = list_table(c, block_table, p);
  p.topk_length = c.opt_vec<const int32_t>("topk_length", topk_length, Kind::I32, t.rows,
                                           "block_table.shape[0] (one per request)");
  p.request_index =
      c.opt_vec<const int32_t>("request_index", request_index, Kind::I32, r, "topk.shape[0]");
  p.block_size = static_cast<int32_t>(block_size);
  p.common = build_common(c, r, row_valid, path, stream);
  p.out = ragged_out(c, out_indices, out_indptr, r, w);
  nb::gil_scoped_release release;
  build_topk_lists(p);
}

void py_build_compressed_all_lists(const In& positions, const In& request_index,
                                   const In& block_table, int64_t block_size, int32_t ratio,
                                   int64_t max_compressed, int64_t width, const In& row_valid,
                                   const Out& out_indices, const Out& out_indptr,
                                   const std::string& path, uintptr_t stream) {
  Call c("build_compressed_all_lists");
  CompressedAllListParams p;
  const int64_t r = c.vec("positions", positions, Kind::I64, -1, "");
  p.positions = ptr<const int64_t>(positions);
  p.request_index =
      c.opt_vec<const int32_t>("request_index", request_index, Kind::I32, r, "positions.shape[0]");
  list_table(c, block_table, p);
  p.block_size = static_cast<int32_t>(block_size);
  p.ratio = ratio;
  p.max_compressed = max_compressed;
  p.common = build_common(c, r, row_valid, path, stream);
  p.out = ragged_out(c, out_indices, out_indptr, r, width);
  nb::gil_scoped_release release;
  build_compressed_all_lists(p);
}

// ---- decode ------------------------------------------------------------------------------------
// Everything a decode call takes, as the Python layer passes it: the arrays (in this order, None
// where absent), the integer options (in this order, with their defaults), the scale, the path
// and the plan. Both lists are exported (_C.DECODE_INPUTS, _C.DECODE_CONFIG); the Python layer and
// the torch ops follow them, so the arguments are spelled out here only.
#define SPARSEMLA_DECODE_INPUTS(X)                                                   \
  X(q) X(main_cache) X(main_indices) X(main_indptr) X(main_lengths) X(extra_cache)  \
  X(extra_indices) X(extra_indptr) X(extra_lengths) X(sink) X(positions) X(rope)
#define SPARSEMLA_DECODE_CONFIG(X)                                                          \
  X(main_block_size, 0) X(main_width, 0) X(main_rows_per_length, 1) X(extra_block_size, 0) \
  X(extra_width, 0) X(extra_rows_per_length, 1) X(num_splits, 0) X(num_sms, 0)             \
  X(adaptive_splits, 0) X(deterministic, 0) X(extra_cache_sanitised, 0) X(kv_connector, 0)
#define SPARSEMLA_INPUT_NAME(n) #n,
#define SPARSEMLA_CONFIG_PAIR(n, d) std::pair<const char*, int64_t>(#n, d),
constexpr const char* kDecodeInputs[] = {SPARSEMLA_DECODE_INPUTS(SPARSEMLA_INPUT_NAME)};
constexpr std::pair<const char*, int64_t> kDecodeConfig[] = {
    SPARSEMLA_DECODE_CONFIG(SPARSEMLA_CONFIG_PAIR)};

struct DecodeArgs {
#define SPARSEMLA_INPUT_FIELD(n) In n;
  SPARSEMLA_DECODE_INPUTS(SPARSEMLA_INPUT_FIELD)
#define SPARSEMLA_CONFIG_FIELD(n, d) int64_t n = d;
  SPARSEMLA_DECODE_CONFIG(SPARSEMLA_CONFIG_FIELD)
  float scale = kDefaultSoftmaxScale;
  std::string path = "auto";
  std::optional<DecodePlan> plan;  // given: the call runs it, no planning
  uintptr_t stream = 0;
};

// A plan as the integers the Python layer carries through torch ops and graphs (DecodePlan.packed;
// the layout is private to this file): a tag, then every field in this order.
constexpr int64_t kPlanTag = 0x53504c31;  // "SPL1"
template <class F>
void plan_fields(DecodePlan& pl, F&& f) {
  DecodeShape& s = pl.shape;
  f(s.num_tokens), f(s.num_heads), f(s.width_main), f(s.width_extra), f(s.has_extra);
  f(s.device), f(s.caches_aligned), f(s.path), f(s.num_splits), f(s.adaptive_splits);
  f(s.deterministic), f(s.num_sms), f(pl.path), f(pl.num_splits), f(pl.num_sms);
  f(pl.adaptive_splits), f(pl.one_wave), f(pl.fused_combine), f(pl.head_blocks_per_cta);
  f(pl.workspace_bytes);
}
std::vector<int64_t> pack(DecodePlan pl) {
  std::vector<int64_t> v{kPlanTag};
  plan_fields(pl, [&](auto& x) { v.push_back(static_cast<int64_t>(x)); });
  return v;
}
DecodePlan unpack(Call& c, const std::vector<int64_t>& v) {
  DecodePlan pl;
  const bool ok = v.size() == pack(pl).size() && v[0] == kPlanTag;
  if (!ok) c.fail("plan", "a DecodePlan's packed integers", std::to_string(v.size()) + " integers");
  size_t i = 1;
  plan_fields(pl, [&](auto& x) { x = static_cast<std::remove_reference_t<decltype(x)>>(v[i++]); });
  return pl;
}

DecodeArgs decode_args(const nb::sequence& inputs, const std::vector<int64_t>& config, float scale,
                       const std::string& path, const std::optional<std::vector<int64_t>>& plan,
                       uintptr_t stream) {
  Call c("sparse_decode");
  DecodeArgs a;
#define SPARSEMLA_INPUT_ADDRESS(n) &a.n,
#define SPARSEMLA_CONFIG_ADDRESS(n, d) &a.n,
  In* arrays[] = {SPARSEMLA_DECODE_INPUTS(SPARSEMLA_INPUT_ADDRESS)};
  int64_t* options[] = {SPARSEMLA_DECODE_CONFIG(SPARSEMLA_CONFIG_ADDRESS)};
  if (nb::len(inputs) != std::size(arrays) || config.size() != std::size(options))
    c.fail("inputs/config", "the lengths of _C.DECODE_INPUTS/_C.DECODE_CONFIG", "others");
  for (size_t i = 0; i < std::size(arrays); ++i) {
    nb::handle h = inputs[i];
    if (!h.is_none() && !nb::try_cast<In>(h, *arrays[i]))
      c.fail(kDecodeInputs[i], "a numpy array or a torch tensor", nb::type_name(h.type()).c_str());
  }
  for (size_t i = 0; i < std::size(options); ++i) *options[i] = config[i];
  a.scale = scale;
  a.path = path;
  if (plan) a.plan = unpack(c, *plan);
  a.stream = stream;
  return a;
}

int32_t i32(Call& c, const std::string& name, int64_t v) {
  if (v < INT32_MIN || v > INT32_MAX) c.fail(name, "a 32-bit integer", std::to_string(v));
  return static_cast<int32_t>(v);
}

// A list (CONTRACT 4.6): ragged (indptr given: indices int32 [cap], indptr int32 [>= T+1]) or dense
// (indptr None: FlashMLA's indices int32 [T, W], rows strided, read directly; optional lengths
// int32 [>= ceil(T / rows_per_length)]: per row, or per request with rows_per_length = s_q).
IndexList index_list(Call& c, const std::string& name, const In& indices, const In& indptr,
                     const In& lengths, int64_t width, int64_t rows_per_length, int64_t T) {
  const std::string ind = name + "_indices", len = name + "_lengths";
  const std::string rpl = name + "_rows_per_length";
  IndexList l;
  if (indptr.is_valid()) {  // ragged
    if (lengths.is_valid())
      c.fail(len, "None with a ragged list (lengths go with a dense list, " + name + "_indptr None)",
             "an array");
    if (rows_per_length != 1) c.fail(rpl, "1 with a ragged list", std::to_string(rows_per_length));
    l.capacity = c.vec(ind, indices, Kind::I32, -1, "");
    c.vec(name + "_indptr", indptr, Kind::I32, -1, "");
    c.min_dim(name + "_indptr", indptr, 0, T + 1, "T + 1");
    l.indptr = ptr<const int32_t>(indptr);
    l.width = width;
  } else {  // dense
    c.check(ind, indices, Kind::I32, -1);
    if (indices.ndim() != 2)
      c.fail(ind, "a dense list [T, W] (2-D) when " + name + "_indptr is None",
             std::to_string(indices.ndim()) + "-D, shape " + shape_text(indices));
    l.width = static_cast<int64_t>(indices.shape(1));
    l.dense_stride = rows(c, ind, indices, Kind::I32, T, -1, "T (q.shape[0])");
    l.capacity = T == 0 ? 0 : (T - 1) * l.dense_stride + l.width;
    if (width != 0 && width != l.width)
      c.fail(name + "_width", "0 or " + ind + ".shape[1] = " + std::to_string(l.width) +
             " (a dense list's width)", std::to_string(width));
    if (rows_per_length < 1) c.fail(rpl, ">= 1", std::to_string(rows_per_length));
    l.rows_per_length = i32(c, rpl, rows_per_length);
    if (lengths.is_valid()) {
      c.vec(len, lengths, Kind::I32, -1, "");
      c.min_dim(len, lengths, 0, (T + rows_per_length - 1) / rows_per_length,
                rows_per_length == 1 ? "T (per row; per request: give " + rpl + " = s_q)"
                                     : "ceil(T / " + rpl + ")");
      l.lengths = ptr<const int32_t>(lengths);
    }
  }
  l.indices = ptr<const int32_t>(indices);
  return l;
}

// With a plan, the call's planning options are the plan's (none may be given as well).
void options_from_plan(Call& c, const DecodeArgs& a, DecodeParams& p) {
  if (a.num_splits || a.num_sms || a.adaptive_splits || a.deterministic || p.path != Path::Auto)
    c.fail("num_splits/num_sms/adaptive_splits/deterministic/path",
           "unset with a plan (the plan holds them)", "set");
  const DecodeShape& s = a.plan->shape;
  p.num_splits = s.num_splits;
  p.num_sms = s.num_sms;
  p.adaptive_splits = s.adaptive_splits;
  p.deterministic = s.deterministic;
  p.path = s.path;
}

// lse fp32 [T, H] (any strides), or FlashMLA's [T / g, H, g] (g = s_q: row t is lse[t / g, :, t % g],
// written in place by the kernels as rows in groups of g).
void lse_layout(Call& c, const Out& lse, DecodeParams& p) {
  c.check("lse", lse, Kind::F32, -1);
  c.positive_strides("lse", lse);
  const bool grouped = lse.ndim() == 3;
  const int64_t g = grouped ? static_cast<int64_t>(lse.shape(2)) : 1;
  if ((lse.ndim() != 2 && !grouped) || g < 1 || int64_t(lse.shape(0)) * g != p.num_tokens) {
    c.fail("lse", "[T, H] or FlashMLA's [b, H, s_q] with b * s_q = T = " +
           std::to_string(p.num_tokens), "shape " + shape_text(lse));
  }
  c.dim("lse", lse, 1, p.num_heads, "H (q.shape[1])");
  p.lse = ptr<float>(lse);
  p.lse_stride_head = p.num_heads <= 1 ? 1 : lse.stride(1);
  p.lse_stride_token = g == 1 ? Call::stride_or_default(lse, 0) : lse.stride(2);
  p.lse_group = i32(c, "lse", g);
  p.lse_stride_group = g == 1 ? 0 : Call::stride_or_default(lse, 0);
}

// Fills DecodeParams from the arrays; out (and lse) only when `out` is given (else a query: q's
// pointer stands in for out, so that the path is resolved from the same device).
DecodeParams decode_params(Call& c, const DecodeArgs& a, const Out& out, const Out& lse) {
  DecodeParams p;
  heads(c, "q", a.q);
  p.num_tokens = static_cast<int64_t>(a.q.shape(0));
  p.num_heads = static_cast<int32_t>(a.q.shape(1));
  const int64_t T = p.num_tokens;
  const int64_t H = p.num_heads;
  p.q = ptr<const bf16_bits>(a.q);
  p.q_stride_token = Call::stride_or_default(a.q, 0);
  p.q_stride_head = H <= 1 ? 512 : a.q.stride(1);
  p.main_cache = mla_cache(c, "main_cache", a.main_cache, a.main_block_size);
  p.main_list = index_list(c, "main", a.main_indices, a.main_indptr, a.main_lengths, a.main_width,
                           a.main_rows_per_length, T);
  if (a.extra_cache.is_valid()) {
    p.has_extra = true;
    p.extra_cache = mla_cache(c, "extra_cache", a.extra_cache, a.extra_block_size);
    if (!a.extra_indices.is_valid())
      c.fail("extra_indices", "the extra list with the extra cache", "None");
    p.extra_list = index_list(c, "extra", a.extra_indices, a.extra_indptr, a.extra_lengths,
                              a.extra_width, a.extra_rows_per_length, T);
  } else if (a.extra_indices.is_valid() || a.extra_indptr.is_valid() || a.extra_lengths.is_valid()) {
    c.fail("extra_cache", "the extra cache with the extra list", "None");
  }
  p.sink = c.opt_vec<const float>("sink", a.sink, Kind::F32, H, "H (q.shape[1])");
  p.scale = a.scale;
  if (a.positions.is_valid()) {
    c.vec("positions", a.positions, Kind::I64, T, "T (q.shape[0])");
    p.positions = ptr<const int64_t>(a.positions);
    if (!a.rope.is_valid())
      c.fail("rope", "a cos/sin table with positions (fused inverse RoPE)", "None");
    p.rope = rope_table(c, "rope", a.rope);
  }
  p.out = const_cast<bf16_bits*>(p.q);
  if (out.is_valid()) {
    heads(c, "out", out, T, H);
    p.out = ptr<bf16_bits>(out);
    p.out_stride_token = Call::stride_or_default(out, 0);
    p.out_stride_head = H <= 1 ? 512 : out.stride(1);
  }
  if (out.is_valid() && lse.is_valid()) lse_layout(c, lse, p);
  p.extra_cache_sanitised = a.extra_cache_sanitised != 0;
  p.kv_connector = a.kv_connector != 0;
  p.num_splits = i32(c, "num_splits", a.num_splits);
  p.num_sms = i32(c, "num_sms", a.num_sms);
  p.adaptive_splits = a.adaptive_splits != 0;
  p.deterministic = a.deterministic != 0;
  p.path = path_of(a.path);
  p.stream = stream_of(a.stream);
  if (a.plan) options_from_plan(c, a, p);
  return p;
}

// The workspace of a call that needs `need` bytes: the given array, else `alloc(need)` (an array of
// >= need bytes on the call's device, e.g. a DLPack capsule of a torch tensor) when need > 0; the
// returned holder keeps it alive for the call. A given array is checked (contiguous bytes).
struct CallWorkspace {
  Out holder;
  void* ptr = nullptr;
  size_t bytes = 0;
};
CallWorkspace call_workspace(Call& c, const Out& workspace, const nb::object& alloc, size_t need) {
  CallWorkspace w{workspace};
  if (need > 0 && !w.holder.is_valid() && !alloc.is_none()) w.holder = nb::cast<Out>(alloc(need));
  if (w.holder.is_valid()) {
    c.check("workspace", w.holder, Kind::AnyBytes, -1);
    c.contiguous_from("workspace", w.holder, 0);
    w.ptr = w.holder.data();
    w.bytes = w.holder.nbytes();
  }
  return w;
}

// Runs the decode with the given plan, else the call's own. Workspace: the given array when the
// plan needs one, else `alloc(nbytes)` is called (it returns an array of >= nbytes bytes on the
// call's device, e.g. a DLPack capsule of a torch tensor) and kept alive for the call.
void py_sparse_decode(const DecodeArgs& a, const Out& out, const Out& lse, const Out& workspace,
                      nb::object alloc) {
  Call c("sparse_decode");
  if (!out.is_valid()) c.fail("out", "an output array", "None");
  const DecodeParams p = decode_params(c, a, out, lse);
  if (p.num_tokens == 0) return;
  // Planned from the call's shape; sparse_decode then validates the call (errors name it).
  const DecodePlan plan = a.plan ? *a.plan : plan_decode(decode_shape(p));
  // A plan without a workspace ignores a given array (it is neither checked nor passed).
  const CallWorkspace ws = plan.workspace_bytes > 0
                               ? call_workspace(c, workspace, alloc, plan.workspace_bytes)
                               : CallWorkspace{};
  nb::gil_scoped_release release;
  sparse_decode(p, plan, ws.ptr, ws.bytes);
}

std::optional<std::string> py_decode_unsupported(const DecodeArgs& a, const Out& out,
                                                 const Out& lse) {
  try {
    Call c("sparse_decode");
    const DecodeParams p = decode_params(c, a, out, lse);
    const char* why = nullptr;
    if (decode_is_supported(p, &why)) return std::nullopt;
    return std::string(why != nullptr ? why : "unsupported");
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

void py_sparse_decode_reference(const DecodeArgs& a, const Out& out, const Out& lse,
                                const Out& abs_mean) {
  Call c("sparse_decode_reference");
  DecodeParams p = decode_params(c, a, Out(), Out());
  p.out = nullptr;
  const auto f64 = [&](const char* name, const Out& x, int ndim) -> double* {
    if (!x.is_valid()) return nullptr;
    c.check(name, x, Kind::F64, ndim);
    c.contiguous_from(name, x, 0);
    c.dim(name, x, 0, p.num_tokens, "T");
    c.dim(name, x, 1, p.num_heads, "H");
    if (ndim == 3) c.dim(name, x, 2, 512, "512");
    return ptr<double>(x);
  };
  if (!out.is_valid()) c.fail("out", "a float64 [T, H, 512] array", "None");
  double* o = f64("out", out, 3);
  double* lse_ptr = f64("lse", lse, 2);
  double* abs_mean_ptr = f64("abs_mean", abs_mean, 3);
  if (c.on_device())
    c.fail("q", "host arrays (the float64 reference runs on the CPU)", "CUDA arrays");
  nb::gil_scoped_release release;
  sparse_decode_reference(p, o, lse_ptr, abs_mean_ptr);
}

void py_inverse_rope(const Out& x, const In& positions, const In& rope, const std::string& path,
                     uintptr_t stream) {
  Call c("inverse_rope_inplace");
  heads(c, "x", x);
  const int64_t T = static_cast<int64_t>(x.shape(0));
  const int32_t H = static_cast<int32_t>(x.shape(1));
  c.vec("positions", positions, Kind::I64, T, "x.shape[0]");
  const RopeTable r = rope_table(c, "rope", rope);
  bf16_bits* data = ptr<bf16_bits>(x);
  const int64_t st = Call::stride_or_default(x, 0), sh = H <= 1 ? 512 : x.stride(1);
  const int64_t* pos = ptr<const int64_t>(positions);
  const Path pt = path_of(path);
  nb::gil_scoped_release release;
  inverse_rope_inplace(data, T, H, st, sh, pos, r, pt, stream_of(stream));
}

// ---- decode context parallelism (CONTRACT 12) ---------------------------------------------------
// rank_out: bf16 or fp32 [R, T, H, 512] (last axis contiguous, positive strides); rank_lse: fp32
// [R, T, H]; out: bf16 [T, H, 512]; lse: fp32 [T, H] or None.
void py_merge_ranks(const In& rank_out, const In& rank_lse, const In& sink, const In& positions,
                    const In& rope, const Out& out, const Out& lse, const std::string& path,
                    uintptr_t stream) {
  Call c("merge_ranks");
  RankMergeParams p;
  if (!rank_out.is_valid()) c.fail("rank_out", "an array", "None");
  const bool f32 = dtype_is(rank_out.dtype(), Kind::F32);
  c.check("rank_out", rank_out, f32 ? Kind::F32 : Kind::Bf16, 4);
  c.last_contiguous("rank_out", rank_out);
  c.positive_strides("rank_out", rank_out);
  c.dim("rank_out", rank_out, 3, Fp8DsMla::kHeadDim, "512");
  const int64_t R = static_cast<int64_t>(rank_out.shape(0)),
                T = static_cast<int64_t>(rank_out.shape(1));
  const int64_t H = static_cast<int64_t>(rank_out.shape(2));
  if (R > INT32_MAX || H > INT32_MAX)
    c.fail("rank_out", "fewer than 2^31 ranks and heads", shape_text(rank_out));
  p.num_ranks = static_cast<int32_t>(R);
  p.num_tokens = T;
  p.num_heads = static_cast<int32_t>(H);
  if (f32) {
    p.rank_out_f32 = ptr<const float>(rank_out);
  } else {
    p.rank_out = ptr<const bf16_bits>(rank_out);
  }
  p.rank_out_stride_rank = Call::stride_or_default(rank_out, 0);
  p.rank_out_stride_token = Call::stride_or_default(rank_out, 1);
  p.rank_out_stride_head = H <= 1 ? 512 : rank_out.stride(2);
  c.check("rank_lse", rank_lse, Kind::F32, 3);
  c.positive_strides("rank_lse", rank_lse);
  for (int i = 0; i < 3; ++i)
    c.dim("rank_lse", rank_lse, i, static_cast<int64_t>(rank_out.shape(i)),
          "rank_out.shape[" + std::to_string(i) + "]");
  p.rank_lse = ptr<const float>(rank_lse);
  p.rank_lse_stride_rank = Call::stride_or_default(rank_lse, 0);
  p.rank_lse_stride_token = Call::stride_or_default(rank_lse, 1);
  p.rank_lse_stride_head = H <= 1 ? 1 : rank_lse.stride(2);
  p.sink = c.opt_vec<const float>("sink", sink, Kind::F32, H, "H (rank_out.shape[2])");
  if (positions.is_valid()) {
    c.vec("positions", positions, Kind::I64, T, "T (rank_out.shape[1])");
    p.positions = ptr<const int64_t>(positions);
    if (!rope.is_valid()) c.fail("rope", "a table with positions", "None");
    p.rope = rope_table(c, "rope", rope);
  }
  heads(c, "out", out, T, H);
  p.out = ptr<bf16_bits>(out);
  p.out_stride_token = Call::stride_or_default(out, 0);
  p.out_stride_head = H <= 1 ? 512 : out.stride(1);
  if (lse.is_valid()) {
    c.check("lse", lse, Kind::F32, 2);
    c.positive_strides("lse", lse);
    c.dim("lse", lse, 0, T, "T");
    c.dim("lse", lse, 1, H, "H");
    p.lse = ptr<float>(lse);
    p.lse_stride_token = Call::stride_or_default(lse, 0);
    p.lse_stride_head = H <= 1 ? 1 : lse.stride(1);
  }
  p.path = path_of(path);
  p.stream = stream_of(stream);
  nb::gil_scoped_release release;
  merge_ranks(p);
}

// indices: ragged int32 [cap] with indptr int32 [T+1], or dense int32 [T, W] (indptr None) with
// lengths int32 [T] or None.
void py_shard_list(const In& indices, const In& indptr, const In& lengths, int32_t num_ranks,
                   int32_t rank, int32_t interleave, int64_t num_slots, const In& row_valid,
                   const Out& out_indices, const Out& out_indptr, int64_t width,
                   const std::string& path, uintptr_t stream) {
  Call c("shard_list");
  ShardListParams p;
  int64_t T = 0;
  if (indptr.is_valid()) {
    c.vec("indices", indices, Kind::I32, -1, "");
    T = c.vec("indptr", indptr, Kind::I32, -1, "") - 1;
    if (T < 0) c.fail("indptr", "T+1 >= 1 entries", "0");
    p.list.indices = ptr<const int32_t>(indices);
    p.list.indptr = ptr<const int32_t>(indptr);
    p.list.capacity = static_cast<int64_t>(indices.shape(0));
  } else {
    c.check("indices", indices, Kind::I32, 2);
    T = static_cast<int64_t>(indices.shape(0));
    const int64_t w = static_cast<int64_t>(indices.shape(1));
    p.list.dense_stride = rows(c, "indices", indices, Kind::I32, T, w, "T");
    p.list.indices = ptr<const int32_t>(indices);
    p.list.width = w;
    p.list.capacity = T == 0 ? 0 : (T - 1) * p.list.dense_stride + w;
    p.list.lengths =
        c.opt_vec<const int32_t>("lengths", lengths, Kind::I32, T, "T (indices.shape[0])");
  }
  p.num_ranks = num_ranks;
  p.rank = rank;
  p.interleave = interleave;
  p.num_slots = num_slots;
  p.common = build_common(c, T, row_valid, path, stream);
  p.out = ragged_out(c, out_indices, out_indptr, T, width);
  nb::gil_scoped_release release;
  shard_list(p);
}

nb::dict py_verify(const In& out, const In& ref, const In& abs_mean) {
  Call c("verify_decode_output");
  heads(c, "out", out);
  c.check("ref", ref, Kind::F64, 3);
  c.contiguous_from("ref", ref, 0);
  for (int i = 0; i < 3; ++i)
    c.dim("ref", ref, i, static_cast<int64_t>(out.shape(i)),
          "out.shape[" + std::to_string(i) + "]");
  c.check("abs_mean", abs_mean, Kind::F64, 3);
  c.contiguous_from("abs_mean", abs_mean, 0);
  for (int i = 0; i < 3; ++i)
    c.dim("abs_mean", abs_mean, i, static_cast<int64_t>(out.shape(i)),
          "out.shape[" + std::to_string(i) + "]");
  if (c.on_device()) c.fail("out", "host arrays", "CUDA arrays");
  const int64_t T = static_cast<int64_t>(out.shape(0));
  const int32_t H = static_cast<int32_t>(out.shape(1));
  const VerifyResult v =
      verify_decode_output(ptr<const bf16_bits>(out), T, H, Call::stride_or_default(out, 0),
                           H <= 1 ? 512 : out.stride(1), ptr<const double>(ref),
                           ptr<const double>(abs_mean));
  nb::dict d;
  d["passed"] = v.passed;
  d["elements"] = v.elements;
  d["special_mismatches"] = v.special_mismatches;
  d["tolerance_failures"] = v.tolerance_failures;
  d["max_abs_error"] = v.max_abs_error;
  d["max_bound_ratio"] = v.max_bound_ratio;
  d["cosine_diff"] = v.cosine_diff;
  d["first_bad"] = v.first_bad;
  d["summary"] = v.summary();
  return d;
}

// ---- lightning indexer (CONTRACT 11) ------------------------------------------------------------
TopkOrder order_of(Call& c, const std::string& name) {
  if (name == "by_index") return TopkOrder::ByIndex;
  if (name == "by_score") return TopkOrder::ByScore;
  c.fail("order", "'by_index' or 'by_score'", "'" + name + "'");
}

// The params of one indexer call from its arrays. Outputs: indices int32 [T, W] (W >= topk; the
// Python argument `out`, named so in errors) and
// the optional lengths [T] / scores [T, W]. Without indices (the size query) the call's w stands
// in for the output pointers: it lives where the outputs will (the backend's choice), is 4-byte
// aligned and is never written by a size query; `with_scores` then says whether scores will be
// requested.
IndexerParams indexer_params(Call& c, const In& q, const In& w, const In& cache, int64_t block_size,
                             const std::string& layout, const In& block_table,
                             const In& row_request, const In& num_candidates, int32_t topk,
                             int64_t width, const std::string& order, const Out& indices,
                             const Out& lengths, const Out& scores, bool with_scores,
                             const std::string& path, uintptr_t stream) {
  IndexerParams p;
  c.check("q", q, Kind::U8, 3);
  c.last_contiguous("q", q);
  c.positive_strides("q", q);
  c.dim("q", q, 2, kIndexerHeadDim, "128");
  p.num_tokens = static_cast<int64_t>(q.shape(0));
  p.num_heads = static_cast<int32_t>(q.shape(1));
  if (q.shape(1) < 1 || q.shape(1) > 128) {
    c.fail("q", "shape[1] = H in 1..128", "shape " + shape_text(q));
  }
  p.q = ptr<const uint8_t>(q);
  p.q_stride_token = Call::stride_or_default(q, 0);
  p.q_stride_head = Call::stride_or_default(q, 1);
  p.w_stride_token = rows(c, "w", w, Kind::F32, p.num_tokens, p.num_heads, "q.shape[0]");
  if (p.num_tokens <= 1) p.w_stride_token = 0;
  p.w = ptr<const float>(w);
  p.cache = indexer_cache(c, "cache", cache, block_size, layout);
  const Table t = table(c, "block_table", block_table);
  p.block_table = t.data;
  p.block_table_stride = t.stride;
  p.block_table_width = t.width;
  p.num_requests = t.rows;
  c.vec("row_request", row_request, Kind::I32, p.num_tokens, "q.shape[0]");
  p.row_request = ptr<const int32_t>(row_request);
  c.vec("num_candidates", num_candidates, Kind::I32, p.num_tokens, "q.shape[0]");
  p.num_candidates = ptr<const int32_t>(num_candidates);
  p.topk = topk;
  p.order = order_of(c, order);
  if (indices.is_valid()) {
    c.check("out", indices, Kind::I32, 2);
    const int64_t W = static_cast<int64_t>(indices.shape(1));
    if (W < topk)
      c.fail("out", "shape[1] = W >= topk = " + std::to_string(topk),
             "shape " + shape_text(indices));
    if (W > INT32_MAX) c.fail("out", "shape[1] < 2^31", "shape " + shape_text(indices));
    p.width = static_cast<int32_t>(W);
    p.indices_stride = rows(c, "out", indices, Kind::I32, p.num_tokens, W, "q.shape[0]");
    p.indices = ptr<int32_t>(indices);
    p.lengths = c.opt_vec<int32_t>("lengths", lengths, Kind::I32, p.num_tokens, "q.shape[0]");
    if (scores.is_valid()) {
      p.scores_stride = rows(c, "scores", scores, Kind::F32, p.num_tokens, W, "q.shape[0]");
      p.scores = ptr<float>(scores);
    }
  } else {
    if (width < topk || width > INT32_MAX) {
      c.fail("width", "W in [topk = " + std::to_string(topk) + ", 2^31-1]", std::to_string(width));
    }
    p.width = static_cast<int32_t>(width);
    float* stand_in = const_cast<float*>(p.w);
    p.indices = reinterpret_cast<int32_t*>(stand_in);
    p.indices_stride = p.width;
    p.scores = with_scores ? stand_in : nullptr;
    p.scores_stride = p.width;
  }
  p.path = path_of(path);
  p.stream = stream_of(stream);
  return p;
}

size_t py_indexer_workspace_size(const In& q, const In& w, const In& cache, int64_t block_size,
                                 const std::string& layout, const In& block_table,
                                 const In& row_request, const In& num_candidates, int32_t topk,
                                 int64_t width, const std::string& order, bool with_scores,
                                 const std::string& path) {
  Call c("indexer_workspace_size");
  const IndexerParams p =
      indexer_params(c, q, w, cache, block_size, layout, block_table, row_request, num_candidates,
                     topk, width, order, Out(), Out(), Out(), with_scores, path, 0);
  return indexer_workspace_size(p);
}

// Runs the indexer. Workspace: the given array when the size query asks for one, else
// `alloc(nbytes)` (an array of >= nbytes bytes on the call's device), kept alive for the call.
void py_indexer_topk(const In& q, const In& w, const In& cache, int64_t block_size,
                     const std::string& layout, const In& block_table, const In& row_request,
                     const In& num_candidates, int32_t topk, const std::string& order,
                     const Out& indices, const Out& lengths, const Out& scores,
                     const Out& workspace, nb::object alloc, const std::string& path,
                     uintptr_t stream) {
  Call c("indexer_topk");
  if (!indices.is_valid()) c.fail("out", "an int32 [T, W] output array", "None");
  const IndexerParams p =
      indexer_params(c, q, w, cache, block_size, layout, block_table, row_request, num_candidates,
                     topk, 0, order, indices, lengths, scores, false, path, stream);
  const CallWorkspace ws = call_workspace(c, workspace, alloc, indexer_workspace_size(p));
  nb::gil_scoped_release release;
  indexer_topk(p, ws.ptr, ws.bytes);
}

void py_indexer_candidates(const In& positions, const Out& out) {
  Call c("indexer_candidates_from_positions");
  const int64_t T = c.vec("positions", positions, Kind::I64, -1, "");
  c.vec("out", out, Kind::I32, T, "positions.shape[0]");
  if (c.on_device())
    c.fail("positions", "host arrays (torch tensors are computed with torch ops)", "CUDA arrays");
  const int64_t* pos = ptr<const int64_t>(positions);
  int32_t* n = ptr<int32_t>(out);
  nb::gil_scoped_release release;
  indexer_candidates_from_positions(pos, T, n);
}

// The query prep of CONTRACT 11.6: q bf16 [T, H, 128], positions int64 [T], rope fp32 [P, >= 64],
// w_raw bf16 [T, H] -> q_out uint8 [T, H, 128] (e4m3 bytes), w_out fp32 [T, H].
void py_indexer_q_prep(const In& q, const In& positions, const In& rope, const In& w_raw,
                       const Out& q_out, const Out& w_out, const std::string& path,
                       uintptr_t stream) {
  Call c("indexer_q_prep");
  IndexerQPrepParams p;
  c.check("q", q, Kind::Bf16, 3);
  c.last_contiguous("q", q);
  c.positive_strides("q", q);
  c.dim("q", q, 2, kIndexerHeadDim, "128");
  p.num_tokens = static_cast<int64_t>(q.shape(0));
  if (q.shape(1) < 1 || q.shape(1) > 128) {
    c.fail("q", "shape[1] = H in 1..128", "shape " + shape_text(q));
  }
  p.num_heads = static_cast<int32_t>(q.shape(1));
  p.q = ptr<const bf16_bits>(q);
  p.q_stride_token = Call::stride_or_default(q, 0);
  p.q_stride_head = Call::stride_or_default(q, 1);
  c.vec("positions", positions, Kind::I64, p.num_tokens, "q.shape[0]");
  p.positions = ptr<const int64_t>(positions);
  p.rope = rope_table(c, "rope", rope);
  p.w_raw_stride = rows(c, "w_raw", w_raw, Kind::Bf16, p.num_tokens, p.num_heads, "q.shape[0]");
  if (p.num_tokens <= 1) p.w_raw_stride = 0;
  p.w_raw = ptr<const bf16_bits>(w_raw);
  c.check("q_out", q_out, Kind::U8, 3);
  c.last_contiguous("q_out", q_out);
  c.positive_strides("q_out", q_out);
  c.dim("q_out", q_out, 0, p.num_tokens, "T (q.shape[0])");
  c.dim("q_out", q_out, 1, p.num_heads, "H (q.shape[1])");
  c.dim("q_out", q_out, 2, kIndexerHeadDim, "128");
  p.q_out = ptr<uint8_t>(q_out);
  p.q_out_stride_token = Call::stride_or_default(q_out, 0);
  p.q_out_stride_head = Call::stride_or_default(q_out, 1);
  p.w_out_stride = rows(c, "w_out", w_out, Kind::F32, p.num_tokens, p.num_heads, "q.shape[0]");
  if (p.num_tokens <= 1) p.w_out_stride = 0;
  p.w_out = ptr<float>(w_out);
  p.path = path_of(path);
  p.stream = stream_of(stream);
  nb::gil_scoped_release release;
  indexer_q_prep(p);
}

// ---- planners ----------------------------------------------------------------------------------
void rope_table_fill(const Out& out, const std::string& kind, double theta, bool yarn,
                     double factor, int64_t original_len, double beta_fast, double beta_slow) {
  Call c("build_rope_table");
  c.check("out", out, Kind::F32, 2);
  c.dim("out", out, 1, 64, "64");
  c.contiguous_from("out", out, 0);
  if (c.on_device()) c.fail("out", "a host array", "a CUDA array");
  RopeConfig cfg;
  if (kind == "window") {
    cfg = rope_config_window_layer();
  } else if (kind == "compressed") {
    cfg = rope_config_compressed_layer();
  } else if (kind == "custom") {
    cfg = {theta, yarn, factor, original_len, beta_fast, beta_slow};
  } else {
    c.fail("layer", "'window', 'compressed' or 'custom'", "'" + kind + "'");
  }
  const int64_t n = static_cast<int64_t>(out.shape(0));
  const std::vector<float> t = build_rope_table(cfg, n);
  std::copy(t.begin(), t.end(), ptr<float>(out));
}

}  // namespace
}  // namespace sparsemla::py

NB_MODULE(_C, m) {
  using namespace sparsemla;
  using namespace sparsemla::py;
  m.doc() = "sparsemla native extension (use the `sparsemla` package, not this module)";
  nb::exception<Error>(m, "Error", PyExc_ValueError);

  m.attr("__version__") = std::to_string(kVersionMajor) + "." + std::to_string(kVersionMinor) +
                          "." + std::to_string(kVersionPatch);
  m.def("built_with_cuda", &built_with_cuda);
  m.def("cpu_isa", [] { return std::string(cpu_isa()); });
  m.attr("BYTES_PER_TOKEN") = Fp8DsMla::kBytesPerToken;
  m.attr("INDEXER_BYTES_PER_TOKEN") = IndexerFp8::kBytesPerToken;
  m.attr("DEFAULT_SCALE") = kDefaultSoftmaxScale;

  m.def("quantize", &py_quantize, "x"_a, "out_bytes"_a, "out_codes"_a, "block"_a, "code_max"_a);
  m.def("quantize_indexer", &py_quantize_indexer, "x"_a, "out_bytes"_a, "out_scale"_a);
  m.def("dequantize_rows", &py_dequantize_rows, "cache"_a, "block_size"_a, "slots"_a, "scrub"_a,
        "out"_a);
  m.def("dequantize_indexer_rows", &py_dequantize_indexer_rows, "cache"_a, "block_size"_a,
        "layout"_a, "slots"_a, "out"_a);

  m.def("write_window", &py_write_window, "kv"_a, "positions"_a, "slots"_a, "rope"_a, "cache"_a,
        "block_size"_a, "sanitise"_a, "path"_a, "stream"_a = 0);
  m.def("write_compressor_state", &py_write_compressor_state, "kv"_a, "score"_a, "ape"_a.none(),
        "positions"_a, "state_slots"_a, "state"_a, "ratio"_a, "head_dim"_a, "path"_a,
        "stream"_a = 0);
  m.def("compress", &py_compress, "positions"_a, "request_index"_a, "state_slots"_a, "out_slots"_a,
        "state_block_table"_a, "state"_a, "norm_weight"_a, "rope"_a, "cache"_a, "block_size"_a,
        "ratio"_a, "norm_eps"_a, "sanitise"_a, "scratch"_a.none(), "path"_a, "stream"_a = 0);
  m.def("compress_indexer", &py_compress_indexer, "positions"_a, "request_index"_a, "state_slots"_a,
        "out_slots"_a, "state_block_table"_a, "state"_a, "norm_weight"_a, "rope"_a, "cache"_a,
        "block_size"_a, "norm_eps"_a, "sanitise"_a, "scratch"_a.none(), "path"_a, "stream"_a = 0);
  m.def("gather_indexer_keys", &py_gather_indexer_keys, "token_to_seq"_a, "cu_seqlen"_a,
        "block_table"_a, "cache"_a, "block_size"_a, "layout"_a, "k_fp8"_a, "k_scale"_a, "path"_a,
        "stream"_a = 0);

  m.def("indexer_workspace_size", &py_indexer_workspace_size, "q"_a, "w"_a, "cache"_a,
        "block_size"_a, "layout"_a, "block_table"_a, "row_request"_a, "num_candidates"_a, "topk"_a,
        "width"_a, "order"_a, "with_scores"_a, "path"_a);
  m.def("indexer_topk", &py_indexer_topk, "q"_a, "w"_a, "cache"_a, "block_size"_a, "layout"_a,
        "block_table"_a, "row_request"_a, "num_candidates"_a, "topk"_a, "order"_a, "indices"_a,
        "lengths"_a.none(), "scores"_a.none(), "workspace"_a.none(), "alloc"_a.none(), "path"_a,
        "stream"_a = 0);
  m.def("indexer_candidates_from_positions", &py_indexer_candidates, "positions"_a, "out"_a);
  m.def("indexer_q_prep", &py_indexer_q_prep, "q"_a, "positions"_a, "rope"_a, "w_raw"_a, "q_out"_a,
        "w_out"_a, "path"_a, "stream"_a = 0);
  m.attr("INDEXER_MAX_TOPK") = kIndexerMaxTopk;

  m.def("build_ragged_from_dense", &py_build_ragged_from_dense, "dense"_a, "lengths"_a,
        "request_index"_a.none(), "num_slots"_a, "row_valid"_a.none(), "out_indices"_a,
        "out_indptr"_a, "path"_a, "stream"_a = 0);
  m.def("build_window_lists", &py_build_window_lists, "positions"_a, "request_index"_a.none(),
        "block_table"_a, "block_size"_a, "window"_a, "width"_a, "row_valid"_a.none(),
        "out_indices"_a, "out_indptr"_a, "path"_a, "stream"_a = 0);
  m.def("build_topk_lists", &py_build_topk_lists, "topk"_a, "topk_length"_a.none(),
        "request_index"_a.none(), "block_table"_a, "block_size"_a, "row_valid"_a.none(),
        "out_indices"_a, "out_indptr"_a, "path"_a, "stream"_a = 0);
  m.def("build_compressed_all_lists", &py_build_compressed_all_lists, "positions"_a,
        "request_index"_a.none(), "block_table"_a, "block_size"_a, "ratio"_a, "max_compressed"_a,
        "width"_a, "row_valid"_a.none(), "out_indices"_a, "out_indptr"_a, "path"_a, "stream"_a = 0);
  m.def("max_compressed_entries", &max_compressed_entries, "max_model_len"_a, "ratio"_a);

  m.def("plan_head_blocks", &plan_head_blocks, "num_heads"_a);
  m.def("plan_iters", &plan_iters, "width_main"_a, "width_extra"_a, "s"_a);
  m.def(
      "plan",
      [](const std::string& which, int64_t t, int32_t h, int64_t wm, int64_t we, int32_t sms) {
        const PlanShape s{t, h, wm, we, sms};
        if (which == "generic") return plan_generic(s);
        if (which == "specialised") return plan_specialised_ref(s);
        if (which == "sm90-tuned") return plan_sm90_tuned(s);
        throw_arg_error("plan", "planner", "'generic', 'specialised' or 'sm90-tuned'",
                        "'" + which + "'");
      },
      "planner"_a, "num_tokens"_a, "num_heads"_a, "width_main"_a, "width_extra"_a, "num_sms"_a);
  m.def(
      "auto_prefers_sm90",
      [](int64_t t, int32_t h, int64_t wm, int64_t we, int32_t sms, bool deterministic) {
        return auto_prefers_sm90({t, h, wm, we, sms}, deterministic);
      },
      "num_tokens"_a, "num_heads"_a, "width_main"_a, "width_extra"_a, "num_sms"_a,
      "deterministic"_a);
  m.def(
      "adaptive_one_wave",
      [](int64_t t, int32_t h, int64_t wm, int64_t we, int32_t sms, int32_t splits) {
        return adaptive_one_wave({t, h, wm, we, sms}, splits);
      },
      "num_tokens"_a, "num_heads"_a, "width_main"_a, "width_extra"_a, "num_sms"_a, "splits"_a);
  m.def("adaptive_active_splits", &adaptive_active_splits, "len_main"_a, "len_extra"_a, "splits"_a,
        "one_wave"_a);
  m.def(
      "may_skip_extra_scrub",
      [](bool specialised, bool fp8_ds_mla, bool connector, bool has_extra, bool sanitised) {
        return may_skip_extra_scrub({specialised, fp8_ds_mla, connector, has_extra, sanitised});
      },
      "specialised_path"_a, "format_is_fp8_ds_mla"_a, "kv_connector"_a, "has_extra_cache"_a,
      "extra_cache_sanitised"_a);
  m.def(
      "select_gpu_path",
      [](int32_t major, int32_t minor, bool have_sm90a, bool aligned, const std::string& req) {
        return std::string(
            path_name(select_gpu_path({major, minor, have_sm90a, aligned, parse_path(req)})));
      },
      "cc_major"_a, "cc_minor"_a, "have_sm90a_kernels"_a, "caches_fast_aligned"_a, "requested"_a);

  nb::list inputs, config;
  for (const char* n : kDecodeInputs) inputs.append(n);
  for (const auto& [n, d] : kDecodeConfig) config.append(nb::make_tuple(n, d));
  m.attr("DECODE_INPUTS") = inputs;
  m.attr("DECODE_CONFIG") = config;
  nb::class_<DecodeArgs>(m, "DecodeArgs")
      .def(nb::new_(&decode_args), "inputs"_a, "config"_a, "scale"_a, "path"_a, "plan"_a.none(),
           "stream"_a);
  m.def("sparse_decode", &py_sparse_decode, "args"_a, "out"_a, "lse"_a.none(),
        "workspace"_a.none(), "alloc"_a.none());
  m.def("decode_unsupported", &py_decode_unsupported, "args"_a, "out"_a.none(), "lse"_a.none());
  m.def("sparse_decode_reference", &py_sparse_decode_reference, "args"_a, "out"_a, "lse"_a.none(),
        "abs_mean"_a.none());

  const auto path_str = [](Path p) { return std::string(path_name(p)); };
#define SPARSEMLA_RO(C, f) .def_ro(#f, &C::f)
  nb::class_<DecodeShape>(m, "DecodeShape")  // read-only views of the C++ structs
      SPARSEMLA_RO(DecodeShape, num_tokens) SPARSEMLA_RO(DecodeShape, num_heads)
      SPARSEMLA_RO(DecodeShape, width_main) SPARSEMLA_RO(DecodeShape, width_extra)
      SPARSEMLA_RO(DecodeShape, has_extra) SPARSEMLA_RO(DecodeShape, device)
      SPARSEMLA_RO(DecodeShape, caches_aligned) SPARSEMLA_RO(DecodeShape, num_splits)
      SPARSEMLA_RO(DecodeShape, adaptive_splits) SPARSEMLA_RO(DecodeShape, deterministic)
      SPARSEMLA_RO(DecodeShape, num_sms)
      .def_prop_ro("path", [=](const DecodeShape& s) { return path_str(s.path); });
  nb::class_<DecodePlan>(m, "DecodePlan")
      SPARSEMLA_RO(DecodePlan, shape) SPARSEMLA_RO(DecodePlan, num_splits)
      SPARSEMLA_RO(DecodePlan, num_sms) SPARSEMLA_RO(DecodePlan, adaptive_splits)
      SPARSEMLA_RO(DecodePlan, one_wave) SPARSEMLA_RO(DecodePlan, fused_combine)
      SPARSEMLA_RO(DecodePlan, head_blocks_per_cta) SPARSEMLA_RO(DecodePlan, workspace_bytes)
      .def_prop_ro("path", [=](const DecodePlan& p) { return path_str(p.path); })
      .def_prop_ro("packed", [](const DecodePlan& p) { return pack(p); });
  m.def(
      "plan_decode",
      [](int64_t t, int32_t h, int64_t wm, int64_t we, bool has_extra, int32_t device,
         bool aligned, const std::string& path, int32_t splits, bool adaptive, bool det,
         int32_t sms) {
        return plan_decode(DecodeShape{
            .num_tokens = t, .num_heads = h, .width_main = wm, .width_extra = we,
            .has_extra = has_extra, .device = device, .caches_aligned = aligned,
            .path = parse_path(path), .num_splits = splits, .adaptive_splits = adaptive,
            .deterministic = det, .num_sms = sms});
      },
      "num_tokens"_a, "num_heads"_a, "width_main"_a, "width_extra"_a, "has_extra"_a, "device"_a,
      "caches_aligned"_a, "path"_a, "num_splits"_a, "adaptive_splits"_a, "deterministic"_a,
      "num_sms"_a);
  m.def(
      "plan_call",
      [](const DecodeArgs& a) {
        Call c("plan_decode");
        return plan_decode(decode_params(c, a, Out(), Out()));
      },
      "args"_a);
  m.def("inverse_rope", &py_inverse_rope, "x"_a, "positions"_a, "rope"_a, "path"_a, "stream"_a = 0);
  m.def("verify_decode_output", &py_verify, "out"_a, "ref"_a, "abs_mean"_a);
  m.def("merge_ranks", &py_merge_ranks, "rank_out"_a, "rank_lse"_a, "sink"_a.none(),
        "positions"_a.none(), "rope"_a.none(), "out"_a, "lse"_a.none(), "path"_a, "stream"_a = 0);
  m.def("shard_list", &py_shard_list, "indices"_a, "indptr"_a.none(), "lengths"_a.none(),
        "num_ranks"_a, "rank"_a, "interleave"_a, "num_slots"_a, "row_valid"_a.none(),
        "out_indices"_a, "out_indptr"_a, "width"_a, "path"_a, "stream"_a = 0);
  m.def("build_rope_table", &rope_table_fill, "out"_a, "layer"_a, "theta"_a, "yarn"_a, "factor"_a,
        "original_len"_a, "beta_fast"_a, "beta_slow"_a);
}
