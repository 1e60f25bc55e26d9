"""Admitting a library card by card (`klineage library admit`), so that a run cut short keeps
every decision it made.

After each card whose trials were recorded the library is written whole (`save`; the CLI writes
atomically): a timeout may kill the run at any moment, and the file then holds every card
trialled before it. Run again on that file, admission resumes. A card is *already decided* when,
for each target it would be trialled on now (its first `limit` held-out targets), its log holds a
trial of that target on the basis it would have now (`admission.trial_basis`: gate mode, GPU,
policy, problem file, the card's content, the kernel the card makes of the target), and one of
those trials passed or failed. Anything else is trialled again, because then the evidence is not
known to be the same: a trial logged without a basis, a changed or added target, another gate,
GPU or policy, an edited card or problem, a transform that now makes another kernel, or only
inconclusive trials. `redo` trials every chosen card.

`deadline` (a `clock` reading) bounds the run for a wrapper's timeout: no card starts once the
clock passes it, nor when it would end past it, judged by the longest card's trials so far plus,
for a card that opens a window of side-by-side correctness checks, the last window's time (a
card's trials are written only when they are all done). Cards not started are reported `left
undecided`; cards with no held-out target or already decided cost no gate and are reported as
such even then.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from klineage import config
from klineage.config import GateMode
from klineage.errors import KLineageError
from klineage.gate import execute
from klineage.gate.pipeline import Progress, default_cache, run_gate
from klineage.gate.policy import Placement
from klineage.gate.prefetch import prefetch
from klineage.gate.verdict import Verdict
from klineage.kernel import KernelState
from klineage.problem import ProblemInfo
from klineage.skills.admission import (
    DEFAULT_LIMIT,
    Gate,
    GateSetting,
    MeasurementKey,
    Target,
    admit,
    applied_to,
    measured_as,
    required_ratio,
    trial_basis,
    trial_policy,
    when_allows,
)
from klineage.skills.card import SkillCard, Trial
from klineage.skills.library import Library
from klineage.skills.trial_reading import TrialOutcome, trial_outcome
from klineage.skills.when import unpaid_when
from klineage.walk.walker import DEFAULT_POLICY

# The walk's correctness gate (every case x 3 seeds, sanitizers on a pass) plus paired timing
# against the target; no vendor timing, which admission never reads.
POLICY = DEFAULT_POLICY.with_(timing=True, vendor=False)


class CardOutcome(str, Enum):
    TRIALLED = "trialled"
    ALREADY_DECIDED = "already decided"
    NO_TARGET = "no held-out target"
    KEPT_OUT = "kept out by its per-case effects"  # they do not say where it pays (when.unpaid_when)
    LEFT_UNDECIDED = "left undecided"  # the deadline came before the card


@dataclass(frozen=True)
class CardRun:
    """What a run did with one card: the card as written, what happened, its new trials, and the
    seconds they took."""

    card: SkillCard
    outcome: CardOutcome
    trials: tuple[Trial, ...] = ()
    seconds: float = 0.0


def setting_for(mode: GateMode, placement: Placement = Placement.AS_LOADED) -> GateSetting:
    """The setting of the real gate in this mode on this machine (the GPU as the gate names it),
    its trials timed with the kernels `placement`d (exchanged: each in the other's place in turn)."""
    gpu = {GateMode.GPU: execute.gpu_name, GateMode.REPLAY: config.replay_gpu}.get(mode, lambda: "none")()
    return GateSetting(mode, gpu, POLICY.with_(placement=placement))


def gate_of(setting: GateSetting, progress: Progress, record: bool = False) -> Gate:
    """The real gate the setting names, reporting its stages to `progress`; with `record`, a GPU
    gate's verdicts (and the correctness twins they reused) also go into the recorded store, so the
    trials' measurements can be replayed where no GPU is."""
    def gate(problem_path: str | Path, kernel: KernelState, against: KernelState | None, case: str) -> Verdict:
        verdict = run_gate(problem_path, kernel, against=against, policy=trial_policy(setting.policy, case),
                           mode=setting.mode, progress=progress)
        if record and setting.mode is GateMode.GPU:
            default_cache().keep(verdict)
        return verdict
    return gate


def already_decided(card: SkillCard, targets: Sequence[Target], setting: GateSetting,
                    problem_for: Callable[[str], str | Path]) -> bool:
    """Whether the card's log already judges it on these targets, on the bases trials would have now."""
    logged = {(t.state, t.basis): t for t in card.verification_log if t.basis is not None}  # the latest wins
    outcomes = set()
    for target in targets:
        basis = trial_basis(card, target, applied_to(card, target), setting, problem_for)
        trial = logged.get((target.state.fingerprint, basis))
        if trial is None:
            return False
        outcomes.add(trial_outcome(trial))
    return bool(outcomes & {TrialOutcome.PASSED, TrialOutcome.FAILED})


def admit_cards(library: Library, chosen: Collection[str], targets_for: Callable[[SkillCard], Sequence[Target]],
                problem_for: Callable[[str], str | Path], gate: Gate, setting: GateSetting,
                save: Callable[[Library], object], *, problems: Mapping[str, ProblemInfo] | None = None,
                limit: int = DEFAULT_LIMIT, redo: bool = False, deadline: float | None = None,
                clock: Callable[[], float] = time.monotonic, progress: Progress = lambda stage, message: None,
                on_card: Callable[[CardRun], None] = lambda run: None, jobs: int = 1,
                measured: Mapping[MeasurementKey, Trial] | None = None) -> tuple[Library, list[CardRun]]:
    """Admit the chosen cards (ids) of the library in its order (a sequence of ids: in theirs), `save`-ing the
    library after each card trialled; the library with every card as it ended, and what became of each chosen card
    (also given to `on_card` as it happens). `gate` must be the gate `setting` names. With `jobs` > 1
    on the GPU gate, the correctness of the next cards' trial kernels (about `jobs` of them) is
    judged side by side first (`klineage.gate.prefetch`), so that each trial's gate call only times.
    `measured` (`admission.measurements`): earlier trials a trial of the same kernel, target, case, policy
    and GPU reads instead of gating it again."""
    if limit < 1:
        raise KLineageError(f"admission needs at least one trial per card, not limit={limit}")
    cards = list(library.cards)
    order = [i for i, card in enumerate(cards) if card.id in chosen]
    if isinstance(chosen, Sequence):  # named one by one: the order they were named in, the first most wanted
        order.sort(key=lambda i: chosen.index(cards[i].id))
    runs: list[CardRun] = []
    # A deadline is kept by the longest card's own trials, plus a side-by-side window where the
    # card opens one: a window judges the next cards' kernels too, so it is not one card's cost.
    longest = window = 0.0
    found: dict[str, list[Target]] = {}  # card id -> its targets, found once

    def targets_of(card: SkillCard) -> list[Target]:
        if card.id not in found:
            found[card.id] = list(targets_for(card))[:limit]
        return found[card.id]

    ahead = _Ahead(jobs if setting.mode is GateMode.GPU else 1, setting, problem_for, progress, measured or {})
    for position, i in enumerate(order, 1):
        card = cards[i]
        label = f"[{position}/{len(order)}] {card.short_id} {card.transform}"
        kept_out = unpaid_when(card) is not None  # no trial could admit it: its targets are not sought
        if not kept_out:
            progress("admit", f"{label}: finding held-out targets")
        targets = [] if kept_out else targets_of(card)
        if kept_out:
            status = when_allows(card, card.status)  # an admitted card its cases contradict loses the status
            if status is not card.status:
                cards[i] = card = dataclasses.replace(card, status=status)
                save(dataclasses.replace(library, cards=tuple(cards)))
            run = CardRun(card, CardOutcome.KEPT_OUT)
        elif not targets:
            run = CardRun(card, CardOutcome.NO_TARGET)
        elif not redo and already_decided(card, targets, setting, problem_for):
            run = CardRun(card, CardOutcome.ALREADY_DECIDED)
        elif deadline is not None and clock() + longest + (window if ahead.opens_window(card) else 0.0) >= deadline:
            run = CardRun(card, CardOutcome.LEFT_UNDECIDED)
        else:
            started = clock()
            if ahead.opens_window(card):
                ahead.before(card, targets, ((cards[j], targets_of(cards[j])) for j in order[position:]  # lazy
                                             if unpaid_when(cards[j]) is None and (redo or not already_decided(
                                                 cards[j], targets_of(cards[j]), setting, problem_for))))
                window = clock() - started
            trialling = clock()
            progress("admit", f"{label}: {len(targets)} trial(s)")
            card, trials = admit(card, targets, problem_for, gate, problems=problems, limit=limit, setting=setting,
                                 measured=measured)
            cards[i] = card
            save(dataclasses.replace(library, cards=tuple(cards)))
            run = CardRun(card, CardOutcome.TRIALLED, tuple(trials), clock() - started)
            longest = max(longest, clock() - trialling)
        runs.append(run)
        on_card(run)
    return dataclasses.replace(library, cards=tuple(cards)), runs


@dataclass
class _Ahead:
    """Judges trial kernels' correctness twins side by side, a window of cards at a time."""

    jobs: int
    setting: GateSetting
    problem_for: Callable[[str], str | Path]
    progress: Progress
    measured: Mapping[MeasurementKey, Trial]  # kernels an earlier trial measured: nothing to judge
    done: set[str] = dataclasses.field(default_factory=set)  # card ids whose kernels were prefetched

    def opens_window(self, card: SkillCard) -> bool:
        return self.jobs > 1 and card.id not in self.done

    def before(self, card: SkillCard, targets: Sequence[Target],
               later: Iterable[tuple[SkillCard, list[Target]]]) -> None:
        by_problem: dict[str, dict[str, KernelState]] = {}
        count = 0
        for each, its_targets in itertools.chain([(card, list(targets))], later):  # lazy: reads no further
            if count >= self.jobs:
                break
            self.done.add(each.id)
            for target in its_targets:
                applied = applied_to(each, target)
                if (applied is not None and required_ratio(each) is not None and unpaid_when(each) is None
                        and measured_as(target.state.fingerprint, trial_basis(
                            each, target, applied, self.setting, self.problem_for)) not in self.measured):
                    by_problem.setdefault(str(self.problem_for(target.problem)), {})[applied.state.fingerprint] = \
                        applied.state
                    count += 1
        self.progress("admit", f"judging the correctness of {count} trial kernel(s) side by side")
        for problem, states in by_problem.items():
            prefetch(problem, states.values(), self.setting.policy.correctness_twin(), default_cache(),
                     jobs=self.jobs, mode=self.setting.mode)
