"""serialize_column_reduction: the four lanes that share a column's walk down a matrix become one thread.

The mechanism (forward): a kernel with one thread per column (`int c = blockIdx.x * blockDim.x + threadIdx.x;`)
whose loops walk down the rows (`for (int r = 0; r < rows; ++r) s += x[r * cols + c];`) has only `cols` threads,
each with a long chain of loads: where columns number in the thousands the GPU holds a warp or two per SM and waits
on memory. Forward gives each column 4 lanes. A warp holds 8 adjacent columns; lanes c, c + 8, c + 16 and c + 24
of the warp take column c, each walking every 4th row from its slice (0 to 3), and what the loops reduce is combined
by shuffles among those 4 lanes (offsets 16 and 8, under the mask of the 4), which leaves each of them the
column's value. One load of the warp is then 8 adjacent elements of 4 rows (a 32-byte sector each, for 4-byte
elements), and the grid grows 4-fold. serialize_reduction gives a column a whole warp instead, whose 32 lanes
read 32 rows of one column: more lanes for very few columns, a sector per element read. Both offer their site;
the gate and the cards' preconditions say which pays where.

The column is serialize_reduction's row seen the other way, so the reading, the legality and the rewrite are
that transform's (klineage/transforms/_warp_reduction.py, described in serialize_reduction.py) with a warp laid out
as 8 columns of 4 lanes, plus:
- every subscript in a loop that names both the loop index and the column adds the column as a term of its own
  (`x[(long long)r * cols + c]`) and never the loop index alone (a walk down a column, not along a row), and at
  least one does;
- no running sum (a scan down a column would need its 4 lanes to pass partial sums along).
A batch of column reductions, one thread per output of (B, D) (`int b = i / D, d = i % D;` then
`x[(b * N + n) * D + d]`), walks down column d of matrix b: a local the kernel declares once as `i % D` and never
assigns is a column too, where every term of the subscript that names the loop index steps by a multiple of D
(whole rows of D columns) and the subscript names the thread index otherwise only through `i / D` (its batch).
A column's 4 lanes leave together (an early `return` past the last column) or stay together, so the lanes a
shuffle's mask names all reach it. The direction is what the layout suits, not what makes it exact: every lane
of a column runs the kernel's code on the same index, as serialize_reduction's lanes do.

Backward writes the one-thread-per-column form back: the column index loses its warp layout, the slice and mask
lines and the butterflies go, the loops step by one from where they started, the grid shrinks by 4.

Anchor: the kernel, kind "function", key the column variable.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms import register
from klineage.transforms._edit import declared_names, summands, unparen, unwrap, written_names
from klineage.transforms._naive import squash
from klineage.transforms._warp_reduction import Layout, Site, WarpReduction
from klineage.transforms.base import NotApplicable


class SerializeColumnReduction(WarpReduction):
    name = "serialize_column_reduction"
    intent = ("Give each column four lanes instead of one thread: a warp walks 8 adjacent columns down 4 rows at a "
              "time and combines each column's reductions with shuffles among its lanes, so a column-wise reduction "
              "has 4 times the threads and reads whole sectors.")
    layout = Layout(8)

    def _check_direction(self, parsed: cp.ParsedSource, site: Site) -> None:
        row, locals_ = site.row, _fixed_locals(parsed, site.function.node.child_by_field_name("body"))
        columns = {row: ""} | _taken(parsed, locals_, row, "%")  # column -> the width it is taken modulo
        down = 0
        for loop in site.loops:
            if loop.scan is not None:
                raise NotApplicable(f"a running sum down '{row}' (its lanes would pass partial sums along)")
            for subscript in cp.nodes_of_type(loop.node, "subscript_expression"):
                indices = subscript.child_by_field_name("indices")
                text = parsed.text(indices)
                named = [column for column in columns if re.search(rf"\b{column}\b", text)]
                if not (re.search(rf"\b{loop.index}\b", text) and named):
                    continue
                terms = summands(parsed, indices.named_children[0])
                said = [parsed.text(term) for term in terms]
                if len(named) != 1 or named[0] not in said or loop.index in said:
                    raise NotApplicable(f"`{parsed.text(subscript)}` does not walk down a column: no one column of "
                                        f"{', '.join(named)} is one of its terms, or '{loop.index}' is")
                if width := columns[named[0]]:
                    _check_batch(parsed, subscript, terms, (loop.index, named[0], width),
                                 _batch_names(parsed, locals_, row, width))
                down += 1
        if not down:
            raise NotApplicable(f"no subscript names both '{row}' and a loop index: nothing walks down a column")


def _fixed_locals(parsed: cp.ParsedSource, body: Node) -> dict[str, Node | None]:
    """Each name the body declares or assigns -> its initializer where it is a local declared once, with one, and
    never assigned (its value is the initializer's everywhere), else None. A name left out is the same everywhere
    in the kernel (a parameter it never assigns, a constant)."""
    declared, written = declared_names(parsed, body), written_names(parsed, body)
    found: dict[str, Node | None] = dict.fromkeys([*declared, *written])
    for declarator in cp.nodes_of_type(body, "init_declarator"):
        name = parsed.text(declarator.child_by_field_name("declarator"))
        if declared.count(name) == 1 and name not in written:
            found[name] = declarator.child_by_field_name("value")
    return found


def _taken(parsed: cp.ParsedSource, locals_: dict[str, Node | None], row: str, operator: str) -> dict[str, str]:
    """The fixed locals initialized `row <operator> X` -> X, a number or a name that is the same everywhere in the
    kernel."""
    found = {}
    for name, value in locals_.items():
        value = unparen(value) if value is not None else None
        if value is None or value.type != "binary_expression" or \
                parsed.text(value.child_by_field_name("operator")) != operator or \
                parsed.text(unparen(value.child_by_field_name("left"))) != row:
            continue
        width = unparen(value.child_by_field_name("right"))
        if width.type == "number_literal" or (width.type == "identifier" and parsed.text(width) not in locals_):
            found[name] = parsed.text(width)
    return found


def _batch_names(parsed: cp.ParsedSource, locals_: dict[str, Node | None], row: str, width: str) -> dict[str, bool]:
    """The thread index and every local whose value may depend on it (each local that is not fixed among them)
    -> whether it is `row / width`, the batch of a column taken `row % width`."""
    derived = {row} | {name for name, value in locals_.items() if value is None}
    while grown := {name for name, value in locals_.items() if name not in derived and value is not None and
                    set(re.findall(r"\w+", parsed.text(value))) & derived}:
        derived |= grown
    batches = {name for name, taken in _taken(parsed, locals_, row, "/").items() if taken == width}
    return {name: name in batches for name in derived}


def _check_batch(parsed: cp.ParsedSource, subscript: Node, terms: list[Node], walk: tuple[str, str, str],
                 batch_names: dict[str, bool]) -> None:
    """For the walk (loop index, column, width) of a column taken `row % width`: every term but the column's that
    names the loop index has the width as a factor, and no term names the column again or the row but through its
    batch; else NotApplicable."""
    index, column, width = walk
    others = list(terms)
    others.pop([parsed.text(term) for term in terms].index(column))
    for term in others:
        names = set(re.findall(r"\w+", parsed.text(term)))
        if index in names and width not in _factors(parsed, term):
            raise NotApplicable(f"`{parsed.text(subscript)}` steps '{index}' by no multiple of {width}: it walks "
                                f"no column of {width}")
        if strays := sorted(name for name in names - {index} if not batch_names.get(name, True) or name == column):
            raise NotApplicable(f"`{parsed.text(subscript)}` names {', '.join(strays)}, which is no batch of "
                                f"'{column}' (its thread index / {width})")


def _factors(parsed: cp.ParsedSource, node: Node) -> list[str]:
    """The factors of a product (`(b * N + n) * D` -> [`b * N + n`, `D`]), each without parentheses or casts."""
    node = unwrap(node)
    if node.type == "binary_expression" and parsed.text(node.child_by_field_name("operator")) == "*":
        return _factors(parsed, node.child_by_field_name("left")) + _factors(parsed, node.child_by_field_name("right"))
    return [squash(parsed.text(node))]


register(SerializeColumnReduction())
