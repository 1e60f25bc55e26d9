"""When the library's cards pay: their timing preconditions, uniform effects and what the preconditions save (CPU).

    python bench/preconditions_report.py [--library LIBRARY.json] [--out bench/results/preconditions.json]
    python bench/preconditions_report.py --library LIBRARY.json --untried   (the cards to trial first: `untried`)

Reads a library (build it with `klineage library build` after bench/percase.py recorded per-case timings:
induction then reads them, klineage.skills.when) and the recorded verdicts; runs nothing on a GPU.
- cards / admitted: the library's cards, and those admitted. Every other count is over the admitted cards.
- with_preconditions: admitted cards with a timing precondition false on at least one measured case;
  uniform: admitted cards that paid on every case measured (klineage.skills.when.card_when).
- loo_accuracy: leave-one-case-out accuracy pooled over every timing precondition (cases predicted
  right / cases), null when there is none; loo_accuracy_every_card: the same over every card's, admitted or not.
- kernel_loo_accuracy: the same with each kernel left out with all its cases instead (how a precondition
  carries to a kernel it was not induced on), pooled over the admitted preconditions measured on several kernels.
- evaluations_saved: at each bundled kernel of each operator, the candidate kernels of cards whose
  timing precondition fails on its problem's headline and decides there (a kernel of a walk it was measured on,
  or any kernel where it carries to kernels left out: retrieval.decides_on), at the card's own transform's sites (what
  `klineage optimize --strategy library` records `precondition_failed` and does not gate in its first round
  from that kernel).
- whens: how many admitted cards' *when* is each kind (precondition, uniform, never, mixed, unmeasured).
- rows: one per admitted card with a *when*: its precondition (or "paid on all N cases measured"),
  the cases it holds and fails on, the share of paid cases where it holds, its leave-one-case-out and
  leave-one-kernel-out accuracies,
  and the held-out trials that decided it (target, paired ratio on the trial's case, outcome, the GPU it was
  judged on, and
  this_content: false where they judged an earlier content whose status it carried): where a
  uniform card was tried beyond the cases it was measured on.
- kept_out: the cards that are not admitted because their per-case effects do not say where they pay
  (klineage.skills.when.unpaid_when), counted by the kind of their *when* (never, mixed, uniform on too few cases).
- pending: the same for cards that are not admitted (a card that gains a precondition is a candidate
  until it is admitted again on it), each with its status.
- provenance.gpu: the GPUs the per-case timings behind the cards ran on ("none": nothing timed per case).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from klineage import config, corpus
from klineage.errors import KLineageError
from klineage.fingerprint import document_text
from klineage.skills.admission_rule import card_digest
from klineage.skills.card import CardStatus, SkillCard
from klineage.skills.library import Library, lineage_index, load_library, problem_infos
from klineage.skills.retrieval import retrieve
from klineage.skills.trial_reading import trial_outcome
from klineage.skills.when import MIN_WHEN_CASES, WhenKind, card_when, unpaid_when

LIBRARY = config.REPO_ROOT / "corpus" / "library" / "library.json"
OUT = config.REPO_ROOT / "bench" / "results" / "preconditions.json"


def _trials(card: SkillCard) -> list[dict[str, Any]]:
    """The held-out trials that decided the card: those of its present content, or for an admitted card
    that has none, those of the content whose status it carried (a rebuild that changed only what no
    trial reads, more cases timed say: `admission.judged_alike`), the latest trialled one. Each with its
    target, its paired ratio (target time over the card's kernel's, on one case; null where the gate
    rejected or timed nothing), its outcome, the GPU that judged it and whether it judged this very content."""
    digest = card_digest(card)
    bases = [t.basis.card for t in card.verification_log if t.basis is not None]
    judged = digest if digest in bases or card.status is not CardStatus.ADMITTED or not bases else bases[-1]
    return [{"target": named.group(1) if (named := _TARGET.match(t.message)) else t.state[:12],
             "ratio": round(t.ratio, 4) if t.ratio is not None else None, "outcome": trial_outcome(t).value,
             "gpu": t.basis.gpu, "this_content": judged == digest}
            for t in card.verification_log if t.basis is not None and t.basis.card == judged]


# "<outcome>: <target>: <n> site(s) -> ...": a target's name may hold ": " itself ("(measured per case already:
# a replication)"), the site count never
_TARGET = re.compile(r"^[a-z]+: (.+?): \d+ site\(s\)")


def _row(card: SkillCard) -> dict[str, Any] | None:
    row = _when_row(card)
    return None if row is None else {**row, "trials": _trials(card)}


def _when_row(card: SkillCard) -> dict[str, Any] | None:
    when = card_when(card)
    if when.kind is WhenKind.PRECONDITION:
        p = when.precondition
        paid = set(when.paid)
        return {"card": card.short_id, "transform": card.transform, "precondition": p.expression,
                "sentence": p.sentence, "holds_on": list(p.holds), "fails_on": list(p.fails),
                "paid_where_held": round(sum(h in paid for h in p.holds) / len(p.holds), 4)
                if p.holds else None,
                "loo_accuracy": p.loo_accuracy, "kernel_loo_accuracy": p.kernel_loo_accuracy}
    if when.kind is WhenKind.UNIFORM:
        cases = [r.case for r in when.cases]
        return {"card": card.short_id, "transform": card.transform, "precondition": when.sentence,
                "sentence": when.sentence, "holds_on": cases, "fails_on": [], "paid_where_held": 1.0,
                "loo_accuracy": None, "kernel_loo_accuracy": None}
    return None


def _pooled(cards: list[SkillCard], measure: str = "loo_accuracy") -> float | None:
    """A precondition measure (`loo_accuracy`, `kernel_loo_accuracy`) pooled over the cards' timing
    preconditions that have it, each weighted by its decided cases."""
    right = total = 0.0
    for card in cards:
        when = card_when(card)
        if when.kind is WhenKind.PRECONDITION and getattr(when.precondition, measure) is not None:
            n = len(when.precondition.holds) + len(when.precondition.fails)
            right, total = right + getattr(when.precondition, measure) * n, total + n
    return round(right / total, 4) if total else None


def evaluations_saved(library: Library) -> int:
    """Candidate kernels the optimize loop's first round would record `precondition_failed` at each bundled kernel."""
    from klineage.optimize.strategies import skipped_candidates

    cards = list(library.admitted())
    if not any(p.source == "timing" for c in cards for p in c.preconditions):
        return 0
    lineages = lineage_index()
    kernels = corpus.list_kernels()
    infos = problem_infos({entry.name.split("/")[0] for entry in kernels})
    saved = 0
    for entry in kernels:
        info = infos.get(entry.name.split("/")[0])
        if info is None:
            continue
        state = entry.load()
        skipped: list = []
        retrieve(state, info, cards, limit=max(1, len(cards)), lineages=lineages, skipped=skipped)
        saved += sum(1 for _ in skipped_candidates(skipped, cards, state, lineages))
    return saved


def _gpus(library: Library) -> list[str]:
    from klineage.walk.timing_audit import percase_timing

    lineages = lineage_index()
    found: set[str] = set()
    refs = {e.source for c in library.cards for e in c.effects}
    for ref in refs:
        lineage = lineages.get(ref.lineage)
        timed = percase_timing(lineage, ref.index) if lineage is not None else None
        if timed is not None:
            found.add(timed.gpu or "unknown")
    return sorted(found)


def report(library: Library) -> dict[str, Any]:
    admitted = [c for c in library.cards if c.status is CardStatus.ADMITTED]
    whens = {c.id: card_when(c) for c in admitted}
    nontrivial = [c for c in admitted if whens[c.id].kind is WhenKind.PRECONDITION and whens[c.id].precondition.fails]
    gpus = _gpus(library)
    return {
        "provenance": {"gpu": ", ".join(gpus) or "none", "library": library.provenance,
                       "counted_over": "admitted cards", "built_by": "bench/preconditions_report.py"},
        "cards": len(library.cards), "admitted": len(admitted), "with_preconditions": len(nontrivial),
        "uniform": sum(w.kind is WhenKind.UNIFORM for w in whens.values()),
        "loo_accuracy": _pooled(admitted), "loo_accuracy_every_card": _pooled(list(library.cards)),
        "kernel_loo_accuracy": _pooled(admitted, "kernel_loo_accuracy"),
        "evaluations_saved": evaluations_saved(library),
        "whens": {kind.value: sum(w.kind is kind for w in whens.values()) for kind in WhenKind},
        "kept_out": _kept_out(library),
        "rows": [row for row in (_row(c) for c in admitted) if row is not None],
        # candidates with a *when* of their own: a new precondition makes a card a candidate until admitted again
        "pending": [{**row, "status": c.status.value} for c in library.cards if c.status is not CardStatus.ADMITTED
                    for row in [_row(c)] if row is not None],
    }


def _kept_out(library: Library) -> dict[str, int]:
    held = [w for c in library.cards if c.status is not CardStatus.ADMITTED for w in [unpaid_when(c)] if w is not None]
    return {kind.value: n for kind in WhenKind for n in [sum(w.kind is kind for w in held)] if n}


def untried(library: Library) -> list[str]:
    """Cards no trial of their present content has judged (one of an earlier content, before the card
    gained its precondition, judged another claim) whose per-case effects say where they pay (a timing
    precondition, or paid on every decided case of at least MIN_WHEN_CASES): what an admission run on the
    GPU should take first. Cards timed on their headline alone are left out: one case says nothing of
    where they pay."""
    def says_where(card: SkillCard) -> bool:
        when = card_when(card)
        return (len(when.cases) > 1 and unpaid_when(card) is None and
                (when.kind is WhenKind.PRECONDITION or len(when.paid) >= MIN_WHEN_CASES))
    return [c.short_id for c in library.cards if c.status is not CardStatus.ADMITTED and not _trials(c)
            and says_where(c)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", type=Path, default=LIBRARY)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--untried", action="store_true",
                        help="print the ids of the cards to trial first (`untried`) on one line and write nothing")
    args = parser.parse_args(argv)
    try:
        if args.untried:
            print(" ".join(untried(load_library(args.library))))
            return 0
        result = report(load_library(args.library))
    except KLineageError as exc:
        print(f"preconditions_report: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(document_text(result), encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "pending", "provenance")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
