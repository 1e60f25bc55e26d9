"""Pointers walked by a counted loop read at the loop's index, so that a forward that reads a row or a column by
its subscripts reads a kernel that steps a pointer along it instead, as C programmers often write:

    const float* p = x + row * cols;                 const float* p = dy + c;
    for (int j = 0; j < cols; ++j) {                 for (int r = 0; r < rows; ++r) {
        s += *p * *p;                                    s += *p;
        ++p;                                             p += cols;
    }                                                }

`walked` writes such a loop's reads `p[j]` (`p[r * cols]`) and drops the step: at step j the walked pointer is its
first value plus j steps, which is what the subscript names, and nothing after the loop reads the pointer. Local
pointers read through subscripts then read through their parameter (`_pointers.inlined`).

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import INTEGER_ARITHMETIC, is_written, own_lines, params, splice


def walked(state: KernelState) -> KernelState:
    """`state` with each pointer walked by a counted loop read at the loop's index: where a loop `for (int j = 0; j <
    n; ++j)` ends its body with the pointer's one step (`++p;`, `p++;`, `p += S;`, `p = p + S;`, S an integer
    expression the loop never writes), the body reads `*p` or `p[k]` only before that step, and nothing else names p
    after its declaration, `*p` is `p[j * S]` and `p[k]` is `p[j * S + k]` at step j; the step goes (the pointer then
    keeps its first value, which nothing reads after the loop). A body that may skip the step (`continue`) or writes
    j is left as written, and so is any other use of the pointer."""
    parsed = cp.parse(state.source)
    edits = []
    for function in cp.functions(parsed):
        body = function.node.child_by_field_name("body")
        if function.is_kernel and body is not None:
            for loop in cp.nodes_of_type(body, "for_statement"):
                edits += _walk(parsed, function, loop)
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


_NAME = re.compile(r"[\w.]+")  # a name or a number, which needs no parentheses as a factor
_COUNTED = re.compile(r"for \(int ([A-Za-z_]\w*) = 0; \1 < [^;]+; (?:\+\+\1|\1\+\+)\)")
_STEP = re.compile(r"(?:\+\+(?P<a>[A-Za-z_]\w*)|(?P<b>[A-Za-z_]\w*)\+\+|(?P<c>[A-Za-z_]\w*) \+= (?P<s>[^;]+)|"
                   r"(?P<d>[A-Za-z_]\w*) = (?P=d) \+ (?P<t>[^;]+));")


def _walk(parsed: cp.ParsedSource, function: cp.Function, loop: Node) -> list[tuple[int, int, str]]:
    """The edits reading the pointer `loop` walks at its index (`walked`), or none."""
    work = loop.child_by_field_name("body")
    header = _COUNTED.match(_squash(parsed.data[loop.start_byte:work.start_byte].decode("utf-8")))
    listed = [c for c in work.named_children if c.type != "comment"] if work.type == "compound_statement" else []
    step = _STEP.fullmatch(_squash(parsed.text(listed[-1]))) if header and len(listed) > 1 else None
    if step is None or re.search(r"\bcontinue\b", parsed.text(work)):
        return []
    index = header[1]
    pointer = step["a"] or step["b"] or step["c"] or step["d"]
    stride = (step["s"] or step["t"] or "1").strip()
    pointers = {param.name for param in params(parsed, function.node) if param.indirection == "*"}
    declared = [d for d in cp.nodes_of_type(function.node, "declaration")
                if re.fullmatch(rf"(?:const )?[A-Za-z_][\w ]*\* (?:const )?(?:__restrict__ )?{pointer} = [^;]+;",
                                _squash(parsed.text(d)))]
    uses = [node for node in cp.nodes_of_type(function.node, "identifier") if parsed.text(node) == pointer]
    inside = [node for node in uses if listed[0].start_byte <= node.start_byte < listed[-1].start_byte]
    in_stride = set(re.findall(r"[A-Za-z_]\w*", stride))
    if pointer in pointers or len(declared) != 1 or not INTEGER_ARITHMETIC.fullmatch(stride) or \
            len(uses) != len(inside) + 2 or any(is_written(node) for node in inside) or \
            any(parsed.text(node) in in_stride | {index} and is_written(node) for node in
                cp.nodes_of_type(work, "identifier")):
        return []  # a parameter, declared twice, used outside this loop, or a stride or index the loop changes
    factor = stride if _NAME.fullmatch(stride) else f"({stride})"
    at = index if stride == "1" else f"{index} * {factor}"
    lines = own_lines(parsed, listed[-1])
    edits = [(lines[0], lines[1], "") if lines else (listed[-1].start_byte, listed[-1].end_byte, "")]
    for node in inside:
        parent = node.parent
        if parent.type == "pointer_expression" and parsed.text(parent).startswith("*"):
            edits.append((parent.start_byte, parent.end_byte, f"{pointer}[{at}]"))
        elif parent.type == "subscript_expression" and parent.child_by_field_name("argument") == node:
            offset = parsed.text(parent.child_by_field_name("indices"))[1:-1].strip()
            edits.append((parent.start_byte, parent.end_byte, f"{pointer}[{at} + ({offset})]"))
        else:
            return []  # the pointer itself read (`p + 1`, an argument): kept
    return edits


def _squash(text: str) -> str:
    return " ".join(text.split())
