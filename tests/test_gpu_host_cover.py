"""The timed call's cover on the GPU (skipped without one; issue 29).

Beside a slow naive GEMM (149 ms a launch on the H200), cuBLAS was never settled: spread 0.94, trial
medians 185 to 244 us, and its gate spent 31 s timing (bench/results/gemm_naive_probe.verdict.json,
before the idle cover). A round's first call follows the host's wait on the last round; the runner
now covers it longer and leaves out a call whose dispatch outlasted its cover (timing.keep_covered).
"""

from __future__ import annotations

import pytest

from gpu_tools import gate_cache, kernel_named
from klineage import corpus
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.gate.verdict import Status

pytestmark = pytest.mark.gpu


def test_the_vendor_beside_a_slow_naive_gemm_settles(tmp_path_factory):
    verdict = run_gate(corpus.problem_path("gemm"), kernel_named("gemm/naive"), cache=gate_cache(tmp_path_factory),
                       policy=GatePolicy(seeds=1, sanitize=Sanitize.NEVER), cases=["headline"])
    profile = verdict.profile
    print(f"gemm/naive against cuBLAS: {profile['contenders']}; exposed {profile.get('host_exposed', {})}; "
          f"profile {verdict.timings.get('run.profile', 0.0):.1f} s")
    assert verdict.status is Status.PASSED
    assert profile["settlement"]["state"] == "settled", profile["settlement"]
