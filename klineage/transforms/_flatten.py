"""Elementwise kernels people write in other shapes than one thread per element, read as that form (`int i =
blockIdx.x * blockDim.x + threadIdx.x; if (i < n) <work>` on a 1-D launch), which the elementwise forwards read.

A matrix's elementwise kernel (a bias add, a masked fill, a per-row scale) is often written on a 2-D launch, in one
of two spellings:

    int col = blockIdx.x * blockDim.x + threadIdx.x;       int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;                                  int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (col < cols) <work>                                 if (row < rows && col < cols) <work>
    (grid (cdiv(cols, B), rows), block B)                  (grid (cdiv(cols, Bx), cdiv(rows, By)), block (Bx, By))

with the declarations in either order (locals declared between or after them, before the guard, read inside the
guard: `_guard_first`; an NCHW kernel's channel along y and image along z joined into one row first: `_layers`),
the indexes 32-bit or 64-bit (`size_t col = ...`, as `_canonical` spells
them), the guard's bounds in either order and its counts maybe cast to the indexes' width (`col < (size_t)cols`: the
same bound wherever the kernel is correct), or the guard as `if (col >= cols) return;` (`if (row >= rows || col >=
cols) return;`) and the work after it. In the first spelling the column's bound may be a product of counts (`i < T
* D`: a batch's elements on x, the batch on y), its element `b * (T * D) + i` however grouped or ordered (compared
as polynomials, `_polynomials.py`). The first spelling may take its row from grid z instead (`int b =
blockIdx.z;`, a batch on a grid one block high), or from grid x where the column's blocks run along y (`int b =
blockIdx.x; int col = threadIdx.x + blockIdx.y * blockDim.x;`), and may bound its row too where the bound is the
grid's extent along the row's axis (`if (t < tokens && d < dim)` on a grid `tokens` blocks high: true in every
block). `flattened` rewrites such a kernel as

    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        int row = i / cols;
        int col = i % cols;
        <work, each subscript `row * cols + col` written `i`>
    }

on a 1-D launch of the same threads per block, cdiv(R * C, threads) blocks (R and C what the launch passes for
`rows` and `cols`). Every (row, col) the 2-D launch guarded in is visited once, with the same row and col, so the
work computes what it did. Legal only where the work cannot tell the launches apart: it names no thread coordinate,
block size, barrier, shared memory, warp collective, loop or early exit (the same list as `_naive`'s element work)
and never assigns row or col. In the first spelling the 1-D bound needs the row count, the grid's y extent: the
scalar parameter every launch passes it as, or, where the kernel takes none (nothing bounded y), a last parameter
`int grid_y` (`grid_z`) it is given and every launch passes the extent as (one extent for all its launches); the
block must be one row high. The index is 64-bit (`long long`) where the kernel names a 64-bit type (its author sized
it for large matrices), else `int`, whose `rows * cols` wraps where the kernel's own `row * cols + col` did. A
subscript with an integer cast on its row or product (`(size_t)row * cols + col`, `static_cast<int64_t>(row) * cols
+ col`) is the element too.

A kernel that is one grid-stride loop over elements (`for (int i = <global index>; i < n; i += blockDim.x *
gridDim.x) <work>`, the stride maybe declared first) becomes `if (i < n) <work>` on cdiv(n, threads) blocks: the loop
visits every element below n once whatever the grid, and so does one thread per element. The work may not name the
grid, a thread coordinate, a barrier, a collective or a jump, nor change the index; n names scalar parameters only.
The loop spelled `int i = <global index>; while (i < n) { <work> i += blockDim.x * gridDim.x; }` is the same loop
where the index is declared before it (only the stride's declaration may stand between), the step is the body's
last statement and the only write of the index (the work may not `continue` past it), and the loop ends the kernel
(nothing reads the index after it).

A row kernel launched as blocks of one thread (`<<<rows, 1>>>`, its row `blockIdx.x`, which a kernel that uses it
as it is gets named by a local of its own type first: `_rows_named`) becomes one thread per row,
`if (row < rows) { <the rest> }` on blocks of THREADS: with one thread a block nothing but the row told the threads
apart, so the rest may loop (a row's work) but may not name a coordinate, the grid, a barrier, shared memory or a
collective; rows is the scalar parameter every launch passes its grid as (given as `int grid_x` where the kernel
takes none, as above). So is a row kernel on wider blocks whose first thread alone works: `if (threadIdx.x != 0)
return;` (or `> 0`) before or after the row's declaration, or the rest of the kernel (the row's declaration too) as
`if (threadIdx.x == 0) { ... }`; after the row's declaration that guard may bound the row by the grid's extent as
well (`threadIdx.x == 0 && row < rows`, `threadIdx.x != 0 || row >= rows` returning, either order), which the flat
form's own guard is; the other threads of the block do nothing, and the launch's block is 1-D, so the working
threads are one a block.

A kernel one thread of the whole launch runs (a whole reduction to one value, `*out = total;`) is one row: its body
names no thread, block or grid and the plan launches one thread (`<<<1, 1>>>`), or its work is the first thread's of
the first block (`if (threadIdx.x == 0 && blockIdx.x == 0) { ... }`, either order, or `int i = <global index>; if
(i == 0) { ... }`, or the others returning first: `if (threadIdx.x != 0 || blockIdx.x != 0) return;`) on a 1-D
launch. It becomes `int row = <global index>; if (row < 1) { <the work> }` on one block
of one warp (Shape.ONE_THREAD), each `*p` of a pointer parameter written `p[0]`; the work may loop but may not name
a coordinate, the grid, a barrier, shared memory or a collective (no other thread ever ran it), nor move the index.
The row readers then give the row a warp, or split its loop into chunks over the GPU (unsplit_reduction).

A grid-stride loop over rows (`for (int row = <global index>; row < rows; row += blockDim.x * gridDim.x) { <a row's
work> }`, either spelling) is read as the loop over elements is, one thread per row on cdiv(rows, threads) blocks,
where the reader asks for rows (Shape.GRID_STRIDE_ROWS): the loop visits every row below rows once whatever the grid,
whatever the work does with it, so its work may loop (over the row's columns). It may not name a coordinate, the
grid, a barrier, shared memory, a collective or a jump (a `return` or `break` would end the thread's later rows too),
nor change the row.

A 2-D launch of either spelling above whose threads each do a row's work (a (B, T, D) tensor's rows, `int b =
blockIdx.y; int t = <index along x>; if (t < T) { for (d ...) ... x[(b * T + t) * D + d] ... }`) is read as one
thread per row of the B * T, where the reader asks for rows (Shape.MATRIX_ROWS): the matrix's flattening, its work
allowed to loop and return (one thread's own), still naming no coordinate, barrier, shared memory or collective; the
element is the flat index inside parentheses too, and a row or column no longer named is not declared.

serialize_reduction, serialize_column_reduction and unsplit_reduction read these row shapes (then give the row a
warp, or its loop chunks); the elementwise forwards, whose element work never loops, ask for neither the grid-stride
one nor the lone thread nor a batch's rows.

The forwards then read the work as they read any 1-D kernel: scalarize_row_gather packs a row's columns
(`bias[col]` once per 16 bytes), scalarize_elementwise packs `[i]` and gathers the rest, uncoarsen_grid_stride
strides a flat matrix's elements (a grid-stride loop is its own form, which it leaves alone). Anything else is left
as written; where a kernel looked like one of these shapes (it names `blockIdx.y` or `gridDim`), why it was not
read is noted for `library fit` (`refusals`).

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import Arg, ArgKind, Launch
from klineage.transforms._calls import first_effect
from klineage.transforms._canonical import INDEX_LOCAL, NARROW, WIDE, canonical, canonical_index
from klineage.transforms._edit import (
    contains,
    declared_names,
    edited,
    fresh_name,
    indentation,
    is_written,
    line_end,
    line_start,
    params,
    reindent,
    splice,
    through_blanks,
    written_names,
)
from klineage.transforms._grid_stride import read_grid_stride, stride_local
from klineage.transforms._layers import layers_joined
from klineage.transforms._naive import (
    FORBIDDEN,
    INTEGER_CAST,
    bound_of,
    bounds_2d,
    grid_extent_parameters,
    grid_index,
    launch_scalars,
    launches_of,
    squash,
    statements,
    subscripted,
)
from klineage.transforms._polynomials import Poly, plus, polynomial, product, times, variable
from klineage.transforms.base import NotApplicable, refused, with_plan

_ROW_BLOCK = re.compile(r"(?:const )?((?:unsigned |signed )?(?:int|long long|long|size_t|int64_t|int32_t|"
                        r"uint32_t|unsigned)) ([A-Za-z_]\w*) = blockIdx\.([xyz]);")
# a column index whose blocks run along grid y while the row takes grid x (`int b = blockIdx.x;`): the axes swapped
_COLUMN_ACROSS = re.compile(r"(?:const )?(?:int|long long) ([A-Za-z_]\w*) = (?:blockIdx\.y \* blockDim\.x \+ "
                            r"threadIdx\.x|threadIdx\.x \+ blockIdx\.y \* blockDim\.x);")
_WIDE_TYPES = re.compile(r"\b(?:long|size_t|int64_t|uint64_t|ptrdiff_t)\b")
_BLOCK_ROW = re.compile(r"(?:const )?(int|unsigned|unsigned int|size_t|long long|long|int64_t) ([A-Za-z_]\w*) = "
                        r"blockIdx\.x;")


def _is_zero(name: str) -> str:
    """The conditions people write for `name` (a regex) being 0: `== 0` either way round, `!name`, `< 1`."""
    return rf"(?:{name} == 0|0 == {name}|!{name}|{name} < 1)"


def _not_zero(name: str) -> str:
    """The conditions people write for `name` (a regex, never negative) not being 0."""
    return rf"(?:{name} != 0|0 != {name}|{name} > 0|0 < {name}|{name} >= 1|{name})"


_THREAD = r"threadIdx\.x"
_BOUND = r"[A-Za-z_]\w*|\d+"  # what a row's bound is read as: a name or a number
_PRODUCT = r"[A-Za-z_]\w*(?: \* [A-Za-z_]\w*)*"  # a column bound: a count, or a product of counts (`T * D`)
# a block whose first thread alone goes on: its other threads return, or the rest is that thread's
_OTHERS_RETURN = re.compile(rf"if \({_not_zero(_THREAD)}\) return;")
_FIRST_ONLY = re.compile(_is_zero(_THREAD))
_BLOCK_FORBIDDEN = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim|__syncthreads\w*|__syncwarp|__shared__|"
                              r"__shfl\w*|__ballot\w*|__any_sync|__all_sync|__activemask|__match\w*|__reduce\w*|asm)\b")
# what a grid-stride loop's row work may not hold: what a one-thread block's may not, the grid's group, and a jump
# (a `return` or `break` would end the thread's later rows too, a `continue` skip a `while` loop's step)
_ROW_FORBIDDEN = re.compile(rf"{_BLOCK_FORBIDDEN.pattern}|\b(?:goto|break|continue|return|this_grid|grid_group)\b")
THREADS = 256  # the threads per block of a kernel read as one thread per row
LONE_BLOCK = 32  # the threads per block of a kernel one thread runs, read as one row: the fewest a warp form takes
_NAMES = ("i", "idx", "element", "flat_index")  # the 1-D index: the first the kernel does not name already


@dataclass(frozen=True)
class _Matrix:
    column: str
    row: str
    row_type: str
    columns: str  # N, a kernel parameter or expression
    rows: str  # M, a kernel scalar parameter
    work: tuple[Node, ...]
    tiled: bool  # the row is blockIdx.y * blockDim.y + threadIdx.y (else blockIdx.y or blockIdx.z alone)
    of_rows: bool = False  # each thread's work a row's, which may loop (Shape.MATRIX_ROWS)
    dimensions: int = 2  # 3 where the row is blockIdx.z (on a grid one block high)


class Shape(Enum):
    MATRIX = "matrix"  # a 2-D launch over a matrix's elements
    MATRIX_ROWS = "matrix_rows"  # the same launch over a batch's rows (`(b, t)` of a (B, T, D) tensor): may loop
    GRID_STRIDE = "grid_stride"  # one grid-stride loop over elements
    GRID_STRIDE_ROWS = "grid_stride_rows"  # the same loop over rows: its work a row's, which may loop
    ONE_THREAD_BLOCKS = "one_thread_blocks"  # a block of one thread per row (`<<<rows, 1>>>`, `row = blockIdx.x`)
    ONE_THREAD = "one_thread"  # one thread of the whole grid does all the work (`<<<1, 1>>>`, or thread 0 alone)


# what the elementwise forwards read: no loop in an element, and more than one element
ELEMENTS = frozenset(Shape) - {Shape.GRID_STRIDE_ROWS, Shape.MATRIX_ROWS, Shape.ONE_THREAD}


def flattened(state: KernelState, shapes: frozenset[Shape] = ELEMENTS) -> KernelState:
    """`state` with every kernel of one of `shapes` (see the module's docstring) in the 1-D form of one thread per
    element or row; the same state when there is none. The grid-stride forward reads matrices only: a grid-stride
    loop is its own form, which it does not stride again."""
    state = _rows_named(state) if Shape.ONE_THREAD_BLOCKS in shapes else state
    parsed = cp.parse(state.source)
    edits, flat = [], state
    for function in cp.functions(parsed):
        body = function.node.child_by_field_name("body")
        if not function.is_kernel or body is None:
            continue
        shape = _shape(parsed, body)
        if shape is Shape.GRID_STRIDE and Shape.GRID_STRIDE_ROWS in shapes:
            shape = Shape.GRID_STRIDE_ROWS  # read as rows: the one loop it looks like may hold loops
        elif shape is Shape.MATRIX and Shape.MATRIX_ROWS in shapes:
            shape = Shape.MATRIX_ROWS  # read as rows: each (row, column) of the launch a row of its own
        if shape not in shapes:
            continue
        try:
            if shape is Shape.ONE_THREAD_BLOCKS:
                text, launches = _threaded(flat, parsed, function)
            elif shape is Shape.ONE_THREAD:
                text, launches = _alone(flat, parsed, function)
            elif shape in (Shape.GRID_STRIDE, Shape.GRID_STRIDE_ROWS):
                text, launches = _destrided(flat, parsed, function, rows=shape is Shape.GRID_STRIDE_ROWS)
            else:
                if shape is Shape.MATRIX and "blockIdx.z" in parsed.text(body) and \
                        (joined := _joined_flat(state, parsed, function, shapes)) is not None:
                    return joined
                guarded, kernel = _guard_first(parsed, function)
                matrix = _matrix(state, guarded, kernel, of_rows=shape is Shape.MATRIX_ROWS)
                text = _rewrite(guarded, kernel, matrix)
                launches = _element_launches(flat, parsed, function, f"{matrix.rows} * {_grouped(matrix.columns)}",
                                             matrix.dimensions)
            flat = KernelState(source=flat.source, plan=with_plan(flat, launches=launches))
        except NoExtentParameter as missing:  # the grid carried the row count: the kernel takes it, and is read again
            try:
                return flattened(with_extent_parameter(state, parsed, function, missing), shapes)
            except NotApplicable as error:
                refused(function, error)
                continue
        except NotApplicable as error:
            # say why not where it looked like a matrix
            if shape not in (Shape.MATRIX, Shape.MATRIX_ROWS) or re.search(r"blockIdx\.[yz]", parsed.text(body)):
                refused(function, error)
            continue
        listed = statements(body)
        edits.append((listed[0].start_byte, listed[-1].end_byte, text))
    if not edits:
        return state
    return canonical(KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=flat.plan))


def _rows_named(state: KernelState) -> KernelState:
    """`state` with the row of each kernel that uses `blockIdx.x` itself as its row named by a local (`const
    unsigned int row = blockIdx.x;`, blockIdx.x's own type, so every expression computes what it did): a kernel
    of blocks of one thread (every launch's block is 1), or whose first thread alone works (`if (threadIdx.x != 0)
    return;` first, no other thread coordinate), which names no block size along x and declares no row already."""
    def edits(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[tuple[int, int, str]]:
        listed = statements(body)
        text = parsed.text(body)
        guarded = bool(listed) and _OTHERS_RETURN.fullmatch(squash(parsed.text(listed[0]))) is not None
        rest = listed[1:] if guarded else listed
        uses = [n for s in rest for n in cp.nodes_of_type(s, "field_expression") if parsed.text(n) == "blockIdx.x"]
        if not rest or not uses or re.search(r"\bblockDim\.x\b|\bblockIdx\.[yz]\b", text) or \
                any(_BLOCK_ROW.fullmatch(squash(parsed.text(s))) for s in rest) or \
                len(re.findall(r"\bthreadIdx\b", text)) != int(guarded):
            return []
        try:
            launches = launches_of(state, function.name, dimensions=1)
        except NotApplicable:
            return []
        if not guarded and any(str(launch.block[0]).strip() != "1" for launch in launches):
            return []
        named = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier")}
        row = fresh_name(named, "row")
        first = rest[0]
        return [(first.start_byte, first.start_byte,
                 f"const unsigned int {row} = blockIdx.x;\n{indentation(parsed.data, first.start_byte)}"),
                *((use.start_byte, use.end_byte, row) for use in uses)]

    return edited(state, edits)


def _shape(parsed: cp.ParsedSource, body: Node) -> Shape:
    """The shape a kernel's body looks like (whether it is one is for its reader to say)."""
    across = any(_COLUMN_ACROSS.fullmatch(squash(parsed.text(node))) for node in statements(body)[:2])
    if _block_row(parsed, body) is not None and not across:  # a row from blockIdx.x beside columns along y: a matrix
        return Shape.ONE_THREAD_BLOCKS
    if _lone_thread(parsed, body) is not None:
        return Shape.ONE_THREAD
    return Shape.GRID_STRIDE if "gridDim" in parsed.text(body) else Shape.MATRIX


def _threaded(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, tuple[Launch, ...]]:
    """A kernel launched as blocks of one thread, its row `blockIdx.x` (`<<<rows, 1>>>`), as one thread per row on
    blocks of THREADS: `int row = <global index>; if (row < rows) { <the rest> }` on cdiv(rows, THREADS) blocks, rows
    the scalar parameter every launch passes its grid as. The rest may loop and return (a row's own work), but not
    name a thread or block coordinate, the grid, a barrier, shared memory or a warp collective, nor change the
    row: with one thread a block, none of those meant anything but the row."""
    declaration, rest, first_only, bound = _block_row(parsed, function.node.child_by_field_name("body"))
    kind, row = _BLOCK_ROW.fullmatch(squash(parsed.text(declaration))).groups()
    launches = launches_of(state, function.name, dimensions=1)
    if not first_only and any(str(launch.block[0]).strip() != "1" for launch in launches):
        raise NotApplicable(f"{function.name} takes its row from blockIdx.x on blocks of more than one thread")
    if not rest:
        raise NotApplicable(f"{function.name} does nothing with its row")
    text = parsed.data[rest[0].start_byte:rest[-1].end_byte].decode("utf-8")
    if found := _BLOCK_FORBIDDEN.search(text):
        raise NotApplicable(f"{function.name}'s row work names a thread or block coordinate, the grid, a barrier or "
                            f"a collective (`{found[0]}`)")
    if any(parsed.text(n) == row and is_written(n) for node in rest for n in cp.nodes_of_type(node, "identifier")):
        raise NotApplicable(f"{function.name} changes its row '{row}'")
    rows = grid_extent(state, parsed, function, 0)
    if bound and bound != rows:  # the first thread's guard bounds the row too: by the grid, which the new guard is
        raise NotApplicable(f"{function.name} bounds its row by '{bound}', not by the grid's extent '{rows}'")
    indent = indentation(parsed.data, statements(function.node.child_by_field_name("body"))[0].start_byte)
    work = reindent(text, len(indentation(parsed.data, rest[0].start_byte)), indent + "    ")
    source = f"{kind} {row} = {canonical_index(NARROW)};\n{indent}if ({row} < {rows}) {{\n{work}\n{indent}}}"
    return source, _element_launches(state, parsed, function, rows, 1, THREADS)


def _alone(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, tuple[Launch, ...]]:
    """A kernel one thread of the whole grid runs (see `_lone_thread`) as one thread per row over one row: `int row
    = <global index>; if (row < 1) { <its work> }` on one block of LONE_BLOCK threads, so that the row readers give
    the row a warp, or split its loop over the GPU (each chunk a block, whose other threads cost least in a block of
    one warp). The work may loop and return, but may not name a coordinate, the grid, a barrier, shared memory or a
    collective (the other threads of the launch never ran it), nor change the index where the kernel declared one.
    A scalar output is often written through its pointer (`*out = s;`): each `*p` of a pointer parameter p reads as
    `p[0]`, the same element, as the row readers read an element."""
    guarded, declaration, work = _lone_thread(parsed, function.node.child_by_field_name("body"))
    sizes = [str(size).strip() for launch in launches_of(state, function.name, dimensions=1)
             for size in (launch.grid[0], launch.block[0])]
    if not guarded and sizes != ["1"] * len(sizes):
        raise NotApplicable(f"{function.name} names no thread or block, but is launched on more than one thread")
    if not work:
        raise NotApplicable(f"{function.name}'s one thread does nothing")
    text = subscripted(parsed, function, work)
    if found := _BLOCK_FORBIDDEN.search(text):
        raise NotApplicable(f"{function.name}'s one thread names a thread or block coordinate, the grid, a barrier "
                            f"or a collective (`{found[0]}`)")
    named = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier")}
    if declaration is not None:
        kind, row = INDEX_LOCAL.fullmatch(squash(parsed.text(declaration))).group("type", "name")
        if any(parsed.text(n) == row and is_written(n) for node in work for n in cp.nodes_of_type(node, "identifier")):
            raise NotApplicable(f"{function.name} changes its index '{row}'")
    else:
        kind, row = NARROW, next(n for n in ("row", "lone_row", "one_thread_row") if n not in named)
    indent = indentation(parsed.data, statements(function.node.child_by_field_name("body"))[0].start_byte)
    body = reindent(text, len(indentation(parsed.data, work[0].start_byte)), indent + "    ")
    source = f"{kind} {row} = {canonical_index(kind)};\n{indent}if ({row} < 1) {{\n{body}\n{indent}}}"
    return source, tuple(Launch(launch.entry, (1, 1, 1), (LONE_BLOCK, 1, 1), launch.shared, launch.args)
                         if launch.entry == function.name else launch for launch in state.plan.launches)


def _lone_thread(parsed: cp.ParsedSource, body: Node) -> tuple[bool, Node | None, list[Node]] | None:
    """(whether a guard keeps the other threads out, the global index's declaration or None, the statements one
    thread runs) of a kernel only one thread of the grid works in: its body names no thread, block or grid at all
    (the plan must launch one thread), or it is the first thread of the first block, `if (threadIdx.x == 0 &&
    blockIdx.x == 0) { ... }` (either order), or of the global index, `int i = <global index>; if (i == 0) { ... }`,
    or the others return first (`if (threadIdx.x != 0 || blockIdx.x != 0) return;`, `if (i > 0) return;`); None
    where the body is not read so."""
    listed = statements(body)
    if listed and not _BLOCK_FORBIDDEN.search(parsed.text(body)):
        return False, None, listed
    found = INDEX_LOCAL.fullmatch(squash(parsed.text(listed[0]))) if listed else None
    declaration, rest = (listed[0], listed[1:]) if found else (None, listed)
    guard = rest[0] if rest else None
    if guard is None or guard.type != "if_statement" or guard.child_by_field_name("alternative") is not None:
        return None
    # a bound cast to the index's width (`col < (size_t)cols`) bounds as the count does wherever the kernel is correct
    condition = _uncast(squash(parsed.text(guard.child_by_field_name("condition")))[1:-1]).strip()
    then = statements(guard.child_by_field_name("consequence"))
    if len(rest) == 1 and re.fullmatch(_first_of_grid(found["name"] if found else None, True), condition):
        return True, declaration, then
    if [squash(parsed.text(s)) for s in then] == ["return;"] and \
            re.fullmatch(_first_of_grid(found["name"] if found else None, False), condition):
        return True, declaration, rest[1:]
    return None


def _first_of_grid(index: str | None, first: bool) -> str:
    """The conditions that hold for the grid's first thread alone (`first`: `threadIdx.x == 0 && blockIdx.x == 0`
    either way round, or `i == 0` of the global index `index`), or for every other thread (`threadIdx.x != 0 ||
    blockIdx.x != 0`, `i > 0`)."""
    said = _is_zero if first else _not_zero
    thread, block, join = said(_THREAD), said(r"blockIdx\.x"), "&&" if first else r"\|\|"
    alone = rf"|{said(re.escape(index))}" if index else ""
    return rf"{thread} {join} {block}|{block} {join} {thread}{alone}"


def _block_row(parsed: cp.ParsedSource, body: Node) -> tuple[Node, list[Node], bool, str] | None:
    """A row kernel's row declaration (`int row = blockIdx.x;`), the statements after it, whether the block's
    first thread alone runs them (the others return first, or the rest is under `if (threadIdx.x == 0)`), and the
    bound that guard also holds the row below (`threadIdx.x == 0 && row < rows`, `threadIdx.x != 0 || row >= rows`;
    "" where none); None where the body is not read so."""
    listed, first_only, bound = statements(body), False, ""
    if listed and _OTHERS_RETURN.fullmatch(squash(parsed.text(listed[0]))):
        listed, first_only = listed[1:], True
    elif len(listed) == 1 and (inner := _first_thread_block(parsed, listed[0])) is not None:
        (listed, _), first_only = inner, True
    if not listed or not (declared := _BLOCK_ROW.fullmatch(squash(parsed.text(listed[0])))):
        return None
    declaration, rest, row = listed[0], listed[1:], declared[2]
    if not first_only and rest and (found := _others_return(parsed, rest[0], row)) is not None:
        rest, first_only, bound = rest[1:], True, found
    elif not first_only and len(rest) == 1 and (inner := _first_thread_block(parsed, rest[0], row)) is not None:
        (rest, bound), first_only = inner, True
    return declaration, rest, first_only, bound


def _first_thread_block(parsed: cp.ParsedSource, statement: Node, row: str = "") -> tuple[list[Node], str] | None:
    """(the statements, the row's bound or "") of `if (threadIdx.x == 0) { ... }` (no else), or of `if
    (threadIdx.x == 0 && row < N)` either way round where `row` is given; None for any other statement."""
    if statement.type != "if_statement" or statement.child_by_field_name("alternative") is not None:
        return None
    condition = statement.child_by_field_name("condition")
    said = squash(parsed.text(condition)).strip("()").strip() if condition is not None else ""
    bounded = re.fullmatch(rf"{_FIRST_ONLY.pattern} && {row} < ({_BOUND})|{row} < ({_BOUND}) && {_FIRST_ONLY.pattern}",
                           said) if row else None
    if not _FIRST_ONLY.fullmatch(said) and bounded is None:
        return None
    return statements(statement.child_by_field_name("consequence")), bounded[1] or bounded[2] if bounded else ""


def _others_return(parsed: cp.ParsedSource, statement: Node, row: str) -> str | None:
    """The row's bound ("" where none) of `if (threadIdx.x != 0) return;`, or of `if (threadIdx.x != 0 || row >=
    N) return;` either way round; None for any other statement."""
    said = squash(parsed.text(statement))
    if _OTHERS_RETURN.fullmatch(said):
        return ""
    others = _not_zero(_THREAD)
    bounded = re.fullmatch(rf"if \((?:{others} \|\| {row} >= ({_BOUND})|{row} >= ({_BOUND}) \|\| {others})\) return;",
                           said)
    return (bounded[1] or bounded[2]) if bounded else None


def destrided(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> KernelState:
    """The state with the kernel `function`, one grid-stride loop whose work may loop (a product's outputs, each
    summing its own), as one thread per element (`_destrided`'s reading, with `rows`), its launches made to match;
    only that kernel changes. NotApplicable where it is not so."""
    text, launches = _destrided(state, parsed, function, rows=True)
    listed = statements(function.node.child_by_field_name("body"))
    source = splice(parsed.data, [(listed[0].start_byte, listed[-1].end_byte, text)])[0].decode("utf-8")
    return canonical(KernelState(source=source, plan=with_plan(state, launches=launches)))


def _destrided(state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
               rows: bool = False) -> tuple[str, tuple[Launch, ...]]:
    """A kernel that is one grid-stride loop over elements (`for (int i = <global index>; i < n; i += blockDim.x *
    gridDim.x) <work>`, or its `while` spelling, the stride maybe declared first) as one thread per element:
    `if (i < n) <work>` on cdiv(n, threads) blocks. The loop visits every element below n once, whatever the grid,
    so one thread per element visits the same ones; the work may not name the grid, a thread coordinate, a
    barrier, a collective or a jump (a `continue` would skip a `while` loop's step), nor change the index. With
    `rows`, the loop's elements are rows and the work a row's: it may loop too (`_ROW_FORBIDDEN`)."""
    listed = statements(function.node.child_by_field_name("body"))
    if not listed or listed[-1].type not in ("for_statement", "while_statement"):
        raise NotApplicable(f"{function.name} is not one grid-stride loop over elements")
    loop = read_grid_stride(parsed, function, listed, listed[-1])
    if loop.before and (len(loop.before) > 1 or stride_local(parsed, loop.before[0]) is None):
        raise NotApplicable(f"{function.name} does more than declare its stride before its grid-stride loop")
    kind, index, start = loop.kind, loop.index, loop.start
    bound = bound_of(squash(parsed.text(loop.bound)))
    if bound is None:
        raise NotApplicable(f"{function.name}'s loop is not `{index} < n; {index} += blockDim.x * gridDim.x`: its "
                            f"bound is not a count")
    text = loop.work
    if re.search(rf"\b{re.escape(loop.stride)}\b", text):
        raise NotApplicable(f"{function.name}'s loop body uses its stride '{loop.stride}'")
    if found := (_ROW_FORBIDDEN if rows else FORBIDDEN).search(text):
        raise NotApplicable(f"{function.name}'s loop body {'' if rows else 'loops, '}synchronizes, jumps or names the "
                            f"grid or a thread (`{found[0]}`)")
    if any(parsed.text(n) == index and is_written(n) for n in cp.nodes_of_type(loop.body, "identifier")
           if loop.step is None or not contains(loop.step, n)):
        raise NotApplicable(f"{function.name} changes its element index '{index}' in the loop body")
    indent = indentation(parsed.data, listed[0].start_byte)
    body = reindent(text, len(indentation(parsed.data, listed[-1].start_byte)), indent)[len(indent):]
    source = f"{kind} {index} = {start};\n{indent}if ({index} < {bound}) {body}"
    return source, _element_launches(state, parsed, function, bound, 1)


def _joined_flat(state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                 shapes: frozenset[Shape]) -> KernelState | None:
    """The state flattened once the kernel's layers along y and z are joined into one row (`_layers`), where that
    flattens the kernel; None where it does not (the joined grid, never launched itself, could pass 65,535)."""
    try:
        joined = layers_joined(state, parsed, function)
    except NotApplicable:  # a batch on z alone, say: the 2-D reading says why where it too refuses
        return None
    result = flattened(joined, shapes)
    kernel = next(f for f in cp.functions(cp.parse(result.source)) if f.name == function.name)
    return result if "blockIdx.y" not in cp.parse(result.source).text(kernel.node) else None


def _guard_first(parsed: cp.ParsedSource, function: cp.Function) -> tuple[cp.ParsedSource, cp.Function]:
    """The source (reparsed, and the kernel in it) with the locals a 2-D kernel declares between its two indexes and
    its guard (`int h = bh % H;`, `float s = scale[row];`) moved inside the guard, where `_matrix` reads the work:
    they call nothing with an effect and the guard does not name them, so a thread the guard keeps computes them
    as before and one it leaves out never used them. The same source where the kernel has no such locals."""
    listed = statements(function.node.child_by_field_name("body"))
    at = next((n for n, node in enumerate(listed) if node.type != "declaration"), len(listed))
    indexes = [node for node in listed[:at] if _is_index(parsed, node)]
    moved = [node for node in listed[:at] if node not in indexes]
    if len(indexes) != 2 or not moved or at == len(listed) or listed[at].type != "if_statement" or \
            listed[at].child_by_field_name("alternative") is not None:
        return parsed, function
    guard = listed[at]
    names = {name for node in moved for name in declared_names(parsed, node)}
    condition, consequence = guard.child_by_field_name("condition"), guard.child_by_field_name("consequence")
    if names & {parsed.text(n) for node in (condition, *indexes) for n in cp.nodes_of_type(node, "identifier")} or \
            any(first_effect(parsed, node) is not None for node in moved):
        return parsed, function
    indent = indentation(parsed.data, guard.start_byte)
    text = "\n".join(indent + "    " + squash(parsed.text(node)) for node in moved)
    if squash(parsed.text(consequence)) in ("return;", "{ return; }"):  # the work after the guard: they go first
        edits = [(guard.end_byte, guard.end_byte, "\n" + "\n".join(indent + squash(parsed.text(n)) for n in moved))]
    elif consequence.type == "compound_statement":
        edits = [(consequence.start_byte + 1, consequence.start_byte + 1, "\n" + text)]
    else:
        edits = [(consequence.start_byte, consequence.end_byte, f"{{\n{text}\n{indent}    "
                  f"{parsed.text(consequence)}\n{indent}}}")]
    edits += [(line_start(parsed.data, node.start_byte), line_end(parsed.data, node.end_byte), "") for node in moved]
    source = splice(parsed.data, edits)[0]
    reparsed = cp.parse(source.decode("utf-8"))
    return reparsed, next(f for f in cp.functions(reparsed) if f.name == function.name)


def _is_index(parsed: cp.ParsedSource, node: Node) -> bool:
    """`node` declares one of the indexes `_matrix` reads: a column or row along a grid axis, or a block's row."""
    text = squash(parsed.text(node))
    return bool(grid_index(parsed, node, wide=True)[0] or _ROW_BLOCK.fullmatch(text) or _COLUMN_ACROSS.fullmatch(text))


def _matrix(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, of_rows: bool = False) -> _Matrix:
    """The 2-D launch's indexes, bounds and work; `of_rows`: each thread's work a row's, which may loop."""
    listed = statements(function.node.child_by_field_name("body"))
    if len(listed) < 3:
        raise NotApplicable(f"{function.name} is no 2-D elementwise kernel: two indexes and a guard")
    column = row = row_type = ""
    tiled, row_axis, across = False, "y", False
    for node in listed[:2]:
        axis, name = grid_index(parsed, node, wide=True)  # 64-bit indexes give a 64-bit flat index (below)
        blocks = _ROW_BLOCK.fullmatch(squash(parsed.text(node)))
        swapped = _COLUMN_ACROSS.fullmatch(squash(parsed.text(node)))
        if axis == "x":
            column = name
        elif axis == "y":
            row, row_type, tiled = name, squash(parsed.text(node)).split(f" {name} =")[0], True
        elif swapped:
            column, across = swapped[1], True
        elif blocks:
            row_type, row, row_axis = blocks.groups()
    if not column or not row or across != (row_axis == "x"):
        raise NotApplicable(f"{function.name} does not start with a column index along x and a row along y (or a "
                            f"row from blockIdx.x and the column's blocks along y)")
    guard = listed[2]
    if guard.type != "if_statement" or guard.child_by_field_name("alternative") is not None:
        raise NotApplicable(f"{function.name} has no guard after its indexes")
    # a bound cast to the index's width (`col < (size_t)cols`) bounds as the count does wherever the kernel is correct
    condition = _uncast(squash(parsed.text(guard.child_by_field_name("condition")))[1:-1])
    consequence = guard.child_by_field_name("consequence")
    returns = squash(parsed.text(consequence)) in ("return;", "{ return; }")
    if returns and len(listed) > 3:
        work = tuple(listed[3:])
    elif not returns and len(listed) == 3:
        work = (consequence,)
    else:
        raise NotApplicable(f"{function.name}: the guard neither ends the kernel nor returns")
    dimensions = 3 if row_axis == "z" else 2
    launches = launches_of(state, function.name, dimensions=dimensions)
    if not tiled and any(str(launch.block[1]).strip() != "1" for launch in launches):
        raise NotApplicable(f"{function.name} takes its row from blockIdx.{row_axis} alone on a block more than one "
                            f"row high")
    if row_axis == "z" and any(str(launch.grid[1]).strip() != "1" for launch in launches):
        raise NotApplicable(f"{function.name} takes its row from blockIdx.z on a grid more than one block high")
    relation, joined = (">=", "||") if returns else ("<", "&&")
    if tiled:
        bounds = bounds_2d(condition, row, column, relation, joined)
        if bounds is None:
            raise NotApplicable(f"{function.name}'s guard is not `{row} {relation} M {joined} {column} {relation} N`")
        rows, columns = bounds
    else:
        # the row bounded too (`t < T && d < D`) where T is the grid's extent along the row's axis: always true there
        both = bounds_2d(condition, row, column, relation, joined)
        bound = re.fullmatch(rf"{column} {relation} \(?({_PRODUCT})\)?", condition)
        if bound is None and both is None:
            raise NotApplicable(f"{function.name}'s guard is not `{column} {relation} N`")
        columns, rows = bound[1] if bound else both[1], grid_extent(state, parsed, function, "xyz".index(row_axis))
        written = written_names(parsed, function.node)
        if any(name in written for name in columns.split(" * ")):
            raise NotApplicable(f"{function.name} assigns a count of its bound `{columns}`")
        if both is not None and both[0] != rows:
            raise NotApplicable(f"{function.name}'s guard bounds {row} by {both[0]}, not by the grid's {row_axis} "
                                f"extent {rows}")
    for node in work:
        text = parsed.text(node)
        if found := (_BLOCK_FORBIDDEN if of_rows else FORBIDDEN).search(text):
            said = "synchronizes, shares memory or names a thread coordinate" if of_rows else \
                "loops, synchronizes, returns or names a thread coordinate"
            raise NotApplicable(f"{function.name}'s work {said} (`{found[0]}`)")
        if any(parsed.text(n) in (row, column) and is_written(n) for n in cp.nodes_of_type(node, "identifier")):
            raise NotApplicable(f"{function.name} changes its row or column")
    return _Matrix(column, row, row_type, columns, rows, work, tiled, of_rows, dimensions)


class NoExtentParameter(NotApplicable):
    """No scalar parameter carries the grid's extent along `axis`, which every launch gives as `extent`."""

    def __init__(self, message: str, axis: int, extent: str):
        super().__init__(message)
        self.axis, self.extent = axis, extent


def grid_extent(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, axis: int) -> str:
    """The kernel's scalar parameter every launch passes its grid's extent along `axis` as (`rows` where the grid
    is (..., rows) and `rows` is passed for the parameter `rows`): the row count, which the 1-D bound must name."""
    found, extents = grid_extent_parameters(state, parsed, function, axis)
    if not found:
        message = (f"{function.name} takes no scalar parameter that every launch passes its grid's "
                   f"{'xyz'[axis]} extent as: the row count the 1-D bound needs")
        if len(extents) == 1:
            raise NoExtentParameter(message, axis, extents.pop())
        raise NotApplicable(message)
    return sorted(found)[0]


def with_extent_parameter(state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                           missing: NoExtentParameter) -> KernelState:
    """The kernel given a last parameter `int grid_<axis>` that every launch passes its grid's extent as: the row
    count a 1-D bound needs, which a 2-D launch's grid carried and the kernel never had to take. The kernel reads
    nothing new; only the flat form's bound names it."""
    names = {parsed.text(n) for n in cp.nodes_of_type(parsed.root, "identifier")}
    name = fresh_name(names, f"grid_{'xyz'[missing.axis]}")
    taken = params(parsed, function.node)
    if not taken:
        raise NotApplicable(f"{function.name} takes no parameters to add the row count to")
    end = taken[-1].node.end_byte
    source = splice(parsed.data, [(end, end, f", int {name}")])[0].decode("utf-8")
    extent = int(missing.extent) if missing.extent.isdigit() else missing.extent
    launches = tuple(replace(launch, args=(*launch.args, Arg(ArgKind.SCALAR, value=extent, type="i32")))
                     if launch.entry == function.name else launch for launch in state.plan.launches)
    return KernelState(source=source, plan=with_plan(state, launches=launches))


def _rewrite(parsed: cp.ParsedSource, function: cp.Function, matrix: _Matrix) -> str:
    """The kernel's body in the 1-D form (its braces left out). Over rows (`matrix.of_rows`), the element is the flat
    index inside parentheses too (`x[(b * T + t) * D + d]`, a row's columns), and a row or column the work no longer
    names once so written is not declared."""
    body = function.node.child_by_field_name("body")
    named = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier")}
    index = next((n for n in _NAMES if n not in named), None)
    if index is None:
        raise NotApplicable(f"{function.name} names every index name the flat form could use")
    wide = bool(_WIDE_TYPES.search(parsed.text(function.node)))
    kind = WIDE if wide else NARROW
    columns = _grouped(matrix.columns)
    total = f"(long long){matrix.rows} * {columns}" if wide else f"{matrix.rows} * {columns}"
    indent = indentation(parsed.data, statements(body)[0].start_byte)
    inner = indent + "    "
    nodes = list(matrix.work)
    if len(nodes) == 1 and nodes[0].type == "compound_statement":  # the `if` form's block: its statements
        nodes = statements(nodes[0])
    work = ""
    if nodes:
        start, end = nodes[0].start_byte, nodes[-1].end_byte
        # the element `row * cols + col` (any order and grouping, the count maybe a product) is the flat index
        # itself, and so is it with an integer cast on the row or the product (`(size_t)row * cols + col`), the flat
        # index being 64-bit where the kernel names a 64-bit type: the same value wherever the kernel's own
        # arithmetic does not wrap
        spelled = {f"{matrix.row} * {matrix.columns} + {matrix.column}", f"{matrix.columns} * {matrix.row} + "
                   f"{matrix.column}", f"{matrix.column} + {matrix.row} * {matrix.columns}",
                   f"{matrix.column} + {matrix.columns} * {matrix.row}"}  # `static_cast<size_t>(row)` uncast too
        counts = matrix.columns.split(" * ")
        names = {name: variable(name) for name in (matrix.row, matrix.column, *counts)}
        element = plus(times(names[matrix.row], product(counts)), names[matrix.column])
        places = ("subscript_argument_list", "parenthesized_expression") if matrix.of_rows else \
            ("subscript_argument_list",)
        found = [n for node in nodes for n in cp.nodes_of_type(node, "binary_expression")
                 if n.parent.type in places and (_uncast(squash(parsed.text(n))) in spelled or
                                                 polynomial(parsed, n, names, through_casts=True) == element)]
        found = [n.parent if n.parent.type == "parenthesized_expression" else n for n in found]  # `(i)` read `i`
        edits = [(n.start_byte - start, n.end_byte - start, index) for n in found]
        if not matrix.of_rows:
            edits += [(a - start, b - start, text) for a, b, text in
                      _element_locals(parsed, function, nodes, names, element, index)]
        work = splice(parsed.data[start:end], edits)[0].decode("utf-8")
        work = reindent(work, len(indentation(parsed.data, start)), inner)[len(inner):]
    still_named = set(re.findall(r"[A-Za-z_]\w*", work))
    lines = [f"{kind} {index} = {canonical_index(kind)};",
             f"if ({index} < {total}) {{",
             *([f"    {matrix.row_type} {matrix.row} = {index} / {columns};"]
               if not matrix.of_rows or matrix.row in still_named else []),
             *([f"    int {matrix.column} = {index} % {columns};"]
               if not matrix.of_rows or matrix.column in still_named else [])]
    text = "\n".join(indent + line for line in lines)[len(indent):] + (f"\n{inner}{work}" if work else "") + \
        f"\n{indent}}}"
    return text


def _element_locals(parsed: cp.ParsedSource, function: cp.Function, nodes: list[Node], names: dict[str, Poly],
                    element: Poly, index: str) -> list[tuple[int, int, str]]:
    """The edits that read a local naming the element (`size_t idx = r * cols + c;`, a declaration of the work's top
    level, never assigned, read only as a whole subscript: `out[idx] = f(x[idx])`) as the flat index: its uses
    written `index`, its declaration gone. It holds the element wherever it is read, which the flat index is."""
    written = written_names(parsed, function.node)
    edits = []
    for node in nodes:
        declarators = node.children_by_field_name("declarator") if node.type == "declaration" else []
        if len(declarators) != 1 or declarators[0].type != "init_declarator" or \
                declarators[0].child_by_field_name("declarator").type != "identifier":
            continue
        local = parsed.text(declarators[0].child_by_field_name("declarator"))
        value = declarators[0].child_by_field_name("value")
        uses = [n for other in nodes if other is not node for n in cp.nodes_of_type(other, "identifier")
                if parsed.text(n) == local]
        if local in written or polynomial(parsed, value, names, through_casts=True) != element or not uses or \
                any(use.parent.type != "subscript_argument_list" for use in uses):
            continue
        edits.append((node.start_byte, through_blanks(parsed, node), ""))
        edits += [(use.start_byte, use.end_byte, index) for use in uses]
    return edits


def _grouped(columns: str) -> str:
    """The column count as a factor: a product of counts in parentheses."""
    return f"({columns})" if " " in columns else columns


def _uncast(text: str) -> str:
    """`text` (squashed) without integer casts, and without the parentheses a cast left around a name."""
    return re.sub(r"\((\w+)\)", r"\1", re.sub(INTEGER_CAST, "", text))


def _element_launches(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, bound: str,
                      dimensions: int, threads: int | None = None) -> tuple[Launch, ...]:
    """Every launch of the kernel (each of at most `dimensions` dimensions) one-dimensional: `threads` per block
    (default: its own threads per block kept), cdiv(n, threads) blocks, n the launch's values for the scalar
    parameters `bound` names."""
    launches_of(state, function.name, dimensions=dimensions)
    launches = []
    for launch in state.plan.launches:
        if launch.entry == function.name:
            block = threads or _threads(launch)
            total = _in_plan(bound, launch_scalars(parsed, function, launch), function.name)
            grid = (f"cdiv({total}, {block})", 1, 1)
            launch = Launch(launch.entry, grid, (block, 1, 1), launch.shared, launch.args)
        launches.append(launch)
    return tuple(launches)


def _in_plan(bound: str, values: dict[str, str], entry: str) -> str:
    """`bound` (names of the kernel's scalar parameters) written in the plan's terms: each name as its launch value."""
    def value(match: re.Match) -> str:
        if match[0] not in values:
            raise NotApplicable(f"the bound names '{match[0]}', which {entry}'s launch passes no scalar for")
        return values[match[0]] if values[match[0]].isidentifier() else f"({values[match[0]]})"

    return re.sub(r"[A-Za-z_]\w*", value, bound)


def _threads(launch: Launch) -> int:
    sizes = [str(d).strip() for d in launch.block[:2]]
    if not all(s.isdigit() for s in sizes):
        raise NotApplicable(f"{launch.entry}'s block ({', '.join(sizes)}) is not a fixed size")
    return int(sizes[0]) * int(sizes[1])
