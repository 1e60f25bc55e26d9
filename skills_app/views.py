"""Pages for problems, kernels and verdicts, rendered on the server from the imported documents.

Every view checks read access first (klineage_web.access), then reads the database only: no
problem file is loaded and no kernel compiled here.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET

from klineage.launch import ARCHES
from klineage_web.access import read_access
from klineage_web.cuda_highlight import highlight_lines
from klineage_web.pagination import paginate, query_without
from klineage_web.short_ids import one_or_404
from skills_app import presenters
from skills_app.filters import LATEST_STATUS_CHOICES, SUITE_CHOICES, KernelFilter, VerdictFilter
from skills_app.models import Kernel, KernelState, Problem, Verdict


@require_GET
@read_access
def kernels(request):
    queryset = (Kernel.objects.with_latest_verdict().select_related("current_state", "problem")
                .annotate(verdict_count=Count("current_state__verdicts")).order_by("adversarial", "name"))
    found = KernelFilter(request.GET, queryset=queryset)
    rows = found.qs if found.is_valid() else queryset.none()
    page = paginate(request, rows)
    return render(request, "skills/kernels.html", {
        "filter": found,
        "page": page,
        "query": query_without(request.GET),
        "operators": Kernel.objects.order_by("operator").values_list("operator", flat=True).distinct(),
        "statuses": LATEST_STATUS_CHOICES,
        "arches": ARCHES,
        "suites": SUITE_CHOICES,
        "selected": {key: request.GET.get(key, "") for key in ("problem", "status", "arch", "suite", "q")},
        "total": Kernel.objects.count(),
    })


@require_GET
@read_access
def kernel(request, name: str):
    found = get_object_or_404(Kernel.objects.select_related("current_state", "problem"), name=name)
    state = found.current_state
    verdicts = list(Verdict.objects.filter(state=state).select_related("problem"))
    against = _state_names({v.against for v in verdicts if v.against})
    compiled = next((v for v in verdicts if (v.document.get("compile") or {}).get("resources")), None)
    featured = next((v for v in verdicts if v.document.get("features")), None)
    older = (KernelState.objects.filter(kernel=found).exclude(pk=state.pk)
             .annotate(verdict_count=Count("verdicts")).order_by("-imported_at"))
    return render(request, "skills/kernel.html", {
        "kernel": found,
        "state": state,
        "plan": state.plan,
        "lines": highlight_lines(state.source),
        "verdicts": [_verdict_card(v, against) for v in verdicts],
        "latest": verdicts[0] if verdicts else None,
        "resources": presenters.resources(compiled.document) if compiled else [],
        "resources_from": compiled,
        "source_features": presenters.source_features(featured.document) if featured else [],
        "sass_features": presenters.sass_features(featured.document) if featured else [],
        "features_from": featured,
        "older_states": older,
    })


@require_GET
@read_access
def problems(request):
    rows = (Problem.objects.filter(current=True)
            .annotate(kernel_count=Count("kernels", distinct=True), verdict_count=Count("verdicts", distinct=True))
            .order_by("operator"))
    earlier = dict(
        Problem.objects.filter(current=False, upload_name="").values_list("operator").annotate(n=Count("id"))
    )
    return render(request, "skills/problems.html", {"problems": rows, "earlier": earlier})


def current_problem_or_404(operator: str) -> Problem:
    found = Problem.objects.filter(operator=operator, current=True).first()
    if found is None:
        raise Http404(f"no current problem '{operator}'")
    return found


@require_GET
@read_access
def problem(request, operator: str):
    found = current_problem_or_404(operator)
    info = found.info
    kernel_rows = (Kernel.objects.with_latest_verdict().filter(operator=operator)
                   .select_related("current_state").order_by("adversarial", "name"))
    tolerances = [{"dtype": dtype, **values} for dtype, values in sorted((info.get("tolerances") or {}).items())]
    return render(request, "skills/problem.html", {
        "problem": found,
        "info": info,
        "roofline": presenters.roofline_rows(info),
        "outputs": info.get("outputs", []),
        "tolerances": tolerances,
        "kernels": kernel_rows,
        "verdict_counts": dict(found.verdicts.values_list("status").annotate(n=Count("id"))),
        "earlier": Problem.objects.filter(operator=operator, current=False, upload_name="").order_by("-imported_at"),
    })


@require_GET
@read_access
def verdicts(request):
    queryset = Verdict.objects.select_related("state__kernel").defer("document", "policy")
    found = VerdictFilter(request.GET, queryset=queryset)
    rows = found.qs if found.is_valid() else queryset.none()
    page = paginate(request, rows)
    return render(request, "skills/verdicts.html", {
        "filter": found,
        "page": page,
        "query": query_without(request.GET),
        "statuses": Verdict.StatusChoices.choices,
        "operators": Verdict.objects.order_by("operator").values_list("operator", flat=True).distinct(),
        "selected": {key: request.GET.get(key, "") for key in ("status", "operator", "reason", "kernel")},
        "total": Verdict.objects.count(),
    })


@require_GET
@read_access
def verdict(request, key: str):
    found = one_or_404(Verdict.objects.select_related("state__kernel", "problem"), "key", key)
    if found.key != key:
        return redirect("skills:verdict", found.key)
    document = found.document
    against = _state_names({found.against} if found.against else set())
    findings = [{**f, "evidence_items": _evidence_items(f.get("evidence") or {})} for f in document.get("findings", [])]
    compile_record = document.get("compile") or {}
    return render(request, "skills/verdict.html", {
        "verdict": found,
        "document": document,
        "card": _verdict_card(found, against),
        "findings": findings,
        "stages": presenters.stages(document),
        "static_findings": (document.get("static") or {}).get("findings", []),
        "compile": compile_record,
        "resources": presenters.resources(document),
        "source_features": presenters.source_features(document),
        "sass_features": presenters.sass_features(document),
        "baseline_cases": presenters.case_results(document, role="baseline"),
        "vendor_check": _vendor_check(document),
        "sanitizer": sorted((document.get("sanitizer") or {}).items()),
        "policy": sorted((document.get("policy") or {}).items()),
        "domain": document.get("domain") or {},
    })


def _verdict_card(verdict: Verdict, against_names: dict[str, str]) -> dict[str, Any]:
    """What a verdict shows in a list: status, cases, worst errors, timing bars, provenance."""
    document = verdict.document
    timing = presenters.timing(document)
    fractions = (document.get("profile") or {}).get("roofline", {}).get("fraction", {})
    return {
        "verdict": verdict,
        "cases": presenters.case_results(document),
        "timing": timing,
        "roofline_fraction": fractions.get("candidate"),
        "provenance": presenters.provenance(document, verdict.served_from),
        "against_name": against_names.get(verdict.against, ""),
        "first_finding": (document.get("findings") or [None])[0],
    }


def _state_names(fingerprints: set[str]) -> dict[str, str]:
    """Fingerprint -> the kernel name it was imported as (or its plan name)."""
    names = {}
    for state in KernelState.objects.filter(fingerprint__in=fingerprints).select_related("kernel"):
        names[state.fingerprint] = state.kernel.name if state.kernel else state.name
    return names


def _evidence_items(evidence: dict[str, Any]) -> list[dict[str, Any]]:
    """Evidence as label/value pairs; long texts (sanitizer excerpts, logs) as blocks."""
    items = []
    for name, value in evidence.items():
        block = isinstance(value, str) and ("\n" in value or len(value) > 120)
        items.append({"name": name.replace("_", " "), "value": value, "block": block})
    return sorted(items, key=lambda item: (item["block"], item["name"]))


def _vendor_check(document: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for record in (document.get("environment") or {}).get("vendor_check") or []:
        outputs = record.get("outputs") or {}
        rows.append({"case": record.get("case", ""), "passed": record.get("passed"),
                     "message": "; ".join(o.get("message", "") for o in outputs.values())})
    return rows


