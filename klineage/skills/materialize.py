"""Materialization: a skill card turned back into code on a kernel it did not come from.

A card records a forward step (its transform) at the sites of its source lineages. To reuse it,
the transform names where its forward could add the mechanism in another state
(`Transform.forward_sites`, keyed with the card's carrier: the unroll factor, the fast-math
intrinsics the evidence showed acceptable, ...) and its forward rewrite runs at each. The caller
may add anchors: `evidence_anchors` gives those of the card's source transitions, which a state of
the same lineage still names (a roundtrip from a walk's naive end), including sites no finder
could place afresh (a scalarized MMA's emulation function). A site where the rewrite does not
apply (`NotApplicable`) is skipped; a card whose transform has no mechanical forward, or no site in
the state, materializes to nothing, and an LLM must do it.

`materialize` gives one rewrite per site, each of the unchanged state (the unit a walk step
has); `apply_everywhere` chains them into one kernel with the card applied at every site (the
unit an optimizer or an admission trial gates). Anchors are stable across the transforms' own
rewrites (ordinals count sites with and without the mechanism), so the sites found on the
original state still name the same places after earlier ones were rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from klineage.errors import KLineageError
from klineage.kernel import KernelState
from klineage.lineage import Lineage
from klineage.skills.card import RefKind, SkillCard
from klineage.transforms import get
from klineage.transforms.base import Anchor, NotApplicable, Rewrite, Transform


def forward_sites(transform: Transform, state: KernelState) -> list[Anchor]:
    """Where `transform`'s forward could add its mechanism in `state` (default carrier values)."""
    return transform.forward_sites(state)


def evidence_anchors(card: SkillCard, lineages: Mapping[str, Lineage]) -> list[Anchor]:
    """The anchors of the card's source transitions, from those of `lineages` (lineage id ->
    lineage) that are at hand, in evidence order without repeats."""
    anchors: list[Anchor] = []
    for ref in card.evidence:
        lineage = lineages.get(ref.lineage)
        if ref.kind is RefKind.TRANSITION and lineage is not None and ref.index < len(lineage.transitions):
            anchor = lineage.transitions[ref.index].anchor
            if anchor not in anchors:
                anchors.append(anchor)
    return anchors


def _sites(transform: Transform, state: KernelState, card: SkillCard, anchors: Sequence[Anchor]) -> list[Anchor]:
    found = transform.forward_sites(state, card.carrier)
    return found + [a for a in anchors if a not in found]


def materialize(card: SkillCard, state: KernelState, anchors: Sequence[Anchor] = ()) -> list[Rewrite]:
    """The card's transform's forward rewrite of `state` at every site where it applies, in site
    order (the transform's own sites, then `anchors`); carrier values from `card.carrier`. [] when
    there is none."""
    transform = get(card.transform)
    rewrites = []
    for anchor in _sites(transform, state, card, anchors):
        try:
            rewrites.append(transform.forward(state, anchor))
        except NotApplicable:
            continue
    return rewrites


@dataclass(frozen=True)
class Applied:
    """A card applied at every site of a state: the resulting kernel and the sites, in order."""

    card: str  # the card's id
    state: KernelState
    anchors: tuple[Anchor, ...]
    notes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.anchors or len(self.anchors) != len(self.notes):
            raise KLineageError("an applied card needs one note per site, and at least one site")


def apply_everywhere(card: SkillCard, state: KernelState, extra: Sequence[Anchor] = ()) -> Applied | None:
    """`state` with the card's forward applied at each of its sites (and `extra` anchors) in turn
    (a site that no longer applies after the earlier rewrites is skipped); None when none applies."""
    transform = get(card.transform)
    current, anchors, notes = state, [], []
    for anchor in _sites(transform, state, card, extra):
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
