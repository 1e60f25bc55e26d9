"""Gate records, mirroring the engine's documents: problems, kernel states (source plus launch
plan, by fingerprint), verdicts, lineages with their transitions and rejections, and the jobs
that run gates and walks on GPU workers.

The database is the job queue: a Job row is the whole truth about a piece of work (what, who
holds it and until when, how far it got, what came out). The channel layer only carries
progress to open pages; losing it loses nothing.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from gate_app import kinds

LOG_LIMIT = 64 * 1024  # characters of a job's log kept; older lines are dropped first


def _empty_progress() -> dict:
    return {"fraction": 0.0, "stage": "", "message": ""}


class Job(models.Model):
    # The built-in kinds of gate_app.kinds: Job.Kind.WALK and so on.
    Kind = models.TextChoices("Kind", kinds.choices())

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"

    class Needs(models.TextChoices):
        CPU = kinds.Needs.CPU.value, "any worker"  # compile-only and replayed work
        GPU = kinds.Needs.GPU.value, "a GPU worker"

    TERMINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    # Not limited to Kind's values: a kind a test adds (gate_app.kinds) is stored the same way.
    kind = models.CharField(max_length=32, choices=Kind.choices)
    params = models.JSONField(default=dict, blank=True)
    needs = models.CharField(max_length=8, choices=Needs.choices, default=Needs.CPU)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    cancel_requested = models.BooleanField(default=False)

    attempts = models.PositiveIntegerField(default=0)  # claims so far, a release on shutdown not counted
    max_attempts = models.PositiveIntegerField(default=3)
    worker_id = models.CharField(max_length=128, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    progress = models.JSONField(default=_empty_progress, blank=True)
    log = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")  # why it failed, or why it was retried

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="jobs")
    # The same key submitted twice gives back the first job instead of queueing the work again.
    idempotency_key = models.CharField(max_length=200, unique=True, null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)  # the latest claim
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The claim: the oldest queued job this worker can run. Partial, so it stays as small
            # as the queue however long the history grows.
            models.Index(fields=["needs", "id"], condition=Q(status="queued"), name="gate_job_claimable"),
            # The reaper: running jobs by lease expiry.
            models.Index(fields=["lease_expires_at"], condition=Q(status="running"), name="gate_job_leased"),
            models.Index(fields=["status", "-created_at"], name="gate_job_by_status"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.kind}, {self.status})"

    @property
    def finished(self) -> bool:
        return self.status in self.TERMINAL


class Worker(models.Model):
    """A gate_worker process as it last reported itself: lets a queued job say what it waits for."""

    worker_id = models.CharField(max_length=128, unique=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    gpu = models.CharField(max_length=64, blank=True, default="")  # CUDA_VISIBLE_DEVICES of its children
    gpu_name = models.CharField(max_length=128, blank=True, default="")
    capabilities = models.JSONField(default=list)  # ["cpu"] or ["gpu", "cpu"]
    kinds = models.JSONField(default=list)  # the job kinds it has handlers for
    started_at = models.DateTimeField(auto_now_add=True)
    seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-seen_at"]

    def __str__(self) -> str:
        return self.worker_id
