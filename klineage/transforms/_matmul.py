"""Shared reading and writing of the matrix-product forms: the product a kernel computes (`Product`), the 16 x 16
shared-tiled form `untile_matmul`'s forward writes (its lines, and the product read back from them), and a
kernel's body rewritten around its epilogue. `untile_matmul` goes between the naive form and the tiled one,
`unblock_matmul` between the tiled form and the register-blocked one.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._canonical import WIDE, WIDE_TYPES
from klineage.transforms._edit import indentation, reindent, splice
from klineage.transforms._naive import FLOAT_ZERO, LOOP_INDEX_TYPES, squash, statements
from klineage.transforms.base import NotApplicable

TILE = 16
KEY = "tile"
TILED_NAMES = (f"{KEY}_a", f"{KEY}_b", f"{KEY}_k")  # what the tiled form declares
# a batched product's batch: one block layer per matrix, declared `int`, in blockIdx.z's own type (`_canonical`
# names an inline blockIdx.z so) or in 64 bits; the forwards keep the declaration as it is, so every offset computes
# what it did
BATCH_INDEX = rf"(?:int|unsigned int|{'|'.join(sorted(WIDE_TYPES))}) [A-Za-z_]\w* = blockIdx\.z;"
# an operand's element type -> the conversion its naive update reads it through ("" for float, read as it is)
CONVERSIONS = {"float": "", **dict.fromkeys(("__half", "half"), "__half2float"),
               **dict.fromkeys(("__nv_bfloat16", "nv_bfloat16"), "__bfloat162float")}
TILE_TYPE = rf"(?:{'|'.join(CONVERSIONS)})"  # a tile holds its operand's own elements: the update converts them
_TILE_ZERO = rf"(?:0\.0f|{TILE_TYPE}\(0\.0f\))"
_NAME = r"[A-Za-z_]\w*"
# the tiled form's patterns name their parts: c, r (each `long long` where wide_c, wide_r), acc, kt (the k step's
# type), K, M, A, N, B, k (the tile's own index), update, epilogue
_FIRST_COLUMN = rf"(?(wide_c)\(long long\))blockIdx\.x \* {TILE}"  # a block's first column, in c's width
_FIRST_ROW = rf"(?(wide_r)\(long long\))blockIdx\.y \* {TILE}"
_B_ROWS = (rf"{KEY}_b\[threadIdx\.y\]\[threadIdx\.x\] = {KEY}_k \+ threadIdx\.y < (?P=K) && (?P=c) < (?P<N>{_NAME}) \? "
           rf"(?P<B>{_NAME})\[\({KEY}_k \+ threadIdx\.y\) \* (?P=N) \+ (?P=c)\] : {_TILE_ZERO};")
# B stored N x K (a linear layer's weight): lanes along k load a row of B, stored across the padded tile
_B_TRANSPOSED = (rf"{KEY}_b\[threadIdx\.x\]\[threadIdx\.y\] = {KEY}_k \+ threadIdx\.x < (?P=K) && {_FIRST_COLUMN} \+ "
                 rf"threadIdx\.y < (?P<N>{_NAME}) \? (?P<B>{_NAME})\[\({_FIRST_COLUMN} \+ threadIdx\.y\) \* (?P=K) \+ "
                 rf"{KEY}_k \+ threadIdx\.x\] : {_TILE_ZERO};")
_A_ROWS = (rf"{KEY}_a\[threadIdx\.y\]\[threadIdx\.x\] = (?P=r) < (?P<M>{_NAME}) && {KEY}_k \+ threadIdx\.x < (?P=K) \? "
           rf"(?P<A>{_NAME})\[(?P=r) \* (?P=K) \+ {KEY}_k \+ threadIdx\.x\] : {_TILE_ZERO};")
# A stored K x M (C = A^T B): lanes along r load a row of A (coalesced), stored down a column of the padded tile
_A_TRANSPOSED = (rf"{KEY}_a\[threadIdx\.x\]\[threadIdx\.y\] = {KEY}_k \+ threadIdx\.y < (?P=K) && {_FIRST_ROW} \+ "
                 rf"threadIdx\.x < (?P<M>{_NAME}) \? (?P<A>{_NAME})\[\({KEY}_k \+ threadIdx\.y\) \* (?P=M) \+ "
                 rf"{_FIRST_ROW} \+ threadIdx\.x\] : {_TILE_ZERO};")


def _tiled(left_transposed: bool, transposed: bool) -> re.Pattern:
    """The squashed body the tiled form has, its parts named (see above)."""
    width, load = (TILE + 1, _B_TRANSPOSED) if transposed else (TILE, _B_ROWS)
    left_width, load_a = (TILE + 1, _A_TRANSPOSED) if left_transposed else (TILE, _A_ROWS)
    return re.compile(
        rf"^{{ __shared__ {TILE_TYPE} {KEY}_a\[{TILE}\]\[{left_width}\]; "
        rf"__shared__ {TILE_TYPE} {KEY}_b\[{TILE}\]\[{width}\]; "
        rf"(?:{BATCH_INDEX} )?(?:{_NAME} \+= [^;]+; ){{0,2}}"
        rf"(?:int|(?P<wide_c>long long)) (?P<c>{_NAME}) = {_FIRST_COLUMN} \+ threadIdx\.x; "
        rf"(?:int|(?P<wide_r>long long)) (?P<r>{_NAME}) = {_FIRST_ROW} \+ threadIdx\.y; "
        rf"float (?P<acc>{_NAME}) = {FLOAT_ZERO}; "
        rf"for \((?P<kt>{LOOP_INDEX_TYPES}) {KEY}_k = 0; {KEY}_k < (?P<K>{_NAME}); {KEY}_k \+= {TILE}\) {{ "
        rf"{load_a} {load} __syncthreads\(\); "
        rf"for \(int (?P<k>{_NAME}) = 0; (?P=k) < {TILE} && {KEY}_k \+ (?P=k) < (?P=K); \+\+(?P=k)\) "
        rf"(?P<update>(?P=acc) (?:\+)?= .+?); __syncthreads\(\); }} "
        rf"if \((?P=r) < (?P=M) && (?P=c) < (?P=N)\) {{ (?P<epilogue>.+) }} }}$")


# (A stored K x M, B stored N x K) -> the tiled form's pattern
_TILED = {(left, right): _tiled(left, right) for left in (False, True) for right in (False, True)}


@dataclass(frozen=True)
class Product:
    column: str  # c
    row: str  # r
    accumulator: str
    index: str  # k
    rows: str  # M
    columns: str  # N
    depth: str  # K
    left: str  # A: rows x K (or K x rows, `left_transposed`)
    right: str  # B: K x columns (or columns x K, `transposed`)
    zero: str  # the accumulator's first value, as written
    update: str  # the loop's one statement, as written (`acc += A[...] * B[...]` or `acc = fmaf(..., acc)`)
    transposed: bool  # B is stored N x K and read at B[c * K + k]
    batch: str = ""  # the batch index's declaration (`int b = blockIdx.z;`) of a batched product, else ""
    left_offset: str = ""  # X of `A[X + r * K + k]`: where a batch's (or a view's) A starts, else ""
    right_offset: str = ""  # Y of `B[Y + k * N + c]` (or `B[Y + c * K + k]`), else ""
    left_type: str = "float"  # A's element type: a 16-bit one is read through its conversion to float
    right_type: str = "float"
    left_transposed: bool = False  # A is stored K x M and read at A[k * M + r] (C = A^T B)
    # the indexes' types as the naive kernel declares them: c and r `int` or `long long` (`_canonical`), k any of
    # LOOP_INDEX_TYPES; every form declares them (and forms a block's first row and column) in these widths
    column_type: str = "int"
    row_type: str = "int"
    index_type: str = "int"

    @staticmethod
    def edge(element: str) -> str:
        """What a tile of `element` holds past the matrix's edge."""
        return "0.0f" if element == "float" else f"{element}(0.0f)"

    def operands(self) -> tuple[str, str]:
        """The naive update's reads of A and of B."""
        right = f"{self.column} * {self.depth} + {self.index}" if self.transposed else \
            f"{self.index} * {self.columns} + {self.column}"
        left = f"{self.index} * {self.rows} + {self.row}" if self.left_transposed else \
            f"{self.row} * {self.depth} + {self.index}"
        return f"{self.left}[{_offset(self.left_offset)}{left}]", f"{self.right}[{_offset(self.right_offset)}{right}]"

    def first(self, axis: str, span: int) -> str:
        """The first column (axis x) or row (y) of a block of `span` outputs along it, formed in that index's width:
        in 64 bits where the naive index was, blockIdx * span passing 2^32 there."""
        wide = (self.column_type if axis == "x" else self.row_type) == WIDE
        return f"{'(long long)' if wide else ''}blockIdx.{axis} * {span}"

    def reads(self) -> dict[str, str]:
        """Each operand read of the naive update, and its read from the tiles."""
        left, right = self.operands()
        return {left: f"{KEY}_a[threadIdx.y][{self.index}]", right: f"{KEY}_b[{self.index}][threadIdx.x]"}

    def starts(self) -> list[str]:
        """The batched form's first statements: the batch index, and each operand pointer moved to its start."""
        return ([self.batch] if self.batch else []) + [f"{operand} += {offset};" for operand, offset in
                                                       ((self.left, self.left_offset), (self.right, self.right_offset))
                                                       if offset]


def _offset(offset: str) -> str:
    return f"{offset} + " if offset else ""


def replaced(text: str, reads: dict[str, str]) -> str:
    """`text` with each key, which it must hold, replaced by its value wherever it stands."""
    for old, new in reads.items():
        if old not in text:
            raise NotApplicable(f"`{text}` does not read {old}")
        text = text.replace(old, new)
    return text


def tiled_lines(p: Product) -> list[str]:
    """The tiled form's body up to and including the guard it opens for the epilogue."""
    t = f"{KEY}_k"
    if p.transposed:  # lanes along k read a row of B (coalesced) and store it down a padded tile column
        width = TILE + 1
        column = f"{p.first('x', TILE)} + threadIdx.y"
        load_b = (f"    {KEY}_b[threadIdx.x][threadIdx.y] = {t} + threadIdx.x < {p.depth} && {column} < {p.columns} ? "
                  f"{p.right}[({column}) * {p.depth} + {t} + threadIdx.x] : {p.edge(p.right_type)};")
    else:
        width = TILE
        load_b = (f"    {KEY}_b[threadIdx.y][threadIdx.x] = {t} + threadIdx.y < {p.depth} && {p.column} < "
                  f"{p.columns} ? {p.right}[({t} + threadIdx.y) * {p.columns} + {p.column}] : "
                  f"{p.edge(p.right_type)};")
    if p.left_transposed:  # lanes along r read a row of A (coalesced) and store it down a padded tile column
        left_width = TILE + 1
        row = f"{p.first('y', TILE)} + threadIdx.x"
        load_a = (f"    {KEY}_a[threadIdx.x][threadIdx.y] = {t} + threadIdx.y < {p.depth} && {row} < {p.rows} ? "
                  f"{p.left}[({t} + threadIdx.y) * {p.rows} + {row}] : {p.edge(p.left_type)};")
    else:
        left_width = TILE
        load_a = (f"    {KEY}_a[threadIdx.y][threadIdx.x] = {p.row} < {p.rows} && {t} + threadIdx.x < {p.depth} ? "
                  f"{p.left}[{p.row} * {p.depth} + {t} + threadIdx.x] : {p.edge(p.left_type)};")
    return [f"__shared__ {p.left_type} {KEY}_a[{TILE}][{left_width}];",
            f"__shared__ {p.right_type} {KEY}_b[{TILE}][{width}];",
            *p.starts(),
            f"{p.column_type} {p.column} = {p.first('x', TILE)} + threadIdx.x;",
            f"{p.row_type} {p.row} = {p.first('y', TILE)} + threadIdx.y;",
            f"float {p.accumulator} = {p.zero};",
            f"for ({p.index_type} {t} = 0; {t} < {p.depth}; {t} += {TILE}) {{",
            load_a,
            load_b,
            "    __syncthreads();",
            f"    for (int {p.index} = 0; {p.index} < {TILE} && {t} + {p.index} < {p.depth}; ++{p.index}) "
            f"{replaced(p.update, p.reads())};",
            "    __syncthreads();",
            "}",
            f"if ({p.row} < {p.rows} && {p.column} < {p.columns}) {{"]


def is_tiled(parsed: cp.ParsedSource, function: cp.Function) -> bool:
    """Whether the kernel's body reads as the tiled form (its epilogue aside)."""
    body = function.node.child_by_field_name("body")
    return body is not None and any(pattern.match(squash(parsed.text(body))) for pattern in _TILED.values())


def tiled_product(parsed: cp.ParsedSource, function: cp.Function) -> tuple[Product, list[Node]]:
    """(the product, its update as the naive loop's statement; the epilogue's statements) of a kernel in the tiled
    form."""
    body = function.node.child_by_field_name("body")
    text = squash(parsed.text(body))
    matches = {transposed: pattern.match(text) for transposed, pattern in _TILED.items()}
    layout = next((t for t, m in matches.items() if m), None)
    if layout is None:
        raise NotApplicable(f"{function.name}: not the tiled product untile_matmul's forward writes")
    left_transposed, transposed = layout
    found = matches[layout]
    c, r, acc, depth, rows, left, columns, right, index, tiled = (found[part] for part in (
        "c", "r", "acc", "K", "M", "A", "N", "B", "k", "update"))
    zero = re.search(rf"float {acc} = ({FLOAT_ZERO});", text)[1]
    batch = re.search(BATCH_INDEX, text)
    offsets = [re.search(rf"\b{operand} \+= ([^;]+);", text) for operand in (left, right)]
    types = re.findall(rf"__shared__ ({TILE_TYPE}) {KEY}_[ab]\[", text)
    product = Product(c, r, acc, index, rows, columns, depth, left, right, zero, "", transposed,
                      batch[0] if batch else "", *(offset[1] if offset else "" for offset in offsets), *types,
                      left_transposed=left_transposed, column_type=WIDE if found["wide_c"] else "int",
                      row_type=WIDE if found["wide_r"] else "int", index_type=found["kt"])
    update = replaced(tiled, {tile: operand for operand, tile in product.reads().items()})
    guard = statements(body)[-1].child_by_field_name("consequence")
    if guard is None or guard.type != "compound_statement":
        raise NotApplicable(f"{function.name}: the tiled product does not end in its guarded epilogue")
    return replace(product, update=update), statements(guard)


def expected_body(lines: list[str], epilogue: str, depth: int) -> str:
    """The squashed body a form has: `lines`, the epilogue, the `depth` blocks the lines open closed."""
    return squash("{ " + " ".join(lines) + f" {epilogue}" + " }" * depth + " }")


def written(parsed: cp.ParsedSource, function: cp.Function, lines: list[str], epilogue: list[Node],
            depth: int) -> str:
    """The source with the kernel's body as `lines`, then the epilogue's statements `depth` levels in, then the
    `depth` blocks the lines open closed."""
    body = function.node.child_by_field_name("body")
    indent = indentation(parsed.data, body.named_children[0].start_byte)
    first, last = epilogue[0], epilogue[-1]
    text = reindent(parsed.data[first.start_byte:last.end_byte].decode("utf-8"),
                    len(indentation(parsed.data, first.start_byte)), indent + "    " * depth)
    closing = [indent + "    " * level + "}" for level in reversed(range(depth))]
    source_lines = [indent + line for line in lines] + [text, *closing]
    start, end = body.named_children[0].start_byte, body.named_children[-1].end_byte
    return splice(parsed.data, [(start, end, "\n".join(source_lines)[len(indent):])])[0].decode("utf-8")
