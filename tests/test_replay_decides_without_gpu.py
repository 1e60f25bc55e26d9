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
from shared_cache import share

SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture()
def empty(tmp_path, shared_cache, monkeypatch) -> GateCache:
    """No verdict, recorded or not; the compiles and artifact reports replay judges by are the run's
    (tests/shared_cache.py), as tests/test_artifact_policy.py makes them for the same adversarial kernels."""
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache)))
    return GateCache(tmp_path / "local", tmp_path / "no-recordings")


@pytest.mark.parametrize("name, reason", [("adversarial/evade_timer_hex_escape", Reason.STATIC_CHECK),
                                          ("adversarial/plan_wrong_arity", Reason.PLAN_ERROR)])
def test_a_rejection_that_needs_no_gpu_is_judged_in_replay(empty, name, reason):
    verdict = run_gate(SOFTMAX, corpus.kernel_entry(name).load(), mode=GateMode.REPLAY, cache=empty,
                       policy=GatePolicy(sanitize=Sanitize.ALWAYS))
    assert verdict.status is Status.REJECTED and verdict.reason is reason
    assert verdict.provenance["origin"] == "judged_without_gpu"
    assert not empty.local.keys()  # decided here, never stored as if measured


def test_a_kernel_that_would_run_still_needs_its_recording(empty):
    with pytest.raises(ReplayMiss, match="replay never guesses"):
        run_gate(SOFTMAX, corpus.kernel_entry("adversarial/copy_out_of_bounds").load(), mode=GateMode.REPLAY,
                 cache=empty, policy=GatePolicy(sanitize=Sanitize.ALWAYS))


def test_a_timed_gate_without_the_vendor_is_answered_by_a_recording_that_timed_it_too(tmp_path):
    """The optimizer times without the vendor; the kernels list shows row_softmax/naive's recorded
    verdicts, which timed the vendor as well. Replay answers with one and says so."""
    from klineage import config
    from klineage.optimize import DEFAULT_POLICY

    recorded = GateCache(tmp_path / "local", config.recorded_dir())
    verdict = run_gate(SOFTMAX, corpus.kernel_entry("row_softmax/naive").load(), mode=GateMode.REPLAY,
                       cache=recorded, policy=DEFAULT_POLICY)
    assert verdict.status is Status.PASSED
    assert verdict.provenance["answered_by"].startswith("a recorded verdict of the same checks")
    assert verdict.policy["vendor"] is True and DEFAULT_POLICY.vendor is False
    with pytest.raises(ReplayMiss):  # nothing wider is recorded for a kernel that never ran
        run_gate(SOFTMAX, corpus.kernel_entry("row_softmax/warp_vec4").load(), mode=GateMode.REPLAY,
                 cache=GateCache(tmp_path / "other", tmp_path / "no-recordings"), policy=DEFAULT_POLICY)
