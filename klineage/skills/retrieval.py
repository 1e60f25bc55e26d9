"""Retrieval: which skill cards fit a kernel and its problem, best first.

A card is a candidate for a state when its status is one asked for, its `requires` are present
among the state's features, what it `provides` is not all there already, none of its
`conflicts` is present, each of its soundness preconditions holds on every case of the problem (a
predicate over names a case does not define fails: unknown fails), and its timing precondition (where
it was measured to pay, klineage.skills.when) holds on the problem's headline, valued with the state's
launch plan; one that fails there is skipped and reported (`PreconditionFailed`), on the kernels it
was measured on, or anywhere where it carries to kernels left out (`decides_on`); one the target cannot
value (registers before a compile) is undecided and skips nothing. Features are named by role,
as induction names them (`kernel`, `device`, `<file>`): a kernel's own function names do not
travel. A card that provides nothing visible at role level (its step added the mechanism at one
more site of a function that already had it, e.g. one more `__restrict__` parameter) is kept
only where its transform finds a forward site in the state, or, given the lineages, where it
applies at one of its evidence's anchors.

Ranking: by gain tier first, then by score. The tier compares the median paired ratio of the
card's effects with DEFAULT_REQUIRED_RATIO (1.01x, what the optimize loop needs to take a step):
- gaining: measured, >= 1.01x;
- untimed: no effects (compile-only or dry lineages): gain unknown, so after measured gains and
  before measured no-gains;
- neutral: measured, < 1.01x (noise or slower). It cannot make a paired improvement on its own,
  yet by score alone a same-operator one (operator term 10) outranks another operator's 11x card
  (gain term <= 1) and spends the loop's gate evaluations; it is ranked last, not dropped, since
  the loop's pair lookahead may still combine it with another card.
Within a tier, one score with the terms in this order of weight:
1. operator similarity: the problem's operator among the card's (1), else a dtype shared with
   the card's scope (1/2), else 0;
2. shape proximity: 1 / (1 + |log2(target size / nearest source size)|), sizes being the
   roofline's minimum bytes of the problem's headline and of the card's timed cases (or the
   source problem's headline), known when `problems` holds the card's source problem; else 0;
3. measured gain: log2 of the median paired ratio of the card's effects (1.0 when untimed),
   clamped to [-1, 1].
Within a tier, where several statuses are asked for, verified cards come first: admitted, then candidates,
imported, retired (STATUS_ORDER), so a run that also retrieves candidates spends its gate evaluations on
what a held-out trial confirmed before what none has yet. Ties go by card id, so the order is
deterministic: the sort key is (tier, status, -score, id).

Source features only: a plain kernel state has no SASS until it is compiled, so a card whose
requires name a SASS-only feature is not retrieved here.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum

from klineage.errors import DocumentError, ExpressionError
from klineage.features.feature import Feature
from klineage.features.source import FILE_LOCUS, source_features
from klineage.kernel import KernelState
from klineage.lineage import Lineage
from klineage.problem import ProblemInfo
from klineage.skills.card import DEFAULT_REQUIRED_RATIO, CardStatus, SkillCard
from klineage.skills.induction import DEVICE_ROLE, KERNEL_ROLE
from klineage.skills.materialize import card_sites, evidence_anchors, materialize
from klineage.skills.predicates import case_facts
from klineage.specialize import specialized
from klineage.transforms import catalog, refusals

OPERATOR_WEIGHT = 10.0
SHAPE_WEIGHT = 2.0
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


@dataclass(frozen=True)
class Match:
    card: SkillCard
    score: float
    reasons: tuple[str, ...]  # readable, e.g. "requires present", "same operator", "measured gain 1.12x"

    def __post_init__(self) -> None:
        if not isinstance(self.card, SkillCard):
            raise DocumentError("match.card", f"must be a SkillCard, not {self.card!r}")
        if not math.isfinite(self.score):
            raise DocumentError("match.score", f"must be finite, not {self.score!r}")
        object.__setattr__(self, "reasons", tuple(self.reasons))

    def to_dict(self) -> dict:
        return {"card": self.card.id, "score": self.score, "reasons": list(self.reasons)}


def state_features(state: KernelState) -> frozenset[Feature]:
    """The state's source features at card roles: `kernel` for a `__global__` function, `<file>`
    for file scope, `device` for any other function."""
    found = source_features(state.source)
    kernels = {f.locus for f in found if f.name == "global_fn"}

    def role(locus: str) -> str:
        return FILE_LOCUS if locus == FILE_LOCUS else KERNEL_ROLE if locus in kernels else DEVICE_ROLE

    return frozenset(Feature(role(f.locus), f.name) for f in found)


def _dtypes(problem: ProblemInfo) -> set[str]:
    found = {o.dtype for o in problem.outputs if o.dtype in DTYPES}
    for case in problem.cases:
        found |= {v for k, v in case.params.items() if k.endswith("dtype") and isinstance(v, str)}
    return found


def _facts(params: Mapping, names: set[str]) -> dict:
    """A case's facts, with `<p>_is_<v>` false for every other value of a text parameter `p`."""
    facts = case_facts(params)
    texts = [k for k, v in params.items() if isinstance(v, str)]
    for name in names:
        if name not in facts and any(re.fullmatch(re.escape(k) + r"_is_\w+", name) for k in texts):
            facts[name] = False
    return facts


@dataclass(frozen=True)
class PreconditionFailed:
    """A card's timing precondition false on the case a target is judged on: where the card was measured
    not to pay (klineage.skills.when), so a gate evaluation of it there would be spent for nothing."""

    card: str
    expression: str
    case: str
    facts: dict

    def __str__(self) -> str:
        shown = ", ".join(f"{k} = {v}" for k, v in sorted(self.facts.items()))
        return (f"precondition_failed: card {self.card[:12]} pays where {self.expression}, which fails on case "
                f"{self.case} ({shown})")


def timing_failure(card: SkillCard, problem: ProblemInfo, state: KernelState | None = None,
                   case: str = "") -> PreconditionFailed | None:
    """The card's timing precondition on the target's case (`case`, else the problem's headline: what the
    optimize loop times), valued with the case's parameters and what `state`'s launch plan makes of them.
    A predicate naming a fact the target does not give (registers, before it is compiled) is undecided, and
    an undecided one skips nothing: it says where the card pays, not whether it is sound, and the gate
    measures anyway."""
    from klineage.skills.facts import case_facts, launch_facts, layout_facts, work_facts
    from klineage.skills.when import SOURCE

    timing = [p for p in card.preconditions if p.source == SOURCE]
    if not timing:
        return None
    name = case or problem.headline
    params = dict(problem.case(name).params)
    launch = launch_facts(state, params) if state is not None else {}
    shared = {**work_facts(problem.roofline.get(name), launch), **layout_facts(problem.outputs, params)}
    facts = {**case_facts(params, launch), **shared}
    for precondition in timing:
        try:
            holds = precondition.check({**_facts(params, precondition.names), **launch, **shared})
        except ExpressionError:
            continue
        if not holds:
            return PreconditionFailed(card.id, precondition.expression, name,
                                      {n: facts[n] for n in sorted(precondition.names) if n in facts})
    return None


def decides_on(card: SkillCard, state: KernelState, lineages: Mapping[str, Lineage] | None) -> bool:
    """Whether the card's timing precondition may skip it on `state`: anywhere where the rule is shown to
    carry to kernels left out (`when.carries`), else on the kernels it was measured on alone (a state of a
    walk behind its effects, given the lineages). On any other kernel, a rule the measured kernels do not
    carry to one another says nothing of it: the gate measures the card there."""
    from klineage.skills.when import carries

    if carries(card):
        return True
    walks = {e.source.lineage for e in card.effects}
    return bool(lineages) and any(state.fingerprint == s.fingerprint for w in walks if w in lineages
                                  for s in lineages[w].states)


def precondition_failure(card: SkillCard, problem: ProblemInfo, state: KernelState | None = None,
                         case: str = "", timing: bool = True) -> str:
    """'' when every soundness precondition holds on every case and (with `timing`) the timing ones on
    the target's case (`timing_failure`), else why not."""
    for precondition in card.preconditions:
        if precondition.source == "timing":
            continue
        for case_ in problem.cases:
            case_name = case_.name
            try:
                holds = precondition.check(_facts(case_.params, precondition.names))
            except ExpressionError as exc:
                return f"precondition {precondition.expression!r} cannot be decided on case {case_name}: {exc}"
            if not holds:
                return f"precondition {precondition.expression!r} fails on case {case_name}"
    failed = timing_failure(card, problem, state, case) if timing else None
    return str(failed) if failed else ""


def size_of(problem: ProblemInfo, case: str) -> float | None:
    """The case's size: the roofline's minimum bytes (None when the problem does not say)."""
    value = problem.roofline.get(case, {}).get("bytes")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _proximity(card: SkillCard, problem: ProblemInfo, problems: Mapping[str, ProblemInfo]) -> tuple[float, str]:
    target = size_of(problem, problem.headline)
    sources = []
    for operator in card.scope.operators:
        known = problems.get(operator)
        if known is None:
            continue
        cases = [e.case for e in card.effects if e.operator == operator] or [known.headline]
        sources += [s for s in (size_of(known, c) for c in cases) if s]
    if target is None or not sources:
        return 0.0, ""
    nearest = min(sources, key=lambda s: abs(math.log2(target / s)))
    distance = abs(math.log2(target / nearest))
    return 1.0 / (1.0 + distance), f"headline {target / nearest:.2g}x the size of the nearest source case"


def _gain(card: SkillCard) -> float:
    return statistics.median(e.ratio for e in card.effects) if card.effects else 1.0


class Tier(IntEnum):
    """A card's gain tier, best first: retrieval sorts by it before the score."""

    GAINING = 0  # measured, median effect ratio >= DEFAULT_REQUIRED_RATIO
    UNTIMED = 1  # no effects: gain unknown
    NEUTRAL = 2  # measured, median effect ratio < DEFAULT_REQUIRED_RATIO: a stepping stone at best


def gain_tier(card: SkillCard) -> tuple[Tier, str]:
    """The card's tier and a readable reason for it."""
    if not card.effects:
        return Tier.UNTIMED, "untimed"
    gain = _gain(card)
    if gain >= DEFAULT_REQUIRED_RATIO:
        return Tier.GAINING, f"measured gain {gain:.2f}x"
    if gain > 1.0 / DEFAULT_REQUIRED_RATIO:
        return Tier.NEUTRAL, f"within noise: {gain:.3f}x, a stepping stone"
    return Tier.NEUTRAL, f"measured slower: {gain:.3f}x, a stepping stone"


STATUS_ORDER = (CardStatus.ADMITTED, CardStatus.CANDIDATE, CardStatus.IMPORTED, CardStatus.RETIRED)


class Fit(str, Enum):
    """What retrieval makes of a card on a target, in the order it decides."""

    PROPOSED = "proposed"  # retrieved: its mechanism is offered here, in rank order
    STATUS = "status"  # not of a status asked for
    UNFIT = "unfit"  # a require missing, a conflict present, or a soundness precondition failing on a case
    NOT_PAYING = "precondition_failed"  # its timing precondition fails on the case timed, and decides here
    PRESENT = "present"  # what it provides is there already
    NO_SITE = "no_site"  # provides nothing visible, and its transform finds no site here


@dataclass(frozen=True)
class Assessment:
    """One card's fit on a target: `match` and `tier` where PROPOSED, else `why` it is not."""

    card: SkillCard
    fit: Fit
    why: str = ""
    match: Match | None = None
    tier: Tier | None = None
    failed: PreconditionFailed | None = None  # the timing precondition's failure, where NOT_PAYING
    sites: int = 0  # forward sites its transform finds in the target, where PROPOSED (0: none found here)
    # with `assess(every_case=True)`, the problem's cases its timing precondition fails on (where it was measured
    # not to pay), where PROPOSED or NOT_PAYING: retrieval judges on the headline, a user's sizes may be others
    fails_on: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.fit, Fit):
            raise DocumentError("assessment.fit", f"must be a Fit, not {self.fit!r}")
        if (self.match is not None) != (self.fit is Fit.PROPOSED):
            raise DocumentError("assessment.match", "a proposed card has a match, and only it")

    def to_dict(self) -> dict:
        """What a report lists of it, the card's *when* in words among it."""
        from klineage.skills.when import card_when, when_label

        return {"card": self.card.id, "transform": self.card.transform, "status": self.card.status.value,
                "fit": self.fit.value, "why": self.why, "sites": self.sites, "when": when_label(card_when(self.card)),
                "fails_on": list(self.fails_on), "reasons": list(self.match.reasons) if self.match else []}


def assess(state: KernelState, problem: ProblemInfo, cards: Sequence[SkillCard], *,
           statuses: tuple[CardStatus, ...] = (CardStatus.ADMITTED,),
           problems: Mapping[str, ProblemInfo] | None = None,
           lineages: Mapping[str, Lineage] | None = None, every_case: bool = False) -> list[Assessment]:
    """Every card's fit on `state` and `problem` (see the module's rules), the proposed ones best first, then
    the others in the library's order: what `retrieve` offers, and why each other card is not offered.
    `every_case`: also judge each card's timing precondition on every case of the problem (`fails_on`), for a
    report; the optimize loop, which retrieves every round, judges on the headline alone. A kernel template is read
    as the instance its plan launches, as the planner reads it (`klineage.specialize`)."""
    state = specialized(state).state
    present = state_features(state)
    known = catalog()  # a card of a transform outside the catalog has no mechanical forward sites
    mine = _dtypes(problem)
    found = [_assess(card, state, problem, present, known, mine, statuses, problems or {}, lineages, every_case)
             for card in cards]
    proposed = sorted((a for a in found if a.fit is Fit.PROPOSED),
                      key=lambda a: (a.tier, STATUS_ORDER.index(a.card.status), -a.match.score, a.card.id))
    return proposed + [a for a in found if a.fit is not Fit.PROPOSED]


def _assess(card: SkillCard, state: KernelState, problem: ProblemInfo, present: frozenset[Feature],
            known: Mapping, mine: set[str], statuses: tuple[CardStatus, ...],
            problems: Mapping[str, ProblemInfo], lineages: Mapping[str, Lineage] | None,
            every_case: bool) -> Assessment:
    if card.status not in statuses:
        return Assessment(card, Fit.STATUS, f"{card.status.value}, not among {', '.join(s.value for s in statuses)}")
    unfit = unfit_reason(card, present, problem)
    if unfit:
        return Assessment(card, Fit.UNFIT, unfit)
    failed = timing_failure(card, problem, state)
    fails_on = tuple(c.name for c in problem.cases if (failed if c.name == problem.headline else
                                                       timing_failure(card, problem, state, c.name)) is not None
                     ) if every_case else ()
    if failed is not None and decides_on(card, state, lineages):  # measured not to pay on the case timed
        return Assessment(card, Fit.NOT_PAYING, str(failed), failed=failed, fails_on=fails_on)
    if card.provides and card.provides <= present:
        shown = ", ".join(sorted(map(str, card.provides)))
        return Assessment(card, Fit.PRESENT, f"what it provides is here already: {shown}")
    transform = known.get(card.transform)
    with refusals() as refused:  # why its forwards read no site here: a spelling they do not read, or a misfit
        sites = card_sites(card, state) if transform is not None else []
    unread = f" (not read as a site: {'; '.join(refused)})" if refused and not sites else ""
    if not card.provides and not sites and not (lineages and _anchored(card, state, lineages)):
        return Assessment(card, Fit.NO_SITE, f"its transform {card.transform} finds no site here{unread}" if transform
                          else f"{card.transform} is not in the catalog: no forward site")
    reasons = ["requires present" if card.requires else "requires nothing"]
    new = sorted(map(str, card.provides - present))
    reasons.append(f"adds {', '.join(new)}" if new else f"adds its mechanism at {len(sites)} more site(s)")
    if card.preconditions:
        reasons.append(f"preconditions hold on all {len(problem.cases)} cases")
    if failed is not None:
        reasons.append(f"its timing precondition fails on {failed.case}, but is not shown to carry to this kernel")
    if problem.operator in card.scope.operators:
        similarity, why = 1.0, f"same operator ({problem.operator})"
    elif mine & set(card.scope.dtypes):
        similarity, why = 0.5, f"same dtype family ({', '.join(sorted(mine & set(card.scope.dtypes)))})"
    else:
        similarity, why = 0.0, f"other operator ({', '.join(card.scope.operators)})"
    reasons.append(why)
    proximity, shape = _proximity(card, problem, problems)
    if shape:
        reasons.append(shape)
    tier, why = gain_tier(card)
    reasons.append(why)
    if sites:
        reasons.append(f"{len(sites)} forward site(s)")
    elif unread:
        reasons.append(f"no forward site{unread}: tried at its walks' anchors")
    gain = max(-1.0, min(1.0, math.log2(_gain(card))))
    score = OPERATOR_WEIGHT * similarity + SHAPE_WEIGHT * proximity + gain
    return Assessment(card, Fit.PROPOSED, match=Match(card, score, tuple(reasons)), tier=tier, sites=len(sites),
                      fails_on=fails_on)


def retrieve(state: KernelState, problem: ProblemInfo, cards: Sequence[SkillCard], *, limit: int = 10,
             statuses: tuple[CardStatus, ...] = (CardStatus.ADMITTED,),
             problems: Mapping[str, ProblemInfo] | None = None,
             lineages: Mapping[str, Lineage] | None = None,
             skipped: list[PreconditionFailed] | None = None) -> list[Match]:
    """The cards that fit `state` on `problem`, best first, at most `limit` (`assess`'s proposed ones).
    `problems` (operator -> ProblemInfo) lets shape proximity compare with the cards' source problems;
    `lineages` (lineage id -> lineage) lend a card that provides nothing visible the sites of its
    evidence's anchors too (a file-scope padding constant is no site a finder places afresh). A card
    whose timing precondition fails on the problem's headline (`timing_failure`) is left out, and added
    to `skipped`."""
    if limit < 0:
        raise DocumentError("retrieve.limit", f"must be >= 0, not {limit}")
    found = assess(state, problem, cards, statuses=statuses, problems=problems, lineages=lineages)
    if skipped is not None:
        skipped.extend(a.failed for a in found if a.fit is Fit.NOT_PAYING)
    return [a.match for a in found if a.fit is Fit.PROPOSED][:limit]


def fits(card: SkillCard, present: frozenset[Feature] | set[Feature], problem: ProblemInfo) -> bool:
    """Whether the card may go where `present` are the features (`unfit_reason` says nothing against it)."""
    return not unfit_reason(card, present, problem)


def unfit_reason(card: SkillCard, present: frozenset[Feature] | set[Feature], problem: ProblemInfo) -> str:
    """'' where the card may go where `present` are the features: its requires are there, none of its
    conflicts is, and its soundness preconditions hold on every case of the problem (where it pays is
    `timing_failure`'s: a card that does not pay alone may within its walk's path); else why not."""
    missing = sorted(map(str, card.requires - set(present)))
    if missing:
        return f"requires {', '.join(missing)}, not here"
    clashing = sorted(map(str, card.conflicts & set(present)))
    if clashing:
        return f"conflicts with {', '.join(clashing)}, here"
    return precondition_failure(card, problem, timing=False)


def _anchored(card: SkillCard, state: KernelState, lineages: Mapping[str, Lineage]) -> bool:
    """Whether the card's forward applies at one of its evidence's anchors in `state`."""
    return bool(materialize(card, state, evidence_anchors(card, lineages, state)))
