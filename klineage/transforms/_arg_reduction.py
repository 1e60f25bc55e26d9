"""A row loop that keeps the best value and where it was (argmax / argmin), and the warp shuffle that combines
(value, index) pairs so that the warp's answer is the sequential loop's to the bit.

The sequential form: `if (e > best) { best = e; at = j; }` (or `<` for the smallest; `best < e` reads the same),
the loop's only statement after local declarations. A strict compare keeps the first of equal values, never
takes a NaN, and keeps a NaN the loop starts from. Split over lanes (each from the same start value), every
lane's pair is either that start pair or a column that beat it strictly; so two pairs of equal value are both
start pairs or both columns, and the combine - the better value, on equal values the smaller index - is the
sequential answer: the first column of the best value, or the start pair where none beat it (a NaN start stays:
nothing compares above or equal to it). Signed zeros compare equal, so the earlier one wins, as in the loop.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._naive import squash, statements

_BETTER = {">": "max", "<": "min"}
_MIRROR = {">": "<", "<": ">"}
PAIR_VALUE, PAIR_INDEX = "pair_value", "pair_index"
# the butterfly over a whole warp; a layout whose lanes share a row in groups passes its own header and mask
WARP_BUTTERFLY, FULL_MASK = "for (int offset = 16; offset > 0; offset /= 2)", "0xffffffffu"


@dataclass(frozen=True)
class ArgBest:
    """`if (candidate <compare> value) { value = candidate; index = <loop index>; }`."""

    value: str
    index: str
    compare: str  # ">" keeps the largest, "<" the smallest

    def __post_init__(self):
        if self.compare not in _BETTER:
            raise ValueError(f"an arg reduction compares with > or <, not {self.compare!r}")


def arg_best(parsed: cp.ParsedSource, loop_body: Node, loop_index: str) -> ArgBest | None:
    """The loop body's arg reduction (locals declared first, then the one `if`), else None."""
    listed = [s for s in statements(loop_body) if s.type != "declaration"]
    if len(listed) != 1 or listed[0].type != "if_statement" or listed[0].child_by_field_name("alternative"):
        return None
    condition = listed[0].child_by_field_name("condition")
    while condition is not None and condition.type in ("parenthesized_expression", "condition_clause"):
        condition = condition.named_children[0] if condition.named_children else None
    if condition is None or condition.type != "binary_expression":
        return None
    compare = parsed.text(condition.child_by_field_name("operator"))
    left, right = condition.child_by_field_name("left"), condition.child_by_field_name("right")
    if compare not in _BETTER:
        return None
    if right.type == "identifier":
        candidate, value = left, parsed.text(right)
    elif left.type == "identifier":
        candidate, value, compare = right, parsed.text(left), _MIRROR[compare]
    else:
        return None
    updates = _assignments(parsed, listed[0].child_by_field_name("consequence"))
    if updates is None or len(updates) != 2 or value not in updates:
        return None
    index = next(name for name in updates if name != value)
    if squash(updates[value]) != squash(parsed.text(candidate)) or updates[index] != loop_index:
        return None
    text = parsed.text(loop_body)
    if len(re.findall(rf"\b{value}\b", text)) != 2 or len(re.findall(rf"\b{index}\b", text)) != 1:
        return None  # the candidate or a local reads the value or the index
    return ArgBest(value, index, compare)


def _assignments(parsed: cp.ParsedSource, node: Node) -> dict[str, str] | None:
    """name -> assigned text of a block of plain `name = e;` statements, else None."""
    found = {}
    for statement in statements(node):
        assignment = statement.named_children[0] if statement.type == "expression_statement" and \
            statement.named_children else None
        if assignment is None or assignment.type != "assignment_expression" or \
                parsed.text(assignment.child_by_field_name("operator")) != "=" or \
                assignment.child_by_field_name("left").type != "identifier":
            return None
        name = parsed.text(assignment.child_by_field_name("left"))
        if name in found:
            return None
        found[name] = parsed.text(assignment.child_by_field_name("right"))
    return found


def pair_butterfly(arg: ArgBest, value_type: str, index_type: str, indent: str, header: str = WARP_BUTTERFLY,
                   mask: str = FULL_MASK) -> str:
    """The butterfly (`header`, over the lanes of `mask`) that leaves every lane with its lanes' best (value, index):
    the better value, on equal values the smaller index."""
    lines = [f"{header} {{",
             f"    const {value_type} {PAIR_VALUE} = __shfl_xor_sync({mask}, {arg.value}, offset);",
             f"    const {index_type} {PAIR_INDEX} = __shfl_xor_sync({mask}, {arg.index}, offset);",
             f"    if ({PAIR_VALUE} {arg.compare} {arg.value} || ({PAIR_VALUE} == {arg.value} && {PAIR_INDEX} < "
             f"{arg.index})) {{",
             f"        {arg.value} = {PAIR_VALUE};",
             f"        {arg.index} = {PAIR_INDEX};",
             "    }",
             "}"]
    return "\n".join(indent + line for line in lines)[len(indent):]


def is_pair_butterfly(text: str, header: str = WARP_BUTTERFLY, mask: str = FULL_MASK) -> bool:
    """Whether `text` (a for statement) is exactly what pair_butterfly writes with this header and mask."""
    match = re.match(rf"^{re.escape(header)} \{{ const ([\w ]+?) {PAIR_VALUE} = __shfl_xor_sync\({re.escape(mask)}, "
                     rf"(\w+), offset\); const ([\w ]+?) {PAIR_INDEX} = __shfl_xor_sync\({re.escape(mask)}, (\w+), "
                     rf"offset\); if \({PAIR_VALUE} ([<>]) ", squash(text))
    if match is None:
        return False
    value_type, value, index_type, index, compare = match.groups()
    return squash(text) == squash(pair_butterfly(ArgBest(value, index, compare), value_type, index_type, "", header,
                                                 mask))
