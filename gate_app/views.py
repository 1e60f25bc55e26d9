"""Kernel, lineage and job pages."""

import json

from django.conf import settings
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from gate_app.models import Job
from gate_app.queue import describe
from klineage_web.access import read_access
from klineage_web.views import pending_section

lineages = pending_section(
    "Lineages",
    "Backward walks from expert kernels: each accepted simplification with its diff, feature "
    "change and paired timings, each rejected one with its evidence, and why the walk ended.",
)
kernels = pending_section(
    "Kernels",
    "Kernel states by fingerprint: CUDA source, launch plan, and every gate verdict on them.",
)
jobs = pending_section(
    "Jobs",
    "Gate runs and walks queued for GPU workers, with their progress and results.",
)


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
