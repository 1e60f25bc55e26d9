"""A loss summed over rows, each row's term added by one atomic, given a warp a row (serialize_reduction's forward)
on a real GPU (sm_90; skipped elsewhere).

The mean cross-entropy of tests/fixtures/gpu_problems/mean_cross_entropy (written for this test: no corpus walk or
card has seen it): its naive kernel is one thread per row, two passes over the row, then `atomicAdd(loss, term /
rows)`. Forwarded, a warp takes each row, lanes stride its passes, shuffles combine the max and the sum, and lane 0
alone adds the row's term. The warp form passes every case against the naive kernel under the gate's sanitizer
(one float summed by atomics in no fixed order, within the problem's tolerance), and its ratios against the naive
kernel and torch eager are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_row_loss.py -v -s -n 0
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
LOSS = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "mean_cross_entropy"
CASES = {"headline", "ragged", "vocab", "narrow", "small"}  # the problem's CASES (its file runs only in the sandbox)



def test_the_warp_loss_passes_every_case_against_the_naive_kernel(cache):
    naive = load_kernel(LOSS / "naive")
    warp = forwarded(naive, "serialize_reduction")
    assert "if (lane == 0) atomicAdd(loss, term / rows);" in warp.source
    passes_against(LOSS / "problem.py", warp, naive, CASES, cache, "mean cross-entropy, a warp a row",
                   "the naive kernel", vendor="torch cross_entropy")
