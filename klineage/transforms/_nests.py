"""Two perfectly nested loops read as one loop over their pairs, for the warp reductions.

A thread that reduces over two dimensions (per-channel batch-norm statistics over a batch and its pixels, a sum over
dims (0, 2) of a (B, N, D) tensor, a row stored as a 2-D tile) is often written as a nest:

    for (int n = 0; n < N; ++n)
        for (int k = 0; k < HW; ++k) <body>

`unnested` writes such a nest as one loop over the pairs:

    for (long long n_k = 0; n_k < (long long)N * HW; ++n_k) {
        int n = n_k / HW;
        int k = n_k % HW;
        <body>
    }

Step t is the pair (t / HW, t % HW): t counting up walks n in order and k in order within each n, as the nest
does, so the loop runs the body on the same pairs in the same order and the kernel computes the same bits. The
warp reductions (`_warp_reduction.py`) then read one row loop, whose steps their lanes stride (t = lane, lane + 32,
...). The flat index is 64-bit: the product of two counts each below 2^31 always fits it, so a nest of more than
2^31 steps, which is correct with 32-bit indexes, stays correct (a 32-bit flat index would overflow there); the
quotient and remainder are below N and HW, so the indexes keep their own types. A count that is a product (`H *
W`) is computed as the kernel computed it in the bounds (`n_k / (H * W)`), or in 64 bits in the flat bound, which
is the same value wherever the kernel's own product did not overflow.

Legal only where both loops declare their index (of an integer type), start at 0, step by one (`++i`, `i++`,
`i += 1`) and stop at `i < count`, each count a scalar integer parameter the kernel never assigns, an integer
literal, or a product of them (the same before, during and after the nest; a count naming the outer index, a
triangular nest, is none); the outer loop's body is the inner loop alone (comments aside); the body assigns neither
index nor takes its address, declares neither again, and holds no loop, `break`, `continue`, `return` or `goto`;
the outer loop lies in no other loop. Anything else stays as written; where a loop's body holds a loop, why it was
not read is noted for `library fit` (`refusals`).

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import declared_names, indentation, is_written, reindent, splice, written_names
from klineage.transforms._naive import LOOP_INDEX_TYPES, parameters, squash, statements
from klineage.transforms.base import NotApplicable, refused

FLAT = "long long"  # the flat index's type
_HEADER = re.compile(rf"for\s*\(\s*({LOOP_INDEX_TYPES})\s+([A-Za-z_]\w*)\s*=\s*0\s*;\s*\2\s*<\s*(.+?)\s*;"
                     r"\s*(?:\+\+\2|\2\+\+|\2\s*\+=\s*1)\s*\)")
_FACTOR = r"(?:[A-Za-z_]\w*|\d+)"
_COUNT = re.compile(rf"{_FACTOR}(?:\s*\*\s*{_FACTOR})*")
_JUMPS = re.compile(r"\b(?:for|while|do|break|continue|return|goto)\b")
_INTEGER = re.compile(rf"(?:const )?(?:{LOOP_INDEX_TYPES}|int32_t|unsigned long|unsigned long long)")
# names the warp forms declare (`_warp_reduction._OWN_NAMES`): the flat index is none of them
_RESERVED = re.compile(r"(?:lane|slice|slice_mask|offset|scan_\w+|pair_\w+)")


def unnested(state: KernelState, only: str | None = None) -> KernelState:
    """`state` with each perfect nest of two loops in its kernels (or in the kernel `only`) written as one loop over
    the pairs (see the module's docstring); the same state where there is none."""
    parsed = cp.parse(state.source)
    edits = []
    for function in cp.functions(parsed):
        body = function.node.child_by_field_name("body")
        if not function.is_kernel or body is None or (only is not None and function.name != only):
            continue
        for node in _outer_loops(body):
            inner = statements(node.child_by_field_name("body"))
            if not any(statement.type == "for_statement" for statement in inner):
                continue  # no nest: a row loop, or no loop of this reading
            try:
                edits.append((node.start_byte, node.end_byte, _flat(parsed, function, node)))
            except NotApplicable as error:
                refused(function, error)
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def _outer_loops(body: Node) -> list[Node]:
    """The for loops of the body that no loop holds."""
    loops = ("for_statement", "while_statement", "do_statement", "for_range_loop")
    found = []
    for node in cp.nodes_of_type(body, "for_statement"):
        parent = node.parent
        while parent is not None and parent != body and parent.type not in loops:
            parent = parent.parent
        if parent == body:
            found.append(node)
    return found


def _flat(parsed: cp.ParsedSource, function: cp.Function, outer: Node) -> str:
    """The nest `outer` as one loop over its pairs; NotApplicable, with the reason, for any other loop."""
    body = function.node.child_by_field_name("body")
    addressed = {parsed.text(n.child_by_field_name("argument")) for n in cp.nodes_of_type(body, "pointer_expression")
                 if parsed.text(n).startswith("&")}
    counts = {name for name, kind, pointer in parameters(parsed, function)
              if not pointer and _INTEGER.fullmatch(kind)} - written_names(parsed, body) - addressed
    listed = statements(outer.child_by_field_name("body"))
    a_kind, a, a_count = _header(parsed, outer, counts)
    if len(listed) != 1:
        raise NotApplicable(f"the loop over '{a}' holds more than its inner loop: no perfect nest")
    inner = listed[0]
    b_kind, b, b_count = _header(parsed, inner, counts)
    work = inner.child_by_field_name("body")
    text = parsed.text(work)
    if found := _JUMPS.search(text):
        raise NotApplicable(f"the body of the nest over '{a}' and '{b}' loops or jumps (`{found[0]}`)")
    if declared := sorted(set(declared_names(parsed, work)) & {a, b}):
        raise NotApplicable(f"the body of the nest over '{a}' and '{b}' declares '{declared[0]}' again")
    taken = {parsed.text(n.child_by_field_name("argument")) for n in cp.nodes_of_type(work, "pointer_expression")
             if parsed.text(n).startswith("&")}
    changed = taken | {parsed.text(n) for n in cp.nodes_of_type(work, "identifier") if is_written(n)}
    for index in (a, b):
        if index in changed:
            raise NotApplicable(f"the body of the nest over '{a}' and '{b}' changes '{index}'")
    named = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier")}
    flat = next(name for name in (f"{a}_{b}", "t", *(f"t{k}" for k in range(len(named) + 1)))
                if name not in named and not _RESERVED.fullmatch(name))
    divisor = b_count if re.fullmatch(_FACTOR, b_count) else f"({b_count})"
    indent = indentation(parsed.data, outer.start_byte)
    inner_indent = indent + "    "
    lines = [f"for ({FLAT} {flat} = 0; {flat} < ({FLAT}){a_count} * {b_count}; ++{flat}) {{",
             f"{inner_indent}{a_kind} {a} = {flat} / {divisor};",
             f"{inner_indent}{b_kind} {b} = {flat} % {divisor};"]
    parts = list(work.named_children) if work.type == "compound_statement" else [work]
    if parts:
        start, end = parts[0].start_byte, parts[-1].end_byte
        column = len(indentation(parsed.data, start))  # a body on the loop's own line: that line's indentation
        lines.append(reindent(parsed.data[start:end].decode("utf-8"), column, inner_indent))
    return "\n".join(lines) + f"\n{indent}}}"


def _header(parsed: cp.ParsedSource, loop: Node, counts: set[str]) -> tuple[str, str, str]:
    """(index type, index, count) of `for (<type> i = 0; i < <count>; ++i)`, the count of `counts` and literals."""
    if loop.type != "for_statement":
        raise NotApplicable(f"`{squash(parsed.text(loop))[:60]}` is no for loop")
    header = squash(parsed.data[loop.start_byte:loop.child_by_field_name("body").start_byte].decode("utf-8"))
    match = _HEADER.fullmatch(header)
    if match is None:
        raise NotApplicable(f"`{header}` in a nest does not declare its index, start it at 0 and step it by one "
                            f"below a count")
    kind, index, count = match.groups()
    if not _COUNT.fullmatch(count) or set(re.findall(r"[A-Za-z_]\w*", count)) - counts:
        raise NotApplicable(f"the count `{count}` of `{header}` is no integer scalar parameter the kernel never "
                            f"assigns, literal or product of them")
    return kind, index, count
