"""Half-split rotary pairs vectorized (scalarize_elementwise's forward, read by _rotate_half) on a real GPU (sm_90;
skipped elsewhere).

A rotary embedding in the "rotate_half" layout, fp32 (tests/fixtures/gpu_problems/rotate_half, written for this
test: no corpus walk or card has seen it), whose naive kernel is one thread per pair (r * 2 * half + j, that +
half) with its cos and sin at r * half + j. Forwarded, a thread takes four pairs as float4s of x at both offsets,
of both tables and of y at both offsets where half % 4 == 0 and the pointers are 16-byte aligned, and runs its pairs
one by one otherwise: the odd_half case (half = 6) takes that element loop on every thread. The vector form passes
every case against the naive kernel under the gate's sanitizer, and its ratios against the naive kernel and torch
eager are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_rotate_half.py -v -s -n 0
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
ROTATE_HALF = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "rotate_half"
# the problem's CASES (named here: a problem file runs only in the sandbox); odd_half: half % 4 != 0, the fallback
CASES = {"headline", "odd_half", "small"}



def test_the_vectorized_rotary_passes_every_case_against_the_naive_kernel(cache):
    naive = load_kernel(ROTATE_HALF / "naive")
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(naive)
    assert (site.function, site.kind, site.key) == ("rotate_half", "function", "p")
    packed = transform.forward(naive, site).state
    assert "half % 4 == 0" in packed.source and "*reinterpret_cast<float4*>(y + b) = y_hi4;" in packed.source
    assert packed.plan.launches[0].grid[0] == "cdiv(cdiv(rows * half, 256), 4)"
    passes_against(ROTATE_HALF / "problem.py", packed, naive, CASES, cache, "the float4 rotary", "the naive kernel")
