"""Gate policy: how hard the gate looks. Part of every verdict's cache key."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any

from klineage.errors import DocumentError
from klineage.fingerprint import sha256_json


class Placement(str, Enum):
    """Where the timed kernels' modules sit while they are timed. Where a module's code lands can
    move a big kernel's time by 1.4x (docs/perf-notes.md, session 15): a byte-identical copy of a
    kernel ran 0.70x as fast as itself, only because it was loaded first."""
    AS_LOADED = "as_loaded"  # each kernel wherever it landed: fine for kernels of a few thousand instructions
    EXCHANGED = "exchanged"  # each round times every kernel in every kernel's place (runner.exchange_places)


class TimingScope(str, Enum):
    """Which cases a timed gate times. The headline alone says what a step buys on one shape; every
    case (the problem's cases and its timing-only `SWEEP` cases) says where it pays and where it
    does not, which is what a card's preconditions are induced from (klineage.skills.when)."""
    HEADLINE = "headline"  # the policy's timing_case, else the problem's headline
    EVERY_CASE = "every_case"  # each judged case and each sweep case the kernel supports, one after another


class Sanitize(str, Enum):
    NEVER = "never"
    ON_PASS = "on_pass"  # only kernels that passed correctness: catches latent races cheaply
    ALWAYS = "always"  # every kernel that ran: gives the most specific reason for failures


@dataclass(frozen=True)
class GatePolicy:
    seeds: int = 3
    timing: bool = True  # time the headline case (candidate, baseline, vendor interleaved)
    timing_case: str = ""  # empty: the problem's headline case
    vendor: bool = True  # time the problem's vendor path beside the candidate
    warmup: int = 5
    trials: int = 3
    min_reps: int = 15
    max_reps: int = 200
    trial_seconds: float = 3.0
    spread_target: float = 0.05  # stop a trial early once (p90 - p10) / median is under this
    input_sets: int = 3  # distinct fresh inputs rotated through the timed calls
    sanitize: Sanitize = Sanitize.ON_PASS
    launch_timeout_s: float = 10.0  # one synchronisation longer than this is a hang
    run_timeout_s: float = 900.0
    output_cap: int = 64 * 1024  # bytes of kernel output tolerated; more is a flood
    require_ratio: float = 0.0  # paired acceptance vs the baseline: 0 means not required
    placement: Placement = Placement.AS_LOADED
    timing_scope: TimingScope = TimingScope.HEADLINE

    def __post_init__(self) -> None:
        if not 1 <= self.seeds <= 16:
            raise DocumentError("policy", "seeds must be between 1 and 16")
        if not 1 <= self.trials <= 10 or not 1 <= self.min_reps <= self.max_reps:
            raise DocumentError("policy", "need 1..10 trials and 1 <= min_reps <= max_reps")
        if not 1 <= self.input_sets <= 8:
            raise DocumentError("policy", "input_sets must be between 1 and 8")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sanitize"] = self.sanitize.value
        if self.placement is Placement.AS_LOADED:  # a policy from before placement existed keeps its fingerprint
            del data["placement"]
        else:
            data["placement"] = self.placement.value
        if self.timing_scope is TimingScope.HEADLINE:  # likewise: recorded verdicts keep their keys
            del data["timing_scope"]
        else:
            data["timing_scope"] = self.timing_scope.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GatePolicy:
        if not isinstance(data, dict):
            raise DocumentError("policy", "must be a table")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise DocumentError("policy", f"unknown keys {sorted(unknown)}")
        values = dict(data)
        for key, kind in (("sanitize", Sanitize), ("placement", Placement), ("timing_scope", TimingScope)):
            if key in values:
                try:
                    values[key] = kind(values[key])
                except ValueError:
                    allowed = ", ".join(k.value for k in kind)
                    raise DocumentError("policy", f"{key} must be one of {allowed}, not {values[key]!r}") from None
        try:
            return cls(**values)
        except TypeError as exc:  # a value of the wrong type, e.g. seeds = "3"
            raise DocumentError("policy", str(exc)) from None

    @property
    def fingerprint(self) -> str:
        return sha256_json(self.to_dict())

    def with_(self, **changes: Any) -> GatePolicy:
        return replace(self, **changes)

    def correctness_twin(self) -> GatePolicy:
        """The same checks without timing. Correctness and sanitizer findings do not depend on what
        is timed, nor where, so a timed gate reuses its twin's verdict when one exists and runs only
        the timing; twins of many kernels can be judged side by side (timings cannot)."""
        return replace(self, timing=False, timing_case="", vendor=False, require_ratio=0.0,
                       placement=Placement.AS_LOADED, timing_scope=TimingScope.HEADLINE)

    def passes_imply(self, other: GatePolicy) -> bool:
        """Whether a kernel that passed this policy's correctness checks also passes `other`'s: the
        same checks with at least as many seeds (a gate runs seeds 0..seeds-1) and sanitizers run
        on a pass wherever `other` runs them. Only a pass carries over: a failure on seed 2 says
        nothing about a one-seed gate."""
        mine, theirs = self.correctness_twin(), other.correctness_twin()
        return (mine.seeds >= theirs.seeds and _SANITIZES_A_PASS[mine.sanitize] >= _SANITIZES_A_PASS[theirs.sanitize]
                and replace(mine, seeds=theirs.seeds, sanitize=theirs.sanitize) == theirs)


_SANITIZES_A_PASS = {Sanitize.NEVER: False, Sanitize.ON_PASS: True, Sanitize.ALWAYS: True}


QUICK = GatePolicy(seeds=3, timing=False, sanitize=Sanitize.NEVER)
STRICT = GatePolicy(seeds=3, sanitize=Sanitize.ALWAYS)
