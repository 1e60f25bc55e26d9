"""POST /api/jobs/: submit a walk or an optimization, as the /optimize/ page does (same checks,
same quota), for scripts holding a session or a token of an operator."""

from __future__ import annotations

import inspect
from typing import Any

from django.urls import reverse
from rest_framework import generics, serializers, status
from rest_framework.exceptions import APIException
from rest_framework.permissions import BasePermission

from gate_app import submit
from gate_app.apps import SUBMIT_PERMISSION
from gate_app.models import Job
from gate_app.queue import QueueError

CHECKS = {Job.Kind.WALK.value: submit.walk_params, Job.Kind.OPTIMIZE.value: submit.optimize_params}


class CanOperate(BasePermission):
    message = "Submitting jobs needs the gate_app.add_job permission (the operator group)."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.has_perm(SUBMIT_PERMISSION))


class QuotaReached(APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "gpu_job_quota"


class JobSubmissionSerializer(serializers.Serializer):
    # A plain field: a choice field named "kind" would share its enum's name with the lineage steps'.
    kind = serializers.CharField(help_text=f"one of: {', '.join(sorted(CHECKS))}")
    params = serializers.DictField(help_text="kernel (a bundled kernel's name, or uploaded/<name>) and the options of the kind: "
                                             "walk: problem, rewriter, mode, max_steps, max_rejections; optimize: "
                                             "problem, rewriter, strategy, statuses, scope, budget, mode, seed")
    id = serializers.IntegerField(read_only=True)
    status = serializers.CharField(read_only=True)
    needs = serializers.CharField(read_only=True)
    url = serializers.SerializerMethodField(help_text="the job's page")

    def get_url(self, job: Job) -> str:
        return reverse("gate:job", args=[job.pk])

    def validate_kind(self, value: str) -> str:
        if value not in CHECKS:
            raise serializers.ValidationError(f"must be one of: {', '.join(sorted(CHECKS))}")
        return value

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        check = CHECKS[data["kind"]]
        options = dict(data["params"])
        kernel = options.pop("kernel", None)
        allowed = set(inspect.signature(check).parameters) - {"kernel"}
        unknown = sorted(set(options) - allowed)
        if not isinstance(kernel, str) or unknown:
            raise serializers.ValidationError({"params": f"needs kernel (a bundled or uploaded kernel's name) and only "
                                                         f"{', '.join(sorted(allowed))}" +
                                                         (f"; unknown: {', '.join(unknown)}" if unknown else "")})
        try:
            data["params"] = check(kernel, **options)
        except QueueError as exc:
            raise serializers.ValidationError({"params": str(exc)}) from None
        return data

    def create(self, validated_data: dict[str, Any]) -> Job:
        try:
            return submit.submit(validated_data["kind"], validated_data["params"], owner=validated_data["owner"])
        except submit.QuotaExceeded as exc:
            raise QuotaReached(str(exc)) from None


class JobSubmitView(generics.CreateAPIView):
    """Queue a walk or an optimization for the signed-in operator; 429 past the GPU job quota."""

    serializer_class = JobSubmissionSerializer
    permission_classes = [CanOperate]

    def perform_create(self, serializer: JobSubmissionSerializer) -> None:
        serializer.save(owner=self.request.user)
