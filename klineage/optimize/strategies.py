"""Where an optimization's candidates come from: one planner per strategy, the same harness for all.

Every strategy answers the same question at the current best kernel: which forward rewrites to
gate next, in which order. The loop (`klineage.optimize.loop`) gates them under one budget, so
the strategies differ only here:

- LIBRARY: the library's cards, ranked by retrieval (`klineage.skills.retrieval.retrieve`: the
  card's requires/provides/conflicts, preconditions and scope against this kernel and problem; a card
  whose timing precondition fails on the headline is offered first as `precondition_failed` kernels,
  recorded and never gated),
  each materialized at every site its transform's forward can take, and at the anchors of the
  card's source transitions (with several sites, first at all of them at once; a card that is
  one mechanism with others, taken apart site by site by the walk, first together with them);
  where that gives nothing, the transitions' forward diffs are replayed (`klineage.skills.replay`);
  or by the LLM rewriter. Before the single cards, the cards of each walk of the operator as
  one path, in that walk's forward order, each where it fits the state the cards before it leave
  (the paths of retrieval).
- LIBRARY_THEN_CATALOG: the LIBRARY strategy's candidates first, then the unconditioned pool in the
  catalog's order (first improvement), leaving out any kernel a card already gated or kept out by its
  timing precondition, and putting last the kernels cards passed over: the library decides what is
  tried first, and a kernel none of its cards fits still gets the catalog's analysis forwards with the
  budget the cards leave.
- GENERATED_ONLY: the same cards stripped of what the lineages taught (anchor site and snippet,
  preconditions, risks), retrieved and materialized at the transforms' own sites only (no anchors
  to place or diffs to replay): the paper's ablation.
- UNCONDITIONED_RANDOM: every catalog transform that has a mechanical forward, at every forward
  site, in one seeded random order; no cards, preconditions or ordering.
- UNCONDITIONED_GREEDY: the same pool in the catalog's order, but each round gates every
  candidate and takes the fastest (steepest ascent) instead of the first improvement.
- NO_LIBRARY: the rewriter alone (the LLM asked for one optimization of its choice); the rule
  rewriter has no forward plan without cards, so it refuses this strategy.

How a library strategy orders a round (`Ordering`, kept in the run's document): AS_PLANNED is the order
above. MEASURED (the default) puts after the rest of the round what is measured to pay less than a step,
in two tiers: first what the library measured on other kernels (a catalog forward of a mechanism every
measured card of which fell short of a step, `mechanism_short_of`; a kernel of an admitted card whose trials
today's admission rule no longer admits it on, `short_of_todays_rule`; then the kernels cards passed over, as
planned), and last what this run measured on this operator (a transform at a site it gated at an earlier
best kernel without taking it, `RunMemory`): the operator's own measurement outranks the walks' evidence.
Nothing is left out: with budget left, the round still reaches them. On bmm_small (H100, budget 8) the
cards re-proposed `__launch_bounds__` after the tile, measured 0.999x on the naive kernel of the same run,
and the catalog's padding removal (cards: 1.003x and 1.01x) came before the register blocking the
unconditioned searches took: 1.58x where they reached 4.02x.

A planner yields `Candidate`s lazily: with the LLM rewriter each one costs a model call, and the
loop stops asking once the gate budget is spent.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from klineage.documents import choice
from klineage.errors import DocumentError, KLineageError
from klineage.kernel import KernelState
from klineage.lineage import Lineage
from klineage.problem import ProblemInfo
from klineage.rewriters.rules import ordered
from klineage.skills.admission_rule import short_of_todays_rule
from klineage.skills.card import CardAnchor, CardStatus, SkillCard
from klineage.specialize import specialized
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform

MAX_ASKS_PER_ROUND = 8  # NO_LIBRARY: model answers per best kernel before the round counts as tried out
RIVALS = 3  # first improvement: candidates it would rule out, gated beside it before it is taken (loop's Rivals)


class Strategy(str, Enum):
    LIBRARY = "library"
    LIBRARY_THEN_CATALOG = "library_then_catalog"
    UNCONDITIONED_RANDOM = "unconditioned_random"
    UNCONDITIONED_GREEDY = "unconditioned_greedy"
    GENERATED_ONLY = "generated_only"
    NO_LIBRARY = "no_library"

    @property
    def uses_library(self) -> bool:
        return self in (Strategy.LIBRARY, Strategy.LIBRARY_THEN_CATALOG, Strategy.GENERATED_ONLY)

    @property
    def lends_walks(self) -> bool:
        """Its cards keep what the lineages taught: their walks' anchors, paths and measured effects."""
        return self in LIBRARY_STRATEGIES

    @property
    def selection(self) -> Selection:
        return Selection.BEST_OF_ROUND if self is Strategy.UNCONDITIONED_GREEDY else Selection.FIRST_IMPROVEMENT

    @classmethod
    def parse(cls, value: Any) -> Strategy:
        return choice(cls, value, "strategy")


# What `klineage optimize` and the dashboard run unless told otherwise: the cards first, then the catalog with
# the budget they leave. On kernels no walk has seen the cards alone often stop after their first step ("no card
# applies": 8 of the 12 held-out operators of bench/transfer), where the catalog's analysis forwards go on (a
# register row cache after a card's warp reduction).
DEFAULT_STRATEGY = Strategy.LIBRARY_THEN_CATALOG

# The strategies that are the library as a user runs it, and the searches without cards it is held against.
LIBRARY_STRATEGIES = (Strategy.LIBRARY, Strategy.LIBRARY_THEN_CATALOG)
UNCONDITIONED = (Strategy.UNCONDITIONED_RANDOM, Strategy.UNCONDITIONED_GREEDY)


class Ordering(str, Enum):
    """How a library strategy orders a round's candidates (module docstring)."""

    AS_PLANNED = "as_planned"  # the planner's order; every run written before orderings existed
    MEASURED = "measured"  # what this run or the library measured paying less than a step after the rest

    @classmethod
    def parse(cls, value: Any) -> Ordering:
        return choice(cls, value, "ordering")


DEFAULT_ORDERING = Ordering.MEASURED


class RunMemory:
    """The sites a run gated without taking them, for the rounds after (`Ordering.MEASURED`). The loop tells it
    what each gated attempt came to and when a step is taken; a site counts only once its round has ended in a
    step, so the lookahead's composites on this round's stepping stones are not put last by this round's own
    refusals."""

    def __init__(self) -> None:
        self._earlier: dict[tuple[str, Anchor | None], str] = {}
        self._this_round: dict[tuple[str, Anchor | None], str] = {}

    def unpaid(self, transform: str, anchor: Anchor | None, what: str) -> None:
        """This round gated `transform` at `anchor` and did not take it (`what` says how it came out)."""
        self._this_round.setdefault((transform, anchor), what)

    def stepped(self) -> None:
        for site, what in self._this_round.items():
            self._earlier.setdefault(site, what)  # the first measurement of a site is the one told
        self._this_round.clear()

    def measured(self, candidate: Candidate) -> str:
        """Why the run's own measurements put the candidate last, or ''."""
        what = self._earlier.get((candidate.transform, candidate.anchor), "")
        return f"{candidate.transform} at {candidate.anchor} was {what} at an earlier best kernel of this run" \
            if what else ""


class Selection(str, Enum):
    """How a round at one best kernel ends."""

    FIRST_IMPROVEMENT = "first_improvement"  # take the first candidate the paired test accepts
    BEST_OF_ROUND = "best_of_round"  # gate every candidate, take the fastest accepted one


class RewriterKind(str, Enum):
    RULES = "rules"  # the catalog's mechanical forward rewrites
    LLM = "llm"  # the LLM rewriter applies a card's (or transform's) intent to the kernel

    @classmethod
    def parse(cls, value: Any) -> RewriterKind:
        return choice(cls, value, "rewriter")


LLM_ANY = "llm"  # the transform a NO_LIBRARY candidate names before the model has named one


@dataclass(frozen=True)
class Candidate:
    """One forward rewrite to gate, or the reason there is none (not both)."""

    transform: str
    card: str = ""  # the card's id; "" when the candidate comes from no card
    anchor: Anchor | None = None
    rewrite: Rewrite | None = None
    reason: str = ""
    score: float | None = None  # the retrieval score, for card candidates
    passed_over: str = ""  # why a candidate kernel is not worth a gate call (`short_of`); only with a rewrite
    precondition_failed: str = ""  # its card's timing precondition fails here (retrieval.timing_failure); likewise
    put_last: str = ""  # why `Ordering.MEASURED` put it after the rest of its round, for the attempt's record
    instance: str = ""  # the template instance its kernel was written from (`planner`), for the attempt's record

    def __post_init__(self) -> None:
        if not self.transform:
            raise DocumentError("candidate", "needs a transform name")
        if (self.rewrite is None) == (not self.reason):
            raise DocumentError("candidate", "carries either a rewrite or the reason there is none")
        if self.not_gated and self.rewrite is None:
            raise DocumentError("candidate", "only a candidate kernel can be passed over")
        if self.rewrite is not None:
            if self.rewrite.direction is not Direction.FORWARD:
                raise DocumentError("candidate", "an optimization candidate is a forward rewrite")
            if self.anchor is None:
                object.__setattr__(self, "anchor", self.rewrite.anchor)

    @property
    def state(self) -> KernelState | None:
        return self.rewrite.state if self.rewrite is not None else None

    @property
    def not_gated(self) -> str:
        """Why this candidate kernel costs no gate evaluation, or ''."""
        return self.precondition_failed or self.passed_over

    def __str__(self) -> str:
        where = f" at {self.anchor}" if self.anchor else ""
        origin = f" (card {self.card[:12]})" if self.card else ""
        return f"{self.transform}{where}{origin}"


Planner = Callable[[KernelState], Iterator[Candidate]]


def strip(card: SkillCard) -> SkillCard:
    """The card without what the lineages taught about where and when: the anchor's site and
    snippet (its kind stays: a card needs one, and it is the transform's, not the lineage's),
    preconditions and risks. Identity (transform, provides, scope) is unchanged."""
    return replace(card, anchor=CardAnchor(card.anchor.kind), preconditions=(), risks=())


def card_brief(card: SkillCard) -> dict[str, Any]:
    """What the LLM rewriter is shown of a card; fields a card does not have are left out, so a
    stripped card shows no anchor site, preconditions or risks."""
    anchor = {k: v for k, v in card.anchor.to_dict().items() if v}
    brief: dict[str, Any] = {"skill_id": card.short_id, "transform": card.transform, "intent": card.intent,
                             "anchor": anchor, "vector": card.vector, "carrier": card.carrier,
                             "preconditions": [f"{p.sentence} ({p.expression})" for p in card.preconditions],
                             "risks": [f"{r.category}: {r.description}" for r in card.risks],
                             "requires": sorted(map(str, card.requires)), "provides": sorted(map(str, card.provides)),
                             "conflicts": sorted(map(str, card.conflicts))}
    return {k: v for k, v in brief.items() if v not in ("", [], {})}


def forward_pool(transforms: Sequence[Transform]) -> list[Transform]:
    """The unconditioned pool: mechanisms with a mechanical forward, in the catalog's walk order."""
    return [t for t in ordered(transforms) if t.role is Role.MECHANISM and t.has_forward]


def planner(strategy: Strategy, rewriter: RewriterKind, **options: Any) -> Planner:
    """The candidate source of a strategy (`_strategy_planner` names the options), reading a kernel template as the
    instance its plan launches (`klineage.specialize`): the forwards recognise types and sizes by their spelling,
    so each candidate of a template is a forward of that instance, and says so (`Candidate.instance`)."""
    plan = _strategy_planner(strategy, rewriter, **options)

    def on_instances(state: KernelState) -> Iterator[Candidate]:
        written = specialized(state)
        for candidate in plan(written.state):
            yield replace(candidate, instance=written.note) if candidate.rewrite is not None else candidate

    return on_instances


def _strategy_planner(strategy: Strategy, rewriter: RewriterKind, *, cards: Sequence[SkillCard],
                      problem: ProblemInfo | None, statuses: Sequence[CardStatus], transforms: Sequence[Transform],
                      seed: int, llm: Any = None, lineages: Mapping[str, Lineage] | None = None,
                      required_ratio: float | None = None, ordering: Ordering = Ordering.AS_PLANNED,
                      memory: RunMemory | None = None) -> Planner:
    """The candidate source of a strategy. `llm` is the LLM rewriter when `rewriter` is LLM.
    `lineages` (lineage id -> lineage) lend the LIBRARY strategy the anchors of its cards' source
    transitions; stripped cards (GENERATED_ONLY) have no anchors to lend. With `required_ratio`, the
    LIBRARY strategy under the rule rewriter passes over the kernels of a card alone whose
    measurements fall short of it (`short_of`); the LLM rewriter is asked for every card. `ordering`
    MEASURED (library strategies, rule rewriter: the LLM's candidates are model calls, never read ahead)
    reads what `memory` has seen of this run, and the cards' measurements against `required_ratio`."""
    if rewriter is RewriterKind.LLM and llm is None:
        raise KLineageError("the llm rewriter was chosen but none was given")
    if strategy.uses_library:
        pool = [strip(c) for c in cards] if strategy is Strategy.GENERATED_ONLY else list(cards)
        if problem is None:
            raise KLineageError(f"strategy {strategy.value} needs the problem's description for retrieval")
        lent = lineages if strategy.lends_walks and lineages else {}
        least = required_ratio if strategy.lends_walks else None
        cards_plan = _cards(pool, problem, tuple(statuses), rewriter, llm, lent, least)
        if ordering is not Ordering.MEASURED or rewriter is not RewriterKind.RULES:
            place: Placing = _as_planned
        else:
            place = _measured_last(pool, memory or RunMemory(), required_ratio)
        if strategy is Strategy.LIBRARY_THEN_CATALOG:
            return _then(cards_plan, _unconditioned(forward_pool(transforms), rewriter, llm, None), place)
        return _then(cards_plan, lambda state: iter(()), place)
    if strategy is Strategy.NO_LIBRARY:
        if rewriter is RewriterKind.RULES:
            raise KLineageError("strategy no_library is the rewriter alone, and the rule rewriter has no forward "
                                "plan without cards: use --rewriter llm, or unconditioned_random / "
                                "unconditioned_greedy for the rule catalog")
        return _rewriter_alone(llm)
    pool = forward_pool(transforms)
    if strategy is Strategy.UNCONDITIONED_RANDOM:
        return _unconditioned(pool, rewriter, llm, random.Random(seed))
    return _unconditioned(pool, rewriter, llm, None)


def short_of(card: SkillCard, required_ratio: float | None) -> str:
    """Why the card alone is not worth a gate call: it has measurements, and none of them would have
    been taken as a step (an effect: its median and every trial at `required_ratio`; a passed
    admission trial: its ratio). '' when one would, or nothing was measured (unknown: the gate
    decides). Its paths and its whole mechanism are still tried: a card may pay among the others."""
    if required_ratio is None:
        return ""
    effects, trials = _measurements(card)
    if not effects + trials or max(effects + trials) >= required_ratio:
        return ""
    return (f"card {card.short_id} alone: none of its {len(effects)} measured effect(s) and {len(trials)} passed "
            f"trial(s) reached the {required_ratio:g}x a step needs (best {max(effects + trials):.3f}x); it is "
            f"tried within paths and its whole mechanism")


def mechanism_short_of(transform: str, cards: Sequence[SkillCard], required_ratio: float | None) -> str:
    """Why the library expects `transform` to pay less than a step: some card of it was measured, and no card's
    measurement reached `required_ratio`. '' otherwise (cards never measured are no evidence either way)."""
    if required_ratio is None:
        return ""
    measured = [sum(_measurements(card), []) for card in cards if card.transform == transform]
    values = [v for each in measured for v in each]
    if not values or max(values) >= required_ratio:
        return ""
    return (f"no measurement of the library's {len([m for m in measured if m])} measured {transform} card(s) "
            f"reached the {required_ratio:g}x a step needs (best {max(values):.3f}x)")


def _measurements(card: SkillCard) -> tuple[list[float], list[float]]:
    """The card's effects (each its worst of median and trials) and its passed admission trials' ratios."""
    return ([min(e.ratio, *e.per_trial) for e in card.effects],
            [t.ratio for t in card.verification_log if t.passed and t.ratio is not None])


def _cards(cards: list[SkillCard], problem: ProblemInfo, statuses: tuple[CardStatus, ...], rewriter: RewriterKind,
           llm: Any, lineages: Mapping[str, Lineage], least: float | None) -> Planner:
    from klineage.skills.materialize import evidence_anchors, materialize
    from klineage.skills.replay import replay
    from klineage.skills.retrieval import retrieve

    offered_paths: set[str] = set()  # the card sets of paths offered so far: each once a run

    def plan(state: KernelState) -> Iterator[Candidate]:
        skipped: list = []
        matches = retrieve(state, problem, cards, limit=max(1, len(cards)), statuses=statuses, lineages=lineages,
                           skipped=skipped)
        found = _skipped_rewrites(skipped, cards, state, lineages)  # materialized once for both uses below
        yield from _failed(found)  # first: recorded whatever the budget leaves
        if rewriter is RewriterKind.RULES:
            yield from _paths(cards, state, problem, statuses, lineages, offered_paths)
        joined: set[str] = set()  # cards already offered as part of a whole mechanism
        for match in matches:
            card = match.card
            if rewriter is RewriterKind.LLM:
                yield _asked(llm, state, card_brief(card), card.transform, card.id, match.score)
                continue
            try:
                whole = _whole(card, [m.card for m in matches], state, lineages, joined)
                # A mechanical forward at the transform's sites and the evidence's anchors; where it
                # gives nothing, the recorded forward diffs replayed (vector replay).
                anchors = evidence_anchors(card, lineages, state)
                rewrites = materialize(card, state, anchors) or replay(card, state, lineages)
            except Exception as exc:  # a broken transform is evidence against the card, not the end of the run
                yield Candidate(card.transform, card.id, reason=f"materializing failed: {type(exc).__name__}: {exc}",
                                score=match.score)
                continue
            if not rewrites:
                yield Candidate(card.transform, card.id, reason=f"{card.transform} has no forward site in this kernel",
                                score=match.score)
            if whole is not None:
                yield Candidate(card.transform, card.id, whole.anchor, whole, score=match.score)
            everywhere = _everywhere(card, state, rewrites, anchors)
            short = short_of(card, least)
            for rewrite in [r for r in (everywhere,) if r is not None] + rewrites:
                yield Candidate(card.transform, card.id, rewrite.anchor, rewrite, score=match.score, passed_over=short)
        if rewriter is RewriterKind.RULES:
            yield from _lent(found)

    return plan


def _skipped_rewrites(skipped: Sequence[Any], cards: Sequence[SkillCard], state: KernelState,
                      lineages: Mapping[str, Lineage]) -> list[tuple[SkillCard, Any, Rewrite]]:
    """(card, its failed precondition, rewrite) for every site of every card retrieval skipped."""
    from klineage.skills.materialize import evidence_anchors, materialize

    by_id = {card.id: card for card in cards}
    found = []
    for failed in skipped:
        card = by_id[failed.card]
        try:
            rewrites = materialize(card, state, evidence_anchors(card, lineages, state))
        except Exception:  # noqa: BLE001 - a card that does not materialize would not have been gated either
            continue
        found += [(card, failed, rewrite) for rewrite in rewrites]
    return found


def skipped_candidates(skipped: Sequence[Any], cards: Sequence[SkillCard], state: KernelState,
                       lineages: Mapping[str, Lineage]) -> Iterator[Candidate]:
    """The kernels of the cards retrieval skipped for a failed timing precondition, at their own transform's
    sites, each recorded as `precondition_failed` and never gated: every one is a gate evaluation the
    precondition saved. Sites another transform lends the card are `_lent`'s."""
    return _failed(_skipped_rewrites(skipped, cards, state, lineages))


def _failed(found: list[tuple[SkillCard, Any, Rewrite]]) -> Iterator[Candidate]:
    for card, failed, rewrite in found:
        if rewrite.transform == card.transform:
            yield Candidate(card.transform, card.id, rewrite.anchor, rewrite, precondition_failed=str(failed))


def _lent(found: list[tuple[SkillCard, Any, Rewrite]]) -> Iterator[Candidate]:
    """The kernels of skipped cards at sites another transform's analysis lends them
    (`materialize.structural_transforms`), gated after the retrieved cards': a timing precondition was
    induced from the launch facts of the kernels the card's own transform rewrote, and a lent site is a
    kernel of another shape (a thread per row, where the evidence had a block per row), whose blocks or
    waves say nothing about it."""
    for card, _failed_precondition, rewrite in found:
        if rewrite.transform != card.transform:
            yield Candidate(card.transform, card.id, rewrite.anchor, rewrite)


def _paths(cards: Sequence[SkillCard], state: KernelState, problem: ProblemInfo, statuses: tuple[CardStatus, ...],
           lineages: Mapping[str, Lineage], offered: set[str]) -> Iterator[Candidate]:
    """Before single cards, the cards of each walk of this operator (of the other operators' walks
    for an operator no walk covers) as one path (`materialize.lineage_paths`), in that walk's
    forward order, each card applied where it fits the state the cards before it leave
    (`retrieval.fits`: a vectorized load has no site until `__ldg` is back) and applies, the others
    passed over: a mechanism measured slower alone (a pipeline, a swizzle without the rest) may pay
    among the others, and a whole path costs one gate evaluation. A path of two or more cards, each card set
    once a run (a rejected path is not
    offered again from the next best kernel)."""
    from klineage.skills.materialize import apply_together, lineage_paths
    from klineage.skills.retrieval import fits, state_features

    allowed = [card for card in cards if card.status in statuses]
    for name, path in lineage_paths(allowed, lineages, problem.operator, state):
        current, used, anchors = state, [], []
        try:
            for card in path:
                applied = (apply_together([card], current, lineages)
                           if fits(card, state_features(current), problem) else None)
                if applied is not None:
                    current, used, anchors = applied.state, used + [card], anchors + list(applied.anchors)
        except Exception as exc:  # a broken transform is evidence against a card, not the end of the run
            yield Candidate(path[0].transform, path[0].id, reason=f"the path of {name} failed: "
                                                                 f"{type(exc).__name__}: {exc}")
            continue
        key = "+".join(card.id for card in used)
        if len(used) < 2 or key in offered:
            continue
        offered.add(key)
        rewrite = Rewrite("+".join(card.transform for card in used), Direction.FORWARD, anchors[0], current,
                          note=f"a path of {len(used)} cards of {name} in its forward order: "
                               + ", ".join(card.short_id for card in used))
        yield Candidate(rewrite.transform, used[0].id, rewrite.anchor, rewrite)


def _whole(card: SkillCard, retrieved: Sequence[SkillCard], state: KernelState, lineages: Mapping[str, Lineage],
           joined: set[str]) -> Rewrite | None:
    """The card with the retrieved cards it is one mechanism with (`materialize.one_mechanism`:
    the walk took the mechanism apart site by site), all applied at once, before any of them alone:
    cp.async's copy alone races and its commit and wait alone do nothing, and the loop's pairs
    cannot reach past a rejected first half. Offered once per mechanism; None when the card is a
    mechanism alone, or when one of its cards does not apply here."""
    from klineage.skills.materialize import apply_together, one_mechanism

    if card.id in joined:
        return None
    group = one_mechanism(card, retrieved, lineages)
    if not group:
        return None
    joined.update(c.id for c in group)
    applied = apply_together(group, state, lineages)
    if applied is None:
        return None
    return Rewrite(card.transform, Direction.FORWARD, applied.anchors[0], applied.state,
                   note=f"one mechanism of cards {', '.join(c.short_id for c in group)}, at "
                        f"{len(applied.anchors)} sites: " + ", ".join(map(str, applied.anchors)))


def _everywhere(card: SkillCard, state: KernelState, rewrites: Sequence[Rewrite],
                anchors: Sequence[Anchor]) -> Rewrite | None:
    """With several sites, the card applied at all of them as one candidate, tried before the single
    sites: a mechanism spread over sites may pay only whole (cp.async needs its commit and its wait),
    and the loop's pairs chain only two steps. None with one site, or when it is one of `rewrites`."""
    from klineage.skills.materialize import apply_everywhere

    if len(rewrites) < 2:
        return None
    applied = apply_everywhere(card, state, anchors)
    if applied is None or len(applied.anchors) < 2 or applied.state.fingerprint in {r.state.fingerprint
                                                                                    for r in rewrites}:
        return None
    return Rewrite(card.transform, Direction.FORWARD, applied.anchors[0], applied.state,
                   removes=tuple(dict.fromkeys(f for r in rewrites for f in r.removes)),
                   adds=tuple(dict.fromkeys(f for r in rewrites for f in r.adds)),
                   note=f"at all {len(applied.anchors)} sites: " + ", ".join(map(str, applied.anchors)))


class Tier(int, Enum):
    """Where `Ordering.MEASURED` puts a candidate kernel in its round."""

    FRESH = 0  # nothing measured says it pays less than a step
    LIBRARY = 1  # the library measured it short of a step on other kernels: its mechanism, or its card
    THIS_RUN = 2  # this run gated it at this site at an earlier best kernel and did not take it


Placing = Callable[[Candidate], tuple[Tier, str]]  # a candidate's tier and, behind FRESH, why


def _measured_last(cards: Sequence[SkillCard], memory: RunMemory, required_ratio: float | None) -> Placing:
    # the cards do not change during a run: each mechanism's verdict once, not at every candidate of every round
    short = {t: mechanism_short_of(t, cards, required_ratio) for t in {card.transform for card in cards}}
    # an admitted card whose trials today's admission rule no longer admits it on: nothing it was tried on showed
    # its gain, so its kernels wait behind those nothing measured short, as a mechanism measured short does
    doubted = {card.id: why for card in cards if (why := short_of_todays_rule(card))}

    def place(candidate: Candidate) -> tuple[Tier, str]:
        if candidate.rewrite is None or candidate.not_gated:
            return Tier.FRESH, ""  # costs no gate call: nothing to gain by moving it
        refused = memory.measured(candidate)
        if refused:
            return Tier.THIS_RUN, refused
        # a mechanism no card names, or a card no trial doubts: unknown, not short
        why = short.get(candidate.transform, "") or doubted.get(candidate.card, "")
        return (Tier.LIBRARY, why) if why else (Tier.FRESH, "")

    return place


def _as_planned(candidate: Candidate) -> tuple[Tier, str]:
    return Tier.FRESH, ""


def _then(first: Planner, after: Planner, place: Placing = _as_planned) -> Planner:
    """`first`'s candidates, then `after`'s whose kernel `first` has not gated at this state (a catalog forward
    that rebuilds a card's kernel would cost a second gate call for one kernel). A kernel `first` passed over
    (its card alone never reached a step's ratio where it was measured: `short_of`) is still `after`'s to gate,
    last of all: that evidence comes from other kernels (the read-only path paid nothing on the walks' kernels
    and 9.8% filling l2_normalize's row cache), so the cards put it behind everything else rather than out of
    a search with budget left. A kernel whose card's timing precondition fails here stays out: that is this
    problem's own cases saying it does not pay. `place` (`Ordering.MEASURED`) moves candidates of both behind the
    fresh ones by their tier, each carrying why: the library's tier before the kernels passed over, this run's
    after them."""

    def plan(state: KernelState) -> Iterator[Candidate]:
        kept_out: set[str] = set()
        passed_over: set[str] = set()
        later: dict[Tier, list[Candidate]] = {Tier.LIBRARY: [], Tier.THIS_RUN: []}
        behind = []

        def placed(candidate: Candidate) -> Iterator[Candidate]:
            tier, why = place(candidate)
            if tier is Tier.FRESH:
                yield candidate
            else:
                later[tier].append(replace(candidate, put_last=why))

        for candidate in first(state):
            if candidate.state is not None:
                (passed_over if candidate.passed_over else kept_out).add(candidate.state.fingerprint)
            yield from placed(candidate)
        for candidate in after(state):
            fingerprint = candidate.state.fingerprint if candidate.state is not None else None
            if fingerprint in passed_over - kept_out:
                behind.append(candidate)
            elif fingerprint not in kept_out:
                yield from placed(candidate)
        yield from later[Tier.LIBRARY]
        yield from behind
        yield from later[Tier.THIS_RUN]

    return plan


def _unconditioned(pool: list[Transform], rewriter: RewriterKind, llm: Any, order: random.Random | None) -> Planner:
    from klineage.skills.materialize import forward_sites

    def plan(state: KernelState) -> Iterator[Candidate]:
        if rewriter is RewriterKind.LLM:
            chosen = list(pool)
            if order is not None:
                order.shuffle(chosen)
            for transform in chosen:
                yield _asked(llm, state, {"transform": transform.name, "intent": transform.intent}, transform.name)
            return
        pairs: list[tuple[Transform, Anchor | None, str]] = []
        for transform in pool:
            try:
                pairs += [(transform, anchor, "") for anchor in forward_sites(transform, state)]
            except Exception as exc:
                pairs.append((transform, None, f"{transform.name}: finding forward sites failed: "
                                               f"{type(exc).__name__}: {exc}"))
        if order is not None:
            order.shuffle(pairs)
        for transform, anchor, error in pairs:
            if error:
                yield Candidate(transform.name, reason=error)
                continue
            try:
                yield Candidate(transform.name, anchor=anchor, rewrite=transform.forward(state, anchor))
            except NotApplicable as exc:
                yield Candidate(transform.name, anchor=anchor, reason=str(exc) or "not applicable")
            except Exception as exc:
                yield Candidate(transform.name, anchor=anchor,
                                reason=f"{transform.name}.forward failed: {type(exc).__name__}: {exc}")

    return plan


def _rewriter_alone(llm: Any) -> Planner:
    ask = {"intent": "Make this kernel faster with exactly one optimization mechanism of your choice, "
                     "keeping it correct for every case it supports."}

    def plan(state: KernelState) -> Iterator[Candidate]:
        for _ in range(MAX_ASKS_PER_ROUND):
            yield _asked(llm, state, ask, LLM_ANY)

    return plan


def _asked(llm: Any, state: KernelState, card_like: dict[str, Any], transform: str, card: str = "",
           score: float | None = None) -> Candidate:
    """One LLM materialization as a candidate; BudgetExhausted propagates (the loop stops on it)."""
    done = llm.materialize(state, card_like)
    name = getattr(done, "transform", "") or transform
    if done.rewrite is None:
        return Candidate(name, card, reason=f"the LLM rewriter gave no kernel: {done.reason}", score=score)
    return Candidate(name, card, done.anchor, done.rewrite, score=score)


__all__ = ["Candidate", "DEFAULT_ORDERING", "DEFAULT_STRATEGY", "LIBRARY_STRATEGIES", "LLM_ANY", "MAX_ASKS_PER_ROUND",
           "Ordering", "Planner", "RIVALS", "RewriterKind", "RunMemory", "Selection", "Strategy", "Tier",
           "UNCONDITIONED", "card_brief", "forward_pool", "mechanism_short_of", "planner", "strip"]
