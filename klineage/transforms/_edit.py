"""Editing utilities shared by the transforms: byte-range splicing, whole-line spans and indentation,
and the syntax queries (parentheses, casts, parameters, memory spaces) that rewrites lean on.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.features.source import source_features
from klineage.kernel import KernelState
from klineage.transforms.base import NotApplicable

LOAD_INTRINSICS = frozenset({"__ldg", "__ldca", "__ldcg", "__ldcs", "__ldlu", "__ldcv"})


CASTS = frozenset({"reinterpret_cast", "static_cast", "const_cast"})


MAX_DEPTH = 8


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # the type specifier text: "float", "float4", "Vec"
    indirection: str  # "*" for a pointer
    node: Node = field(compare=False, repr=False)


def unwrap(node: Node) -> Node:
    """The expression under parentheses and casts (`(reinterpret_cast<T*>(p))` -> `p`)."""
    while True:
        if node.type == "parenthesized_expression" and node.named_child_count:
            node = node.named_children[0]
        elif node.type == "call_expression" and cast_name(node) in CASTS and call_arguments(node):
            node = call_arguments(node)[0]
        elif node.type == "cast_expression" and node.child_by_field_name("value") is not None:
            node = node.child_by_field_name("value")
        else:
            return node


def unparen(node: Node) -> Node:
    while node.type == "parenthesized_expression" and node.named_child_count:
        node = node.named_children[0]
    return node


def summands(parsed: cp.ParsedSource, node: Node) -> list[Node]:
    """The terms an expression adds (`(long long)r * n + c` -> [`(long long)r * n`, `c`]), each without its
    parentheses and casts; a difference's right side is a term of its own."""
    node = unparen(node)
    while node.type == "cast_expression":
        node = unparen(node.child_by_field_name("value"))
    if node.type == "binary_expression" and parsed.text(node.child_by_field_name("operator")) in ("+", "-"):
        return summands(parsed, node.child_by_field_name("left")) + summands(parsed, node.child_by_field_name("right"))
    return [node]


def outer_parens(node: Node) -> Node:
    """`node` or the outermost parenthesized_expression that wraps it alone."""
    while node.parent is not None and node.parent.type == "parenthesized_expression":
        node = node.parent
    return node


def is_written(node: Node) -> bool:
    """`node` (alone in any parentheses around it) is what an assignment or an increment writes."""
    outer = outer_parens(node)
    parent = outer.parent
    return parent is not None and parent.type in ("assignment_expression", "update_expression") and \
        (parent.child_by_field_name("left") or parent.child_by_field_name("argument")) == outer


def written_names(parsed: cp.ParsedSource, scope: Node) -> set[str]:
    """The names `scope` assigns or increments (`n = e`, `n += e`, `++n`)."""
    return {parsed.text(node) for node in cp.nodes_of_type(scope, "identifier") if is_written(node)}


def declared_kind(parsed: cp.ParsedSource, declaration: Node) -> str:
    """What a declaration says before its first declarator (`float`, `const int`), blanks squashed."""
    first = declaration.children_by_field_name("declarator")[0]
    return " ".join(parsed.data[declaration.start_byte:first.start_byte].decode("utf-8").split())


# the 32-bit integer types a local holding a thread's coordinate (or a value of it) is declared with
INDEX_LOCAL_KINDS = frozenset({"int", "unsigned", "unsigned int", "const int", "const unsigned", "const unsigned int"})


def unassigned_locals(parsed: cp.ParsedSource, function: Node, kinds: frozenset[str] = INDEX_LOCAL_KINDS
                      ) -> dict[str, str]:
    """Each local the function's body declares with a value and one of `kinds` (as `declared_kind` reads it), alone
    or beside others (`int row = blockIdx.x, tid = threadIdx.x;`), and never assigns -> its value, squashed: a name
    that holds that value wherever it is read."""
    written = written_names(parsed, function)
    found = {}
    for declaration in cp.nodes_of_type(function.child_by_field_name("body"), "declaration"):
        if declared_kind(parsed, declaration) not in kinds:
            continue
        for declarator in declaration.children_by_field_name("declarator"):
            name, value = declarator.child_by_field_name("declarator"), declarator.child_by_field_name("value")
            if declarator.type == "init_declarator" and name.type == "identifier" and parsed.text(name) not in written:
                found[parsed.text(name)] = " ".join(parsed.text(value).split())
    return found


def local_types(parsed: cp.ParsedSource, body: Node) -> dict[str, str]:
    """Each local the body declares once: its type (a name declared twice, maybe as two types, is left out)."""
    types: dict[str, str] = {}
    names = declared_names(parsed, body)
    for declaration in cp.nodes_of_type(body, "declaration"):
        kind = declaration.child_by_field_name("type")
        for declarator in declaration.children_by_field_name("declarator"):
            name = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else declarator
            if kind is not None and name.type == "identifier" and names.count(parsed.text(name)) == 1:
                types[parsed.text(name)] = " ".join(parsed.text(kind).split())
    return types


def declared_names(parsed: cp.ParsedSource, scope: Node) -> list[str]:
    """The name of each variable `scope` declares, in order: a name declared in two scopes is listed twice."""
    names = []
    for declaration in cp.nodes_of_type(scope, "declaration"):
        for declarator in declaration.children_by_field_name("declarator"):
            while declarator is not None and declarator.type != "identifier":
                declarator = declarator.child_by_field_name("declarator")
            names += [parsed.text(declarator)] if declarator is not None else []
    return names


def cast_name(call: Node) -> str:
    function = call.child_by_field_name("function")
    if function is not None and function.type == "template_function":
        name = function.child_by_field_name("name")
        return name.text.decode() if name is not None else ""
    return ""


def call_arguments(call: Node) -> list[Node]:
    arguments = call.child_by_field_name("arguments")
    return [a for a in arguments.named_children if a.type != "comment"] if arguments is not None else []


def operator(node: Node) -> str:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else ""


@dataclass(frozen=True)
class LdgCall:
    """`__ldg(&a[k])`: the call and the subscript it loads."""

    node: Node
    subscript: Node


def ldg_calls(parsed: cp.ParsedSource, scope: Node) -> list[LdgCall]:
    """Every `__ldg(&a[k])` of the scope whose array is a plain name (parentheses around either are fine)."""
    found = []
    for call in cp.nodes_of_type(scope, "call_expression"):
        arguments = call_arguments(call)
        if cp.call_name(call) != "__ldg" or len(arguments) != 1:
            continue
        address = unparen(arguments[0])
        if address.type != "pointer_expression" or operator(address) != "&":
            continue
        subscript = unparen(address.child_by_field_name("argument"))
        if subscript.type == "subscript_expression" and \
                subscript.child_by_field_name("argument").type == "identifier":
            found.append(LdgCall(call, subscript))
    return found


def plain_read_edits(parsed: cp.ParsedSource, scope: Node, array: str | None = None) -> list[tuple[int, int, str]]:
    """Edits that read each `__ldg(&a[k])` of the scope (of `array` only, when given) as `a[k]`; a call inside
    another's subscript (`__ldg(&t[__ldg(&idx[i])])`) is left for a later pass, where its edit no longer overlaps."""
    calls = [call for call in ldg_calls(parsed, scope)
             if array is None or parsed.text(call.subscript.child_by_field_name("argument")) == array]
    inner = {node.id for call in calls for node in cp.nodes_of_type(call.subscript, "call_expression")}
    return [(call.node.start_byte, call.node.end_byte, parsed.text(call.subscript))
            for call in calls if call.node.id not in inner]


def params(parsed: cp.ParsedSource, function: Node) -> list[Param]:
    """The parameters of a function definition (not of lambdas inside it)."""
    declarator = function.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return []
    found = []
    for node in declarator.child_by_field_name("parameters").named_children:
        if node.type not in ("parameter_declaration", "optional_parameter_declaration"):
            continue
        inner, indirection = node.child_by_field_name("declarator"), ""
        while inner is not None and inner.type not in ("identifier", "field_identifier"):
            if inner.type == "pointer_declarator":
                indirection += "*"
            elif inner.type == "reference_declarator":
                indirection += "&"
            nested = inner.child_by_field_name("declarator")
            inner = nested if nested is not None else next(
                (c for c in reversed(inner.named_children) if c.type != "type_qualifier"), None)
        type_node = node.child_by_field_name("type")
        if inner is not None and type_node is not None:
            found.append(Param(parsed.text(inner), parsed.text(type_node), indirection, node))
    return found


def contains(outer: Node, inner: Node) -> bool:
    return outer.start_byte <= inner.start_byte and inner.end_byte <= outer.end_byte


def functions_named(parsed: cp.ParsedSource, name: str) -> list[Node]:
    return [f.node for f in cp.functions(parsed) if f.name == name]


class Scope:
    """Declarations, functions and calls of one parsed source, for name and memory-space lookups."""

    def __init__(self, parsed: cp.ParsedSource):
        self.parsed = parsed
        self.declarations = cp.declarations(parsed)
        self.functions = cp.functions(parsed)
        self.calls: dict[str, list[Node]] = {}
        for call in cp.nodes_of_type(parsed.root, "call_expression"):
            self.calls.setdefault(cp.call_name(call), []).append(call)

    def declaration(self, name: str, at: Node) -> cp.Declaration | None:
        """The declaration of `name` visible at `at`: the last one before it in its function, else at
        namespace scope."""
        function = cp.enclosing_function(at)
        local = [d for d in self.declarations if d.name == name and function is not None
                 and contains(function, d.node) and d.node.start_byte < at.start_byte]
        if local:
            return local[-1]
        return next((d for d in self.declarations if d.name == name and d.function is None), None)

    def param(self, name: str, at: Node) -> tuple[Node, int, Param] | None:
        function = cp.enclosing_function(at)
        if function is None:
            return None
        for index, param in enumerate(params(self.parsed, function)):
            if param.name == name:
                return function, index, param
        return None

    def is_kernel(self, function: Node) -> bool:
        return any(f.node == function and f.is_kernel for f in self.functions)

    def memory_space(self, expression: Node, depth: int = 0) -> str | None:
        """"global", "shared", "local" or None (unknown) for the memory an address expression points into."""
        if depth > MAX_DEPTH:
            return None
        node = unwrap(expression)
        if node.type == "binary_expression" and operator(node) in ("+", "-"):
            for side in ("left", "right"):
                space = self.memory_space(node.child_by_field_name(side), depth + 1)
                if space is not None:
                    return space
            return None
        if node.type == "pointer_expression" and operator(node) == "&":
            return self.memory_space(node.child_by_field_name("argument"), depth + 1)
        if node.type == "subscript_expression":
            return self.memory_space(node.child_by_field_name("argument"), depth + 1)
        if node.type == "conditional_expression":
            spaces = {self.memory_space(node.child_by_field_name(f), depth + 1) for f in ("consequence", "alternative")}
            return spaces.pop() if len(spaces) == 1 else None
        if node.type == "call_expression":
            if cp.call_name(node) == "__cvta_generic_to_shared":
                return "shared"
            return self._lambda_space(node, depth)
        if node.type == "identifier":
            return self._name_space(node, depth)
        return None

    def _lambda_space(self, call: Node, depth: int) -> str | None:
        """A call of a local lambda (`auto stage = [&](int s) { return base + s * BYTES; }`): where its
        return values point."""
        callee = call.child_by_field_name("function")
        if callee is None or callee.type != "identifier":
            return None
        declaration = self.declaration(self.parsed.text(callee), call)
        if declaration is None or declaration.init is None or declaration.init.type != "lambda_expression":
            return None
        returns = [r.named_children[0] for r in cp.nodes_of_type(declaration.init, "return_statement")
                   if r.named_child_count]
        spaces = {self.memory_space(r, depth + 1) for r in returns}
        return spaces.pop() if len(spaces) == 1 else None

    def _name_space(self, node: Node, depth: int) -> str | None:
        name = self.parsed.text(node)
        declaration = self.declaration(name, node)
        found_param = self.param(name, node)
        if declaration is not None and (found_param is None or declaration.function is not None):
            specifiers = set(declaration.specifiers)
            if "__shared__" in specifiers:
                return "shared"
            if declaration.function is None:
                return "global" if "__device__" in specifiers or "__managed__" in specifiers else (
                    "constant" if "__constant__" in specifiers else None)
            if declaration.init is not None:
                return self.memory_space(declaration.init, depth + 1)
            return "local" if not declaration.indirection else None
        if found_param is None:
            return None
        function, index, param = found_param
        if self.is_kernel(function):
            return "global" if param.indirection.startswith("*") else None
        spaces = set()
        for call in self.calls.get(cp.function_name(function), []):
            arguments = call_arguments(call)
            if index >= len(arguments) or contains(function, call):
                spaces.add(None)  # a default argument, or recursion: unknown
                continue
            spaces.add(self.memory_space(arguments[index], depth + 1))
        return spaces.pop() if len(spaces) == 1 else None


def occurrences(data: bytes, text: str, ranges: list[tuple[int, int]]) -> list[int]:
    """Start offsets of `text` inside the byte ranges, in order; where the text begins or ends with a
    name character, only where it does not continue a longer name (`c` is not found in `const`)."""
    needle, found = text.encode("utf-8"), []
    word = re.compile(rb"\w")
    for start, end in ranges:
        at = data.find(needle, start)
        while at != -1 and at + len(needle) <= end:
            before = data[at - 1:at] if at > 0 else b""
            after = data[at + len(needle):at + len(needle) + 1]
            if not (word.match(needle[:1]) and word.match(before)) and not (word.match(needle[-1:]) and
                                                                             word.match(after)):
                found.append(at)
            at = data.find(needle, at + 1)
    return found


def function_ranges(parsed: cp.ParsedSource, name: str) -> list[tuple[int, int]]:
    return [(n.start_byte, n.end_byte) for n in functions_named(parsed, name)]


def payload(key: str) -> tuple[str, dict[str, Any]]:
    """`"xv#0 {...}"` -> ("xv#0", {...}); a key without a payload gives an empty dict."""
    head, _, rest = key.partition(" ")
    if not rest:
        return head, {}
    try:
        data = json.loads(rest)
    except json.JSONDecodeError:
        raise NotApplicable(f"anchor key {key[:60]!r} has a malformed payload") from None
    return head, data if isinstance(data, dict) else {}


def make_key(head: str, data: dict[str, Any]) -> str:
    return f"{head} {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}"


def function_feature_names(source: str, function: str) -> set[str]:
    return {f.name for f in source_features(source) if f.locus == function}


def line_start(data: bytes, offset: int) -> int:
    return data.rfind(b"\n", 0, offset) + 1


def line_end(data: bytes, offset: int) -> int:
    """Offset just past the newline that ends the line holding `offset` (the end of data if none)."""
    end = data.find(b"\n", offset)
    return len(data) if end < 0 else end + 1


def own_lines(parsed: cp.ParsedSource, node: Node) -> tuple[int, int] | None:
    """(start of the first line, end of the last line) when `node` stands alone on its lines: only
    blanks before it, only blanks or a `//` comment after it; None when other code shares them."""
    data = parsed.data
    start = line_start(data, node.start_byte)
    if data[start:node.start_byte].strip():
        return None
    end = line_end(data, max(node.end_byte - 1, node.start_byte))
    rest = data[node.end_byte:end].strip()
    if rest and not rest.startswith(b"//"):
        return None
    return start, end


def fresh_name(taken: set[str], base: str) -> str:
    """`base`, else `base1`, `base2`, ...: the first not in `taken` (which then holds it)."""
    name, n = base, 1
    while name in taken:
        name, n = f"{base}{n}", n + 1
    taken.add(name)
    return name


def indentation(data: bytes, offset: int) -> str:
    """The blanks that begin the line holding `offset`."""
    start = line_start(data, offset)
    text = data[start:offset].decode("utf-8", "replace")
    return text[:len(text) - len(text.lstrip(" \t"))]


def leading_start(parsed: cp.ParsedSource, node: Node) -> int:
    """Start of the comment lines (and a `#pragma`) right above `node` with no blank line between,
    or of the node's own line: the lines that travel with it when it moves or goes."""
    data = parsed.data
    start = line_start(data, node.start_byte)
    previous = node.prev_sibling
    while previous is not None and (previous.type == "comment" or cp.pragma_text(previous)):
        span = own_lines(parsed, previous)
        if span is None or span[1] != start:
            break
        start = span[0]
        previous = previous.prev_sibling
    return start


def item_span(parsed: cp.ParsedSource, node: Node) -> tuple[int, int]:
    """Whole lines of a statement with the comments and pragma above it; NotApplicable if it
    shares a line with other code."""
    span = own_lines(parsed, node)
    if span is None:
        raise NotApplicable(f"`{first_line(parsed, node)}` shares its line with other code")
    return leading_start(parsed, node), span[1]


def reindent(text: str, old: int, new: str) -> str:
    """Move lines from indentation column `old` to indentation `new`: each line loses up to `old`
    leading blanks and gains `new`; blank lines stay empty and `#` lines (pragmas) stay as they are."""
    lines = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        if not body.strip() or body.lstrip().startswith("#"):
            lines.append(line if body.strip() else line[len(body):])
            continue
        blanks = len(body) - len(body.lstrip(" \t"))
        lines.append(new + line[min(blanks, old):])
    return "".join(lines)


def first_line(parsed: cp.ParsedSource, node: Node) -> str:
    return parsed.text(node).strip().splitlines()[0][:80] if parsed.text(node).strip() else node.type


class Edit(NamedTuple):
    """Replace bytes [start, end) by `text`; an insertion has start == end."""

    start: int
    end: int
    text: str = ""


def splice(data: bytes, edits: Iterable[tuple[int, int, str]]) -> tuple[bytes, list[int]]:
    """Apply byte-range edits (start, end, text) that do not overlap; insertions at one offset keep their
    order. Returns the new bytes and where each edit's text starts in them."""
    edits = [Edit(*edit) for edit in edits]
    order = sorted(range(len(edits)), key=lambda i: (edits[i].start, edits[i].end, i))
    out, starts, position, shift = [], [0] * len(edits), 0, 0
    for i in order:
        start, end, text = edits[i]
        if start < position:
            raise NotApplicable("overlapping edits")
        encoded = text.encode("utf-8")
        out += [data[position:start], encoded]
        starts[i] = start + shift
        shift += len(encoded) - (end - start)
        position = end
    out.append(data[position:])
    return b"".join(out), starts


# integer arithmetic over names and numbers (sums, products, casts, parentheses): no call, subscript, comparison or
# comma, so its value is fixed by the names it reads
INTEGER_ARITHMETIC = re.compile(r"[\w\s*+\-()]+")


def through_blanks(parsed: cp.ParsedSource, node: Node) -> int:
    """Past `node` and the blanks up to the next statement: a removed statement takes its line with it."""
    end = node.end_byte
    while end < len(parsed.data) and parsed.data[end:end + 1] in (b" ", b"\t", b"\r", b"\n"):
        end += 1
    return end


KernelEdit = Callable[[cp.ParsedSource, cp.Function, Node], list[tuple[int, int, str]]]


def edited(state: KernelState, edit: KernelEdit, only: str | None = None) -> KernelState:
    """`state` with `edit`'s byte edits of each kernel's body made (of the kernel `only` where given); the same
    state where there are none. NotApplicable where two edits overlap."""
    parsed = cp.parse(state.source)
    edits = [found for function in cp.functions(parsed)
             if function.is_kernel and (only is None or function.name == only)
             and (body := function.node.child_by_field_name("body")) is not None
             for found in edit(parsed, function, body)]
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def edited_to_fixpoint(state: KernelState, edit: KernelEdit, passes: int) -> KernelState:
    """`state` with `edit`'s byte edits of each kernel's body made, then again on the result, up to `passes` times
    while there are any (a fold that reads through another waits for it); the state as it stands where two edits
    would overlap (a fold inside another's use: left as written)."""
    for _ in range(passes):
        try:
            once = edited(state, edit)
        except NotApplicable:
            return state
        if once is state:
            return state
        state = once
    return state

