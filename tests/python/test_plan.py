"""Planners (CONTRACT 4.4), the adaptive rule (4.5), the provenance gate (5) and the architecture gate (7)."""

import itertools

import pytest

import reference as ref
import sparsemla

SPECIALISED = [((1, 1, 128, 8192), 32), ((1, 1, 128, 32), 32), ((8, 1, 128, 32), 32),
               ((1, 1, 128, 7812), 32), ((8, 1, 128, 7812), 32), ((17, 1, 128, 32), 4),
               ((16, 1, 128, 781), 13), ((48, 1, 128, 3906), 10), ((64, 1, 128, 32), 4),
               ((64, 1, 128, 256), 4), ((64, 1, 128, 781), 7), ((64, 1, 128, 3906), 8),
               ((64, 1, 128, 7812), 8), ((512, 1, 128, 7812), 1)]
GENERIC = [((256, 1, 128, 0), 1), ((1, 1, 128, 8192), 16), ((8, 1, 128, 8192), 16),
           ((64, 1, 128, 8192), 4)]


@pytest.mark.parametrize("args,want", SPECIALISED)
def test_plan_specialised_ref_conformance_values(args, want):
    t, hb, wm, we = args
    assert sparsemla.testing.plan_specialised_ref(t, 16 * hb, wm, we, 256) == want


@pytest.mark.parametrize("args,want", GENERIC)
def test_plan_generic_conformance_values(args, want):
    t, hb, wm, we = args
    assert sparsemla.testing.plan_generic(t, 16 * hb, wm, we, 256) == want


def test_planners_match_spec_formulas_on_random_shapes(rng):
    for _ in range(400):
        t = int(rng.integers(0, 600))
        h = int(rng.integers(1, 129))
        wm = int(rng.choice([0, 1, 64, 128, 333]))
        we = int(rng.choice([0, 32, 512, 781, 2048, 8192]))
        cu = int(rng.choice([1, 16, 132, 256]))
        g = sparsemla.testing.plan_generic(t, h, wm, we, cu)
        assert g == ref.plan_generic(t, h, wm, we, cu) and 1 <= g <= 16
        assert sparsemla.testing.plan_specialised_ref(t, h, wm, we, cu) == ref.plan_specialised(t, h, wm, we, cu)
        assert 1 <= sparsemla.testing.plan_sm90_tuned(t, h, wm, we, cu) <= 32
        s = int(rng.integers(1, 33))
        assert sparsemla.testing.plan_iters(wm, we, s) == ref._iters(wm, we, s)


def test_auto_prefers_sm90_measured_cells():
    # (T, H, width_main, width_extra) -> sm90 measured faster on the H200 (docs/PERF.md, "Path
    # rule"; the 2026-11-29 tables of docs/lab/sm90-path.md).
    cells = [((8, 64, 128, 512), False), ((32, 64, 128, 512), True), ((8, 128, 128, 1024), True),
             ((8, 64, 128, 2048), True), ((1, 128, 128, 8192), False), ((128, 16, 128, 1024), True),
             ((8, 32, 128, 1024), False), ((128, 8, 128, 1024), True), ((8, 8, 128, 1024), False)]
    for (t, h, wm, we), want in cells:
        assert sparsemla.testing.auto_prefers_sm90(t, h, wm, we) == want
        assert not sparsemla.testing.auto_prefers_sm90(t, h, wm, we, deterministic=True)


def test_adaptive_active_splits_spec_example():
    assert [sparsemla.testing.adaptive_active_splits(1, e, 32, 16) for e in (64, 512, 1536)] == [4, 16, 32]
    assert sparsemla.testing.adaptive_active_splits(1, 64, 2, 16) == 2  # never above S
    # ONE_WAVE: CU / base for 16 <= base < 64, else S.
    assert sparsemla.testing.adaptive_one_wave(16, 16, 128, 8192, 256, 32) == 16
    assert sparsemla.testing.adaptive_one_wave(4, 16, 128, 8192, 256, 32) == 32


def test_provenance_gate_truth_table():
    for bits in itertools.product([False, True], repeat=5):
        assert sparsemla.testing.may_skip_extra_scrub(*bits) == (bits[0] and bits[1] and not bits[2]
                                                         and bits[3] and bits[4])


def test_architecture_gate():
    assert sparsemla.testing.select_gpu_path(9, 0, True, True) == "cuda-sm90"
    assert sparsemla.testing.select_gpu_path(9, 0, True, False) == "cuda-generic"   # unaligned caches
    assert sparsemla.testing.select_gpu_path(9, 0, False, True) == "cuda-generic"   # no sm_90a cubin
    for cc in ((8, 0), (10, 0), (12, 0)):
        assert sparsemla.testing.select_gpu_path(*cc, True, True) == "cuda-generic"
    assert sparsemla.testing.select_gpu_path(9, 0, True, True, "cuda-generic") == "cuda-generic"
    with pytest.raises(sparsemla.Error, match="path"):
        sparsemla.testing.select_gpu_path(9, 0, True, True, "tpu")
