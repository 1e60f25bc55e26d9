"""Shared analysis and rewriting for the forwards that pack an elementwise kernel's elements into 16-byte
vectors (scalarize_elementwise: four 32-bit elements per `float4`; scalarize_half_packs: eight 16-bit
`__half`/`__nv_bfloat16` elements per `uint4`).

Both read the same naive form (`int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) <body>`, scalar locals
maybe declared between the two, the body writing arrays only at `[i]`, or only at `[k * i + j]` for a pair or group
of k; an array it only reads may be read elsewhere too) and write the same vector form: `i` becomes the thread
index times the indexes a pack holds (the width, or the width / k); where those are in bounds and every array is
16-byte aligned each array the body reads is loaded once as a pack, the body runs once per index on registers and
each array it writes is stored once; otherwise a scalar loop over the indexes covers what is left. A `Packing` says
how one transform names a pack, its lanes and the element types it packs; the rest is here, so the two stay one
mechanism at two widths.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms._calls import first_effect
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import indentation, is_written, operator, reindent, splice, unparen
from klineage.transforms._flatten import flattened
from klineage.transforms._naive import (
    INDEXES,
    SERIAL_INDEX,
    Local,
    between,
    compared,
    copied_bound,
    declared_index,
    if_form,
    index_declaration,
    kernel,
    launches_of,
    parameters,
    readable,
    rescaled_grid,
    scalar_locals,
    squash,
    statements,
    sunk,
    unwrapped,
)
from klineage.transforms._pointers import inlined
from klineage.transforms._readonly import plain_reads
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

ELEMENT = "e"  # the tail loop's element index
_FORBIDDEN = re.compile(r"\b(?:__syncthreads|__syncwarp|__shared__|atomic\w*|__shfl\w*|goto|while|do|for|return|"
                        r"gridDim|printf|asm)\b")


@dataclass(frozen=True)
class Packing:
    """How one transform packs elements: `width` per 16 bytes, the pack type of each element type it accepts
    (`const` and `__restrict__` dropped), how a lane of an array's pack is written, the declarations that
    load (or, for an array only written, declare) the pack, and the names the body must not use already."""

    width: int
    packs: Mapping[str, str]  # element type -> pack type
    kinds: str  # the accepted element types, for messages: "float, double, int, unsigned, 64-bit or 8-bit integers"
    pure: frozenset[str]  # calls the body may make (no effects)
    taken: str  # a regular expression of the names the rewrite declares
    lane: Callable[[str, int], str]  # (array, lane) -> the lane's expression
    # (array, element type, pack type, index, read, written) -> the lines that load or declare the array's pack
    declare: Callable[[str, str, str, str, bool, bool], list[str]]

    def name(self, array: str) -> str:
        return f"{array}{self.width}"


@dataclass(frozen=True)
class Site:
    function: cp.Function
    kind: str  # the index's type: int or long long
    index: str
    index_init: Node
    guard: Node  # the `if (i < n)` statement
    bound: str
    body: Node  # the guarded statement
    read: tuple[tuple[str, str], ...]  # (array, element type), in order of first use
    written: tuple[tuple[str, str], ...]
    span: int  # the elements an index owns: 1 (`[i]`), or k of a pair or group (`[k * i + j]`, j < k)


def vector_index(count: int, kind: str) -> str:
    """The vector form's index: the thread's first of `count` indexes (elements, or pairs)."""
    return f"({dict(INDEXES)[kind]}) * {count}"


def spans(packing: Packing) -> tuple[int, ...]:
    """The indexes a thread of the vector form may take: a pack's elements one an index, or groups of k (k
    dividing the width) while a pack holds two groups or more (one group a thread would be no coarser)."""
    return tuple(packing.width // k for k in range(1, packing.width // 2 + 1) if packing.width % k == 0)


def plain_body(parsed: cp.ParsedSource, function: cp.Function, body: Node, packing: Packing) -> dict[str, str]:
    """The pointer parameters' element types, once the element work `body` is shown not to loop, synchronize,
    return, name a thread coordinate or what the vector form declares, call what may have an effect (a lane of the
    vector form runs the work once per element it holds) or dereference a pointer expression (the packs stand for
    subscripts only); NotApplicable naming which."""
    text = parsed.text(body)
    found = _FORBIDDEN.search(text) or re.search(rf"\b(?:threadIdx|{ELEMENT}|{packing.taken})\b", text)
    if found:
        raise NotApplicable(f"{function.name}'s element body loops, synchronizes, returns or names '{ELEMENT}' or a "
                            f"name the vector form declares (`{found[0]}`)")
    if (called := first_effect(parsed, body, packing.pure)) is not None:
        raise NotApplicable(f"{function.name} calls {called}, which may have effects")
    if cp.nodes_of_type(body, "pointer_expression") or "->" in text:
        raise NotApplicable(f"{function.name} dereferences a pointer expression")
    return {name: kind.removeprefix("const ").strip() for name, kind, pointer in parameters(parsed, function)
            if pointer}


def stored_on_every_path(statement: Node, place: Callable[[Node], Hashable | None]) -> set:
    """The places `statement` stores to on every path through it: `place(subscript)` of a plain store `a[k] = v;`
    (None: not a place that counts), those of a block's statements together, and those that both branches of an
    if/else store (`if (v > 20) y[i] = v; else y[i] = log1pf(expf(v));` stores y[i] whichever runs)."""
    if statement.type == "expression_statement" and statement.named_children:
        expression = statement.named_children[0]
        left = expression.child_by_field_name("left") if expression.type == "assignment_expression" else None
        if left is None or left.type != "subscript_expression" or operator(expression) != "=":
            return set()
        found = place(left)
        return {found} if found is not None else set()
    if statement.type == "compound_statement":
        return set().union(*(stored_on_every_path(inner, place) for inner in statements(statement)))
    other = statement.child_by_field_name("alternative") if statement.type == "if_statement" else None
    if other is None:
        return set()
    other = other.named_children[-1] if other.type == "else_clause" else other
    return stored_on_every_path(statement.child_by_field_name("consequence"), place) & \
        stored_on_every_path(other, place)


def serial_site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, packing: Packing) -> Site:
    """The naive elementwise form in `function`, or NotApplicable with the reason."""
    kind, index, init, guard, bound, prelude = naive_guard(state, parsed, function, packing)
    guarded = guard.child_by_field_name("consequence")
    types = plain_body(parsed, function, guarded, packing)
    subscripts = sorted(cp.nodes_of_type(guarded, "subscript_expression"), key=evaluation_order)
    span = _span(parsed, function, subscripts, index, packing)
    shown = index if span == 1 else f"{span} * {index} + j"
    read, written, gathered = {}, {}, set()

    def lane_place(node: Node) -> tuple[str, int] | None:
        at = _place(parsed, node, index)
        return (parsed.text(node.child_by_field_name("argument")), at[1]) if at and at[0] == span else None

    stores = set().union(*(stored_on_every_path(statement, lane_place) for statement in statements(guarded)))
    for node in subscripts:
        array = parsed.text(node.child_by_field_name("argument"))
        stored = is_written(node)
        place = _place(parsed, node, index)
        if place is None or place[0] != span:  # a gather or broadcast (`b[i % cols]`): each lane reads its own
            if array not in types or stored:
                raise NotApplicable(f"{function.name} {'writes' if stored else 'reads'} `{parsed.text(node)}`, "
                                    f"not element {shown} of a pointer parameter it only reads")
            gathered.add(array)
            continue
        element = types.get(array, "")
        if element not in packing.packs:
            raise NotApplicable(f"'{array}' is no pointer parameter to {packing.kinds}")
        parent = node.parent
        if stored and (parent.type != "assignment_expression" or parsed.text(parent.child_by_field_name("operator"))
                       != "="):
            read.setdefault(array, element)
        if not stored and array in written and array not in read:
            raise NotApplicable(f"'{array}' is read after it is written")
        (written if stored else read).setdefault(array, element)
    check_unpacked_stores(written.items())
    if gathered & set(written):
        raise NotApplicable(f"'{sorted(gathered & set(written))[0]}' is written and read at other elements than "
                            f"{shown}: a lane could read what another lane writes")
    for use in _index_uses(parsed, guarded, index):
        if is_written(use) or use.parent.type in ("init_declarator", "declaration", "parameter_declaration"):
            raise NotApplicable(f"{function.name} writes or declares '{index}' in its element body")
    for array in written:
        if array not in read and any((array, j) not in stores for j in range(span)):
            raise NotApplicable(f"'{array}' is written only under a condition, or not at every element of its "
                                f"index: a vector store would write garbage")
    if not read and not written:
        raise NotApplicable(f"{function.name} touches no array")
    return Site(function, kind, index, init, guard, bound, guarded, tuple(read.items()), tuple(written.items()),
                span)


# a bool mask packs as bytes only where it is read: its byte holds 0 or 1, which an unsigned char reads as the same
# number; a store would keep a value's own byte where bool converts it to 0 or 1
READ_ONLY = frozenset({"bool"})


def check_unpacked_stores(written: Iterable[tuple[str, str]]) -> None:
    """NotApplicable where an array the kernel writes (array, element type) has a type packed for reading only."""
    for array, element in written:
        if element in READ_ONLY:
            raise NotApplicable(f"'{array}' is a bool array the kernel writes: its packed bytes would keep values "
                                f"bool converts to 0 or 1")


def naive_guard(state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                packing: Packing) -> tuple[str, str, Node, Node, str, tuple[Local, ...]]:
    """(index type, index, its initializer, the `if (i < n)` guard, its bound as copied, the scalar locals before
    it) of a 1-D kernel that ends in its guarded element work; NotApplicable with the reason otherwise."""
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is not a kernel")
    launches_of(state, function.name, dimensions=1)
    body = function.node.child_by_field_name("body")
    declaration, init, kind, index = declared_index(parsed, body)
    listed = statements(body)
    prelude = scalar_locals(parsed, function, listed, listed.index(declaration), index)
    guard = listed[-1]
    if guard.type != "if_statement" or guard.child_by_field_name("alternative") is not None:
        raise NotApplicable(f"{function.name} does not end in `if ({index} < n) ...`")
    relation, said = compared(parsed, guard, index)
    bound = copied_bound(parsed, function, said, prelude) if relation == "<" else None
    if bound is None:
        raise NotApplicable(f"{function.name}'s guard is not `{index} < n`, n a count the kernel keeps")
    if listed.index(guard) != listed.index(declaration) + len(between(prelude)) + 1:
        raise NotApplicable(f"{function.name} has code between its element index and the guard")
    if indexed := [local for local in prelude if local.indexed]:  # `sunk` moves them into the body
        raise NotApplicable(f"{function.name}'s local '{indexed[0].names[0]}' before the guard names '{index}'")
    check_names(function, prelude, packing.taken)
    return kind, index, init, guard, bound, prelude


def named_apart(state: KernelState, packing: Packing) -> KernelState:
    """`state` with each local of a kernel named as the vector form names its own (the tail's `e`, a pack `x4`)
    renamed `<name>_` (more underscores where that is taken too): a local's name is the kernel's own to choose, so
    the kernel computes what it did; the same state where no local clashes."""
    parsed = cp.parse(state.source)
    edits = []
    for function in cp.functions(parsed):
        identifiers = cp.nodes_of_type(function.node, "identifier")
        declared = {parsed.text(node) for node in identifiers if node.parent.type in ("init_declarator", "declaration")}
        clashing = {name for name in declared if re.fullmatch(rf"{ELEMENT}|{packing.taken}", name)}
        if not function.is_kernel or not clashing:
            continue
        names = {parsed.text(node) for node in identifiers}
        clashing -= {name for name, _, _ in parameters(parsed, function)}  # a parameter's uses are not the local's
        for name in sorted(clashing):
            fresh = next(f"{name}{'_' * k}" for k in range(1, 9) if f"{name}{'_' * k}" not in names)
            names.add(fresh)
            edits += [(node.start_byte, node.end_byte, fresh) for node in identifiers if parsed.text(node) == name]
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan) if edits else state


def check_names(function: cp.Function, found: tuple[Local, ...], taken: str) -> None:
    """NotApplicable where a scalar local takes a name the vector form declares (the tail's `e`, a pack matching
    `taken`): the bound or the body copied below that declaration would read the new name."""
    if clash := [name for local in found for name in local.names if re.fullmatch(rf"{ELEMENT}|{taken}", name)]:
        raise NotApplicable(f"{function.name}'s local '{clash[0]}' takes a name the vector form declares")


def _span(parsed: cp.ParsedSource, function: cp.Function, subscripts: list[Node], index: str,
          packing: Packing) -> int:
    """The elements each index owns, as its stores say: k where the body writes arrays at `[k * i + j]` (a pair,
    k = 2, or a group), 1 where at `[i]` (a read at `[2 * i]` beside them is a gather); NotApplicable for stores at
    two such k, or groups that do not fill a pack twice."""
    grouped = {place[0] for place in (_place(parsed, node, index) for node in subscripts if is_written(node)) if place}
    if len(grouped) > 1:
        shown = " and at ".join(f"`[{index}]`" if k == 1 else f"`[{k} * {index} + j]`" for k in sorted(grouped))
        raise NotApplicable(f"{function.name} writes at {shown}: an index owns one number of elements")
    span = grouped.pop() if grouped else 1
    if packing.width // span not in spans(packing):
        raise NotApplicable(f"{function.name}'s groups of {span} elements do not fill a {packing.width}-element pack "
                            f"twice")
    return span


def packed(state: KernelState, parsed: cp.ParsedSource, site: Site, packing: Packing) -> tuple[str, LaunchPlan]:
    """(source, plan) of the vector form of `site`: packs loaded, the body once per lane, packs stored, the
    scalar tail; the grid divided by the width."""
    data, span, count = parsed.data, site.span, packing.width // site.span  # count: the indexes of a thread
    indent = indentation(data, site.guard.start_byte)
    inner = indent + "    "
    read, written = dict(site.read), dict(site.written)
    arrays = read | written
    aligned = " | ".join(f"(size_t){a}" for a in arrays)
    first = site.index if span == 1 else f"{span} * {site.index}"  # the pack's first element
    lines = [f"if ({site.index} + {count - 1} < {site.bound} && (({aligned}) & 15) == 0) {{"]
    for array, element in arrays.items():
        declared = packing.declare(array, element, packing.packs[element], first, array in read, array in written)
        lines += [inner + line for line in declared]
    column = len(indentation(data, site.body.start_byte))
    for lane in range(count):
        text = _per_element(parsed, site, lambda a, j, k=lane: packing.lane(a, k * span + j),
                            f"({site.index} + {lane})" if lane else site.index)
        block = text if site.body.type == "compound_statement" else f"{{ {text} }}"
        lines.append(inner + reindent(block, column, inner)[len(inner):])
    for array, element in site.written:
        lines.append(f"{inner}*reinterpret_cast<{packing.packs[element]}*>({array} + {first}) = "
                     f"{packing.name(array)};")
    return else_per_element(state, data, site, lines, _per_element(parsed, site, None, ELEMENT), count,
                            (indent, inner, column))


def else_per_element(state: KernelState, data: bytes, site: Any, lines: list[str], work: str, count: int,
                     layout: tuple[str, str, int]) -> tuple[str, LaunchPlan]:
    """The vector form's source and plan: the vector branch `lines` closed by the naive `work` (its index already
    `ELEMENT`) once for each of the thread's `count` indexes below the bound, in place of the guard; the index the
    thread's first of `count`, the grid `count` times smaller. `site` has the naive form's kind, index, bound,
    index_init, guard and function; `layout` is (the guard's indent, the branch's, the work's first column)."""
    indent, inner, column = layout
    lines = [*lines, f"{indent}}} else {{",
             f"{inner}for ({site.kind} {ELEMENT} = {site.index}; {ELEMENT} < {site.bound} && {ELEMENT} < "
             f"{site.index} + {count}; ++{ELEMENT}) " + reindent(work, column, inner)[len(inner):],
             f"{indent}}}"]
    edits = [(site.index_init.start_byte, site.index_init.end_byte, vector_index(count, site.kind)),
             (site.guard.start_byte, site.guard.end_byte, "\n".join(lines))]
    plan = rescaled_grid(state, site.function.name, lambda grid: f"cdiv({grid}, {count})")
    return _apply(data, edits), plan


def unpacked(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, index: str,
             packing: Packing) -> tuple[str, LaunchPlan]:
    """(source, plan) of the naive form of a kernel in the vector form: its element loop, one element per
    thread, the grid as it was."""
    found, init, kind, guard, count = vector_form(parsed, function, packing)
    if found != index:
        raise NotApplicable(f"{function.name}: the element index is '{found}'")
    alternative = guard.child_by_field_name("alternative")
    tail = next(c for c in cp.nodes_of_type(alternative, "for_statement"))
    bound = re.fullmatch(rf"{ELEMENT} < (.+) && {ELEMENT} < {index} \+ {count}",  # the bound as copied
                         squash(parsed.text(tail.child_by_field_name("condition"))))
    if bound is None:
        raise NotApplicable(f"{function.name}: the element loop has no bound")
    body = tail.child_by_field_name("body")
    indent = indentation(parsed.data, guard.start_byte)
    # the tail names the element `e` wherever the naive body named its index (the body may not name `e` itself)
    text = splice(parsed.data[body.start_byte:body.end_byte],
                  [(use.start_byte - body.start_byte, use.end_byte - body.start_byte, index)
                   for use in _index_uses(parsed, body, ELEMENT)])[0].decode("utf-8")
    text = reindent(text, len(indentation(parsed.data, body.start_byte)), indent)[len(indent):]
    edits = [(init.start_byte, init.end_byte, dict(INDEXES)[kind]),
             (guard.start_byte, guard.end_byte, f"if ({index} < {bound[1]}) {text}")]
    plan = rescaled_grid(state, function.name, lambda grid: unwrapped(grid, "cdiv(", f", {count})"))
    return _apply(parsed.data, edits), plan


def vector_form(parsed: cp.ParsedSource, function: cp.Function,
                packing: Packing) -> tuple[str, Node, str, Node, int]:
    """(index, its initializer, its type, the vector guard, the indexes a thread takes) of a kernel in the form
    `packed` writes."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    for (kind, _), count in ((k, c) for k in INDEXES for c in spans(packing)):
        try:
            _, init, index = index_declaration(parsed, body, vector_index(count, kind), kind)
        except NotApplicable:
            continue
        for statement in body.named_children:
            condition = statement.child_by_field_name("condition") if statement.type == "if_statement" else None
            if condition is not None and squash(parsed.text(condition)).startswith(
                    f"({index} + {count - 1} <") and statement.child_by_field_name("alternative") is not None:
                return index, init, kind, statement, count
        raise NotApplicable(f"{function.name} has no vector guard")
    raise NotApplicable(f"{function.name} has no vector index `int i = ({SERIAL_INDEX}) * {packing.width};`")


def evaluation_order(subscript: Node) -> int:
    """Where an access happens in evaluation order: a store once its assignment's value is computed (`y[i] =
    f(y[i])` reads y first), any other access where it stands."""
    parent = subscript.parent
    if parent.type == "assignment_expression" and parent.child_by_field_name("left") == subscript:
        return parent.end_byte
    return subscript.start_byte


def _apply(data: bytes, edits: list[tuple[int, int, str]]) -> str:
    return splice(data, edits)[0].decode("utf-8")


def _place(parsed: cp.ParsedSource, subscript: Node, index: str) -> tuple[int, int] | None:
    """(k, j) of a subscript at `[i]` (1, 0) or at `[k * i + j]` (`[i * k]`, `[j + k * i]`; k and j literals); None
    at any other place."""
    place = subscript.child_by_field_name("indices")
    place = unparen(place.named_children[0] if place.type == "subscript_argument_list" and
                    place.named_child_count == 1 else place)
    offset = 0
    if place.type == "binary_expression" and operator(place) == "+":
        sides = [unparen(place.child_by_field_name(side)) for side in ("left", "right")]
        literal = [side for side in sides if re.fullmatch(r"\d+", parsed.text(side))]
        if len(literal) != 1:
            return None
        offset, place = int(parsed.text(literal[0])), sides[1 - sides.index(literal[0])]
    if place.type == "identifier" and parsed.text(place) == index:
        return (1, 0) if offset == 0 else None
    if place.type != "binary_expression" or operator(place) != "*":
        return None
    factors = sorted((parsed.text(unparen(place.child_by_field_name(side))) for side in ("left", "right")),
                     key=lambda text: text != index)
    if factors[0] != index or not re.fullmatch(r"[1-9]\d*", factors[1]) or offset >= int(factors[1]):
        return None
    return int(factors[1]), offset


def _index_uses(parsed: cp.ParsedSource, node: Node, index: str) -> list[Node]:
    return [use for use in cp.nodes_of_type(node, "identifier") if parsed.text(use) == index]


def _per_element(parsed: cp.ParsedSource, site: Site, element: Callable[[str, int], str] | None,
                 index: str) -> str:
    """The guarded statement's text for one index: each element subscript `a[i]` (`a[k * i + j]`) replaced by
    `element(a, j)` (a lane of a pack), and every other use of the index (a gather's subscript, a value) by `index`;
    with no `element`, every use of the index by `index` (the tail's `a[e]`)."""
    base = site.body.start_byte
    at = [n for n in cp.nodes_of_type(site.body, "subscript_expression")
          if element is not None and (_place(parsed, n, site.index) or (0,))[0] == site.span]
    edits = [(n.start_byte - base, n.end_byte - base,
              element(parsed.text(n.child_by_field_name("argument")), _place(parsed, n, site.index)[1])) for n in at]
    edits += [(use.start_byte - base, use.end_byte - base, index) for use in _index_uses(parsed, site.body, site.index)
              if not any(n.start_byte <= use.start_byte < n.end_byte for n in at)]
    return splice(parsed.data[base:site.body.end_byte], edits)[0].decode("utf-8")


class PackedElementwise(Transform):
    """A transform whose forward packs an elementwise kernel's elements as `packing` says; subclasses set the
    class attributes of a Transform, `packing`, and the words their notes use for an element and a pack."""

    packing: Packing
    element: str  # "element", "16-bit element"
    pack: str  # "vectors", "packs"
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", form[0], parsed.text(function.node)[:200])
                for function, form in readable(parsed, lambda f: vector_form(parsed, f, self.packing))]

    def _read(self, state: KernelState) -> KernelState:
        """The naive form's index, guard and reads (through local pointers too), its locals named apart from the
        names the vector form declares."""
        return if_form(sunk(flattened(canonical(inlined(plain_reads(named_apart(state, self.packing)))))))

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        state = self._read(state)
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", site.index, parsed.text(site.guard)[:200])
                for function, site in readable(parsed, lambda f: self.site(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = self._read(state)
        parsed = cp.parse(state.source)
        site = self.site(state, parsed, kernel(parsed, anchor))
        if site.index != anchor.key:
            raise NotApplicable(f"{anchor}: the element index is '{site.index}'")
        source, plan = site.rewritten(state, parsed) if hasattr(site, "rewritten") else \
            packed(state, parsed, site, self.packing)
        names, width = ", ".join(dict(site.read) | dict(site.written)), self.packing.width
        unit = getattr(site, "unit", self.element)  # a reading's own unit: "half-split pair"
        return self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan, carrier={"width": width},
                            note=f"{site.function.name}: {width} {unit}s per thread as 16-byte {self.pack} "
                                 f"of {names}, scalar tail; grid / {width}")

    def site(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function):
        """The naive form this transform packs in `function` (a `Site`, or another reading's site that writes its
        own vector form with `rewritten`), or NotApplicable with the reason."""
        return serial_site(state, parsed, function, self.packing)

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        source, plan = unpacked(state, parsed, function, anchor.key, self.packing)
        return self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                            note=f"{function.name}: one {self.element} per thread, scalar loads and stores")
