"""Two readings that widened serialize_reduction's forward, each on a real GPU (sm_90; skipped elsewhere).

Per-channel batch-norm statistics (tests/fixtures/gpu_problems/bn_stats, written for this test: no corpus walk or
card has seen it), whose naive kernel is one thread per channel walking a perfect nest `for (n < N) for (k < HW)`:
the forward reads the nest as one loop over its (n, k) pairs (klineage/transforms/_nests.py), then gives each channel
a warp whose lanes stride the pairs and sum their shares by shuffles (the CPU golden case `bn_stats`).

Row sums (tests/fixtures/gpu_problems/row_sum_first_thread, likewise written for this test), whose naive kernel
runs a block of 128 threads per row where the first thread alone works (`if (threadIdx.x != 0) return;`): the
forward reads it as one thread per row (klineage/transforms/_flatten.py), then gives each row a warp (the CPU
golden case `first_thread_rows`).

Each forwarded kernel passes every case against its naive kernel under the gate's sanitizer, and its ratios against
that kernel and torch eager are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_nested_reductions.py -v -s -n 0
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
PROBLEMS = Path(__file__).resolve().parent / "fixtures" / "gpu_problems"
BN_STATS = PROBLEMS / "bn_stats"
ROW_SUM = PROBLEMS / "row_sum_first_thread"
# the problems' CASES (named here: a problem file runs only in the sandbox)
BN_CASES = {"headline", "one_image", "one_pixel", "ragged"}
ROW_CASES = {"headline", "ragged", "small"}



def test_the_nest_given_a_warp_a_channel_passes_every_case_against_the_naive_kernel(cache):
    naive = load_kernel(BN_STATS / "naive")
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(naive)
    assert (site.function, site.kind, site.key) == ("bn_stats", "function", "c")  # a thread per channel
    warp = transform.forward(naive, site).state
    assert "for (long long n_k = lane; n_k < (long long)N * HW; n_k += 32) {" in warp.source  # the pairs, strided
    assert warp.source.count("__shfl_xor_sync") == 2  # the sum and the sum of squares
    assert warp.plan.launches[0].grid[0] == "(cdiv(C, 128)) * 32"
    passes_against(BN_STATS / "problem.py", warp, naive, BN_CASES, cache,
                   "bn_stats given a warp a channel", "the naive nest", vendor="torch.var_mean")


def test_the_first_thread_rows_given_a_warp_pass_every_case_against_the_naive_kernel(cache):
    naive = load_kernel(ROW_SUM / "naive")
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(naive)
    assert (site.function, site.kind, site.key) == ("row_sum", "function", "row")  # a thread per row
    warp = transform.forward(naive, site).state
    assert "threadIdx.x != 0" not in warp.source  # read as a thread per row, then a warp per row
    assert "for (int j = lane; j < cols; j += 32)" in warp.source and "__shfl_xor_sync" in warp.source
    assert warp.plan.launches[0].grid[0].endswith("* 32")
    passes_against(ROW_SUM / "problem.py", warp, naive, ROW_CASES, cache,
                   "row sums given a warp a row", "the first-thread kernel", vendor="torch.sum")


def test_the_nest_split_into_chunks_of_pairs_passes_every_case_against_the_naive_kernel(cache):
    """unsplit_reduction reads the nest as one loop over its pairs too: chunks of pairs on grid y, each chunk's
    sums to scratch, a second launch adding them per channel in chunk order."""
    naive = load_kernel(BN_STATS / "naive")
    transform = get("unsplit_reduction")
    (site,) = transform.forward_sites(naive)
    assert (site.function, site.kind, site.key) == ("bn_stats", "function", "c")
    split = transform.forward(naive, site).state
    assert "n_k < (long long)N * HW && n_k < split_first + split_steps" in split.source
    assert [launch.entry for launch in split.plan.launches] == ["bn_stats", "bn_stats_merge"]
    passes_against(BN_STATS / "problem.py", split, naive, BN_CASES, cache,
                   "bn_stats split into chunks of pairs", "the naive nest", vendor="torch.var_mean")
