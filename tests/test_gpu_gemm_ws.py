"""The warp-specialised mma.sync GEMM variant (bench/variants/gemm_mma_sync_ws) on a real GPU
(sm_90; skipped elsewhere): it must pass every case its domain holds, like the expert it may
replace, and is timed against cuBLAS and gemm/mma_sync on the headline case. Its reason to exist
is issue 3's target, which the expert misses (0.641x): TARGET_VS_CUBLAS of cuBLAS's speed."""

from __future__ import annotations

import pytest

from gpu_tools import (
    assert_clean_under_the_sanitizers,
    assert_passes_every_case,
    assert_reaches_target,
    gate_fixtures,
    timing_ratios,
)
from klineage import config, corpus

pytestmark = pytest.mark.gpu
GEMM = corpus.problem_path("gemm")
VARIANT = str(config.REPO_ROOT / "bench" / "variants" / "gemm_mma_sync_ws")
BASELINE = "gemm/mma_sync"
TARGET_VS_CUBLAS = 0.70

cache, timed = gate_fixtures(GEMM, VARIANT, BASELINE, record=False)  # a bench variant: not a corpus kernel


def test_the_variant_passes_every_supported_case(timed):
    assert_passes_every_case(timed, {"headline", "ragged_mn", "skinny", "small"}, {"ragged", "odd_k"})


def test_the_variant_is_timed_against_cublas_and_the_expert(timed):
    timing_ratios(timed, VARIANT, "cuBLAS", BASELINE, case=None)


# A negative result kept as evidence: on the H200 the variant is 0.624x cuBLAS and 0.981x gemm/mma_sync
# (bench/logs/gpu-session-s20.txt; 0.625x in gpu-session-s14.txt). Strict: reaching the target fails it.
@pytest.mark.xfail(strict=True, reason="warp specialisation over mma.sync: 0.624x cuBLAS, under 0.70x")
def test_the_variant_reaches_the_cublas_target(timed):
    assert_reaches_target(timed, TARGET_VS_CUBLAS)


def test_the_variant_is_clean_under_the_sanitizers(cache):
    assert_clean_under_the_sanitizers(GEMM, VARIANT, cache, ["small", "ragged_mn"])
