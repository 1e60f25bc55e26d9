"""Job pages (with cancel), the page that submits walks and optimizations, and the upload page."""

import json

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gate_app import kinds, presenters, queue, submit, uploads
from gate_app.apps import SUBMIT_PERMISSION
from gate_app.forms import UploadForm
from gate_app.models import Job, Worker
from gate_app.queue import QueueError, describe
from klineage_web.access import read_access
from klineage_web.pagination import paginate, query_without


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
    page = paginate(request, queryset)
    workers = list(Worker.objects.all())
    rows = [describe(job, log=False, workers=workers) for job in page.object_list]
    return render(request, "gate_app/jobs.html", {
        "page": page, "query": query_without(request.GET), "rows": rows, "selected": selected,
        "statuses": Job.Status.choices, "kinds": Job.Kind.choices, "workers": workers})


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
    finished = job.status == Job.Status.SUCCEEDED and isinstance(job.result, dict)
    can_cancel = not job.finished and (request.user.is_staff or (job.owner_id and job.owner_id == request.user.pk))
    kind = kinds.registry().get(job.kind)
    page = kind.page if kind is not None and kind.page else "gate_app/job.html"
    return render(request, page, {
        "job": state, "result_json": result, "can_cancel": can_cancel, "ended": job.finished,
        "can_run_again": job.kind in _submitted() and request.user.has_perm(SUBMIT_PERMISSION),
        **(kind.present(job.result, job.params) if finished and kind is not None else {})})


def _submitted() -> dict[str, kinds.JobKind]:
    """The kinds the optimize page submits (and runs again)."""
    return kinds.offered(kinds.Offered.PAGE, kinds.Offered.PAGE_AND_API)


@login_required
@permission_required(SUBMIT_PERMISSION, raise_exception=True)
@require_POST
def run_again(request, job_id: int):
    """Queue a job again with the parameters it ran with, for whoever asks (operators only)."""
    job = get_object_or_404(Job, pk=job_id, kind__in=list(_submitted()))
    try:
        again = submit.submit(job.kind, job.params, owner=request.user)
    except QueueError as exc:
        messages.error(request, f"Job {job.pk} was not queued again: {exc}")
        return redirect("gate:job", job.pk)
    messages.success(request, f"Queued again as job {again.pk}, with the parameters of job {job.pk}.")
    return redirect("gate:job", again.pk)


@login_required
@require_POST
def cancel(request, job_id: int):
    """Cancel a job (its owner or staff): a queued one at once, a running one by its worker."""
    job = get_object_or_404(Job, pk=job_id)
    if not (request.user.is_staff or (job.owner_id and job.owner_id == request.user.pk)):
        raise PermissionDenied("only the job's owner or staff may cancel it")
    status = job.status if job.finished else queue.cancel(job)
    if job.finished or status not in (Job.Status.CANCELLED, Job.Status.RUNNING):
        messages.warning(request, f"Job {job.pk} has already finished ({status}): nothing to cancel.")
    elif status == Job.Status.CANCELLED:
        messages.success(request, f"Job {job.pk} is cancelled.")
    else:
        messages.info(request, f"Cancel requested: job {job.pk}'s worker is stopping it; it will show as cancelled.")
    return redirect("gate:job", job.pk)


@login_required
@permission_required(SUBMIT_PERMISSION, raise_exception=True)
@require_http_methods(["GET", "POST"])
def optimize(request):
    """Submit an optimization, a backward walk or a gate run (operators only); each form's errors, the
    quota's included, are shown against it. ?kernel= preselects the kernel in all three."""
    initial = {"kernel": request.GET.get("kernel", "")}
    forms = {name: kind.form_class(prefix=name, initial=initial) for name, kind in _submitted().items()}
    status = 200
    if request.method == "POST":
        kind = request.POST.get("action", "")
        if kind not in forms:
            return render(request, "gate_app/optimize.html", _optimize_context(request, forms), status=400)
        form = forms[kind] = type(forms[kind])(request.POST, prefix=kind)
        if form.is_valid():
            try:
                job = submit.submit(kind, form.params, owner=request.user)
            except QueueError as exc:
                form.add_error(None, str(exc))
            else:
                return redirect("gate:job", job.pk)
        status = 400
    return render(request, "gate_app/optimize.html", _optimize_context(request, forms), status=status)


def _optimize_context(request, forms) -> dict:
    # A refused form's errors, also at the top of the page: the form itself may be a screen further down.
    refused = [{"kind": kind, "errors": [f"{form.fields[name].label}: {error}" if name in form.fields else error
                                         for name, errors in form.errors.items() for error in errors]}
               for kind, form in forms.items() if form.is_bound and form.errors]
    return {**{f"{kind}_form": form for kind, form in forms.items()}, "refused": refused,
            "gpu_jobs": submit.gpu_jobs_held(request.user), "quota": settings.KLINEAGE_GPU_JOB_QUOTA,
            "recent": Job.objects.filter(owner=request.user, kind__in=list(forms)).order_by("-id")[:10]}


@login_required
@permission_required(SUBMIT_PERMISSION, raise_exception=True)
@require_http_methods(["GET", "POST"])
def upload(request):
    """Upload a problem file and/or a kernel (operators only); what was refused is shown against the
    form, with the static check's findings, and nothing of it is stored."""
    form = UploadForm(request.POST, request.FILES) if request.method == "POST" else UploadForm()
    findings = ()
    if request.method == "POST" and form.is_valid():
        try:
            outcome = uploads.upload(**form.chosen(), owner=request.user)
        except uploads.UploadRefused as exc:
            form.add_error(None, exc.message)
            findings = exc.findings
        else:
            for line in presenters.upload_lines(outcome):
                messages.success(request, line)
            return redirect("gate:upload")
    return render(request, "gate_app/upload.html", {
        "form": form, "findings": findings, **presenters.uploads_listing(),
    }, status=400 if request.method == "POST" else 200)
