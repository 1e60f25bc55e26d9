"""Two kernel states side by side: the source diff from the first to the second and their SASS
instruction counts, class by class, summed over the kernel's functions."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db.models import F
from django.shortcuts import render
from django.views.decorators.http import require_GET

from klineage.kernel import KernelState as EngineState
from klineage.launch import LaunchPlan
from klineage.lineage import unified_diff
from klineage_web.access import read_access
from klineage_web.diff_rows import diff_layout, diff_lines, split_rows
from klineage_web.short_ids import one_or_404
from skills_app.lineage_overview import sass_totals
from skills_app.models import KernelState, Lineage, Verdict


def sass_counts(state: KernelState) -> tuple[Counter[str], str]:
    """A state's SASS instruction counts and where they were read: its newest verdict that compiled it,
    else a lineage that holds it; empty when neither recorded any."""
    found = (Verdict.objects.filter(state=state, document__features__sass__has_key="counts")
             .order_by(F("created").desc(nulls_last=True), "-id")
             .values("key", counts=F("document__features__sass__counts")).first())
    if found:
        return sass_totals({"features": {"sass": {"counts": found["counts"]}}}), f"verdict {found['key'][:12]}"
    for lineage in Lineage.objects.filter(steps__child_state=state).distinct()[:1]:
        for summary in lineage.document.get("states", []):
            if summary["fingerprint"] == state.fingerprint:
                return sass_totals(summary), f"lineage {lineage.id[:12]}"
    return Counter(), ""


def sass_rows(a: Counter[str], b: Counter[str]) -> list[dict[str, Any]]:
    return [{"name": name, "a": a[name], "b": b[name], "delta": b[name] - a[name]}
            for name in sorted(set(a) | set(b), key=lambda n: (-abs(b[n] - a[n]), n))]


@require_GET
@read_access
def compare(request):
    """?a=&b= name two states by fingerprint (whole or its first 12 hex digits, as pages show them)."""
    names = {key: request.GET.get(key, "").strip() for key in ("a", "b")}
    context: dict[str, Any] = {"names": names, "diff_layout": diff_layout(request)}
    if all(names.values()):
        a, b = (one_or_404(KernelState.objects.select_related("kernel"), "fingerprint", names[k]) for k in "ab")
        engine = [EngineState(s.source, LaunchPlan.from_dict(s.plan)) for s in (a, b)]
        rows = diff_lines(unified_diff(*engine, "a", "b"))
        (counts_a, from_a), (counts_b, from_b) = sass_counts(a), sass_counts(b)
        context.update(a=a, b=b, diff=split_rows(rows) if context["diff_layout"] == "split" else rows,
                       same=a.fingerprint == b.fingerprint, sass=sass_rows(counts_a, counts_b),
                       sass_from=(from_a, from_b), totals=(sum(counts_a.values()), sum(counts_b.values())))
    return render(request, "skills/compare.html", context)
