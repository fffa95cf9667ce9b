"""Small independent numpy references for the Python test suite (straight from docs/CONTRACT.md, never
from the library): codecs, the quantiser, page layout, writers, decode, lists, gather, planners."""

import math

import numpy as np

ROW = 584
DATA = 576


# ---- bf16 ----------------------------------------------------------------------------------------------
def bf16_round_bits(x):
    """float32 values -> bf16 bits, round to nearest even; NaN -> quiet NaN keeping the sign."""
    x = np.asarray(x, dtype=np.float32)
    out = np.empty(x.shape, dtype=np.uint16)
    flat_in, flat_out = x.ravel(), out.ravel()
    for i, v in enumerate(flat_in.tolist()):
        u = int(np.float32(v).view(np.uint32))
        if (u & 0x7FFFFFFF) > 0x7F800000:
            flat_out[i] = (u >> 16) | 0x40
            continue
        lower = u & 0xFFFF
        up = u >> 16
        if lower > 0x8000 or (lower == 0x8000 and (up & 1)):
            up += 1
        flat_out[i] = up & 0xFFFF
    return out


def bf16_round_bits_fast(x):
    """Vectorised form of bf16_round_bits (checked against it in the tests)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    up = u >> 16
    lower = u & 0xFFFF
    up = up + ((lower > 0x8000) | ((lower == 0x8000) & ((up & 1) == 1)))
    return np.where(nan, (u >> 16) | 0x40, up).astype(np.uint16)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x):
    return bf16_to_f32(bf16_round_bits_fast(x))


# ---- e4m3fn / UE8M0 --------------------------------------------------------------------------------------
def e4m3_table():
    """The 256 e4m3fn values: s eeee mmm, bias 7, e=0 subnormal m*2^-9, 0x7F/0xFF NaN."""
    t = np.empty(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = math.nan
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


E4M3 = e4m3_table()
_POS = E4M3[:127]  # codes 0x00..0x7E, increasing, 0 .. 448


def e4m3_encode(y):
    """Nearest e4m3fn code of finite |y| <= 448 (ties to the even code); sign bit from y's sign."""
    y = np.asarray(y, dtype=np.float64)
    a = np.abs(y)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    d_lo, d_hi = np.abs(a - _POS[lo]), np.abs(_POS[hi] - a)
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    sign = np.signbit(y).astype(np.int64) << 7
    return (pick | sign).astype(np.uint8)


def ue8m0(code):
    code = np.asarray(code, dtype=np.float64)
    return np.where(code == 255, np.inf, 2.0 ** (code - 127))


# ---- quantiser (CONTRACT 2.3) ---------------------------------------------------------------------------------
def quant_exponent(amax):
    """Smallest integer e with 448 * 2^e >= amax (amax >= 1e-4 finite), or inf."""
    if math.isinf(amax):
        return math.inf
    e = math.floor(math.log2(amax / 448.0)) - 2
    while 448.0 * 2.0 ** e < amax:
        e += 1
    return e


def quantize_tile(x, code_max):
    """x: float32 bf16-exact values of one tile -> (bytes uint8, code)."""
    x = np.asarray(x, dtype=np.float32)
    finite_or_inf = x[~np.isnan(x)]
    amax = float(np.max(np.abs(finite_or_inf))) if finite_or_inf.size else 0.0
    amax = max(amax, float(np.float32(1e-4)))
    e = quant_exponent(amax)
    if math.isinf(e):
        with np.errstate(invalid="ignore"):
            y = x * np.float32(0.0)
        code = code_max
    else:
        y = (x.astype(np.float64) * 2.0 ** (-e)).astype(np.float32)
        code = min(max(e + 127, 0), code_max)
    y = np.where(np.isnan(y), np.float32(-448.0), np.clip(y, -448.0, 448.0))
    return e4m3_encode(y), code


def quantize_rows(x, block, code_max):
    """float32 [N, D] bf16-exact -> bytes [N, D], codes [N, D/block]."""
    n, d = x.shape
    b = np.empty((n, d), dtype=np.uint8)
    c = np.empty((n, d // block), dtype=np.uint8)
    for r in range(n):
        for t in range(d // block):
            b[r, t * block:(t + 1) * block], c[r, t] = quantize_tile(x[r, t * block:(t + 1) * block],
                                                                     code_max)
    return b, c


# ---- RoPE (CONTRACT 1) ----------------------------------------------------------------------------------------
def rope_table(positions, theta=10000.0, yarn=False, factor=16.0, orig=65536, beta_fast=32.0,
               beta_slow=1.0):
    k = np.arange(32, dtype=np.float64)
    freq = 1.0 / theta ** (2 * k / 64)
    if yarn:
        def corr(rot):
            return 64 * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
        lo, hi = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), 63)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((k - lo) / (hi - lo), 0, 1)
        freq = freq / factor * ramp + freq * (1 - ramp)
    ang = np.arange(positions, dtype=np.float64)[:, None] * freq[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


def rope_forward(x, c, s):
    """x float32 [..., 64] interleaved pairs, c/s float32 [..., 32]: a*c - b*s, a*s + b*c in fp32."""
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    with np.errstate(invalid="ignore", over="ignore"):
        out[..., 0::2] = (a * c) - (b * s)
        out[..., 1::2] = (a * s) + (b * c)
    return out


def rope_inverse(x, c, s):
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    with np.errstate(invalid="ignore", over="ignore"):
        out[..., 0::2] = (a * c) + (b * s)
        out[..., 1::2] = (b * c) - (a * s)
    return out


# ---- fp8_ds_mla page layout (CONTRACT 2.1) -------------------------------------------------------------------
def store_row(cache2d, block_size, slot, nope_bytes, codes, rope_bits):
    """Writes one token into a [num_blocks, page_bytes] uint8 view."""
    blk, p = divmod(int(slot), block_size)
    page = cache2d[blk]
    page[p * DATA:p * DATA + 448] = nope_bytes
    page[p * DATA + 448:p * DATA + 576] = np.asarray(rope_bits, dtype="<u2").view(np.uint8)
    sc = block_size * DATA + p * 8
    page[sc:sc + 7] = codes
    page[sc + 7] = 0


def load_row(cache2d, block_size, slot, scrub):
    """float64 [512] dequantised row of a valid slot (NaN -> 0 when scrub)."""
    blk, p = divmod(int(slot), block_size)
    page = cache2d[blk]
    nope = E4M3[page[p * DATA:p * DATA + 448]]
    sc = block_size * DATA + p * 8
    scales = np.repeat(ue8m0(page[sc:sc + 7]), 64)
    with np.errstate(invalid="ignore"):
        v = np.concatenate([nope * scales,
                            bf16_to_f32(page[p * DATA + 448:p * DATA + 576].view("<u2"))
                            .astype(np.float64)])
    if scrub:
        v = np.where(np.isnan(v), 0.0, v)
    return v


def random_cache(rng, num_blocks, block_size, pad=0, codes=(118, 132)):
    """A cache of random valid rows (no NaN bytes, codes in range, random bf16 RoPE), page stride
    block_size*584 + pad; returns the [num_blocks, stride] uint8 array."""
    stride = block_size * ROW + pad
    cache = rng.integers(0, 256, size=(num_blocks, stride), dtype=np.uint8)
    for b in range(num_blocks):
        for p in range(block_size):
            nope = rng.integers(0, 256, size=448).astype(np.uint8)
            nope[(nope & 0x7F) == 0x7F] = 0x3C
            code = rng.integers(codes[0], codes[1], size=7).astype(np.uint8)
            rope = bf16_round_bits_fast(rng.standard_normal(64).astype(np.float32))
            store_row(cache, block_size, b * block_size + p, nope, code, rope)
    return cache


# ---- writers (CONTRACT 3.1) --------------------------------------------------------------------------------------
def window_row(kv_bits, pos, table, sanitise):
    """One window-writer token -> (nope bytes, codes, rope bits)."""
    x = bf16_to_f32(kv_bits).copy()
    c, s = table[pos, :32], table[pos, 32:]
    x[448:] = rope_forward(x[448:], c, s)
    rope = bf16_round_bits_fast(x[448:])
    if sanitise:
        rope = np.where((rope & 0x7FFF) > 0x7F80, np.uint16(0), rope)
    nope, codes = quantize_rows(bf16_round(x[:448])[None, :], 64, 254 if sanitise else 255)
    return nope[0], codes[0], rope


# ---- decode (CONTRACT 4.2) -------------------------------------------------------------------------------------------
def decode(q_bits, caches, lists, sink=None, scale=512 ** -0.5, scrub_extra=True):
    """float64 reference: q bf16 bits [T, H, 512]; caches = [(cache2d, bs), ...] (main, extra);
    lists = [(indices, indptr), ...]. Returns (out [T, H, 512], lse [T, H], abs_mean [T, H, 512]):
    abs_mean is the accuracy scale A of CONTRACT 9.9, A[t, h, j] = sum_i p_i |v_ij| / sum_i p_i over
    the row's valid keys (the keys' softmax, without the sink), 0 for a row without keys.
    Special values (CONTRACT 4.2): a NaN or +inf score makes its (t, h) NaN (out and lse); a NaN
    sink makes every row of its head NaN; -inf scores weigh 0 (all -inf: no mass, out 0, lse +inf);
    a +inf sink gives 0."""
    q = bf16_to_f32(q_bits).astype(np.float64)
    t_count, h_count = q.shape[0], q.shape[1]
    out = np.zeros((t_count, h_count, 512))
    lse = np.full((t_count, h_count), np.inf)
    abs_mean = np.zeros((t_count, h_count, 512))
    for t in range(t_count):
        keys = []
        for li, ((cache, bs), (idx, ptr)) in enumerate(zip(caches, lists)):
            n_slots = cache.shape[0] * bs
            for s in idx[ptr[t]:ptr[t + 1]]:
                if 0 <= s < n_slots:
                    keys.append(load_row(cache, bs, s, scrub=(li == 0 or scrub_extra)))
        k = np.stack(keys) if keys else np.zeros((0, 512))
        with np.errstate(invalid="ignore", over="ignore"):
            z = scale * (q[t] @ k.T)  # [H, n]
        for h in range(h_count):
            sk = None if sink is None else float(sink[h])
            out[t, h], lse[t, h], abs_mean[t, h] = _decode_head(z[h], k, sk)
    return out, lse, abs_mean


def _decode_head(z, k, sk):
    """(out [512], lse, abs_mean [512]) of one (t, h) from its scores z [n], keys k [n, 512] and
    sink sk (None: no sink)."""
    zeros = np.zeros(512)
    poisoned = bool(np.any(np.isnan(z) | (z == np.inf)))
    nan_out = poisoned or (sk is not None and math.isnan(sk))
    m = np.max(z) if z.size else -np.inf
    if poisoned:
        return np.full(512, np.nan), np.nan, zeros
    if m == -np.inf:  # no valid key, or every weight exp(-inf) = 0
        return (np.full(512, np.nan) if nan_out else zeros), np.inf, zeros
    w = np.exp(z - m)
    lse = m + np.log(w.sum())
    abs_mean = (w @ np.abs(k)) / w.sum()
    if nan_out:
        return np.full(512, np.nan), lse, abs_mean
    if sk == math.inf:
        return zeros, lse, abs_mean
    mm = m if sk is None else max(m, sk)
    p = np.exp(z - mm)
    den = p.sum() + (0.0 if sk is None else math.exp(sk - mm))
    return (p @ k / den if den > 0 else zeros), lse, abs_mean


def rope_inverse_abs_mean(a, c, s):
    """The accuracy scale of an output whose RoPE dims were rotated back (a [..., 64] pairs, c/s
    [..., 32]): an error (e_a, e_b) of a pair is at most (|c| e_a + |s| e_b, |s| e_a + |c| e_b) after
    the rotation, so A becomes |c| A_a + |s| A_b and |s| A_a + |c| A_b."""
    c, s = np.abs(np.asarray(c, np.float64)), np.abs(np.asarray(s, np.float64))
    x, y = a[..., 0::2], a[..., 1::2]
    out = np.empty(np.broadcast_shapes(a.shape, c.shape[:-1] + (64,)))
    out[..., 0::2] = c * x + s * y
    out[..., 1::2] = s * x + c * y
    return out


def decode_verdict(out_bits, ref, abs_mean, cosine_tol=5e-6):
    """The CONTRACT 9.9 accuracy contract, written here from the contract (the library's is
    include/sparsemla/verify.h, which also has the argument for the bound): NaN/+inf/-inf in the same
    places; every finite element within 2^-7 A + 2^-8 |ref| + 1e-6 (a non-finite A bounds nothing);
    the cosine difference over the whole output <= cosine_tol (0 when sum(ref^2) < 1e-12): 5e-6,
    or 2e-5 for a merge of bf16 rank outputs (CONTRACT 12.3: two stacked stores)."""
    out = bf16_to_f32(out_bits).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    a = np.asarray(abs_mean, dtype=np.float64)
    assert out.shape == ref.shape == a.shape, (out.shape, ref.shape, a.shape)
    special = ((np.isnan(out) != np.isnan(ref)) | (np.isposinf(out) != np.isposinf(ref))
               | (np.isneginf(out) != np.isneginf(ref)))
    fin = np.isfinite(out) & np.isfinite(ref)
    o, r = out[fin], ref[fin]
    d = np.abs(o - r)
    with np.errstate(invalid="ignore"):
        bound = np.where(np.isfinite(a[fin]), a[fin] / 128 + np.abs(r) / 256 + 1e-6, np.inf)
    bad = ~(d <= bound)
    norms = float((o * o + r * r).sum())
    cos = 0.0 if float((r * r).sum()) < 1e-12 or norms == 0 else 1 - 2 * float((o * r).sum()) / norms
    v = dict(special_mismatches=int(special.sum()), tolerance_failures=int(bad.sum()),
             max_abs_error=float(d.max()) if d.size else 0.0,
             max_bound_ratio=float((d / bound).max()) if d.size else 0.0, cosine_diff=cos)
    v["passed"] = v["special_mismatches"] == 0 and v["tolerance_failures"] == 0 and cos <= cosine_tol
    return v


def ragged(rows):
    """Python lists of slots per row -> (indices int32, indptr int32)."""
    indptr = np.zeros(len(rows) + 1, dtype=np.int32)
    indptr[1:] = np.cumsum([len(r) for r in rows])
    flat = [s for r in rows for s in r]
    return np.asarray(flat if flat else [0], dtype=np.int32), indptr


# ---- planners (CONTRACT 4.4 / 4.5) -------------------------------------------------------------------------------
def _iters(wm, we, s):
    it = 0
    if wm > 0:
        it += -(-(-(-wm // s)) // 32)
    if we > 0:
        it += -(-(-(-we // s)) // 32)
    return it


def plan_generic(t, h, wm, we, cu):
    if t == 0:
        return 1
    base = max(1, t * -(-h // 16))

    def waves(s):
        return -(-(base * s) // cu)
    best, best_cost = 1, None
    for s in range(1, 17):
        cost = waves(s) * (1 / s + 0.04)
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    if best > 1 and (wm > 0 or we > 0):
        for s in range(1, best):
            if waves(s) == waves(best) and _iters(wm, we, s) == _iters(wm, we, best):
                return s
    return best


def plan_specialised(t, h, wm, we, cu):
    if t == 0:
        return 1
    base = max(1, t * -(-h // 16))

    def waves(s):
        return -(-(base * s) // cu)
    s_ = min(32, max(1, -(-(2 * cu) // base)))
    if base >= 16 and s_ > 4 and _iters(wm, we, 4) <= 3:
        return 4
    if 16 <= base < 64:
        ow = max(1, cu // base)
        tw = 1 if _iters(wm, we, ow) <= 9 else 2
        s_ = min(s_, max(1, tw * cu // base))
    if base >= 16 and s_ > 1:
        for s in range(1, s_):
            if waves(s) == waves(s_) and _iters(wm, we, s) == _iters(wm, we, s_):
                return s
    return s_
