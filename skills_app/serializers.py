"""API representations: compact ones for lists, whole documents for details."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from skills_app.card_words import effective_status
from skills_app.models import (
    CardTrial,
    Kernel,
    KernelState,
    Lineage,
    LineageStep,
    Problem,
    Review,
    SkillCard,
    SkillLibrary,
    Verdict,
)


class ProblemSerializer(serializers.ModelSerializer):
    headline = serializers.CharField(read_only=True)
    cases = serializers.SerializerMethodField(help_text="case names, headline first as declared")
    page = serializers.SerializerMethodField()

    class Meta:
        model = Problem
        fields = ["fingerprint", "operator", "path", "bundled", "current", "upload_name", "probe", "headline", "cases",
                  "page", "imported_at"]

    def get_cases(self, problem: Problem) -> list[str]:
        return [case["name"] for case in problem.cases]

    def get_page(self, problem: Problem) -> str | None:
        return reverse("skills:problem", args=[problem.operator]) if problem.current else None


class ProblemDetailSerializer(ProblemSerializer):
    class Meta(ProblemSerializer.Meta):
        fields = [*ProblemSerializer.Meta.fields, "numerics", "probe_error", "info"]


class LatestVerdictSerializer(serializers.Serializer):
    key = serializers.CharField()
    status = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)


class KernelSerializer(serializers.ModelSerializer):
    fingerprint = serializers.CharField(source="current_state.fingerprint", read_only=True)
    arch = serializers.CharField(source="current_state.arch", read_only=True)
    problem = serializers.CharField(source="problem.fingerprint", read_only=True, allow_null=True, default=None)
    latest_verdict = serializers.SerializerMethodField()
    page = serializers.SerializerMethodField()

    class Meta:
        model = Kernel
        fields = ["name", "operator", "problem", "fingerprint", "arch", "origin", "adversarial", "expected_reason",
                  "latest_verdict", "page", "updated_at"]

    @extend_schema_field(LatestVerdictSerializer(allow_null=True))
    def get_latest_verdict(self, kernel: Kernel) -> dict[str, Any] | None:
        key = getattr(kernel, "latest_key", None)
        if key is None:
            return None
        return {"key": key, "status": kernel.latest_status, "reason": kernel.latest_reason or ""}

    def get_page(self, kernel: Kernel) -> str:
        return reverse("skills:kernel", args=[kernel.name])


class KernelDetailSerializer(KernelSerializer):
    description = serializers.CharField(source="current_state.plan.description", read_only=True, default="")
    states = serializers.SlugRelatedField(many=True, read_only=True, slug_field="fingerprint",
                                          help_text="every state imported under this name, newest first")

    class Meta(KernelSerializer.Meta):
        fields = [*KernelSerializer.Meta.fields, "description", "expected_why", "states"]


class KernelStateSerializer(serializers.ModelSerializer):
    kernel = serializers.CharField(source="kernel.name", read_only=True, allow_null=True, default=None)
    entries = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = KernelState
        fields = ["fingerprint", "name", "operator", "arch", "kernel", "entries", "imported_at"]


class KernelStateDetailSerializer(KernelStateSerializer):
    class Meta(KernelStateSerializer.Meta):
        fields = [*KernelStateSerializer.Meta.fields, "source", "plan"]


class VerdictSerializer(serializers.ModelSerializer):
    kernel = serializers.SerializerMethodField(help_text="the named kernel whose state was judged, when known")
    page = serializers.SerializerMethodField()

    class Meta:
        model = Verdict
        fields = ["key", "status", "reason", "kernel", "kernel_name", "kernel_fingerprint", "operator",
                  "problem_fingerprint", "gpu", "toolchain", "mode", "against", "cases", "served_from", "git_commit",
                  "created", "page"]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_kernel(self, verdict: Verdict) -> str | None:
        state = verdict.state
        return state.kernel.name if state is not None and state.kernel is not None else None

    def get_page(self, verdict: Verdict) -> str:
        return reverse("skills:verdict", args=[verdict.key])


class VerdictDetailSerializer(VerdictSerializer):
    class Meta(VerdictSerializer.Meta):
        fields = [*VerdictSerializer.Meta.fields, "policy", "document"]


# ---------------------------------------------------------------------------------------------
# Lineages, their steps, and reviews.


class LineageSerializer(serializers.ModelSerializer):
    expert_fingerprint = serializers.CharField(source="expert_state.fingerprint", read_only=True)
    page = serializers.SerializerMethodField()

    class Meta:
        model = Lineage
        fields = ["id", "expert_name", "expert_fingerprint", "operator", "problem_fingerprint", "rewriter",
                  "gate_mode", "assurance", "termination_kind", "termination_message", "accepted_count",
                  "rejected_count", "stats", "source_path", "page", "imported_at"]

    def get_page(self, lineage: Lineage) -> str:
        return reverse("skills:lineage", args=[lineage.id])


class LineageDetailSerializer(LineageSerializer):
    class Meta(LineageSerializer.Meta):
        fields = [*LineageSerializer.Meta.fields, "document"]


class ReviewSerializer(serializers.ModelSerializer):
    reviewer = serializers.CharField(source="reviewer.get_username", read_only=True)
    step = serializers.PrimaryKeyRelatedField(queryset=LineageStep.objects.all())

    class Meta:
        model = Review
        fields = ["id", "step", "reviewer", "verdict", "comment", "created"]
        read_only_fields = ["id", "reviewer", "created"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("verdict") == Review.Verdict.DISPUTE and not attrs.get("comment", "").strip():
            raise serializers.ValidationError({"comment": "a dispute needs a comment saying what is wrong"})
        return attrs


class LineageStepSerializer(serializers.ModelSerializer):
    lineage = serializers.CharField(source="lineage_id", read_only=True)
    parent = serializers.CharField(source="parent_state.fingerprint", read_only=True)
    child = serializers.CharField(source="child_state.fingerprint", read_only=True, allow_null=True, default=None)
    disputed = serializers.BooleanField(read_only=True)
    reviews = ReviewSerializer(many=True, read_only=True)

    class Meta:
        model = LineageStep
        fields = ["id", "lineage", "kind", "index", "branch_step", "transform", "anchor", "parent", "child",
                  "features_removed", "features_added", "forward_status", "forward_message", "forward_timing",
                  "pairing", "pairing_note", "retimed_ratio", "note", "rejection_category", "rejection_reason",
                  "cases_failed", "evidence", "disputed", "reviews"]


class LineageStepDetailSerializer(LineageStepSerializer):
    class Meta(LineageStepSerializer.Meta):
        fields = [*LineageStepSerializer.Meta.fields, "backward_diff", "forward_diff"]


# ---------------------------------------------------------------------------------------------
# The skill library.


class CardTrialSerializer(serializers.ModelSerializer):
    class Meta:
        model = CardTrial
        fields = ["outcome", "target", "verdict_key", "ratio", "message", "judged", "created"]


class SkillCardSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="card_id", read_only=True)
    # A plain string in the schema: an enum component named "status" would clash with verdicts'.
    status = serializers.CharField(read_only=True, help_text="candidate, admitted, retired or imported")
    effective_status = serializers.SerializerMethodField(
        help_text="the status an optimization acts on: candidate while a disputed step sends an admitted card "
                  "back to admission (`readmission` says why), else `status`")
    page = serializers.SerializerMethodField()
    library = serializers.CharField(source="library.name", read_only=True,
                                    help_text="the library holding this copy of the card")

    class Meta:
        model = SkillCard
        fields = ["id", "short_id", "library", "status", "transform", "intent", "surface", "platform", "operators",
                  "dtypes", "requires", "provides", "conflicts", "median_gain", "precondition_count", "risk_count",
                  "when_kind", "when_label", "readmission", "effective_status", "page", "imported_at", "updated_at"]

    def get_page(self, card: SkillCard) -> str:
        return card.get_absolute_url()

    def get_effective_status(self, card: SkillCard) -> str:
        return effective_status(card)


class SkillCardDetailSerializer(SkillCardSerializer):
    trials = CardTrialSerializer(many=True, read_only=True)
    skillmd = serializers.SerializerMethodField(help_text="the card's SKILL.md")

    class Meta(SkillCardSerializer.Meta):
        fields = [*SkillCardSerializer.Meta.fields, "skillmd", "trials", "document"]

    def get_skillmd(self, card: SkillCard) -> str:
        return card.skillmd_url()


class SkillLibrarySerializer(serializers.ModelSerializer):
    cards = serializers.IntegerField(source="card_total", read_only=True, help_text="cards it holds")
    admitted = serializers.IntegerField(read_only=True, help_text="of them, admitted and not back to admission")
    back_to_admission = serializers.IntegerField(
        read_only=True, help_text="of them, admitted but back to admission: a disputed step stands behind it, or "
                                  "today's rule would not admit it on its trials")
    with_timing_precondition = serializers.IntegerField(source="conditioned", read_only=True,
                                                        help_text="of them, cards whose when is a timing precondition")
    page = serializers.SerializerMethodField()

    class Meta:
        model = SkillLibrary
        fields = ["name", "source", "note", "created", "cards", "admitted", "back_to_admission",
                  "with_timing_precondition", "page", "provenance", "imported_at", "updated_at"]

    def get_page(self, library: SkillLibrary) -> str:
        return library.get_absolute_url()
