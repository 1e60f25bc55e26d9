"""Divisions made cheaper on a real GPU (sm_90; skipped elsewhere): a division by a constant folded into a product
by its reciprocal (reciprocal_constant), and a float division computed by `__fdividef` (fast_math's division
sites).

Both on held-out operators (bench/transfer, which no corpus walk or card has seen), after their elements move as
float4 (scalarize_elementwise), where the divisions are what is left of each thread's work. Hard swish is a template
that divides by `scalar_t(6)`: four IEEE divisions a thread, each a reciprocal estimate, refinement and a slow-path
branch, folded, each one multiply. The Adam step divides by two bias corrections, constants, and by the root of the
second moment: both forwards together. Each faster form passes every case against the float4 kernel that divides,
under the gate's sanitizer and within the problem's tolerances (a folded product is within about 1.5 ulp of the
rounded quotient, `__fdividef` within about 2), and its ratios against that kernel and torch eager are printed with
whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_divisions.py -v -s -n 0
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
from klineage.specialize import specialized
from klineage.transforms import get

pytestmark = pytest.mark.gpu
TRANSFER = Path(__file__).resolve().parent.parent / "bench" / "transfer"
CASES = {"headline", "ragged", "small"}  # both problems' CASES (a problem file runs only in the sandbox)


def float4_kernel(operator: str):
    return forwarded(specialized(load_kernel(TRANSFER / operator / "naive")).state, "scalarize_elementwise")


def test_the_folded_reciprocal_passes_every_case_against_the_float4_divisions(cache):
    vector = float4_kernel("hardswish")
    assert vector.source.count("/ float(6)") == 5  # four lanes and the tail
    folded = forwarded(vector, "reciprocal_constant")
    assert folded.source.count("* (1 / float(6))") == 5 and folded.plan == vector.plan
    passes_against(TRANSFER / "hardswish" / "problem.py", folded, vector, CASES, cache,
                   "hardswish's float4 kernel with its sixth folded", "the float4 kernel dividing by 6")


def test_folded_corrections_and_fdividef_pass_every_case_against_the_float4_divisions(cache):
    vector = float4_kernel("adam_update")
    fast = vector
    for name in ("reciprocal_constant", "reciprocal_constant", "fast_math"):
        transform = get(name)
        (site, *_) = [a for a in transform.forward_sites(fast) if a.kind in ("divisor", "division")]
        fast = transform.forward(fast, site).state
    assert fast.source.count("__fdividef(") == 5 and " / (" not in fast.source.replace("(1 / (", "")
    passes_against(TRANSFER / "adam_update" / "problem.py", fast, vector, CASES, cache,
                   "adam_update's float4 kernel with its corrections folded and __fdividef",
                   "the float4 kernel dividing")
