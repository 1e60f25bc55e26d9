"""A kernel template's launched instance written out as a plain kernel, so that the forwards read its types.

Kernels are often written once for every element type, `template <typename scalar_t> __global__ void k(const
scalar_t* x, ...)`, and launched as one instance (`entry = "k<float>"`). The forwards recognise what they rewrite
by its spelling (a `float*` parameter, a block of 256, `blockIdx.x * blockDim.x + threadIdx.x`), so on the template
they find nothing. `specialized` rewrites each such kernel as the instance its plan launches: the template header
goes, every template parameter inside the kernel becomes its argument, and the launches name the plain kernel.
The compiler builds the same instance from either text, so the kernel the gate runs does not change; the forwards
then place their mechanisms on it as on any plain kernel.

A kernel is specialized only where the result is certain to be that instance: every launch of it names the same
instance, each parameter is a type (`typename`, `class`) or a value, with an argument given or a default, its
name appears nowhere else in the source but in explicit instantiations of that instance, which go (no declaration,
instantiation of other arguments or one the compiler deduces, overload or call of it), no
parameter is a pack or a template itself, no type argument is more than one word (`unsigned int(x)` is no
expression) and no parameter is used as a scope (`T::value_type`). A value argument other than a literal or a
name goes in parentheses, so that `N / 2` with `N` = `2 * 64` keeps its value; one with anything but an
expression's characters (a `;`, a brace, a quote, a `#`) or unbalanced parentheses is refused, since the plan's text
becomes source. Anything else is left as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tree_sitter import Node

from klineage.entries import entry_name, normalized, template_arguments
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import splice

_TYPE_PARAMETERS = frozenset({"type_parameter_declaration", "optional_type_parameter_declaration"})
_VALUE_PARAMETERS = frozenset({"parameter_declaration", "optional_parameter_declaration"})
_ATOM = re.compile(r"-?[\w.]+")  # a literal or a name: needs no parentheses in place of a value parameter
# an integral expression: the plan's text becomes source, so no statement, brace, string or directive can ride in it
_VALUE = re.compile(r"[\w\s.+\-*/%()<>=&|^~!?:]+")
_ONE_WORD_TYPE = re.compile(r"[A-Za-z_][\w:]*")  # `float`, `__half`, `c10::Half`: a functional cast still parses
_NAMES = frozenset({"identifier", "type_identifier"})


@dataclass(frozen=True)
class Specialized:
    """The state with its template kernels written as their launched instances, and one line per kernel."""

    state: KernelState
    instances: tuple[str, ...]  # the instances written out, as the plan named them (`k<float>`)

    @property
    def note(self) -> str:
        return f"on the instance{'s' if len(self.instances) > 1 else ''} {', '.join(self.instances)} written out " \
               "as a plain kernel" if self.instances else ""


def specialized(state: KernelState) -> Specialized:
    """`state` with each kernel template its plan launches as one instance written as that instance (the same state,
    and no instances, where there is none)."""
    parsed = cp.parse(state.source)
    edits: list[tuple[int, int, str]] = []
    entries: dict[str, str] = {}
    for function in cp.functions(parsed):
        found = _instance(parsed, function, state)
        if found is not None:
            entry, written = found
            edits += written
            entries[entry] = function.name
    if not edits:
        return Specialized(state, ())
    source = splice(parsed.data, edits)[0].decode("utf-8")
    launches = tuple(replace(launch, entry=entries.get(launch.entry, launch.entry)) for launch in state.plan.launches)
    return Specialized(KernelState(source=source, plan=replace(state.plan, launches=launches)), tuple(entries))


def _instance(parsed: cp.ParsedSource, function: cp.Function,
              state: KernelState) -> tuple[str, list[tuple[int, int, str]]] | None:
    """(the plan's entry, the edits writing the instance) for a launched `__global__` template, else None."""
    template = function.node.parent
    if "__global__" not in function.qualifiers or template is None or template.type != "template_declaration" \
            or function.scope:
        return None
    entries = {launch.entry for launch in state.plan.launches
               if (named := entry_name(launch.entry)) is not None and named[0] == function.name}
    if len(entries) != 1:
        return None
    entry = entries.pop()
    arguments = template_arguments(entry)
    parameters = template.child_by_field_name("parameters").named_children
    values = _bindings(parsed, parameters, arguments)
    instantiations = _instantiations(parsed, function.name)
    if values is None or any(args is None or [normalized(a) for a in args] != [normalized(a) for a in arguments]
                             for _, args in instantiations):
        return None
    own = [template] + [node for node, _ in instantiations]
    if _named_elsewhere(parsed, function.name, own):
        return None
    body_edits = []
    for node in cp.nodes_of_type(function.node, *_NAMES):
        text = parsed.text(node)
        if text in values:
            if node.parent is not None and node.parent.type == "qualified_identifier":
                return None
            body_edits.append((node.start_byte - function.node.start_byte, node.end_byte - function.node.start_byte,
                               values[text]))
    if any(parsed.text(n) in values for n in cp.nodes_of_type(function.node, "namespace_identifier")):
        return None
    written = splice(parsed.data[function.node.start_byte:function.node.end_byte], body_edits)[0].decode("utf-8")
    return entry, [(template.start_byte, template.end_byte, written)] + [
        (node.start_byte, _line_end(parsed.data, node.end_byte), "") for node, _ in instantiations]


def _bindings(parsed: cp.ParsedSource, parameters: list[Node], arguments: list[str] | None) -> dict[str, str] | None:
    """Each parameter's name -> the text that replaces it, or None where one cannot be bound for certain."""
    if arguments is None or len(arguments) > len(parameters):
        return None
    values = {}
    for i, parameter in enumerate(parameters):
        if parameter.type not in _TYPE_PARAMETERS | _VALUE_PARAMETERS:
            return None  # a pack or a template template parameter
        is_type = parameter.type in _TYPE_PARAMETERS
        name_node = (next((c for c in parameter.children if c.type == "type_identifier"), None) if is_type
                     else parameter.child_by_field_name("declarator"))  # `typename T` names no field
        default = parameter.child_by_field_name("default_type" if is_type else "default_value")
        if name_node is None or name_node.type not in _NAMES:
            return None
        argument = arguments[i] if i < len(arguments) else parsed.text(default) if default is not None else None
        if argument is None:
            return None
        if is_type:
            if not _ONE_WORD_TYPE.fullmatch(argument):
                return None
        elif not _VALUE.fullmatch(argument) or argument.count("(") != argument.count(")"):
            return None
        elif not _ATOM.fullmatch(argument):
            argument = f"({argument})"
        values[parsed.text(name_node)] = argument
    return values


def _instantiations(parsed: cp.ParsedSource, name: str) -> list[tuple[Node, list[str] | None]]:
    """The explicit instantiations of template `name` (`template __global__ void k<float>(const float*, ...);`, which
    a kernel file needs for the compiler to build the instance it launches), each with its template arguments
    (None where the compiler deduces them)."""
    found = []
    for node in cp.nodes_of_type(parsed.root, "template_instantiation"):
        declarator = next((c for c in node.children if c.type == "function_declarator"), None)
        named = declarator.child_by_field_name("declarator") if declarator is not None else None
        if named is not None and named.type == "template_function" \
                and parsed.text(named.child_by_field_name("name")) == name:
            found.append((node, template_arguments(parsed.text(named))))
        elif named is not None and parsed.text(named) == name:
            found.append((node, None))
    return found


def _line_end(data: bytes, offset: int) -> int:
    """Past the line break that ends the line at `offset` when only blanks lie between (a removed line leaves none)."""
    rest = data[offset:]
    stripped = rest.lstrip(b" \t")
    return offset + len(rest) - len(stripped) + (1 if stripped.startswith(b"\n") else 0)


def _named_elsewhere(parsed: cp.ParsedSource, name: str, own: list[Node]) -> bool:
    """Whether the kernel's name appears outside its definition and instantiations (a declaration, an overload, a
    call, an instance of other arguments)."""
    return any(parsed.text(node) == name and not any(n.start_byte <= node.start_byte < n.end_byte for n in own)
               for node in cp.nodes_of_type(parsed.root, "identifier", "field_identifier", "type_identifier"))


__all__ = ["Specialized", "specialized"]
