"""bench/profile_gemm.py without a GPU: the launch it profiles is the plan's, and the gpu_session
stage that runs it under Nsight Compute exists."""

from __future__ import annotations

import pytest

from klineage import corpus
from tests.bench_tools import BENCH, bench_script

profile_gemm = bench_script("profile_gemm")


def test_the_expert_is_launched_with_its_plans_geometry_on_the_headline():
    grid, block, shared = profile_gemm.geometry(corpus.kernel_entry("gemm/mma_sync").load())
    assert grid == (16 * 32, 1, 1)  # 4096 / 128 x 4096 / 256 tiles
    assert block == (256, 1, 1) and shared == 4 * (128 + 256) * 64 * 2


def test_a_tensor_map_kernel_is_refused_by_name():
    with pytest.raises(SystemExit, match="gemm_wgmma_tma"):
        profile_gemm.geometry(corpus.kernel_entry("gemm/wgmma_tma").load())


def test_the_gpu_session_has_a_profile_stage():
    script = (BENCH / "gpu_session.sh").read_text()
    assert "profile:*)" in script and "bench/profile_gemm.py" in script and "--clock-control none" in script
