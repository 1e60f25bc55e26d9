"""unblock_matmul: a register-blocked tiled product (each thread a 4 x 4 micro-tile of outputs from 64 x 64 shared
tiles) computes one output per thread from 16 x 16 tiles.

The mechanism (forward): the tiled product `untile_matmul` writes (a block of 16 x 16 threads, each computing one
output from 16 x 16 shared tiles of A and B per step of 16 along k) reads two shared values per multiply-add. The
forward makes the same block compute a 64 x 64 tile of outputs, each thread 16 of them: rows r0 + 16 i and columns
c0 + 16 j (i, j < 4; r0, c0 its first output's row and column, 16 apart so that a warp's shared reads and global
stores stay on consecutive columns). Per step of 16 along k the block loads a 64 x 16 tile of A and a 16 x 64 tile
of B (each thread four elements of each, zero past the edges) and, per k, each thread copies its four values of A
and four of B into registers and multiplies every pair: 8 shared reads feed 16 multiply-adds instead of 32.
- Each output keeps its own accumulator (`block_acc[i][j]`) and takes its products in the naive kernel's k order
  with the loop's own statement (operand reads and accumulator renamed), stopping at K: the result is the tiled
  (and the naive) kernel's to the bit, for M, N and K that 64 and 16 need not divide.
- The epilogue runs once per micro-tile output, under that output's bounds, with `r`, `c` and the accumulator
  declared as that output's: the statements as written.
- B stored N x K (a linear layer's weight) is loaded along k, a row of B across the lanes, and stored down a
  column of a 16 x 65 tile (the padding spreads a column over the banks). A stored K x M (`A[k * M + r]`, C = A^T
  B) likewise: loaded along r, a row of A across the lanes, stored down a column of a 64 x 17 tile. A batch's
  pointer moves and 16-bit tiles (with 16-bit registers, converted by the update as before) stay as the tiled form
  has them.
- The indexes keep the tiled form's widths: 64-bit rows and columns (`long long` first output's row and column, and
  each output's `r` and `c`) with a block's first row and column formed in 64 bits, the step along k in its own
  type, so every subscript and the epilogue compute what they did.
- The plan's launches keep their block (16, 16) and get the grid (cdiv(N, 64), cdiv(M, 64), Z).

Backward writes the tiled form back from the blocked one, and the plan's grid (cdiv(N, 16), cdiv(M, 16), Z).

A product tiled in shared memory by hand (the CUDA tutorials' form: T x T tiles of A and B loaded per step along k,
one output a thread, B stored K x N or N x K, T a number or constant the square block has) is read as the naive
product it computes (`_hand_tiles.py` says which spellings and why its sum is the naive loop's to the bit) and
blocked the same way; its backward is the tiled form untile_matmul writes, which computes the same.

Legality (forward_sites), conservative: the kernel's body is exactly the tiled form untile_matmul's forward
writes (its lines rewritten from the product they read as, then compared), or one tiled by hand as above,
whose update is the product's
(`acc += A[...] * B[...]`, either operand first, or `fmaf`, each operand through its tile type's conversion);
every launch of the kernel is exactly the one that forward writes (block (16, 16), grid (cdiv(N, 16),
cdiv(M, 16)), a third dimension only for a batch; a hand-tiled kernel's block is its tile's T x T) and passes no
buffer twice; the kernel names nothing `block_...`.
The epilogue, now run 16 times in a thread, must not tell: it names the accumulator and none of A, B, the loop
index, a tile, a thread coordinate, a barrier, a loop or a jump; it calls only functions with no effect
(`_calls.first_effect`: the math library, the 16-bit types' conversions and arithmetic such as `__half2float` and
`__float2half`, and the source's functions that call only those), takes no address and dereferences no pointer,
does not declare the accumulator again; it assigns only the accumulator, names it declares and elements of arrays
(pointer parameters or its own), and touches each array it writes at one subscript only (reading another output's
element, written by this thread or another, would tell). Anything else: no site.

Anchor: the kernel, kind "function", key "block".
"""

from __future__ import annotations

import re
from dataclasses import replace

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import register
from klineage.transforms._calls import MATH_CALLS, first_effect
from klineage.transforms._edit import declared_names, unparen
from klineage.transforms._hand_tiles import hand_tiled_product
from klineage.transforms._matmul import (
    BATCH_INDEX,
    CONVERSIONS,
    TILE,
    TILE_TYPE,
    TILED_NAMES,
    Product,
    expected_body,
    is_tiled,
    replaced,
    tiled_lines,
    tiled_product,
    written,
)
from klineage.transforms._naive import (
    FLOAT_ZERO,
    FORBIDDEN,
    LOOP_INDEX_TYPES,
    kernel,
    launches_of,
    parameters,
    readable,
    squash,
    statements,
    tiled_plan,
)
from klineage.transforms._packings import HALF_CALLS
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

KEY = "block"
MICRO = 4  # a thread's outputs along each side of its micro-tile
SPAN = TILE * MICRO  # a block's outputs along each side: its 16 threads, 4 outputs each
ACCUMULATOR = f"{KEY}_acc[{KEY}_i][{KEY}_j]"
DEPTH = 3  # the blocks around the epilogue: the loops over the micro-tile's rows and columns, the output's guard
# what an epilogue may call: the math library and the 16-bit types' conversions and arithmetic, values of their
# arguments alone (a __half output is stored through `__float2half`)
_PURE_CALLS = MATH_CALLS | HALF_CALLS
_ID = r"([A-Za-z_]\w*)"
_WIDENED = r"(?:\(long long\))?"  # a 64-bit index's block start is formed in 64 bits
# the blocked form's names the reader takes its product from (squashed body); the rest is checked by rewriting
_FIELDS = {
    "types": rf"__shared__ ({TILE_TYPE}) {KEY}_a\[{SPAN}\]\[({TILE}|{TILE + 1})\]; __shared__ ({TILE_TYPE}) "
             rf"{KEY}_b\[{TILE}\]\[({SPAN}|{SPAN + 1})\];",
    # A's load: groups M, K, A (stored M x K) or K, M, A (stored K x M)
    "left": rf"(?:< {_ID} && {KEY}_k \+ threadIdx\.x < {_ID} \? {_ID}\[\({KEY}_r \+ {TILE} \* {KEY}_i\) \*|"
            rf"{KEY}_a\[threadIdx\.x \+ {TILE} \* {KEY}_i\]\[threadIdx\.y\] = {KEY}_k \+ threadIdx\.y < {_ID} && "
            rf"{_WIDENED}blockIdx\.y \* {SPAN} \+ threadIdx\.x \+ {TILE} \* {KEY}_i < {_ID} \? {_ID}\[)",
    "right": rf"{KEY}_b\[[^;]*< {_ID} \? {_ID}\[\((?:{KEY}_k \+ threadIdx\.y|{_WIDENED}blockIdx\.x \* {SPAN} \+ "
             rf"threadIdx\.y \+ {TILE} \* {KEY}_i)\) \*",
    # the indexes' types: the block's first output's column and row, and the step along k
    "indexes": rf"(int|long long) {KEY}_c = {_WIDENED}blockIdx\.x \* {SPAN} \+ threadIdx\.x; "
               rf"(int|long long) {KEY}_r = ",
    "step": rf"for \(({LOOP_INDEX_TYPES}) {KEY}_k = 0; ",
    "zero": rf"{re.escape(ACCUMULATOR)} = ({FLOAT_ZERO});",
    "index": rf"for \(int {_ID} = 0; \1 < {TILE} && {KEY}_k \+",
    "update": rf"\+\+{KEY}_j\) ([^;]+); }}",
    "output": rf"(?:int|long long) {_ID} = {KEY}_r \+ {TILE} \* {KEY}_i; "
              rf"(?:int|long long) {_ID} = {KEY}_c \+ {TILE} \* {KEY}_j; "
              rf"if \(\1 < {_ID} && \2 < {_ID}\) {{ float {_ID} = ",
}


class UnblockMatmul(Transform):
    name = "unblock_matmul"
    intent = ("Register-block a tiled matrix product: each thread computes a 4x4 micro-tile of outputs from 64x64 "
              "shared tiles, reusing every value it reads from shared memory across four outputs.")
    placement = Placement.ANALYSIS
    # a product's shared tiles, grown for register reuse: the cards of shared staging and of the tiles lend it
    kin = ("unstage_shared", "untile_matmul")

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [_anchor(parsed, function) for function in cp.functions(parsed) if _is_blocked(parsed, function)]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [_anchor(parsed, function) for function, _ in readable(parsed, lambda f: _tiled_site(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        p, epilogue = _tiled_site(state, parsed, function)
        plan = tiled_plan(state, function, p.rows, p.columns, (SPAN, SPAN), (TILE, TILE))
        return self._write(state, parsed, function, blocked_lines(p), epilogue, DEPTH, plan,
                           f"{function.name}: {MICRO}x{MICRO} outputs per thread from {SPAN}x{SPAN} shared tiles of "
                           f"{p.left} and {p.right}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        p, epilogue = _blocked_product(parsed, function)
        plan = tiled_plan(state, function, p.rows, p.columns, (TILE, TILE), (TILE, TILE))
        return self._write(state, parsed, function, tiled_lines(p), epilogue, 1, plan,
                           f"{function.name}: one output per thread from {TILE}x{TILE} shared tiles",
                           Direction.BACKWARD)

    def _write(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function, lines: list[str],
               epilogue: list[Node], depth: int, plan: LaunchPlan, note: str,
               direction: Direction = Direction.FORWARD) -> Rewrite:
        return self.rewrite(state, Anchor(function.name, "function", KEY), direction,
                            written(parsed, function, lines, epilogue, depth), plan=plan,
                            carrier={"micro": MICRO, "tile": SPAN}, note=note)


def _anchor(parsed: cp.ParsedSource, function: cp.Function) -> Anchor:
    return Anchor(function.name, "function", KEY, parsed.text(function.node)[:200])


def blocked_lines(p: Product) -> list[str]:
    """The blocked form's body up to and including the declaration of one output's accumulator, which opens the
    epilogue's scope inside the loops over the micro-tile and the output's guard."""
    i, j, k = f"{KEY}_i", f"{KEY}_j", f"{KEY}_k"
    each_i, each_j = (f"for (int {n} = 0; {n} < {MICRO}; ++{n})" for n in (i, j))
    a_row, b_column = f"{KEY}_r + {TILE} * {i}", f"{KEY}_c + {TILE} * {i}"
    if p.transposed:  # lanes along k read a row of B (coalesced) and store it down a padded tile column
        width, b_row = SPAN + 1, f"{p.first('x', SPAN)} + threadIdx.y + {TILE} * {i}"
        load_b = (f"{KEY}_b[threadIdx.x][threadIdx.y + {TILE} * {i}] = {k} + threadIdx.x < {p.depth} && {b_row} < "
                  f"{p.columns} ? {p.right}[({b_row}) * {p.depth} + {k} + threadIdx.x] : {p.edge(p.right_type)};")
    else:
        width = SPAN
        load_b = (f"{KEY}_b[threadIdx.y][threadIdx.x + {TILE} * {i}] = {k} + threadIdx.y < {p.depth} && {b_column} < "
                  f"{p.columns} ? {p.right}[({k} + threadIdx.y) * {p.columns} + {b_column}] : {p.edge(p.right_type)};")
    if p.left_transposed:  # lanes along r read a row of A (coalesced) and store it down a padded tile column
        left_width, a_column = TILE + 1, f"{p.first('y', SPAN)} + threadIdx.x + {TILE} * {i}"
        load_a = (f"{KEY}_a[threadIdx.x + {TILE} * {i}][threadIdx.y] = {k} + threadIdx.y < {p.depth} && {a_column} < "
                  f"{p.rows} ? {p.left}[({k} + threadIdx.y) * {p.rows} + {a_column}] : {p.edge(p.left_type)};")
    else:
        left_width = TILE
        load_a = (f"{KEY}_a[threadIdx.y + {TILE} * {i}][threadIdx.x] = {a_row} < {p.rows} && {k} + threadIdx.x < "
                  f"{p.depth} ? {p.left}[({a_row}) * {p.depth} + {k} + threadIdx.x] : {p.edge(p.left_type)};")
    left, right = p.operands()
    update = re.sub(rf"\b{p.accumulator}\b", ACCUMULATOR,
                    replaced(p.update, {left: f"{KEY}_ra[{i}]", right: f"{KEY}_rb[{j}]"}))
    return [f"__shared__ {p.left_type} {KEY}_a[{SPAN}][{left_width}];",
            f"__shared__ {p.right_type} {KEY}_b[{TILE}][{width}];",
            *p.starts(),
            f"{p.column_type} {KEY}_c = {p.first('x', SPAN)} + threadIdx.x;",
            f"{p.row_type} {KEY}_r = {p.first('y', SPAN)} + threadIdx.y;",
            f"float {KEY}_acc[{MICRO}][{MICRO}];",
            each_i,
            f"    {each_j} {ACCUMULATOR} = {p.zero};",
            f"for ({p.index_type} {k} = 0; {k} < {p.depth}; {k} += {TILE}) {{",
            f"    {each_i} {{",
            f"        {load_a}",
            f"        {load_b}",
            "    }",
            "    __syncthreads();",
            f"    for (int {p.index} = 0; {p.index} < {TILE} && {k} + {p.index} < {p.depth}; ++{p.index}) {{",
            f"        {p.left_type} {KEY}_ra[{MICRO}];",  # the registers every output of a row or column reuses
            f"        {p.right_type} {KEY}_rb[{MICRO}];",
            f"        {each_i} {{",
            f"            {KEY}_ra[{i}] = {KEY}_a[threadIdx.y + {TILE} * {i}][{p.index}];",
            f"            {KEY}_rb[{i}] = {KEY}_b[{p.index}][threadIdx.x + {TILE} * {i}];",
            "        }",
            f"        {each_i}",
            f"            {each_j} {update};",
            "    }",
            "    __syncthreads();",
            "}",
            f"{each_i} {{",
            f"    {each_j} {{",
            f"        {p.row_type} {p.row} = {KEY}_r + {TILE} * {i};",
            f"        {p.column_type} {p.column} = {KEY}_c + {TILE} * {j};",
            f"        if ({p.row} < {p.rows} && {p.column} < {p.columns}) {{",
            f"            float {p.accumulator} = {ACCUMULATOR};"]


def _blocked_product(parsed: cp.ParsedSource, function: cp.Function) -> tuple[Product, list[Node]]:
    """(the product, with its naive update; the epilogue's statements) of a kernel in the blocked form: its names
    read from the body, which must then be exactly what `blocked_lines` writes for them."""
    body = function.node.child_by_field_name("body") if function.is_kernel else None
    text = squash(parsed.text(body)) if body is not None else ""
    found = {name: re.search(pattern, text) for name, pattern in _FIELDS.items()}
    epilogue = _nested_epilogue(body) if body is not None else []
    if not all(found.values()) or not epilogue:
        raise NotApplicable(f"{function.name}: not the register-blocked product unblock_matmul's forward writes")
    left_type, left_width, right_type, width = found["types"].groups()
    left_transposed = found["left"][1] is None
    rows, depth, left = found["left"].groups()[:3]
    if left_transposed:
        depth, rows, left = found["left"].groups()[3:]
    columns, right = found["right"].groups()
    row, column, _, _, accumulator = found["output"].groups()
    column_type, row_type = found["indexes"].groups()
    batch = re.search(BATCH_INDEX, text)
    offsets = [re.search(rf"\b{operand} \+= ([^;]+);", text) for operand in (left, right)]
    product = Product(column, row, accumulator, found["index"][1], rows, columns, depth, left, right,
                      found["zero"][1], "", width == str(SPAN + 1), batch[0] if batch else "",
                      *(offset[1] if offset else "" for offset in offsets), left_type, right_type,
                      left_width == str(TILE + 1), column_type, row_type, found["step"][1])
    a_read, b_read = product.operands()
    update = replaced(found["update"][1].replace(ACCUMULATOR, accumulator),
                      {f"{KEY}_ra[{KEY}_i]": a_read, f"{KEY}_rb[{KEY}_j]": b_read})
    product = replace(product, update=update)
    if text != expected_body(blocked_lines(product), _text(parsed, epilogue), DEPTH):
        raise NotApplicable(f"{function.name}: not exactly the register-blocked product unblock_matmul's forward "
                            f"writes")
    return product, epilogue


def _is_blocked(parsed: cp.ParsedSource, function: cp.Function) -> bool:
    try:
        _blocked_product(parsed, function)
    except NotApplicable:
        return False
    return True


def _nested_epilogue(body: Node) -> list[Node]:
    """The statements after the accumulator's declaration in the guard the body's last statement (the loops over
    the micro-tile) ends in; [] where the body does not end so."""
    listed = statements(body)
    for _ in range(2):  # the loops over the micro-tile's rows and columns, each with a block
        loop = listed[-1] if listed else None
        inner = loop.child_by_field_name("body") if loop is not None and loop.type == "for_statement" else None
        listed = statements(inner) if inner is not None and inner.type == "compound_statement" else []
    loop = listed[-1] if listed else None
    guard = loop.child_by_field_name("consequence") if loop is not None and loop.type == "if_statement" else None
    return statements(guard)[1:] if guard is not None and guard.type == "compound_statement" else []


def _text(parsed: cp.ParsedSource, epilogue: list[Node]) -> str:
    return parsed.data[epilogue[0].start_byte:epilogue[-1].end_byte].decode("utf-8")


def _tiled_site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple[Product, list[Node]]:
    """(the product, the epilogue's statements) of a kernel in exactly the tiled form untile_matmul's forward
    writes, launched as it launches it, whose epilogue may run once per micro-tile output."""
    if not function.is_kernel or function.node.child_by_field_name("body") is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    canonical = is_tiled(parsed, function)
    if canonical:
        product, epilogue = tiled_product(parsed, function)
        body = function.node.child_by_field_name("body")
        if squash(parsed.text(body)) != expected_body(tiled_lines(product), _text(parsed, epilogue), 1):
            raise NotApplicable(f"{function.name}: not exactly the tiled product untile_matmul's forward writes")
    else:  # tiled by hand: read as the naive product it computes (its launch's block checked by the reading)
        product, epilogue = hand_tiled_product(state, parsed, function)
        tiled_plan(state, function, product.rows, product.columns, (SPAN, SPAN), (TILE, TILE))  # M, N passed
    _check_update(function, product)
    if named := sorted(n for n in _identifiers(parsed, function.node) if n.startswith(f"{KEY}_")):
        raise NotApplicable(f"{function.name} names '{named[0]}', a name the blocked form declares")
    _check_epilogue(parsed, function, product, epilogue)
    launches_of(state, function.name, dimensions=3 if product.batch else 2)
    if canonical and tiled_plan(state, function, product.rows, product.columns, (TILE, TILE), (TILE, TILE)) != \
            state.plan:
        raise NotApplicable(f"{function.name}'s launch is not the tiled one: block ({TILE}, {TILE}), grid "
                            f"(cdiv(N, {TILE}), cdiv(M, {TILE}))")
    return product, epilogue


def _check_update(function: cp.Function, p: Product) -> None:
    """NotApplicable unless the update sums the product of A's and B's reads (each through its tile type's
    conversion) into the accumulator: the blocked form renames exactly those three."""
    x, y = (f"{CONVERSIONS[kind]}({read})" if CONVERSIONS[kind] else read
            for kind, read in zip((p.left_type, p.right_type), p.operands(), strict=True))
    acc = p.accumulator
    if p.update not in (f"{acc} += {x} * {y}", f"{acc} += {y} * {x}", f"{acc} = fmaf({x}, {y}, {acc})",
                        f"{acc} = fmaf({y}, {x}, {acc})"):
        raise NotApplicable(f"{function.name}'s update `{p.update}` is not the product of {x} and {y} summed into "
                            f"{acc}")


def _identifiers(parsed: cp.ParsedSource, node: Node) -> set[str]:
    return {parsed.text(n) for n in cp.nodes_of_type(node, "identifier")}


def _check_epilogue(parsed: cp.ParsedSource, function: cp.Function, p: Product, epilogue: list[Node]) -> None:
    """NotApplicable where the epilogue, run once per output of a thread's micro-tile, could tell: see the module's
    legality."""
    text = " ".join(squash(parsed.text(node)) for node in epilogue)
    names = set().union(*(_identifiers(parsed, node) for node in epilogue))
    declared = {name for node in epilogue for name in declared_names(parsed, node)}
    if p.accumulator not in names or p.accumulator in declared or FORBIDDEN.search(text) or \
            names & {p.left, p.right, p.index, *TILED_NAMES}:
        raise NotApplicable(f"{function.name}'s epilogue does not only finish the accumulator")
    if effect := next((e for e in (first_effect(parsed, node, _PURE_CALLS) for node in epilogue) if e), None):
        raise NotApplicable(f"{function.name}'s epilogue calls {effect}, which may have an effect")
    if any(cp.nodes_of_type(node, "pointer_expression") for node in epilogue):
        raise NotApplicable(f"{function.name}'s epilogue takes an address or dereferences a pointer")
    pointers = {name for name, _, pointer in parameters(parsed, function) if pointer}
    places: dict[str, set[str]] = {}  # an array the epilogue writes -> the subscripts it names it at
    for node in epilogue:
        for change in cp.nodes_of_type(node, "assignment_expression", "update_expression"):
            target = unparen(change.child_by_field_name("left" if change.type == "assignment_expression" else
                                                        "argument"))
            array = target.child_by_field_name("argument") if target.type == "subscript_expression" else None
            if target.type == "identifier" and parsed.text(target) in declared | {p.accumulator}:
                continue
            if array is None or array.type != "identifier" or parsed.text(array) not in pointers | declared:
                raise NotApplicable(f"{function.name}'s epilogue assigns `{squash(parsed.text(target))}`, which "
                                    f"outlives its output")
            places[parsed.text(array)] = set()
    for node in epilogue:
        for subscript in cp.nodes_of_type(node, "subscript_expression"):
            array = parsed.text(subscript.child_by_field_name("argument"))
            if array in places:
                places[array].add(squash(parsed.text(subscript.child_by_field_name("indices"))))
    if crossed := sorted(array for array, at in places.items() if len(at) > 1):
        raise NotApplicable(f"{function.name}'s epilogue touches {crossed[0]}, which it writes, at another output")


register(UnblockMatmul())
