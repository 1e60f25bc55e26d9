"""scalarize_grid_stride: a grid-stride loop that moves four elements a step as 16-byte vectors (a scalar tail, and
the element loop where a pointer is misaligned) becomes the loop over elements; forward finds its sites by analysis.

The mechanism (forward): a kernel whose threads each walk a grid-stride loop over elements, summing as they go (a
loss, a dot product, a norm, a maximum: `s += d * d`, `m = fmaxf(m, x[i])`) or also writing each element, keeps
one 4-byte load per array in flight a step. Where every array the loop touches at `[i]` is 16-byte aligned
(checked at run time on the pointers, as scalarize_elementwise does), the loop walks vectors instead:

    if ((((size_t)a | (size_t)b) & 15) == 0) {
        for (int v = <start>; v < n / 4; v += blockDim.x * gridDim.x) {
            const float4 a4 = reinterpret_cast<const float4*>(a)[v];
            const float4 b4 = reinterpret_cast<const float4*>(b)[v];
            { <body, a[i] as a4.x, b[i] as b4.x, any other i as (4 * v)> }
            { <body, .y, (4 * v + 1)> } { <.z> } { <.w> }
        }
        for (int i = (n / 4) * 4 + <start>; i < n; i += blockDim.x * gridDim.x) <body>
    } else {
        for (int i = <start>; i < n; i += blockDim.x * gridDim.x) <body>
    }

the vector loop from the loop's own start to n / 4 with its own stride, each array read at `[i]` loaded once a step
as a `float4`/`int4`/`uint4`, the body once per component in component order (each component's own element index
`4 * v + c`, a block of its own so the body's locals are its own), each array written at `[i]` stored once as a
vector; then a scalar tail over the last n % 4 elements with the same stride; where a pointer is misaligned the
original loop, as written. The `while` spelling (`int i = <start>; while (i < n) { <body> i += <stride>; }`) keeps
its declaration before the branch; its tail is `i += (n / 4) * 4;` and the loop as written. Code before and after
the loop is untouched, so whatever combines the threads' sums after it (an atomic, a warp's shuffles) still does.

Every element below n is visited once, as before, but by another thread and in another order: each thread now
sums a different set of elements, so floating-point sums are reassociated (integer sums, maxima and minima are
not changed). That is legal under the gate's tolerance, as for unaggregate_atomics: the naive kernel's unordered
atomics already give one of many roundings.

Legality (forward_sites), conservative, decided on the parse and the plan: the launch is 1-D and passes no buffer
twice; the kernel has exactly one top-level grid-stride loop over one dimension: its index starts at the global
thread index `blockIdx.x * blockDim.x + threadIdx.x` (its terms and factors in either order, casts on the grid
allowed), its condition is `i < n`, n a name or integer arithmetic of scalar parameters and constants the kernel
never assigns (`_naive.copied_bound`), its step `i += blockDim.x * gridDim.x` (or a stride local declared so and
never assigned); the `while` spelling's index is changed nowhere before the loop and read nowhere after it.

The body has no barrier, shuffle, atomic, `return`/`break`/`continue`/`goto`, inner loop, thread coordinate,
`static` or shared local, call that may have an effect, or pointer dereference; it never writes or declares the
index. Every array it touches at `[i]` is a pointer parameter to float, int or unsigned. An array it writes is
written only at `[i]`, on every path through the body (a plain store of its top level, or one on both branches of
an if/else) unless it is also read there (so every component gets a value), read after it is written only after a
store of the top level, and touched nowhere else in the kernel. An array
read elsewhere (`t[idx[i]]`, `w[0]`) is a pointer parameter the kernel never writes.

Every other name the body assigns is a local it declares (per element, its own in each component's block, and no
name of a local before the loop) or an accumulator: a scalar local declared before the loop that the body only
updates as a reduction, `s += e`, `s -= e`, `s *= e`, `s |= e`, `s &= e`, `s ^= e`, `s = s + e`, `s = e * s`,
`s = fmaxf(s, e)` (max, min, fmax, fmin, fminf), `++s`, each statement on its own, one kind of update per
accumulator, `e` reading no accumulator, and no accumulator read elsewhere in the body. An order of updates other
than a reduction's (`last = x[i]`, `y[i] = s`, `if (x[i] > m) { m = x[i]; k = i; }`) would see other elements in
another order, so it is refused. The names the rewrite declares (the vector index, `<array>4`) are not names of
the kernel already. Anything else: no site.

Backward scalarizes exactly the form forward writes: the aligned branch goes and the misaligned branch's loop,
the loop as written, takes the branch's place (reindented back), so forward then backward gives the original bytes.

Anchor: the kernel, kind "function", key the loop's element index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._calls import MATH_CALLS, first_effect
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import indentation, is_written, operator, reindent, splice, unparen
from klineage.transforms._elementwise import evaluation_order, stored_on_every_path
from klineage.transforms._grid_stride import grid_stride_candidates, read_grid_stride
from klineage.transforms._naive import (
    FORBIDDEN,
    LOOP_INDEX_TYPES,
    copied_bound,
    kernel,
    launches_of,
    parameters,
    readable,
    squash,
    statements,
)
from klineage.transforms._readonly import plain_reads
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

WIDTH = 4
COMPONENTS = ("x", "y", "z", "w")
VECTORS = {"float": "float4", "int": "int4", "unsigned": "uint4", "unsigned int": "uint4"}
_BODY_FORBIDDEN = re.compile(rf"{FORBIDDEN.pattern}|\b(?:atomic\w*|printf|static|volatile|asm)\b")
_VECTOR_INDEXES = ("v", "vec", "v4", "vector_index")
# an accumulator's update families: the compound operators, the binary operators and the calls of each
_FAMILIES = {"+=": "+", "-=": "+", "*=": "*", "|=": "|", "&=": "&", "^=": "^"}
_COMMUTATIVE = {"+": "+", "*": "*", "|": "|", "&": "&", "^": "^"}
_EXTREMA = {"fmaxf": "max", "fmax": "max", "max": "max", "fminf": "min", "fmin": "min", "min": "min"}
_ALIGNED = re.compile(r"\(\(\((?:\(size_t\)[A-Za-z_]\w*)(?: \| \(size_t\)[A-Za-z_]\w*)*\) & 15\) == 0\)")


@dataclass(frozen=True)
class _Site:
    function: cp.Function
    loop: Node  # the `for` or `while` statement
    kind: str  # the index's type, as declared
    index: str
    start: str  # the index's initial value, as written
    start_node: Node  # where the `for` loop's start stands (the `while` loop's declaration's value)
    bound: str
    stride: str  # the step's stride, as written
    step: Node | None  # the `while` loop's step statement
    body: Node
    read: tuple[tuple[str, str], ...]  # (array, element type) read at [i], in order of first access
    written: tuple[tuple[str, str], ...]
    vector: str  # the vector index's name


class ScalarizeGridStride(Transform):
    name = "scalarize_grid_stride"
    intent = ("Walk a grid-stride loop that accumulates (a sum, a dot product, a norm, a maximum) or writes its "
              "element four elements a step as 16-byte vector loads and stores, with a scalar tail and the element "
              "loop for misaligned pointers.")
    # the vector type forward adds at a site (float4, or int4/uint4): cards that move 16-byte vectors (devectorize's,
    # scalarize_elementwise's) propose this transform's sites too
    removes = ("vector_type_float4", "vector_type_int4")
    placement = Placement.ANALYSIS
    kin = ("scalarize_elementwise", "devectorize")  # the same 16-byte vectors, on a loop a thread walks

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", form[0], parsed.text(form[1])[:200])
                for function, form in readable(parsed, lambda f: _vector_form(parsed, f))]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        # an author's `__ldg(&a[i])` is the read `a[i]` the vector replaces; a loop from an index local, from the index
        state = canonical(plain_reads(state))
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", site.index, parsed.text(site.loop)[:200])
                for function, site in readable(parsed, lambda f: _site(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = canonical(plain_reads(state))
        parsed = cp.parse(state.source)
        site = _site(state, parsed, kernel(parsed, anchor))
        if site.index != anchor.key:
            raise NotApplicable(f"{anchor}: the loop's element index is '{site.index}'")
        names = ", ".join(dict(site.read) | dict(site.written))
        return self.rewrite(state, anchor, Direction.FORWARD, _vectorized(parsed, site), carrier={"width": WIDTH},
                            note=f"{site.function.name}: the grid-stride loop walks {WIDTH} elements a step as 16-byte "
                                 f"vectors of {names}, scalar tail; the element loop where a pointer is misaligned")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        index, branch, original = _vector_form(parsed, function)
        if index != anchor.key:
            raise NotApplicable(f"{anchor}: the loop's element index is '{index}'")
        indent = indentation(parsed.data, branch.start_byte)
        text = reindent(parsed.text(original), len(indentation(parsed.data, original.start_byte)), indent)
        source = splice(parsed.data, [(branch.start_byte, branch.end_byte, text[len(indent):])])[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{function.name}: the grid-stride loop walks one element a step")


def _site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> _Site:
    """The grid-stride loop forward vectorizes in `function`, or NotApplicable with the reason."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    listed = statements(body)
    loops = grid_stride_candidates(parsed, listed)
    if len(loops) != 1:
        raise NotApplicable(f"{function.name} has {'no' if not loops else 'more than one'} grid-stride loop over "
                            f"elements at its top level")
    launches_of(state, function.name, dimensions=1)
    strided = read_grid_stride(parsed, function, listed, loops[0])
    loop, index, step = strided.loop, strided.index, strided.step
    bound = copied_bound(parsed, function, strided.bound, ())
    if bound is None:
        raise NotApplicable(f"{function.name}'s loop bound is not a count of scalar parameters")
    after = listed[listed.index(loop) + 1:]
    if loop.type == "while_statement":
        if any(parsed.text(n) == index for s in after for n in cp.nodes_of_type(s, "identifier")):
            raise NotApplicable(f"{function.name} reads its index '{index}' after the loop: the tail ends elsewhere")
    work, text = strided.body, strided.work
    if found := _BODY_FORBIDDEN.search(text):
        raise NotApplicable(f"{function.name}'s loop body loops, synchronizes, jumps, makes an atomic or names the "
                            f"grid or a thread (`{found[0]}`)")
    if (called := first_effect(parsed, work, MATH_CALLS)) is not None:
        raise NotApplicable(f"{function.name}'s loop body calls {called}, which may have effects")
    if cp.nodes_of_type(work, "pointer_expression") or "->" in text:
        raise NotApplicable(f"{function.name}'s loop body dereferences a pointer expression")
    if any(parsed.text(n) == index and (is_written(n) or n.parent.type in ("init_declarator", "declaration"))
           for n in cp.nodes_of_type(work, "identifier") if step is None or not _within(n, step)):
        raise NotApplicable(f"{function.name} writes or declares its index '{index}' in the loop body")
    read, written = _arrays(parsed, function, work, index, step)
    _accumulators(parsed, function, work, strided.before, step)
    named = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier")}
    if clash := sorted(f"{a}{WIDTH}" for a in dict(read) | dict(written) if f"{a}{WIDTH}" in named):
        raise NotApplicable(f"{function.name} names '{clash[0]}', which the vector form declares")
    vector = next((name for name in _VECTOR_INDEXES if name not in named), None)
    if vector is None:
        raise NotApplicable(f"{function.name} names every vector index name the vector form could use")
    return _Site(function, loop, strided.kind, index, strided.start, strided.start_node, bound, strided.stride, step,
                 work, read, written, vector)


def _arrays(parsed: cp.ParsedSource, function: cp.Function, work: Node, index: str,
            step: Node | None) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """(read, written): the arrays the body touches at `[i]`, each with its element type, once they are legal."""
    pointers = {name: kind.removeprefix("const ").strip() for name, kind, pointer in parameters(parsed, function)
                if pointer}
    body = function.node.child_by_field_name("body")
    # the arrays the kernel writes anywhere: by a subscript store, or through its name
    stores = [n for n in cp.nodes_of_type(body, "subscript_expression") if is_written(n)]
    ever_written = {parsed.text(n.child_by_field_name("argument")) for n in stores}
    read, written, top = {}, {}, statements(work)
    plain = set()
    for node in sorted(cp.nodes_of_type(work, "subscript_expression"), key=evaluation_order):
        array = parsed.text(node.child_by_field_name("argument"))
        stored = is_written(node)
        at = _at_index(parsed, node, index)
        if not at:
            if stored or array not in pointers or array in ever_written:
                raise NotApplicable(f"{function.name} {'writes' if stored else 'reads'} `{parsed.text(node)}`, not "
                                    f"element {index} of a pointer parameter the kernel never writes")
            continue
        element = pointers.get(array, "")
        if element not in VECTORS:
            raise NotApplicable(f"{function.name} touches `{parsed.text(node)}`: '{array}' is no pointer parameter "
                                f"to float, int or unsigned")
        if stored and parsed.text(node.parent.child_by_field_name("operator")) != "=":
            read.setdefault(array, element)  # `y[i] += e` reads y[i] first
        if not stored and array in plain:
            continue  # the component a top-level store gave it: nothing to load
        if not stored and array in written and array not in read:
            raise NotApplicable(f"'{array}' is read after it is written")
        (written if stored else read).setdefault(array, element)
        if stored and node.parent.parent in top:
            plain.add(array)
    everywhere = set().union(*(stored_on_every_path(
        statement, lambda n: parsed.text(n.child_by_field_name("argument")) if _at_index(parsed, n, index) else None)
        for statement in top))
    for array in written:
        if array not in read and array not in plain | everywhere:
            raise NotApplicable(f"'{array}' is written only under a condition: a vector store would write garbage")
        touched = [n for n in cp.nodes_of_type(body, "identifier") if parsed.text(n) == array]
        if any(not _within(n, work) for n in touched):
            raise NotApplicable(f"{function.name} touches '{array}', which its loop writes, outside the loop")
    for array in dict(read) | dict(written):
        if array in ever_written and any(not _within(n, work) for n in cp.nodes_of_type(body, "identifier")
                                         if parsed.text(n) == array):
            raise NotApplicable(f"{function.name} writes '{array}' outside the loop too")
    if not read and not written:
        raise NotApplicable(f"{function.name}'s loop touches no array at `[{index}]`")
    return tuple(read.items()), tuple(written.items())


def _at_index(parsed: cp.ParsedSource, subscript: Node, index: str) -> bool:
    place = subscript.child_by_field_name("indices")
    if place.type == "subscript_argument_list":
        if place.named_child_count != 1:
            return False
        place = place.named_children[0]
    return parsed.text(unparen(place)) == index and unparen(place).type == "identifier"


def _accumulators(parsed: cp.ParsedSource, function: cp.Function, work: Node, before: list[Node],
                  step: Node | None) -> None:
    """NotApplicable unless every name the body assigns, other than its own locals, is a scalar local declared
    before the loop that the body only updates as a reduction (see the module's docstring)."""
    own = {parsed.text(d) for d in cp.nodes_of_type(work, "declaration") for d in _declared(d)}
    uses = [n for n in cp.nodes_of_type(work, "identifier") if step is None or not _within(n, step)]
    carried = sorted({parsed.text(n) for n in uses if is_written(n)} - own)
    locals_before = {parsed.text(name): declaration for declaration in before if declaration.type == "declaration"
                     for name in _declared(declaration)}
    if shadowed := sorted(own & set(locals_before)):
        raise NotApplicable(f"{function.name}'s loop body declares '{shadowed[0]}' again, which a local before the "
                            f"loop names")
    for name in carried:
        declaration = locals_before.get(name)
        if declaration is None:
            raise NotApplicable(f"{function.name}'s loop assigns '{name}', which is no local declared before the loop")
        if re.search(r"\b(?:static|__shared__|extern)\b", parsed.text(declaration)):
            raise NotApplicable(f"{function.name}'s accumulator '{name}' is no plain local")
    families: dict[str, str] = {}
    allowed: set[int] = set()
    for statement in cp.nodes_of_type(work, "expression_statement"):
        expression = statement.named_children[0] if statement.named_children else None
        for name in carried:
            update = _update(parsed, expression, name) if expression is not None else None
            if update is None:
                continue
            family, own_uses, value = update
            if families.setdefault(name, family) != family:
                raise NotApplicable(f"{function.name} updates its accumulator '{name}' in two ways: no reduction")
            if value is not None and any(parsed.text(n) in carried for n in cp.nodes_of_type(value, "identifier")):
                raise NotApplicable(f"{function.name}'s update of '{name}' reads an accumulator: no reduction")
            allowed |= {n.id for n in own_uses}
    for use in uses:
        if parsed.text(use) in carried and use.id not in allowed:
            raise NotApplicable(f"{function.name}'s loop reads or updates its accumulator '{parsed.text(use)}' other "
                                f"than as a reduction (`s += e`, `m = fmaxf(m, e)`): another order of elements would "
                                f"change it")


def _declared(declaration: Node) -> list[Node]:
    """The identifiers a declaration declares (`float a = 0, b;`): a pointer or array declarator's left out, so
    that a carried name declared so is no accumulator."""
    found = []
    for declarator in declaration.children_by_field_name("declarator"):
        inner = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else declarator
        if inner is not None and inner.type == "identifier":
            found.append(inner)
    return found


def _update(parsed: cp.ParsedSource, expression: Node, name: str) -> tuple[str, list[Node], Node | None] | None:
    """(family, the accumulator's own uses, the operand) of a reduction update of `name` (a whole statement's
    expression), None where the expression is none."""
    expression = unparen(expression)
    if expression.type == "update_expression":
        argument = unparen(expression.child_by_field_name("argument"))
        return ("+", [argument], None) if parsed.text(argument) == name else None
    if expression.type != "assignment_expression":
        return None
    left = unparen(expression.child_by_field_name("left"))
    if left.type != "identifier" or parsed.text(left) != name:
        return None
    symbol, right = parsed.text(expression.child_by_field_name("operator")), expression.child_by_field_name("right")
    if symbol in _FAMILIES:
        return _FAMILIES[symbol], [left], right
    if symbol != "=":
        return None
    right = unparen(right)
    if right.type == "binary_expression" and (operator(right) in _COMMUTATIVE or operator(right) == "-"):
        sides = [right.child_by_field_name("left"), right.child_by_field_name("right")]
        for at, side in enumerate(sides):
            if unparen(side).type == "identifier" and parsed.text(unparen(side)) == name and \
                    (at == 0 or operator(right) != "-"):
                return _COMMUTATIVE.get(operator(right), "+"), [left, unparen(side)], sides[1 - at]
    if right.type == "call_expression" and cp.call_name(right) in _EXTREMA:
        arguments = right.child_by_field_name("arguments").named_children
        if len(arguments) == 2:
            for at, argument in enumerate(arguments):
                if unparen(argument).type == "identifier" and parsed.text(unparen(argument)) == name:
                    return _EXTREMA[cp.call_name(right)], [left, unparen(argument)], arguments[1 - at]
    return None


def _within(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def _vectorized(parsed: cp.ParsedSource, site: _Site) -> str:
    """The kernel's source with the loop in the vector form."""
    data = parsed.data
    indent = indentation(data, site.loop.start_byte)
    inner, deeper = indent + "    ", indent + "        "
    read, written = dict(site.read), dict(site.written)
    arrays = read | written
    bound = site.bound if re.fullmatch(r"[A-Za-z_]\w*", site.bound) else f"({site.bound})"
    v = site.vector
    lines = [f"if ((({' | '.join(f'(size_t){a}' for a in arrays)}) & 15) == 0) {{",
             f"{inner}for ({site.kind} {v} = {site.start}; {v} < {bound} / {WIDTH}; {v} += {site.stride}) {{"]
    for array, element in read.items():
        vector = VECTORS[element]
        const = "" if array in written else "const "
        lines.append(f"{deeper}{const}{vector} {array}{WIDTH} = reinterpret_cast<const {vector}*>({array})[{v}];")
    for array, element in written.items():
        if array not in read:
            lines.append(f"{deeper}{VECTORS[element]} {array}{WIDTH};")
    column = len(indentation(data, site.body.start_byte))
    for lane in range(WIDTH):
        block = _component(parsed, site, lane)
        lines.append(deeper + reindent(block, column, deeper)[len(deeper):])
    for array, element in written.items():
        lines.append(f"{deeper}reinterpret_cast<{VECTORS[element]}*>({array})[{v}] = {array}{WIDTH};")
    lines.append(f"{inner}}}")
    loop_text = parsed.text(site.loop)
    moved = reindent(loop_text, len(indent), inner)[len(inner):]
    tail_start = f"({bound} / {WIDTH}) * {WIDTH}"
    if site.step is None:  # the loop as written from the first element the vectors left
        at = site.start_node.start_byte - site.loop.start_byte
        length = site.start_node.end_byte - site.start_node.start_byte
        tail = loop_text[:at] + f"{tail_start} + {loop_text[at:at + length]}" + loop_text[at + length:]
        lines.append(inner + reindent(tail, len(indent), inner)[len(inner):])
    else:
        lines += [f"{inner}{site.index} += {tail_start};", inner + moved]
    lines += [f"{indent}}} else {{", inner + moved, f"{indent}}}"]
    return splice(data, [(site.loop.start_byte, site.loop.end_byte, "\n".join(lines))])[0].decode("utf-8")


def _component(parsed: cp.ParsedSource, site: _Site, lane: int) -> str:
    """The body's text for one component: `a[i]` as the lane of a's vector, any other use of the index as the
    component's element index, the `while` loop's step left out; always a block."""
    body, base = site.body, site.body.start_byte
    element = f"({WIDTH} * {site.vector} + {lane})" if lane else f"({WIDTH} * {site.vector})"
    arrays = dict(site.read) | dict(site.written)
    at = [n for n in cp.nodes_of_type(body, "subscript_expression") if _at_index(parsed, n, site.index)
          and parsed.text(n.child_by_field_name("argument")) in arrays]
    edits = [(n.start_byte - base, n.end_byte - base,
              f"{parsed.text(n.child_by_field_name('argument'))}{WIDTH}.{COMPONENTS[lane]}") for n in at]
    edits += [(n.start_byte - base, n.end_byte - base, element) for n in cp.nodes_of_type(body, "identifier")
              if parsed.text(n) == site.index and not any(_within(n, s) for s in at)
              and (site.step is None or not _within(n, site.step))]
    if site.step is not None:  # from the end of the statement before the step through the step
        previous = statements(body)[-2]
        edits.append((previous.end_byte - base, site.step.end_byte - base, ""))
    text = splice(parsed.data[base:body.end_byte], edits)[0].decode("utf-8")
    return text if body.type == "compound_statement" else f"{{ {text} }}"


def _vector_form(parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, Node, Node]:
    """(the element index, the aligned branch `if (...) {...} else {...}`, the loop as written in its else) of a
    kernel in the form forward writes."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    for statement in statements(body):
        if statement.type != "if_statement" or not _ALIGNED.fullmatch(
                squash(parsed.text(statement.child_by_field_name("condition")))):
            continue
        consequence, alternative = (statement.child_by_field_name(f) for f in ("consequence", "alternative"))
        inside = statements(alternative.named_children[0]) if alternative is not None and \
            alternative.named_children else []
        aligned = statements(consequence)
        if len(inside) != 1 or inside[0].type not in ("for_statement", "while_statement") or \
                aligned[0].type != "for_statement" or not re.search(
                    rf"< .+ / {WIDTH}$", squash(parsed.text(aligned[0].child_by_field_name("condition")))):
            continue
        original = inside[0]
        if original.type == "for_statement":
            found = re.match(rf"(?:{LOOP_INDEX_TYPES}) ([A-Za-z_]\w*) =",
                             squash(parsed.text(original.child_by_field_name("initializer"))))
        else:
            found = re.match(r"\(\s*([A-Za-z_]\w*) <", squash(parsed.text(original.child_by_field_name("condition"))))
        if found:
            return found[1], statement, original
    raise NotApplicable(f"{function.name} has no grid-stride loop over 16-byte vectors beside its element loop")


register(ScalarizeGridStride())
