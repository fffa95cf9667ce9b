"""The lightning indexer (CONTRACT 11) and its query prep (11.6) on torch tensors: CPU tensors
(marker `torch`) equal the numpy results, the custom ops pass opcheck, torch.compile(fullgraph=True)
equals eager; CUDA tensors (marker `gpu`, scripts/gpu-check) equal the CPU, or, for an op whose
CUDA path is not built, fail with the library's error naming `path`. The query prep's CUDA kernel
(on the current stream, in a CUDA graph) is held to the CPU bit for bit."""

import numpy as np
import pytest

import indexer_reference as iref
import reference as ref
import sparsemla
import test_indexer as ti
from test_torch import DEVICES, N, T, sync

torch = pytest.importorskip("torch")


def _cuda_or_skip(device, fn):
    """fn(); on CUDA an Error naming `path` (the CUDA indexer not built yet) skips the test."""
    try:
        return fn()
    except sparsemla.Error as e:
        if device == "cuda" and "argument 'path'" in str(e):
            pytest.skip(f"CUDA path not built: {e}")
        raise


def _tensors(p, device):
    return [T(a, device) for a in p.args()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["by_index", "by_score"])
def test_indexer_on_tensors_equals_numpy(rng, device, order):
    p = iref.Problem(rng, T=6, H=16, R=3, Wt=4, bs=16, nb=8, exact=True,
                     row_request=[0, 0, 1, -1, 2, 2])
    p.table[1, 1] = -1
    k = 9
    want = sparsemla.indexer_topk(*p.args(), k, block_size=p.bs, width=12, order=order,
                                  return_lengths=True, return_scores=True)
    got = _cuda_or_skip(device, lambda: sparsemla.indexer_topk(
        *_tensors(p, device), k, block_size=p.bs, width=12, order=order, return_lengths=True,
        return_scores=True))
    sync(device)
    for g, w in zip(got, want):
        assert g.device.type == device
        assert np.array_equal(N(g), w)
    # q as torch.float8_e4m3fn: the same bytes.
    q8 = T(p.q, device).view(torch.float8_e4m3fn)
    got8 = sparsemla.indexer_topk(q8, *_tensors(p, device)[1:], k, block_size=p.bs, width=12,
                                  order=order)
    assert np.array_equal(N(got8), want[0])


@pytest.mark.parametrize("device", DEVICES)
def test_q_prep_and_candidates_on_tensors_equal_numpy(rng, device):
    q, pos, rope, w = ti.prep_inputs(rng, 5, 8)
    pos[1] = -1
    want = sparsemla.indexer_q_prep(q, pos, rope, w)
    got = _cuda_or_skip(device, lambda: sparsemla.indexer_q_prep(
        T(q, device), T(pos, device), T(rope, device), T(w, device)))
    sync(device)
    assert np.array_equal(N(got[0]), want[0])
    assert np.array_equal(N(got[1]), want[1])
    positions = np.array([-3, -1, 0, 2, 3, 4, 7, 2 ** 33 - 2], dtype=np.int64)
    n = sparsemla.indexer_candidates_from_positions(T(positions, device))
    assert n.dtype == torch.int32
    assert np.array_equal(N(n), sparsemla.indexer_candidates_from_positions(positions))
    with pytest.raises(sparsemla.Error, match="argument 'positions'"):
        sparsemla.indexer_candidates_from_positions(T(positions.astype(np.int32), device))


def _q_prep_edges(rng, T, H):
    """prep_inputs with the edges of test_indexer.test_q_prep_bit_exact_with_edges (amax below
    1e-4, exactly 448*2^k, one ulp above, NaN, +inf) and a padding row."""
    q, pos, rope, w = ti.prep_inputs(rng, T, H)
    q[0, 0] = ref.bf16_round_bits_fast(np.full(128, 1e-6, dtype=np.float32))
    q[0, 1, :64] = ref.bf16_round_bits_fast(np.float32(0.5))
    q[0, 1, 3] = ref.bf16_round_bits_fast(np.float32(448 * 2.0 ** 3))
    q[0, 1, 64:] = 0
    q[0, 2] = q[0, 1]
    q[0, 2, 3] += 1
    q[1, 0, 5] = 0x7FC0
    q[1, 1, 9] = 0x7F80
    pos[2] = -1
    return q, pos, rope, w


def _same_q_prep(got, want):
    """Bytes equal; weights equal bit for bit where finite-or-inf, NaN where NaN (payloads differ
    between host and device arithmetic)."""
    assert np.array_equal(N(got[0]), want[0])
    gw, ww = N(got[1]), want[1]
    nan = np.isnan(ww)
    assert np.array_equal(np.isnan(gw), nan)
    assert np.array_equal(gw.view(np.uint32)[~nan], ww.view(np.uint32)[~nan])


@pytest.mark.gpu
def test_q_prep_cuda_equals_cpu_on_the_current_stream_and_in_a_graph(rng):
    """The CUDA query prep (CONTRACT 11.6) on CUDA tensors: bit-identical to the CPU on random rows
    and the exponent edges, on a side stream whose inputs arrive late (the call runs on the current
    stream), and in a captured CUDA graph replayed with new inputs in the same tensors."""
    dev = "cuda"
    for t, h in [(6, 16), (33, 64), (3, 128)]:
        q, pos, rope, w = _q_prep_edges(rng, t, h)
        _same_q_prep(sparsemla.indexer_q_prep(T(q, dev), T(pos, dev), T(rope, dev), T(w, dev)),
                     sparsemla.indexer_q_prep(q, pos, rope, w))
    q, pos, rope, w = _q_prep_edges(rng, 8, 64)
    want = sparsemla.indexer_q_prep(q, pos, rope, w)
    tq, tpos, trope, tw = T(q, dev), T(pos, dev), T(rope, dev), T(w, dev)
    q2 = torch.zeros_like(tq)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # q2 is filled late on this stream: another stream races
        q2.copy_(tq)
        got = sparsemla.indexer_q_prep(q2, tpos, trope, tw)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    _same_q_prep(got, want)
    # A CUDA graph: captured once, replayed with new queries, weights and positions.
    q_out = torch.full((8, 64, 128), 0xA5, dtype=torch.uint8, device=dev)
    w_out = torch.full((8, 64), 777.0, dtype=torch.float32, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sparsemla.indexer_q_prep(tq, tpos, trope, tw, q_out=q_out, w_out=w_out)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparsemla.indexer_q_prep(tq, tpos, trope, tw, q_out=q_out, w_out=w_out)
    for step in range(3):
        q, pos, _, w = ti.prep_inputs(rng, 8, 64)
        pos[step] = -1
        tq.copy_(T(q, dev))
        tpos.copy_(T(pos, dev))
        tw.copy_(T(w, dev))
        q_out.fill_(0xA5)
        w_out.fill_(777.0)
        graph.replay()
        torch.cuda.synchronize()
        _same_q_prep((q_out, w_out), sparsemla.indexer_q_prep(q, pos, rope, w))


@pytest.mark.gpu
def test_q_prep_cuda_refuses_sm90_and_mixed_devices(rng):
    q, pos, rope, w = ti.prep_inputs(rng, 3, 4)
    args = [T(q, "cuda"), T(pos, "cuda"), T(rope, "cuda"), T(w, "cuda")]
    with pytest.raises(sparsemla.Error, match="argument 'path'"):
        sparsemla.indexer_q_prep(*args, path="cuda-sm90")
    with pytest.raises(sparsemla.Error, match="argument 'path'"):
        sparsemla.indexer_q_prep(*args, path="cpu")
    args[1] = T(pos, "cpu")
    with pytest.raises(sparsemla.Error, match="argument 'positions'"):
        sparsemla.indexer_q_prep(*args)


@pytest.mark.torch
def test_indexer_tensor_errors_name_the_argument(rng):
    p = iref.Problem(rng, T=3, H=4, R=2, Wt=2, bs=16, nb=3)
    q, w, cache, table, rr, n = _tensors(p, "cpu")
    with pytest.raises(sparsemla.Error, match="argument 'w'"):
        sparsemla.indexer_topk(q, w.double(), cache, table, rr, n, 8, block_size=p.bs)
    with pytest.raises(sparsemla.Error, match="argument 'q'"):
        sparsemla.indexer_topk(q.float(), w, cache, table, rr, n, 8, block_size=p.bs)
    with pytest.raises(sparsemla.Error, match="argument 'out'"):
        sparsemla.indexer_topk(q, w, cache, table, rr, n, 8, block_size=p.bs,
                               out=torch.empty((3, 8), dtype=torch.int64))
    with pytest.raises(sparsemla.Error, match="argument 'path'"):
        sparsemla.indexer_topk(q, w, cache, table, rr, n, 8, block_size=p.bs, path="cuda-sm90")


@pytest.mark.parametrize("device", DEVICES)
def test_indexer_custom_ops_pass_opcheck(rng, device):
    p = iref.Problem(rng, T=4, H=8, R=2, Wt=3, bs=16, nb=5, exact=True)
    q, w, cache, table, rr, n = _tensors(p, device)
    idx = torch.empty((4, 10), dtype=torch.int32, device=device)
    ln = torch.empty(4, dtype=torch.int32, device=device)
    sc = torch.empty((4, 10), dtype=torch.float32, device=device)
    _cuda_or_skip(device, lambda: torch.library.opcheck(
        torch.ops.sparsemla.indexer_topk.default,
        (q, w, cache, table, rr, n, 8, p.bs, "normal", "by_score", idx, ln, sc, None, "auto")))
    qb, pos, rope, wr = ti.prep_inputs(rng, 3, 4)
    q_out = torch.empty((3, 4, 128), dtype=torch.uint8, device=device)
    w_out = torch.empty((3, 4), dtype=torch.float32, device=device)
    _cuda_or_skip(device, lambda: torch.library.opcheck(
        torch.ops.sparsemla.indexer_q_prep.default,
        (T(qb, device), T(pos, device), T(rope, device), T(wr, device), q_out, w_out, "auto")))


def _indexer_step(q_bf16, positions, rope, w_raw, cache, table, row_request):
    """An engine-like indexer step: query prep, candidate counts from positions, top-k."""
    q, w = sparsemla.indexer_q_prep(q_bf16, positions, rope, w_raw)
    n = sparsemla.indexer_candidates_from_positions(positions)
    idx, ln, sc = sparsemla.indexer_topk(q, w, cache, table, row_request, n, 16, block_size=16,
                                         width=20, order="by_score", return_lengths=True,
                                         return_scores=True)
    return idx, ln, sc * 2


@pytest.mark.parametrize("device", DEVICES)
def test_indexer_torch_compile_fullgraph_equals_eager(rng, device):
    p = iref.Problem(rng, T=4, H=16, R=2, Wt=4, bs=16, nb=9, row_request=[0, 0, 1, 1])
    qb, _, rope, wr = ti.prep_inputs(rng, 4, 16, P=400)
    pos = np.array([100, 101, 254, 255], dtype=np.int64)  # n = 25, 25, 63, 64
    args = [T(qb, device), T(pos, device), T(rope, device), T(wr, device), T(p.cache, device),
            T(p.table, device), T(p.row_request, device)]
    eager = _cuda_or_skip(device, lambda: _indexer_step(*args))
    compiled = torch.compile(_indexer_step, fullgraph=True)
    got = compiled(*args)
    for g, e in zip(got, eager):
        assert torch.equal(g, e)
    args[1] = T(np.array([3, 4, 40, 41], dtype=np.int64), device)  # new positions, same graph
    got = compiled(*args)
    for g, e in zip(got, _indexer_step(*args)):
        assert torch.equal(g, e)
