"""Vector replay: a card's forward step re-applied to a kernel as the diff its walk recorded.

Where a transform has no mechanical forward (a pipeline's prologue and refill placement are design
choices no finder can reconstruct), the lineage still holds the step itself: the forward diff from
the simpler state back to the expert-side one. Replaying it on another state works where that
state still reads like the walk's child around each hunk, which is what a roundtrip from the
walk's own naive end gives: later simplifications rewrote other lines, not these.

Matching is strict, like `patch` without fuzz: every hunk's old lines (context and removals) must
appear exactly once in the target, else the replay does not apply; verbatim first, else once with
each line's leading and trailing blanks ignored (`patch --ignore-whitespace`: the rule rewriter
may indent a restored `#pragma` otherwise than the expert did, which changes no code). The
launch-plan part of a diff (its canonical JSON) is replayed the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping

from klineage.errors import DocumentError
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.lineage import Lineage
from klineage.skills.card import RefKind, SkillCard
from klineage.transforms import get
from klineage.transforms.base import Direction, NotApplicable, Rewrite

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def apply_diff(text: str, diff: str) -> str | None:
    """`text` with the hunks of a one-file unified diff applied, or None when any hunk's old lines
    are not found exactly once."""
    lines = text.split("\n")
    for old, new in _hunks(diff):
        at = _found(lines, old, str)
        if at is None:
            at = _found(lines, old, str.strip)
        if at is None:
            return None
        lines[at:at + len(old)] = new
    return "\n".join(lines)


def _found(lines: list[str], old: list[str], same: Callable[[str], str]) -> int | None:
    """Where `old` is in `lines`, comparing lines by `same`: its only place, else None."""
    wanted, keyed = [same(line) for line in old], [same(line) for line in lines]
    at = [i for i in range(len(lines) - len(old) + 1) if keyed[i:i + len(old)] == wanted] if old else []
    return at[0] if len(at) == 1 else None


def _hunks(diff: str) -> list[tuple[list[str], list[str]]]:
    hunks: list[tuple[list[str], list[str]]] = []
    for line in diff.split("\n"):
        if _HUNK.match(line):
            hunks.append(([], []))
        elif hunks and line[:1] in (" ", "-", "+"):
            old, new = hunks[-1]
            if line[0] != "+":
                old.append(line[1:])
            if line[0] != "-":
                new.append(line[1:])
    return hunks


def _files(diff: str) -> dict[str, str]:
    """The diff split by file: the part after each `+++ <label>/<file>` header, keyed by file."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in diff.split("\n"):
        if line.startswith("--- "):
            current = None
        elif line.startswith("+++ "):
            current = line[4:].split("/", 1)[-1]
            parts[current] = []
        elif current is not None:
            parts[current].append(line)
    return {name: "\n".join(body) for name, body in parts.items()}


def replay_diff(state: KernelState, diff: str) -> KernelState | None:
    """`state` with a lineage's forward diff (kernel.cu, and launch.json when the plan changed)
    replayed on it; None where it does not apply or gives nothing new."""
    files = _files(diff)
    source = apply_diff(state.source, files["kernel.cu"]) if "kernel.cu" in files else state.source
    plan = state.plan
    if source is not None and "launch.json" in files:
        text = apply_diff(json.dumps(state.plan.to_dict(), sort_keys=True, indent=1), files["launch.json"])
        try:
            plan = LaunchPlan.from_dict(json.loads(text), "replayed plan") if text is not None else None
        except (DocumentError, ValueError):
            plan = None
    if source is None or plan is None or (source == state.source and plan == state.plan):
        return None
    return KernelState(source=source, plan=plan)


def replay(card: SkillCard, state: KernelState, lineages: Mapping[str, Lineage]) -> list[Rewrite]:
    """One forward rewrite per source transition of the card (in `lineages`) whose diff replays on
    `state`, each of the unchanged state; repeats of one result are dropped."""
    transform = get(card.transform)
    rewrites: list[Rewrite] = []
    seen: set[str] = set()
    for ref in card.evidence:
        lineage = lineages.get(ref.lineage)
        if ref.kind is not RefKind.TRANSITION or lineage is None or ref.index >= len(lineage.transitions):
            continue
        step = lineage.transitions[ref.index]
        replayed = replay_diff(state, step.forward_diff)
        if replayed is None or replayed.fingerprint in seen:
            continue
        try:
            rewrites.append(Rewrite(card.transform, Direction.FORWARD, step.anchor, replayed, removes=transform.adds,
                                    adds=transform.removes, carrier=dict(step.carrier),
                                    note=f"replayed the forward diff of {ref}"))
        except NotApplicable:  # the replayed source does not parse
            continue
        seen.add(replayed.fingerprint)
    return rewrites
