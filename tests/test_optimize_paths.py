"""Paths of cards: before single cards, the library planner offers the retrieved cards of each walk
of the operator as one candidate, in that walk's forward order. From the naive ends of the
committed GPU walks with the bundled library; the path kernels compile with the real nvcc."""

from __future__ import annotations

import pytest

from klineage import config, corpus
from klineage.config import GateMode
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.lineage import Lineage
from klineage.optimize.strategies import RewriterKind, Strategy, planner
from klineage.skills.card import CardStatus
from klineage.skills.induction import lineage_id
from klineage.skills.library import corpus_lineages, lineage_index, load_library, problem_infos
from klineage.skills.materialize import lineage_paths
from klineage.transforms import catalog

ROOT = config.REPO_ROOT
WALKS = {"conv2d": "conv2d_implicit_gemm.gpu.json", "gemm": "gemm_mma_sync.gpu.json"}
ADMITTED = (CardStatus.ADMITTED,)
ALL = (CardStatus.ADMITTED, CardStatus.CANDIDATE)


@pytest.fixture(scope="module")
def library():
    return load_library(ROOT / "corpus" / "library" / "library.json")


def _plan(strategy: Strategy, library, operator: str, statuses):
    lineages = lineage_index() if strategy is Strategy.LIBRARY else {}
    return planner(strategy, RewriterKind.RULES, cards=library.cards, problem=problem_infos({operator})[operator],
                   statuses=statuses, transforms=list(catalog().values()), seed=0, lineages=lineages)


def _walk(operator: str) -> Lineage:
    return Lineage.load(ROOT / "corpus" / "lineages" / WALKS[operator])


@pytest.mark.parametrize("operator", sorted(WALKS))
def test_the_first_candidate_is_the_walks_path_and_it_compiles(library, operator, gate_cache):
    walk = _walk(operator)
    first = next(_plan(Strategy.LIBRARY, library, operator, ADMITTED)(walk.states[-1].kernel))
    assert first.rewrite.note.startswith("a path of ") and lineage_id(walk) in first.rewrite.note
    [(_, cards)] = [p for p in lineage_paths([c for c in library.cards if c.status is CardStatus.ADMITTED],
                                             lineage_index(), operator) if p[0] == lineage_id(walk)]
    used = first.transform.split("+")
    remaining = iter(c.transform for c in cards)
    assert len(used) >= 5 and all(t in remaining for t in used)  # the cards that applied, in the path's order
    # forward order: the walk removed mma first and launch bounds last, so they come back last and first
    assert (used[0], used[-1]) == ("launch_bounds", "scalarize_mma")
    verdict = run_gate(corpus.problem_path(operator), first.state, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    assert verdict.status is Status.COMPILED, verdict.describe(300)


def _code_lines(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if line.strip()]


@pytest.mark.parametrize("walk", corpus_lineages()[0], ids=lineage_id)
def test_with_every_card_one_path_rebuilds_the_expert(library, walk):
    """From the naive end of every walk the skills evaluation starts from, the path of all its cards
    (unadmitted ones too) gives back the expert's code but for indentation: each card at its own
    step's anchors with the carrier recorded there (GEMM unrolls one loop by 4, the others fully),
    each where it fits the state the cards before it leave (row_softmax's vectorized loads need
    `__ldg` back first), the pipeline by replaying its recorded diff (no mechanical forward), the
    epilogue padding at its evidence's file-scope anchor."""
    operator = walk.problem.operator
    first = next(_plan(Strategy.LIBRARY, library, operator, ALL)(walk.states[-1].kernel))
    assert lineage_id(walk) in first.rewrite.note  # its own walk's path first
    assert _code_lines(first.state.source) == _code_lines(walk.states[0].kernel.source)


def test_a_path_is_offered_once_a_run(library):
    naive = _walk("conv2d").states[-1].kernel
    plan = _plan(Strategy.LIBRARY, library, "conv2d", ADMITTED)
    paths = [[c for c in plan(naive) if c.rewrite is not None and c.rewrite.note.startswith("a path")]
             for _ in range(2)]
    # one path per walk of conv2d (the sm_90a expert's walk too); a rejected path is not gated again
    # from the next best kernel
    assert [len(p) for p in paths] == [2, 0]
    fresh = _plan(Strategy.LIBRARY, library, "conv2d", ADMITTED)
    assert next(fresh(naive)).state.fingerprint == paths[0][0].state.fingerprint


def test_stripped_cards_make_no_path(library):
    naive = _walk("conv2d").states[-1].kernel
    candidates = [c for c in _plan(Strategy.GENERATED_ONLY, library, "conv2d", ALL)(naive) if c.rewrite is not None]
    assert candidates and not [c for c in candidates if c.rewrite.note.startswith("a path")]


def _borrowed_path(library):
    """conv2d's naive end's first candidate with conv2d's walks out of reach."""
    others = {name: lin for name, lin in lineage_index().items() if lin.problem.operator != "conv2d"}
    plan = planner(
        Strategy.LIBRARY,
        RewriterKind.RULES,
        cards=library.cards,
        problem=problem_infos({"conv2d"})["conv2d"],
        statuses=ADMITTED,
        transforms=list(catalog().values()),
        seed=0,
        lineages=others,
    )
    return next(plan(_walk("conv2d").states[-1].kernel))


def test_a_kernel_of_an_operator_no_walk_covers_borrows_another_operators_path(library):
    """With conv2d's walks out of reach (as for an uploaded kernel of a new operator), conv2d's naive
    end gets the other operators' walks as paths, the longest (GEMM's) first: its cards go back
    where they fit and apply here (cp.async, ldmatrix, vectorized accesses, launch bounds), the rest
    are passed over. Without the fallback it would get single cards only."""
    first = _borrowed_path(library)
    assert first.rewrite.note.startswith("a path of ") and "gemm_mma_sync" in first.rewrite.note
    assert {"launch_bounds", "devectorize", "sync_copies", "scalarize_ldmatrix"} <= set(first.transform.split("+"))
    own = lineage_paths([c for c in library.cards if c.status is CardStatus.ADMITTED], lineage_index(), "conv2d")
    assert {lin.problem.operator for name, _ in own for lin in [lineage_index()[name]]} == {"conv2d"}  # own walks only


@pytest.mark.slow  # about 16 s of nvcc on two cores; conv2d's own path compiles in the default run
def test_the_borrowed_path_compiles(library, gate_cache):
    first = _borrowed_path(library)
    verdict = run_gate(corpus.problem_path("conv2d"), first.state, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    assert verdict.status is Status.COMPILED, verdict.describe(300)
