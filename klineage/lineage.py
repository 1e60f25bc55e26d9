"""The lineage document: one backward walk of an expert kernel, kept as a forward curriculum.

A walk starts at the expert and removes one mechanism per accepted step. The document stores

- `states`: the expert first, then the child of every accepted step, in order, each with its
  source, launch plan, a summary of its gate verdict and its source/SASS features;
- `transitions`: the accepted steps. `parent` is the more expert state, `child` the simpler one;
  `backward_diff` goes parent -> child, `forward_diff` child -> parent (the skill a card teaches),
  with the audit's removed/added features and the check of the forward step (`forward`);
- `rejections`: proposals the walk did not take, with their category and evidence;
- `termination`: why the walk stopped, and `stats`.

The document is versioned, validated on construction (fingerprints chain from the expert through
every transition, indices are contiguous, enums are known) and serialized deterministically:
sorted keys, no wall-clock timestamps. `stats.seconds` is the gate time the verdicts themselves
report (their per-stage timings), so a replayed walk, served the same recorded verdicts,
reproduces the document byte for byte.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from klineage.config import GateMode
from klineage.documents import Document, enum, has, need, nonnegative, text, whole
from klineage.errors import DocumentError
from klineage.gate.verdict import Reason, Status, Verdict
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms.base import Anchor

LINEAGE_VERSION = 1
DEFAULT_FORWARD_RATIO = 0.99  # the forward step must reach this speed vs the state it came from


class ForwardStatus(str, Enum):
    """What is known about the forward step (child -> parent) of a transition."""

    VERIFIED = "verified"  # the mechanical forward gives back the parent, and the parent is >= 0.99x as fast
    NO_MECHANICAL_FORWARD = "no_mechanical_forward"  # the transform has no inverse: an LLM must materialize it
    SLOWER = "slower"  # the parent is not >= 0.99x the child's speed in the median and every trial
    FAILED = "failed"  # the forward rewrite does not give back the parent, or its timing could not be judged
    UNTIMED = "untimed"  # the forward gives back the parent, but the gate ran nothing (compile-only walk)
    # the forward gives back the parent, and the child runs the parent's machine code (klineage.gate.machine_code):
    # its true ratio is 1, so it was not timed (a walk with the code check)
    SAME_CODE = "same_code"


class RejectionCategory(str, Enum):
    COMPILE_ERROR = "compile_error"  # nvcc failed, or the plan cannot be resolved (gate reason plan_error)
    INCORRECT = "incorrect"  # wrong, unwritten, stale, NaN, nondeterministic output; modified input; race
    CRASH = "crash"  # the context died, out-of-bounds write, memcheck error, output flood
    TIMEOUT = "timeout"
    AUDIT_MISMATCH = "audit_mismatch"  # the gate passed, but the features do not show one declared removal
    NO_CHANGE = "no_change"  # the rewrite gives back its own parent, or an earlier state of the walk
    NOT_APPLICABLE = "not_applicable"  # the transform refused (the reason is walk evidence)
    GATE_ERROR = "gate_error"  # the gate could not judge (harness or problem failure); the walk stops
    RESOURCE_LIMIT = "resource_limit"  # shared memory, launch resources
    STATIC_CHECK = "static_check"
    REPEATED = "repeated"  # the same edit was refused earlier in the walk for a reason its code alone decides

    @property
    def counts(self) -> bool:
        """Whether it counts toward the walk's rejection limit: only proposals the gate judged and
        refused do. A transform declining to apply, a rewrite that changes nothing or an edit already
        refused costs no gate evaluation; a gate error stops the walk instead."""
        return self not in (RejectionCategory.NOT_APPLICABLE, RejectionCategory.NO_CHANGE,
                            RejectionCategory.GATE_ERROR, RejectionCategory.REPEATED)


class Termination(str, Enum):
    COMPLETE = "complete"  # no eligible proposal remains at the last state
    STEP_LIMIT = "step_limit"
    REJECTION_LIMIT = "rejection_limit"
    UNKNOWN = "unknown"  # the expert did not pass, the gate failed, or the walk could not go on


class CaseOutcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"  # outside the kernel's declared domain
    NOT_RUN = "not_run"  # the gate ran nothing on this case (compile-only, or stopped before it)


class FeatureLevel(str, Enum):
    SOURCE = "source"
    SASS = "sass"


class Assurance(str, Enum):
    """How far a lineage can be trusted; follows from the gate mode."""

    GPU_VERIFIED = "gpu_verified"  # every state ran on a GPU (measured now, or recorded and replayed)
    UNVERIFIED = "unverified_compile_only"  # a dry walk: compiled and audited, never run, never timed

    @classmethod
    def of(cls, mode: GateMode) -> Assurance:
        return cls.UNVERIFIED if mode is GateMode.COMPILE_ONLY else cls.GPU_VERIFIED


def _fingerprint(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise DocumentError(where, f"must be a sha256 fingerprint, not {value!r}")
    return value


@dataclass(frozen=True)
class KernelRef:
    name: str
    fingerprint: str

    def __post_init__(self) -> None:
        text(self.name, "kernel.name", empty=False)
        _fingerprint(self.fingerprint, "kernel.fingerprint")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, data: Any, where: str = "expert") -> KernelRef:
        data = has(data, ("name", "fingerprint"), where)
        return cls(data["name"], data["fingerprint"])


@dataclass(frozen=True)
class ProblemRef:
    operator: str
    fingerprint: str

    def __post_init__(self) -> None:
        text(self.operator, "problem.operator", empty=False)
        text(self.fingerprint, "problem.fingerprint", empty=False)

    def to_dict(self) -> dict[str, Any]:
        return {"operator": self.operator, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, data: Any, where: str = "problem") -> ProblemRef:
        data = has(data, ("operator", "fingerprint"), where)
        return cls(data["operator"], data["fingerprint"])


@dataclass(frozen=True)
class Limits:
    max_steps: int = 16
    max_rejections: int = 4

    def __post_init__(self) -> None:
        whole(self.max_steps, "limits.max_steps")
        whole(self.max_rejections, "limits.max_rejections", minimum=1)

    def to_dict(self) -> dict[str, Any]:
        return {"max_steps": self.max_steps, "max_rejections": self.max_rejections}

    @classmethod
    def from_dict(cls, data: Any, where: str = "limits") -> Limits:
        data = has(data, ("max_steps", "max_rejections"), where)
        return cls(data["max_steps"], data["max_rejections"])


@dataclass(frozen=True)
class CaseResult:
    case: str
    outcome: CaseOutcome

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "outcome": self.outcome.value}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> CaseResult:
        data = has(data, ("case", "outcome"), where)
        return cls(text(data["case"], f"{where}.case", empty=False),
                   enum(CaseOutcome, data["outcome"], f"{where}.outcome"))


@dataclass(frozen=True)
class VerdictSummary:
    """The part of a gate verdict a lineage keeps: status, reason, and how each case went."""

    status: Status
    reason: Reason | None
    cases: tuple[CaseResult, ...]

    def __post_init__(self) -> None:
        if (self.status is Status.REJECTED) != (self.reason is not None):
            raise DocumentError("verdict", "a rejected verdict has a reason; no other status has one")

    @classmethod
    def of(cls, verdict: Verdict) -> VerdictSummary:
        return cls(verdict.status, verdict.reason, case_results(verdict))

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "reason": self.reason.value if self.reason else None,
                "cases": [c.to_dict() for c in self.cases]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "verdict") -> VerdictSummary:
        data = has(data, ("status", "reason", "cases"), where)
        reason = None if data["reason"] is None else enum(Reason, data["reason"], f"{where}.reason")
        if not isinstance(data["cases"], list):
            raise DocumentError(f"{where}.cases", "must be a list")
        return cls(enum(Status, data["status"], f"{where}.status"), reason,
                   tuple(CaseResult.from_dict(c, f"{where}.cases[{i}]") for i, c in enumerate(data["cases"])))


def case_results(verdict: Verdict) -> tuple[CaseResult, ...]:
    """Each case the verdict names, with how the candidate did on it."""
    passed: dict[str, bool] = {}
    for record in verdict.correctness:
        if record.get("kernel", "candidate") == "candidate":
            passed[record["case"]] = passed.get(record["case"], True) and bool(record.get("passed"))
    failed_by_finding = {f.case for f in verdict.findings if f.case}
    results = []
    for case in verdict.cases:
        if case in failed_by_finding or passed.get(case) is False:
            outcome = CaseOutcome.FAILED
        elif case in passed:
            outcome = CaseOutcome.PASSED
        else:
            outcome = CaseOutcome.NOT_RUN
        results.append(CaseResult(case, outcome))
    for case in verdict.domain.get("skipped", []) or []:
        results.append(CaseResult(case, CaseOutcome.SKIPPED))
    return tuple(results)


@dataclass(frozen=True)
class State:
    """A kernel the walk reached (the expert, or the child of an accepted step)."""

    fingerprint: str
    source: str
    plan: dict[str, Any]
    verdict: VerdictSummary
    features: dict[str, Any]  # the verdict's {"source": [...], "sass": {"counts": [...]}}

    def __post_init__(self) -> None:
        where = f"state {self.fingerprint[:12]}"
        _fingerprint(self.fingerprint, f"{where}.fingerprint")
        if self.kernel.fingerprint != self.fingerprint:
            raise DocumentError(where, "fingerprint does not match its source and plan")
        if not isinstance(self.features, dict):
            raise DocumentError(f"{where}.features", "must be an object")

    @functools.cached_property  # parsed and fingerprinted once: audits and imports ask for it at every step
    def kernel(self) -> KernelState:
        return KernelState(source=self.source, plan=LaunchPlan.from_dict(self.plan, "state plan"))

    @classmethod
    def of(cls, kernel: KernelState, verdict: Verdict) -> State:
        return cls(kernel.fingerprint, kernel.source, kernel.plan.to_dict(), VerdictSummary.of(verdict),
                   dict(verdict.features))

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "source": self.source, "plan": self.plan,
                "verdict": self.verdict.to_dict(), "features": self.features}

    @classmethod
    def from_dict(cls, data: Any, where: str = "state") -> State:
        data = has(data, ("fingerprint", "source", "plan", "verdict", "features"), where)
        return cls(data["fingerprint"], text(data["source"], f"{where}.source", empty=False), data["plan"],
                   VerdictSummary.from_dict(data["verdict"], f"{where}.verdict"), data["features"])


@dataclass(frozen=True, order=True)
class FeatureChange:
    """A feature present at a locus on one side of a step and absent on the other."""

    level: FeatureLevel
    locus: str
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level.value, "locus": self.locus, "name": self.name}

    @classmethod
    def from_dict(cls, data: Any, where: str = "feature") -> FeatureChange:
        data = has(data, ("level", "locus", "name"), where)
        return cls(enum(FeatureLevel, data["level"], f"{where}.level"), text(data["locus"], f"{where}.locus"),
                   text(data["name"], f"{where}.name", empty=False))

    def __str__(self) -> str:
        return f"{self.level.value} {self.locus}:{self.name}"


@dataclass(frozen=True)
class PairedTiming:
    """Paired timing of the forward step: child time / parent time, overall and per trial."""

    overall: float
    per_trial: tuple[float, ...]
    required: float = DEFAULT_FORWARD_RATIO

    def __post_init__(self) -> None:
        numbers = (self.overall, self.required, *self.per_trial)
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
            raise DocumentError("forward.timing", "ratios must be numbers")

    @property
    def accepted(self) -> bool:
        return self.overall >= self.required and all(r >= self.required for r in self.per_trial)

    def to_dict(self) -> dict[str, Any]:
        return {"overall": self.overall, "per_trial": list(self.per_trial), "required": self.required}

    @classmethod
    def from_dict(cls, data: Any, where: str = "forward.timing") -> PairedTiming:
        data = has(data, ("overall", "per_trial", "required"), where)
        if not isinstance(data["per_trial"], list):
            raise DocumentError(f"{where}.per_trial", "must be a list")
        return cls(data["overall"], tuple(data["per_trial"]), data["required"])


@dataclass(frozen=True)
class ForwardCheck:
    status: ForwardStatus
    message: str
    timing: PairedTiming | None = None

    def __post_init__(self) -> None:
        if self.status is ForwardStatus.VERIFIED and (self.timing is None or not self.timing.accepted):
            raise DocumentError("forward", "a verified forward step needs a paired timing that meets its ratio")
        if self.status is ForwardStatus.SLOWER and (self.timing is None or self.timing.accepted):
            raise DocumentError("forward", "a slower forward step needs a paired timing below its ratio")

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "message": self.message,
                "timing": self.timing.to_dict() if self.timing else None}

    @classmethod
    def from_dict(cls, data: Any, where: str = "forward") -> ForwardCheck:
        data = has(data, ("status", "message", "timing"), where)
        timing = None if data["timing"] is None else PairedTiming.from_dict(data["timing"], f"{where}.timing")
        return cls(enum(ForwardStatus, data["status"], f"{where}.status"), text(data["message"], f"{where}.message"),
                   timing)


@dataclass(frozen=True)
class Transition:
    """An accepted step, stored as its forward: child (simpler) -> parent (more expert)."""

    index: int
    transform: str
    anchor: Anchor
    parent: str
    child: str
    backward_diff: str
    forward_diff: str
    features_removed: tuple[FeatureChange, ...]
    features_added: tuple[FeatureChange, ...]
    forward: ForwardCheck
    carrier: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        where = f"transitions[{self.index}]"
        whole(self.index, f"{where}.index")
        text(self.transform, f"{where}.transform", empty=False)
        _fingerprint(self.parent, f"{where}.parent")
        _fingerprint(self.child, f"{where}.child")
        if self.parent == self.child:
            raise DocumentError(where, "parent and child are the same kernel")

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "transform": self.transform, "anchor": self.anchor.to_dict(),
                "parent": self.parent, "child": self.child, "backward_diff": self.backward_diff,
                "forward_diff": self.forward_diff, "features_removed": [f.to_dict() for f in self.features_removed],
                "features_added": [f.to_dict() for f in self.features_added], "forward": self.forward.to_dict(),
                "carrier": self.carrier, "note": self.note}

    @classmethod
    def from_dict(cls, data: Any, where: str = "transition") -> Transition:
        data = has(data, ("index", "transform", "anchor", "parent", "child", "backward_diff", "forward_diff",
                          "features_removed", "features_added", "forward", "carrier"), where)
        return cls(data["index"], data["transform"], _anchor(data["anchor"], f"{where}.anchor"), data["parent"],
                   data["child"], text(data["backward_diff"], f"{where}.backward_diff"),
                   text(data["forward_diff"], f"{where}.forward_diff"),
                   _changes(data["features_removed"], f"{where}.features_removed"),
                   _changes(data["features_added"], f"{where}.features_added"),
                   ForwardCheck.from_dict(data["forward"], f"{where}.forward"), dict(data["carrier"]),
                   text(data.get("note", ""), f"{where}.note"))


@dataclass(frozen=True)
class Evidence:
    """What a rejection left behind: the first finding's message, stage and case, a compile log
    excerpt, the worst error and where it was, or the audit's detail."""

    message: str = ""
    stage: str = ""
    case: str = ""
    log: str = ""
    worst: dict[str, Any] = field(default_factory=dict)  # seed, worst_index, max_abs_err, rel_l2
    audit: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "stage": self.stage, "case": self.case, "log": self.log,
                "worst": self.worst, "audit": self.audit}

    @classmethod
    def from_dict(cls, data: Any, where: str = "evidence") -> Evidence:
        data = has(data, ("message", "stage", "case", "log", "worst", "audit"), where)
        return cls(*(text(data[k], f"{where}.{k}") for k in ("message", "stage", "case", "log")),
                   dict(data["worst"]), dict(data["audit"]))


@dataclass(frozen=True)
class Rejection:
    """A proposal the walk did not take. It was a candidate for transition `step` and branched
    from that transition's parent: the expert for step 0, else the child of transition step - 1."""

    step: int
    parent: str
    transform: str
    anchor: Anchor | None  # None when the transform failed before naming a site
    category: RejectionCategory
    reason: Reason | None  # the gate's reason, when the gate judged it
    cases_failed: tuple[str, ...]
    evidence: Evidence

    def __post_init__(self) -> None:
        whole(self.step, "rejection.step")
        _fingerprint(self.parent, "rejection.parent")
        text(self.transform, "rejection.transform", empty=False)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "parent": self.parent, "transform": self.transform,
                "anchor": self.anchor.to_dict() if self.anchor else None, "category": self.category.value,
                "reason": self.reason.value if self.reason else None, "cases_failed": list(self.cases_failed),
                "evidence": self.evidence.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str = "rejection") -> Rejection:
        data = has(data, ("step", "parent", "transform", "anchor", "category", "reason", "cases_failed",
                          "evidence"), where)
        anchor = None if data["anchor"] is None else _anchor(data["anchor"], f"{where}.anchor")
        reason = None if data["reason"] is None else enum(Reason, data["reason"], f"{where}.reason")
        if not isinstance(data["cases_failed"], list):
            raise DocumentError(f"{where}.cases_failed", "must be a list")
        return cls(data["step"], data["parent"], data["transform"], anchor,
                   enum(RejectionCategory, data["category"], f"{where}.category"), reason,
                   tuple(text(c, f"{where}.cases_failed") for c in data["cases_failed"]),
                   Evidence.from_dict(data["evidence"], f"{where}.evidence"))


@dataclass(frozen=True)
class Outcome:
    kind: Termination
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "message": self.message}

    @classmethod
    def from_dict(cls, data: Any, where: str = "termination") -> Outcome:
        data = has(data, ("kind", "message"), where)
        return cls(enum(Termination, data["kind"], f"{where}.kind"), text(data["message"], f"{where}.message"))


@dataclass(frozen=True)
class Stats:
    accepted: int
    rejected: int
    gate_evaluations: int
    seconds: float  # gate time as the verdicts report it (recorded verdicts keep theirs), not wall-clock

    def __post_init__(self) -> None:
        for name in ("accepted", "rejected", "gate_evaluations"):
            whole(getattr(self, name), f"stats.{name}")
        nonnegative(self.seconds, "stats.seconds")

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "rejected": self.rejected, "gate_evaluations": self.gate_evaluations,
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: Any, where: str = "stats") -> Stats:
        data = has(data, ("accepted", "rejected", "gate_evaluations", "seconds"), where)
        return cls(data["accepted"], data["rejected"], data["gate_evaluations"], data["seconds"])


_TOP_LEVEL = ("version", "expert", "problem", "rewriter", "gate", "assurance", "policy", "limits", "states",
              "transitions", "rejections", "termination", "stats")


@dataclass(frozen=True)
class Lineage(Document):
    document_name = "lineage"

    expert: KernelRef
    problem: ProblemRef
    rewriter: str
    gate: GateMode
    policy: dict[str, Any]  # the gate policy of every state's verdict (replay needs the same one)
    limits: Limits
    states: tuple[State, ...]
    transitions: tuple[Transition, ...]
    rejections: tuple[Rejection, ...]
    termination: Outcome
    stats: Stats
    version: int = LINEAGE_VERSION

    def __post_init__(self) -> None:
        if self.version != LINEAGE_VERSION:
            raise DocumentError("lineage", f"unsupported version {self.version!r} (this is {LINEAGE_VERSION})")
        text(self.rewriter, "lineage.rewriter", empty=False)
        if not isinstance(self.gate, GateMode):
            raise DocumentError("lineage.gate", f"must be a GateMode, not {self.gate!r}")
        self._check_chain()
        if self.stats.accepted != len(self.transitions) or self.stats.rejected != len(self.rejections):
            raise DocumentError("lineage.stats", f"counts {self.stats.accepted} accepted / {self.stats.rejected} "
                                                 f"rejected disagree with {len(self.transitions)} transitions / "
                                                 f"{len(self.rejections)} rejections")
        self._check_limits()

    @property
    def assurance(self) -> Assurance:
        return Assurance.of(self.gate)

    @property
    def chain(self) -> tuple[str, ...]:
        """Fingerprints from the expert to the simplest state reached."""
        return (self.expert.fingerprint, *(t.child for t in self.transitions))

    def state(self, fingerprint: str) -> State:
        for state in self.states:
            if state.fingerprint == fingerprint:
                return state
        raise DocumentError("lineage", f"no state {fingerprint[:12]}")

    def _check_chain(self) -> None:
        expected = self.expert.fingerprint
        for position, transition in enumerate(self.transitions):
            where = f"transitions[{position}]"
            if transition.index != position:
                raise DocumentError(where, f"index {transition.index}: indices must run 0, 1, 2 ... without gaps")
            if transition.parent != expected:
                origin = "the expert" if position == 0 else f"the child of transition {position - 1}"
                raise DocumentError(where, f"parent {transition.parent[:12]} is not {origin} ({expected[:12]}): "
                                           f"the fingerprints do not chain")
            expected = transition.child
        chain = self.chain
        if len(set(chain)) != len(chain):
            raise DocumentError("lineage.transitions", "the walk returns to a state it already left")
        states = tuple(s.fingerprint for s in self.states)
        if states != chain:
            raise DocumentError("lineage.states", "states must be the expert, then each transition's child, in order")
        for position, rejection in enumerate(self.rejections):
            where = f"rejections[{position}]"
            if rejection.step > len(self.transitions):
                raise DocumentError(where, f"step {rejection.step} is past the last transition")
            if rejection.parent != chain[rejection.step]:
                raise DocumentError(where, f"parent {rejection.parent[:12]} is not the state of step {rejection.step}")
            if position and rejection.step < self.rejections[position - 1].step:
                raise DocumentError(where, "rejections must be in walk order")

    def _check_limits(self) -> None:
        kind = self.termination.kind
        if len(self.transitions) > self.limits.max_steps:
            raise DocumentError("lineage", f"{len(self.transitions)} transitions exceed max_steps "
                                           f"{self.limits.max_steps}")
        counted = sum(r.category.counts for r in self.rejections)
        if counted > self.limits.max_rejections:
            raise DocumentError("lineage", f"{counted} counted rejections exceed max_rejections "
                                           f"{self.limits.max_rejections}")
        if kind is Termination.STEP_LIMIT and len(self.transitions) != self.limits.max_steps:
            raise DocumentError("lineage.termination", "step_limit, but the walk did not reach max_steps")
        if kind is Termination.REJECTION_LIMIT and counted != self.limits.max_rejections:
            raise DocumentError("lineage.termination", "rejection_limit, but the walk did not reach max_rejections")

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "expert": self.expert.to_dict(), "problem": self.problem.to_dict(),
                "rewriter": self.rewriter, "gate": self.gate.value, "assurance": self.assurance.value,
                "policy": self.policy, "limits": self.limits.to_dict(), "states": [s.to_dict() for s in self.states],
                "transitions": [t.to_dict() for t in self.transitions],
                "rejections": [r.to_dict() for r in self.rejections], "termination": self.termination.to_dict(),
                "stats": self.stats.to_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> Lineage:
        data = has(data, ("version", "termination", "transitions"), "lineage")
        data = need(data, _TOP_LEVEL, "lineage")
        if data["version"] != LINEAGE_VERSION:
            raise DocumentError("lineage", f"unsupported version {data['version']!r} (this is {LINEAGE_VERSION})")
        for key in ("states", "transitions", "rejections"):
            if not isinstance(data[key], list):
                raise DocumentError(f"lineage.{key}", "must be a list")
        gate = enum(GateMode, data["gate"], "lineage.gate")
        assurance = enum(Assurance, data["assurance"], "lineage.assurance")
        if assurance is not Assurance.of(gate):
            raise DocumentError("lineage.assurance", f"{assurance.value} contradicts gate mode {gate.value}")
        if not isinstance(data["policy"], dict):
            raise DocumentError("lineage.policy", "must be an object")
        return cls(
            expert=KernelRef.from_dict(data["expert"]),
            problem=ProblemRef.from_dict(data["problem"]),
            rewriter=data["rewriter"],
            gate=gate,
            policy=data["policy"],
            limits=Limits.from_dict(data["limits"]),
            states=tuple(State.from_dict(s, f"states[{i}]") for i, s in enumerate(data["states"])),
            transitions=tuple(Transition.from_dict(t, f"transitions[{i}]") for i, t in enumerate(data["transitions"])),
            rejections=tuple(Rejection.from_dict(r, f"rejections[{i}]") for i, r in enumerate(data["rejections"])),
            termination=Outcome.from_dict(data["termination"]),
            stats=Stats.from_dict(data["stats"]),
            version=data["version"],
        )


def _anchor(data: Any, where: str) -> Anchor:
    data = has(data, ("function", "kind", "key"), where)
    for key in ("function", "kind", "key", "snippet"):
        text(data.get(key, ""), f"{where}.{key}")
    return Anchor.from_dict(data)


def _changes(data: Any, where: str) -> tuple[FeatureChange, ...]:
    if not isinstance(data, list):
        raise DocumentError(where, "must be a list")
    return tuple(FeatureChange.from_dict(f, f"{where}[{i}]") for i, f in enumerate(data))


def unified_diff(before: KernelState, after: KernelState, before_label: str = "a",
                 after_label: str = "b") -> str:
    """A unified diff of the source, followed by one of the launch plan when the plan changed."""
    parts = [_diff(before.source, after.source, f"{before_label}/kernel.cu", f"{after_label}/kernel.cu")]
    if before.plan != after.plan:
        plans = [json.dumps(p.to_dict(), sort_keys=True, indent=1) for p in (before.plan, after.plan)]
        parts.append(_diff(*plans, f"{before_label}/launch.json", f"{after_label}/launch.json"))
    return "".join(p for p in parts if p)


def _diff(before: str, after: str, before_label: str, after_label: str) -> str:
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), before_label, after_label, lineterm="")
    text = "\n".join(lines)
    return text + "\n" if text else ""
