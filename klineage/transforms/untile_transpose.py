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

Backward writes the direct copy back from the canonical tiled form, with the grid one thread per
element needs under the (32, 8) block; a kernel that came from the 1-D spelling gets the 2-D copy, which computes
the same.

Legality (forward_sites), conservative: the kernel's body is exactly the two index declarations and the
guarded copy above (either order of the two bounds), or the 1-D index, its guard by the element count, the split and
the copy; X and Y distinct pointer parameters of one element type, R and C scalar parameters passed by the launch as
scalars; the plan launches the kernel with a block and grid of at most two dimensions and passes no buffer twice.
Anything else: no site.

Anchor: the kernel, kind "function", key "tile".
"""

from __future__ import annotations

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
_TILED = re.compile(
    rf"^{{ __shared__ {_ID} {KEY}\[{TILE}\]\[{TILE + 1}\]; int {_ID} = blockIdx\.x \* {TILE} \+ threadIdx\.x; "
    rf"int {_ID} = blockIdx\.y \* {TILE} \+ threadIdx\.y; for \(int k = 0; k < {TILE}; k \+= {ROWS_PER_PASS}\) "
    rf"if \(\3 \+ k < {_ID} && \2 < {_ID}\) {KEY}\[threadIdx\.y \+ k\]\[threadIdx\.x\] = {_ID}\[(\(size_t\))?"
    rf"\(\3 \+ k\) \* \5 \+ \2\]; __syncthreads\(\); int \2_out = ")
# a 64-bit cast on the first factor of a subscript (the naive form's, kept by the tiled form as `(size_t)`)
_WIDE = rf"\((?:{'|'.join(sorted(WIDE_TYPES))})\) ?"
# the 1-D spelling (after `_FLAT_RETURN`): one index over the R x C elements, guarded by their count (the product
# maybe cast to 64 bits), then the split into a row and a column and the copy
_FLAT = re.compile(rf"^{{ (int|long long) {_ID} = ([^;{{}}]+); if \(\2 < ({_WIDE})?{_ID} \* {_ID}\) "
                   rf"{{ ([^{{}}]+;) }} }}$")
# its early return, `if (i >= R * C) return; <split, copy>`: the `if` form's negation, the rest of the kernel its work
_FLAT_RETURN = re.compile(r"^\{ ([^;{}]+;) if \((\w+) >= (.+?)\) return; ([^{}]+) \}$")


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

    @property
    def cast(self) -> str:
        return "(size_t)" if self.wide else ""


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
                if f.is_kernel and _TILED.match(squash(parsed.text(f.node.child_by_field_name("body"))))]

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
        body = function.node.child_by_field_name("body")
        indent = indentation(parsed.data, body.named_children[0].start_byte)
        c, r, rows, columns, x, y = copy.column, copy.row, copy.rows, copy.columns, copy.source, copy.target
        passes = f"for (int k = 0; k < {TILE}; k += {ROWS_PER_PASS})"
        lines = [f"__shared__ {copy.element} {KEY}[{TILE}][{TILE + 1}];",
                 f"int {c} = blockIdx.x * {TILE} + threadIdx.x;",
                 f"int {r} = blockIdx.y * {TILE} + threadIdx.y;",
                 passes,
                 f"    if ({r} + k < {rows} && {c} < {columns}) {KEY}[threadIdx.y + k][threadIdx.x] = "
                 f"{x}[{copy.cast}({r} + k) * {columns} + {c}];",
                 "__syncthreads();",
                 f"int {c}_out = blockIdx.y * {TILE} + threadIdx.x;",
                 f"int {r}_out = blockIdx.x * {TILE} + threadIdx.y;",
                 passes,
                 f"    if ({r}_out + k < {columns} && {c}_out < {rows}) "
                 f"{y}[{copy.cast}({r}_out + k) * {rows} + {c}_out] = {KEY}[threadIdx.x][threadIdx.y + k];"]
        text = "\n".join(indent + line for line in lines)[len(indent):]
        start, end = body.named_children[0].start_byte, body.named_children[-1].end_byte
        source = splice(parsed.data, [(start, end, text)])[0].decode("utf-8")
        plan = tiled_plan(state, function, copy.rows, copy.columns, (TILE, TILE), (TILE, ROWS_PER_PASS))
        return self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan, carrier={"tile": TILE},
                            note=f"{function.name}: {TILE}x{TILE + 1} shared tile, block ({TILE}, {ROWS_PER_PASS})")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        body = function.node.child_by_field_name("body")
        match = _TILED.match(squash(parsed.text(body)))
        if match is None:
            raise NotApplicable(f"{anchor}: not the tiled transpose forward writes")
        element, c, r, rows, columns, x, wide = match.groups()
        target = re.search(rf"\) (\w+)\[{re.escape(wide or '')}\({r}_out \+ k\) \* {rows} \+ {c}_out\] = {KEY}\[",
                           squash(parsed.text(body)))
        if target is None:
            raise NotApplicable(f"{anchor}: no store of the tile's columns")
        copy = Copy(c, r, rows, columns, x, target[1], element, wide=bool(wide))
        indent = indentation(parsed.data, body.named_children[0].start_byte)
        lines = [f"int {c} = blockIdx.x * blockDim.x + threadIdx.x;",
                 f"int {r} = blockIdx.y * blockDim.y + threadIdx.y;",
                 f"if ({r} < {rows} && {c} < {columns}) {copy.target}[{copy.cast}{c} * {rows} + {r}] = "
                 f"{x}[{copy.cast}{r} * {columns} + {c}];"]
        text = "\n".join(indent + line for line in lines)[len(indent):]
        start, end = body.named_children[0].start_byte, body.named_children[-1].end_byte
        source = splice(parsed.data, [(start, end, text)])[0].decode("utf-8")
        plan = tiled_plan(state, function, copy.rows, copy.columns, (TILE, ROWS_PER_PASS), (TILE, ROWS_PER_PASS))
        return self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                            note=f"{function.name}: a direct transpose, one thread per element")


def _naive_copy(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> Copy:
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is not a kernel")
    split, split_wide = _unsplit(squash(parsed.text(function.node.child_by_field_name("body"))))
    body, wide = _plain(split)
    wide = wide or split_wide
    match = _NAIVE.match(body)
    if match is None:
        raise NotApplicable(f"{function.name} is not a naive transpose")
    column, row, condition, target, rows, source, columns = match.groups()
    if bounds_2d(condition, row, column) != (rows, columns) or source == target:
        raise NotApplicable(f"{function.name}'s bounds do not match its indices")
    params = {name: (kind, pointer) for name, kind, pointer in parameters(parsed, function)}
    if not all(params.get(p, ("", False))[1] for p in (source, target)) or \
            params[source][0].removeprefix("const ") != params[target][0] or \
            any(params.get(n, ("", True))[1] for n in (rows, columns)):
        raise NotApplicable(f"{function.name}: X and Y are not pointers to one type, or R and C not scalars")
    launches_of(state, function.name, dimensions=2)
    return Copy(column, row, rows, columns, source, target, params[target][0], wide)


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


def _plain(body: str) -> tuple[str, bool]:
    """The squashed body as `_NAIVE` reads it, and whether the copy's subscripts were cast to 64 bits: an early
    return on the out-of-range threads (`if (r >= R || c >= C) return; <copy>`) is the guard it negates, braces
    around the lone copy go, and a 64-bit cast on a subscript's first factor is noted and dropped (the tiled form
    casts both of its subscripts then)."""
    early = re.fullmatch(r"\{ (int \w+ = [^;]+; int \w+ = [^;]+;) if \((\w+) >= (\w+) \|\| (\w+) >= (\w+)\) return; "
                         r"([^;{}]+;) \}", body)
    if early:
        body = f"{{ {early[1]} if ({early[2]} < {early[3]} && {early[4]} < {early[5]}) {early[6]} }}"
    body = re.sub(r"\) \{ ([^;{}]+;) \} \}$", r") \1 }", body)
    plain, casts = re.subn(rf"\[{_WIDE}", "[", body)  # only the copy has subscripts
    return plain, casts > 0  # one cast or two: the tiled form forms both in 64 bits, never narrower


register(UntileTranspose())
