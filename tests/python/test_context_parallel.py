"""Decode context parallelism (CONTRACT 12): shard_list against the interleave rule written here,
merge_ranks against a float64 merge and on its exact edge cases, and the pipeline (a request's lists
sharded over R = 2, 3 ranks, each rank's cache its own pages, each decoded without the sink, merged
with it) against the float64 reference of the unsharded decode (CONTRACT 9.9). numpy on the CPU
backend; torch CPU tensors (marker `torch`) and CUDA tensors (marker `gpu`, bit-identical to the CPU
backend) through torch.ops.sparsemla."""

import numpy as np
import pytest

import reference as ref
import sparsemla
from test_decode import TABLE, make_cache, make_rows

INF = np.float32(np.inf)
# Rule 3's threshold for a merge of bf16 rank outputs (CONTRACT 12.3; verify.h's
# kVerifyCosineTolBf16RankMerge): two stacked bf16 stores, coherent over FP8-valued rows.
BF16_RANK_MERGE_COSINE_TOL = 2e-5


def rank_of(v, r_count, inter):
    return (v % (inter * r_count)) // inter


def local_of(v, r_count, inter):
    return (v // (inter * r_count)) * inter + v % inter


def shard_rows(rows, r_count, r, inter, num_slots=0):
    return [[local_of(v, r_count, inter) for v in row
             if v >= 0 and (num_slots == 0 or v < num_slots) and rank_of(v, r_count, inter) == r]
            for row in rows]


@pytest.mark.parametrize("r_count,inter", [(1, 1), (2, 1), (3, 2), (8, 4)])
@pytest.mark.parametrize("dense", [False, True])
def test_shard_list_follows_the_interleave_rule(rng, r_count, inter, dense):
    t, n, w = 7, 900, 60
    rows = make_rows(rng, t, n, [0, 1, 17, 60, 33], invalid_rate=0.2)
    for r in range(r_count):
        if dense:
            d = np.full((t, w), -1, np.int32)
            lengths = np.array([len(x) for x in rows], np.int32)
            for i, x in enumerate(rows):
                d[i, :len(x)] = x
            idx, ptr = sparsemla.shard_list(d, num_ranks=r_count, rank=r, interleave=inter,
                                            lengths=lengths, num_slots=n)
        else:
            ind, iptr = ref.ragged(rows)
            idx, ptr = sparsemla.shard_list(ind, iptr, num_ranks=r_count, rank=r,
                                            interleave=inter, num_slots=n, width=w)
        want = shard_rows(rows, r_count, r, inter, n)
        assert ptr[0] == 0
        for i in range(t):
            assert list(idx[ptr[i]:ptr[i + 1]]) == want[i], (r, i)


def test_shard_list_errors_name_the_argument():
    ind, ptr = ref.ragged([[0, 1, 2, 3]])
    with pytest.raises(sparsemla.Error, match="'rank'"):
        sparsemla.shard_list(ind, ptr, num_ranks=2, rank=2)
    with pytest.raises(sparsemla.Error, match="'out.width'"):
        sparsemla.shard_list(ind, ptr, num_ranks=2, rank=0, width=1)  # two entries on rank 0


def random_ranks(rng, r_count, t, h, p_empty=0.15):
    gain = np.exp(0.7 * rng.standard_normal((r_count, t, h, 8, 1)))
    out32 = (0.3 * rng.standard_normal((r_count, t, h, 8, 64)) * gain).reshape(r_count, t, h, 512)
    out32 = out32.astype(np.float32)
    lse = (rng.standard_normal((r_count, t, h)) * 3 + 5).astype(np.float32)
    lse[rng.random(lse.shape) < p_empty] = INF
    return out32, ref.bf16_round_bits_fast(out32), lse


def merge64(out_r, lse_r, sink=None, positions=None):
    """The float64 merge of CONTRACT 12.1."""
    out_r = np.asarray(out_r, np.float64)
    lse_r = np.asarray(lse_r, np.float64)
    act = np.isfinite(lse_r)
    mx = np.where(act, lse_r, -np.inf).max(axis=0)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    w = np.where(act, np.exp(np.where(act, lse_r, 0) - safe), 0.0)
    s = w.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = np.where(s > 0, safe + np.log(np.where(s > 0, s, 1)), np.inf)
    sk = np.full(lse_r.shape[2], -np.inf) if sink is None else np.asarray(sink, np.float64)
    big = np.maximum(np.where(np.isfinite(mx), mx, -np.inf), sk[None, :])
    big_safe = np.where(np.isfinite(big), big, 0.0)
    wb = np.where(act, np.exp(np.where(act, lse_r, 0) - big_safe), 0.0)
    den = wb.sum(axis=0) + np.exp(sk[None, :] - big_safe)
    out = np.where((den > 0)[..., None], (wb[..., None] * out_r).sum(axis=0)
                   / np.where(den > 0, den, 1)[..., None], 0.0)
    if positions is not None:
        c, sn = TABLE[positions, :32][:, None, :], TABLE[positions, 32:][:, None, :]
        out[..., 448:] = ref.rope_inverse(out[..., 448:], c, sn)
    return out, lse


@pytest.mark.parametrize("r_count", [1, 2, 8])
@pytest.mark.parametrize("f32", [False, True])
@pytest.mark.parametrize("with_sink,with_rope", [(False, False), (True, False), (True, True)])
def test_merge_matches_the_float64_merge(rng, r_count, f32, with_sink, with_rope):
    t, h = 3, 8
    out32, out_bf, lse = random_ranks(rng, r_count, t, h)
    sink = (rng.standard_normal(h) + 5).astype(np.float32) if with_sink else None
    pos = rng.integers(0, 8192, t).astype(np.int64) if with_rope else None
    rank_out = out32 if f32 else out_bf
    out, mlse = sparsemla.merge_ranks(rank_out, lse, sink=sink, positions=pos,
                                      rope=TABLE if with_rope else None)
    want, want_lse = merge64(out32 if f32 else ref.bf16_to_f32(out_bf), lse, sink, pos)
    got = ref.bf16_to_f32(out).astype(np.float64)
    assert np.all(np.abs(got - want) <= np.abs(want) / 256 + 1e-5 * np.abs(want).max() + 1e-30)
    fin = np.isfinite(want_lse)
    assert np.array_equal(np.isinf(mlse), ~fin)
    assert np.allclose(mlse[fin], want_lse[fin], rtol=1e-6, atol=1e-6)


def test_merge_edge_cases_are_exact(rng):
    t, h = 2, 4
    out32, out_bf, lse = random_ranks(rng, 2, t, h, p_empty=0)
    base, base_lse = sparsemla.merge_ranks(out_bf, lse)
    # An extra empty rank (poisoned output) changes nothing, bit for bit.
    out3 = np.concatenate([out_bf, np.full((1, t, h, 512), 0x7FC0, np.uint16)])
    lse3 = np.concatenate([lse, np.full((1, t, h), INF)])
    o3, l3 = sparsemla.merge_ranks(out3, lse3)
    assert np.array_equal(o3, base) and np.array_equal(l3, base_lse)
    # Sink -inf: no sink, bit for bit; +inf: zeros; NaN: NaN rows; lse never changes.
    for v in (-INF, INF, np.float32(np.nan)):
        o, ll = sparsemla.merge_ranks(out_bf, lse, sink=np.full(h, v, np.float32))
        assert np.array_equal(ll, base_lse)
        f = ref.bf16_to_f32(o)
        if v == -INF:
            assert np.array_equal(o, base)
        elif v == INF:
            assert np.all(f == 0)
        else:
            assert np.all(np.isnan(f))
    # Every rank empty: zeros and +inf.
    o, ll = sparsemla.merge_ranks(out_bf, np.full_like(lse, INF), sink=np.ones(h, np.float32))
    assert np.all(ref.bf16_to_f32(o) == 0) and np.all(ll == INF)


def rank_cache(cache, bs_v, r_count, r, inter):
    """Rank r's cache: page b holds the rank's slots of virtual page b (page size bs_v / R)."""
    nb, bs = cache.shape[0], bs_v // r_count
    out = np.zeros((nb, bs * 584), np.uint8)
    for local in range(nb * bs):
        v = (local // inter) * inter * r_count + r * inter + local % inter
        vb, vo, b, o = v // bs_v, v % bs_v, local // bs, local % bs
        out[b, o * 576:(o + 1) * 576] = cache[vb, vo * 576:(vo + 1) * 576]
        out[b, bs * 576 + o * 8:bs * 576 + o * 8 + 8] = cache[vb, bs_v * 576 + vo * 8:bs_v * 576 + vo * 8 + 8]
    return out


@pytest.mark.parametrize("r_count,inter", [(2, 1), (3, 2)])
def test_sharded_decodes_merged_equal_the_unsharded_decode(rng, r_count, inter):
    t, h = 3, 8
    bs_v = 8 * r_count * inter
    main = make_cache(rng, 4, bs_v)
    extra = make_cache(rng, 600 // bs_v + 1, bs_v)
    n_main, n_extra = main.shape[0] * bs_v, extra.shape[0] * bs_v
    main_rows = make_rows(rng, t, n_main, [128, 5, 0], invalid_rate=0.05)
    extra_rows = make_rows(rng, t, n_extra, [512, 300, 1], invalid_rate=0.05)
    q = ref.bf16_round_bits_fast(rng.standard_normal((t, h, 512)).astype(np.float32))
    sink = rng.uniform(5, 9, h).astype(np.float32)  # the sink holds 5-70% of the mass
    pos = rng.integers(0, 8192, t).astype(np.int64)
    outs, lses = [], []
    for r in range(r_count):
        mi, mp = sparsemla.shard_list(*ref.ragged(main_rows), num_ranks=r_count, rank=r,
                                      interleave=inter, num_slots=n_main, width=128)
        xi, xp = sparsemla.shard_list(*ref.ragged(extra_rows), num_ranks=r_count, rank=r,
                                      interleave=inter, num_slots=n_extra, width=512)
        o, ll = sparsemla.sparse_decode(
            q, rank_cache(main, bs_v, r_count, r, inter), mi, mp,
            main_block_size=bs_v // r_count, extra_cache=rank_cache(extra, bs_v, r_count, r, inter),
            extra_indices=xi, extra_indptr=xp, extra_block_size=bs_v // r_count, return_lse=True)
        outs.append(o)
        lses.append(ll)
    out, lse = sparsemla.merge_ranks(np.stack(outs), np.stack(lses), sink=sink, positions=pos,
                                     rope=TABLE)
    want, want_lse, a = ref.decode(q, [(main, bs_v), (extra, bs_v)],
                                   [ref.ragged(main_rows), ref.ragged(extra_rows)], sink)
    c, s = TABLE[pos, :32][:, None, :], TABLE[pos, 32:][:, None, :]
    want[..., 448:] = ref.rope_inverse(want[..., 448:], c, s)
    a[..., 448:] = ref.rope_inverse_abs_mean(a[..., 448:], c, s)
    v = ref.decode_verdict(out, want, a, cosine_tol=BF16_RANK_MERGE_COSINE_TOL)
    assert v["passed"], v
    fin = np.isfinite(want_lse)
    assert np.array_equal(np.isinf(lse), ~fin)
    d = np.abs(lse[fin] - want_lse[fin])
    assert np.all((d <= 1e-6) | (d / (np.abs(want_lse[fin]) + 1e-6) < 8.01 / 65536))


# ---- torch ---------------------------------------------------------------------------------------
DEVICES = [pytest.param("cpu", marks=pytest.mark.torch), pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("f32", [False, True])
def test_torch_merge_equals_the_numpy_merge(rng, device, f32):
    import torch
    t, h, r_count = 5, 16, 3
    out32, out_bf, lse = random_ranks(rng, r_count, t, h)
    lse[0, 1, 2] = -INF
    lse[1, 2, 3] = np.nan
    sink = (rng.standard_normal(h) + 5).astype(np.float32)
    sink[0] = INF
    pos = rng.integers(0, 8192, t).astype(np.int64)
    want, want_lse = sparsemla.merge_ranks(out32 if f32 else out_bf, lse, sink=sink, positions=pos,
                                           rope=TABLE)
    tout = (torch.from_numpy(out32) if f32
            else torch.from_numpy(out_bf.view(np.int16)).view(torch.bfloat16))
    args = [tout, torch.from_numpy(lse), torch.from_numpy(sink), torch.from_numpy(pos),
            torch.from_numpy(TABLE)]
    args = [x.to(device) for x in args]
    out, mlse = sparsemla.merge_ranks(args[0], args[1], sink=args[2], positions=args[3],
                                      rope=args[4])
    if device == "cuda":
        torch.cuda.synchronize()
    got = out.cpu().view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(ref.bf16_to_f32(want))
    assert np.array_equal(np.isnan(ref.bf16_to_f32(got)), nan)
    assert np.array_equal(got[~nan], want[~nan])  # bit for bit (NaN payloads aside)
    ml = mlse.cpu().numpy()
    assert np.array_equal(np.isnan(ml), np.isnan(want_lse))
    assert np.array_equal(ml[~np.isnan(ml)], want_lse[~np.isnan(want_lse)])


@pytest.mark.parametrize("device", DEVICES)
def test_torch_shard_list_equals_numpy(rng, device):
    import torch
    rows = make_rows(rng, 6, 500, [0, 3, 40, 77], invalid_rate=0.2)
    ind, ptr = ref.ragged(rows)
    want_i, want_p = sparsemla.shard_list(ind, ptr, num_ranks=3, rank=1, interleave=2, width=80)
    gi, gp = sparsemla.shard_list(torch.from_numpy(ind).to(device), torch.from_numpy(ptr).to(device),
                                  num_ranks=3, rank=1, interleave=2, width=80)
    gp = gp.cpu().numpy()
    assert np.array_equal(gp, want_p)
    assert np.array_equal(gi.cpu().numpy()[:gp[-1]], want_i[:want_p[-1]])


@pytest.mark.gpu
def test_torch_merge_under_cuda_graph_replay(rng):
    import torch
    t, h, r_count = 4, 32, 2
    _, out_bf, lse = random_ranks(rng, r_count, t, h)
    d_out = torch.from_numpy(out_bf.view(np.int16)).view(torch.bfloat16).cuda()
    d_lse = torch.from_numpy(lse).cuda()
    out = torch.empty((t, h, 512), dtype=torch.bfloat16, device="cuda")
    mlse = torch.empty((t, h), dtype=torch.float32, device="cuda")
    sparsemla.merge_ranks(d_out, d_lse, out=out, lse=mlse)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparsemla.merge_ranks(d_out, d_lse, out=out, lse=mlse)
    for _ in range(2):
        _, nb, nl = random_ranks(rng, r_count, t, h)
        d_out.copy_(torch.from_numpy(nb.view(np.int16)).view(torch.bfloat16))
        d_lse.copy_(torch.from_numpy(nl))
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = sparsemla.merge_ranks(nb, nl)
        assert np.array_equal(out.cpu().view(torch.int16).numpy().view(np.uint16), want)
        assert np.array_equal(mlse.cpu().numpy(), want_lse)


@pytest.mark.gpu
def test_two_gpu_nccl_pipeline_passes():
    """tools/cp_two_gpu.py under torchrun on 2 GPUs (NCCL all-gather, then the merge): every cell
    within CONTRACT 9.9 of the float64 reference of the single-GPU decode of the whole list."""
    import os
    import subprocess
    import sys
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (not run: no 2-GPU machine)")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "cp_two_gpu.py")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        script, "--iters", "10"], capture_output=True, text=True, env=env,
                       timeout=900)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "PASS" in r.stdout
