"""Running products, exclusive running sums and running sums from the row's end given a warp a row
(serialize_reduction's forward) on a real GPU (sm_90; skipped elsewhere).

Three problems written for this test (tests/fixtures/gpu_problems/row_cumprod, row_exclusive_cumsum and
row_reverse_cumsum: no corpus walk or card has seen them), each with a naive kernel of one thread per row: a prefix
product (`running *= x; y = running;`), an exclusive prefix sum of integers (`y = running; running += x;`) and a
prefix sum walked down from the row's last column. Forwarded, each row's warp scans 32 columns a step with
`__shfl_up_sync` and carries the chunk's total from lane 31. Each warp form passes every case against its naive
kernel under the gate's sanitizer (the integers exactly), and its ratios against the naive kernel and torch eager
are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_warp_scans.py -v -s -n 0
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
PROBLEMS = Path(__file__).resolve().parent / "fixtures" / "gpu_problems"
CASES = {"headline", "ragged", "narrow", "small"}  # both problems' CASES (their files run only in the sandbox)



@pytest.mark.parametrize("problem, stored", [
    ("row_cumprod", "y[(long long)row * cols + j] = running * scan_value;"),
    ("row_exclusive_cumsum", "y[(long long)row * cols + j] = lane == 0 ? running : running + scan_before;"),
    ("row_reverse_cumsum", "const int j = cols - 1 - (scan_base + lane);"),
])
def test_the_warp_scan_passes_every_case_against_the_naive_kernel(cache, problem, stored):
    naive = load_kernel(PROBLEMS / problem / "naive")
    warp = forwarded(naive, "serialize_reduction")
    assert stored in warp.source
    passes_against(PROBLEMS / problem / "problem.py", warp, naive, CASES, cache, f"{problem}, a warp a row",
                   "the naive kernel", vendor="torch")
