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

A batch of small products is read too: a batch index declared among the two indexes (`int b = blockIdx.z;`), each
operand read at its batch's start (`A[X + r * K + k]`, `B[Y + k * N + c]`, X and Y naming only the batch index
and scalar parameters: `b * M * K`). The tiled form moves the operand pointers to those starts first (`A += X;`),
then is the unbatched one; the grid keeps its third dimension, one layer of blocks per matrix.

Backward writes the naive product back from the canonical tiled form, under the same (16, 16) block and grid.

Legality (forward_sites), conservative: the kernel's body is exactly the two index declarations (either order)
and the guarded block above (either order of the two bounds; or `if (r >= M || c >= N) return;` and the block's
statements after it), the accumulator a float starting at zero, the loop body the one
update (`A[...] * B[...]` in either order); A and B distinct pointer parameters to float, or to a 16-bit type
read through its own conversion, M, N and K scalar
parameters passed by the launch as scalars; the epilogue names the accumulator and none of A, B, the loop index,
a thread or block coordinate, a barrier, a loop or a jump; the plan launches the kernel with a two-dimensional
block and grid (a three-dimensional grid for a batch) and passes no buffer twice; an operand with a start is not
a `const` pointer (its start is added to it). Anything else: no site.

Anchor: the kernel, kind "function", key "tile".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import register
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import indentation, reindent, splice
from klineage.transforms._naive import (
    FLOAT_ZERO,
    bounds_2d,
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
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

TILE = 16
KEY = "tile"
_ID = r"([A-Za-z_]\w*)"
_BATCH_INDEX = r"int [A-Za-z_]\w* = blockIdx\.z;"  # a batched product's batch: one block layer per matrix
# an operand's element type -> the conversion its naive update reads it through ("" for float, read as it is)
CONVERSIONS = {"float": "", **dict.fromkeys(("__half", "half"), "__half2float"),
               **dict.fromkeys(("__nv_bfloat16", "nv_bfloat16"), "__bfloat162float")}
_TILE_TYPE = rf"(?:{'|'.join(CONVERSIONS)})"  # a tile holds its operand's own elements: the update converts them
_TILE_ZERO = rf"(?:0\.0f|{_TILE_TYPE}\(0\.0f\))"
_B_ROWS = (rf"{KEY}_b\[threadIdx\.y\]\[threadIdx\.x\] = {KEY}_k \+ threadIdx\.y < \4 && \1 < {_ID} \? "
           rf"{_ID}\[\({KEY}_k \+ threadIdx\.y\) \* \7 \+ \1\] : {_TILE_ZERO};")
# B stored N x K (a linear layer's weight): lanes along k load a row of B, stored across the padded tile
_B_TRANSPOSED = (rf"{KEY}_b\[threadIdx\.x\]\[threadIdx\.y\] = {KEY}_k \+ threadIdx\.x < \4 && blockIdx\.x \* {TILE} \+ "
                 rf"threadIdx\.y < {_ID} \? {_ID}\[\(blockIdx\.x \* {TILE} \+ threadIdx\.y\) \* \4 \+ {KEY}_k \+ "
                 rf"threadIdx\.x\] : {_TILE_ZERO};")


def _tiled(transposed: bool) -> re.Pattern:
    """The squashed body forward writes; groups: c, r, acc, K, M, A, N, B, k, the tiled update, the epilogue."""
    width, load = (TILE + 1, _B_TRANSPOSED) if transposed else (TILE, _B_ROWS)
    return re.compile(
        rf"^{{ __shared__ {_TILE_TYPE} {KEY}_a\[{TILE}\]\[{TILE}\]; "
        rf"__shared__ {_TILE_TYPE} {KEY}_b\[{TILE}\]\[{width}\]; "
        rf"(?:{_BATCH_INDEX} )?(?:[A-Za-z_]\w* \+= [^;]+; ){{0,2}}"
        rf"int {_ID} = blockIdx\.x \* {TILE} \+ threadIdx\.x; int {_ID} = blockIdx\.y \* {TILE} \+ threadIdx\.y; "
        rf"float {_ID} = {FLOAT_ZERO}; for \(int {KEY}_k = 0; {KEY}_k < {_ID}; {KEY}_k \+= {TILE}\) {{ "
        rf"{KEY}_a\[threadIdx\.y\]\[threadIdx\.x\] = \2 < {_ID} && {KEY}_k \+ threadIdx\.x < \4 \? {_ID}\[\2 \* \4 "
        rf"\+ {KEY}_k \+ threadIdx\.x\] : {_TILE_ZERO}; {load} __syncthreads\(\); "
        rf"for \(int {_ID} = 0; \9 < {TILE} && {KEY}_k \+ \9 < \4; \+\+\9\) (\3 (?:\+)?= .+?); __syncthreads\(\); }} "
        rf"if \(\2 < \5 && \1 < \7\) {{ (.+) }} }}$")


_TILED = {transposed: _tiled(transposed) for transposed in (False, True)}
_EPILOGUE_FORBIDDEN = r"\b(?:threadIdx|blockIdx|blockDim|gridDim|__syncthreads\w*|__shfl\w*|for|while|do|goto|" \
                      r"return|break|continue|asm)\b"


@dataclass(frozen=True)
class Product:
    column: str  # c
    row: str  # r
    accumulator: str
    index: str  # k
    rows: str  # M
    columns: str  # N
    depth: str  # K
    left: str  # A: rows x K
    right: str  # B: K x columns
    zero: str  # the accumulator's first value, as written
    update: str  # the loop's one statement, as written (`acc += A[...] * B[...]` or `acc = fmaf(..., acc)`)
    transposed: bool  # B is stored N x K and read at B[c * K + k]
    batch: str = ""  # the batch index's declaration (`int b = blockIdx.z;`) of a batched product, else ""
    left_offset: str = ""  # X of `A[X + r * K + k]`: where a batch's (or a view's) A starts, else ""
    right_offset: str = ""  # Y of `B[Y + k * N + c]` (or `B[Y + c * K + k]`), else ""
    left_type: str = "float"  # A's element type: a 16-bit one is read through its conversion to float
    right_type: str = "float"

    @staticmethod
    def edge(element: str) -> str:
        """What a tile of `element` holds past the matrix's edge."""
        return "0.0f" if element == "float" else f"{element}(0.0f)"

    def reads(self) -> dict[str, str]:
        """Each operand read of the naive update, and its read from the tiles."""
        right = f"{self.column} * {self.depth} + {self.index}" if self.transposed else \
            f"{self.index} * {self.columns} + {self.column}"
        left = f"{self.row} * {self.depth} + {self.index}"
        return {f"{self.left}[{_offset(self.left_offset)}{left}]": f"{KEY}_a[threadIdx.y][{self.index}]",
                f"{self.right}[{_offset(self.right_offset)}{right}]": f"{KEY}_b[{self.index}][threadIdx.x]"}

    def starts(self) -> list[str]:
        """The batched form's first statements: the batch index, and each operand pointer moved to its start."""
        return ([self.batch] if self.batch else []) + [f"{operand} += {offset};" for operand, offset in
                                                       ((self.left, self.left_offset), (self.right, self.right_offset))
                                                       if offset]


def _offset(offset: str) -> str:
    return f"{offset} + " if offset else ""


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
                if f.is_kernel and any(pattern.match(squash(parsed.text(f.node.child_by_field_name("body"))))
                                       for pattern in _TILED.values())]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        state = inlined(canonical(state))  # the index as the naive forms spell it, the operands by name
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", KEY, parsed.text(function.node)[:200])
                for function, _ in readable(parsed, lambda f: _naive_product(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = inlined(canonical(state))  # the index as the naive forms spell it, the operands by name
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        product, epilogue = _naive_product(state, parsed, function)
        p, t = product, f"{KEY}_k"
        if p.transposed:  # lanes along k read a row of B (coalesced) and store it down a padded tile column
            width = TILE + 1
            load_b = (f"    {KEY}_b[threadIdx.x][threadIdx.y] = {t} + threadIdx.x < {p.depth} && blockIdx.x * {TILE} + "
                      f"threadIdx.y < {p.columns} ? {p.right}[(blockIdx.x * {TILE} + threadIdx.y) * {p.depth} + {t} + "
                      f"threadIdx.x] : {p.edge(p.right_type)};")
        else:
            width = TILE
            load_b = (f"    {KEY}_b[threadIdx.y][threadIdx.x] = {t} + threadIdx.y < {p.depth} && {p.column} < "
                      f"{p.columns} ? {p.right}[({t} + threadIdx.y) * {p.columns} + {p.column}] : "
                      f"{p.edge(p.right_type)};")
        lines = [f"__shared__ {p.left_type} {KEY}_a[{TILE}][{TILE}];",
                 f"__shared__ {p.right_type} {KEY}_b[{TILE}][{width}];",
                 *p.starts(),
                 f"int {p.column} = blockIdx.x * {TILE} + threadIdx.x;",
                 f"int {p.row} = blockIdx.y * {TILE} + threadIdx.y;",
                 f"float {p.accumulator} = {p.zero};",
                 f"for (int {t} = 0; {t} < {p.depth}; {t} += {TILE}) {{",
                 f"    {KEY}_a[threadIdx.y][threadIdx.x] = {p.row} < {p.rows} && {t} + threadIdx.x < {p.depth} ? "
                 f"{p.left}[{p.row} * {p.depth} + {t} + threadIdx.x] : {p.edge(p.left_type)};",
                 load_b,
                 "    __syncthreads();",
                 f"    for (int {p.index} = 0; {p.index} < {TILE} && {t} + {p.index} < {p.depth}; ++{p.index}) "
                 f"{_replaced(p.update, p.reads())};",
                 "    __syncthreads();",
                 "}",
                 f"if ({p.row} < {p.rows} && {p.column} < {p.columns}) {{"]
        plan = tiled_plan(state, function, product.rows, product.columns, (TILE, TILE), (TILE, TILE))
        return self._write(state, parsed, function, lines, epilogue, plan,
                           f"{function.name}: {TILE}x{TILE} shared tiles of {p.left} and {p.right}, block "
                           f"({TILE}, {TILE})")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        body = function.node.child_by_field_name("body")
        matches = {transposed: pattern.match(squash(parsed.text(body))) for transposed, pattern in _TILED.items()}
        transposed = next((t for t, m in matches.items() if m), None)
        if transposed is None:
            raise NotApplicable(f"{anchor}: not the tiled product forward writes")
        c, r, acc, depth, rows, left, columns, right, index, tiled = matches[transposed].groups()[:10]
        text = squash(parsed.text(body))
        zero = re.search(rf"float {acc} = ({FLOAT_ZERO});", text)[1]
        batch = re.search(_BATCH_INDEX, text)
        offsets = [re.search(rf"\b{operand} \+= ([^;]+);", text) for operand in (left, right)]
        product = Product(c, r, acc, index, rows, columns, depth, left, right, zero, "", transposed,
                          batch[0] if batch else "", *(found[1] if found else "" for found in offsets))
        update = _replaced(tiled, {tile: operand for operand, tile in product.reads().items()})
        lines = [f"int {c} = blockIdx.x * blockDim.x + threadIdx.x;",
                 f"int {r} = blockIdx.y * blockDim.y + threadIdx.y;",
                 *([product.batch] if product.batch else []),
                 f"if ({r} < {rows} && {c} < {columns}) {{",
                 f"    float {acc} = {zero};",
                 f"    for (int {index} = 0; {index} < {depth}; ++{index}) {update};"]
        guard = body.named_children[-1].child_by_field_name("consequence")
        epilogue = [node for node in guard.named_children if node.type != "comment"]
        return self._write(state, parsed, function, lines, epilogue, state.plan,
                           f"{function.name}: a direct product, one thread per output", Direction.BACKWARD)

    def _write(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function, lines: list[str],
               epilogue: list[Node], plan: LaunchPlan, note: str, direction: Direction = Direction.FORWARD) -> Rewrite:
        """The kernel's body as `lines`, then the epilogue's statements re-indented one level in, closing the guard
        `lines` open."""
        body = function.node.child_by_field_name("body")
        indent = indentation(parsed.data, body.named_children[0].start_byte)
        first, last = epilogue[0], epilogue[-1]
        text = reindent(parsed.data[first.start_byte:last.end_byte].decode("utf-8"),
                        len(indentation(parsed.data, first.start_byte)), indent + "    ")
        source_lines = [indent + line for line in lines] + [text, indent + "}"]
        start, end = body.named_children[0].start_byte, body.named_children[-1].end_byte
        source = splice(parsed.data, [(start, end, "\n".join(source_lines)[len(indent):])])[0].decode("utf-8")
        return self.rewrite(state, Anchor(function.name, "function", KEY), direction, source, plan=plan,
                            carrier={"tile": TILE}, note=note)


def _naive_product(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple[Product, list[Node]]:
    """(the product, the epilogue's statements: those after the loop) of a naive product kernel: the two index
    declarations in either order, then `if (r < M && c < N) { ... }` ending the kernel or `if (r >= M || c >= N)
    return;` and the same statements after it."""
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is not a kernel")
    listed = statements(function.node.child_by_field_name("body"))
    # a batched product declares its batch among its indexes: one layer of blocks per matrix
    batched = [node for node in listed[:3] if re.fullmatch(_BATCH_INDEX, squash(parsed.text(node)))]
    batch = squash(parsed.text(batched[0])) if batched else ""
    listed = [node for node in listed if node not in batched]
    indexes = dict(grid_index(parsed, node) for node in listed[:2])
    if len(listed) < 3 or set(indexes) != {"x", "y"} or listed[2].type != "if_statement" or \
            listed[2].child_by_field_name("alternative") is not None:
        raise NotApplicable(f"{function.name} is not a naive matrix product: two indexes and a guard")
    column, row = indexes["x"], indexes["y"]
    guard = listed[2]
    condition = squash(parsed.text(guard.child_by_field_name("condition")))[1:-1]
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
    first = re.fullmatch(rf"float {_ID} = ({FLOAT_ZERO});", squash(parsed.text(work[0])))
    loop = re.fullmatch(rf"for \(int {_ID} = 0; \1 < {_ID}; (?:\+\+\1|\1\+\+)\) (?:{{ )?(.+?);(?: }})?",
                        squash(parsed.text(work[1]))) if work[1].type == "for_statement" else None
    if first is None or loop is None:
        raise NotApplicable(f"{function.name} is not a naive matrix product: no zeroed float and loop over k")
    accumulator, zero = first.groups()
    index, depth, update = loop.groups()
    terms = next((m for m in (p.fullmatch(update) for p in _PRODUCTS) if m), None)
    if terms is None or terms["acc"] != accumulator:
        raise NotApplicable(f"{function.name}'s loop does not sum a product into {accumulator}")
    params = {name: (kind, pointer) for name, kind, pointer in parameters(parsed, function)}
    batch_name = batch.split()[1] if batch else ""
    reads = {terms["x"]: _at(terms["at_x"]), terms["y"]: _at(terms["at_y"])}
    left, left_offset = next(((a, x) for a, (x, at) in reads.items() if at == f"{row} * {depth} + {index}"),
                             (None, ""))
    right, right_offset = next(((a, x) for a, (x, at) in reads.items() if at == f"{index} * {columns} + {column}"),
                               (None, ""))
    transposed = right is None
    if transposed:
        right, right_offset = next(((a, x) for a, (x, at) in reads.items()
                                    if at == f"{column} * {depth} + {index}"), (None, ""))
    if left is None or right is None or left == right:
        raise NotApplicable(f"{function.name} does not read A[r * K + k] and B[k * N + c] (or B[c * K + k])")
    for operand, offset in ((left, left_offset), (right, right_offset)):  # where a batch's matrix starts
        names = set(re.findall(r"[A-Za-z_]\w*", offset))
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
                   batch, left_offset, right_offset, types[left], types[right]), work[2:]


def _at(subscript: str) -> tuple[str, str]:
    """(X, the rest) of a subscript `X + r * K + k` (X: a batch's or a view's start), or ("", subscript) where none
    leads: the rest is its last two terms."""
    terms = subscript.split(" + ")
    return (" + ".join(terms[:-2]), " + ".join(terms[-2:])) if len(terms) > 2 else ("", subscript)


# the update of a product loop: a sum of the operands' product, the fused form included, either operand first
_OPERAND = (r"(?P<cvt_{0}>(?:__half2float|__bfloat162float)\()?(?P<{0}>[A-Za-z_]\w*)\[(?P<at_{0}>[^][]+)\]"
            r"(?(cvt_{0})\))")
_PRODUCTS = (re.compile(rf"(?P<acc>[A-Za-z_]\w*) \+= {_OPERAND.format('x')} \* {_OPERAND.format('y')}"),
             re.compile(rf"(?P<acc>[A-Za-z_]\w*) = fmaf\({_OPERAND.format('x')}, {_OPERAND.format('y')}, (?P=acc)\)"))


def _replaced(text: str, reads: dict[str, str]) -> str:
    for old, new in reads.items():
        if text.count(old) != 1:
            raise NotApplicable(f"`{text}` does not read {old} once")
        text = text.replace(old, new)
    return text


register(UntileMatmul())
