"""What every rewriter gives the walk: proposals, and what the walk gives back: its history.

A rewriter looks at a kernel state and proposes backward simplifications, one `Proposal` per
(transform, anchor): the rewrite to gate, or the reason the transform does not apply there (which
the walk keeps as evidence). The walk gates proposals in the order they come and accepts the
first that passes; it records every attempt in the `History` it passed to `propose`, while the
iterator is still running, so a rewriter that reads the history lazily sees what was rejected at
this state a moment ago.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from klineage.errors import DocumentError
from klineage.kernel import KernelState
from klineage.transforms.base import Anchor, Direction, Rewrite


@dataclass(frozen=True)
class Proposal:
    """One candidate step: a backward `rewrite`, or the reason there is none (not both)."""

    transform: str
    anchor: Anchor | None  # None only when the transform failed before naming a site
    rewrite: Rewrite | None = None
    not_applicable_reason: str = ""

    def __post_init__(self) -> None:
        if not self.transform:
            raise DocumentError("proposal", "needs a transform name")
        if (self.rewrite is None) == (not self.not_applicable_reason):
            raise DocumentError("proposal", "carries either a rewrite or the reason it is not applicable")
        if self.rewrite is not None:
            if self.rewrite.direction is not Direction.BACKWARD:
                raise DocumentError("proposal", "a walk proposal is a backward rewrite")
            if self.anchor is None:
                object.__setattr__(self, "anchor", self.rewrite.anchor)

    @property
    def applicable(self) -> bool:
        return self.rewrite is not None

    def __str__(self) -> str:
        return f"{self.transform} at {self.anchor}" if self.anchor else self.transform


class AttemptOutcome(str, Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"  # gated and refused, audited and refused, or not applicable


@dataclass(frozen=True)
class Attempt:
    """One proposal the walk dealt with, as a rewriter (or a prompt) sees it."""

    step: int  # the transition it was a candidate for
    parent: str  # fingerprint of the state it was proposed at
    transform: str
    anchor: Anchor | None
    outcome: AttemptOutcome
    category: str = ""  # the rejection category, "" when accepted
    reason: str = ""  # the gate's reason, or a short why
    evidence: str = ""  # one line of evidence

    @property
    def accepted(self) -> bool:
        return self.outcome is AttemptOutcome.ACCEPTED


class History(Sequence[Attempt]):
    """The walk's attempts, oldest first. Append-only; the walk adds to it during `propose`."""

    def __init__(self, attempts: Sequence[Attempt] = ()):
        self._attempts: list[Attempt] = list(attempts)

    def record(self, attempt: Attempt) -> None:
        self._attempts.append(attempt)

    def tried_at(self, fingerprint: str) -> set[tuple[str, Anchor | None]]:
        """(transform, anchor) pairs already dealt with at the state with this fingerprint."""
        return {(a.transform, a.anchor) for a in self._attempts if a.parent == fingerprint}

    def __getitem__(self, index):  # type: ignore[override]
        return self._attempts[index]

    def __len__(self) -> int:
        return len(self._attempts)

    def __repr__(self) -> str:
        return f"History({len(self._attempts)} attempts)"


@runtime_checkable
class Rewriter(Protocol):
    name: str

    def propose(self, state: KernelState, history: History) -> Iterator[Proposal]:
        """Candidate backward steps at `state`, best first; lazily, so the walk can stop early."""
        ...


__all__ = ["Attempt", "AttemptOutcome", "History", "Proposal", "Rewriter"]
