"""Skill cards for the library's tests, induced from real lineages.

`timed_lineage()` is the committed dry walk of row_softmax/warp_vec4 as a GPU walk would leave it
(every state passed its aligned cases, three forward steps timed) with one refused unroll that
failed the ragged and narrow cases, built with the helpers that give any lineage GPU-style
verdicts, timings and rejections; `induce` lifts it into four cards, two with a risk and a
precondition, three with effects. `many_cards(n)` varies those real card dicts (transform, scope,
intent, effects, status) into n distinct valid cards, their ids derived from their content.
`dry_cards_by_transform()` induces the dry walk as it is.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from klineage.config import GateMode
from klineage.gate.verdict import Reason, Status
from klineage.lineage import (
    CaseOutcome,
    CaseResult,
    Evidence,
    ForwardCheck,
    ForwardStatus,
    Lineage,
    PairedTiming,
    Rejection,
    RejectionCategory,
    VerdictSummary,
)
from klineage.skills.card import SkillCard
from klineage.skills.induction import induce
from klineage.transforms.base import Anchor
from lineage_data import DRY_WALK

CASES = {  # corpus/problems/row_softmax.py
    "headline": {"rows": 16384, "cols": 4096},
    "ragged": {"rows": 1000, "cols": 3001},
    "long_rows": {"rows": 7, "cols": 9973},
    "narrow": {"rows": 4099, "cols": 30},
    "mid_aligned": {"rows": 2053, "cols": 1540},
    "small": {"rows": 33, "cols": 257},
}
ALIGNED = ("headline", "mid_aligned")
TIMINGS = {0: (1.08, 1.07, 1.08, 1.10), 1: (1.02, 1.01, 1.03, 1.02), 6: (0.97, 0.96, 0.98, 0.97)}


def all_passed(lineage: Lineage, outcomes: dict[str, CaseOutcome] | None = None) -> Lineage:
    """The lineage as a GPU walk would leave it: every state passed (or the given outcome per case)."""
    outcomes = outcomes or {}
    cases = tuple(CaseResult(c, outcomes.get(c, CaseOutcome.PASSED)) for c in CASES)
    states = tuple(dataclasses.replace(s, verdict=VerdictSummary(Status.PASSED, None, cases)) for s in lineage.states)
    return dataclasses.replace(lineage, gate=GateMode.GPU, states=states)


def with_timing(lineage: Lineage, ratios: dict[int, tuple[float, ...]]) -> Lineage:
    transitions = []
    for t in lineage.transitions:
        if t.index in ratios:
            overall, *trials = ratios[t.index]
            timing = PairedTiming(overall, tuple(trials))
            status = ForwardStatus.VERIFIED if timing.accepted else ForwardStatus.SLOWER
            t = dataclasses.replace(t, forward=ForwardCheck(status, "timed", timing))
        transitions.append(t)
    return dataclasses.replace(lineage, transitions=tuple(transitions))


def with_rejections(lineage: Lineage, rejections: list[Rejection]) -> Lineage:
    return dataclasses.replace(lineage, rejections=tuple(rejections),
                               stats=dataclasses.replace(lineage.stats, rejected=len(rejections)))


def unroll_rejection(lineage: Lineage, step: int = 1, cases=("ragged", "narrow"), function: str = "softmax_row",
                     category=RejectionCategory.INCORRECT) -> Rejection:
    return Rejection(step, lineage.chain[step], "unroll", Anchor(function, "loop", "i#0:unroll"), category,
                     Reason.INCORRECT if category is RejectionCategory.INCORRECT else None, tuple(cases),
                     Evidence(message="max abs err 0.3 at row 7", stage="correctness", case=cases[0] if cases else ""))


def timed_lineage() -> Lineage:
    dry = Lineage.load(DRY_WALK)
    passed = all_passed(dry, {c: CaseOutcome.NOT_RUN for c in CASES if c not in ALIGNED})
    return with_rejections(with_timing(passed, TIMINGS), [unroll_rejection(dry)])


def dry_cards_by_transform() -> dict[str, SkillCard]:
    """The cards induced from the dry walk, one per transform: the one that names a feature when there are two."""
    by_name = {}
    for card in induce([Lineage.load(DRY_WALK)]):
        if card.transform not in by_name or card.provides:
            by_name[card.transform] = card
    return by_name


def real_cards() -> list[SkillCard]:
    return induce([timed_lineage()], {"row_softmax": CASES})


def library_document(cards: list[SkillCard] | list[dict[str, Any]], date: str = "2026-11-29T12:00:00+00:00"):
    dicts = [c if isinstance(c, dict) else c.to_dict() for c in cards]
    return {"version": 1, "provenance": {"date": date, "built_by": "tests/library_data.py"}, "cards": dicts}


def store_real_library():
    """The real cards and the timed lineage they came from, both imported into the test database
    (so the cards' evidence and risks resolve to stored steps): (cards, the stored Lineage)."""
    from skills_app.card_import import import_library
    from skills_app.importer import import_lineage

    cards = real_cards()
    lineage, _ = import_lineage(timed_lineage().to_dict())
    import_library(library_document(cards))
    return cards, lineage


OPERATORS = ("row_softmax", "gemm", "conv2d", "fmha", "topk", "gdn")
PLATFORMS = ("sm90", "sm90a")
STATUSES = ("candidate", "admitted", "retired")


def many_cards(count: int) -> list[dict[str, Any]]:
    """`count` distinct valid card dicts, varied from the real cards; ids derived from the content."""
    base = real_cards()
    out = []
    for i, template in zip(range(count), itertools.cycle(base)):
        operator = OPERATORS[i % len(OPERATORS)]
        ratio = round(0.9 + (i % 97) / 200, 4)
        card = dataclasses.replace(
            template, id="", transform=f"{template.transform}_v{i // len(base)}",
            intent=f"{template.intent} Variant {i}.", status=STATUSES[(i // 3) % len(STATUSES)],
            scope=dataclasses.replace(template.scope, operators=(operator,),
                                      platform=PLATFORMS[(i // 7) % len(PLATFORMS)]),
            effects=tuple(dataclasses.replace(e, operator=operator, ratio=ratio) for e in template.effects))
        out.append(card.to_dict())
    return out


def corpus_cards():
    """The stored cards of the bundled corpus's library (import_library's default name), not those of the
    libraries built beside it that import_library_files brings in as well."""
    from skills_app.models import DEFAULT_LIBRARY, SkillCard

    return SkillCard.objects.filter(library__name=DEFAULT_LIBRARY)
