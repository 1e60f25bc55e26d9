"""POST /api/jobs/: submit a job of a kind offered to the API (gate_app.kinds: walks and optimizations), as
the /optimize/ page does (same checks, same quota), for scripts holding a session or a token of an
operator; and /api/uploads/: upload a problem file and/or a kernel as the /upload/ page does (POST,
operators), or list the uploads (GET)."""

from __future__ import annotations

from typing import Any

from django.db.models import CharField, F, IntegerField, OuterRef, Subquery, Value
from django.db.models.fields.json import KT
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import APIException
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.response import Response

from gate_app import kinds, presenters, submit, uploads
from gate_app.apps import SUBMIT_PERMISSION
from gate_app.models import Job
from gate_app.queue import QueueError
from klineage_web.access import ReadAccess
from klineage_web.pagination import Pagination
from skills_app.models import Kernel, Problem


def _offered() -> dict[str, kinds.JobKind]:
    return kinds.offered(kinds.Offered.PAGE_AND_API)


class CanOperate(BasePermission):
    message = "Submitting jobs needs the gate_app.add_job permission (the operator group)."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.has_perm(SUBMIT_PERMISSION))


class QuotaReached(APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "gpu_job_quota"


class JobSubmissionSerializer(serializers.Serializer):
    # A plain field: a choice field named "kind" would share its enum's name with the lineage steps'.
    kind = serializers.CharField(help_text=f"one of: {', '.join(sorted(_offered()))}")
    params = serializers.DictField(
        help_text="kernel (a bundled kernel's name, or uploaded/<name>) and the options of the kind, each "
        "optional: " + "; ".join(f"{name}: {', '.join(kind.options())}" for name, kind in _offered().items())
    )
    id = serializers.IntegerField(read_only=True)
    status = serializers.CharField(read_only=True)
    needs = serializers.CharField(read_only=True)
    url = serializers.SerializerMethodField(help_text="the job's page")

    def get_url(self, job: Job) -> str:
        return reverse("gate:job", args=[job.pk])

    def validate_kind(self, value: str) -> str:
        if value not in _offered():
            raise serializers.ValidationError(f"must be one of: {', '.join(sorted(_offered()))}")
        return value

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        kind = _offered()[data["kind"]]
        options = dict(data["params"])
        kernel = options.pop("kernel", None)
        allowed = set(kind.options())
        unknown = sorted(set(options) - allowed)
        if not isinstance(kernel, str) or unknown:
            raise serializers.ValidationError({"params": f"needs kernel (a bundled or uploaded kernel's name) and only "
                                                         f"{', '.join(sorted(allowed))}" +
                                                         (f"; unknown: {', '.join(unknown)}" if unknown else "")})
        try:
            data["params"] = kind.check_params(kernel, **options)
        except QueueError as exc:
            raise serializers.ValidationError({"params": str(exc)}) from None
        return data

    def create(self, validated_data: dict[str, Any]) -> Job:
        try:
            return submit.submit(validated_data["kind"], validated_data["params"], owner=validated_data["owner"])
        except submit.QuotaExceeded as exc:
            raise QuotaReached(str(exc)) from None


class JobSubmitView(generics.CreateAPIView):
    """Queue a walk or an optimization (a kind offered to the API) for the signed-in operator; 429 past the GPU
    job quota."""

    serializer_class = JobSubmissionSerializer
    permission_classes = [CanOperate]

    def perform_create(self, serializer: JobSubmissionSerializer) -> None:
        serializer.save(owner=self.request.user)


# Uploads ------------------------------------------------------------------------------------------
# POST /api/uploads/ does what the /upload/ page does, through the same gate_app.uploads.received()
# and upload(): nothing uploaded runs in this process (a problem file is stored as text and probed by
# a sandboxed CPU job; a kernel passes the gate's static check first), and a refusal stores nothing.
# GET lists uploaded problems and kernels together, as the page does beside its form.


class StaticFindingSerializer(serializers.Serializer):
    rule = serializers.CharField(help_text="the static check's rule, e.g. include")
    message = serializers.CharField()
    line = serializers.IntegerField(help_text="1-based; 0 when the finding concerns the whole file or the plan")


class UploadRefusalSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="what was refused and why; nothing of the upload was stored")
    findings = StaticFindingSerializer(
        many=True, help_text="the gate's static check's findings, when it refused the kernel"
    )


class UploadFilesSerializer(serializers.Serializer):
    """The files of an upload, as the /upload/ page's form takes them (multipart/form-data)."""

    problem = serializers.FileField(required=False, help_text=f"the problem file (.py, at most "
                                    f"{uploads.LIMITS['problem file']} bytes), stored as uploaded/<file name> and "
                                    f"probed in the sandboxed runner by a job")
    source = serializers.FileField(required=False, help_text=f"the kernel source (.cu, at most "
                                   f"{uploads.LIMITS['kernel source']} bytes): the file its plan's source names")
    plan = serializers.FileField(required=False, help_text=f"the kernel's launch plan (.toml, at most "
                                 f"{uploads.LIMITS['launch plan']} bytes), named uploaded/<its name>; its problem is "
                                 f"a bundled one or uploaded/<name>")


class UploadSerializer(serializers.Serializer):
    """An uploaded problem or kernel: a row of the listing, or what an upload stored."""

    # A plain field: a choice field named "kind" would share its enum's name with the lineage steps'.
    kind = serializers.CharField(help_text="problem or kernel")
    name = serializers.CharField(source="upload", help_text="the name jobs use: uploaded/<name>")
    fingerprint = serializers.CharField(source="content",
                                        help_text="the problem file's, or the kernel's state (source and plan)")
    problem = serializers.CharField(source="names_problem",
                                    help_text="a kernel: the problem its plan names (bundled, or uploaded/<name>); "
                                              "a problem: its own name")
    probe = serializers.ChoiceField(source="probe_status", choices=Problem.Probe.choices, allow_null=True,
                                    help_text="a problem: what its sandboxed probe found so far; null for a kernel")
    probe_error = serializers.CharField(source="refusal", allow_null=True,
                                        help_text="why the probe refused the problem; empty or null otherwise")
    probe_job = serializers.IntegerField(allow_null=True, help_text="a problem: its latest probe job's id")
    uploaded_at = serializers.DateTimeField(source="uploaded")
    # Read-only, from the signed-in user: an upload's fields are its files, nothing names an uploader.
    uploaded_by = serializers.CharField(source="uploader", read_only=True, allow_null=True,
                                        help_text="the username of the operator who uploaded it; null for uploads "
                                                  "made before uploaders were recorded, or whose account is deleted")
    url = serializers.SerializerMethodField(help_text="its detail in the API")
    page = serializers.SerializerMethodField(help_text="a kernel's page; null for a problem")

    def get_url(self, row: dict[str, Any]) -> str:
        if row["kind"] == "problem":
            return reverse("problem-detail", kwargs={"fingerprint": row["content"]})
        return reverse("kernel-detail", kwargs={"name": row["upload"]})

    def get_page(self, row: dict[str, Any]) -> str | None:
        return reverse("skills:kernel", args=[row["upload"]]) if row["kind"] == "kernel" else None


class ProbeJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField()
    needs = serializers.CharField()
    url = serializers.SerializerMethodField(help_text="the job's page")

    def get_url(self, job: Job) -> str:
        return reverse("gate:job", args=[job.pk])


class UploadResultSerializer(serializers.Serializer):
    problem = UploadSerializer(allow_null=True, help_text="the problem uploaded, if one was")
    kernel = UploadSerializer(allow_null=True, help_text="the kernel uploaded, if one was")
    unchanged = serializers.ListField(child=serializers.CharField(),
                                      help_text="names whose content was already uploaded: nothing new stored")
    probe_job = ProbeJobSerializer(allow_null=True, help_text="the problem's probe job (a CPU job, outside the GPU "
                                                              "job quota), while its probe is pending")
    messages = serializers.ListField(child=serializers.CharField(), help_text="what the /upload/ page would say")


ORDERINGS = {"name": "upload", "kind": "kind", "problem": "names_problem", "probe": "probe_status",
             "uploaded_at": "uploaded", "uploaded_by": "uploader"}


class UploadQuerySerializer(serializers.Serializer):
    """The listing's filters and ordering."""

    kind = serializers.ChoiceField(choices=["problem", "kernel"], required=False)
    name = serializers.CharField(required=False, help_text="an upload's name, uploaded/<name>")
    problem = serializers.CharField(required=False, help_text="a problem's name (row_softmax, uploaded/<name>): "
                                    "that uploaded problem and the uploaded kernels whose plan names it")
    probe = serializers.ChoiceField(choices=Problem.Probe.choices, required=False,
                                    help_text="problems whose probe is in this state")
    q = serializers.CharField(required=False, help_text="part of the name")
    uploaded_by = serializers.CharField(required=False, help_text="a username: what that operator uploaded")
    ordering = serializers.CharField(required=False, help_text=f"comma-separated, '-' first for descending: "
                                     f"{', '.join(ORDERINGS)} (default -uploaded_at)")

    def validate_ordering(self, value: str) -> list[str]:
        terms = [term.strip() for term in value.split(",") if term.strip()]
        unknown = [term for term in terms if term.lstrip("-") not in ORDERINGS]
        if unknown:
            raise serializers.ValidationError(f"unknown: {', '.join(unknown)}; order by {', '.join(ORDERINGS)}")
        return [("-" if term.startswith("-") else "") + ORDERINGS[term.lstrip("-")] for term in terms]


class CanReadOrUpload(BasePermission):
    """Listing follows the API's read access (KLINEAGE_READ_OPEN); uploading needs an operator."""

    def has_permission(self, request, view) -> bool:
        checked = ReadAccess() if request.method in SAFE_METHODS else CanOperate()
        self.message = (checked.message if request.method in SAFE_METHODS else
                        "Uploading needs the gate_app.add_job permission (the operator group).")
        return checked.has_permission(request, view)


def _problem_rows(selected: dict[str, Any]):
    """Uploaded problems as rows of the listing, filtered by `selected` (UploadQuerySerializer's)."""
    probes = (Job.objects.annotate(probed=KT("params__problem"))
              .filter(kind=Job.Kind.PROBE, probed=OuterRef("upload_name")).order_by("-id").values("id")[:1])
    rows = Problem.objects.exclude(upload_name="")
    if "name" in selected:
        rows = rows.filter(upload_name=selected["name"])
    if "problem" in selected:
        rows = rows.filter(upload_name=selected["problem"])
    if "probe" in selected:
        rows = rows.filter(probe=selected["probe"])
    if "q" in selected:
        rows = rows.filter(upload_name__icontains=selected["q"])
    if "uploaded_by" in selected:
        rows = rows.filter(uploaded_by__username=selected["uploaded_by"])
    return rows.order_by().values(
        kind=Value("problem"), upload=F("upload_name"), content=F("fingerprint"), names_problem=F("upload_name"),
        probe_status=F("probe"), refusal=F("probe_error"), probe_job=Subquery(probes, output_field=IntegerField()),
        uploaded=F("imported_at"), uploader=F("uploaded_by__username"))


def _kernel_rows(selected: dict[str, Any]):
    """Uploaded kernels as rows of the listing, the same columns as _problem_rows'."""
    rows = Kernel.objects.filter(origin=Kernel.Origin.UPLOADED)
    if "name" in selected:
        rows = rows.filter(name=selected["name"])
    if "problem" in selected:
        rows = rows.filter(operator=selected["problem"])
    if "probe" in selected:
        rows = rows.none()  # a kernel has no probe
    if "q" in selected:
        rows = rows.filter(name__icontains=selected["q"])
    if "uploaded_by" in selected:
        rows = rows.filter(uploaded_by__username=selected["uploaded_by"])
    return rows.order_by().values(
        kind=Value("kernel"), upload=F("name"), content=F("current_state__fingerprint"), names_problem=F("operator"),
        probe_status=Value(None, output_field=CharField()), refusal=Value(None, output_field=CharField()),
        probe_job=Value(None, output_field=IntegerField()), uploaded=F("imported_at"),
        uploader=F("uploaded_by__username"))


class UploadView(generics.ListCreateAPIView):
    """Upload a problem file and/or a kernel as the /upload/ page does (operators; multipart), or list
    the uploaded problems and kernels."""

    permission_classes = [CanReadOrUpload]
    parser_classes = [MultiPartParser]
    serializer_class = UploadSerializer
    pagination_class = Pagination
    filter_backends: list = []  # the listing is a union of two tables: filtered and ordered below
    DEFAULT_ORDERING = ["-uploaded", "kind", "upload"]

    def get_queryset(self):
        query = UploadQuerySerializer(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        selected = dict(query.validated_data)
        ordering = selected.pop("ordering", None) or []
        parts = [rows(selected) for kind, rows in (("problem", _problem_rows), ("kernel", _kernel_rows))
                 if selected.get("kind", kind) == kind]
        queryset = parts[0].union(*parts[1:], all=True) if len(parts) > 1 else parts[0]
        tie_break = [term for term in self.DEFAULT_ORDERING if term.lstrip("-") not in
                     {t.lstrip("-") for t in ordering}]
        return queryset.order_by(*ordering, *tie_break)

    @extend_schema(parameters=[UploadQuerySerializer],
                   description="Uploaded problems (with their probe's state and latest probe job) and kernels "
                               "(with the problem their plan names), each with its uploader, newest first unless "
                               "ordered otherwise.")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(request={"multipart/form-data": UploadFilesSerializer},
                   responses={201: UploadResultSerializer, 200: UploadResultSerializer,
                              400: UploadRefusalSerializer},
                   description="Store a problem file (probed by a sandboxed CPU job, which the response names), a "
                               "kernel (its source and launch plan: the gate's static check first), or both; 201 "
                               "when anything new was stored, 200 when all of it was already uploaded. The uploader "
                               "recorded is the signed-in operator: no field names one. Bad input is refused with "
                               "400 and a message, and nothing of the upload is stored.")
    def post(self, request, *args, **kwargs):
        return self.create(request, *args, **kwargs)

    def create(self, request, *args, **kwargs) -> Response:
        unknown = sorted(set(request.data) - set(uploads.FIELDS) - {"csrfmiddlewaretoken"})
        if unknown:
            return _refused(f"unknown field(s): {', '.join(unknown)}; an upload's fields are "
                            f"{', '.join(uploads.FIELDS)}")
        files = UploadFilesSerializer(data=request.data)
        if not files.is_valid():
            return _refused("; ".join(f"the {uploads.FIELDS.get(key, key)}: {' '.join(map(str, errors))}"
                                      for key, errors in files.errors.items()))
        try:
            outcome = uploads.upload(**uploads.received(files.validated_data), owner=request.user)
        except uploads.UploadRefused as exc:
            return _refused(exc.message, exc.findings)
        result = UploadResultSerializer({  # the rows as the listing gives them
            "problem": _problem_rows({"name": outcome.problem.upload_name}).get() if outcome.problem else None,
            "kernel": _kernel_rows({"name": outcome.kernel.name}).get() if outcome.kernel else None,
            "unchanged": outcome.unchanged,
            "probe_job": outcome.probe_job, "messages": presenters.upload_lines(outcome)}).data
        stored = {row.name if isinstance(row, Kernel) else row.upload_name
                  for row in (outcome.problem, outcome.kernel) if row is not None}
        created = bool(stored - set(outcome.unchanged))
        return Response(result, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def _refused(message: str, findings=()) -> Response:
    return Response({"detail": message, "findings": [finding.to_dict() for finding in findings]},
                    status=status.HTTP_400_BAD_REQUEST)
