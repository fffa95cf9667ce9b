"""A FlashMLA-compatible entry point for DeepSeek-V4 ("MODEL1") sparse decode.

Engines that call FlashMLA's ``get_mla_metadata`` / ``flash_mla_with_kvcache`` for the DSV4 sparse
decode can import these two names from here instead::

    from sparsemla.flashmla import flash_mla_with_kvcache, get_mla_metadata

Semantics follow FlashMLA's sparse FP8 decode (SPEC 4.3a), with two relaxations: any h_q in 1..128
and any top-k width are accepted. Scheduling metadata is not needed (the split count is planned
per call from shapes only), so ``get_mla_metadata`` returns an inert object and ``block_table``,
``cache_seqlens``, ``num_splits`` and ``causal`` are ignored. Works on torch tensors (CPU or CUDA;
traceable by ``torch.compile`` and capturable in CUDA graphs) and on numpy arrays (bf16 as uint16).
"""

import numpy as np

from . import _ops


class FlashMLASchedMeta:
    """Stand-in for FlashMLA's tile-scheduler metadata; sparsemla needs none."""

    def __init__(self):
        self.have_initialized = False
        self.config = None


def get_mla_metadata(*args, **kwargs):
    """Returns ``(FlashMLASchedMeta(), None)``; all arguments are accepted and ignored."""
    del args, kwargs
    return FlashMLASchedMeta(), None


def _as_bytes(cache):
    """The cache as uint8 (FlashMLA callers may pass a float8/int8 view of the same bytes)."""
    if _ops._is_tensor(cache):
        torch = _ops._torch_mod()
        return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)
    return cache if cache.dtype == np.uint8 else cache.view(np.uint8)


def _request_rows(like, t, s_q):
    """int32 [t]: the request of each query row (row // s_q)."""
    if _ops._is_tensor(like):
        torch = _ops._torch_mod()
        return torch.div(torch.arange(t, dtype=torch.int32, device=like.device), s_q,
                         rounding_mode="floor")
    return (np.arange(t, dtype=np.int32) // s_q).astype(np.int32)


def _full(like, n, value):
    if _ops._is_tensor(like):
        torch = _ops._torch_mod()
        return torch.full((n,), value, dtype=torch.int32, device=like.device)
    return np.full((n,), value, dtype=np.int32)


def _list(indices, lengths, cache, t, s_q, name):
    """Dense [b, s_q, topk] indices (+ per-request lengths) -> ragged (indices, indptr, width)."""
    if indices is None:
        raise ValueError(f"sparsemla.flashmla: argument '{name}': expected int32 [b, s_q, topk] "
                         "indices (sparse decode only), got None")
    if len(indices.shape) != 3:
        raise ValueError(f"sparsemla.flashmla: argument '{name}': expected [b, s_q, topk], got "
                         f"shape {tuple(indices.shape)}")
    topk = indices.shape[2]
    dense = indices.reshape(t, topk)
    num_slots = cache.shape[0] * cache.shape[1]
    if lengths is None:
        idx, ptr = _ops.build_ragged_from_dense(dense, _full(dense, t, topk), num_slots=num_slots)
    else:
        idx, ptr = _ops.build_ragged_from_dense(dense, lengths, num_slots=num_slots,
                                                request_index=_request_rows(dense, t, s_q))
    return idx, ptr, topk


def _check_cache(cache, name):
    if len(cache.shape) != 4 or cache.shape[2] != 1 or cache.shape[3] != 584:
        raise ValueError(f"sparsemla.flashmla: argument '{name}': expected the fp8_ds_mla page view "
                         f"[num_blocks, page_block_size, 1, 584], got shape {tuple(cache.shape)}")


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=True, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    """DSV4 sparse FP8 decode with FlashMLA's calling convention. Returns ``(out, lse)``.

    q: bf16 ``[b, s_q, h_q, 512]``; k_cache: uint8 ``[num_blocks, page_block_size, 1, 584]`` view
    of the fp8_ds_mla pages (SPEC 2.1; page stride = ``stride(0)`` bytes); indices: int32
    ``[b, s_q, topk]`` slot ids into k_cache (block * page_block_size + row; -1 and any other
    out-of-range value: skipped); topk_length: int32 ``[b]`` or None, only the first
    ``topk_length[i]`` indices of request i are read. extra_k_cache / extra_indices_in_kvcache /
    extra_topk_length: the same for the compressed cache, attended in the same softmax.
    attn_sink: fp32 ``[h_q]`` (-inf: no effect, +inf: zero output) or None. softmax_scale: default
    ``512**-0.5``. head_dim_v must be 512 and is_fp8_kvcache True.

    out: bf16 ``[b, s_q, h_q, 512]``; lse: fp32 ``[b, h_q, s_q]`` natural-log log-sum-exp of the
    scaled scores without the sink, +inf for a row with no valid key (whose output is 0).
    """
    del block_table, cache_seqlens, tile_scheduler_metadata, num_splits, causal
    if not is_fp8_kvcache:
        raise ValueError("sparsemla.flashmla: argument 'is_fp8_kvcache': expected True (only the "
                         "FP8 fp8_ds_mla cache is supported), got False")
    if head_dim_v != 512:
        raise ValueError(f"sparsemla.flashmla: argument 'head_dim_v': expected 512, got {head_dim_v}")
    if len(q.shape) != 4 or q.shape[3] != 512:
        raise ValueError(f"sparsemla.flashmla: argument 'q': expected [b, s_q, h_q, 512], got shape "
                         f"{tuple(q.shape)}")
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    t = b * s_q
    _check_cache(k_cache, "k_cache")
    k_cache = _as_bytes(k_cache)
    main_idx, main_ptr, main_w = _list(indices, topk_length, k_cache, t, s_q, "indices")
    extra = {}
    if extra_k_cache is not None:
        _check_cache(extra_k_cache, "extra_k_cache")
        extra_k_cache = _as_bytes(extra_k_cache)
        e_idx, e_ptr, e_w = _list(extra_indices_in_kvcache, extra_topk_length, extra_k_cache, t,
                                  s_q, "extra_indices_in_kvcache")
        extra = dict(extra_cache=extra_k_cache, extra_indices=e_idx, extra_indptr=e_ptr,
                     extra_width=e_w)
    elif extra_indices_in_kvcache is not None:
        raise ValueError("sparsemla.flashmla: argument 'extra_k_cache': expected a cache with "
                         "extra_indices_in_kvcache, got None")
    out, lse = _ops.sparse_decode(q.reshape(t, h_q, 512), k_cache, main_idx, main_ptr,
                                  main_width=main_w, sink=attn_sink, scale=softmax_scale,
                                  return_lse=True, **extra)
    out = out.reshape(b, s_q, h_q, 512)
    lse = lse.reshape(b, s_q, h_q)
    if _ops._is_tensor(lse):
        lse = lse.transpose(1, 2)
        lse = lse if s_q == 1 else lse.contiguous()
    else:
        lse = np.ascontiguousarray(lse.transpose(0, 2, 1))
    return out, lse
