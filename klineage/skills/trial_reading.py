"""What a recorded trial says of its card: the outcome its message starts with (`TrialOutcome`, as
admission writes it) and how that reads for the card (`Reading`: a failed trial told apart into
slower and rejected). Admission, SKILL.md export and the dashboard's import read trials the same way."""

from __future__ import annotations

from enum import Enum

from klineage.errors import DocumentError
from klineage.skills.card import Trial


class TrialOutcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"


def trial_outcome(trial: Trial) -> TrialOutcome:
    """The outcome a recorded trial's message starts with."""
    head = trial.message.split(":", 1)[0].strip()
    try:
        return TrialOutcome(head)
    except ValueError:
        raise DocumentError("trial.message", f"does not start with an outcome ({head!r})") from None


class Reading(str, Enum):
    """What a recorded trial says of the card, FAILED told apart by why."""

    PASSED = "passed"
    SLOWER = "slower"  # the gate passed the kernel; it was slower than required: the mechanism did not pay there
    REJECTED = "rejected"  # the gate rejected the kernel: the card was unsound on that target
    INCONCLUSIVE = "inconclusive"


def reading(trial: Trial) -> Reading:
    """A trial logged without an outcome in its message (written by hand, or by an older tool) reads
    as passed when it says it passed, else inconclusive: what it did is unknown."""
    try:
        outcome = trial_outcome(trial)
    except DocumentError:
        return Reading.PASSED if trial.passed else Reading.INCONCLUSIVE
    if outcome is TrialOutcome.FAILED:
        return Reading.SLOWER if trial.ratio is not None else Reading.REJECTED
    return Reading(outcome.value)
