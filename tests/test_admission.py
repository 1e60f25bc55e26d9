"""Held-out roundtrip admission of cards induced from the committed dry walk of
row_softmax/warp_vec4.

Targets come from real states: the bundled kernels, the tiny softmax under
tests/fixtures/materialize/, and the committed dry walk of topk/radix_select. Trials run the real
gate: compile-only (what this machine can do: always inconclusive, so nothing is admitted), replay
with an empty store (a miss: inconclusive), and GPU-style verdicts for the timed branches: the
real compile-only verdict of the materialized kernel given a passing or rejecting outcome and a
paired ratio, as a GPU gate reports them (the same way test_induction gives lineages GPU-style
verdicts)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench_tools import session_stage
from klineage import corpus
from klineage.config import GateMode
from klineage.errors import DocumentError, KLineageError
from klineage.gate.cache import GateCache
from klineage.gate.machine_code import CodeCheck, CodeIdentity, same_machine_code
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Finding, Reason, Status
from klineage.kernel import load_kernel
from klineage.lineage import Lineage
from klineage.skills.admission import (
    GateSetting,
    Target,
    admit,
    applied_to,
    held_out_targets,
    judged_alike,
    measurements,
)
from klineage.skills.admission_rule import card_digest, rejudge, required_ratio, short_of_todays_rule, when_allows
from klineage.skills.admission_run import POLICY
from klineage.skills.card import CardStatus, Effect, Precondition, Ref, RefKind, Trial, TrialBasis
from klineage.skills.induction import lineage_id
from klineage.skills.library import Library, problem_infos
from klineage.skills.trial_reading import Reading, TrialOutcome, reading, trial_outcome
from klineage.skills.when import unpaid_when
from library_data import dry_cards_by_transform
from lineage_data import DRY_WALK

ROOT = Path(__file__).resolve().parents[1]
TOPK = ROOT / "corpus" / "lineages" / "topk_radix_select.dry.json"
TINY = ROOT / "tests" / "fixtures" / "materialize" / "tiny_softmax"


@pytest.fixture(scope="module")
def lineages():
    return [Lineage.load(DRY_WALK), Lineage.load(TOPK)]


@pytest.fixture(scope="module")
def cards():
    return dry_cards_by_transform()


def tiny_target() -> Target:
    return Target("tiny_softmax", "row_softmax", load_kernel(TINY))


def compile_gate(cache):
    def gate(problem_path, kernel, against, case=""):
        return run_gate(problem_path, kernel, against=against, mode=GateMode.COMPILE_ONLY, cache=cache)
    return gate


def timed_gate(cache, ratio: float | None, status: Status = Status.PASSED):
    """The real compile-only verdict, given the outcome and paired ratio a GPU gate would report."""
    def gate(problem_path, kernel, against, case=""):
        verdict = compile_gate(cache)(problem_path, kernel, against, case)
        profile = {"ratios": {"vs_baseline": {"overall": ratio, "per_trial": [ratio] * 3}}} if ratio else {}
        findings = (Finding(Reason.INCORRECT, "correctness", "case ragged: 12 elements differ", "ragged"),) \
            if status is Status.REJECTED else ()
        return dataclasses.replace(verdict, status=status, profile=profile, findings=findings)
    return gate


def with_effect(card, ratio: float):
    ref = Ref(lineage_id(Lineage.load(DRY_WALK)), RefKind.TRANSITION, 0)
    return dataclasses.replace(card, effects=(Effect("headline", "row_softmax", ratio, (ratio, ratio * 1.01,
                                                                                        ratio * 0.99), ref),))


def with_case_effects(card, ratios: list[float]):
    """The card timed on one case per ratio (as bench/percase.py times a step on every case)."""
    ref = Ref(lineage_id(Lineage.load(DRY_WALK)), RefKind.TRANSITION, 0)
    return dataclasses.replace(card, effects=tuple(Effect(f"case{i}", "row_softmax", r, (r, r, r), ref)
                                                   for i, r in enumerate(ratios)))


@pytest.mark.parametrize("ratios, kind, status", [
    ([1.0] * 6, "never", CardStatus.RETIRED),  # timed on six cases, paid on none: contradicted
    ([1.2] * 4 + [0.98] * 4, "mixed", CardStatus.CANDIDATE),  # pays somewhere, nothing says where
    ([1.2] * 7, "uniform", CardStatus.CANDIDATE),  # paid on every case, but on fewer than eight
])
def test_a_card_whose_cases_do_not_say_where_it_pays_is_not_admitted(cards, ratios, kind, status):
    """A card timed per case is admitted only where its cases say where it pays (a forced precondition, or
    paid on every one of eight cases or more). A trial of a card they keep out costs no gate, and an
    admitted one is retired (paid nowhere) or a candidate again."""
    card = with_case_effects(cards["launch_bounds"], ratios)
    assert unpaid_when(card).kind.value == kind

    def gate(problem_path, kernel, against, case=""):
        raise AssertionError("a trial that cannot admit must not spend a gate evaluation")

    updated, [trial] = admit(card, [tiny_target()], corpus.problem_path, gate)
    assert trial_outcome(trial) is TrialOutcome.INCONCLUSIVE and "do not say where it pays" in trial.message
    assert updated.status is CardStatus.CANDIDATE
    assert when_allows(card, CardStatus.ADMITTED) is status
    admitted, _ = admit(dataclasses.replace(card, status=CardStatus.ADMITTED), [tiny_target()], corpus.problem_path,
                        gate)
    assert admitted.status is status


def test_paid_on_every_case_or_timed_on_headlines_alone_the_trial_decides(cards, gate_cache):
    """Paid on all of eight cases says where the card pays; a card timed on its steps' headlines alone (one
    case a step, as a library built before per-case timing) cannot say, so its trials decide as before."""
    ref = Ref(lineage_id(Lineage.load(DRY_WALK)), RefKind.TRANSITION, 0)
    headlines = dataclasses.replace(cards["launch_bounds"], effects=tuple(
        Effect("headline", op, 1.0, (1.0, 1.0, 1.0), dataclasses.replace(ref, index=i))
        for i, op in enumerate(("row_softmax", "gemm", "topk", "conv2d"))))
    for card in (with_case_effects(cards["launch_bounds"], [1.2] * 8), headlines):
        assert unpaid_when(card) is None
        updated, [trial] = admit(card, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, 1.2))
        assert trial_outcome(trial) is TrialOutcome.PASSED and updated.status is CardStatus.ADMITTED


def test_held_out_targets_skip_the_source_lineage_and_need_a_site(cards, lineages):
    states = {name: corpus.kernel_entry(name).load() for name in
              ("row_softmax/naive", "row_softmax/warp_vec4", "gemm/naive", "topk/radix_select")}
    states["tiny_softmax"] = load_kernel(TINY)
    source = {s.fingerprint for s in lineages[0].states}
    for card in cards.values():
        targets = held_out_targets(card, lineages, states)
        assert not [t for t in targets if t.state.fingerprint in source], card.transform
        assert len({t.state.fingerprint for t in targets}) == len(targets)
        assert "row_softmax/warp_vec4" not in [t.name for t in targets]  # the card's own expert
    launch = [t.name for t in held_out_targets(cards["launch_bounds"], lineages, states)]
    assert launch[0] == "tiny_softmax"  # bundled kernels first; the naive softmax already has the bound
    assert "row_softmax/naive" not in launch
    restrict = held_out_targets(cards["restrict"], lineages, states)
    topk = [t for t in restrict if t.name.startswith(lineage_id(lineages[1]))]
    assert topk and all(t.problem == "topk" for t in topk)  # the topk walk's states without __restrict__
    assert [t.name for t in restrict][:1] == ["tiny_softmax"]


def test_with_the_code_check_a_target_the_compiler_already_unrolled_is_no_target(cards, lineages):
    """nvcc unrolls the naive and the tiny softmax's loops itself: the unroll card's kernels of them run their own
    machine code, so a trial there would time the compiler, not the card; the topk walk's states are left."""
    states = {"tiny_softmax": load_kernel(TINY), "row_softmax/naive": corpus.kernel_entry("row_softmax/naive").load()}
    card = cards["unroll"]
    unchecked = held_out_targets(card, lineages, states, 2)
    assert [t.name for t in unchecked] == ["row_softmax/naive", "tiny_softmax"]
    assert all(same_machine_code(t.state, applied_to(card, t).state) is CodeIdentity.SAME for t in unchecked)
    checked = held_out_targets(card, lineages, states, 1, code_check=CodeCheck.SASS)
    assert [t.problem for t in checked] == ["topk"]
    assert same_machine_code(checked[0].state, applied_to(card, checked[0]).state) is CodeIdentity.DIFFERENT


def test_compile_only_trials_are_inconclusive_and_admit_nothing(cards, gate_cache):
    card = with_effect(cards["launch_bounds"], 1.1)
    updated, trials = admit(card, [tiny_target()], corpus.problem_path, compile_gate(gate_cache))
    assert [trial_outcome(t) for t in trials] == [TrialOutcome.INCONCLUSIVE]
    assert "compiled verdict" in trials[0].message and not trials[0].passed
    assert trials[0].state == load_kernel(TINY).fingerprint
    assert updated.status is CardStatus.CANDIDATE and updated.verification_log == tuple(trials)
    assert updated.id == card.id  # trials do not change who the card is


def test_a_replay_miss_is_inconclusive(cards, tmp_path):
    empty = GateCache(tmp_path / "cache", tmp_path / "recorded")

    def replay(problem_path, kernel, against, case=""):
        return run_gate(problem_path, kernel, against=against, mode=GateMode.REPLAY, cache=empty)

    _, [trial] = admit(with_effect(cards["restrict"], 1.1), [tiny_target()], corpus.problem_path, replay)
    assert trial_outcome(trial) is TrialOutcome.INCONCLUSIVE and "could not judge" in trial.message


def test_a_timed_pass_reaching_the_declared_effect_admits(cards, gate_cache):
    card = with_effect(cards["launch_bounds"], 1.2)
    assert required_ratio(card) == pytest.approx((1.2 * (1 - 0.05)) ** 0.5)
    updated, [trial] = admit(card, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, 1.18))
    assert trial_outcome(trial) is TrialOutcome.PASSED and trial.passed and trial.ratio == 1.18
    assert updated.status is CardStatus.ADMITTED
    assert updated.verification_log[-1] == trial


def test_slower_than_declared_fails_and_retires_an_admitted_card(cards, gate_cache):
    card = with_effect(cards["launch_bounds"], 1.2)
    updated, [trial] = admit(card, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, 1.0))
    assert trial_outcome(trial) is TrialOutcome.FAILED and "below the 1.068x" in trial.message
    assert updated.status is CardStatus.CANDIDATE
    admitted = dataclasses.replace(card, status=CardStatus.ADMITTED)
    retired, _ = admit(admitted, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, 1.0))
    assert retired.status is CardStatus.RETIRED


def gate_per_target(cache, *outcomes: tuple[float | None, Status]):
    """The timed gate with one (ratio, status) per call, in the order admit trials its targets."""
    left = list(outcomes)

    def gate(problem_path, kernel, against, case=""):
        ratio, status = left.pop(0)
        return timed_gate(cache, ratio, status)(problem_path, kernel, against, case)
    return gate


@pytest.mark.parametrize("other, admitted", [((0.94, Status.PASSED), True), ((None, Status.REJECTED), False)])
def test_a_slower_trial_beside_a_passed_one_admits_a_rejected_one_does_not(cards, gate_cache, other, admitted):
    """Session 7's pipeline card: 0.939x on conv2d's pointwise case (where a short reduction does
    not pay for the stages), its effect shown elsewhere. A slower trial says where the mechanism
    does not pay; a rejected one, that the card is unsound somewhere."""
    card = with_effect(cards["launch_bounds"], 1.2)
    gate = gate_per_target(gate_cache, other, (1.2, Status.PASSED))
    updated, trials = admit(card, [tiny_target(), tiny_target()], corpus.problem_path, gate, limit=2)
    assert [trial_outcome(t) for t in trials] == [TrialOutcome.FAILED, TrialOutcome.PASSED]
    assert reading(trials[0]) is (Reading.SLOWER if admitted else Reading.REJECTED)
    assert updated.status is (CardStatus.ADMITTED if admitted else CardStatus.CANDIDATE)


@pytest.mark.parametrize("trial_ratio, outcome", [(7.1, TrialOutcome.PASSED), (3.0, TrialOutcome.FAILED)])
def test_a_large_gain_must_keep_its_order_of_magnitude_on_another_shape(cards, gate_cache, trial_ratio, outcome):
    card = with_effect(cards["launch_bounds"], 11.3)  # mma.sync's conv2d headline gain; its pointwise case: 7.1x
    assert required_ratio(card) == pytest.approx((11.3 * 0.95) ** 0.5)  # 3.28x
    _, [trial] = admit(card, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, trial_ratio))
    assert trial_outcome(trial) is outcome


def test_rejudge_reads_the_recorded_ratios_of_this_content_again(cards):
    card = with_effect(cards["launch_bounds"], 11.3)
    ours = TrialBasis("gpu", "NVIDIA H200", "p" * 64, "q" * 64, card_digest(card), "c" * 64)
    theirs = dataclasses.replace(ours, card="d" * 64)
    log = (Trial("a" * 64, False, 7.1, "failed: t1: passed at 7.100x, below the 10.735x the card's effects require",
                 ours),
           Trial("b" * 64, False, 7.1, "failed: t2: passed at 7.100x, below the 10.735x", theirs),
           Trial("e" * 64, False, None, "failed: t3: rejected (incorrect): 12 elements differ", ours))
    updated, changed = rejudge(dataclasses.replace(card, verification_log=log))
    assert [t.state for t in changed] == ["a" * 64]
    first, second, third = updated.verification_log
    assert trial_outcome(first) is TrialOutcome.PASSED and first.passed and first.ratio == 7.1
    assert "re-judged" in first.message and "first read as failed: t1" in first.message
    assert (second, third) == log[1:]  # another content's trial, and a rejection: no ratio to read again
    assert updated.status is CardStatus.CANDIDATE  # the rejection of this content still stands
    alone, _ = rejudge(dataclasses.replace(card, verification_log=log[:2]))
    assert alone.status is CardStatus.ADMITTED
    assert rejudge(alone) == (alone, [])  # judged under today's rule already: nothing changes
    slow = Trial("f" * 64, False, 0.94, "failed: t4: passed at 0.940x, below the 3.277x", ours)
    kept_out = dataclasses.replace(card, verification_log=(first, slow))  # read under an older status rule
    decided, none_changed = rejudge(kept_out)
    assert none_changed == [] and decided.status is CardStatus.ADMITTED  # the status is decided again all the same


def test_effects_that_move_the_ask_past_no_trial_are_judged_alike(cards):
    """Timed on every case, a card's effects ask trials less (a 12x headline gain with an 8x case); a
    log whose timed trials all clear both asks reads the same under either, so its status carries.
    One trial between the two asks would read otherwise: not alike, the card is tried again."""
    before, after = with_effect(cards["launch_bounds"], 12.0), with_effect(cards["launch_bounds"], 8.0)
    assert required_ratio(after) < required_ratio(before)
    basis = TrialBasis("gpu", "NVIDIA H200", "p" * 64, "q" * 64, card_digest(before), "c" * 64)
    log = (Trial("a" * 64, True, 9.5, "passed: t1", basis), Trial("b" * 64, False, 1.2, "failed: t2: 1.200x", basis),
           Trial("e" * 64, False, None, "failed: t3: rejected (incorrect)", basis))
    assert judged_alike(dataclasses.replace(before, verification_log=log), after)
    between = Trial("f" * 64, False, 3.0, "failed: t4: passed at 3.000x, below the 3.376x", basis)
    assert required_ratio(after) < 3.0 < required_ratio(before)
    assert not judged_alike(dataclasses.replace(before, verification_log=log + (between,)), after)
    declared = dataclasses.replace(after, preconditions=(Precondition("n >= 4", "n is at least 4", ("a",), ("b",),
                                                                      "timing"),))
    assert not judged_alike(dataclasses.replace(before, verification_log=log), declared)  # more than effects


def test_a_rejected_kernel_fails_the_trial(cards, gate_cache):
    card = with_effect(cards["restrict"], 1.05)
    updated, [trial] = admit(card, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, None, Status.REJECTED))
    assert trial_outcome(trial) is TrialOutcome.FAILED and "rejected (incorrect)" in trial.message
    assert updated.status is CardStatus.CANDIDATE and len(updated.verification_log) == 1


def test_without_a_declared_effect_the_trial_is_inconclusive_and_costs_no_gate(cards):
    assert required_ratio(cards["unroll"]) is None  # a dry walk's card: nothing was timed
    gated = []

    def gate(problem_path, kernel, against, case=""):
        gated.append(kernel)
        raise AssertionError("a trial that cannot admit must not spend a gate evaluation")

    updated, [trial] = admit(cards["unroll"], [tiny_target()], corpus.problem_path, gate)
    assert trial_outcome(trial) is TrialOutcome.INCONCLUSIVE and "no measured effect" in trial.message
    assert trial.ratio is None and updated.status is CardStatus.CANDIDATE and not gated


def test_a_precondition_failing_on_the_target_problem_is_no_fair_trial(cards, gate_cache):
    card = dataclasses.replace(with_effect(cards["launch_bounds"], 1.2), preconditions=(
        Precondition("cols % 4 == 0", "cols must be a multiple of 4"),))
    _, [trial] = admit(card, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, 1.3),
                       problems=problem_infos({"row_softmax"}))
    assert trial_outcome(trial) is TrialOutcome.INCONCLUSIVE and "not a fair trial" in trial.message


def test_limits_and_records(cards, gate_cache):
    targets = [tiny_target(), Target("naive", "row_softmax", corpus.kernel_entry("row_softmax/naive").load())]
    updated, trials = admit(cards["unroll"], targets, corpus.problem_path, compile_gate(gate_cache), limit=1)
    assert len(trials) == 1 and len(updated.verification_log) == 1
    with pytest.raises(KLineageError, match="at least one trial"):
        admit(cards["unroll"], targets, corpus.problem_path, compile_gate(gate_cache), limit=0)
    with pytest.raises(DocumentError, match="outcome"):
        trial_outcome(Trial("f" * 64, False, None, "maybe: something"))
    with pytest.raises(DocumentError, match="target.name"):
        Target("", "row_softmax", load_kernel(TINY))


def test_held_out_cases_come_after_the_other_targets_and_avoid_measured_cases(cards, lineages):
    card = with_effect(cards["restrict"], 1.1)  # measured on row_softmax's headline
    problems = problem_infos({"row_softmax", "topk"})
    softmax = problems["row_softmax"]
    without = held_out_targets(card, lineages, {}, limit=50)
    with_cases = held_out_targets(card, lineages, {}, limit=50, problems=problems)
    assert with_cases[:len(without)] == without and len(with_cases) > len(without)
    walk = lineages[0]
    for target in with_cases[len(without):]:
        step = int(target.name.split("@")[-1].split(" ")[0])
        assert target.state == walk.states[step].kernel  # the child of one of the card's transitions
        assert target.anchors == (walk.transitions[step - 1].anchor,)
        assert target.case in {c.name for c in softmax.cases} - {"headline", softmax.headline}
        assert target.name.endswith(f"on case {target.case}") and target.to_dict()["case"] == target.case
    # Every evidence transition is measured only on the headline: the largest other case is held out.
    sizes = {c.name: softmax.roofline[c.name]["bytes"] for c in softmax.cases if c.name != softmax.headline}
    assert {t.case for t in with_cases[len(without):]} == {max(sizes, key=sizes.get)}


def test_a_card_timed_on_every_case_is_replicated_on_its_largest_case_where_it_says_it_pays(cards, lineages):
    """No case is left unmeasured once a step is timed per case: admission then times the card again on
    the largest measured case, and with a timing precondition only where that precondition holds."""
    walk = lineages[0]
    info = problem_infos({walk.problem.operator})[walk.problem.operator]
    ref = Ref(lineage_id(walk), RefKind.TRANSITION, 0)
    every = [c.name for c in info.cases]
    card = dataclasses.replace(cards["restrict"], evidence=(ref,), effects=tuple(
        Effect(case, info.operator, 1.1, (1.1, 1.1, 1.1), ref) for case in every))
    problems = {info.operator: info}
    sizes = {c.name: info.roofline[c.name]["bytes"] for c in info.cases if c.name != info.headline}
    [target] = held_out_targets(card, [walk], {}, limit=50, problems=problems)
    assert target.case == max(sizes, key=sizes.get)
    assert target.name.endswith("(measured per case already: a replication)")
    assert target.state == walk.states[1].kernel
    smaller = min(sizes, key=sizes.get)
    timing = Precondition(f"case_is_{smaller}", f"pays on {smaller} alone", holds=(f"{info.operator}:{smaller}",),
                          fails=tuple(f"{info.operator}:{c}" for c in sizes if c != smaller), source="timing",
                          loo_accuracy=1.0)
    [target] = held_out_targets(dataclasses.replace(card, preconditions=(timing,)), [walk], {}, limit=50,
                                problems=problems)
    assert target.case == smaller  # the largest case where it holds, not the largest case
    nowhere = dataclasses.replace(timing, holds=(), fails=tuple(f"{info.operator}:{c}" for c in sizes))
    assert held_out_targets(dataclasses.replace(card, preconditions=(nowhere,)), [walk], {}, limit=50,
                            problems=problems) == []


def test_a_held_out_case_trial_is_timed_on_that_case(cards, lineages, gate_cache):
    card = with_effect(cards["restrict"], 1.1)
    target = held_out_targets(card, lineages, {}, limit=50, problems=problem_infos({"row_softmax", "topk"}))[-1]
    asked = []

    def gate(problem_path, kernel, against, case):
        asked.append(case)
        return timed_gate(gate_cache, 1.2)(problem_path, kernel, against, case)

    updated, [trial] = admit(card, [target], corpus.problem_path, gate)
    assert asked == [target.case] and trial_outcome(trial) is TrialOutcome.PASSED
    assert f"on case {target.case}" in trial.message and updated.status is CardStatus.ADMITTED


def test_a_card_without_a_mechanical_forward_is_trialled_by_replaying_its_step():
    """unpipeline has no mechanical forward, so no state could ever be its target; on a held-out
    case of its own walk step, the step's recorded forward diff gives back exactly the parent."""
    from klineage.skills.library import corpus_lineages, load_library

    library = load_library(ROOT / "corpus" / "library" / "library.json")
    lineages, _ = corpus_lineages()
    [card] = [c for c in library.cards if c.transform == "unpipeline"]
    targets = held_out_targets(card, lineages, {}, 2, problem_infos({"conv2d", "gemm"}))
    assert targets and all(t.case for t in targets)
    by_id = {lineage_id(lin): lin for lin in lineages}
    for target in targets:
        name, step = target.name.split(" on case ")[0].rsplit("@", 1)
        walk = by_id[name]
        assert target.state.fingerprint == walk.states[int(step)].kernel.fingerprint
        applied = applied_to(card, target)
        assert applied.state.fingerprint == walk.states[int(step) - 1].kernel.fingerprint
    assert applied_to(card, dataclasses.replace(targets[0], forward_diff="")) is None


def test_the_gpu_session_admits_a_card_of_a_bench_walk_on_a_replication(gate_cache, tmp_path):
    """The admit stage, given the percase library and the walks it was built from (ADMIT_LINEAGES), finds the
    warp_mma card of conv2d_implicit_wgmma's walk a target: that walk's step on its largest case, measured per
    case already (python3 a shim that turns the GPU gate into the compile gate: trials are inconclusive here)."""
    walk = ROOT / "bench" / "walks" / "conv2d_implicit_wgmma.gpu.json.gz"
    done, argv = session_stage("admit@240", tmp_path, {
        "ADMIT_FROM": "bench/results/percase/library.json", "ADMIT_CARDS": "713b836a4adc", "ADMIT_LIMIT": "2",
        "ADMIT_LINEAGES": "bench/walks/conv2d_implicit_wgmma.gpu.json.gz", "ADMIT_JOBS": "1",
        "REBUILD_TRIALS": "bench/results/percase/library.json"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert argv[argv.index("--lineages") + 1] == str(walk.relative_to(ROOT))
    # the library a rebuild kept the trials of is where a renamed card's measurements are
    assert argv[argv.index("--measurements") + 1] == "bench/results/percase/library.json"
    library = json.loads((tmp_path / "out" / "library.json").read_text())
    [card] = [c for c in library["cards"] if c["id"].startswith("713b836a4adc")]
    messages = [t["message"] for t in card["verification_log"]]
    wgmma = lineage_id(Lineage.load(walk))
    assert any(m.startswith(f"inconclusive: {wgmma}@") and "(measured per case already: a replication)" in m
               for m in messages), messages
    before = json.loads((ROOT / "bench" / "results" / "percase" / "library.json").read_text())
    [was] = [c for c in before["cards"] if c["id"] == card["id"]]
    assert card["status"] == was["status"]  # an inconclusive trial decides nothing


def test_a_trial_that_shows_no_gain_does_not_admit_a_card_of_a_small_gain(cards, gate_cache):
    """A 1.03x card asks a trial for the gain the optimize loop takes a step on (1.01x), not for "no more
    than 1% slower": 0.999x on a held-out target has not reproduced the mechanism's gain."""
    card = with_effect(cards["launch_bounds"], 1.03)
    assert required_ratio(card) == pytest.approx(1.01)
    updated, [trial] = admit(card, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, 0.999))
    assert trial_outcome(trial) is TrialOutcome.FAILED and "below the 1.010x" in trial.message
    assert updated.status is not CardStatus.ADMITTED


@pytest.mark.parametrize("trial_ratio, outcome", [(1.0099, TrialOutcome.FAILED), (1.0101, TrialOutcome.INCONCLUSIVE),
                                                   (1.0249, TrialOutcome.INCONCLUSIVE), (1.0252, TrialOutcome.PASSED)])
def test_a_trial_inside_the_gate_s_spread_of_the_ask_is_inconclusive(cards, gate_cache, trial_ratio, outcome):
    """1.012x against an ask of 1.010x is inside what a fresh gate of the same pair moves (1.5%): it neither
    reproduces the gain nor refutes it, so it admits nothing; beyond 1.010 x 1.015 it passes, below 1.010 it fails."""
    card = with_effect(cards["launch_bounds"], 1.03)
    updated, [trial] = admit(card, [tiny_target()], corpus.problem_path, timed_gate(gate_cache, trial_ratio))
    assert trial_outcome(trial) is outcome and trial.ratio == pytest.approx(trial_ratio)
    assert (updated.status is CardStatus.ADMITTED) is (outcome is TrialOutcome.PASSED)
    if outcome is TrialOutcome.INCONCLUSIVE:
        assert "by under 1.5%, the gate's run-to-run spread" in trial.message


def test_rejudge_reads_a_pass_inside_the_spread_as_inconclusive_and_takes_the_admission_back(cards):
    card = with_effect(cards["launch_bounds"], 1.03)  # asks 1.010x
    ours = TrialBasis("gpu", "NVIDIA H200", "p" * 64, "q" * 64, card_digest(card), "c" * 64)
    close = Trial("a" * 64, True, 1.012, "passed: t1: 1 site(s) -> x; 1.012x (required 1.010x)", ours)
    admitted = dataclasses.replace(card, verification_log=(close,), status=CardStatus.ADMITTED)
    updated, [changed] = rejudge(admitted)
    assert trial_outcome(changed) is TrialOutcome.INCONCLUSIVE and not changed.passed and changed.ratio == 1.012
    assert "re-judged" in changed.message and "first read as passed: t1" in changed.message
    assert updated.status is CardStatus.CANDIDATE  # the admission rested on that pass alone
    assert "would be candidate now" in short_of_todays_rule(admitted)
    clear = Trial("b" * 64, True, 1.06, "passed: t2: 1 site(s) -> y; 1.060x (required 1.010x)", ours)
    fresh, _ = rejudge(dataclasses.replace(card, verification_log=(close, clear)))
    assert fresh.status is CardStatus.ADMITTED
    assert fresh.verification_log[1] == clear  # a clear pass beside it keeps the card admitted


def test_a_card_that_says_where_it_pays_is_tried_on_a_case_where_that_holds(cards):
    """On another kernel of the problem, a card measured to pay on long rows only is timed on the largest
    case whose rows are long, not on the headline, where it says it does not pay; where no case of the
    problem holds, the kernel is no target for it."""
    from klineage.skills.admission import fair_case

    info = problem_infos({"row_softmax"})["row_softmax"]

    def paying_where(expression):
        return dataclasses.replace(cards["launch_bounds"], preconditions=(
            Precondition(expression, f"pays where {expression}", ("row_softmax:long_rows",), ("row_softmax:headline",),
                         "timing", loo_accuracy=1.0),))

    target = fair_case(paying_where("cols >= 8000"), tiny_target(), info)
    wide = [c.name for c in info.cases if c.params["cols"] >= 8000]
    assert target is not None and target.case in wide and "where the card says it pays" in target.name
    assert fair_case(paying_where("cols >= 1000000000"), tiny_target(), info) is None
    assert fair_case(paying_where("cols >= 16"), tiny_target(), info) == tiny_target()  # the headline holds


def test_a_card_renamed_by_a_new_walk_reads_the_measurement_its_kernel_already_has(cards, gate_cache):
    """A card whose content changed (here its effect) makes the same kernel of the same target: the trial reads
    the earlier trial's paired ratio and judges it against the new card's own required ratio, with no gate
    call. A rejection is read alike; another GPU, or a trial that measured nothing, is not the same
    measurement."""
    setting = GateSetting(GateMode.GPU, "NVIDIA H200", POLICY)
    first, [measured] = admit(with_effect(cards["launch_bounds"], 1.2), [tiny_target()], corpus.problem_path,
                              timed_gate(gate_cache, 1.06), setting=setting)
    earlier = measurements([Library((first,))])

    def no_gate(*args):
        raise AssertionError("a measured kernel is not gated again")

    for effect, outcome in ((1.03, TrialOutcome.PASSED), (1.3, TrialOutcome.FAILED)):  # asks 1.01x, then ~1.11x
        renamed = with_effect(cards["launch_bounds"], effect)
        updated, [trial] = admit(renamed, [tiny_target()], corpus.problem_path, no_gate, setting=setting,
                                 measured=earlier)
        assert trial_outcome(trial) is outcome and trial.ratio == 1.06
        assert "measured by an earlier trial" in trial.message
        assert trial.basis.card == card_digest(renamed) != measured.basis.card
    rejected, [refused] = admit(with_effect(cards["launch_bounds"], 1.2), [tiny_target()], corpus.problem_path,
                                timed_gate(gate_cache, None, Status.REJECTED), setting=setting)
    _, [trial] = admit(with_effect(cards["launch_bounds"], 1.03), [tiny_target()], corpus.problem_path, no_gate,
                       setting=setting, measured=measurements([Library((rejected,))]))
    assert trial_outcome(trial) is TrialOutcome.FAILED and "rejected" in trial.message and trial.ratio is None
    elsewhere = GateSetting(GateMode.GPU, "NVIDIA H100 80GB HBM3", POLICY)
    _, [timed] = admit(with_effect(cards["launch_bounds"], 1.03), [tiny_target()], corpus.problem_path,
                       timed_gate(gate_cache, 1.02), setting=elsewhere, measured=earlier)
    assert timed.ratio == 1.02 and "earlier trial" not in timed.message
    inconclusive = dataclasses.replace(measured, ratio=None, passed=False, message="inconclusive: x: nothing timed")
    assert measurements([Library((dataclasses.replace(first, verification_log=(inconclusive,)),))]) == {}
