"""Materialization: a skill card turned back into code on a kernel it did not come from.

A card records a forward step (its transform) at the sites of its source lineages. To reuse it,
the transform names where its forward could add the mechanism in another state
(`Transform.forward_sites`, keyed with the card's carrier: the unroll factor, the fast-math
intrinsics the evidence showed acceptable, ...) and its forward rewrite runs at each. The caller
may add anchors: `evidence_anchors` gives those of the card's source transitions, which a state of
the same lineage still names (a roundtrip from a walk's naive end), including sites no finder
could place afresh (a scalarized MMA's emulation function). Retrieval by structure: a transform whose
forward places its mechanism by analysis (`Placement.ANALYSIS`: a warp per row, 16-byte vectors) lends
its sites to every card whose transform removes the same mechanism (`card_sites`), so a card learned on
one operator proposes its mechanism wherever another kernel has the structure it needs. A site where the
rewrite does not
apply (`NotApplicable`) is skipped; a card whose transform has no mechanical forward, or no site in
the state, materializes to nothing, and an LLM must do it.

`materialize` gives one rewrite per site, each of the unchanged state (the unit a walk step
has); `apply_everywhere` chains them into one kernel with the card applied at every site (the
unit an optimizer or an admission trial gates); `one_mechanism` and `apply_together` do the same for
cards that are one mechanism taken apart site by site (cp.async's copy, commit and wait), which
pays, or is even correct, only whole; `lineage_paths` orders the cards of one walk as a path from
its naive end back toward its expert. Anchors are stable across the transforms' own
rewrites (ordinals count sites with and without the mechanism), so the sites found on the
original state still name the same places after earlier ones were rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from klineage.errors import KLineageError
from klineage.kernel import KernelState
from klineage.lineage import Lineage
from klineage.skills.card import Ref, RefKind, SkillCard
from klineage.skills.replay import replay
from klineage.transforms import catalog, get
from klineage.transforms.base import Anchor, NotApplicable, Placement, Rewrite, Transform


def forward_sites(transform: Transform, state: KernelState) -> list[Anchor]:
    """Where `transform`'s forward could add its mechanism in `state` (default carrier values)."""
    return transform.forward_sites(state)


def evidence_anchors(card: SkillCard, lineages: Mapping[str, Lineage],
                     state: KernelState | None = None) -> list[Anchor]:
    """The anchors of the card's source transitions, from those of `lineages` (lineage id ->
    lineage) that are at hand, in evidence order without repeats; with `state`, those of lineages
    of its problem first: an anchor's snippet may hold the code forward puts back (cp.async's
    helper), one site takes the first that applies, and the state's own walk recorded its own."""
    def own_problem_first(ref: Ref) -> bool:
        lineage = lineages.get(ref.lineage)
        return not (state is not None and lineage is not None and lineage.problem.operator == state.plan.problem)

    anchors: list[Anchor] = []
    for ref in sorted(card.evidence, key=own_problem_first):
        lineage = lineages.get(ref.lineage)
        if ref.kind is RefKind.TRANSITION and lineage is not None and ref.index < len(lineage.transitions):
            anchor = lineage.transitions[ref.index].anchor
            if anchor not in anchors:
                anchors.append(anchor)
    return anchors


def _sites(transform: Transform, state: KernelState, card: SkillCard, anchors: Sequence[Anchor]) -> list[Anchor]:
    found = transform.forward_sites(state, card.carrier)
    return found + [a for a in anchors if a not in found]


def structural_transforms(card: SkillCard) -> list[Transform]:
    """The catalog's transforms, other than the card's own, that place the card's mechanism by analysis: their
    declared mechanism features meet those of the card's transform (or what the card provides), or they name
    the card's transform as their kin."""
    own = get(card.transform)
    mechanism = set(own.removes) | {feature.name for feature in card.provides}
    return [transform for name, transform in sorted(catalog().items()) if name != own.name
            and transform.placement is Placement.ANALYSIS and transform.lent
            and (mechanism & set(transform.removes) or own.name in transform.kin)]


def card_sites(card: SkillCard, state: KernelState, anchors: Sequence[Anchor] = ()) -> list[tuple[Transform, Anchor]]:
    """(transform, anchor) of every site where the card's mechanism could go in `state`: its own transform's
    sites and `anchors`, then the sites that a structural transform's analysis finds."""
    own = get(card.transform)
    pairs = [(own, anchor) for anchor in _sites(own, state, card, anchors)]
    for transform in structural_transforms(card):
        pairs += [(transform, anchor) for anchor in transform.forward_sites(state, card.carrier)]
    return pairs


def materialize(card: SkillCard, state: KernelState, anchors: Sequence[Anchor] = ()) -> list[Rewrite]:
    """The card's transform's forward rewrite of `state` at every site where it applies, in site
    order (the transform's own sites, then `anchors`); carrier values from `card.carrier`. [] when
    there is none."""
    rewrites = []
    for transform, anchor in card_sites(card, state, anchors):
        try:
            rewrites.append(transform.forward(state, anchor))
        except NotApplicable:
            continue
    return rewrites


@dataclass(frozen=True)
class Applied:
    """A card applied at every site of a state: the resulting kernel and the sites, in order."""

    card: str  # the card's id; the ids joined by '+' for cards applied together
    state: KernelState
    anchors: tuple[Anchor, ...]
    notes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.anchors or len(self.anchors) != len(self.notes):
            raise KLineageError("an applied card needs one note per site, and at least one site")


def apply_everywhere(card: SkillCard, state: KernelState, extra: Sequence[Anchor] = ()) -> Applied | None:
    """`state` with the card's forward applied at each of its sites (and `extra` anchors) in turn
    (a site that no longer applies after the earlier rewrites is skipped); None when none applies."""
    return _apply(card, state, card_sites(card, state, extra))


def _apply(card: SkillCard, state: KernelState, sites: Sequence[tuple[Transform, Anchor]]) -> Applied | None:
    current, anchors, notes = state, [], []
    for transform, anchor in sites:
        try:
            rewrite = transform.forward(current, anchor)
        except NotApplicable:
            continue
        current = rewrite.state
        anchors.append(anchor)
        notes.append(rewrite.note)
    if not anchors:
        return None
    return Applied(card.id, current, tuple(anchors), tuple(notes))


def one_mechanism(card: SkillCard, others: Sequence[SkillCard], lineages: Mapping[str, Lineage]) -> list[SkillCard]:
    """The card and those of `others` that are one mechanism with it, in forward order; [] when
    none is. One mechanism: cards of the same transform with a source transition in one unbroken
    run of that transform with one of the card's, in a lineage at hand (the walk took the mechanism
    apart there site by site). Forward order undoes the walk's: its last removal first (cp.async's
    wait and commit go back before the copy that needs them)."""
    def step_in_run(other: SkillCard) -> tuple[str, int, int] | None:
        """(lineage, the card's step, the other's step) of a run both are in; None when none."""
        for mine in card.evidence:
            for theirs in other.evidence:
                lineage = lineages.get(mine.lineage)
                transitions = mine.kind is RefKind.TRANSITION and theirs.kind is RefKind.TRANSITION
                if lineage is None or theirs.lineage != mine.lineage or not transitions:
                    continue
                low, high = sorted((mine.index, theirs.index))
                if high < len(lineage.transitions) and all(
                        t.transform == card.transform for t in lineage.transitions[low:high + 1]):
                    return mine.lineage, mine.index, theirs.index
        return None

    unique = {other.id: other for other in others if other.id != card.id and other.transform == card.transform}
    found = {other.id: step for other in unique.values() if (step := step_in_run(other)) is not None}
    if not found:
        return []
    where, mine, _ = next(iter(found.values()))  # order by the steps in one lineage: the first run's
    steps = {card.id: mine, **{i: s[2] for i, s in found.items() if s[0] == where}}
    group = [card] + [unique[i] for i in found if i in steps]
    return sorted(group, key=lambda c: -steps[c.id])


def apply_together(cards: Sequence[SkillCard], state: KernelState, lineages: Mapping[str, Lineage]) -> Applied | None:
    """`state` with the cards applied one after the other, each at its evidence's anchors where
    they apply, else everywhere, else (no mechanical forward) by replaying its recorded forward
    diff; None unless every card applies (one mechanism is whole or not there)."""
    current, anchors, notes = state, [], []
    for card in cards:
        # where the walk's own anchors apply (a roundtrip), there only: each with the carrier its step
        # recorded there, not one card's carrier at every site; else everywhere, else by replay
        evidence = evidence_anchors(card, lineages, current)
        own = get(card.transform)
        applied = _apply(card, current, [(own, a) for a in evidence]) or apply_everywhere(card, current, evidence)
        if applied is None:
            replayed = replay(card, current, lineages)
            if not replayed:
                return None
            applied = Applied(card.id, replayed[0].state, (replayed[0].anchor,), (replayed[0].note,))
        current, anchors, notes = applied.state, anchors + list(applied.anchors), notes + list(applied.notes)
    return Applied("+".join(c.id for c in cards), current, tuple(anchors), tuple(notes)) if cards else None


def lineage_paths(cards: Sequence[SkillCard], lineages: Mapping[str, Lineage], operator: str,
                  state: KernelState | None = None) -> list[tuple[str, list[SkillCard]]]:
    """Paths of cards: for each lineage at hand of `operator` that is a source of two or more of
    `cards`, (its id, those cards in forward order: the walk's last removal first, so that each
    card's prerequisites go back before it); the walk `state` is a state of first, then those with
    more cards. Where no walk of `operator` is such a source (a kernel of an operator no walk
    covers, e.g. an upload), the other operators' walks: a new kernel borrows a whole expert's
    order, each card still going only where it fits and applies."""
    steps = _steps(cards, lineages, lambda other: other == operator) or \
        _steps(cards, lineages, lambda other: other != operator)
    by_id = {card.id: card for card in cards}
    paths = [(name, [by_id[i] for i in sorted(found, key=lambda i: -found[i])]) for name, found in steps.items()]
    target = state.fingerprint if state is not None else None
    walked = {name for name in steps if any(s.fingerprint == target for s in lineages[name].states)}
    return sorted(paths, key=lambda path: (path[0] not in walked, -len(path[1]), path[0]))


def _steps(cards: Sequence[SkillCard], lineages: Mapping[str, Lineage],
           operator_ok: Callable[[str], bool]) -> dict[str, dict[str, int]]:
    """Lineage id -> {card id: the card's last step there}, for the walks whose operator is ok and
    that are a source of two or more of the cards."""
    steps: dict[str, dict[str, int]] = {}
    for card in cards:
        for ref in card.evidence:
            lineage = lineages.get(ref.lineage)
            if ref.kind is RefKind.TRANSITION and lineage is not None and operator_ok(lineage.problem.operator):
                known = steps.setdefault(ref.lineage, {})
                known[card.id] = max(known.get(card.id, -1), ref.index)
    return {name: found for name, found in steps.items() if len(found) > 1}
