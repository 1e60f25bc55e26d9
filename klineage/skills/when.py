"""When a card pays: a predicate over case facts, induced from its per-case effects, that separates the
cases where its forward step reached the required ratio from those where it did not.

Input: one `CaseEffect` per measured case (`operator:case`): its facts and the step's paired ratio there
(child time / parent time, > 1 faster; the median over the card's steps timed on that case). A case
paid when that ratio reached `required` (DEFAULT_REQUIRED_RATIO, what the optimize loop needs to take a
step) with room for the gate's run-to-run spread (REPEATABILITY): at least `required` x (1 + spread).
It did not pay below `required`. In between it is undecided (a re-run could put it under `required`):
left out of the search and of leave-one-case-out, and counted in every sentence. The band sits above
`required` only, because what a precondition claims is "it pays where this holds": a paid case must be
a gain no re-run takes back, while a case at 1.00x that a re-run might lift to 1.012x costs little
when left out. Without the band, steps whose effect is 1.00x give or take a per cent got
"preconditions" fitted to which side of 1.01x the noise put two cases on.

Facts (`case_facts`): the case's parameters (numbers; `<p>_is_<v>` for text, e.g. dtypes), what
the step's parent kernel's launch plan makes of them (`blocks` of its largest launch, `waves` = blocks /
SMs, `threads` a block, `dynamic_shared` bytes), what ptxas said of it (`registers`,
`static_shared`) and the work the problem's roofline figures give the case (`megabytes`, `intensity`,
`bytes_per_thread`: `work_facts`). Only facts every measured case defines are searched, and a card measured on several
operators leaves their parameters out (induction's `_when`): conv2d's N is a batch, GEMM's N a width, so
GEMM and conv2d cases are compared by blocks, waves, threads, shared memory and registers alone.

Search (`search`), simplest first: one atom, then two joined by `and`. Atoms, in this order of families:
text equality (`dtype_is_float16`), thresholds (`waves >= 1`, `cols <= 4096`, a round number between the
last unpaid and the first paid case: `_between`), divisibility (`cols % 4 == 0`; after thresholds, since
a few sizes share some divisor by chance, while an alignment rule shows where no threshold does). An atom is a candidate
when it holds on every paid case; it separates when it also fails on every unpaid one.

What is written (`induce_when`), and why each rule:
- paid on every case: UNIFORM, "paid on all N cases measured", a result, not an empty field; never
  paid: NEVER ("did not pay on any of the N cases measured").
- a predicate separating them is written only when the data forced it: at least MIN_SUPPORT cases on
  each side (a predicate is false somewhere the step did not pay, and true somewhere it paid), and a
  leave-one-case-out accuracy of at least MIN_LOO: each case in turn is left out, the search re-run on
  the others, and its prediction (the predicate found, else the others' majority) compared with what
  was measured. A predicate that one case decides is noise fitted, not a precondition. And since two
  paid cases among thirty unpaid ones give a high accuracy whatever is said of the two, the search
  without a paid case must still call it paid on at least MIN_RECALL of them (`paid_recall`).
- otherwise MIXED: "paid on k of N cases; nothing over the case facts separates them", with the
  accuracy the best candidate reached, so a reader sees how far from a rule the evidence is.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from itertools import combinations
from typing import Any

from klineage import devices, expr
from klineage.devices import DeviceSpec
from klineage.errors import DocumentError, ExpressionError
from klineage.kernel import KernelState
from klineage.launch import numeric
from klineage.skills.card import DEFAULT_REQUIRED_RATIO, Precondition, SkillCard, measured_case
from klineage.skills.predicates import DIVISORS
from klineage.skills.predicates import case_facts as param_facts

MIN_SUPPORT = 2  # decided cases on each side of a written predicate
# How far one paired ratio moves between fresh gates of the same pair: 20 of them, each a new runner,
# the first right after the machine started, spread from -1.1% to +1.5% of their median
# (bench/results/timing_fidelity.json, H200).
REPEATABILITY = 0.015
MIN_LOO = 0.8  # leave-one-case-out accuracy a written predicate reaches
MIN_RECALL = 0.5  # share of its paid cases it still predicts paid when each is left out (`paid_recall`)
MIN_WHEN_CASES = 8  # distinct cases a card must have paid on before "paid on all N cases" admits it
SOURCE = "timing"  # a Precondition's source: it says where the step pays, not whether it is sound


class Outcome(str, Enum):
    PAID = "paid"  # reached the required ratio with room for REPEATABILITY
    DID_NOT_PAY = "did not pay"  # below the required ratio
    UNDECIDED = "undecided"  # reached it, but by less than REPEATABILITY


def outcome_of(ratio: float, required: float = DEFAULT_REQUIRED_RATIO) -> Outcome:
    if ratio >= required * (1.0 + REPEATABILITY):
        return Outcome.PAID
    if ratio < required:
        return Outcome.DID_NOT_PAY
    return Outcome.UNDECIDED


class WhenKind(str, Enum):
    PRECONDITION = "precondition"  # paid where an induced predicate holds
    UNIFORM = "uniform"  # paid on every case measured
    NEVER = "never"  # paid on none
    MIXED = "mixed"  # paid on some; nothing the data forced separates them
    UNMEASURED = "unmeasured"  # no case timed


@dataclass(frozen=True)
class CaseEffect:
    case: str  # "operator:case", or "operator:case@kernel" for one kernel's row of a case timed on several
    facts: Mapping[str, Any]
    ratio: float
    outcome: Outcome

    def __post_init__(self) -> None:
        if not isinstance(self.ratio, (int, float)) or not self.ratio > 0:
            raise DocumentError(f"case effect {self.case}", f"ratio must be > 0, not {self.ratio!r}")
        if not isinstance(self.outcome, Outcome):
            raise DocumentError(f"case effect {self.case}", f"outcome must be an Outcome, not {self.outcome!r}")

    @property
    def paid(self) -> bool:
        return self.outcome is Outcome.PAID


@dataclass(frozen=True)
class Atom:
    expression: str
    sentence: str  # completes "it paid where ..."
    family: int  # 0 equality, 1 threshold, 2 divisibility


@dataclass(frozen=True)
class When:
    kind: WhenKind
    sentence: str
    cases: tuple[CaseEffect, ...] = ()
    precondition: Precondition | None = None
    loo_accuracy: float | None = None
    required: float = DEFAULT_REQUIRED_RATIO
    candidates: tuple[str, ...] = field(default=())  # what the search considered and why it was not written

    @property
    def paid(self) -> tuple[str, ...]:
        return tuple(c.case for c in self.cases if c.paid)


def case_facts(params: Mapping[str, Any], launch: Mapping[str, Any] | None = None,
               compiled: Mapping[str, Any] | None = None,
               roofline: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The names a timing predicate may use for one case: parameters, launch, compiled and work facts."""
    return {**param_facts(params), **(launch or {}), **(compiled or {}), **work_facts(roofline, launch or {})}


def work_facts(roofline: Mapping[str, float] | None, launch: Mapping[str, Any]) -> dict[str, Any]:
    """What a case asks of the kernel in units every operator shares, from the problem's roofline figures
    for it: `megabytes` (the least traffic the case needs, 1e6 bytes), `intensity` (flops per byte of it)
    and, where the launch is known, `bytes_per_thread` (that traffic over the threads of the largest
    launch: how much work each thread has to hide its latency behind). Parameters name different things in
    different problems (conv2d's N is a batch, GEMM's N a width); these do not, so a card measured on several
    operators can still be told where it pays by size and by work per thread. {} without figures."""
    if not roofline or not roofline.get("bytes"):
        return {}
    moved = float(roofline["bytes"])
    facts = {"megabytes": round(moved / 1e6, 4), "intensity": round(float(roofline.get("flops", 0.0)) / moved, 4)}
    threads = launch.get("blocks", 0) * launch.get("threads", 0)
    if threads:
        facts["bytes_per_thread"] = round(moved / threads, 2)
    return facts


def launch_facts(kernel: KernelState, params: Mapping[str, Any],
                 device: DeviceSpec = devices.DEFAULT) -> dict[str, Any]:
    """What `kernel`'s launch plan makes of a case on `device`: the largest launch's `blocks`, `waves`
    (blocks / SMs: below 1 the grid leaves SMs idle), `threads` a block and `dynamic_shared` bytes;
    {} where the plan does not resolve for the case."""
    env = numeric({**params, **kernel.constants, **device.facts()})
    best: dict[str, Any] = {}
    try:
        for launch in kernel.plan.launches:
            blocks = math.prod(expr.evaluate_int(str(d), env) for d in launch.grid)
            if blocks > best.get("blocks", 0):
                best = {"blocks": blocks, "waves": round(blocks / device.num_sms, 4),
                        "threads": math.prod(expr.evaluate_int(str(d), env) for d in launch.block),
                        "dynamic_shared": expr.evaluate_int(str(launch.shared), env)}
    except (ExpressionError, DocumentError, ZeroDivisionError):
        return {}
    return best


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.3g}"
    return str(value)


def _shared(rows: Sequence[CaseEffect]) -> dict[str, list[Any]]:
    """Each fact every row defines, with its values in row order. A text equality `p_is_v` counts as
    defined wherever `p` is (false where `p` has another value)."""
    if not rows:
        return {}
    numbers = set.intersection(*({k for k in r.facts if "_is_" not in k} for r in rows))
    texts = {k for r in rows for k in r.facts if "_is_" in k}
    texts = {k for k in texts if all(any(f.startswith(k.split("_is_")[0] + "_is_") for f in r.facts) for r in rows)}
    return {k: [r.facts.get(k, False) for r in rows] for k in sorted(numbers | texts)}


def atoms(rows: Sequence[CaseEffect]) -> list[Atom]:
    """Every atom true on every paid case of `rows` and false on at least one unpaid one, simplest first."""
    paid = [r for r in rows if r.paid]
    if not paid:
        return []
    table = _shared(rows)
    found: list[Atom] = []
    for key, values in table.items():  # 0: text equality
        if "_is_" in key and all(v is True for v, r in zip(values, rows) if r.paid):
            name, value = key.split("_is_", 1)
            found.append(Atom(key, f"{name} is {value}", 0))
    for key, values in table.items():  # 1: thresholds between the paid cases and the nearest unpaid ones
        if "_is_" in key or not all(_numeric(v) for v in values):
            continue
        mine = [v for v, r in zip(values, rows) if r.paid]
        theirs = [v for v, r in zip(values, rows) if not r.paid]
        below = [v for v in theirs if v < min(mine)]
        above = [v for v in theirs if v > max(mine)]
        low = _between(max(below), min(mine)) if below else min(mine)
        high = -_between(-min(above), -max(mine)) if above else max(mine)
        found.append(Atom(f"{key} >= {_fmt(low)}", f"{key} is at least {_fmt(low)}", 1))
        found.append(Atom(f"{key} <= {_fmt(high)}", f"{key} is at most {_fmt(high)}", 1))
    for key, values in table.items():  # 2: divisibility, the largest divisor every paid case has
        ints = [v for v, r in zip(values, rows) if r.paid]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values) and all(v > 0 for v in ints):
            for d in sorted((d for d in DIVISORS if all(v % d == 0 for v in ints)), reverse=True):
                found.append(Atom(f"{key} % {d} == 0", f"{key} is a multiple of {d}", 2))
    return found


def _between(lo: float, hi: float) -> float:
    """A round threshold in (lo, hi]: the power of two nearest the geometric middle, else the middle with
    the fewest significant digits, else hi. Between the last unpaid and the first paid case nothing was
    measured; a round number near the middle reads as the rule it is and does not hug either case (a
    threshold at the first paid case would call that case unpaid whenever it is left out)."""
    middle = math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2
    if middle > 0:
        power = 2.0 ** round(math.log2(middle))
        if lo < power <= hi:
            return int(power) if power >= 1 else power
    for digits in range(1, 4):
        candidate = float(f"{middle:.{digits}g}")
        if lo < candidate <= hi:
            return int(candidate) if candidate.is_integer() else candidate
    return hi


def _holds(expression: str, row: CaseEffect) -> bool:
    try:
        return bool(expr.evaluate(expression, {**row.facts, **{n: False for n in expr.names(expression)
                                                               if "_is_" in n and n not in row.facts}}))
    except ExpressionError:
        return False


def search(rows: Sequence[CaseEffect]) -> Atom | None:
    """The simplest predicate (an atom, else two joined by `and`) true on every paid case and false on
    every unpaid one; None where there is none, or nothing to separate."""
    paid = {r.case for r in rows if r.paid}
    unpaid = {r.case for r in rows if not r.paid}
    if not paid or not unpaid:
        return None
    found = atoms(rows)
    truth = {a.expression: {r.case for r in rows if _holds(a.expression, r)} for a in found}
    viable = [a for a in sorted(found, key=lambda a: a.family) if paid <= truth[a.expression]]
    for atom in viable:
        if not truth[atom.expression] & unpaid:
            return atom
    for first, second in sorted(combinations(viable, 2), key=lambda p: p[0].family + p[1].family):
        if not truth[first.expression] & truth[second.expression] & unpaid:
            return Atom(f"{first.expression} and {second.expression}", f"{first.sentence} and {second.sentence}",
                        first.family + second.family)
    return None


def _left_out_guesses(rows: Sequence[CaseEffect]) -> list[bool]:
    """For each case, whether the search on all cases but it predicts it paid: the predicate found on the
    others, else the others' majority (ties: paid). A case measured on several kernels is left out with
    all its rows: its twin on another kernel would otherwise tell the search the answer."""
    searched: dict[str, tuple[Atom | None, bool]] = {}  # a case's rows share one search over the others
    guesses = []
    for left in rows:
        case = measured_case(left.case)
        if case not in searched:
            others = [r for r in rows if measured_case(r.case) != case]
            searched[case] = (search(others), 2 * sum(r.paid for r in others) >= len(others))
        atom, majority = searched[case]
        guesses.append(_holds(atom.expression, left) if atom is not None else majority)
    return guesses


def leave_one_out(rows: Sequence[CaseEffect], guesses: Sequence[bool] | None = None) -> float:
    """How often the search on all cases but one predicts whether the left-out case paid (`guesses`: the
    rows' `_left_out_guesses`, when already made)."""
    guesses = _left_out_guesses(rows) if guesses is None else guesses
    return sum(g == r.paid for g, r in zip(guesses, rows)) / len(rows) if rows else 0.0


def paid_recall(rows: Sequence[CaseEffect], guesses: Sequence[bool] | None = None) -> float:
    """Of the paid cases, the share the search on the others still predicts paid. Where few cases paid among
    many that did not, leave-one-case-out accuracy is high whatever the predicate says of the paid ones; a
    predicate that calls its own paid cases unpaid once each is left out was fitted to them."""
    guesses = _left_out_guesses(rows) if guesses is None else guesses
    kept = [g for g, r in zip(guesses, rows) if r.paid]
    return sum(kept) / len(kept) if kept else 0.0


def induce_when(rows: Sequence[CaseEffect], required: float = DEFAULT_REQUIRED_RATIO) -> When:
    """The card's *when* from its per-case effects (see the module's rules)."""
    rows = tuple(sorted(rows, key=lambda r: r.case))
    if len({r.case for r in rows}) != len(rows):
        raise DocumentError("induce_when", "one row per case: merge a case's steps first (`per_case`)")
    kind, sentence = _tally(rows, required)
    if kind is not WhenKind.MIXED:
        return When(kind, sentence, rows, required=required)
    decided = [r for r in rows if r.outcome is not Outcome.UNDECIDED]
    paid = sum(r.paid for r in decided)
    unpaid = len(decided) - paid
    atom = search(decided)
    guesses = _left_out_guesses(decided)  # each case left out once: both measures read the same searches
    loo, recall = leave_one_out(decided, guesses), paid_recall(decided, guesses)
    if atom is not None and paid >= MIN_SUPPORT and unpaid >= MIN_SUPPORT and loo >= MIN_LOO and recall >= MIN_RECALL:
        holds = tuple(r.case for r in decided if _holds(atom.expression, r))
        fails = tuple(r.case for r in decided if not _holds(atom.expression, r))
        sentence = (f"pays where {atom.sentence}: paid on all {len(holds)} decided case(s) where it holds, on none "
                    f"of the {len(fails)} where it does not (leave-one-case-out {loo:.2f})"
                    + _undecided_clause(rows, required))
        return When(WhenKind.PRECONDITION, sentence, rows,
                    Precondition(atom.expression, sentence, holds, fails, SOURCE, loo_accuracy=round(loo, 4)),
                    loo, required)
    why = ("no predicate over the facts every case shares separates them" if atom is None else
           f"'{atom.expression}' separates them but is not forced (support {paid} paid / {unpaid} not, "
           f"leave-one-case-out {loo:.2f}, paid cases kept {recall:.2f}; needs {MIN_SUPPORT} decided cases "
           f"each side, {MIN_LOO} and {MIN_RECALL})")
    return When(WhenKind.MIXED, f"{sentence}; {why}", rows, None, loo, required, (atom.expression,) if atom else ())


def _undecided_clause(rows: Sequence[CaseEffect], required: float) -> str:
    undecided = sum(r.outcome is Outcome.UNDECIDED for r in rows)
    return f"; {undecided} more reached {required}x by under {REPEATABILITY:.1%}, undecided" if undecided else ""


def _tally(rows: Sequence[CaseEffect], required: float) -> tuple[WhenKind, str]:
    """What the cases say before any search: the kind (MIXED where a predicate may separate them) and
    its sentence, every case counted by outcome."""
    n = len(rows)
    paid = sum(r.paid for r in rows)
    unpaid = sum(r.outcome is Outcome.DID_NOT_PAY for r in rows)
    undecided = n - paid - unpaid
    spread = f"{REPEATABILITY:.1%}"
    band = f"at {required}x but by under {spread}, the gate's run-to-run spread"
    if not rows:
        return WhenKind.UNMEASURED, "not timed on any case"
    if paid == n:
        return WhenKind.UNIFORM, f"paid on all {n} cases measured (each beyond {required}x by more than {spread})"
    if not paid:
        parts = [f"{unpaid} below {required}x"] * bool(unpaid) + [f"{undecided} {band}"] * bool(undecided)
        return WhenKind.NEVER, f"did not pay on any of the {n} cases measured ({'; '.join(parts)})"
    if not unpaid:  # nothing to separate: it reached the ratio everywhere, some cases by less than the spread
        return WhenKind.UNIFORM, (f"paid on all {paid} decided cases of {n} measured (each beyond {required}x by "
                                  f"more than {spread}); the other {undecided} reached {required}x by under {spread}, "
                                  f"the gate's run-to-run spread, and none fell below it")
    return WhenKind.MIXED, (f"paid on {paid} of {n} cases measured, did not pay on {unpaid}"
                            + (f", {undecided} undecided ({band})" if undecided else ""))


def per_case(effects: Sequence[tuple[str, float, Mapping[str, Any]]],
             required: float = DEFAULT_REQUIRED_RATIO) -> list[CaseEffect]:
    """One row per case from (case, ratio, facts) measurements, a case timed in several steps taking the
    median ratio and the facts they share (a fact that differs between its steps, such as registers, is
    left out for that case)."""
    grouped: dict[str, list[tuple[float, Mapping[str, Any]]]] = {}
    for case, ratio, facts in effects:
        grouped.setdefault(case, []).append((ratio, facts))
    rows = []
    for case, items in sorted(grouped.items()):
        ratio = statistics.median(r for r, _ in items)
        first = items[0][1]
        facts = {k: v for k, v in first.items() if all(f.get(k) == v for _, f in items[1:])}
        rows.append(CaseEffect(case, facts, ratio, outcome_of(ratio, required)))
    return rows


def timing_precondition(card: SkillCard) -> Precondition | None:
    """The card's timing precondition (where it was measured to pay), if induction wrote one."""
    return next((p for p in card.preconditions if p.source == SOURCE), None)


def card_when(card: SkillCard, required: float = DEFAULT_REQUIRED_RATIO) -> When:
    """A card's *when* as its document states it: its timing precondition where induction wrote one,
    else what its per-case effects show (uniform, never, or mixed with nothing forced). No search runs
    here: what was not written at induction was not forced."""
    rows = tuple(per_case([(f"{e.operator}:{e.case}", e.ratio, {}) for e in card.effects], required))
    timing = timing_precondition(card)
    if timing is not None:
        return When(WhenKind.PRECONDITION, timing.sentence, rows, timing, timing.loo_accuracy, required)
    kind, sentence = _tally(rows, required)
    if kind is WhenKind.MIXED:
        sentence += "; no predicate over the case facts was forced by them"
    return When(kind, sentence, rows, required=required)


def unpaid_when(card: SkillCard, required: float = DEFAULT_REQUIRED_RATIO) -> When | None:
    """The card's *when* where it keeps the card from being admitted, or None where the card may be
    admitted on its trials. A card timed per case (some step of it timed on more than one case) must say
    where it pays: a forced precondition, or paid on every case of at least MIN_WHEN_CASES. Paid on
    none, on some with nothing saying where, or on all of too few cases keeps it out. A card timed on
    its steps' headlines alone (a library built before per-case timing) cannot tell "never pays" from
    "not measured where it pays": its trials decide, as before."""
    steps = Counter((e.source.lineage, e.source.index) for e in card.effects)
    if not any(n > 1 for n in steps.values()):
        return None
    when = card_when(card, required)
    if when.kind is WhenKind.PRECONDITION or (when.kind is WhenKind.UNIFORM and len(when.paid) >= MIN_WHEN_CASES):
        return None
    if when.kind is WhenKind.UNIFORM:
        return replace(when, sentence=f"{when.sentence}; fewer than the {MIN_WHEN_CASES} cases that saying so needs")
    return when
