"""Pairwise distances staged through shared tiles (untile_matmul's forward on a sum that is no product) on a real
GPU (sm_90; skipped elsewhere).

C[i, j] = ||A[i] - B[j]|| (tests/fixtures/gpu_problems/pairwise_distance, written for this test: no corpus walk or
card has seen it), whose naive kernel is one thread per pair summing `d * d` over a local `d = A[r * K + k] -
B[c * K + k]`. Tiled, a 16 x 16 block stages a tile of A's rows and one of B's rows (loaded along k into a padded
tile) per step of 16 along k. The tiled kernel passes every case against the naive one under the gate's sanitizer,
and its ratios against that kernel and torch.cdist are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_pairwise_distance.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import (
    forwarded,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    passes_against,
)
from klineage.kernel import load_kernel

pytestmark = pytest.mark.gpu
DISTANCE = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "pairwise_distance"
CASES = {"headline", "ragged", "small"}  # the problem's CASES (named here: a problem file runs only in the sandbox)



def test_the_tiled_distances_pass_every_case_against_the_naive_kernel(cache):
    naive = load_kernel(DISTANCE / "naive")
    tiled = forwarded(naive, "untile_matmul")
    assert "__shared__ float tile_b[16][17];" in tiled.source  # B's rows loaded along k into a padded tile
    passes_against(DISTANCE / "problem.py", tiled, naive, CASES, cache, "the tiled pairwise distances",
                   "the naive kernel", vendor="torch.cdist")
