"""The operations of sparsemla on arrays: numpy arrays (CPU backend) and torch tensors (CPU or CUDA).

Conventions (every function):

* Arrays go to the C++ library through DLPack without a copy. numpy arrays run on the CPU backend;
  torch CUDA tensors run on the GPU, on the tensor's current stream (``torch.cuda.current_stream``),
  with no host synchronisation. All arrays of one call live on the same device.
* bf16 data is ``torch.bfloat16``, or ``uint16`` holding the raw bf16 bits (numpy has no bf16:
  use :func:`float_to_bf16_bits` / :func:`bf16_bits_to_float`). Cache buffers are ``uint8``.
  Positions and slots are ``int64``; indices, block tables and lengths are ``int32``.
* A paged cache is a ``uint8`` array whose first axis is the page (page stride = ``stride(0)``
  bytes, which may include padding) and whose other axes hold one dense page of at least
  ``block_size * 584`` bytes (fp8_ds_mla) or ``block_size * 132`` bytes (indexer keys): e.g.
  FlashMLA's ``[num_blocks, block_size, 1, 584]``, vLLM's ``[num_blocks, block_size, 584]`` or a
  padded ``[num_blocks, page_bytes]``. ``block_size=None`` takes ``shape[1]`` of a >= 3-D cache.
* Outputs are written in place into the arrays given (``out=`` and friends) or allocated like the
  inputs (same library and device). With torch installed, calls on torch tensors go through the
  ``torch.ops.sparsemla.*`` custom ops, so they work under ``torch.compile(fullgraph=True)`` and
  inside ``torch.cuda.graph`` capture.
* ``path``: ``"auto"`` (host arrays: CPU, CUDA tensors: the GPU path the architecture gate picks),
  ``"cpu"``, ``"cuda-generic"`` or ``"cuda-sm90"``.
* Bad arguments raise :class:`sparsemla.Error` (a ``ValueError``) naming the operation, the
  argument, what was expected and what was given.
"""

import contextlib
import sys

import numpy as np

from . import _C
from . import _checks as _ck

Error = _C.Error
BYTES_PER_TOKEN = _C.BYTES_PER_TOKEN  # fp8_ds_mla: 448 e4m3 + 64 bf16 + 8 scale bytes
INDEXER_BYTES_PER_TOKEN = _C.INDEXER_BYTES_PER_TOKEN  # 128 e4m3 + fp32 scale
DEFAULT_SCALE = 512 ** -0.5

# The torch module once the custom ops are registered (torch_ops.py), else None.
_TORCH = None


def _use_ops(x):
    """True when x is a torch tensor and the torch custom ops exist (traceable by dynamo)."""
    return _TORCH is not None and isinstance(x, _TORCH.Tensor)


def _dispatch(op, raw, like, args):
    """Runs torch.ops.sparsemla.<op>(*args) when `like` is a torch tensor, else raw(*args)."""
    if _use_ops(like):
        getattr(_TORCH.ops.sparsemla, op)(*args)
    else:
        raw(*args)


# ---- the raw layer: arrays -> _C --------------------------------------------------------------------
def _torch_mod():
    return _TORCH if _TORCH is not None else sys.modules.get("torch")


def _is_tensor(x):
    torch = _torch_mod()
    return torch is not None and isinstance(x, torch.Tensor)


def _dl(name, x):
    """What _C receives for argument `name`: numpy arrays as they are; torch CUDA tensors as DLPack
    capsules exported with stream=-1 (no stream synchronisation: torch's default __dlpack__() makes
    the default stream wait on the current one, which breaks CUDA-graph capture)."""
    if _ck.is_numpy_bf16(x):  # ml_dtypes.bfloat16: the same bytes as uint16 bf16 bits
        return x.view(np.uint16)
    if x is None or isinstance(x, np.ndarray):
        return x
    if _is_tensor(x):
        x = x.detach()
        return x.__dlpack__(stream=-1) if x.is_cuda else x
    if hasattr(x, "__dlpack__") or hasattr(x, "__array_interface__"):
        return x
    raise TypeError(f"sparsemla: argument '{name}': expected a numpy array or a torch tensor, "
                    f"got {type(x).__name__}")


def _stream(x):
    """The CUDA stream (as an int) that work on `x` goes to: torch's current stream of x's device."""
    if _is_tensor(x) and x.is_cuda:
        return _torch_mod().cuda.current_stream(x.device).cuda_stream
    return 0


def _guard(x):
    """Makes x's CUDA device the current one for the call (torch's DLPack export requires it)."""
    if _is_tensor(x) and x.is_cuda:
        torch = _torch_mod()
        if x.device.index != torch.cuda.current_device():
            return torch.cuda.device(x.device)
    return contextlib.nullcontext()


_NP_DTYPES = {"uint8": np.uint8, "int32": np.int32, "int64": np.int64, "float32": np.float32,
              "float64": np.float64, "uint16": np.uint16}


def _empty(like, shape, dtype):
    """Uninitialised array of `shape` in the library of `like` (numpy or torch, same device).
    dtype: a numpy dtype name, or 'like' for like's own dtype."""
    if _is_tensor(like):
        torch = _torch_mod()
        tdt = like.dtype if dtype == "like" else getattr(torch, dtype)
        return torch.empty(shape, dtype=tdt, device=like.device)
    return np.empty(shape, dtype=like.dtype if dtype == "like" else _NP_DTYPES[dtype])


def _zeros(like, shape, dtype):
    if _is_tensor(like):
        torch = _torch_mod()
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=like.device)
    return np.zeros(shape, dtype=_NP_DTYPES[dtype])


def _bs(op, block_size, name="block_size"):
    """The page size the extension takes: 0 for None (from the cache's shape[1])."""
    return _ck.block_size(op, name, block_size)


def _arrays(op, required=(), optional=(), written=(), optional_written=()):
    """Checks each (name, array[, ndim]) of a call before any of them is read (see _checks)."""
    for group, opt, wr in ((required, False, False), (optional, True, False),
                           (written, False, True), (optional_written, True, True)):
        for name, x, *ndim in group:
            _ck.array(op, name, x, ndim=ndim[0] if ndim else None, optional=opt, writable=wr)


# ---- bf16 helpers (numpy) --------------------------------------------------------------------------
def float_to_bf16_bits(x):
    """float32 array -> uint16 array of bf16 bits, round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def bf16_bits_to_float(b):
    """uint16 array of bf16 bits -> float32 array (exact)."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---- quantiser and row decoders (CPU) -------------------------------------------------------------
def quantize(x, *, block=64, sanitise=True):
    """The quantiser of CONTRACT 2.3 on bf16 tiles (CPU arrays).

    x: bf16 ``[..., D]`` (D a multiple of ``block``), the values to store. Per ``block``-wide tile:
    ``amax = max(|x|, 1e-4)`` (NaN ignored), ``e = ceil(log2(amax/448))`` exactly, bytes =
    e4m3fn(clamp(x * 2^-e, -448, 448)) (RNE, NaN -> -448), code = clamp(e + 127, 0, code_max) with
    code_max 254 when ``sanitise`` else 255.

    Returns ``(bytes, codes)``: uint8 ``[..., D]`` e4m3 bytes and uint8 ``[..., D/block]`` UE8M0
    codes. The fp8_ds_mla NoPE part uses block=64 over its 448 dims.
    """
    _arrays("quantize", required=[("x", x, tuple(range(1, 33)))])
    block = _ck.integer("quantize", "block", block, 1, _ck.I64_MAX)
    sanitise = _ck.flag("quantize", "sanitise", sanitise)
    shape = tuple(x.shape)
    d = shape[-1]
    x2 = x.reshape(-1, d)
    out_bytes = _empty(x2, (x2.shape[0], d), "uint8")
    out_codes = _empty(x2, (x2.shape[0], d // block if block > 0 else 0), "uint8")
    _C.quantize(_dl("x", x2), _dl("out_bytes", out_bytes), _dl("out_codes", out_codes), block,
                254 if sanitise else 255)
    return out_bytes.reshape(shape), out_codes.reshape(shape[:-1] + (out_codes.shape[1],))


def quantize_indexer(x):
    """The indexer quantiser (CONTRACT 2.3): one 128-wide block per row, CPU arrays.

    x: bf16 ``[N, 128]``. Returns ``(bytes, scale)``: uint8 ``[N, 128]`` e4m3 bytes and fp32 ``[N]``
    scales ``2^e`` (+inf for a row holding +-inf).
    """
    _arrays("quantize_indexer", required=[("x", x, 2)])
    out_bytes = _empty(x, (x.shape[0], 128), "uint8")
    out_scale = _empty(x, (x.shape[0],), "float32")
    _C.quantize_indexer(_dl("x", x), _dl("out_bytes", out_bytes), _dl("out_scale", out_scale))
    return out_bytes, out_scale


def dequantize_rows(cache, slots, *, block_size=None, scrub=True, out=None):
    """Decodes fp8_ds_mla cache rows to fp32 (CPU arrays).

    cache: uint8 paged cache (see module doc); slots: int64 ``[N]`` valid slot ids
    (block * block_size + row; an invalid slot raises). scrub: NaN -> +0 (CONTRACT 5), as the decoder
    does for the window cache. Returns fp32 ``[N, 512]``: NoPE = e4m3 * 2^(code-127), RoPE = the
    stored bf16 values.
    """
    op = "dequantize_rows"
    _arrays(op, required=[("cache", cache), ("slots", slots, 1)], optional_written=[("out", out)])
    bs, scrub = _bs(op, block_size), _ck.flag(op, "scrub", scrub)
    if out is None:
        out = _empty(slots, (slots.shape[0], 512), "float32")
    _C.dequantize_rows(_dl("cache", cache), bs, _dl("slots", slots), scrub, _dl("out", out))
    return out


def dequantize_indexer_rows(cache, slots, *, block_size=None, layout="normal", out=None):
    """Decodes indexer-key cache rows (CPU arrays): fp32 ``[N, 128]`` = e4m3 value * fp32 scale.

    cache: uint8 paged indexer cache (132 bytes per token); slots: int64 ``[N]``;
    layout: ``"normal"`` or ``"shuffle"`` (CONTRACT 2.2).
    """
    op = "dequantize_indexer_rows"
    _arrays(op, required=[("cache", cache), ("slots", slots, 1)], optional_written=[("out", out)])
    bs, layout = _bs(op, block_size), _ck.text(op, "layout", layout)
    if out is None:
        out = _empty(slots, (slots.shape[0], 128), "float32")
    _C.dequantize_indexer_rows(_dl("cache", cache), bs, layout, _dl("slots", slots),
                               _dl("out", out))
    return out


# ---- RoPE -------------------------------------------------------------------------------------------
def build_rope_table(positions, layer="compressed", *, theta=10000.0, yarn=False, yarn_factor=16.0,
                     yarn_original_len=65536, yarn_beta_fast=32.0, yarn_beta_slow=1.0):
    """The per-layer RoPE cos/sin table of CONTRACT 1: numpy fp32 ``[positions, 64]``, row p =
    ``[cos(p*f_k), k < 32 | sin(p*f_k), k < 32]``.

    layer: ``"window"`` (theta 10000, no YaRN: window-only layers), ``"compressed"`` (theta 160000
    with YaRN factor 16, original length 65536, beta 32/1: ratio-4 and ratio-128 layers) or
    ``"custom"`` (the keyword arguments). For torch: ``torch.from_numpy(table).cuda()``.
    """
    op = "build_rope_table"
    rows = _ck.integer(op, "positions", positions, 0, _ck.I32_MAX)
    layer = _ck.text(op, "layer", layer, ("window", "compressed", "custom"))
    theta = _ck.real(op, "theta", theta, positive=True)
    yarn = _ck.flag(op, "yarn", yarn)
    yarn_factor = _ck.real(op, "yarn_factor", yarn_factor, positive=True)
    yarn_original_len = _ck.integer(op, "yarn_original_len", yarn_original_len, 1)
    beta_fast = _ck.real(op, "yarn_beta_fast", yarn_beta_fast)
    beta_slow = _ck.real(op, "yarn_beta_slow", yarn_beta_slow)
    out = np.empty((rows, 64), dtype=np.float32)
    _C.build_rope_table(out, layer, theta, yarn, yarn_factor, yarn_original_len, beta_fast,
                        beta_slow)
    return out


def _r_inverse_rope(x, positions, rope, path):
    with _guard(x):
        _C.inverse_rope(_dl("x", x), _dl("positions", positions), _dl("rope", rope), path,
                        _stream(x))


def inverse_rope(x, positions, rope, *, path="auto"):
    """Standalone inverse RoPE, in place (CONTRACT 1, 4.3): on each pair k of dims 448..511 of
    x bf16 ``[T, H, 512]`` (last dim contiguous), ``a' = a*c + b*s``, ``b' = b*c - a*s`` with
    ``c, s = rope[positions[t]]`` in fp32, rounded once to bf16; NoPE dims untouched.
    positions: int64 ``[T]`` in ``[0, P)``; rope: fp32 ``[P, 64]``. Returns x.
    """
    op = "inverse_rope_inplace"
    _arrays(op, required=[("positions", positions), ("rope", rope)], written=[("x", x, 3)])
    path = _ck.path(op, path)
    _dispatch("inverse_rope", _r_inverse_rope, x, (x, positions, rope, path))
    return x


# ---- writers -----------------------------------------------------------------------------------------
def _r_write_window(kv, positions, slots, rope, cache, block_size, sanitise, path):
    with _guard(cache):
        _C.write_window(_dl("kv", kv), _dl("positions", positions), _dl("slots", slots),
                        _dl("rope", rope), _dl("cache", cache), block_size, sanitise, path,
                        _stream(cache))


def write_window(kv, positions, slots, rope, cache, *, block_size=None, sanitise=True, path="auto"):
    """Window (SWA) writer (CONTRACT 3.1): stores one token per row of kv into the fp8_ds_mla cache.

    kv: bf16 ``[N, 512]`` RMS-normalised latents (rows may be strided); positions: int64 ``[N]``
    (each in ``[0, P)``); slots: int64 ``[N]`` destination slots, ``< 0``: skip the token (nothing
    read or written); rope: fp32 ``[P, 64]`` the layer's table; cache: uint8 paged cache, written
    in place. Dims 448..511 are rotated at the token's position, NoPE tiles quantised (2.3), RoPE
    stored as bf16. sanitise: codes clamped to 254 and NaN RoPE values stored as 0 (CONTRACT 5).
    Returns cache.
    """
    op = "write_window"
    _arrays(op, required=[("kv", kv), ("positions", positions), ("slots", slots),
                          ("rope", rope)], written=[("cache", cache)])
    args = (kv, positions, slots, rope, cache, _bs(op, block_size),
            _ck.flag(op, "sanitise", sanitise), _ck.path(op, path))
    _dispatch("write_window", _r_write_window, cache, args)
    return cache


def _r_write_compressor_state(kv, score, ape, positions, state_slots, state, ratio, head_dim, path):
    with _guard(state):
        _C.write_compressor_state(_dl("kv", kv), _dl("score", score), _dl("ape", ape),
                                  _dl("positions", positions), _dl("state_slots", state_slots),
                                  _dl("state", state), ratio, head_dim, path, _stream(state))


def write_compressor_state(kv, score, positions, state_slots, state, *, ratio=4, head_dim=512,
                           ape=None, path="auto"):
    """Compressor state writer (CONTRACT 3.2).

    With ``W = coff * head_dim`` (coff 2 for ratio 4, 1 for ratio 128; head_dim 512 for the KV
    compressor, 128 for the indexer's): kv, score: fp32 ``[N, W]``; positions: int64 ``[N]``;
    state_slots: int64 ``[N]`` (block * state_bs + row, ``< 0``: skip); state: fp32
    ``[num_state_blocks, state_bs, >= 2W]`` (last dim contiguous), written in place: row =
    ``[kv | score + ape[pos % ratio]]``; ape: fp32 ``[ratio, W]`` or None (already added).
    Returns state.
    """
    op = "write_compressor_state"
    _arrays(op, required=[("kv", kv), ("score", score), ("positions", positions),
                          ("state_slots", state_slots)], optional=[("ape", ape)],
            written=[("state", state)])
    args = (kv, score, ape, positions, state_slots, state,
            _ck.integer(op, "ratio", ratio, 1, _ck.I32_MAX),
            _ck.integer(op, "head_dim", head_dim, 1, _ck.I32_MAX), _ck.path(op, path))
    _dispatch("write_compressor_state", _r_write_compressor_state, state, args)
    return state


def _compressor_arrays(op, positions, request_index, state_slots, out_slots, state_block_table,
                       state, norm_weight, rope, cache, scratch):
    _arrays(op, required=[("positions", positions, 1), ("request_index", request_index),
                          ("state_slots", state_slots), ("out_slots", out_slots),
                          ("state_block_table", state_block_table), ("state", state),
                          ("norm_weight", norm_weight), ("rope", rope)],
            written=[("cache", cache)], optional_written=[("scratch", scratch)])


def _compressor_options(op, norm_eps, sanitise, two_stage, path):
    """(norm_eps, sanitise, two_stage, path) of a compressor call, checked."""
    return (_ck.real(op, "norm_eps", norm_eps), _ck.flag(op, "sanitise", sanitise),
            _ck.flag(op, "two_stage", two_stage), _ck.path(op, path))


def _r_compress(positions, request_index, state_slots, out_slots, state_block_table, state,
                norm_weight, rope, cache, block_size, ratio, norm_eps, sanitise, scratch, path):
    with _guard(cache):
        _C.compress(_dl("positions", positions), _dl("request_index", request_index),
                    _dl("state_slots", state_slots), _dl("out_slots", out_slots),
                    _dl("state_block_table", state_block_table), _dl("state", state),
                    _dl("norm_weight", norm_weight), _dl("rope", rope), _dl("cache", cache),
                    block_size, ratio, norm_eps, sanitise, _dl("scratch", scratch), path,
                    _stream(cache))


def compress(positions, request_index, state_slots, out_slots, state_block_table, state,
             norm_weight, rope, cache, *, ratio=4, block_size=None, norm_eps=1e-6, sanitise=True,
             two_stage=False, scratch=None, path="auto"):
    """KV compressor (CONTRACT 3.2), ratio 4 (with overlap) or 128: one compressed entry per ratio tokens.

    Per token (N): positions int64, request_index int32 (row of state_block_table), state_slots int64
    (``< 0``: token skipped), out_slots int64 (compressed slot, ``< 0``: nothing stored).
    state_block_table: int32 ``[R, width]``; state: fp32 ``[blocks, state_bs, >= 2W]`` (read only);
    norm_weight: fp32 ``[512]``; rope: fp32 ``[P, 64]``; cache: uint8 paged fp8_ds_mla cache,
    written in place. A token with ``(pos + 1) % ratio == 0`` pools the state rows of its window
    (softmax over tokens per channel), RMS-normalises (eps ``norm_eps``), rotates at
    ``(pos // ratio) * ratio``, quantises and stores. sanitise (default on): codes <= 254 and NaN
    RoPE -> 0. two_stage (or scratch fp32 ``[N, 512]``): pooling into scratch, then finishing;
    byte-identical rows. Returns cache.
    """
    op = "compress"
    _compressor_arrays(op, positions, request_index, state_slots, out_slots, state_block_table,
                       state, norm_weight, rope, cache, scratch)
    ratio = _ck.integer(op, "ratio", ratio, 1, _ck.I32_MAX)
    norm_eps, sanitise, two_stage, path = _compressor_options(op, norm_eps, sanitise, two_stage,
                                                              path)
    if scratch is None and two_stage:
        scratch = _empty(positions, (positions.shape[0], 512), "float32")
    args = (positions, request_index, state_slots, out_slots, state_block_table, state, norm_weight,
            rope, cache, _bs(op, block_size), ratio, norm_eps, sanitise, scratch, path)
    _dispatch("compress", _r_compress, cache, args)
    return cache


def _r_compress_indexer(positions, request_index, state_slots, out_slots, state_block_table, state,
                        norm_weight, rope, cache, block_size, norm_eps, sanitise, scratch, path):
    with _guard(cache):
        _C.compress_indexer(_dl("positions", positions), _dl("request_index", request_index),
                            _dl("state_slots", state_slots), _dl("out_slots", out_slots),
                            _dl("state_block_table", state_block_table), _dl("state", state),
                            _dl("norm_weight", norm_weight), _dl("rope", rope),
                            _dl("cache", cache), block_size, norm_eps, sanitise,
                            _dl("scratch", scratch), path, _stream(cache))


def compress_indexer(positions, request_index, state_slots, out_slots, state_block_table, state,
                     norm_weight, rope, cache, *, block_size=None, norm_eps=1e-6, sanitise=True,
                     two_stage=False, scratch=None, path="auto"):
    """Indexer-key compressor (CONTRACT 3.2, last paragraph): as :func:`compress` with ratio 4 and head
    128 (state W = 256, norm_weight fp32 ``[128]``, RoPE dims 64..127), one 128-wide quantiser block,
    fp32 scale, into a uint8 paged indexer cache (132 bytes per token, NORMAL layout).
    scratch: fp32 ``[N, 128]`` for the two-stage form. Returns cache.
    """
    op = "compress_indexer"
    _compressor_arrays(op, positions, request_index, state_slots, out_slots, state_block_table,
                       state, norm_weight, rope, cache, scratch)
    norm_eps, sanitise, two_stage, path = _compressor_options(op, norm_eps, sanitise, two_stage,
                                                              path)
    if scratch is None and two_stage:
        scratch = _empty(positions, (positions.shape[0], 128), "float32")
    args = (positions, request_index, state_slots, out_slots, state_block_table, state, norm_weight,
            rope, cache, _bs(op, block_size), norm_eps, sanitise, scratch, path)
    _dispatch("compress_indexer", _r_compress_indexer, cache, args)
    return cache


# ---- gather ------------------------------------------------------------------------------------------
def _r_gather_indexer_keys(token_to_seq, cu_seqlen, block_table, cache, block_size, layout, k_fp8,
                           k_scale, path):
    with _guard(k_scale):
        _C.gather_indexer_keys(_dl("token_to_seq", token_to_seq), _dl("cu_seqlen", cu_seqlen),
                               _dl("block_table", block_table), _dl("cache", cache), block_size,
                               layout, _dl("k_fp8", k_fp8), _dl("k_scale", k_scale), path,
                               _stream(k_scale))


def gather_indexer_keys(token_to_seq, cu_seqlen, block_table, cache, *, block_size=None,
                        layout="normal", k_fp8=None, k_scale=None, path="auto"):
    """Indexer-key gather (CONTRACT 6): paged indexer cache -> contiguous keys of a prefill chunk.

    token_to_seq: int32 ``[N]`` (sequence of each output row; out of range: padding token);
    cu_seqlen: int32 ``[B+1]``; block_table: int32 ``[>= B, width]``; cache: uint8 paged indexer
    cache; layout ``"normal"``/``"shuffle"``. Row tid of sequence b, position
    ``o = tid - cu_seqlen[b]``, reads page ``block_table[b][o // bs]`` row ``o % bs``.
    k_fp8: uint8 ``[N, 128]`` (rows may be strided) and k_scale: fp32 ``[N]``, written in place
    (allocated zero-filled when None). Invalid tokens write nothing; a valid token whose page is
    invalid gets scale 0 and an untouched value row. Returns ``(k_fp8, k_scale)``.
    """
    op = "gather_indexer_keys"
    _arrays(op, required=[("token_to_seq", token_to_seq, 1), ("cu_seqlen", cu_seqlen),
                          ("block_table", block_table), ("cache", cache)],
            optional_written=[("k_fp8", k_fp8), ("k_scale", k_scale)])
    block_size = _bs(op, block_size)
    layout, path = _ck.text(op, "layout", layout), _ck.path(op, path)
    n = token_to_seq.shape[0]
    if k_fp8 is None:
        k_fp8 = _zeros(token_to_seq, (n, 128), "uint8")
    if k_scale is None:
        k_scale = _zeros(token_to_seq, (n,), "float32")
    args = (token_to_seq, cu_seqlen, block_table, cache, block_size, layout, k_fp8, k_scale, path)
    _dispatch("gather_indexer_keys", _r_gather_indexer_keys, k_scale, args)
    return k_fp8, k_scale


# ---- ragged lists --------------------------------------------------------------------------------------
def alloc_ragged(max_rows, width, like):
    """Persistent list buffers for CUDA graphs (CONTRACT 4.6): ``(indices int32 [max_rows*width],
    indptr int32 [max_rows+1])`` in the library/device of ``like``. Builders rewrite them in place
    every step (pass ``out=(indices, indptr)`` and rows of the captured count; ``row_valid`` 0 for
    rows beyond the live batch), so their addresses never change."""
    op = "alloc_ragged"
    max_rows = _ck.integer(op, "max_rows", max_rows, 0, _ck.I32_MAX - 1)
    width = _ck.integer(op, "width", width, 0, _ck.I32_MAX)
    _ck.array(op, "like", like)
    return _empty(like, (max_rows * width,), "int32"), _empty(like, (max_rows + 1,), "int32")


def _builder_arrays(op, main, request_index, block_table, row_valid, out, extra=()):
    """Checks a builder's arrays: main = (name, array, ndim), the optional ones, out."""
    required = [main] + ([("block_table", block_table)] if block_table is not None else [])
    _arrays(op, required=required,
            optional=[("request_index", request_index), ("row_valid", row_valid), *extra])
    _ck.out_pair(op, out)


def _outs(out, like, rows, width):
    if out is not None:
        return out[0], out[1]
    return alloc_ragged(rows, width, like)


def _r_build_ragged_from_dense(dense, lengths, request_index, num_slots, row_valid, out_indices,
                               out_indptr, path):
    with _guard(out_indptr):
        _C.build_ragged_from_dense(_dl("dense", dense), _dl("lengths", lengths),
                                   _dl("request_index", request_index), num_slots,
                                   _dl("row_valid", row_valid), _dl("out_indices", out_indices),
                                   _dl("out_indptr", out_indptr), path, _stream(out_indptr))


def build_ragged_from_dense(dense, lengths, *, request_index=None, num_slots=0, row_valid=None,
                            out=None, path="auto"):
    """Dense index rows + lengths -> a ragged list (CONTRACT 4.6).

    dense: int32 ``[R, W]`` (rows may be strided); lengths: int32 ``[R]``, or ``[num_requests]``
    with request_index int32 ``[R]`` (FlashMLA's per-request ``topk_length``, broadcast to the
    request's rows). Row r keeps its first ``clamp(len, 0, W)`` entries; with ``num_slots > 0`` kept
    values outside ``[0, num_slots)`` become -1. row_valid: uint8 ``[R]`` (0: padding row, length
    0) or None. out: ``(indices int32 [>= R*W], indptr int32 [>= R+1])`` written in place, else
    allocated. Returns ``(indices, indptr)``; the planner width of the list is W.
    """
    op = "build_ragged_from_dense"
    _builder_arrays(op, ("dense", dense, 2), request_index, None, row_valid, out)
    _ck.array(op, "lengths", lengths)
    num_slots = _ck.integer(op, "num_slots", num_slots)
    r, w = dense.shape
    out_indices, out_indptr = _outs(out, dense, r, w)
    args = (dense, lengths, request_index, num_slots, row_valid, out_indices, out_indptr,
            _ck.path(op, path))
    _dispatch("build_ragged_from_dense", _r_build_ragged_from_dense, out_indptr, args)
    return out_indices, out_indptr


def _r_build_window_lists(positions, request_index, block_table, block_size, window, width,
                          row_valid, out_indices, out_indptr, path):
    with _guard(out_indptr):
        _C.build_window_lists(_dl("positions", positions), _dl("request_index", request_index),
                              _dl("block_table", block_table), block_size, window, width,
                              _dl("row_valid", row_valid), _dl("out_indices", out_indices),
                              _dl("out_indptr", out_indptr), path, _stream(out_indptr))


def build_window_lists(positions, block_table, block_size, *, request_index=None, window=128,
                       width=None, row_valid=None, out=None, path="auto"):
    """Sliding-window lists (CONTRACT 4.6): row r covers positions ``max(pos-127, 0) .. pos``
    (``len = min(pos+1, window)``), entry j = slot of position ``start + j`` through the window
    block table: ``block_table[req][q // block_size] * block_size + q % block_size`` (-1 past the
    table row).

    positions: int64 ``[R]`` query positions; block_table: int32 ``[num_requests, table_width]``;
    request_index: int32 ``[R]`` (None: row r is request r); width W (default window) >= window;
    row_valid, out as in :func:`build_ragged_from_dense`. Returns ``(indices, indptr)``.
    """
    op = "build_window_lists"
    _builder_arrays(op, ("positions", positions, 1), request_index, block_table, row_valid, out)
    block_size = _ck.integer(op, "block_size", block_size, 1, _ck.I32_MAX)
    window = _ck.integer(op, "window", window, 1, _ck.I32_MAX)
    width = _ck.integer(op, "width", window if width is None else width, 0, _ck.I32_MAX)
    r = positions.shape[0]
    out_indices, out_indptr = _outs(out, positions, r, width)
    args = (positions, request_index, block_table, block_size, window, width, row_valid,
            out_indices, out_indptr, _ck.path(op, path))
    _dispatch("build_window_lists", _r_build_window_lists, out_indptr, args)
    return out_indices, out_indptr


def _r_build_topk_lists(topk, topk_length, request_index, block_table, block_size, row_valid,
                        out_indices, out_indptr, path):
    with _guard(out_indptr):
        _C.build_topk_lists(_dl("topk", topk), _dl("topk_length", topk_length),
                            _dl("request_index", request_index), _dl("block_table", block_table),
                            block_size, _dl("row_valid", row_valid),
                            _dl("out_indices", out_indices), _dl("out_indptr", out_indptr), path,
                            _stream(out_indptr))


def build_topk_lists(topk, block_table, block_size, *, topk_length=None, request_index=None,
                     row_valid=None, out=None, path="auto"):
    """Ratio-4 lists from the indexer's local top-k (CONTRACT 4.6).

    topk: int32 ``[R, W]`` local compressed indices; block_table: int32 ``[num_requests, Wt]``
    (compressed cache pages, page size block_size). ``len`` = number of entries in
    ``[0, Wt*block_size)`` (only the first ``topk_length[req]`` entries count when topk_length
    int32 ``[num_requests]`` is given); the first len entries are kept, local i ->
    ``block_table[req][i // bs] * bs + i % bs``, entries of that prefix out of range -> -1.
    request_index, row_valid, out as in :func:`build_window_lists`. Returns ``(indices, indptr)``.
    """
    op = "build_topk_lists"
    _builder_arrays(op, ("topk", topk, 2), request_index, block_table, row_valid, out,
                    extra=[("topk_length", topk_length)])
    block_size = _ck.integer(op, "block_size", block_size, 1, _ck.I32_MAX)
    r, w = topk.shape
    out_indices, out_indptr = _outs(out, topk, r, w)
    args = (topk, topk_length, request_index, block_table, block_size, row_valid, out_indices,
            out_indptr, _ck.path(op, path))
    _dispatch("build_topk_lists", _r_build_topk_lists, out_indptr, args)
    return out_indices, out_indptr


def _r_build_compressed_all_lists(positions, request_index, block_table, block_size, ratio,
                                  max_compressed, width, row_valid, out_indices, out_indptr, path):
    with _guard(out_indptr):
        _C.build_compressed_all_lists(_dl("positions", positions),
                                      _dl("request_index", request_index),
                                      _dl("block_table", block_table), block_size, ratio,
                                      max_compressed, width, _dl("row_valid", row_valid),
                                      _dl("out_indices", out_indices),
                                      _dl("out_indptr", out_indptr), path, _stream(out_indptr))


def build_compressed_all_lists(positions, block_table, block_size, max_compressed, *, ratio=128,
                               request_index=None, width=None, row_valid=None, out=None,
                               path="auto"):
    """Ratio-128 lists, every compressed entry so far (CONTRACT 4.6): row r has
    ``n = min((pos+1) // ratio, max_compressed)`` entries i = 0..n-1 mapped through block_table as
    in :func:`build_topk_lists`. max_compressed: :func:`max_compressed_entries` (8192 at 1M
    context); width W (default max_compressed) >= max_compressed. Returns ``(indices, indptr)``.
    """
    op = "build_compressed_all_lists"
    _builder_arrays(op, ("positions", positions, 1), request_index, block_table, row_valid, out)
    block_size = _ck.integer(op, "block_size", block_size, 1, _ck.I32_MAX)
    ratio = _ck.integer(op, "ratio", ratio, 1, _ck.I32_MAX)
    max_compressed = _ck.integer(op, "max_compressed", max_compressed, 0, _ck.I32_MAX)
    width = _ck.integer(op, "width", max_compressed if width is None else width, 0, _ck.I32_MAX)
    r = positions.shape[0]
    out_indices, out_indptr = _outs(out, positions, r, width)
    args = (positions, request_index, block_table, block_size, ratio, max_compressed, width,
            row_valid, out_indices, out_indptr, _ck.path(op, path))
    _dispatch("build_compressed_all_lists", _r_build_compressed_all_lists, out_indptr, args)
    return out_indices, out_indptr


def max_compressed_entries(max_model_len, ratio=128):
    """``roundup(ceil(max_model_len / ratio), 128)``: the width W of ratio-128 lists."""
    op = "max_compressed_entries"
    return _C.max_compressed_entries(_ck.integer(op, "max_model_len", max_model_len),
                                     _ck.integer(op, "ratio", ratio, 1, _ck.I32_MAX))


# ---- lightning indexer (CONTRACT 11) ---------------------------------------------------------------
INDEXER_MAX_TOPK = _C.INDEXER_MAX_TOPK  # k in 1..2048
_ORDERS = ("by_index", "by_score")


def _e4m3_bytes(x):
    """An e4m3 array as its raw bytes: torch.float8_e4m3fn and ml_dtypes' float8_e4m3fn are viewed
    as uint8 (the same bytes); anything else is passed on for the extension to check."""
    if _is_tensor(x) and x.dtype == getattr(_torch_mod(), "float8_e4m3fn", None):
        return x.view(_torch_mod().uint8)
    if isinstance(x, np.ndarray) and x.dtype.name == "float8_e4m3fn" and x.dtype.itemsize == 1:
        return x.view(np.uint8)
    return x


def _r_indexer_topk(q, w, cache, block_table, row_request, num_candidates, topk, block_size,
                    layout, order, indices, lengths, scores, workspace, path):
    with _guard(indices):
        _C.indexer_topk(_dl("q", _e4m3_bytes(q)), _dl("w", w), _dl("cache", cache), block_size,
                        layout, _dl("block_table", block_table), _dl("row_request", row_request),
                        _dl("num_candidates", num_candidates), topk, order,
                        _dl("indices", indices), _dl("lengths", lengths), _dl("scores", scores),
                        _dl("workspace", workspace), _alloc_like(indices), path,
                        _stream(indices))


def _indexer_args(op, q, w, cache, block_table, row_request, num_candidates, topk, block_size,
                  layout, order, path):
    _arrays(op, required=[("q", q, 3), ("w", w, 2), ("cache", cache),
                          ("block_table", block_table, 2), ("row_request", row_request, 1),
                          ("num_candidates", num_candidates, 1)])
    return (_ck.integer(op, "topk", topk, -_ck.I32_MAX, _ck.I32_MAX), _bs(op, block_size),
            _ck.text(op, "layout", layout, ("normal", "shuffle")),
            _ck.text(op, "order", order, _ORDERS), _ck.path(op, path))


def indexer_workspace_size(q, w, cache, block_table, row_request, num_candidates, topk, *,
                           block_size=None, layout="normal", width=None, order="by_index",
                           with_scores=False, path="auto"):
    """Workspace bytes :func:`indexer_topk` needs for these arguments (CONTRACT 11.5: a size query
    over the shapes, where the arrays live and the path; 0 on the CPU). width: W of the output
    (default topk); with_scores: whether scores will be requested. Runs nothing."""
    op = "indexer_workspace_size"
    topk, block_size, layout, order, path = _indexer_args(
        op, q, w, cache, block_table, row_request, num_candidates, topk, block_size, layout, order,
        path)
    width = _ck.integer(op, "width", topk if width is None else width, 0, _ck.I32_MAX)
    with _guard(q):
        return _C.indexer_workspace_size(
            _dl("q", _e4m3_bytes(q)), _dl("w", w), _dl("cache", cache), block_size, layout,
            _dl("block_table", block_table), _dl("row_request", row_request),
            _dl("num_candidates", num_candidates), topk, width, order,
            _ck.flag(op, "with_scores", with_scores), path)


def indexer_topk(q, w, cache, block_table, row_request, num_candidates, topk, *, block_size=None,
                 layout="normal", width=None, order="by_index", return_lengths=False,
                 return_scores=False, out=None, lengths=None, scores=None, workspace=None,
                 path="auto"):
    """The lightning-indexer decode (CONTRACT 11): per query row, the scores of the request's
    compressed entries (11.2) and the best ``topk`` by the exact rule of 11.3, as the dense list
    the ratio-4 builder (:func:`build_topk_lists`) reads.

    q: e4m3 ``[T, H, 128]`` (uint8 bytes, ``torch.float8_e4m3fn`` or ml_dtypes' float8_e4m3fn;
    H in 1..128, last dim contiguous, other strides free), the indexer query after RoPE and
    quantisation (:func:`indexer_q_prep` makes it from bf16); w: fp32 ``[T, H]`` (rows may be
    strided), the head weights with every scale folded in (11.1). cache: uint8 paged indexer
    cache (132 bytes per entry, ``layout`` ``"normal"`` or ``"shuffle"``); block_table: int32
    ``[R, Wt]``, entry j of request r is row ``j % block_size`` of page ``block_table[r][j //
    block_size]``. row_request: int32 ``[T]`` (outside ``[0, R)``: padding row); num_candidates:
    int32 ``[T]`` n_t (:func:`indexer_candidates_from_positions`; < 0: 0, clamped to
    ``Wt*block_size``); a page id outside ``[0, num_blocks)`` removes its entries (11.4).
    topk: k in 1..2048; width: W >= k of the output (default k, or ``out.shape[1]``).
    order: ``"by_index"`` (ascending local index, default) or ``"by_score"`` (descending score,
    then ascending index). Non-finite scores rank last, -0 ties +0, ties go to the lower index.

    out: int32 ``[T, W]`` (rows may be strided), lengths: int32 ``[T]``, scores: fp32 ``[T, W]``
    written in place (else allocated; lengths and scores only when given or asked for with
    ``return_lengths`` / ``return_scores``). Row t holds ``len_t = min(k, |C_t|)`` distinct local
    indices, then -1 up to W; scores holds the fp32 score of each selected entry, -inf in the
    padding. workspace: contiguous bytes, >= :func:`indexer_workspace_size` (allocated on the
    call's device when needed and None; 0 on the CPU). Returns out, or ``(out, lengths,
    scores)`` (None for one not requested) when lengths or scores are given or asked for.
    """
    op = "indexer_topk"
    topk, block_size, layout, order, path = _indexer_args(
        op, q, w, cache, block_table, row_request, num_candidates, topk, block_size, layout, order,
        path)
    _arrays(op, optional_written=[("out", out, 2), ("lengths", lengths, 1),
                                  ("scores", scores, 2), ("workspace", workspace)])
    return_lengths = _ck.flag(op, "return_lengths", return_lengths)
    return_scores = _ck.flag(op, "return_scores", return_scores)
    t = q.shape[0]
    if out is None:
        w_out = _ck.integer(op, "width", topk if width is None else width, 0, _ck.I32_MAX)
        if 1 <= topk <= INDEXER_MAX_TOPK and w_out < topk:
            _ck.fail(op, "width", f"None or an integer >= topk = {topk}", str(w_out))
        out = _empty(w, (t, w_out), "int32")
    elif width is not None and _ck.integer(op, "width", width, 0, _ck.I32_MAX) != out.shape[1]:
        _ck.fail(op, "width", f"None or out.shape[1] = {out.shape[1]}", str(width))
    if lengths is None and return_lengths:
        lengths = _empty(w, (t,), "int32")
    if scores is None and return_scores:
        scores = _empty(w, (t, out.shape[1]), "float32")
    args = (q, w, cache, block_table, row_request, num_candidates, topk, block_size, layout, order,
            out, lengths, scores, workspace, path)
    _dispatch("indexer_topk", _r_indexer_topk, out, args)
    if lengths is None and scores is None:
        return out
    return out, lengths, scores


def indexer_candidates_from_positions(positions, *, out=None):
    """n_t = floor((pos_t + 1) / 4) per row (CONTRACT 11.1), 0 where pos_t < 0 (padding rows): the
    num_candidates of :func:`indexer_topk` in a decode step. positions: int64 ``[T]``. Returns
    int32 ``[T]`` (out, when given: written in place). numpy arrays run the library's helper
    (a position >= 2^33, whose n_t overflows int32, raises); torch tensors (any device) compute the
    same with torch operations (traceable, no host synchronisation; not range-checked)."""
    op = "indexer_candidates_from_positions"
    _arrays(op, required=[("positions", positions, 1)], optional_written=[("out", out, 1)])
    if _is_tensor(positions):
        torch = _torch_mod()
        if positions.dtype != torch.int64:
            _ck.fail(op, "positions", "dtype int64", str(positions.dtype).replace("torch.", ""))
        n = torch.where(positions < 0, torch.zeros_like(positions),
                        torch.div(positions, 4, rounding_mode="floor")
                        + (torch.remainder(positions, 4) == 3).to(torch.int64)).to(torch.int32)
        if out is None:
            return n
        out.copy_(n)
        return out
    if out is None:
        out = _empty(positions, (positions.shape[0],), "int32")
    _C.indexer_candidates_from_positions(_dl("positions", positions), _dl("out", out))
    return out


def _r_indexer_q_prep(q, positions, rope, w_raw, q_out, w_out, path):
    with _guard(w_out):
        _C.indexer_q_prep(_dl("q", q), _dl("positions", positions), _dl("rope", rope),
                          _dl("w_raw", w_raw), _dl("q_out", _e4m3_bytes(q_out)),
                          _dl("w_out", w_out), path, _stream(w_out))


def indexer_q_prep(q, positions, rope, w_raw, *, q_out=None, w_out=None, path="auto"):
    """The indexer query prep (CONTRACT 11.6): bf16 query -> the e4m3 query and folded weights of
    :func:`indexer_topk`.

    q: bf16 ``[T, H, 128]`` (last dim contiguous), the query after ``wq_b``; positions: int64
    ``[T]`` (``< 0``: padding row, outputs zero); rope: fp32 ``[P, 64]`` the layer's table;
    w_raw: bf16 ``[T, H]``, the output of ``weights_proj``. Per (t, h): dims 64..127 rotated as
    GPT-J pairs (fp32, rounded to bf16); ``amax = max(|x|, 1e-4)``, ``e = ceil(log2(amax/448))``
    exactly; bytes ``e4m3fn(clamp(x * 2^-e, +-448))`` (RNE, NaN -> -448); ``w = ((fp32(w_raw) *
    2^e) * 128^-0.5) * 64^-0.5``. No Hadamard rotation. q_out: uint8 (or float8_e4m3fn)
    ``[T, H, 128]`` and w_out: fp32 ``[T, H]`` written in place (else allocated). numpy arrays
    and CPU tensors run the CPU backend; CUDA tensors the generic CUDA kernel on the current stream
    (bit-identical to the CPU; a position past the table gives a padding row there, where the CPU
    raises; ``path="cuda-sm90"`` raises naming ``path``). Returns ``(q_out, w_out)``.
    """
    op = "indexer_q_prep"
    _arrays(op, required=[("q", q, 3), ("positions", positions, 1), ("rope", rope, 2),
                          ("w_raw", w_raw, 2)],
            optional_written=[("q_out", q_out, 3), ("w_out", w_out, 2)])
    path = _ck.path(op, path)
    t, h = q.shape[0], q.shape[1]
    if q_out is None:
        q_out = _empty(positions, (t, h, 128), "uint8")
    if w_out is None:
        w_out = _empty(positions, (t, h), "float32")
    _dispatch("indexer_q_prep", _r_indexer_q_prep, w_out,
              (q, positions, rope, w_raw, q_out, w_out, path))
    return q_out, w_out


# ---- decode context parallelism (CONTRACT 12) --------------------------------------------------------
def _r_merge_ranks(rank_out, rank_lse, sink, positions, rope, out, lse, path):
    with _guard(out):
        _C.merge_ranks(_dl("rank_out", rank_out), _dl("rank_lse", rank_lse), _dl("sink", sink),
                       _dl("positions", positions), _dl("rope", rope), _dl("out", out),
                       _dl("lse", lse), path, _stream(out))


def merge_ranks(rank_out, rank_lse, *, sink=None, positions=None, rope=None, out=None, lse=None,
                return_lse=True, path="auto"):
    """Merges the decode results of R context-parallel ranks (CONTRACT 12.1) and applies the sink
    once: the exact combination of one softmax over all the ranks' keys.

    rank_out: bf16 (or fp32, the more accurate option) ``[R, T, H, 512]``, each rank's
    :func:`sparse_decode` output computed **without** the sink; rank_lse: fp32 ``[R, T, H]``,
    their lse (natural log, without the sink, ``+inf`` for a rank with no valid key: such a rank
    contributes nothing and its output is never read). Per (t, h), with ``M = max(max_r lse_r,
    sink_h)``: ``out = sum_r exp(lse_r - M) out_r / (sum_r exp(lse_r - M) + exp(sink_h - M))``,
    then the inverse RoPE at ``positions`` with ``rope`` when given; merged ``lse = log sum_r
    exp(lse_r)`` (never includes the sink; ``+inf`` when every rank is empty, whose output is 0).
    sink: fp32 ``[H]`` or None. out: bf16 ``[T, H, 512]`` and lse: fp32 ``[T, H]`` written in place
    (else allocated; ``return_lse=False`` skips the lse). The CPU backend and the CUDA kernel give
    the same bits. Returns ``(out, lse)`` (lse None when not requested).
    """
    op = "merge_ranks"
    _arrays(op, required=[("rank_out", rank_out, 4), ("rank_lse", rank_lse, 3)],
            optional=[("sink", sink, 1), ("positions", positions, 1), ("rope", rope, 2)],
            optional_written=[("out", out, 3), ("lse", lse, 2)])
    path = _ck.path(op, path)
    _, t, h, _ = rank_out.shape
    if out is None:  # bf16: torch.bfloat16 for tensors, uint16 bf16 bits for numpy
        out = (_torch_mod().empty((t, h, 512), dtype=_torch_mod().bfloat16, device=rank_lse.device)
               if _is_tensor(rank_lse) else np.empty((t, h, 512), dtype=np.uint16))
    if lse is None and return_lse:
        lse = _empty(rank_lse, (t, h), "float32")
    _dispatch("merge_ranks", _r_merge_ranks, out,
              (rank_out, rank_lse, sink, positions, rope, out, lse, path))
    return out, lse


def _r_shard_list(indices, indptr, lengths, num_ranks, rank, interleave, num_slots, row_valid,
                  out_indices, out_indptr, width, path):
    with _guard(out_indptr):
        _C.shard_list(_dl("indices", indices), _dl("indptr", indptr), _dl("lengths", lengths),
                      num_ranks, rank, interleave, num_slots, _dl("row_valid", row_valid),
                      _dl("out_indices", out_indices), _dl("out_indptr", out_indptr), width, path,
                      _stream(out_indptr))


def shard_list(indices, indptr=None, *, num_ranks, rank, interleave=1, num_slots=0, lengths=None,
               width=None, row_valid=None, out=None, path="auto"):
    """Rank ``rank``'s part of a list (CONTRACT 12.2): row t keeps, in order, the entries ``v`` of
    row t with ``0 <= v`` (``< num_slots`` when > 0) and ``(v // interleave) % num_ranks == rank``,
    as the local slots ``(v // (interleave*num_ranks)) * interleave + v % interleave`` (vLLM's
    decode-context-parallel interleave over the virtual block table of page size
    ``num_ranks * block_size``). The list: ragged ``(indices int32 [cap], indptr int32 [T+1])``,
    or dense ``indices`` int32 ``[T, W]`` (``indptr=None``) with optional per-row ``lengths``
    ``[T]``. width: the output's row width W (default: the input's, ``W`` of a dense list or
    ``cap // T``); every rank's row must fit it. row_valid, out as in
    :func:`build_ragged_from_dense`. Returns ``(indices, indptr)`` (planner width W)."""
    op = "shard_list"
    _arrays(op, required=[("indices", indices)],
            optional=[("indptr", indptr, 1), ("lengths", lengths, 1), ("row_valid", row_valid, 1)])
    _ck.out_pair(op, out)
    num_ranks = _ck.integer(op, "num_ranks", num_ranks, 1, 1024)
    rank = _ck.integer(op, "rank", rank, 0, num_ranks - 1)
    interleave = _ck.integer(op, "interleave", interleave, 1, _ck.I32_MAX)
    num_slots = _ck.integer(op, "num_slots", num_slots)
    if indptr is None:
        t = indices.shape[0]
        default_width = indices.shape[1] if len(indices.shape) == 2 else 1
    else:
        t = indptr.shape[0] - 1
        default_width = indices.shape[0] // t if t > 0 else 1
    width = _ck.integer(op, "width", default_width if width is None else width, 1, _ck.I32_MAX)
    path = _ck.path(op, path)
    out_indices, out_indptr = _outs(out, indices, max(t, 0), width)
    _dispatch("shard_list", _r_shard_list, out_indptr,
              (indices, indptr, lengths, num_ranks, rank, interleave, num_slots, row_valid,
               out_indices, out_indptr, width, path))
    return out_indices, out_indptr


# ---- planners and gates ----------------------------------------------------------------------------------
def plan_generic(num_tokens, num_heads, width_main, width_extra, num_sms):
    """Generic split selector of CONTRACT 4.4 (cap 16): S from T, hb = ceil(H/16), the lists' dense
    widths and the multiprocessor count CU."""
    return _C.plan("generic", num_tokens, num_heads, width_main, width_extra, num_sms)


def plan_specialised_ref(num_tokens, num_heads, width_main, width_extra, num_sms):
    """Specialised split selector of CONTRACT 4.4 exactly as specified (cap 32; conformance-pinned)."""
    return _C.plan("specialised", num_tokens, num_heads, width_main, width_extra, num_sms)


def plan_sm90_tuned(num_tokens, num_heads, width_main, width_extra, num_sms):
    """The split policy the specialised path launches with, re-tuned for its 64-head CTAs on 132
    SMs: one wave (num_sms / (T * ceil(H / 64))), >= 2 key tiles per split (>= 1 below 8 CTAs),
    capped at 16; always in [1, 32]."""
    return _C.plan("sm90-tuned", num_tokens, num_heads, width_main, width_extra, num_sms)


def auto_prefers_sm90(num_tokens, num_heads, width_main, width_extra, num_sms=132,
                      deterministic=False):
    """Whether ``path="auto"`` takes the sm90 kernels where the architecture gate allows them: where
    they were measured faster than the generic ones on the H200 (not deterministic; >= 64 heads
    with >= 16 CTAs of 64 heads or >= 8 with rows of >= 2048 keys; 8..63 heads from 32 query
    rows; docs/PERF.md)."""
    return _C.auto_prefers_sm90(num_tokens, num_heads, width_main, width_extra, num_sms,
                                bool(deterministic))


def plan_iters(width_main, width_extra, s):
    """iters(s) of CONTRACT 4.4: key blocks of 32 per split over both lists."""
    return _C.plan_iters(width_main, width_extra, s)


def adaptive_one_wave(num_tokens, num_heads, width_main, width_extra, num_sms, splits):
    """ONE_WAVE of CONTRACT 4.5: ``max(1, CU // base)`` when ``16 <= base < 64``, else splits."""
    return _C.adaptive_one_wave(num_tokens, num_heads, width_main, width_extra, num_sms, splits)


def adaptive_active_splits(len_main, len_extra, splits, one_wave):
    """Splits that do work for a row with true lengths (len_main, len_extra) (CONTRACT 4.5)."""
    return _C.adaptive_active_splits(len_main, len_extra, splits, one_wave)


def may_skip_extra_scrub(specialised_path, format_is_fp8_ds_mla, kv_connector, has_extra_cache,
                         extra_cache_sanitised):
    """The NaN provenance gate of CONTRACT 5: True only when all of specialised path, fp8_ds_mla format,
    no KV connector, an extra cache and a sanitised extra cache hold."""
    return _C.may_skip_extra_scrub(bool(specialised_path), bool(format_is_fp8_ds_mla),
                                   bool(kv_connector), bool(has_extra_cache),
                                   bool(extra_cache_sanitised))


def select_gpu_path(cc_major, cc_minor, have_sm90a_kernels, caches_fast_aligned, requested="auto"):
    """The architecture gate of CONTRACT 7: ``"cuda-sm90"`` only on cc 9.0 with sm_90a kernels and
    16-byte aligned caches (or when forced), else ``"cuda-generic"``."""
    return _C.select_gpu_path(cc_major, cc_minor, bool(have_sm90a_kernels),
                              bool(caches_fast_aligned), requested)


# ---- decode ------------------------------------------------------------------------------------------------
# The decode's arrays and integer options, in the order _C.DecodeArgs and the torch ops take them
# (the binding defines both lists), and every keyword of sparse_decode with its default.
_DECODE_INPUTS = tuple(_C.DECODE_INPUTS)
_DECODE_CONFIG = tuple(name for name, _ in _C.DECODE_CONFIG)
_DECODE_KW = {**dict.fromkeys(_DECODE_INPUTS[4:]), **dict(_C.DECODE_CONFIG),
              "main_block_size": None, "extra_block_size": None, "scale": None,
              "path": "auto", "plan": None, "out": None, "lse": None, "workspace": None,
              "return_lse": False}


class DecodePlan:
    """A decode plan (C++ ``sparsemla::DecodePlan``, made by :func:`plan_decode`): what a call
    decides before it launches, from shapes and placement only. Read-only fields: ``path``
    (``"cpu"``, ``"cuda-generic"``, ``"cuda-sm90"``), ``num_splits``, ``num_sms``,
    ``adaptive_splits``, ``one_wave``, ``fused_combine``, ``head_blocks_per_cta``,
    ``workspace_bytes`` and ``shape`` (what it was planned for: ``num_tokens``, ``num_heads``,
    ``width_main``, ``width_extra``, ``has_extra``, ``device``, ``caches_aligned``, ``path``,
    ``num_splits``, ``adaptive_splits``, ``deterministic``, ``num_sms``). ``packed``: the plan as
    a tuple of ints, the form torch ops, compiled graphs and CUDA graphs carry."""

    def __init__(self, plan):
        self.__dict__.update(_plan=plan, packed=tuple(plan.packed))

    def __getattr__(self, name):
        plan = self.__dict__.get("_plan")
        if plan is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(plan, name)

    def __setattr__(self, name, value):
        raise AttributeError(f"sparsemla.DecodePlan: '{name}' is read-only")

    def __eq__(self, other):
        return isinstance(other, DecodePlan) and other.packed == self.packed

    def __hash__(self):
        return hash(self.packed)

    def __repr__(self):
        s = self.shape
        return (f"DecodePlan(path='{self.path}', num_splits={self.num_splits}, workspace_bytes="
                f"{self.workspace_bytes}; T={s.num_tokens}, H={s.num_heads}, widths {s.width_main}"
                f"{f' + {s.width_extra}' if s.has_extra else ''}, device {s.device})")


def _cuda_available():
    torch = _torch_mod()
    return torch is not None and torch.cuda.is_available()


def _device_ordinal(device):
    """-1 (host data) or the CUDA ordinal of "cpu", "cuda[:N]", a torch.device, an int, or an
    array / tensor (its device)."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, (bool, np.bool_)):
        return _ck.integer("plan_decode", "device", device, -1, _ck.I32_MAX)
    text = str(getattr(device, "device", device))
    if text == "cpu" or text.startswith("cuda:"):
        return -1 if text == "cpu" else int(text[5:])
    if text == "cuda":
        return _torch_mod().cuda.current_device() if _cuda_available() else 0
    raise Error(f"sparsemla::plan_decode: argument 'device': expected 'cpu', 'cuda[:N]', a "
                f"torch.device, a CUDA ordinal or an array, got {device!r}")


def plan_decode(num_tokens, num_heads, width_main, width_extra=0, *, has_extra=None, device="cpu",
                path="auto", num_splits=0, adaptive_splits=False, deterministic=False, num_sms=0,
                caches_aligned=True):
    """Plans decodes of one shape (CONTRACT 4.4): an engine plans once per step and runs every layer of
    that shape with ``sparse_decode(..., plan=plan)``, which then plans nothing. Returns a
    :class:`DecodePlan`.

    width_main / width_extra: the lists' dense widths W (a dense list's ``shape[1]``, a builder's
    W, a ragged list's main_width or capacity // T); width_extra 0: a window-only layer (unless
    has_extra=True). device: where the data lives (``"cpu"``, ``"cuda[:N]"``, a torch.device, an
    ordinal or an array); caches_aligned: both caches' base and page stride 16-byte aligned (sm90
    needs it). path, num_splits, adaptive_splits, deterministic, num_sms: as for sparse_decode.
    """
    op, i = "plan_decode", _ck.integer
    shape = (i(op, "num_tokens", num_tokens), i(op, "num_heads", num_heads, -_ck.I32_MAX - 1, _ck.I32_MAX),
             i(op, "width_main", width_main), i(op, "width_extra", width_extra))
    has_extra = shape[3] > 0 if has_extra is None else _ck.flag(op, "has_extra", has_extra)
    ordinal = _device_ordinal(device)
    options = (_ck.flag(op, "caches_aligned", caches_aligned), _ck.path(op, path),
               i(op, "num_splits", num_splits, 0, _MAX_SPLITS),
               _ck.flag(op, "adaptive_splits", adaptive_splits),
               _ck.flag(op, "deterministic", deterministic),
               i(op, "num_sms", num_sms, 0, _ck.I32_MAX))
    guard = (_torch_mod().cuda.device(ordinal) if ordinal >= 0 and _cuda_available()
             else contextlib.nullcontext())
    with guard:  # the C++ planner plans for the current CUDA device
        return DecodePlan(_C.plan_decode(*shape, has_extra, ordinal, *options))


_MAX_SPLITS = 32  # CONTRACT 4.4: S in 1..32, 0: the path's planner
_DECODE_FLAGS = ("adaptive_splits", "deterministic", "extra_cache_sanitised", "kv_connector")


def _decode_option(op, name, v):
    """One integer option of a decode call (None: its default), checked (see _checks)."""
    if v is None:
        return dict(_C.DECODE_CONFIG)[name]
    if name in _DECODE_FLAGS:
        return int(_ck.flag(op, name, v))
    if name.endswith("_block_size"):
        return _ck.block_size(op, name, v)
    if name.endswith("_rows_per_length"):
        return _ck.integer(op, name, v, 1, _ck.I32_MAX)
    if name == "num_splits":
        return _ck.integer(op, name, v, 0, _MAX_SPLITS)
    return _ck.integer(op, name, v, 0, _ck.I32_MAX if name == "num_sms" else _ck.I64_MAX)


def _decode_arrays(op, inputs, k):
    """Checks a decode call's arrays before any is read: q [T, H, 512], caches and lists present,
    outputs writable."""
    _arrays(op, required=[("q", inputs[0], 3), ("main_cache", inputs[1]),
                          ("main_indices", inputs[2])],
            optional=list(zip(_DECODE_INPUTS[3:], inputs[3:])),
            optional_written=[(n, k[n]) for n in ("out", "lse", "workspace")])


def _decode_call(q, main_cache, main_indices, main_indptr, kw, op="sparse_decode"):
    """(inputs, config, scale, path, plan, k) of a call: its arrays in _DECODE_INPUTS order, its
    integer options in _DECODE_CONFIG order, the plan's integers (or None) and every keyword."""
    for name in kw:
        if name not in _DECODE_KW:
            raise TypeError(f"sparsemla.sparse_decode: unexpected keyword argument '{name}'")
    k = dict(_DECODE_KW)
    k.update(kw)
    inputs = [q, main_cache, main_indices, main_indptr] + [k[n] for n in _DECODE_INPUTS[4:]]
    _decode_arrays(op, inputs, k)
    config = [_decode_option(op, n, k[n]) for n in _DECODE_CONFIG]
    # Any finite scale is computed as written (<= 0 included); NaN / inf would only give NaN rows.
    scale = DEFAULT_SCALE if k["scale"] is None else _ck.real(op, "scale", k["scale"])
    k["return_lse"] = _ck.flag(op, "return_lse", k["return_lse"])
    plan = k["plan"]
    if plan is not None and not isinstance(plan, DecodePlan):
        _ck.fail(op, "plan", "a sparsemla.DecodePlan (plan_decode) or None", type(plan).__name__)
    path = _ck.path(op, k["path"])
    if plan is not None:
        _options_unset_with_plan(op, config, path)
    return inputs, config, scale, path, None if plan is None else list(plan.packed), k


def _options_unset_with_plan(op, config, path):
    """A plan holds the planning options: none of them may be given with it as well."""
    defaults = dict(_C.DECODE_CONFIG)
    for name in ("num_splits", "num_sms", "adaptive_splits", "deterministic"):
        value = config[_DECODE_CONFIG.index(name)]
        if value != defaults[name]:
            _ck.fail(op, name, f"unset ({defaults[name]}) with a plan (the plan holds it)",
                     str(value))
    if path != "auto":
        _ck.fail(op, "path", "'auto' with a plan (the plan holds the path)", repr(path))


def _args(inputs, config, scale, path, plan):
    """The _C.DecodeArgs of a call (call it under _guard(q))."""
    return _C.DecodeArgs([_dl(n, x) for n, x in zip(_DECODE_INPUTS, inputs)], config, scale, path,
                         plan, _stream(inputs[0]))


def _alloc_like(like):
    """The workspace allocator of a call on `like`'s device (CUDA: DLPack capsules)."""
    torch = _torch_mod()
    if _is_tensor(like) and like.is_cuda:
        return lambda n: torch.empty(n, dtype=torch.uint8, device=like.device).__dlpack__(stream=-1)
    if _is_tensor(like):
        return lambda n: torch.empty(n, dtype=torch.uint8)
    return lambda n: np.empty(n, dtype=np.uint8)


def _r_sparse_decode(inputs, out, lse, workspace, config, scale, path, plan):
    q = inputs[0]
    with _guard(q):
        _C.sparse_decode(_args(inputs, config, scale, path, plan), _dl("out", out), _dl("lse", lse),
                         _dl("workspace", workspace), _alloc_like(q))


def sparse_decode(q, main_cache, main_indices, main_indptr=None, **kwargs):
    """Sparse MLA decode against FP8 paged caches (CONTRACT 4): one softmax over the main and extra lists.

    q: bf16 ``[T, H, 512]`` (H in 1..128; last dim contiguous, other strides free).
    main_cache: uint8 paged fp8_ds_mla cache (the window cache; block_size from ``shape[1]`` of a
    >= 3-D cache, else ``main_block_size``). The main list (CONTRACT 4.6; global slot ids, -1 or any
    out-of-range value skipped) is ragged, main_indices int32 ``[cap]`` + main_indptr int32
    ``[>= T+1]`` (row t = ``indices[indptr[t]:indptr[t+1]]``; main_width: W for the planner, 0:
    cap // T), or dense (main_indptr None; FlashMLA's form, read directly): main_indices int32
    ``[T, W]`` (rows may be strided), row t = its first ``clamp(main_lengths[t //
    main_rows_per_length], 0, W)`` entries (main_lengths int32 per row ``[T]``, or per request
    ``[b]`` with main_rows_per_length = s_q; None: W). extra_*: the same for the compressed cache
    (ratio-4 top-k or ratio-128 lists), or None for window-only layers.
    sink: fp32 ``[H]`` in natural-log units (-inf: no effect, +inf: zero output, NaN: that head's
    output NaN in every row) or None; scale: any finite number (``<= 0`` computed as written),
    default ``512**-0.5``. A NaN or +inf score (e.g. NaN in q) makes that row's out and lse NaN
    (CONTRACT 4.2). positions int64 ``[T]`` + rope fp32 ``[P, 64]``: fused inverse RoPE of
    output dims 448..511 at each query's position (both or neither).
    plan: a :class:`DecodePlan` of this shape (:func:`plan_decode`): the call plans nothing and
    takes num_splits, num_sms, adaptive_splits, deterministic and path from it (give none of
    them); a call of another shape raises naming the field. Without one the call plans itself
    from them: num_splits S in 1..32 (0: the path's planner), num_sms CU (0: the device's),
    adaptive_splits (CONTRACT 4.5, sm90 path), deterministic (a row's out and lse bits do not depend
    on its batchmates: S planned as if T = 1, no adaptive rule), path.
    extra_cache_sanitised: every reachable extra row was written by this library's compressor in
    sanitising mode (the sm90 path without kv_connector then skips the extra scrub, CONTRACT 5).
    out: bf16 ``[T, H, 512]`` and lse: fp32 ``[T, H]`` (any strides; or FlashMLA's ``[b, H, s_q]``,
    row t at ``lse[t // s_q, :, t % s_q]``) written in place (else allocated): lse is the
    natural-log log-sum-exp of the scaled scores without the sink, +inf for a row without a valid
    key (whose output is exact 0); workspace: contiguous, >= the plan's
    ``workspace_bytes`` (allocated when needed and None). Returns out, or ``(out, lse)`` when
    ``return_lse`` or lse is given.
    """
    inputs, config, scale, path, plan, k = _decode_call(q, main_cache, main_indices, main_indptr,
                                                        kwargs)
    out, lse = k["out"], k["lse"]
    want_lse = k["return_lse"] or lse is not None
    if out is None:
        out = _empty(q, (q.shape[0], q.shape[1], 512), "like")
    if want_lse and lse is None:
        lse = _empty(q, (q.shape[0], q.shape[1]), "float32")
    args = (inputs, out, lse, k["workspace"], config, scale, path, plan)
    _dispatch("sparse_decode_out", _r_sparse_decode, q, args)
    return (out, lse) if want_lse else out


def _query(q, main_cache, main_indices, main_indptr, kwargs, op="sparse_decode"):
    """(_C.DecodeArgs, keywords) of a call that runs nothing (call it under _guard(q))."""
    inputs, config, scale, path, plan, k = _decode_call(q, main_cache, main_indices, main_indptr,
                                                        kwargs, op)
    return _args(inputs, config, scale, path, plan), k


def plan_decode_for(q, main_cache, main_indices, main_indptr=None, **kwargs):
    """The :class:`DecodePlan` that :func:`sparse_decode` with these arguments makes (its shape
    and placement read from the arrays); runs nothing."""
    with _guard(q):
        return DecodePlan(_C.plan_call(_query(q, main_cache, main_indices, main_indptr, kwargs)[0]))


def decode_num_splits(q, main_cache, main_indices, main_indptr=None, **kwargs):
    """The split count S that :func:`sparse_decode` with these arguments uses:
    ``plan_decode_for(...).num_splits``."""
    return plan_decode_for(q, main_cache, main_indices, main_indptr, **kwargs).num_splits


def unsupported_reason(q, main_cache, main_indices, main_indptr=None, **kwargs):
    """Why :func:`sparse_decode` with these arguments would fail (the full validation message), or
    None when it is supported. Takes the arguments of sparse_decode; runs nothing."""
    with _guard(q):
        try:
            a, k = _query(q, main_cache, main_indices, main_indptr, kwargs)
        except Error as e:  # a bad value is a reason too; a wrong Python type still raises
            return str(e)
        return _C.decode_unsupported(a, _dl("out", k["out"]), _dl("lse", k["lse"]))


def is_supported(q, main_cache, main_indices, main_indptr=None, **kwargs):
    """True when :func:`sparse_decode` can run with these arguments (see unsupported_reason)."""
    return unsupported_reason(q, main_cache, main_indices, main_indptr, **kwargs) is None


def sparse_decode_reference(q, main_cache, main_indices, main_indptr=None, *,
                            return_abs_mean=False, **kwargs):
    """float64 reference of :func:`sparse_decode` on the dequantised cache (CPU arrays), with the
    kernels' scrub decisions and no bf16 rounding of probabilities. Same arguments (out, lse,
    workspace ignored). Returns ``(out float64 [T, H, 512], lse float64 [T, H])``, and with
    ``return_abs_mean=True`` ``(out, lse, abs_mean)``: the accuracy scale ``A`` float64
    ``[T, H, 512]`` that :func:`verify_decode_output` needs, ``A[t,h,j] = sum_i p_i |v_ij| /
    sum_i p_i`` over the row's valid keys (the keys' softmax, without the sink; on the dims rotated
    by a fused inverse RoPE, ``|c| A_a + |s| A_b`` of the pair), 0 for a row without keys."""
    kwargs = {k: v for k, v in kwargs.items() if k not in ("out", "lse", "workspace", "return_lse")}
    return_abs_mean = _ck.flag("sparse_decode_reference", "return_abs_mean", return_abs_mean)
    a, _ = _query(q, main_cache, main_indices, main_indptr, kwargs, op="sparse_decode_reference")
    t, h = q.shape[0], q.shape[1]
    out = np.zeros((t, h, 512), dtype=np.float64)
    lse = np.zeros((t, h), dtype=np.float64)
    abs_mean = np.zeros((t, h, 512), dtype=np.float64) if return_abs_mean else None
    _C.sparse_decode_reference(a, out, lse, abs_mean)
    return (out, lse, abs_mean) if return_abs_mean else (out, lse)


def verify_decode_output(out, ref, abs_mean):
    """The accuracy contract of CONTRACT 9.9 (CPU arrays; the rule and its argument are in
    ``include/sparsemla/verify.h``): out bf16 ``[T, H, 512]`` against ref float64 ``[T, H, 512]``
    (contiguous), NaN/+inf/-inf in the same places, each finite element within
    ``2^-7 * abs_mean + 2^-8 * |ref| + 1e-6``, and the cosine difference over the whole output
    <= 5e-6. abs_mean (required): the reference's ``A``, float64 ``[T, H, 512]`` contiguous, from
    ``sparse_decode_reference(..., return_abs_mean=True)``. Returns a dict: passed, elements,
    special_mismatches, tolerance_failures, max_abs_error, max_bound_ratio (max error / bound, <= 1
    passes), cosine_diff, first_bad, summary."""
    if abs_mean is None:
        raise Error("sparsemla::verify_decode_output: argument 'abs_mean': expected the reference's "
                    "accuracy scale, float64 [T, H, 512] (sparse_decode_reference(..., "
                    "return_abs_mean=True)), got None")
    _arrays("verify_decode_output", required=[("out", out), ("ref", ref), ("abs_mean", abs_mean)])
    return _C.verify_decode_output(_dl("out", out), _dl("ref", ref), _dl("abs_mean", abs_mean))


def built_with_cuda():
    """True when this build holds the CUDA kernels."""
    return _C.built_with_cuda()


def cpu_isa():
    """The CPU backend's instruction-set level in this process: "baseline", "avx2" or "avx512" (the
    best the CPU supports, or the one SPARSEMLA_CPU_ISA forces)."""
    return _C.cpu_isa()
