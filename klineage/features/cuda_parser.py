"""CUDA C++ through tree-sitter-cuda: parsing, syntax errors, and views of functions, loops,
declarations, inline asm and macros that the feature reader, the static check and the rule
rewriter share.

Lines are 1-based; nodes keep their byte offsets into the UTF-8 source, so a rewriter can splice
`ParsedSource.data` directly. Trees are cached and shared: treat them as read-only.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from functools import cache, lru_cache
from typing import NamedTuple, TypeVar

import tree_sitter_cuda
from tree_sitter import Language, Node, Parser, Query, QueryCursor, Tree

# Attribute macros the grammar does not know (`struct __align__(16) V`, `__cluster_dims__(2, 1, 1)`).
# They are blanked to spaces of the same length before parsing, so every offset still points
# into the original text, which is where node text is read from.
_UNPARSED_ATTRIBUTE = re.compile(rb"\b(?:__align__|__cluster_dims__|__maxnreg__)\s*\(")
FRAGMENT_FUNCTION = "__klineage_fragment__"
_BODY_FIELDS = ("body", "consequence", "alternative")
_NAME_TYPES = ("identifier", "qualified_identifier", "field_identifier")
T = TypeVar("T")
_ESCAPES = {"\\n": "\n", "\\t": "\t", "\\r": "\r", '\\"': '"', "\\'": "'", "\\\\": "\\"}


class LoopKind(str, Enum):
    FOR = "for"
    RANGE_FOR = "range_for"
    WHILE = "while"
    DO = "do"


_LOOPS = {"for_statement": LoopKind.FOR, "for_range_loop": LoopKind.RANGE_FOR, "while_statement": LoopKind.WHILE,
          "do_statement": LoopKind.DO}


class SyntaxIssue(NamedTuple):
    line: int
    column: int  # 1-based, in characters
    text: str  # the unparsable text, or "missing X"


@dataclass(frozen=True)
class ParsedSource:
    source: str
    data: bytes  # the original source as UTF-8; node byte offsets index it
    tree: Tree = field(compare=False, repr=False)
    # whole-source views (functions, loops, ...) made once per tree: a walk asks for them thousands of times
    _views: dict[str, tuple] = field(default_factory=dict, compare=False, repr=False)

    @property
    def root(self) -> Node:
        return self.tree.root_node

    def view(self, name: str, make: Callable[[ParsedSource], Iterable[T]]) -> list[T]:
        """`make(self)`, made on the first call for `name` and kept with the tree; a fresh list each call, so
        that a caller sorting or extending it changes nothing the next caller sees."""
        if name not in self._views:
            self._views[name] = tuple(make(self))
        return list(self._views[name])

    def text(self, node: Node) -> str:
        return self.data[node.start_byte:node.end_byte].decode("utf-8", "replace")

    def column(self, node: Node) -> int:
        line_start = node.start_byte - node.start_point.column
        return len(self.data[line_start:node.start_byte].decode("utf-8", "replace")) + 1


@dataclass(frozen=True)
class Function:
    name: str  # `gemm`, `Tile::load`, `operator+`; template arguments are dropped
    scope: str  # the enclosing namespaces and classes, `a::b`; "" at file scope
    qualifiers: tuple[str, ...]  # `__global__`, `__device__`, `__forceinline__`, `static`, ...
    template_params: tuple[str, ...]  # `int BM`, `typename T`; () for a plain function
    launch_bounds: tuple[str, ...]  # the `__launch_bounds__` arguments, () when absent
    lines: tuple[int, int]
    node: Node = field(compare=False, repr=False)

    @property
    def is_kernel(self) -> bool:
        return "__global__" in self.qualifiers


@dataclass(frozen=True)
class Loop:
    """A loop. Where `#pragma unroll` is the braceless body of an outer loop, the grammar ends the
    outer loop before the pragma, so the inner loop is its next sibling rather than its body."""

    kind: LoopKind
    pragma: str  # the `#pragma` text right before the loop (`unroll`, `unroll 4`, `nounroll`), or ""
    function: str | None
    lines: tuple[int, int]
    node: Node = field(compare=False, repr=False)
    pragma_node: Node | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Declaration:
    """One declared variable (a declaration with several declarators yields several)."""

    name: str
    type: str
    specifiers: tuple[str, ...]  # `__shared__`, `extern`, `static`, `const`, `constexpr`, `__device__`, ...
    dims: tuple[str, ...]  # array extents in source order, "" for `[]`; () when not an array
    indirection: str  # the declarator's `*` and `&`, outermost first: "*" for `float* p`, "" for `float x`
    constant: bool  # the object itself cannot be written (for a pointer: the pointer, not the pointee)
    function: str | None  # the enclosing function, None at namespace scope
    line: int
    node: Node = field(compare=False, repr=False)  # the declaration
    init: Node | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class AsmBlock:
    code: str  # the assembly template: its string pieces joined, common escapes decoded
    function: str | None
    lines: tuple[int, int]
    node: Node = field(compare=False, repr=False)


@dataclass(frozen=True)
class Macro:
    name: str
    params: tuple[str, ...] | None  # None for an object-like macro
    body: str  # line continuations turned into spaces, so the body reads as ordinary code
    line: int
    node: Node = field(compare=False, repr=False)


@cache
def language() -> Language:
    return Language(tree_sitter_cuda.language())


_local = threading.local()  # a Parser is not safe to share between threads


def _parser() -> Parser:
    if not hasattr(_local, "parser"):
        _local.parser = Parser(language())
    return _local.parser


@lru_cache(maxsize=16)
def parse(source: str) -> ParsedSource:
    data = source.encode("utf-8")
    return ParsedSource(source, data, _parser().parse(_parse_view(data)))


@lru_cache(maxsize=1024)  # apart from parse(), so that a file's many macros do not evict the file
def parse_fragment(code: str) -> ParsedSource:
    """Parse a code fragment (a macro body) as the body of a function named FRAGMENT_FUNCTION."""
    data = f"void {FRAGMENT_FUNCTION}() {{\n{code}\n;}}".encode()
    return ParsedSource(data.decode("utf-8"), data, _parser().parse(_parse_view(data)))


def _parse_view(data: bytes) -> bytes:
    """`data` with each attribute macro's `name(args)` blanked, where it is code: an occurrence in a
    comment or a literal stays, and so does one whose parentheses do not close on the same line
    without a `;`, `{` or `}` (the grammar then sees it as written, and fails closed)."""
    view = bytearray(data)
    hidden = comments_and_literals(data)
    for match in _UNPARSED_ATTRIBUTE.finditer(data):
        if inside(hidden, match.start()):
            continue
        depth, end = 0, match.end() - 1
        while end < len(data) and data[end] not in b"\n;{}":
            depth += {40: 1, 41: -1}.get(data[end], 0)  # ( and )
            end += 1
            if depth == 0:
                break
        if depth == 0:
            view[match.start():end] = b" " * (end - match.start())
    return bytes(view)


_HIDDEN = re.compile(rb'//(?:[^\n\\]|\\.)*|/\*.*?(?:\*/|\Z)|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.DOTALL)


def comments_and_literals(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of every comment, string and character literal, in order. A `//` comment runs on
    past a backslash-newline, as the preprocessor splices it."""
    return [match.span() for match in _HIDDEN.finditer(data)]


def inside(spans: list[tuple[int, int]], offset: int) -> bool:
    index = bisect.bisect_right(spans, (offset, 1 << 62)) - 1
    return index >= 0 and spans[index][0] <= offset < spans[index][1]


@cache
def query(pattern: str) -> Query:
    return Query(language(), pattern)


def captures(node: Node, pattern: str) -> dict[str, list[Node]]:
    """Nodes under `node` captured by a tree-sitter query, by capture name."""
    return QueryCursor(query(pattern)).captures(node)


def nodes_of_type(node: Node, *types: str) -> list[Node]:
    """Descendants of `node` (itself included) of the given named types, in source order."""
    found = captures(node, "[" + " ".join(f"({t})" for t in types) + "] @node").get("node", [])
    return sorted(found, key=lambda n: (n.start_byte, -n.end_byte))


def line_range(node: Node) -> tuple[int, int]:
    end_row = node.end_point.row
    if node.end_point.column == 0 and end_row > node.start_point.row:
        end_row -= 1  # preprocessor nodes end on the start of the next line
    return node.start_point.row + 1, end_row + 1


def enclosing_function(node: Node) -> Node | None:
    """The innermost function definition containing `node` (or `node` itself)."""
    while node is not None and node.type != "function_definition":
        node = node.parent
    return node


def function_name(definition: Node) -> str:
    declarator = definition.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return ""
    name = declarator.child_by_field_name("declarator")
    if name.type == "template_function":
        name = name.child_by_field_name("name")
    return name.text.decode("utf-8", "replace")


def function_of(node: Node) -> str | None:
    definition = enclosing_function(node)
    return function_name(definition) if definition is not None else None


def call_name(call: Node) -> str:
    """The called name of a call_expression without scope or template arguments (`mma_sync`)."""
    function = call.child_by_field_name("function")
    while function is not None and function.type in ("qualified_identifier", "template_function"):
        function = function.child_by_field_name("name")
    return function.text.decode("utf-8", "replace") if function is not None else ""


def syntax_errors(source: str | ParsedSource) -> list[SyntaxIssue]:
    parsed = _parsed(source)
    issues = []
    for node in _error_nodes(parsed.root):
        if node.is_missing:
            if _pragma_as_body(node):
                continue
            text = f"missing {node.type!r}"
        else:
            lines = parsed.text(node).strip().splitlines()
            text = lines[0][:60] if lines else "unexpected input"
        issues.append(SyntaxIssue(node.start_point.row + 1, parsed.column(node), text))
    return sorted(set(issues))


def _error_nodes(root: Node) -> list[Node]:
    """The outermost ERROR nodes and every MISSING node, searching only subtrees with errors."""
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            found.append(node)
        elif node.has_error:
            stack.extend(node.children)
    return found


def _pragma_as_body(missing: Node) -> bool:
    """The grammar cannot take `#pragma unroll` as the sole body of `for (...)` without braces
    (a common idiom for nested loops): it reports a missing `;` there, which is not an error."""
    statement = missing.parent
    if statement is None or statement.type != "expression_statement" or statement.named_child_count:
        return False
    owner = statement.parent
    if owner is None or not any(owner.child_by_field_name(f) == statement for f in _BODY_FIELDS):
        return False
    following = owner.next_sibling
    # `for (...) for (...)` then the pragma: the inner loop is the outer one's body, so the
    # pragma follows the outermost of the braceless chain.
    while following is None and owner.parent is not None and any(
            owner.parent.child_by_field_name(f) == owner for f in _BODY_FIELDS):
        owner = owner.parent
        following = owner.next_sibling
    return following is not None and following.type == "preproc_call" and is_pragma(following)


def is_pragma(node: Node) -> bool:
    """A `#pragma` line (the grammar parses it as a generic preproc_call)."""
    directive = node.child_by_field_name("directive")
    return directive is not None and re.sub(rb"\s", b"", directive.text) == b"#pragma"


def pragma_text(node: Node) -> str:
    """The argument of a `#pragma` preproc_call (`unroll 4`), or "" for any other node."""
    if node.type != "preproc_call" or not is_pragma(node):
        return ""
    argument = node.child_by_field_name("argument")
    return argument.text.decode("utf-8", "replace").strip() if argument is not None else ""


def functions(source: str | ParsedSource) -> list[Function]:
    return _parsed(source).view("functions", _functions)


def _functions(parsed: ParsedSource) -> list[Function]:
    found = []
    for node in nodes_of_type(parsed.root, "function_definition"):
        skipped = {"type", "declarator", "body"}
        qualifiers = tuple(parsed.text(child) for i, child in enumerate(node.children)
                           if node.field_name_for_child(i) not in skipped
                           and (child.type in ("storage_class_specifier", "type_qualifier") or _is_keyword(child)))
        bounds = next((c for c in node.children if c.type == "launch_bounds"), None)
        template = node.parent if node.parent is not None and node.parent.type == "template_declaration" else None
        params = template.child_by_field_name("parameters") if template is not None else None
        found.append(Function(
            name=function_name(node),
            scope=_scope(parsed, node),
            qualifiers=qualifiers,
            template_params=tuple(parsed.text(p) for p in params.named_children) if params else (),
            launch_bounds=tuple(parsed.text(a) for a in bounds.named_children) if bounds else (),
            lines=line_range(node),
            node=node,
        ))
    return found


def _scope(parsed: ParsedSource, node: Node) -> str:
    names = []
    for ancestor in _ancestors(node):
        if ancestor.type in ("namespace_definition", "struct_specifier", "class_specifier"):
            name = ancestor.child_by_field_name("name")
            names.insert(0, parsed.text(name) if name is not None else "(anonymous)")
    return "::".join(names)


def _ancestors(node: Node):
    while node.parent is not None:
        node = node.parent
        yield node


def loops(source: str | ParsedSource) -> list[Loop]:
    return _parsed(source).view("loops", _loops)


def _loops(parsed: ParsedSource) -> list[Loop]:
    found = []
    for node in nodes_of_type(parsed.root, *_LOOPS):
        pragma = node.prev_named_sibling
        while pragma is not None and pragma.type == "comment":
            pragma = pragma.prev_named_sibling
        pragma = pragma if pragma is not None and pragma_text(pragma) else None
        found.append(Loop(_LOOPS[node.type], pragma_text(pragma) if pragma else "",
                          function_of(node), line_range(node), node, pragma))
    return found


def declarations(source: str | ParsedSource) -> list[Declaration]:
    return _parsed(source).view("declarations", _declarations)


def _declarations(parsed: ParsedSource) -> list[Declaration]:
    found = []
    for node in nodes_of_type(parsed.root, "declaration"):
        specifiers = tuple(parsed.text(child) for child in node.children
                           if child.type in ("storage_class_specifier", "type_qualifier") or _is_keyword(child))
        type_node = node.child_by_field_name("type")
        type_text = parsed.text(type_node) if type_node is not None else ""
        for declarator in node.children_by_field_name("declarator"):
            variable = _variable(parsed, declarator, specifiers)
            if variable is None:
                continue
            name, dims, indirection, constant, init = variable
            found.append(Declaration(name, type_text, specifiers, dims, indirection, constant, function_of(node),
                                     node.start_point.row + 1, node, init))
    return found


def _variable(parsed: ParsedSource, declarator: Node,
              specifiers: tuple[str, ...]) -> tuple[str, tuple[str, ...], str, bool, Node | None] | None:
    """(name, dims, indirection, constant, init) of one declarator, or None for a function prototype."""
    init = None
    if declarator.type == "init_declarator":
        init = declarator.child_by_field_name("value")
        declarator = declarator.child_by_field_name("declarator")
    dims: list[str] = []
    indirection = ""
    pointer_const = False
    while declarator is not None and declarator.type not in _NAME_TYPES:
        if declarator.type == "function_declarator":
            return None
        if declarator.type == "pointer_declarator":
            if "*" not in indirection:  # the outermost pointer is the variable itself
                pointer_const = any(parsed.text(c) == "const" for c in declarator.named_children
                                    if c.type == "type_qualifier")
            indirection += "*"
        elif declarator.type == "reference_declarator":
            indirection += "&"
        elif declarator.type == "array_declarator":
            size = declarator.child_by_field_name("size")
            dims.insert(0, parsed.text(size) if size is not None else "")
        inner = declarator.child_by_field_name("declarator")  # a reference has no such field
        declarator = inner if inner is not None else next(iter(declarator.named_children[-1:]), None)
    if declarator is None:
        return None
    # `const` among the specifiers binds to the pointee when the variable is a pointer.
    constant = "constexpr" in specifiers or (pointer_const if "*" in indirection else "const" in specifiers)
    return parsed.text(declarator), tuple(dims), indirection, constant, init


def asm_blocks(source: str | ParsedSource) -> list[AsmBlock]:
    return _parsed(source).view("asm_blocks", _asm_blocks)


def _asm_blocks(parsed: ParsedSource) -> list[AsmBlock]:
    found = []
    for node in nodes_of_type(parsed.root, "gnu_asm_expression"):
        code = node.child_by_field_name("assembly_code")
        text = string_value(parsed, code) if code is not None else ""
        found.append(AsmBlock(text, function_of(node), line_range(node), node))
    return found


def string_value(parsed: ParsedSource, node: Node) -> str:
    """The contents of a string literal, or of adjacent literals joined (`"cp." "async"`), with
    the common escapes decoded so that `"{\\n" "ldmatrix..."` reads as two lines."""
    pieces = nodes_of_type(node, "string_content", "escape_sequence", "raw_string_content")
    return "".join(_ESCAPES.get(parsed.text(p), parsed.text(p)) if p.type == "escape_sequence" else parsed.text(p)
                   for p in pieces)


def macros(source: str | ParsedSource) -> list[Macro]:
    return _parsed(source).view("macros", _macros)


def _macros(parsed: ParsedSource) -> list[Macro]:
    found = []
    for node in nodes_of_type(parsed.root, "preproc_def", "preproc_function_def"):
        params = node.child_by_field_name("parameters")
        value = node.child_by_field_name("value")
        body = parsed.text(value).replace("\\\r\n", "  \n").replace("\\\n", " \n") if value is not None else ""
        found.append(Macro(
            name=parsed.text(node.child_by_field_name("name")),
            params=tuple(parsed.text(p) for p in params.named_children) if params is not None else None,
            body=body.strip(),
            line=node.start_point.row + 1,
            node=node,
        ))
    return found


def _is_keyword(node: Node) -> bool:
    """An anonymous keyword token such as `__global__` or `__device__` (not punctuation)."""
    text = node.type
    return not node.is_named and (text[:1].isalpha() or text.startswith("__"))


def _parsed(source: str | ParsedSource) -> ParsedSource:
    return source if isinstance(source, ParsedSource) else parse(source)
