"""The numbers the home page leads with, all read from the database and bench/results (the recent jobs beside
them are gate_app's: klineage_web.views.home adds those)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, F

from klineage.gate.verdict import Status
from skills_app import evidence
from skills_app.card_words import title_of
from skills_app.models import Kernel, Problem, SkillCard, SkillLibrary, Verdict


@dataclass
class SuiteRow:
    name: str
    expected: str
    why: str
    status: str | None
    reason: str | None
    key: str | None

    @property
    def rejected(self) -> bool:
        return self.status == Status.REJECTED.value

    @property
    def matches(self) -> bool:
        return self.rejected and self.reason == self.expected


@dataclass
class Suite:
    rows: list[SuiteRow] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.rows)

    @property
    def rejected(self) -> int:
        return sum(row.rejected for row in self.rows)

    @property
    def matching(self) -> int:
        return sum(row.matches for row in self.rows)

    @property
    def unjudged(self) -> int:
        return sum(row.status is None for row in self.rows)


def adversarial_suite() -> Suite:
    """Each adversarial kernel with the latest verdict on its current state, against its expectation."""
    kernels = Kernel.objects.with_latest_verdict().filter(adversarial=True).order_by("name")
    return Suite([SuiteRow(k.name, k.expected_reason, k.expected_why, k.latest_status, k.latest_reason or None,
                           k.latest_key) for k in kernels])


def verdicts_by_status() -> list[dict[str, Any]]:
    counts = dict(Verdict.objects.values_list("status").annotate(n=Count("id")))
    total = sum(counts.values()) or 1
    rows, offset = [], 0.0
    for status in Status:
        share = 100 * counts.get(status.value, 0) / total
        rows.append({"status": status.value, "count": counts.get(status.value, 0), "share": share, "offset": offset})
        offset += share
    return rows


def library_glance() -> dict[str, Any]:
    """The default library's cards by status, the admitted ones sent back to admission (`skills_app.readmission`)
    counted apart, and the best measured gain among its admitted cards (or any, before admission); how many
    libraries there are."""
    library = SkillLibrary.objects.default()
    cards = SkillCard.objects.filter(library=library)
    counts = dict(cards.order_by().values_list("status").annotate(n=Count("id")))
    total = sum(counts.values())
    back = cards.filter(status=SkillCard.Status.ADMITTED).exclude(readmission="").count()
    counts[SkillCard.Status.ADMITTED] = counts.get(SkillCard.Status.ADMITTED, 0) - back  # the standing ones
    admitted = cards.filter(status=SkillCard.Status.ADMITTED, readmission="", median_gain__isnull=False)
    timed = admitted if admitted.exists() else cards.filter(median_gain__isnull=False)
    best = (timed.order_by("-median_gain", "transform", "card_id").select_related("library")
            .only("short_id", "transform", "intent", "median_gain", "library__name")
            .annotate(anchor=F("document__anchor"), effects=F("document__effects")).first())
    if best is not None:
        best.title = title_of(best, best.anchor)
        best.cases = [f"{e['operator']}/{e['case']}" for e in best.effects]
    trialled = cards.filter(trials__isnull=False).distinct().count()
    operators = sorted({op for ops in cards.values_list("operators", flat=True) for op in ops})
    admitted_count = counts.get(SkillCard.Status.ADMITTED, 0)
    return {"name": library.name if library else "", "others": max(SkillLibrary.objects.count() - 1, 0),
            "total": total, **{s: counts.get(s, 0) for s in SkillCard.Status.values}, "back_to_admission": back,
            "best": best,
            "trialled": trialled, "admission_rate": admitted_count / total if trialled and total else None,
            "operators": operators}


def dashboard() -> dict[str, Any]:
    kernels = dict(Kernel.objects.values_list("adversarial").annotate(n=Count("id")))
    return {
        "problem_count": Problem.objects.filter(current=True).count(),
        "kernel_count": kernels.get(False, 0),
        "adversarial_count": kernels.get(True, 0),
        "verdict_count": Verdict.objects.count(),
        "gpus": list(Verdict.objects.exclude(gpu="").order_by("gpu").values_list("gpu", flat=True).distinct()),
        "by_status": verdicts_by_status(),
        "suite": adversarial_suite(),
        "recent": Verdict.objects.select_related("state__kernel").defer("document", "policy")[:6],
        "evidence": evidence.load_all(),
        "library": library_glance(),
    }
