"""The skill library: a filtered, sorted list of cards, one page per card, and its SKILL.md.

The list reads the lifted columns only (never the card documents); the card page reads one
document and resolves its lineage refs (`expert@fingerprint:gate`, see
`klineage.skills.induction.lineage_id`) to the stored lineage steps, so risks and evidence link to
the rejected attempt or accepted step on its lineage page.
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Count, F
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from klineage.gate.policy import Placement
from klineage.skills import skillmd
from klineage.skills.card import SkillCard as EngineCard
from klineage.walk.timing_audit import Pairing
from klineage_web.access import read_access
from klineage_web.cuda_highlight import highlight_lines
from klineage_web.diff_rows import diff_layout, diff_lines, split_rows
from klineage_web.pagination import paginate, query_without
from skills_app.card_refs import resolve_refs
from skills_app.card_when import soundness_preconditions, when_chart
from skills_app.card_words import effective_status, gain_where_held, standing_of, title_of
from skills_app.filters import SkillCardFilter
from skills_app.libraries import addressed_card, cards_of, libraries_with_counts, library_or_404
from skills_app.lineage_views import forward_headers
from skills_app.models import CardTrial, LineageStep, SkillCard, When

SORTS = {
    "gain": ("measured gain", [F("median_gain").desc(nulls_last=True), "transform", "card_id"]),
    "transform": ("transform", ["transform", "card_id"]),
    "id": ("card id", ["card_id"]),
}
FILTERS = ("q", "status", "readmission", "when", "operator", "surface", "platform", "intent", "feature",
           "preconditions", "sort")
READMISSION_CHOICES = [("true", "back to admission"), ("false", "standing")]
STEP_KINDS = {"transition": LineageStep.Kind.ACCEPTED, "rejection": LineageStep.Kind.REJECTED}


@require_GET
@read_access
def library(request, library: str | None = None):
    shown = library_or_404(library)
    cards = cards_of(shown)
    sort = request.GET.get("sort") if request.GET.get("sort") in SORTS else "gain"
    queryset = cards.only("card_id", "short_id", "status", "transform", "intent", "surface", "platform",
                          "operators", "median_gain", "precondition_count", "risk_count", "readmission",
                          "when_kind", "when_label")
    found = SkillCardFilter(request.GET, queryset=queryset)
    rows = found.qs.order_by(*SORTS[sort][1]) if found.is_valid() else queryset.none()
    page = paginate(request, rows)
    _words(page.object_list)
    for row in page.object_list:
        row.library = shown  # every listed card is the shown library's: its address needs no query
    without_status = request.GET.copy()
    without_status.pop("status", None)
    by_status = SkillCardFilter(without_status, queryset=cards)
    counts = dict(by_status.qs.order_by().values_list("status").annotate(n=Count("id"))) if by_status.is_valid() else {}
    back = by_status.qs.filter(status=SkillCard.Status.ADMITTED).exclude(readmission="").count() if counts else 0
    return render(request, "skills/library.html", {
        "library": shown,
        "exports": {fmt: shown.export_url(fmt) for fmt in ("csv", "json")} if shown else {},
        "libraries": libraries_with_counts(),
        "filter": found,
        "page": page,
        "query": query_without(request.GET),
        "status_query": query_without(request.GET, "status"),
        "status_counts": [{"status": value, "count": counts.get(value, 0)} for value, _ in SkillCard.Status.choices],
        "back_to_admission": back,  # of the admitted ones: optimizations take them for candidates
        "operators": _operators(cards),
        "surfaces": cards.order_by("surface").values_list("surface", flat=True).distinct(),
        "platforms": cards.order_by("platform").values_list("platform", flat=True).distinct(),
        "statuses": SkillCard.Status.choices,
        "whens": When.choices,
        "readmission_choices": READMISSION_CHOICES,
        "sorts": [(key, label) for key, (label, _) in SORTS.items()],
        "sort": sort,
        "selected": {key: request.GET.get(key, "") for key in FILTERS},
        "total": cards.count(),
    })


@require_GET
@read_access
def card(request, short_id: str, library: str | None = None):
    row = addressed_card(short_id, library)
    document = row.document
    diagnostics = document.get("diagnostics", [])
    steps = resolve_refs([*document["evidence"], *(ref for risk in document["risks"] + diagnostics
                                                   for ref in risk["evidence"]),
                          *(effect["source"] for effect in document["effects"])])
    anchor = document["anchor"]
    trials = list(row.trials.order_by("created", "id"))
    return render(request, "skills/card.html", {
        "card": row,
        "title": title_of(row, anchor),
        "standing": standing_of(row, document["effects"], trials, document["preconditions"]),
        "held_gain": gain_where_held(document["effects"], document["preconditions"]),
        "document": document,
        "anchor": anchor,
        "snippet": highlight_lines(anchor["snippet"]) if anchor["snippet"] else [],
        "vector": split_rows(forward_headers(diff_lines(document["vector"]))) if diff_layout(request) == "split"
        else forward_headers(diff_lines(document["vector"])),
        "diff_layout": diff_layout(request),
        "preconditions": soundness_preconditions(document),
        "when": when_chart(document),
        "diagnostics": [{**d, "links": [_link(ref, steps) for ref in d["evidence"]]} for d in diagnostics],
        "effects": effect_chart(document["effects"], steps),
        "risks": [{**risk, "links": [_link(ref, steps) for ref in risk["evidence"]]} for risk in document["risks"]],
        "evidence": [_link(ref, steps) for ref in document["evidence"]],
        "scope": document["scope"],
        "carrier": [(key, ", ".join(json.dumps(v) for v in (values if isinstance(values, list) else [values])))
                    for key, values in document["carrier"].items()],
        "trials": trials,
        "history": row.trials.filter(judged=CardTrial.Judged.EARLIER).exists(),
        "current_trials": row.trials.filter(judged=CardTrial.Judged.CURRENT).exists(),
        "elsewhere": SkillCard.objects.filter(card_id=row.card_id).exclude(pk=row.pk).select_related("library")
        .order_by("library__name"),
        "reviews": sorted((review for step in steps.values() for review in step.reviews.all()),
                          key=lambda r: (r.created, r.id), reverse=True),
    })


@require_GET
@read_access
def card_skillmd(request, short_id: str, library: str | None = None):
    row = addressed_card(short_id, library)
    # A card sent back to admission by a dispute reads as the candidate an optimization treats it as.
    engine_card = EngineCard.from_dict({**row.to_document(), "status": effective_status(row)})
    response = HttpResponse(skillmd.render(engine_card), content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{skillmd.skill_dir(engine_card)}-SKILL.md"'
    return response


def _words(cards: list[SkillCard]) -> None:
    """Each listed card's title and standing, from its anchor, effects and trials read for this page only
    (read with the list, the documents' parts would be extracted for every card the filter matched)."""
    parts = {pk: rest for pk, *rest in SkillCard.objects.filter(pk__in=[c.pk for c in cards]).values_list(
        "pk", "document__anchor", "document__effects", "document__preconditions")}
    trials: dict[int, list[CardTrial]] = {}
    for trial in CardTrial.objects.filter(card__in=cards).only("card_id", "outcome", "ratio", "judged"):
        trials.setdefault(trial.card_id, []).append(trial)
    for card in cards:
        anchor, effects, preconditions = parts[card.pk]
        card.title = title_of(card, anchor)
        card.standing = standing_of(card, effects, trials.get(card.pk, []), preconditions)


def effect_chart(effects: list[dict[str, Any]], steps: dict[tuple[str, str, int], LineageStep] | None = None
                 ) -> dict[str, Any] | None:
    """Per-case bars of the child/parent time ratio (> 1 is faster), the trials' range as a whisker
    and the 1.0 line, in SVG user units: a 320-wide view box, one 34-unit row per effect, its label
    above its bar so long case names fit at any width. An effect whose step's timing is biased (its
    states timed apart in their two pairings, `LineageStep.pairing`) is drawn hollow and listed. Where
    the step was re-timed with its kernels exchanging places, a tick marks the measurement the bar is
    not: the re-timed ratio beside the walk's (a library built before the re-timing), or the walk's
    own beside an effect that is the re-timing (`placement` exchanged); either way it is listed."""
    if not effects:
        return None
    span, row_height = 250, 34
    steps = steps or {}
    step_of = [steps.get((e["source"]["lineage"], e["source"]["kind"], e["source"]["index"])) for e in effects]
    ticks = [_other_measurement(e, s) for e, s in zip(effects, step_of)]
    scale = max([1.0, *(e["ratio"] for e in effects), *(r for e in effects for r in e["per_trial"]),
                 *(value for value, _ in filter(None, ticks))]) * 1.05
    bars = []
    for i, (effect, step, tick) in enumerate(zip(effects, step_of, ticks)):
        trials = effect["per_trial"] or [effect["ratio"]]
        top = i * row_height
        biased = step is not None and step.pairing == Pairing.BIASED.value
        bars.append({
            "label": f"{effect['operator']}/{effect['case']}",
            "biased_note": step.pairing_note if biased else "",
            "retimed": step.retimed_ratio if tick else None,
            "retimed_note": step.pairing_note if tick else "",
            "tick": tick[0] if tick else None,
            "tick_kind": tick[1] if tick else "",
            "tick_x": round(span * tick[0] / scale, 1) if tick else 0,
            "ratio": effect["ratio"],
            "faster": effect["ratio"] >= 1.0,
            "label_y": top + 12,
            "y": top + 16,
            "width": round(span * effect["ratio"] / scale, 1),
            "low": round(span * min(trials) / scale, 1),
            "high": round(span * max(trials) / scale, 1),
            "whisker_y": top + 21.5,
            "value_x": round(span * max(effect["ratio"], *trials) / scale + 5, 1),
            "value_y": top + 26,
        })
    kinds = {bar["tick_kind"] for bar in bars}
    return {"bars": bars, "one": round(span / scale, 1), "height": len(effects) * row_height + 4,
            "biased": [bar for bar in bars if bar["biased_note"]], "retimed": [bar for bar in bars if bar["tick"]],
            "retimed_ticks": "retimed" in kinds, "walked_ticks": "walked" in kinds}


def _other_measurement(effect: dict[str, Any], step: LineageStep | None) -> tuple[float, str] | None:
    """The ratio a tick marks beside the effect's bar and its kind, where the step was re-timed."""
    if step is None or step.pairing != Pairing.EXCHANGED.value or not step.retimed_ratio:
        return None
    if effect.get("placement") == Placement.EXCHANGED.value:
        walked = (step.forward_timing or {}).get("overall")
        return (walked, "walked") if walked else None
    return step.retimed_ratio, "retimed"


def _operators(cards) -> list[str]:
    """Every operator named in some card's scope (cards usually share a handful of scope lists)."""
    lists = cards.order_by().values_list("operators", flat=True).distinct()
    return sorted({name for names in lists for name in names})


def _link(ref: dict[str, Any], steps: dict[tuple[str, str, int], LineageStep]) -> dict[str, Any]:
    step = steps.get((ref["lineage"], ref["kind"], ref["index"]))
    expert = ref["lineage"].rpartition("@")[0] or ref["lineage"]
    label = f"{expert} {'step' if ref['kind'] == 'transition' else 'rejected attempt'} {ref['index']}"
    if step is None:
        return {"label": label, "ref": ref["lineage"], "url": None, "step": None}
    kind = STEP_KINDS[ref["kind"]]
    url = reverse("skills:lineage", args=[step.lineage_id]) + f"#step-{kind}-{step.index}"
    return {"label": label, "ref": ref["lineage"], "url": url, "step": step}
