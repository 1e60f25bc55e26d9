"""Which steps of a walk changed the machine code, recorded so that a library build need not compile.

A backward step whose child runs its parent's machine code (klineage.gate.machine_code: the same SASS and
resources, launched alike) has a true ratio of 1: its forward is what nvcc had done already (a `restrict`
it had inferred, an unroll it had made, a `__launch_bounds__` that moves no register). Its timings, on
the headline or on every case, measure the noise of the pairing, not the mechanism, so induction leaves
them out of a card's *when* (klineage.skills.when) and of its measured risks.

Knowing it means compiling both states of every step: hundreds of kernels, minutes each on a small
machine. `census` does it once, on as many processes as the host has, and a `StepCodes` record keeps
the answer by lineage id and step index with the toolchain that compiled them; `klineage library build`
reads the record (bench/step_code.py writes it). A step the record lacks is UNCHECKED: its timings
count as before.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
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
    """Per lineage id (klineage.skills.induction.lineage_id), per step index, whether the step's two
    states run the same machine code, as `toolchain` compiled them."""

    toolchain: str
    steps: Mapping[str, Mapping[int, CodeIdentity]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        nonblank(self.toolchain, "step codes.toolchain")
        steps = {}
        for lineage, by_index in self.steps.items():
            nonblank(lineage, "step codes.steps")
            steps[lineage] = {int(i): enum(CodeIdentity, v, f"step codes.steps[{lineage}][{i}]")
                              for i, v in by_index.items()}
        object.__setattr__(self, "steps", steps)

    def identity(self, lineage: str, index: int) -> CodeIdentity:
        return self.steps.get(lineage, {}).get(index, CodeIdentity.UNCHECKED)

    def same(self) -> int:
        return sum(v is CodeIdentity.SAME for by_index in self.steps.values() for v in by_index.values())

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "toolchain": self.toolchain,
                "steps": {lineage: {str(i): v.value for i, v in sorted(by_index.items())}
                          for lineage, by_index in sorted(self.steps.items())}}

    @classmethod
    def from_dict(cls, data: Any, where: str = "step codes") -> StepCodes:
        data = need(data, ("version", "toolchain", "steps"), where)
        if data["version"] != VERSION:
            raise DocumentError(where, f"unsupported version {data['version']!r} (this engine reads {VERSION})")
        if not isinstance(data["steps"], dict) or not all(isinstance(v, dict) for v in data["steps"].values()):
            raise DocumentError(f"{where}.steps", "must map a lineage id to a table of step index -> identity")
        try:
            steps = {lineage: {int(i): v for i, v in by_index.items()} for lineage, by_index in data["steps"].items()}
        except ValueError as bad:
            raise DocumentError(f"{where}.steps", f"a step index is not a whole number: {bad}") from None
        return cls(data["toolchain"], steps)

    @classmethod
    def load(cls, path: str | Path) -> StepCodes:
        try:
            data = json.loads(read_document_text(path, "step codes"))
        except json.JSONDecodeError as bad:
            raise DocumentError(str(path), f"not JSON: {bad}") from None
        return cls.from_dict(data, str(path))

    def save(self, path: str | Path) -> Path:
        return save_document(self.to_dict(), path)


def code_digest(kernel: KernelState) -> str | None:
    """A content digest of the state's machine code (None where it is not known): two states run the
    same code exactly when their digests are equal."""
    code = machine_code(kernel)
    if code is None:
        return None
    text = json.dumps([code.sass, code.resources, code.launch], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def census(lineages: Mapping[str, Lineage], toolchain: str, *, jobs: int = 1, deadline: float | None = None,
           earlier: StepCodes | None = None) -> StepCodes:
    """Every step of `lineages` (by lineage id) compared, each state compiled once on `jobs` processes;
    the steps `earlier` decided (same toolchain) are kept, not compiled again. At `deadline` (a
    time.monotonic() value) the steps still open are left out, so a later call resumes where this stopped."""
    if earlier is not None and earlier.toolchain != toolchain:
        earlier = None  # another compiler's code says nothing of this one's
    known = {lineage: dict(by_index) for lineage, by_index in (earlier.steps if earlier else {}).items()}
    open_steps = [(lid, i) for lid, lineage in lineages.items() for i in range(len(lineage.transitions))
                  if known.get(lid, {}).get(i, CodeIdentity.UNCHECKED) is CodeIdentity.UNCHECKED]
    kernels: dict[str, KernelState] = {}
    for lid, i in open_steps:
        for state in lineages[lid].states[i:i + 2]:
            kernels.setdefault(state.kernel.fingerprint, state.kernel)
    digests = _digests(kernels, jobs, deadline)
    for lid, i in open_steps:
        pair = [digests.get(s.kernel.fingerprint, "") for s in lineages[lid].states[i:i + 2]]
        if "" in pair:  # not compiled before the deadline: open for the next call
            continue
        identity = (CodeIdentity.UNCHECKED if None in pair else
                    CodeIdentity.SAME if pair[0] == pair[1] else CodeIdentity.DIFFERENT)
        known.setdefault(lid, {})[i] = identity
    return StepCodes(toolchain, known)


def _digests(kernels: Mapping[str, KernelState], jobs: int, deadline: float | None) -> dict[str, str | None]:
    """fingerprint -> code digest (None: it did not compile) for those done before the deadline."""
    done: dict[str, str | None] = {}
    pool = ProcessPoolExecutor(max(1, jobs))
    try:
        running = {pool.submit(code_digest, kernel): fingerprint for fingerprint, kernel in kernels.items()}
        while running:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            finished, _ = wait(running, timeout=left, return_when=FIRST_COMPLETED)
            for future in finished:
                done[running.pop(future)] = future.result()
    finally:
        pool.shutdown(wait=deadline is None, cancel_futures=True)
    return done

