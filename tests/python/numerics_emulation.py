"""CPU emulation of the sparse-decode numerics (CONTRACT 4.2, 4.3, 4.3a), one switch per rounding point.

Pure numpy (+ ctypes for the platform's expf / logf in the rare near-tie cases, see `expf`). Used by
tests/python/test_numerics_emulation.py and, as a script, for the numerics study of docs/NUMERICS.md:

    scripts/numerics-study [--batch 8] [--quick] [--cells NAMES] [--rope]   (numpy only)

Everything is float64 except where a path rounds; fp32 steps are done in np.float32 in the path's
order where the order decides bits. The configuration `CPU_FAST` reproduces the library's CPU fast
path (src/cpu/decode_fast.cpp) bit for bit (out bits and lse bits); `GPU` models both CUDA paths
(src/cuda/generic/decode_partial*.cuh, src/cuda/sm90/decode_sm90.cu, src/cuda/common/decode_common.cuh);
`FLASHMLA` models FlashMLA's sm90 MODEL1 sparse decode and its combine as read from its source (no
code of it here). GPU and FLASHMLA can not be bit-exact on a CPU (tensor-core accumulation order,
MUFU.EX2): they round at the same points with correctly rounded fp32 operations instead, which is
~1e-7 relative per step, four orders below the ~1e-3 effects studied.

Rounding points (the `Numerics` fields):
  qk       Q.K order: "lanes4" (the CPU path: 4 fp32 lanes over d, then (l0+l2)+(l1+l3)) or "exact"
           (one rounding of the exact dot product to fp32: tensor cores, bf16 products are exact).
  q_fold   None, or fold scale*log2e into Q before Q.K and round it to "bf16" (a variant no path uses).
  exp_arg  "nat": exp(fp32(fp32(raw*scale) - m)) (CPU); "sub_mul": exp2(fp32(fp32(z - m) * log2e))
           with z = fp32(raw*scale) (our GPU kernels); "ffma": exp2(fma(raw, scale*log2e, -M)), M the
           running max in log2 units (FlashMLA).
  rescale  threshold in nats by which a tile's max must beat the running max m before m moves and
           acc, l are rescaled: 0 = eager (CPU path, FlashMLA, our GPU kernels), 8 = lazy (our GPU kernels before
           docs/NUMERICS.md's fix).
  tile     keys per online-softmax step: 32 (ours), 64 (FlashMLA, over main||extra blocks).
  p_round  probabilities before P.V: "bf16" (every path) or "none".
  l_from   "fp32": l sums the fp32 probabilities (every path); "bf16": l sums the rounded ones.
  partials "fp32" (every path) or "bf16" split accumulators.
  finish   "div" (CPU: o / max(L, 1e-30)), "recip" (GPU: o * (1 / max(L, 1e-30))), "flashmla"
           (O / L per split, lse in log2 units, the sink folded into the global lse).
  store    "bf16" (every path) or "none" (fp32 output, to measure the store's share).
  rope     "fused" (fp32 inverse RoPE before the one bf16 store) or "standalone" (bf16 store, rotate
           the bf16 values, store again), used only when positions are given.
  layout   "segments": S splits cut the main and the extra segment separately, tiles never straddle
           them (CONTRACT 4.3, ours); "concat": FlashMLA's pieces, contiguous runs of 64-key blocks over
           main (padded to whole blocks) || extra.
"""

import argparse
import ctypes
import ctypes.util
import dataclasses
import math
import os
import sys

import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
NO_MASS = -FLT_MAX  # score of an invalid key, m of a split without mass (CONTRACT 4.2, 4.3)
LOG2E = F32(1.4426950408889634)  # kLog2e of decode_common.cuh (FlashMLA's CUDART_L2E_F: same value)
DIM, NOPE, ROPE_PAIRS, TILES = 512, 448, 32, 7
ROW_BYTES, DATA_BYTES = 584, 576


# ---- bf16 (bit manipulation; ml_dtypes is not a dependency) -------------------------------------------
def bf16_bits(x):
    """fp32 -> bf16 bits, round to nearest even; NaN -> quiet NaN (float_to_bf16 of numerics.h)."""
    u = np.asarray(x, dtype=F32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16  # uint32 wraps only for NaN inputs
    return np.where(nan, (u >> 16) | 0x40, r).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(F32)


def round_bf16(x):
    return bf16_value(bf16_bits(x))


# ---- expf / logf with the platform libm's bits --------------------------------------------------------
_LIBM = None


def _libm():
    global _LIBM
    if _LIBM is None:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for name in ("expf", "logf", "exp2f"):
            f = getattr(lib, name)
            f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
        _LIBM = lib
    return _LIBM


def _f32_of_f64(y64, x, libm_name, window):
    """float64 results -> fp32 as a faithful libm would round them: np.float32(y64) (round to
    nearest) except where y64 lies within `window` ulp of a rounding tie, where the platform's own
    function decides: glibc's expf and logf are not correctly rounded (measured here on glibc 2.36:
    expf within 0.5015 ulp, wrong on ~6.5e-4 of inputs in [-20, 0]; logf within ~0.8 ulp), so expf
    asks libm within 0.01 ulp of a tie (~2% of calls) and logf within 0.35 ulp (lse only)."""
    y = y64.astype(F32)
    fin = np.isfinite(y) & (y != 0)
    ulp = np.spacing(np.abs(y).astype(F32)).astype(np.float64)
    frac = np.zeros_like(y64)
    frac[fin] = np.abs(y64[fin] - y[fin].astype(np.float64)) / ulp[fin]
    near = fin & (np.abs(frac - 0.5) < window)
    # tiny / subnormal results and the float underflow boundary: ask libm too
    near |= (np.abs(y64) < 1e-37) & (y64 != 0)
    if near.any():
        f = getattr(_libm(), libm_name)
        xs = x[near]
        y[near] = np.array([f(float(v)) for v in xs], dtype=F32)
    return y


def expf(x):
    """std::exp(float) of the library's CPU code, elementwise."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore", under="ignore"):
        return _f32_of_f64(np.exp(x.astype(np.float64)), x, "expf", 0.01)


def _f32_bits(u):
    return np.array(u, dtype=np.uint32).view(F32)


def exp_cpu_lanes(x):
    """The CPU fast path's vectorised exp of the probabilities at the baseline level (exp_lanes of
    src/cpu/decode_kernels.inc: no FMA, every step an fp32 operation), bit for bit. Constants by their
    bits, as the C++ float literals round them."""
    x = np.asarray(x, dtype=F32)
    log2e, ln2_hi, ln2_lo = _f32_bits(0x3FB8AA3B), _f32_bits(0x3F318000), _f32_bits(0xB95E8083)
    rnd = F32(12582912.0)  # 1.5 * 2^23
    with np.errstate(all="ignore"):
        xc = np.where(x > F32(-88), x, F32(-88)).astype(F32)  # NaN -> -88, fixed below
        xr = np.where(xc < F32(88), xc, F32(88)).astype(F32)
        n = (((xr * log2e).astype(F32) + rnd).astype(F32) - rnd).astype(F32)
        r = ((xr - (n * ln2_hi).astype(F32)).astype(F32) - (n * ln2_lo).astype(F32)).astype(F32)
        p = np.full_like(r, F32(1) / F32(5040))
        for c in (F32(1) / F32(720), F32(1) / F32(120), F32(1) / F32(24), F32(1) / F32(6),
                  F32(0.5), F32(1), F32(1)):
            p = ((p * r).astype(F32) + c).astype(F32)
        biased = ((n + rnd).astype(F32).view(np.uint32) - rnd.view(np.uint32) + np.uint32(127))
        e = (p * (biased.astype(np.uint32) << np.uint32(23)).view(F32)).astype(F32)
        e = np.where(x < _f32_bits(0xC2AEAC4F), F32(0), e)
        e = np.where(x > _f32_bits(0x42B17217), F32(np.inf), e)
        return np.where(np.isnan(x), x, e).astype(F32)


def logf(x):
    x = np.asarray(x, dtype=F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _f32_of_f64(np.log(x.astype(np.float64)), x, "logf", 0.35)


def exp2_gpu(x):
    """ex2.approx.ftz.f32 modelled as the correctly rounded 2^x, subnormal results flushed to 0."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore", under="ignore"):
        y = np.exp2(x.astype(np.float64)).astype(F32)
    return np.where(np.abs(y) < np.finfo(np.float32).tiny, F32(0), y)


def expf_gpu(x):
    """CUDA __expf(x) = ex2.approx(x * log2e)."""
    return exp2_gpu(np.asarray(x, dtype=F32) * LOG2E)


# ---- e4m3 / UE8M0 / the quantiser of the kit's caches -----------------------------------------------
def _e4m3_table():
    t = np.empty(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = math.nan
        else:
            v = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


E4M3 = _e4m3_table()
_E4M3_POS = E4M3[:127]  # bytes 0x00..0x7E: 0 .. 448, increasing


def e4m3_encode(y):
    """Nearest e4m3fn byte (ties to even mantissa) of finite |y| <= 448; sign kept."""
    y = np.asarray(y, dtype=np.float64)
    a = np.abs(y)
    hi = np.clip(np.searchsorted(_E4M3_POS, a, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    d_lo, d_hi = a - _E4M3_POS[lo], _E4M3_POS[hi] - a
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (pick | (np.signbit(y).astype(np.int64) << 7)).astype(np.uint8)


def kit_latents(rng, n):
    """The kit's latents: N(0,1) x exp(0.7 N(0,1)) per (token, 64-dim tile), fp32 -> bf16 bits."""
    x = rng.standard_normal((n, 8, 64)).astype(F32)
    mag = np.exp(F32(0.7) * rng.standard_normal((n, 8, 1)).astype(F32)).astype(F32)
    return bf16_bits((x * mag).reshape(n, DIM))


def quantize_kit(lat_bits):
    """FlashMLA's test quantiser, in words (CONTRACT 2.3's note): per 64-dim NoPE tile of the bf16 values,
    the scale is 2^ceil(log2(max(amax / 448, 1e-4))) (fp32 arithmetic), the bytes are e4m3 (nearest,
    ties to even) of x / scale, the code is the scale's biased exponent; RoPE dims stay bf16.
    Returns (nope bytes [n, 448], codes [n, 7], rope bf16 bits [n, 64])."""
    x = bf16_value(lat_bits)
    tiles = x[:, :NOPE].reshape(-1, TILES, 64)
    inv = np.max(np.abs(tiles), axis=-1).astype(F32) / F32(448.0)
    inv = np.maximum(inv, F32(1e-4))
    m, e = np.frexp(inv.astype(np.float64))
    e = np.where(m == 0.5, e - 1, e)  # ceil(log2 v), exact
    y = tiles.astype(np.float64) * np.ldexp(1.0, -e)[..., None]
    return e4m3_encode(y).reshape(-1, NOPE), (e + 127).astype(np.uint8), lat_bits[:, NOPE:].copy()


def dequant(nope, codes, rope_bits):
    """CONTRACT 2.1 decode of clean rows (no NaN bytes, codes 1..254): fp32 [n, 512]. Exact in bf16 for
    codes >= 8 (the only ones the kit's quantiser emits), so the kernels' bf16 K is the same."""
    n = nope.shape[0]
    scale = np.ldexp(1.0, codes.astype(np.int64) - 127)
    k = np.empty((n, DIM), dtype=F32)
    k[:, :NOPE] = (E4M3[nope].reshape(n, TILES, 64) * scale[..., None]).reshape(n, NOPE)
    k[:, NOPE:] = bf16_value(rope_bits)
    return k


# ---- paged cache bytes (CONTRACT 2.1), for calls into the library -------------------------------------
def write_cache(nope, codes, rope_bits, block_size, pad=0, pad_bytes=None):
    """uint8 [num_blocks, block_size*584 + pad]: slot i = (block i // bs, row i % bs). pad_bytes: the
    8th scale byte of every row (FlashMLA's quantiser leaves it uninitialised; readers ignore it)."""
    n = nope.shape[0]
    nb = -(-n // block_size)
    cache = np.zeros((nb, block_size * ROW_BYTES + pad), dtype=np.uint8)
    for i in range(n):
        b, p = divmod(i, block_size)
        row = cache[b, p * DATA_BYTES:(p + 1) * DATA_BYTES]
        row[:NOPE] = nope[i]
        row[NOPE:] = rope_bits[i].astype("<u2").view(np.uint8)
        sc = cache[b, block_size * DATA_BYTES + 8 * p:block_size * DATA_BYTES + 8 * p + 8]
        sc[:7] = codes[i]
        sc[7] = 0 if pad_bytes is None else pad_bytes[i]
    return cache


# ---- the emulation --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Numerics:
    qk: str = "lanes4"
    q_fold: object = None
    exp_arg: str = "nat"
    rescale: float = 0.0
    tile: int = 32
    p_round: str = "bf16"
    l_from: str = "fp32"
    partials: str = "fp32"
    finish: str = "div"
    store: str = "bf16"
    rope: str = "fused"
    layout: str = "segments"

    def but(self, **kw):
        return dataclasses.replace(self, **kw)


CPU_FAST = Numerics()
# The CUDA kernels: eager rescale by default (Tuning::rescale_lag, src/core/tuning.h);
# SPARSEMLA_RESCALE_LAG=<nats> changes the kernels and this model alike (measurement only).
GPU = Numerics(qk="exact", exp_arg="sub_mul", rescale=float(os.environ.get("SPARSEMLA_RESCALE_LAG") or 0),
               finish="recip")
# The kernels before docs/NUMERICS.md's fix (lazy 8 nats): the base of the study's variants.
GPU_LAZY8 = GPU.but(rescale=8.0)
FLASHMLA = Numerics(qk="exact", exp_arg="ffma", rescale=0.0, tile=64, finish="flashmla",
                    layout="concat")


def _scores(cfg, q, keys, scale):
    """raw [H, n] Q.K (before the scale) in fp32, or the scaled score for the CPU order."""
    if cfg.qk == "lanes4":
        qr = q.reshape(q.shape[0], 1, DIM // 4, 4)
        kr = keys.reshape(1, keys.shape[0], DIM // 4, 4)
        acc = np.zeros((q.shape[0], keys.shape[0], 4), dtype=F32)
        for d in range(DIM // 4):
            acc += qr[:, :, d, :] * kr[:, :, d, :]
        return (acc[..., 0] + acc[..., 2]) + (acc[..., 1] + acc[..., 3])
    return (q.astype(np.float64) @ keys.astype(np.float64).T).astype(F32)


# Rescale statistics of the GPU kernels' cost model: a tile rescales acc (128 fp32 multiplies per
# consumer thread) when any row of the group that shares the decision moved m: a warp's 16 head rows
# on sm90 (needs_rescale, __any_sync), the CTA's up to 64 heads on the generic path
# (__syncthreads_or). The first tile of a split counts (alpha = 0 there, the kernels multiply).
RESCALE_STATS = {"tiles": 0, "warp16": 0, "cta64": 0}


def _count_rescales(move):
    H = move.shape[0]
    RESCALE_STATS["tiles"] += 1
    for key, g in (("warp16", 16), ("cta64", 64)):
        n = -(-H // g)
        RESCALE_STATS[key] += float(np.mean([move[i * g:(i + 1) * g].any() for i in range(n)]))


def _split_state(cfg, q, keys, blocks, scale):
    """One split's online softmax over `blocks` (per tile: the indices of its valid keys).
    Returns (m, l, acc) per head; m in natural-log units, or log2 units with exp_arg == "ffma"
    (FlashMLA keeps M that way), -FLT_MAX for a head without mass."""
    H = q.shape[0]
    m = np.full(H, NO_MASS, dtype=F32)
    l = np.zeros(H, dtype=F32)
    acc = np.zeros((H, DIM), dtype=F32)
    base2 = cfg.exp_arg in ("sub_mul", "ffma")
    folded = cfg.q_fold == "bf16"
    if folded:  # scale (x log2e for the base-2 paths) folded into Q, rounded to bf16
        q = round_bf16(q * (F32(scale * LOG2E) if base2 else F32(scale)))
    sl2 = F32(scale * LOG2E)  # FlashMLA's sm_scale_div_log2
    log2_m = cfg.exp_arg == "ffma" or (folded and base2)  # m kept in log2 units
    thr = F32(cfg.rescale * float(LOG2E)) if log2_m else F32(cfg.rescale)
    for idx in blocks:
        if len(idx) == 0:
            continue
        kb = keys[idx]
        raw = _scores(cfg, q, kb, scale)
        # zt: the score in the units of m; bmax: the tile's max in those units
        if folded:
            zt = raw
            bmax = np.max(zt, axis=1)
        elif cfg.exp_arg == "ffma":
            zt = None
            bmax = (np.max(raw, axis=1) * sl2).astype(F32)
        else:
            zt = (F32(scale) * raw).astype(F32)
            bmax = np.max(zt, axis=1)
        # eager (thr 0): m moves whenever the tile beats it (CPU: m_new = fmax(m, max)); lazy: only
        # by more than thr (the first tile always moves: -FLT_MAX + thr == -FLT_MAX)
        move = bmax > (m + thr) if thr > 0 else bmax > m
        _count_rescales(move)
        m_use = np.where(move, bmax, m).astype(F32)
        first = m == NO_MASS
        with np.errstate(over="ignore"):  # first tile: -FLT_MAX - max (x log2e) -> -inf, alpha 0
            dm = np.where(move, (m - bmax).astype(F32), F32(0)).astype(F32)
            dm2 = np.where(first, -np.inf, dm * LOG2E).astype(F32)
        if cfg.exp_arg == "nat":  # the CPU: std::exp for alpha, its vectorised exp for p
            alpha = expf(dm)
            ex = exp_cpu_lanes if cfg.qk == "lanes4" else expf
            p = ex((zt - m_use[:, None]).astype(F32))
        elif cfg.exp_arg == "sub_mul" and not log2_m:
            alpha = exp2_gpu(dm2)
            p = exp2_gpu(((zt - m_use[:, None]).astype(F32) * LOG2E).astype(F32))
        elif zt is not None:  # log2 units already (folded Q)
            alpha = exp2_gpu(dm)
            p = exp2_gpu((zt - m_use[:, None]).astype(F32))
        else:  # FlashMLA: one FFMA raw * scale_log2 - M, then exp2
            alpha = exp2_gpu(dm)
            p = exp2_gpu((raw.astype(np.float64) * float(sl2)
                          - m_use[:, None].astype(np.float64)).astype(F32))
        alpha = np.where(first, F32(0), alpha).astype(F32)
        p = p.astype(F32)
        if cfg.qk == "lanes4":  # CPU: key j into lane j % 4 in key order, then (l0 + l2) + (l1 + l3)
            lanes = np.zeros((H, 4), dtype=F32)
            for j in range(p.shape[1]):
                lanes[:, j % 4] = (lanes[:, j % 4] + p[:, j]).astype(F32)
            psum = ((lanes[:, 0] + lanes[:, 2]).astype(F32) +
                    (lanes[:, 1] + lanes[:, 3]).astype(F32)).astype(F32)
        else:
            psum = np.sum(p.astype(np.float64), axis=1).astype(F32)
        pr = round_bf16(p) if cfg.p_round == "bf16" else p
        if cfg.l_from == "bf16":
            psum = np.sum(pr.astype(np.float64), axis=1).astype(F32)
        l = ((l * alpha).astype(F32) + psum).astype(F32)
        m = m_use
        if cfg.qk == "lanes4":  # CPU: acc*alpha, then the keys in order, fp32
            a = (acc * alpha[:, None]).astype(F32)
            for j in range(kb.shape[0]):
                a = (a + pr[:, j:j + 1] * kb[j][None, :]).astype(F32)
            acc = a
        else:  # tensor-core P.V: the tile's exact contribution rounded once, then added
            acc = ((acc * alpha[:, None]).astype(F32) +
                   (pr.astype(np.float64) @ kb.astype(np.float64)).astype(F32)).astype(F32)
    # our combine works in natural-log units, FlashMLA's in log2 units
    if log2_m and cfg.finish != "flashmla":
        m = np.where(m == NO_MASS, NO_MASS, (m / LOG2E).astype(F32)).astype(F32)
    elif not log2_m and cfg.finish == "flashmla":
        m = np.where(m == NO_MASS, NO_MASS, (m * LOG2E).astype(F32)).astype(F32)
    sealed = np.where(l == 0, NO_MASS, m).astype(F32)
    return sealed, l, acc


def _finish(cfg, parts, sink_h, cs):
    """CONTRACT 4.3 (or FlashMLA's) combine of the splits of one token: parts = [(m, l, acc)], sink_h [H]
    or None, cs (cos [32], sin [32]) or None. Returns (out fp32 before the store, lse fp32 [H])."""
    H = parts[0][0].shape[0]
    ms = np.stack([p[0] for p in parts])  # [S, H]
    ls = np.stack([p[1] for p in parts])
    accs = np.stack([p[2] for p in parts])  # [S, H, 512]
    if cfg.finish == "flashmla":
        return _finish_flashmla(ms, ls, accs, sink_h, cs)
    gpu = cfg.finish == "recip"
    ex = expf_gpu if gpu else expf
    m_keys = np.full(H, NO_MASS, dtype=F32)
    for s in range(len(parts)):
        m_keys = np.fmax(m_keys, ms[s])
    m_all = np.fmax(m_keys, sink_h) if sink_h is not None else m_keys
    den = np.zeros(H, dtype=F32)
    w = np.zeros_like(ms)
    for s in range(len(parts)):
        w[s] = np.where(ms[s] == NO_MASS, F32(0), ex((ms[s] - m_all).astype(F32)))
        den = (den + (w[s] * ls[s]).astype(F32)).astype(F32)
    if sink_h is not None:
        with np.errstate(invalid="ignore"):
            den = (den + ex((sink_h - m_all).astype(F32))).astype(F32)
    lk = np.zeros(H, dtype=F32)
    for s in range(len(parts)):
        term = (ex((ms[s] - m_keys).astype(F32)) * ls[s]).astype(F32)
        lk = (lk + np.where(ms[s] == NO_MASS, F32(0), term)).astype(F32)
    with np.errstate(divide="ignore"):
        lse = np.where(lk == 0, F32(np.inf), (m_keys + logf(lk)).astype(F32)).astype(F32)
    o = np.zeros((H, DIM), dtype=F32)
    if gpu:
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = (F32(1) / np.fmax(den, F32(1e-30))).astype(F32)
            factor = np.where(den > 0, inv, F32(0)).astype(F32)
        for s in range(len(parts)):
            c = (w[s] * factor).astype(F32)
            act = (ms[s] != NO_MASS)[:, None]
            fma = (o.astype(np.float64) + c[:, None].astype(np.float64) * accs[s]).astype(F32)
            o = np.where(act, fma, o)
    else:
        for s in range(len(parts)):
            act = (w[s] != 0)[:, None]
            o = np.where(act, (o + (w[s][:, None] * accs[s]).astype(F32)).astype(F32), o)
        o = (o / np.fmax(den, F32(1e-30))[:, None]).astype(F32)
    if cs is not None:
        o = _inverse_rope(cfg, o, cs)
    o = np.where((den > 0)[:, None], o, F32(0)).astype(F32)  # rows without mass: exact +0
    return o, lse


def _inverse_rope(cfg, o, cs):
    c, s = cs
    o = o.copy()
    if cfg.rope == "standalone":
        o = round_bf16(o)
    a, b = o[:, NOPE::2].copy(), o[:, NOPE + 1::2].copy()
    o[:, NOPE::2] = ((a * c).astype(F32) + (b * s).astype(F32)).astype(F32)
    o[:, NOPE + 1::2] = ((b * c).astype(F32) - (a * s).astype(F32)).astype(F32)
    return o


def _finish_flashmla(ms, ls, accs, sink_h, cs):
    """FlashMLA: a single piece scales O by 1/(L + 2^(sink*log2e - M)); several pieces store O/L
    (fp32) and lse2 = log2 L + M, and the combine weighs them by 2^(lse2_s - lse2) with the sink
    folded into the global lse2 as log2(1 + 2^(sink*log2e - lse2))."""
    S, H = ms.shape  # m in log2 units here (exp_arg "ffma")
    sink2 = (sink_h * LOG2E).astype(F32) if sink_h is not None else None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if S == 1:
            m, l = ms[0], ls[0]
            sk = exp2_gpu((sink2 - m).astype(F32)) if sink2 is not None else F32(0)
            sc = np.where(l == 0, F32(0), (F32(1) / (l + sk).astype(F32)).astype(F32))
            o = (accs[0] * sc[:, None]).astype(F32)
            nat = (np.log(l.astype(np.float64)) + m / np.log2(np.e)).astype(F32)
            lse = np.where(l == 0, F32(np.inf), nat)
        else:
            lse2 = np.where(ls == 0, F32(-np.inf), (np.log2(ls.astype(np.float64)) + ms).astype(F32))
            scaled = (accs / np.where(ls == 0, F32(1), ls)[..., None]).astype(F32)
            data = np.where((ls == 0)[..., None], F32(0), scaled)
            mx = np.max(lse2, axis=0)
            mx = np.where(mx == -np.inf, F32(0), mx)
            ssum = np.sum(exp2_gpu((lse2 - mx).astype(F32)).astype(np.float64), axis=0).astype(F32)
            glob = (np.log2(ssum.astype(np.float64)) + mx).astype(F32)
            glob = np.where(ssum == 0, F32(np.inf), glob).astype(F32)
            lse = (glob / LOG2E).astype(F32)
            if sink2 is not None:
                fold = np.log2(1 + exp2_gpu((sink2 - glob).astype(F32)).astype(np.float64))
                glob = np.where(glob != np.inf, (glob + fold).astype(F32), glob)
            wts = exp2_gpu((lse2 - glob).astype(F32))
            o = np.sum(wts[..., None].astype(np.float64) * data, axis=0).astype(F32)
    if cs is not None:
        o = _inverse_rope(Numerics(), o, cs)
    return o, lse


def decode_token(cfg, q, keys, main_valid, extra_valid, splits, scale, sink=None, cs=None):
    """One query token. q fp32 [H, 512] (bf16 values); keys fp32 [n_main + n_extra, 512] (the rows the
    two list rows reference, in list order); main_valid / extra_valid: bool per list position;
    splits: S (layout "segments": each segment cut into S ranges, CONTRACT 4.3) or, for "concat",
    the number of pieces over the concatenated main||extra tile list. Returns (out bf16 bits or fp32
    [H, 512], lse fp32 [H])."""
    n_main = len(main_valid)
    tile = cfg.tile
    pieces = []
    if cfg.layout == "concat":
        # FlashMLA: main list padded to whole 64-key blocks, then the extra list's blocks; pieces
        # are contiguous block ranges of this concatenation.
        nbm = max(1, -(-n_main // tile))
        blocks = []
        for b in range(nbm):
            pos = np.arange(b * tile, min((b + 1) * tile, n_main))
            blocks.append(pos[main_valid[pos]] if len(pos) else pos)
        nbe = -(-len(extra_valid) // tile)
        for b in range(nbe):
            pos = np.arange(b * tile, min((b + 1) * tile, len(extra_valid)))
            blocks.append(n_main + pos[extra_valid[pos]])
        per = -(-len(blocks) // splits)
        pieces = [blocks[i:i + per] for i in range(0, len(blocks), per)]
    else:
        for s in range(splits):
            blocks = []
            for valid, base in ((main_valid, 0), (extra_valid, n_main)):
                n = len(valid)
                c = -(-n // splits)
                b, e = min(s * c, n), min((s + 1) * c, n)
                for t0 in range(b, e, tile):
                    pos = np.arange(t0, min(t0 + tile, e))
                    blocks.append(base + pos[valid[pos]])
            pieces.append(blocks)
    parts = [_split_state(cfg, q, keys, blocks, scale) for blocks in pieces]
    if cfg.partials == "bf16" and len(parts) > 1:  # split accumulators stored as bf16
        parts = [(m, l, round_bf16(acc)) for m, l, acc in parts]
    o, lse = _finish(cfg, parts, sink, cs)
    if cfg.store == "bf16":
        if cs is not None and cfg.rope == "standalone":
            o = o.copy()
        return bf16_bits(o), lse
    return o, lse


# ---- the library's call, emulated -----------------------------------------------------------------
def _cache_rows(cache, block_size, slots):
    """(keys fp32 [n, 512], valid [n]) of global slots in a uint8 cache [num_blocks, >= bs*584]."""
    nb = cache.shape[0]
    slots = np.asarray(slots, dtype=np.int64)
    valid = (slots >= 0) & (slots < nb * block_size)
    keys = np.zeros((len(slots), DIM), dtype=F32)
    for i in np.nonzero(valid)[0]:
        b, p = divmod(int(slots[i]), block_size)
        row = cache[b, p * DATA_BYTES:(p + 1) * DATA_BYTES]
        codes = cache[b, block_size * DATA_BYTES + 8 * p:block_size * DATA_BYTES + 8 * p + 7]
        keys[i] = dequant(row[None, :NOPE], codes[None], row[NOPE:].view("<u2")[None])[0]
    return keys, valid


def sparse_decode(cfg, q_bits, main_cache, main_block_size, main_indices, main_indptr,
                  extra_cache=None, extra_block_size=None, extra_indices=None, extra_indptr=None,
                  sink=None, scale=512 ** -0.5, num_splits=1, positions=None, rope=None):
    """sparsemla.sparse_decode (numpy arrays, clean caches) under numerics cfg: (out bf16 bits
    [T, H, 512], lse fp32 [T, H]). With CPU_FAST it must give the CPU path's bits exactly."""
    T, H = q_bits.shape[0], q_bits.shape[1]
    q = bf16_value(q_bits)
    scale = F32(scale)
    sink = None if sink is None else np.asarray(sink, dtype=F32)
    out = np.zeros((T, H, DIM), dtype=np.uint16 if cfg.store == "bf16" else F32)
    lse = np.zeros((T, H), dtype=F32)
    for t in range(T):
        mk, mv = _cache_rows(main_cache, main_block_size,
                             main_indices[main_indptr[t]:main_indptr[t + 1]])
        if extra_cache is not None:
            ek, ev = _cache_rows(extra_cache, extra_block_size,
                                 extra_indices[extra_indptr[t]:extra_indptr[t + 1]])
        else:
            ek, ev = np.zeros((0, DIM), dtype=F32), np.zeros(0, dtype=bool)
        cs = None
        if positions is not None:
            row = np.asarray(rope, dtype=F32)[int(positions[t])]
            cs = (row[:ROPE_PAIRS], row[ROPE_PAIRS:2 * ROPE_PAIRS])
        out[t], lse[t] = decode_token(cfg, q[t], np.concatenate([mk, ek]), mv, ev, num_splits,
                                      scale, sink, cs)
    return out, lse


# ---- the study ------------------------------------------------------------------------------------
def reference_token(q, keys, scale, sink=None, cs=None):
    """float64 CONTRACT 4.2 over the dequantised keys (all valid): (out [H, 512], lse [H])."""
    z = (q.astype(np.float64) @ keys.astype(np.float64).T) * float(scale)
    m = np.max(z, axis=1, keepdims=True)
    e = np.exp(z - m)
    den = e.sum(axis=1)
    lse = m[:, 0] + np.log(den)
    o = (e @ keys.astype(np.float64)) / den[:, None]
    if sink is not None:
        o = o / (1.0 + np.exp(sink.astype(np.float64) - lse))[:, None]
    if cs is not None:
        c, s = cs[0].astype(np.float64), cs[1].astype(np.float64)
        a, b = o[:, NOPE::2].copy(), o[:, NOPE + 1::2].copy()
        o[:, NOPE::2] = a * c + b * s
        o[:, NOPE + 1::2] = b * c - a * s
    return o, lse


@dataclasses.dataclass
class Cell:
    name: str
    heads: int
    topk: int
    ours_s: int      # split count of the sm90 path (plan_sm90_tuned at 132 SMs; the kit's B sets it)
    generic_s: int   # split count of the generic path (plan_generic at 132 SMs)
    flashmla_p: int  # FlashMLA's pieces per request (its schedule, INCUMBENT-SM90.md section 1)


# The kit's standard window-128 + C4 top-k cells. Only the split counts depend on the kit's batch
# B; the emulation draws its own tokens (each with its own 128 + top-k rows).
CELLS = [
    Cell("h64-c4-512-B1", 64, 512, 16, 16, 10),
    Cell("h64-c4-512-B8", 64, 512, 10, 4, 10),
    Cell("h64-c4-512-B32", 64, 512, 4, 1, 3),
    Cell("h64-c4-512-B128", 64, 512, 1, 1, 1),
    Cell("h128-c4-1024-B1", 128, 1024, 16, 16, 18),
    Cell("h128-c4-1024-B8", 128, 1024, 8, 2, 6),
    Cell("h128-c4-1024-B32", 128, 1024, 2, 1, 2),
    Cell("h128-c4-1024-B128", 128, 1024, 1, 1, 1),
]


def make_cell_data(rng, cell, tokens, window=128, rope_positions=False):
    """Per token: q fp32 [H, 512] (bf16 of N(0,1)), keys [window + topk, 512] (kit latents, kit
    quantiser, dequantised: each token's own rows), sink fp32 [H] ~ N(0,1), cos/sin or None."""
    data = []
    for _ in range(tokens):
        q = bf16_value(bf16_bits(rng.standard_normal((cell.heads, DIM)).astype(F32)))
        lat = kit_latents(rng, window + cell.topk)
        keys = dequant(*quantize_kit(lat))
        sink = rng.standard_normal(cell.heads).astype(F32)
        cs = None
        if rope_positions:
            ang = rng.uniform(0, 2 * np.pi, ROPE_PAIRS)
            cs = (np.cos(ang).astype(F32), np.sin(ang).astype(F32))
        data.append((q, keys, sink, cs))
    return data


def rel_fro(err_sq, ref_sq):
    return math.sqrt(err_sq / ref_sq)


def measure(cfg, cell, data, window=128, splits=None, scale=F32(512 ** -0.5), refs=None):
    """rel-Frobenius error of out and lse vs float64, over the tokens of data."""
    es = rs = el = rl = 0.0
    for i, (q, keys, sink, cs) in enumerate(data):
        ro, rlse = refs[i] if refs is not None else reference_token(q, keys, scale, sink, cs)
        mv = np.ones(window, dtype=bool)
        ev = np.ones(keys.shape[0] - window, dtype=bool)
        s = splits
        if s is None:
            s = cell.flashmla_p if cfg.layout == "concat" else cell.ours_s
        o, lse = decode_token(cfg, q, keys, mv, ev, s, scale, sink, cs)
        of = bf16_value(o).astype(np.float64) if cfg.store == "bf16" else o.astype(np.float64)
        es += float(np.sum((of - ro) ** 2))
        rs += float(np.sum(ro ** 2))
        el += float(np.sum((lse.astype(np.float64) - rlse) ** 2))
        rl += float(np.sum(rlse ** 2))
    return rel_fro(es, rs), rel_fro(el, rl)


def outputs_differ(cfg_a, cfg_b, cell, data, window=128, scale=F32(512 ** -0.5)):
    """rel-Frobenius difference of two paths' outputs on the same data (b the baseline), as the kit
    reports sparsemla vs FlashMLA."""
    num = den = 0.0
    for q, keys, sink, cs in data:
        mv, ev = np.ones(window, dtype=bool), np.ones(keys.shape[0] - window, dtype=bool)
        o = []
        for cfg in (cfg_a, cfg_b):
            s = cell.flashmla_p if cfg.layout == "concat" else cell.ours_s
            bits = decode_token(cfg, q, keys, mv, ev, s, scale, sink, cs)[0]
            o.append(bf16_value(bits).astype(np.float64))
        num += float(np.sum((o[0] - o[1]) ** 2))
        den += float(np.sum(o[1] ** 2))
    return rel_fro(num, den)


def variants():
    """(label, numerics) rows of the study table: the three paths, then one point moved at a time."""
    return [
        ("ours GPU (lazy 8 nats, tile 32)", GPU_LAZY8),
        ("ours GPU, generic path's S", GPU_LAZY8),
        ("ours CPU fast path", CPU_FAST),
        ("FlashMLA", FLASHMLA),
        ("GPU, eager rescale (threshold 0)", GPU_LAZY8.but(rescale=0.0)),
        ("GPU, lazy threshold 1 nat", GPU_LAZY8.but(rescale=1.0)),
        ("GPU, lazy threshold 2 nats", GPU_LAZY8.but(rescale=2.0)),
        ("GPU, tile 64", GPU_LAZY8.but(tile=64)),
        ("GPU, exp2 arg by one ffma (FlashMLA's)", GPU_LAZY8.but(exp_arg="ffma")),
        ("GPU, ffma arg + FlashMLA's combine and sink", GPU_LAZY8.but(exp_arg="ffma", finish="flashmla")),
        ("GPU, Q*scale*log2e folded into Q, bf16", GPU_LAZY8.but(q_fold="bf16")),
        ("GPU, l sums the bf16 P", GPU_LAZY8.but(l_from="bf16")),
        ("GPU, lazy 2 nats + l sums the bf16 P", GPU_LAZY8.but(rescale=2.0, l_from="bf16")),
        ("GPU, bf16 split partials", GPU_LAZY8.but(partials="bf16")),
        ("GPU, finish by division (CPU's)", GPU_LAZY8.but(finish="div")),
        ("GPU, no P rounding", GPU_LAZY8.but(p_round="none")),
        ("GPU, fp32 store (no bf16 out)", GPU_LAZY8.but(store="none")),
        ("FlashMLA, lazy 8 nats", FLASHMLA.but(rescale=8.0)),
        ("FlashMLA, no P rounding", FLASHMLA.but(p_round="none")),
        ("GPU, eager + l sums the bf16 P", GPU_LAZY8.but(rescale=0.0, l_from="bf16")),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8, help="query tokens per cell (default 8)")
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="h64 B1/B128 and h128 B8 cells only")
    ap.add_argument("--cells", default="", help="comma list of cell names")
    ap.add_argument("--rope", action="store_true", help="also the inverse-RoPE epilogue variants")
    a = ap.parse_args(argv)
    cells = CELLS
    if a.cells:
        cells = [c for c in CELLS if c.name in a.cells.split(",")]
    elif a.quick:
        cells = [c for c in CELLS if c.name in ("h64-c4-512-B1", "h64-c4-512-B128", "h128-c4-1024-B8")]
    rows = variants()
    table, rates = {}, {}
    for cell in cells:
        rng = np.random.default_rng(a.seed + CELLS.index(cell))
        data = make_cell_data(rng, cell, a.batch)
        refs = [reference_token(q, k, F32(512 ** -0.5), s, cs) for q, k, s, cs in data]
        for label, cfg in rows:
            for k in RESCALE_STATS:
                RESCALE_STATS[k] = 0
            sp = cell.generic_s if "generic path's S" in label else None
            table[(label, cell.name)] = measure(cfg, cell, data, splits=sp, refs=refs)
            n = max(RESCALE_STATS["tiles"], 1)
            rates[(label, cell.name)] = (RESCALE_STATS["warp16"] / n, RESCALE_STATS["cta64"] / n)
            print(f"{cell.name:18s} {label:38s} out {table[(label, cell.name)][0]:.3e}"
                  f"  lse {table[(label, cell.name)][1]:.2e}", file=sys.stderr, flush=True)
    print(f"| variant (rel-F of out vs fp64; T = {a.batch} tokens per cell) | "
          + " | ".join(c.name for c in cells) + " |")
    print("|---|" + "---|" * len(cells))
    for label, _ in rows:
        print(f"| {label} | " + " | ".join(f"{table[(label, c.name)][0]:.3e}" for c in cells) + " |")
    print()
    print("| lse rel-F | " + " | ".join(c.name for c in cells) + " |")
    print("|---|" + "---|" * len(cells))
    for label in ("ours GPU (lazy 8 nats, tile 32)", "ours CPU fast path", "FlashMLA"):
        print(f"| {label} | " + " | ".join(f"{table[(label, c.name)][1]:.2e}" for c in cells) + " |")
    print()
    print("| rel-F difference to FlashMLA's output (the kit's 'vs FlashMLA' column) | "
          + " | ".join(c.name for c in cells) + " |")
    print("|---|" + "---|" * len(cells))
    for label, cfg in (("ours GPU (lazy 8 nats, tile 32)", GPU_LAZY8), ("GPU, eager rescale", GPU_LAZY8.but(rescale=0.0)),
                       ("ours CPU fast path", CPU_FAST)):
        vals = []
        for cell in cells:
            rng = np.random.default_rng(a.seed + CELLS.index(cell))
            vals.append(outputs_differ(cfg, FLASHMLA, cell, make_cell_data(rng, cell, a.batch)))
        print(f"| {label} | " + " | ".join(f"{v:.2e}" for v in vals) + " |")
    print()
    print("| tiles that rescale acc: sm90 (any of a warp's 16 rows) / generic (any of 64 heads) | "
          + " | ".join(c.name for c in cells) + " |")
    print("|---|" + "---|" * len(cells))
    for label, cfg in rows:
        if cfg.finish == "flashmla" or cfg.exp_arg == "nat":
            continue
        if label.startswith(("ours", "GPU, eager", "GPU, lazy")):
            cols = [f"{rates[(label, c.name)][0]:.2f} / {rates[(label, c.name)][1]:.2f}" for c in cells]
            print(f"| {label} | " + " | ".join(cols) + " |")
    if a.rope:
        cell = cells[0]
        rng = np.random.default_rng(a.seed + 100)
        data = make_cell_data(rng, cell, a.batch, rope_positions=True)
        print()
        print(f"| inverse-RoPE epilogue ({cell.name}, positions given) | out rel-F |")
        print("|---|---|")
        for label, cfg in (("GPU, fused fp32 rotation", GPU),
                           ("GPU, standalone (bf16, rotate, bf16)", GPU.but(rope="standalone"))):
            print(f"| {label} | {measure(cfg, cell, data)[0]:.3e} |")


if __name__ == "__main__":
    main()
