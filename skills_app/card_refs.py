"""A card's evidence refs (`expert@fingerprint-prefix:gate`, kind, index) and the stored lineage steps
they name, in both directions."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, Q

from skills_app.models import LineageStep, Review


def step_ref(step: LineageStep) -> tuple[str, str, int]:
    """The ref a card would use for `step` (`klineage.skills.induction.lineage_id` on the stored side)."""
    lineage = step.lineage
    key = f"{lineage.expert_name}@{lineage.expert_state.fingerprint[:12]}:{lineage.gate_mode}"
    return key, "transition" if step.accepted else "rejection", step.index


def lineage_filter(key: str) -> Q | None:
    """`expert@fingerprint-prefix:gate` as a lookup on a step's lineage."""
    name, _, rest = key.rpartition("@")
    prefix, _, gate = rest.partition(":")
    if not name or not prefix or not gate:
        return None
    return Q(lineage__expert_name=name, lineage__expert_state__fingerprint__startswith=prefix, lineage__gate_mode=gate)


def resolve_refs(refs: list[dict[str, Any]]) -> dict[tuple[str, str, int], LineageStep]:
    """(ref lineage, ref kind, index) -> the stored step. Where one expert was walked more than once
    under one gate mode, the longest walk is the one a library is built from
    (`klineage.skills.library.corpus_lineages`); then the newest."""
    wanted = {(r["lineage"], r["kind"], r["index"]) for r in refs}
    lookups = {key: lineage_filter(key) for key in {r["lineage"] for r in refs}}
    found: dict[tuple[str, str, int], LineageStep] = {}
    for key, lookup in lookups.items():
        if lookup is None:
            continue
        steps = (LineageStep.objects.filter(lookup).select_related("lineage")
                 .defer("lineage__document", "backward_diff", "forward_diff")
                 .prefetch_related(Prefetch("reviews", queryset=Review.objects.select_related("reviewer")))
                 .order_by("-lineage__accepted_count", "-lineage__imported_at", "lineage_id", "kind", "index"))
        for step in steps:
            ref = (key, "transition" if step.accepted else "rejection", step.index)
            if ref in wanted and ref not in found:
                found[ref] = step
    return found
