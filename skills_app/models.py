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

from django.conf import settings
from django.db import models
from django.db.models import OuterRef, Q, Subquery
from django.urls import reverse

from klineage.gate.verdict import Status
from klineage.walk.timing_audit import Pairing

FINGERPRINT_LENGTH = 64  # sha256, hex


class Problem(models.Model):
    """A problem as the sandboxed probe described it (its file never runs in the web process).

    An uploaded problem is stored before it is probed: its `info` stays empty until its probe job
    records what the probe found, or why it refused the file."""

    class Probe(models.TextChoices):
        PENDING = "pending", "waiting for its probe"
        SOUND = "sound", "probed: sound"
        REFUSED = "refused", "refused by its probe"

    operator = models.CharField(max_length=100)
    fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH, unique=True)
    info = models.JSONField(help_text="ProblemInfo.to_dict(), from the sandboxed probe")
    numerics = models.JSONField(default=list, blank=True,
                                help_text="the probe's reasons why the problem is unusable; empty when sound")
    path = models.CharField(max_length=500, help_text="relative to the repository for bundled problems")
    bundled = models.BooleanField(default=False)
    upload_name = models.CharField(max_length=80, blank=True, default="",
                                   help_text="uploaded problems: the name jobs use, uploaded/<name>; empty otherwise")
    probe = models.CharField(max_length=8, choices=Probe.choices, default=Probe.SOUND)
    probe_error = models.TextField(blank=True, default="", help_text="why the probe refused it")
    # Kept when the account goes: the upload stays usable by jobs, only its uploader is forgotten.
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="uploaded_problems",
                                    help_text="uploaded problems: who uploaded it; null for bundled problems, "
                                              "uploads made before uploaders were recorded, or a deleted account")
    # One current problem per operator: the file as it is now. Earlier versions stay, since
    # verdicts measured against them name their fingerprint.
    current = models.BooleanField(default=False)
    imported_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["operator", "-current", "-imported_at"]
        constraints = [
            models.UniqueConstraint(fields=["operator"], condition=Q(current=True), name="skills_problem_one_current"),
            models.UniqueConstraint(fields=["upload_name"], condition=~Q(upload_name=""),
                                    name="skills_problem_upload_name"),
        ]
        indexes = [models.Index(fields=["operator", "current"], name="skills_problem_operator")]

    def __str__(self) -> str:
        return f"{self.operator} ({self.fingerprint[:12]})"

    @property
    def uploaded(self) -> bool:
        return bool(self.upload_name)

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
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="uploaded_kernels",
                                    help_text="uploaded kernels: who uploaded it; null for bundled kernels, "
                                              "uploads made before uploaders were recorded, or a deleted account")
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


# ---------------------------------------------------------------------------------------------
# Lineages: one backward walk of an expert kernel, its steps and people's reviews of them.


class Lineage(models.Model):
    """A lineage document (klineage.lineage.Lineage), keyed by the sha256 of its canonical text."""

    class Assurance(models.TextChoices):
        GPU_VERIFIED = "gpu_verified", "GPU verified"
        UNVERIFIED = "unverified_compile_only", "unverified (dry walk, compile only)"

    id = models.CharField(primary_key=True, max_length=FINGERPRINT_LENGTH,
                          help_text="sha256 of the document's canonical JSON text")
    expert_state = models.ForeignKey(KernelState, on_delete=models.CASCADE, related_name="lineages",
                                     help_text="the expert kernel state the walk started from")
    expert_name = models.CharField(max_length=200)
    problem = models.ForeignKey(Problem, null=True, blank=True, on_delete=models.SET_NULL, related_name="lineages")
    operator = models.CharField(max_length=100)
    problem_fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH)
    rewriter = models.CharField(max_length=100)
    gate_mode = models.CharField(max_length=16)
    assurance = models.CharField(max_length=32, choices=Assurance.choices)
    termination_kind = models.CharField(max_length=24)
    termination_message = models.TextField(blank=True, default="")
    stats = models.JSONField(default=dict)
    accepted_count = models.PositiveIntegerField(default=0)
    rejected_count = models.PositiveIntegerField(default=0)
    source_path = models.CharField(max_length=500, blank=True, default="",
                                   help_text="the committed file it was imported from, if any")
    document = models.JSONField(help_text="Lineage.to_dict(), whole")
    imported_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operator", "expert_name", "-imported_at"]
        indexes = [
            models.Index(fields=["operator", "termination_kind"], name="skills_lineage_operator"),
            models.Index(fields=["assurance"], name="skills_lineage_assurance"),
        ]

    def __str__(self) -> str:
        return f"lineage of {self.expert_name} ({self.id[:12]})"

    @property
    def unverified(self) -> bool:
        return self.assurance == self.Assurance.UNVERIFIED

    def to_document(self) -> dict[str, Any]:
        """The engine's Lineage.to_dict(); Lineage.from_dict accepts it."""
        return dict(self.document)


class LineageStep(models.Model):
    """An accepted transition of a lineage, or a rejected attempt branching off one of its states."""

    class Kind(models.TextChoices):
        ACCEPTED = "accepted", "accepted"
        REJECTED = "rejected", "rejected"

    lineage = models.ForeignKey(Lineage, on_delete=models.CASCADE, related_name="steps")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    index = models.PositiveIntegerField(help_text="transition index (accepted) or position among rejections")
    branch_step = models.PositiveIntegerField(
        help_text="the transition this was a candidate for: accepted steps, their own index; rejected attempts, "
                  "the step whose parent state they branched from")
    transform = models.CharField(max_length=100)
    anchor = models.JSONField(null=True, blank=True, help_text="function, kind, key, snippet; null if none was named")
    parent_state = models.ForeignKey(KernelState, on_delete=models.CASCADE, related_name="steps_as_parent")
    child_state = models.ForeignKey(KernelState, null=True, blank=True, on_delete=models.CASCADE,
                                    related_name="steps_as_child")
    backward_diff = models.TextField(blank=True, default="")
    forward_diff = models.TextField(blank=True, default="")
    features_removed = models.JSONField(default=list, blank=True)
    features_added = models.JSONField(default=list, blank=True)
    forward_status = models.CharField(max_length=24, blank=True, default="")
    forward_message = models.TextField(blank=True, default="")
    forward_timing = models.JSONField(null=True, blank=True, help_text="overall, per_trial, required; null if untimed")
    pairing = models.CharField(
        max_length=10, blank=True, default="", choices=[(p.value, p.value) for p in Pairing],
        help_text="GPU walks' accepted steps: whether the parent and child each timed alike in both of their "
                  "pairings (klineage.walk.timing_audit); biased: the forward ratio is not evidence; exchanged: "
                  "re-timed with parent and child exchanging places, `retimed_ratio`")
    pairing_note = models.TextField(blank=True, default="")
    retimed_ratio = models.FloatField(null=True, blank=True,
                                      help_text="exchanged: the re-timed child time / parent time; null otherwise")
    note = models.TextField(blank=True, default="")
    rejection_category = models.CharField(max_length=24, blank=True, default="")
    rejection_reason = models.CharField(max_length=40, blank=True, default="", help_text="the gate's reason, if any")
    cases_failed = models.JSONField(default=list, blank=True)
    evidence = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["lineage", "branch_step", "-kind", "index"]
        constraints = [
            models.UniqueConstraint(fields=["lineage", "kind", "index"], name="skills_step_unique_index"),
        ]
        indexes = [models.Index(fields=["kind", "forward_status"], name="skills_step_kind")]

    def __str__(self) -> str:
        return f"{self.kind} step {self.index} {self.transform} of {self.lineage_id[:12]}"

    @property
    def accepted(self) -> bool:
        return self.kind == self.Kind.ACCEPTED

    @property
    def latest_review(self) -> Review | None:
        reviews = list(self.reviews.all())
        return max(reviews, key=lambda r: (r.created, r.id)) if reviews else None

    @property
    def disputed(self) -> bool:
        """The latest review disputes this step: the cards derived from it go back to re-admission
        (`skills_app.readmission`)."""
        latest = self.latest_review
        return latest is not None and latest.verdict == Review.Verdict.DISPUTE


class Review(models.Model):
    """A person's judgement on a step: confirm it, or dispute it with a comment."""

    class Verdict(models.TextChoices):
        CONFIRM = "confirm", "confirm"
        DISPUTE = "dispute", "dispute"

    step = models.ForeignKey(LineageStep, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey("auth.User", on_delete=models.PROTECT, related_name="lineage_reviews")
    verdict = models.CharField(max_length=8, choices=Verdict.choices)
    comment = models.TextField(blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.verdict} by {self.reviewer_id} on step {self.step_id}"


# ---------------------------------------------------------------------------------------------
# The skill library: cards lifted from lineages, and the roundtrip trials that admit them.


class SkillLibraryQuerySet(models.QuerySet):
    def default(self) -> SkillLibrary | None:
        """The library pages and optimizations use where none is named: the bundled corpus's, else
        the first stored by name."""
        return self.filter(name=DEFAULT_LIBRARY).first() or self.order_by("name").first()


DEFAULT_LIBRARY = "corpus"  # the name of corpus/library/library.json (skills_app.card_import.library_name)


class SkillLibrary(models.Model):
    """One skill library document (`{"version", "provenance", "cards"}`), named for its file. Cards
    are stored per library: two libraries built from the same walks may hold the same card id with
    different effects, preconditions and status, and each keeps its own."""

    name = models.SlugField(max_length=60, unique=True, help_text="from the file: corpus, percase ...")
    source = models.CharField(max_length=300, help_text="the file it was imported from, as the import named it")
    note = models.TextField(blank=True, default="", help_text="the provenance's note: how it was built")
    provenance = models.JSONField(default=dict)
    created = models.DateTimeField(null=True, blank=True, help_text="when the library document was written")
    imported_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SkillLibraryQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "skill libraries"

    def __str__(self) -> str:
        return self.name

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_LIBRARY

    def get_absolute_url(self) -> str:
        return reverse("skills:library") if self.is_default else reverse("skills:library-named", args=[self.name])

    def export_url(self, fmt: str) -> str:
        return (reverse("skills:library-export", args=[fmt]) if self.is_default
                else reverse("skills:library-named-export", args=[self.name, fmt]))


class When(models.TextChoices):  # klineage.skills.when.WhenKind
    PRECONDITION = "precondition", "pays where its timing precondition holds"
    UNIFORM = "uniform", "paid on every case measured"
    MIXED = "mixed", "paid on some cases, nothing forced says where"
    NEVER = "never", "paid on no case measured"
    UNMEASURED = "unmeasured", "not timed on any case"


class SkillCard(models.Model):
    """A skill card (klineage.skills.card.SkillCard), whole, keyed by its library and content id, with
    what the library filters and sorts on lifted out of it. Features are `locus/name` texts."""

    class Status(models.TextChoices):
        CANDIDATE = "candidate", "candidate"
        ADMITTED = "admitted", "admitted"
        RETIRED = "retired", "retired"
        IMPORTED = "imported", "imported"

    library = models.ForeignKey(SkillLibrary, on_delete=models.CASCADE, related_name="cards")
    card_id = models.CharField(max_length=FINGERPRINT_LENGTH, help_text="sha256 of the card's identity")
    short_id = models.CharField(max_length=12)
    status = models.CharField(max_length=12, choices=Status.choices)
    transform = models.CharField(max_length=100)
    intent = models.TextField()
    surface = models.CharField(max_length=40, help_text="the anchor kind: loop, function, parameter ...")
    platform = models.CharField(max_length=40)
    operators = models.JSONField(default=list)
    dtypes = models.JSONField(default=list, blank=True)
    requires = models.JSONField(default=list, blank=True)
    provides = models.JSONField(default=list, blank=True)
    conflicts = models.JSONField(default=list, blank=True)
    median_gain = models.FloatField(null=True, blank=True,
                                    help_text="median child/parent time ratio over the effects; null if untimed")
    precondition_count = models.PositiveIntegerField(default=0)
    when_kind = models.CharField(max_length=12, choices=When.choices, default=When.UNMEASURED,
                                 help_text="where its per-case effects say it pays (klineage.skills.when.card_when)")
    when_label = models.CharField(max_length=300, blank=True, default="",
                                  help_text="that in a few words: its timing precondition, or how many cases paid")
    risk_count = models.PositiveIntegerField(default=0)
    search_text = models.TextField(help_text="intent, anchor snippet and transform, lower case, for search")
    document = models.JSONField(help_text="SkillCard.to_dict(), whole")
    digest = models.CharField(max_length=FINGERPRINT_LENGTH, help_text="sha256 of the document")
    readmission = models.TextField(blank=True, default="",
                                   help_text="why the card must pass admission again (a disputed step behind it); "
                                             "empty when nothing is disputed")
    library_created = models.DateTimeField(null=True, blank=True,
                                           help_text="when the library document it came from was written")
    imported_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = [models.F("median_gain").desc(nulls_last=True), "transform", "card_id"]
        constraints = [
            models.UniqueConstraint(fields=["library", "card_id"], name="skills_card_unique_in_library"),
            models.UniqueConstraint(fields=["library", "short_id"], name="skills_card_short_unique_in_library"),
        ]
        indexes = [
            models.Index(fields=["status", "transform"], name="skills_card_status"),
            models.Index(fields=["surface"], name="skills_card_surface"),
            models.Index(fields=["library", "when_kind"], name="skills_card_when"),
            models.Index(fields=["platform"], name="skills_card_platform"),
            models.Index(fields=["transform", "card_id"], name="skills_card_transform"),
            models.Index(fields=["-median_gain", "transform", "card_id"], name="skills_card_gain"),
        ]

    def __str__(self) -> str:
        return f"{self.transform} ({self.short_id})"

    def to_document(self) -> dict[str, Any]:
        """The engine's SkillCard.to_dict(); SkillCard.from_dict accepts it."""
        return dict(self.document)

    # The default library's cards keep the short addresses they had before libraries were told apart.
    def get_absolute_url(self) -> str:
        if self.library.is_default:
            return reverse("skills:card", args=[self.short_id])
        return reverse("skills:library-card", args=[self.library.name, self.short_id])

    def skillmd_url(self) -> str:
        if self.library.is_default:
            return reverse("skills:card-skillmd", args=[self.short_id])
        return reverse("skills:library-card-skillmd", args=[self.library.name, self.short_id])


class CardTrial(models.Model):
    """One roundtrip trial of a card: materialized on a target state outside its lineages and gated."""

    class Outcome(models.TextChoices):  # klineage.skills.admission.Reading
        PASSED = "passed", "passed"
        SLOWER = "slower", "slower: the mechanism did not pay there"
        REJECTED = "rejected", "rejected by the gate"
        INCONCLUSIVE = "inconclusive", "inconclusive"

    card = models.ForeignKey(SkillCard, on_delete=models.CASCADE, related_name="trials")
    outcome = models.CharField(max_length=12, choices=Outcome.choices)
    target = models.CharField(max_length=FINGERPRINT_LENGTH, help_text="the kernel state it was applied to")
    verdict_key = models.CharField(max_length=FINGERPRINT_LENGTH, blank=True, default="",
                                   help_text="the gate verdict on the result, when recorded")
    class Judged(models.TextChoices):  # which content of the card the trial judged (its basis)
        CURRENT = "current", "the card as it is"
        EARLIER = "earlier", "an earlier content of the card, as its basis names it"
        UNKNOWN = "unknown", "logged without a basis"

    ratio = models.FloatField(null=True, blank=True, help_text="child/parent time ratio; null if untimed")
    message = models.TextField(blank=True, default="")
    judged = models.CharField(max_length=8, choices=Judged.choices, default=Judged.UNKNOWN,
                              help_text="which content of the card the trial judged: a card whose effects or "
                                        "preconditions changed keeps its earlier trials as history")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["card", "created", "id"]
        indexes = [models.Index(fields=["card", "outcome"], name="skills_trial_card")]

    def __str__(self) -> str:
        return f"{self.outcome} trial of {self.card_id} on {self.target[:12]}"
