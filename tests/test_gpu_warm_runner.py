"""A warm runner's verdicts are a cold runner's (on a real GPU; skipped without one; issue 29).

Candidates in a stream, a rejected one in the middle: each verdict judged through one warm runner
must equal, in everything but the measurements and where it was made, the verdict of a cold runner.
"""

from __future__ import annotations

import pytest

from klineage import corpus
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.gate.verdict import Status, Verdict
from klineage.gate.warm import WarmRunner

pytestmark = pytest.mark.gpu
SOFTMAX = corpus.problem_path("row_softmax")
STREAM = ["row_softmax/naive", "row_softmax/warp_vec4", "adversarial/write_zeros", "row_softmax/warp_vec4"]


def content(verdict: Verdict) -> dict:
    """Everything a verdict decides and checks, and what held the run; not its times or clocks."""
    profile = verdict.profile
    return {"status": verdict.status, "findings": [(f.reason, f.stage, f.case, f.message) for f in verdict.findings],
            "cases": verdict.cases, "correctness": verdict.correctness, "domain": verdict.domain,
            "vendor_check": verdict.environment.get("vendor_check"), "profile": sorted(profile),
            "contenders": sorted(profile.get("contenders", {})), "ratios": sorted(profile.get("ratios", {})),
            "gpu": verdict.environment.get("gpu"),
            # what held the run; its limits differ (a warm runner's CPU limit covers its whole life)
            "sandbox": verdict.environment.get("sandbox", "").split(";")[0]}


@pytest.mark.parametrize("policy", [GatePolicy(sanitize=Sanitize.NEVER, timing=False),
                                    GatePolicy(sanitize=Sanitize.NEVER, seeds=1)], ids=["untimed", "timed"])
def test_a_stream_through_a_warm_runner_gives_the_cold_runners_verdicts(tmp_path, policy):
    with WarmRunner(SOFTMAX) as runner:
        for index, name in enumerate(STREAM):
            kernel = corpus.kernel_entry(name).load()
            cold = run_gate(SOFTMAX, kernel, policy=policy, cache=GateCache(tmp_path / f"cold{index}", None))
            warm = run_gate(SOFTMAX, kernel, policy=policy, cache=GateCache(tmp_path / f"warm{index}", None),
                            runner=runner)
            assert content(warm) == content(cold), name
            if warm.status is Status.PASSED:  # judged warm: the problem was not loaded again
                assert "run.load_problem" not in warm.timings and "run.load_problem" in cold.timings
            if policy.timing and name == "row_softmax/warp_vec4" and index == 1:  # the runner's second candidate
                assert warm.timings["run.vendor_check"] < 0.1 * cold.timings["run.vendor_check"]  # checked once
        assert runner.started == 2  # the rejected candidate ended the first runner
