"""The gate's verdict: one JSON record per (kernel, problem, cases, GPU, toolchain, policy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from klineage.config import GateMode
from klineage.errors import DocumentError
from klineage.gate.timing import PairedRatio, Settlement

VERDICT_VERSION = 1  # the document's layout
# What the gate checks and how it decides; part of every verdict key made by version 2 on (cache.py).
# 1: the gate until issue 29 (keys without a gate part); 2: distinct poison patterns for every buffer
# and guard, and timings that settle or say `unsettled` and decide nothing.
GATE_VERSION = 2


class Status(str, Enum):
    PASSED = "passed"  # every stage that ran passed, GPU stages included
    COMPILED = "compiled"  # compile-only run: static check and compile passed, nothing ran
    REJECTED = "rejected"  # a stage found the kernel wrong, unsafe or unrunnable
    ERROR = "error"  # the harness or the problem failed, not the kernel: no judgement on it

    @classmethod
    def passing(cls, mode: GateMode) -> Status:
        """The status of a kernel that passes under `mode`: a compile-only gate runs nothing, so the
        most it can say is compiled."""
        return cls.COMPILED if mode is GateMode.COMPILE_ONLY else cls.PASSED


class Reason(str, Enum):
    """Why a kernel was rejected. Declaration order is priority: when a run finds several
    problems, the verdict's reason is the earliest listed, the most specific evidence."""

    STATIC_CHECK = "static_check"
    COMPILE_ERROR = "compile_error"
    PLAN_ERROR = "plan_error"
    RESOURCE_LIMIT = "resource_limit"
    LAUNCH_ERROR = "launch_error"
    TIMEOUT = "timeout"
    OUTPUT_FLOOD = "output_flood"
    CRASH = "crash"  # illegal address, misaligned access, trap: the context died
    OUT_OF_BOUNDS_WRITE = "out_of_bounds_write"  # a guard region around a buffer was overwritten
    MEMCHECK = "memcheck"  # compute-sanitizer memcheck found an invalid access
    RACE = "race"  # compute-sanitizer racecheck found a shared-memory hazard
    INPUT_MODIFIED = "input_modified"
    STALE_OUTPUT = "stale_output"  # matches the answer for earlier inputs: caching across calls
    UNWRITTEN_OUTPUT = "unwritten_output"  # poison still there: elements never written
    NAN_OUTPUT = "nan_output"
    NONDETERMINISTIC = "nondeterministic"
    INCORRECT = "incorrect"
    TIMED_OUTPUT_INCORRECT = "timed_output_incorrect"
    UNKNOWN = "unknown"

    @property
    def priority(self) -> int:
        return list(Reason).index(self)


@dataclass(frozen=True)
class Finding:
    """One reason with its evidence; a verdict's first finding decides it."""

    reason: Reason
    stage: str
    message: str
    case: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason.value, "stage": self.stage, "message": self.message,
                "case": self.case, "evidence": self.evidence}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        try:
            reason = Reason(data["reason"])
        except (KeyError, ValueError):
            raise DocumentError("finding", f"unknown reason {data.get('reason')!r}") from None
        return cls(reason, data.get("stage", ""), data.get("message", ""), data.get("case", ""),
                   dict(data.get("evidence", {})))


@dataclass(frozen=True)
class Verdict:
    status: Status
    kernel: dict[str, str]  # name, fingerprint
    problem: dict[str, str]  # operator, fingerprint
    cases: tuple[str, ...]
    policy: dict[str, Any]
    findings: tuple[Finding, ...] = ()
    static: dict[str, Any] = field(default_factory=dict)
    compile: dict[str, Any] = field(default_factory=dict)
    features: dict[str, Any] = field(default_factory=dict)
    correctness: tuple[dict[str, Any], ...] = ()
    profile: dict[str, Any] = field(default_factory=dict)
    sanitizer: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per stage
    domain: dict[str, Any] = field(default_factory=dict)  # declared supported cases and those skipped

    def __post_init__(self) -> None:
        object.__setattr__(self, "findings", tuple(sorted(self.findings, key=lambda f: f.reason.priority)))
        if self.status is Status.REJECTED and not self.findings:
            raise DocumentError("verdict", "a rejected verdict needs at least one finding")
        if self.status in (Status.PASSED, Status.COMPILED) and self.findings:
            raise DocumentError("verdict", f"a {self.status.value} verdict cannot carry findings")

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def gate_version(self) -> int:
        """The version of the gate that made this verdict (provenance; absent: version 1)."""
        return int(self.provenance.get("gate_version", 1))

    @property
    def settlement(self) -> Settlement | None:
        """How the timing ended; None where nothing was timed, or the gate predates the settle check."""
        state = (self.profile.get("settlement") or {}).get("state")
        return Settlement(state) if state else None

    @property
    def unsettled(self) -> bool:
        """Timed, but the timing never settled: no ratio of it may accept or refuse a kernel."""
        return self.settlement is Settlement.UNSETTLED

    def paired_ratio(self, name: str = "vs_baseline") -> PairedRatio | None:
        """A ratio of the timing (reference time / candidate time) that may decide: None where it was
        not measured or the timing is unsettled."""
        found = self.profile.get("ratios", {}).get(name)
        if not found or self.unsettled:
            return None
        return PairedRatio(float(found["overall"]), tuple(float(r) for r in found["per_trial"]))

    @property
    def reason(self) -> Reason | None:
        return self.findings[0].reason if self.findings else None

    def describe(self, width: int | None = None) -> str:
        """Why, for a message: the status and the first finding's reason, case and message (given
        `width`, the message on one line, cut to that many characters), or the harness error's tail."""
        if self.findings:
            first = self.findings[0]
            where = f" [{first.case}]" if first.case else ""
            message = first.message if width is None else " ".join(first.message.split())[:width]
            return f"{self.status.value}, {first.reason.value}{where}: {message}"
        if self.status is Status.ERROR:
            return f"error: {str(self.environment.get('error', ''))[-400:]}"
        if self.unsettled:
            return f"{self.status.value}, timing: unsettled ({'; '.join(self.profile['settlement']['reasons'])})"
        return self.status.value

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERDICT_VERSION,
            "status": self.status.value,
            "reason": self.reason.value if self.reason else None,
            "kernel": self.kernel,
            "problem": self.problem,
            "cases": list(self.cases),
            "policy": self.policy,
            "findings": [f.to_dict() for f in self.findings],
            "static": self.static,
            "compile": self.compile,
            "features": self.features,
            "correctness": list(self.correctness),
            "profile": self.profile,
            "sanitizer": self.sanitizer,
            "environment": self.environment,
            "provenance": self.provenance,
            "timings": self.timings,
            "domain": self.domain,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Verdict:
        if not isinstance(data, dict):
            raise DocumentError("verdict", "must be an object")
        if data.get("version") != VERDICT_VERSION:
            raise DocumentError("verdict", f"unsupported version {data.get('version')!r}")
        try:
            status = Status(data["status"])
        except (KeyError, ValueError):
            raise DocumentError("verdict", f"unknown status {data.get('status')!r}") from None
        for key in ("kernel", "problem", "cases", "policy"):
            if key not in data:
                raise DocumentError("verdict", f"missing '{key}'")
        state = ((data.get("profile") or {}).get("settlement") or {}).get("state")
        if state is not None and state not in {s.value for s in Settlement}:
            raise DocumentError("verdict", f"unknown timing settlement {state!r}")
        return cls(
            status=status,
            kernel=dict(data["kernel"]),
            problem=dict(data["problem"]),
            cases=tuple(data["cases"]),
            policy=dict(data["policy"]),
            findings=tuple(Finding.from_dict(f) for f in data.get("findings", [])),
            static=dict(data.get("static", {})),
            compile=dict(data.get("compile", {})),
            features=dict(data.get("features", {})),
            correctness=tuple(data.get("correctness", [])),
            profile=dict(data.get("profile", {})),
            sanitizer=dict(data.get("sanitizer", {})),
            environment=dict(data.get("environment", {})),
            provenance=dict(data.get("provenance", {})),
            timings=dict(data.get("timings", {})),
            domain=dict(data.get("domain", {})),
        )
