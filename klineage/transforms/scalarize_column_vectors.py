"""scalarize_column_vectors: a "thread per column" kernel whose threads each own four adjacent columns, moved as
16-byte vectors row by row, becomes the kernel whose threads own one column; forward finds its sites by analysis.

The mechanism (forward): in a kernel where every thread owns one column c of row-major matrices with a run-time
row length `cols` (a bias gradient, a column maximum, mean or variance, one split of a column reduction), walks
the rows and touches memory only at `[<row> * cols + c]` or `[c]`, each thread reads one 4-byte element a row.
Where `cols % 4 == 0` and every array moved as vectors is 16-byte aligned (checked at run time), a thread owns the
four columns 4 * c4 .. 4 * c4 + 3 instead:

    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (cols % 4 == 0 && (((size_t)dy | (size_t)db) & 15) == 0) {
        const int c4 = c;  // columns 4 * c4 .. 4 * c4 + 3
        if (c4 < cols / 4) {
            float sum_x = 0.0f;  ... sum_w
            for (int r = 0; r < rows; r++) {
                const float4 dy4 = reinterpret_cast<const float4*>(dy + (size_t)r * cols)[c4];
                sum_x += dy4.x;  ... sum_w += dy4.w;
            }
            reinterpret_cast<float4*>(db)[c4] = make_float4(sum_x, sum_y, sum_z, sum_w);
        }
    } else if (c < cols) { <the guarded work, as written> }

(`if (c >= cols) return; <work>` keeps the same shape: its else is the guard and the work, as written.) Each
statement of the work runs once per component in component order, c as `(4 * c4 + k)` and every local the work
declares renamed per component (`sum_x`), except declarations that name no column, memory or per-component local
and are never assigned (`const int split_first = blockIdx.y * SPLIT;`) and the loops' headers: those run once. A read of
an array the kernel never writes, evaluated unconditionally by its statement, is one vector load before the
statement; a plain store `a[...] = e;` of a top-level statement is one vector store of the four components'
values; every other access (under a condition, of a 64-bit array, a compound store) stays scalar at the
component's column. Each component computes what the thread of its column computed, the same expressions in the
same order (nvcc contracts them alike), and no two columns share an element of any array (0 <= c < cols), so
results are bit-exact.

The launch is left as it is: its threads cover cols columns, four times what the vector path needs, and a thread
whose column vector is past cols / 4 does nothing there. Changing the grid would tie the plan to the branch taken at
run time and break the else branch, which still needs a thread per column.

Legality (forward_sites), conservative: the plan launches the kernel with a 1-D block (the grid may have y and z:
blockIdx.y may pick rows) and passes no buffer twice; the kernel declares c as the global index along x (its
canonical spelling, `_canonical.py`) and then exactly one guard at its top level, `if (c < cols) <work>` as its last
statement or `if (c >= cols) return;` followed by the work, cols a scalar integer parameter never assigned; before
the guard only declarations that read no memory, name no column and are never assigned. The work holds locals,
straight-line statements and top-level `for` loops (header a declaration naming no column, per-component local or
memory; its index assigned only by the header) whose bodies are straight-line: no nested loop, barrier,
collective, atomic, jump, `return`, pointer dereference, call that may have an effect, or x coordinate of the grid
but through c. Every subscript is of a pointer parameter at `[c]` or `[E * cols + c]`, E naming no column,
per-component local or memory, and a pointer parameter is used only so; at least one loop touches `[E * cols + c]`
(a kernel that walks no rows, one element a thread, is scalarize_elementwise's). Every per-component local is
declared once in the kernel, before any use; no new name (c4, `<array>4`, `<local>_x`) is a name of the kernel; at
least one access becomes a 16-byte vector of float, int or unsigned. Anything else: no site.

Backward scalarizes exactly the form forward writes: the aligned branch goes and its else, the guard and work as
written, takes its place (reindented back), so forward then backward gives the original bytes (forward checks it).

Anchor: the kernel, kind "function", key the column index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import ArgKind
from klineage.transforms import register
from klineage.transforms._calls import MATH_CALLS, first_effect
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import declared_names, indentation, is_written, operator, reindent, splice, unparen
from klineage.transforms._grid_stride import GLOBAL_INDEX
from klineage.transforms._naive import LOOP_INDEX_TYPES, kernel, parameters, readable, squash, statements, uncast_grid
from klineage.transforms._readonly import plain_reads
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

WIDTH = 4
COMPONENTS = ("x", "y", "z", "w")
VECTORS = {"float": "float4", "int": "int4", "unsigned": "uint4", "unsigned int": "uint4"}
# what the work may not hold: barriers, collectives, jumps, atomics, effects, loops but `for`, the grid's x
# coordinates (a column is only c; blockIdx.y may choose rows)
_FORBIDDEN = re.compile(r"\b(?:__syncthreads\w*|__syncwarp|__shared__|__shfl\w*|__ballot\w*|__any_sync|__all_sync|"
                        r"__activemask|__match\w*|__reduce\w*|asm|goto|break|continue|return|while|do|this_grid|"
                        r"grid_group|atomic\w*|printf|static|volatile|extern|warpSize)\b|"
                        r"\b(?:threadIdx|blockIdx|blockDim|gridDim)\.x\b")
_ALIGNED = re.compile(r"\(([A-Za-z_]\w*) % 4 == 0 && \(\(\(size_t\)[A-Za-z_]\w*(?: \| \(size_t\)[A-Za-z_]\w*)* ?\) "
                      r"& 15\) == 0\)")
_CONDITIONAL = frozenset({"conditional_expression", "if_statement", "else_clause", "compound_statement",
                          "for_statement"})


@dataclass(frozen=True)
class _Site:
    function: cp.Function
    column: str  # c
    kind: str  # c's type, `const` left out
    cols: str
    guard: Node
    last: Node  # the kernel's last statement: the end of what the else branch keeps
    returns: bool  # the `if (c >= cols) return;` form
    work: tuple[Node, ...]  # the guarded statements
    once: frozenset[int]  # ids of the work's declarations that run once, not per component
    renamed: frozenset[str]  # the work's per-component locals
    vectors: dict[int, str]  # id of a subscript read as a vector -> the vector's name
    loads: dict[int, tuple[tuple[str, str, str, str], ...]]  # statement id -> (name, array, vector type, offset)
    stores: dict[int, tuple[str, str, str, Node]]  # statement id -> (array, vector type, offset, value)
    aligned: tuple[str, ...]  # the arrays moved as vectors
    vector: str  # c4


class ScalarizeColumnVectors(Transform):
    name = "scalarize_column_vectors"
    intent = ("Give each thread of a thread-per-column kernel (a bias gradient, a column maximum) four adjacent "
              "columns, reading and writing them row by row as 16-byte vectors where cols % 4 == 0 and the pointers "
              "are aligned; the kernel as written elsewhere.")
    # the vector type forward adds (float4, or int4/uint4): cards that move 16-byte vectors propose these sites too
    removes = ("vector_type_float4", "vector_type_int4")
    placement = Placement.ANALYSIS
    kin = ("scalarize_elementwise", "devectorize", "scalarize_grid_stride")  # the same 16-byte vectors

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", column, parsed.text(function.node)[:200])
                for function, (column, _) in readable(parsed, lambda f: _restored(parsed, f))]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        state = canonical(plain_reads(state))  # `__ldg(&a[k])` is the read `a[k]`; the index in its one spelling
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", site.column, parsed.text(site.guard)[:200])
                for function, site in readable(parsed, lambda f: _site(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = canonical(plain_reads(state))
        parsed = cp.parse(state.source)
        site = _site(state, parsed, kernel(parsed, anchor))
        if site.column != anchor.key:
            raise NotApplicable(f"{anchor}: the column index is '{site.column}'")
        source = _vectorized(parsed, site)
        undone = cp.parse(source)
        if _restored(undone, kernel(undone, anchor))[1] != state.source:  # the layout backward could not restore
            raise NotApplicable(f"{anchor}: the guarded work's layout would not come back as written")
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"width": WIDTH},
                            note=f"{site.function.name}: each thread owns {WIDTH} columns, moving "
                                 f"{', '.join(site.aligned)} as 16-byte vectors; one column a thread where cols % "
                                 f"{WIDTH} != 0 or a pointer is misaligned")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        column, source = _restored(parsed, kernel(parsed, anchor))
        if column != anchor.key:
            raise NotApplicable(f"{anchor}: the column index is '{column}'")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{anchor.function}: each thread owns one column")


def _guard(parsed: cp.ParsedSource, statement: Node) -> tuple[str, str, bool] | None:
    """(c, cols, the `return` form) of `if (c < cols) ...` without else or `if (c >= cols) return;`, else None."""
    if statement.type != "if_statement":
        return None
    condition = squash(parsed.text(statement.child_by_field_name("condition")))
    consequence = squash(parsed.text(statement.child_by_field_name("consequence")))
    if statement.child_by_field_name("alternative") is not None:
        return None
    if found := re.fullmatch(r"\( ?([A-Za-z_]\w*) < ([A-Za-z_]\w*) ?\)", condition):
        return found[1], found[2], False
    found = re.fullmatch(r"\( ?([A-Za-z_]\w*) >= ([A-Za-z_]\w*) ?\)", condition)
    return (found[1], found[2], True) if found and consequence in ("return;", "{ return; }") else None


def _site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> _Site:
    """The thread-per-column work forward vectorizes in `function`, or NotApplicable with the reason."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    listed = statements(body)
    guards = [(at, found) for at, s in enumerate(listed) if (found := _guard(parsed, s))]
    if len(guards) != 1:
        raise NotApplicable(f"{function.name} has {'no' if not guards else 'more than one'} column guard "
                            f"`if (c < cols)` or `if (c >= cols) return;` at its top level")
    at, (column, cols, returns) = guards[0]
    guard = listed[at]
    if not returns and at != len(listed) - 1:
        raise NotApplicable(f"{function.name} runs statements after its column guard")
    work = tuple(listed[at + 1:] if returns else statements(guard.child_by_field_name("consequence")))
    _launch(state, function.name)
    scalars = {name: kind for name, kind, pointer in parameters(parsed, function) if not pointer}
    pointers = {name: kind.removeprefix("const ").strip() for name, kind, pointer in parameters(parsed, function)
                if pointer}
    written = {parsed.text(n) for n in cp.nodes_of_type(body, "identifier") if is_written(n)}
    if not re.fullmatch(rf"(?:const )?(?:{LOOP_INDEX_TYPES})", scalars.get(cols, "")) or cols in written:
        raise NotApplicable(f"{function.name}'s row length '{cols}' is no integer parameter it never assigns")
    kind = _column(parsed, function, listed[:at], column, written)
    if column in written:
        raise NotApplicable(f"{function.name} assigns its column '{column}'")
    if not work:
        raise NotApplicable(f"{function.name} guards no work")
    text = "\n".join(_code(parsed, statement) for statement in work)
    if found := _FORBIDDEN.search(text):
        raise NotApplicable(f"{function.name}'s work synchronizes, jumps, makes an atomic or names the grid's x "
                            f"coordinates but through its column (`{found[0]}`)")
    for statement in work:
        if (called := first_effect(parsed, statement, MATH_CALLS)) is not None:
            raise NotApplicable(f"{function.name}'s work calls {called}, which may have effects")
        if cp.nodes_of_type(statement, "pointer_expression") or "->" in _code(parsed, statement):
            raise NotApplicable(f"{function.name}'s work dereferences or takes the address of a pointer expression")
    loops = [n for s in work for n in cp.nodes_of_type(s, "for_statement")]
    if any(loop not in work for loop in loops):
        raise NotApplicable(f"{function.name}'s work nests a loop, or runs one under a condition")
    for node in cp.nodes_of_type(body, "identifier"):
        parent = node.parent
        if parsed.text(node) in pointers and (parent.type != "subscript_expression" or
                                              parent.child_by_field_name("argument") != node or is_written(node)):
            raise NotApplicable(f"{function.name} uses the pointer '{parsed.text(node)}' other than as an array")
    once, per = _once(parsed, function, work, written, column, set(pointers))
    _declarations(parsed, function, per)
    headers = [loop.child_by_field_name(f) for loop in loops for f in ("initializer", "condition", "update")]
    assigned = {parsed.text(n) for s in work for n in cp.nodes_of_type(s, "identifier") if is_written(n)
                and not any(h is not None and h.start_byte <= n.start_byte < h.end_byte for h in headers)}
    if outside := sorted(assigned - per):
        raise NotApplicable(f"{function.name}'s work assigns '{outside[0]}', no local of its own")
    vectors, loads, stores, aligned = _accesses(parsed, function, work, column, cols, pointers, per | {column})
    if not any(_offset(parsed, function, n, column, cols, per | {column}) for loop in loops
               for n in cp.nodes_of_type(loop.child_by_field_name("body"), "subscript_expression")):
        raise NotApplicable(f"{function.name} walks no rows: no loop touches `[E * {cols} + {column}]` (one element "
                            f"a thread is scalarize_elementwise's)")
    named = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier")}
    new = [f"{column}4", *(f"{name}_{k}" for name in sorted(per) for k in COMPONENTS), *vectors.values()]
    if clash := sorted(set(new) & named):
        raise NotApplicable(f"{function.name} names '{clash[0]}', which the vector form declares")
    return _Site(function, column, kind, cols, guard, listed[-1], returns, work, once, frozenset(per), vectors, loads,
                 stores, aligned, f"{column}4")


def _code(parsed: cp.ParsedSource, node: Node) -> str:
    """`node`'s text without its comments (a comment saying "do" or "return" is no loop or exit)."""
    return splice(parsed.data[node.start_byte:node.end_byte],
                  [(c.start_byte - node.start_byte, c.end_byte - node.start_byte, " ")
                   for c in cp.nodes_of_type(node, "comment")])[0].decode("utf-8")


def _launch(state: KernelState, entry: str) -> None:
    """NotApplicable unless the plan launches `entry`, each time with a 1-D block and no buffer passed twice."""
    launches = [launch for launch in state.plan.launches if launch.entry == entry]
    if not launches:
        raise NotApplicable(f"the plan never launches {entry}")
    for launch in launches:
        if any(str(d).strip() != "1" for d in launch.block[1:]):
            raise NotApplicable(f"{entry}'s launch has a block of more than one dimension")
        buffers = [arg.name for arg in launch.args if arg.kind is ArgKind.BUFFER]
        if len(buffers) != len(set(buffers)):
            raise NotApplicable(f"{entry}'s launch passes one buffer twice")


def _column(parsed: cp.ParsedSource, function: cp.Function, before: list[Node], column: str, written: set[str]) -> str:
    """The type of the column index declared before the guard as the global index along x; NotApplicable unless
    every other statement there declares, once for every column, locals never assigned of values that read no
    memory and name no column."""
    kind = None
    for statement in before:
        found = re.fullmatch(rf"(?:const )?({LOOP_INDEX_TYPES}) {re.escape(column)} = (.+);",
                             squash(parsed.text(statement)))
        if statement.type == "declaration" and found:
            if not GLOBAL_INDEX.fullmatch(uncast_grid(found[2])):
                break
            kind = found[1]
        elif statement.type != "declaration" or set(declared_names(parsed, statement)) & written or \
                cp.nodes_of_type(statement, "subscript_expression") or \
                re.search(rf"\b{re.escape(column)}\b|\b(?:threadIdx|blockIdx|blockDim|gridDim)\.x\b",
                          parsed.text(statement)) or first_effect(parsed, statement, MATH_CALLS - {"__ldg"}):
            raise NotApplicable(f"{function.name} runs `{squash(parsed.text(statement))[:60]}` before its guard")
    if kind is None:
        raise NotApplicable(f"{function.name}'s column '{column}' is not declared as the global thread index "
                            f"`blockIdx.x * blockDim.x + threadIdx.x`")
    return kind


def _declarations(parsed: cp.ParsedSource, function: cp.Function, per: set[str]) -> None:
    """NotApplicable unless each per-component local is declared once in the kernel, before any use of its name
    (renaming it per component then renames what it names, and only that)."""
    everywhere = declared_names(parsed, function.node)
    uses = {}
    for node in cp.nodes_of_type(function.node, "identifier"):
        uses.setdefault(parsed.text(node), node)
    for name in sorted(per):
        if everywhere.count(name) != 1 or uses[name].parent.type not in ("init_declarator", "declaration"):
            raise NotApplicable(f"{function.name} declares or uses its local '{name}' elsewhere too")


def _free(parsed: cp.ParsedSource, node: Node, names: set[str], skip: set[str] = frozenset()) -> bool:
    """`node` reads no memory and names none of `names` (but those of `skip`)."""
    return not cp.nodes_of_type(node, "subscript_expression") and not any(
        parsed.text(n) in names - skip for n in cp.nodes_of_type(node, "identifier"))


def _once(parsed: cp.ParsedSource, function: cp.Function, work: tuple[Node, ...], written: set[str], column: str,
          pointers: set[str]) -> tuple[frozenset[int], set[str]]:
    """(ids of the declarations and loop headers that run once, the locals each component has its own of);
    NotApplicable where a loop's header names a column, memory or a per-component local, or its body assigns its
    index. A declaration runs once where it names none of those and is never assigned."""
    per, once = set(), set()
    top = [s for statement in work for s in ([statement] if statement.type != "for_statement" else
                                             [statement, *statements(statement.child_by_field_name("body"))])]
    for statement in top:
        if statement.type == "for_statement":
            header = statement.child_by_field_name("initializer")
            indexes = set(declared_names(parsed, header)) if header is not None and header.type == "declaration" \
                else set()
            stepped = {parsed.text(n) for n in cp.nodes_of_type(statement.child_by_field_name("body"), "identifier")
                       if is_written(n)}
            parts = [statement.child_by_field_name(f) for f in ("initializer", "condition", "update")]
            if not indexes or stepped & indexes or \
                    not all(p is None or _free(parsed, p, per | pointers | {column}) for p in parts):
                raise NotApplicable(f"{function.name}'s loop header `{squash(parsed.text(header or statement))}` "
                                    f"is no index declared and stepped once for every column")
            once.add(header.id)
        elif statement.type == "declaration":
            names = set(declared_names(parsed, statement))
            if not names & written and _free(parsed, statement, per | pointers | {column}, names):
                once.add(statement.id)
            else:
                per |= names
    for statement in work:  # and the locals of nested blocks, each component's own
        for declaration in cp.nodes_of_type(statement, "declaration"):
            if declaration.id not in once:
                per |= set(declared_names(parsed, declaration))
    return frozenset(once), per


def _accesses(parsed: cp.ParsedSource, function: cp.Function, work: tuple[Node, ...], column: str, cols: str,
              pointers: dict[str, str], names: set[str]):
    """(vectors, loads, stores, aligned) of `_Site`, once every access of memory is one at a column."""
    subscripts = [n for s in work for n in cp.nodes_of_type(s, "subscript_expression")]
    stored = {parsed.text(n.child_by_field_name("argument")) for n in subscripts if is_written(n)}
    vectors, loads, stores, aligned, named = {}, {}, {}, {}, {}
    tops = [s for statement in work for s in ([statement] if statement.type != "for_statement" else
                                              statements(statement.child_by_field_name("body")))]
    for statement in tops:
        for node in cp.nodes_of_type(statement, "subscript_expression"):
            array = parsed.text(node.child_by_field_name("argument"))
            if array not in pointers:
                raise NotApplicable(f"{function.name} subscripts `{parsed.text(node)}`, no pointer parameter")
            offset = _offset(parsed, function, node, column, cols, names)
            vector = VECTORS.get(pointers[array])
            if vector is None:
                continue  # a 64-bit array, say: each component's element on its own
            if is_written(node):
                if _plain_store(statement, node):
                    stores[statement.id] = (array, vector, offset, statement.named_children[0].child_by_field_name(
                        "right"))
                    aligned[array] = True
                continue
            if array in stored or not _unconditional(node, statement):
                continue
            key = (statement.parent.id, array, offset)  # one load a scope for each row of an array
            if key not in named:
                count = sum(1 for other in named if other[1] == array)
                named[key] = f"{array}{WIDTH}" + (f"_{count}" if count else "")
                loads.setdefault(statement.id, []).append((named[key], array, vector, offset))
            vectors[node.id] = named[key]
            aligned[array] = True
    if not aligned:
        raise NotApplicable(f"{function.name} moves no float, int or unsigned array as 16-byte vectors")
    return vectors, {k: tuple(v) for k, v in loads.items()}, stores, tuple(aligned)


def _offset(parsed: cp.ParsedSource, function: cp.Function, subscript: Node, column: str, cols: str,
            names: set[str]) -> str:
    """E of `a[E * cols + c]` as written ('' for `a[c]`), or NotApplicable."""
    place = subscript.child_by_field_name("indices")
    if place.type == "subscript_argument_list" and place.named_child_count == 1:
        place = place.named_children[0]
    place = unparen(place)
    if place.type == "identifier" and parsed.text(place) == column:
        return ""
    if place.type == "binary_expression" and operator(place) == "+":
        product, last = (unparen(place.child_by_field_name(side)) for side in ("left", "right"))
        if parsed.text(last) == column and product.type == "binary_expression" and operator(product) == "*" and \
                parsed.text(unparen(product.child_by_field_name("right"))) == cols:
            row = product.child_by_field_name("left")
            if _free(parsed, row, names) and not cp.nodes_of_type(row, "assignment_expression") and \
                    not cp.nodes_of_type(row, "update_expression"):
                return parsed.text(row)
    raise NotApplicable(f"{function.name} touches `{parsed.text(subscript)}`, not `[E * {cols} + {column}]` or "
                        f"`[{column}]` with E naming no column")


def _plain_store(statement: Node, subscript: Node) -> bool:
    """`statement` is `a[...] = e;`, the subscript its target, e assigning nothing."""
    expression = unparen(statement.named_children[0]) if statement.type == "expression_statement" and \
        statement.named_children else None
    return expression is not None and expression.type == "assignment_expression" and \
        operator(expression) == "=" and unparen(expression.child_by_field_name("left")) == subscript and \
        not cp.nodes_of_type(expression.child_by_field_name("right"), "assignment_expression") and \
        not cp.nodes_of_type(expression.child_by_field_name("right"), "update_expression")


def _unconditional(node: Node, statement: Node) -> bool:
    """`statement` always evaluates `node`: no condition, branch or `&&`/`||` right side stands between them."""
    while node.parent is not None and node.parent != statement:
        parent = node.parent
        if parent.type in _CONDITIONAL or parent.type == "binary_expression" and operator(parent) in ("&&", "||") \
                and parent.child_by_field_name("right") == node:
            return False
        node = parent
    return True


def _vectorized(parsed: cp.ParsedSource, site: _Site) -> str:
    """The kernel's source in the vector form."""
    data = parsed.data
    indent = indentation(data, site.guard.start_byte)
    inner, v = indent + "    ", site.vector
    lines = [f"if ({site.cols} % {WIDTH} == 0 && (({' | '.join(f'(size_t){a}' for a in site.aligned)}) & 15) == 0) {{",
             f"{inner}const {site.kind} {v} = {site.column};  // columns {WIDTH} * {v} .. {WIDTH} * {v} + {WIDTH - 1}",
             f"{inner}if ({v} < {site.cols} / {WIDTH}) {{",
             *_scope(parsed, site, site.work, inner + "    "),
             f"{inner}}}"]
    original = data[site.guard.start_byte:site.last.end_byte].decode("utf-8")
    if site.returns:
        lines += [f"{indent}}} else {{", reindent(original, len(indent), inner), f"{indent}}}"]
    else:
        lines.append(f"{indent}}} else {original}")
    return splice(data, [(site.guard.start_byte, site.last.end_byte, "\n".join(lines))])[0].decode("utf-8")


def _scope(parsed: cp.ParsedSource, site: _Site, listed: list[Node] | tuple[Node, ...], indent: str) -> list[str]:
    """The lines of a scope's statements on the vector path: a loop's header once, its body a scope."""
    data, lines = parsed.data, []
    for statement in listed:
        column = len(indentation(data, statement.start_byte))
        if statement.type == "for_statement":
            body = statement.child_by_field_name("body")
            head = reindent(data[statement.start_byte:body.start_byte].decode("utf-8").rstrip(), column, indent)
            lines += [f"{head} {{", *_scope(parsed, site, statements(body), indent + "    "), f"{indent}}}"]
        elif statement.id in site.once:
            lines.append(reindent(parsed.text(statement), column, indent))
        else:
            for name, array, vector, offset in site.loads.get(statement.id, ()):
                lines.append(f"{indent}const {vector} {name} = reinterpret_cast<const {vector}*>"
                             f"({_base(array, offset, site.cols)})[{site.vector}];")
            if statement.id in site.stores:
                array, vector, offset, value = site.stores[statement.id]
                values = [_component(parsed, site, value, k) for k in range(WIDTH)]
                store = f"{indent}reinterpret_cast<{vector}*>({_base(array, offset, site.cols)})[{site.vector}] = "
                if len(store) + len(f"make_{vector}();") + sum(len(v) + 2 for v in values) - 2 <= 120:
                    lines.append(f"{store}make_{vector}({', '.join(values)});")
                else:  # a value a line
                    lines += [f"{store}make_{vector}(", *(f"{indent}    {v}," for v in values[:-1]),
                              f"{indent}    {values[-1]});"]
            else:
                lines += [reindent(_component(parsed, site, statement, k), column, indent) for k in range(WIDTH)]
    return lines


def _base(array: str, offset: str, cols: str) -> str:
    return f"{array} + {offset} * {cols}" if offset else array


def _component(parsed: cp.ParsedSource, site: _Site, node: Node, k: int) -> str:
    """`node`'s text for component k: a vector read as its lane, c as the component's column, a per-component
    local as its own."""
    base = node.start_byte
    lanes = [n for n in cp.nodes_of_type(node, "subscript_expression") if n.id in site.vectors]
    edits = [(n.start_byte - base, n.end_byte - base, f"{site.vectors[n.id]}.{COMPONENTS[k]}") for n in lanes]
    for name in cp.nodes_of_type(node, "identifier"):
        if any(n.start_byte <= name.start_byte < n.end_byte for n in lanes):
            continue
        if parsed.text(name) == site.column:
            edits.append((name.start_byte - base, name.end_byte - base,
                          f"({WIDTH} * {site.vector} + {k})" if k else f"({WIDTH} * {site.vector})"))
        elif parsed.text(name) in site.renamed:
            edits.append((name.start_byte - base, name.end_byte - base, f"{parsed.text(name)}_{COMPONENTS[k]}"))
    return splice(parsed.data[base:node.end_byte], edits)[0].decode("utf-8")


def _restored(parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, str]:
    """(the column index, the source with the kernel's vector form replaced by its else branch, reindented back)."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    data = parsed.data
    for statement in statements(body):
        if statement.type != "if_statement" or not _ALIGNED.fullmatch(
                squash(parsed.text(statement.child_by_field_name("condition")))):
            continue
        consequence, alternative = (statement.child_by_field_name(f) for f in ("consequence", "alternative"))
        inside = statements(consequence)
        first = re.fullmatch(r"const [\w ]+ [A-Za-z_]\w* = ([A-Za-z_]\w*);", squash(parsed.text(inside[0])))
        kept = alternative.named_children[0] if alternative is not None and alternative.named_children else None
        if first is None or kept is None or kept.type not in ("if_statement", "compound_statement") or \
                not kept.named_children:
            continue
        indent = indentation(data, statement.start_byte)
        if kept.type == "if_statement":
            text, guard = parsed.text(kept), kept
        else:
            text = data[kept.named_children[0].start_byte:kept.named_children[-1].end_byte].decode("utf-8")
            text, guard = reindent(text, len(indent) + 4, indent)[len(indent):], statements(kept)[0]
        found = _guard(parsed, guard)
        if found is not None and found[0] == first[1] and found[2] == (kept.type == "compound_statement"):
            return found[0], splice(data, [(statement.start_byte, statement.end_byte, text)])[0].decode("utf-8")
    raise NotApplicable(f"{function.name} has no column vectors beside its thread-per-column work")


register(ScalarizeColumnVectors())
