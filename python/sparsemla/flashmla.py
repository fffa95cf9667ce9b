"""A FlashMLA-compatible entry point for DeepSeek-V4 ("MODEL1") sparse decode.

Engines that call FlashMLA's ``get_mla_metadata`` / ``flash_mla_with_kvcache`` for the DSV4 sparse
decode can import these two names from here instead::

    from sparsemla.flashmla import flash_mla_with_kvcache, get_mla_metadata

Semantics follow FlashMLA's sparse FP8 decode (CONTRACT 4.3a), with two relaxations: any h_q in 1..128
and any top-k width are accepted. The dense ``indices`` and ``topk_length`` go to the decode as they
are (dense lists, CONTRACT 4.6: no conversion kernel). ``get_mla_metadata`` returns the holder of a
decode plan, made by the first call with it and reused by every later one (as FlashMLA fills its
scheduling metadata once); ``block_table`` and ``cache_seqlens`` are ignored; ``causal`` must be
False and ``num_splits`` None (get_mla_metadata's second value), as in FlashMLA's sparse decode.
Works on torch tensors (CPU or CUDA; traceable by ``torch.compile`` and capturable in CUDA graphs)
and on numpy arrays (bf16 as uint16 or ml_dtypes.bfloat16).
"""

import numpy as np

from . import _checks, _ops

_OP = "flashmla.flash_mla_with_kvcache"

# What a plan depends on, in the order FlashMLASchedMeta.shape holds it: (argument, what).
_PLANNED = (("q", "shape[0] (b)"), ("q", "shape[1] (s_q)"), ("q", "shape[2] (h_q)"),
            ("indices", "shape[2] (topk)"),
            ("extra_indices_in_kvcache", "shape[2] (extra topk; None: no extra cache)"))


class FlashMLASchedMeta:
    """FlashMLA's scheduling metadata, here the holder of a sparsemla decode plan: empty from
    get_mla_metadata; the first flash_mla_with_kvcache call with it plans (from the call's own
    shapes and placement) and stores the plan (``have_initialized`` becomes True); every later call
    runs that plan, planning nothing. One metadata per shape, as FlashMLA's: a call whose shapes
    differ from the planned ones raises ValueError naming the argument (call get_mla_metadata again
    for another shape). Under torch.compile an empty metadata stays empty and every call plans
    itself (plan in eager mode first to reuse the plan in compiled code)."""

    def __init__(self):
        self.have_initialized = False
        self.config = None
        self.plan = None   # sparsemla.DecodePlan
        self.shape = None  # (b, s_q, h_q, topk, extra topk or None) the plan was made for


def get_mla_metadata(*args, **kwargs):
    """Returns ``(FlashMLASchedMeta(), None)``, an empty plan holder; all arguments are ignored."""
    del args, kwargs
    return FlashMLASchedMeta(), None


def _as_bytes(cache):
    """The cache as uint8 (FlashMLA callers may pass a float8/int8 view of the same bytes)."""
    if _ops._is_tensor(cache):
        torch = _ops._torch_mod()
        return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)
    return cache if cache.dtype == np.uint8 else cache.view(np.uint8)


# sparse_decode's argument names -> this entry's (so that an error names what the caller passed).
_ARG_NAMES = {"main_cache": "k_cache", "main_indices": "indices", "main_lengths": "topk_length",
              "sink": "attn_sink", "scale": "softmax_scale", "extra_cache": "extra_k_cache",
              "extra_indices": "extra_indices_in_kvcache", "extra_lengths": "extra_topk_length"}


def _in_our_names(error):
    """The same error, its argument named as flash_mla_with_kvcache's caller named it."""
    text = str(error)
    for ours, theirs in _ARG_NAMES.items():
        text = text.replace(f"argument '{ours}'", f"argument '{theirs}'")
    return type(error)(text)


def _check_cache(cache, name):
    _checks.array(_OP, name, cache)
    if len(cache.shape) != 4 or cache.shape[2] != 1 or cache.shape[3] != 584:
        raise _ops.Error(f"sparsemla.flashmla: argument '{name}': expected the fp8_ds_mla page view "
                         f"[num_blocks, page_block_size, 1, 584], got shape {tuple(cache.shape)}")
    return _as_bytes(cache)


def _dense(indices, b, s_q, name):
    """FlashMLA's [b, s_q, topk] indices as the dense [T, topk] list (a view)."""
    if indices is None:
        raise _ops.Error(f"sparsemla.flashmla: argument '{name}': expected int32 [b, s_q, topk] "
                         "indices (sparse decode only), got None")
    _checks.array(_OP, name, indices)
    if len(indices.shape) != 3 or tuple(indices.shape[:2]) != (b, s_q):
        raise _ops.Error(f"sparsemla.flashmla: argument '{name}': expected [b, s_q, topk] with "
                         f"q's b = {b}, s_q = {s_q}, got shape {tuple(indices.shape)}")
    return indices.reshape(b * s_q, indices.shape[2])


def _compiling():
    torch = _ops._torch_mod()
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())


def _plan(meta, shape, call):
    """The plan of a call with `meta`: the stored one (its shape checked), else made now and
    stored; None (the call plans itself) without a FlashMLASchedMeta or while compiling."""
    if not isinstance(meta, FlashMLASchedMeta):
        return None
    if meta.plan is not None:
        for (name, what), planned, got in zip(_PLANNED, meta.shape, shape):
            if planned != got:
                raise _ops.Error(f"sparsemla.flashmla: argument '{name}': expected {what} = "
                                 f"{planned}, as planned by the first call with this "
                                 "tile_scheduler_metadata (one metadata per shape: "
                                 f"get_mla_metadata() again for another), got {got}")
        return meta.plan
    if _compiling():
        return None
    meta.plan = _ops.plan_decode_for(*call[:3], **call[3])
    meta.shape, meta.have_initialized = shape, True
    return meta.plan


def _check_flashmla_options(num_splits, causal):
    """FlashMLA's sparse decode has no causal mode (each row attends exactly its listed keys), and
    its num_splits is get_mla_metadata's second value, None here: the split count is part of the
    plan the metadata holds. Anything else would be ignored silently, so it is refused."""
    if _checks.flag(_OP, "causal", causal):
        _checks.fail(_OP, "causal", "False (the sparse decode attends exactly the listed indices; "
                     "there is no causal mask to apply)", "True")
    if num_splits is not None:
        _checks.fail(_OP, "num_splits", "None, the second value of get_mla_metadata() (the split "
                     "count is chosen by the plan in tile_scheduler_metadata)", repr(num_splits))


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=True, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    """DSV4 sparse FP8 decode with FlashMLA's calling convention. Returns ``(out, lse)``.

    q: bf16 ``[b, s_q, h_q, 512]``; k_cache: uint8 ``[num_blocks, page_block_size, 1, 584]`` view
    of the fp8_ds_mla pages (CONTRACT 2.1; page stride = ``stride(0)`` bytes); indices: int32
    ``[b, s_q, topk]`` slot ids into k_cache (block * page_block_size + row; -1 and any other
    out-of-range value: skipped); topk_length: int32 ``[b]`` or None, only the first
    ``topk_length[i]`` indices of request i are read. extra_k_cache / extra_indices_in_kvcache /
    extra_topk_length: the same for the compressed cache, attended in the same softmax.
    attn_sink: fp32 ``[h_q]`` (-inf: no effect, +inf: zero output, NaN: NaN output) or None. softmax_scale: default
    ``512**-0.5``. head_dim_v must be 512 and is_fp8_kvcache True. tile_scheduler_metadata: a
    FlashMLASchedMeta (its plan is made by the first call and reused) or None (planned per call).

    out: bf16 ``[b, s_q, h_q, 512]``; lse: fp32 ``[b, h_q, s_q]`` natural-log log-sum-exp of the
    scaled scores without the sink, +inf for a row with no valid key (whose output is 0). Both
    are allocated uninitialised and written in place by the decode (no copy kernel).
    """
    del block_table, cache_seqlens
    _check_flashmla_options(num_splits, causal)
    if not _checks.flag(_OP, "is_fp8_kvcache", is_fp8_kvcache):
        raise _ops.Error("sparsemla.flashmla: argument 'is_fp8_kvcache': expected True (only the "
                         "FP8 fp8_ds_mla cache is supported), got False")
    _checks.array(_OP, "q", q)
    if _checks.integer(_OP, "head_dim_v", head_dim_v) != 512:
        raise _ops.Error(f"sparsemla.flashmla: argument 'head_dim_v': expected 512, got {head_dim_v}")
    if len(q.shape) != 4 or q.shape[3] != 512:
        raise _ops.Error(f"sparsemla.flashmla: argument 'q': expected [b, s_q, h_q, 512], got shape "
                         f"{tuple(q.shape)}")
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    t = b * s_q
    k_cache = _check_cache(k_cache, "k_cache")
    main = _dense(indices, b, s_q, "indices")
    kw = dict(main_lengths=topk_length, main_rows_per_length=s_q, sink=attn_sink,
              scale=softmax_scale)
    extra_topk = None
    if extra_k_cache is not None:
        extra = _dense(extra_indices_in_kvcache, b, s_q, "extra_indices_in_kvcache")
        kw.update(extra_cache=_check_cache(extra_k_cache, "extra_k_cache"), extra_indices=extra,
                  extra_lengths=extra_topk_length, extra_rows_per_length=s_q)
        extra_topk = extra.shape[1]
    elif extra_indices_in_kvcache is not None:
        raise _ops.Error("sparsemla.flashmla: argument 'extra_k_cache': expected a cache with "
                         "extra_indices_in_kvcache, got None")
    q3 = q.reshape(t, h_q, 512)
    try:
        plan = _plan(tile_scheduler_metadata, (b, s_q, h_q, main.shape[1], extra_topk),
                     (q3, k_cache, main, kw))
        out = _ops._empty(q, (b, s_q, h_q, 512), "like")
        lse = _ops._empty(q, (b, h_q, s_q), "float32")  # written in place: row i*s_q + j at [i, :, j]
        _ops.sparse_decode(q3, k_cache, main, None, out=out.reshape(t, h_q, 512), lse=lse,
                           plan=plan, **kw)
    except (_ops.Error, TypeError) as e:
        raise _in_our_names(e) from None
    return out, lse
