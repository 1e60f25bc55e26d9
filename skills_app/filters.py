"""Filters shared by the pages and the API (django-filter), so both accept the same parameters."""

from __future__ import annotations

import json

import django_filters as filters
from django.db.models import Q, QuerySet

from klineage.launch import ARCHES
from skills_app.models import Kernel, KernelState, Lineage, LineageStep, Problem, SkillCard, Verdict, When

NO_VERDICT = "none"
LATEST_STATUS_CHOICES = [*Verdict.StatusChoices.choices, (NO_VERDICT, "no verdict yet")]
ARCH_CHOICES = [(arch, arch) for arch in ARCHES]
SUITE_CHOICES = [("expert", "expert and baseline kernels"), ("adversarial", "adversarial suite")]


class ProblemFilter(filters.FilterSet):
    operator = filters.CharFilter(help_text="the problem's operator, e.g. row_softmax")
    current = filters.BooleanFilter(help_text="only the current version of each operator")
    bundled = filters.BooleanFilter()

    class Meta:
        model = Problem
        fields = ["operator", "current", "bundled"]


class KernelFilter(filters.FilterSet):
    """Expects `Kernel.objects.with_latest_verdict()`: the status filter reads its annotation."""

    problem = filters.CharFilter(field_name="operator", help_text="the operator the kernel implements")
    status = filters.ChoiceFilter(choices=LATEST_STATUS_CHOICES, method="filter_status",
                                  help_text="status of the latest verdict on the kernel's current state")
    arch = filters.ChoiceFilter(choices=ARCH_CHOICES, field_name="current_state__arch",
                                help_text="the architecture its plan targets")
    suite = filters.ChoiceFilter(choices=SUITE_CHOICES, method="filter_suite")
    origin = filters.ChoiceFilter(choices=Kernel.Origin.choices)
    q = filters.CharFilter(field_name="name", lookup_expr="icontains", help_text="part of the kernel's name")

    class Meta:
        model = Kernel
        fields = ["problem", "status", "arch", "suite", "origin", "q"]

    def filter_status(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        if value == NO_VERDICT:
            return queryset.filter(latest_status__isnull=True)
        return queryset.filter(latest_status=value)

    def filter_suite(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(adversarial=value == "adversarial")


class KernelStateFilter(filters.FilterSet):
    operator = filters.CharFilter()
    arch = filters.ChoiceFilter(choices=ARCH_CHOICES)
    name = filters.CharFilter(help_text="the plan's name, e.g. row_softmax_naive")
    kernel = filters.CharFilter(field_name="kernel__name", help_text="the named kernel, e.g. row_softmax/naive")

    class Meta:
        model = KernelState
        fields = ["operator", "arch", "name", "kernel"]


class VerdictFilter(filters.FilterSet):
    status = filters.ChoiceFilter(choices=Verdict.StatusChoices.choices)
    reason = filters.CharFilter(help_text="the first finding's reason, e.g. race")
    operator = filters.CharFilter()
    gpu = filters.CharFilter()
    toolchain = filters.CharFilter()
    served_from = filters.ChoiceFilter(choices=Verdict.ServedFrom.choices)
    kernel = filters.CharFilter(method="filter_kernel",
                                help_text="a kernel's name (row_softmax/naive), plan name or state fingerprint")
    kernel_fingerprint = filters.CharFilter()
    created_after = filters.IsoDateTimeFilter(field_name="created", lookup_expr="gte")
    created_before = filters.IsoDateTimeFilter(field_name="created", lookup_expr="lt")

    class Meta:
        model = Verdict
        fields = ["status", "reason", "operator", "gpu", "toolchain", "served_from", "kernel",
                  "kernel_fingerprint", "created_after", "created_before"]

    def filter_kernel(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(Q(state__kernel__name=value) | Q(kernel_name=value) | Q(kernel_fingerprint=value))


class LineageFilter(filters.FilterSet):
    problem = filters.CharFilter(field_name="operator", help_text="the problem's operator, e.g. row_softmax")
    termination = filters.ChoiceFilter(
        field_name="termination_kind", help_text="why the walk stopped",
        choices=[(k, k) for k in ("complete", "step_limit", "rejection_limit", "unknown")])
    rewriter = filters.CharFilter(help_text="the rewriter that proposed the steps, e.g. rules")
    assurance = filters.ChoiceFilter(choices=Lineage.Assurance.choices)
    expert = filters.CharFilter(field_name="expert_name", help_text="the expert kernel's plan name")

    class Meta:
        model = Lineage
        fields = ["problem", "termination", "rewriter", "assurance", "expert"]


class LineageStepFilter(filters.FilterSet):
    lineage = filters.CharFilter(field_name="lineage_id", help_text="the lineage's id")
    kind = filters.ChoiceFilter(choices=LineageStep.Kind.choices)
    transform = filters.CharFilter()
    forward_status = filters.CharFilter(help_text="accepted steps: verified, untimed, slower ...")
    pairing = filters.ChoiceFilter(choices=LineageStep._meta.get_field("pairing").choices,
                                   help_text="GPU walks' accepted steps: consistent, biased, outweighed, unchecked")
    category = filters.CharFilter(field_name="rejection_category", help_text="rejected attempts: compile_error ...")
    problem = filters.CharFilter(field_name="lineage__operator")
    reviewed = filters.BooleanFilter(field_name="reviews", lookup_expr="isnull", exclude=True, distinct=True,
                                     help_text="whether anyone has reviewed the step")

    class Meta:
        model = LineageStep
        fields = ["lineage", "kind", "transform", "forward_status", "pairing", "category", "problem", "reviewed"]


class SkillCardFilter(filters.FilterSet):
    """List fields (operators, features) are JSON lists of texts: a value matches as a whole JSON string."""

    library = filters.CharFilter(field_name="library__name",
                                 help_text="the library's name (corpus, percase ...); every library where unset")
    status = filters.ChoiceFilter(choices=SkillCard.Status.choices)
    operator = filters.CharFilter(method="filter_listed", field_name="operators",
                                  help_text="an operator in the card's scope, e.g. row_softmax")
    surface = filters.CharFilter(help_text="the anchor kind the card acts on: loop, function, parameter ...")
    platform = filters.CharFilter(help_text="e.g. sm90")
    transform = filters.CharFilter()
    intent = filters.CharFilter(lookup_expr="icontains", help_text="part of the intent sentence")
    feature = filters.CharFilter(
        method="filter_feature",
        help_text="a feature (locus/name, e.g. kernel/launch_bounds) the card requires or provides",
    )
    q = filters.CharFilter(method="filter_search",
                           help_text="words that must all appear in the intent, anchor or transform")
    readmission = filters.BooleanFilter(method="filter_readmission",
                                        help_text="true: cards sent back to admission by a disputed step")
    when = filters.ChoiceFilter(field_name="when_kind", choices=When.choices,
                                help_text="where its per-case effects say it pays: precondition (a timing "
                                          "precondition says where), uniform, mixed, never or unmeasured")
    preconditions = filters.BooleanFilter(method="filter_preconditions",
                                          help_text="true: cards that state a precondition (when they are sound or "
                                                    "where they pay); false: cards with none")

    class Meta:
        model = SkillCard
        fields = ["library", "status", "operator", "surface", "platform", "transform", "intent", "feature", "q",
                  "readmission", "when", "preconditions"]

    def filter_preconditions(self, queryset: QuerySet, name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        return queryset.filter(precondition_count__gt=0) if value else queryset.filter(precondition_count=0)

    def filter_readmission(self, queryset: QuerySet, name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        return queryset.exclude(readmission="") if value else queryset.filter(readmission="")

    def filter_listed(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(**{f"{name}__icontains": json.dumps(value)})

    def filter_feature(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        text = json.dumps(value)
        return queryset.filter(Q(requires__icontains=text) | Q(provides__icontains=text))

    def filter_search(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        for word in value.lower().split():
            queryset = queryset.filter(search_text__contains=word)
        return queryset
