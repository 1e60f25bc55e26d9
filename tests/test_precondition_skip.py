"""Timing preconditions decide: retrieval and the optimize loop skip a card measured not to pay on the
case a target is judged on, record it `precondition_failed` with the predicate and the case, and count
the gate evaluations that saves."""

from __future__ import annotations

import dataclasses

import pytest

from bench_tools import bench_script
from klineage import config, corpus
from klineage.config import GateMode
from klineage.lineage import Lineage
from klineage.optimize import AttemptStatus, OptimizationResult, optimize
from klineage.optimize.result import Stats
from klineage.skills import induce
from klineage.skills.card import CardStatus, Effect, Precondition, Ref, RefKind
from klineage.skills.facts import launch_facts, layout_facts
from klineage.skills.induction import lineage_id
from klineage.skills.library import Library, problem_infos
from klineage.skills.retrieval import precondition_failure, retrieve, timing_failure
from klineage.skills.when import SOURCE

SOFTMAX = corpus.problem_path("row_softmax")
DRY_LINEAGE = config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.dry.json"
CANDIDATES = (CardStatus.CANDIDATE,)


@pytest.fixture(scope="module")
def cards():
    return induce([Lineage.load(DRY_LINEAGE)])


@pytest.fixture(scope="module")
def naive():
    return corpus.kernel_entry("row_softmax/naive").load()


@pytest.fixture(scope="module")
def info():
    return problem_infos({"row_softmax"})["row_softmax"]


def timed(card, expression: str, kernel_loo: float | None = 1.0):
    """The card with a timing precondition; by default one shown to carry to kernels left out (it decides on
    any kernel)."""
    return dataclasses.replace(card, preconditions=card.preconditions + (
        Precondition(expression, f"pays where {expression}", ("row_softmax:a",), ("row_softmax:b",), SOURCE,
                     loo_accuracy=1.0, kernel_loo_accuracy=kernel_loo),))


def retrievable(cards, naive, info):
    found = retrieve(naive, info, cards, limit=len(cards), statuses=CANDIDATES)
    assert found, "the dry walk's cards retrieve on the naive softmax"
    return found[0].card


def test_a_failing_timing_precondition_skips_the_card_and_says_where(cards, naive, info):
    card = retrievable(cards, naive, info)
    headline = info.case(info.headline).params  # rows 16384, cols 4096
    skipped: list = []
    others = [c for c in cards if c.id != card.id]
    found = retrieve(naive, info, others + [timed(card, "cols <= 1024")], limit=len(cards), statuses=CANDIDATES,
                     skipped=skipped)
    assert card.id not in {m.card.id for m in found}
    [failed] = skipped
    assert (failed.card, failed.expression, failed.case, failed.facts) == (card.id, "cols <= 1024", "headline",
                                                                           {"cols": headline["cols"]})
    assert str(failed).startswith("precondition_failed: ") and "fails on case headline (cols = 4096)" in str(failed)
    held = retrieve(naive, info, others + [timed(card, "cols >= 1024")], limit=len(cards), statuses=CANDIDATES,
                    skipped=skipped)
    assert card.id in {m.card.id for m in held} and len(skipped) == 1


def test_launch_facts_of_the_target_value_the_predicate(cards, naive, info):
    card = retrievable(cards, naive, info)
    facts = launch_facts(naive, info.case(info.headline).params)
    assert facts["waves"] == round(facts["blocks"] / 132, 4) and facts["blocks"] >= 1
    below = timing_failure(timed(card, f"waves >= {facts['waves'] * 2}"), info, naive)
    assert below is not None and below.facts == {"waves": facts["waves"]}
    assert timing_failure(timed(card, f"waves >= {facts['waves']}"), info, naive) is None
    # without the state the launch is unknown: undecided, so it skips nothing
    assert timing_failure(timed(card, f"waves >= {facts['waves'] * 2}"), info) is None


def test_an_undecided_timing_precondition_skips_nothing(cards, naive, info):
    """Registers are known only once the target is compiled: a timing predicate over them is undecided here."""
    card = timed(retrievable(cards, naive, info), "registers <= 32")
    assert timing_failure(card, info, naive) is None and precondition_failure(card, info, naive) == ""


def test_the_loop_records_precondition_failed_and_counts_what_it_saved(cards, naive, info, gate_cache):
    card = retrievable(cards, naive, info)
    library = Library(tuple(c if c.id != card.id else timed(c, "cols <= 1024") for c in cards),
                      {"lineages": ["row_softmax_warp_vec4 (dry)"]})
    result = optimize(SOFTMAX, naive, strategy="library", library=library, budget=2,
                      gate_mode=GateMode.COMPILE_ONLY, cache=gate_cache, statuses=CANDIDATES)
    skipped = [a for a in result.attempts if a.status is AttemptStatus.PRECONDITION_FAILED]
    assert skipped and all(a.card == card.id and "cols <= 1024" in a.message and "case headline" in a.message
                           and a.evaluation is None for a in skipped)
    assert result.stats.saved == len(skipped) and result.to_dict()["stats"]["saved"] == len(skipped)
    assert OptimizationResult.from_json(result.to_json()) == result
    assert "saved" not in Stats(1, 0, 0, 0.0).to_dict()  # a run that skipped nothing keeps its old bytes
    row = bench_script("skills_eval").strategy_row(result)  # what the roundtrip benchmark records of it
    assert row["saved"] == len(skipped)


def test_a_failing_timing_precondition_does_not_decide_a_site_another_transform_lends():
    """A card learned on kernels with a block per row (blocks >= 512 over row_softmax's cases) is lent
    serialize_reduction's warp per row on a held-out rms_norm whose naive kernel runs a thread per row in 128
    blocks: its precondition speaks of the kernels its own transform rewrote, so the lent site is gated."""
    from pathlib import Path

    from klineage.kernel import load_kernel
    from klineage.optimize.strategies import RewriterKind, Strategy, planner
    from klineage.problem import load_problem
    from klineage.skills.library import bundled_library, load_library
    from klineage.transforms import catalog

    transfer = Path(__file__).resolve().parent.parent / "bench" / "transfer" / "rms_norm"
    target, start = load_problem(transfer / "problem.py").info, load_kernel(transfer / "naive")
    assert launch_facts(start, target.case(target.headline).params)["blocks"] < 512
    shuffle = next(c for c in load_library(bundled_library()).cards if c.transform == "shuffle_to_shared")
    card = dataclasses.replace(shuffle, preconditions=(Precondition(
        "blocks >= 512", "pays where blocks >= 512", ("row_softmax:a",), ("row_softmax:b",), SOURCE,
        loo_accuracy=1.0, kernel_loo_accuracy=1.0),))
    assert timing_failure(card, target, start) is not None
    plan = planner(Strategy.LIBRARY, RewriterKind.RULES, cards=[card], problem=target, statuses=[card.status],
                   transforms=list(catalog().values()), seed=0)
    offered = [c for c in plan(start) if c.rewrite is not None]
    assert [(c.card, c.rewrite.transform, c.not_gated) for c in offered] == [(card.id, "serialize_reduction", "")]


def test_the_rows_a_case_writes_value_an_alignment_predicate(cards, naive, info):
    """row_softmax's outputs are float32 rows of `cols`: its headline (4096) writes 16384-byte rows, aligned
    to 128 bytes; a 1025-column case's rows are aligned to 4 bytes only, where a 16-byte pack cannot line up."""
    card = retrievable(cards, naive, info)
    assert layout_facts(info.outputs, {"rows": 8, "cols": 4096}) == {"row_bytes": 16384, "row_align": 128}
    assert layout_facts(info.outputs, {"rows": 8, "cols": 1025}) == {"row_bytes": 4100, "row_align": 4}
    assert layout_facts(info.outputs, {"rows": 8}) == {}  # a shape that does not resolve says nothing
    assert timing_failure(timed(card, "row_align >= 16"), info, naive) is None
    failed = timing_failure(timed(card, "row_align >= 256"), info, naive)
    assert failed is not None and failed.facts == {"row_align": 128}


def _measured_on(card, lineage: Lineage, ratios: dict[str, float]):
    """The card with per-case effects measured on `lineage`'s kernel (one step of it)."""
    source = Ref(lineage_id(lineage), RefKind.TRANSITION, 0)
    return dataclasses.replace(card, effects=tuple(Effect(case, "row_softmax", r, (r, r), source)
                                                   for case, r in ratios.items()))


def test_a_rule_not_shown_to_carry_decides_only_on_the_kernels_it_was_measured_on(cards, info):
    """A timing precondition measured on one kernel (no leave-one-kernel-out), or one whose left-out kernels
    it does not predict better than always saying the commoner outcome, skips its card on the states of the
    walks it was measured on and nowhere else: on another kernel the gate measures it."""
    lineage = Lineage.load(DRY_LINEAGE)
    own = lineage.states[-1].kernel  # the dry walk's simplest kernel: one the card was measured on
    card = retrievable(cards, own, info)
    others = [c for c in cards if c.id != card.id]
    ratios = {"a": 1.2, "b": 0.97, "c": 0.98, "d": 0.99}
    for kernel_loo in (None, 0.7):  # one kernel; several, left-out ones predicted worse than "did not pay" (0.75)
        narrow = _measured_on(timed(card, "cols <= 1024", kernel_loo), lineage, ratios)
        skipped: list = []
        found = retrieve(own, info, others + [narrow], limit=len(cards), statuses=CANDIDATES, skipped=skipped)
        assert card.id in {m.card.id for m in found} and not skipped  # without the walks: not its kernel
        found = retrieve(own, info, others + [narrow], limit=len(cards), statuses=CANDIDATES, skipped=skipped,
                         lineages={lineage_id(lineage): lineage})
        assert card.id not in {m.card.id for m in found} and [f.card for f in skipped] == [card.id]
    carrying = _measured_on(timed(card, "cols <= 1024", 0.8), lineage, ratios)  # 0.8 >= MIN_LOO and > 0.75
    skipped = []
    retrieve(own, info, others + [carrying], limit=len(cards), statuses=CANDIDATES, skipped=skipped)
    assert [f.card for f in skipped] == [card.id]


def test_every_derived_fact_a_predicate_may_name_is_said_in_words_and_kept_from_divisibility(naive, info):
    """Each fact the case, launch, ptxas, work, layout and SASS families give has its own meaning in the
    glossary (a new fact without one would read as "a parameter"); of them only row bytes may get a
    divisibility rule, the parameters always may."""
    from types import SimpleNamespace

    from klineage.skills.facts import MEASURED_FACTS, case_facts, kernel_facts, meaning
    from klineage.walk.timing_audit import compiled_facts

    params = dict(info.case(info.headline).params)
    launch = launch_facts(naive, params)
    ptxas = compiled_facts(SimpleNamespace(compile={"resources": {"sm_90": {"k": {"registers": 40}}}}))
    kernel = kernel_facts({"sass": {"counts": [{"name": "ldg_128", "locus": "k", "count": 2}]}})
    facts = case_facts(params, launch, ptxas, info.roofline[info.headline], layout_facts(info.outputs, params), kernel)
    derived = set(facts) - set(params)
    assert {"blocks", "registers", "megabytes", "row_align", "barriers", "vector_load_share"} <= derived
    for name in derived:
        assert not meaning(name, ("row_softmax",)).startswith("a parameter"), name
    assert derived - MEASURED_FACTS == {"row_bytes"} and not set(params) & MEASURED_FACTS
    assert meaning("cols", ("row_softmax",)) == "a parameter of the row_softmax cases"
