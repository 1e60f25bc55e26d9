"""Words for measured ratios that agree with the numbers behind them.

A ratio here is child time / parent time of a forward step (> 1: the step made the kernel faster).
The gate passes a step that is "not slower than" its required ratio (0.99 by default), so a passed
step is not necessarily faster: most change time by under 1%. The words below say which of three
things a ratio is (faster, within the noise band, slower), print enough digits that a ratio below
its mark never reads as equal to it, and give a card's status a qualifier where its measurements
disagree with a plain "admitted".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

BAND = 0.01  # a change of under 1% either way is within the timing noise the gate allows
MAX_DIGITS = 6


class Pace(str, Enum):
    FASTER = "faster"
    WITHIN = "within 1%"
    SLOWER = "slower"


def pace(ratio: float) -> Pace:
    if ratio >= 1.0 + BAND:
        return Pace.FASTER
    if ratio < 1.0 - BAND:
        return Pace.SLOWER
    return Pace.WITHIN


def ratio_text(value: float, mark: float | None = None, unit: str = "x") -> str:
    """`value` with three decimals, or more until it no longer prints equal to `mark` when it is not
    (0.98996 against 0.99 reads 0.98996x, not 0.990x)."""
    digits = 3
    while mark is not None and value != mark and digits < MAX_DIGITS and f"{value:.{digits}f}" == f"{mark:.{digits}f}":
        digits += 1
    return f"{value:.{digits}f}{unit}"


def change_text(ratio: float) -> str:
    """"faster by 12.3%", "slower by 23.0%" (how much more time the slower kernel of the two takes) or
    "within 1% (1.004x)"."""
    kind = pace(ratio)
    if kind is Pace.FASTER:
        return f"{ratio:.2f}x faster" if ratio >= 2 else f"faster by {100 * (ratio - 1):.1f}%"
    if kind is Pace.SLOWER:
        return f"slower by {100 * (1 / ratio - 1):.1f}%"
    return f"within 1% ({ratio_text(ratio)})"


@dataclass(frozen=True)
class StepWords:
    """What a forward step's timing says: a short badge and a sentence naming the first failing
    trial where there is one."""

    badge: str
    tone: str  # "ok", "neutral", "bad", "none": the badge's colour
    sentence: str


def forward_words(status: str, overall: float | None = None, per_trial: Sequence[float] = (),
                  required: float = 0.99) -> StepWords:
    """Words for a step's forward check from its status (verified, slower, untimed, no_mechanical_forward,
    empty) and timing."""
    if overall is None:
        badge = {"untimed": "forward untimed", "no_mechanical_forward": "no mechanical forward",
                 "same_code": "same machine code: not timed",
                 "": "forward not checked"}.get(status, f"forward {status.replace('_', ' ')}")
        return StepWords(badge, "none", "")
    values = [overall, *per_trial]
    shown = ", ".join(ratio_text(v, required) for v in per_trial)
    trials = f" (trials {shown})" if per_trial else ""
    required_text = f"{required:g}x"
    if all(v >= required for v in values):
        kind = pace(overall)
        badge = change_text(overall) if kind is not Pace.WITHIN else f"not slower than {required_text}"
        tone = "ok" if kind is Pace.FASTER else "neutral"
        return StepWords(badge, tone, f"child/parent time {ratio_text(overall, required)}{trials}; "
                                      f"required at least {required_text} in the median and every trial")
    if overall < required:
        where, value = "the median", overall
    else:
        index, value = next((i, v) for i, v in enumerate(per_trial) if v < required)
        where = f"trial {index + 1} of {len(per_trial)}"
    return StepWords(f"below {required_text} on {where}", "bad",
                     f"child/parent time {ratio_text(overall, required)}{trials}: {where} at "
                     f"{ratio_text(value, required)} is below the required {required_text}")


@dataclass(frozen=True)
class Standing:
    """A card's status as it reads beside its measurements: `badge` qualifies the status where the
    measured effects or trials did not all pay; `sentence` says where it paid and where it did not."""

    status: str
    badge: str
    tone: str  # "ok", "mixed", "slower", "none"
    sentence: str


def standing(status: str, effects: Iterable[tuple[str, float]], trials: Iterable[tuple[str, float | None]] = (),
             readmission: str = "", ruled_out: Sequence[bool] = ()) -> Standing:
    """`effects`: (case label, child/parent ratio) where the card was learned; `trials`: (outcome, ratio)
    of its roundtrip trials on other kernels; `readmission`: why it is back to admission, if it is;
    `ruled_out`: per effect, whether the card's timing precondition fails on that case (an optimization
    does not apply it there), so that a card slower only where its precondition says it does not pay
    reads as its precondition says, and the badge counts the cases it holds on."""
    effects = list(effects)
    trials = list(trials)
    if readmission:  # an optimization treats an admitted card as a candidate until it passes again
        shown = "candidate" if status == "admitted" else status
        return Standing(shown, f"{shown} · back to admission", "mixed",
                        f"Back to admission: {readmission}. Until it passes again it is treated as a candidate.")
    flags = list(ruled_out) or [False] * len(effects)
    if len(flags) != len(effects):
        raise ValueError(f"ruled_out has {len(flags)} flags for {len(effects)} effects")
    excluded = [effect for effect, out in zip(effects, flags) if out]
    applied = [effect for effect, out in zip(effects, flags) if not out]
    faster = [(case, r) for case, r in applied if pace(r) is Pace.FASTER]
    slower = [(case, r) for case, r in applied if pace(r) is Pace.SLOWER]
    slow_trials = [r for outcome, r in trials if outcome == "slower"]
    within = len(applied) - len(faster) - len(slower)
    where = " where its precondition holds" if excluded else ""
    parts = [_listed("Faster", faster), _listed("Slower", slower),
             f"Within 1% on {within} of {_cases(len(applied))}" if within else ""]
    if excluded:
        slow_out = [(case, r) for case, r in excluded if pace(r) is Pace.SLOWER]
        parts[0:3] = [p + where if p else p for p in parts[0:3]]
        parts.append(f"Its precondition rules out {len(excluded)} of the {_cases(len(effects))}, where an "
                     f"optimization does not apply it" + (f"; it was slower on {len(slow_out)} of those"
                                                          if slow_out else ""))
    if trials:
        shown = ", ".join(ratio_text(r) for r in slow_trials if r is not None)
        parts.append(f"{len(slow_trials)} of {len(trials)} trial{'s' if len(trials) != 1 else ''} on other kernels "
                     f"slower" + (f" ({shown})" if shown else ""))
    sentence = ". ".join(filter(None, parts)) + "." if any(parts) else "No measured effect yet."
    if not effects:
        return Standing(status, status, "none", sentence)
    if not slower and not slow_trials:
        qualifier = ("faster" if faster else "no measured gain") + where
        return Standing(status, f"{status} · {qualifier}", "ok" if faster else "none", sentence)
    counted = f"slower on {len(slower)} of {_cases(len(applied))}{where}" if slower else ""
    trialled = f"{len(slow_trials)} of {len(trials)} trials slower" if slow_trials else ""
    qualifier = ", ".join(filter(None, [counted, trialled]))
    tone = "slower" if len(slower) == len(applied) else "mixed"
    return Standing(status, f"{status} · {qualifier}", tone, sentence)


def _cases(n: int) -> str:
    return f"{n} case{'s' if n != 1 else ''}"


def _listed(label: str, cases: list[tuple[str, float]]) -> str:
    if not cases:
        return ""
    return f"{label} on " + ", ".join(f"{case} ({ratio_text(r)})" for case, r in cases)
