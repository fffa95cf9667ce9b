"""Every bad input a clear error (issue #27, docs/RELIABILITY.md "Bad inputs, Python"): each public
entry called with one argument wrong raises sparsemla.Error (a ValueError) for a bad value or
TypeError for a wrong Python type, and the message names the argument ("argument '<name>'").
Also: ml_dtypes / torch bfloat16 arrays are accepted, and NaN / inf in q and sink and scale <= 0
follow CONTRACT 4.2's special values."""

import math

import numpy as np
import pytest

import reference as ref
import sparsemla
from sparsemla import flashmla

T, H, BS, NB = 3, 2, 16, 4  # query rows, heads, page size, pages
ROPE = sparsemla.build_rope_table(64, "window")


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _cache(rng=None, nb=NB, bs=BS):
    """A [nb, bs, 584] fp8_ds_mla cache of random valid rows (or zeros without rng)."""
    if rng is None:
        return np.zeros((nb, bs, 584), np.uint8)
    return ref.random_cache(rng, nb, bs).reshape(nb, bs, 584)


def _q(rng=None):
    if rng is None:
        return np.zeros((T, H, 512), np.uint16)
    return ref.bf16_round_bits_fast(rng.standard_normal((T, H, 512)).astype(np.float32))


# ---- the valid call of every entry, with one argument replaced -----------------------------------
def _decode_args():
    return dict(q=_q(), main_cache=_cache(), main_indices=np.arange(T * 4, dtype=np.int32),
                main_indptr=np.arange(0, T * 4 + 1, 4, dtype=np.int32))


def decode(fn=sparsemla.sparse_decode, **bad):
    a = {**_decode_args(), **bad}
    return fn(a.pop("q"), a.pop("main_cache"), a.pop("main_indices"), a.pop("main_indptr"), **a)


def plan_decode(**bad):
    a = {"num_tokens": T, "num_heads": H, "width_main": 4, **bad}
    return sparsemla.plan_decode(a.pop("num_tokens"), a.pop("num_heads"), a.pop("width_main"), **a)


def write_window(**bad):
    a = {**dict(kv=np.zeros((2, 512), np.uint16), positions=np.zeros(2, np.int64),
             slots=np.arange(2, dtype=np.int64), rope=ROPE, cache=_cache()), **bad}
    return sparsemla.write_window(a.pop("kv"), a.pop("positions"), a.pop("slots"), a.pop("rope"),
                                  a.pop("cache"), **a)


def write_compressor_state(**bad):
    a = {**dict(kv=np.zeros((2, 1024), np.float32), score=np.zeros((2, 1024), np.float32),
             positions=np.arange(2, dtype=np.int64), state_slots=np.arange(2, dtype=np.int64),
             state=np.zeros((2, 8, 2048), np.float32)), **bad}
    return sparsemla.write_compressor_state(a.pop("kv"), a.pop("score"), a.pop("positions"),
                                            a.pop("state_slots"), a.pop("state"), **a)


def _compress_args(head):
    return dict(positions=np.arange(4, dtype=np.int64), request_index=np.zeros(4, np.int32),
                state_slots=np.arange(4, dtype=np.int64), out_slots=np.full(4, -1, np.int64),
                state_block_table=np.zeros((1, 2), np.int32),
                state=np.zeros((2, 8, 4 * head), np.float32),
                norm_weight=np.ones(head, np.float32), rope=ROPE)


def compress(**bad):
    a = {**_compress_args(512), "cache": _cache(), **bad}
    args = [a.pop(n) for n in list(_compress_args(512)) + ["cache"]]
    return sparsemla.compress(*args, **a)


def compress_indexer(**bad):
    a = {**_compress_args(128), "cache": np.zeros((NB, BS, 132), np.uint8), **bad}
    args = [a.pop(n) for n in list(_compress_args(128)) + ["cache"]]
    return sparsemla.compress_indexer(*args, **a)


def gather(**bad):
    a = {**dict(token_to_seq=np.zeros(3, np.int32), cu_seqlen=np.array([0, 3], np.int32),
             block_table=np.zeros((1, 1), np.int32), cache=np.zeros((NB, BS, 132), np.uint8)),
         **bad}
    return sparsemla.gather_indexer_keys(a.pop("token_to_seq"), a.pop("cu_seqlen"),
                                         a.pop("block_table"), a.pop("cache"), **a)


def from_dense(**bad):
    a = {**dict(dense=np.zeros((T, 4), np.int32), lengths=np.full(T, 4, np.int32)), **bad}
    return sparsemla.build_ragged_from_dense(a.pop("dense"), a.pop("lengths"), **a)


def window_lists(**bad):
    a = {**dict(positions=np.arange(T, dtype=np.int64), block_table=np.zeros((T, 8), np.int32),
             block_size=BS), **bad}
    return sparsemla.build_window_lists(a.pop("positions"), a.pop("block_table"),
                                        a.pop("block_size"), **a)


def topk_lists(**bad):
    a = {**dict(topk=np.zeros((T, 4), np.int32), block_table=np.zeros((T, 2), np.int32),
             block_size=BS), **bad}
    return sparsemla.build_topk_lists(a.pop("topk"), a.pop("block_table"), a.pop("block_size"),
                                      **a)


def compressed_lists(**bad):
    a = {**dict(positions=np.arange(T, dtype=np.int64), block_table=np.zeros((T, 2), np.int32),
             block_size=2, max_compressed=128), **bad}
    return sparsemla.build_compressed_all_lists(a.pop("positions"), a.pop("block_table"),
                                                a.pop("block_size"), a.pop("max_compressed"), **a)


def rope_table(**bad):
    a = {"positions": 8, **bad}
    return sparsemla.build_rope_table(a.pop("positions"), **a)


def inverse_rope(**bad):
    a = {**dict(x=np.zeros((T, H, 512), np.uint16), positions=np.zeros(T, np.int64), rope=ROPE),
         **bad}
    return sparsemla.inverse_rope(a.pop("x"), a.pop("positions"), a.pop("rope"), **a)


def alloc_ragged(**bad):
    a = {**dict(max_rows=4, width=8, like=np.zeros(1, np.int32)), **bad}
    return sparsemla.alloc_ragged(a["max_rows"], a["width"], a["like"])


def max_compressed(**bad):
    a = {"max_model_len": 1024, **bad}
    return sparsemla.max_compressed_entries(a.pop("max_model_len"), **a)


def quantize(**bad):
    a = {"x": np.zeros((2, 448), np.uint16), **bad}
    return sparsemla.quantize(a.pop("x"), **a)


def quantize_indexer(**bad):
    return sparsemla.quantize_indexer(bad.get("x", np.zeros((2, 128), np.uint16)))


def dequantize(**bad):
    a = {**dict(cache=_cache(), slots=np.arange(3, dtype=np.int64)), **bad}
    return sparsemla.dequantize_rows(a.pop("cache"), a.pop("slots"), **a)


def verify(**bad):
    z = np.zeros((1, 1, 512))
    a = {**dict(out=np.zeros((1, 1, 512), np.uint16), ref=z, abs_mean=z), **bad}
    return sparsemla.verify_decode_output(a["out"], a["ref"], a["abs_mean"])


def flash(**bad):
    b, s_q = 1, 2
    a = {**dict(q=np.zeros((b, s_q, H, 512), np.uint16),
                k_cache=np.zeros((NB, BS, 1, 584), np.uint8), block_table=None,
                cache_seqlens=None, head_dim_v=512, tile_scheduler_metadata=None,
                indices=np.zeros((b, s_q, 8), np.int32)), **bad}
    return flashmla.flash_mla_with_kvcache(
        a.pop("q"), a.pop("k_cache"), a.pop("block_table"), a.pop("cache_seqlens"),
        a.pop("head_dim_v"), a.pop("tile_scheduler_metadata"), **a)


V, TE = sparsemla.Error, TypeError
TOO_BIG = 2 ** 40  # beyond int32 (and the old nanobind TypeError)

# (entry, bad arguments, exception, the argument the message names)
CASES = [
    # decode: arrays
    (decode, dict(q=None), TE, "q"),
    (decode, dict(q=[[0.0]]), TE, "q"),
    (decode, dict(q=np.zeros(512, np.uint16)), V, "q"),
    (decode, dict(q=np.zeros((T, H, 512), np.float32)), V, "q"),
    (decode, dict(q=np.zeros((T, H, 256), np.uint16)), V, "q"),
    (decode, dict(q=np.zeros((T, H, 1024), np.uint16)[:, :, ::2]), V, "q"),
    (decode, dict(main_cache=np.zeros((NB, BS, 584), np.int32)), V, "main_cache"),
    (decode, dict(main_cache=[1, 2]), TE, "main_cache"),
    (decode, dict(main_cache=np.zeros((NB, BS, 584), np.uint8)[:, :, ::-1]), V, "main_cache"),
    (decode, dict(main_indices=np.zeros(12, np.int64)), V, "main_indices"),
    (decode, dict(main_indices=None), TE, "main_indices"),
    (decode, dict(main_indptr=np.zeros((2, 2), np.int32)), V, "main_indptr"),
    (decode, dict(main_indptr=np.zeros(2, np.int32)), V, "main_indptr"),
    (decode, dict(main_lengths=np.zeros(T, np.int32)), V, "main_lengths"),
    (decode, dict(out=_read_only(np.zeros((T, H, 512), np.uint16))), V, "out"),
    (decode, dict(out=np.zeros((T, H, 512), np.float32)), V, "out"),
    (decode, dict(out=np.zeros((T + 1, H, 512), np.uint16)), V, "out"),
    (decode, dict(lse=_read_only(np.zeros((T, H), np.float32))), V, "lse"),
    (decode, dict(lse=[0.0]), TE, "lse"),
    (decode, dict(lse=np.zeros((T, H), np.float64)), V, "lse"),
    (decode, dict(workspace=_read_only(np.zeros(10, np.uint8))), V, "workspace"),
    (decode, dict(sink=np.zeros(H, np.float64)), V, "sink"),
    (decode, dict(sink=np.zeros(H + 1, np.float32)), V, "sink"),
    (decode, dict(positions=np.zeros(T, np.int64)), V, "rope"),
    (decode, dict(positions=np.zeros(T, np.int32), rope=ROPE), V, "positions"),
    (decode, dict(extra_indices=np.zeros(4, np.int32)), V, "extra_cache"),
    (decode, dict(extra_cache=_cache()), V, "extra_indices"),
    # decode: integer and float options
    (decode, dict(num_splits=TOO_BIG), V, "num_splits"),
    (decode, dict(num_splits=33), V, "num_splits"),
    (decode, dict(num_splits=-1), V, "num_splits"),
    (decode, dict(num_splits=2.7), TE, "num_splits"),
    (decode, dict(num_splits="4"), TE, "num_splits"),
    (decode, dict(num_sms=2 ** 31), V, "num_sms"),
    (decode, dict(main_block_size=8), V, "main_block_size"),  # contradicts shape[1] = 16
    (decode, dict(main_block_size=-1), V, "main_block_size"),
    (decode, dict(main_block_size=16.0), TE, "main_block_size"),
    (decode, dict(main_cache=np.zeros((NB, BS * 584), np.uint8)), V, "main_block_size"),
    (decode, dict(main_width=-1), V, "main_width"),
    (decode, dict(main_rows_per_length=0), V, "main_rows_per_length"),
    (decode, dict(deterministic=2), TE, "deterministic"),
    (decode, dict(return_lse="yes"), TE, "return_lse"),
    (decode, dict(scale=math.nan), V, "scale"),
    (decode, dict(scale=math.inf), V, "scale"),
    (decode, dict(scale="0.1"), TE, "scale"),
    (decode, dict(path="tpu"), V, "path"),
    (decode, dict(path=1), TE, "path"),
    (decode, dict(plan="plan"), V, "plan"),  # sparsemla.Error, as documented before issue #27
    (decode, dict(plan=sparsemla.plan_decode(T + 1, H, 4)), V, "plan.shape.num_tokens"),
    (decode, dict(plan=sparsemla.plan_decode(T, H, 4), num_splits=2), V, "num_splits"),
    # the other decode entries share the checks
    (lambda **b: decode(sparsemla.plan_decode_for, **b), dict(q=np.zeros(3, np.uint16)), V, "q"),
    (lambda **b: decode(sparsemla.decode_num_splits, **b), dict(num_splits=TOO_BIG), V,
     "num_splits"),
    (lambda **b: decode(sparsemla.sparse_decode_reference, **b), dict(main_block_size=4), V,
     "main_block_size"),
    (lambda **b: decode(sparsemla.sparse_decode_reference, **b), dict(return_abs_mean=None), TE,
     "return_abs_mean"),
    (lambda **b: decode(sparsemla.is_supported, **b), dict(q=[1]), TE, "q"),
    # plan_decode
    (plan_decode, dict(num_tokens=-1), V, "num_tokens"),
    (plan_decode, dict(num_tokens=1.5), TE, "num_tokens"),
    (plan_decode, dict(num_heads=2 ** 31), V, "num_heads"),
    (plan_decode, dict(num_heads=0), V, "shape.num_heads"),  # the C++ planner's range check
    (plan_decode, dict(width_main=-4), V, "width_main"),
    (plan_decode, dict(width_extra=None), TE, "width_extra"),
    (plan_decode, dict(num_splits=TOO_BIG), V, "num_splits"),
    (plan_decode, dict(num_splits=999), V, "num_splits"),
    (plan_decode, dict(num_sms=-1), V, "num_sms"),
    (plan_decode, dict(device="tpu"), V, "device"),
    (plan_decode, dict(device=TOO_BIG), V, "device"),
    (plan_decode, dict(path="gpu"), V, "path"),
    (plan_decode, dict(deterministic="no"), TE, "deterministic"),
    # writers
    (write_window, dict(kv=np.zeros((2, 512), np.float32)), V, "kv"),
    (write_window, dict(kv=np.zeros(512, np.uint16)), V, "kv"),
    (write_window, dict(kv=[0] * 512), TE, "kv"),
    (write_window, dict(positions=np.zeros(2, np.int32)), V, "positions"),
    (write_window, dict(slots=np.zeros(3, np.int64)), V, "slots"),
    (write_window, dict(rope=np.zeros(64, np.float32)), V, "rope"),
    (write_window, dict(cache=_read_only(_cache())), V, "cache"),
    (write_window, dict(cache=None), TE, "cache"),
    (write_window, dict(block_size=TOO_BIG), V, "block_size"),
    (write_window, dict(block_size=0), V, "block_size"),
    (write_window, dict(block_size=8), V, "block_size"),  # contradicts shape[1] = 16
    (write_window, dict(block_size=1.5), TE, "block_size"),
    (write_window, dict(sanitise="yes"), TE, "sanitise"),
    (write_compressor_state, dict(state=_read_only(np.zeros((2, 8, 2048), np.float32))), V,
     "state"),
    (write_compressor_state, dict(ratio=2 ** 31), V, "ratio"),
    (write_compressor_state, dict(ratio=4.5), TE, "ratio"),
    (write_compressor_state, dict(head_dim=-512), V, "head_dim"),
    (write_compressor_state, dict(kv=np.zeros((2, 512), np.float32)), V, "kv"),
    (write_compressor_state, dict(ape=np.zeros((3, 1024), np.float32)), V, "ape"),
    (compress, dict(cache=_read_only(_cache())), V, "cache"),
    (compress, dict(ratio=TOO_BIG), V, "ratio"),
    (compress, dict(norm_eps=math.nan), V, "norm_eps"),
    (compress, dict(norm_eps="1e-6"), TE, "norm_eps"),
    (compress, dict(state_block_table=np.zeros((1, 2), np.int64)), V, "state_block_table"),
    (compress, dict(norm_weight=np.ones(128, np.float32)), V, "norm_weight"),
    (compress, dict(scratch=_read_only(np.zeros((4, 512), np.float32))), V, "scratch"),
    (compress, dict(positions=np.zeros((4, 1), np.int64)), V, "positions"),
    (compress, dict(block_size=-16), V, "block_size"),
    (compress_indexer, dict(cache=_read_only(np.zeros((NB, BS, 132), np.uint8))), V, "cache"),
    (compress_indexer, dict(norm_weight=np.ones(512, np.float32)), V, "norm_weight"),
    (compress_indexer, dict(two_stage="no"), TE, "two_stage"),
    # gather
    (gather, dict(token_to_seq=np.zeros((3, 1), np.int32)), V, "token_to_seq"),
    (gather, dict(cu_seqlen=np.zeros(0, np.int32)), V, "cu_seqlen"),
    (gather, dict(block_table=np.zeros(3, np.int32)), V, "block_table"),
    (gather, dict(k_fp8=_read_only(np.zeros((3, 128), np.uint8))), V, "k_fp8"),
    (gather, dict(k_scale=np.zeros(3, np.float64)), V, "k_scale"),
    (gather, dict(layout="tiled"), V, "layout"),
    (gather, dict(block_size=TOO_BIG), V, "block_size"),
    (gather, dict(block_size=8), V, "block_size"),  # contradicts shape[1] = 16
    # list builders
    (from_dense, dict(dense=np.zeros(4, np.int32)), V, "dense"),
    (from_dense, dict(dense=[[0]]), TE, "dense"),
    (from_dense, dict(lengths=np.zeros(T, np.int64)), V, "lengths"),
    (from_dense, dict(lengths=None), TE, "lengths"),
    (from_dense, dict(num_slots=-1), V, "num_slots"),
    (from_dense, dict(num_slots=2.0), TE, "num_slots"),
    (from_dense, dict(row_valid=np.ones(T, np.int32)), V, "row_valid"),
    (from_dense, dict(out=(_read_only(np.zeros(12, np.int32)), np.zeros(4, np.int32))), V,
     "out_indices"),
    (from_dense, dict(out=(np.zeros(12, np.int32), np.zeros(2, np.int32))), V, "out_indptr"),
    (from_dense, dict(out=np.zeros(12, np.int32)), TE, "out"),
    (window_lists, dict(window=2 ** 31), V, "window"),
    (window_lists, dict(window=0), V, "window"),
    (window_lists, dict(block_size=0), V, "block_size"),
    (window_lists, dict(width=-1), V, "width"),
    (window_lists, dict(positions=np.zeros((T, 1), np.int64)), V, "positions"),
    (window_lists, dict(block_table=np.zeros((T, 8), np.int64)), V, "block_table"),
    (window_lists, dict(request_index=[0, 0, 0]), TE, "request_index"),
    (topk_lists, dict(topk=np.zeros(4, np.int32)), V, "topk"),
    (topk_lists, dict(topk_length=np.zeros(T + 1, np.int32)), V, "topk_length"),
    (topk_lists, dict(block_size=2 ** 31), V, "block_size"),
    (compressed_lists, dict(max_compressed=-1), V, "max_compressed"),
    (compressed_lists, dict(ratio=0), V, "ratio"),
    (compressed_lists, dict(positions=np.zeros(T, np.float64)), V, "positions"),
    (alloc_ragged, dict(max_rows=-1), V, "max_rows"),
    (alloc_ragged, dict(width=1.5), TE, "width"),
    (alloc_ragged, dict(like=[0]), TE, "like"),
    (max_compressed, dict(max_model_len=-1), V, "max_model_len"),
    (max_compressed, dict(ratio=0), V, "ratio"),
    (max_compressed, dict(max_model_len=1.5), TE, "max_model_len"),
    # RoPE, quantisers, row decoders, verification
    (rope_table, dict(positions=-1), V, "positions"),
    (rope_table, dict(positions=2.5), TE, "positions"),
    (rope_table, dict(positions=TOO_BIG), V, "positions"),
    (rope_table, dict(layer="dense"), V, "layer"),
    (rope_table, dict(layer="custom", theta=-1.0), V, "theta"),
    (inverse_rope, dict(x=_read_only(np.zeros((T, H, 512), np.uint16))), V, "x"),
    (inverse_rope, dict(x=np.zeros((T, 512), np.uint16)), V, "x"),
    (inverse_rope, dict(positions=np.zeros(T + 1, np.int64)), V, "positions"),
    (inverse_rope, dict(rope=None), TE, "rope"),
    (quantize, dict(x=[0.0]), TE, "x"),
    (quantize, dict(block=0), V, "block"),
    (quantize, dict(x=np.zeros((2, 448), np.float32)), V, "x"),
    (quantize_indexer, dict(x=np.zeros(128, np.uint16)), V, "x"),
    (dequantize, dict(slots=np.zeros((3, 1), np.int64)), V, "slots"),
    (dequantize, dict(block_size=4), V, "block_size"),
    (dequantize, dict(out=_read_only(np.zeros((3, 512), np.float32))), V, "out"),
    (verify, dict(ref=[0.0]), TE, "ref"),
    (verify, dict(abs_mean=None), V, "abs_mean"),
    # the FlashMLA entry
    (flash, dict(causal=True), V, "causal"),
    (flash, dict(num_splits=999), V, "num_splits"),
    (flash, dict(num_splits=1), V, "num_splits"),
    (flash, dict(q=np.zeros((2, H, 512), np.uint16)), V, "q"),
    (flash, dict(q=[0]), TE, "q"),
    (flash, dict(k_cache=np.zeros((NB, BS, 584), np.uint8)), V, "k_cache"),
    (flash, dict(k_cache=None), TE, "k_cache"),
    (flash, dict(indices=None), V, "indices"),
    (flash, dict(indices=[[0]]), TE, "indices"),
    (flash, dict(indices=np.zeros((1, 2, 8), np.int64)), V, "indices"),
    (flash, dict(topk_length=np.zeros(1, np.int64)), V, "topk_length"),
    (flash, dict(head_dim_v=256), V, "head_dim_v"),
    (flash, dict(head_dim_v=512.0), TE, "head_dim_v"),
    (flash, dict(is_fp8_kvcache=False), V, "is_fp8_kvcache"),
    (flash, dict(softmax_scale=math.nan), V, "softmax_scale"),
    (flash, dict(attn_sink=np.zeros(H, np.float64)), V, "attn_sink"),
    (flash, dict(extra_indices_in_kvcache=np.zeros((1, 2, 8), np.int32)), V, "extra_k_cache"),
]


def _case_id(case):
    entry, bad, exc, name = case
    what = ", ".join(f"{k}={type(v).__name__}" for k, v in bad.items())
    return f"{getattr(entry, '__name__', 'entry')}-{name}-{what}-{exc.__name__}"


@pytest.mark.parametrize("entry,bad,exc,name", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_input_raises_an_error_naming_the_argument(entry, bad, exc, name):
    with pytest.raises(exc) as info:
        entry(**bad)
    # sparsemla.Error for bad values, TypeError (not a nanobind conversion error) for bad types.
    assert type(info.value) is exc
    assert f"argument '{name}'" in str(info.value), str(info.value)


def test_every_entry_accepts_its_valid_call():
    """The baseline of CASES: without the bad argument every entry runs (else a case could pass
    because the call failed for another reason)."""
    entries = {entry for entry, *_ in CASES if getattr(entry, "__name__", "") != "<lambda>"}
    for entry in entries:
        entry()
    for fn in (sparsemla.plan_decode_for, sparsemla.decode_num_splits, sparsemla.is_supported,
               sparsemla.sparse_decode_reference):
        decode(fn)
    assert sparsemla.is_supported(*_decode_args().values())


def test_unsupported_reason_reports_a_bad_value_and_raises_on_a_bad_type():
    args = _decode_args()
    why = sparsemla.unsupported_reason(*args.values(), num_splits=TOO_BIG)
    assert "argument 'num_splits'" in why
    with pytest.raises(TypeError, match="argument 'num_splits'"):
        sparsemla.unsupported_reason(*args.values(), num_splits=2.5)


def test_explicit_block_size_equal_to_the_shape_and_2d_caches_still_work(rng):
    cache = _cache(rng)
    a = {**_decode_args(), "main_cache": cache}
    q, c, i, p = a.values()
    want = sparsemla.sparse_decode(q, c, i, p)
    same = sparsemla.sparse_decode(q, c, i, p, main_block_size=BS)
    flat = sparsemla.sparse_decode(q, c.reshape(NB, -1), i, p, main_block_size=BS)
    assert np.array_equal(want, same) and np.array_equal(want, flat)


# ---- bf16 arrays of ml_dtypes and torch ----------------------------------------------------------
def test_ml_dtypes_bfloat16_is_accepted_like_uint16_bits(rng):
    import ml_dtypes  # a pinned test dependency (python/requirements.txt): never skipped
    cache = _cache(rng)
    q_bits = _q(rng)
    q_bf16 = q_bits.view(ml_dtypes.bfloat16)
    a = _decode_args()
    want, want_lse = sparsemla.sparse_decode(q_bits, cache, a["main_indices"], a["main_indptr"],
                                             return_lse=True)
    got, got_lse = sparsemla.sparse_decode(q_bf16, cache, a["main_indices"], a["main_indptr"],
                                           return_lse=True)
    assert got.dtype == ml_dtypes.bfloat16  # allocated like q
    assert np.array_equal(got.view(np.uint16), want) and np.array_equal(got_lse, want_lse)
    out = np.zeros((T, H, 512), ml_dtypes.bfloat16)
    sparsemla.sparse_decode(q_bf16, cache, a["main_indices"], a["main_indptr"], out=out)
    assert np.array_equal(out.view(np.uint16), want)
    # writers and the standalone inverse RoPE take it too
    kv = ref.bf16_round_bits_fast(rng.standard_normal((2, 512)).astype(np.float32))
    pos, slots = np.array([3, 9], np.int64), np.array([0, 5], np.int64)
    c1, c2 = _cache(), _cache()
    sparsemla.write_window(kv, pos, slots, ROPE, c1)
    sparsemla.write_window(kv.view(ml_dtypes.bfloat16), pos, slots, ROPE, c2)
    assert np.array_equal(c1, c2)
    x1, x2 = q_bits.copy(), q_bits.copy().view(ml_dtypes.bfloat16)
    sparsemla.inverse_rope(x1, pos[:1].repeat(T), ROPE)
    sparsemla.inverse_rope(x2, pos[:1].repeat(T), ROPE)
    assert np.array_equal(x1, x2.view(np.uint16))


@pytest.mark.torch
def test_torch_cpu_tensors_get_the_same_checks_and_bf16_is_accepted(rng):
    import torch
    cache = _cache(rng)
    q_bits = _q(rng)
    a = _decode_args()
    want = sparsemla.sparse_decode(q_bits, cache, a["main_indices"], a["main_indptr"])
    tq = torch.from_numpy(ref.bf16_to_f32(q_bits)).to(torch.bfloat16)
    tc, ti, tp = (torch.from_numpy(x) for x in (cache, a["main_indices"], a["main_indptr"]))
    got = sparsemla.sparse_decode(tq, tc, ti, tp)
    assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), want)
    for bad, exc, name in ((dict(num_splits=TOO_BIG), V, "num_splits"),
                           (dict(num_splits=2.7), TE, "num_splits"),
                           (dict(main_block_size=8), V, "main_block_size")):
        with pytest.raises(exc, match=f"argument '{name}'"):
            sparsemla.sparse_decode(tq, tc, ti, tp, **bad)
    with pytest.raises(V, match="argument 'q'"):
        sparsemla.sparse_decode(tq[0, 0], tc, ti, tp)


# ---- special values in q and sink, scale <= 0 (CONTRACT 4.2) -------------------------------------
def _special_case(rng):
    cache = _cache(rng)
    a = _decode_args()
    idx, ptr = a["main_indices"], a["main_indptr"].copy()
    ptr[2:] = ptr[2]  # row 2 has no keys
    return _q(rng), cache, idx, ptr


def test_nan_in_q_gives_a_nan_row_and_nan_lse_in_the_decode_and_the_reference(rng):
    q, cache, idx, ptr = _special_case(rng)
    q[0, 1, 5] = 0x7FC0                # one NaN dim: every score of (0, 1) is NaN
    q[1, 0, :] = 0x7F80                # +inf in every dim: scores +inf or NaN
    q[2, 0, :] = 0x7FC0                # no keys: no score, an empty row still
    for splits in (1, 2):
        out, lse = sparsemla.sparse_decode(q, cache, idx, ptr, num_splits=splits, return_lse=True)
        want, want_lse = sparsemla.sparse_decode_reference(q, cache, idx, ptr)
        o = ref.bf16_to_f32(out)
        for t, h in ((0, 1), (1, 0)):
            assert np.isnan(o[t, h]).all() and np.isnan(want[t, h]).all()
            assert np.isnan(lse[t, h]) and np.isnan(want_lse[t, h])
        assert (o[2] == 0).all() and (want[2] == 0).all() and (lse[2] == np.inf).all()
        assert np.isfinite(o[0, 0]).all() and np.isfinite(lse[0, 0])
    py_out, py_lse, _ = ref.decode(q, [(cache.reshape(NB, -1), BS)], [(idx, ptr)])
    assert np.isnan(py_out[0, 1]).all() and np.isnan(py_lse[0, 1]) and np.isnan(py_lse[1, 0])


def test_nan_sink_gives_its_head_nan_and_leaves_lse_alone(rng):
    q, cache, idx, ptr = _special_case(rng)
    sink = np.array([np.nan, 0.5], np.float32)
    out, lse = sparsemla.sparse_decode(q, cache, idx, ptr, sink=sink, return_lse=True)
    _, lse_none = sparsemla.sparse_decode(q, cache, idx, ptr, return_lse=True)
    want, _ = sparsemla.sparse_decode_reference(q, cache, idx, ptr, sink=sink)
    o = ref.bf16_to_f32(out)
    assert np.isnan(o[:, 0]).all() and np.isnan(want[:, 0]).all()  # row 2 (no keys) too
    assert np.isfinite(o[:, 1]).all() and (o[2, 1] == 0).all()
    assert np.array_equal(lse, lse_none)
    py_out, _, _ = ref.decode(q, [(cache.reshape(NB, -1), BS)], [(idx, ptr)], sink=sink)
    assert np.isnan(py_out[:, 0]).all()


def test_infinite_sinks_keep_their_meaning(rng):
    q, cache, idx, ptr = _special_case(rng)
    out = sparsemla.sparse_decode(q, cache, idx, ptr, sink=np.array([np.inf, -np.inf], np.float32))
    plain = sparsemla.sparse_decode(q, cache, idx, ptr)
    assert (ref.bf16_to_f32(out[:, 0]) == 0).all()  # +inf: all mass on the sink
    assert np.array_equal(out[:, 1], plain[:, 1])     # -inf: no effect


@pytest.mark.parametrize("scale", [0.0, -0.0, -1.0 / 16])
def test_scale_at_or_below_zero_is_computed_as_written(rng, scale):
    q, cache, idx, ptr = _special_case(rng)
    out, lse = sparsemla.sparse_decode(q, cache, idx, ptr, scale=scale, return_lse=True)
    want, want_lse, a = sparsemla.sparse_decode_reference(q, cache, idx, ptr, scale=scale,
                                                          return_abs_mean=True)
    v = sparsemla.verify_decode_output(out, want, a)
    assert v["passed"], v["summary"]
    py_out, py_lse, _ = ref.decode(q, [(cache.reshape(NB, -1), BS)], [(idx, ptr)], scale=scale)
    assert np.allclose(want, py_out, rtol=1e-12, atol=1e-12)
    assert np.allclose(lse[:2], want_lse[:2], rtol=1e-5)
    if scale == 0.0:  # every key weighs the same: lse = ln(4 keys)
        assert np.allclose(want_lse[:2], math.log(4), rtol=1e-12)
