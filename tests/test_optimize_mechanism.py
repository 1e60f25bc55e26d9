"""Cards that are one mechanism go back together. The walk takes cp.async apart site by site (the
copy, then its commit, then its wait: three steps, two cards), and neither half pays alone: on the
H200 the copy alone raced (NaN outputs) and the commit and wait alone were 0.98x (session 6). The
library planner offers the whole mechanism first, in forward order, from the committed GPU walks
and the bundled library."""

from __future__ import annotations

import pytest

from klineage import config
from klineage.lineage import Lineage
from klineage.optimize.strategies import RewriterKind, Strategy, planner
from klineage.skills.card import CardStatus
from klineage.skills.library import lineage_index, load_library, problem_infos
from klineage.skills.materialize import one_mechanism
from klineage.transforms import catalog

ROOT = config.REPO_ROOT
ALL = (CardStatus.CANDIDATE, CardStatus.ADMITTED)
WALKS = {"conv2d": "conv2d_implicit_gemm.gpu.json", "gemm": "gemm_mma_sync.gpu.json"}


@pytest.fixture(scope="module")
def library():
    return load_library(ROOT / "corpus" / "library" / "library.json")


def _walk(operator: str) -> Lineage:
    return Lineage.load(ROOT / "corpus" / "lineages" / WALKS[operator])


def _without_cp_async(walk: Lineage) -> int:
    """The first of the walk's three sync_copies steps (they run unbroken)."""
    steps = [i for i, t in enumerate(walk.transitions) if t.transform == "sync_copies"]
    assert steps == list(range(steps[0], steps[-1] + 1)) and len(steps) == 3
    return steps[0]


def _candidates(strategy: Strategy, library, state, operator: str, lineages):
    plan = planner(strategy, RewriterKind.RULES, cards=library.cards, problem=problem_infos({operator})[operator],
                   statuses=ALL, transforms=list(catalog().values()), seed=0, lineages=lineages)
    return [c for c in plan(state) if c.rewrite is not None]


@pytest.mark.parametrize("operator", sorted(WALKS))
def test_the_whole_cp_async_mechanism_comes_back_first_and_exactly(library, operator):
    walk = _walk(operator)
    first = _without_cp_async(walk)
    state, parent = walk.states[first + 3].kernel, walk.states[first].kernel
    lineages = lineage_index()
    copies = [c for c in _candidates(Strategy.LIBRARY, library, state, operator, lineages)
              if c.transform == "sync_copies"]
    whole = copies[0]
    assert whole.rewrite.note.startswith("one mechanism of cards")
    # Exactly the walk's state before it took cp.async apart: the commit and wait helpers and the
    # copy, with this problem's own helper (not the other lineage's same-named one).
    assert whole.state.fingerprint == parent.fingerprint
    assert all(c.state.fingerprint != parent.fingerprint for c in copies[1:]), "no single card gives it back"


def test_a_mechanism_is_ordered_as_forward_undoes_the_walk(library):
    walk = _walk("conv2d")
    lineages = lineage_index()
    first = _without_cp_async(walk)
    cards = [c for c in library.cards if c.transform == "sync_copies"]
    copy = next(c for c in cards if any(r.index == first and r.lineage.startswith("conv2d") for r in c.evidence))
    group = one_mechanism(copy, library.cards, lineages)
    assert group[-1].id == copy.id and len(group) == 2  # the helpers go back before the copy that needs them
    assert one_mechanism(copy, library.cards, {}) == []  # without the lineages nothing says they belong together
    unrelated = next(c for c in library.cards if c.transform == "scalarize_mma")
    assert one_mechanism(unrelated, library.cards, lineages) == []


def test_generated_only_cards_know_no_mechanism(library):
    walk = _walk("conv2d")
    state = walk.states[_without_cp_async(walk) + 3].kernel
    candidates = _candidates(Strategy.GENERATED_ONLY, library, state, "conv2d", lineage_index())
    assert candidates and not [c for c in candidates if c.rewrite.note.startswith("one mechanism")]
