"""Cards sent back to admission: those a disputed step stands behind, and those today's rule would not admit.

A card is marked while any accepted step in its evidence stands disputed (its latest review disputes
it); a later confirming review clears the mark. An admitted card is marked too where its recorded
trials, read under today's admission rule, no longer admit it (`admission_rule.short_of_todays_rule`:
admitted once on a trial that was merely not more than 1% slower). Marked cards keep their status on
the page (with the reason beside it), but an optimization treats a marked admitted card as a
candidate: its evidence no longer vouches for it until it passes admission again.
"""

from __future__ import annotations

from klineage.skills.admission_rule import short_of_todays_rule
from klineage.skills.card import SkillCard as EngineCard
from skills_app.card_refs import resolve_refs, step_ref
from skills_app.models import LineageStep, SkillCard


def reason(card: SkillCard) -> str:
    """Why `card` must pass admission again, or "" when no step behind it is disputed and today's rule
    admits it as its status says."""
    steps = resolve_refs(card.document["evidence"])
    disputed = sorted((s for s in steps.values() if s.disputed), key=lambda s: (s.lineage_id, s.index))
    said = [f"{s.lineage.expert_name} step {s.index} disputed by "
            f"{s.latest_review.reviewer.get_username() if s.latest_review.reviewer else 'a reviewer'}"
            for s in disputed]
    if card.status == SkillCard.Status.ADMITTED:
        said.append(short_of_todays_rule(EngineCard.from_dict(card.document)))
    return "; ".join(filter(None, said))


def refresh_card(card: SkillCard) -> bool:
    """Re-mark one card; whether its mark changed."""
    marked = reason(card)
    if marked == card.readmission:
        return False
    card.readmission = marked
    card.save(update_fields=["readmission", "updated_at"])
    return True


def refresh_for_step(step: LineageStep) -> int:
    """Re-mark the cards whose evidence names `step`; how many marks changed."""
    if not step.accepted:
        return 0  # rejected attempts are risks, not evidence a card stands on
    ref = step_ref(step)
    standing = [card for card in SkillCard.objects.filter(transform=step.transform)  # evidence is the transform's
                if any((r["lineage"], r["kind"], r["index"]) == ref for r in card.document["evidence"])]
    return sum(refresh_card(card) for card in standing)


def on_review_saved(sender, instance, created: bool, **kwargs) -> None:
    if created:
        refresh_for_step(LineageStep.objects.select_related("lineage__expert_state").get(pk=instance.step_id))
