"""One atomic an element on one address, folded by warps (unaggregate_atomics' element form), and folded over a
grid the GPU's size first (its `@grid` site), on a real GPU (sm_90; skipped elsewhere).

The amax of a float vector as the int bits of |x| (tests/fixtures/gpu_problems/abs_max, written for this test: no
corpus walk or card has seen it), whose naive kernel makes `atomicMax` once an element: 16 million atomics queue at
one address. The warp fold makes one a warp (n / 32); the grid fold makes one a warp of a grid of num_sms * 8 blocks
of 256 (about 8,400 on an H100, whatever n). Maxima are exact in any order, so the gate compares runs bit for bit.
Each form passes every case against the one before it under the gate's sanitizer, and its ratios against it and
torch eager are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_atomic_folds.py -v -s -n 0
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpu_tools import (
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    passes_against,
)
from klineage.kernel import load_kernel
from klineage.transforms import get

pytestmark = pytest.mark.gpu
ABS_MAX = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "abs_max"
CASES = {"headline", "ragged", "small"}  # the problem's CASES (its file runs only in the sandbox)


def _folded(over_grid: bool):
    naive = load_kernel(ABS_MAX / "naive")
    transform = get("unaggregate_atomics")
    grid_site, site = transform.forward_sites(naive)
    assert grid_site == replace(site, key=f"{site.key}@grid")
    return naive, transform.forward(naive, grid_site if over_grid else site).state


def test_the_warps_fold_passes_every_case_against_an_atomic_an_element(cache):
    naive, warp = _folded(over_grid=False)
    assert "if (threadIdx.x % 32 == 0) atomicMax(amax, warp_max);" in warp.source
    passes_against(ABS_MAX / "problem.py", warp, naive, CASES, cache, "amax folded by warps", "an atomic an element")


def test_the_grid_fold_passes_every_case_against_the_warps_fold(cache):
    _, warp = _folded(over_grid=False)
    _, grid = _folded(over_grid=True)
    assert grid.plan.launches[1].grid[0] == "min(cdiv(n, 256), num_sms * 8)"
    passes_against(ABS_MAX / "problem.py", grid, warp, CASES, cache, "amax folded over a grid the GPU's size",
                   "amax folded by warps")
