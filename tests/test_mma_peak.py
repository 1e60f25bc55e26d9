"""bench/mma_peak.py's kernels, compiled with real nvcc: each must reach the SASS it claims to time
(tensor-core MMAs on every accumulator, ldmatrix only where it says so) without local-memory spills,
or its TFLOP/s would measure something else."""

from __future__ import annotations

import pytest

from klineage.features.sass import disassemble
from tests.bench_tools import bench_script

mma_peak = bench_script("mma_peak")


@pytest.fixture(scope="module")
def sass(tmp_path_factory):
    return disassemble(mma_peak.build(tmp_path_factory.mktemp("peak")))


@pytest.mark.parametrize("name, tile, ctas", mma_peak.CONFIGS)
def test_every_timed_kernel_issues_one_mma_per_accumulator_per_k_step(sass, name, tile, ctas):
    opcodes = [i.split()[0] for i in sass[name]]
    hmma = sum(op.startswith("HMMA.16816.F32.BF16") for op in opcodes)
    assert hmma == 2 * tile[0] * tile[1]  # the loop body holds two k-steps
    assert not any(op.startswith(("LDL", "STL")) for op in opcodes)
    ldsm = sum(op.startswith("LDSM") for op in opcodes)
    if name.startswith("ldsm"):
        # two k-steps of A (one x4 per m16 tile) and B (one x4 per two n8 tiles), and the first step's
        assert ldsm == 3 * (tile[0] + tile[1] // 2)
    else:
        assert ldsm == 0


@pytest.mark.parametrize("name, tile, ctas", mma_peak.CONFIGS)
def test_the_flop_count_is_what_the_sass_issues(sass, name, tile, ctas):
    """TFLOP/s divide `flops` by the time: it must be the HMMAs the loop body issues (two k-steps)
    times the loop's trips, warps, CTAs and SMs, at 2 * 16 * 8 * 16 each."""
    hmma = sum(i.split()[0].startswith("HMMA.16816") for i in sass[name])
    iters, sms, warps = 64, 132, 8
    assert mma_peak.flops(tile, ctas, iters, sms) == hmma * (iters // 2) * warps * ctas * sms * 2 * 16 * 8 * 16
