"""The optimization document: one run of the forward loop, every attempt kept.

A run starts at a kernel (`start`), gates candidates against the current best with paired
timing, and moves only on a paired improvement. The document stores

- `attempts`: every candidate, in order: the card or transform it came from, its anchor, the
  kernel's fingerprint, the gate call it took (`evaluation`, 1-based; the start's gate is call 1),
  the verdict's key and summary, the paired ratio against the best (best time / candidate time),
  and a message saying why it was or was not taken;
- `steps`: the accepted path, start -> best, each with the kernel it reached and its forward diff;
- `stop`: why the run ended, and `stats`: gate evaluations used, wasted ones (gated candidates not
  taken), accepted steps, the gate time the verdicts report, `saved`: candidate kernels recorded
  `precondition_failed` and not gated (their card was measured not to pay on such a case), and `same_code`:
  those recorded `same_code` and not gated (they run the best kernel's machine code; `code_check`).

The lineage document's parts are reused where they mean the same thing (`ProblemRef`,
`VerdictSummary`, `Assurance`); the rest is this versioned document's own. It validates itself on
construction: attempts are numbered without gaps, gate calls count up from the start's, the steps
chain from the start through taken attempts, the budget holds, and a compile-only run (nothing
ran, nothing was timed: unknown fails) accepts nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from klineage import codec
from klineage.config import GateMode
from klineage.documents import Document, enum, need, nonnegative, number, text, whole
from klineage.errors import DocumentError
from klineage.gate.machine_code import CodeCheck
from klineage.gate.timing import PairedRatio
from klineage.kernel import KernelState
from klineage.lineage import Assurance, ProblemRef, VerdictSummary
from klineage.optimize.strategies import LIBRARY_STRATEGIES, UNCONDITIONED, Ordering, RewriterKind, Strategy
from klineage.skills.card import DEFAULT_REQUIRED_RATIO, CardStatus
from klineage.transforms.base import Anchor

OPTIMIZATION_VERSION = 1
# DEFAULT_REQUIRED_RATIO (1.01, defined in klineage.skills.card, re-exported here): a candidate must be at least
# that many times as fast as the best, in the median and every trial
COMPILE_ONLY_NOTE = ("compile-only gate: nothing ran and nothing was timed, so no candidate can be shown to improve "
                     "on the best (unknown fails); candidates are recorded as untimed and none is accepted")


class AttemptStatus(str, Enum):
    FASTER = "faster"  # passed; best time / candidate time met the required ratio in the median and every trial
    NOT_FASTER = "not_faster"  # passed, but the paired ratio fell short (or the gate gave none: unknown fails)
    UNTIMED = "untimed"  # compile-only: compiled, nothing ran; never accepted
    UNSETTLED = "unsettled"  # passed, but the timing never settled: no decision either way; never accepted
    REJECTED = "rejected"  # the gate refused the candidate
    GATE_ERROR = "gate_error"  # the gate could not judge (harness failure, replay miss); the run stops
    NOT_APPLICABLE = "not_applicable"  # no candidate kernel: the card or transform could not be applied here
    DUPLICATE = "duplicate"  # the kernel was judged already at this best, or is a state of the path
    PASSED_OVER = "passed_over"  # not gated: its card's measured effects fall short of the required ratio
    PRECONDITION_FAILED = "precondition_failed"  # not gated: its card was measured not to pay on such a case
    SAME_CODE = "same_code"  # not gated: it runs the best kernel's machine code (CodeCheck.SASS), so its ratio is 1

    @property
    def gated(self) -> bool:
        """Whether it cost a gate evaluation."""
        return self not in (AttemptStatus.NOT_APPLICABLE, AttemptStatus.DUPLICATE, AttemptStatus.PASSED_OVER,
                            AttemptStatus.PRECONDITION_FAILED, AttemptStatus.SAME_CODE)


class Stop(str, Enum):
    BUDGET = "budget"  # every gate evaluation of the budget is spent
    NO_CANDIDATE = "no_candidate"  # no card or transform gives a candidate at the best kernel
    NO_IMPROVEMENT = "no_improvement"  # every candidate at the best kernel was tried; none was taken
    START_FAILED = "start_failed"  # the starting kernel does not pass the gate
    GATE_ERROR = "gate_error"  # the gate could not judge a candidate; nothing after it is trusted
    LLM_BUDGET = "llm_budget"  # the model budget is spent
    TIME_LIMIT = "time_limit"  # the run's wall-clock limit passed before its budget was spent


def _ratio(data: Any, where: str) -> PairedRatio:
    data = need(data, ("overall", "per_trial"), where)
    if not isinstance(data["per_trial"], list):
        raise DocumentError(f"{where}.per_trial", "must be a list")
    return PairedRatio(number(data["overall"], f"{where}.overall", positive=True),
                       tuple(number(r, f"{where}.per_trial[{i}]", positive=True)
                             for i, r in enumerate(data["per_trial"])))


def _anchor(data: Any, where: str) -> Anchor | None:
    if data is None:
        return None
    data = need(data, ("function", "kind", "key"), where, optional=("snippet",))
    try:
        return Anchor.from_dict(data)
    except DocumentError as exc:
        raise DocumentError(where, str(exc)) from None


@dataclass(frozen=True)
class Attempt:
    """One candidate the loop dealt with."""

    index: int
    round: int  # how many steps had been taken when it was tried (0: at the start kernel)
    parent: str  # fingerprint of the best kernel it was tried against
    transform: str  # the transform it applies ("other:<name>" or "llm" from the LLM rewriter)
    card: str  # the card's id; "" when it came from no card
    anchor: Anchor | None
    candidate: str  # fingerprint of the candidate kernel; "" when there was none
    status: AttemptStatus
    message: str  # why it was (not) taken, in one line
    evaluation: int | None = None  # the gate call it took, from 1 (the start's); None when not gated
    key: str = ""  # the verdict's content key
    verdict: VerdictSummary | None = None
    ratio: PairedRatio | None = None  # best time / candidate time, overall and per trial
    score: float | None = None  # the retrieval score, for card candidates

    def __post_init__(self) -> None:
        where = f"attempts[{self.index}]"
        whole(self.index, f"{where}.index")
        whole(self.round, f"{where}.round")
        text(self.transform, f"{where}.transform", empty=False)
        if not isinstance(self.status, AttemptStatus):
            raise DocumentError(f"{where}.status", f"must be an AttemptStatus, not {self.status!r}")
        if self.status.gated:
            if self.evaluation is None or (self.verdict is None and self.status is not AttemptStatus.GATE_ERROR):
                raise DocumentError(where, f"a {self.status.value} attempt was gated: it needs its evaluation and "
                                           f"verdict")
            whole(self.evaluation, f"{where}.evaluation", minimum=2)
        elif self.evaluation is not None or self.verdict is not None or self.ratio is not None:
            raise DocumentError(where, f"a {self.status.value} attempt cost no gate evaluation and has no verdict")
        if (self.status is AttemptStatus.NOT_APPLICABLE) != (not self.candidate):
            raise DocumentError(where, "a candidate kernel is named exactly when there was one")
        if self.status is AttemptStatus.FASTER and self.ratio is None:
            raise DocumentError(where, "a faster attempt needs its paired ratio")
        if self.status in (AttemptStatus.UNTIMED, AttemptStatus.REJECTED) and self.ratio is not None:
            raise DocumentError(where, f"a {self.status.value} attempt was not timed")

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "round": self.round, "parent": self.parent, "transform": self.transform,
                "card": self.card, "anchor": self.anchor.to_dict() if self.anchor else None,
                "candidate": self.candidate, "status": self.status.value, "message": self.message,
                "evaluation": self.evaluation, "key": self.key,
                "verdict": self.verdict.to_dict() if self.verdict else None,
                "ratio": self.ratio.to_dict() if self.ratio else None, "score": self.score}

    @classmethod
    def from_dict(cls, data: Any, where: str = "attempt") -> Attempt:
        data = need(data, ("index", "round", "parent", "transform", "card", "anchor", "candidate", "status",
                           "message", "evaluation", "key", "verdict", "ratio", "score"), where)
        score = data["score"]
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
            raise DocumentError(f"{where}.score", f"must be a number or null, not {score!r}")
        return cls(data["index"], data["round"], text(data["parent"], f"{where}.parent"), data["transform"],
                   text(data["card"], f"{where}.card"), _anchor(data["anchor"], f"{where}.anchor"),
                   text(data["candidate"], f"{where}.candidate"),
                   enum(AttemptStatus, data["status"], f"{where}.status"), text(data["message"], f"{where}.message"),
                   data["evaluation"], text(data["key"], f"{where}.key"),
                   None if data["verdict"] is None else VerdictSummary.from_dict(data["verdict"], f"{where}.verdict"),
                   None if data["ratio"] is None else _ratio(data["ratio"], f"{where}.ratio"), score)


@dataclass(frozen=True)
class Step:
    """An accepted candidate: the path moves from `parent` to `state`."""

    index: int
    attempt: int  # the attempt that was taken
    transform: str
    card: str
    anchor: Anchor | None
    parent: str
    state: KernelState
    ratio: PairedRatio  # parent time / child time
    diff: str  # unified diff parent -> child

    @property
    def child(self) -> str:
        return self.state.fingerprint

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "attempt": self.attempt, "transform": self.transform, "card": self.card,
                "anchor": self.anchor.to_dict() if self.anchor else None, "parent": self.parent,
                "child": self.child, "state": self.state.to_dict(), "ratio": self.ratio.to_dict(), "diff": self.diff}

    @classmethod
    def from_dict(cls, data: Any, where: str = "step") -> Step:
        data = need(data, ("index", "attempt", "transform", "card", "anchor", "parent", "child", "state", "ratio",
                           "diff"), where)
        state = KernelState.from_dict(data["state"], f"{where}.state")
        if data["child"] != state.fingerprint:
            raise DocumentError(f"{where}.child", "does not match the state's fingerprint")
        return cls(whole(data["index"], f"{where}.index"), whole(data["attempt"], f"{where}.attempt"),
                   text(data["transform"], f"{where}.transform", empty=False), text(data["card"], f"{where}.card"),
                   _anchor(data["anchor"], f"{where}.anchor"), text(data["parent"], f"{where}.parent"), state,
                   _ratio(data["ratio"], f"{where}.ratio"), text(data["diff"], f"{where}.diff"))


@dataclass(frozen=True)
class LibraryRef:
    """The library a run drew on: where it came from, which card statuses were allowed, how many cards."""

    path: str
    statuses: tuple[CardStatus, ...]
    cards: int  # cards in the library
    eligible: int  # of them, cards with an allowed status

    def __post_init__(self) -> None:
        text(self.path, "library.path")
        object.__setattr__(self, "statuses", tuple(self.statuses))
        if not self.statuses or not all(isinstance(s, CardStatus) for s in self.statuses):
            raise DocumentError("library.statuses", "needs at least one card status")
        whole(self.cards, "library.cards")
        whole(self.eligible, "library.eligible")
        if self.eligible > self.cards:
            raise DocumentError("library", "more eligible cards than cards")

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "statuses": [s.value for s in self.statuses], "cards": self.cards,
                "eligible": self.eligible}

    @classmethod
    def from_dict(cls, data: Any, where: str = "library") -> LibraryRef:
        data = need(data, ("path", "statuses", "cards", "eligible"), where)
        if not isinstance(data["statuses"], list):
            raise DocumentError(f"{where}.statuses", "must be a list")
        return cls(data["path"], tuple(enum(CardStatus, s, f"{where}.statuses") for s in data["statuses"]),
                   data["cards"], data["eligible"])


@codec.part("stats")
@dataclass(frozen=True)
class Stats:
    evaluations: int  # gate calls, the start's included
    wasted: int  # gated candidates that were not taken
    accepted: int
    seconds: float  # gate time as the verdicts report it
    # candidate kernels not gated because their card's timing precondition failed here; absent at 0: old bytes
    saved: int = codec.omitted(0)
    same_code: int = codec.omitted(0)  # candidate kernels not gated because they run the best's machine code

    def __post_init__(self) -> None:
        for name in ("evaluations", "wasted", "accepted", "saved", "same_code"):
            whole(getattr(self, name), f"stats.{name}")
        nonnegative(self.seconds, "stats.seconds")

    def saved_entry(self) -> dict[str, int]:
        """`saved` and `same_code` as a benchmark row keeps them: absent at 0, as in these stats' own bytes."""
        return {name: getattr(self, name) for name in ("saved", "same_code") if getattr(self, name)}


_KEYS = ("version", "kind", "problem", "start", "start_verdict", "strategy", "rewriter", "gate", "assurance", "budget",
         "seed", "required_ratio", "policy", "library", "attempts", "steps", "best", "stop", "message", "stats",
         "speedup", "note", "llm_usage")
KIND = "optimization"


@dataclass(frozen=True)
class OptimizationResult(Document):
    document_name = "optimization"

    problem: ProblemRef
    start: KernelState
    start_verdict: VerdictSummary
    strategy: Strategy
    rewriter: RewriterKind
    gate: GateMode
    budget: int
    seed: int
    required_ratio: float
    policy: dict[str, Any]  # the gate policy of every call (replay needs the same one)
    library: LibraryRef | None
    attempts: tuple[Attempt, ...]
    steps: tuple[Step, ...]
    stop: Stop
    message: str
    stats: Stats
    llm_usage: dict[str, Any] | None = None  # the model's tokens and cost, when the LLM rewriter ran
    rivals: int = 0  # candidates a first improvement rules out, gated beside it; 0 in runs from before rivals
    ordering: Ordering = Ordering.AS_PLANNED  # how a library strategy ordered its rounds; runs from before: as planned
    code_check: CodeCheck = CodeCheck.NONE  # runs from before the check compared nothing
    version: int = OPTIMIZATION_VERSION

    def __post_init__(self) -> None:
        if self.version != OPTIMIZATION_VERSION:
            raise DocumentError("optimization", f"unsupported version {self.version!r} (this is "
                                                f"{OPTIMIZATION_VERSION})")
        for name, kind in (("strategy", Strategy), ("rewriter", RewriterKind), ("gate", GateMode), ("stop", Stop),
                           ("ordering", Ordering), ("code_check", CodeCheck)):
            if not isinstance(getattr(self, name), kind):
                raise DocumentError(f"optimization.{name}", f"must be a {kind.__name__}, not {getattr(self, name)!r}")
        whole(self.budget, "optimization.budget", minimum=1)
        whole(self.seed, "optimization.seed")
        whole(self.rivals, "optimization.rivals")
        if number(self.required_ratio, "optimization.required_ratio", positive=True) < 1:
            raise DocumentError("optimization.required_ratio", "an improvement needs a ratio >= 1")
        object.__setattr__(self, "attempts", tuple(self.attempts))
        object.__setattr__(self, "steps", tuple(self.steps))
        self._check_attempts()
        self._check_steps()
        gated = [a for a in self.attempts if a.status.gated]
        taken = {s.attempt for s in self.steps}
        saved = sum(a.status is AttemptStatus.PRECONDITION_FAILED for a in self.attempts)
        same = sum(a.status is AttemptStatus.SAME_CODE for a in self.attempts)
        if same and self.code_check is CodeCheck.NONE:
            raise DocumentError("optimization.code_check", "none, yet an attempt was recorded same_code")
        expected = Stats(1 + len(gated), len(gated) - len(taken), len(self.steps), self.stats.seconds, saved, same)
        if self.stats != expected:
            raise DocumentError("optimization.stats", f"{self.stats.to_dict()} disagree with the attempts and steps "
                                                      f"(evaluations {expected.evaluations}, wasted "
                                                      f"{expected.wasted}, accepted {expected.accepted})")
        if self.stats.evaluations > self.budget:
            raise DocumentError("optimization.stats", f"{self.stats.evaluations} gate evaluations exceed the budget "
                                                      f"{self.budget}")
        if self.stop is Stop.BUDGET and self.stats.evaluations != self.budget:
            raise DocumentError("optimization.stop", "budget, but the budget was not spent")
        if self.stop is Stop.TIME_LIMIT and self.stats.evaluations >= self.budget:
            raise DocumentError("optimization.stop", "time_limit, but the whole budget was spent")

    def _check_attempts(self) -> None:
        last = 1
        for position, attempt in enumerate(self.attempts):
            if attempt.index != position:
                raise DocumentError(f"attempts[{position}]", f"index {attempt.index}: attempts run 0, 1, 2 ...")
            if attempt.evaluation is not None:
                if attempt.evaluation != last + 1:
                    raise DocumentError(f"attempts[{position}]", f"evaluation {attempt.evaluation} does not follow "
                                                                 f"{last}: every gate call is counted, in order")
                last = attempt.evaluation
            if self.gate is GateMode.COMPILE_ONLY and attempt.status in (AttemptStatus.FASTER, AttemptStatus.NOT_FASTER,
                                                                        AttemptStatus.UNSETTLED):
                raise DocumentError(f"attempts[{position}]", f"a compile-only run times nothing: {COMPILE_ONLY_NOTE}")
            if attempt.status is AttemptStatus.FASTER and not attempt.ratio.accepts(self.required_ratio):
                raise DocumentError(f"attempts[{position}]", f"faster, but its ratio does not meet "
                                                             f"{self.required_ratio} in the median and every trial")

    def _check_steps(self) -> None:
        current = self.start.fingerprint
        for position, step in enumerate(self.steps):
            where = f"steps[{position}]"
            if step.index != position:
                raise DocumentError(where, f"index {step.index}: steps run 0, 1, 2 ...")
            if step.attempt >= len(self.attempts):
                raise DocumentError(where, f"attempt {step.attempt} does not exist")
            attempt = self.attempts[step.attempt]
            if attempt.status is not AttemptStatus.FASTER:
                raise DocumentError(where, f"takes attempt {step.attempt}, which is {attempt.status.value}, not faster")
            if (attempt.candidate, attempt.parent, attempt.round) != (step.child, step.parent, position):
                raise DocumentError(where, f"does not match attempt {step.attempt} (kernel, parent or round)")
            if step.parent != current:
                raise DocumentError(where, f"parent {step.parent[:12]} is not the best before it ({current[:12]})")
            if step.ratio != attempt.ratio:
                raise DocumentError(where, "its ratio is not its attempt's")
            current = step.child
        if self.gate is GateMode.COMPILE_ONLY and self.steps:
            raise DocumentError("optimization.steps", f"a compile-only run accepts nothing: {COMPILE_ONLY_NOTE}")

    # what the run found

    @property
    def assurance(self) -> Assurance:
        return Assurance.of(self.gate)

    @property
    def best(self) -> KernelState:
        return self.steps[-1].state if self.steps else self.start

    @property
    def speedup(self) -> float | None:
        """Start time / best time, as the product of the paired ratios of the path; None when nothing
        could be timed (compile-only)."""
        if self.gate is GateMode.COMPILE_ONLY:
            return None
        return math.prod(s.ratio.overall for s in self.steps)

    def speedup_within(self, budget: int) -> float | None:
        """The speedup this run would have ended with under a budget of `budget` gate evaluations:
        it makes the same attempts up to that many, and a round cut short still takes its fastest
        candidate so far (the loop's rule), so each round gives the best faster ratio it had by then."""
        if self.gate is GateMode.COMPILE_ONLY:
            return None
        best: dict[int, float] = {}
        for a in self.attempts:
            if a.status is AttemptStatus.FASTER and a.evaluation <= budget:
                best[a.round] = max(best.get(a.round, 0.0), a.ratio.overall)
        return math.prod(best.values())

    def speedups_by_budget(self) -> list[list[float]]:
        """[N, speedup under a budget of N] wherever that changes (1.0 before the first): what lets a run
        that went further be compared with one cut after N evaluations. Empty where nothing was timed."""
        if self.speedup is None:
            return []
        changes = sorted({a.evaluation for a in self.attempts if a.status is AttemptStatus.FASTER})
        return [[n, self.speedup_within(n)] for n in changes]

    @property
    def note(self) -> str:
        return COMPILE_ONLY_NOTE if self.gate is GateMode.COMPILE_ONLY else ""

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"version": self.version, "kind": KIND, "problem": self.problem.to_dict(),
                "start": self.start.to_dict(), "start_verdict": self.start_verdict.to_dict(),
                "strategy": self.strategy.value, "rewriter": self.rewriter.value, "gate": self.gate.value,
                "assurance": self.assurance.value, "budget": self.budget, "seed": self.seed,
                "required_ratio": self.required_ratio, "policy": self.policy,
                "library": self.library.to_dict() if self.library else None,
                "attempts": [a.to_dict() for a in self.attempts], "steps": [s.to_dict() for s in self.steps],
                "best": {"name": best.name, "fingerprint": best.fingerprint}, "stop": self.stop.value,
                "message": self.message, "stats": self.stats.to_dict(), "speedup": self.speedup, "note": self.note,
                "llm_usage": self.llm_usage, "rivals": self.rivals, "ordering": self.ordering.value,
                # absent while none: the bytes of runs written before the check
                **({"code_check": self.code_check.value} if self.code_check is not CodeCheck.NONE else {})}

    @classmethod
    def from_dict(cls, data: Any) -> OptimizationResult:
        # absent: a run from before rivals, orderings, or the code check
        data = need(data, _KEYS, "optimization", optional=("rivals", "ordering", "code_check"))
        if data["version"] != OPTIMIZATION_VERSION:
            raise DocumentError("optimization", f"unsupported version {data['version']!r} (this is "
                                                f"{OPTIMIZATION_VERSION})")
        if data["kind"] != KIND:
            raise DocumentError("optimization.kind", f"must be {KIND!r}, not {data['kind']!r}")
        for key in ("attempts", "steps"):
            if not isinstance(data[key], list):
                raise DocumentError(f"optimization.{key}", "must be a list")
        if not isinstance(data["policy"], dict):
            raise DocumentError("optimization.policy", "must be an object")
        gate = enum(GateMode, data["gate"], "optimization.gate")
        if enum(Assurance, data["assurance"], "optimization.assurance") is not Assurance.of(gate):
            raise DocumentError("optimization.assurance", f"{data['assurance']} contradicts gate mode {gate.value}")
        result = cls(
            problem=ProblemRef.from_dict(data["problem"]),
            start=KernelState.from_dict(data["start"], "optimization.start"),
            start_verdict=VerdictSummary.from_dict(data["start_verdict"], "optimization.start_verdict"),
            strategy=enum(Strategy, data["strategy"], "optimization.strategy"),
            rewriter=enum(RewriterKind, data["rewriter"], "optimization.rewriter"), gate=gate,
            budget=data["budget"], seed=data["seed"], required_ratio=data["required_ratio"], policy=data["policy"],
            library=None if data["library"] is None else LibraryRef.from_dict(data["library"]),
            attempts=tuple(Attempt.from_dict(a, f"attempts[{i}]") for i, a in enumerate(data["attempts"])),
            steps=tuple(Step.from_dict(s, f"steps[{i}]") for i, s in enumerate(data["steps"])),
            stop=enum(Stop, data["stop"], "optimization.stop"), message=text(data["message"], "optimization.message"),
            stats=Stats.from_dict(data["stats"]), llm_usage=data["llm_usage"], rivals=data.get("rivals", 0),
            ordering=enum(Ordering, data.get("ordering", Ordering.AS_PLANNED.value), "optimization.ordering"),
            code_check=enum(CodeCheck, data.get("code_check", CodeCheck.NONE.value), "optimization.code_check"),
            version=data["version"])
        derived = result.to_dict()
        for key in ("best", "speedup", "note"):
            if data[key] != derived[key]:
                raise DocumentError(f"optimization.{key}", f"{data[key]!r} disagrees with the attempts and steps "
                                                           f"({derived[key]!r})")
        return result


class EventKind(str, Enum):
    ATTEMPT = "attempt"  # a candidate was dealt with
    STEP = "step"  # the path moved: a new best kernel


@dataclass(frozen=True)
class OptimizationEvent:
    """What a live view needs after each attempt and each step: enough to chart the best speedup
    against gate evaluations spent. `speedup` is None while nothing can be timed (compile-only)."""

    kind: EventKind
    attempt: Attempt
    evaluations: int
    budget: int
    steps: int
    best: str  # fingerprint of the best kernel after this event
    speedup: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "attempt": self.attempt.to_dict(), "evaluations": self.evaluations,
                "budget": self.budget, "steps": self.steps, "best": self.best, "speedup": self.speedup}


# A benchmark's runs of one kernel, by strategy name: each run's summary ("stop", "speedup", ...), as the transfer
# benchmark writes them and the dashboard reads them back.
def library_run(runs: Mapping[str, Any]) -> dict[str, Any]:
    """The run of whichever library strategy the benchmark measured; {} where none ran."""
    return next((runs[s.value] for s in LIBRARY_STRATEGIES if s.value in runs), {})


# a run that ended on its own: more budget would have changed nothing
ENDED = (Stop.NO_CANDIDATE.value, Stop.NO_IMPROVEMENT.value)


def run_speedup_within(run: Mapping[str, Any], budget: int) -> float | None:
    """A run summary's speedup under `budget` gate evaluations: its own when it ended on its own within the budget
    or used exactly that many, else read off its speedups_by_budget (the attempts it had made by then); None when
    the summary cannot tell (it stopped short of `budget` for another reason, or keeps no speedups_by_budget)."""
    if run["evaluations"] <= budget and (run["stop"] in ENDED or run["evaluations"] == budget):
        return run["speedup"]
    if run["evaluations"] < budget or "speedups_by_budget" not in run:
        return None
    return next((speedup for n, speedup in reversed(run["speedups_by_budget"]) if n <= budget), 1.0)


def better_unconditioned(runs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The unconditioned run with the larger speedup of those that measured one; None where none did (a gate that
    times nothing, or a start that failed: its speedup of 1 measured nothing)."""
    measured = [runs[s.value] for s in UNCONDITIONED if s.value in runs
                and runs[s.value].get("stop") != Stop.START_FAILED.value
                and isinstance(runs[s.value].get("speedup"), (int, float)) and runs[s.value]["speedup"] > 0]
    return max(measured, key=lambda run: run["speedup"], default=None)


__all__ = ["Attempt", "AttemptStatus", "COMPILE_ONLY_NOTE", "DEFAULT_REQUIRED_RATIO", "EventKind", "LibraryRef",
           "ENDED", "OPTIMIZATION_VERSION", "OptimizationEvent", "OptimizationResult", "Step", "Stats", "Stop",
           "better_unconditioned", "library_run", "run_speedup_within"]
