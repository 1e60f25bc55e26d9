"""Few long rows given a block a row (serialize_block_reduction's forward) on a real GPU (sm_90; skipped elsewhere).

The row softmax of tests/fixtures/gpu_problems/few_long_rows (written for this test: no corpus walk or card has seen
it): 16 rows of 16,384 columns on the headline, one thread a row in the naive kernel. Forwarded, a block of 256
takes each row (serialize_block_reduction), or a warp does (serialize_reduction). Each form passes every case
against the naive kernel under the gate's sanitizer, and the block form is gated against the warp form too, so its
ratio over the warp form on the headline is measured side by side; the ratios are printed with whether the timing
settled (run with -s). The block form's passes then keep the row in registers (uncache_row: 64 values a thread
of 256, so rows to 16,384 columns; the wide case's rows take the passes as they were), gated against the block form.

    python -m pytest tests/test_gpu_block_rows.py -v -s -n 0
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
ROWS = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "few_long_rows"
CASES = {"headline", "wide", "many", "ragged", "small"}  # the problem's CASES (its file runs only in the sandbox)


def test_a_block_a_row_passes_every_case_against_the_naive_kernel_and_the_warp_form(cache):
    naive = load_kernel(ROWS / "naive")
    block = forwarded(naive, "serialize_block_reduction")
    warp = forwarded(naive, "serialize_reduction")
    assert "__syncthreads();" in block.source and block.plan.launches[0].block[0] == 256
    passes_against(ROWS / "problem.py", block, naive, CASES, cache, "row softmax, a block a row", "the naive kernel",
                   vendor="torch softmax")
    passes_against(ROWS / "problem.py", block, warp, CASES, cache, "row softmax, a block a row",
                   "the warp a row form", vendor="torch softmax")


def test_the_block_rows_register_cache_passes_every_case_against_the_block_form(cache):
    block = forwarded(load_kernel(ROWS / "naive"), "serialize_block_reduction")
    cached = forwarded(block, "uncache_row")
    assert "float row_cache[64];" in cached.source and "if (cols <= 256 * 64) {" in cached.source
    passes_against(ROWS / "problem.py", cached, block, CASES, cache, "row softmax, a block a row, its row in registers",
                   "the block a row form", vendor="torch softmax")
