"""Ragged list builders and graph buffers (CONTRACT 4.6)."""

import numpy as np
import pytest

import sparsemla


def _check(indices, indptr, rows):
    """Builder output against the expected rows (lists of slots)."""
    assert indptr[0] == 0
    for r, want in enumerate(rows):
        assert indptr[r + 1] - indptr[r] == len(want), r
        assert list(indices[indptr[r]:indptr[r + 1]]) == list(want), r


def _slot(table, r, i, bs):
    col = i // bs
    if col >= table.shape[1]:
        return -1
    s = int(table[r, col]) * bs + i % bs
    return s if -2**31 <= s < 2**31 else -1


def test_dense_to_ragged_per_row_lengths_range_check_and_padding(rng):
    r, w, n = 9, 24, 500
    dense = rng.integers(-3, n + 50, size=(r, w + 5)).astype(np.int32)[:, :w]  # strided rows
    lengths = rng.integers(-2, w + 4, r).astype(np.int32)
    valid = (rng.random(r) < 0.8).astype(np.uint8)
    idx, ptr = sparsemla.build_ragged_from_dense(dense, lengths, num_slots=n, row_valid=valid)
    assert idx.shape == (r * w,) and ptr.shape == (r + 1,)
    rows = []
    for i in range(r):
        keep = min(max(int(lengths[i]), 0), w) if valid[i] else 0
        rows.append([v if 0 <= v < n else -1 for v in dense[i, :keep]])
    _check(idx, ptr, rows)
    idx2, ptr2 = sparsemla.build_ragged_from_dense(dense, lengths)  # no range check
    _check(idx2, ptr2, [list(dense[i, :min(max(int(lengths[i]), 0), w)]) for i in range(r)])


def test_dense_to_ragged_per_request_lengths_broadcast_to_mtp_rows(rng):
    b, s_q, w = 4, 3, 16
    dense = rng.integers(0, 100, size=(b * s_q, w)).astype(np.int32)
    topk_length = rng.integers(0, w + 1, b).astype(np.int32)
    req = (np.arange(b * s_q) // s_q).astype(np.int32)
    idx, ptr = sparsemla.build_ragged_from_dense(dense, topk_length, request_index=req)
    _check(idx, ptr, [list(dense[i, :topk_length[i // s_q]]) for i in range(b * s_q)])


@pytest.mark.parametrize("bs", [1, 16, 64])
def test_window_lists_slots_through_block_table(rng, bs):
    reqs, width = 5, 3
    table = rng.integers(0, 50, size=(reqs, width)).astype(np.int32)
    r = 11
    pos = rng.integers(0, width * bs + 40, r).astype(np.int64)
    pos[0] = 0
    req = rng.integers(0, reqs, r).astype(np.int32)
    idx, ptr = sparsemla.build_window_lists(pos, table, bs, request_index=req)
    rows = []
    for i in range(r):
        start, n = max(int(pos[i]) - 127, 0), min(int(pos[i]) + 1, 128)
        rows.append([_slot(table, req[i], start + j, bs) for j in range(n)])
    _check(idx, ptr, rows)


def test_topk_lists_with_and_without_topk_length(rng):
    reqs, wt, bs, w = 3, 4, 8, 20
    table = rng.integers(0, 30, size=(reqs, wt)).astype(np.int32)
    r = 6
    req = np.array([0, 0, 1, 1, 2, 2], dtype=np.int32)
    topk = rng.integers(-1, wt * bs + 3, size=(r, w)).astype(np.int32)
    topk_length = np.array([w, 5, 0], dtype=np.int32)
    for tl in (None, topk_length):
        idx, ptr = sparsemla.build_topk_lists(topk, table, bs, topk_length=tl, request_index=req)
        rows = []
        for i in range(r):
            cand = topk[i, :w if tl is None else min(max(int(tl[req[i]]), 0), w)]
            n = int(((cand >= 0) & (cand < wt * bs)).sum())
            rows.append([_slot(table, req[i], int(v), bs) if 0 <= v < wt * bs else -1
                         for v in cand[:n]])
        _check(idx, ptr, rows)


def test_compressed_all_lists_capped_at_max_compressed(rng):
    reqs, wt, bs = 2, 40, 2
    table = rng.integers(0, 100, size=(reqs, wt)).astype(np.int32)
    maxc = sparsemla.max_compressed_entries(128 * 20, 128)
    assert maxc == 128 and sparsemla.max_compressed_entries(1 << 20) == 8192
    pos = np.array([0, 126, 127, 128 * 70 + 5, 128 * 200], dtype=np.int64)
    req = np.array([0, 1, 0, 1, 0], dtype=np.int32)
    idx, ptr = sparsemla.build_compressed_all_lists(pos, table, bs, 64, request_index=req)
    rows = [[_slot(table, req[i], j, bs) for j in range(min((int(pos[i]) + 1) // 128, 64))]
            for i in range(5)]
    _check(idx, ptr, rows)
    assert ptr[-1] == 0 + 0 + 1 + 64 + 64


def test_graph_buffers_keep_addresses_and_rewrite_rows_beyond_live_batch(rng):
    captured, bs, w = 8, 16, 128
    table = rng.integers(0, 40, size=(captured, 12)).astype(np.int32)
    indices, indptr = sparsemla.alloc_ragged(captured, w, like=table)
    addr = (indices.ctypes.data, indptr.ctypes.data)
    for live in (8, 3, 0, 5):
        indptr[:] = 12345  # stale data from an earlier step
        pos = np.zeros(captured, dtype=np.int64)
        pos[:live] = rng.integers(0, 190, live)
        valid = np.zeros(captured, dtype=np.uint8)
        valid[:live] = 1
        out = sparsemla.build_window_lists(pos, table, bs, row_valid=valid, out=(indices, indptr))
        assert out[0] is indices and out[1] is indptr
        assert (indices.ctypes.data, indptr.ctypes.data) == addr
        rows = []
        for i in range(captured):
            if i >= live:
                rows.append([])
                continue
            start, n = max(int(pos[i]) - 127, 0), min(int(pos[i]) + 1, 128)
            rows.append([_slot(table, i, start + j, bs) for j in range(n)])
        _check(indices, indptr, rows)


def test_builders_check_buffers_and_rows():
    dense = np.zeros((4, 8), dtype=np.int32)
    lengths = np.full(4, 8, dtype=np.int32)
    small = (np.zeros(31, dtype=np.int32), np.zeros(5, dtype=np.int32))
    with pytest.raises(sparsemla.Error, match="out_indices"):
        sparsemla.build_ragged_from_dense(dense, lengths, out=small)
    with pytest.raises(sparsemla.Error, match="lengths"):
        sparsemla.build_ragged_from_dense(dense, lengths[:3])
    table = np.zeros((2, 2), dtype=np.int32)
    with pytest.raises(sparsemla.Error, match=r"request_index\[1\]"):
        sparsemla.build_window_lists(np.array([1, 2], dtype=np.int64), table, 16,
                                     request_index=np.array([0, 7], dtype=np.int32))
    with pytest.raises(sparsemla.Error, match=r"positions\[0\]"):
        sparsemla.build_window_lists(np.array([-1], dtype=np.int64), table, 16)
    idx, ptr = sparsemla.build_window_lists(np.zeros(0, dtype=np.int64), table, 16)
    assert ptr.shape == (1,) and ptr[0] == 0
