"""A warp's walk over a row taken 16 bytes a lane per step (scalarize_row_walk) on a real GPU (sm_90; skipped
elsewhere).

Two held-out operators of bench/transfer (no corpus walk or card has seen them) are given a warp per row by
serialize_reduction, then their walk is vectorized: the row argmax (exact tolerance: the first largest column on
every case, a ragged row length and a narrow row among them) and the batched matrix-vector product. Each passes every
case against the warp form under the gate's sanitizer, and its ratios against the warp form and torch eager are
printed (run with -s).

    python -m pytest tests/test_gpu_row_walk.py -v -s -n 0
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
BENCH = Path(__file__).resolve().parent.parent / "bench" / "transfer"
# the problems' CASES (named here: a problem file runs only in the gate's sandbox)
CASES = {"row_argmax": {"headline", "ragged", "narrow", "small"},
         "batched_matvec": {"headline", "ragged", "small"}}



@pytest.mark.parametrize("operator", sorted(CASES))
def test_the_vector_walk_passes_every_case_against_the_warp_form(cache, operator):
    naive = load_kernel(BENCH / operator / "naive")
    warp = forwarded(naive, "serialize_reduction")
    vector = forwarded(warp, "scalarize_row_walk")
    passes_against(BENCH / operator / "problem.py", vector, warp, CASES[operator], cache,
                   f"{operator}'s vector walk", "the warp form")
