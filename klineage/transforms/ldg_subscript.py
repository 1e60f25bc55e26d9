"""ldg_subscript: a read-only global array read as `__ldg(&a[k])` is read as `a[k]`; forward finds its sites by
analysis.

The mechanism (forward): a kernel reads an array it never writes through the non-coherent read-only cache,
every subscripted read `a[k]` becoming `__ldg(&a[k])`. The `ldg` transform moves one `__ldg(p)` call written as
a pointer expression, at the anchors of its walks; this one places the mechanism on any kernel, one array at a
time, wherever the analysis shows the data cannot change while the kernel runs.

Legality (forward_sites), decided on the parse and the plan: `a` is a pointer of a `__global__` kernel to a
`const` element type `__ldg` loads (`const float* __restrict__ x`), either a parameter or a local that starts at
one (`const float* in = x + row * cols`, its address in global memory); the kernel uses `a` only as the base of
subscripted reads (not written, not addressed) or as the start of such a const local, never assigns it, and
never casts `const` away (`const_cast`) anywhere; every launch of the kernel passes each buffer once, so no
other pointer of the kernel reaches the same memory to write it. A device function's pointer may point into
shared memory, where `__ldg` is undefined: no site there.

Backward turns every `__ldg(&a[k])` of the array in the kernel back into `a[k]`; always correct (a coherent
load reads the same value).

Anchor: the kernel, kind "array", key the array's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import ArgKind
from klineage.transforms import register
from klineage.transforms._edit import (
    Scope,
    contains,
    is_written,
    ldg_calls,
    operator,
    outer_parens,
    params,
    plain_read_edits,
    splice,
    unparen,
)
from klineage.transforms._naive import kernel, squash
from klineage.transforms._readonly import LDG_TYPES
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform


class LdgSubscript(Transform):
    name = "ldg_subscript"
    intent = ("Read a global array the kernel never writes through the read-only cache: each `a[k]` becomes "
              "`__ldg(&a[k])`.")
    removes = ("ldg",)
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        found = []
        for function in cp.functions(parsed):
            arrays: dict[str, Node] = {}
            for call in ldg_calls(parsed, function.node):
                arrays.setdefault(parsed.text(call.subscript.child_by_field_name("argument")), call.node)
            found += [Anchor(function.name, "array", name, parsed.text(node)) for name, node in arrays.items()]
        return found

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        edits = plain_read_edits(parsed, function.node, anchor.key)
        if not edits:
            raise NotApplicable(f"{anchor}: no __ldg(&{anchor.key}[...])")
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{function.name}: {len(edits)} read(s) of {anchor.key} by the coherent path")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        reads = _read_only_arrays(state, parsed, function).get(anchor.key)
        if reads is None:
            raise NotApplicable(f"{anchor}: {_why_not(state, parsed, function, anchor.key)}")
        if not reads:
            raise NotApplicable(f"{anchor}: every read of {anchor.key} already uses __ldg")
        edits = [(read.start_byte, read.end_byte, f"__ldg(&{parsed.text(read)})") for read in reads]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source,
                            note=f"{function.name}: {len(edits)} read(s) of {anchor.key} through the read-only cache")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for function in cp.functions(parsed):
            if not function.is_kernel or function.node.child_by_field_name("body") is None:
                continue
            for name, reads in _read_only_arrays(state, parsed, function).items():
                if reads:
                    anchors.append(Anchor(function.name, "array", name, parsed.text(reads[0])))
        return anchors


def _const_pointers(parsed: cp.ParsedSource, function: cp.Function) -> dict[str, Node | None]:
    """Name -> initializer (None for a parameter) of each pointer of the kernel to a `const` `__ldg` type, declared
    once; a name declared twice (shadowing) is left out."""
    declared: dict[str, list[Node | None]] = {}
    for param in params(parsed, function.node):
        if param.indirection == "*" and _pointee_const(parsed, param.node) and squash(param.type) in LDG_TYPES:
            declared.setdefault(param.name, []).append(None)
        else:
            declared.setdefault(param.name, []).extend([None, None])
    for declaration in cp.declarations(parsed):
        if declaration.function != function.name or not contains(function.node, declaration.node):
            continue
        pointer = declaration.indirection == "*" and "const" in declaration.specifiers and \
            squash(declaration.type) in LDG_TYPES and declaration.init is not None
        declared.setdefault(declaration.name, []).extend([declaration.init] if pointer else [None, None])
    return {name: inits[0] for name, inits in declared.items() if len(inits) == 1}


def _pointee_const(parsed: cp.ParsedSource, declaration: Node) -> bool:
    return any(c.type == "type_qualifier" and parsed.text(c) == "const" for c in declaration.children)


def _uses(parsed: cp.ParsedSource, body: Node, name: str) -> list[Node]:
    """The identifiers `name` in the body other than where a declaration names what it declares."""
    return [n for n in cp.nodes_of_type(body, "identifier") if parsed.text(n) == name and not (
        n.parent is not None and n.parent.type in _DECLARATORS and n.parent.child_by_field_name("declarator") == n)]


_DECLARATORS = frozenset({"pointer_declarator", "init_declarator", "declaration", "array_declarator",
                          "reference_declarator"})


def _read(node: Node) -> Node | None:
    """The subscript `node` is the base of, when that subscript is only read (not written, not addressed)."""
    parent = node.parent
    if parent is None or parent.type != "subscript_expression" or parent.child_by_field_name("argument") != node:
        return None
    outer = outer_parens(parent)
    if is_written(parent) or (outer.parent is not None and outer.parent.type == "pointer_expression"
                               and operator(outer.parent) == "&"):
        return None
    return parent


def _start_of(init: Node, node: Node) -> bool:
    """`node` is where the initializer `init` starts the pointer: `init` is `node` or `node + k` (`k + node`)."""
    expression = unparen(init)
    if expression == node:
        return True
    return expression.type == "binary_expression" and operator(expression) == "+" and \
        node in (unparen(expression.child_by_field_name("left")), unparen(expression.child_by_field_name("right")))


def _read_only_arrays(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> dict[str, list[Node]]:
    """Array name -> its plain subscripted reads ([] when every read already uses __ldg), for every array of the
    kernel that the module docstring's analysis shows to be read-only global data; {} when none is."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None or "const_cast" in parsed.text(body) or _aliased(state, function):
        return {}
    pointers = _const_pointers(parsed, function)
    scope = Scope(parsed)
    loaded = {(call.subscript.start_byte, call.subscript.end_byte) for call in ldg_calls(parsed, body)}
    starts: dict[str, str] = {}  # a const local -> the pointer it starts at
    for name, init in pointers.items():
        if init is not None:
            bases = [n for n in cp.nodes_of_type(init, "identifier") if parsed.text(n) in pointers and
                     _start_of(init, n)]
            if len(bases) == 1 and scope.memory_space(init) == "global":
                starts[name] = parsed.text(bases[0])
    found: dict[str, list[Node]] = {}
    for name, init in pointers.items():
        if init is not None and name not in starts:
            continue
        reads, uses = [], _uses(parsed, body, name)
        for use in uses:
            subscript = use.parent if use.parent is not None and use.parent.type == "subscript_expression" else None
            if subscript is not None and (subscript.start_byte, subscript.end_byte) in loaded:
                continue  # already read through the cache
            if _read(use) is not None:
                reads.append(_read(use))
            elif starts.get(_initializing(use, pointers) or "") != name:
                break
        else:
            if uses:
                found[name] = reads
    # a local is read-only only while the pointer it starts at is
    return {name: reads for name, reads in found.items() if name not in starts or starts[name] in found}


def _initializing(use: Node, pointers: Mapping[str, Node | None]) -> str | None:
    """The const local whose initializer starts at `use`, if any."""
    node = use
    while node.parent is not None and node.parent.type not in ("init_declarator", "compound_statement"):
        node = node.parent
    declarator = node.parent
    if declarator is None or declarator.type != "init_declarator":
        return None
    init = declarator.child_by_field_name("value")
    target = declarator.child_by_field_name("declarator")
    while target is not None and target.type != "identifier":
        target = target.child_by_field_name("declarator")
    if target is None or init is None or not _start_of(init, use):
        return None
    name = target.text.decode("utf-8")
    return name if pointers.get(name) is not None and pointers[name] == init else None


def _aliased(state: KernelState, function: cp.Function) -> bool:
    """The plan never launches the kernel, or passes one buffer twice to it."""
    launches = [launch for launch in state.plan.launches if launch.entry == function.name]
    for launch in launches:
        buffers = [arg.name for arg in launch.args if arg.kind is ArgKind.BUFFER]
        if len(buffers) != len(set(buffers)):
            return True
    return not launches


def _why_not(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, name: str) -> str:
    body = function.node.child_by_field_name("body")
    if "const_cast" in parsed.text(body):
        return "the kernel casts const away"
    if _aliased(state, function):
        return "the plan never launches the kernel or passes one buffer to it twice"
    if name not in _const_pointers(parsed, function):
        return f"{name} is no pointer to a const type __ldg loads, declared once"
    return f"{name} is used other than by subscripted reads, or does not point into global memory"


register(LdgSubscript())
