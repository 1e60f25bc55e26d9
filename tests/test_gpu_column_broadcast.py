"""scalarize_row_gather's column-broadcast forward on a real GPU (sm_90; skipped elsewhere): a bias add, GELU and a
per-channel scale written for the transform's tests (tests/transforms/scalarize_row_gather/bias_gelu_float, its own
problem, not a corpus or transfer operator), forwarded to 16-byte packs of x, bias, scale and out, passes the full
gate on every case of its problem (a row length of 4096 that takes the vector path, one of 1001 that takes the
scalar path, a small one), timed against the naive kernel it was made from and torch eager; the ratios are printed
(run with -s).

    python -m pytest tests/test_gpu_column_broadcast.py -v -s -n 0
"""

from __future__ import annotations

import os

import pytest

from gpu_tools import assert_passes_every_case, gate_cache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.transforms import Anchor, get
from tests.transforms.golden import HERE, load

pytestmark = pytest.mark.gpu
CASE = HERE / "scalarize_row_gather" / "bias_gelu_float"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return gate_cache(tmp_path_factory)


def test_the_forwarded_bias_gelu_passes_every_case_and_beats_the_naive_kernel(cache):
    naive = load(CASE, "after", "kernel")
    packed = get("scalarize_row_gather").forward(naive, Anchor("kernel", "function", "i")).state
    assert packed == load(CASE, "before", "kernel")
    verdict = run_gate(CASE / "problem.py", packed, against=naive, cache=cache,
                       policy=GatePolicy(sanitize=Sanitize.NEVER), record=bool(os.environ.get("KLINEAGE_RECORDED_DIR")))
    assert_passes_every_case(verdict, {"headline", "odd", "small"})
    ratios = verdict.profile["ratios"]
    medians = {role: round(c["median_us"], 1) for role, c in verdict.profile["contenders"].items()}
    print(f"\nbias_gelu_scale, 16-byte packs with the bias and scale broadcast per column, on the headline: median us "
          f"{medians}; {ratios['vs_baseline']['overall']:.3f}x the naive kernel, "
          f"{ratios['vs_vendor']['overall']:.3f}x torch eager")
    assert ratios["vs_baseline"]["overall"] > 1.0
