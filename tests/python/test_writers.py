"""Writers (CONTRACT 3): window writer, compressor state writer, compressor (ratio 4 / 128, single-pass /
two-stage, sanitising), indexer compressor; and the indexer-key gather (CONTRACT 6)."""

import math

import numpy as np
import pytest

import reference as ref
import sparsemla

TABLE = ref.rope_table(4096, theta=160000.0, yarn=True)


def _latents(rng, n):
    x = rng.standard_normal((n, 512)).astype(np.float32) * rng.uniform(0.05, 20, (n, 1))
    return ref.bf16_round_bits_fast(x.astype(np.float32))


def _rope_close(got_bits, want_f32):
    """RoPE values: equal after rounding, or within one bf16 ulp (FMA contraction may move the fp32
    result by 1 ulp before the rounding, CONTRACT 1)."""
    got = ref.bf16_to_f32(got_bits).astype(np.float64)
    want = ref.bf16_to_f32(ref.bf16_round_bits_fast(want_f32)).astype(np.float64)
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 1e-38))) - 7)
    assert np.all(np.abs(got - want) <= ulp)


@pytest.mark.parametrize("block_size,pad", [(1, 0), (2, 0), (16, 576), (61, 0), (64, 576 * 3)])
@pytest.mark.parametrize("sanitise", [True, False])
def test_window_writer_matches_reference_page_sizes_and_skips(rng, block_size, pad, sanitise):
    nb = 5
    cache = rng.integers(0, 256, size=(nb, block_size * 584 + pad), dtype=np.uint8)
    before = cache.copy()
    n = min(nb * block_size, 40)
    slots = rng.permutation(nb * block_size)[:n].astype(np.int64)
    slots[rng.random(n) < 0.25] = -1  # skipped tokens
    pos = rng.integers(0, 4096, n).astype(np.int64)
    kv = _latents(rng, n)
    sparsemla.write_window(kv, pos, slots, TABLE, cache, block_size=block_size, sanitise=sanitise)
    expect = before.copy()
    for i in range(n):
        if slots[i] < 0:
            continue
        nope, codes, rope = ref.window_row(kv[i], pos[i], TABLE, sanitise)
        ref.store_row(expect, block_size, slots[i], nope, codes, rope)
    # NoPE bytes, codes, pad bytes and every untouched byte (page padding, other rows) are exact.
    rope_mask = np.zeros_like(cache, dtype=bool)
    for s in slots[slots >= 0]:
        b, p = divmod(int(s), block_size)
        rope_mask[b, p * 576 + 448:p * 576 + 576] = True
    assert np.array_equal(cache[~rope_mask], expect[~rope_mask])
    for i in np.nonzero(slots >= 0)[0]:
        b, p = divmod(int(slots[i]), block_size)
        got = cache[b, p * 576 + 448:p * 576 + 576].view("<u2")
        x = ref.bf16_to_f32(kv[i])[448:]
        _rope_close(got, ref.rope_forward(x, TABLE[pos[i], :32], TABLE[pos[i], 32:]))


def test_window_writer_poisoned_latents_sanitising_equals_legacy_scrubbed(rng):
    bs, n = 8, 16
    kv = _latents(rng, n)
    kv[0, 3] = 0x7F80        # +inf in a NoPE tile
    kv[1, 70] = 0x7FC0       # NaN in a NoPE tile
    kv[2, 449] = 0x7FC0      # NaN RoPE
    kv[3, 500] = 0xFF80      # -inf RoPE (rotation makes NaN/inf)
    pos = rng.integers(0, 4096, n).astype(np.int64)
    slots = np.arange(n, dtype=np.int64)
    caches = {}
    for sanitise in (True, False):
        caches[sanitise] = np.zeros((2, bs * 584), dtype=np.uint8)
        sparsemla.write_window(kv, pos, slots, TABLE, caches[sanitise], block_size=bs,
                               sanitise=sanitise)
    san = caches[True]
    codes = np.stack([san[b, bs * 576 + p * 8:bs * 576 + p * 8 + 7] for b in range(2)
                      for p in range(bs)])
    assert codes.max() <= 254
    nope = np.stack([san[b, p * 576:p * 576 + 448] for b in range(2) for p in range(bs)])
    assert not np.any((nope & 0x7F) == 0x7F)
    a = sparsemla.dequantize_rows(san, slots, block_size=bs, scrub=False)
    b = sparsemla.dequantize_rows(caches[False], slots, block_size=bs, scrub=True)
    assert not np.isnan(a).any()
    assert np.array_equal(a, b)  # IEEE ==: -0 == +0


def test_write_compressor_state_rows_with_ape_and_skips(rng):
    for ratio, head in ((4, 512), (128, 512), (4, 128)):
        w = (2 if ratio == 4 else 1) * head
        sbs, nsb, n = 4, 6, 12
        state = rng.standard_normal((nsb, sbs, 2 * w + 8)).astype(np.float32)
        before = state.copy()
        kv = rng.standard_normal((n, w)).astype(np.float32)
        score = rng.standard_normal((n, w)).astype(np.float32)
        ape = rng.standard_normal((ratio, w)).astype(np.float32)
        pos = rng.integers(0, 1000, n).astype(np.int64)
        slots = rng.permutation(nsb * sbs)[:n].astype(np.int64)
        slots[::5] = -1
        for use_ape in (True, False):
            state[:] = before
            sparsemla.write_compressor_state(kv, score, pos, slots, state, ratio=ratio,
                                             head_dim=head, ape=ape if use_ape else None)
            want = before.copy()
            for i in range(n):
                if slots[i] < 0:
                    continue
                b, r = divmod(int(slots[i]), sbs)
                want[b, r, :w] = kv[i]
                want[b, r, w:2 * w] = score[i] + (ape[pos[i] % ratio] if use_ape else 0)
            assert np.array_equal(state, want)
        with pytest.raises(sparsemla.Error, match="argument 'state'.*2W"):
            sparsemla.write_compressor_state(kv, score, pos, slots, state[:, :, :2 * w - 1],
                                             ratio=ratio, head_dim=head)


# ---- compressor ---------------------------------------------------------------------------------------------
class Setup:
    """R requests of L tokens each with random state rows in a paged state cache."""

    def __init__(self, rng, ratio, head, requests, length, sbs, cbs):
        self.ratio, self.head = ratio, head
        self.coff = 2 if ratio == 4 else 1
        w = self.coff * head
        per_req = -(-length // sbs)
        nsb = requests * per_req + 2
        self.state = np.full((nsb, sbs, 2 * w), np.nan, dtype=np.float32)
        self.sbt = rng.permutation(nsb)[:requests * per_req].reshape(requests, per_req).astype(np.int32)
        self.kv = rng.standard_normal((requests, length, w)).astype(np.float32)
        self.score = (rng.standard_normal((requests, length, w)) * 2).astype(np.float32)
        for r in range(requests):
            for p in range(length):
                b = self.sbt[r, p // sbs]
                self.state[b, p % sbs, :w] = self.kv[r, p]
                self.state[b, p % sbs, w:] = self.score[r, p]
        entries = length // ratio
        per_c = -(-entries // cbs)
        self.ncb = requests * per_c + 1
        self.cbt = rng.permutation(self.ncb)[:requests * per_c].reshape(requests, per_c).astype(np.int32)
        self.cbs = cbs
        pos = np.tile(np.arange(length, dtype=np.int64), requests)
        req = np.repeat(np.arange(requests, dtype=np.int32), length)
        self.positions, self.request_index = pos, req
        self.state_slots = np.array([self.sbt[r, p // sbs] * sbs + p % sbs for r, p in zip(req, pos)],
                                    dtype=np.int64)
        out = []
        for r, p in zip(req, pos):
            if (p + 1) % ratio:
                out.append(-1)
            else:
                j = p // ratio
                out.append(self.cbt[r, j // cbs] * cbs + j % cbs)
        self.out_slots = np.array(out, dtype=np.int64)
        self.weight = (1 + 0.1 * rng.standard_normal(head)).astype(np.float32)

    def pooled(self, r, p):
        """float64 pooled, normed vector of the entry completed at position p of request r."""
        w, head = self.coff * self.head, self.head
        rows = np.arange(p - (self.coff) * self.ratio + 1, p + 1)
        kv = np.zeros((len(rows), head))
        sc = np.full((len(rows), head), -np.inf)
        for i, q in enumerate(rows):
            if q < 0:
                continue
            half = 0 if (self.coff == 2 and i < self.ratio) else (w - head)
            kv[i] = self.kv[r, q, half:half + head]
            sc[i] = self.score[r, q, half:half + head]
        m = sc.max(axis=0)
        e = np.exp(sc - m)
        c = (e * kv).sum(axis=0) / e.sum(axis=0)
        var = (c * c).sum() / head
        return c / math.sqrt(var + 1e-6) * self.weight.astype(np.float64)

    def run(self, cache, **kw):
        fn = sparsemla.compress if self.head == 512 else sparsemla.compress_indexer
        extra = {"ratio": self.ratio} if self.head == 512 else {}
        fn(self.positions, self.request_index, self.state_slots, self.out_slots, self.sbt,
           self.state, self.weight, TABLE, cache, block_size=self.cbs, **extra, **kw)


def _ulp_bf16(m):
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(m), 1e-30))) - 7)


def _check_mla_entry(cache, cbs, slot, normed, rope_pos):
    """CONTRACT 9.3 comparison of one stored entry with the float64 reference."""
    b, p = divmod(int(slot), cbs)
    page = cache[b]
    codes = page[cbs * 576 + p * 8:cbs * 576 + p * 8 + 7].astype(np.int64)
    assert page[cbs * 576 + p * 8 + 7] == 0
    nope_ref = ref.bf16_round(normed[:448].astype(np.float32)).astype(np.float64)
    got = sparsemla.dequantize_rows(cache, np.array([slot], dtype=np.int64), block_size=cbs)[0]
    for t in range(7):
        tile = nope_ref[t * 64:(t + 1) * 64]
        amax = max(np.abs(tile).max(), 1e-4)
        e_ref = ref.quant_exponent(amax)
        near = any(abs(amax - 448 * 2.0 ** k) <= _ulp_bf16(amax) for k in (e_ref - 1, e_ref))
        assert codes[t] == e_ref + 127 or (near and abs(codes[t] - (e_ref + 127)) == 1)
        e = codes[t] - 127
        d = np.abs(got[t * 64:(t + 1) * 64] - tile)
        assert np.all(d <= 16 * 2.0 ** e + _ulp_bf16(tile)), d.max()
    c, s = TABLE[rope_pos, :32].astype(np.float64), TABLE[rope_pos, 32:].astype(np.float64)
    a, bb = normed[448::2], normed[449::2]
    rot = np.empty(64)
    rot[0::2], rot[1::2] = a * c - bb * s, a * s + bb * c
    mag = np.repeat(np.hypot(rot[0::2], rot[1::2]), 2)
    assert np.all(np.abs(got[448:] - rot) <= 2 * _ulp_bf16(mag))


@pytest.mark.parametrize("ratio,requests,length,sbs,cbs", [(4, 3, 37, 4, 2), (4, 2, 64, 3, 64),
                                                           (128, 2, 256, 8, 2)])
def test_compressor_matches_float64_reference_and_two_stage_bytewise(rng, ratio, requests, length,
                                                                     sbs, cbs):
    st = Setup(rng, ratio, 512, requests, length, sbs, cbs)
    fill = rng.integers(0, 256, size=(st.ncb, cbs * 584 + 64), dtype=np.uint8)
    one, two = fill.copy(), fill.copy()
    st.run(one)
    st.run(two, two_stage=True)
    assert np.array_equal(one, two)  # single-pass and two-stage rows are byte-identical
    written = np.zeros_like(one, dtype=bool)
    for i in np.nonzero(st.out_slots >= 0)[0]:
        r, p = st.request_index[i], st.positions[i]
        _check_mla_entry(one, cbs, st.out_slots[i], st.pooled(r, p), (p // ratio) * ratio)
        b, q = divmod(int(st.out_slots[i]), cbs)
        written[b, q * 576:(q + 1) * 576] = True
        written[b, cbs * 576 + q * 8:cbs * 576 + q * 8 + 8] = True
    assert np.array_equal(one[~written], fill[~written])  # nothing else touched


def test_compressor_skips_negative_out_and_state_slots(rng):
    st = Setup(rng, 4, 512, 2, 16, 4, 4)
    done = np.nonzero(st.out_slots >= 0)[0]
    st.out_slots[done[0]] = -1      # completes an entry, but nothing stored
    st.state_slots[done[1]] = -1    # token skipped entirely
    cache = np.zeros((st.ncb, 4 * 584), dtype=np.uint8)
    st.run(cache)
    ref_cache = np.zeros_like(cache)
    st.out_slots[done[1]] = -1
    st.state_slots[done[1]] = 0
    st.run(ref_cache)
    assert np.array_equal(cache, ref_cache)


def test_compressor_sanitising_on_poisoned_inputs_equals_legacy_scrubbed(rng):
    st = Setup(rng, 4, 512, 2, 32, 4, 8)
    st.weight[5] = np.inf            # inf norm weight: a NoPE tile holding inf
    st.weight[300] = np.nan          # NaN norm weight
    st.weight[460] = np.nan          # NaN RoPE
    st.kv[0, 10, 700] = np.inf       # inf latent
    for r in range(2):
        for p in range(32):
            b = st.sbt[r, p // 4]
            st.state[b, p % 4, :1024] = st.kv[r, p]
    caches = {}
    for sanitise in (True, False):
        caches[sanitise] = np.zeros((st.ncb, 8 * 584), dtype=np.uint8)
        st.run(caches[sanitise], sanitise=sanitise)
    slots = st.out_slots[st.out_slots >= 0]
    san = caches[True]
    for s in slots:
        b, p = divmod(int(s), 8)
        assert san[b, 8 * 576 + p * 8:8 * 576 + p * 8 + 7].max() <= 254
        assert not np.any((san[b, p * 576:p * 576 + 448] & 0x7F) == 0x7F)
    a = sparsemla.dequantize_rows(san, slots, block_size=8, scrub=False)
    b = sparsemla.dequantize_rows(caches[False], slots, block_size=8, scrub=True)
    assert not np.isnan(a).any()
    assert np.array_equal(a, b)
    assert np.isinf(a).any()  # the poisoned tiles did reach the cache


def test_indexer_compressor_matches_reference_and_two_stage(rng):
    st = Setup(rng, 4, 128, 3, 29, 4, 16)
    nb = st.ncb
    fill = rng.integers(0, 256, size=(nb, 16 * 132 + 16), dtype=np.uint8)
    one, two = fill.copy(), fill.copy()
    st.run(one)
    st.run(two, two_stage=True)
    assert np.array_equal(one, two)
    slots = st.out_slots[st.out_slots >= 0]
    got = sparsemla.dequantize_indexer_rows(one, slots, block_size=16)
    for k, i in enumerate(np.nonzero(st.out_slots >= 0)[0]):
        r, p = st.request_index[i], st.positions[i]
        normed = st.pooled(r, p)
        rp = (p // 4) * 4
        c, s = TABLE[rp, :32].astype(np.float64), TABLE[rp, 32:].astype(np.float64)
        x = normed.copy()
        x[64::2], x[65::2] = normed[64::2] * c - normed[65::2] * s, normed[64::2] * s + normed[65::2] * c
        xr = ref.bf16_round(x.astype(np.float32)).astype(np.float64)
        b, q = divmod(int(slots[k]), 16)
        scale = float(one[b, 16 * 128 + q * 4:16 * 128 + q * 4 + 4].view(np.float32)[0])
        e = ref.quant_exponent(max(np.abs(xr).max(), 1e-4))
        assert scale in (2.0 ** e, 2.0 ** (e - 1), 2.0 ** (e + 1))
        tol = 16 * scale + 2 * _ulp_bf16(np.maximum(np.abs(xr), np.repeat(np.hypot(x[0::2], x[1::2]), 2)))
        assert np.all(np.abs(got[k] - xr) <= tol)


# ---- gather (CONTRACT 6) ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["normal", "shuffle"])
def test_gather_indexer_keys_multi_sequence_padding_and_invalid_pages(rng, layout):
    bs, nb = 16, 7
    cache = rng.integers(0, 256, size=(nb, bs * 132), dtype=np.uint8)
    lens = [5, 0, 37, 16]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    width = 3
    table = rng.integers(0, nb, size=(len(lens) + 1, width)).astype(np.int32)
    table[2, 1] = nb + 3   # invalid block id
    table[3, 0] = -2
    n = int(cu[-1]) + 6    # over-allocated: trailing padding tokens
    tts = np.full(n, -1, dtype=np.int32)
    for b in range(len(lens)):
        tts[cu[b]:cu[b + 1]] = b
    tts[3] = 9             # out-of-range sequence: padding
    k_fp8 = np.full((n, 128), 0xAB, dtype=np.uint8)
    k_scale = np.full(n, 7.5, dtype=np.float32)
    out = sparsemla.gather_indexer_keys(tts, cu, table, cache, block_size=bs, layout=layout,
                                        k_fp8=k_fp8, k_scale=k_scale)
    assert out[0] is k_fp8 and out[1] is k_scale
    for tid in range(n):
        b = tts[tid]
        valid = 0 <= b < len(lens) and cu[b] <= tid < cu[b + 1]
        if not valid:
            assert k_scale[tid] == 7.5 and np.all(k_fp8[tid] == 0xAB)
            continue
        o = tid - cu[b]
        col = o // bs
        blk = table[b, col] if col < width else -1
        if not 0 <= blk < nb:
            assert k_scale[tid] == 0 and np.all(k_fp8[tid] == 0xAB)
            continue
        p, d = o % bs, np.arange(128)
        off = p * 128 + d if layout == "normal" else (p // 16) * 2048 + (p % 16) * 16 + (d // 16) * 256 + d % 16
        assert np.array_equal(k_fp8[tid], cache[blk, off])
        assert k_scale[tid].view(np.uint32) == cache[blk, bs * 128 + p * 4:bs * 128 + p * 4 + 4].view(np.uint32)[0]


def test_gather_allocates_zeroed_outputs_and_checks_arguments(rng):
    cache = rng.integers(0, 256, size=(2, 16 * 132), dtype=np.uint8)
    tts = np.array([0, 0, -1], dtype=np.int32)
    cu = np.array([0, 2], dtype=np.int32)
    table = np.array([[1]], dtype=np.int32)
    k, s = sparsemla.gather_indexer_keys(tts, cu, table, cache, block_size=16)
    assert k.shape == (3, 128) and s.shape == (3,)
    assert np.all(k[2] == 0) and s[2] == 0
    assert np.array_equal(k[1], cache[1, 128:256])
    with pytest.raises(sparsemla.Error, match="argument 'token_to_seq'.*int32"):
        sparsemla.gather_indexer_keys(tts.astype(np.int64), cu, table, cache, block_size=16)
    with pytest.raises(sparsemla.Error, match="layout"):
        sparsemla.gather_indexer_keys(tts, cu, table, cache, block_size=16, layout="tiled")
