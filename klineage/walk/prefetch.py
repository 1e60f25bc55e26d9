"""The states a walk will probably reach: those of a recorded walk of the same expert, to prefetch."""

from __future__ import annotations

from pathlib import Path

from klineage.config import GateMode
from klineage.errors import KLineageError
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import stored_verdict
from klineage.gate.policy import GatePolicy
from klineage.kernel import KernelState
from klineage.lineage import Lineage


def guessed_walk(lineage_path: str | Path, expert: KernelState) -> Lineage:
    """A recorded walk of the same expert. A lineage of another expert guesses nothing useful and
    is refused."""
    lineage = Lineage.load(Path(lineage_path))
    if lineage.expert.fingerprint != expert.fingerprint:
        raise KLineageError(f"{lineage_path} walked {lineage.expert.name} {lineage.expert.fingerprint[:12]}, "
                            f"not {expert.name} {expert.fingerprint[:12]}: nothing to prefetch from it")
    return lineage


def guessed_states(lineage_path: str | Path, expert: KernelState) -> list[KernelState]:
    """The states of a recorded walk of the same expert, in walk order."""
    return [state.kernel for state in guessed_walk(lineage_path, expert).states]


def untimed_states(problem: str | Path, guess: Lineage, timing_policy: GatePolicy, cache: GateCache,
                   mode: GateMode = GateMode.GPU) -> set[str]:
    """The fingerprints of the states the walk will compile for its forward timings: both ends of
    each guessed step whose timing (the parent against the child) no store holds. A resumed walk
    replays the steps before them without compiling anything."""
    states = {state.fingerprint: state.kernel for state in guess.states}
    pending: set[str] = set()
    for step in guess.transitions:
        if stored_verdict(problem, states[step.parent], against=states[step.child], policy=timing_policy,
                          mode=mode, cache=cache) is None:
            pending |= {step.parent, step.child}
    return pending
