"""A warp's butterfly as people spell it, read as the warp reductions write it:

    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);

People write the same loop many ways: any name for the offset, `o >>= 1` or `o = o / 2` for the step, `o >= 1` or
`o != 0` for the test, `warpSize / 2` for the start, the full mask as `0xffffffff` or `0xFFFFFFFF` (with or without
a `u`), the shuffle's width (32 or warpSize) passed, braces around the one statement, `s = s + ...` for `s += ...`.
Each spelling runs the same shuffles in the same order, so every lane ends with the same bits.

A butterfly read down (`__shfl_down_sync`) where only lane 0 reads its results afterwards (the sum stored under `if
(lane == 0)`) is read as the xor butterfly too: at each step lane 0 (and every lane below twice the offset) adds the
same lane's value either way, so lane 0 ends with the same bits; the other lanes' values, which differ, are never
read. Only where every read of what the loop assigns, after it, sits under a test that the thread is lane 0
(`lane == 0` for a lane declared `threadIdx.x % 32` or `threadIdx.x & 31` and never assigned, or that test
spelled inline).

Anything else (another mask, a partial warp, a body that names the offset otherwise, an offset name that the body
already uses) is left as written. The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import edited, is_written, splice
from klineage.transforms._naive import squash
from klineage.transforms.base import NotApplicable

HEADER = "for (int offset = 16; offset > 0; offset /= 2)"
MASK = "0xffffffffu"
_ID = r"[A-Za-z_]\w*"
_HEADER = re.compile(rf"^for \((?:int|unsigned|unsigned int) ({_ID}) = (?:16|\(?warpSize / 2\)?|\(?warpSize >> 1\)?); "
                     rf"(?:\1 > 0|\1 >= 1|\1 != 0|0 < \1|\1); (?:\1 /= 2|\1 >>= 1|\1 = \1 / 2|\1 = \1 >> 1)\)$")
_FULL_MASK = re.compile(r"^0x[fF]{8}[uU]?$")
_LANE = re.compile(rf"^(?:const )?(?:int|unsigned|unsigned int) ({_ID}) = \(?threadIdx\.x (?:% 32|& 31)\)?;$")


def butterflies_read(state: KernelState) -> KernelState:
    """`state` with each kernel's warp butterflies in people's spellings (above) written as the warp reductions
    write them; the same state where there is none."""
    def edits(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[tuple[int, int, str]]:
        found = []
        for loop in cp.nodes_of_type(body, "for_statement"):
            try:
                edit = _read(parsed, function, body, loop)
            except NotApplicable:
                continue
            found += [edit] if edit is not None else []
        return found

    return edited(state, edits)


def _read(parsed: cp.ParsedSource, function: cp.Function, body: Node,
          loop: Node) -> tuple[int, int, str] | None:
    """The edit writing `loop` as the forwards' butterfly, None where it is written so already; NotApplicable where
    it is no full-warp butterfly."""
    inner = loop.child_by_field_name("body")
    head = _HEADER.match(squash(parsed.data[loop.start_byte:inner.start_byte].decode("utf-8")))
    if head is None:
        raise NotApplicable("not a butterfly's header")
    offset = head[1]
    listed = [n for n in inner.named_children if n.type != "comment"] if inner.type == "compound_statement" \
        else [inner]
    if len(listed) != 1 or listed[0].type != "expression_statement":
        raise NotApplicable("not one statement")
    statement = listed[0]
    calls = [c for c in cp.nodes_of_type(statement, "call_expression")
             if cp.call_name(c) in ("__shfl_xor_sync", "__shfl_down_sync")]
    uses = [n for n in cp.nodes_of_type(statement, "identifier") if parsed.text(n) == offset]
    if not calls or len(uses) != len(calls) or offset != "offset" and any(
            parsed.text(n) == "offset" for n in cp.nodes_of_type(statement, "identifier")):
        raise NotApplicable("the offset is named otherwise than as each shuffle's lane mask")
    edits, down = [], False
    for call in calls:
        arguments = call.child_by_field_name("arguments").named_children
        if len(arguments) not in (3, 4) or not _FULL_MASK.match(parsed.text(arguments[0])) or \
                parsed.text(arguments[2]) != offset or \
                len(arguments) == 4 and parsed.text(arguments[3]) not in ("32", "warpSize"):
            raise NotApplicable("not a full warp's shuffle by the offset")
        down = down or cp.call_name(call) == "__shfl_down_sync"
        edits.append((call.start_byte - statement.start_byte, call.end_byte - statement.start_byte,
                      f"__shfl_xor_sync({MASK}, {parsed.text(arguments[1])}, offset)"))
    if down:
        _check_lane_zero_reads(parsed, function, body, loop, statement)
    written = _added(splice(parsed.data[statement.start_byte:statement.end_byte], edits)[0].decode("utf-8"))
    replacement = f"{HEADER} {written}"
    return None if squash(parsed.text(loop)) == squash(replacement) else (loop.start_byte, loop.end_byte, replacement)


def _added(statement: str) -> str:
    """`s = s + e;` as `s += e;` (the same addition); any other statement as it is."""
    found = re.fullmatch(rf"({_ID}) = \1 \+ (.+);", " ".join(statement.split()))
    return f"{found[1]} += {found[2]};" if found else statement


def _check_lane_zero_reads(parsed: cp.ParsedSource, function: cp.Function, body: Node, loop: Node,
                           statement: Node) -> None:
    """NotApplicable unless every read after `loop` of a name its `statement` assigns is under a test that the
    thread is lane 0."""
    assigned = {parsed.text(n) for n in cp.nodes_of_type(statement, "identifier") if is_written(n)}
    lanes = {m[1] for d in cp.nodes_of_type(body, "declaration") if (m := _LANE.match(squash(parsed.text(d))))}
    lanes = {lane for lane in lanes if not any(is_written(n) for n in cp.nodes_of_type(body, "identifier")
                                               if parsed.text(n) == lane)}
    zero = {f"({lane} == 0)" for lane in lanes} | {"(threadIdx.x % 32 == 0)", "((threadIdx.x & 31) == 0)"}
    for use in cp.nodes_of_type(body, "identifier"):
        if use.start_byte < loop.end_byte or parsed.text(use) not in assigned:
            continue
        guard = use.parent
        while guard is not None and not (guard.type == "if_statement" and guard.child_by_field_name("condition")
                                         is not None and squash(parsed.text(guard.child_by_field_name("condition")))
                                         in zero and _within(guard.child_by_field_name("consequence"), use)):
            guard = guard.parent
        if guard is None or guard.start_byte < loop.end_byte:
            raise NotApplicable(f"'{parsed.text(use)}' is read after the shuffles down by lanes other than 0")


def _within(outer: Node, inner: Node) -> bool:
    return outer.start_byte <= inner.start_byte and inner.end_byte <= outer.end_byte
