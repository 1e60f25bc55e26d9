"""Canonical spellings of a naive kernel's thread index, so that the analysis forwards read a kernel however its
author spelled that index.

The forwards that place a mechanism on naive kernels (`_naive.py`) recognise one thread per element or row by one
declaration, `int i = blockIdx.x * blockDim.x + threadIdx.x;` or its 64-bit form `long long i = (long long)
blockIdx.x * blockDim.x + threadIdx.x;`. People write the same index many ways: the terms in another order
(`threadIdx.x + blockIdx.x * blockDim.x`, `blockDim.x * blockIdx.x + ...`), in parentheses, `const`, with the
widening cast on either factor or as `static_cast<int64_t>(...)`, declared `int32_t`, `int64_t`, `size_t`,
`unsigned` or `auto`. A kernel may also name its block size by a constant (`blockIdx.x * THREADS + threadIdx.x`,
THREADS a `constexpr` or `#define` that every launch of the kernel passes as its block) or by the number itself (a
template's instance, `blockIdx.x * 128 + threadIdx.x`). `canonical` rewrites each such declaration to the canonical
one before a forward reads the kernel, so the forward's output carries the canonical spelling.

Each rewrite keeps the index's value for every launch on which the original does not overflow:
- the order of a sum or product of integers, parentheses and `const` on a local never change a value;
- a constant equal to the block size along an axis of every launch of the kernel is blockDim along that axis
  wherever the kernel runs (`blockIdx.y * TILE + threadIdx.y`, TILE a square block's side, is the y index);
- a 64-bit index (signed or not, cast on either factor of the product) becomes `long long` with the cast on
  `blockIdx.x`: the product is formed in 64 bits either way; a 64-bit declaration with no cast at all forms the
  sum in 32 unsigned bits first, the same value wherever that sum does not wrap past 2^32 threads;
- a cast to a 32-bit type on a coordinate (`(int)blockIdx.x * blockDim.x + threadIdx.x`, as PyTorch extensions
  write it) is dropped: every coordinate is below 2^31, so the cast keeps its value, and the sum is the bare one
  wherever it does not pass INT_MAX (with every coordinate cast to `int` it is formed signed, which overflows
  there);
- a cast of the whole sum (`static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x)`, as PyTorch extensions write
  it) converts the 32-bit sum as the declaration would: to 32 bits it is the bare sum, to 64 bits the bare sum in a
  64-bit declaration (above); a sum formed in 64 bits and cast to 32 is left as written;
- an unsigned index becomes a signed one of its width only where every use reads the value as a non-negative
  number: a subscript, a comparison, a call argument or an initializer, reached from the index through `+`, `*`,
  `/` and `%` only (no subtraction, negation, shift or bit operation, whose results differ between the two), and
  the index is never assigned. Known limit, the one of every naive `int` kernel: a 32-bit product of the index
  past INT_MAX, which unsigned arithmetic would wrap at 2^32 instead.
A 32-bit local holding one coordinate written `const` or through a cast to int (`const int b = blockIdx.z;`, `int
row = static_cast<int>(blockIdx.y);`) is declared plainly (`int b = blockIdx.z;`): neither changes its value.
A kernel reading `blockIdx.z` where it uses it (a batch's offset, `A + blockIdx.z * M * K`), no local holding it,
gets it named first by a local of its own type (`unsigned int batch = blockIdx.z;`): every expression computes what
it did, and the batch readers find the declaration they read.
A local holding a coordinate (`const int tid = threadIdx.x;`, 32 bits, never assigned) is that coordinate in an
index's declaration (`blockIdx.x * blockDim.x + tid`), and goes once nothing else reads it.
A grid-stride loop that starts at a local holding the index (`int index = blockIdx.x * blockDim.x + threadIdx.x;`
then `for (int i = index; i < n; i += stride)`, as CUDA's own examples write it) starts at the index itself once
that local is read nowhere else: the same value, and the loop's header then reads as the grid-stride loop the
forwards know. The declaration goes; it must be canonical already and of the loop index's type.
Indexes declared together (`int b = blockIdx.z, i = ..., j = ...;`) are declared one by one first, in their
order and with their shared type, so that each reads as the lone declaration above; a declaration that reads no
coordinate, and a loop's initializer, keep their locals together.
Calls of the source's own `__device__` helpers are written out in the kernels first (`_inline_calls`: a row loop or
an element's arithmetic its author put in a helper), then C's spellings (`_c_style`): locals declared together and
set later are declared where they are set, and counted `while` loops, and `for` loops over an index declared
earlier (`int j; ... for (j = 0; ...)`), become the `for` loops that declare their index, the spelling the forwards
read loops in; and a pointer a counted loop steps along a row or a column (`s += *p; p += cols;`) is read at the
loop's index (`_pointer_walks`: `p[j * cols]`).
Anything else is left as written, and the forwards find no site there, as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms._c_style import c_style
from klineage.transforms._edit import (
    KernelEdit,
    call_arguments,
    cast_name,
    declared_kind,
    edited_to_fixpoint,
    fresh_name,
    indentation,
    is_written,
    line_start,
    operator,
    unparen,
)
from klineage.transforms._inline_calls import inlined_calls
from klineage.transforms._macros import expanded
from klineage.transforms._pointer_walks import walked

NARROW, WIDE = "int", "long long"
_SIGNED = {"int": NARROW, "signed": NARROW, "signed int": NARROW, "int32_t": NARROW,
           "long long": WIDE, "long long int": WIDE, "signed long long": WIDE, "long": WIDE, "long int": WIDE,
           "int64_t": WIDE, "ptrdiff_t": WIDE}
_UNSIGNED = {"unsigned": NARROW, "unsigned int": NARROW, "uint32_t": NARROW,
             "size_t": WIDE, "unsigned long long": WIDE, "unsigned long": WIDE, "uint64_t": WIDE}
WIDE_TYPES = frozenset(t for t, width in {**_SIGNED, **_UNSIGNED}.items() if width == WIDE)  # the 64-bit spellings
_VALUE_PRESERVING = frozenset({"+", "*", "/", "%"})  # on non-negative operands, signed and unsigned agree
_READS = frozenset({"subscript_argument_list", "subscript_expression", "argument_list", "init_declarator"})
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})
# a canonical index local, and a loop index starting at a local (texts with blanks squashed)
INDEX_LOCAL = re.compile(r"(?P<type>int|long long) (?P<name>[A-Za-z_]\w*) = (?P<value>(?:\(long long\))?"
                          r"blockIdx\.x \* blockDim\.x \+ threadIdx\.x);")
_COORDINATE = re.compile(r"\b(?:threadIdx|blockIdx|blockDim)\b")
_LOOP_START = re.compile(r"(?P<type>int|long long|[a-z_][\w ]*?) (?P<index>[A-Za-z_]\w*) = (?P<start>[A-Za-z_]\w*);")


def canonical(state: KernelState) -> KernelState:
    """`state` with every thread-index declaration that is an equivalent spelling of a canonical one rewritten to
    it, and every grid-stride loop from an index local starting at the index (the same state when there is none)."""
    # helpers written out, then C's spellings of locals, loops and pointers, then pointers walked by loops read at
    # their index
    state = walked(c_style(inlined_calls(expanded(state))))
    state = _layers_named(_unread_coordinate_locals(_declarations(_one_per_declaration(state))))
    started = _loops_from_the_index(state)
    return state if started == state else _declarations(started)  # a 64-bit loop index now declared from the index


Edits = list[tuple[int, int, str]]


def _edited(state: KernelState, edit: KernelEdit) -> KernelState:
    """`state` with `edit`'s byte edits of each kernel's body made (the same state where there are none, or where
    two would overlap: left as written)."""
    return edited_to_fixpoint(state, edit, passes=1)


def _declarations(state: KernelState) -> KernelState:
    """`state` with every thread-index declaration that is an equivalent spelling of a canonical one rewritten to
    it."""
    def edit(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> Edits:
        names = {**_block_sizes(state, parsed, function), **_coordinate_locals(parsed, function, body)}
        edits = []
        for statement in body.named_children:
            if statement.type == "for_statement":  # a grid-stride loop declares its index in its initializer
                statement = statement.child_by_field_name("initializer") or statement
            replacement = _canonical_declaration(parsed, body, statement, names) or _plain_coordinate(parsed, statement)
            if replacement is not None:
                edits.append((statement.start_byte, statement.end_byte, replacement))
        return edits

    return _edited(state, edit)


_CAST_COORDINATE = re.compile(r"(?:const )?int (?P<name>[A-Za-z_]\w*) = (?:\(int\) ?|static_cast<int>)?\(?"
                              r"(?P<value>(?:threadIdx|blockIdx|blockDim)\.[xyz])\)?;")


def _plain_coordinate(parsed: cp.ParsedSource, statement: Node) -> str | None:
    """`int b = blockIdx.z;` for a 32-bit local holding one coordinate written `const` or through a cast to int
    (`const int row = static_cast<int>(blockIdx.y);`): a coordinate is below 2^31, so the cast keeps its value, and
    `const` on a local never changes one; the forwards read a batch's or a row's coordinate in this spelling."""
    found = _CAST_COORDINATE.fullmatch(" ".join(parsed.text(statement).split())) \
        if statement.type == "declaration" else None
    text = f"int {found['name']} = {found['value']};" if found else None
    return text if text is not None and text != " ".join(parsed.text(statement).split()) else None


def _one_per_declaration(state: KernelState) -> KernelState:
    """`state` with each top-level declaration of several locals that reads a thread or block coordinate (`int b
    = blockIdx.z, i = ..., j = ...;`) written as one declaration per local, in their order: each local is
    initialized where it was, after those before it, so every value is the same; the index's declaration then
    reads as the lone one the forwards know."""
    def edit(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> Edits:
        edits = []
        for statement in body.named_children:
            declarators = statement.children_by_field_name("declarator") if statement.type == "declaration" else []
            if len(declarators) < 2 or not _COORDINATE.search(parsed.text(statement)):
                continue
            kind = declared_kind(parsed, statement)
            indent = parsed.data[line_start(parsed.data, statement.start_byte):statement.start_byte].decode("utf-8")
            separator = "\n" + indent if not indent.strip() else " "
            edits.append((statement.start_byte, statement.end_byte,
                          separator.join(f"{kind} {parsed.text(d)};" for d in declarators)))
        return edits

    return _edited(state, edit)


# a local (or an assignment) holding the grid's z coordinate, however cast
_HOLDS_LAYER = re.compile(r"\b[A-Za-z_]\w* = (?:\([\w ]+\) ?|static_cast<[\w ]+>)?\(?blockIdx\.z\)?[;,]")


def _layers_named(state: KernelState) -> KernelState:
    """`state` with `blockIdx.z` read inline as a batch's layer (`A + blockIdx.z * M * K`, no local holding it)
    named by a local of its own type first (`unsigned int batch = blockIdx.z;`), each use reading the local: every
    expression computes what it did, and the batch readers find the declaration they read. A kernel that also
    names blockDim.z or threadIdx.z (a 3-D thread index, not a layer) is left as written."""
    def edit(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> Edits:
        text = parsed.text(body)
        uses = [n for n in cp.nodes_of_type(body, "field_expression") if parsed.text(n) == "blockIdx.z"]
        listed = body.named_children
        if not uses or not listed or re.search(r"\b(?:blockDim|threadIdx)\.z\b", text) or \
                _HOLDS_LAYER.search(" ".join(text.split())):
            return []
        name = fresh_name({parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier")}, "batch")
        first = listed[0]
        return [(first.start_byte, first.start_byte,
                 f"unsigned int {name} = blockIdx.z;\n{indentation(parsed.data, first.start_byte)}"),
                *((use.start_byte, use.end_byte, name) for use in uses)]

    return _edited(state, edit)


def _loops_from_the_index(state: KernelState) -> KernelState:
    """`state` with each top-level `for` loop whose index starts at a canonical index local read nowhere else
    starting at the index itself, that local's declaration gone (see the module's docstring)."""
    return _edited(state, _started_at_the_index)


def _started_at_the_index(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> Edits:
    starts, edits = {}, []  # name -> (declaration, its type, its value) of each canonical index local
    for statement in body.named_children:
        found = INDEX_LOCAL.fullmatch(" ".join(parsed.text(statement).split()))
        if statement.type == "declaration" and found:
            starts[found["name"]] = (statement, found["type"], found["value"])
        initializer = statement.child_by_field_name("initializer") if statement.type == "for_statement" else None
        start = _LOOP_START.fullmatch(" ".join(parsed.text(initializer).split())) if initializer else None
        if start is None or start["start"] not in starts:
            continue
        declaration, kind, value = starts.pop(start["start"])
        uses = [n for n in cp.nodes_of_type(function.node, "identifier") if parsed.text(n) == start["start"]]
        # the loop index of the local's type, or a 64-bit one (size_t, ...) from a 64-bit local: the same value
        same = start["type"] == kind or (kind == WIDE and start["type"] in WIDE_TYPES)
        if not same or len(uses) != 2:  # its declaration and the loop's start alone
            continue
        edits.append((line_start(parsed.data, declaration.start_byte), _past_line(parsed.data, declaration), ""))
        edits.append((initializer.start_byte, initializer.end_byte, f"{start['type']} {start['index']} = {value};"))
    return edits


def _past_line(data: bytes, node: Node) -> int:
    """Past `node` and the rest of its line, its newline included."""
    end = data.find(b"\n", node.end_byte)
    return len(data) if end < 0 else end + 1


_COORDINATE_LOCAL = re.compile(r"(?:const )?(?:int|unsigned|unsigned int|int32_t|uint32_t|auto) "
                               r"(?P<name>[A-Za-z_]\w*) = "
                               r"(?P<value>(?:threadIdx|blockIdx|blockDim)\.[xyz]);")


def _coordinate_locals(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> dict[str, str]:
    """Each 32-bit local of the kernel's body that holds a thread or block coordinate (`const int tid =
    threadIdx.x;`) and is never assigned -> that coordinate: it has the coordinate's value wherever it is read (a
    coordinate is below 2^31, so the signed local holds it unchanged)."""
    written = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier") if is_written(n)}
    found = {}
    for statement in body.named_children:
        local = _coordinate_local(parsed, statement)
        if local and local["name"] not in written:
            found[local["name"]] = local["value"]
    return found


def _coordinate_local(parsed: cp.ParsedSource, statement: Node) -> re.Match[str] | None:
    """The name and coordinate of a declaration `_COORDINATE_LOCAL` reads; None for any other statement."""
    return _COORDINATE_LOCAL.fullmatch(" ".join(parsed.text(statement).split())) \
        if statement.type == "declaration" else None


def _unread_coordinate_locals(state: KernelState) -> KernelState:
    """`state` without the coordinate locals (`_coordinate_locals`) that nothing reads, as the canonical index leaves
    the one it read through (`const int tid = threadIdx.x;`): a declaration with no effect."""
    def edit(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> Edits:
        names = [parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier")]
        return [(line_start(parsed.data, statement.start_byte), _past_line(parsed.data, statement), "")
                for statement in body.named_children
                if (local := _coordinate_local(parsed, statement)) and names.count(local["name"]) == 1]

    return _edited(state, edit)


def _block_sizes(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> dict[str, str]:
    """Each constant or literal that is the block size along some axes of every launch of the kernel -> `blockDim.`
    followed by those axes (`blockDim.xy` for a square block's TILE): `_index_width` reads it as blockDim along the
    axis of the index it stands in."""
    sizes: dict[str, str] = {}
    for axis in range(3):
        for name in _block_constants(state, parsed, function, axis):
            sizes[name] = sizes.get(name, "blockDim.") + "xyz"[axis]
    return sizes


def _block_constants(state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                    axis: int = 0) -> frozenset[str]:
    """The source's integer constants that equal the block size along `axis` (0: x) of every launch of the kernel
    (none where it is not launched) and that the kernel does not declare a name of its own for, and that size as a
    literal: each is blockDim along that axis wherever the kernel runs."""
    constants = parse_constants(state.source)
    sizes = set()
    for launch in (launch for launch in state.plan.launches if launch.entry == function.name):
        try:
            sizes.add(expr.evaluate_int(str(launch.block[axis]), constants))
        except ExpressionError:
            return frozenset()
    if len(sizes) != 1:
        return frozenset()
    size = sizes.pop()
    own = {parsed.text(node) for node in cp.nodes_of_type(function.node, "identifier")
           if node.parent is not None and node.parent.type in ("init_declarator", "parameter_declaration",
                                                                "declaration", "pointer_declarator")}
    return frozenset({str(size)} | {name for name, value in constants.items()
                                    if isinstance(value, int) and value == size and name not in own})


def _canonical_declaration(parsed: cp.ParsedSource, body: Node, statement: Node,
                           names: Mapping[str, str] | None = None) -> str | None:
    if statement.type != "declaration":
        return None
    declarators = statement.children_by_field_name("declarator")
    declared = statement.child_by_field_name("type")
    if len(declarators) != 1 or declarators[0].type != "init_declarator" or declared is None:
        return None
    name_node, init = declarators[0].child_by_field_name("declarator"), declarators[0].child_by_field_name("value")
    if name_node is None or name_node.type != "identifier" or init is None:
        return None
    name, kind = parsed.text(name_node), " ".join(parsed.text(declared).split())
    found = _index_width(parsed, init, names or {})
    if found is None:
        return None
    width, axis = found
    if kind == "auto":  # deduced from the initializer: unsigned int, or the widening cast's type
        kind = "unsigned" if width == NARROW else _cast_type(parsed, init)
    if kind in _SIGNED:
        target = _SIGNED[kind]
    elif kind in _UNSIGNED and _read_as_non_negative(parsed, body, statement, name):
        target = _UNSIGNED[kind]
    else:
        return None
    if target == NARROW and width == WIDE:
        return None  # a 64-bit product narrowed into 32 bits: kept as written
    text = f"{target} {name} = {canonical_index(target, axis)};"
    return None if " ".join(parsed.text(statement).split()) == text else text


def canonical_index(width: str, axis: str = "x") -> str:
    """The canonical global index along one axis, formed in 32 bits (NARROW) or 64 (WIDE)."""
    widen = "(long long)" if width == WIDE else ""
    return f"{widen}blockIdx.{axis} * blockDim.{axis} + threadIdx.{axis}"


def _index_width(parsed: cp.ParsedSource, init: Node, names: Mapping[str, str]) -> tuple[str, str] | None:
    """(NARROW or WIDE, the axis) when `init` is blockIdx.a * blockDim.a + threadIdx.a in any order and
    parentheses along one axis a (a name of `names` standing for the coordinate it maps to), WIDE when a 64-bit
    cast widens a factor of the product; else None. A cast of the whole sum (`static_cast<int>(...)`, as PyTorch
    extensions write it) converts the 32-bit sum: to 32 bits it is the sum, to 64 bits the sum widened after it is
    formed (WIDE, as a 64-bit declaration of the bare sum); a sum formed in 64 bits cast to 32 is left as written."""
    total = unparen(init)
    whole = _cast(parsed, total)
    if whole is not None:
        kind, value = whole
        found = _index_width(parsed, value, names)
        width = {**_SIGNED, **_UNSIGNED}.get(kind)
        if found is None or width is None or (found[0] == WIDE and width == NARROW):
            return None
        return width, found[1]
    if total.type != "binary_expression" or operator(total) != "+":
        return None
    terms = [unparen(total.child_by_field_name(side)) for side in ("left", "right")]
    products = [t for t in terms if t.type == "binary_expression" and operator(t) == "*"]
    thread = _coordinate(parsed, terms[1 - terms.index(products[0])], names) if len(products) == 1 else None
    if thread is None or thread[1] or not thread[0].startswith("threadIdx."):
        return None
    axis = thread[0][-1]
    factors = [_coordinate(parsed, unparen(products[0].child_by_field_name(side)), names) for side in ("left", "right")]
    if None in factors or sorted(_along(f[0], axis) for f in factors) != [f"blockDim.{axis}", f"blockIdx.{axis}"]:
        return None
    return WIDE if any(widened for _, widened in factors) else NARROW, axis


def _along(coordinate: str, axis: str) -> str:
    """`blockDim.<axis>` for a block size constant that equals it (`blockDim.xy` along x or y), else the coordinate."""
    return f"blockDim.{axis}" if coordinate.startswith("blockDim.") and axis in coordinate[9:] else coordinate


def _cast(parsed: cp.ParsedSource, node: Node) -> tuple[str, Node] | None:
    """(the type, the value) of `(T)value` or `static_cast<T>(value)`, the type's blanks squashed; else None."""
    if node.type == "cast_expression":
        kind = " ".join(parsed.text(node.child_by_field_name("type")).split())
        return kind, unparen(node.child_by_field_name("value"))
    if node.type == "call_expression" and cast_name(node) == "static_cast":
        arguments = node.child_by_field_name("function").child_by_field_name("arguments")
        if arguments is not None and len(call_arguments(node)) == 1:
            return " ".join(parsed.text(arguments).strip("<>").split()), unparen(call_arguments(node)[0])
    return None


def _coordinate(parsed: cp.ParsedSource, node: Node, names: Mapping[str, str]) -> tuple[str, bool] | None:
    """(`blockIdx.x`-like name, whether a 64-bit cast widens it) for a coordinate, cast or not (a name of `names`
    is the coordinate it maps to); else None. A cast to a 32-bit type (`(int)blockIdx.x`) keeps the coordinate's
    value, every coordinate being below 2^31."""
    widened, cast = False, _cast(parsed, node)
    if cast is not None:
        width = {**_SIGNED, **_UNSIGNED}.get(cast[0])
        if width is None:
            return None
        widened, node = width == WIDE, cast[1]
    text = "".join(parsed.text(node).split())
    if text in names:
        return names[text], widened
    return (text, widened) if re.fullmatch(r"(?:blockIdx|blockDim|threadIdx)\.[xyz]", text) else None


def _cast_type(parsed: cp.ParsedSource, init: Node) -> str:
    for node in cp.nodes_of_type(init, "type_descriptor"):
        return " ".join(parsed.text(node).split())
    return ""


def _read_as_non_negative(parsed: cp.ParsedSource, body: Node, declaration: Node, name: str) -> bool:
    """Every use of `name` after its declaration reads it, through +, *, / and % only, where signed and unsigned
    arithmetic give one value: a subscript, a comparison, a call argument or an initializer; it is never
    assigned."""
    for use in cp.nodes_of_type(body, "identifier"):
        if parsed.text(use) != name or use.start_byte < declaration.end_byte:
            continue
        if is_written(use):
            return False
        node = use
        while True:
            parent = node.parent
            if parent.type in ("parenthesized_expression", "cast_expression"):
                node = parent
            elif parent.type == "binary_expression" and operator(parent) in _VALUE_PRESERVING and (
                    operator(parent) in ("+", "*") or parent.child_by_field_name("left") == node):
                node = parent
            elif parent.type == "binary_expression" and operator(parent) in _COMPARISONS or parent.type in _READS:
                break
            else:
                return False
    return True
