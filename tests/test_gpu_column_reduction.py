"""Reductions down columns given more threads by the analysis forwards, on a real GPU (sm_90; skipped elsewhere).

- The held-out bias gradient (bench/transfer/bias_grad, one thread per column) forwarded by each of the three
  forwards that find it: a warp per column (serialize_reduction), four lanes per column (serialize_column_reduction:
  shuffles under a partial mask) and chunks of rows merged by a second launch (unsplit_reduction). Each passes every
  case against the naive kernel under the gate's sanitizer, and its ratios are printed (run with -s): which
  layout pays on which shape is what the cards' preconditions will learn from.
- The corpus column argmax (corpus/kernels/column_max/naive), whose tolerance is exact and whose inputs hold ties
  (integer and constant columns): the four-lane form and the split form give the first row of the largest value on
  every case, on the hardware's shuffles and launches.

    python -m pytest tests/test_gpu_column_reduction.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import (
    assert_passes_every_case,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
)
from klineage import corpus
from klineage.gate.pipeline import run_gate
from klineage.kernel import load_kernel
from klineage.transforms import get

pytestmark = pytest.mark.gpu
BIAS_GRAD = Path(__file__).resolve().parent.parent / "bench" / "transfer" / "bias_grad"
# the problems' CASES (named here: a problem file runs only in the gate's sandbox)
BIAS_GRAD_CASES = {"headline", "ragged", "tall", "wide", "small"}
COLUMN_MAX_CASES = {"headline", "ragged", "tall_narrow", "wide_short", "mid_aligned", "small"}



def _forwarded(naive, name: str):
    transform = get(name)
    (site,) = transform.forward_sites(naive)
    return transform.forward(naive, site).state


@pytest.mark.parametrize("name", ["serialize_reduction", "serialize_column_reduction", "unsplit_reduction"])
def test_each_column_forward_passes_the_held_out_bias_gradient(cache, name):
    naive = load_kernel(BIAS_GRAD / "naive")
    verdict = run_gate(BIAS_GRAD / "problem.py", _forwarded(naive, name), against=naive, cache=cache)
    assert_passes_every_case(verdict, BIAS_GRAD_CASES)
    ratios = verdict.profile["ratios"]
    print(f"\nbias_grad by {name} on the headline: {ratios['vs_baseline']['overall']:.3f}x the naive kernel, "
          f"{ratios['vs_vendor']['overall']:.3f}x torch; timing {verdict.profile['settlement']['state']}")


@pytest.mark.parametrize("name", ["serialize_column_reduction", "unsplit_reduction"])
def test_the_column_argmax_keeps_the_first_row_of_the_largest_value(cache, name):
    naive = corpus.kernel_entry("column_max/naive").load()
    problem = corpus.problem_path("column_max")
    verdict = run_gate(problem, _forwarded(naive, name), against=naive, cache=cache)
    assert_passes_every_case(verdict, COLUMN_MAX_CASES)
