"""The library planner tries a card at all its sites at once before its single sites: a mechanism
spread over several sites (cp.async's copy, commit and wait; `__restrict__` on every pointer) may pay
only whole, and the loop's pair lookahead chains no more than two steps."""

from __future__ import annotations

from klineage import config
from klineage.lineage import Lineage
from klineage.optimize.strategies import RewriterKind, Strategy, planner
from klineage.skills.card import CardStatus
from klineage.skills.library import lineage_index, load_library, problem_infos
from klineage.skills.materialize import apply_everywhere, evidence_anchors, materialize
from klineage.transforms import catalog

ROOT = config.REPO_ROOT


def _plan(card, state, operator):
    lineages = lineage_index()
    plan = planner(Strategy.LIBRARY, RewriterKind.RULES, cards=[card], problem=problem_infos({operator})[operator],
                   statuses=(CardStatus.CANDIDATE, CardStatus.ADMITTED), transforms=list(catalog().values()),
                   seed=0, lineages=lineages)
    return list(plan(state)), lineages


def test_a_card_with_several_sites_is_tried_whole_first():
    library = load_library(ROOT / "corpus" / "library" / "library.json")
    walk = Lineage.load(ROOT / "corpus" / "lineages" / "conv2d_implicit_gemm.gpu.json")
    naive = walk.states[-1].kernel
    card = next(c for c in library.cards if c.transform == "restrict" and len(materialize(c, naive)) > 2)
    candidates, lineages = _plan(card, naive, "conv2d")
    singles = materialize(card, naive, evidence_anchors(card, lineages))
    whole = apply_everywhere(card, naive, evidence_anchors(card, lineages))
    assert len(candidates) == len(singles) + 1
    assert candidates[0].state.fingerprint == whole.state.fingerprint
    assert candidates[0].rewrite.note.startswith(f"at all {len(whole.anchors)} sites")
    assert [c.state.fingerprint for c in candidates[1:]] == [r.state.fingerprint for r in singles]


def test_a_card_with_one_site_is_tried_once():
    library = load_library(ROOT / "corpus" / "library" / "library.json")
    walk = Lineage.load(ROOT / "corpus" / "lineages" / "conv2d_implicit_gemm.gpu.json")
    card = next(c for c in library.cards if c.transform == "scalarize_mma")
    candidates, _ = _plan(card, walk.states[-1].kernel, "conv2d")
    assert len(candidates) == 1 and candidates[0].rewrite is not None and "at all" not in candidates[0].rewrite.note
