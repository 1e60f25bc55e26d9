"""restrict: drop `__restrict__` from one pointer (a function parameter, or a local pointer).

Anchor: the enclosing function, kind "parameter" (a parameter of that function, kernel or helper)
or "declaration" (a pointer declared in its body), key the variable's name; `#<n>` follows the
name when the function (or its overloads, which share the name) declares it more than once,
counting every pointer of that name with or without the qualifier, so the ordinal survives the
removal. A spelling other than `__restrict__` is kept in the key (`p:__restrict`) so that forward
puts the same word back.

Backward is always correct: `__restrict__` is a promise that the pointer does not alias; without
it the compiler assumes less and reloads more, the values are the same. Its usual visible cost is
that loads through `const T* __restrict__` leave the read-only path (SASS `LDG...CONSTANT`,
`ldg_const`), unless `__ldg` asks for it explicitly.
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
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

SPELLINGS = ("__restrict__", "__restrict")
_KEY = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:#(?P<n>\d+))?(?::(?P<spelling>__restrict(?:__)?))?$")


class _Pointer:
    """A pointer declarator of a parameter or a declaration, and its restrict qualifier if any."""

    def __init__(self, function: str, kind: str, name: Node, declarator: Node, qualifier: Node | None):
        self.function, self.kind, self.name = function, kind, name
        self.declarator, self.qualifier = declarator, qualifier


def _pointers(parsed: cp.ParsedSource) -> list[_Pointer]:
    found = []
    for owner in cp.nodes_of_type(parsed.root, "parameter_declaration", "declaration"):
        function = cp.function_of(owner) or "<file>"
        kind = "parameter" if owner.type == "parameter_declaration" else "declaration"
        if kind == "parameter" and not _is_definition_parameter(owner):
            continue  # a parameter of a function pointer, a lambda or a prototype inside a body
        declarators = owner.children_by_field_name("declarator")
        for declarator in declarators:
            if declarator.type == "init_declarator":
                declarator = declarator.child_by_field_name("declarator")
            pointer = declarator
            while pointer is not None and pointer.type not in ("pointer_declarator", "identifier"):
                pointer = pointer.child_by_field_name("declarator")
            if pointer is None or pointer.type != "pointer_declarator":
                continue
            name = pointer.child_by_field_name("declarator")
            if name is None or name.type != "identifier":
                continue  # pointer to pointer, pointer to array: not handled
            qualifier = None
            for child in pointer.children:
                if child.type == "type_qualifier" and parsed.text(child) in SPELLINGS:
                    qualifier = child
                elif child.type == "ms_pointer_modifier" and parsed.text(child) in SPELLINGS:
                    qualifier = child
            found.append(_Pointer(function, kind, name, pointer, qualifier))
    return found


def _is_definition_parameter(parameter: Node) -> bool:
    """A parameter of the function definition that encloses it (not of a nested declarator)."""
    definition = cp.enclosing_function(parameter)
    declarator = definition.child_by_field_name("declarator") if definition is not None else None
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    return declarator is not None and parameter.parent == declarator.child_by_field_name("parameters")


def _keyed(parsed: cp.ParsedSource) -> list[tuple[Anchor, _Pointer]]:
    counts: dict[tuple[str, str, str], int] = {}
    keyed = []
    for pointer in _pointers(parsed):
        name = parsed.text(pointer.name)
        slot = (pointer.function, pointer.kind, name)
        n = counts.get(slot, 0)
        counts[slot] = n + 1
        key = name if n == 0 else f"{name}#{n}"
        if pointer.qualifier is not None and parsed.text(pointer.qualifier) != "__restrict__":
            key += f":{parsed.text(pointer.qualifier)}"
        owner = pointer.declarator
        while owner.type not in ("parameter_declaration", "declaration"):
            owner = owner.parent
        keyed.append((Anchor(pointer.function, pointer.kind, key, parsed.text(owner)), pointer))
    return keyed


class Restrict(Transform):
    name = "restrict"
    intent = "Promise the compiler that a pointer does not alias any other (__restrict__)."
    removes = ("restrict_ptr",)

    def find(self, state: KernelState) -> list[Anchor]:
        return [anchor for anchor, pointer in _keyed(cp.parse(state.source)) if pointer.qualifier is not None]

    def _site(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[_Pointer, str]:
        match = _KEY.match(anchor.key) if anchor.kind in ("parameter", "declaration") else None
        if match is None:
            raise NotApplicable(f"restrict needs a parameter or declaration anchor keyed by a pointer's name, "
                                f"not {anchor}")
        wanted = match["name"] + (f"#{match['n']}" if match["n"] and match["n"] != "0" else "")
        for candidate, pointer in _keyed(parsed):
            if (candidate.function, candidate.kind, candidate.key.split(":")[0]) == (
                    anchor.function, anchor.kind, wanted):
                return pointer, match["spelling"] or "__restrict__"
        raise NotApplicable(f"restrict: no pointer {anchor.kind} '{match['name']}' in {anchor.function}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        pointer, _ = self._site(parsed, anchor)
        if pointer.qualifier is None:
            raise NotApplicable(f"restrict: '{parsed.text(pointer.name)}' in {anchor.function} is not __restrict__")
        data = parsed.data
        start, end = pointer.qualifier.start_byte, pointer.qualifier.end_byte
        after = len(data[end:]) - len(data[end:].lstrip(b" \t"))
        if after:
            end += after  # `float* __restrict__ p` -> `float* p`
        else:
            start -= len(data[:start]) - len(data[:start].rstrip(b" \t"))
        source = (data[:start] + data[end:]).decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"dropped {parsed.text(pointer.qualifier)} from '{parsed.text(pointer.name)}'")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        pointer, spelling = self._site(parsed, anchor)
        if pointer.qualifier is not None:
            raise NotApplicable(f"restrict: '{parsed.text(pointer.name)}' in {anchor.function} is already restrict")
        data = parsed.data
        at = pointer.name.start_byte
        source = (data[:at] + f"{spelling} ".encode() + data[at:]).decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source,
                            note=f"declared '{parsed.text(pointer.name)}' {spelling}")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        """Pointer parameters of `__global__` functions without the qualifier, unless the launch plan
        passes the same buffer to two pointer parameters of that kernel (they would alias)."""
        parsed = cp.parse(state.source)
        kernels = {f.name for f in cp.functions(parsed) if f.is_kernel}
        shared = _aliased_parameters(state, parsed, kernels)
        return [anchor for anchor, pointer in _keyed(parsed)
                if anchor.kind == "parameter" and pointer.qualifier is None and anchor.function in kernels
                and (anchor.function, parsed.text(pointer.name)) not in shared]


def _aliased_parameters(state: KernelState, parsed: cp.ParsedSource, kernels: set[str]) -> set[tuple[str, str]]:
    """(kernel, parameter) pairs that some launch binds to a buffer another parameter also gets."""
    names: dict[str, list[str]] = {}
    for function in cp.functions(parsed):
        if function.name in kernels:
            declarator = function.node.child_by_field_name("declarator")
            while declarator is not None and declarator.type != "function_declarator":
                declarator = declarator.child_by_field_name("declarator")
            parameters = declarator.child_by_field_name("parameters") if declarator is not None else None
            found = []
            for parameter in (parameters.named_children if parameters is not None else []):
                identifiers = cp.nodes_of_type(parameter, "identifier")
                found.append(parsed.text(identifiers[-1]) if identifiers else "")
            names[function.name] = found
    aliased: set[tuple[str, str]] = set()
    for launch in state.plan.launches:
        kernel = launch.entry.split("<")[0].strip()
        buffers = [arg.name if arg.kind is ArgKind.BUFFER else None for arg in launch.args]
        for position, buffer in enumerate(buffers):
            if buffer is not None and buffers.count(buffer) > 1 and position < len(names.get(kernel, [])):
                aliased.add((kernel, names[kernel][position]))
    return aliased


register(Restrict())
