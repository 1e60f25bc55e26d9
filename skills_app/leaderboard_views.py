"""A problem's leaderboard: every kernel state with a passed, timed verdict on the current problem,
fastest first within each timed case, with its time beside the vendor's from the same run."""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.shortcuts import render
from django.views.decorators.http import require_GET

from klineage.skills.standing import ratio_text
from klineage_web.access import read_access
from skills_app.models import Problem, Verdict
from skills_app.views import current_problem_or_404


def leaderboard_rows(problem: Problem) -> dict[str, list[dict[str, Any]]]:
    """Per timed case, one row per kernel state, fastest first: its newest passed timed verdict that timed
    the vendor beside it, else its newest (a walk times a step against its parent only). `state` is None
    for a kernel only recorded verdicts know (an optimization's candidate, say): its source is not stored,
    so there is nothing to compare."""
    found = (Verdict.objects.filter(problem_fingerprint=problem.fingerprint, status=Verdict.StatusChoices.PASSED,
                                    document__profile__contenders__has_key="candidate")
             .order_by("kernel_fingerprint", F("created").desc(nulls_last=True), "-id")
             .values("key", "kernel_name", "kernel_fingerprint", "gpu", "created", "state", "state__kernel__name",
                     case=F("document__profile__case"), contenders=F("document__profile__contenders"),
                     ratios=F("document__profile__ratios")))
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    for row in found:  # newest first per state: its newest verdict that timed the vendor, else its newest
        vendor = ((row["ratios"] or {}).get("vs_vendor") or {}).get("overall")
        slot = (row["kernel_fingerprint"], row["case"] or "?")
        if slot not in chosen or (vendor and not chosen[slot]["vendor"]):
            chosen[slot] = {**row, "vendor": vendor}
    cases: dict[str, list[dict[str, Any]]] = {}
    for (_, case), row in chosen.items():
        vendor = (row["ratios"] or {}).get("vs_vendor") or {}
        cases.setdefault(case, []).append({
            **row, "time_us": (row["contenders"] or {})["candidate"].get("median_us"),
            "vs_vendor": ratio_text(vendor["overall"]) if vendor.get("overall") else "",
            "vs_vendor_trials": ", ".join(ratio_text(v) for v in vendor.get("per_trial", [])),
            "faster_than_vendor": bool(vendor.get("overall") and vendor["overall"] > 1.0),
        })
    for rows in cases.values():
        rows.sort(key=lambda r: (r["time_us"] is None, r["time_us"] or 0.0, r["kernel_name"]))
    return dict(sorted(cases.items(), key=lambda item: (item[0] != problem.info.get("headline"), item[0])))


@require_GET
@read_access
def leaderboard(request, operator: str):
    problem = current_problem_or_404(operator)
    return render(request, "skills/leaderboard.html", {"problem": problem, "cases": leaderboard_rows(problem)})
