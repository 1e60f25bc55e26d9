"""untile_transpose: a transpose staged through a padded shared-memory tile becomes a direct strided copy.

The mechanism (forward): a naive 2-D transpose, one thread per element,

    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < R && c < C) Y[c * R + r] = X[r * C + c];

(also with the guard as an early return, `if (r >= R || c >= C) return;`, braces around the copy, or the
subscripts cast to 64 bits, `Y[(size_t)c * R + r]`, which the tiled form keeps) reads X along rows (coalesced)
but writes Y with a stride of R elements (one transaction per thread). The
forward stages a 32 x 32 tile in shared memory: a block of 32 x 8 threads reads the tile's rows (four
per thread, coalesced), waits at a barrier, and writes the tile's columns as rows of Y (coalesced). The
tile is 32 x 33: the padding column puts the 32 elements of a tile column in 32 different banks. The
bounds are checked per element, so R and C need not be multiples of 32. The plan's launch gets a block
of (32, 8) and a grid of (cdiv(C, 32), cdiv(R, 32)), C and R read from the launch's arguments.

The same copy is often written on one index over the R x C elements, split into a row and a column, on a 1-D launch:

    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < R * C) { int r = i / C, c = i % C; Y[c * R + r] = X[i]; }

(also with X[r * C + c], the split as two declarations in either order, the guard as an early return `if (i >= R *
C) return;`, or a 64-bit index, count or split, which makes the tiled subscripts 64-bit). It visits each (r, c) below
(R, C) once, as the 2-D copy does, and X[i] is X[r * C + c] there, so the forward reads it as the 2-D copy (C the
divisor of both the row and the column, R the count's other factor) and writes the same tiled form and launch: the
tiled grid depends on R and C alone, not on the launch it replaces, which covers every element as a correct naive
kernel's launch does.

A batch of transposes, (B, R, C) -> (B, C, R) (NCHW -> NHWC with H * W one axis), is the 2-D copy on a 3-D grid, its
matrix the grid's z:

    int b = blockIdx.z;  // among the index declarations; `long long` or another 64-bit type too
    if (r < R && c < C) Y[(b * C + c) * R + r] = X[(b * R + r) * C + c];

each subscript the 2-D one plus the batch's offset b * R * C, spelled any way that sums and multiplies to it (`b * R
* C + r * C + c`, casts on any factor). Each layer of z is an independent transpose of its own matrix, so the tiled
form does the same with the offset in both of its subscripts, `(b * R + r + k) * C + c` and `(b * C + r_out + k) * R
+ c_out`, and keeps the launch's grid z. A 64-bit batch or cast makes the tiled subscripts 64-bit (the cast on b).

Backward writes the direct copy back from the canonical tiled form, with the grid one thread per
element needs under the (32, 8) block (a batch's declaration and offsets kept, grid z as it is); a kernel that came
from the 1-D spelling gets the 2-D copy, which computes the same.

Legality (forward_sites), conservative: the kernel's body is exactly the two index declarations and the
guarded copy above (either order of the two bounds; each subscript any sum of products that equals the form's,
casts to 64 bits on any factor), or the 1-D index, its guard by the element count, the split and the copy, or the
2-D copy with a batch declaration whose offset b * R * C both subscripts add; X and Y distinct pointer parameters of
one element type, R and C scalar parameters passed by the launch as scalars; the plan launches the kernel with a
block of at most two dimensions and a grid of at most two, three for a batch, and passes no buffer twice; no name
of the copy is one the tiled form declares (k, tile, <c>_out, <r>_out). Anything else: no site.

Anchor: the kernel, kind "function", key "tile".
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._canonical import WIDE_TYPES, canonical
from klineage.transforms._edit import indentation, splice
from klineage.transforms._naive import (
    INDEXES,
    LOOP_INDEX_TYPES,
    bounds_2d,
    kernel,
    launches_of,
    parameters,
    readable,
    squash,
    tiled_plan,
)
from klineage.transforms._readonly import plain_reads
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

TILE, ROWS_PER_PASS = 32, 8
KEY = "tile"
_ID = r"([A-Za-z_]\w*)"
_NAIVE = re.compile(
    rf"^{{ int {_ID} = blockIdx\.x \* blockDim\.x \+ threadIdx\.x; int {_ID} = blockIdx\.y \* blockDim\.y \+ "
    rf"threadIdx\.y; if \((.+?)\) {_ID}\[\1 \* {_ID} \+ \2\] = {_ID}\[\2 \* {_ID} \+ \1\]; }}$")
# the names of the tiled form (what `_tiled_lines` writes checks it exactly): element type, c, r, the batch, R, C, X's
# subscript (its cast says whether the form is 64-bit), Y
_TILED = re.compile(
    rf"^{{ __shared__ {_ID} {KEY}\[{TILE}\]\[{TILE + 1}\]; int {_ID} = blockIdx\.x \* {TILE} \+ threadIdx\.x; "
    rf"int {_ID} = blockIdx\.y \* {TILE} \+ threadIdx\.y; (?:int {_ID} = blockIdx\.z; )?for \(int k = 0; k < {TILE}; "
    rf"k \+= {ROWS_PER_PASS}\) if \(\3 \+ k < {_ID} && \2 < {_ID}\) {KEY}\[threadIdx\.y \+ k\]\[threadIdx\.x\] = "
    rf"{_ID}\[([^\]]+)\]; .* {_ID}\[[^\]]+\] = {KEY}\[threadIdx\.x\]\[threadIdx\.y \+ k\]; }}$")
# a 64-bit cast on any factor of a subscript (the tiled form forms its subscripts in 64 bits then)
_WIDE = rf"\((?:{'|'.join(sorted(WIDE_TYPES))})\) ?|static_cast<(?:{'|'.join(sorted(WIDE_TYPES))})>"
# the 1-D spelling (after `_FLAT_RETURN`): one index over the R x C elements, guarded by their count (the product
# maybe cast to 64 bits), then the split into a row and a column and the copy
_FLAT = re.compile(rf"^{{ (int|long long) {_ID} = ([^;{{}}]+); if \(\2 < ({_WIDE})?{_ID} \* {_ID}\) "
                   rf"{{ ([^{{}}]+;) }} }}$")
# its early return, `if (i >= R * C) return; <split, copy>`: the `if` form's negation, the rest of the kernel its work
_FLAT_RETURN = re.compile(r"^\{ ([^;{}]+;) if \((\w+) >= (.+?)\) return; ([^{}]+) \}$")
# a batch's matrix from the grid's z, among the declarations before the guard; 64-bit types make the offsets 64-bit
_BATCH = re.compile(rf"(?<=[{{;] )(?:const )?(int|{'|'.join(sorted(WIDE_TYPES))}) {_ID} = blockIdx\.z; ")
Form = dict[tuple[str, ...], int]  # a subscript's polynomial: monomial (its names, sorted) -> coefficient


@dataclass(frozen=True)
class Copy:
    column: str  # c: the index along X's rows
    row: str  # r
    rows: str  # R: X's row count
    columns: str  # C
    source: str  # X
    target: str  # Y
    element: str
    wide: bool = False  # the subscripts are formed in 64 bits (`(size_t)r * C + c`)
    batch: str = ""  # b = blockIdx.z: the matrix of a batch, each R x C; "" for one matrix

    @property
    def cast(self) -> str:
        return "(size_t)" if self.wide else ""

    def at(self, row: str, rows: str, columns: str, column: str) -> str:
        """The subscript of element (row, column) of a `rows` x `columns` matrix (X's shape; Y's is its transpose),
        the batch's own where batched, in 64 bits where the naive form's subscripts were."""
        if self.batch:
            return f"({self.cast}{self.batch} * {rows} + {row}) * {columns} + {column}"
        return f"{self.cast}{f'({row})' if ' ' in row else row} * {columns} + {column}"


class UntileTranspose(Transform):
    name = "untile_transpose"
    intent = ("Stage a transpose through a padded 32x33 shared-memory tile so that both the reads and the writes "
              "of global memory are coalesced.")
    removes = ("shared_array",)
    placement = Placement.ANALYSIS
    kin = ("unpad_shared", "unstage_shared")  # a padded shared tile is their mechanism too

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(f.name, "function", KEY, parsed.text(f.node)[:200]) for f in cp.functions(parsed)
                if f.is_kernel and _tiled_copy(squash(parsed.text(f.node.child_by_field_name("body"))))]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        state = canonical(plain_reads(state))  # the index and reads as the naive forms spell them
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", KEY, parsed.text(function.node)[:200])
                for function, _ in readable(parsed, lambda f: _naive_copy(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = canonical(plain_reads(state))  # the index and reads as the naive forms spell them
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        copy = _naive_copy(state, parsed, function)
        source = _body(parsed, function, _tiled_lines(copy))
        plan = tiled_plan(state, function, copy.rows, copy.columns, (TILE, TILE), (TILE, ROWS_PER_PASS))
        return self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan, carrier={"tile": TILE},
                            note=f"{function.name}: {TILE}x{TILE + 1} shared tile, block ({TILE}, {ROWS_PER_PASS})")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        copy = _tiled_copy(squash(parsed.text(function.node.child_by_field_name("body"))))
        if copy is None:
            raise NotApplicable(f"{anchor}: not the tiled transpose forward writes")
        c, r = copy.column, copy.row
        lines = [f"int {c} = blockIdx.x * blockDim.x + threadIdx.x;",
                 f"int {r} = blockIdx.y * blockDim.y + threadIdx.y;",
                 *([f"int {copy.batch} = blockIdx.z;"] if copy.batch else []),
                 f"if ({r} < {copy.rows} && {c} < {copy.columns}) "
                 f"{copy.target}[{copy.at(c, copy.columns, copy.rows, r)}] = "
                 f"{copy.source}[{copy.at(r, copy.rows, copy.columns, c)}];"]
        source = _body(parsed, function, lines)
        plan = tiled_plan(state, function, copy.rows, copy.columns, (TILE, ROWS_PER_PASS), (TILE, ROWS_PER_PASS))
        return self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                            note=f"{function.name}: a direct transpose, one thread per element")


def _tiled_lines(copy: Copy) -> list[str]:
    """The tiled form's statements: the tile's rows read (coalesced), a barrier, its columns written as Y's rows."""
    c, r, rows, columns = copy.column, copy.row, copy.rows, copy.columns
    passes = f"for (int k = 0; k < {TILE}; k += {ROWS_PER_PASS})"
    return [f"__shared__ {copy.element} {KEY}[{TILE}][{TILE + 1}];",
            f"int {c} = blockIdx.x * {TILE} + threadIdx.x;",
            f"int {r} = blockIdx.y * {TILE} + threadIdx.y;",
            *([f"int {copy.batch} = blockIdx.z;"] if copy.batch else []),
            passes,
            f"    if ({r} + k < {rows} && {c} < {columns}) {KEY}[threadIdx.y + k][threadIdx.x] = "
            f"{copy.source}[{copy.at(f'{r} + k', rows, columns, c)}];",
            "__syncthreads();",
            f"int {c}_out = blockIdx.y * {TILE} + threadIdx.x;",
            f"int {r}_out = blockIdx.x * {TILE} + threadIdx.y;",
            passes,
            f"    if ({r}_out + k < {columns} && {c}_out < {rows}) "
            f"{copy.target}[{copy.at(f'{r}_out + k', columns, rows, f'{c}_out')}] = "
            f"{KEY}[threadIdx.x][threadIdx.y + k];"]


def _tiled_copy(body: str) -> Copy | None:
    """The copy of a squashed body that is exactly the tiled form `_tiled_lines` writes, else None."""
    match = _TILED.match(body)
    if match is None:
        return None
    element, c, r, batch, rows, columns, source, read, target = match.groups()
    copy = Copy(c, r, rows, columns, source, target, element, "(size_t)" in read, batch or "")
    return copy if squash(f"{{ {' '.join(_tiled_lines(copy))} }}") == body else None


def _body(parsed: cp.ParsedSource, function: cp.Function, lines: list[str]) -> str:
    """The source with the kernel's statements replaced by `lines`, at the body's indentation."""
    body = function.node.child_by_field_name("body")
    indent = indentation(parsed.data, body.named_children[0].start_byte)
    text = "\n".join(indent + line for line in lines)[len(indent):]
    start, end = body.named_children[0].start_byte, body.named_children[-1].end_byte
    return splice(parsed.data, [(start, end, text)])[0].decode("utf-8")


def _naive_copy(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> Copy:
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is not a kernel")
    split, split_wide = _unsplit(squash(parsed.text(function.node.child_by_field_name("body"))))
    unbatched, batch, batch_wide = _unbatched(split)
    body, offsets, wide = _subscripts(_plain(unbatched), batch)
    match = _NAIVE.match(body)
    if match is None:
        raise NotApplicable(f"{function.name} is not a naive transpose")
    column, row, condition, target, rows, source, columns = match.groups()
    if bounds_2d(condition, row, column) != (rows, columns) or source == target:
        raise NotApplicable(f"{function.name}'s bounds do not match its indices")
    if batch and offsets != [{tuple(sorted((batch, rows, columns))): 1}] * 2:  # b * R * C: a whole matrix a batch
        raise NotApplicable(f"{function.name}'s subscripts do not both add its batch's offset {batch} * {rows} * "
                            f"{columns}")
    if {column, row, batch, rows, columns, source, target} & {"k", KEY, f"{column}_out", f"{row}_out"}:
        raise NotApplicable(f"{function.name} names what the tiled form declares (k, {KEY}, <index>_out)")
    params = {name: (kind, pointer) for name, kind, pointer in parameters(parsed, function)}
    if not all(params.get(p, ("", False))[1] for p in (source, target)) or \
            params[source][0].removeprefix("const ") != params[target][0] or \
            any(params.get(n, ("", True))[1] for n in (rows, columns)):
        raise NotApplicable(f"{function.name}: X and Y are not pointers to one type, or R and C not scalars")
    launches = launches_of(state, function.name, dimensions=3 if batch else 2)
    if any(str(launch.block[2]).strip() != "1" for launch in launches):
        raise NotApplicable(f"{function.name}'s block has more than 2 dimensions")
    return Copy(column, row, rows, columns, source, target, params[target][0], wide or split_wide or batch_wide,
                batch)


def _unsplit(body: str) -> tuple[str, bool]:
    """The squashed body in the 2-D form `_NAIVE` reads where it is the 1-D spelling (`_FLAT`), and whether that
    spelling is 64-bit (its index, its count or its split); the body as it is, and False, where it is not 1-D.

    `int i = <global index>; if (i < R * C) { int r = i / C, c = i % C; Y[c * R + r] = X[i]; }` visits each (r, c)
    of the R x C elements once, as the 2-D form does on its 2-D launch, and X[i] is X[r * C + c] there: so it reads
    as `if (r < R && c < C) Y[c * R + r] = X[r * C + c];`, C the divisor of both the row and the column and R the
    count's other factor. Whether the copy then agrees with those bounds is `_NAIVE`'s to check (a row and a column
    swapped, a subscript by another count: no site); a row or column that hides the index or a count from the copy
    is no site here."""
    flat = _FLAT.match(_FLAT_RETURN.sub(r"{ \1 if (\2 < \3) { \4 } }", body))
    if flat is None or dict(INDEXES)[flat[1]] != flat[3]:
        return body, False
    kind, index, cast, first, second = flat[1], flat[2], flat[4], flat[5], flat[6]
    *declarations, copy = [statement.strip() for statement in re.findall(r"[^;]+;", flat[7])]
    (row, columns), (column, divisor), wide = _split(declarations, index)
    if columns != divisor or columns not in (first, second):
        raise NotApplicable(f"the 1-D index {index} is not split by one factor of its count {first} * {second}")
    if {row, column} & {index, first, second}:  # declared in the guarded block, it would hide that name from the copy
        raise NotApplicable("the 1-D index's row or column is named as the index or a count")
    rows = first if columns == second else second
    copy = re.sub(rf"\[{re.escape(index)}\]", f"[{row} * {columns} + {column}]", copy)
    return (f"{{ int {column} = blockIdx.x * blockDim.x + threadIdx.x; int {row} = blockIdx.y * blockDim.y + "
            f"threadIdx.y; if ({row} < {rows} && {column} < {columns}) {copy} }}"), wide or kind != "int" or bool(cast)


def _split(declarations: list[str], index: str) -> tuple[tuple[str, str], tuple[str, str], bool]:
    """((row, its divisor), (column, its divisor), whether either is 64-bit) of the declarations of a row `r = i /
    C` and a column `c = i % C`, in one declaration or two, in either order."""
    part = rf"[A-Za-z_]\w* = {re.escape(index)} [/%] [A-Za-z_]\w*"
    parts, wide = {}, False
    for declaration in declarations:
        found = re.fullmatch(rf"(?:const )?({LOOP_INDEX_TYPES}) ({part}(?:, {part})*);", declaration)
        if found is None:
            raise NotApplicable(f"`{declaration}` declares no row `{index} / C` or column `{index} % C` of the "
                                "1-D index")
        wide = wide or found[1] in WIDE_TYPES
        for name, _, _, op, divisor in (declarator.split(" ") for declarator in found[2].split(", ")):
            if op in parts:
                raise NotApplicable(f"the 1-D index {index} is split into more than a row and a column")
            parts[op] = (name, divisor)
    if set(parts) != {"/", "%"}:
        raise NotApplicable(f"the 1-D index {index} is not split into a row ({index} / C) and a column ({index} % C)")
    return parts["/"], parts["%"], wide


def _unbatched(body: str) -> tuple[str, str, bool]:
    """(the squashed body without its batch declaration `b = blockIdx.z;`, b, whether b is 64-bit); the body, ""
    and False where it declares none. Whether both subscripts add b's matrix offset is `_naive_copy`'s to check."""
    found = _BATCH.search(body)
    if found is None:
        return body, "", False
    return body[:found.start()] + body[found.end():], found[2], found[1] != "int"


def _plain(body: str) -> str:
    """The squashed body as `_NAIVE` reads it, its subscripts aside: an early return on the out-of-range threads
    (`if (r >= R || c >= C) return; <copy>`) is the guard it negates, and braces around the lone copy go."""
    early = re.fullmatch(r"\{ (int \w+ = [^;]+; int \w+ = [^;]+;) if \((\w+) >= (\w+) \|\| (\w+) >= (\w+)\) return; "
                         r"([^;{}]+;) \}", body)
    if early:
        body = f"{{ {early[1]} if ({early[2]} < {early[3]} && {early[4]} < {early[5]}) {early[6]} }}"
    return re.sub(r"\) \{ ([^;{}]+;) \} \}$", r") \1 }", body)


def _subscripts(body: str, batch: str) -> tuple[str, list[Form], bool]:
    """(the squashed body with each subscript `<i> * <n> + <j>` of the two indexes i and j, however it sums and
    multiplies to that, written so; the terms of each subscript that name the batch; whether a 64-bit cast widens
    any). A subscript of another form stays as written, which `_NAIVE` then does not read."""
    indexes = set(re.findall(r"int (\w+) = blockIdx\.[xy] \* blockDim\.[xy] \+ threadIdx\.[xy];", body))
    offsets, wide = [], False

    def plain(match: re.Match) -> str:
        nonlocal wide
        read = _polynomial(match[2])
        if read is None:
            return match[0]
        form, cast = read
        offsets.append({term: n for term, n in form.items() if batch and batch in term})
        wide = wide or cast
        rest = {term: n for term, n in form.items() if not (batch and batch in term)}
        return f"{match[1]}[{_two_index_form(rest, indexes) or match[2]}]"

    return re.sub(r"(\w+)\[([^\[\]]+)\]", plain, body), offsets, wide


def _two_index_form(form: Form, indexes: set[str]) -> str:
    """`i * n + j` where `form` is that polynomial of the two indexes i and j and a count n that is neither; else
    ""."""
    if len(indexes) != 2 or sorted(len(term) for term in form) != [1, 2] or set(form.values()) != {1}:
        return ""
    (inner,), outer = sorted(form, key=len)
    counts = [name for name in outer if name not in indexes]
    if inner not in indexes or len(counts) != 1 or set(outer) - set(counts) != indexes - {inner}:
        return ""
    return f"{(indexes - {inner}).pop()} * {counts[0]} + {inner}"


def _polynomial(text: str) -> tuple[Form, bool] | None:
    """(the polynomial a squashed subscript computes over its names, whether a 64-bit cast widens a part of it);
    None where it is more than sums and products of names and integers (a narrowing cast, a subtraction, a
    literal with a suffix). Those are Python's expressions too, so Python's parser reads them once the casts go."""
    plain, casts = re.subn(_WIDE, "", text)
    try:
        tree = ast.parse(plain, mode="eval").body
    except SyntaxError:
        return None
    form = _fold(tree)
    return None if form is None else (form, casts > 0)


def _fold(node: ast.AST) -> Form | None:
    if isinstance(node, ast.Name):
        return {(node.id,): 1}
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return {(): node.value} if node.value else {}
    if not isinstance(node, ast.BinOp) or not isinstance(node.op, ast.Add | ast.Mult):
        return None
    left, right = _fold(node.left), _fold(node.right)
    if left is None or right is None:
        return None
    if isinstance(node.op, ast.Add):
        pairs = [*left.items(), *right.items()]
    else:
        pairs = [(tuple(sorted(a + b)), n * m) for a, n in left.items() for b, m in right.items()]
    terms: Form = {}
    for term, n in pairs:
        terms[term] = terms.get(term, 0) + n
    return {term: n for term, n in terms.items() if n}


register(UntileTranspose())
