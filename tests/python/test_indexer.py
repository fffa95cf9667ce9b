"""The lightning-indexer decode (CONTRACT 11) and its query prep (11.6) through the Python package on
numpy arrays (the CPU backend), against the float64 reference of indexer_reference.py: exact data
bit for bit in both orders, the near-tie rule of 11.7 on random data, invalid device values,
ties, layouts, strides, the candidate helper, the size query and the pipeline indexer -> ratio-4
builder -> decode. Bad arguments: test_bad_inputs.py style, here at the end."""

import re

import numpy as np
import pytest

import indexer_reference as iref
import reference as ref
import sparsemla

NEG_INF = np.float32(-np.inf)


def check_rows(p, got, k, order, *, exact, lengths=None, scores=None):
    """11.7 on every row: structure always; exact data: indices and scores equal the reference's;
    random data: the score bound and the near-tie rule (eps = 2^-16, fp32 path)."""
    W = got.shape[1]
    worst = 0.0
    for t in range(p.T):
        j, s, a = p.reference(t)
        ln = min(k, j.size)
        row = got[t]
        assert np.all(row[ln:] == -1), f"row {t}: padding"
        assert len(set(row[:ln].tolist())) == ln and np.all(np.isin(row[:ln], j)), f"row {t}"
        if lengths is not None:
            assert lengths[t] == ln
        if scores is not None:
            assert np.all(scores[t, ln:] == NEG_INF)
        want_j, want_s = iref.expected_selection(j, s, k, order)
        if exact:
            assert np.array_equal(row[:ln], want_j), f"row {t}: {row[:ln]} != {want_j}"
            if scores is not None:
                np.testing.assert_array_equal(scores[t, :ln], want_s.astype(np.float32))
            continue
        if order == "by_index":
            assert np.all(np.diff(row[:ln]) > 0)
        pos = {int(x): i for i, x in enumerate(j)}
        sel = np.array([pos[int(x)] for x in row[:ln]], dtype=np.int64)
        e = 2.0 ** -16 * a
        if scores is not None and ln:
            err = np.abs(scores[t, :ln].astype(np.float64) - s[sel])
            assert np.all(err <= e[sel]), f"row {t}: score error"
            worst = max(worst, float(np.max(err / np.maximum(a[sel], 1e-300))))
        unsel = np.setdiff1d(np.arange(j.size), sel)
        if ln and unsel.size:
            assert np.min(s[sel] + e[sel]) >= np.max(s[unsel] - e[unsel]), f"row {t}: near-tie"
    assert got.shape == (p.T, W)
    return worst


@pytest.mark.parametrize("layout", ["normal", "shuffle"])
@pytest.mark.parametrize("order", ["by_index", "by_score"])
def test_exact_data_bit_for_bit_with_invalid_device_values(rng, layout, order):
    p = iref.Problem(rng, T=9, H=16, R=3, Wt=5, bs=16, nb=8, layout=layout, exact=True, pad=576)
    p.table[1, 2] = -1                    # invalid page ids leave C_t
    p.table[2, 0] = p.nb
    p.table[2, 3] = 2 ** 31 - 1
    p.table[0, 4] = p.table[0, 1]         # a duplicate page: distinct candidates
    p.row_request[4] = -1                 # padding rows
    p.row_request[5] = p.R
    p.n[6] = -5                           # negative n: 0
    p.n[7] = p.Wt * p.bs + 1000           # clamped
    k = 7
    idx, ln, sc = sparsemla.indexer_topk(*p.args(), k, block_size=p.bs, layout=layout,
                                         width=k + 5, order=order, return_lengths=True,
                                         return_scores=True)
    assert idx.dtype == np.int32 and ln.dtype == np.int32 and sc.dtype == np.float32
    check_rows(p, idx, k, order, exact=True, lengths=ln, scores=sc)
    # Without scores the same indices (the CPU may skip key reads where n <= k).
    alone = sparsemla.indexer_topk(*p.args(), k, block_size=p.bs, layout=layout, width=k + 5,
                                   order=order)
    assert np.array_equal(alone, idx)


def test_random_data_within_the_near_tie_rule_with_mtp_rows(rng):
    p = iref.Problem(rng, T=8, H=64, R=4, Wt=6, bs=64, nb=24,
                     row_request=[0, 0, 1, 1, 2, 2, 3, 3])
    p.n[1::2] = p.n[0::2] + 1             # MTP rows: n differing by one
    p.n = np.minimum(p.n, p.Wt * p.bs)
    k = 40
    idx, ln, sc = sparsemla.indexer_topk(*p.args(), k, order="by_score", return_lengths=True,
                                         return_scores=True, block_size=p.bs)
    worst = check_rows(p, idx, k, "by_score", exact=False, lengths=ln, scores=sc)
    assert worst < 2.0 ** -16
    idx2 = sparsemla.indexer_topk(*p.args(), k, block_size=p.bs)
    for t in range(p.T):  # by_index: the same set, ascending
        assert np.array_equal(idx2[t][idx2[t] >= 0], np.sort(idx[t][idx[t] >= 0]))


def test_ties_lowest_indices_win_and_rows_are_independent(rng):
    p = iref.Problem(rng, T=3, H=4, R=1, Wt=4, bs=16, nb=4, exact=True, n=[64, 64, 37],
                     row_request=[0, 0, 0])
    p.q[0] = 0                            # all-zero row: every score 0 (ReLU)
    p.w[1] = 0                            # all-equal scores
    k = 10
    idx, sc = sparsemla.indexer_topk(*p.args(), k, block_size=p.bs, return_scores=True)[::2]
    assert np.array_equal(idx[0], np.arange(k)) and np.array_equal(idx[1], np.arange(k))
    assert np.all(sc[0] == 0)
    one = sparsemla.indexer_topk(p.q[2:], p.w[2:], p.cache, p.table, p.row_request[2:], p.n[2:], k,
                                 block_size=p.bs)
    assert np.array_equal(one[0], idx[2])


def test_strided_views_and_given_outputs(rng):
    p = iref.Problem(rng, T=5, H=8, R=2, Wt=3, bs=16, nb=6, exact=True)
    k = 9
    want = sparsemla.indexer_topk(*p.args(), k, block_size=p.bs, width=12)
    qbig = np.zeros((p.T, p.H + 2, 160), dtype=np.uint8)
    qbig[:, 1:p.H + 1, :128] = p.q
    wbig = np.zeros((p.T, p.H + 3), dtype=np.float32)
    wbig[:, :p.H] = p.w
    out = np.full((p.T, 20), 99, dtype=np.int32)
    got = sparsemla.indexer_topk(qbig[:, 1:p.H + 1, :128], wbig[:, :p.H], p.cache, p.table,
                                 p.row_request, p.n, k, block_size=p.bs, out=out[:, 4:16])
    assert got.base is out or got is not None
    assert np.array_equal(out[:, 4:16], want)
    assert np.all(out[:, :4] == 99) and np.all(out[:, 16:] == 99)
    # A 3-D cache view names its page size: block_size taken from shape[1].
    c3 = p.cache[:, :p.bs * 132].reshape(p.nb, p.bs, 132)
    assert np.array_equal(sparsemla.indexer_topk(p.q, p.w, c3, p.table, p.row_request, p.n, k,
                                                 width=12), want)
    # float8 views of the query bytes (ml_dtypes).
    ml = pytest.importorskip("ml_dtypes")
    assert np.array_equal(sparsemla.indexer_topk(p.q.view(ml.float8_e4m3fn), p.w, c3, p.table,
                                                 p.row_request, p.n, k, width=12), want)


def test_empty_batch_and_size_query(rng):
    p = iref.Problem(rng, T=2, H=4, R=1, Wt=2, bs=16, nb=2)
    assert sparsemla.indexer_workspace_size(*p.args(), 8, block_size=p.bs) == 0
    assert sparsemla.indexer_workspace_size(*p.args(), 8, block_size=p.bs, width=16,
                                            with_scores=True, order="by_score") == 0
    e = sparsemla.indexer_topk(p.q[:0], p.w[:0], p.cache, p.table, p.row_request[:0], p.n[:0], 8,
                               block_size=p.bs)
    assert e.shape == (0, 8)


def test_candidates_from_positions():
    pos = np.array([-5, -1, 0, 1, 2, 3, 4, 7, 8, 2 ** 33 - 2, 2 ** 33 - 5], dtype=np.int64)
    n = sparsemla.indexer_candidates_from_positions(pos)
    want = np.where(pos < 0, 0, (pos + 1) // 4)
    assert n.dtype == np.int32 and np.array_equal(n, want)
    with pytest.raises(sparsemla.Error, match="argument 'positions'"):
        sparsemla.indexer_candidates_from_positions(np.array([2 ** 33 - 1], dtype=np.int64))


# ---- query prep (11.6) ---------------------------------------------------------------------------------
def prep_inputs(rng, T, H, P=512):
    q = ref.bf16_round_bits_fast((rng.standard_normal((T, H, 128)) * 3).astype(np.float32))
    w = ref.bf16_round_bits_fast(rng.standard_normal((T, H)).astype(np.float32))
    pos = rng.integers(0, P, T).astype(np.int64)
    return q, pos, sparsemla.build_rope_table(P), w


def test_q_prep_bit_exact_with_edges(rng):
    q, pos, rope, w = prep_inputs(rng, 6, 16)
    q[0, 0] = ref.bf16_round_bits_fast(np.full(128, 1e-6, dtype=np.float32))   # amax below 1e-4
    q[0, 1, :64] = ref.bf16_round_bits_fast(np.float32(0.5))
    q[0, 1, 3] = ref.bf16_round_bits_fast(np.float32(448 * 2.0 ** 3))         # exactly 448*2^k
    q[0, 1, 64:] = 0
    q[0, 2] = q[0, 1]
    q[0, 2, 3] += 1                                                          # one ulp above
    q[1, 0, 5] = 0x7FC0                                                      # NaN
    q[1, 1, 9] = 0x7F80                                                      # +inf
    pos[2] = -1                                                              # padding row
    qb, wf = sparsemla.indexer_q_prep(q, pos, rope, w)
    want_b, want_w = iref.q_prep(q, pos, rope, w)
    assert qb.dtype == np.uint8 and wf.dtype == np.float32
    assert np.array_equal(qb, want_b)
    assert np.array_equal(wf.view(np.uint32)[~np.isnan(want_w)],
                          want_w.view(np.uint32)[~np.isnan(want_w)])
    assert np.all(qb[2] == 0) and np.all(wf[2] == 0)
    assert qb[0, 1, 3] == 0x7E and qb[0, 2, 3] == 0x76


def test_q_prep_feeds_the_indexer_pipeline(rng):
    """q prep -> indexer -> ratio-4 builder: the builder's list equals the
    indexer's rows mapped through the table (CONTRACT 4.6; item 9 of CONTRACT 11.8)."""
    T, H, bs, nb, Wt = 4, 64, 16, 12, 4
    q, pos, rope, wr = prep_inputs(rng, T, H)
    qb, w = sparsemla.indexer_q_prep(q, pos, rope, wr)
    p = iref.Problem(rng, T=T, H=H, R=T, Wt=Wt, bs=bs, nb=nb)
    k = 16
    idx, ln, _ = sparsemla.indexer_topk(qb, w, p.cache, p.table, p.row_request, p.n, k,
                                        block_size=bs, return_lengths=True)
    ind, ptr = sparsemla.build_topk_lists(idx, p.table, bs, topk_length=ln)
    for t in range(T):
        row = ind[ptr[t]:ptr[t + 1]]
        loc = idx[t][:ln[t]]
        assert np.array_equal(row, p.table[t][loc // bs] * bs + loc % bs)


# ---- bad arguments ----------------------------------------------------------------------------------------
def bad(fn, arg, *args, exc=sparsemla.Error, **kw):
    with pytest.raises(exc, match=re.escape(f"argument '{arg}'")):
        fn(*args, **kw)


def test_indexer_bad_arguments_name_the_argument(rng):
    p = iref.Problem(rng, T=3, H=4, R=2, Wt=2, bs=16, nb=3)
    q, w, cache, table, rr, n = p.args()
    f = sparsemla.indexer_topk
    kw = dict(block_size=p.bs)
    bad(f, "q", q.astype(np.float32), w, cache, table, rr, n, 8, **kw)
    bad(f, "q", q[..., :64], w, cache, table, rr, n, 8, **kw)
    bad(f, "q", q[:, :, ::2], w, cache, table, rr, n, 8, **kw)
    bad(f, "q", np.zeros((3, 129, 128), np.uint8), np.zeros((3, 129), np.float32), cache, table,
        rr, n, 8, **kw)
    bad(f, "q", q[0], w, cache, table, rr, n, 8, **kw)
    bad(f, "w", q, w.astype(np.float64), cache, table, rr, n, 8, **kw)
    bad(f, "w", q, w[:, :3], cache, table, rr, n, 8, **kw)
    bad(f, "w", q, w[:2], cache, table, rr, n, 8, **kw)
    bad(f, "cache", q, w, cache.astype(np.int32), table, rr, n, 8, **kw)
    bad(f, "cache", q, w, cache[:, :100], table, rr, n, 8, **kw)
    bad(f, "block_size", q, w, cache, table, rr, n, 8)
    bad(f, "block_table", q, w, cache, table.astype(np.int64), rr, n, 8, **kw)
    bad(f, "block_table", q, w, cache, table[:, ::2][:, :1].repeat(2, 1)[:, ::-1], rr, n, 8, **kw)
    bad(f, "row_request", q, w, cache, table, rr[:2], n, 8, **kw)
    bad(f, "row_request", q, w, cache, table, rr.astype(np.int64), n, 8, **kw)
    bad(f, "num_candidates", q, w, cache, table, rr, n.astype(np.float32), 8, **kw)
    bad(f, "topk", q, w, cache, table, rr, n, 0, **kw)
    bad(f, "topk", q, w, cache, table, rr, n, 2049, width=4096, **kw)
    bad(f, "topk", q, w, cache, table, rr, n, 8.0, exc=TypeError, **kw)
    bad(f, "width", q, w, cache, table, rr, n, 8, width=7, **kw)
    bad(f, "layout", q, w, cache, table, rr, n, 8, layout="tiled", **kw)
    bad(f, "order", q, w, cache, table, rr, n, 8, order="descending", **kw)
    bad(f, "path", q, w, cache, table, rr, n, 8, path="gpu", **kw)
    bad(f, "path", q, w, cache, table, rr, n, 8, path="cuda-generic", **kw)
    bad(f, "out", q, w, cache, table, rr, n, 8, out=np.zeros((3, 8), np.int64), **kw)
    bad(f, "out", q, w, cache, table, rr, n, 8, out=np.zeros((3, 7), np.int32), **kw)
    bad(f, "out", q, w, cache, table, rr, n, 8, out=np.zeros((2, 8), np.int32), **kw)
    ro = np.zeros((3, 8), np.int32)
    ro.flags.writeable = False
    bad(f, "out", q, w, cache, table, rr, n, 8, out=ro, **kw)
    bad(f, "out", q, w, cache, table, rr, n, 8, out=[[0] * 8] * 3, exc=TypeError, **kw)
    bad(f, "width", q, w, cache, table, rr, n, 8, out=np.zeros((3, 8), np.int32), width=9, **kw)
    bad(f, "lengths", q, w, cache, table, rr, n, 8, lengths=np.zeros(2, np.int32), **kw)
    bad(f, "scores", q, w, cache, table, rr, n, 8, scores=np.zeros((3, 8), np.float64), **kw)
    bad(f, "scores", q, w, cache, table, rr, n, 8, scores=np.zeros((3, 6), np.float32), **kw)
    bad(f, "return_scores", q, w, cache, table, rr, n, 8, return_scores="yes", exc=TypeError, **kw)
    bad(sparsemla.indexer_workspace_size, "width", q, w, cache, table, rr, n, 8, width=4, **kw)
    bad(sparsemla.indexer_workspace_size, "topk", q, w, cache, table, rr, n, 0, **kw)
    bad(sparsemla.indexer_candidates_from_positions, "positions", n)
    bad(sparsemla.indexer_candidates_from_positions, "positions", [1, 2], exc=TypeError)
    bad(sparsemla.indexer_candidates_from_positions, "out", np.zeros(3, np.int64),
        out=np.zeros(2, np.int32))


def test_q_prep_bad_arguments_name_the_argument(rng):
    q, pos, rope, w = prep_inputs(rng, 3, 4)
    f = sparsemla.indexer_q_prep
    bad(f, "q", q.astype(np.float32), pos, rope, w)
    bad(f, "q", q[..., :64], pos, rope, w)
    bad(f, "q", np.zeros((3, 129, 128), np.uint16), pos, rope, np.zeros((3, 129), np.uint16))
    bad(f, "positions", q, pos.astype(np.int32), rope, w)
    bad(f, "positions", q, pos[:2], rope, w)
    bad(f, "positions[1]", q, np.array([0, 512, 3], np.int64), rope, w)
    bad(f, "rope", q, pos, rope[:, :32], w)
    bad(f, "rope", q, pos, rope.astype(np.float64), w)
    bad(f, "w_raw", q, pos, rope, w[:, :2])
    bad(f, "w_raw", q, pos, rope, w.view(np.int16))
    bad(f, "q_out", q, pos, rope, w, q_out=np.zeros((3, 4, 128), np.int8))
    bad(f, "q_out", q, pos, rope, w, q_out=np.zeros((3, 5, 128), np.uint8))
    bad(f, "w_out", q, pos, rope, w, w_out=np.zeros((3, 4), np.float64))
    bad(f, "path", q, pos, rope, w, path="cuda-sm90")
