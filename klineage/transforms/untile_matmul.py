"""untile_matmul: an inner product that stages its operands through shared-memory tiles reads them from global
memory directly, one thread per output.

The mechanism (forward): a naive matrix product, one thread per output element,

    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[r * K + k] * B[k * N + c];
        <epilogue: statements that use acc, r and c, such as C[r * N + c] = alpha * acc + bias[c];>
    }

reads each element of A and B from global memory once per output it feeds (N and M times).

The forward makes a block of 16 x 16 threads load a 16 x 16 tile of A and one of B into shared memory per step
of 16 along k, each thread one element of each, wait at a barrier, and take its 16 products from the tiles:
every global element is read once per block instead of once per thread.
- Loads past the matrix edges give 0 and are never summed (the product loop stops at K), so M, N and K need not
  be multiples of 16.
- The products are summed in the naive kernel's order, with the loop's own statement: the result is the naive
  kernel's to the bit.
- The epilogue runs as it was, under the same bounds.
- The plan's launch gets a block of (16, 16) and a grid of (cdiv(N, 16), cdiv(M, 16)), M and N read from the
  launch's arguments.
- Operands may be 16-bit (`__half`, `__nv_bfloat16`) read through their conversion (`__half2float(A[...])`): the
  tiles then hold the operands' own elements and the update converts them as the naive loop did, to the bit.
- B may be stored N x K instead, read at `B[c * K + k]` (a linear layer's weight). Its tile is then loaded along
  k, a row of B across the lanes, and stored down a column of a 16 x 17 tile (the padding spreads the column over
  the banks).
- A may be stored K x M instead, read at `A[k * M + r]` (C = A^T B, as `torch.matmul(A.T, B)`), B either way. Its
  tile is then loaded along r, a row of A across the lanes, and stored down a column of a 16 x 17 tile, which the
  product loop reads as before.

A product spelled one thread per output on a 1-D launch is read too: the flat index (`int i = blockIdx.x *
blockDim.x + threadIdx.x;` in any spelling `_canonical` reads, `(int)blockIdx.x * blockDim.x + threadIdx.x` as
PyTorch extensions write it among them) under `if (i < M * N)` (or `if (i >= M * N) return;`), its row and column
declared first as `i / N` and `i % N`, the flat index named after the loop only. It is read as the 2-D form with
the same row and column (the epilogue's `i` read as its value, `r * N + c`), which the forward tiles and the
backward writes back: the flat spelling is one more way to write that naive kernel.

People's other spellings of the naive product are read as it too: a `#pragma unroll` before the loop (the tiled
loop replaces it), guards nested one per bound (`_c_style.joined_guards`), `k += 1` and `acc = acc + ...` (the
short forms, `_c_style`), a block size named by a constant along each axis (`#define TILE 16`, `_canonical`),
offsets named by integer locals (`int a_off = b * M * K + r * K;`, `_index_locals`), operands named by local
pointers (a batch's matrix, `const float* Ab = A + (size_t)b * M * K;`, `_pointers`), one or two float locals
holding the elements (`float a = A[..]; float b = B[..]; acc += a * b;`), a subscript's terms in any order
(`A[k + K * r]`), a thread per row looping over the row's output columns, each column's product and epilogue its
own (`_row_columns`: read as a thread per output where no column can see what another wrote), a row that is a layer
of the grid on a 1-D block (`int r = blockIdx.y;`, bounded by the launch alone: `_grid_rows`), a grid-stride loop
over the outputs (`_flatten.destrided`, then read as the flat spelling), and a sum started from a value the epilogue
can add instead (a linear layer's `float acc = bias[c];`: `_sum_starts`' late reading, the bias added after the
loop under the guard, which may round differently from adding it first, within the gate's tolerance).

A batch of small products is read too: a batch index declared among the two indexes (`int b = blockIdx.z;`, unsigned
or 64-bit too), each operand read at its batch's start (`A[X + r * K + k]` or `A[X + k * M + r]`, `B[Y + k * N +
c]`, X and Y naming only the batch index and scalar parameters: `b * M * K`; a start that offsets the rows, `A[(b *
M + r) * K + k]`, is read as `A[(b * M) * K + r * K + k]`, the same sum). The tiled form moves the operand pointers
to those starts first (`A += X;`), then is the unbatched one; the grid keeps its third dimension, one layer of
blocks per matrix.

The indexes may be 64-bit, as PyTorch extensions declare them over a tensor's sizes: the row and column `int64_t`,
`long long` or `size_t` (`_canonical` spells each `long long`, an unsigned one only where every use reads it as
signed arithmetic would), k of any type a loop index takes (`int64_t`, `size_t`, ...), the sizes of any integer
type, a batch's index 64-bit too (`int64_t b = blockIdx.z;`, kept as written). The tiled form keeps each index's
width: a 64-bit row or column is declared `long long`, a block's first row or column formed in 64 bits
(`(long long)blockIdx.x * 16`), and the step along k declared in the loop index's own type. A 32-bit index would not
do: over 64-bit sizes a column may pass 2^31, and over `int` sizes the naive kernel forms r * K (so the operands'
subscripts) and the epilogue's r * N + c in 64 bits, past what an int holds for a large M * K or M * N. With the
widths kept, every subscript and the epilogue compute what they did, for every size. A flat index may be 64-bit
too, split into 64-bit rows and columns; a 32-bit row or column of a 64-bit flat index is refused (past INT_MAX rows
it keeps only the low bits, which the 2-D row never does).

Backward writes the naive product back from the canonical tiled form, under the same (16, 16) block and grid.

Legality (forward_sites), conservative: the kernel's body is exactly the two index declarations (either order,
each `int` or `long long` as `_canonical` spells it) and the guarded block above (either order of the two bounds;
or `if (r >= M || c >= N) return;` and the block's statements after it), the accumulator a float starting at zero
(or at another value, such as a linear layer's bias, that the epilogue can add instead: `_sum_starts`' late
reading), the loop's index of an integer type (`_naive.LOOP_INDEX_TYPES`), the loop body the one
update (`A[...] * B[...]` in either order; or the sum of another float function of one element of each, read at a
product's places, of literals and pure math only, such as `(A[...] - B[...]) * (A[...] - B[...])` for distances,
maybe through one float local first: `float d = A[...] - B[...]; acc += d * d;` reads as that sum with the local's
value in its place, the spelling backward writes); A and B distinct pointer parameters to float, or to a 16-bit type
read through its own conversion, M, N and K scalar
parameters passed by the launch as scalars; the epilogue names the accumulator and none of A, B, the loop index,
a thread or block coordinate, a barrier, a loop or a jump; the plan launches the kernel with a two-dimensional
block and grid (a three-dimensional grid for a batch) and passes no buffer twice; an operand with a start is not
a `const` pointer (its start is added to it). Anything else: no site.

Anchor: the kernel, kind "function", key "tile".
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import register
from klineage.transforms._c_style import joined_guards
from klineage.transforms._calls import MATH_CALLS
from klineage.transforms._canonical import NARROW, WIDE, WIDE_TYPES, canonical, canonical_index
from klineage.transforms._edit import is_written
from klineage.transforms._flatten import destrided
from klineage.transforms._grid_rows import rows_on_layers
from klineage.transforms._index_locals import counts_inlined, folded
from klineage.transforms._matmul import (
    BATCH_INDEX,
    CONVERSIONS,
    KEY,
    TILE,
    Product,
    is_tiled,
    tiled_lines,
    tiled_product,
    written,
)
from klineage.transforms._naive import (
    FLOAT_ZERO,
    INTEGER_CAST,
    LOOP_INDEX_TYPES,
    bounds_2d,
    grid_extent_parameters,
    grid_index,
    kernel,
    launches_of,
    parameters,
    readable,
    squash,
    statements,
    tiled_plan,
)
from klineage.transforms._pointers import inlined
from klineage.transforms._readonly import plain_reads
from klineage.transforms._row_columns import columns_threaded
from klineage.transforms._sum_starts import started_at_zero
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

_ID = r"([A-Za-z_]\w*)"
_SPLIT_TYPES = rf"int|{'|'.join(sorted(WIDE_TYPES))}"  # a flat product's row and column: 32 or 64 bits
_EPILOGUE_FORBIDDEN = r"\b(?:threadIdx|blockIdx|blockDim|gridDim|__syncthreads\w*|__shfl\w*|for|while|do|goto|" \
                      r"return|break|continue|asm)\b"


class UntileMatmul(Transform):
    name = "untile_matmul"
    intent = ("Stage a matrix product's operands through 16x16 shared-memory tiles, so that a block reads each "
              "element of A and B once per tile step instead of once per thread.")
    removes = ("shared_array",)
    placement = Placement.ANALYSIS
    kin = ("unstage_shared",)  # operands staged in shared memory for a product are that mechanism too

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(f.name, "function", KEY, parsed.text(f.node)[:200]) for f in cp.functions(parsed)
                if f.is_kernel and is_tiled(parsed, f)]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        state = _read(state)
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", KEY, parsed.text(function.node)[:200])
                for function, _ in readable(parsed, lambda f: _planned(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = _read(state)  # as forward_sites reads it
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        state, parsed, function, (p, epilogue) = _read_product(state, parsed, function)
        plan = tiled_plan(state, function, p.rows, p.columns, (TILE, TILE), (TILE, TILE))
        return self._write(state, parsed, function, tiled_lines(p), epilogue, plan,
                           f"{function.name}: {TILE}x{TILE} shared tiles of {p.left} and {p.right}, block "
                           f"({TILE}, {TILE})")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        p, epilogue = tiled_product(parsed, function)
        lines = [f"{p.column_type} {p.column} = {canonical_index(p.column_type, 'x')};",
                 f"{p.row_type} {p.row} = {canonical_index(p.row_type, 'y')};",
                 *([p.batch] if p.batch else []),
                 f"if ({p.row} < {p.rows} && {p.column} < {p.columns}) {{",
                 f"    float {p.accumulator} = {p.zero};",
                 f"    for ({p.index_type} {p.index} = 0; {p.index} < {p.depth}; ++{p.index}) {p.update};"]
        return self._write(state, parsed, function, lines, epilogue, state.plan,
                           f"{function.name}: a direct product, one thread per output", Direction.BACKWARD)

    def _write(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function, lines: list[str],
               epilogue: list[Node], plan: LaunchPlan, note: str, direction: Direction = Direction.FORWARD) -> Rewrite:
        """The kernel's body as `lines`, then the epilogue's statements one level in, closing the guard `lines`
        open."""
        return self.rewrite(state, Anchor(function.name, "function", KEY), direction,
                            written(parsed, function, lines, epilogue, 1), plan=plan, carrier={"tile": TILE},
                            note=note)


def _read(state: KernelState) -> KernelState:
    """The kernel as the reader takes it: the index as the naive forms spell it, the bounds of nested guards joined,
    counts and offsets named by locals and operands named by local pointers read through their values, `__ldg`
    reads plain (the tiled loop reads its operands from shared memory, which the read-only cache's loads do not
    address)."""
    return inlined(folded(counts_inlined(joined_guards(canonical(plain_reads(state))))))


def _planned(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple:
    """`_read_product`'s reading, once the tiled plan can be written from it (each launch passes M and N)."""
    read = _read_product(state, parsed, function)
    state, _, function, (product, _) = read
    tiled_plan(state, function, product.rows, product.columns, (TILE, TILE), (TILE, TILE))
    return read


def _read_product(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple:
    """(the state, its parse, the kernel, `_naive_product`'s reading) of a naive product kernel, read as written or
    with its sum started at zero and its start (a linear layer's bias) added after the loop (`_sum_starts`, `late`:
    the tiled forms' threads past the edge run the loop too, and must not read the start there)."""
    try:
        return _read_spelled(state, parsed, function)
    except NotApplicable as refusal:
        started = started_at_zero(state, function.name, late=True)
        if started is state:
            raise
        parsed = cp.parse(started.source)
        try:
            return _read_spelled(started, parsed, next(f for f in cp.functions(parsed) if f.name == function.name))
        except NotApplicable as late:
            raise NotApplicable(f"{refusal}; nor with its start added after the loop: {late}") from None


def _read_spelled(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple:
    """`_read_product`'s reading of the kernel as it stands, or of the 2-D form it spells: a flat product (a 1-D
    launch, one thread per output: `_unflattened`), a thread per row of columns (`columns_threaded`), a row from a
    layer of the grid (`rows_on_layers`)."""
    try:
        return state, parsed, function, _naive_product(state, parsed, function)
    except NotApplicable as refusal:
        refusals = [str(refusal)]
    for spelled, reading in (("a flat product", _unflattened), ("a row of columns", columns_threaded),
                             ("a row on a grid layer", rows_on_layers), ("a grid-stride product", _strided)):
        try:
            state = folded(reading(parsed, function, state))  # `int i = r * N + c;` read as canonical() would
            break
        except NotApplicable as other:
            refusals.append(f"nor is it {spelled}: {other}")
    else:
        raise NotApplicable("; ".join(refusals))
    parsed = cp.parse(state.source)
    function = next(f for f in cp.functions(parsed) if f.name == function.name)
    return state, parsed, function, _naive_product(state, parsed, function)


def _strided(parsed: cp.ParsedSource, function: cp.Function, state: KernelState) -> KernelState:
    """The state with the kernel's grid-stride loop over a product's outputs (`for (int i = <the 1-D index>; i < M *
    N; i += blockDim.x * gridDim.x) { int r = i / N, c = i % N; ... }`) as the 2-D form: one thread per output
    (`_flatten.destrided`: the loop visits every output once, whatever the grid), then as `_unflattened` reads that."""
    flat = destrided(state, parsed, function)
    parsed = cp.parse(flat.source)
    return _unflattened(parsed, next(f for f in cp.functions(parsed) if f.name == function.name), flat)


def _unflattened(parsed: cp.ParsedSource, function: cp.Function, state: KernelState) -> KernelState:
    """The state with the kernel's flat product (`int i = <the 1-D index>;`, `if (i < M * N) { int r = i / N; int c =
    i % N; <accumulator, loop, epilogue> }` or `if (i >= M * N) return;` and the same after it) written as the 2-D
    form: the row and column from grid y and x, `if (r < M && c < N) { ... }`, and `int i = r * N + c;` before the
    epilogue where it names i. NotApplicable where the kernel is not so."""
    listed = statements(function.node.child_by_field_name("body")) if function.is_kernel else []
    axis, flat, flat_type = _grid_index(parsed, listed[0]) if listed else ("", "", "")
    if axis != "x" or len(listed) < 2 or listed[1].type != "if_statement" or \
            listed[1].child_by_field_name("alternative") is not None:
        raise NotApplicable("no 1-D index and guard after it")
    guard = listed[1]
    condition = squash(parsed.text(guard.child_by_field_name("condition")))[1:-1]
    consequence = guard.child_by_field_name("consequence")
    inside = re.fullmatch(rf"{flat} < {_ID} \* {_ID}", condition)
    leaves = re.fullmatch(rf"{flat} >= {_ID} \* {_ID}", condition)
    if inside and len(listed) == 2 and consequence.type == "compound_statement":
        work = statements(consequence)
    elif leaves and squash(parsed.text(consequence)) in ("return;", "{ return; }"):
        work = listed[2:]
    else:
        raise NotApplicable(f"the guard is not `{flat} < M * N` around the work (or `{flat} >= M * N` returning)")
    factors = (inside or leaves).groups()
    row, column, columns, types, body = _flat_split(parsed, work, flat)
    if flat_type == WIDE and not set(types.values()) <= WIDE_TYPES:
        raise NotApplicable(f"the 64-bit '{flat}' is split into a 32-bit row or column, which may not hold it")
    if columns not in factors or len(body) < 3:
        raise NotApplicable(f"the guard's count is not M * {columns}, or no accumulator, loop and epilogue follow")
    rows = factors[1] if factors[0] == columns else factors[0]
    before, epilogue = body[:2], body[2:]
    if any(re.search(rf"\b{flat}\b", parsed.text(node)) for node in before) or \
            any(is_written(use) for use in cp.nodes_of_type(function.node, "identifier")
                if parsed.text(use) in (flat, row, column)):
        raise NotApplicable(f"'{flat}' is named before the epilogue, or the indexes are assigned")
    named = any(re.search(rf"\b{flat}\b", parsed.text(node)) for node in epilogue)
    # each index declared in its own type, which `canonical` then spells as the 2-D form does (a 64-bit one as
    # `long long`, an unsigned one only where every use reads it as signed arithmetic would)
    lines = [f"{types[index]} {index} = {canonical_index(WIDE if types[index] in WIDE_TYPES else NARROW, axis)};"
             for index, axis in ((column, "x"), (row, "y"))]
    lines += [f"if ({row} < {rows} && {column} < {columns}) {{",
              *(f"    {squash(parsed.text(node))}" for node in before),
              *([f"    {flat_type} {flat} = {row} * {columns} + {column};"] if named else [])]
    return canonical(KernelState(source=written(parsed, function, lines, epilogue, 1), plan=state.plan))


def _flat_split(parsed: cp.ParsedSource, work: list[Node],
                flat: str) -> tuple[str, str, str, dict[str, str], list[Node]]:
    """(row, column, N, each one's type, the statements after them) of a flat product's work opening with `int r = i
    / N;` and `int c = i % N;` (either order, or one declaration of both; each `int` or 64-bit)."""
    one = bool(work) and work[0].type == "declaration" and len(work[0].children_by_field_name("declarator")) == 2
    taken = work[:1] if one else work[:2]
    # each index declared on its own, `int r = i / N; int c = i % N;`, whichever way the kernel wrote them
    declared = " ".join(f"{squash(parsed.text(node.child_by_field_name('type')))} {squash(parsed.text(d))};"
                        for node in taken if node.type == "declaration"
                        for d in node.children_by_field_name("declarator"))
    for first, second in (("/", "%"), ("%", "/")):
        found = re.fullmatch(rf"({_SPLIT_TYPES}) {_ID} = {flat} {first} {_ID}; ({_SPLIT_TYPES}) {_ID} = {flat} "
                             rf"{second} \3;", declared)
        if found:
            named_type, named, columns, other_type, other = found.groups()
            row, column = (named, other) if first == "/" else (other, named)
            return row, column, columns, {named: named_type, other: other_type}, work[len(taken):]
    raise NotApplicable(f"the row and column are not declared first as `{flat} / N` and `{flat} % N`")


def _naive_product(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple[Product, list[Node]]:
    """(the product, the epilogue's statements: those after the loop) of a naive product kernel: the two index
    declarations in either order, then `if (r < M && c < N) { ... }` ending the kernel or `if (r >= M || c >= N)
    return;` and the same statements after it."""
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is not a kernel")
    listed = statements(function.node.child_by_field_name("body"))
    # a batched product declares its batch among its indexes: one layer of blocks per matrix
    batched = [node for node in listed[:3] if re.fullmatch(BATCH_INDEX, squash(parsed.text(node)))]
    batch = squash(parsed.text(batched[0])) if batched else ""
    listed = [node for node in listed if node not in batched]
    indexes = {axis: (name, kind) for axis, name, kind in (_grid_index(parsed, node) for node in listed[:2])}
    if len(listed) < 3 or set(indexes) != {"x", "y"} or listed[2].type != "if_statement" or \
            listed[2].child_by_field_name("alternative") is not None:
        raise NotApplicable(f"{function.name} is not a naive matrix product: two indexes and a guard")
    (column, column_type), (row, row_type) = indexes["x"], indexes["y"]
    guard = listed[2]
    batch_name = batch.split(" = ")[0].split()[-1] if batch else ""
    condition = _batch_unbounded(state, parsed, function, squash(parsed.text(guard.child_by_field_name("condition")))
                                 [1:-1], batch_name)
    consequence = guard.child_by_field_name("consequence")
    if len(listed) == 3 and consequence.type == "compound_statement":
        bounds, work = bounds_2d(condition, row, column, "<", "&&"), statements(consequence)
    elif squash(parsed.text(consequence)) in ("return;", "{ return; }"):
        bounds, work = bounds_2d(condition, row, column, ">=", "||"), listed[3:]
    else:
        bounds, work = None, []
    if bounds is None or len(work) < 3:
        raise NotApplicable(f"{function.name}'s guard is not `r < M && c < N` (or `r >= M || c >= N` returning)")
    rows, columns = bounds
    work = _unpragmaed(parsed, work)
    first = re.fullmatch(rf"float {_ID} = ({FLOAT_ZERO});", squash(parsed.text(work[0])))
    loop = re.fullmatch(rf"for \(({LOOP_INDEX_TYPES}) {_ID} = 0; \2 < {_ID}; (?:\+\+\2|\2\+\+)\) "
                        rf"(?:{{ )?(.+?);(?: }})?", squash(parsed.text(work[1]))) if work[1].type == "for_statement" \
        else None
    if first is None or loop is None:
        raise NotApplicable(f"{function.name} is not a naive matrix product: no zeroed float and loop over k")
    accumulator, zero = first.groups()
    index_type, index, depth, update = loop.groups()
    terms = next((m.groupdict() for m in (p.fullmatch(update) for p in _PRODUCTS) if m), None)
    if terms is None:
        terms, update = _summed_terms(update, accumulator, index)
    if terms["acc"] != accumulator:
        raise NotApplicable(f"{function.name}'s loop does not sum a product into {accumulator}")
    params = {name: (kind, pointer) for name, kind, pointer in parameters(parsed, function)}
    reads = {terms["x"]: _at(terms["at_x"], (row, column, index)), terms["y"]: _at(terms["at_y"], (row, column, index))}
    for operand, at in ((terms["x"], terms["at_x"]), (terms["y"], terms["at_y"])):  # the update reads X + the rest
        start, rest = reads[operand]
        update = update.replace(f"{operand}[{at}]", f"{operand}[{start + ' + ' if start else ''}{rest}]")
    left, left_offset = next(((a, x) for a, (x, at) in reads.items() if at == f"{row} * {depth} + {index}"),
                             (None, ""))
    left_transposed = left is None  # A stored K x M: C = A^T B
    if left_transposed:
        left, left_offset = next(((a, x) for a, (x, at) in reads.items() if at == f"{index} * {rows} + {row}"),
                                 (None, ""))
    right, right_offset = next(((a, x) for a, (x, at) in reads.items() if at == f"{index} * {columns} + {column}"),
                               (None, ""))
    transposed = right is None
    if transposed:
        right, right_offset = next(((a, x) for a, (x, at) in reads.items()
                                    if at == f"{column} * {depth} + {index}"), (None, ""))
    if left is None or right is None or left == right:
        raise NotApplicable(f"{function.name} does not read A[r * K + k] (or A[k * M + r]) and B[k * N + c] (or "
                            f"B[c * K + k])")
    for operand, offset in ((left, left_offset), (right, right_offset)):  # where a batch's matrix starts
        names = set(re.findall(r"[A-Za-z_]\w*", re.sub(INTEGER_CAST, "", offset)))
        if any(name != batch_name and params.get(name, ("", True))[1] for name in names) or \
                re.search(rf"\*\s*const\s+{operand}\b", parsed.text(function.node.child_by_field_name(
                    "declarator"))):
            raise NotApplicable(f"{function.name} offsets {operand} by `{offset}`, which names more than the batch "
                                f"and scalar parameters, or {operand} is a const pointer")
    # A and B are only read here (the epilogue never names them), and the launch passes no buffer twice
    conversions = {terms["x"]: terms["cvt_x"] or "", terms["y"]: terms["cvt_y"] or ""}
    types = {a: params.get(a, ("", False))[0].removeprefix("const ").strip() for a in (left, right)}
    if any(not params.get(a, ("", False))[1] or types[a] not in CONVERSIONS or
           f"{CONVERSIONS[types[a]]}(" != f"{conversions[a][:-1]}(" for a in (left, right)) or \
            any(params.get(n, ("", True))[1] for n in (rows, columns, depth)):
        raise NotApplicable(f"{function.name}: A and B are not pointers to float (or to __half or __nv_bfloat16 read "
                            f"through their conversion to float), or M, N and K not scalars")
    epilogue = " ".join(squash(parsed.text(node)) for node in work[2:])
    if not re.search(rf"\b{accumulator}\b", epilogue) or re.search(_EPILOGUE_FORBIDDEN, epilogue) or \
            re.search(rf"\b(?:{left}|{right}|{index})\b", epilogue):
        raise NotApplicable(f"{function.name}'s epilogue does not only finish the accumulator")
    for launch in launches_of(state, function.name, dimensions=3 if batch else 2):
        if str(launch.block[2]).strip() != "1":
            raise NotApplicable(f"{function.name}'s block is three-dimensional")
    return Product(column, row, accumulator, index, rows, columns, depth, left, right, zero, update, transposed,
                   batch, left_offset, right_offset, types[left], types[right], left_transposed, column_type, row_type,
                   index_type), work[2:]


def _grid_index(parsed: cp.ParsedSource, node: Node) -> tuple[str, str, str]:
    """(axis, name, type) of a thread index as `_canonical` spells it (`_naive.grid_index`), its type `int` or, 64-bit,
    `long long`; else ("", "", "")."""
    axis, name = grid_index(parsed, node, wide=True)
    return (axis, name, WIDE if squash(parsed.text(node)).startswith(f"{WIDE} ") else NARROW) if axis else ("", "", "")


def _batch_unbounded(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, condition: str,
                     batch: str) -> str:
    """The guard's condition (squashed) less a bound on the batch index that every launch makes hold: `b < L` joined
    to the two bounds (`b >= L` to a returning guard's) where each grid has as many layers along z as the launch
    passes for L, so that b = blockIdx.z is below L in every block. Else the condition as it is."""
    if not batch:
        return condition
    extents = grid_extent_parameters(state, parsed, function, 2)[0]
    for relation, joined in (("<", "&&"), (">=", "||")):
        terms = condition.split(f" {joined} ")
        kept = [term for term in terms if term not in {f"{batch} {relation} {extent}" for extent in extents}]
        if len(terms) == 3 and len(kept) == 2:
            return f" {joined} ".join(kept)
    return condition


def _summed_terms(update: str, accumulator: str, index: str) -> tuple[dict[str, str], str]:
    """The operands of a loop that sums another float function of one element of A and one of B than their
    product (`acc += (A[..] - B[..]) * (A[..] - B[..])`, `acc += fabsf(A[..] - B[..])`: a distance), read in the
    same places as a product's, and the update as one statement: a body of one or two float locals and the sum
    (`float d = A[..] - B[..]; acc += d * d;`, `float a = A[..]; float b = B[..]; acc += a * b;`) is the sum with
    each local's value in its place. The expression names
    only the two elements, literals and pure math; NotApplicable otherwise."""
    for _ in range(2):  # an element of each operand named first (`float av = A[..]; float bv = B[..];`)
        local = re.fullmatch(rf"(?:const )?float {_ID} = ([^;]+); (.+)", update)
        if local is None:
            break
        name, value, update = local.groups()
        if not re.search(rf"\b{name}\b", update) or re.search(_CHANGED.format(name=name), update):
            raise NotApplicable(f"the loop's local '{name}' is not read by its sum, or is written or addressed")
        update = re.sub(rf"\b{name}\b", lambda _, value=value: value if _READ.fullmatch(value) else f"({value})",
                        update)
    summed = re.fullmatch(rf"{re.escape(accumulator)} \+= (.+)", update)
    if summed is None or ";" in update:
        raise NotApplicable(f"the loop's body is not one sum into {accumulator}, maybe after one float local")
    reads = re.findall(r"([A-Za-z_]\w*)\[([^][]+)\]", summed[1])
    places = dict(reads)
    if len(places) != 2 or any(places[name] != at for name, at in reads):
        raise NotApplicable("the loop's sum does not read one element of each of two arrays")
    rest = re.sub(r"[A-Za-z_]\w*\[[^][]+\]", "", summed[1])
    others = set(re.findall(r"[A-Za-z_]\w*", re.sub(r"\b\d+(?:\.\d*)?(?:e[+-]?\d+)?[fF]?\b", "", rest)))
    if others - MATH_CALLS or index in others:
        raise NotApplicable(f"the loop's sum names {', '.join(sorted(others - MATH_CALLS))} besides its two elements")
    (x, at_x), (y, at_y) = places.items()
    return {"acc": accumulator, "x": x, "at_x": at_x, "y": y, "at_y": at_y, "cvt_x": None, "cvt_y": None}, update


def _at(subscript: str, moving: tuple[str, ...]) -> tuple[str, str]:
    """(X, the rest) of a subscript `X + r * K + k` (X: a batch's or a view's start, "" where there is none): the
    rest is the terms that name a `moving` name (the row, column and loop index), each product's factors and the
    terms in the order the naive form writes (`k + r * K` and `K * r + k` are `r * K + k`), X the other terms as
    written. Integer sums and products reorder without changing their value."""
    nested = re.fullmatch(rf"\((.+) \+ {_ID}\) \* {_ID} \+ {_ID}", subscript)
    if nested:  # `(X + r) * K + k`, a batch's rows before the row's (`(b * M + r) * K + k`): X * K + r * K + k
        start, row, width, index = nested.groups()
        return f"({start}) * {width}", f"{row} * {width} + {index}"
    terms = _top_level_terms(subscript)
    if terms is None:
        return "", subscript
    named = [t for t in terms if set(re.findall(r"[A-Za-z_]\w*", t)) & set(moving)]
    if len(named) != 2 or any(t.count(" * ") > 1 for t in named):  # no product's place: its last two terms, as written
        return (" + ".join(terms[:-2]), " + ".join(terms[-2:])) if len(terms) > 2 else ("", subscript)
    ordered = sorted((" * ".join(sorted(t.split(" * "), key=lambda f: f not in moving)) for t in named),
                     key=lambda t: " * " not in t)  # the product first, then the lone index
    return " + ".join(t for t in terms if t not in named), " + ".join(ordered)


def _top_level_terms(subscript: str) -> list[str] | None:
    """The terms of a sum at its top level (None where a subtraction or an unbalanced parenthesis stands there)."""
    terms, depth, start = [], 0, 0
    for at, char in enumerate(subscript):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and subscript.startswith(" + ", at):
            terms.append(subscript[start:at])
            start = at + 3
        elif depth == 0 and subscript.startswith(" - ", at) or depth < 0:
            return None
    return [*terms, subscript[start:]] if depth == 0 else None


def _unpragmaed(parsed: cp.ParsedSource, work: list[Node]) -> list[Node]:
    """The work's statements without a `#pragma unroll` standing before a `for` loop: the tiled form replaces the
    product's loop by its own, which nvcc unrolls over the tile (the pragma never changes a value)."""
    return [node for at, node in enumerate(work)
            if not (node.type == "preproc_call" and _UNROLL.fullmatch(squash(parsed.text(node))) and
                    at + 1 < len(work) and work[at + 1].type == "for_statement")]


_CHANGED = r"&\s*{name}\b|\b{name}\s*(?:[-+*/]?=[^=]|\+\+|--)|(?:\+\+|--)\s*{name}\b"  # addressed or written
_READ = re.compile(rf"{_ID}\[[^][]+\]")  # one element, which needs no parentheses to stand for its local
_UNROLL = re.compile(r"#pragma unroll(?: \(?\d+\)?)?")


# the update of a product loop: a sum of the operands' product, the fused form included, either operand first
_OPERAND = (r"(?P<cvt_{0}>(?:__half2float|__bfloat162float)\()?(?P<{0}>[A-Za-z_]\w*)\[(?P<at_{0}>[^][]+)\]"
            r"(?(cvt_{0})\))")
_PRODUCTS = (re.compile(rf"(?P<acc>[A-Za-z_]\w*) \+= {_OPERAND.format('x')} \* {_OPERAND.format('y')}"),
             re.compile(rf"(?P<acc>[A-Za-z_]\w*) = fmaf\({_OPERAND.format('x')}, {_OPERAND.format('y')}, (?P=acc)\)"))


register(UntileMatmul())
