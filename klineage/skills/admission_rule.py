"""The rule a card's trials are judged by, and the status they give it; no gate runs here.

A target is another shape or another kernel than the card's effects were timed on, and a mechanism's
gain depends on the regime (mma.sync measured 11.3x on conv2d's headline, 58.9x on GEMM's, 7.1x on
conv2d's pointwise case), so a trial must show the effect in kind and in order of magnitude, not its size
on another shape: at least half the smallest declared gain, in log terms, after that effect's spread
(never less than `NOISE`) is taken off:
  required = max(DEFAULT_REQUIRED_RATIO, sqrt(min over effects of ratio x (1 - max(spread, NOISE))))
(with a timing precondition, over the effects on the cases where it holds: where the card was measured
not to pay asks nothing of a trial). The floor is the gain the optimize loop needs to take a step: a
trial that only shows the kernel no slower than before (0.999x) has not reproduced a gain, and
"admitted" must not rest on it. Nor may it rest on a ratio that reached `required` by less than a fresh
gate of the same pair moves (`when.REPEATABILITY`, 1.5%): such a trial neither reproduced the effect nor
refuted it, and reads inconclusive (`timed_outcome`), as a case that reached the step's ratio by so little
is undecided when a card's *when* is induced.

Status: admitted when some trial PASSED and none was rejected by the gate (a materialization that is
unsound somewhere keeps the card out); a trial that passed the gate only slower than required
(`Reading.SLOWER`) says where the mechanism does not pay, not that the card is wrong, so it does not keep
out a card that reproduced its effect elsewhere; an admitted card with a FAILED trial and no PASSED one is
retired; otherwise the status stays (a retired card stays). Above all that, "admitted" says where the card
pays: a card timed per case is admitted only where its cases say so (`when.unpaid_when`: a forced
precondition, or paid on all of at least eight cases); an admitted one is retired where it paid on none of
its cases, a candidate again where it paid on some with nothing saying where (`when_allows`).

The rule has tightened over time (a trial once passed when it was not more than 1% slower). `rejudge`
reads a card's recorded trials under today's rule, and `short_of_todays_rule` says why an admitted card
would not be admitted today.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from klineage.fingerprint import sha256_json
from klineage.skills.card import DEFAULT_REQUIRED_RATIO, CardStatus, SkillCard, Trial
from klineage.skills.trial_reading import Reading, TrialOutcome, reading, trial_outcome
from klineage.skills.when import REPEATABILITY, Outcome, WhenKind, outcome_of, timing_precondition, unpaid_when

NOISE = 0.05  # the least relative spread assumed of a declared effect


def card_digest(card: SkillCard) -> str:
    """The card's content without its log and status: what a trial judged (its effects set the
    ratio required, its preconditions which trials are fair), though the card's id leaves it out."""
    return sha256_json({k: v for k, v in card.to_dict().items() if k not in ("verification_log", "status")})


def required_ratio(card: SkillCard) -> float | None:
    """The paired ratio a trial must reach; None when the card declares no measured effect. With a
    timing precondition, only the effects on cases where it holds count: a trial is fair only where
    it holds, and the cases where the card was measured not to pay ask nothing of it."""
    effects = card.effects
    timing = timing_precondition(card)
    if timing is not None:
        effects = tuple(e for e in effects if timing.held(f"{e.operator}:{e.case}")) or effects
    if not effects:
        return None
    lower = min(e.ratio * (1.0 - max(e.spread, NOISE)) for e in effects)
    return max(DEFAULT_REQUIRED_RATIO, math.sqrt(lower))


def timed_outcome(ratio: float, required: float) -> TrialOutcome:
    """How a timed trial's paired `ratio` reads against the `required` one: passed beyond it by more than
    the gate's run-to-run spread, failed below it, inconclusive in between (the module's rule)."""
    return _TIMED[outcome_of(ratio, required)]


_TIMED = {Outcome.PAID: TrialOutcome.PASSED, Outcome.DID_NOT_PAY: TrialOutcome.FAILED,
          Outcome.UNDECIDED: TrialOutcome.INCONCLUSIVE}
# what a trial read before today's rule said, as the outcome today's rule gives
_AS_OUTCOME = {Reading.PASSED: TrialOutcome.PASSED, Reading.SLOWER: TrialOutcome.FAILED,
               Reading.INCONCLUSIVE: TrialOutcome.INCONCLUSIVE}


def within_spread(ratio: float, required: float) -> str:
    """The words a trial inside the spread is recorded with."""
    return (f"{ratio:.3f}x reached the {required:.3f}x required by under {REPEATABILITY:.1%}, the gate's "
            f"run-to-run spread: neither reproduced nor refuted")


def status_after(card: SkillCard, trials: Sequence[Trial]) -> CardStatus:
    """The card's status once `trials` are read (the module's rule)."""
    readings = {reading(t) for t in trials}
    status = card.status
    if status is not CardStatus.RETIRED:
        if Reading.PASSED in readings and Reading.REJECTED not in readings:
            status = CardStatus.ADMITTED
        failed = readings & {Reading.SLOWER, Reading.REJECTED}
        if failed and Reading.PASSED not in readings and status is CardStatus.ADMITTED:
            status = CardStatus.RETIRED
    return when_allows(card, status)


def when_allows(card: SkillCard, status: CardStatus) -> CardStatus:
    """`status`, unless the card's per-case effects keep it from being admitted (`when.unpaid_when`): then
    an admitted card is retired where it paid on none of its cases (the measurements contradict it) and
    a candidate again where it paid on some with nothing saying where, or on all of too few cases
    (admission waits for its *when*)."""
    unpaid = unpaid_when(card)
    if unpaid is None or status is not CardStatus.ADMITTED:
        return status
    return CardStatus.RETIRED if unpaid.kind is WhenKind.NEVER else CardStatus.CANDIDATE


def rejudge(card: SkillCard) -> tuple[SkillCard, list[Trial]]:
    """The card with its timed trials judged again under today's `required_ratio`, from the paired
    ratios they recorded (no gate runs: a passing verdict's ratio is the measurement, the outcome
    only a reading of it), and its status decided again, by `admit`'s rule, from every trial of this
    content in its log (`admit` reads only the trials it just made; decided even where no outcome
    changed); also the trials whose outcome changed (`timed_outcome`). A rejected or untimed trial has no
    ratio and keeps its outcome. An admitted card left with no pass of this content, some pass of it now
    inside the gate's spread, is judged as the candidate it was before that admission: such a pass neither
    reproduced the effect nor refuted it. Each changed trial's message keeps the old one after the new
    reading. Only trials of this very content (their basis names the card's digest) are read again: another
    content declared other effects."""
    required = required_ratio(card)
    digest = card_digest(card)
    changed: list[Trial] = []
    log = []
    lost_a_pass = False
    for trial in card.verification_log:
        old = reading(trial)  # a timed trial (one with a ratio) reads passed, slower or inconclusive
        ours = trial.basis is not None and trial.basis.card == digest
        if ours and required is not None and trial.ratio is not None and old is not Reading.REJECTED:
            new = timed_outcome(trial.ratio, required)
            if new is not _AS_OUTCOME[old]:
                said = (within_spread(trial.ratio, required) + " now" if new is TrialOutcome.INCONCLUSIVE else
                        f"{trial.ratio:.3f}x against the {required:.3f}x required now")
                trial = dataclasses.replace(trial, passed=new is TrialOutcome.PASSED, message=(
                    f"{new.value}: re-judged: {said}; first read as {trial.message}"))
                changed.append(trial)
                lost_a_pass = lost_a_pass or (old is Reading.PASSED and new is TrialOutcome.INCONCLUSIVE)
        log.append(trial)
    same = [t for t in log if t.basis is not None and t.basis.card == digest]
    judged = card
    if card.status is CardStatus.ADMITTED and lost_a_pass and not any(reading(t) is Reading.PASSED for t in same):
        # its admission rested on passes that today's rule reads as inconclusive: judged as the candidate it was
        judged = dataclasses.replace(card, status=CardStatus.CANDIDATE)
    status = status_after(judged, same) if same else when_allows(judged, judged.status)
    return dataclasses.replace(card, verification_log=tuple(log), status=status), changed


def short_of_todays_rule(card: SkillCard) -> str:
    """Why an admitted card would not be admitted today, or "" where it would (or is not admitted): its
    trials judged again under today's `required_ratio` by `rejudge` (no gate runs) leave it another
    status. Such a card was admitted under an earlier, looser rule (a trial once passed when it was not
    more than 1% slower). The library file keeps the status it was admitted with, since measurements made
    with the library ran so; readers say it stands no longer (SKILL.md, the dashboard, which sends it back
    to admission), and `klineage library admit --rejudge` writes today's status."""
    if card.status is not CardStatus.ADMITTED:
        return ""
    today, changed = rejudge(card)
    if today.status is CardStatus.ADMITTED:
        return ""
    if changed:
        required = required_ratio(card)
        close = [f"{t.ratio:.3f}x" for t in changed if trial_outcome(t) is TrialOutcome.INCONCLUSIVE]
        reached = ", ".join(f"{t.ratio:.3f}x" for t in changed)
        which = "" if len(changed) == 1 else f"{', '.join(close)} "
        spread = (f" ({which}above it by under {REPEATABILITY:.1%}, the gate's run-to-run spread: "
                  f"neither reproduced nor refuted)") if close else ""
        return (f"admitted under an earlier rule: today's asks {required:.3f}x of a trial and "
                f"{'its trial' if len(changed) == 1 else 'its trials'} reached {reached}{spread}, so it would be "
                f"{today.status.value} now")
    unpaid = unpaid_when(card)
    return (f"admitted before its per-case effects were read, and they keep it out: "
            f"{unpaid.sentence if unpaid else 'see its when'}; it would be {today.status.value} now")
