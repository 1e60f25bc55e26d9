"""Ordering.MEASURED: a library strategy tries what this run or the library measured paying less than a step
after the rest of its round, and leaves nothing out.

The end-to-end runs are bmm_small's default search on an H100 in both orders (sessions 46 and 47), replayed off its
recorded verdicts: the planner, the transforms, the bundled library, the budget and the rivals are the real ones,
and every verdict is one the GPU gave."""

from __future__ import annotations

import dataclasses
import json

import pytest

from klineage import config, corpus
from klineage.config import REPO_ROOT, GateMode
from klineage.errors import DocumentError
from klineage.gate.cache import GateCache
from klineage.kernel import load_kernel
from klineage.optimize import AttemptStatus, CodeCheck, OptimizationResult, Strategy, optimize, strategies
from klineage.optimize.strategies import Candidate, Ordering, RunMemory, Tier, mechanism_short_of
from klineage.skills.admission_rule import short_of_todays_rule
from klineage.skills.card import CardStatus
from klineage.skills.library import bundled_library, load_library
from klineage.transforms.base import Anchor, Direction, Rewrite

SITE = Anchor("row_softmax", "function", "launch_bounds(256)")


def _candidate(state, suffix: str, card: str = "", transform: str = "ldg", **why) -> Candidate:
    kernel = state.with_source(state.source + f"\n// {suffix}\n")
    return Candidate(transform, card, rewrite=Rewrite(transform, Direction.FORWARD, Anchor("k", "function", suffix),
                                                      kernel), **why)


def _suffix(candidate: Candidate) -> str:
    return candidate.state.source.rsplit("// ", 1)[1].strip()


def test_what_is_measured_to_pay_less_than_a_step_comes_after_the_rest_of_the_round():
    """Fresh kernels of the cards, then of the catalog; then what the library measured short of a step on other
    kernels, and the kernels cards passed over; last what this run refused on this operator. Nothing is left
    out, and the catalog never gates a card's kernel again, wherever the card's kernel went."""
    start = corpus.kernel_entry("row_softmax/naive").load()
    card = "c" * 64
    from_cards = [_candidate(start, "card", card), _candidate(start, "card-refused", card),
                  _candidate(start, "passed", card, passed_over="alone: never a step")]
    from_catalog = [_candidate(start, suffix) for suffix in ("passed", "refused", "fresh", "short", "card",
                                                             "card-refused")]
    tiers = {"card-refused": (Tier.THIS_RUN, "not faster before"), "refused": (Tier.THIS_RUN, "rejected before"),
             "short": (Tier.LIBRARY, "its cards fell short")}
    plan = strategies._then(lambda state: iter(from_cards), lambda state: iter(from_catalog),
                            lambda candidate: tiers.get(_suffix(candidate), (Tier.FRESH, "")))
    order = [(c.card != "", _suffix(c), c.put_last) for c in plan(start)]
    assert order == [(True, "card", ""), (True, "passed", ""), (False, "fresh", ""),
                     (False, "short", "its cards fell short"), (False, "passed", ""),
                     (True, "card-refused", "not faster before"), (False, "refused", "rejected before")]
    as_planned = strategies._then(lambda state: iter(from_cards), lambda state: iter(from_catalog))
    assert [_suffix(c) for c in as_planned(start)] == ["card", "card-refused", "passed", "refused", "fresh", "short",
                                                       "passed"]


def test_a_site_the_run_gated_without_a_step_counts_only_once_its_round_took_one():
    """The lookahead's composites on this round's stepping stones are planned before any step: a refusal of this
    round must not put them last."""
    start = corpus.kernel_entry("row_softmax/naive").load()
    memory = RunMemory()
    candidate = Candidate("launch_bounds", rewrite=Rewrite("launch_bounds", Direction.FORWARD, SITE, start))
    memory.unpaid("launch_bounds", SITE, "not faster")
    assert memory.measured(candidate) == ""
    memory.stepped()
    assert memory.measured(candidate) == ("launch_bounds at row_softmax/function:launch_bounds(256) was not faster "
                                          "at an earlier best kernel of this run")
    elsewhere = Candidate("launch_bounds", rewrite=Rewrite("launch_bounds", Direction.FORWARD,
                                                           Anchor("other", "function", "launch_bounds(256)"), start))
    assert memory.measured(elsewhere) == "", "another site of the transform is not what was measured"
    memory.unpaid("launch_bounds", SITE, "rejected")
    memory.stepped()
    assert "was not faster" in memory.measured(candidate), "the first measurement of a site is the one told"


def _measured(transform: str, *ratios: float):
    card = load_library(bundled_library()).cards[0]
    effects = tuple(dataclasses.replace(card.effects[0], ratio=r, per_trial=(r, r, r)) for r in ratios) \
        if card.effects else ()
    return dataclasses.replace(card, id="", transform=transform, effects=effects, verification_log=())


def test_a_mechanism_is_short_of_a_step_only_when_some_card_measured_it_and_none_reached_the_ratio():
    assert load_library(bundled_library()).cards[0].effects, "the helper needs a card with an effect to copy"
    cards = [_measured("unpad_shared", 1.003, 1.008), _measured("unpad_shared"), _measured("launch_bounds", 1.169)]
    assert mechanism_short_of("unpad_shared", cards, 1.01) == (
        "no measurement of the library's 1 measured unpad_shared card(s) reached the 1.01x a step needs "
        "(best 1.008x)")
    assert mechanism_short_of("launch_bounds", cards, 1.01) == ""
    assert mechanism_short_of("unblock_matmul", cards, 1.01) == "", "no card: unknown, not short"
    assert mechanism_short_of("unpad_shared", cards + [_measured("unpad_shared", 1.2)], 1.01) == ""
    assert mechanism_short_of("unpad_shared", cards, None) == ""
    # an effect counts by its worst of median and trials, as a card alone is judged (short_of)
    mixed = dataclasses.replace(cards[2], id="", effects=(dataclasses.replace(cards[2].effects[0], ratio=1.05,
                                                                       per_trial=(1.05, 1.0, 1.06)),))
    assert mechanism_short_of("launch_bounds", [mixed], 1.01).endswith("(best 1.000x)")


BMM_SMALL = REPO_ROOT / "bench" / "transfer" / "bmm_small"
PARTS = REPO_ROOT / "bench" / "results" / "transfer-parts"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def on_the_h100(monkeypatch):
    """Replay serves the verdicts the H100 recorded (bench/logs/gpu-session-s46.txt, -s47.txt)."""
    monkeypatch.setenv("KLINEAGE_REPLAY_GPU", H100)


def _replayed(ordering: Ordering, budget: int = 8) -> OptimizationResult:
    """bmm_small's default search as transfer_eval ran it on the H100 (budget 8, 6 jobs, 3 rivals, before the code
    check)."""
    result = optimize(BMM_SMALL / "problem.py", load_kernel(BMM_SMALL / "naive"),
                      strategy=Strategy.LIBRARY_THEN_CATALOG, library=load_library(bundled_library()), budget=budget,
                      gate_mode=GateMode.REPLAY, jobs=6, rivals=3, cache=GateCache(None, config.recorded_dir()),
                      ordering=ordering, code_check=CodeCheck.NONE)
    assert OptimizationResult.from_json(result.to_json()) == result
    assert result.ordering is ordering
    return result


def _gated(result: OptimizationResult) -> list[tuple[int, str]]:
    return [(a.round, a.transform) for a in result.attempts if a.status.gated]


def test_a_site_refused_at_an_earlier_best_kernel_waits_behind_what_no_one_measured(on_the_h100):
    """As planned, the round after the tile re-gates the `__launch_bounds__` card that was not faster on the naive
    kernel, then the catalog's padding removal (its cards measured 1.003x and 1.01x), and budget 8 ends at the tile,
    1.58x. Measured, both wait behind register blocking, which the same budget takes: 4.01x. Each replay is the run
    its committed part records."""
    planned, measured = _replayed(Ordering.AS_PLANNED), _replayed(Ordering.MEASURED)
    for result, part in ((planned, "gpu-s46-h100"), (measured, "gpu-s47-h100-measured")):
        recorded = json.loads((PARTS / part / "bmm_small.json").read_text(encoding="utf-8"))
        run = recorded["runs"]["bmm_small"]["library_then_catalog"]
        assert [s.transform for s in result.steps] == run["steps"]
        assert result.speedup == pytest.approx(run["speedup"])
    assert [s.transform for s in planned.steps] == ["untile_matmul"] and planned.speedup == pytest.approx(1.577, 1e-3)
    assert [s.transform for s in measured.steps] == ["untile_matmul", "unblock_matmul"]
    assert measured.speedup == pytest.approx(1.577 * 2.544, 1e-3)
    # the first round and the next round's card composite are the same; then the planned order re-gates what was
    # refused or measured short, and the measured order gates register blocking at the 7th evaluation
    assert _gated(measured)[:5] == _gated(planned)[:5]
    assert _gated(planned)[5:] == [(1, "launch_bounds"), (1, "unpad_shared")]
    assert _gated(measured)[5:7] == [(1, "unblock_matmul"), (2, "launch_bounds+unroll+unpad_shared")]
    refused = {(a.transform, a.anchor) for a in measured.attempts if a.round == 0 and a.status.gated
               and a.status is not AttemptStatus.FASTER}
    assert ("launch_bounds", Anchor("bmm", "function", "launch_bounds(256)")) in refused


def test_a_run_document_keeps_its_ordering_and_one_from_before_orderings_reads_as_planned(on_the_h100):
    result = _replayed(Ordering.MEASURED, budget=2)
    data = json.loads(result.to_json())
    assert data["ordering"] == "measured"
    del data["ordering"]
    assert OptimizationResult.from_dict(data).ordering is Ordering.AS_PLANNED
    with pytest.raises(DocumentError, match=r"optimization\.ordering"):
        OptimizationResult.from_dict(data | {"ordering": "sideways"})



def test_a_card_today_s_admission_rule_doubts_waits_behind_what_no_one_measured(monkeypatch):
    """bias_grad's default search on the H200 (session 60), replayed off the verdicts its three searches recorded.
    As it ran, the round after the split column sum gave two of its four evaluations to card be14705607df's
    shuffle_to_shared kernels (0.66x and 0.62x): a card admitted on one trial of 1.014x against the 1.010x asked,
    inside the gate's run-to-run spread, which today's rule reads inconclusive. Measured, its kernels wait behind
    the catalog's, and the same budget takes the merge's block reduction: 19.49x where the run had 17.60x."""
    monkeypatch.setenv("KLINEAGE_REPLAY_GPU", "NVIDIA H200")
    problem = REPO_ROOT / "bench" / "transfer" / "bias_grad"
    library = load_library(bundled_library())
    doubted = library.by_id("be14705607df")
    assert doubted.status is CardStatus.ADMITTED and "above it by under 1.5%" in short_of_todays_rule(doubted)
    place = strategies._measured_last(library.cards, RunMemory(), 1.01)
    start = load_kernel(problem / "naive")
    tier, why = place(_candidate(start, "doubted", doubted.id, "shuffle_to_shared"))
    assert tier is Tier.LIBRARY and why == short_of_todays_rule(doubted)
    assert place(_candidate(start, "fresh", "", "shuffle_to_shared")) == (Tier.FRESH, "")
    result = optimize(problem / "problem.py", start, strategy=Strategy.LIBRARY_THEN_CATALOG, library=library,
                      budget=8, gate_mode=GateMode.REPLAY, jobs=6, rivals=3,
                      cache=GateCache(None, config.recorded_dir()), ordering=Ordering.MEASURED)
    recorded = json.loads((PARTS / "gpu-s60-h200" / "bias_grad.json").read_text(encoding="utf-8"))
    ran = recorded["runs"]["bias_grad"]["library_then_catalog"]
    assert ran["steps"] == ["unsplit_reduction"] and ran["speedup"] == pytest.approx(17.596, 1e-3)
    assert [s.transform for s in result.steps] == ["unsplit_reduction", "serialize_block_reduction"]
    assert result.speedup == pytest.approx(19.487, 1e-3) and result.stats.evaluations == 8
    assert not any(a.card == doubted.id and a.status.gated for a in result.attempts)
