"""Named source transforms: the rule rewriter's vocabulary.

Each transform is one unit, in the manner of a compiler pattern rewrite: it finds the sites where
its mechanism lives (`find`), removes the mechanism at one site (`backward`, the walk's
simplification) and, where a mechanical inverse exists, puts it back (`forward`, the skill the
walk teaches). Sites are named by anchors that survive unrelated edits: the enclosing function
and a stable key (a variable, a helper's name, the n-th loop over an index), never line numbers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from klineage.errors import DocumentError, KLineageError
from klineage.features.cuda_parser import Function, syntax_errors
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan


class Role(str, Enum):
    """A mechanism becomes a skill; carrier tuning (tile sizes, vector widths) travels with one."""

    MECHANISM = "mechanism"
    CARRIER = "carrier"


class Direction(str, Enum):
    BACKWARD = "backward"  # remove the mechanism: expert -> naive
    FORWARD = "forward"  # add it back: naive -> expert


class Placement(str, Enum):
    """How a transform's forward finds where to go on a kernel it was never walked from."""

    ANCHORED = "anchored"  # at the anchors of its walks, and the few sites `forward_sites` can name
    ANALYSIS = "analysis"  # wherever an analysis of the kernel's structure shows the rewrite is legal


class NotApplicable(KLineageError):
    """The transform cannot apply at this site; the message says why (it becomes walk evidence)."""


# where a caller asked (`refusals`), why each kernel was not read as a site: what a user whose kernel got no
# site from a forward needs to see, so that they can tell a spelling the forward does not read from a real misfit
_REFUSALS: ContextVar[list[str] | None] = ContextVar("refusals", default=None)


@contextmanager
def refusals() -> Iterator[list[str]]:
    """Collects, while the block runs, "kernel: why" for every kernel a forward's site search refused."""
    token = _REFUSALS.set(collected := [])
    try:
        yield collected
    finally:
        _REFUSALS.reset(token)


def refused(function: Function, error: NotApplicable) -> None:
    """Notes why `function` is no site, where a caller collects refusals (a helper function is no site by design)."""
    collected = _REFUSALS.get()
    if collected is not None and function.is_kernel and (why := f"{function.name}: {error}") not in collected:
        collected.append(why)


@dataclass(frozen=True)
class Anchor:
    """Where a transform acts: function, the kind of code surface, and a stable key within it."""

    function: str  # enclosing function name, or "<file>"
    kind: str  # "loop", "declaration", "call", "asm", "function", "pragma", "plan" ...
    key: str  # e.g. the vector variable's name, a helper's name, "loop:k#0"
    snippet: str = field(default="", compare=False)  # representative code, for people and cards

    def __post_init__(self) -> None:
        if not self.function or not self.kind or not self.key:
            raise DocumentError("anchor", "needs function, kind and key")

    def to_dict(self) -> dict[str, str]:
        return {"function": self.function, "kind": self.kind, "key": self.key, "snippet": self.snippet}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Anchor:
        return cls(data["function"], data["kind"], data["key"], data.get("snippet", ""))

    def __str__(self) -> str:
        return f"{self.function}/{self.kind}:{self.key}"


@dataclass(frozen=True)
class Rewrite:
    """The result of applying a transform at one anchor."""

    transform: str
    direction: Direction
    anchor: Anchor
    state: KernelState  # the rewritten kernel (source and, when it changed, plan)
    removes: tuple[str, ...] = ()  # feature names taken away at the anchor's function
    adds: tuple[str, ...] = ()
    carrier: dict[str, Any] = field(default_factory=dict)  # tuning values that travel with it
    note: str = ""

    def __post_init__(self) -> None:
        issues = syntax_errors(self.state.source)
        if issues:
            first = issues[0]
            raise NotApplicable(f"{self.transform} produced source that does not parse "
                                f"(line {first.line}, column {first.column}: {first.text!r})")

    def to_dict(self) -> dict[str, Any]:
        return {"transform": self.transform, "direction": self.direction.value, "anchor": self.anchor.to_dict(),
                "kernel": self.state.to_dict(), "removes": list(self.removes), "adds": list(self.adds),
                "carrier": self.carrier, "note": self.note}


class Transform(ABC):
    """Subclasses set the class attributes and implement `find` and `backward` (and `forward`)."""

    name: str  # unique, snake_case: "devectorize", "unpipeline", ...
    intent: str  # the abstract goal of the FORWARD direction, one sentence
    role: Role = Role.MECHANISM
    removes: tuple[str, ...] = ()  # source/SASS feature names the backward direction takes away
    adds: tuple[str, ...] = ()  # feature names the backward direction introduces (e.g. syncthreads)
    # Mechanisms that must be removed first because they depend on this one (the walk's order:
    # ldmatrix and MMA before shared staging, pipelining before async copies).
    after: tuple[str, ...] = ()
    # ANALYSIS: `forward_sites` places the mechanism on any kernel with the structure it needs, so a card
    # of another transform with the same mechanism proposes it there too (`skills.materialize.card_sites`).
    placement: Placement = Placement.ANCHORED
    # Transforms of the same mechanism that share no feature name with this one (padding has none): their
    # cards propose this transform's analysis sites too.
    kin: tuple[str, ...] = ()
    # Whether those cards propose its analysis sites at all: off for a forward no walk has measured yet where a
    # card's path taking it first would rule out a route the cards' evidence measured (the catalog still has it).
    lent: bool = True

    @abstractmethod
    def find(self, state: KernelState) -> list[Anchor]:
        """Every anchor where the mechanism is present (empty when there is none)."""

    @abstractmethod
    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        """Remove the mechanism at `anchor`; raise NotApplicable with the reason if it cannot."""

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        """Add the mechanism at `anchor` (of the simpler state). Default: no mechanical inverse."""
        raise NotApplicable(f"{self.name} has no mechanical forward rewrite; an LLM must materialize it")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        """Anchors of `state` where `forward` could add the mechanism afresh (a site no backward step
        made), keyed with the tuning values `carrier` names (a card's carrier: key -> values seen).
        Default: none; a transform whose forward can be placed on an arbitrary kernel overrides it."""
        return []

    @staticmethod
    def carrier_values(carrier: Mapping[str, Any] | None, key: str) -> list[Any]:
        """The values a card's carrier lists for `key`, in its order ([] when it names none)."""
        values = (carrier or {}).get(key, [])
        return list(values) if isinstance(values, list) else [values]

    @classmethod
    def carrier_counts(cls, carrier: Mapping[str, Any] | None, *keys: str, above: int = 0) -> list[int]:
        """The distinct whole numbers above `above` that a card's carrier lists under `keys`, in its order."""
        values = [value for key in keys for value in cls.carrier_values(carrier, key)]
        return list(dict.fromkeys(int(v) for v in values if str(v).isdigit() and int(v) > above))

    @property
    def has_forward(self) -> bool:
        return type(self).forward is not Transform.forward

    def rewrite(self, state: KernelState, anchor: Anchor, direction: Direction, source: str,
                plan: LaunchPlan | None = None, **details: Any) -> Rewrite:
        """Build a Rewrite; the shared helper every transform returns through."""
        new_state = KernelState(source=source, plan=plan or state.plan)
        if new_state.fingerprint == state.fingerprint:
            raise NotApplicable(f"{self.name} changed nothing at {anchor}")
        removes, adds = (self.removes, self.adds) if direction is Direction.BACKWARD else (self.adds, self.removes)
        return Rewrite(self.name, direction, anchor, new_state, removes=removes, adds=adds, **details)

    def comes_back(self, state: KernelState, anchor: Anchor, simplified: Rewrite, undone: str) -> Rewrite:
        """`simplified` (this transform's backward of `state`) where the forward writes `state` again from it, else
        NotApplicable naming `undone` ("rerolled, k would not unroll back"): a backward that reads its own forward
        form is legal only where that form is all there is (a `break` in unrolled work, an edited shuffle pass)."""
        try:
            again = self.forward(simplified.state, anchor).state.source
        except NotApplicable as error:
            raise NotApplicable(f"{anchor}: {undone} ({error})") from None
        if again != state.source:
            raise NotApplicable(f"{anchor}: {undone} to this kernel")
        return simplified

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "intent": self.intent, "role": self.role.value, "removes": list(self.removes),
                "adds": list(self.adds), "after": list(self.after), "has_forward": self.has_forward}


def with_plan(state: KernelState, **changes: Any) -> LaunchPlan:
    """A copy of the state's plan with some fields replaced (e.g. launches with a new grid)."""
    return replace(state.plan, **changes)
