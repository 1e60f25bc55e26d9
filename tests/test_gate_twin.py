"""A timed gate reuses its correctness twin (same kernel, untimed policy): the decision without a GPU.

The GPU half (a passed twin: only the timing runs) is tests/test_gpu_twin.py. Here the GPU gate is
driven as far as it goes without one: KLINEAGE_GPU_NAME names the GPU, so the gate probes,
compiles and reads features for real (probes and compiles shared by the run: tests/shared_cache.py),
and a rejected twin must decide the verdict before anything would need a GPU (reaching the runner
here would fail the test with an error verdict)."""

from __future__ import annotations

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache, verdict_key
from klineage.gate.pipeline import _judged_twin, run_gate
from klineage.gate.policy import GatePolicy, Placement, Sanitize
from klineage.gate.verdict import Finding, Reason, Status, Verdict
from klineage.walk import walker
from shared_cache import share
from verdict_tools import store_gpu_verdict

SOFTMAX = corpus.problem_path("row_softmax")
TIMED = GatePolicy(seeds=3, timing=True, vendor=False, sanitize=Sanitize.ON_PASS)


@pytest.fixture()
def cache(tmp_path, monkeypatch, shared_cache) -> GateCache:
    """The test's own verdicts; its probes, compiles and features the run's (tests/shared_cache.py)."""
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache)))
    monkeypatch.setenv("KLINEAGE_GPU_NAME", "NVIDIA H200")
    return GateCache(tmp_path / "cache", tmp_path / "recorded")


def test_the_twin_is_the_same_checks_untimed():
    twin = TIMED.correctness_twin()
    assert (twin.timing, twin.vendor, twin.timing_case, twin.require_ratio) == (False, False, "", 0.0)
    assert (twin.seeds, twin.sanitize, twin.output_cap) == (TIMED.seeds, TIMED.sanitize, TIMED.output_cap)
    assert twin.fingerprint != TIMED.fingerprint and twin.correctness_twin() == twin
    # where the timed kernels sit changes no check: an exchanged gate shares the twin
    assert TIMED.with_(placement=Placement.EXCHANGED).correctness_twin() == twin


def _store_rejected_twin(cache: GateCache, kernel) -> Verdict:
    """The twin's verdict as the GPU would have stored it for a kernel wrong on one case."""
    return store_gpu_verdict(cache, SOFTMAX, kernel, TIMED.correctness_twin(), "rejected",
                             (Finding(Reason.INCORRECT, "correctness", "rel L2 0.5 on case odd", "odd"),),
                             correctness=[{"case": "odd", "kernel": "candidate", "seeds": [], "passed": False}])


def test_a_rejected_twin_decides_the_timed_gate_without_running_it(cache):
    kernel, parent = (
        corpus.kernel_entry("row_softmax/naive").load(),
        corpus.kernel_entry("row_softmax/warp_vec4").load(),
    )
    twin = _store_rejected_twin(cache, kernel)
    verdict = run_gate(SOFTMAX, kernel, against=parent, mode=GateMode.GPU, cache=cache, policy=TIMED)
    assert verdict.status is Status.REJECTED and verdict.reason is Reason.INCORRECT
    assert verdict.provenance["correctness_from"] == twin.provenance["key"]
    assert verdict.correctness == twin.correctness and "run" not in verdict.timings
    # The composed verdict is stored under the timed key: asked again, it is served.
    again = run_gate(SOFTMAX, kernel, against=parent, mode=GateMode.GPU, cache=cache, policy=TIMED)
    assert again.provenance["served_from"] == "cache"


def test_keeping_a_verdict_keeps_the_twin_it_reports(cache):
    kernel, parent = (
        corpus.kernel_entry("row_softmax/naive").load(),
        corpus.kernel_entry("row_softmax/warp_vec4").load(),
    )
    twin = _store_rejected_twin(cache, kernel)
    verdict = run_gate(SOFTMAX, kernel, against=parent, mode=GateMode.GPU, cache=cache, policy=TIMED)
    cache.keep(verdict)
    assert cache.recorded.get(verdict.provenance["key"]) is not None
    assert cache.recorded.get(twin.provenance["key"]) is not None


def test_a_pass_under_more_seeds_and_sanitizers_implies_a_lighter_pass():
    state = GatePolicy(seeds=3, timing=False, vendor=False, sanitize=Sanitize.ON_PASS)
    forward = GatePolicy(seeds=1, timing=True, vendor=False, sanitize=Sanitize.NEVER)
    assert state.passes_imply(forward) and state.passes_imply(state.with_(sanitize=Sanitize.ALWAYS))
    assert not forward.passes_imply(state)  # fewer seeds, no sanitizer
    assert not state.with_(seeds=1).passes_imply(state.with_(seeds=2))
    assert not state.passes_imply(forward.with_(launch_timeout_s=1.0))  # another check, not a lighter one


@pytest.mark.parametrize("status", ["passed", "rejected"])
def test_a_walk_states_pass_answers_its_forward_timings_correctness(cache, status):
    """With the walk's own policies: the state verdict is keyed by the state policy as it is (an
    untimed policy that still says `vendor`), not by its correctness twin."""
    kernel = corpus.kernel_entry("row_softmax/naive").load()
    state = walker.DEFAULT_POLICY
    forward = walker.forward_timing_policy(state)
    findings = (Finding(Reason.INCORRECT, "correctness", "rel L2 0.5 on case odd, seed 2", "odd"),)
    stored = store_gpu_verdict(cache, SOFTMAX, kernel, state, status, findings if status == "rejected" else ())
    timed_parts = {k: v for k, v in stored.provenance["key_parts"].items() if k != "version"}
    _, parts = verdict_key(**{**timed_parts, "policy": forward.fingerprint, "against": "parent"})
    found = _judged_twin(cache, forward, parts, judged_under=state)
    assert found == (stored if status == "passed" else None)  # only a pass carries over
    assert _judged_twin(cache, forward, parts) is None  # without it: no twin of the forward policy stored
    more_seeds = state.with_(seeds=4, timing=True)
    assert _judged_twin(cache, more_seeds, parts, judged_under=state) is None  # three seeds say nothing of a fourth
