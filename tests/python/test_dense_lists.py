"""Dense index lists (CONTRACT 4.6: FlashMLA's [T, W] indices + lengths, read by the decode directly)
against the ragged lists build_ragged_from_dense makes from them, and decode plans (plan once, run
many): a plan reused across layers gives what planning per call gives, a plan of another shape is
refused naming the field. numpy here (CPU backend); test_torch.py runs them on tensors (CPU, GPU)."""

import numpy as np
import pytest

import reference as ref
import sparsemla
from test_decode import SCALE, assert_lse_close, assert_verified, make_cache

MAIN_SLOTS, EXTRA_SLOTS = 3 * 64, 150 * 2


def dense_rows(rng, t, w, n_slots, pad=3):
    """int32 [t, w] rows of slots in [0, n_slots) with strided rows (row stride w + pad), -1
    padding and out-of-range entries (n, n + 1024, INT32_MAX, INT32_MIN) mixed in."""
    big = rng.integers(0, n_slots, size=(t, w + pad)).astype(np.int32)
    d = big[:, :w]
    u = rng.random((t, w))
    d[u < 0.1] = -1
    bad = np.array([n_slots, n_slots + 1024, 2**31 - 1, -2**31], dtype=np.int32)
    d[(u >= 0.1) & (u < 0.15)] = rng.choice(bad, int(((u >= 0.1) & (u < 0.15)).sum()))
    assert d.strides[0] == 4 * (w + pad)
    return d


def make_lengths(rng, kind, t, s_q, w):
    """(lengths, rows_per_length): None, per request [t / s_q] or per row [t], values in
    [-3, w + 5] (so some are clamped at both ends)."""
    if kind is None:
        return None, 1
    n, rpl = (t // s_q, s_q) if kind == "request" else (t, 1)
    return rng.integers(-3, w + 6, n).astype(np.int32), rpl


def as_ragged(dense, lengths, rpl):
    """The ragged list of a dense one (the builder, no range check: the decode skips them)."""
    t, w = dense.shape
    if lengths is None:
        return sparsemla.build_ragged_from_dense(dense, np.full(t, w, np.int32))
    req = (np.arange(t) // rpl).astype(np.int32)
    return sparsemla.build_ragged_from_dense(dense, lengths, request_index=req)


def python_rows(dense, lengths, rpl):
    """The rows of a dense list written out here (CONTRACT 4.6), as a ragged list for reference.decode."""
    t, w = dense.shape
    lens = [w if lengths is None else min(max(int(lengths[i // rpl]), 0), w) for i in range(t)]
    return ref.ragged([list(dense[i, :lens[i]]) for i in range(t)])


class Layer:
    """One layer's decode inputs with dense lists: q, a window cache + dense rows, a compressed cache
    + dense rows, a sink."""

    def __init__(self, rng, t, h, w=40, we=72, s_q=1, lengths="request", extra=True):
        self.t, self.h = t, h
        self.q = ref.bf16_round_bits_fast(rng.standard_normal((t, h, 512)).astype(np.float32))
        self.main = make_cache(rng, 3, 64)
        self.dense = dense_rows(rng, t, w, MAIN_SLOTS)
        self.lengths, self.rpl = make_lengths(rng, lengths, t, s_q, w)
        self.extra = None
        if extra:
            self.extra = make_cache(rng, 150, 2)
            self.extra_dense = dense_rows(rng, t, we, EXTRA_SLOTS)
            self.extra_lengths, _ = make_lengths(rng, lengths, t, s_q, we)
        self.sink = (rng.standard_normal(h) * 2).astype(np.float32)

    def dense_kwargs(self, **kw):
        k = dict(main_block_size=64, main_lengths=self.lengths, main_rows_per_length=self.rpl,
                 sink=self.sink)
        if self.extra is not None:
            k.update(extra_cache=self.extra, extra_block_size=2, extra_indices=self.extra_dense,
                     extra_lengths=self.extra_lengths, extra_rows_per_length=self.rpl)
        k.update(kw)
        return k

    def run_dense(self, **kw):
        return sparsemla.sparse_decode(self.q, self.main, self.dense, None, return_lse=True,
                                       **self.dense_kwargs(**kw))

    def ragged(self):
        main = as_ragged(self.dense, self.lengths, self.rpl)
        extra = None if self.extra is None else as_ragged(self.extra_dense, self.extra_lengths,
                                                          self.rpl)
        return main, extra

    def run_ragged(self, **kw):
        main, extra = self.ragged()
        k = dict(main_block_size=64, main_width=self.dense.shape[1], sink=self.sink)
        if extra is not None:
            k.update(extra_cache=self.extra, extra_block_size=2, extra_indices=extra[0],
                     extra_indptr=extra[1], extra_width=self.extra_dense.shape[1])
        k.update(kw)
        return sparsemla.sparse_decode(self.q, self.main, *main, return_lse=True, **k)


def same_bits(a, b):
    """out and lse bitwise equal (lse compared as uint32, so +inf and NaN count too)."""
    return (np.array_equal(a[0], b[0])
            and np.array_equal(a[1].view(np.uint32), b[1].view(np.uint32)))


@pytest.mark.parametrize("lengths,s_q", [(None, 1), ("request", 1), ("request", 3), ("row", 1),
                                         ("row", 2)])
@pytest.mark.parametrize("splits", [0, 3])
def test_dense_lists_equal_their_ragged_lists(rng, lengths, s_q, splits):
    """-1 padding, out-of-range entries, per-request (rows_per_length = s_q) and per-row lengths,
    lengths < 0 and > W (clamped), strided rows: the same bits as the ragged list."""
    layer = Layer(rng, 6, 16, s_q=s_q, lengths=lengths)
    got = layer.run_dense(num_splits=splits)
    want = layer.run_ragged(num_splits=splits)
    assert same_bits(got, want)
    # ... and both meet the accuracy contract against the float64 reference of the ragged rows.
    rows = [python_rows(layer.dense, layer.lengths, layer.rpl),
            python_rows(layer.extra_dense, layer.extra_lengths, layer.rpl)]
    ref_out, ref_lse, a = ref.decode(layer.q, [(layer.main, 64), (layer.extra, 2)], rows,
                                     layer.sink, SCALE)
    assert_verified(got[0], ref_out, a)
    assert_lse_close(got[1], ref_lse)


def test_dense_window_only_list_and_library_reference(rng):
    layer = Layer(rng, 5, 8, w=128, lengths="row", extra=False)
    got = layer.run_dense()
    assert same_bits(got, layer.run_ragged())
    want, _, a = sparsemla.sparse_decode_reference(layer.q, layer.main, layer.dense, None,
                                                   return_abs_mean=True, **layer.dense_kwargs())
    assert_verified(got[0], want, a)


def test_dense_lengths_clamped_and_all_invalid_rows(rng):
    """Rows whose lengths are <= 0, or whose kept entries are all invalid, give 0 and lse +inf; a
    length beyond W reads W entries, not the padding after the row."""
    layer = Layer(rng, 4, 4, w=16, lengths="row", extra=False)
    layer.lengths[:] = [0, -7, 16, 1000]
    layer.dense[1] = rng.integers(0, MAIN_SLOTS, 16)  # length -7: nothing read anyway
    layer.dense[2] = -1                               # every entry invalid
    layer.dense[3] = rng.integers(0, MAIN_SLOTS, 16)
    out, lse = layer.run_dense()
    for row in (0, 1, 2):
        assert np.all(out[row] == 0) and np.all(np.isposinf(lse[row]))
    assert np.isfinite(lse[3]).all()
    base = layer.dense.base  # the padding after each row must not be read
    base[:, 16:] = 0
    again = layer.run_dense()
    assert same_bits((out, lse), again)


@pytest.mark.parametrize("s_q", [1, 3])
def test_lse_in_flashmla_layout_written_in_place(rng, s_q):
    """lse given as FlashMLA's [b, H, s_q]: row t lands at [t // s_q, :, t % s_q], nothing else is
    written (strided too: a slice of a larger buffer)."""
    layer = Layer(rng, 2 * s_q, 8, s_q=s_q)
    out, lse = layer.run_dense()
    big = np.full((2, 8, s_q + 2), np.nan, np.float32)
    grouped = big[:, :, 1:1 + s_q]
    out2 = layer.run_dense(lse=grouped)[0]
    assert np.array_equal(out2, out)
    want = lse.reshape(2, s_q, 8).transpose(0, 2, 1)
    assert np.array_equal(grouped.view(np.uint32), want.view(np.uint32))
    assert np.isnan(big[:, :, 0]).all() and np.isnan(big[:, :, -1]).all()
    with pytest.raises(sparsemla.Error, match="argument 'lse'.*b \\* s_q = T"):
        layer.run_dense(lse=np.zeros((3, 8, s_q), np.float32))
    with pytest.raises(sparsemla.Error, match="argument 'lse'.*shape\\[1\\]"):
        layer.run_dense(lse=np.zeros((2, 4, s_q), np.float32))


def test_dense_zero_tokens(rng):
    q = np.zeros((0, 8, 512), np.uint16)
    out, lse = sparsemla.sparse_decode(q, make_cache(rng, 1, 64), np.zeros((0, 32), np.int32), None,
                                       main_block_size=64, return_lse=True)
    assert out.shape == (0, 8, 512) and lse.shape == (0, 8)


def test_dense_list_argument_errors_name_the_argument(rng):
    layer = Layer(rng, 4, 4, w=16, lengths="row", extra=False)
    q, cache, d = layer.q, layer.main, layer.dense
    k = dict(main_block_size=64)

    def run(indices=d, indptr=None, **kw):
        return sparsemla.sparse_decode(q, cache, indices, indptr, **dict(k, **kw))
    with pytest.raises(sparsemla.Error, match="argument 'main_indices'.*2-D.*main_indptr is None"):
        run(np.ascontiguousarray(d).reshape(-1))
    with pytest.raises(sparsemla.Error, match=r"argument 'main_indices'.*shape\[0\]"):
        run(d[:3])
    with pytest.raises(sparsemla.Error, match="argument 'main_indices'.*int32"):
        run(d.astype(np.int64))
    with pytest.raises(sparsemla.Error, match="argument 'main_indices'.*unit-stride"):
        run(np.repeat(d, 2, axis=1)[:, ::2])
    with pytest.raises(sparsemla.Error, match="argument 'main_lengths'.*main_rows_per_length"):
        run(main_lengths=np.full(2, 3, np.int32))  # per request, rows_per_length not given
    run(main_lengths=np.full(2, 3, np.int32), main_rows_per_length=2)
    with pytest.raises(sparsemla.Error, match="argument 'main_lengths'.*int32"):
        run(main_lengths=np.full(4, 3, np.int64))
    with pytest.raises(sparsemla.Error, match="argument 'main_rows_per_length'"):
        run(main_lengths=np.full(4, 3, np.int32), main_rows_per_length=0)
    with pytest.raises(sparsemla.Error, match="argument 'main_width'"):
        run(main_width=32)
    idx, ptr = as_ragged(d, layer.lengths, 1)
    with pytest.raises(sparsemla.Error, match="argument 'main_lengths'.*ragged"):
        run(idx, ptr, main_lengths=layer.lengths)
    with pytest.raises(sparsemla.Error, match="argument 'main_rows_per_length'.*ragged"):
        run(idx, ptr, main_rows_per_length=2)
    with pytest.raises(sparsemla.Error, match="argument 'extra_cache'"):
        run(extra_indices=d, extra_lengths=layer.lengths)
    with pytest.raises(sparsemla.Error, match="argument 'extra_indices'"):
        run(extra_cache=cache, extra_block_size=64)
    with pytest.raises(TypeError, match="'main_lengths'"):
        run(main_lengths=[1, 2, 3, 4])


# ---- plans ----------------------------------------------------------------------------------------------
def test_plan_fields_are_the_planners_and_read_only():
    plan = sparsemla.plan_decode(6, 32, 128, 512, num_sms=64)
    assert isinstance(plan, sparsemla.DecodePlan) and plan.path == "cpu"
    assert plan.num_splits == sparsemla.testing.plan_generic(6, 32, 128, 512, 64) and plan.num_sms == 64
    s = plan.shape
    assert (s.num_tokens, s.num_heads, s.width_main, s.width_extra, s.has_extra, s.device) == \
        (6, 32, 128, 512, True, -1)
    assert (s.path, s.num_splits, s.num_sms, s.deterministic, s.caches_aligned) == \
        ("auto", 0, 64, False, True)
    want = 6 * plan.num_splits * 32 * 514 * 4 if plan.num_splits > 1 else 0
    assert plan.workspace_bytes == want
    forced = sparsemla.plan_decode(6, 32, 128, num_splits=5, path="cpu", device="cpu")
    assert forced.num_splits == 5 and forced.workspace_bytes == 6 * 5 * 32 * 514 * 4
    assert not forced.shape.has_extra and forced.shape.width_extra == 0
    assert forced.shape.path == "cpu" and forced.path == "cpu"
    assert isinstance(plan.packed, tuple) and all(isinstance(v, int) for v in plan.packed)
    assert plan == sparsemla.plan_decode(6, 32, 128, 512, num_sms=64) and plan != forced
    for name in ("num_splits", "path", "packed"):
        with pytest.raises(AttributeError):
            setattr(plan, name, 1)
    with pytest.raises(AttributeError):
        plan.shape.num_tokens = 1
    assert "num_splits" in repr(plan) and "cpu" in repr(plan)
    det = sparsemla.plan_decode(64, 16, 128, 512, num_sms=132, deterministic=True,
                                adaptive_splits=True)
    assert det.num_splits == sparsemla.testing.plan_generic(1, 16, 128, 512, 132) and not det.adaptive_splits


def test_plan_of_a_call_equals_the_plan_of_its_shape(rng):
    layer = Layer(rng, 6, 16, w=40, we=72)
    got = sparsemla.plan_decode_for(layer.q, layer.main, layer.dense, None, **layer.dense_kwargs())
    assert got == sparsemla.plan_decode(6, 16, 40, 72)
    assert sparsemla.decode_num_splits(layer.q, layer.main, layer.dense, None,
                                       **layer.dense_kwargs(num_splits=7)) == 7
    (mi, mp), _ = layer.ragged()
    ragged = sparsemla.plan_decode_for(layer.q, layer.main, mi, mp, main_block_size=64)
    assert ragged == sparsemla.plan_decode(6, 16, mi.shape[0] // 6)  # capacity // T


@pytest.mark.parametrize("splits", [0, 1, 4])
def test_plan_reused_across_layers_equals_planning_per_call(rng, splits):
    """One plan per step, several layers (their own caches, queries and lists, the same shapes),
    one workspace: the same bits as each call planning itself."""
    t, h, w, we = 6, 16, 40, 72
    plan = sparsemla.plan_decode(t, h, w, we, num_splits=splits)
    ws = np.empty(plan.workspace_bytes, np.uint8)
    for _ in range(3):
        layer = Layer(rng, t, h, w=w, we=we, s_q=2, lengths="request")
        planned = layer.run_dense(plan=plan, workspace=ws)
        assert same_bits(planned, layer.run_dense(num_splits=splits))
        assert same_bits(planned, layer.run_ragged(num_splits=splits))
    # A ragged call of the same shape runs the plan too.
    assert same_bits(layer.run_ragged(plan=plan), layer.run_ragged(num_splits=splits))


def test_plan_of_another_shape_is_refused_naming_the_field(rng):
    layer = Layer(rng, 4, 16, w=40, we=72)
    run = layer.run_dense
    for plan, field in ((sparsemla.plan_decode(5, 16, 40, 72), "num_tokens"),
                        (sparsemla.plan_decode(4, 8, 40, 72), "num_heads"),
                        (sparsemla.plan_decode(4, 16, 64, 72), "width_main"),
                        (sparsemla.plan_decode(4, 16, 40, 80), "width_extra"),
                        (sparsemla.plan_decode(4, 16, 40), "has_extra")):
        with pytest.raises(sparsemla.Error, match=rf"argument 'plan\.shape\.{field}'"):
            run(plan=plan)
    plan = sparsemla.plan_decode(4, 16, 40, 72, num_splits=3)
    with pytest.raises(sparsemla.Error, match="num_splits.*plan"):
        run(plan=plan, num_splits=3)  # options belong to the plan
    with pytest.raises(sparsemla.Error, match="argument 'workspace"):
        run(plan=plan, workspace=np.empty(plan.workspace_bytes - 4, np.uint8))
    with pytest.raises(sparsemla.Error, match="argument 'plan'.*DecodePlan"):
        run(plan=plan.packed)
    with pytest.raises(sparsemla.Error, match=r"argument 'shape\.num_heads'"):
        sparsemla.plan_decode(4, 0, 40)
    with pytest.raises(sparsemla.Error, match=r"argument 'shape\.width_extra'"):
        sparsemla.plan_decode(4, 16, 40, 8, has_extra=False)
    with pytest.raises(sparsemla.Error, match="argument 'device'"):
        sparsemla.plan_decode(4, 16, 40, device="tpu")
    with pytest.raises(sparsemla.Error, match=r"argument 'shape\.path'"):
        sparsemla.plan_decode(4, 16, 40, path="cuda-generic")
    if not sparsemla.built_with_cuda():
        with pytest.raises(sparsemla.Error, match=r"argument 'shape\.device'"):
            sparsemla.plan_decode(4, 16, 40, device="cuda:0")

