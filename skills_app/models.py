"""Records mirroring the engine's documents, so pages and the API can query them.

Each model keeps the engine's document whole (a problem's `ProblemInfo.to_dict()`, a kernel
state's source and plan, a verdict's `Verdict.to_dict()`) next to the few fields lifted out of it
for filtering and ordering. `to_document()` gives the document back, and the engine's own
`from_dict` accepts it: the database never holds anything the engine could not read.

Everything content-addressed is keyed the engine's way: problems and kernel states by
fingerprint, verdicts by their cache key. Later records (lineages, steps, skill cards) attach to
`KernelState` by fingerprint as well.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import OuterRef, Q, Subquery

from klineage.gate.verdict import Status

FINGERPRINT_LENGTH = 64  # sha256, hex


class Problem(models.Model):
    """A problem as the sandboxed probe described it (its file never runs in the web process)."""

    operator = models.CharField(max_length=100)
    fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH, unique=True)
    info = models.JSONField(help_text="ProblemInfo.to_dict(), from the sandboxed probe")
    numerics = models.JSONField(default=list, blank=True,
                                help_text="the probe's reasons why the problem is unusable; empty when sound")
    path = models.CharField(max_length=500, help_text="relative to the repository for bundled problems")
    bundled = models.BooleanField(default=False)
    # One current problem per operator: the file as it is now. Earlier versions stay, since
    # verdicts measured against them name their fingerprint.
    current = models.BooleanField(default=False)
    imported_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["operator", "-current", "-imported_at"]
        constraints = [
            models.UniqueConstraint(fields=["operator"], condition=Q(current=True), name="skills_problem_one_current"),
        ]
        indexes = [models.Index(fields=["operator", "current"], name="skills_problem_operator")]

    def __str__(self) -> str:
        return f"{self.operator} ({self.fingerprint[:12]})"

    @property
    def cases(self) -> list[dict[str, Any]]:
        return self.info.get("cases", [])

    @property
    def headline(self) -> str:
        return self.info.get("headline", "")

    @property
    def description(self) -> str:
        return self.info.get("description", "")

    def to_document(self) -> dict[str, Any]:
        return dict(self.info)


class KernelState(models.Model):
    """CUDA device source plus its launch plan, by content fingerprint."""

    fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH, unique=True)
    source = models.TextField()
    plan = models.JSONField(help_text="LaunchPlan.to_dict()")
    # The named kernel this state was loaded as; lineage states may belong to none.
    kernel = models.ForeignKey("Kernel", null=True, blank=True, on_delete=models.SET_NULL, related_name="states")
    # Lifted from the plan, for filters.
    name = models.CharField(max_length=200)
    operator = models.CharField(max_length=100)
    arch = models.CharField(max_length=16)
    imported_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "-imported_at"]
        indexes = [
            models.Index(fields=["operator", "arch"], name="skills_state_operator_arch"),
            models.Index(fields=["name"], name="skills_state_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint[:12]})"

    @property
    def entries(self) -> list[str]:
        return [launch["entry"] for launch in self.plan.get("launch", [])]

    def to_document(self) -> dict[str, Any]:
        """The engine's KernelState.to_dict()."""
        from klineage.kernel import DOCUMENT_VERSION

        return {"version": DOCUMENT_VERSION, "fingerprint": self.fingerprint, "source": self.source,
                "plan": self.plan}


class KernelQuerySet(models.QuerySet):
    def with_latest_verdict(self) -> KernelQuerySet:
        """Annotate the status, reason and key of the latest verdict on each kernel's current state."""
        latest = Verdict.objects.filter(state_id=OuterRef("current_state_id")).order_by(
            models.F("created").desc(nulls_last=True), "-id")
        return self.annotate(
            latest_status=Subquery(latest.values("status")[:1]),
            latest_reason=Subquery(latest.values("reason")[:1]),
            latest_key=Subquery(latest.values("key")[:1]),
        )


class Kernel(models.Model):
    """A named kernel: a bundled corpus kernel (or adversarial one) or an uploaded one."""

    class Origin(models.TextChoices):
        BUNDLED = "bundled", "bundled"
        UPLOADED = "uploaded", "uploaded"

    name = models.CharField(max_length=200, unique=True, help_text="e.g. row_softmax/naive or adversarial/hang")
    operator = models.CharField(max_length=100, help_text="the plan's problem")
    problem = models.ForeignKey(Problem, null=True, blank=True, on_delete=models.SET_NULL, related_name="kernels",
                                help_text="the current problem for the plan's operator")
    current_state = models.ForeignKey(KernelState, on_delete=models.PROTECT, related_name="current_for")
    origin = models.CharField(max_length=16, choices=Origin.choices, default=Origin.BUNDLED)
    adversarial = models.BooleanField(default=False, help_text="part of the adversarial suite: the gate must reject it")
    expected_reason = models.CharField(max_length=40, blank=True, default="",
                                       help_text="adversarial kernels: the reason the gate must give")
    expected_why = models.TextField(blank=True, default="")
    imported_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = KernelQuerySet.as_manager()

    class Meta:
        ordering = ["adversarial", "name"]
        indexes = [
            models.Index(fields=["operator", "adversarial"], name="skills_kernel_operator"),
            models.Index(fields=["origin"], name="skills_kernel_origin"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def fingerprint(self) -> str:
        return self.current_state.fingerprint


class Verdict(models.Model):
    """One gate verdict, whole, with what the lists filter on lifted out of it."""

    class ServedFrom(models.TextChoices):
        RECORDED = "recorded", "recorded store"  # committed verdicts measured on GPU hosts
        CACHE = "cache", "local cache"  # this machine's content-addressed cache
        MEASURED = "measured", "measured here"  # a gate run on this instance

    StatusChoices = models.TextChoices("StatusChoices", [(s.name, (s.value, s.value)) for s in Status])

    key = models.CharField(max_length=FINGERPRINT_LENGTH, unique=True)
    # Linked when the state / problem is known here; the fingerprints are kept either way, so a
    # verdict recorded for a state not imported yet attaches once it is.
    state = models.ForeignKey(KernelState, null=True, blank=True, on_delete=models.SET_NULL, related_name="verdicts")
    problem = models.ForeignKey(Problem, null=True, blank=True, on_delete=models.SET_NULL, related_name="verdicts")
    kernel_fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH)
    kernel_name = models.CharField(max_length=200)
    problem_fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH)
    operator = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=StatusChoices.choices)
    reason = models.CharField(max_length=40, blank=True, default="")
    gpu = models.CharField(max_length=100, blank=True, default="")
    toolchain = models.CharField(max_length=100, blank=True, default="")
    mode = models.CharField(max_length=16, blank=True, default="")
    against = models.CharField(max_length=FINGERPRINT_LENGTH, blank=True, default="",
                               help_text="fingerprint of the state it was timed against; empty for none")
    cases = models.JSONField(default=list)
    policy = models.JSONField(default=dict)
    git_commit = models.CharField(max_length=64, blank=True, default="")
    document = models.JSONField(help_text="Verdict.to_dict(), whole")
    digest = models.CharField(max_length=FINGERPRINT_LENGTH, help_text="sha256 of the document, to skip unchanged ones")
    served_from = models.CharField(max_length=16, choices=ServedFrom.choices, default=ServedFrom.RECORDED)
    created = models.DateTimeField(null=True, blank=True, help_text="when the gate produced it (provenance)")
    imported_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = [models.F("created").desc(nulls_last=True), "-id"]
        indexes = [
            models.Index(fields=["state", "-created"], name="skills_verdict_state_latest"),
            models.Index(fields=["status", "reason"], name="skills_verdict_status"),
            models.Index(fields=["operator", "status"], name="skills_verdict_operator"),
            models.Index(fields=["kernel_fingerprint"], name="skills_verdict_kernel_fp"),
            models.Index(fields=["gpu"], name="skills_verdict_gpu"),
            models.Index(fields=["-created"], name="skills_verdict_created"),
        ]

    def __str__(self) -> str:
        return f"{self.status} {self.kernel_name} on {self.operator} ({self.key[:12]})"

    def to_document(self) -> dict[str, Any]:
        return dict(self.document)

    @property
    def provenance(self) -> dict[str, Any]:
        return self.document.get("provenance", {})
