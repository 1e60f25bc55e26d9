"""Induction of skill cards from lineages, and the predicate search behind preconditions.

Lineages are real: the corpus's compile-only walk of row_softmax/warp_vec4 (the walker's own
output, `corpus/lineages/row_softmax_warp_vec4.dry.json`), given GPU-style verdicts, timings and
rejections through the lineage dataclasses; and small synthetic chains built from real kernel
states where a rule needs features the corpus walk does not show."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.features.feature import Feature
from klineage.gate.policy import Placement
from klineage.gate.verdict import Status
from klineage.lineage import (
    CaseOutcome,
    CaseResult,
    FeatureChange,
    FeatureLevel,
    ForwardCheck,
    ForwardStatus,
    KernelRef,
    Limits,
    Lineage,
    Outcome,
    PairedTiming,
    ProblemRef,
    RejectionCategory,
    State,
    Stats,
    Termination,
    Transition,
    VerdictSummary,
    unified_diff,
)
from klineage.skills.card import CardStatus, RefKind
from klineage.skills.induction import induce, lineage_id
from klineage.skills.predicates import DIVISORS, Labelled, case_facts, separate
from klineage.transforms.base import Anchor
from klineage.walk.timing_audit import retimed_effect
from library_data import ALIGNED, CASES, all_passed, unroll_rejection, with_rejections, with_timing
from lineage_data import DRY_WALK
from shared_cache import share

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = {"row_softmax": CASES}


# ---------------------------------------------------------------- predicate search


def table(ok: set[str], cases: dict = CASES) -> list[Labelled]:
    return [Labelled(name, params, name in ok) for name, params in cases.items()]


def test_divisibility_separates_and_is_the_strongest_the_evidence_supports():
    found = separate(table(set(ALIGNED)))
    assert (found.expression, found.sentence) == ("cols % 4 == 0", "cols must be a multiple of 4")
    assert found.holds == ("headline", "mid_aligned")
    assert found.fails == ("long_rows", "narrow", "ragged", "small")
    assert not found.inconsistent


@pytest.mark.parametrize("divisor", DIVISORS)
def test_each_divisor_is_found(divisor):
    rows = [Labelled(f"ok{i}", {"K": divisor * m}, True) for i, m in enumerate((1, 5, 7))]
    rows += [Labelled(f"bad{i}", {"K": divisor * m + 1}, False) for i, m in enumerate((1, 2))]
    if divisor > 2:
        rows.append(Labelled("half", {"K": divisor * 5 // 2 if divisor % 2 == 0 else divisor + 1}, False))
    found = separate(rows)
    assert found.expression == f"K % {divisor} == 0"
    assert found.sentence == f"K must be a multiple of {divisor}"


def test_multiple_of_three():
    rows = [Labelled("a", {"N": 96}, True), Labelled("b", {"N": 48 * 3}, True), Labelled("c", {"N": 150}, True),
            Labelled("d", {"N": 128}, False), Labelled("e", {"N": 100}, False)]
    assert separate(rows).expression == "N % 3 == 0"  # 6 is not a candidate divisor; 3 is


def test_power_of_two():
    rows = [Labelled(f"p{n}", {"S": n}, True) for n in (64, 128, 1024)]
    rows += [Labelled(f"q{n}", {"S": n}, False) for n in (96, 192, 320)]  # all multiples of 32: no divisor separates
    found = separate(rows)
    assert (found.expression, found.sentence) == ("is_pow2(S)", "S must be a power of two")


def test_threshold_at_the_sound_extreme():
    rows = [Labelled("a", {"cols": 64}, True), Labelled("b", {"cols": 97}, True),
            Labelled("c", {"cols": 31}, False), Labelled("d", {"cols": 2}, False)]
    found = separate(rows)
    assert (found.expression, found.sentence) == ("cols >= 64", "cols must be at least 64")
    upper = separate([Labelled("a", {"n": 7}, True), Labelled("b", {"n": 33}, True), Labelled("c", {"n": 40}, False)])
    assert upper.expression == "n <= 33"


def test_dtype_equality_comes_first():
    rows = [Labelled("h", {"dtype": "float16", "K": 64}, True), Labelled("b", {"dtype": "float16", "K": 72}, True),
            Labelled("f", {"dtype": "float32", "K": 64}, False), Labelled("g", {"dtype": "bfloat16", "K": 30}, False)]
    found = separate(rows)
    assert (found.expression, found.sentence) == ("dtype_is_float16", "dtype must be float16")
    assert case_facts({"dtype": "float16", "K": 8, "flag": True}) == {"dtype_is_float16": True, "K": 8, "flag": 1}


def test_two_atoms_when_one_does_not_separate():
    rows = [Labelled("a", {"K": 128}, True), Labelled("b", {"K": 320}, True),
            Labelled("c", {"K": 200}, False),  # fails divisibility only
            Labelled("d", {"K": 64}, False)]  # fails the threshold only
    found = separate(rows)
    assert found.expression == "K % 64 == 0 and K >= 128"
    assert ", and " in found.sentence


def test_no_counter_evidence_gives_no_precondition():
    found = separate(table(set(CASES)))
    assert not found.found and not found.inconsistent
    assert "nothing to separate" in found.sentence


def test_inconsistent_evidence():
    rows = table(set(ALIGNED)) + [Labelled("headline", CASES["headline"], False)]
    found = separate(rows)
    assert not found.found and found.inconsistent and "headline" in found.sentence
    # Same parameters, different labels: nothing over the parameters can separate them.
    clash = separate([Labelled("a", {"K": 8}, True), Labelled("b", {"K": 8}, False)])
    assert not clash.found and clash.inconsistent and "no predicate" in clash.sentence
    assert separate([Labelled("a", {"K": 8}, False)]).inconsistent


# ---------------------------------------------------------------- lineages


@pytest.fixture(scope="module")
def dry() -> Lineage:
    return Lineage.load(DRY_WALK)


def by_transform(cards, transform):
    return [c for c in cards if c.transform == transform]


def test_grouping_by_transform_and_feature_delta(dry):
    cards = induce([dry])
    assert [c.transform for c in cards] == ["launch_bounds", "restrict", "unroll", "unroll"]
    assert sum(len(c.evidence) for c in cards) == len(dry.transitions)
    unrolls = {frozenset(map(str, c.provides)): c for c in by_transform(cards, "unroll")}
    assert set(unrolls) == {frozenset(), frozenset({"device:unroll_pragma"})}
    assert [r.index for r in unrolls[frozenset()].evidence] == [1, 2, 3, 4]
    assert [r.index for r in unrolls[frozenset({"device:unroll_pragma"})].evidence] == [5]
    (bounds,) = by_transform(cards, "launch_bounds")
    assert bounds.provides == {Feature("kernel", "launch_bounds")}  # a __global__ function's role
    assert bounds.intent.startswith("Bound the kernel's block size")
    assert bounds.anchor.kind == "function" and "__launch_bounds__" in bounds.anchor.snippet
    assert "+" in bounds.vector and "__launch_bounds__" in bounds.vector
    assert bounds.carrier == {"launch_bounds": [["THREADS", "MIN_BLOCKS_PER_SM"]]}
    assert bounds.scope.operators == ("row_softmax",) and bounds.scope.language == "cuda"
    assert bounds.scope.platform == "sm90"
    assert bounds.scope.prior_actions == ("restrict", "unroll")  # forward steps that come before it
    assert all(c.status is CardStatus.CANDIDATE and c.verification_log == () for c in cards)
    assert all(r.kind is RefKind.TRANSITION and r.lineage == lineage_id(dry) for c in cards for r in c.evidence)
    assert all(c.effects == () for c in cards)  # a compile-only walk times nothing


def test_vector_is_the_smallest_forward_diff(dry):
    cards = induce([dry])
    (pragmas,) = [c for c in by_transform(cards, "unroll") if not c.provides]
    smallest = min((dry.transitions[r.index] for r in pragmas.evidence), key=lambda t: len(t.forward_diff))
    assert pragmas.vector == smallest.forward_diff
    assert pragmas.anchor.key == smallest.anchor.key


def test_ids_are_stable_across_runs_and_processes(dry):
    first = [c.id for c in induce([dry])]
    again = [c.id for c in induce([Lineage.load(DRY_WALK)])]
    assert first == again and len(set(first)) == len(first)
    code = ("from klineage.lineage import Lineage; from klineage.skills import induce; "
            f"print(' '.join(c.id for c in induce([Lineage.load({str(DRY_WALK)!r})])))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == first
    # Inducing the same lineage twice merges evidence and keeps identity.
    assert [c.id for c in induce([dry, dry])] == first


def test_cards_survive_their_own_round_trip(dry):
    for card in induce([all_passed(with_timing(dry, {0: (1.05, 1.04, 1.05, 1.06)}))], PROBLEMS):
        assert type(card).from_dict(card.to_dict()) == card


def test_effects_from_paired_forward_timing(dry):
    lineage = with_timing(all_passed(dry), {0: (1.08, 1.07, 1.08, 1.10), 6: (0.97, 0.96, 0.98, 0.97)})
    cards = induce([lineage], PROBLEMS)
    (bounds,) = by_transform(cards, "launch_bounds")
    (effect,) = bounds.effects
    assert (effect.case, effect.operator, effect.ratio, effect.per_trial) == ("headline", "row_softmax", 1.08,
                                                                              (1.07, 1.08, 1.10))
    assert effect.spread == pytest.approx(0.03 / 1.08)
    assert (effect.source.kind, effect.source.index) == (RefKind.TRANSITION, 0)
    (restrict,) = by_transform(cards, "restrict")
    assert [e.ratio for e in restrict.effects] == [0.97]  # a slower forward step is measured, not hidden


def test_a_step_re_timed_with_places_exchanged_gives_its_effect_that_ratio(dry):
    lineage = with_timing(all_passed(dry), {0: (1.08, 1.07, 1.08, 1.10), 6: (0.97, 0.96, 0.98, 0.97)})
    asked = []

    def retimed(walk, index):
        asked.append(index)
        return (1.001, (1.0, 1.001, 1.002)) if index == 6 else None

    cards = induce([lineage], PROBLEMS, retimed)
    (restrict,) = by_transform(cards, "restrict")
    (effect,) = restrict.effects
    assert (effect.ratio, effect.per_trial, effect.placement) == (1.001, (1.0, 1.001, 1.002), Placement.EXCHANGED)
    (bounds,) = by_transform(cards, "launch_bounds")
    assert bounds.effects[0].ratio == 1.08 and bounds.effects[0].placement is Placement.AS_LOADED
    assert sorted(asked) == [0, 6]  # only timed steps are asked for
    assert restrict.id == by_transform(induce([lineage], PROBLEMS), "restrict")[0].id  # the card stays the card


def test_the_bundled_padding_card_is_measured_by_its_re_timing():
    """gemm/mma_sync's padding step: 0.848 as the walk paired it, 1.003 with places exchanged
    (recorded on the H200, session 15); the card's gemm effect is the re-timing."""
    gemm = Lineage.load(ROOT / "corpus" / "lineages" / "gemm_mma_sync.gpu.json")
    assert retimed_effect(gemm, 7)[0] == pytest.approx(1.003, abs=5e-4)
    (card,) = [c for c in induce([gemm], None, retimed_effect) if c.transform == "unpad_shared"]
    (effect,) = card.effects
    assert effect.placement is Placement.EXCHANGED and effect.ratio == pytest.approx(1.003, abs=5e-4)
    assert gemm.transitions[7].forward.timing.overall == pytest.approx(0.848, abs=5e-4)


def test_risks_and_preconditions_from_rejections(dry):
    # The unroll steps were sound where the aligned cases passed; a refused unroll failed ragged and narrow.
    outcomes = {c: CaseOutcome.NOT_RUN for c in CASES if c not in ALIGNED}
    lineage = with_rejections(all_passed(dry, outcomes), [unroll_rejection(dry)])
    cards = induce([lineage], PROBLEMS)
    for card in by_transform(cards, "unroll"):
        (pre,) = card.preconditions
        assert (pre.expression, pre.sentence, pre.source) == ("cols % 4 == 0", "cols must be a multiple of 4",
                                                              "correctness")
        assert pre.holds == ("headline", "mid_aligned") and pre.fails == ("narrow", "ragged")
        (risk,) = card.risks
        assert risk.category == "incorrect"
        assert "ragged" in risk.description and "narrow" in risk.description and "max abs err" in risk.description
        assert [(r.kind, r.index) for r in risk.evidence] == [(RefKind.REJECTION, 0)]
    for card in by_transform(cards, "launch_bounds") + by_transform(cards, "restrict"):
        assert card.preconditions == () and card.risks == ()  # rejections of another transform


def test_inconsistent_evidence_becomes_a_risk(dry):
    # Every state passed every case, yet a refused unroll failed ragged: no predicate, a risk instead.
    lineage = with_rejections(all_passed(dry), [unroll_rejection(dry)])
    for card in by_transform(induce([lineage], PROBLEMS), "unroll"):
        assert card.preconditions == ()
        categories = [r.category for r in card.risks]
        assert categories == ["incorrect", "inconsistent_evidence"]
        assert "both sound and unsound" in card.risks[1].description


def test_not_run_cases_give_no_labels_without_problems(dry):
    lineage = with_rejections(all_passed(dry), [unroll_rejection(dry)])
    for card in by_transform(induce([lineage]), "unroll"):
        assert card.preconditions == ()  # no case parameters: nothing to search
        assert [r.category for r in card.risks] == ["incorrect"]


def test_domain_skips_give_preconditions(dry):
    # The expert (with launch bounds) skips the unaligned cases; its child judges all of them.
    skipped = {c: CaseOutcome.SKIPPED for c in CASES if c not in ALIGNED}
    lineage = all_passed(dry)
    expert = lineage.states[0]
    cases = tuple(CaseResult(c, skipped.get(c, CaseOutcome.PASSED)) for c in CASES)
    states = (dataclasses.replace(expert, verdict=VerdictSummary(Status.PASSED, None, cases)), *lineage.states[1:])
    lineage = dataclasses.replace(lineage, states=states)
    (bounds,) = by_transform(induce([lineage], PROBLEMS), "launch_bounds")
    (pre,) = bounds.preconditions
    assert (pre.expression, pre.source) == ("cols % 4 == 0", "correctness+domain")


def test_no_change_and_gate_errors_are_not_risks(dry):
    rejection = unroll_rejection(dry, cases=(), category=RejectionCategory.NO_CHANGE)
    lineage = with_rejections(all_passed(dry), [rejection])
    assert all(c.risks == () for c in induce([lineage], PROBLEMS))


def test_conflicts_from_refused_states(dry):
    # A refused unroll anchored in the __global__ function, whose mechanisms no accepted unroll saw there.
    rejection = unroll_rejection(dry, cases=("headline",), function="row_softmax_warp_vec4")
    lineage = with_rejections(all_passed(dry), [rejection])
    parent = lineage.state(rejection.parent)
    mechanisms = {r["name"] for r in parent.features["source"] if r["locus"] == "row_softmax_warp_vec4"}
    for card in by_transform(induce([lineage], PROBLEMS), "unroll"):
        assert card.conflicts
        assert {f.locus for f in card.conflicts} == {"kernel"}
        assert {f.name for f in card.conflicts} <= mechanisms
        assert "global_fn" not in {f.name for f in card.conflicts}  # plumbing, not a mechanism


# ---------------------------------------------------------------- requires, on synthetic chains


def synthetic(features: list[set[str]], steps: list[tuple[str, str]], function: str = "gemm_main") -> Lineage:
    """A chain of real kernel states (the corpus expert with a marker comment) whose verdicts carry the
    given source features at `function` (a __global__ function); step i removes steps[i] = (transform, name)."""
    base = corpus.kernel_entry("row_softmax/warp_vec4").load()
    kernels = [base.with_source(base.source + f"\n// state {i}\n") for i in range(len(features))]
    cases = (CaseResult("headline", CaseOutcome.PASSED),)
    states = tuple(State(k.fingerprint, k.source, k.plan.to_dict(), VerdictSummary(Status.PASSED, None, cases),
                         {"source": [{"locus": function, "name": n} for n in sorted(f | {"global_fn"})],
                          "sass": {"counts": []}})
                   for k, f in zip(kernels, features))
    transitions = []
    for i, (transform, name) in enumerate(steps):
        parent, child = kernels[i], kernels[i + 1]
        transitions.append(Transition(
            i, transform, Anchor(function, "function", function, f"// {name}"), parent.fingerprint, child.fingerprint,
            unified_diff(parent, child, "parent", "child"), unified_diff(child, parent, "child", "parent"),
            (FeatureChange(FeatureLevel.SOURCE, function, name),), (),
            ForwardCheck(ForwardStatus.VERIFIED, "ok", PairedTiming(1.2, (1.2, 1.21, 1.19))), {}))
    return Lineage(KernelRef("synthetic", kernels[0].fingerprint), ProblemRef("gemm", "f" * 64), "rules", GateMode.GPU,
                   {}, Limits(16, 4), states, tuple(transitions), (), Outcome(Termination.COMPLETE, "done"),
                   Stats(len(transitions), 0, len(features), 0.0))


def test_requires_mechanism_family_present_on_both_sides():
    lineage = synthetic([{"shared_array", "ldmatrix", "mma_sync", "restrict_ptr"},
                         {"shared_array", "mma_sync", "restrict_ptr"}],
                        [("scalarize_ldmatrix", "ldmatrix")])
    (card,) = induce([lineage])
    assert card.provides == {Feature("kernel", "ldmatrix")}
    # shared staging and the MMA it feeds stay; restrict is another family.
    assert card.requires == {Feature("kernel", "shared_array"), Feature("kernel", "mma_sync")}
    assert card.applies(card.requires) and not card.applies(set())


def test_requires_what_the_walk_removed_later():
    # sync_copies lists unpipeline in `after`: the pipeline is removed first and its forward needs cp.async.
    lineage = synthetic([{"multistage_pipeline", "cp_async", "cp_async_wait", "shared_array"},
                         {"cp_async", "cp_async_wait", "shared_array"},
                         {"shared_array"}],
                        [("unpipeline", "multistage_pipeline"), ("sync_copies", "cp_async")])
    cards = {c.transform: c for c in induce([lineage])}
    assert {Feature("kernel", "cp_async"), Feature("kernel", "cp_async_wait")} <= cards["unpipeline"].requires
    assert cards["unpipeline"].scope.prior_actions == ("sync_copies",)
    assert cards["sync_copies"].requires == {Feature("kernel", "shared_array")}
    assert cards["unpipeline"].effects[0].ratio == 1.2


def test_requires_is_what_every_transition_of_a_group_needs():
    one = synthetic([{"shared_array", "ldmatrix", "mma_sync"}, {"shared_array", "mma_sync"}],
                    [("scalarize_ldmatrix", "ldmatrix")])
    two = synthetic([{"shared_array", "ldmatrix", "wmma"}, {"shared_array", "wmma"}],
                    [("scalarize_ldmatrix", "ldmatrix")], function="other_kernel")
    two = dataclasses.replace(two, expert=KernelRef("synthetic_two", two.expert.fingerprint))
    (card,) = induce([one, two])
    assert len(card.evidence) == 2 and card.requires == {Feature("kernel", "shared_array")}


def test_sass_changes_sit_at_kernel_entries():
    lineage = synthetic([{"shared_array", "ldmatrix"}, {"shared_array"}], [("scalarize_ldmatrix", "ldmatrix")],
                        function="helper")
    removed = (FeatureChange(FeatureLevel.SASS, "_Z6helperv", "ldsm"),
               FeatureChange(FeatureLevel.SOURCE, "helper", "ldmatrix"))
    step = dataclasses.replace(lineage.transitions[0], features_removed=removed)
    (card,) = induce([dataclasses.replace(lineage, transitions=(step,))])
    assert card.provides == {Feature("kernel", "ldsm"), Feature("kernel", "ldmatrix")}


# ---------------------------------------------------------------- a live walk


@pytest.fixture(scope="module")
def walked(tmp_path_factory, shared_cache) -> Lineage:
    """A fresh compile-only walk of warp_vec4 with the catalog as it is today (real nvcc, gate and audit): its
    verdicts its own, its probes and compiles the run's (tests/shared_cache.py)."""
    from klineage.gate.cache import GateCache
    from klineage.toolchain import find_toolchain
    from klineage.walk.walker import walk

    try:
        find_toolchain()
    except Exception as exc:  # no nvcc here: the stored walk covers the rest
        pytest.skip(f"no CUDA toolchain: {exc}")
    root = tmp_path_factory.mktemp("skills-walk")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KLINEAGE_CACHE_DIR", str(share(root / "cache", shared_cache)))
        return walk(corpus.problem_path("row_softmax"), corpus.kernel_entry("row_softmax/warp_vec4").load(),
                    gate_mode=GateMode.COMPILE_ONLY, max_steps=4, cache=GateCache(root / "cache", root / "recorded"))


def test_cards_from_a_live_walk(walked, tmp_path):
    from klineage.skills import export_skillmd, import_skillmd

    assert walked.transitions, walked.termination.message
    cards = induce([walked])
    assert sum(len(c.evidence) for c in cards) == len(walked.transitions)
    assert len({(c.transform, c.provides) for c in cards}) == len(cards)
    assert [c.id for c in cards] == [c.id for c in induce([Lineage.from_json(walked.to_json())])]
    export_skillmd(cards, tmp_path)
    assert import_skillmd(tmp_path) == cards
