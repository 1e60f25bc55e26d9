"""A reduction's grid-stride loop moved as 16-byte vectors (scalarize_grid_stride's forward) on a real GPU (sm_90;
skipped elsewhere).

The held-out mean squared error (bench/transfer/mse_loss, no corpus walk or card has seen it) sums each thread's
grid-stride slice; the search first sums a warp's shares by shuffles (unaggregate_atomics), after which nothing in
the catalog applied. Forwarded, the slice is read as float4s of both inputs where they are 16-byte aligned, the
tail element by element. The vector loop passes every case against the warp-aggregated kernel under the gate's
sanitizer, and its ratios against that kernel and torch eager are printed with whether the timing settled (run
with -s). Its grid, capped at 256 blocks (about two an SM), is then sized to the GPU (fix_grid_cap's forward:
num_sms * 8 blocks of 256 threads), or its loops unrolled two grids a step (reroll_grid_stride's forward), and each is
gated against the vector loop on 256 blocks the same way. Last, the held-out softplus's plain grid-stride loop (whose
work branches on each value) unrolled four grids a step, full steps unguarded, is gated against the plain loop.

    python -m pytest tests/test_gpu_grid_stride_vectors.py -v -s -n 0
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
from klineage.transforms import get

pytestmark = pytest.mark.gpu
MSE = Path(__file__).resolve().parent.parent / "bench" / "transfer" / "mse_loss"
CASES = {"headline", "ragged", "small"}  # the problem's CASES (named here: a problem file runs only in the sandbox)



def test_the_vector_loop_passes_every_case_against_the_warp_aggregated_kernel(cache):
    aggregated = forwarded(load_kernel(MSE / "naive"), "unaggregate_atomics")
    vectors = forwarded(aggregated, "scalarize_grid_stride")
    assert "float4" in vectors.source
    passes_against(MSE / "problem.py", vectors, aggregated, CASES, cache,
                   "mse_loss's vector loop", "the warp-aggregated kernel")


def _vectors():
    return forwarded(forwarded(load_kernel(MSE / "naive"), "unaggregate_atomics"), "scalarize_grid_stride")


def test_the_grid_sized_to_the_gpu_passes_every_case_against_the_fixed_256_blocks(cache):
    vectors = _vectors()
    sized = forwarded(vectors, "fix_grid_cap")
    assert [str(launch.grid[0]) for launch in sized.plan.launches] == ["1", "min(cdiv(n, 256), num_sms * 8)"]
    passes_against(MSE / "problem.py", sized, vectors, CASES, cache,
                   "mse_loss's vector loop on num_sms * 8 blocks", "the same loop on 256 blocks")


def test_the_loops_unrolled_two_grids_a_step_pass_every_case_against_the_vector_loop(cache):
    vectors = _vectors()
    unrolled = forwarded(vectors, "reroll_grid_stride")
    assert unrolled.source.count("#pragma unroll") == 6 and unrolled.plan == vectors.plan
    passes_against(MSE / "problem.py", unrolled, vectors, CASES, cache,
                   "mse_loss's loops two grids a step", "the vector loop")


def test_softplus_unrolled_four_grids_a_step_passes_every_case_against_its_plain_loop(cache):
    softplus = MSE.parent / "softplus"
    plain = load_kernel(softplus / "naive")
    transform = get("reroll_grid_stride")
    unrolled = transform.forward(plain, transform.forward_sites(plain, {"factor": [4]})[0]).state
    assert "i_base += 4 * (stride)" in unrolled.source
    passes_against(softplus / "problem.py", unrolled, plain, CASES, cache,
                   "softplus's loop four grids a step", "the plain loop")
