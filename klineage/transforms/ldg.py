"""ldg: replace one `__ldg(ptr)` read-only load by a plain dereference `*(ptr)`.

Anchor: the enclosing function, kind "call", key `<ptr>#<n>`: the pointer expression as written
and its ordinal among the function's loads of that same expression, counting both `__ldg(<ptr>)`
and `*(<ptr>)`, so the ordinal survives the rewrite and forward finds the same load again.

The dereference is always parenthesised (`*(xv + j)`), and wrapped once more where the call was the
operand of a postfix expression (`__ldg(p).x` becomes `(*(p)).x`, not `*(p).x`).

Backward is always correct: `__ldg` reads through the non-coherent read-only cache, which is only
valid because the data does not change during the kernel; a plain load reads the same value by the
coherent path. SASS may keep `LDG...CONSTANT` when the compiler proves the pointer read-only on its
own (`const T* __restrict__`); the `restrict` transform removes that promise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import ArgKind
from klineage.transforms import register
from klineage.transforms._readonly import LDG_TYPES
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

_KEY = re.compile(r"^(?P<ptr>.+)#(?P<n>\d+)$", re.DOTALL)
# Where a call sits as the operand of a postfix operator, a bare `*(p)` would bind looser.
_POSTFIX_OPERAND = {"field_expression": "argument", "subscript_expression": "argument",
                    "call_expression": "function", "update_expression": "argument"}


def _postfix_operand(node: Node) -> bool:
    parent = node.parent
    if parent is None or parent.type not in _POSTFIX_OPERAND:
        return False
    if parent.type == "update_expression" and parent.children[0] != node:
        return False  # prefix ++x binds like the unary *
    return parent.child_by_field_name(_POSTFIX_OPERAND[parent.type]) == node


class _Load:
    """One load of a pointer expression: an `__ldg` call, or a `*(...)` dereference."""

    def __init__(self, function: str, pointer: str, node: Node, is_ldg: bool, replace: Node):
        self.function, self.pointer, self.node, self.is_ldg, self.replace = function, pointer, node, is_ldg, replace


def _loads(parsed: cp.ParsedSource) -> list[_Load]:
    found = []
    for node in cp.nodes_of_type(parsed.root, "call_expression", "pointer_expression"):
        function = cp.function_of(node) or "<file>"
        if node.type == "call_expression":
            if cp.call_name(node) != "__ldg" or node.child_by_field_name("function").type != "identifier":
                continue
            arguments = node.child_by_field_name("arguments")
            if arguments is None or arguments.named_child_count != 1:
                continue
            found.append(_Load(function, parsed.text(arguments.named_children[0]), node, True, node))
        else:
            operator = node.child_by_field_name("operator")
            argument = node.child_by_field_name("argument")
            if operator is None or parsed.text(operator) != "*" or argument is None:
                continue
            if argument.type != "parenthesized_expression" or argument.named_child_count != 1:
                continue
            replace = node
            parent = node.parent
            if (parent is not None and parent.type == "parenthesized_expression"
                    and parent.named_child_count == 1 and _postfix_operand(parent)):
                replace = parent  # `(*(p)).x`, as backward writes it
            found.append(_Load(function, parsed.text(argument.named_children[0]), node, False, replace))
    return found


def _keyed(parsed: cp.ParsedSource) -> list[tuple[str, _Load]]:
    counts: dict[tuple[str, str], int] = {}
    keyed = []
    for load in _loads(parsed):
        n = counts.get((load.function, load.pointer), 0)
        counts[(load.function, load.pointer)] = n + 1
        keyed.append((f"{load.pointer}#{n}", load))
    return keyed


class Ldg(Transform):
    name = "ldg"
    intent = "Load read-only global data through the non-coherent read-only cache (__ldg)."
    removes = ("ldg",)

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(load.function, "call", key, parsed.text(load.node))
                for key, load in _keyed(parsed) if load.is_ldg]

    def _site(self, parsed: cp.ParsedSource, anchor: Anchor) -> _Load:
        if anchor.kind != "call" or not _KEY.match(anchor.key):
            raise NotApplicable(f"ldg needs a call anchor keyed `<pointer expression>#<n>`, not {anchor}")
        for key, load in _keyed(parsed):
            if load.function == anchor.function and key == anchor.key:
                return load
        raise NotApplicable(f"ldg: no load of '{_KEY.match(anchor.key)['ptr']}' number "
                            f"{_KEY.match(anchor.key)['n']} in {anchor.function}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        load = self._site(parsed, anchor)
        if not load.is_ldg:
            raise NotApplicable(f"ldg: the load at {anchor} is already a plain dereference")
        text = f"*({load.pointer})"
        if _postfix_operand(load.node):
            text = f"({text})"
        data = parsed.data
        source = (data[:load.node.start_byte] + text.encode() + data[load.node.end_byte:]).decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"__ldg({load.pointer}) became a plain load {text}")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        load = self._site(parsed, anchor)
        if load.is_ldg:
            raise NotApplicable(f"ldg: the load at {anchor} already uses __ldg")
        data = parsed.data
        text = f"__ldg({load.pointer})"
        source = (data[:load.replace.start_byte] + text.encode() + data[load.replace.end_byte:]).decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source,
                            note=f"{parsed.text(load.replace)} reads through the read-only cache: {text}")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        """Plain `*(p)` loads that are only read (not assigned, incremented or addressed) where `p`
        starts with a pointer the function declares `const` of a type `__ldg` loads (`const float* x`,
        a parameter or a local): data the kernel promises not to write through that pointer. None
        where a launch passes one buffer twice: the kernel may write what it reads elsewhere."""
        for launch in state.plan.launches:
            buffers = [arg.name for arg in launch.args if arg.kind is ArgKind.BUFFER]
            if len(buffers) != len(set(buffers)):
                return []
        parsed = cp.parse(state.source)
        readable = _const_pointers(parsed)
        anchors = []
        for key, load in _keyed(parsed):
            base = re.match(r"\s*\(*\s*([A-Za-z_]\w*)", load.pointer)
            if load.is_ldg or base is None or (load.function, base[1]) not in readable or _written(load.replace):
                continue
            anchors.append(Anchor(load.function, "call", key, parsed.text(load.replace)))
        return anchors


def _const_pointers(parsed: cp.ParsedSource) -> set[tuple[str, str]]:
    """(function, name) of every `const T*` parameter or local with T an `__ldg` type."""
    found = set()
    for owner in cp.nodes_of_type(parsed.root, "parameter_declaration", "declaration"):
        function = cp.function_of(owner)
        qualifiers = {parsed.text(c) for c in owner.children if c.type == "type_qualifier"}
        kind = owner.child_by_field_name("type")
        if function is None or "const" not in qualifiers or kind is None:
            continue
        if " ".join(parsed.text(kind).split()) not in LDG_TYPES:
            continue
        for declarator in owner.children_by_field_name("declarator"):
            if declarator.type == "init_declarator":
                declarator = declarator.child_by_field_name("declarator")
            if declarator is None or declarator.type != "pointer_declarator":
                continue
            name = declarator.child_by_field_name("declarator")
            if name is not None and name.type == "identifier":
                found.add((function, parsed.text(name)))
    return found


def _written(node: Node) -> bool:
    """Whether an expression is the target of an assignment, an increment or `&`."""
    parent = node.parent
    while parent is not None and parent.type == "parenthesized_expression":
        node, parent = parent, parent.parent
    if parent is None:
        return False
    if parent.type == "assignment_expression":
        return parent.child_by_field_name("left") == node
    if parent.type == "update_expression":
        return True
    return parent.type == "pointer_expression" and _operator_text(parent) == "&"


def _operator_text(node: Node) -> str:
    operator = node.child_by_field_name("operator")
    return operator.text.decode("utf-8") if operator is not None and operator.text is not None else ""


register(Ldg())
