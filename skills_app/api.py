"""Read-only API over problems, kernels, kernel states and verdicts (DRF viewsets)."""

from __future__ import annotations

from django.db.models import F, Prefetch
from rest_framework import mixins, viewsets
from rest_framework.permissions import BasePermission
from rest_framework.routers import DefaultRouter

from klineage_web.access import ReadAccess
from klineage_web.pagination import Pagination
from skills_app import filters, serializers
from skills_app.libraries import card_anywhere_or_404, libraries_with_counts
from skills_app.models import CardTrial, Kernel, KernelState, Lineage, LineageStep, Problem, Review, SkillCard, Verdict

# A kernel's name is a corpus path such as row_softmax/naive: slashes allowed, dots not.
KERNEL_NAME_PATTERN = r"[A-Za-z0-9_\-]+(?:/[A-Za-z0-9_\-]+)*"


class _ReadOnly(viewsets.ReadOnlyModelViewSet):
    permission_classes = [ReadAccess]
    pagination_class = Pagination
    detail_serializer_class = None

    def get_serializer_class(self):
        if self.action == "retrieve" and self.detail_serializer_class is not None:
            return self.detail_serializer_class
        return self.serializer_class


class ProblemViewSet(_ReadOnly):
    """Problems as the sandboxed probe described them: cases, outputs, tolerances, roofline."""

    queryset = Problem.objects.all()
    serializer_class = serializers.ProblemSerializer
    detail_serializer_class = serializers.ProblemDetailSerializer
    filterset_class = filters.ProblemFilter
    lookup_field = "fingerprint"
    ordering_fields = ["operator", "fingerprint", "imported_at"]
    ordering = ["operator", "-current", "-imported_at"]


class KernelViewSet(_ReadOnly):
    """Named kernels (bundled, adversarial, uploaded) with the latest verdict on their current state."""

    queryset = Kernel.objects.with_latest_verdict().select_related("current_state", "problem")
    serializer_class = serializers.KernelSerializer
    detail_serializer_class = serializers.KernelDetailSerializer
    filterset_class = filters.KernelFilter
    lookup_field = "name"
    lookup_value_regex = KERNEL_NAME_PATTERN
    ordering_fields = ["name", "operator", "updated_at", "latest_status"]
    ordering = ["adversarial", "name"]


class KernelStateViewSet(_ReadOnly):
    """Kernel states by fingerprint: CUDA source plus launch plan."""

    queryset = KernelState.objects.select_related("kernel")
    serializer_class = serializers.KernelStateSerializer
    detail_serializer_class = serializers.KernelStateDetailSerializer
    filterset_class = filters.KernelStateFilter
    lookup_field = "fingerprint"
    ordering_fields = ["name", "operator", "imported_at"]
    ordering = ["name", "-imported_at"]


class VerdictViewSet(_ReadOnly):
    """Gate verdicts by key; the detail holds the whole engine document."""

    queryset = Verdict.objects.select_related("state__kernel")
    serializer_class = serializers.VerdictSerializer
    detail_serializer_class = serializers.VerdictDetailSerializer
    filterset_class = filters.VerdictFilter
    lookup_field = "key"
    ordering_fields = ["created", "status", "operator", "kernel_name", "gpu"]
    ordering = [F("created").desc(nulls_last=True), "-id"]

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list":
            return queryset.defer("document", "policy")
        return queryset


router = DefaultRouter()
router.register("problems", ProblemViewSet, basename="problem")
router.register("kernels", KernelViewSet, basename="kernel")
router.register("kernel-states", KernelStateViewSet, basename="kernel-state")
router.register("verdicts", VerdictViewSet, basename="verdict")


class LineageViewSet(_ReadOnly):
    """Lineages by id (the sha256 of the document); the detail holds the whole engine document."""

    queryset = Lineage.objects.select_related("expert_state")
    serializer_class = serializers.LineageSerializer
    detail_serializer_class = serializers.LineageDetailSerializer
    filterset_class = filters.LineageFilter
    ordering_fields = ["operator", "expert_name", "imported_at", "accepted_count", "rejected_count"]
    ordering = ["operator", "expert_name", "-imported_at"]

    def get_queryset(self):
        queryset = super().get_queryset()
        return queryset.defer("document") if self.action == "list" else queryset


class LineageStepViewSet(_ReadOnly):
    """Accepted steps and rejected attempts of lineages, with their reviews."""

    queryset = LineageStep.objects.select_related("parent_state", "child_state").prefetch_related(
        Prefetch("reviews", queryset=Review.objects.select_related("reviewer")))
    serializer_class = serializers.LineageStepSerializer
    detail_serializer_class = serializers.LineageStepDetailSerializer
    filterset_class = filters.LineageStepFilter
    ordering_fields = ["lineage", "index", "branch_step", "transform", "kind"]
    ordering = ["lineage", "branch_step", "-kind", "index"]

    def get_queryset(self):
        queryset = super().get_queryset()
        return queryset.defer("backward_diff", "forward_diff") if self.action == "list" else queryset


class CanReview(BasePermission):
    """Creating a review needs a signed-in user with skills_app.add_review (the reviewer group)."""

    message = "Reviewing needs the skills_app.add_review permission (the reviewer group)."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.has_perm("skills_app.add_review"))


class ReviewViewSet(mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Confirm or dispute a lineage step (POST); the reviewer is the signed-in user."""

    queryset = Review.objects.select_related("reviewer")
    serializer_class = serializers.ReviewSerializer
    permission_classes = [CanReview]

    def perform_create(self, serializer):
        serializer.save(reviewer=self.request.user)


router.register("lineages", LineageViewSet, basename="lineage")
router.register("lineage-steps", LineageStepViewSet, basename="lineage-step")
router.register("reviews", ReviewViewSet, basename="review")


class SkillCardViewSet(_ReadOnly):
    """Skill cards by short id (the first 12 hex digits of the card id), of every library unless `library`
    names one; the detail holds the whole card document and its verification trials. A card id two
    libraries hold is read from the default library unless `library` says which."""

    queryset = SkillCard.objects.select_related("library")
    serializer_class = serializers.SkillCardSerializer
    detail_serializer_class = serializers.SkillCardDetailSerializer
    filterset_class = filters.SkillCardFilter
    lookup_field = "short_id"
    lookup_value_regex = "[0-9a-f]{12}"
    ordering_fields = ["median_gain", "transform", "card_id", "status", "imported_at"]
    ordering = [F("median_gain").desc(nulls_last=True), "transform", "card_id"]

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list":
            return queryset.defer("document", "search_text")
        return queryset.prefetch_related(Prefetch("trials", queryset=CardTrial.objects.order_by("created", "id")))

    def get_object(self):
        if self.request.query_params.get("library"):
            return super().get_object()
        card = card_anywhere_or_404(self.kwargs["short_id"])
        self.check_object_permissions(self.request, card)
        return self.get_queryset().get(pk=card.pk)


router.register("cards", SkillCardViewSet, basename="card")


class SkillLibraryViewSet(_ReadOnly):
    """Skill libraries by name, each with its card counts; their cards are `/api/cards/?library=<name>`."""

    serializer_class = serializers.SkillLibrarySerializer
    lookup_field = "name"
    lookup_value_regex = "[-a-zA-Z0-9_]+"
    ordering_fields = ["name", "created"]
    ordering = ["name"]

    def get_queryset(self):
        return libraries_with_counts()


router.register("libraries", SkillLibraryViewSet, basename="library")
