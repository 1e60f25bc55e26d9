"""A library admission cut short keeps what it decided, and a re-run resumes from the file.

Real parts throughout: the bundled library's cards with measured effects, their held-out targets
among the bundled kernels and committed lineages, and the replay gate serving a recorded store of
this module's own. What the store holds is the real compile-only verdict of each card's first
materialized target under the admission policy, recorded under the replay key with the outcome
and paired ratio a GPU gate would report (as tests/test_gate_pipeline.py records one): the first
card passes at 1.5x, the second is rejected (incorrect), the third passes. A clock that the gate
advances stands for GPU time where a test needs a budget to run out."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from klineage import config, corpus
from klineage.cli import main
from klineage.config import GateMode
from klineage.gate.cache import verdict_key
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import Placement
from klineage.gate.verdict import Finding, Reason, Status
from klineage.skills.admission import GateSetting, held_out_targets
from klineage.skills.admission_rule import required_ratio
from klineage.skills.admission_run import POLICY, CardOutcome, admit_cards, gate_of, setting_for
from klineage.skills.card import CardStatus, Trial
from klineage.skills.library import corpus_lineages, load_library, save_library
from klineage.skills.materialize import apply_everywhere
from klineage.skills.trial_reading import TrialOutcome, trial_outcome

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "corpus" / "library" / "library.json"
GATE_SECONDS = 50.0  # what one trial costs on the test's clock


def _record(cache, card, target, status: Status, ratio: float | None) -> None:
    applied = apply_everywhere(card, target.state)
    compiled = run_gate(corpus.problem_path(target.problem), applied.state, against=target.state, policy=POLICY,
                        mode=GateMode.COMPILE_ONLY, cache=cache)
    parts = {k: v for k, v in compiled.provenance["key_parts"].items() if k != "version"}
    key, _ = verdict_key(**{**parts, "gpu": config.replay_gpu(), "mode": GateMode.GPU.value})
    findings = (Finding(Reason.INCORRECT, "correctness", "case ragged: 12 elements differ", "ragged"),) \
        if status is Status.REJECTED else ()
    profile = {"ratios": {"vs_baseline": {"overall": ratio, "per_trial": [ratio] * 3}}} if ratio else {}
    cache.recorded.put(key, dataclasses.replace(compiled, status=status, findings=findings, profile=profile))


@pytest.fixture(scope="module")
def world(gate_cache):
    """Three bundled cards with a measured effect, their first two held-out targets, and the store."""
    library = load_library(BUNDLED)
    lineages, _ = corpus_lineages()
    states = {entry.name: entry.load() for entry in corpus.list_kernels()}
    cards, targets, kernels = [], {}, set()
    # cards of the generic forwards (ldg, restrict), whose held-out targets stay put as the catalog reads more
    # kernels: the deadline arithmetic below counts their first trials' two problems
    for card in (c for c in library.cards if c.transform in ("ldg", "restrict")):
        found = held_out_targets(card, lineages, states, 2) if required_ratio(card) else []
        # Each card's first trial must be a verdict of its own: two cards that make the same kernel
        # of the same target (two `restrict` cards) would share one recorded outcome.
        made = (found[0].state.fingerprint, apply_everywhere(card, found[0].state).state.fingerprint) if found else None
        if len(found) == 2 and made not in kernels:  # a re-run with the first left out still has one
            kernels.add(made)
            cards.append(card)
            targets[card.id] = found
        if len(cards) == 3:
            break
    for card, (status, ratio) in zip(cards, [(Status.PASSED, 1.5), (Status.REJECTED, None), (Status.PASSED, 1.5)]):
        _record(gate_cache, card, targets[card.id][0], status, ratio)
    with pytest.MonkeyPatch.context() as patch:  # the replay gate reads this store
        patch.setenv("KLINEAGE_RECORDED_DIR", str(gate_cache.recorded.root))
        yield SimpleNamespace(library=library, cards=cards, targets=targets)


def _admit(world, library, path: Path, *, setting: GateSetting | None = None, gate=None, targets_for=None,
           problem_for=corpus.problem_path, **options):
    setting = setting or setting_for(GateMode.REPLAY)
    return admit_cards(library, {c.id for c in world.cards}, targets_for or (lambda card: world.targets[card.id]),
                       problem_for, gate or gate_of(setting, lambda stage, message: None), setting,
                       lambda partial: save_library(partial, path), limit=1, **options)


def _budgeted(world, path: Path):
    """A run whose budget (120 s) runs out after two cards of 50 s each; the library as the gate
    found it on disk at each call; the gate calls."""
    save_library(world.library, path)
    now, seen = [0.0], []
    replay = gate_of(setting_for(GateMode.REPLAY), lambda stage, message: None)

    def gate(problem_path, kernel, against, case=""):
        seen.append(load_library(path))
        now[0] += GATE_SECONDS
        return replay(problem_path, kernel, against, case)

    updated, runs = _admit(world, world.library, path, gate=gate, deadline=120.0, clock=lambda: now[0])
    return updated, runs, seen


def _log(library, card):
    return library.by_id(card.id).verification_log


def test_a_run_stopped_by_the_budget_leaves_every_decision_so_far_in_the_file(world, tmp_path):
    path = tmp_path / "library.json"
    updated, runs, seen = _budgeted(world, path)
    first, second, third = world.cards
    assert [run.outcome for run in runs] == [CardOutcome.TRIALLED, CardOutcome.TRIALLED, CardOutcome.LEFT_UNDECIDED]
    assert [trial_outcome(t) for run in runs for t in run.trials] == [TrialOutcome.PASSED, TrialOutcome.FAILED]
    on_disk = load_library(path)
    assert on_disk == updated
    assert on_disk.by_id(first.id).status is CardStatus.ADMITTED
    assert "rejected (incorrect)" in _log(on_disk, second)[-1].message
    assert _log(on_disk, third) == third.verification_log  # never started: as it was
    # the second card was gated with the first one's decision already written
    assert len(seen) == 2 and _log(seen[1], first) == _log(on_disk, first) and seen[0] == world.library
    trial = _log(on_disk, first)[-1]
    assert trial.basis.gate == "replay" and trial.basis.gpu == config.replay_gpu()
    assert trial.basis.policy == POLICY.fingerprint and trial.basis.candidate
    assert Trial.from_dict(trial.to_dict()) == trial
    assert "basis" not in dataclasses.replace(trial, basis=None).to_dict()  # older logs keep their bytes


@pytest.mark.parametrize("jobs, deadline, outcomes", [
    (6, 250.0, "TTL"),  # one window for all three: the second card's 50 s fit, though the first took 150
    (2, 330.0, "TTL"),  # the third card opens a window again: its 50 s after the last window's 100 end at 350
])
def test_the_deadline_counts_a_side_by_side_window_once(world, tmp_path, monkeypatch, jobs, deadline, outcomes):
    """On a GPU gate the first card of a window also judges the next cards' kernels side by side
    (50 s per problem on this clock, the three cards' targets in two problems; the side-by-side runs
    need a GPU, so a stand-in advances the clock), and each trial then costs 50 s. A deadline reads
    the window as the window's cost, not the card's."""
    now = [0.0]
    monkeypatch.setattr(
        "klineage.skills.admission_run.prefetch", lambda *args, **kwargs: now.__setitem__(0, now[0] + 50)
    )
    replay = gate_of(setting_for(GateMode.REPLAY), lambda stage, message: None)

    def gate(*call):
        now[0] += GATE_SECONDS
        return replay(*call)

    setting = GateSetting(GateMode.GPU, config.replay_gpu(), POLICY)
    _, runs = _admit(world, world.library, tmp_path / "library.json", setting=setting, gate=gate, jobs=jobs, redo=True,
                     deadline=deadline, clock=lambda: now[0])
    letter = {CardOutcome.TRIALLED: "T", CardOutcome.LEFT_UNDECIDED: "L"}
    assert "".join(letter[run.outcome] for run in runs) == outcomes
    assert runs[0].seconds == 150.0 and runs[1].seconds == 50.0


def test_a_rerun_skips_the_decided_cards_and_trials_the_rest(world, tmp_path):
    path = tmp_path / "library.json"
    _budgeted(world, path)
    stopped = load_library(path)
    gated = []
    replay = gate_of(setting_for(GateMode.REPLAY), lambda stage, message: None)
    resumed, runs = _admit(world, stopped, path, gate=lambda *call: gated.append(call) or replay(*call))
    assert [run.outcome for run in runs] == [CardOutcome.ALREADY_DECIDED, CardOutcome.ALREADY_DECIDED,
                                             CardOutcome.TRIALLED]
    assert len(gated) == 1 and trial_outcome(runs[2].trials[0]) is TrialOutcome.PASSED
    first, second, third = world.cards
    assert _log(resumed, first) == _log(stopped, first) and _log(resumed, second) == _log(stopped, second)
    assert load_library(path) == resumed and resumed.by_id(third.id).status is CardStatus.ADMITTED
    _, again = _admit(world, resumed, path)
    assert {run.outcome for run in again} == {CardOutcome.ALREADY_DECIDED}


def test_redo_trials_the_decided_cards_again(world, tmp_path):
    path = tmp_path / "library.json"
    decided, _ = _admit(world, world.library, path)
    redone, runs = _admit(world, decided, path, redo=True)
    assert {run.outcome for run in runs} == {CardOutcome.TRIALLED}
    for card in world.cards:
        assert len(_log(redone, card)) == len(_log(decided, card)) + 1


def _changed_problem(tmp_path: Path):
    def problem_for(name: str) -> Path:
        copy = tmp_path / f"{name}.py"
        if not copy.exists():
            copy.write_text(corpus.problem_path(name).read_text() + "\nEDITED = True\n")
        return copy
    return problem_for


CHANGES = {  # what differs on the re-run -> keyword arguments and the library it starts from
    "the held-out targets": lambda world, tmp_path, library: (
        {"targets_for": lambda card: world.targets[card.id][1:]}, library),
    "the gate mode": lambda world, tmp_path, library: ({"setting": setting_for(GateMode.COMPILE_ONLY)}, library),
    "the GPU": lambda world, tmp_path, library: (
        {"setting": GateSetting(GateMode.REPLAY, "NVIDIA H100 80GB HBM3", POLICY)}, library),
    "the gate policy": lambda world, tmp_path, library: (
        {"setting": GateSetting(GateMode.REPLAY, config.replay_gpu(), POLICY.with_(seeds=1))}, library),
    "the trials' placement": lambda world, tmp_path, library: (
        {"setting": setting_for(GateMode.REPLAY, Placement.EXCHANGED)}, library),
    "the problem file": lambda world, tmp_path, library: ({"problem_for": _changed_problem(tmp_path)}, library),
    "the card's effects": lambda world, tmp_path, library: ({}, dataclasses.replace(library, cards=tuple(
        dataclasses.replace(c, effects=tuple(dataclasses.replace(e, ratio=e.ratio * 1.1) for e in c.effects))
        for c in library.cards))),
    "a log without bases": lambda world, tmp_path, library: ({}, dataclasses.replace(library, cards=tuple(
        dataclasses.replace(c, verification_log=tuple(dataclasses.replace(t, basis=None) for t in c.verification_log))
        for c in library.cards))),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_card_whose_evidence_changed_is_trialled_again(world, tmp_path, change):
    path = tmp_path / "library.json"
    decided, first = _admit(world, world.library, path)
    assert {run.outcome for run in first} == {CardOutcome.TRIALLED}
    options, library = CHANGES[change](world, tmp_path, decided)
    _, runs = _admit(world, library, path, **options)
    assert {run.outcome for run in runs} == {CardOutcome.TRIALLED}, change


def test_inconclusive_trials_decide_nothing(world, tmp_path):
    path = tmp_path / "library.json"
    compiled = setting_for(GateMode.COMPILE_ONLY)
    once, _ = _admit(world, world.library, path, setting=compiled)
    _, runs = _admit(world, once, path, setting=compiled)
    assert {run.outcome for run in runs} == {CardOutcome.TRIALLED}
    assert {trial_outcome(t) for run in runs for t in run.trials} == {TrialOutcome.INCONCLUSIVE}


def test_the_library_file_is_never_half_written(world, tmp_path, monkeypatch):
    path = tmp_path / "library.json"
    replay = gate_of(setting_for(GateMode.REPLAY), lambda stage, message: None)
    calls = []

    def killed_at_the_second_card(*call):
        calls.append(call)
        if len(calls) == 2:
            raise KeyboardInterrupt  # a wrapper's timeout, mid-card
        return replay(*call)

    save_library(world.library, path)
    with pytest.raises(KeyboardInterrupt):
        _admit(world, world.library, path, gate=killed_at_the_second_card)
    first = world.cards[0]
    after_one = path.read_bytes()
    assert load_library(path).by_id(first.id).status is CardStatus.ADMITTED

    real_write = pathlib.Path.write_text

    def cut_short(self, text, *args, **kwargs):  # the disk fills up halfway through the library
        if self.name.startswith(f".{path.name}."):
            real_write(self, text[: len(text) // 2], *args, **kwargs)
            raise OSError("No space left on device")
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", cut_short)
    with pytest.raises(OSError, match="No space"):
        _admit(world, load_library(path), path, redo=True)
    assert path.read_bytes() == after_one  # the whole previous file, not half of the next
    assert sorted(p.name for p in tmp_path.iterdir()) == ["library.json"]  # no temporary left behind
    json.loads(after_one)


def test_the_cli_stops_at_its_budget_resumes_and_redoes(world, tmp_path, capsys):
    path = tmp_path / "library.json"
    shutil.copyfile(BUNDLED, path)
    # the targets the world recorded verdicts for, chosen without the code check
    admit = ["library", "admit", "--library", str(path), "--gate", "replay", "--limit", "1", "--code-check", "none"]
    for card in world.cards:
        admit += ["--card", card.short_id]

    assert main(admit + ["--budget-s", "0"]) == 0
    out = capsys.readouterr().out
    assert "3 left undecided" in out and "3 card(s) left undecided" in out and f"--library {path}" in out
    assert [c.verification_log for c in load_library(path).cards] == [c.verification_log for c in world.library.cards]

    assert main(admit) == 0
    out = capsys.readouterr().out
    assert "[1/3]" in out and "1 failed, 2 passed" in out
    trialled = load_library(path)

    assert main(admit) == 0
    out = capsys.readouterr().out
    assert "3 already decided" in out and "left undecided" not in out
    assert [c.verification_log for c in load_library(path).cards] == [c.verification_log for c in trialled.cards]

    assert main(admit + ["--redo"]) == 0
    assert "1 failed, 2 passed" in capsys.readouterr().out
    for card in world.cards:
        assert len(_log(load_library(path), card)) == len(_log(trialled, card)) + 1

    assert main(admit + ["--budget-s", "-1"]) == 2
    assert "--budget-s must be 0 or more" in capsys.readouterr().err


def test_a_card_its_cases_keep_out_costs_no_target_search_and_loses_an_admitted_status(world, tmp_path):
    """A card timed per case that paid nowhere (or nowhere in particular) cannot be admitted by any trial:
    its held-out targets are not sought (on the H200 that search took 100 s and more for one card), nothing
    is logged, and an admitted one whose cases contradict it is retired in the file."""
    from klineage.skills.card import Effect

    card = world.cards[0]
    source = card.effects[0].source
    never = dataclasses.replace(card, status=CardStatus.ADMITTED, effects=tuple(
        Effect(f"case{i}", "row_softmax", 0.99, (0.99, 0.99), source) for i in range(6)))
    library = dataclasses.replace(world.library, cards=tuple(never if c.id == card.id else c
                                                             for c in world.library.cards))
    sought = []
    path = tmp_path / "library.json"
    updated, runs = admit_cards(library, {never.id}, lambda c: sought.append(c) or world.targets[c.id],
                                corpus.problem_path, gate_of(setting_for(GateMode.REPLAY), lambda s, m: None),
                                setting_for(GateMode.REPLAY), lambda partial: save_library(partial, path), limit=1)
    assert [run.outcome for run in runs] == [CardOutcome.KEPT_OUT] and not sought
    assert updated.by_id(never.id).status is CardStatus.RETIRED
    assert updated.by_id(never.id).verification_log == never.verification_log
    assert load_library(path).by_id(never.id).status is CardStatus.RETIRED


def test_cards_named_one_by_one_are_trialled_in_the_order_named(world, tmp_path):
    """`library admit --card C --card A` wants C first: a budget that runs out after one card must have spent
    it on C. A set of ids (every card) goes in the library's order."""
    first, _, third = world.cards
    setting = setting_for(GateMode.REPLAY)
    gate = gate_of(setting, lambda stage, message: None)
    for chosen, expected in (([third.id, first.id], [third, first]), ({first.id, third.id}, [first, third])):
        _, runs = admit_cards(world.library, chosen, lambda card: world.targets[card.id], corpus.problem_path, gate,
                              setting, lambda partial: save_library(partial, tmp_path / "library.json"), limit=1)
        assert [run.card.id for run in runs] == [c.id for c in expected]
