"""Replay decides on this machine what needs no GPU: a kernel the static check, nvcc, the policy on the
artifact or the plan check rejects is rejected the same way everywhere, recorded or not. A kernel that
passes them still needs its recorded GPU verdict."""

import pytest

from klineage import corpus
from klineage.errors import ReplayMiss
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import GateMode, run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.gate.verdict import Reason, Status

SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture()
def empty(tmp_path) -> GateCache:
    return GateCache(tmp_path / "local", tmp_path / "no-recordings")


@pytest.mark.parametrize("name, reason", [("adversarial/evade_timer_hex_escape", Reason.STATIC_CHECK),
                                          ("adversarial/plan_wrong_arity", Reason.PLAN_ERROR)])
def test_a_rejection_that_needs_no_gpu_is_judged_in_replay(empty, name, reason):
    verdict = run_gate(SOFTMAX, corpus.kernel_entry(name).load(), mode=GateMode.REPLAY, cache=empty,
                       policy=GatePolicy(sanitize=Sanitize.ALWAYS))
    assert verdict.status is Status.REJECTED and verdict.reason is reason
    assert verdict.provenance["origin"] == "judged_without_gpu"
    assert not list(empty.local.root.rglob("*.json"))  # decided here, never stored as if measured


def test_a_kernel_that_would_run_still_needs_its_recording(empty):
    with pytest.raises(ReplayMiss, match="replay never guesses"):
        run_gate(SOFTMAX, corpus.kernel_entry("adversarial/copy_out_of_bounds").load(), mode=GateMode.REPLAY,
                 cache=empty, policy=GatePolicy(sanitize=Sanitize.ALWAYS))
