"""Lineage pages (list and timeline) and the review queue.

A lineage page reads the stored document and its step rows only: diffs are highlighted on the
server with the CUDA highlighter, one line at a time, with +/- gutters (klineage_web.diff_rows); the
first line of each run of removed (added) lines carries the features the step removes (adds). The job
that made a lineage, if one did, is gate_app's to know: the page's template asks klineage_web.walk_jobs.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.db.models import F, Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from klineage.skills.standing import ratio_text
from klineage_web.access import read_access
from klineage_web.diff_rows import diff_layout, diff_lines, split_rows
from klineage_web.pagination import paginate, query_without
from klineage_web.short_ids import one_or_404
from skills_app.filters import LineageFilter
from skills_app.lineage_overview import speedup_chart, step_row
from skills_app.models import Lineage, LineageStep, Review, Verdict

REVIEW_PERMISSION = "skills_app.add_review"
TERMINATIONS = ("complete", "step_limit", "rejection_limit", "unknown")


def ratio_bars(overall: float, per_trial: list[float], mark: float, label: str) -> dict[str, Any]:
    """A paired ratio, overall and per trial, as bar widths on one scale with `mark` drawn across them;
    a bar short of the mark is drawn slow, and its text never reads equal to the mark."""
    scale = max([mark, overall, *per_trial, 1.0]) * 1.1
    bars = [{"label": label, "ratio": overall, "text": ratio_text(overall, mark),
             "width": round(100 * overall / scale, 1), "ok": overall >= mark, "overall": True}]
    bars += [{"label": f"trial {i + 1}", "ratio": v, "text": ratio_text(v, mark), "width": round(100 * v / scale, 1),
              "ok": v >= mark} for i, v in enumerate(per_trial)]
    return {"bars": bars, "mark": mark, "mark_at": round(100 * mark / scale, 1)}


def timing_rows(timing: dict[str, Any] | None) -> dict[str, Any] | None:
    """The forward step's child time / parent time ratios as bars, with the required ratio marked."""
    if not timing:
        return None
    return ratio_bars(float(timing.get("overall", 0.0)), [float(v) for v in timing.get("per_trial", [])],
                      float(timing.get("required", 0.99)), "vs parent")


def vendor_timing(state_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Per kernel state, vendor time / state time as bars (parity marked), from the newest passed verdict
    of that state whose profile timed the vendor beside it (`profile.ratios.vs_vendor`), with that
    verdict's key, GPU and case; passed only, so a kernel the gate rejected is never shown as fast.
    A walk times each step against its parent only (its policy leaves the vendor out), and times from
    different runs are never divided, so a state that no verdict timed against the vendor is absent:
    the page says so instead of showing a number."""
    found: dict[int, dict[str, Any]] = {}
    rows = (Verdict.objects.filter(state_id__in=state_ids, status=Verdict.StatusChoices.PASSED,
                                   document__profile__ratios__has_key="vs_vendor")
            .order_by("state_id", F("created").desc(nulls_last=True), "-id")
            # Only the ratio and the case out of each document: verdict documents are large.
            .values("state_id", "key", "gpu", ratio=F("document__profile__ratios__vs_vendor"),
                    case=F("document__profile__case")))
    for row in rows:
        ratio = row["ratio"]
        if row["state_id"] in found or not isinstance(ratio, dict):
            continue
        bars = ratio_bars(float(ratio.get("overall", 0.0)), [float(v) for v in ratio.get("per_trial", [])],
                          1.0, "vs vendor")
        found[row["state_id"]] = {**bars, "key": row["key"], "gpu": row["gpu"], "case": row["case"] or ""}
    return found


def _state_summaries(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["fingerprint"]: s for s in document.get("states", [])}


def _evidence(step: LineageStep) -> dict[str, Any]:
    evidence = step.evidence or {}
    worst = evidence.get("worst") or {}
    audit = evidence.get("audit") or {}
    return {
        "message": evidence.get("message", ""),
        "stage": evidence.get("stage", ""),
        "case": evidence.get("case", ""),
        "log": evidence.get("log", ""),
        "worst": sorted(worst.items()),
        "audit": sorted((k, v) for k, v in audit.items()),
    }


def _reviewable(user) -> bool:
    return bool(user.is_authenticated and user.has_perm(REVIEW_PERMISSION))


@require_GET
@read_access
def lineages(request):
    queryset = Lineage.objects.defer("document").select_related("expert_state__kernel").order_by(
        "operator", "expert_name", "-imported_at")
    found = LineageFilter(request.GET, queryset=queryset)
    rows = found.qs if found.is_valid() else queryset.none()
    page = paginate(request, rows)
    return render(request, "skills/lineages.html", {
        "page": page,
        "query": query_without(request.GET),
        "operators": Lineage.objects.order_by("operator").values_list("operator", flat=True).distinct(),
        "rewriters": Lineage.objects.order_by("rewriter").values_list("rewriter", flat=True).distinct(),
        "terminations": TERMINATIONS,
        "assurances": Lineage.Assurance.choices,
        "selected": {key: request.GET.get(key, "") for key in ("problem", "termination", "rewriter", "assurance")},
        "total": Lineage.objects.count(),
    })


def lineage_or_404(lineage_id: str, queryset=None) -> Lineage:
    """A lineage by its full id or by the 12-hex short id pages show."""
    return one_or_404(queryset if queryset is not None else Lineage.objects.all(), "id", lineage_id)


STEPS_PER_PART = 24  # accepted steps drawn in full per page of a lineage; the overview table lists all
ORDERS = {"backward": "expert → naive (the walk's order)", "forward": "naive → expert (the skills' order)"}


@require_GET
@read_access
def lineage(request, lineage_id: str):
    found = lineage_or_404(lineage_id, Lineage.objects.select_related("expert_state__kernel", "problem"))
    if found.id != lineage_id:
        query = f"?{request.GET.urlencode()}" if request.GET else ""
        return redirect(reverse("skills:lineage", args=[found.id]) + query)
    document = found.document
    states = _state_summaries(document)
    # Diffs load on demand (step_diff) and the states' sources are read from nowhere here.
    steps = list(found.steps.defer("backward_diff", "forward_diff", *(f"{state}__{column}" for state in (
        "parent_state", "child_state") for column in ("source", "plan"))).select_related("parent_state", "child_state")
                 .prefetch_related(Prefetch("reviews", queryset=Review.objects.select_related("reviewer"))))
    accepted = [s for s in steps if s.accepted]
    rejected = [s for s in steps if not s.accepted]
    branches: dict[int, list[dict[str, Any]]] = {}
    for step in rejected:
        branches.setdefault(step.branch_step, []).append({"step": step})
    order = request.GET.get("order") if request.GET.get("order") in ORDERS else "backward"
    sequence = accepted if order == "backward" else accepted[::-1]
    parts = max(1, -(-len(sequence) // STEPS_PER_PART))
    part = min(max(1, _number(request.GET.get("part"))), parts)
    part_of = {step.index: i // STEPS_PER_PART + 1 for i, step in enumerate(sequence)}
    part_of[len(accepted)] = parts if order == "backward" else 1  # attempts at the simplest state
    rows = [step_row(step, states) for step in steps]
    for row in rows:
        at = part_of[row["step"].branch_step]
        row["href"] = f"#{row['anchor_id']}" if at == part else f"?order={order}&part={at}#{row['anchor_id']}"
    shown = sequence[(part - 1) * STEPS_PER_PART:part * STEPS_PER_PART]
    by_step = {(row["step"].kind, row["step"].index): row for row in rows}
    vendor = vendor_timing([found.expert_state_id, *(step.child_state_id for step in shown)])
    timeline = []
    for step in shown:
        child = states.get(step.child_state.fingerprint, {})
        timeline.append({
            "step": step,
            "row": by_step[(step.kind, step.index)],
            "verdict": child.get("verdict", {}),
            "timing": timing_rows(step.forward_timing),
            "vendor": vendor.get(step.child_state_id),
            "rejected": branches.get(step.index, []),
            "review": step.latest_review,
        })
    if order == "forward":
        rows.reverse()
    expert = states.get(found.expert_state.fingerprint, {})
    last = accepted[-1].child_state if accepted else found.expert_state
    return render(request, "skills/lineage.html", {
        "lineage": found,
        "document": document,
        "expert_verdict": expert.get("verdict", {}),
        "expert_vendor": vendor.get(found.expert_state_id),
        "timeline": timeline,
        "rows": rows,
        "chart": speedup_chart([row for row in rows if row["accepted"]]),
        "order": order,
        "orders": ORDERS,
        "part": part,
        "parts": range(1, parts + 1),
        "part_count": parts,
        "part_steps": (shown[0].index, shown[-1].index) if shown else None,
        # the expert opens the walk's order and closes the skills'; the simplest state the reverse
        "expert_at": "start" if order == "backward" and part == 1 else "end" if order == "forward" and part == parts
        else "",
        "simplest_at": "end" if order == "backward" and part == parts else "start" if order == "forward" and part == 1
        else "",
        "after_last": branches.get(len(accepted), []),
        "last_state": last,
        "limits": document.get("limits", {}),
        "can_review": _reviewable(request.user),
        "diff_layout": diff_layout(request),
    })


@require_GET
@read_access
def step_diff(request, lineage_id: str, index: int):
    """One accepted step's forward diff (simpler kernel -> with the mechanism), as a fragment the
    lineage page loads when its diff is opened; linked from the page, it also reads on its own."""
    step = get_object_or_404(LineageStep.objects.select_related("parent_state", "child_state"),
                             lineage_id=lineage_or_404(lineage_id).id, kind=LineageStep.Kind.ACCEPTED, index=index)
    rows = forward_diff_rows(step)
    layout = diff_layout(request)
    fragment = request.headers.get("X-Fragment") == "1"
    return render(request, "skills/_step_diff.html" if fragment else "skills/step_diff.html", {
        "step": step, "rows": split_rows(rows) if layout == "split" else rows, "diff_layout": layout,
    })


@require_GET
@read_access
def rejected_attempt(request, lineage_id: str, index: int):
    """One rejected attempt's evidence (reason, stage, worst error, log excerpt), as a fragment the lineage
    page loads when the attempt is opened; linked from the page, it also reads on its own."""
    step = get_object_or_404(LineageStep, lineage_id=lineage_or_404(lineage_id).id, kind=LineageStep.Kind.REJECTED,
                             index=index)
    fragment = request.headers.get("X-Fragment") == "1"
    return render(request, "skills/_rejected_body.html" if fragment else "skills/rejected_attempt.html",
                  {"step": step, "evidence": _evidence(step)})


def _number(text: str | None) -> int:
    try:
        return int(text or 1)
    except ValueError:
        return 1


def forward_diff_rows(step: LineageStep) -> list[dict[str, Any]]:
    """The step in the forward direction, as cards show theirs: what the walk removed reads as added."""
    return forward_headers(diff_lines(step.forward_diff, step.features_added, step.features_removed))


FORWARD_HEADERS = {"--- child/kernel.cu": "--- without the step (the walk's child)",
                   "+++ parent/kernel.cu": "+++ with the step (the walk's parent)"}


def forward_headers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A forward diff's file headers in words: which side lacks the mechanism and which has it."""
    for row in rows:
        if row["kind"] == "file" and str(row["code"]) in FORWARD_HEADERS:
            row["code"] = FORWARD_HEADERS[str(row["code"])]
    return rows


WALKS = {"gpu": ("GPU walks", Lineage.Assurance.GPU_VERIFIED),
         "dry": ("dry walks (compile only, unverified)", Lineage.Assurance.UNVERIFIED),
         "all": ("all walks", None)}


@require_GET
@read_access
def review_queue(request):
    """Steps nobody has reviewed: by default those of GPU walks, whose timing a reviewer can judge; a dry
    walk's steps were only compiled and wait in a list of their own (?walks=dry)."""
    pending = (LineageStep.objects.filter(reviews__isnull=True).select_related("lineage", "parent_state", "child_state")
               .defer("lineage__document", "backward_diff", "forward_diff", "parent_state__source",
                      "child_state__source")
               .order_by("lineage__operator", "lineage_id", "branch_step", "-kind", "index"))
    # Narrow the queue to one operator, one lineage or one kind of step (unknown values match nothing).
    selected = {key: request.GET.get(key, "").strip() for key in ("operator", "lineage", "kind", "walks")}
    if selected["walks"] not in WALKS:
        selected["walks"] = "all" if selected["lineage"] else "gpu"
    field = {"operator": "lineage__operator", "lineage": "lineage_id", "kind": "kind"}
    pending = pending.filter(**{field[key]: selected[key] for key in field if selected[key]})
    apart = pending.filter(lineage__assurance=Lineage.Assurance.UNVERIFIED).count() \
        if selected["walks"] == "gpu" else 0
    assurance = WALKS[selected["walks"]][1]
    if assurance is not None:
        pending = pending.filter(lineage__assurance=assurance)
    page = paginate(request, pending)
    for step in page.object_list:
        step.row = step_row(step, {})
    recent = Review.objects.select_related("step__lineage", "reviewer").defer("step__lineage__document")[:20]
    return render(request, "skills/review.html", {
        "page": page,
        "query": query_without(request.GET),
        "selected": selected,
        "walks": [(key, label) for key, (label, _) in WALKS.items()],
        "walks_label": WALKS[selected["walks"]][0],
        "apart": apart,
        "apart_query": query_without(request.GET, "walks"),
        "operators": Lineage.objects.order_by("operator").values_list("operator", flat=True).distinct(),
        "kinds": LineageStep.Kind.choices,
        "recent": recent,
        "can_review": _reviewable(request.user),
        "verdicts": Review.Verdict.choices,
    })


@require_POST
@login_required
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def review_step(request, step_id: int):
    step = get_object_or_404(LineageStep.objects.select_related("lineage"), id=step_id)
    verdict = request.POST.get("verdict", "")
    comment = request.POST.get("comment", "").strip()
    if verdict not in Review.Verdict.values:
        messages.error(request, "Choose confirm or dispute.")
    elif verdict == Review.Verdict.DISPUTE and not comment:
        messages.error(request, "A dispute needs a comment saying what is wrong.")
    else:
        Review.objects.create(step=step, reviewer=request.user, verdict=verdict, comment=comment[:5000])
        messages.success(request, f"Recorded: {verdict} on step {step.index} ({step.transform}).")
    target = request.POST.get("next", "")
    if target == "lineage":
        return redirect(reverse("skills:lineage", args=[step.lineage_id]) + f"#step-{step.kind}-{step.index}")
    return redirect("skills:review")
