"""What a card row reads as on a page: its forward title and its status beside its measurements
(`klineage.skills.titles`, `klineage.skills.standing`), for the library list, the card page and
the home page alike."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from klineage.skills.card import Effect, Precondition
from klineage.skills.standing import Standing, standing
from klineage.skills.titles import CardTitle, card_title
from klineage.skills.when import ruled_out
from skills_app.models import CardTrial, SkillCard


def title_of(card: SkillCard, anchor: dict[str, Any]) -> CardTitle:
    return card_title(card.transform, anchor, card.intent)


def standing_of(card: SkillCard, effects: Iterable[dict[str, Any]], trials: Iterable[CardTrial],
                preconditions: Iterable[dict[str, Any]] = ()) -> Standing:
    """Every trial counts, those that judged an earlier content of the card too: they measured the same
    mechanism on their targets, and the trial table marks which they are. `preconditions` (the card
    document's): where its timing precondition fails, a slower case is what it says, not against it."""
    effects = list(effects)
    return standing(card.status, [(f"{e['operator']}/{e['case']}", e["ratio"]) for e in effects],
                    [(t.outcome, t.ratio) for t in trials], card.readmission, ruled_out_of(effects, preconditions))


def ruled_out_of(effects: Iterable[dict[str, Any]], preconditions: Iterable[dict[str, Any]]) -> list[bool]:
    """Per effect of a card document, whether its timing precondition fails on that case."""
    return ruled_out([Effect.from_dict(e) for e in effects], [Precondition.from_dict(p) for p in preconditions])


def gain_where_held(effects: list[dict[str, Any]], preconditions: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The median child/parent ratio over the cases the card's timing precondition holds on, where it
    rules some out (the median over every case mixes in cases an optimization does not apply it to)."""
    flags = ruled_out_of(effects, preconditions)
    held = [e["ratio"] for e, out in zip(effects, flags) if not out]
    if not any(flags) or not held:
        return None
    return {"ratio": statistics.median(held), "cases": len(held)}


def effective_status(card: SkillCard) -> str:
    """The status an optimization acts on: an admitted card sent back to admission (a disputed step behind
    it, or trials today's rule does not admit it on) counts as a candidate until it passes admission again
    (`skills_app.readmission`)."""
    if card.readmission and card.status == SkillCard.Status.ADMITTED:
        return SkillCard.Status.CANDIDATE.value
    return card.status
