"""sparse_decode (SPEC 4) on the CPU backend against the float64 numpy reference in reference.py, plus
the queries (is_supported, split count, workspace size), the library's own reference and verifier,
and argument errors."""

import math

import numpy as np
import pytest

import reference as ref
import sparsemla

TABLE = ref.rope_table(8192, theta=160000.0, yarn=True)
INVALID = [-2**31, -1, "n", "n+1024", 2**31 - 1]
SCALE = float(np.float32(512 ** -0.5))  # the library's default scale is this fp32 value
S03 = float(np.float32(0.03))  # scales pass through fp32


def make_cache(rng, nb, bs, pad=0):
    """A cache filled by the window writer from random latents 0.1 * N(0, 1) clipped to +-0.2.

    Argument for the size: the SPEC 9 rule (abs 1e-3 or rel 2/128 per element) must cover the bf16
    rounding of the probabilities before P.V. It moves an output element by at most 2^-9 * max|v|
    (the weights p_j / L sum to <= 1); the RoPE pairs are rotated twice (writer, output), so
    max|v| <= sqrt(2) * 0.2 * (1 + 2^-8) there and the error <= sqrt(2) * 2^-9 * 0.284 = 7.8e-4,
    plus the output's bf16 rounding (<= 1.25e-4 below |out| = 0.064, where the abs bound applies;
    above it the relative bound holds: (7.8e-4 + 2^-9 |out|) / |out| < 2/128). So every element
    passes for every seed. Unclipped 0.25 * N(0, 1) latents failed about once in a few hundred
    runs (seed 3176790068351532481: a 2-key row, |v| ~ 0.55, d = 1.05e-3 on |ref| = 0.06)."""
    cache = rng.integers(0, 256, size=(nb, bs * 584 + pad), dtype=np.uint8)
    n = nb * bs
    latents = np.clip(0.1 * rng.standard_normal((n, 512)), -0.2, 0.2)
    kv = ref.bf16_round_bits_fast(latents.astype(np.float32))
    sparsemla.write_window(kv, rng.integers(0, 8192, n).astype(np.int64),
                           np.arange(n, dtype=np.int64), TABLE, cache, block_size=bs)
    return cache


def make_rows(rng, t, n_slots, lengths, invalid_rate=0.1):
    rows = []
    for i in range(t):
        ln = int(lengths[i % len(lengths)])
        row = list(rng.integers(0, n_slots, ln))
        for j in range(ln):
            if rng.random() < invalid_rate:
                v = INVALID[int(rng.integers(0, len(INVALID)))]
                row[j] = {"n": n_slots, "n+1024": n_slots + 1024}.get(v, v)
        rows.append(row)
    return rows


class Problem:
    def __init__(self, rng, t, h, main_bs=64, main_nb=5, extra=True, extra_bs=2, extra_nb=300,
                 main_lens=(0, 1, 31, 32, 33, 63, 64, 65, 128), extra_lens=(512, 0, 97, 1000),
                 pad=0, sink=True):
        self.t, self.h = t, h
        self.q = ref.bf16_round_bits_fast(rng.standard_normal((t, h, 512)).astype(np.float32))
        self.main = (make_cache(rng, main_nb, main_bs, pad), main_bs)
        self.main_list = ref.ragged(make_rows(rng, t, main_nb * main_bs, main_lens))
        self.extra = None
        if extra:
            self.extra = (make_cache(rng, extra_nb, extra_bs), extra_bs)
            self.extra_list = ref.ragged(make_rows(rng, t, extra_nb * extra_bs, extra_lens))
        self.sink = (rng.standard_normal(h) * 2).astype(np.float32) if sink else None

    def kwargs(self, **kw):
        k = dict(main_block_size=self.main[1], sink=self.sink)
        if self.extra is not None:
            k.update(extra_cache=self.extra[0], extra_indices=self.extra_list[0],
                     extra_indptr=self.extra_list[1], extra_block_size=self.extra[1])
        k.update(kw)
        return k

    def run(self, **kw):
        k = self.kwargs(**kw)
        return sparsemla.sparse_decode(self.q, self.main[0], self.main_list[0], self.main_list[1], **k)

    def reference(self, sink="default", scale=SCALE):
        caches, lists = [self.main], [self.main_list]
        if self.extra is not None:
            caches.append(self.extra)
            lists.append(self.extra_list)
        return ref.decode(self.q, caches, lists, self.sink if isinstance(sink, str) else sink, scale)


def assert_lse_close(lse, want):
    assert np.array_equal(np.isposinf(lse), np.isposinf(want))
    fin = np.isfinite(want)
    d = np.abs(lse[fin].astype(np.float64) - want[fin])
    assert np.all((d < 1e-6) | (d / (np.abs(want[fin]) + 1e-6) < 8.01 / 65536))


@pytest.mark.parametrize("h", [1, 3, 16, 64])
def test_window_only_matches_reference_across_head_counts(rng, h):
    p = Problem(rng, 9, h, extra=False)
    out, lse = p.run(return_lse=True)
    want, want_lse = p.reference()
    ref.assert_decode_close(out, want)
    assert_lse_close(lse, want_lse)


@pytest.mark.parametrize("main_bs,pad,extra_bs", [(64, 0, 2), (61, 0, 64), (16, 576, 1)])
def test_main_plus_extra_lists_one_softmax_page_sizes(rng, main_bs, pad, extra_bs):
    p = Problem(rng, 6, 16, main_bs=main_bs, main_nb=4, pad=pad, extra_bs=extra_bs,
                extra_nb=600 // extra_bs)
    out, lse = p.run(return_lse=True, scale=S03)
    want, want_lse = p.reference(scale=S03)
    ref.assert_decode_close(out, want)
    assert_lse_close(lse, want_lse)
    # Without the sink, the output changes; the lse does not (it never includes the sink).
    out2, lse2 = p.run(return_lse=True, scale=S03, sink=None)
    ref.assert_decode_close(out2, p.reference(sink=None, scale=S03)[0])
    assert np.array_equal(lse2, lse)


@pytest.mark.parametrize("splits", [1, 2, 3, 4, 8, 32])
def test_split_counts_all_match_reference(rng, splits):
    p = Problem(rng, 4, 8, extra_lens=(700, 3, 0, 1200))
    out, lse = p.run(num_splits=splits, return_lse=True)
    want, want_lse = p.reference()
    ref.assert_decode_close(out, want)
    assert_lse_close(lse, want_lse)


def test_sink_minus_inf_changes_nothing_plus_inf_gives_zero_and_empty_rows_zero(rng):
    p = Problem(rng, 5, 4, main_lens=(0, 20, 128, 5, 0), extra_lens=(0, 0, 300, 64, 0),
                sink=False)
    idx, ptr = p.main_list
    p.main_list = ref.ragged([[] if i in (0, 4) else list(idx[ptr[i]:ptr[i + 1]])
                              for i in range(5)])
    base, base_lse = p.run(return_lse=True)
    minus, minus_lse = p.run(return_lse=True, sink=np.full(4, -np.inf, dtype=np.float32))
    assert np.array_equal(base, minus) and np.array_equal(base_lse, minus_lse)
    plus = p.run(sink=np.array([np.inf, 0.5, np.inf, -1], dtype=np.float32))
    assert np.all(plus[:, [0, 2]] == 0)
    want = p.reference(sink=np.array([np.inf, 0.5, np.inf, -1]))[0]
    ref.assert_decode_close(plus[:, [1, 3]], want[:, [1, 3]])
    for row in (0, 4):  # no valid key: exact 0 and lse +inf
        assert np.all(base[row] == 0) and np.all(np.isposinf(base_lse[row]))
    assert np.isfinite(base_lse[1:4]).all()


def test_fused_inverse_rope_equals_standalone(rng):
    p = Problem(rng, 7, 16)
    pos = rng.integers(0, 8192, 7).astype(np.int64)
    fused = p.run(positions=pos, rope=TABLE)
    plain = p.run()
    sparsemla.inverse_rope(plain, pos, TABLE)
    assert np.array_equal(fused[..., :448], plain[..., :448])
    a = ref.bf16_to_f32(fused[..., 448:]).astype(np.float64)
    b = ref.bf16_to_f32(plain[..., 448:]).astype(np.float64)
    mag = np.repeat(np.hypot(b[..., 0::2], b[..., 1::2]), 2, axis=-1)
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(mag, 1e-30))) - 7)
    assert np.all(np.abs(a - b) <= 2 * ulp)
    want, _ = p.reference()
    c, s = TABLE[pos, :32][:, None, :].astype(np.float64), TABLE[pos, 32:][:, None, :].astype(np.float64)
    want[..., 448:] = ref.rope_inverse(want[..., 448:], c, s)
    ref.assert_decode_close(fused, want)


def test_strided_q_out_lse_and_explicit_workspace(rng):
    p = Problem(rng, 5, 6)
    want, want_lse = p.reference()
    q_big = np.zeros((5, 8, 512), dtype=np.uint16)
    q_big[:, 1:7] = p.q
    p.q = q_big[:, 1:7]
    out_big = np.full((5, 6, 1024), 0x7FC0, dtype=np.uint16)
    lse_t = np.full((6, 5), np.nan, dtype=np.float32)
    ws = np.empty(sparsemla.workspace_size(5, 6, 4), dtype=np.uint8)
    res = p.run(out=out_big[:, :, 256:768], lse=lse_t.T, workspace=ws, num_splits=4)
    assert res[0].base is out_big or res[0].base is out_big.base
    ref.assert_decode_close(out_big[:, :, 256:768], want)
    assert_lse_close(lse_t.T, want_lse)
    assert np.all(out_big[:, :, :256] == 0x7FC0) and np.all(out_big[:, :, 768:] == 0x7FC0)
    with pytest.raises(sparsemla.Error, match="workspace"):
        p.run(num_splits=4, workspace=ws[:100])


def test_poisoned_caches_are_scrubbed(rng):
    p = Problem(rng, 3, 4, main_lens=(40,), extra_lens=(60,))
    for cache, bs in (p.main, p.extra):
        n = cache.shape[0] * bs
        for s in rng.integers(0, n, 30):
            b, q = divmod(int(s), bs)
            row = cache[b]
            kind = int(rng.integers(0, 3))
            if kind == 0:
                row[q * 576 + int(rng.integers(0, 448))] = 0x7F           # NaN byte
            elif kind == 1:
                t = int(rng.integers(0, 7))
                row[q * 576 + t * 64:q * 576 + t * 64 + 64] = 0          # zero bytes
                row[bs * 576 + q * 8 + t] = 255                          # x code 255 = NaN
            else:
                k = int(rng.integers(0, 64))
                row[q * 576 + 448 + 2 * k:q * 576 + 450 + 2 * k] = [0xC0, 0x7F]  # NaN RoPE
    out = p.run()
    assert not np.isnan(ref.bf16_to_f32(out)).any()
    ref.assert_decode_close(out, p.reference()[0])
    # The CPU path is never the specialised one: asserting a sanitised extra cache changes nothing.
    assert np.array_equal(p.run(trust_extra_nan_free=True), out)


def test_permuted_lists_give_the_same_result_within_tolerance(rng):
    p = Problem(rng, 3, 16, main_lens=(100,), extra_lens=(300,))
    out = p.run()
    idx, ptr = p.extra_list
    perm = idx.copy()
    for t in range(3):
        perm[ptr[t]:ptr[t + 1]] = rng.permutation(idx[ptr[t]:ptr[t + 1]])
    p.extra_list = (perm, ptr)
    ref.assert_decode_close(p.run(), ref.bf16_to_f32(out).astype(np.float64))


def test_queries_splits_workspace_support_and_library_reference(rng):
    p = Problem(rng, 4, 32)
    args = (p.q, p.main[0], p.main_list[0], p.main_list[1])
    assert sparsemla.is_supported(*args, **p.kwargs())
    assert sparsemla.unsupported_reason(*args, **p.kwargs()) is None
    assert sparsemla.decode_num_splits(*args, **p.kwargs(num_splits=5)) == 5
    s = sparsemla.decode_num_splits(*args, **p.kwargs(num_sms=64))
    # Planner widths default to capacity // T.
    assert s == ref.plan_generic(4, 32, p.main_list[0].shape[0] // 4,
                                 p.extra_list[0].shape[0] // 4, 64)
    s2 = sparsemla.decode_num_splits(*args, **p.kwargs(planner="specialised", num_sms=132,
                                                       main_width=128, extra_width=1024))
    assert s2 == ref.plan_specialised(4, 32, 128, 1024, 132)
    assert sparsemla.workspace_size(4, 32, 3) == 4 * 3 * 32 * 514 * 4
    bad = p.q[:, :0]
    reason = sparsemla.unsupported_reason(bad, *args[1:], **p.kwargs(sink=None))
    assert reason is not None and "num_heads" in reason
    assert not sparsemla.is_supported(bad, *args[1:], **p.kwargs(sink=None))
    # The library's float64 reference and verifier agree with ours.
    lib_out, lib_lse = sparsemla.sparse_decode_reference(*args, **p.kwargs())
    want, want_lse = p.reference()
    np.testing.assert_allclose(lib_out, want, rtol=1e-9, atol=1e-12)
    assert np.array_equal(np.isinf(lib_lse), np.isinf(want_lse))
    np.testing.assert_allclose(lib_lse[np.isfinite(want_lse)], want_lse[np.isfinite(want_lse)],
                               rtol=1e-12)
    out = p.run()
    v = sparsemla.verify_decode_output(out, want)
    assert v["passed"] and v["elements"] == out.size
    bad_out = out.copy()
    bad_out[1, 2, 3] ^= 0x4000
    assert not sparsemla.verify_decode_output(bad_out, want)["passed"]


def test_deterministic_row_bits_independent_of_batchmates_num_sms_132(rng):
    """docs/RELIABILITY.md 4: with deterministic=True a row decoded alone and inside batches of 2, 7
    and 64 random batchmates (at a random place) gives the same out and lse bits. H 16, widths
    128 + 512, CU 132: alone S = 16, at T = 64 S = 2, so without the flag the same comparison must
    differ somewhere (else the test could not tell S apart)."""
    h, wm, we, cu, pool_size = 16, 128, 512, 132, 80
    main = (make_cache(rng, 8, 64), 64)
    extra = (make_cache(rng, 400, 2), 2)
    q = ref.bf16_round_bits_fast(rng.standard_normal((pool_size, h, 512)).astype(np.float32))
    mains = make_rows(rng, pool_size, 8 * 64, list(rng.integers(1, wm + 1, pool_size)))
    extras = make_rows(rng, pool_size, 400 * 2, list(rng.integers(1, we + 1, pool_size)))
    sink = (rng.standard_normal(h) * 2).astype(np.float32)
    probes = [r for r in rng.permutation(pool_size) if len(extras[r]) >= 200][:2]
    assert len(probes) == 2

    def decode(ids, deterministic):
        mi, mp = ref.ragged([mains[i] for i in ids])
        ei, ep = ref.ragged([extras[i] for i in ids])
        kw = dict(main_block_size=main[1], main_width=wm, extra_cache=extra[0], extra_indices=ei,
                  extra_indptr=ep, extra_block_size=extra[1], extra_width=we, sink=sink,
                  num_sms=cu, deterministic=deterministic)
        qb = np.ascontiguousarray(q[ids])
        s = sparsemla.decode_num_splits(qb, main[0], mi, mp, **kw)
        out, lse = sparsemla.sparse_decode(qb, main[0], mi, mp, return_lse=True, **kw)
        return s, out, lse

    # The rule: S is the planner's for T = 1 whatever the batch (also for a named planner).
    assert decode([probes[0]] * 64, True)[0] == ref.plan_generic(1, h, wm, we, cu) == 16
    assert decode([probes[0]] * 64, False)[0] == ref.plan_generic(64, h, wm, we, cu) == 2
    qb, (mi, mp) = q[:64], ref.ragged(mains[:64])
    for det, t_plan in ((True, 1), (False, 64)):  # S 32 vs 4
        s = sparsemla.decode_num_splits(qb, main[0], mi, mp, main_block_size=64, main_width=wm,
                                        planner="specialised", num_sms=cu, deterministic=det)
        assert s == ref.plan_specialised(t_plan, h, wm, 0, cu)

    compared = differences = nondet_differences = 0
    for probe in probes:
        alone = {det: decode([probe], det)[1:] for det in (True, False)}
        for size in (2, 7, 64):
            others = [int(r) for r in rng.permutation(pool_size) if r != probe][:size - 1]
            at = int(rng.integers(0, size))
            ids = others[:at] + [probe] + others[at:]
            for det in (True, False):
                _, out, lse = decode(ids, det)
                same = (np.array_equal(out[at], alone[det][0][0])
                        and np.array_equal(lse[at].view(np.uint32),
                                           alone[det][1][0].view(np.uint32)))
                if det:
                    compared += 1
                    differences += not same
                else:
                    nondet_differences += not same
    assert compared == 6 and differences == 0
    assert nondet_differences > 0, "deterministic=False gave the same bits: S was not told apart"


def test_zero_tokens_returns_empty_output(rng):
    p = Problem(rng, 0, 8, extra=False)
    out, lse = p.run(return_lse=True)
    assert out.shape == (0, 8, 512) and lse.shape == (0, 8)


def test_argument_errors_name_the_argument(rng):
    p = Problem(rng, 2, 4, main_lens=(10,), extra=False)
    q, cache, (idx, ptr) = p.q, p.main[0], p.main_list
    k = dict(main_block_size=64)
    with pytest.raises(sparsemla.Error, match="argument 'q'.*bf16.*float32"):
        sparsemla.sparse_decode(q.astype(np.float32), cache, idx, ptr, **k)
    with pytest.raises(sparsemla.Error, match="argument 'out'"):
        sparsemla.sparse_decode(q, cache, idx, ptr, out=np.zeros((2, 4, 256), np.uint16), **k)
    with pytest.raises(sparsemla.Error, match="main_indptr"):
        sparsemla.sparse_decode(q, cache, idx, ptr[:2], **k)
    with pytest.raises(sparsemla.Error, match="main_indices.*int32"):
        sparsemla.sparse_decode(q, cache, idx.astype(np.int64), ptr, **k)
    with pytest.raises(sparsemla.Error, match="sink"):
        sparsemla.sparse_decode(q, cache, idx, ptr, sink=np.zeros(3, np.float32), **k)
    with pytest.raises(sparsemla.Error, match="extra_cache"):
        sparsemla.sparse_decode(q, cache, idx, ptr, extra_indices=idx, extra_indptr=ptr, **k)
    with pytest.raises(sparsemla.Error, match="main_cache.*block_size"):
        sparsemla.sparse_decode(q, cache, idx, ptr)
    with pytest.raises(sparsemla.Error, match="rope"):
        sparsemla.sparse_decode(q, cache, idx, ptr, positions=np.zeros(2, np.int64), **k)
    with pytest.raises(sparsemla.Error, match=r"positions\[1\]"):
        sparsemla.sparse_decode(q, cache, idx, ptr, positions=np.array([0, 9000], np.int64),
                                rope=TABLE, **k)
    with pytest.raises(sparsemla.Error, match=r"main_list.indptr\[2\]"):
        bad = ptr.copy()
        bad[2] = 10**6
        sparsemla.sparse_decode(q, cache, idx, bad, **k)
    with pytest.raises(sparsemla.Error, match="planner"):
        sparsemla.sparse_decode(q, cache, idx, ptr, planner="fastest", **k)
    with pytest.raises(sparsemla.Error, match="path"):
        sparsemla.sparse_decode(q, cache, idx, ptr, path="cuda-generic", **k)
    with pytest.raises(TypeError, match="'main_indices'"):
        sparsemla.sparse_decode(q, cache, [1, 2], ptr, **k)
    assert isinstance(sparsemla.Error("x"), ValueError)
    assert math.isclose(sparsemla.DEFAULT_SCALE, 512 ** -0.5, rel_tol=1e-7)
