"""Histogram privatization (unprivatize_histogram's forward) on a real GPU (sm_90; skipped elsewhere).

A histogram of 256 bins over skewed int32 values (tests/fixtures/gpu_problems/histogram, written for this test: no
corpus walk or card has seen it), whose naive kernel is a grid-stride loop of a full GPU of blocks adding each
element to its bin with one global atomic. Forwarded, each block counts its elements into a shared-memory copy of
the bins (shared atomics) and adds each non-zero bin to the global histogram once. The privatized kernel passes every
case against the naive one under the gate's sanitizer (int32 bins: exact), and its ratios against the naive kernel
and torch.histc are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_histogram_privatization.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import (
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    passes_against,
)
from klineage.kernel import load_kernel
from klineage.transforms import get

pytestmark = pytest.mark.gpu
HISTOGRAM = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "histogram"
CASES = {"headline", "ragged", "small"}  # the problem's CASES (named here: a problem file runs only in the sandbox)



def test_the_privatized_histogram_passes_every_case_against_the_naive_kernel(cache):
    naive = load_kernel(HISTOGRAM / "naive")
    transform = get("unprivatize_histogram")
    (site,) = transform.forward_sites(naive)
    assert (site.function, site.kind) == ("histogram", "loop")  # the grid-stride form: the copy outside the loop
    privatized = transform.forward(naive, site).state
    assert "__shared__ int s_hist[BINS];" in privatized.source
    passes_against(HISTOGRAM / "problem.py", privatized, naive, CASES, cache,
                   "the privatized histogram", "the naive kernel", vendor="torch.histc")
