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

Facts (klineage.skills.facts, `case_facts`): the case's parameters (numbers; `<p>_is_<v>` for text, e.g. dtypes), what
the step's parent kernel's launch plan makes of them (`blocks` of its largest launch, `waves` = blocks /
SMs, `threads` a block, `dynamic_shared` bytes), what ptxas said of it (`registers`, `static_shared`,
`stack_bytes`, `spill_bytes`), the work the problem's roofline figures give the case (`megabytes`,
`intensity`, `bytes_per_thread`: `work_facts`), the rows its outputs are written in (`row_bytes`,
`row_align`: `layout_facts`) and what the kernel the step starts from is made of, from its SASS
(`barriers`, `shuffles`, `vector_load_share` ...: `kernel_facts`). A fact is searched where more than half of the cases
define it (a step timed on its headline alone has no ptxas facts); an atom fails where its fact is
missing (unknown fails). A card measured on several operators leaves their parameters out (induction's
`_when`): conv2d's N is a batch, GEMM's N a width, so GEMM and conv2d cases are compared by blocks,
waves, threads, shared memory, registers, spills, work and row layout alone.

Search (`search`): the predicate that calls fewest decided cases wrongly (paid where it fails, unpaid
where it holds), one atom, else two joined by `and` where that calls fewer wrongly. Atoms, in this
order of families: text equality (`dtype_is_float16`), thresholds (`waves >= 1`, `cols <= 4096`: a
round number between two neighbouring values, `_between`), divisibility (`cols % 4 == 0`; after
thresholds, since a few sizes share some divisor by chance, while an alignment rule shows where no
threshold does; of the case's sizes and row bytes only: a register count or a grid that divides by 3
says nothing). Ties go to a range of one fact over two facts, then to simpler families.
Measurements are noisy and kernels differ in ways no fact names, so a predicate may have exceptions;
what keeps one from being fitted to noise is the rules below, each checked on held-out cases.

What is written (`induce_when`), and why each rule:
- paid on every case: UNIFORM, "paid on all N cases measured", a result, not an empty field; never
  paid: NEVER ("did not pay on any of the N cases measured").
- a predicate is written only when the data forced it: at least MIN_SUPPORT cases on each side (true
  somewhere it paid, false somewhere it did not); at least MIN_PRECISION of the decided cases where it
  holds paid ("pays where ..." must be mostly true); and a leave-one-case-out accuracy of at least
  MIN_LOO and of at least the share of the commoner outcome: each case in turn is left out, the search
  re-run on the others (its thresholds placed between their values), and its prediction (the predicate
  found, where it reaches MIN_PRECISION on them, else the others' majority) compared with what was
  measured. A predicate that one case decides is noise fitted, not a precondition. Where the cases span
  several kernels, the same is measured with each kernel left out with all its cases
  (`kernel_loo_accuracy`: how the rule carries to a kernel never measured, what a user's kernel is), and
  a predicate naming a kernel fact must reach the same bar that way: such a fact is one value for all of
  a kernel's cases, so with cases left out it can name the kernels that paid without saying why. And since two paid
  cases among thirty unpaid ones give a high accuracy whatever is said of the two, the search without a
  paid case must still call it paid on at least MIN_RECALL of them (`paid_recall`). Its sentence counts
  the exceptions ("paid on 12 of the 13 decided cases where it holds, on 1 of the 20 where it does not").
- otherwise MIXED: "paid on k of N cases", with the best split and the measures it fell short on, so a
  reader sees how far from a rule the evidence is.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import numpy as np

from klineage import expr
from klineage.errors import DocumentError, ExpressionError
from klineage.skills.card import DEFAULT_REQUIRED_RATIO, KERNEL_MARK, Effect, Precondition, SkillCard, measured_case
from klineage.skills.facts import KERNEL_FACTS, MEASURED_FACTS
from klineage.skills.predicates import DIVISORS

MIN_SUPPORT = 2  # decided cases on each side of a written predicate
# How far one paired ratio moves between fresh gates of the same pair: 20 of them, each a new runner,
# the first right after the machine started, spread from -1.1% to +1.5% of their median
# (bench/results/timing_fidelity.json, H200).
REPEATABILITY = 0.015
MIN_LOO = 0.8  # leave-one-case-out accuracy a written predicate reaches
MIN_RECALL = 0.5  # share of its paid cases it still predicts paid when each is left out (`paid_recall`)
MIN_PRECISION = 0.8  # share of the decided cases where a written predicate holds on which the step paid
BEAM = 200  # atoms missing fewest paid cases, paired with one another
MIN_WHEN_CASES = 8  # distinct cases a card must have paid on before "paid on all N cases" admits it
SAME_CODE = "same_code"  # a card's diagnostic: steps whose child runs its parent's machine code, timing noise alone
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


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.3g}"
    return str(value)


@dataclass(frozen=True)
class _Facts:
    """The rows' facts as columns: numbers (NaN where a row lacks the fact) and text equalities (false
    where a row lacks the parameter). Only facts more than half of the rows define: a step timed on its
    headline alone has no ptxas facts, while a fact most rows lack tells which operator or kernel a row
    is rather than what its case asks. An atom over a fact a row lacks fails there (unknown fails)."""

    numbers: dict[str, np.ndarray]
    texts: dict[str, np.ndarray]

    @classmethod
    def of(cls, rows: Sequence[CaseEffect]) -> _Facts:
        counts = Counter(k for r in rows for k, v in r.facts.items() if "_is_" not in k and _numeric(v))
        numbers = {k: np.array([float(r.facts[k]) if _numeric(r.facts.get(k)) else np.nan for r in rows])
                   for k, n in sorted(counts.items()) if 2 * n > len(rows)}
        params = Counter(p for r in rows for p in {k.split("_is_")[0] for k in r.facts if "_is_" in k})
        texts = {k: np.array([r.facts.get(k) is True for r in rows])
                 for k in sorted({k for r in rows for k in r.facts if "_is_" in k})
                 if 2 * params[k.split("_is_")[0]] > len(rows)}
        return cls(numbers, texts)


def _cut(lo: float, hi: float) -> tuple[str, str]:
    """Thresholds between two neighbouring values, as written: `>= a` true from `hi` up and `<= b` true
    from `lo` down, each a round number between them (`_between`) where its written form stays there."""
    def written(value: float, inside: Callable[[float], bool]) -> str:
        for text in (_fmt(value), f"{value:.6g}", repr(float(value))):
            if inside(float(text)):
                return text
        return repr(float(value))

    at_least, at_most = _between(lo, hi), -_between(-hi, -lo)
    if float(lo).is_integer() and float(hi).is_integer():  # counts: "barriers <= 1", not "<= 1.5"
        at_least, at_most = math.ceil(at_least), math.floor(at_most)
    return (written(at_least, lambda t: lo < t <= hi), written(at_most, lambda t: lo <= t < hi))


def _candidates(facts: _Facts, train: np.ndarray) -> tuple[list[Atom], np.ndarray]:
    """Every atom over the facts, formed from the `train` rows' values, with the rows (all of them) it
    holds on, simplest first: text equalities, then a threshold between each two neighbouring values of a
    number, then divisibility. Of atoms that hold on the same rows only the first is kept; one that holds
    on every training row or on none says nothing of them."""
    found: list[tuple[Atom, np.ndarray]] = []
    for key, column in facts.texts.items():  # 0: text equality
        name, value = key.split("_is_", 1)
        found.append((Atom(key, f"{name} is {value}", 0), column))
    with np.errstate(invalid="ignore"):
        for key, column in facts.numbers.items():  # 1: thresholds between neighbouring values
            steps = np.unique(column[train & ~np.isnan(column)])
            for lo, hi in zip(steps, steps[1:]):
                low, high = _cut(float(lo), float(hi))
                found.append((Atom(f"{key} >= {low}", f"{key} is at least {low}", 1), column >= float(low)))
                found.append((Atom(f"{key} <= {high}", f"{key} is at most {high}", 1), column <= float(high)))
        for key, column in facts.numbers.items():  # 2: divisibility, of sizes alone
            if key in MEASURED_FACTS:
                continue
            defined = column[~np.isnan(column)]
            if defined.size and np.all(defined > 0) and np.all(defined == np.round(defined)):
                for d in sorted(DIVISORS, reverse=True):
                    found.append((Atom(f"{key} % {d} == 0", f"{key} is a multiple of {d}", 2),
                                  ~np.isnan(column) & (np.fmod(column, d) == 0)))
    atoms_: list[Atom] = []
    masks: list[np.ndarray] = []
    seen: set[bytes] = set()
    for atom, mask in found:
        key = np.packbits(mask).tobytes()
        if key not in seen and (mask & train).any() and (~mask & train).any():
            seen.add(key)
            atoms_.append(atom)
            masks.append(mask)
    return atoms_, np.array(masks, dtype=bool).reshape(len(masks), len(train))


def _between(lo: float, hi: float) -> float:
    """A round threshold in (lo, hi]: the power of two nearest the geometric middle (the upper one where
    the middle sits halfway, as it does between two powers of two: "row_align >= 32", not ">= 20"), else
    the middle with the fewest significant digits, else hi. Between the last unpaid and the first paid case nothing was
    measured; a round number near the middle reads as the rule it is and does not hug either case (a
    threshold at the first paid case would call that case unpaid whenever it is left out)."""
    middle = math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2
    if middle > 0:
        power = 2.0 ** math.floor(math.log2(middle) + 0.5)
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


def _best(atoms_: Sequence[Atom], masks: np.ndarray, paid: np.ndarray,
          unpaid: np.ndarray) -> tuple[Atom, np.ndarray] | None:
    """The predicate calling fewest of the `paid` and `unpaid` cases wrongly (paid where it fails, unpaid
    where it holds): one atom, else two joined by `and` where that calls fewer wrongly; ties go to a range
    of one fact over two facts, then to the simpler families, then to the earlier atoms. Pairs are formed
    among the BEAM atoms that miss fewest paid cases (a conjunction only narrows). Only a predicate true on
    some paid case and false on some unpaid one is a candidate; None without one."""
    if not paid.any() or not unpaid.any() or not len(atoms_):
        return None
    errors = (~masks & paid).sum(1) + (masks & unpaid).sum(1)
    useful = np.flatnonzero((masks & paid).any(1) & (~masks & unpaid).any(1))
    if not useful.size:
        return None
    families = np.array([a.family for a in atoms_])
    one = useful[np.lexsort((useful, families[useful], errors[useful]))[0]]
    best, least = (atoms_[one], masks[one]), errors[one]
    missed = (~masks[useful] & paid).sum(1)
    wrong = (masks[useful] & unpaid).sum(1)
    beam = useful[np.lexsort((useful, wrong, missed))[:BEAM]]
    both = masks[beam][:, None, :] & masks[beam][None, :, :]
    pair_errors = (~both & paid).sum(2) + (both & unpaid).sum(2)
    upper = np.triu(np.ones((len(beam), len(beam)), dtype=bool), 1) & (both & paid).any(2)
    i, j = np.nonzero(upper & (pair_errors < least))
    if i.size:
        # a range of one fact reads simpler than two facts joined; then the simpler families, then the earlier atoms
        facts = np.array([atoms_[k].expression.split()[0] for k in beam])
        order = np.lexsort((beam[j], beam[i], families[beam[i]] + families[beam[j]], facts[i] != facts[j],
                            pair_errors[i, j]))
        i, j = i[order[0]], j[order[0]]
        first, second = (atoms_[k] for k in sorted((beam[i], beam[j])))
        best = (Atom(f"{first.expression} and {second.expression}", f"{first.sentence} and {second.sentence}",
                     first.family + second.family), both[i, j])
    return best


def search(rows: Sequence[CaseEffect]) -> Atom | None:
    """The predicate over the rows' facts that calls fewest of their cases wrongly (`_best`); None where
    there is nothing to separate or no atom to separate it with."""
    paid = np.array([r.paid for r in rows], dtype=bool)
    everyone = np.ones(len(rows), dtype=bool)
    found = _best(*_candidates(_Facts.of(rows), everyone), paid, ~paid)
    return found[0] if found else None


def measured_kernel(key: str) -> str:
    """The kernel a row was measured on: its operator, and the kernel a card timed on several adds."""
    operator = key.split(":", 1)[0]
    return operator + (KERNEL_MARK + key.split(KERNEL_MARK, 1)[1] if KERNEL_MARK in key else "")


def _left_out_guesses(rows: Sequence[CaseEffect], fold: Callable[[str], str] = measured_case) -> list[bool]:
    """For each fold of rows (`fold`: a row's case key -> its fold), whether the search on all other rows
    predicts each of its rows paid: the predicate found on the others (its thresholds placed between their
    values), else the others' majority (ties: paid). By case (the default), a case measured on several
    kernels is left out with all its rows: its twin on another kernel would otherwise tell the search the
    answer. By kernel (`measured_kernel`), a kernel is left out with all its cases: what a kernel fact
    claims is that it tells a kernel never measured apart, and only a kernel left out can show that."""
    facts = _Facts.of(rows)
    paid = np.array([r.paid for r in rows], dtype=bool)
    folds = [fold(r.case) for r in rows]
    guesses: dict[str, np.ndarray | bool] = {}  # a fold's rows share one search over the others
    for key in dict.fromkeys(folds):
        keep = np.array([f != key for f in folds])
        found = _best(*_candidates(facts, keep), paid & keep, ~paid & keep)
        if found is not None and (found[1] & paid & keep).sum() >= MIN_PRECISION * (found[1] & keep).sum():
            guesses[key] = found[1]
        else:  # what induction would not write predicts nothing: the majority does
            guesses[key] = bool(2 * (paid & keep).sum() >= keep.sum()) if keep.any() else False
    return [bool(g[i]) if isinstance(g := guesses[key], np.ndarray) else g for i, key in enumerate(folds)]


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
    """The card's *when* from its per-case effects (see the module's rules). Where the best predicate
    names a kernel fact and is not written, the search runs again without kernel facts: a kernel fact
    that told the measured kernels apart but failed with each left out must not hide a case rule."""
    rows = tuple(sorted(rows, key=lambda r: r.case))
    if len({r.case for r in rows}) != len(rows):
        raise DocumentError("induce_when", "one row per case: merge a case's steps first (`per_case`)")
    kind, sentence = _tally(rows, required)
    if kind is not WhenKind.MIXED:
        return When(kind, sentence, rows, required=required)
    when = _judge(rows, sentence, required)
    if when.kind is WhenKind.PRECONDITION or not when.candidates or \
            not KERNEL_FACTS & expr.names(when.candidates[0]):
        return when
    plain = tuple(replace(r, facts={k: v for k, v in r.facts.items() if k not in KERNEL_FACTS}) for r in rows)
    again = _judge(plain, sentence, required)
    return replace(again, cases=rows, candidates=(*when.candidates, *again.candidates))


def _judge(rows: tuple[CaseEffect, ...], sentence: str, required: float) -> When:
    """The best predicate over the rows' decided cases, written where it meets every rule of the module.
    Where the cases span several kernels it is also judged with each kernel left out, and a predicate
    naming a kernel fact must meet the accuracy and recall rules that way too: a kernel fact is the same
    on every case of a kernel, so leaving cases out cannot show it is more than a name for the kernels
    that paid."""
    decided = [r for r in rows if r.outcome is not Outcome.UNDECIDED]
    atom = search(decided)
    guesses = _left_out_guesses(decided)  # each case left out once: both measures read the same searches
    loo, recall = leave_one_out(decided, guesses), paid_recall(decided, guesses)
    if atom is None:
        return When(WhenKind.MIXED, f"{sentence}; no predicate over the facts the cases share separates them",
                    rows, None, loo, required)
    split = _Split.of(atom, decided)
    majority = max(split.paid, split.unpaid) / len(decided)
    measures, kernel_loo, enough = f"leave-one-case-out {loo:.2f}", None, loo >= max(MIN_LOO, majority)
    kernels = len({measured_kernel(r.case) for r in decided})
    if kernels > 1:
        by_kernel = _left_out_guesses(decided, measured_kernel)
        kernel_loo = leave_one_out(decided, by_kernel)
        measures += f", leave-one-kernel-out {kernel_loo:.2f} over {kernels} kernels"
        if KERNEL_FACTS & expr.names(atom.expression):
            enough = enough and kernel_loo >= max(MIN_LOO, majority) and paid_recall(decided, by_kernel) >= MIN_RECALL
    if (split.paid_held >= MIN_SUPPORT and split.unpaid_failed >= MIN_SUPPORT and split.precision >= MIN_PRECISION
            and enough and recall >= MIN_RECALL):
        sentence = (f"pays where {atom.sentence}: {split.tally()} ({measures}; always saying the commoner outcome "
                    f"scores {majority:.2f})" + _undecided_clause(rows, required))
        return When(WhenKind.PRECONDITION, sentence, rows,
                    Precondition(atom.expression, sentence, split.holds, split.fails, SOURCE,
                                 loo_accuracy=round(loo, 4),
                                 kernel_loo_accuracy=None if kernel_loo is None else round(kernel_loo, 4)),
                    loo, required)
    why = (f"the best split, '{atom.expression}', is not forced ({split.tally()}; {measures} "
           f"against {majority:.2f} for always saying the commoner outcome, paid cases kept {recall:.2f}; it needs "
           f"{MIN_SUPPORT} decided cases each side, {MIN_PRECISION:.0%} paid where it holds, {MIN_LOO} and "
           f"{MIN_RECALL}, with each kernel left out too where it names a kernel fact)")
    return When(WhenKind.MIXED, f"{sentence}; {why}", rows, None, loo, required, (atom.expression,))


@dataclass(frozen=True)
class _Split:
    """How a predicate divides the decided cases: where it holds and where it fails, and which paid."""

    holds: tuple[str, ...]
    fails: tuple[str, ...]
    paid_held: int
    paid_failed: int

    @classmethod
    def of(cls, atom: Atom, decided: Sequence[CaseEffect]) -> _Split:
        held = [r for r in decided if _holds(atom.expression, r)]
        failed = [r for r in decided if not _holds(atom.expression, r)]
        return cls(tuple(r.case for r in held), tuple(r.case for r in failed),
                   sum(r.paid for r in held), sum(r.paid for r in failed))

    @property
    def paid(self) -> int:
        return self.paid_held + self.paid_failed

    @property
    def unpaid(self) -> int:
        return len(self.holds) + len(self.fails) - self.paid

    @property
    def unpaid_failed(self) -> int:
        return len(self.fails) - self.paid_failed

    @property
    def precision(self) -> float:
        return self.paid_held / len(self.holds) if self.holds else 0.0

    def tally(self) -> str:
        """"paid on all 4 decided case(s) where it holds, on none of the 9 where it does not", with the
        exceptions counted where there are any."""
        held = (f"paid on all {len(self.holds)} decided case(s) where it holds" if self.paid_held == len(self.holds)
                else f"paid on {self.paid_held} of the {len(self.holds)} decided cases where it holds")
        failed = (f"on none of the {len(self.fails)} where it does not" if not self.paid_failed
                  else f"on {self.paid_failed} of the {len(self.fails)} where it does not")
        return f"{held}, {failed}"


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
    return _timing(card.preconditions)


def _timing(preconditions: Sequence[Precondition]) -> Precondition | None:
    return next((p for p in preconditions if p.source == SOURCE), None)


def ruled_out(effects: Sequence[Effect], preconditions: Sequence[Precondition]) -> list[bool]:
    """Per effect, whether the card's timing precondition fails on its case (the case keyed as induction
    keyed it, `kernel_rows`): where an optimization would not apply the card. A case it says nothing
    about is not ruled out."""
    timing = _timing(preconditions)
    if timing is None:
        return [False] * len(effects)
    return [timing.holds_on(key) is False for key, _ in kernel_rows(effects)]


def kernel_rows(effects: Sequence[Effect]) -> list[tuple[str, Effect]]:
    """Effects keyed as induction's rows: "operator:case", or "operator:case@kernel" where they time that
    operator on several kernels (a lineage id starts with its expert's name)."""
    def kernel(effect: Effect) -> str:
        return effect.source.lineage.split(KERNEL_MARK, 1)[0]

    kernels: dict[str, set[str]] = {}
    for effect in effects:
        kernels.setdefault(effect.operator, set()).add(kernel(effect))
    return [(f"{e.operator}:{e.case}" + (f"{KERNEL_MARK}{kernel(e)}" if len(kernels[e.operator]) > 1 else ""), e)
            for e in effects]


def card_when(card: SkillCard, required: float = DEFAULT_REQUIRED_RATIO) -> When:
    """A card's *when* as its document states it: its timing precondition where induction wrote one,
    else what its per-case effects show (uniform, never, or mixed with nothing forced). No search runs
    here: what was not written at induction was not forced."""
    timing = timing_precondition(card)
    if timing is not None:  # its rows as induction had them, one a kernel where a case was timed on several
        rows = tuple(per_case([(key, e.ratio, {}) for key, e in kernel_rows(card.effects)], required))
        return When(WhenKind.PRECONDITION, timing.sentence, rows, timing, timing.loo_accuracy, required)
    rows = tuple(per_case([(f"{e.operator}:{e.case}", e.ratio, {}) for e in card.effects], required))
    kind, sentence = _tally(rows, required)
    if kind is WhenKind.MIXED:
        sentence += "; no predicate over the case facts was forced by them"
    if kind is WhenKind.UNMEASURED and any(d.category == SAME_CODE for d in card.diagnostics):
        sentence = "not timed: every step it came from ran its parent's machine code, so nothing of it was measured"
    return When(kind, sentence, rows, required=required)


def when_label(when: When) -> str:
    """A card's *when* in a few words, for a list: its timing precondition, or how many cases paid."""
    decided = [c for c in when.cases if c.outcome is not Outcome.UNDECIDED]
    n = len(when.cases)
    cases = f"{n} case{'s' if n != 1 else ''}"
    if when.kind is WhenKind.PRECONDITION:
        return f"where {when.precondition.expression}"
    if when.kind is WhenKind.UNIFORM:
        return f"paid on all {cases}" if len(decided) == n else f"paid on all {len(decided)} decided of {cases}"
    if when.kind is WhenKind.NEVER:
        return f"paid on none of {cases}"
    if when.kind is WhenKind.MIXED:
        return f"paid on {len(when.paid)} of {cases}, nothing forced says where"
    return "not timed on any case"


def carries(card: SkillCard) -> bool:
    """Whether the card's timing precondition is shown to carry to a kernel it was not induced on: its
    leave-one-kernel-out accuracy reaches MIN_LOO and beats always saying the commoner outcome of its
    decided cases. One measured on a single kernel, or whose rule the other kernels do not place where
    a left-out kernel needs it, speaks of the kernels measured alone."""
    timing = timing_precondition(card)
    if timing is None or timing.kernel_loo_accuracy is None:
        return False
    decided = [r for r in card_when(card).cases if r.outcome is not Outcome.UNDECIDED]
    paid = sum(r.paid for r in decided)
    majority = max(paid, len(decided) - paid) / len(decided) if decided else 0.0
    return timing.kernel_loo_accuracy >= max(MIN_LOO, majority)


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
