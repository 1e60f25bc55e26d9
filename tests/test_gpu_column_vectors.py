"""Four columns a thread (scalarize_column_vectors' forward) on a real GPU (sm_90; skipped elsewhere).

Column sums of a wide matrix (tests/fixtures/gpu_problems/column_sum_wide, written for this test: no corpus walk or
card has seen it), whose naive kernel is one thread per column walking down the rows. Forwarded, where the column
count is a multiple of 4 and the pointers are 16-byte aligned, each thread sums four adjacent columns from one
16-byte load a row. The forwarded kernel passes every case against the naive one under the gate's sanitizer (the
same bits: each column's rows in the same order), and its ratios against the naive kernel and torch.sum are printed
with whether the timing settled (run with -s). On bias_grad's 1,024 columns it lost (0.27x: a quarter of the
threads); this headline has 131,072 columns, so what it shows is whether the vectors pay where threads are plenty.

    python -m pytest tests/test_gpu_column_vectors.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import assert_passes_every_case, gate_cache, said_ratios
from klineage.gate.pipeline import run_gate
from klineage.kernel import load_kernel
from klineage.transforms import get

pytestmark = pytest.mark.gpu
COLUMN_SUM = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "column_sum_wide"
CASES = {"headline", "ragged", "small"}  # the problem's CASES (named here: a problem file runs only in the sandbox)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return gate_cache(tmp_path_factory)


def test_four_columns_a_thread_pass_every_case_against_the_naive_kernel(cache):
    naive = load_kernel(COLUMN_SUM / "naive")
    transform = get("scalarize_column_vectors")
    (site,) = transform.forward_sites(naive)
    assert (site.function, site.kind, site.key) == ("column_sum", "function", "c")
    vectors = transform.forward(naive, site).state
    assert "float4" in vectors.source and vectors.plan == naive.plan  # the launch as it was
    verdict = run_gate(COLUMN_SUM / "problem.py", vectors, against=naive, cache=cache)
    assert_passes_every_case(verdict, CASES)
    print(said_ratios(verdict, "four columns a thread", "the naive kernel", vendor="torch.sum(dim=0)"))
