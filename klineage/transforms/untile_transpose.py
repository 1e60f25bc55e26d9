"""untile_transpose: a transpose staged through a padded shared-memory tile becomes a direct strided copy.

The mechanism (forward): a naive 2-D transpose, one thread per element,

    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < R && c < C) Y[c * R + r] = X[r * C + c];

reads X along rows (coalesced) but writes Y with a stride of R elements (one transaction per thread). The
forward stages a 32 x 32 tile in shared memory: a block of 32 x 8 threads reads the tile's rows (four
per thread, coalesced), waits at a barrier, and writes the tile's columns as rows of Y (coalesced). The
tile is 32 x 33: the padding column puts the 32 elements of a tile column in 32 different banks. The
bounds are checked per element, so R and C need not be multiples of 32. The plan's launch gets a block
of (32, 8) and a grid of (cdiv(C, 32), cdiv(R, 32)), C and R read from the launch's arguments.

The forward reads the 2-D copy however it is spelled where the spelling copies exactly the same elements:
- the indexes in either order, or in any spelling `_canonical` reads (terms in another order, `const`, declared
  together), 32-bit or 64-bit (`size_t`, `long long`: the tiled subscripts are then 64-bit); a block size named by a
  constant or a literal (`blockIdx.y * TY + threadIdx.y`, `#define TY 8`) that is every launch's block size along
  that axis, which is blockDim there (`_canonical` reads it along each axis);
- the guard as `&&` in either order, as an early return `if (r >= R || c >= C) return;`, or nested (`if (r < R) {
  if (c < C) ... }`, one early return per bound): each runs the copy exactly where r < R and c < C;
- braces around the copy, temporaries before it (`int src = r * C + c, dst = c * R + r; float v = X[src]; Y[dst] =
  v;`), put in place of their names (`_inlined` says which keep the value);
- each subscript any sum of products that equals the form's, a factor cast to 64 bits (`Y[(size_t)c * R + r]`),
  which the tiled form keeps.
A 64-bit index needs R and C of `int`: the tiled form's indexes are `int`, below 32 * cdiv(n, 32) <= 2^31 for an
`int` count n, so they hold every value the 64-bit ones take in bounds.

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
+ c_out`, and keeps the launch's grid z. A 64-bit batch or cast makes the tiled subscripts 64-bit (the cast on b),
and so does a batch of blockIdx.z's own type (`unsigned int b = blockIdx.z;`, as `_canonical` names an inline
`blockIdx.z * R * C`): the same subscripts wherever the naive kernel's 32-bit unsigned ones do not wrap past 2^32.

Backward writes the direct copy back from the canonical tiled form, with the grid one thread per
element needs under the (32, 8) block (a batch's declaration and offsets kept, grid z as it is); a kernel that came
from the 1-D spelling gets the 2-D copy, which computes the same.

Legality (forward_sites), conservative: the kernel's body is exactly the two index declarations and the
guarded copy above in one of those spellings, or the 1-D index, its guard by the element count, the split and the
copy, or the 2-D copy with a batch declaration whose offset b * R * C both subscripts add; X and Y distinct pointer
parameters of one element type, R and C scalar parameters passed by the launch as scalars (`int` for 64-bit
indexes); the plan launches the kernel with a block of at most two dimensions and a grid of at most two, three for a
batch, and passes no buffer twice; no name of the copy is one the tiled form declares (k, tile, <c>_out, <r>_out).
Anything else: no site, the refusal naming the part of the form that is missing or differs (no row index, a guard
that does not bound the column, a read at X[c * C + r], a temporary that narrows, ...).

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
    kernel,
    launches_of,
    parameters,
    readable,
    squash,
    tiled_plan,
)
from klineage.transforms._pointers import inlined
from klineage.transforms._polynomials import of_text
from klineage.transforms._readonly import plain_reads
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

TILE, ROWS_PER_PASS = 32, 8
KEY = "tile"
_ID = r"([A-Za-z_]\w*)"
# a thread index along x (the column) or y (the row) as `_canonical` spells it, in 32 or 64 bits
_INDEX = re.compile(r"(?:int (?P<narrow>[A-Za-z_]\w*) = |long long (?P<wide>[A-Za-z_]\w*) = \(long long\))"
                    r"blockIdx\.(?P<axis>[xy]) \* blockDim\.(?P=axis) \+ threadIdx\.(?P=axis);")
_INT32 = frozenset({"int", "int32_t"})  # the counts a 64-bit index may run to, and a 32-bit temporary's types
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
_BATCH = re.compile(rf"(?<=[{{;] )(?:const )?(int|unsigned int|{'|'.join(sorted(WIDE_TYPES))}) {_ID} = "
                    r"blockIdx\.z; ")
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
        state = inlined(canonical(plain_reads(state)))  # indexes, row pointers, reads as the naive forms spell them
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", KEY, parsed.text(function.node)[:200])
                for function, _ in readable(parsed, lambda f: _naive_copy(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = inlined(canonical(plain_reads(state)))  # indexes, row pointers, reads as the naive forms spell them
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
    params = {name: (kind, pointer) for name, kind, pointer in parameters(parsed, function)}
    pointers = {name: kind for name, (kind, pointer) in params.items() if pointer}
    try:
        split, split_wide = _unsplit(squash(parsed.text(function.node.child_by_field_name("body"))))
        unbatched, batch, batch_wide = _unbatched(split)
        column, row, index_wide, rest = _indexes(unbatched[1:-1].strip())
        rows, columns, work = _guard(rest, row, column)
        store = _inlined(work, pointers, {*params, row, column, batch} - {""}, index_wide)
        store, offsets, cast = _subscripts(store, {column, row}, batch)
        target, source = _transposed(store, row, column, rows, columns, batch)
    except NotApplicable as error:
        raise NotApplicable(f"{function.name} is not a naive transpose: {error}") from None
    if batch and offsets != [{tuple(sorted((batch, rows, columns))): 1}] * 2:  # b * R * C: a whole matrix a batch
        raise NotApplicable(f"{function.name}'s subscripts do not both add its batch's offset {batch} * {rows} * "
                            f"{columns}")
    if {column, row, batch, rows, columns, source, target} & {"k", KEY, f"{column}_out", f"{row}_out"}:
        raise NotApplicable(f"{function.name} names what the tiled form declares (k, {KEY}, <index>_out)")
    if not all(params.get(p, ("", False))[1] for p in (source, target)) or \
            params[source][0].removeprefix("const ") != params[target][0] or \
            any(params.get(n, ("", True))[1] for n in (rows, columns)):
        raise NotApplicable(f"{function.name}: X and Y are not pointers to one type, or R and C not scalars")
    # the tiled form's indexes are `int` whatever the naive ones were: below 32 * cdiv(n, 32) <= 2^31 for an `int`
    # count n (2^31 a multiple of 32), so they hold every value a 64-bit index takes under counts of 32 bits
    if index_wide and {params[rows][0], params[columns][0]} - _INT32:
        raise NotApplicable(f"{function.name}'s 64-bit indexes run to {rows} and {columns}, not both `int`: past what "
                            "the tiled form's 32-bit indexes hold")
    launches = launches_of(state, function.name, dimensions=3 if batch else 2)
    if any(str(launch.block[2]).strip() != "1" for launch in launches):
        raise NotApplicable(f"{function.name}'s block has more than 2 dimensions")
    return Copy(column, row, rows, columns, source, target, params[target][0],
                cast or index_wide or split_wide or batch_wide, batch)


def _indexes(text: str) -> tuple[str, str, bool, str]:
    """(column, row, whether either is 64-bit, the statements after them) of the squashed statements `text` that
    start with the two thread indexes, `c` along x and `r` along y as `_canonical` spells them, in either order:
    neither reads the other, so their order changes no value."""
    found, wide = {}, False
    while index := _INDEX.match(text):
        axis, name = index["axis"], index["narrow"] or index["wide"]
        if axis in found:
            raise NotApplicable(f"it declares two indexes along {axis}, {found[axis]} and {name}")
        found[axis], wide, text = name, wide or bool(index["wide"]), text[index.end():].lstrip()
    for axis, role in (("x", "column"), ("y", "row")):
        if axis not in found:
            first = text.split(";")[0]
            scaled = f"blockIdx.{axis}" in first and f"blockDim.{axis}" not in first
            flat = axis == "y" and "x" in found  # one index: the 1-D spelling, which `_unsplit` did not read
            raise NotApplicable(f"it declares no {role} index `{role[0]} = blockIdx.{axis} * blockDim.{axis} + "
                                f"threadIdx.{axis}` (int or 64-bit) before `{first};`" + (
                                    f": a block size it names must be every launch's along {axis}" if scaled else
                                    ", nor splits one index i guarded by `i < R * C` into `i / C` and `i % C`"
                                    if flat else ""))
    return found["x"], found["y"], wide, text


def _guard(text: str, row: str, column: str) -> tuple[str, str, str]:
    """(R, C, the guarded work) of the squashed statements after the indexes: `if (r < R && c < C) <work>` in
    either order, or an early return on `r >= R || c >= C` then the work, or those nested (`if (r < R) { if (c < C)
    ... }`, `if (r >= R) return; if (c >= C) return; ...`): each runs the work exactly where r < R and c < C."""
    bounds: dict[str, str] = {}
    while opening := re.match(r"if ?\(", text):
        end = _closing(text, opening.end() - 1)
        condition, rest = text[opening.end():end - 1], text[end:].lstrip()
        returned = re.match(r"(?:return;|\{ return; \}) ?", rest)
        for part in _top_level(condition, "||" if returned else "&&"):
            bound = re.fullmatch(rf"([A-Za-z_]\w*) ?{'>=' if returned else '<'} ?([A-Za-z_]\w*)", part)
            if bound is None:
                raise NotApplicable(f"its {'early return' if returned else 'guard'} tests `{part}`, not `<index> "
                                    f"{'>=' if returned else '<'} <count>`")
            if bound[1] not in (row, column):
                raise NotApplicable(f"its guard bounds {bound[1]}, neither its row {row} nor its column {column}")
            if bound[1] in bounds:
                raise NotApplicable(f"its guard bounds {bound[1]} twice")
            bounds[bound[1]] = bound[2]
        if returned:
            text = rest[returned.end():]
            continue
        if rest.startswith("{"):
            end = _closing(rest, 0)
            text, after = rest[1:end - 1].strip(), rest[end:].strip()
        elif rest.startswith("if"):  # an unbraced nested guard: the next pass reads it, and what follows it
            text, after = rest, ""
        else:
            statement = re.match(r"[^;{}]+;", rest)
            text, after = (statement[0], rest[statement.end():].strip()) if statement else (rest, "")
        if after:
            raise NotApplicable(f"`{after}` follows its guarded work")
    if not bounds:
        raise NotApplicable(f"`{text.split(';')[0]};` follows its indexes where a guard `if ({row} < R && {column} < "
                            f"C)` or `if ({row} >= R || {column} >= C) return;` belongs")
    if missing := [index for index in (row, column) if index not in bounds]:
        raise NotApplicable(f"no guard bounds {' nor '.join(missing)} (`if ({row} < R && {column} < C)` or `if ({row} "
                            f">= R || {column} >= C) return;`): threads past the matrix would copy")
    return bounds[row], bounds[column], text


def _inlined(work: str, pointers: dict[str, str], taken: set[str], wide: bool) -> str:
    """The guarded work as the one store it makes: temporaries before it (`int src = r * C + c, dst = ...; float v =
    x[src]; y[dst] = v;`) put in place of their names, each subscript's value as the store's own subscript
    computes it. An index temporary is a sum of products of names in `int` or 64 bits, never narrowed: one of 64
    bits holds a 32-bit value unchanged, one of 32 bits would cut a 64-bit one (`wide`: the indexes are). A value
    temporary reads a pointer parameter as its own element type, which the copy stores unchanged."""
    if re.search(r"[{}]|\b(?:if|for|while|do|switch|return|goto)\b", work) or not work.endswith(";"):
        raise NotApplicable(f"its guarded work `{work}` is not straight-line: temporaries, then one copy")
    *declarations, store = (part.strip() for part in work[:-1].split(";"))
    temporaries = []
    for declaration in declarations:
        found = re.fullmatch(r"(?:const )?([A-Za-z_][\w ]*?) ([A-Za-z_]\w* ?=.+)", declaration)
        named = [re.fullmatch(r"([A-Za-z_]\w*) ?= ?(.+)", part) for part in _top_level(found[2], ",")] if found else []
        if not named or None in named:
            raise NotApplicable(f"its work has `{declaration};` before its last statement `{store};`: only "
                                "temporaries `<type> <name> = <value>;` may precede the copy")
        temporaries += [(found[1], name[1], name[2]) for name in named]
    assigned = re.fullmatch(r"([^=]+?) ?(?<![-+*/%&|^<>!])= ?(?!=)(.+)", store)
    if assigned is None:
        raise NotApplicable(f"its work ends in `{store};`, no copy `Y[c * R + r] = X[r * C + c];`")
    texts = [value for _, _, value in temporaries] + [assigned[1], assigned[2]]
    for at, (kind, name, _) in enumerate(temporaries):
        value = texts[at]
        if name in taken or any(re.search(rf"(?<![\w.]){name}\b", text) for text in texts[:at]):
            raise NotApplicable(f"its temporary {name} hides another {name} the copy may read")
        read = re.fullmatch(r"([A-Za-z_]\w*)\[[^\[\]]+\]", value)
        polynomial = None if read else _polynomial(value)
        if read and read[1] in pointers:
            if kind != pointers[read[1]]:
                raise NotApplicable(f"its temporary `{kind} {name}` holds an element of {read[1]} "
                                    f"({pointers[read[1]]}) as {kind}")
        elif polynomial is None or kind not in {*_INT32, *WIDE_TYPES}:
            raise NotApplicable(f"its temporary `{kind} {name} = {value}` is neither a subscript (sums and products of "
                                "names, `int` or 64-bit) nor a read of a pointer parameter")
        elif kind in _INT32 and (wide or polynomial[1]):
            raise NotApplicable(f"its temporary `{kind} {name} = {value}` narrows a 64-bit subscript to 32 bits")
        taken.add(name)
        texts[at + 1:] = [_substituted(text, name, value) for text in texts[at + 1:]]
    return f"{_unwrapped(texts[-2])} = {_unwrapped(texts[-1])};"


def _substituted(text: str, name: str, value: str) -> str:
    """`text` with `value` in place of the name: bare as a whole subscript or the whole text, else parenthesized."""
    if text == name:
        return value
    text = re.sub(rf"\[ ?{name} ?\]", lambda _: f"[{value}]", text)
    return re.sub(rf"(?<![\w.]){name}\b", lambda _: f"({value})", text)


def _transposed(store: str, row: str, column: str, rows: str, columns: str, batch: str) -> tuple[str, str]:
    """(Y, X) of the store (its subscripts as `_subscripts` writes them, a batch's offset aside) where it is `Y[c * R
    + r] = X[r * C + c];` for the guard's R and C; NotApplicable naming the part that differs."""
    offset = f" plus {batch} * {rows} * {columns}" if batch else ""
    copy = re.fullmatch(r"([A-Za-z_]\w*)\[([^\[\]]+)\] = ([A-Za-z_]\w*)\[([^\[\]]+)\];", store)
    if copy is None:
        raise NotApplicable(f"its work `{store}` is no copy `Y[{column} * {rows} + {row}] = X[{row} * {columns} + "
                            f"{column}];`")
    target, written, source, read = copy.groups()
    if source == target:
        raise NotApplicable(f"it reads and writes one pointer, {source}")
    counts = (re.fullmatch(rf"{column} \* (\w+) \+ {row}", written), re.fullmatch(rf"{row} \* (\w+) \+ {column}", read))
    if all(counts) and (counts[0][1], counts[1][1]) != (rows, columns):
        raise NotApplicable(f"its bounds do not match its indices: the guard bounds {row} by {rows} and {column} by "
                            f"{columns}, the subscripts are of a {counts[0][1]} x {counts[1][1]} matrix")
    if read != f"{row} * {columns} + {column}":
        raise NotApplicable(f"it reads {source}[{read}], not {source}[{row} * {columns} + {column}{offset}]: X's row "
                            f"{row}, column {column}")
    if written != f"{column} * {rows} + {row}":
        raise NotApplicable(f"it writes {target}[{written}], not {target}[{column} * {rows} + {row}{offset}]: Y's "
                            f"row {column}, column {row}")
    return target, source


def _closing(text: str, start: int) -> int:
    """The offset past the bracket that closes the one at `start` (a parenthesis or a brace)."""
    depth = 0
    for at in range(start, len(text)):
        depth += {"(": 1, "{": 1, ")": -1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return at + 1
    raise NotApplicable(f"`{text[start:]}` is not closed")


def _top_level(text: str, separator: str) -> list[str]:
    """The parts of `text` between the separators outside brackets, each without parentheses around it whole."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if depth == 0 and text.startswith(separator, at) and at >= start:
            parts.append(text[start:at])
            start = at + len(separator)
    return [_unwrapped(part) for part in [*parts, text[start:]]]


def _unwrapped(text: str) -> str:
    text = text.strip()
    while text.startswith("(") and _closing(text, 0) == len(text):
        text = text[1:-1].strip()
    return text


def _unsplit(body: str) -> tuple[str, bool]:
    """The squashed body in the 2-D form `_naive_copy` reads where it is the 1-D spelling (`_FLAT`), and whether that
    spelling is 64-bit (its index, its count or its split); the body as it is, and False, where it is not 1-D.

    `int i = <global index>; if (i < R * C) { int r = i / C, c = i % C; Y[c * R + r] = X[i]; }` visits each (r, c)
    of the R x C elements once, as the 2-D form does on its 2-D launch, and X[i] is X[r * C + c] there: so it reads
    as `if (r < R && c < C) Y[c * R + r] = X[r * C + c];`, C the divisor of both the row and the column and R the
    count's other factor. Whether the copy then agrees with those bounds is `_transposed`'s to check (a row and a column
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
    """(the squashed body without its batch declaration `b = blockIdx.z;`, b, whether the tiled subscripts are
    formed in 64 bits for it: b is 64-bit or unsigned); the body, ""
    and False where it declares none. Whether both subscripts add b's matrix offset is `_naive_copy`'s to check."""
    found = _BATCH.search(body)
    if found is None:
        return body, "", False
    return body[:found.start()] + body[found.end():], found[2], found[1] != "int"


def _subscripts(store: str, indexes: set[str], batch: str) -> tuple[str, list[Form], bool]:
    """(the store with each subscript `<i> * <n> + <j>` of the two indexes i and j, however it sums and multiplies
    to that, written so; the terms of each subscript that name the batch; whether a 64-bit cast widens any). A
    subscript of another form stays as written, which `_transposed` then names."""
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

    return re.sub(r"(\w+)\[([^\[\]]+)\]", plain, store), offsets, wide


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
    literal with a suffix)."""
    plain, casts = re.subn(_WIDE, "", text)
    poly = None if "-" in plain else of_text(plain)
    if poly is None or any(not name.isidentifier() for monomial, _ in poly for name in monomial):
        return None  # a cast left (`(int)r`) reads as a name of its own: a narrowing, which this reader refuses
    return dict(poly), casts > 0


register(UntileTranspose())
