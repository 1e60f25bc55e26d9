"""scalarize_elementwise: a thread's four elements, read and written as 16-byte vectors, become one element.

The mechanism (forward): an elementwise kernel, one thread per element (`int i = blockIdx.x * blockDim.x +
threadIdx.x; if (i < n) <body>` where the body reads and writes arrays only at `[i]`), gets four
consecutive elements per thread: `i` becomes the thread index times 4, and where the four are in bounds
and every array is 16-byte aligned (checked at run time on the pointers) each array the body reads is
loaded once as a `float4`/`int4`/`uint4`, the body runs once per component on registers, and each array
it writes is stored once as a vector; otherwise (the tail where n is no multiple of 4, or a misaligned
pointer) the body runs element by element over what is left of the four. The launch's first grid
dimension becomes a quarter, rounded up: cdiv(grid, 4) blocks still give every four elements a thread.

Backward scalarizes the canonical form forward writes, from its element loop: one element per thread
again, the grid back to what it was.

Legality (forward_sites), conservative, decided on the parse: the element index is the only use of
threadIdx and is used only as the subscript `[i]` (and in the bound `i < n`); every array the body
touches is a pointer parameter to `float`, `int` or `unsigned`; the body has no loop, barrier, shared
memory, atomic, shuffle, `return` or call outside a list of pure math functions; an array the body writes
is read before (its vector is loaded) or written by a statement of the body's top level (every component
gets a value); the launch is one-dimensional and passes no buffer twice. Anything else: no site.

Anchor: the kernel, kind "function", key the element index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._edit import indentation, reindent, splice
from klineage.transforms._naive import (
    SERIAL_INDEX,
    index_declaration,
    kernel,
    launches_of,
    parameters,
    rescaled_grid,
    squash,
    statements,
    unwrapped,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

WIDTH = 4
ELEMENT = "e"
COMPONENTS = ("x", "y", "z", "w")
VECTORS = {"float": "float4", "int": "int4", "unsigned": "uint4", "unsigned int": "uint4"}
_VECTOR_INDEX = f"({SERIAL_INDEX}) * {WIDTH}"
_PURE_CALLS = frozenset({
    "expf", "__expf", "exp", "logf", "__logf", "log", "sqrtf", "sqrt", "rsqrtf", "fabsf", "fabs", "tanhf", "tanh",
    "fmaxf", "fminf", "max", "min", "fmaf", "__fdividef", "erff", "erf", "powf", "sinf", "cosf", "__ldg", "abs",
    "__saturatef", "normcdff", "erfcf", "log1pf", "expm1f", "floorf", "ceilf", "roundf", "truncf", "copysignf"})
_FORBIDDEN = re.compile(r"\b(?:__syncthreads|__syncwarp|__shared__|atomic\w*|__shfl\w*|goto|while|do|for|return|"
                        r"gridDim|printf|asm)\b")


@dataclass(frozen=True)
class Site:
    function: cp.Function
    index: str
    index_init: Node
    guard: Node  # the `if (i < n)` statement
    bound: str
    body: Node  # the guarded statement
    read: tuple[tuple[str, str], ...]  # (array, vector type), in order of first use
    written: tuple[tuple[str, str], ...]


class ScalarizeElementwise(Transform):
    name = "scalarize_elementwise"
    intent = ("Give each thread four consecutive elements of an elementwise kernel and move them as 16-byte "
              "vector loads and stores, with a scalar path for the tail and for misaligned pointers.")
    removes = ("vector_type_float4",)
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        found = []
        for function in cp.functions(parsed):
            try:
                index, _, _ = _vector_form(parsed, function)
            except NotApplicable:
                continue
            found.append(Anchor(function.name, "function", index, parsed.text(function.node)[:200]))
        return found

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for function in cp.functions(parsed):
            try:
                site = _serial_site(state, parsed, function)
            except NotApplicable:
                continue
            anchors.append(Anchor(function.name, "function", site.index, parsed.text(site.guard)[:200]))
        return anchors

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        site = _serial_site(state, parsed, kernel(parsed, anchor))
        if site.index != anchor.key:
            raise NotApplicable(f"{anchor}: the element index is '{site.index}'")
        data = parsed.data
        indent = indentation(data, site.guard.start_byte)
        inner = indent + "    "
        arrays = dict(site.read) | dict(site.written)
        aligned = " | ".join(f"(size_t){a}" for a in arrays)
        lines = [f"if ({site.index} + {WIDTH - 1} < {site.bound} && (({aligned}) & 15) == 0) {{"]
        for array, vector in site.read:
            const = "" if array in dict(site.written) else "const "
            lines.append(f"{inner}{const}{vector} {array}{WIDTH} = *reinterpret_cast<const {vector}*>({array} + "
                         f"{site.index});")
        for array, vector in site.written:
            if array not in dict(site.read):
                lines.append(f"{inner}{vector} {array}{WIDTH};")
        column = len(indentation(data, site.body.start_byte))
        for component in COMPONENTS:
            text = _subscripts(parsed, site, lambda a, c=component: f"{a}{WIDTH}.{c}")
            block = text if site.body.type == "compound_statement" else f"{{ {text} }}"
            lines.append(inner + reindent(block, column, inner)[len(inner):])
        for array, vector in site.written:
            lines.append(f"{inner}*reinterpret_cast<{vector}*>({array} + {site.index}) = {array}{WIDTH};")
        tail_body = _subscripts(parsed, site, lambda a: f"{a}[{ELEMENT}]")
        lines.append(f"{indent}}} else {{")
        lines.append(f"{inner}for (int {ELEMENT} = {site.index}; {ELEMENT} < {site.bound} && {ELEMENT} < "
                     f"{site.index} + {WIDTH}; ++{ELEMENT}) " + reindent(tail_body, column, inner)[len(inner):])
        lines.append(f"{indent}}}")
        edits = [(site.index_init.start_byte, site.index_init.end_byte, _VECTOR_INDEX),
                 (site.guard.start_byte, site.guard.end_byte, "\n".join(lines))]
        source = _apply(data, edits)
        plan = rescaled_grid(state, site.function.name, _quarter_grid)
        names = ", ".join(a for a in arrays)
        return self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan, carrier={"width": WIDTH},
                            note=f"{site.function.name}: {WIDTH} elements per thread as 16-byte vectors of {names}, "
                                 f"scalar tail; grid / {WIDTH}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        index, init, guard = _vector_form(parsed, function)
        if index != anchor.key:
            raise NotApplicable(f"{anchor}: the element index is '{index}'")
        alternative = guard.child_by_field_name("alternative")
        tail = next(c for c in cp.nodes_of_type(alternative, "for_statement"))
        bound = re.match(rf"\s*{ELEMENT}\s*<\s*([\w.]+)", parsed.text(tail.child_by_field_name("condition")))
        if bound is None:
            raise NotApplicable(f"{anchor}: the element loop has no bound")
        body = tail.child_by_field_name("body")
        indent = indentation(parsed.data, guard.start_byte)
        text = parsed.text(body)
        for subscript in sorted(cp.nodes_of_type(body, "subscript_expression"), key=lambda n: -n.start_byte):
            if squash(parsed.text(subscript.child_by_field_name("indices"))) in (f"[{ELEMENT}]", ELEMENT):
                start = subscript.child_by_field_name("indices").start_byte - body.start_byte
                end = subscript.child_by_field_name("indices").end_byte - body.start_byte
                text = text[:start] + f"[{index}]" + text[end:]
        text = reindent(text, len(indentation(parsed.data, body.start_byte)), indent)[len(indent):]
        edits = [(init.start_byte, init.end_byte, SERIAL_INDEX),
                 (guard.start_byte, guard.end_byte, f"if ({index} < {bound[1]}) {text}")]
        source, plan = _apply(parsed.data, edits), rescaled_grid(state, function.name, _serial_grid)
        return self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                            note=f"{function.name}: one element per thread, scalar loads and stores")


def _apply(data: bytes, edits: list[tuple[int, int, str]]) -> str:
    return splice(data, edits)[0].decode("utf-8")


def _pointer_types(parsed: cp.ParsedSource, function: cp.Function) -> dict[str, str]:
    """Pointer parameter name -> its element type (`const` and `__restrict__` dropped)."""
    return {name: kind for name, kind, pointer in parameters(parsed, function) if pointer}


def _serial_site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> Site:
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is not a kernel")
    launches_of(state, function.name, dimensions=1)
    body = function.node.child_by_field_name("body")
    declaration, init, index = index_declaration(parsed, body, SERIAL_INDEX)
    listed = statements(body)
    guard = listed[-1]
    if guard.type != "if_statement" or guard.child_by_field_name("alternative") is not None:
        raise NotApplicable(f"{function.name} does not end in `if ({index} < n) ...`")
    bound = re.fullmatch(rf"\(\s*{index}\s*<\s*([A-Za-z_]\w*)\s*\)",
                         squash(parsed.text(guard.child_by_field_name("condition"))))
    if bound is None:
        raise NotApplicable(f"{function.name}'s guard is not `{index} < n`")
    if listed.index(guard) != listed.index(declaration) + 1:
        raise NotApplicable(f"{function.name} has code between its element index and the guard")
    guarded = guard.child_by_field_name("consequence")
    text = parsed.text(guarded)
    if _FORBIDDEN.search(text) or "threadIdx" in text or re.search(rf"\b(?:{ELEMENT}|\w+{WIDTH})\b", text):
        raise NotApplicable(f"{function.name}'s element body loops, synchronizes, returns or names '{ELEMENT}'")
    for call in cp.nodes_of_type(guarded, "call_expression"):
        if cp.call_name(call) not in _PURE_CALLS:
            raise NotApplicable(f"{function.name} calls {cp.call_name(call)}, which may have effects")
    types = _pointer_types(parsed, function)
    read, written = {}, {}
    subscripts = sorted(cp.nodes_of_type(guarded, "subscript_expression"), key=lambda n: n.start_byte)
    for node in subscripts:
        array = parsed.text(node.child_by_field_name("argument"))
        if squash(parsed.text(node.child_by_field_name("indices"))) not in (f"[{index}]", index):
            raise NotApplicable(f"{function.name} reads `{parsed.text(node)}`, not element {index}")
        vector = VECTORS.get(types.get(array, "").removeprefix("const ").strip())
        if vector is None:
            raise NotApplicable(f"'{array}' is no pointer parameter to float, int or unsigned")
        parent = node.parent
        stored = parent.type == "assignment_expression" and parent.child_by_field_name("left") == node
        if stored and parsed.text(parent.child_by_field_name("operator")) != "=":
            read.setdefault(array, vector)
        if not stored and array in written and array not in read:
            raise NotApplicable(f"'{array}' is read after it is written")
        (written if stored else read).setdefault(array, vector)
    uses = len(re.findall(rf"\b{index}\b", text))
    if uses != len(subscripts):
        raise NotApplicable(f"{function.name} uses '{index}' beyond its subscripts")
    if cp.nodes_of_type(guarded, "pointer_expression") or "->" in text:
        raise NotApplicable(f"{function.name} dereferences a pointer expression")
    top = statements(guarded)
    for array in written:
        if array not in read and not any(squash(parsed.text(s)).startswith(f"{array}[{index}] =") for s in top):
            raise NotApplicable(f"'{array}' is written only under a condition: a vector store would write garbage")
    if not read and not written:
        raise NotApplicable(f"{function.name} touches no array")
    return Site(function, index, init, guard, bound[1], guarded, tuple(read.items()), tuple(written.items()))


def _subscripts(parsed: cp.ParsedSource, site: Site, replace) -> str:
    """The guarded statement's text with each `a[i]` replaced by `replace(a)`."""
    text, base = parsed.text(site.body), site.body.start_byte
    for node in sorted(cp.nodes_of_type(site.body, "subscript_expression"), key=lambda n: -n.start_byte):
        array = parsed.text(node.child_by_field_name("argument"))
        text = text[:node.start_byte - base] + replace(array) + text[node.end_byte - base:]
    return text


def _vector_form(parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, Node, Node]:
    """(index, its initializer, the vector guard) of a kernel in the form forward writes."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    _, init, index = index_declaration(parsed, body, _VECTOR_INDEX)
    for statement in body.named_children:
        condition = statement.child_by_field_name("condition") if statement.type == "if_statement" else None
        if condition is not None and squash(parsed.text(condition)).startswith(f"({index} + {WIDTH - 1} <") and \
                statement.child_by_field_name("alternative") is not None:
            return index, init, statement
    raise NotApplicable(f"{function.name} has no vector guard")


def _quarter_grid(grid: str) -> str:
    return f"cdiv({grid}, {WIDTH})"


def _serial_grid(grid: str) -> str:
    return unwrapped(grid, "cdiv(", f", {WIDTH})")


register(ScalarizeElementwise())
