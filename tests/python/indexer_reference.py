"""float64 reference of the lightning-indexer decode (CONTRACT 11.2 math, 11.3 rule, 11.7 bound)
and of its query prep (11.6), written from the contract's text in numpy, plus builders of indexer
problems: random data as the 3.2 writer produces it, and exact-arithmetic data (11.7)."""

import math

import numpy as np

import reference as ref

E4M3 = ref.E4M3
# Exact-arithmetic values {-2, -1, 0, 1, 2} as e4m3 bytes.
EXACT_BYTES = np.array([0xC0, 0xB8, 0x00, 0x38, 0x40], dtype=np.uint8)


def value_offset(layout, p, d):
    """Byte offset of value d of row p inside an indexer page (CONTRACT 2.2)."""
    if layout == "normal":
        return p * 128 + d
    return (p // 16) * 2048 + (p % 16) * 16 + (d // 16) * 256 + d % 16


def store_entry(pages, bs, layout, block, row, values, scale):
    """Writes one entry (128 e4m3 bytes and its fp32 scale) into pages uint8 [nb, page_bytes]."""
    d = np.arange(128)
    pages[block, value_offset(layout, row, d)] = values
    pages[block, bs * 128 + 4 * row: bs * 128 + 4 * row + 4] = \
        np.frombuffer(np.float32(scale).tobytes(), dtype=np.uint8)


def load_entry(pages, bs, layout, block, row):
    """(values float64 [128], scale float64) of one entry."""
    d = np.arange(128)
    vals = E4M3[pages[block, value_offset(layout, row, d)]]
    scale = pages[block, bs * 128 + 4 * row: bs * 128 + 4 * row + 4].view(np.float32)[0]
    return vals, float(scale)


class Problem:
    """An indexer problem on host arrays (the arguments of sparsemla.indexer_topk)."""

    def __init__(self, rng, *, T, H, R, Wt, bs, nb, layout="normal", exact=False, pad=0,
                 n=None, row_request=None):
        self.T, self.H, self.R, self.Wt, self.bs, self.nb, self.layout = T, H, R, Wt, bs, nb, layout
        page = bs * 132 + pad
        if exact:
            self.q = EXACT_BYTES[rng.integers(0, 5, size=(T, H, 128))]
            self.w = (rng.integers(-4, 9, size=(T, H)) * 2.0 ** -6).astype(np.float32)
        else:
            self.q = ref.e4m3_encode(np.clip(rng.standard_normal((T, H, 128)) * 40, -448, 448))
            self.w = (rng.standard_normal((T, H)) * 0.02).astype(np.float32)
        self.cache = rng.integers(0, 256, size=(nb, page), dtype=np.uint8)  # pad bytes random
        for b in range(nb):
            for r in range(bs):
                if exact:
                    vals = EXACT_BYTES[rng.integers(0, 5, size=128)]
                    scale = 2.0 ** int(rng.integers(-3, 3))
                else:
                    vals = ref.e4m3_encode(np.clip(rng.standard_normal(128) * 60, -448, 448))
                    scale = 2.0 ** int(rng.integers(-12, -4))
                store_entry(self.cache, bs, layout, b, r, vals, scale)
        self.table = np.stack([rng.permutation(nb)[:Wt] for _ in range(R)]).astype(np.int32) \
            if nb >= Wt else rng.integers(0, nb, size=(R, Wt)).astype(np.int32)
        self.row_request = (np.arange(T) % max(R, 1)).astype(np.int32) if row_request is None \
            else np.asarray(row_request, dtype=np.int32)
        self.n = (rng.integers(0, Wt * bs + 1, size=T).astype(np.int32) if n is None
                  else np.asarray(n, dtype=np.int32))

    def args(self):
        return (self.q, self.w, self.cache, self.table, self.row_request, self.n)

    def candidates(self, t):
        """C_t (11.3): the row's addressable local indices."""
        r = int(self.row_request[t])
        if not 0 <= r < self.R:
            return np.zeros(0, dtype=np.int64)
        n = min(max(int(self.n[t]), 0), self.Wt * self.bs)
        j = np.arange(n)
        blocks = self.table[r][j // self.bs] if n else np.zeros(0, dtype=np.int32)
        return j[(blocks >= 0) & (blocks < self.nb)]

    def reference(self, t):
        """(candidates, float64 scores, A) of row t (11.2 in float64, 11.7's A)."""
        j = self.candidates(t)
        if j.size == 0:
            return j, np.zeros(0), np.zeros(0)
        r = int(self.row_request[t])
        kv = np.empty((j.size, 128))
        c = np.empty(j.size)
        for i, jj in enumerate(j):
            kv[i], c[i] = load_entry(self.cache, self.bs, self.layout,
                                     int(self.table[r][jj // self.bs]), int(jj % self.bs))
        qv = E4M3[self.q[t]]                               # [H, 128]
        w = self.w[t].astype(np.float64)                   # [H]
        with np.errstate(invalid="ignore", over="ignore"):
            dot = qv @ kv.T                                # [H, S]
            relu = np.where(dot < 0, 0.0, dot)             # NaN stays NaN
            score = c * (w @ relu)
            a = c * (np.abs(w) @ (np.abs(qv) @ np.abs(kv).T))
        return j, score, a


def rank(j, score):
    """The 11.3 rank order of candidates j with these scores: larger key first, then lower j."""
    key = np.where(np.isfinite(score), score, -np.inf)
    key = np.where(key == 0, 0.0, key)
    return np.lexsort((j, -key))


def expected_selection(j, score, k, order):
    """Indices (in the output order) and their scores by the 11.3 rule on these scores."""
    o = rank(j, score)[:min(k, j.size)]
    if order == "by_index":
        o = o[np.argsort(j[o], kind="stable")]
    return j[o], score[o]


# ---- query prep (CONTRACT 11.6) -------------------------------------------------------------------
def q_prep(q_bits, positions, rope, w_bits):
    """(bytes uint8 [T, H, 128], w float32 [T, H]) of 11.6, from its text: rotation in fp32 rounded
    to bf16, the exact exponent by search, RNE bytes by nearest-code search, the fold in order."""
    t_, h_ = q_bits.shape[:2]
    out_b = np.zeros((t_, h_, 128), dtype=np.uint8)
    out_w = np.zeros((t_, h_), dtype=np.float32)
    inv128 = np.float32(1 / math.sqrt(128.0))
    for t in range(t_):
        if positions[t] < 0:
            continue
        cs = rope[positions[t]]
        for h in range(h_):
            x = ref.bf16_to_f32(q_bits[t, h]).copy()
            x[64:] = ref.bf16_round(ref.rope_forward(x[64:], cs[:32], cs[32:]))
            b, _ = ref.quantize_tile(x, 254)
            out_b[t, h] = b
            finite = x[~np.isnan(x)]
            amax = max(float(np.max(np.abs(finite))) if finite.size else 0.0,
                       float(np.float32(1e-4)))
            e = ref.quant_exponent(amax)
            two_e = np.float32(np.inf) if math.isinf(e) else np.float32(2.0 ** e)
            with np.errstate(invalid="ignore", over="ignore"):
                w = (ref.bf16_to_f32(w_bits[t, h]) * two_e) * inv128 * np.float32(0.125)
            out_w[t, h] = w
    return out_b, out_w
