"""scalarize_row_gather's forward on a real GPU (sm_90; skipped elsewhere), on two kernels written for the
transform's tests (tests/transforms/scalarize_row_gather/<case>, each with its own problem, not a corpus or transfer
operator): an embedding lookup forwarded to 16 bytes of a row per thread (rows of 1024 that take the vector path,
769 that take the scalar path, a small case), and a bias add, GELU and per-channel scale whose bias and scale are
column broadcasts, forwarded to 16-byte packs of x, bias, scale and out (rows of 4096, 1001, 8). Each passes the
full gate on every case of its problem, timed against the naive kernel it was made from and torch eager
(`embedding`, `gelu(x + bias) * scale`); the ratios are printed (run with -s).

    python -m pytest tests/test_gpu_row_gather.py -v -s -n 0
"""

from __future__ import annotations

import os

import pytest

from gpu_tools import (
    assert_passes_every_case,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
)
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.transforms import Anchor, get
from tests.transforms.golden import HERE, load

pytestmark = pytest.mark.gpu
FOLDER = HERE / "scalarize_row_gather"



@pytest.mark.parametrize("case, what", [
    ("embedding_float", "embedding_rows, 16 bytes of a row per thread"),
    ("bias_gelu_float", "bias_gelu_scale, 16-byte packs, bias and scale per column"),
])
def test_the_forwarded_kernel_passes_every_case_and_beats_the_naive_kernel(cache, case, what):
    naive = load(FOLDER / case, "after", "kernel")
    packed = get("scalarize_row_gather").forward(naive, Anchor("kernel", "function", "i")).state
    assert packed == load(FOLDER / case, "before", "kernel")
    verdict = run_gate(FOLDER / case / "problem.py", packed, against=naive, cache=cache,
                       policy=GatePolicy(sanitize=Sanitize.NEVER), record=bool(os.environ.get("KLINEAGE_RECORDED_DIR")))
    assert_passes_every_case(verdict, {"headline", "odd", "small"})
    ratios = verdict.profile["ratios"]
    medians = {role: round(c["median_us"], 1) for role, c in verdict.profile["contenders"].items()}
    print(f"\n{what}, on the headline: median us {medians}; {ratios['vs_baseline']['overall']:.3f}x the naive "
          f"kernel, {ratios['vs_vendor']['overall']:.3f}x torch eager")
    assert ratios["vs_baseline"]["overall"] > 1.0
