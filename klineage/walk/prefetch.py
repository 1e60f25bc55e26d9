"""The states a walk will probably reach: those of a recorded walk of the same expert, to prefetch."""

from __future__ import annotations

from pathlib import Path

from klineage.errors import KLineageError
from klineage.kernel import KernelState
from klineage.lineage import Lineage


def guessed_states(lineage_path: str | Path, expert: KernelState) -> list[KernelState]:
    """The states of a recorded walk of the same expert, in walk order. A lineage of another
    expert guesses nothing useful and is refused."""
    lineage = Lineage.load(Path(lineage_path))
    if lineage.expert.fingerprint != expert.fingerprint:
        raise KLineageError(f"{lineage_path} walked {lineage.expert.name} {lineage.expert.fingerprint[:12]}, "
                            f"not {expert.name} {expert.fingerprint[:12]}: nothing to prefetch from it")
    return [state.kernel for state in lineage.states]
