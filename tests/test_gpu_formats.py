"""On the H200: one problem per format gated with its matching kernel (bench/gpu_session.sh gputest:formats)."""

from __future__ import annotations

import pytest

from klineage.config import GateMode
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy
from klineage.gate.verdict import Status
from klineage.kernel import load_kernel
from tests.test_problem_formats import FORMATS, KERNELS


@pytest.mark.gpu
@pytest.mark.parametrize("fixture", sorted(KERNELS))
def test_each_format_gates_on_the_gpu(fixture, gate_cache):
    kernel = load_kernel(FORMATS / "kernels" / KERNELS[fixture])
    verdict = run_gate(FORMATS / fixture, kernel, policy=GatePolicy(timing=False), mode=GateMode.GPU,
                       cache=gate_cache)
    assert verdict.status is Status.PASSED, [f.message for f in verdict.findings]
