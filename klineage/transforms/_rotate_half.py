"""scalarize_elementwise's reading of one thread per half-split pair (the GPT-NeoX / Llama "rotate_half"
rotary layout): pair p of a row of 2 * H elements is (row base + j, row base + j + H), its table entry r * H + j.

    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < rows * half) { int r = p / half; int j = p % half; int a = r * 2 * half + j; int b = a + half;
        float x1 = x[a], x2 = x[b]; float c = cos_t[r * half + j], s = sin_t[r * half + j];
        y[a] = x1 * c - x2 * s; y[b] = x2 * c + x1 * s; }

Four consecutive pairs of a thread (p a multiple of 4) lie in one row at j .. j + 3 wherever H divides by 4, so
each array is one 16-byte vector at each offset it is touched at: x at a and at b, the tables at r * H + j, y
at a and at b; all three offsets are then multiples of 4, so the pointers' own 16-byte alignment is enough. The
vector form (`rewritten`) checks `p + 3 < n && H % 4 == 0` and the pointers at run time, keeps the offsets'
declarations (computed once, for the first pair), runs the rest of the work once per pair on vector lanes, and
otherwise runs the naive work pair by pair in the element loop `for (int e = p; e < n && e < p + 4; ++e)` that
the interleaved forms write, so `unpacked` (`_elementwise.py`) is its backward too.

Why a reading of its own beside `serial_site`: that one names an array's one pack by the array (`x4`), a place
by `[k * i + j]`; here an array has two packs (x at a and at b) and the places are offsets of a row split out of
the index, which only a polynomial reading of the offsets shows equal to a, a + H and r * H + j.

Legality, on the parse: the work starts with integer declarations that split the index, `r = p / H` and
`j = p % H` with one H (a scalar parameter, or a parenthesized product of them, the kernel assigning none), then
offsets of r, j and parameters; every subscript of the rest is at 2 * r * H + j, that + H (an array of pairs) or
r * H + j (a table, only read), one array at one kind of place; an array at a pair offset is a pointer parameter
to float, int or unsigned; the rest names p, j and the offsets only inside those subscripts (every lane has its
own), assigns none of the split's names, and has no loop, barrier, atomic, call with effects, pointer
dereference or jump; a pack only written is stored by a plain statement of the work's top level. Anything else
is refused with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms._edit import indentation, is_written, operator, reindent, splice, unparen
from klineage.transforms._elementwise import (
    ELEMENT,
    Packing,
    else_per_element,
    evaluation_order,
    naive_guard,
    plain_body,
)
from klineage.transforms._naive import parameters, statements, written_names
from klineage.transforms._polynomials import Poly, constant, plus, polynomial, times, variable
from klineage.transforms.base import NotApplicable

WIDTH = 4
COMPONENTS = ("x", "y", "z", "w")
VECTORS = {"float": "float4", "int": "int4", "unsigned": "uint4", "unsigned int": "uint4"}
INTEGERS = {"int", "long long", "long long int", "long", "size_t", "unsigned", "unsigned int", "int64_t"}
# the offsets' roles, and the suffix of their packs' names (the pack names match the packing's `taken`: \w+4)
LOW, HIGH, TABLE = "lo", "hi", "t"

class NotSplit(NotApplicable):
    """The work does not split its index (`p / H`, `p % H`): not this reading's kernel at all."""


@dataclass(frozen=True)
class HalfSite:
    function: cp.Function
    kind: str
    index: str
    index_init: Node
    guard: Node
    bound: str
    body: Node  # the guarded compound statement
    half: str  # H as written
    offsets: tuple[Node, ...]  # the splitting declarations
    work: tuple[Node, ...]  # the statements after them
    places: tuple[tuple[Node, str, str], ...]  # (subscript, array, role)
    read: tuple[tuple[str, str], ...]  # (array, element type)
    written: tuple[tuple[str, str], ...]
    unit = "half-split pair"  # what a thread takes four of, for the rewrite's note

    def rewritten(self, state: KernelState, parsed: cp.ParsedSource) -> tuple[str, LaunchPlan]:
        return packed_halves(state, parsed, self)


def _split_by(parsed: cp.ParsedSource, node: Node | None, index: str, op: str) -> Node | None:
    """H of an initializer `index / H` (op "/") or `index % H` (op "%"); None otherwise."""
    node = unparen(node) if node is not None else None
    if node is None or node.type != "binary_expression" or operator(node) != op:
        return None
    if parsed.text(unparen(node.child_by_field_name("left"))) != index:
        return None
    return node.child_by_field_name("right")


def _declarators(parsed: cp.ParsedSource, statement: Node) -> list[tuple[str, Node | None]] | None:
    """(name, initializer) of a plain integer declaration's declarators; None for any other statement."""
    if statement.type != "declaration":
        return None
    kind = statement.child_by_field_name("type")
    if kind is None or squash_type(parsed.text(kind)) not in INTEGERS:
        return None
    found = []
    for declarator in statement.children_by_field_name("declarator"):
        if declarator.type != "init_declarator" or declarator.child_by_field_name("declarator").type != "identifier":
            return None
        found.append((parsed.text(declarator.child_by_field_name("declarator")),
                      declarator.child_by_field_name("value")))
    return found


def squash_type(text: str) -> str:
    return " ".join(text.split())


def half_site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, packing: Packing) -> HalfSite:
    """The half-split pair form in `function`; NotSplit where its work does not split the index, NotApplicable with
    the reason where it does but would not pack."""
    kind, index, init, guard, bound, _ = naive_guard(state, parsed, function, packing)
    body = guard.child_by_field_name("consequence")
    top = statements(body)
    offsets, split = [], {}
    for statement in top:
        declared = _declarators(parsed, statement)
        if declared is None or not any(index in {parsed.text(n) for n in cp.nodes_of_type(value, "identifier")}
                                       or set(split) & {parsed.text(n) for n in cp.nodes_of_type(value, "identifier")}
                                       for _, value in declared if value is not None):
            break
        offsets.append(statement)
        for name, value in declared:
            split[name] = value
    quotient = [(name, _split_by(parsed, value, index, "/")) for name, value in split.items()]
    remainder = [(name, _split_by(parsed, value, index, "%")) for name, value in split.items()]
    quotient, remainder = [q for q in quotient if q[1] is not None], [r for r in remainder if r[1] is not None]
    if not quotient and not remainder:
        raise NotSplit(f"{function.name}'s work does not split '{index}' into a row and a pair")
    if len(quotient) != 1 or len(remainder) != 1:
        raise NotApplicable(f"{function.name} splits '{index}' other than once by `{index} / H` and once by "
                            f"`{index} % H`")
    (row, h), (pair, h2) = quotient[0], remainder[0]
    half = parsed.text(h)
    if " ".join(half.split()) != " ".join(parsed.text(h2).split()):
        raise NotApplicable(f"{function.name} splits '{index}' by `{half}` and by `{parsed.text(h2)}`: "
                            f"one row length")
    scalars = {name for name, _, pointer in parameters(parsed, function) if not pointer}
    factors = [parsed.text(n) for n in cp.nodes_of_type(h, "identifier")]
    inner = unparen(h)
    product = inner.type == "identifier" or (h.type == "parenthesized_expression" and re.fullmatch(
        r"\w+(?:\s*\*\s*\w+)*", parsed.text(inner)) is not None)
    if not product or not set(factors) <= scalars:
        raise NotApplicable(f"{function.name}'s row length `{half}` is not a scalar parameter or a product of them")
    names = {p: variable(p) for p in scalars} | {row: variable("#r"), pair: variable("#j")}
    # the index is its row's first pair plus the pair: p = r * H + j (p >= 0, so / and % split it exactly)
    names[index] = plus(Poly({(tuple(sorted(("#r", *factors))), 1)}), variable("#j"))
    assigned = written_names(parsed, function.node.child_by_field_name("body"))
    if clash := sorted((set(factors) | set(split)) & assigned):
        raise NotApplicable(f"{function.name} assigns '{clash[0]}', which its pairs' offsets read")
    for name, value in split.items():
        if name in (row, pair):
            continue
        poly = polynomial(parsed, value, names) if value is not None else None
        if poly is None:
            raise NotApplicable(f"{function.name}'s offset '{name}' is not integer arithmetic on the row, the pair "
                                f"and parameters")
        names[name] = poly
    hp = Poly({(tuple(sorted(factors)), 1)})
    j, r = variable("#j"), variable("#r")
    low = plus(times(times(r, hp), constant(2)), j)
    roles = {low: LOW, plus(low, hp): HIGH, plus(times(r, hp), j): TABLE}
    work = top[len(offsets):]
    if not work:
        raise NotApplicable(f"{function.name}'s work only splits '{index}'")
    types = plain_body(parsed, function, body, packing)
    lanewise = {index, pair} | {name for name, poly in names.items() if name in split and
                                any(any(s in ("#j",) for s in m) for m, _ in poly)}
    places, role_of, read, written, stores = [], {}, {}, {}, set()
    subscripts = [n for statement in work for n in cp.nodes_of_type(statement, "subscript_expression")]
    for node in sorted(subscripts, key=evaluation_order):
        array = parsed.text(node.child_by_field_name("argument"))
        at = node.child_by_field_name("indices")
        at = at.named_children[0] if at.type == "subscript_argument_list" and at.named_child_count == 1 else at
        poly = polynomial(parsed, at, names)
        role = roles.get(poly) if poly is not None else None
        stored = is_written(node)
        if role is None or array not in types:
            raise NotApplicable(f"{function.name} {'writes' if stored else 'reads'} `{parsed.text(node)}`: not a "
                                f"pointer parameter at a pair's offsets (2 * r * {half} + j, + {half}) or its table "
                                f"entry (r * {half} + j)")
        kind_of = "table" if role == TABLE else "pairs"
        if role_of.setdefault(array, kind_of) != kind_of:
            raise NotApplicable(f"'{array}' is touched at a pair's offsets and at its table entry: another pair's "
                                f"elements")
        if role == TABLE and stored:
            raise NotApplicable(f"{function.name} writes its table '{array}' at r * {half} + j")
        if types[array] not in VECTORS:
            raise NotApplicable(f"'{array}' is no pointer parameter to float, int or unsigned")
        parent = node.parent
        if not stored or parent.type != "assignment_expression" or parsed.text(
                parent.child_by_field_name("operator")) != "=":
            read.setdefault((array, role), types[array])
        if stored:
            written.setdefault((array, role), types[array])
            if parent.type == "assignment_expression" and parent.parent in work:
                stores.add((array, role))
        places.append((node, array, role))
    for key in written:
        if key not in read and key not in stores:
            raise NotApplicable(f"'{key[0]}' is written only under a condition at one of its offsets: a vector "
                                f"store would write garbage")
    inside = [(n.start_byte, n.end_byte) for n, _, _ in places]
    for statement in work:
        for use in cp.nodes_of_type(statement, "identifier"):
            name = parsed.text(use)
            if name in lanewise and not any(s <= use.start_byte < e for s, e in inside):
                raise NotApplicable(f"{function.name} names '{name}' outside its pairs' subscripts: a lane would "
                                    f"read the first pair's")
    if not written:
        raise NotApplicable(f"{function.name} writes no pair")
    return HalfSite(function, kind, index, init, guard, bound, body, half, tuple(offsets), tuple(work),
                    tuple(places), tuple((a, t) for (a, _), t in read.items()),
                    tuple((a, t) for (a, _), t in written.items()))


def _pack(array: str, role: str) -> str:
    return f"{array}{WIDTH}" if role == TABLE else f"{array}_{role}{WIDTH}"


def packed_halves(state: KernelState, parsed: cp.ParsedSource, site: HalfSite) -> tuple[str, LaunchPlan]:
    """(source, plan) of the vector form: four pairs a thread, one vector of each array at each offset, the naive
    work pair by pair in the element loop otherwise; the grid a quarter."""
    data = parsed.data
    indent = indentation(data, site.guard.start_byte)
    inner = indent + "    "
    column = len(indentation(data, site.body.start_byte))
    arrays = list(dict.fromkeys([a for a, _ in site.read] + [a for a, _ in site.written]))
    types = dict(site.read) | dict(site.written)
    aligned = " | ".join(f"(size_t){a}" for a in arrays)
    lines = [f"if ({site.index} + {WIDTH - 1} < {site.bound} && {site.half} % {WIDTH} == 0 && (({aligned}) & 15) == "
             f"0) {{"]
    start, end = site.offsets[0].start_byte, site.offsets[-1].end_byte
    lines.append(inner + reindent(data[start:end].decode("utf-8"), column + 4, inner)[len(inner):])
    packs: dict[tuple[str, str], str] = {}  # (array, role) -> the offset's text, first as written
    loaded: set[tuple[str, str]] = set()
    for node, array, role in site.places:
        at = node.child_by_field_name("indices")
        at = at.named_children[0] if at.type == "subscript_argument_list" and at.named_child_count == 1 else at
        shown = " ".join(parsed.text(at).split())
        packs.setdefault((array, role), shown if unparen(at).type == "identifier" else f"({shown})")
        stored, parent = is_written(node), node.parent
        if not stored or parent.type != "assignment_expression" or \
                parsed.text(parent.child_by_field_name("operator")) != "=":
            loaded.add((array, role))
    written = {(array, role) for node, array, role in site.places if is_written(node)}
    for (array, role), offset in packs.items():
        vector = VECTORS[types[array]]
        if (array, role) in loaded:
            const = "" if (array, role) in written else "const "
            lines.append(f"{inner}{const}{vector} {_pack(array, role)} = *reinterpret_cast<const {vector}*>({array} + "
                         f"{offset});")
        else:
            lines.append(f"{inner}{vector} {_pack(array, role)};")
    base = site.body.start_byte
    for lane in range(WIDTH):
        edits = [(base + 1 - base, end - base, "")]  # the offsets are the first pair's, declared once above
        edits += [(n.start_byte - base, n.end_byte - base, f"{_pack(array, role)}.{COMPONENTS[lane]}")
                  for n, array, role in site.places]
        block = splice(data[base:site.body.end_byte], edits)[0].decode("utf-8")
        lines.append(inner + reindent(block, column, inner)[len(inner):])
    for (array, role), offset in packs.items():
        if (array, role) in written:
            lines.append(f"{inner}*reinterpret_cast<{VECTORS[types[array]]}*>({array} + {offset}) = "
                         f"{_pack(array, role)};")
    uses = [n for n in cp.nodes_of_type(site.body, "identifier") if parsed.text(n) == site.index]
    tail = splice(data[base:site.body.end_byte], [(n.start_byte - base, n.end_byte - base, ELEMENT)
                                                   for n in uses])[0].decode("utf-8")
    return else_per_element(state, data, site, lines, tail, WIDTH, (indent, inner, column))
