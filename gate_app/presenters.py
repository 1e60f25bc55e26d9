"""A finished optimization's document as the job page shows it: the best kernel (highlighted
source), the skills applied on the way with their diffs, and every attempt."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from skills_app.highlight import highlight_lines
from skills_app.lineage_views import diff_lines
from skills_app.models import SkillCard

SHORT = 12  # characters of a card id the library's pages go by


def _ratio(value: dict[str, Any] | None) -> float | None:
    return value["overall"] if value else None


def optimization(result: dict[str, Any]) -> dict[str, Any]:
    steps = result["steps"]
    best = steps[-1]["state"] if steps else result["start"]
    named = {s["card"][:SHORT] for s in steps if s["card"]} | {a["card"][:SHORT] for a in result["attempts"] if a["card"]}
    known = set(SkillCard.objects.filter(short_id__in=named).values_list("short_id", flat=True))

    def card(card_id: str) -> dict[str, str] | None:
        if not card_id:
            return None
        short = card_id[:SHORT]
        return {"short": short, "url": reverse("skills:card", args=[short]) if short in known else ""}

    return {
        "best": result["best"], "source": highlight_lines(best["source"]), "speedup": result["speedup"],
        "stop": result["stop"], "message": result["message"], "note": result["note"], "stats": result["stats"],
        "strategy": result["strategy"], "gate": result["gate"], "budget": result["budget"],
        "library": result["library"],
        "applied": [{"index": s["index"], "transform": s["transform"], "card": card(s["card"]),
                     "ratio": _ratio(s["ratio"]), "diff": diff_lines(s["diff"])} for s in steps],
        "attempts": [{"index": a["index"], "round": a["round"], "transform": a["transform"], "card": card(a["card"]),
                      "status": a["status"], "ratio": _ratio(a["ratio"]), "message": a["message"]}
                     for a in result["attempts"]],
    }
