"""The library and a lineage's steps as CSV or JSON, one row per card or step, with the words the
pages show beside the numbers (ratios are child time / parent time of the forward step: above 1,
the mechanism made the kernel faster)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from django.db.models import F, Prefetch
from django.http import Http404, HttpResponse
from django.views.decorators.http import require_GET

from klineage_web.access import read_access
from skills_app.card_words import effective_status, standing_of, title_of
from skills_app.libraries import cards_of, library_or_404
from skills_app.lineage_overview import step_row
from skills_app.lineage_views import lineage_or_404
from skills_app.models import CardTrial

FORMATS = {"csv": "text/csv; charset=utf-8", "json": "application/json"}


def _respond(rows: list[dict[str, Any]], name: str, fmt: str) -> HttpResponse:
    if fmt not in FORMATS:
        raise Http404(f"no export as {fmt}: csv or json")
    if fmt == "json":
        body = json.dumps(rows, indent=1)
    else:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["none"])
        writer.writeheader()
        writer.writerows({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()}
                         for row in rows)
        body = out.getvalue()
    response = HttpResponse(body, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response


@require_GET
@read_access
def library_export(request, fmt: str, library: str | None = None):
    shown = library_or_404(library)
    cards = (cards_of(shown).order_by("transform", "card_id")
             .annotate(anchor=F("document__anchor"), effects=F("document__effects"),
                       preconditions=F("document__preconditions"))
             .prefetch_related(Prefetch("trials", queryset=CardTrial.objects.only("card_id", "outcome", "ratio",
                                                                                  "judged"))))
    rows = []
    for card in cards:
        title = title_of(card, card.anchor)
        standing = standing_of(card, card.effects, card.trials.all(), card.preconditions)
        rows.append({
            "card_id": card.card_id, "short_id": card.short_id, "title": str(title), "transform": card.transform,
            "site": title.where, "status": card.status, "effective_status": effective_status(card),
            "standing": standing.badge, "measurements": standing.sentence, "library": shown.name if shown else "",
            "when_kind": card.when_kind, "when": card.when_label,
            "median_gain_x": card.median_gain, "operators": card.operators, "surface": card.surface,
            "platform": card.platform, "readmission": card.readmission,
            "effects": [{"case": f"{e['operator']}/{e['case']}", "ratio_x": e["ratio"], "trials_x": e["per_trial"]}
                        for e in card.effects],
        })
    return _respond(rows, f"klineage-library-{shown.name}" if shown else "klineage-library", fmt)


@require_GET
@read_access
def lineage_export(request, lineage_id: str, fmt: str):
    found = lineage_or_404(lineage_id)
    states = {s["fingerprint"]: s for s in found.document.get("states", [])}
    steps = (found.steps.defer("backward_diff", "forward_diff", "parent_state__source", "child_state__source")
             .select_related("parent_state", "child_state"))
    rows = []
    for step in steps:
        row = step_row(step, states)
        timing = step.forward_timing or {}
        rows.append({
            "kind": step.kind, "index": step.index, "branch_step": step.branch_step, "transform": step.transform,
            "forward": row["verb"], "site": row["where"], "forward_status": step.forward_status,
            "ratio_x": timing.get("overall"), "trials_x": timing.get("per_trial", []),
            "required_x": timing.get("required"), "verdict": row["words"].badge if row["words"] else "rejected",
            "rejection": step.rejection_category, "sass_change": [d["text"] for d in row["sass"]],
            "parent": step.parent_state.fingerprint, "child": step.child_state.fingerprint if step.child_state else "",
        })
    return _respond(rows, f"lineage-{found.id[:12]}-steps", fmt)
