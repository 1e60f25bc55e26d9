"""Kernel, lineage and job pages."""

import json

from django.conf import settings
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from django.core.paginator import Paginator

from gate_app.models import Job, Worker
from gate_app.queue import describe
from klineage_web.access import read_access

JOBS_PER_PAGE = 50


@require_GET
@read_access
def jobs(request):
    """Jobs newest first, filterable by status and kind, each with why it waits when it does."""
    selected = {"status": request.GET.get("status", ""), "kind": request.GET.get("kind", "")}
    queryset = Job.objects.select_related("owner").order_by("-created_at", "-id")
    if selected["status"] in Job.Status.values:
        queryset = queryset.filter(status=selected["status"])
    if selected["kind"] in Job.Kind.values:
        queryset = queryset.filter(kind=selected["kind"])
    page = Paginator(queryset, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    workers = list(Worker.objects.all())
    rows = [describe(job, log=False, workers=workers) for job in page.object_list]
    return render(request, "gate_app/jobs.html", {
        "page": page, "rows": rows, "selected": selected, "statuses": Job.Status.choices,
        "kinds": Job.Kind.choices, "workers": workers})


@require_GET
@never_cache
def job_state(request, job_id: int):
    """A job's whole state as JSON: what pages poll when no cross-process channel layer carries
    live progress (see the "poll" field), and what the WebSocket sends on connect."""
    if not settings.KLINEAGE_READ_OPEN and not request.user.is_authenticated:
        return JsonResponse({"error": "sign in to read jobs"}, status=403)
    job = Job.objects.select_related("owner").filter(pk=job_id).first()
    if job is None:
        return JsonResponse({"error": f"no job {job_id}"}, status=404)
    return JsonResponse(describe(job))


@require_GET
@read_access
def job_detail(request, job_id: int):
    """One job, kept current in the browser: live over the WebSocket, or by polling job_state."""
    job = Job.objects.select_related("owner").filter(pk=job_id).first()
    if job is None:
        raise Http404(f"no job {job_id}")
    state = describe(job)
    result = json.dumps(state["result"], indent=1) if state["result"] is not None else ""
    return render(request, "gate_app/job.html", {"job": state, "result_json": result})
