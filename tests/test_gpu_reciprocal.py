"""A division by a constant folded into a product by its reciprocal (reciprocal_constant's forward) on a real GPU
(sm_90; skipped elsewhere).

The held-out hard swish (bench/transfer/hardswish, which no corpus walk or card has seen) is a template that
divides by `scalar_t(6)`. Specialized and moved four elements a thread as float4 (scalarize_elementwise), each
thread still makes four IEEE divisions, each a reciprocal estimate, refinement and a slow-path branch; folded,
each is one multiply. The folded kernel passes every case against the float4 kernel under the gate's sanitizer,
within the problem's tolerances (the product is within about 1.5 ulp of the rounded quotient), and its ratios
against that kernel and torch eager are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_reciprocal.py -v -s -n 0
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

pytestmark = pytest.mark.gpu
HARDSWISH = Path(__file__).resolve().parent.parent / "bench" / "transfer" / "hardswish"
CASES = {"headline", "ragged", "small"}  # the problem's CASES (a problem file runs only in the sandbox)


def test_the_folded_reciprocal_passes_every_case_against_the_float4_divisions(cache):
    vector = forwarded(specialized(load_kernel(HARDSWISH / "naive")).state, "scalarize_elementwise")
    assert vector.source.count("/ float(6)") == 5  # four lanes and the tail
    folded = forwarded(vector, "reciprocal_constant")
    assert folded.source.count("* (1 / float(6))") == 5 and folded.plan == vector.plan
    passes_against(HARDSWISH / "problem.py", folded, vector, CASES, cache,
                   "hardswish's float4 kernel with its sixth folded", "the float4 kernel dividing by 6")
