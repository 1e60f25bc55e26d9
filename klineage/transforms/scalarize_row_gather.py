"""scalarize_row_gather: a thread's 16 bytes of a row, found through a computed row base and moved as one vector,
become one element per thread; forward finds its sites by analysis.

The mechanism (forward): a kernel of one thread per output element that splits the element index into a row and
a column and reaches a row through a computed base (an embedding lookup, a gather, `index_select`, a permute of
rows by an index array), reads an operand once per column (a column broadcast: a bias add, the scale and shift
after a normalization, a per-channel scale) or once per row, or all of these:

    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;                        (or `if (i < n) { ... }`)
    int r = i / cols, c = i % cols;
    out[i] = table[(long long)idx[r] * cols + c];                   (or `out[i] = x[i] * gamma[c] + beta[i % cols]`)

gets the 16 bytes of one row per thread (four 32-bit or eight 16-bit elements: scalarize_elementwise's and
scalarize_half_packs's packings): `i` becomes the thread index times the width; where the row length divides by
the width, the width's elements are in bounds and every packed array is 16-byte aligned (checked at run time on
the pointers) the row and column are split once, each array is loaded once as a pack at its place (`[i]`,
`[Y * cols + c]` or the column `[c]`: with `cols` and `c` multiples of the width, the width's elements share one
row and each of these starts a 16-byte block), the work runs once per lane on registers and each written array
is stored once as a pack; otherwise (a row length that does not divide, a misaligned pointer, the tail) a scalar
loop runs the naive work for each element of the width. The index array is read once per pack instead of once per
element. The launch's first grid dimension becomes cdiv(grid, width). Where the naive work is one statement under
`if (i < n)` the vector if/else is that statement (`if (i < n) if (...) { ... } else { ... }`), so backward gives
the naive text back exactly.

A scatter-add (`index_add`, the backward of an embedding: `atomicAdd(&out[(long long)idx[r] * cols + c], v);`, a
statement of the work's top level) packs the same way: the four lanes' values go into a float4, which one sm_90
vector atomicAdd adds to the row's four elements (REDG.E.ADD.F32x4 for four scalar atomics). Each component is
added atomically, as each scalar add was; float atomics were never ordered, so the sums are what the naive kernel
can produce. Only float data (the vector atomicAdd adds float2 and float4), at `[i]`, a column or a row's column,
the array accessed nowhere else; an add under a condition is refused (a lane with nothing to add would add +0.0).

Backward scalarizes the form forward writes, from its element loop: one element per thread again, the grid back
to what it was.

Legality (forward_sites), decided on the parse and the plan; anything else is no site, with the reason:
- the naive form `element_work` reads (a 1-D launch passing no buffer twice, so no two arrays alias; the work has
  no loop, barrier, collective, early exit or thread coordinate and never changes the index). An `int` index
  times the width may wrap where the index did not, so the vector form's index is `long long` either way, the
  thread index (exact in 32 unsigned bits) widened before it is scaled; the work names the index only in its
  split and at `[i]`, where a 64-bit index gives the values the 32-bit one gave wherever the naive kernel's own
  index did not wrap;
- the work may start by declaring its row `r = i / C`, its column `c = i % C` or both (one declaration or two)
  and may write the column out as `i % C`; one C in all, a literal (that must divide by the width), a scalar
  parameter the kernel never assigns or an integer local declared before the index or between it and the guard
  (`const int cols = heads * dim;`, `_naive.scalar_locals`; a split declared there moves into the work,
  `_naive.sunk`); neither r nor c is assigned;
- every subscript of the rest is element `[i]`, a row's column `[Y * C + c]` (Y names neither i nor c), the
  column `[c]` (read only: every row reads it), or a value the whole row shares (names neither i nor c:
  `idx[r]`); i and c appear nowhere else, so an operand at its column and anywhere else is refused;
- an array at `[i]`, `[Y * C + c]` or `[c]` is a pointer parameter to 32-bit float/int/unsigned data, or all are to
  16-bit `__half`/`__nv_bfloat16`, each at one place only; one it writes is not read after it is written and,
  unless it is read first, is written by a statement of the work's top level (every lane gets a value);
- an array read at a row-wide place is a pointer parameter the work never writes and packs nowhere;
- no pointer dereference, no call but the packing's pure math and the source's pure helpers (`_calls.py`), and no
  name `e` or a pack's name in the work.

Anchor: the kernel, kind "function", key the element index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._calls import first_effect
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import indentation, is_written, operator, reindent, splice, unparen
from klineage.transforms._elementwise import ELEMENT, Packing, check_names, check_unpacked_stores, evaluation_order
from klineage.transforms._flatten import flattened
from klineage.transforms._naive import (
    INDEXES,
    SERIAL_INDEX,
    ElementWork,
    element_work,
    index_declaration,
    kernel,
    parameters,
    readable,
    rescaled_grid,
    squash,
    statements,
    sunk,
    unwrapped,
)
from klineage.transforms._packings import HALVES, WORDS
from klineage.transforms._pointers import inlined
from klineage.transforms._readonly import plain_reads
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

WIDE_INDEX = dict(INDEXES)["long long"]
# the vector form's first element, from each naive index type: a 32-bit index is widened (the thread index is
# exact in 32 unsigned bits: fewer than 2^32 threads), so that the index times the width cannot wrap
_SCALED = {"long long": lambda width: f"({WIDE_INDEX}) * {width}",
           "int": lambda width: f"(long long)({SERIAL_INDEX}) * {width}"}
PACKINGS = (WORDS, HALVES)
_FEATURES = {"float4": "vector_type_float4", "int4": "vector_type_int4", "uint4": "vector_type_int4"}
_SPLIT_TYPES = frozenset({"int", "long long", "long", "unsigned", "unsigned int", "size_t", "int64_t", "long int"})


@dataclass(frozen=True)
class Pack:
    array: str
    element: str  # the array's element type
    place: str  # its subscript, as written: `i` or `(long long)idx[r] * cols + c`
    read: bool
    written: bool
    added: bool = False  # added to by atomicAdd (a scatter-add): one vector atomic a pack


@dataclass(frozen=True)
class RowSite:
    work: ElementWork
    divisor: str  # C of `r = i / C, c = i % C`
    steps: tuple[Node, ...]  # the work's statements: the row/column split first
    lanes: tuple[Node, ...]  # the statements after the split: what runs once per lane
    packing: Packing
    packs: tuple[Pack, ...]
    places: tuple[tuple[Node, str], ...]  # each packed subscript and its array
    adds: tuple[tuple[Node, Node, str], ...] = ()  # each `atomicAdd(&a[...], v);`: the statement, v, the array a


def _place(subscript: Node) -> Node:
    """The index expression of `a[...]`."""
    indices = subscript.child_by_field_name("indices")
    return indices.named_children[0] if indices.type == "subscript_argument_list" else indices


def _names(parsed: cp.ParsedSource, node: Node) -> list[str]:
    return [parsed.text(n) for n in cp.nodes_of_type(node, "identifier")]


def _split(parsed: cp.ParsedSource, listed: list[Node], index: str) -> tuple[int, set[str], str | None, str | None]:
    """(how many leading statements split the index, the Cs they split by, the row's name, the column's name): a
    row `r = i / C`, a column `c = i % C` or both, declared first; None for what is not declared."""
    found: dict[str, tuple[str, str]] = {}  # operator -> (name, divisor)
    count = 0
    for statement in listed:
        if statement.type != "declaration" or len(found) == 2:
            break
        kind = squash(parsed.text(statement.child_by_field_name("type")))
        words = parsed.data[statement.start_byte:statement.child_by_field_name("type").start_byte].decode().split()
        if kind not in _SPLIT_TYPES or set(words) - {"const"}:
            break
        parts = []
        for declarator in statement.children_by_field_name("declarator"):
            value = declarator.child_by_field_name("value") if declarator.type == "init_declarator" else None
            value = unparen(value) if value is not None else None
            if value is None or value.type != "binary_expression" or operator(value) not in ("/", "%") or \
                    squash(parsed.text(value.child_by_field_name("left"))) != index or \
                    value.child_by_field_name("right").type not in ("identifier", "number_literal") or \
                    declarator.child_by_field_name("declarator").type != "identifier":
                break
            parts.append((operator(value), parsed.text(declarator.child_by_field_name("declarator")),
                          parsed.text(value.child_by_field_name("right"))))
        else:
            if not parts or any(op in found for op, _, _ in parts):
                break
            found |= {op: (name, divisor) for op, name, divisor in parts}
            count += 1
            continue
        break
    named = {op: name for op, (name, _) in found.items()}
    return count, {divisor for _, divisor in found.values()}, named.get("/"), named.get("%")


def _inline_column(parsed: cp.ParsedSource, node: Node, index: str) -> str | None:
    """C where `node` is `i % C` (C a name or a literal), else None."""
    node = unparen(node)
    if node.type != "binary_expression" or operator(node) != "%" or \
            squash(parsed.text(node.child_by_field_name("left"))) != index:
        return None
    right = node.child_by_field_name("right")
    return parsed.text(right) if right.type in ("identifier", "number_literal") else None


def _is_column(parsed: cp.ParsedSource, node: Node, column: str | None, divisor: str, index: str) -> bool:
    """`node` is the column: its declared name, or `i % C` written out."""
    return (column is not None and parsed.text(unparen(node)) == column) or \
        _inline_column(parsed, node, index) == divisor


def _row_column(parsed: cp.ParsedSource, place: Node, column: str | None, divisor: str, index: str) -> bool:
    """`place` is `Y * C + c` (either order of each), Y naming neither the index nor the column."""
    place = unparen(place)
    if place.type != "binary_expression" or operator(place) != "+":
        return False
    left, right = (unparen(place.child_by_field_name(side)) for side in ("left", "right"))
    base = left if _is_column(parsed, right, column, divisor, index) else \
        right if _is_column(parsed, left, column, divisor, index) else None
    if base is None or base.type != "binary_expression" or operator(base) != "*":
        return False
    factors = [base.child_by_field_name(side) for side in ("left", "right")]
    texts = [squash(parsed.text(unparen(f))) for f in factors]
    if divisor not in texts:
        return False
    other = factors[1 - texts.index(divisor)]
    return not {index, column} & set(_names(parsed, other))


def _divisor(parsed: cp.ParsedSource, lanes: list[Node], index: str, declared: set[str]) -> str:
    """The one row length C of the split and of every `i % C` the work writes out."""
    written = {_inline_column(parsed, n, index) for s in lanes for n in cp.nodes_of_type(s, "binary_expression")}
    found = (declared | written) - {None}
    if len(found) != 1:
        raise NotApplicable(f"the work does not split '{index}' by one row length C into a row `r = {index} / C` "
                            f"or a column `c = {index} % C`" + (f" (it names {', '.join(sorted(found))})" if found
                                                                 else ""))
    return found.pop()


def row_site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> RowSite:
    """The naive row form in `function` (a gather through a row base, a column broadcast, or both), or
    NotApplicable with the reason."""
    work = element_work(state, parsed, function)
    name, index = function.name, work.index
    guarded = work.nodes[0].parent.type == "if_statement"  # the `if (i < n) <work>` form: the work is one statement
    listed = statements(work.nodes[0]) if guarded else list(work.nodes)
    count, declared, row, column = _split(parsed, listed, index)
    lanes = listed[count:]
    if not lanes:
        raise NotApplicable(f"{name} splits '{index}' but does nothing with the row")
    divisor = _divisor(parsed, lanes, index, declared)
    params = parameters(parsed, function)
    pointers = {p: kind.removeprefix("const ").strip() for p, kind, pointer in params if pointer}
    body = function.node.child_by_field_name("body")
    written_names = {parsed.text(n) for n in cp.nodes_of_type(body, "identifier") if is_written(n)}
    kept = {p for p, _, pointer in params if not pointer} - written_names  # scalar locals are never assigned
    kept |= {name for local in work.locals if local.integer for name in local.names}
    if not re.fullmatch(r"[1-9]\d*", divisor) and divisor not in kept:
        raise NotApplicable(f"the row length '{divisor}' is no literal and no scalar parameter the kernel keeps, "
                            f"nor an integer scalar local")
    text = "\n".join(parsed.text(s) for s in lanes)
    if re.search(rf"\b(?:{ELEMENT}|{WORDS.taken}|{HALVES.taken})\b", "\n".join(parsed.text(s) for s in listed)):
        raise NotApplicable(f"{name}'s work names '{ELEMENT}' or a name a pack would take")
    check_names(function, work.locals, f"{WORDS.taken}|{HALVES.taken}")
    assigned = sorted({row, column} & written_names - {None})
    if assigned:
        raise NotApplicable(f"{name} assigns its row or column '{assigned[0]}'")
    adds = _atomic_adds(parsed, lanes)
    addresses = {address.id for statement, _ in adds.values() for address in
                 cp.nodes_of_type(statement, "pointer_expression")[:1]}
    if any(n.id not in addresses for s in lanes for n in cp.nodes_of_type(s, "pointer_expression")) or "->" in text:
        raise NotApplicable(f"{name} dereferences a pointer expression")
    packs: dict[str, Pack] = {}
    places: list[tuple[Node, str]] = []
    shared_reads: set[str] = set()
    uses = dict.fromkeys({index, column} - {None}, 0)
    shown_column = column or f"{index} % {divisor}"
    subscripts = sorted((n for s in lanes for n in cp.nodes_of_type(s, "subscript_expression")), key=evaluation_order)
    for node in subscripts:
        array, place = parsed.text(node.child_by_field_name("argument")), _place(node)
        where = squash(parsed.text(place))
        if array not in pointers:
            raise NotApplicable(f"'{array}' is no pointer parameter")
        parent = node.parent
        stored = parent.type == "assignment_expression" and parent.child_by_field_name("left") == node
        broadcast = _is_column(parsed, place, column, divisor, index)
        if node.id in adds:
            if not (where == index or broadcast or _row_column(parsed, place, column, divisor, index)):
                raise NotApplicable(f"`{parsed.text(node)}` that {name} adds to is neither element {index}, a column "
                                    f"nor a row's column: its four lanes' elements need not be one vector")
            if array in packs or pointers[array] != "float":
                raise NotApplicable(f"'{array}' is added to atomically and accessed otherwise too, or holds no float "
                                    f"(a vector atomicAdd adds float2 or float4)")
            for used in (n for n in _names(parsed, place) if n in uses):
                uses[used] += 1
            packs[array] = Pack(array, pointers[array], parsed.text(place), False, False, added=True)
            continue
        if where == index or broadcast or _row_column(parsed, place, column, divisor, index):
            if broadcast and is_written(node):
                raise NotApplicable(f"'{array}' is written at column `{where}`, an element every row writes")
            if is_written(node) and not stored:
                raise NotApplicable(f"`{parsed.text(parent)}` changes an element in place")
            for used in (n for n in _names(parsed, place) if n in uses):
                uses[used] += 1
            if array in packs and squash(packs[array].place) != where:
                raise NotApplicable(f"'{array}' is accessed at two places, `{packs[array].place}` and `{where}`: "
                                    f"one pack per array is all this form moves")
            known = packs.get(array)
            if known is not None and known.added:
                raise NotApplicable(f"'{array}' is added to atomically and accessed otherwise too")
            if not stored and known is not None and known.written and not known.read:
                raise NotApplicable(f"'{array}' is read after it is written")
            updated = stored and parsed.text(parent.child_by_field_name("operator")) != "="
            packs[array] = Pack(array, pointers[array], parsed.text(place),
                                (known is not None and known.read) or not stored or updated,
                                (known is not None and known.written) or stored)
            places.append((node, array))
        elif set(uses) & set(_names(parsed, place)):
            raise NotApplicable(f"`{parsed.text(node)}` is neither element {index}, a column `{shown_column}`, a "
                                f"row's column `Y * {divisor} + {shown_column}`, nor one value for the whole row")
        elif stored or is_written(node):
            raise NotApplicable(f"'{array}' is written at `{parsed.text(node)}`, a place the whole row shares")
        else:
            shared_reads.add(array)
    if not packs:
        raise NotApplicable(f"{name} moves no array at element {index}, at a column or at a row's column")
    for used, count_used in uses.items():
        if len(re.findall(rf"\b{used}\b", text)) != count_used:
            raise NotApplicable(f"{name} uses '{used}' beyond its subscripts")
    both = shared_reads & set(packs)
    if both:
        raise NotApplicable(f"'{sorted(both)[0]}' is read at a row-wide place and moved as a pack")
    packing = next((p for p in PACKINGS if all(pack.element in p.packs for pack in packs.values())), None)
    if packing is None:
        raise NotApplicable(f"the packed arrays {', '.join(packs)} are not all pointers to {WORDS.kinds}, nor all "
                            f"to {HALVES.kinds}")
    if divisor.isdigit() and int(divisor) % packing.width:
        raise NotApplicable(f"the row length {divisor} does not divide by the width {packing.width}: no row "
                            f"starts a 16-byte block")
    check_unpacked_stores((pack.array, pack.element) for pack in packs.values() if pack.written)
    values = {statement.id: value for statement, value in adds.values()}  # an atomic add: its value alone checked
    for called in (first_effect(parsed, values.get(s.id, s), packing.pure) for s in lanes):
        if called is not None:
            raise NotApplicable(f"{name} calls {called}, which may have effects")
    for pack in packs.values():
        if pack.written and not pack.read and not any(
                s.type == "expression_statement" and squash(parsed.text(s)).startswith(f"{pack.array}[") and
                unparen(s.named_children[0]).type == "assignment_expression" for s in lanes):
            raise NotApplicable(f"'{pack.array}' is written only under a condition: a vector store would write "
                                f"garbage")
    added = tuple((statement, value, parsed.text(_subscript_added(statement).child_by_field_name("argument")))
                  for statement, value in adds.values())
    return RowSite(work, divisor, tuple(listed), tuple(lanes), packing, tuple(packs.values()), tuple(places), added)


def _subscript_added(statement: Node) -> Node | None:
    """`a[...]` of a statement `atomicAdd(&a[...], v);`, else None."""
    call = unparen(statement.named_children[0]) if statement.type == "expression_statement" and \
        statement.named_child_count == 1 else None
    if call is None or call.type != "call_expression" or call.child_by_field_name("function").type != "identifier":
        return None
    arguments = call.child_by_field_name("arguments").named_children
    address = unparen(arguments[0]) if len(arguments) == 2 else None
    target = unparen(address.child_by_field_name("argument")) if address is not None and \
        address.type == "pointer_expression" and operator(address) == "&" else None
    return target if target is not None and target.type == "subscript_expression" else None


def _atomic_adds(parsed: cp.ParsedSource, lanes: list[Node]) -> dict[int, tuple[Node, Node]]:
    """The statements of the work's top level that add a value to an element atomically, `atomicAdd(&a[...], v);`
    (its value unused): the element's id -> (the statement, v)."""
    found = {}
    for statement in lanes:
        target = _subscript_added(statement)
        call = unparen(statement.named_children[0]) if target is not None else None
        if target is not None and parsed.text(call.child_by_field_name("function")) == "atomicAdd":
            found[target.id] = (statement, call.child_by_field_name("arguments").named_children[1])
    return found


def _region(site: RowSite) -> tuple[int, int]:
    return site.steps[0].start_byte, site.steps[-1].end_byte


def _work_text(parsed: cp.ParsedSource, site: RowSite) -> str:
    start, end = _region(site)
    return parsed.data[start:end].decode("utf-8")


def _lane_text(parsed: cp.ParsedSource, site: RowSite, lane: int) -> str:
    """The statements after the split with every packed subscript replaced by its lane of the pack."""
    start, end = site.lanes[0].start_byte, site.lanes[-1].end_byte
    edits = [(node.start_byte - start, node.end_byte - start, site.packing.lane(array, lane))
             for node, array in site.places]
    # an atomic add's value goes to the lane of its array's pack, which one vector atomic adds after the lanes
    edits += [edit for statement, value, array in site.adds for edit in (
        (statement.start_byte - start, value.start_byte - start, f"{site.packing.lane(array, lane)} = "),
        (value.end_byte - start, statement.end_byte - start, ";"))]
    text = parsed.data[start:end]
    return splice(text, edits)[0].decode("utf-8")


def _renamed(parsed: cp.ParsedSource, nodes: tuple[Node, ...], old: str, new: str) -> str:
    """The text from the first node to the last with the identifier `old` named `new`."""
    start, end = nodes[0].start_byte, nodes[-1].end_byte
    edits = [(n.start_byte - start, n.end_byte - start, new) for node in nodes
             for n in cp.nodes_of_type(node, "identifier") if parsed.text(n) == old]
    return splice(parsed.data[start:end], edits)[0].decode("utf-8")


def _condition(site: RowSite) -> str:
    width, index = site.packing.width, site.work.index
    aligned = " | ".join(f"(size_t){pack.array}" for pack in site.packs)
    return f"{site.divisor} % {width} == 0 && {index} + {width - 1} < {site.work.bound} && (({aligned}) & 15) == 0"


def _offset(pack: Pack) -> str:
    """The pack's place as an offset to add to its array: a name as it is, an expression in parentheses."""
    return pack.place if re.fullmatch(r"\w+", pack.place) else f"({pack.place})"


def _tail_header(site: RowSite) -> str:
    index, width = site.work.index, site.packing.width
    return (f"for (long long {ELEMENT} = {index}; {ELEMENT} < {site.work.bound} && {ELEMENT} < {index} + "
            f"{width}; ++{ELEMENT})")


def packed(state: KernelState, parsed: cp.ParsedSource, site: RowSite) -> tuple[str, object]:
    """(source, plan) of the vector form: the split once, packs loaded, the work once per lane on registers, packs
    stored; the scalar loop otherwise; the grid divided by the width."""
    data, packing, width = parsed.data, site.packing, site.packing.width
    start, end = _region(site)
    indent = indentation(data, start)
    inner, column = indent + "    ", len(indent)
    split = data[start:site.lanes[0].start_byte].decode("utf-8").rstrip()  # empty where the work writes `i % C`
    lines = [f"if ({_condition(site)}) {{"] + ([reindent(split, column, inner)] if split else [])
    for pack in site.packs:
        lines += [inner + line for line in packing.declare(pack.array, pack.element, packing.packs[pack.element],
                                                             _offset(pack), pack.read, pack.written or pack.added)]
    for lane in range(width):
        text = _lane_text(parsed, site, lane)
        if len(site.lanes) > 1:  # the lane's statements in a block of their own
            text = "{\n" + reindent(text, column, " " * (column + 4)) + "\n" + " " * column + "}"
        lines.append(reindent(text, column, inner))
    for pack in (p for p in site.packs if p.written):
        lines.append(f"{inner}*reinterpret_cast<{packing.packs[pack.element]}*>({pack.array} + {_offset(pack)}) = "
                     f"{packing.name(pack.array)};")
    for pack in (p for p in site.packs if p.added):
        lines.append(f"{inner}atomicAdd(reinterpret_cast<{packing.packs[pack.element]}*>({pack.array} + "
                     f"{_offset(pack)}), {packing.name(pack.array)});")
    scalar = _renamed(parsed, site.steps, site.work.index, ELEMENT)
    lines += [f"{indent}}} else {{", f"{inner}{_tail_header(site)} {{",
              reindent(scalar, column, inner + "    "), f"{inner}}}", f"{indent}}}"]
    edits = [(site.work.start, site.work.init_node.end_byte, f"long long {site.work.index} = "
                                                             f"{_SCALED[site.work.kind](width)}"),
             (start, end, "\n".join(lines))]
    plan = rescaled_grid(state, site.work.function.name, lambda grid: f"cdiv({grid}, {width})")
    return splice(data, edits)[0].decode("utf-8"), plan


def _features(text: str) -> tuple[str, ...]:
    """The vector type features a pack shows in `text`: `float4` for 32-bit floats, the `int4`/`uint4` pack else."""
    return tuple(sorted({_FEATURES[t] for t in re.findall(r"\b(float4|u?int4)\b", text)}))


def _vector_form(parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, str, Node, Node, Node, int]:
    """(index, the naive index's type, the index declaration, the vector if/else, the scalar loop, the width) of a
    kernel in the form `packed` writes."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    for (kind, scaled), packing in ((k, p) for k in _SCALED.items() for p in PACKINGS):
        try:
            declaration, _, index = index_declaration(parsed, body, scaled(packing.width), "long long")
        except NotApplicable:
            continue
        width = packing.width
        for statement in cp.nodes_of_type(body, "if_statement"):
            condition = squash(parsed.text(statement.child_by_field_name("condition")))
            alternative = statement.child_by_field_name("alternative")
            if not re.match(rf"\(\S+ % {width} == 0 && {index} \+ {width - 1} < ", condition) or alternative is None:
                continue
            loops = [n for n in cp.nodes_of_type(alternative, "for_statement") if squash(parsed.text(n)).startswith(
                f"for (long long {ELEMENT} = {index}; {ELEMENT} < ")]
            if loops and loops[0].child_by_field_name("body").type == "compound_statement":
                return index, kind, declaration, statement, loops[0], width
    raise NotApplicable(f"{function.name} has no row gather moved in 16-byte packs")


class ScalarizeRowGather(Transform):
    name = "scalarize_row_gather"
    intent = ("Move 16 bytes of a row per thread in a gather or copy through a computed row base (an index array, a "
              "permutation) or an elementwise kernel with per-column operands (a bias, a scale and shift) as one "
              "vector load and store per operand, reading the row base once per vector, where the row length "
              "divides by the width and the pointers are 16-byte aligned; a scalar path otherwise.")
    removes = ("vector_type_float4", "vector_type_int4")  # one of them at each site: float4 or the uint4/int4 pack
    placement = Placement.ANALYSIS
    kin = ("scalarize_elementwise", "scalarize_half_packs")  # the same packs, on elements at [i] alone

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", form[0], parsed.text(form[3])[:200])
                for function, form in readable(parsed, lambda f: _vector_form(parsed, f))]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        # the naive forms' index and reads (through local pointers too), 1-D
        state = sunk(flattened(canonical(inlined(plain_reads(state)))))
        parsed = cp.parse(state.source)
        sites = readable(parsed, lambda f: row_site(state, parsed, f))
        return [Anchor(function.name, "function", site.work.index, _work_text(parsed, site)[:200])
                for function, site in sites]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        # the naive forms' index and reads (through local pointers too), 1-D
        state = sunk(flattened(canonical(inlined(plain_reads(state)))))
        parsed = cp.parse(state.source)
        site = row_site(state, parsed, kernel(parsed, anchor))
        if site.work.index != anchor.key:
            raise NotApplicable(f"{anchor}: the element index is '{site.work.index}'")
        source, plan = packed(state, parsed, site)
        width, moved = site.packing.width, ", ".join(p.array for p in site.packs)
        rewrite = self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan, carrier={"width": width},
                               note=f"{site.work.function.name}: {width} elements of a row per thread as 16-byte "
                                    f"packs of {moved} (row length divisible by {width}, 16-byte aligned), scalar "
                                    f"path otherwise; grid / {width}")
        # an 8-bit array's 4-byte pack rides beside the 16-byte ones: no feature of its own
        shown = {_FEATURES[kind] for pack in site.packs if (kind := site.packing.packs[pack.element]) in _FEATURES}
        return replace(rewrite, removes=(), adds=tuple(sorted(shown)))

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        index, kind, declaration, guard, loop, width = _vector_form(parsed, function)
        if index != anchor.key:
            raise NotApplicable(f"{anchor}: the element index is '{index}'")
        steps = tuple(c for c in loop.child_by_field_name("body").named_children)
        indent = indentation(parsed.data, guard.start_byte)
        text = _renamed(parsed, steps, ELEMENT, index)
        text = reindent(text, len(indentation(parsed.data, steps[0].start_byte)), indent)[len(indent):]
        naive = f"{kind} {index} = {dict(INDEXES)[kind]};"
        edits = [(declaration.start_byte, declaration.end_byte, naive), (guard.start_byte, guard.end_byte, text)]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        plan = rescaled_grid(state, function.name, lambda grid: unwrapped(grid, "cdiv(", f", {width})"))
        rewrite = self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                               note=f"{function.name}: one element of a row per thread, scalar loads and stores")
        return replace(rewrite, removes=_features(parsed.text(guard)), adds=())


register(ScalarizeRowGather())
