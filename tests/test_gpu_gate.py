"""The gate on a real GPU (skipped without one): a correct kernel passes and is timed, wrong ones
are rejected for the right reason, and a hung kernel costs a timeout, not the runner."""

from __future__ import annotations

import os
import time

import pytest

from klineage import corpus
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Placement, Sanitize
from klineage.gate.verdict import Reason, Status

pytestmark = pytest.mark.gpu
SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> GateCache:
    """A fresh local cache; recordings go to KLINEAGE_RECORDED_DIR when that is set (GPU sessions)."""
    recorded = os.environ.get("KLINEAGE_RECORDED_DIR")
    return GateCache(tmp_path_factory.mktemp("gate-cache"), recorded or None)


def gate(name: str, cache: GateCache, **kwargs):
    return run_gate(SOFTMAX, corpus.kernel_entry(name).load(), cache=cache,
                    record=bool(os.environ.get("KLINEAGE_RECORDED_DIR")), **kwargs)


def test_correct_kernel_passes_every_case_and_is_timed_against_vendor(cache):
    verdict = gate("row_softmax/warp_vec4", cache, policy=GatePolicy(sanitize=Sanitize.ON_PASS))
    assert verdict.status is Status.PASSED, verdict.findings
    assert {r["case"] for r in verdict.correctness if r["passed"]} == set(verdict.cases)
    contenders = verdict.profile["contenders"]
    assert set(contenders) == {"candidate", "vendor"}
    assert contenders["candidate"]["count"] >= 3 * GatePolicy().min_reps
    ratio = verdict.profile["ratios"]["vs_vendor"]
    assert ratio["overall"] > 0 and len(ratio["per_trial"]) == GatePolicy().trials
    assert 0 < verdict.profile["roofline"]["fraction"]["candidate"] <= 1.05
    assert verdict.sanitizer["memcheck"]["status"] == "clean"
    assert verdict.sanitizer["racecheck"]["status"] == "clean"
    assert verdict.environment["gpu"].startswith("NVIDIA")
    checked = verdict.environment["vendor_check"]  # the yardstick is itself right on every case
    assert sorted(c["case"] for c in checked) == sorted(verdict.cases) and all(c["passed"] for c in checked)


def test_an_untimed_gate_does_not_check_the_vendor(cache):
    """The vendor is only a yardstick for timings (GDN's took 110-140 s of an untimed state gate)."""
    verdict = gate("row_softmax/warp_vec4", cache, policy=GatePolicy(sanitize=Sanitize.NEVER, timing=False))
    assert verdict.status is Status.PASSED, verdict.findings
    assert verdict.environment["vendor_check"] == []
    assert "run.vendor_check" not in verdict.timings


@pytest.mark.parametrize("name, reason", [
    ("adversarial/write_zeros", Reason.INCORRECT),
    ("adversarial/write_nothing", Reason.UNWRITTEN_OUTPUT),
    ("adversarial/modify_input", Reason.INPUT_MODIFIED),
    ("adversarial/write_out_of_bounds", Reason.OUT_OF_BOUNDS_WRITE),
])
def test_wrong_kernels_rejected_with_their_reason(cache, name, reason):
    verdict = gate(name, cache, policy=GatePolicy(sanitize=Sanitize.NEVER, timing=False))
    assert verdict.status is Status.REJECTED
    assert verdict.reason is reason, verdict.findings


def test_a_hang_is_a_timeout_and_the_next_kernel_still_runs(cache):
    policy = GatePolicy(sanitize=Sanitize.NEVER, timing=False, launch_timeout_s=5.0)
    started = time.monotonic()
    verdict = gate("adversarial/hang", cache, policy=policy)
    assert verdict.reason is Reason.TIMEOUT
    assert time.monotonic() - started < 60
    after = gate("row_softmax/naive", cache, policy=policy, cases=["small"])
    assert after.status is Status.PASSED


def test_exchanged_places_time_each_kernel_in_every_kernels_place(cache):
    """Where a module lands can move a big kernel's time (docs/perf-notes.md, session 15); an
    exchanged gate reloads the two kernels between trials, each in the other's place."""
    policy = GatePolicy(sanitize=Sanitize.NEVER, vendor=False, placement=Placement.EXCHANGED)
    verdict = gate(
        "row_softmax/warp_vec4", cache, policy=policy, against=corpus.kernel_entry("row_softmax/naive").load()
    )
    assert verdict.status is Status.PASSED, verdict.findings
    placed = verdict.profile["placement"]
    assert placed["arrangements"] == [["candidate", "baseline"], ["baseline", "candidate"]]
    assert set(placed["medians_us"]) == {"candidate", "baseline"}
    assert all(len(m) == 2 and min(m) > 0 for m in placed["medians_us"].values())
    ratio = verdict.profile["ratios"]["vs_baseline"]  # one paired ratio per round of both arrangements
    assert len(ratio["per_trial"]) == policy.trials
    assert verdict.profile["contenders"]["candidate"]["count"] >= 2 * policy.trials * policy.min_reps
    assert ratio["overall"] > 1.0  # the naive kernel is slower than the vectorised one, in either place


def test_float_atomics_pass_where_the_problem_allows_run_to_run_differences(cache, tmp_path):
    """The held-out scatter-add adds with fp32 atomics: judged run by run against the reference it passes; the
    same contract demanding bit-identical runs (the default) rejects it as nondeterministic."""
    from pathlib import Path

    from klineage.kernel import load_kernel

    folder = Path(__file__).resolve().parent.parent / "bench" / "transfer" / "scatter_add"
    naive, untimed = load_kernel(folder / "naive"), GatePolicy(timing=False, sanitize=Sanitize.NEVER)
    verdict = run_gate(folder / "problem.py", naive, cache=cache, policy=untimed)
    assert verdict.status is Status.PASSED, verdict.findings
    strict = tmp_path / "problem.py"
    strict.write_text((folder / "problem.py").read_text().replace('RUN_TO_RUN = "within_tolerance"', ""))
    verdict = run_gate(strict, naive, cache=cache, policy=untimed)
    assert verdict.status is Status.REJECTED and verdict.reason is Reason.NONDETERMINISTIC, verdict.findings
