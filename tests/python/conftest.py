"""Shared fixtures: fresh random seeds (SPARSEMLA_TEST_SEED=<seed> reproduces a failing run), torch and
GPU availability markers."""

import os
import secrets
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import reference`


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


TORCH = _torch()
HAS_GPU = bool(TORCH is not None and TORCH.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    skip_torch = pytest.mark.skip(reason="torch is not installed")
    skip_gpu = pytest.mark.skip(reason="needs torch with a CUDA GPU (scripts/gpu-check runs these)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        elif "torch" in item.keywords and TORCH is None:
            item.add_marker(skip_torch)


@pytest.fixture
def rng(request):
    """A numpy Generator with a fresh seed, printed when the test fails."""
    seed = int(os.environ.get("SPARSEMLA_TEST_SEED", "0")) or secrets.randbits(63)
    request.node.user_properties.append(("seed", seed))
    yield np.random.default_rng(seed)
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\nseed={seed} (SPARSEMLA_TEST_SEED={seed} reproduces it)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep
        if rep.failed:
            for name, value in item.user_properties:
                if name == "seed":
                    rep.sections.append(("seed", f"seed={value} (SPARSEMLA_TEST_SEED={value} reproduces it)"))
