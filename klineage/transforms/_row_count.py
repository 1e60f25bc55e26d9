"""The count a row kernel's guard compares its row with, said in the plan's terms: what the forwards that resize a
launch to the rows or outputs (unsplit_reduction's chunks, serialize_block_reduction's block a row) read from
`if (row >= N) return;` or `if (row < N)`, and the check that the kernel never changes N, so that the plan's value
is the kernel's.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._edit import declared_names, unparen, written_names
from klineage.transforms._naive import BOUND, INTEGER_CAST, bound_of, squash
from klineage.transforms.base import NotApplicable


def guard_count(parsed: cp.ParsedSource, statement: Node, row: str, relations: tuple[str, str]) -> str | None:
    """N of `row R N` (R relations[0]) or `N R' row` (R' relations[1]) in the if statement's condition, N a name or a
    product or sum of names (`B * D`), integer casts on them left out, or a positive number."""
    condition = statement.child_by_field_name("condition")
    compare = unparen(condition.child_by_field_name("value") or condition)
    if compare.type != "binary_expression":
        return None
    left, right = (squash(parsed.text(unparen(compare.child_by_field_name(s)))) for s in ("left", "right"))
    relation = parsed.text(compare.child_by_field_name("operator"))
    said = right if left == row and relation == relations[0] else \
        left if right == row and relation == relations[1] else None
    # the count without integer casts (`(size_t)cols`, `(long long)B * D`): the plan's values are exact, and the
    # offsets a reader forms from it are formed in 64 bits; a number counts as written (`row < 1`: one output)
    if said and re.fullmatch(r"[1-9]\d*", said):
        return said
    return (bound_of(said) or bound_of(re.sub(INTEGER_CAST, "", said))) if said else None


def check_fixed(parsed: cp.ParsedSource, body: Node, text: str) -> None:
    """NotApplicable where the body assigns a name of `text` or declares it again: the plan says its value as
    launched (a parameter `D = D * 2;` would make the kernel's count another than the plan's: a split's scratch
    overrun, a block a row's grid short)."""
    changed = (written_names(parsed, body) | set(declared_names(parsed, body))) & set(re.findall(r"\w+", text))
    if changed:
        raise NotApplicable(f"the kernel assigns or declares {', '.join(sorted(changed))}, which the plan says as "
                            f"launched")


def plan_value(text: str, scalars: dict[str, str], constants: dict) -> str:
    """`text` (a name, or a product or sum of names) as the plan says it: each scalar parameter as the launch passes
    it, each constant by its name; NotApplicable where a name is neither. A positive number is itself."""
    def said(name: re.Match) -> str:
        if name[0] in scalars:
            return f"({scalars[name[0]]})" if not re.fullmatch(r"\w+", scalars[name[0]]) else scalars[name[0]]
        if name[0] in constants:
            return name[0]
        raise NotApplicable(f"'{name[0]}' of `{text}` is neither a scalar parameter nor a constant the plan can name")
    if re.fullmatch(r"[1-9]\d*", text):
        return text
    if not re.fullmatch(BOUND, text):
        raise NotApplicable(f"`{text}` is not a name, or a product or sum of names, the plan can say")
    return re.sub(r"[A-Za-z_]\w*", said, text)
