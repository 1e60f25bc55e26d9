"""A matrix product tiled in shared memory by hand (the tutorial form: one output a thread, a T x T tile of A and
one of B loaded per step along k, a barrier, the tile's products summed, a barrier), read as the naive product it
computes, so that `unblock_matmul` can register-block it as it does the tiled form `untile_matmul` writes.

The form read, its names any, its statements in this order (the declarations before the loop in any order):

    __shared__ float As[T][T];  __shared__ float Bs[T][T];       // a column of padding allowed on either
    int tx = threadIdx.x, ty = threadIdx.y, bx = blockIdx.x;      // optional, never assigned
    int r = blockIdx.y * T + ty;  int c = blockIdx.x * T + tx;    // T a number, a constant or blockDim
    float acc = 0.0f;
    for (int t = 0; t < (K + T - 1) / T; ++t) {                   // or `for (int t = 0; t < K; t += T)`
        As[ty][tx] = r < M && t * T + tx < K ? A[r * K + t * T + tx] : 0.0f;   // or if / else; any order of terms
        Bs[ty][tx] = t * T + ty < K && c < N ? B[(t * T + ty) * N + c] : 0.0f; // or B stored N x K: B[c * K + ...]
        __syncthreads();
        for (int k = 0; k < T; ++k) acc += As[ty][k] * Bs[k][tx];   // or fmaf; `&& t * T + k < K` allowed
        __syncthreads();
    }
    if (r < M && c < N) { ...epilogue naming acc... }

with integer locals of the loop's body naming the offsets (`int ak = t * T + tx;`) read as their values, and every
launch's block (T, T). A batch of products (`int b = blockIdx.z;`, one layer of blocks a matrix) loads through views
of A and B at their matrix's start (`const float* Ab = A + (size_t)b * M * K;`, the start naming only the batch and
scalar parameters); the blocked form moves A and B there instead (`A += (size_t)b * M * K;`).

Each step loads A[r][t T + tx] and B[t T + ty][c] (0 past an edge) and adds As[ty][k] * Bs[k][tx] = A[r][t T + k] *
B[t T + k][c] for k < T, so the accumulator takes A[r][k] * B[k][c] for every k < K in the naive loop's order,
then products of two zeros past K: it starts at +0.0, which adding +0.0 never changes, so the sum is the naive
loop's to the bit. The product read has the naive update (`acc += A[r * K + k] * B[k * N +
c]`, the operands in the order the tile's update names them).

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from dataclasses import replace

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms._edit import is_written
from klineage.transforms._matmul import BATCH_INDEX, Product
from klineage.transforms._naive import FLOAT_ZERO, INTEGER_CAST, launches_of, parameters, squash, statements
from klineage.transforms._polynomials import Poly, constant, of_text
from klineage.transforms.base import NotApplicable

_ID = r"([A-Za-z_]\w*)"
_TILE = re.compile(rf"^__shared__ float {_ID}\[(\w+)\]\[(\w+)(?: \+ 1)?\];$")
_INT = r"(?:const )?int"
_LOCAL = re.compile(rf"^{_INT} {_ID} = (.+);$")
_ZERO = re.compile(rf"^float {_ID} = ({FLOAT_ZERO});$")
# an operand's matrix of a batch: `const float* Ab = A + (size_t)b * M * K;`
_VIEW = re.compile(rf"^const float ?\* ?(?:__restrict__ )?{_ID} = {_ID} \+ ([^;]+);$")
# the loop over the tiles: (t, its bound, its step); the base of a tile's columns is `t * T`, or t where it steps by T
_STEPS = re.compile(rf"^for \(int {_ID} = 0; \1 < (.+?); (?:\+\+\1|\1\+\+|\1 \+= (\w+))\)$")
_STORE = re.compile(rf"^{_ID}\[threadIdx\.y\]\[threadIdx\.x\] = \(?(.+?)\)? \? {_ID}\[(.+)\] : ({FLOAT_ZERO});$")
_IF_STORE = re.compile(rf"^if \((.+)\) {{? ?{_ID}\[threadIdx\.y\]\[threadIdx\.x\] = {_ID}\[(.+)\]; }}? ?else {{? ?"
                       rf"\2\[threadIdx\.y\]\[threadIdx\.x\] = ({FLOAT_ZERO}); ?}}?$")
_INNER = re.compile(rf"^for \(int {_ID} = 0; \1 < (\w+)(?: && (.+?) < (\w+))?; (?:\+\+\1|\1\+\+)\) {{? ?"
                    rf"{_ID} (?:\+= (.+?) \* (.+?)|= fmaf\((.+?), (.+?), \5\)); ?}}?$")
_COORDINATES = ("threadIdx", "blockIdx", "blockDim")
_HELD = frozenset({"threadIdx.x", "threadIdx.y", "blockIdx.x", "blockIdx.y"})  # what a coordinate local may hold


def hand_tiled_product(state: KernelState, parsed: cp.ParsedSource,
                       function: cp.Function) -> tuple[Product, list[Node]]:
    """(the naive product a hand-tiled kernel computes, the epilogue's statements), or NotApplicable saying what
    does not read as the form above."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    if re.search(r"\b(?:threadIdx|blockDim)\.z\b", parsed.text(body)):
        raise NotApplicable(f"{function.name} names a third thread dimension: no hand-tiled product")
    listed = statements(body)
    if len(listed) < 4 or listed[-1].type != "if_statement" or listed[-2].type != "for_statement":
        raise NotApplicable(f"{function.name} does not end in a loop over tiles and a guarded epilogue")
    reader = _Reader(state, parsed, function)
    for node in listed[:-2]:
        reader.declaration(squash(parsed.text(node)))
    product = reader.product(listed[-2], listed[-1])
    guard = listed[-1].child_by_field_name("consequence")
    epilogue = statements(guard) if guard.type == "compound_statement" else [guard]
    gone = set(reader.tiles) | set(reader.coordinates) | set(reader.views)  # what the blocked form does not declare
    if named := sorted(gone & {parsed.text(n) for node in epilogue for n in cp.nodes_of_type(node, "identifier")}):
        raise NotApplicable(f"{function.name}'s epilogue names {named[0]}, which only its tiled form declares")
    return product, epilogue


class _Reader:
    """What the declarations before the loop name, then the loop and the guard read against them."""

    def __init__(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function):
        self.state, self.parsed, self.function = state, parsed, function
        self.constants = parse_constants(state.source)
        self.written = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier") if is_written(n)}
        self.coordinates: dict[str, str] = {}  # tx -> threadIdx.x
        self.tiles: dict[str, tuple[str, str]] = {}
        self.indexes: dict[str, str] = {}  # "x" -> c, "y" -> r
        self.accumulator, self.zero = "", ""
        self.operands: set[str] = set()  # the float pointers the kernel only reads
        self.batch = ""  # a batch's declaration (`int b = blockIdx.z;`), one layer of blocks a matrix
        self.views: dict[str, tuple[str, str]] = {}  # Ab -> (A, the batch's start: `b * M * K`)
        self.side = self._block_side()

    def _block_side(self) -> int:
        sides = set()
        for launch in launches_of(self.state, self.function.name, dimensions=3):
            try:
                sides.add(tuple(expr.evaluate_int(str(d), self.constants) for d in (*launch.block, 1)[:3]))
            except ExpressionError:
                raise NotApplicable(f"{self.function.name}'s block is not a number") from None
        side, other, depth = sides.pop() if len(sides) == 1 else (0, 1, 1)
        if side != other or depth != 1:
            raise NotApplicable(f"{self.function.name}'s block is not one square T x T in every launch")
        return side

    def _number(self, text: str) -> int | None:
        try:
            return expr.evaluate_int(text, self.constants)
        except ExpressionError:
            return None

    def _coordinated(self, text: str) -> str:
        """`text` with each thread-coordinate local as its coordinate."""
        for name, coordinate in self.coordinates.items():
            text = re.sub(rf"\b{name}\b", coordinate, text)
        return text

    def declaration(self, text: str) -> None:
        if tile := _TILE.match(text):
            name, rows, columns = tile.groups()
            if self._number(rows) != self.side or self._number(columns) != self.side:
                raise NotApplicable(f"the tile {name} is not {self.side} x {self.side}, the block")
            self.tiles[name] = (rows, columns)
            return
        if zero := _ZERO.match(text):
            self.accumulator, self.zero = zero.groups()
            return
        if re.fullmatch(BATCH_INDEX, text) and not self.batch:
            self.batch = text
            return
        if view := _VIEW.match(text):
            self.views[view[1]] = (view[2], view[3])
            return
        declared = re.match(rf"^{_INT} (.+);$", text)
        parts = [p.strip() for p in declared[1].split(",")] if declared else []
        if not parts:
            raise NotApplicable(f"`{text}` is no tile, index or accumulator of a hand-tiled product")
        for part in parts:
            name, value = (s.strip() for s in part.split("=", 1)) if "=" in part else (part, "")
            if name in self.written:
                raise NotApplicable(f"{name} is assigned")
            if value in _HELD:
                self.coordinates[name] = value
            elif axis := self._index_axis(self._coordinated(value)):
                self.indexes[axis] = name
            else:
                raise NotApplicable(f"`{part}` is no thread coordinate or output index")

    def _index_axis(self, value: str) -> str:
        """"x" or "y" where `value` is blockIdx.<axis> * T + threadIdx.<axis> (T the block's side), else ""."""
        for axis in "xy":
            got = _poly(value.replace(f"blockDim.{axis}", str(self.side)), self.constants)
            if got is not None and got == _poly(f"blockIdx.{axis} * {self.side} + threadIdx.{axis}", self.constants):
                return axis
        return ""

    def product(self, loop: Node, guard: Node) -> Product:
        if len(self.tiles) != 2 or set(self.indexes) != {"x", "y"} or not self.accumulator:
            raise NotApplicable(f"{self.function.name} does not declare two tiles, the two output indexes and a "
                                "zeroed accumulator")
        column, row = self.indexes["x"], self.indexes["y"]
        rows, columns = self._extents(guard, row, column)
        header = squash(self.parsed.data[loop.start_byte:loop.child_by_field_name("body").start_byte].decode())
        steps = _STEPS.match(header)
        body = loop.child_by_field_name("body")
        if steps is None or body.type != "compound_statement":
            raise NotApplicable(f"`{header}` is not a loop over tiles from 0")
        t, bound, step = steps.groups()
        depth, base = self._depth(t, bound, step)
        self._check_operands(rows, columns, depth)
        listed = [node for node in statements(body) if node.type != "preproc_call"]  # `#pragma unroll`
        locals_: dict[str, str] = {}
        while listed and (local := _LOCAL.match(self._coordinated(squash(self.parsed.text(listed[0]))))):
            if local[1] in self.written:
                raise NotApplicable(f"{local[1]} is assigned")
            locals_[local[1]] = f"({local[2]})"
            listed = listed[1:]
        texts = [_inlined(self._coordinated(squash(self.parsed.text(n))), locals_) for n in listed]
        if len(texts) != 5 or texts[2] != "__syncthreads();" or texts[4] != "__syncthreads();":
            raise NotApplicable(f"{self.function.name}'s loop over tiles is not two loads, a barrier, the tile's "
                                "products and a barrier")
        (a_tile, a_guard, a, a_at), (b_tile, b_guard, b, b_at) = (_load(text) for text in texts[:2])
        (a, a_start), (b, b_start) = (self._operand(name) for name in (a, b))
        if a_tile == b_tile or {a_tile, b_tile} != set(self.tiles) or a == b or \
                not {a, b} <= self.operands:
            raise NotApplicable(f"{self.function.name}'s tiles are not loaded from two float pointers it only reads")
        k_a, k_b = f"{base} + threadIdx.x", f"{base} + threadIdx.y"
        if _conjuncts(a_guard, self.constants) != _conjuncts(f"{row} < {rows} && {k_a} < {depth}", self.constants) \
                or not _same(a_at, f"{row} * {depth} + {k_a}", self.constants):
            raise NotApplicable(f"{a_tile} does not hold A[{row}][{k_a}], 0 past M and K")
        if _conjuncts(b_guard, self.constants) != _conjuncts(f"{k_b} < {depth} && {column} < {columns}",
                                                             self.constants):
            raise NotApplicable(f"{b_tile} is not guarded by {k_b} < {depth} and {column} < {columns}")
        transposed = _same(b_at, f"{column} * {depth} + {k_b}", self.constants)
        if not transposed and not _same(b_at, f"({k_b}) * {columns} + {column}", self.constants):
            raise NotApplicable(f"{b_tile} does not hold B[{k_b}][{column}] (B stored K x N or N x K)")
        index, first, second, fused = self._inner(texts[3], base, depth, a_tile, b_tile)
        product = Product(column, row, self.accumulator, index, rows, columns, depth, a, b, self.zero, "", transposed,
                          self.batch, a_start, b_start)
        left, right = product.operands()
        x, y = (left, right) if first == a_tile else (right, left)
        acc = self.accumulator
        return replace(product, update=f"{acc} = fmaf({x}, {y}, {acc})" if fused else f"{acc} += {x} * {y}")

    def _operand(self, name: str) -> tuple[str, str]:
        """(the pointer parameter a tile loads from, where a batch's matrix starts in it: "" for the pointer itself)
        of the name a load reads: the parameter, or a view of it at an offset naming only the batch index and scalar
        parameters (cast or not)."""
        if name not in self.views:
            return name, ""
        operand, start = self.views[name]
        batch = self.batch.split(" = ")[0].split()[-1] if self.batch else None
        names = set(re.findall(r"[A-Za-z_]\w*", re.sub(INTEGER_CAST, "", start)))
        params = {p: pointer for p, _, pointer in parameters(self.parsed, self.function)}
        if name in self.written or batch is None or batch not in names or \
                any(n != batch and (params.get(n, True) or n in self.written) for n in names):
            raise NotApplicable(f"{name} starts at `{start}`, which names more than the batch and scalar parameters")
        return operand, start

    def _extents(self, guard: Node, row: str, column: str) -> tuple[str, str]:
        """(M, N) of the epilogue's guard `r < M && c < N` (either order; no else)."""
        condition = squash(self.parsed.text(guard.child_by_field_name("condition")))
        found = dict(re.findall(rf"\b({row}|{column}) < {_ID}", condition))
        if guard.child_by_field_name("alternative") is not None or set(found) != {row, column} or \
                _conjuncts(condition, self.constants) != _conjuncts(f"{row} < {found[row]} && {column} < "
                                                                    f"{found[column]}", self.constants):
            raise NotApplicable(f"{self.function.name}'s epilogue is not guarded by {row} < M && {column} < N")
        return found[row], found[column]

    def _depth(self, t: str, bound: str, step: str | None) -> tuple[str, str]:
        """(K, the base of a tile's columns) of the loop over tiles: `t < K; t += T` from t, or `t < (K + T - 1) /
        T; ++t` from t * T."""
        if step is not None:
            if self._number(step) != self.side or not re.fullmatch(r"\w+", bound):
                raise NotApplicable(f"the loop over tiles does not step by the tile's {self.side} to a bound K")
            return bound, t
        count = re.fullmatch(r"\((\w+) \+ (\w+) - 1\) / (\w+)", bound)
        if count is None or self._number(count[2]) != self.side or self._number(count[3]) != self.side:
            raise NotApplicable(f"the loop over tiles does not count cdiv(K, {self.side}) tiles")
        return count[1], f"{t} * {self.side}"

    def _check_operands(self, rows: str, columns: str, depth: str) -> None:
        params = {name: (kind, pointer) for name, kind, pointer in parameters(self.parsed, self.function)}
        if len({rows, columns, depth}) != 3 or any(
                params.get(n, ("", True))[1] or params[n][0] not in ("int", "const int") or n in self.written
                for n in (rows, columns, depth)):
            raise NotApplicable(f"{self.function.name}'s M, N and K are not three int parameters it never assigns")
        self.operands = {name for name, (kind, pointer) in params.items()
                         if pointer and kind.removeprefix("const ") == "float" and name not in self.written}

    def _inner(self, text: str, base: str, depth: str, a_tile: str, b_tile: str) -> tuple[str, str, str, bool]:
        """(k, the tile read first, the other, whether fused) of the tile's products: `for (k = 0; k < T[ && base +
        k < K]; ++k) acc += A_tile[threadIdx.y][k] * B_tile[k][threadIdx.x];` (either factor first), or `acc =
        fmaf(..., ..., acc)`."""
        inner = _INNER.match(text)
        if inner is None or inner[5] != self.accumulator or self._number(inner[2]) != self.side:
            raise NotApplicable(f"`{text}` does not sum the tile's {self.side} products into {self.accumulator}")
        index, _, stop, stop_bound, _, first, second, fused_first, fused_second = inner.groups()
        fused = fused_first is not None
        first, second = (fused_first, fused_second) if fused else (first, second)
        if stop and not (_same(stop, f"{base} + {index}", self.constants) and stop_bound == depth):
            raise NotApplicable(f"`{text}` stops otherwise than at K")
        reads = {f"{a_tile}[threadIdx.y][{index}]": a_tile, f"{b_tile}[{index}][threadIdx.x]": b_tile}
        if {first, second} != set(reads):
            raise NotApplicable(f"`{text}` does not multiply {a_tile}[threadIdx.y][k] by {b_tile}[k][threadIdx.x]")
        return index, reads[first], reads[second], fused


def _inlined(text: str, locals_: dict[str, str]) -> str:
    """`text` with each local of the loop's body (`int ak = t * T + tx;`) as its parenthesized value."""
    for name, value in locals_.items():
        text = re.sub(rf"\b{name}\b", value, text)
    return text


def _load(text: str) -> tuple[str, str, str, str]:
    """(the tile, its guard, the operand, the operand's subscript) of a tile's load, as a ternary or if / else."""
    if found := _STORE.match(text):
        tile, condition, operand, at, _ = found.groups()
        return tile, condition, operand, at
    if found := _IF_STORE.match(text):
        condition, tile, operand, at, _ = found.groups()
        return tile, condition, operand, at
    raise NotApplicable(f"`{text}` is not a tile's load of one element, 0 past the edges")


def _poly(text: str, constants: dict) -> Poly | None:
    """The integer expression `text` as a polynomial: the thread coordinates names of their own, an integer constant
    its value; None where it is no polynomial."""
    for coordinate in _COORDINATES:
        text = re.sub(rf"\b{coordinate}\.([xyz])\b", rf"{coordinate}_\1", text)
    return of_text(text, {name: constant(value) for name, value in constants.items() if isinstance(value, int)})


def _same(text: str, want: str, constants: dict) -> bool:
    got = _poly(text, constants)
    return got is not None and got == _poly(want, constants)


def _conjuncts(text: str, constants: dict) -> set[tuple] | None:
    """The `&&`-joined comparisons `L < R` of `text` as (polynomial of L, R); None where a term is no such
    comparison."""
    found = set()
    for term in _unwrapped(text).split(" && "):
        compared = _unwrapped(term).rsplit(" < ", 1)
        left = _poly(compared[0], constants) if len(compared) == 2 and re.fullmatch(r"\w+", compared[1]) else None
        if left is None:
            return None
        found.add((left, compared[1]))
    return found


def _unwrapped(text: str) -> str:
    """`text` without parentheses around the whole of it."""
    text = text.strip()
    while text.startswith("(") and _closing(text) == len(text) - 1:
        text = text[1:-1].strip()
    return text


def _closing(text: str) -> int:
    """Where the parenthesis opening `text` closes (-1 where it does not)."""
    depth = 0
    for at, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return at
    return -1
