"""The forward loop: reuse skill cards (or a baseline strategy) to optimize a kernel under the gate.

- `strategies`: where candidates come from (`Strategy`, `RewriterKind`, the planners);
- `result`: the optimization document (`OptimizationResult`, its attempts, steps and events);
- `loop`: `optimize(...)`, the gated loop with its budget.
"""

from klineage.optimize.loop import DEFAULT_POLICY, Lookahead, optimize
from klineage.optimize.result import (
    COMPILE_ONLY_NOTE,
    DEFAULT_REQUIRED_RATIO,
    Attempt,
    AttemptStatus,
    CodeCheck,
    EventKind,
    LibraryRef,
    OptimizationEvent,
    OptimizationResult,
    Step,
    Stop,
)
from klineage.optimize.strategies import Candidate, RewriterKind, Selection, Strategy

__all__ = ["Attempt", "AttemptStatus", "COMPILE_ONLY_NOTE", "Candidate", "CodeCheck", "DEFAULT_POLICY",
           "DEFAULT_REQUIRED_RATIO",
           "EventKind", "LibraryRef", "Lookahead", "OptimizationEvent", "OptimizationResult", "RewriterKind",
           "Selection", "Step", "Stop", "Strategy", "optimize"]
