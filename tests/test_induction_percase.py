"""Induction from steps timed on every case: one effect a case, the timing precondition the cases force,
measured risks (slower cases, refusals) and the cards' SKILL.md, on the real softmax GPU walk.

The per-case timings here are given (`percase`), as the recorded every-case verdicts give them on a GPU
host (bench/percase.py); what is tested is what induction makes of them."""

from __future__ import annotations

import dataclasses

import pytest

from klineage import config
from klineage.gate.policy import Placement
from klineage.gate.verdict import Finding, Reason
from klineage.lineage import Lineage
from klineage.skills.card import SkillCard
from klineage.skills.induction import PLACEMENT_DOUBT, SLOWER_RISK, induce
from klineage.skills.library import problem_infos
from klineage.skills.skillmd import parse, render
from klineage.skills.when import SOURCE, WhenKind, card_when
from klineage.walk.timing_audit import CaseRatio, PerCaseTiming

WALK = config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.gpu.json"
VECTOR_STEP = 2  # devectorize: the float4 loads; its forward pays where a row is whole float4s
BOUNDS_STEP = 22  # launch_bounds


@pytest.fixture(scope="module")
def walk():
    return Lineage.load(WALK)


@pytest.fixture(scope="module")
def info():
    return problem_infos({"row_softmax"})["row_softmax"]


def _all_cases(info):
    return [(c.name, dict(c.params)) for c in info.cases + info.sweep]


def timings(info, refused: bool = False):
    def percase(lineage: Lineage, index: int) -> PerCaseTiming | None:
        if index == VECTOR_STEP:
            rows = tuple(CaseRatio(name, r, (r, r * 1.01, r * 0.99)) for name, p in _all_cases(info)
                         for r in [1.15 if p["cols"] % 4 == 0 else 0.97])
            findings = (Finding(Reason.INCORRECT, "profile", "max abs err 0.5", "cols_odd_short"),) if refused else ()
            return PerCaseTiming(rows, Placement.AS_LOADED, {"registers": 40, "static_shared": 0}, findings, "H200")
        if index == BOUNDS_STEP:
            rows = tuple(CaseRatio(name, 1.08, (1.08, 1.07, 1.09)) for name, _ in _all_cases(info))
            return PerCaseTiming(rows, Placement.EXCHANGED, {"registers": 32, "static_shared": 0}, (), "H200")
        return None
    return percase


def card_of(cards: list[SkillCard], lineage: Lineage, index: int) -> SkillCard:
    return next(c for c in cards if any(e.source.index == index and e.source.lineage.startswith(lineage.expert.name)
                                        for e in c.effects))


def test_a_step_timed_on_every_case_gives_one_effect_a_case_and_its_precondition(walk, info):
    cards = induce([walk], {"row_softmax": info}, percase=timings(info))
    vector = card_of(cards, walk, VECTOR_STEP)
    mine = [e for e in vector.effects if e.source.index == VECTOR_STEP]
    assert len(mine) == len(info.cases) + len(info.sweep) >= 14
    [timing] = [p for p in vector.preconditions if p.source == SOURCE]
    # float32 rows of a multiple of 4 columns are whole 16-byte packs: the rows' alignment says so in bytes,
    # a fact every operator shares (a threshold goes before the divisibility of `cols` that says the same)
    assert timing.expression == "row_align >= 16"
    unaligned = {f"row_softmax:{n}" for n, p in _all_cases(info) if p["cols"] % 4}
    assert set(timing.fails) == unaligned and timing.loo_accuracy >= 0.8
    assert timing.facts["row_softmax:cols_unaligned"] == {"row_align": 4}
    when = card_when(vector)
    assert when.kind is WhenKind.PRECONDITION
    # the slower cases are a measured risk, with how much slower and which step measured it
    [slower] = [r for r in vector.risks if r.category == SLOWER_RISK]
    assert "row_softmax:cols_unaligned 0.970x (3.1% slower)" in slower.description
    assert all(ref.index == VECTOR_STEP for ref in slower.evidence)
    text = render(vector)
    assert parse(text) == vector
    assert "Pays where row_align is at least 16" in text and "row_softmax:cols_unaligned: 0.970x, did not pay; " \
                                                             "the precondition fails" in text


def test_a_uniform_step_is_said_to_pay_everywhere(walk, info):
    cards = induce([walk], {"row_softmax": info}, percase=timings(info))
    bounds = card_of(cards, walk, BOUNDS_STEP)
    assert not [p for p in bounds.preconditions if p.source == SOURCE]
    when = card_when(bounds)
    assert when.kind is WhenKind.UNIFORM and when.sentence.startswith(f"paid on all {len(_all_cases(info))} cases")
    assert all(e.placement is Placement.EXCHANGED for e in bounds.effects if e.source.index == BOUNDS_STEP)


def test_a_refusal_while_timed_is_a_risk_naming_its_case(walk, info):
    cards = induce([walk], {"row_softmax": info}, percase=timings(info, refused=True))
    vector = card_of(cards, walk, VECTOR_STEP)
    [refused] = [r for r in vector.risks if r.category == "incorrect"
                 and "when timed on every case" in r.description]
    assert "row_softmax:cols_odd_short" in refused.description and "max abs err 0.5" in refused.description


def test_without_per_case_timings_the_cards_are_as_before(walk, info):
    """Headline timings alone give one case an operator: no timing precondition is induced from them."""
    cards = induce([walk], {"row_softmax": info})
    assert not [p for c in cards for p in c.preconditions if p.source == SOURCE]


def test_admission_asks_only_what_the_card_paid_where_it_holds(walk, info):
    """The required ratio comes from the effects where the timing precondition holds; a trial on a case
    where it fails is not fair (inconclusive, no gate call)."""
    from klineage.skills.admission import Target, admit
    from klineage.skills.admission_rule import required_ratio
    from klineage.skills.trial_reading import TrialOutcome

    cards = induce([walk], {"row_softmax": info}, percase=timings(info))
    vector = card_of(cards, walk, VECTOR_STEP)
    mine = dataclasses.replace(vector, effects=tuple(e for e in vector.effects if e.source.index == VECTOR_STEP))
    held, everywhere = required_ratio(mine), required_ratio(dataclasses.replace(mine, preconditions=()))
    assert held > 1.0 and held > everywhere  # the unaligned cases, 0.97x, ask nothing of a trial
    child = walk.states[VECTOR_STEP + 1].kernel
    calls = []

    def gate(*args):
        calls.append(args)
        raise AssertionError("an unfair trial must not reach the gate")

    target = Target("unaligned rows", "row_softmax", child, "cols_unaligned", (), "")
    _, [trial] = admit(vector, [target], lambda op: str(config.corpus_dir() / "problems" / f"{op}.py"), gate,
                       problems={"row_softmax": info})
    assert trial.message.startswith(TrialOutcome.INCONCLUSIVE.value) and "row_align >= 16" in trial.message
    assert not calls


def test_percase_times_the_card_steps_of_the_library_it_is_given(walk, tmp_path):
    """bench/percase.py picks the steps behind the cards of `--library` (a library built from more walks
    than the bundled one, before it is admitted): every source step of this walk by default, and with
    `per_card` the ones whose headline effect lies furthest from 1 first."""
    import json

    from bench_tools import bench_script
    from klineage.skills.induction import lineage_id

    def effect(index, ratio):
        return {"ratio": ratio, "source": {"lineage": lineage_id(walk), "index": index}}

    library = tmp_path / "library.json"
    library.write_text(json.dumps({"cards": [{"effects": [effect(3, 1.02), effect(5, 0.80)]},
                                             {"effects": [effect(8, 1.30), {**effect(8, 1.3), "source": {
                                                 "lineage": "another_walk@0", "index": 4}}]},
                                             {"effects": [effect(10, 1.40), effect(16, 1.05)]}]}))
    steps = bench_script("percase").library_steps
    # step 10, a `restrict` whose child runs its parent's machine code (corpus/step_code.json), is never timed:
    # the card's next step is taken instead
    assert steps(walk, 0, library) == [3, 5, 8, 16]
    assert steps(walk, 1, library) == [5, 8, 16]
    assert steps(walk, 0, library, by_effect=True) == [8, 5, 16, 3]  # |log 1.30| > |log 0.80| > ...
    assert steps(walk, 0) != [3, 5, 8, 16]  # the bundled library's own card steps otherwise


def test_percase_times_a_step_once_its_two_kernels_are_built_while_later_ones_compile(tmp_path, monkeypatch):
    """bench/percase.py's builds are started in step order and handed out per step: a state two steps share
    is built once, and each step waits for its own two kernels only (a stage cut by its time limit still
    timed its first steps)."""
    from concurrent.futures import ThreadPoolExecutor, wait

    from bench_tools import bench_script
    from klineage.gate.compile import compile_kernel

    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(tmp_path))  # a compile cache of its own: nothing built before
    walk = Lineage.load(WALK)
    assert not compile_kernel(walk.states[3].kernel, cache_dir=tmp_path / "probe").cached
    with ThreadPoolExecutor(max_workers=2) as pool:
        builds = bench_script("percase").precompile(walk, [3, 4], pool)
        assert sorted(builds) == [3, 4] and builds[3][1] is builds[4][0]  # state 4: step 3's child, step 4's parent
        wait(builds[3])
        assert all(f.done() and f.exception() is None for f in builds[3])
    for index in (3, 4, 5):
        assert compile_kernel(walk.states[index].kernel, cache_dir=config.cache_dir()).cached


def test_a_case_timing_the_pairing_moved_is_left_out_of_the_card_and_said_in_its_diagnostics(walk, info):
    plain = timings(info)

    def doubted(lineage: Lineage, index: int) -> PerCaseTiming | None:
        found = plain(lineage, index)
        if index != VECTOR_STEP:
            return found
        rows = tuple(dataclasses.replace(r, doubt="state 3 timed 12.0 us as a parent and 9.0 us as a child")
                     if r.case == "narrow" else r for r in found.rows)
        return dataclasses.replace(found, rows=rows)

    vector = card_of(induce([walk], {"row_softmax": info}, percase=doubted), walk, VECTOR_STEP)
    assert "narrow" not in {e.case for e in vector.effects}
    assert "row_softmax:narrow" not in {c.case for c in card_when(vector).cases}
    [doubt] = [d for d in vector.diagnostics if d.category == PLACEMENT_DOUBT]
    assert "row_softmax:narrow" in doubt.description and "12.0 us as a parent" in doubt.description
    assert "## Diagnostics" in render(vector) and "row_softmax:narrow" in render(vector)


def test_percase_audit_names_the_moved_cases_and_the_steps_to_time_with_places_exchanged(capsys):
    """bench/percase.py --audit on the GEMM walk's recorded per-case timings (H200, session 19), no GPU:
    step 0's states timed alike beside steps 1, step 3 had no neighbour timed per case, and step 7's
    child timed 1.64x apart on grid_one_wave as the next step's parent."""
    from bench_tools import bench_script

    gemm = config.corpus_dir() / "lineages" / "gemm_mma_sync.gpu.json"
    assert bench_script("percase").main([str(gemm), "--audit", "--steps", "0,3,7"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "consistent on all 12 cases" in out[0] and "unchecked" in out[1]
    assert "7 of 12 cases moved by the pairing" in out[2] and "grid_one_wave" in out[2]
    assert out[-1] == "time again with places exchanged: 3,7"


def test_a_case_timed_on_two_kernels_is_a_row_for_each_with_its_own_compiled_facts(walk, info):
    """The same step timed on two kernels of one operator: one pays everywhere at 40 registers, the other
    nowhere at 200. Merged into one row a case, the registers they differ in would be lost (and the median of
    1.15x and 0.97x paid everywhere); a row for each kernel keeps them, and they say where the step pays."""
    twin = dataclasses.replace(walk, expert=dataclasses.replace(walk.expert, name="row_softmax_twin"))

    def percase(lineage: Lineage, index: int) -> PerCaseTiming | None:  # every vectorizing step, every case
        if lineage.transitions[index].transform != walk.transitions[VECTOR_STEP].transform:
            return None
        ratio, registers = (0.97, 200) if lineage.expert.name == "row_softmax_twin" else (1.15, 40)
        rows = tuple(CaseRatio(name, ratio, (ratio, ratio * 1.01, ratio * 0.99)) for name, _ in _all_cases(info))
        return PerCaseTiming(rows, Placement.AS_LOADED, {"registers": registers, "static_shared": 0}, (), "H200")

    vector = card_of(induce([walk, twin], {"row_softmax": info}, percase=percase), walk, VECTOR_STEP)
    [timing] = [p for p in vector.preconditions if p.source == SOURCE]
    assert timing.expression == "registers <= 100"
    assert "row_softmax:headline@row_softmax_twin" in timing.fails and timing.loo_accuracy == 1.0
    assert timing.holds_on(f"row_softmax:headline@{walk.expert.name}") is True
    assert timing.holds_on("row_softmax:headline") is None  # it holds on one kernel's run of the case only
    assert timing.held("row_softmax:headline") and not timing.held("row_softmax:nowhere")
