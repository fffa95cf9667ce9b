"""bf16 helpers, the quantiser (CONTRACT 2.3), the row decoders (CONTRACT 2.1/2.2) and the RoPE helpers."""

import math

import numpy as np
import pytest

import reference as ref
import sparsemla

SPECIAL_F32 = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 1e-40, -1e-40,
                        3.3895314e38, 1.00390625, 1.01171875, 1.0078125, 448.0, 1e-4],
                       dtype=np.float32)


def test_bf16_helpers_match_reference_rounding_on_random_and_special_values(rng):
    x = np.concatenate([SPECIAL_F32, rng.standard_normal(2000).astype(np.float32) * 10,
                        rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32)])
    slow = ref.bf16_round_bits(x)
    assert np.array_equal(ref.bf16_round_bits_fast(x), slow)  # the fast reference itself
    got = sparsemla.float_to_bf16_bits(x)
    assert got.dtype == np.uint16
    assert np.array_equal(got, slow)
    back = sparsemla.bf16_bits_to_float(slow)
    assert np.array_equal(back.view(np.uint32), slow.astype(np.uint32) << 16)


def _edge_tiles(rng):
    """Tiles (float32, bf16-exact) covering the CONTRACT 9.1 quantiser edge cases."""
    tiles = []
    tiles.append(rng.standard_normal(64) * 1e-6)                     # amax below 1e-4
    t = rng.standard_normal(64)
    t[3] = 448.0 * 2.0 ** -3
    tiles.append(np.clip(t, -56, 56))                                # amax exactly 448*2^k
    t = rng.standard_normal(64)
    t[5] = 448.0 * 2.0 ** 2 * 1.0078125                              # just above 448*2^k
    tiles.append(t)
    tiles.append(np.clip(rng.standard_normal(64), -3, 3) * 1e38)      # huge (e near the top)
    t = rng.standard_normal(64)
    t[7], t[8] = -0.0, 0.0
    tiles.append(t)                                                  # signed zeros
    t = rng.standard_normal(64)
    t[9] = np.nan
    tiles.append(t)                                                  # NaN ignored by amax
    tiles.append(np.full(64, np.nan))                                # all NaN: amax 1e-4
    t = rng.standard_normal(64)
    t[1], t[2] = np.inf, np.nan
    tiles.append(t)                                                  # +inf: e = +inf
    t = rng.standard_normal(64)
    t[4] = -np.inf
    tiles.append(t)
    tiles.append(rng.standard_normal(64) * 2.0 ** -20)               # tiny: subnormal e4m3
    tiles.append(np.zeros(64) + 2.0 ** -9 * 1e-4 / 448)              # values rounding to 0
    for _ in range(8):
        tiles.append(rng.standard_normal(64) * 10.0 ** rng.uniform(-3, 4))
    x = np.stack(tiles).astype(np.float32)
    return ref.bf16_round(x)


@pytest.mark.parametrize("sanitise", [True, False])
def test_quantize_matches_reference_bit_exact_on_edge_tiles(rng, sanitise):
    x = _edge_tiles(rng)
    bits = ref.bf16_round_bits_fast(x)
    got_bytes, got_codes = sparsemla.quantize(bits, block=64, sanitise=sanitise)
    want_bytes, want_codes = ref.quantize_rows(x, 64, 254 if sanitise else 255)
    assert np.array_equal(got_bytes, want_bytes)
    assert np.array_equal(got_codes[:, 0], want_codes[:, 0])
    assert not np.any((got_bytes & 0x7F) == 0x7F), "the quantiser never emits a NaN byte"
    inf_rows = np.isinf(x).any(axis=1)
    assert np.all(got_codes[inf_rows, 0] == (254 if sanitise else 255))
    assert np.all((got_codes[~inf_rows, 0] >= 105) & (got_codes[~inf_rows, 0] <= 247))


def test_quantize_nope_rows_448_wide_and_batched_shapes(rng):
    x = ref.bf16_round((rng.standard_normal((3, 5, 448)) * rng.uniform(0.01, 50, (3, 5, 1)))
                       .astype(np.float32))
    got_bytes, got_codes = sparsemla.quantize(ref.bf16_round_bits_fast(x))
    assert got_bytes.shape == (3, 5, 448) and got_codes.shape == (3, 5, 7)
    want_bytes, want_codes = ref.quantize_rows(x.reshape(15, 448), 64, 254)
    assert np.array_equal(got_bytes.reshape(15, 448), want_bytes)
    assert np.array_equal(got_codes.reshape(15, 7), want_codes)


def test_quantize_indexer_rows_bytes_and_power_of_two_scales(rng):
    x = ref.bf16_round((rng.standard_normal((6, 128)) * rng.uniform(1e-3, 100, (6, 1)))
                       .astype(np.float32))
    x[4, 7] = np.inf
    x[5] = ref.bf16_round(x[5] * np.float32(1e-7))
    got_bytes, got_scale = sparsemla.quantize_indexer(ref.bf16_round_bits_fast(x))
    for r in range(6):
        b, _ = ref.quantize_tile(x[r], 255)
        assert np.array_equal(got_bytes[r], b)
        amax = max(float(np.nanmax(np.abs(x[r]))), float(np.float32(1e-4)))
        e = ref.quant_exponent(amax)
        assert got_scale[r] == (np.inf if math.isinf(e) else 2.0 ** e)


def test_quantize_rejects_bad_arguments_naming_them():
    with pytest.raises(sparsemla.Error, match="argument 'x'.*bf16"):
        sparsemla.quantize(np.zeros((2, 64), dtype=np.float32))
    with pytest.raises(sparsemla.Error, match="argument 'block'"):
        sparsemla.quantize(np.zeros((2, 96), dtype=np.uint16), block=64)


@pytest.mark.parametrize("block_size,pad", [(1, 0), (2, 16), (61, 0), (64, 576 * 2)])
def test_dequantize_rows_every_byte_and_code_exact(rng, block_size, pad):
    cache = ref.random_cache(rng, 3, block_size, pad)
    n = 3 * block_size
    slot = int(rng.integers(0, n))
    nope = np.resize(np.arange(256, dtype=np.uint8), 448)  # every e4m3 byte, NaN ones included
    codes = np.array([0, 1, 127, 200, 254, 255, 118], dtype=np.uint8)
    rope = ref.bf16_round_bits_fast(rng.standard_normal(64).astype(np.float32))
    rope[5] = 0x7FC0  # NaN RoPE
    ref.store_row(cache, block_size, slot, nope, codes, rope)
    slots = np.array([slot, (slot + 1) % n, 0, n - 1], dtype=np.int64)
    for scrub in (True, False):
        got = sparsemla.dequantize_rows(cache, slots, block_size=block_size, scrub=scrub)
        want = np.stack([ref.load_row(cache, block_size, s, scrub) for s in slots])
        assert got.dtype == np.float32 and got.shape == (4, 512)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        fin = ~np.isnan(want)
        assert np.array_equal(got[fin].astype(np.float64), want[fin])
    assert not np.isnan(sparsemla.dequantize_rows(cache, slots, block_size=block_size)).any()


def test_dequantize_rows_takes_block_size_from_a_3d_view(rng):
    cache = ref.random_cache(rng, 4, 16)
    slots = rng.integers(0, 64, 9).astype(np.int64)
    a = sparsemla.dequantize_rows(cache.reshape(4, 16, 584), slots)
    b = sparsemla.dequantize_rows(cache, slots, block_size=16)
    assert np.array_equal(a, b)
    with pytest.raises(sparsemla.Error, match="block_size"):
        sparsemla.dequantize_rows(cache, slots)
    with pytest.raises(sparsemla.Error, match="slot"):
        sparsemla.dequantize_rows(cache, np.array([64], dtype=np.int64), block_size=16)


@pytest.mark.parametrize("layout", ["normal", "shuffle"])
def test_dequantize_indexer_rows_both_layouts(rng, layout):
    bs, nb = 16, 3
    cache = rng.integers(0, 256, size=(nb, bs * 132 + 32), dtype=np.uint8)
    scales = (2.0 ** rng.integers(-10, 5, size=(nb, bs))).astype(np.float32)
    for b in range(nb):
        cache[b, bs * 128:bs * 132] = scales[b].view(np.uint8)
    slots = rng.integers(0, nb * bs, 20).astype(np.int64)
    got = sparsemla.dequantize_indexer_rows(cache, slots, block_size=bs, layout=layout)
    for i, s in enumerate(slots):
        b, p = divmod(int(s), bs)
        d = np.arange(128)
        if layout == "normal":
            off = p * 128 + d
        else:
            off = (p // 16) * 2048 + (p % 16) * 16 + (d // 16) * 256 + d % 16
        want = ref.E4M3[cache[b, off]] * float(scales[b, p])
        assert np.array_equal(np.isnan(got[i]), np.isnan(want))
        fin = ~np.isnan(want)
        assert np.array_equal(got[i][fin].astype(np.float64), want[fin])


@pytest.mark.parametrize("layer", ["window", "compressed"])
def test_build_rope_table_matches_spec_frequencies(layer):
    got = sparsemla.build_rope_table(3000, layer)
    if layer == "window":
        want = ref.rope_table(3000, theta=10000.0)
    else:
        want = ref.rope_table(3000, theta=160000.0, yarn=True)
    assert got.shape == (3000, 64) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    custom = sparsemla.build_rope_table(10, "custom", theta=500.0)
    np.testing.assert_allclose(custom, ref.rope_table(10, theta=500.0), rtol=0, atol=2e-6)


def test_inverse_rope_in_place_matches_fp32_reference(rng):
    t, h = 5, 3
    table = ref.rope_table(100, theta=160000.0, yarn=True)
    x = ref.bf16_round_bits_fast(rng.standard_normal((t, h, 512)).astype(np.float32))
    pos = rng.integers(0, 100, t).astype(np.int64)
    before = x.copy()
    assert sparsemla.inverse_rope(x, pos, table) is x
    assert np.array_equal(x[..., :448], before[..., :448])
    xf = ref.bf16_to_f32(before[..., 448:])
    c, s = table[pos, :32][:, None, :], table[pos, 32:][:, None, :]
    want = ref.bf16_round_bits_fast(ref.rope_inverse(xf, c, s))
    assert np.array_equal(x[..., 448:], want)
    with pytest.raises(sparsemla.Error, match="positions"):
        sparsemla.inverse_rope(x, np.array([0, 1, 2, 3, 100], dtype=np.int64), table)
