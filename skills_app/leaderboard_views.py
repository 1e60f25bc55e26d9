"""A problem's leaderboard: every kernel state with a passed, timed verdict on the current problem,
fastest first within each timed case, with its time beside the vendor's from the same run. One GPU at a time:
times from two GPUs would rank hardware, not kernels."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, F
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from klineage.skills.standing import ratio_text
from klineage_web.access import read_access
from skills_app.models import Problem, Verdict
from skills_app.views import current_problem_or_404


def timed(problem: Problem):
    return Verdict.objects.filter(problem_fingerprint=problem.fingerprint, status=Verdict.StatusChoices.PASSED,
                                  document__profile__contenders__has_key="candidate")


def timed_gpus(problem: Problem) -> list[tuple[str, int]]:
    """(GPU, kernel states timed on it) for every GPU the problem was timed on, the most states first."""
    counts = timed(problem).values("gpu").annotate(states=Count("kernel_fingerprint", distinct=True))
    return sorted(((row["gpu"], row["states"]) for row in counts), key=lambda item: (-item[1], item[0]))


def leaderboard_rows(problem: Problem, gpu: str) -> dict[str, list[dict[str, Any]]]:
    """Per timed case, one row per kernel state timed on `gpu`, fastest first: its newest passed timed verdict
    there that timed the vendor beside it, else its newest (a walk times a step against its parent only).
    `state` is None for a kernel only recorded verdicts know (an optimization's candidate, say): its source is
    not stored, so there is nothing to compare."""
    found = (timed(problem).filter(gpu=gpu)
             .order_by("kernel_fingerprint", F("created").desc(nulls_last=True), "-id")
             .values("key", "kernel_name", "kernel_fingerprint", "gpu", "created", "state", "state__kernel__name",
                     case=F("document__profile__case"), contenders=F("document__profile__contenders"),
                     ratios=F("document__profile__ratios"), settlement=F("document__profile__settlement__state")))
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
    gpus = timed_gpus(problem)
    gpu = request.GET.get("gpu") or (gpus[0][0] if gpus else "")
    if gpus and gpu not in dict(gpus):
        raise Http404(f"no verdict of {operator} was timed on GPU {gpu!r}; timed on: {', '.join(dict(gpus))}")
    others = [(other, states) for other, states in gpus if other != gpu]
    return render(request, "skills/leaderboard.html", {"problem": problem, "gpu": gpu, "others": others,
                                                       "cases": leaderboard_rows(problem, gpu) if gpu else {}})
