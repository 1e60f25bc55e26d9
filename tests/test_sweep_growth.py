"""A problem's SWEEP table grows by appending cases: steps timed on every case before it grew keep serving
the cases they timed (pipeline.earlier_sweep_verdict), so only the steps a new case is meant to decide are
timed again. Read from the rope walk's every-case verdicts recorded on the H200, with no GPU."""

from __future__ import annotations

import pytest

from bench_tools import BENCH, bench_script
from klineage import corpus
from klineage.errors import ReplayMiss
from klineage.gate.pipeline import earlier_sweep_verdict, recorded_verdict
from klineage.gate.policy import GatePolicy, Placement, TimingScope
from klineage.lineage import Lineage
from klineage.walk.timing_audit import PERCASE_TRIAL_SECONDS, percase_step

STEP = 3  # the 16-byte store of the second half-row: timed on all 18 cases (6 judged, 12 sweep)
RECORDED = {"headline", "head_large", "decode_batch", "head_40", "tokens_tiny"}  # some of the 18


@pytest.fixture(scope="module")
def walk() -> Lineage:
    return Lineage.load(BENCH / "walks" / "rope_pack8.gpu.json.gz")


def _every_case(walk: Lineage) -> GatePolicy:
    policy = GatePolicy.from_dict(walk.policy["forward_timing"])
    return policy.with_(timing_scope=TimingScope.EVERY_CASE, trial_seconds=min(policy.trial_seconds,
                                                                               PERCASE_TRIAL_SECONDS))


def _rope_with(tmp_path, sweep_edit) -> str:
    source = corpus.problem_path("rope").read_text(encoding="utf-8")
    grown = tmp_path / "rope.py"
    grown.write_text(sweep_edit(source), encoding="utf-8")
    return str(grown)


def _gate(walk: Lineage, problem: str, serve):
    return serve(problem, walk.states[STEP].kernel, against=walk.states[STEP + 1].kernel, policy=_every_case(walk))


def test_an_appended_sweep_case_leaves_the_earlier_timings_served(walk, tmp_path):
    appended = _rope_with(tmp_path, lambda s: s.replace(
        '    "decode_batch": {"b": 64, "s": 1, "h": 32, "d": 128},  # 16384 packs, one token each\n',
        '    "decode_batch": {"b": 64, "s": 1, "h": 32, "d": 128},  # 16384 packs, one token each\n'
        '    "tokens_huge": {"b": 64, "s": 4096, "h": 32, "d": 128},\n', 1))
    with pytest.raises(ReplayMiss):  # today's table, with the new case, was never timed
        _gate(walk, appended, recorded_verdict)
    verdict = _gate(walk, appended, earlier_sweep_verdict)
    timed = set(verdict.profile["per_case"])
    assert len(timed) == 18 and RECORDED <= timed and "tokens_huge" not in timed


def test_a_changed_sweep_case_is_a_different_measurement(walk, tmp_path):
    """Its last sweep case changed, today's table was never timed; the step was also timed before the
    rope sweep gained its last six cases, and that table is a prefix of this one: it is served."""
    changed = _rope_with(tmp_path, lambda s: s.replace('"decode_batch": {"b": 64,', '"decode_batch": {"b": 65,', 1))
    with pytest.raises(ReplayMiss):
        _gate(walk, changed, recorded_verdict)
    timed = set(_gate(walk, changed, earlier_sweep_verdict).profile["per_case"])
    assert len(timed) == 12 and not timed & {"decode_batch", "head_40", "tokens_tiny"} and "head_large" in timed


def test_the_table_the_step_was_timed_on_is_served_as_it_was(walk):
    problem = str(corpus.problem_path("rope"))
    assert _gate(walk, problem, earlier_sweep_verdict).to_dict() == _gate(walk, problem, recorded_verdict).to_dict()


def test_a_step_never_timed_on_any_table_is_a_miss(walk):
    problem, kernel = str(corpus.problem_path("rope")), walk.states[STEP].kernel
    with pytest.raises(ReplayMiss):
        earlier_sweep_verdict(problem, kernel, against=kernel, policy=_every_case(walk))


def test_the_estimate_of_a_step_timed_before_is_what_that_timing_took_scaled_to_the_cases(walk):
    """bench/percase.py plans a call from what a step's earlier every-case timing took: the headline model
    says about 18 s for rope step 3 on 18 cases, where the gate took more than 25."""
    percase = bench_script("percase")
    recorded = percase_step(walk, STEP)
    took = sum(v for stage, v in recorded.timings.items() if "." not in stage)
    assert percase.estimate_s(walk, STEP, 18, Placement.AS_LOADED) == pytest.approx(took)
    per_case = recorded.timings["run.profile_every_case"] / 18
    assert percase.estimate_s(walk, STEP, 24, Placement.AS_LOADED) == pytest.approx(took + 6 * per_case)
    assert percase.estimate_s(walk, STEP, 18, Placement.EXCHANGED) == pytest.approx(took + 18 * per_case)
    assert took > 25
