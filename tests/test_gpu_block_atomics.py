"""A block-per-row kernel's sum added into shared memory by every thread's atomic, then made once a warp
(unaggregate_atomics' forward on a block's shared sum) on a real GPU (sm_90; skipped elsewhere).

Rows of int32 scaled by their sums (tests/fixtures/gpu_problems/row_sum_scale, written for this test: no corpus walk
or card has seen it), whose naive kernel is a block a row written the way a first block-per-row kernel often is:
each thread sums a stride of the row, adds its partial to one `__shared__` total with `atomicAdd`, and every thread
reads the total past a barrier. Forwarded, a butterfly of shuffles sums each warp's partials and one lane a warp
adds them: 8 shared atomics a block of 256 threads on the address, not 256. Integer sums are exact in any order, so
the gate compares runs bit for bit. The warp form passes every case against the naive kernel under the gate's
sanitizer, and its ratios against that kernel and torch eager are printed with whether the timing settled (run
with -s).

    python -m pytest tests/test_gpu_block_atomics.py -v -s -n 0
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
ROW_SUM_SCALE = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "row_sum_scale"
CASES = {"headline", "ragged", "narrow", "small"}  # the problem's CASES (its file runs only in the sandbox)



def test_the_warps_shared_atomics_pass_every_case_against_every_threads(cache):
    naive = load_kernel(ROW_SUM_SCALE / "naive")
    aggregated = forwarded(naive, "unaggregate_atomics")
    assert "if (threadIdx.x % 32 == 0) atomicAdd(&total, warp_total);" in aggregated.source
    passes_against(ROW_SUM_SCALE / "problem.py", aggregated, naive, CASES, cache,
                   "row sums made once a warp", "every thread's shared atomic")
