"""A whole reduction written for one thread, split over the GPU (unsplit_reduction's forward on a kernel `_flatten.py`
reads as one row), then its chunks and its merge a warp each (serialize_reduction's forward), on a real GPU (sm_90;
skipped elsewhere).

The sum of squares of a vector (tests/fixtures/gpu_problems/sum_of_squares, written for this test: no corpus walk or
card has seen it), whose naive kernel is `<<<1, 1>>>`: one thread adds every square and stores the total through the
pointer. Each form passes every case against that kernel under the gate's sanitizer, runs bit for bit alike (no
atomics: the chunks merge in their order), and its ratios against the naive kernel and torch eager are printed with
whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_whole_reduction.py -v -s -n 0
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
from klineage.transforms import Anchor, get

pytestmark = pytest.mark.gpu
SUM_OF_SQUARES = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "sum_of_squares"
CASES = {"headline", "ragged", "short", "one"}  # the problem's CASES (its file runs only in the sandbox)


def _forms():
    naive = load_kernel(SUM_OF_SQUARES / "naive")
    split = forwarded(naive, "unsplit_reduction")
    warps = get("serialize_reduction")
    chunks = warps.forward(split, Anchor("sum_of_squares", "function", "row")).state
    both = warps.forward(chunks, Anchor("sum_of_squares_merge", "function", "row")).state
    return naive, {"split over the GPU": split, "chunks in warps": chunks, "chunks and merge in warps": both}


@pytest.mark.parametrize("form", ["split over the GPU", "chunks in warps", "chunks and merge in warps"])
def test_each_form_of_the_one_thread_sum_passes_every_case_against_it(cache, form):
    naive, forms = _forms()
    passes_against(SUM_OF_SQUARES / "problem.py", forms[form], naive, CASES, cache,
                   f"the sum of squares, {form}", "one thread's loop")
