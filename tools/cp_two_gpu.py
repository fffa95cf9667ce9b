"""Decode context parallelism on 2 GPUs (CONTRACT 12, docs/CP.md): one process per GPU, NCCL.

Each rank holds its own pages of the request's caches (the interleave rule: virtual slot v on rank
v % R at local slot v // R, R = world size), shards the unsharded lists with sparsemla.shard_list,
decodes its part without the sink, all-gathers (out, lse) and merges them with the sink
(sparsemla.merge_ranks). Rank 0 checks the merged output against the single-GPU decode of the whole
list (CONTRACT 9.9 rule against the float64 reference's accuracy scale; lse per 9.4) and prints the
times: the single-GPU decode, the rank decode, the all-gather and the merge kernel, each the median
of CUDA-event timings.

    torchrun --nproc-per-node 2 tools/cp_two_gpu.py [--batches 1,8,32] [--iters 50]

Shapes (DSV4, T = B rows of one query token): C4-Pro (H = 128 heads at TP 1 ... here --heads, default
64: V4-Pro at TP 2; window 128 + top-k 1024 compressed entries at 64k context) and C128 (window 128 +
every compressed entry: context / 128 = 512 at 64k). With fewer than 2 GPUs it exits 0 with a
message (nothing to measure). NVLink multicast stays off (set below, before torch initialises NCCL).
"""

import argparse
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import numpy as np  # noqa: E402

try:
    import torch  # noqa: E402
    import torch.distributed as dist  # noqa: E402
except ImportError:
    print("cp_two_gpu: torch is not installed; skipped")
    sys.exit(0)

import sparsemla  # noqa: E402

BS = 64  # the rank's page size; the virtual page holds R * BS slots


def bf16_bits(x):
    return torch.from_numpy(sparsemla.float_to_bf16_bits(x.astype(np.float32)).view(np.int16)).view(
        torch.bfloat16)


def model_cache(gen, nb, bs):
    """A cache written by the library's window writer from model-like latents (CONTRACT 9.9)."""
    n = nb * bs
    gain = np.exp(0.7 * gen.standard_normal((n, 8, 1)))
    kv = sparsemla.float_to_bf16_bits((gen.standard_normal((n, 8, 64)) * gain).reshape(n, 512)
                                      .astype(np.float32))
    cache = np.zeros((nb, bs * 584), np.uint8)
    table = sparsemla.build_rope_table(8192, "window")
    sparsemla.write_window(kv, gen.integers(0, 8192, n).astype(np.int64), np.arange(n, dtype=np.int64),
                           table, cache, block_size=bs)
    return cache


def rank_pages(cache, world, rank):
    """Rank `rank`'s cache: page b holds the rank's slots of virtual page b (interleave 1)."""
    nb, bsv = cache.shape[0], BS * world
    data = cache[:, :bsv * 576].reshape(nb, bsv, 576)[:, rank::world]
    codes = cache[:, bsv * 576:bsv * 584].reshape(nb, bsv, 8)[:, rank::world]
    return np.concatenate([data.reshape(nb, -1), codes.reshape(nb, -1)], axis=1)


def problem(layer, batch, heads, world, seed):
    """Virtual caches (page R*BS), lists of virtual slots, q, sink, positions (same on every rank)."""
    gen = np.random.default_rng(seed)
    ctx = 65536
    n_extra = ctx // 4 if layer == "c4-pro" else ctx // 128
    width = 1024 if layer == "c4-pro" else n_extra
    bsv = BS * world
    main_nb = (batch * 128 + bsv - 1) // bsv + 1
    extra_nb = (batch * n_extra + bsv - 1) // bsv + 1
    main, extra = model_cache(gen, main_nb, bsv), model_cache(gen, extra_nb, bsv)
    main_idx = np.arange(batch * 128, dtype=np.int32).reshape(batch, 128)  # each request's window
    if layer == "c4-pro":  # the indexer's top-k: 1024 distinct entries of the request's 16384
        extra_idx = np.stack([b * n_extra + gen.permutation(n_extra)[:width] for b in range(batch)])
    else:  # every compressed entry so far
        extra_idx = np.stack([b * n_extra + np.arange(n_extra) for b in range(batch)])
    extra_idx = extra_idx.astype(np.int32)
    q = gen.standard_normal((batch, heads, 512)).astype(np.float32)
    sink = gen.uniform(5, 9, heads).astype(np.float32)
    pos = gen.integers(0, 65536, batch).astype(np.int64)
    return main, extra, main_idx, extra_idx, q, sink, pos


def ragged(dense):
    t, w = dense.shape
    return dense.reshape(-1).copy(), (np.arange(t + 1) * w).astype(np.int32)


def median_ms(fn, iters):
    """Median of CUDA-event timings of fn() (after 5 warm-up calls)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--layers", default="c4-pro,c128")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    if "RANK" not in os.environ:
        print("cp_two_gpu: run it with `torchrun --nproc-per-node 2 tools/cp_two_gpu.py`; skipped")
        return 0
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print(f"cp_two_gpu: needs 2 GPUs, found {torch.cuda.device_count() if torch.cuda.is_available() else 0}; "
              "skipped (not run: no 2-GPU machine)")
        return 0
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    table_np = sparsemla.build_rope_table(65536, "compressed")
    table = torch.from_numpy(table_np).to(dev)
    failures = 0
    rows = []
    for layer in args.layers.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            main, extra, main_idx, extra_idx, q, sink, pos = problem(layer, batch, args.heads, world, 1234)
            h = args.heads
            tq, tsink, tpos = bf16_bits(q).to(dev), torch.from_numpy(sink).to(dev), torch.from_numpy(pos).to(dev)
            # This rank's pages and lists (sharded on the GPU).
            my_main = torch.from_numpy(rank_pages(main, world, rank)).to(dev)
            my_extra = torch.from_numpy(rank_pages(extra, world, rank)).to(dev)
            vm, vmp = [torch.from_numpy(x).to(dev) for x in ragged(main_idx)]
            vx, vxp = [torch.from_numpy(x).to(dev) for x in ragged(extra_idx)]
            mi, mp = sparsemla.shard_list(vm, vmp, num_ranks=world, rank=rank, width=main_idx.shape[1])
            xi, xp = sparsemla.shard_list(vx, vxp, num_ranks=world, rank=rank, width=extra_idx.shape[1])
            out_r = torch.empty((batch, h, 512), dtype=torch.bfloat16, device=dev)
            lse_r = torch.empty((batch, h), dtype=torch.float32, device=dev)
            gathered_out = torch.empty((world, batch, h, 512), dtype=torch.bfloat16, device=dev)
            gathered_lse = torch.empty((world, batch, h), dtype=torch.float32, device=dev)
            merged = torch.empty((batch, h, 512), dtype=torch.bfloat16, device=dev)
            merged_lse = torch.empty((batch, h), dtype=torch.float32, device=dev)

            def rank_decode():
                sparsemla.sparse_decode(tq, my_main, mi, mp, main_block_size=BS, extra_cache=my_extra,
                                        extra_indices=xi, extra_indptr=xp, extra_block_size=BS,
                                        out=out_r, lse=lse_r)

            def gather():
                dist.all_gather_into_tensor(gathered_out, out_r)
                dist.all_gather_into_tensor(gathered_lse, lse_r)

            def merge():
                sparsemla.merge_ranks(gathered_out, gathered_lse, sink=tsink, positions=tpos, rope=table,
                                      out=merged, lse=merged_lse)

            rank_decode()
            gather()
            merge()
            torch.cuda.synchronize()
            t_rank, t_gather, t_merge = (median_ms(f, args.iters) for f in (rank_decode, gather, merge))
            if rank == 0:
                # The single-GPU decode of the whole list on the virtual caches (page R*BS).
                full_main, full_extra = torch.from_numpy(main).to(dev), torch.from_numpy(extra).to(dev)
                fm, fmp = vm, vmp
                one_out = torch.empty_like(merged)
                one_lse = torch.empty_like(merged_lse)

                def single():
                    sparsemla.sparse_decode(tq, full_main, fm, fmp, main_block_size=BS * world,
                                            extra_cache=full_extra, extra_indices=vx, extra_indptr=vxp,
                                            extra_block_size=BS * world, sink=tsink, positions=tpos,
                                            rope=table, out=one_out, lse=one_lse)

                t_single = median_ms(single, args.iters)
                # Both against the float64 reference of the whole list (CPU), with the 9.9 rule.
                want, want_lse, a = sparsemla.sparse_decode_reference(
                    sparsemla.float_to_bf16_bits(q), main, *ragged(main_idx),
                    main_block_size=BS * world, extra_cache=extra,
                    extra_indices=ragged(extra_idx)[0], extra_indptr=ragged(extra_idx)[1],
                    extra_block_size=BS * world, sink=sink, positions=pos, rope=table_np,
                    return_abs_mean=True)
                got = merged.cpu().view(torch.int16).numpy().view(np.uint16)
                v = sparsemla.verify_decode_output(got, want, a)
                ml = merged_lse.cpu().numpy()
                d = np.abs(ml - want_lse)
                lse_ok = bool(np.all((d <= 1e-6) | (d / (np.abs(want_lse) + 1e-6) < 8.01 / 65536)))
                ok = v["passed"] and lse_ok
                failures += not ok
                rows.append((layer, batch, h, t_single, t_rank, t_gather, t_merge, v["max_bound_ratio"],
                             "PASS" if ok else "FAIL"))
            dist.barrier()
    if rank == 0:
        print("layer     B    H  single-GPU(ms)  rank decode(ms)  all-gather(ms)  merge(ms)  "
              "err/bound verdict")
        for r in rows:
            print(f"{r[0]:8s} {r[1]:3d} {r[2]:4d} {r[3]:15.4f} {r[4]:16.4f} {r[5]:15.4f} {r[6]:10.4f} "
                  f"{r[7]:9.3f} {r[8]}")
    fail = torch.tensor([failures], device=dev)
    dist.all_reduce(fail)
    dist.destroy_process_group()
    return 1 if int(fail.item()) else 0


if __name__ == "__main__":
    sys.exit(main())
