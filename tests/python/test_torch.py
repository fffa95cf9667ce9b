"""torch integration: the public functions on torch tensors (CPU tensors: marker `torch`; CUDA tensors:
marker `gpu`, run by scripts/gpu-check), the torch.ops.sparsemla custom ops (opcheck), torch.compile
(fullgraph) against eager, CUDA-graph capture and replay with changing lengths against eager, and the
FlashMLA-compatible module against sparse_decode and the float64 reference."""

import numpy as np
import pytest

import reference as ref
import sparsemla
from sparsemla import _ops, flashmla
import test_decode as td
import test_dense_lists as tdl
import test_writers as tw

torch = pytest.importorskip("torch")

DEVICES = [pytest.param("cpu", marks=pytest.mark.torch), pytest.param("cuda", marks=pytest.mark.gpu)]


def T(a, device):
    """numpy -> torch on device; uint16 (raw bf16 bits) becomes torch.bfloat16."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(a.copy()).to(device)


def N(t):
    """torch -> numpy; bfloat16 becomes uint16 raw bits."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


# ---- operations on torch tensors ----------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_window_writer_and_builders_on_tensors_equal_numpy(rng, device):
    bs, nb, n = 16, 6, 40
    cache = rng.integers(0, 256, size=(nb, bs * 584 + 576), dtype=np.uint8)
    kv = ref.bf16_round_bits_fast(rng.standard_normal((n, 512)).astype(np.float32))
    pos = rng.integers(0, 4096, n).astype(np.int64)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    slots[::7] = -1
    tc = T(cache, device)
    sparsemla.write_window(T(kv, device), T(pos, device), T(slots, device), T(tw.TABLE, device), tc,
                           block_size=bs)
    sparsemla.write_window(kv, pos, slots, tw.TABLE, cache, block_size=bs)
    sync(device)
    assert np.array_equal(N(tc), cache)

    table = rng.integers(0, 50, size=(4, 8)).astype(np.int32)
    rpos = rng.integers(0, 300, 9).astype(np.int64)
    req = rng.integers(0, 4, 9).astype(np.int32)
    want = sparsemla.build_window_lists(rpos, table, 16, request_index=req)
    got = sparsemla.build_window_lists(T(rpos, device), T(table, device), 16,
                                       request_index=T(req, device))
    assert np.array_equal(N(got[1]), want[1])
    assert np.array_equal(N(got[0])[:want[1][-1]], want[0][:want[1][-1]])

    dense = rng.integers(-1, 500, size=(9, 32)).astype(np.int32)
    lengths = rng.integers(0, 40, 4).astype(np.int32)
    want = sparsemla.build_ragged_from_dense(dense, lengths, request_index=req, num_slots=400)
    got = sparsemla.build_ragged_from_dense(T(dense, device), T(lengths, device),
                                            request_index=T(req, device), num_slots=400)
    assert np.array_equal(N(got[1]), want[1])
    assert np.array_equal(N(got[0])[:want[1][-1]], want[0][:want[1][-1]])

    topk = rng.integers(-1, 70, size=(9, 24)).astype(np.int32)
    want = sparsemla.build_topk_lists(topk, table, 8, topk_length=lengths, request_index=req)
    got = sparsemla.build_topk_lists(T(topk, device), T(table, device), 8,
                                     topk_length=T(lengths, device), request_index=T(req, device))
    assert np.array_equal(N(got[1]), want[1])
    assert np.array_equal(N(got[0])[:want[1][-1]], want[0][:want[1][-1]])

    cpos = rng.integers(0, 128 * 9, 9).astype(np.int64)
    want = sparsemla.build_compressed_all_lists(cpos, table, 1, 8, request_index=req)
    got = sparsemla.build_compressed_all_lists(T(cpos, device), T(table, device), 1, 8,
                                               request_index=T(req, device))
    assert np.array_equal(N(got[1]), want[1])
    assert np.array_equal(N(got[0])[:want[1][-1]], want[0][:want[1][-1]])


@pytest.mark.parametrize("device", DEVICES)
def test_compressors_and_gather_on_tensors(rng, device):
    st = tw.Setup(rng, 4, 512, 2, 24, 4, 4)
    cache = np.zeros((st.ncb, 4 * 584), dtype=np.uint8)
    tc = T(cache, device)
    sparsemla.compress(T(st.positions, device), T(st.request_index, device), T(st.state_slots, device),
                       T(st.out_slots, device), T(st.sbt, device), T(st.state, device),
                       T(st.weight, device), T(tw.TABLE, device), tc, block_size=4, two_stage=True)
    sync(device)
    got = N(tc)
    for i in np.nonzero(st.out_slots >= 0)[0]:
        tw._check_mla_entry(got, 4, st.out_slots[i], st.pooled(st.request_index[i], st.positions[i]),
                            (st.positions[i] // 4) * 4)

    # State writer: exact copies.
    w, sbs = 1024, 4
    state = np.zeros((5, sbs, 2 * w), dtype=np.float32)
    kv = rng.standard_normal((6, w)).astype(np.float32)
    score = rng.standard_normal((6, w)).astype(np.float32)
    sl = np.array([0, 3, -1, 7, 12, 19], dtype=np.int64)
    p6 = rng.integers(0, 100, 6).astype(np.int64)
    ts = T(state, device)
    sparsemla.write_compressor_state(T(kv, device), T(score, device), T(p6, device), T(sl, device), ts)
    sparsemla.write_compressor_state(kv, score, p6, sl, state)
    sync(device)
    assert np.array_equal(N(ts), state)

    # Gather: the same bytes as the CPU path.
    icache = rng.integers(0, 256, size=(5, 16 * 132), dtype=np.uint8)
    tts = np.array([0, 0, 1, 1, 1, -1], dtype=np.int32)
    cu = np.array([0, 2, 5], dtype=np.int32)
    bt = np.array([[3], [1]], dtype=np.int32)
    want = sparsemla.gather_indexer_keys(tts, cu, bt, icache, block_size=16)
    got = sparsemla.gather_indexer_keys(T(tts, device), T(cu, device), T(bt, device),
                                        T(icache, device), block_size=16)
    assert np.array_equal(N(got[0]), want[0]) and np.array_equal(N(got[1]), want[1])


def _decode_tensors(p, device):
    k = dict(main_block_size=p.main[1], sink=None if p.sink is None else T(p.sink, device))
    if p.extra is not None:
        k.update(extra_cache=T(p.extra[0], device), extra_indices=T(p.extra_list[0], device),
                 extra_indptr=T(p.extra_list[1], device), extra_block_size=p.extra[1])
    return (T(p.q, device), T(p.main[0], device), T(p.main_list[0], device),
            T(p.main_list[1], device)), k


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("h,splits,q_gain", [(8, 0, 1.0), (16, 3, 1.0), (64, 1, 1.0), (128, 8, 1.0),
                                            (64, 4, 8.0)])
def test_sparse_decode_on_tensors_matches_reference(rng, device, h, splits, q_gain):
    """q_gain 8: a peaked softmax (logits ~N(0, 13^2), a few keys hold most of the probability)."""
    p = td.Problem(rng, 5, h, q_gain=q_gain)
    args, k = _decode_tensors(p, device)
    out, lse = sparsemla.sparse_decode(*args, num_splits=splits, return_lse=True, **k)
    assert out.dtype == torch.bfloat16 and out.device.type == device
    want, want_lse, a = p.reference()
    td.assert_verified(N(out), want, a)
    td.assert_lse_close(N(lse), want_lse)
    # The functional custom op gives the same bits.
    inputs, config, scale, path, plan, _ = _ops._decode_call(*args, dict(k, num_splits=splits))
    o2, l2 = torch.ops.sparsemla.sparse_decode(inputs, config, scale, path, plan)
    assert torch.equal(o2, out) and torch.equal(l2, lse)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_inverse_rope_and_standalone_on_tensors(rng, device):
    p = td.Problem(rng, 4, 16)
    args, k = _decode_tensors(p, device)
    pos = T(rng.integers(0, 8192, 4).astype(np.int64), device)
    table = T(td.TABLE, device)
    fused = sparsemla.sparse_decode(*args, positions=pos, rope=table, **k)
    plain = sparsemla.sparse_decode(*args, **k)
    sparsemla.inverse_rope(plain, pos, table)
    assert torch.equal(fused[..., :448], plain[..., :448])
    a, b = fused[..., 448:].double().cpu(), plain[..., 448:].double().cpu()
    mag = torch.hypot(b[..., 0::2], b[..., 1::2]).repeat_interleave(2, -1)
    ulp = torch.exp2(torch.floor(torch.log2(mag.clamp_min(1e-30))) - 7)
    assert bool(((a - b).abs() <= 2 * ulp).all())


def _opcheck_args(rng, device, **kw):
    """(inputs, config, scale, path, plan) of a decode, and out, lse."""
    p = td.Problem(rng, 3, 16, main_lens=(50,), extra_lens=(200,))
    args, k = _decode_tensors(p, device)
    out = torch.empty((3, 16, 512), dtype=torch.bfloat16, device=device)
    lse = torch.empty((3, 16), dtype=torch.float32, device=device)
    return _ops._decode_call(*args, dict(k, **kw))[:5], out, lse


@pytest.mark.parametrize("device", DEVICES)
def test_custom_ops_pass_opcheck(rng, device):
    for kw in (dict(num_splits=2), dict(plan=sparsemla.plan_decode(3, 16, 50, 200, num_splits=2,
                                                                  device=device))):
        (inputs, config, scale, path, plan), out, lse = _opcheck_args(rng, device, **kw)
        base = (inputs, config, scale, path, plan)
        torch.library.opcheck(torch.ops.sparsemla.sparse_decode.default, base)
        torch.library.opcheck(torch.ops.sparsemla.sparse_decode_out.default,
                              (inputs, out, lse, None, config, scale, path, plan))
    dense = T(rng.integers(0, 100, size=(4, 8)).astype(np.int32), device)
    lengths = T(np.array([8, 3, 0, 5], dtype=np.int32), device)
    idx = torch.empty(32, dtype=torch.int32, device=device)
    ptr = torch.empty(5, dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.sparsemla.build_ragged_from_dense.default,
                          (dense, lengths, None, 0, None, idx, ptr, "auto"))
    kv = T(ref.bf16_round_bits_fast(rng.standard_normal((3, 512)).astype(np.float32)), device)
    cache = torch.zeros((2, 16 * 584), dtype=torch.uint8, device=device)
    torch.library.opcheck(torch.ops.sparsemla.write_window.default,
                          (kv, T(np.array([1, 2, 3], np.int64), device),
                           T(np.array([0, 5, 17], np.int64), device), T(td.TABLE, device), cache,
                           16, True, "auto"))


# ---- torch.compile --------------------------------------------------------------------------------
def _step(q, cache, dense, lengths, req, extra_cache, extra_dense, sink):
    """An engine-like decode step: lists from dense rows, then the decode, then the FlashMLA call."""
    num_slots = cache.shape[0] * 64
    idx, ptr = sparsemla.build_ragged_from_dense(dense, lengths, request_index=req,
                                                 num_slots=num_slots)
    eidx, eptr = sparsemla.build_ragged_from_dense(extra_dense, lengths, request_index=req)
    out, lse = sparsemla.sparse_decode(q, cache, idx, ptr, main_block_size=64, main_width=dense.shape[1],
                                       extra_cache=extra_cache, extra_indices=eidx,
                                       extra_indptr=eptr, extra_block_size=2,
                                       extra_width=extra_dense.shape[1], sink=sink,
                                       return_lse=True)
    return out * 2, lse


def _dense_step(q, cache, dense, lengths, extra_cache, extra_dense, sink, plan):
    """The same step on dense lists (per-request lengths, 2 rows per request) with a plan made
    outside: no list builder, no planning."""
    out, lse = sparsemla.sparse_decode(q, cache, dense, None, main_block_size=64,
                                       main_lengths=lengths, main_rows_per_length=2,
                                       extra_cache=extra_cache, extra_indices=extra_dense,
                                       extra_lengths=lengths, extra_rows_per_length=2,
                                       extra_block_size=2, sink=sink, plan=plan, return_lse=True)
    return out * 2, lse


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_equals_eager(rng, device):
    torch._dynamo.reset()
    t, h = 6, 16
    q = T(ref.bf16_round_bits_fast(rng.standard_normal((t, h, 512)).astype(np.float32)), device)
    cache = T(td.make_cache(rng, 4, 64), device).view(4, 64, 584)
    extra_cache = T(td.make_cache(rng, 200, 2), device)
    dense = T(rng.integers(-1, 256, size=(t, 128)).astype(np.int32), device)
    extra_dense = T(rng.integers(0, 400, size=(t, 256)).astype(np.int32), device)
    lengths = T(np.array([128, 0, 77], dtype=np.int32), device)
    req = T(np.array([0, 0, 1, 1, 2, 2], dtype=np.int32), device)
    sink = T(rng.standard_normal(h).astype(np.float32), device)
    eager = _step(q, cache, dense, lengths, req, extra_cache, extra_dense, sink)
    compiled = torch.compile(_step, fullgraph=True)
    got = compiled(q, cache, dense, lengths, req, extra_cache, extra_dense, sink)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    # New lengths, same compiled graph.
    lengths2 = T(np.array([5, 128, 1], dtype=np.int32), device)
    eager2 = _step(q, cache, dense, lengths2, req, extra_cache, extra_dense, sink)
    got2 = compiled(q, cache, dense, lengths2, req, extra_cache, extra_dense, sink)
    assert torch.equal(got2[0], eager2[0]) and torch.equal(got2[1], eager2[1])

    # Dense lists with a plan made outside the compiled region (the plan the ragged step makes
    # for itself): the same bits as the ragged step, new lengths in the same graph.
    plan = sparsemla.plan_decode(t, h, 128, 256, device=q.device)
    compiled_dense = torch.compile(_dense_step, fullgraph=True)
    for lens, want in ((lengths, eager), (lengths2, eager2)):
        args = (q, cache, dense, lens, extra_cache, extra_dense, sink, plan)
        got = compiled_dense(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        eager_dense = _dense_step(*args)
        assert torch.equal(eager_dense[0], want[0]) and torch.equal(eager_dense[1], want[1])

    def fm(qq, kc, ind, tl, ekc, eind, snk, meta=None):
        return flashmla.flash_mla_with_kvcache(qq, kc, None, None, 512, meta, indices=ind,
                                               topk_length=tl, extra_k_cache=ekc,
                                               extra_indices_in_kvcache=eind,
                                               extra_topk_length=tl, attn_sink=snk)
    q4 = q.view(3, 2, h, 512)
    kc = cache.view(4, 64, 1, 584)
    ekc = extra_cache.view(200, 2, 1, 584)
    ind, eind = dense.view(3, 2, 128), extra_dense.view(3, 2, 256)
    want = fm(q4, kc, ind, lengths, ekc, eind, sink)
    got = torch.compile(fm, fullgraph=True)(q4, kc, ind, lengths, ekc, eind, sink)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # A metadata initialised by an eager call: the compiled call runs its plan.
    meta, _ = flashmla.get_mla_metadata()
    eager_meta = fm(q4, kc, ind, lengths, ekc, eind, sink, meta)
    assert meta.have_initialized and torch.equal(eager_meta[0], want[0])
    got = torch.compile(fm, fullgraph=True)(q4, kc, ind, lengths, ekc, eind, sink, meta)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_writer_mutates_graph_input(rng, device):
    torch._dynamo.reset()
    bs, n = 16, 10
    kv = T(ref.bf16_round_bits_fast(rng.standard_normal((n, 512)).astype(np.float32)), device)
    pos = T(rng.integers(0, 4096, n).astype(np.int64), device)
    slots = T(rng.permutation(64)[:n].astype(np.int64), device)
    table = T(tw.TABLE, device)
    c1 = torch.zeros((4, bs * 584), dtype=torch.uint8, device=device)
    c2 = c1.clone()

    def write(kv, pos, slots, table, cache):
        sparsemla.write_window(kv, pos, slots, table, cache, block_size=16)
        return cache.sum(dtype=torch.int64)
    s1 = write(kv, pos, slots, table, c1)
    s2 = torch.compile(write, fullgraph=True)(kv, pos, slots, table, c2)
    assert torch.equal(c1, c2) and int(s1) == int(s2) and int(s1) > 0


# ---- CUDA graphs ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("lists", ["ragged", "dense"])
@pytest.mark.parametrize("given_workspace", [True, False])
def test_cuda_graph_replay_with_changing_lengths_equals_eager(rng, lists, given_workspace):
    """ragged: the builders and a call that plans itself, captured; dense: the engine pattern, a
    plan made once outside the graph and dense lists + per-row lengths read by the decode."""
    dev = "cuda"
    t_max, h, w, ew = 8, 64, 128, 512
    q = T(ref.bf16_round_bits_fast(rng.standard_normal((t_max, h, 512)).astype(np.float32)), dev)
    cache = T(td.make_cache(rng, 4, 64), dev)
    extra_cache = T(td.make_cache(rng, 300, 2), dev)
    dense = torch.zeros((t_max, w), dtype=torch.int32, device=dev)
    edense = torch.zeros((t_max, ew), dtype=torch.int32, device=dev)
    lengths = torch.zeros(t_max, dtype=torch.int32, device=dev)
    elengths = torch.zeros(t_max, dtype=torch.int32, device=dev)
    sink = T(rng.standard_normal(h).astype(np.float32), dev)
    idx, ptr = sparsemla.alloc_ragged(t_max, w, like=dense)
    eidx, eptr = sparsemla.alloc_ragged(t_max, ew, like=dense)
    out = torch.empty((t_max, h, 512), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((t_max, h), dtype=torch.float32, device=dev)
    plan = sparsemla.plan_decode(t_max, h, w, ew, device=dev, num_splits=8)
    ws = (torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=dev)
          if given_workspace else None)
    common = dict(main_block_size=64, extra_cache=extra_cache, extra_block_size=2, sink=sink,
                  out=out, lse=lse, workspace=ws)

    def step():
        if lists == "dense":
            sparsemla.sparse_decode(q, cache, dense, None, main_lengths=lengths,
                                    extra_indices=edense, extra_lengths=elengths, plan=plan,
                                    **common)
            return
        sparsemla.build_ragged_from_dense(dense, lengths, num_slots=256, out=(idx, ptr))
        sparsemla.build_ragged_from_dense(edense, elengths, num_slots=600, out=(eidx, eptr))
        sparsemla.sparse_decode(q, cache, idx, ptr, main_width=w, extra_indices=eidx,
                                extra_indptr=eptr, extra_width=ew, num_splits=8, **common)

    def fill():
        dense.copy_(torch.randint(-1, 256, (t_max, w), dtype=torch.int32, device=dev))
        edense.copy_(torch.randint(0, 600, (t_max, ew), dtype=torch.int32, device=dev))
        lengths.copy_(torch.randint(0, w + 1, (t_max,), dtype=torch.int32, device=dev))
        elengths.copy_(torch.randint(0, ew + 1, (t_max,), dtype=torch.int32, device=dev))
        lengths[0] = 0
        elengths[0] = 0  # an empty row
    fill()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(4):
        fill()
        graph.replay()
        torch.cuda.synchronize()
        got_out, got_lse = out.clone(), lse.clone()
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        step()  # eager, same inputs
        torch.cuda.synchronize()
        assert torch.equal(got_out, out) and torch.equal(got_lse, lse)
        assert bool((got_out[0] == 0).all()) and bool(torch.isposinf(got_lse[0]).all())
        # ... and eager matches the float64 reference.
        d, le = N(dense), N(lengths)
        e, ele = N(edense), N(elengths)
        main_rows = ref.ragged([list(d[i, :le[i]]) for i in range(t_max)])
        extra_rows = ref.ragged([list(e[i, :ele[i]]) for i in range(t_max)])
        want, want_lse, a = ref.decode(N(q), [(N(cache), 64), (N(extra_cache), 2)],
                                       [main_rows, extra_rows], N(sink), td.SCALE)
        td.assert_verified(N(out), want, a)
        td.assert_lse_close(N(lse), want_lse)


@pytest.mark.gpu
def test_decode_runs_on_the_current_stream(rng):
    p = td.Problem(rng, 4, 32)
    args, k = _decode_tensors(p, "cuda")
    want = sparsemla.sparse_decode(*args, num_splits=4, **k)
    q2 = torch.zeros_like(args[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # q2 is filled late on this stream: another stream races
        q2.copy_(args[0])
        got = sparsemla.sparse_decode(q2, *args[1:], num_splits=4, **k)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    assert torch.equal(got, want)


# ---- FlashMLA-compatible module ----------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_flashmla_on_tensors_matches_sparse_decode_and_reference(rng, device):
    import test_flashmla as tf
    c = tf.Case(rng, b=4, s_q=2, h=16)
    c.topk_length[2] = 0
    c.extra_length[2] = 0  # request 2: empty rows
    c.sink[3], c.sink[5] = np.inf, -np.inf
    meta, _ = flashmla.get_mla_metadata()
    kc = T(c.main[0], device)[:, :64 * 584].view(3, 64, 1, 584)
    ekc = T(c.extra[0], device).view(100, 2, 1, 584)
    out, lse = flashmla.flash_mla_with_kvcache(
        T(c.q, device), kc, None, None, 512, meta, indices=T(c.indices, device),
        attn_sink=T(c.sink, device), extra_k_cache=ekc,
        extra_indices_in_kvcache=T(c.extra_indices, device),
        topk_length=T(c.topk_length, device), extra_topk_length=T(c.extra_length, device))
    assert out.shape == (4, 2, 16, 512) and lse.shape == (4, 16, 2) and lse.is_contiguous()
    want, want_lse, a = c.reference(c.sink)
    tf._verified(N(out), want, a)
    tf._lse_close(N(lse), want_lse)
    assert bool((out[2] == 0).all()) and bool(torch.isposinf(lse[2]).all())
    assert bool((out[:, :, 3] == 0).all())
    # Against sparse_decode on the same ragged lists: identical bits.
    main = tf._rows(c.indices, c.topk_length, 2)
    extra = tf._rows(c.extra_indices, c.extra_length, 2)
    o2, l2 = sparsemla.sparse_decode(T(c.q, device).view(8, 16, 512), kc, T(main[0], device),
                                     T(main[1], device), main_width=64, extra_cache=ekc,
                                     extra_indices=T(extra[0], device),
                                     extra_indptr=T(extra[1], device), extra_width=96,
                                     sink=T(c.sink, device), return_lse=True)
    assert torch.equal(out.view(8, 16, 512), o2)
    assert torch.equal(lse.transpose(1, 2).reshape(8, 16), l2)
    # The metadata keeps the first call's plan; later calls run it and give the same bits.
    again = flashmla.flash_mla_with_kvcache(
        T(c.q, device), kc, None, None, 512, meta, indices=T(c.indices, device),
        attn_sink=T(c.sink, device), extra_k_cache=ekc,
        extra_indices_in_kvcache=T(c.extra_indices, device),
        topk_length=T(c.topk_length, device), extra_topk_length=T(c.extra_length, device))
    assert meta.have_initialized and meta.plan.shape.device == (-1 if device == "cpu" else
                                                                torch.cuda.current_device())
    assert torch.equal(again[0], out) and torch.equal(again[1], lse)
    one = tf.Case(rng, b=3, s_q=1, h=16)
    o1, l1 = flashmla.flash_mla_with_kvcache(
        T(one.q, device), T(one.main[0], device)[:, :64 * 584].view(3, 64, 1, 584), None, None,
        512, None, indices=T(one.indices, device), attn_sink=T(one.sink, device),
        extra_k_cache=T(one.extra[0], device).view(100, 2, 1, 584),
        extra_indices_in_kvcache=T(one.extra_indices, device),
        topk_length=T(one.topk_length, device), extra_topk_length=T(one.extra_length, device))
    assert l1.shape == (3, 16, 1) and l1.is_contiguous()  # written in place: no transpose copy
    tf._lse_close(N(l1), one.reference(one.sink)[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths,s_q", [(None, 1), ("request", 2), ("row", 1)])
def test_dense_lists_on_tensors_equal_ragged_lists(rng, device, lengths, s_q):
    """test_dense_lists on tensors: dense lists (strided rows, -1 padding, out-of-range entries,
    clamped lengths) give the bits of their ragged lists, with a plan reused across layers."""
    t, h, w, we = 8, 64, 40, 72
    plan = sparsemla.plan_decode(t, h, w, we, device=device)
    for _ in range(2):  # two layers, one plan
        layer = tdl.Layer(rng, t, h, w=w, we=we, s_q=s_q, lengths=lengths)
        q, cache, ecache = T(layer.q, device), T(layer.main, device), T(layer.extra, device)
        base = T(layer.dense.base, device)  # keeps the row stride of the strided view
        dense = base[:, :w]
        ebase = T(layer.extra_dense.base, device)
        opt = (lambda x: None if x is None else T(x, device))
        kw = dict(main_block_size=64, extra_cache=ecache, extra_block_size=2,
                  sink=T(layer.sink, device), return_lse=True)
        got = sparsemla.sparse_decode(q, cache, dense, None, main_lengths=opt(layer.lengths),
                                      main_rows_per_length=layer.rpl, extra_indices=ebase[:, :we],
                                      extra_lengths=opt(layer.extra_lengths),
                                      extra_rows_per_length=layer.rpl, plan=plan, **kw)
        (mi, mp), (ei, ep) = layer.ragged()
        want = sparsemla.sparse_decode(q, cache, T(mi, device), T(mp, device), main_width=w,
                                       extra_indices=T(ei, device), extra_indptr=T(ep, device),
                                       extra_width=we, **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_mixed_devices_are_rejected_naming_the_argument(rng):
    p = td.Problem(rng, 2, 8, extra=False)
    args, k = _decode_tensors(p, "cuda")
    with pytest.raises(sparsemla.Error, match="main_indices.*same device"):
        sparsemla.sparse_decode(args[0], args[1], T(p.main_list[0], "cpu"), args[3], **k)
