"""Which steps of a walk changed the machine code, recorded so that a library build need not compile.

A backward step whose child runs its parent's machine code (klineage.gate.machine_code: the same SASS and
resources, launched alike) has a true ratio of 1: its forward is what nvcc had done already (a `restrict`
it had inferred, an unroll it had made, a `__launch_bounds__` that moves no register). Its timings, on
the headline or on every case, measure the noise of the pairing, not the mechanism, so induction leaves
them out of a card's *when* (klineage.skills.when) and of its measured risks.

Knowing it means compiling both states of every step: about 700 kernels for the GPU walks, some seconds
each and the MMA kernels up to half a minute. `census` does it once, on as many processes as the host
has, and a `StepCodes` record keeps the answer by the step's two kernel fingerprints with the toolchain
that compiled them; `klineage library build` reads the record (bench/step_code.py writes it). A step the
record lacks is UNCHECKED: its timings count as before. A walk made with the code check marks such steps
itself (`ForwardStatus.SAME_CODE`, klineage.walk.walker).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klineage.documents import enum, need, nonblank, read_document_text, save_document
from klineage.errors import DocumentError
from klineage.gate.machine_code import CodeIdentity, machine_code
from klineage.kernel import KernelState
from klineage.lineage import Lineage

VERSION = 1


@dataclass(frozen=True)
class StepCodes:
    """Per step, keyed by its parent's and its child's kernel fingerprints (two walks of one expert share
    a lineage id, never a step), whether the two run the same machine code as `toolchain` compiled them."""

    toolchain: str
    steps: Mapping[str, Mapping[str, CodeIdentity]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        nonblank(self.toolchain, "step codes.toolchain")
        steps = {}
        for parent, children in self.steps.items():
            nonblank(parent, "step codes.steps")
            if not isinstance(children, Mapping):
                raise DocumentError(f"step codes.steps[{parent[:12]}]", "must map a child fingerprint to an identity")
            steps[parent] = {child: enum(CodeIdentity, v, f"step codes.steps[{parent[:12]}][{child[:12]}]")
                             for child, v in children.items()}
        object.__setattr__(self, "steps", steps)

    def identity(self, parent: str, child: str) -> CodeIdentity:
        return self.steps.get(parent, {}).get(child, CodeIdentity.UNCHECKED)

    def of(self, lineage: Lineage, index: int) -> CodeIdentity:
        """Step `index` of `lineage`, by the fingerprints its transition names."""
        step = lineage.transitions[index]
        return self.identity(step.parent, step.child)

    def same(self) -> int:
        return sum(v is CodeIdentity.SAME for children in self.steps.values() for v in children.values())

    def decided(self) -> int:
        return sum(v is not CodeIdentity.UNCHECKED for children in self.steps.values() for v in children.values())

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "toolchain": self.toolchain,
                "steps": {parent: {child: v.value for child, v in sorted(children.items())}
                          for parent, children in sorted(self.steps.items())}}

    @classmethod
    def from_dict(cls, data: Any, where: str = "step codes") -> StepCodes:
        data = need(data, ("version", "toolchain", "steps"), where)
        if data["version"] != VERSION:
            raise DocumentError(where, f"unsupported version {data['version']!r} (this engine reads {VERSION})")
        if not isinstance(data["steps"], dict):
            raise DocumentError(f"{where}.steps", "must map a parent fingerprint to a table of child -> identity")
        return cls(data["toolchain"], data["steps"])

    @classmethod
    def load(cls, path: str | Path) -> StepCodes:
        try:
            data = json.loads(read_document_text(path, "step codes"))
        except json.JSONDecodeError as bad:
            raise DocumentError(str(path), f"not JSON: {bad}") from None
        return cls.from_dict(data, str(path))

    def save(self, path: str | Path) -> Path:
        return save_document(self.to_dict(), path)


def census(steps: Iterable[tuple[KernelState, KernelState]], toolchain: str, *, jobs: int = 1,
           deadline: float | None = None, earlier: StepCodes | None = None) -> StepCodes:
    """Every (parent, child) step compared, each state compiled once on `jobs` processes; the steps
    `earlier` decided (same toolchain) are kept, not compiled again. At `deadline` (a time.monotonic()
    value) the steps still open are left out, so a later call resumes where this stopped."""
    if earlier is not None and earlier.toolchain != toolchain:
        earlier = None  # another compiler's code says nothing of this one's
    known = {parent: dict(children) for parent, children in (earlier.steps if earlier else {}).items()}
    pairs = {(parent.fingerprint, child.fingerprint): (parent, child) for parent, child in steps}
    open_pairs = {pair: kernels for pair, kernels in pairs.items()
                  if known.get(pair[0], {}).get(pair[1], CodeIdentity.UNCHECKED) is CodeIdentity.UNCHECKED}
    digests = _digests({k.fingerprint: k for kernels in open_pairs.values() for k in kernels}, jobs, deadline)
    for parent, child in open_pairs:
        pair = [digests.get(parent, ""), digests.get(child, "")]
        if "" in pair:  # not compiled before the deadline: open for the next call
            continue
        known.setdefault(parent, {})[child] = (CodeIdentity.UNCHECKED if None in pair else
                                               CodeIdentity.SAME if pair[0] == pair[1] else CodeIdentity.DIFFERENT)
    return StepCodes(toolchain, known)


def walk_steps(lineage: Lineage) -> list[tuple[KernelState, KernelState]]:
    """The (parent, child) kernels of each accepted step of a walk, in order."""
    return [(a.kernel, b.kernel) for a, b in zip(lineage.states, lineage.states[1:])]


def _digests(kernels: Mapping[str, KernelState], jobs: int, deadline: float | None) -> dict[str, str | None]:
    """fingerprint -> code digest (None: it did not compile) for those done before the deadline. At the
    deadline the workers are killed, not awaited: a compile still running would hold its caller's output open."""
    done: dict[str, str | None] = {}
    with multiprocessing.Pool(max(1, jobs)) as pool:  # leaving the block terminates the workers
        results = pool.imap_unordered(_digest_of, kernels.items())
        for _ in kernels:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            try:
                fingerprint, digest = results.next(timeout=left)
            except multiprocessing.TimeoutError:
                break
            done[fingerprint] = digest
    return done


def _digest_of(item: tuple[str, KernelState]) -> tuple[str, str | None]:
    """(fingerprint, the digest of the state's machine code, or None where it is not known)."""
    code = machine_code(item[1])
    return item[0], None if code is None else code.digest()
