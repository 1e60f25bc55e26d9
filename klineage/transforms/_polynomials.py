"""Integer index expressions as polynomials over their names, so that two spellings of one place compare equal
(`r * 2 * h + j` and `j + 2 * h * r`; `x[r * n + 0]` and `x[r * n]`).

A polynomial is a frozenset of (monomial, coefficient): a monomial is the sorted tuple of the names it multiplies
(a name twice for a square), the coefficient a nonzero integer; the zero polynomial is the empty set.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._edit import operator, unparen

Poly = frozenset  # of (monomial: sorted names, coefficient), coefficients not 0


def _normal(terms: Iterable[tuple[tuple[str, ...], int]]) -> Poly:
    total: Counter = Counter()
    for monomial, coefficient in terms:
        total[tuple(sorted(monomial))] += coefficient
    return Poly((m, c) for m, c in total.items() if c)


def constant(value: int) -> Poly:
    return _normal([((), value)])


def variable(name: str) -> Poly:
    return Poly({((name,), 1)})


def times(poly: Poly, factor: Poly) -> Poly:
    return _normal((m1 + m2, c1 * c2) for m1, c1 in poly for m2, c2 in factor)


def product(names: list[str]) -> Poly:
    """The product of the names (`T * D`)."""
    total = constant(1)
    for name in names:
        total = times(total, variable(name))
    return total


def plus(*polys: Poly) -> Poly:
    return _normal(term for poly in polys for term in poly)


def polynomial(parsed: cp.ParsedSource, node: Node, names: dict[str, Poly], through_casts: bool = False) -> Poly | None:
    """`node` as a polynomial over the names (a name of `names` stands for its polynomial); None for anything but
    decimal integer literals, those names, casts of such polynomials and + - *. `through_casts`: a cast is what it
    converts (a reader that holds a cast to give the same value wherever the kernel's own arithmetic does not wrap)."""
    node = unparen(node)
    text = parsed.text(node)
    if node.type == "number_literal" and re.fullmatch(r"\d+", text):
        return constant(int(text))
    if node.type == "identifier":
        return names.get(text)
    if node.type == "cast_expression":
        # a conversion is a name of its own, of its type and what it converts: `(long long)r * n` is that name times
        # n wherever it is written so, never `r * n` (which may wrap where the widened product does not)
        inner = polynomial(parsed, node.child_by_field_name("value"), names, through_casts)
        kind = " ".join(parsed.text(node.child_by_field_name("type")).split())
        return inner if inner is None or through_casts else variable(f"({kind}){sorted(inner)}")
    if node.type != "binary_expression" or operator(node) not in "+-*":
        return None
    left, right = (polynomial(parsed, node.child_by_field_name(side), names, through_casts)
                   for side in ("left", "right"))
    if left is None or right is None:
        return None
    if operator(node) == "*":
        return times(left, right)
    return plus(left, right if operator(node) == "+" else times(right, constant(-1)))


def of_text(text: str, names: dict[str, Poly] | None = None) -> Poly | None:
    """The integer expression `text` (C, as a reader holds it) as `polynomial` reads it, each identifier a name of
    its own where `names` gives it no polynomial; None where it is no polynomial."""
    parsed = cp.parse(f"void f() {{ e = ({text}); }}")
    assignment = next(iter(cp.nodes_of_type(parsed.root, "assignment_expression")), None)
    if assignment is None or parsed.root.has_error:  # a text that is no expression
        return None
    given = names or {}
    named = {name: given[name] if name in given else variable(name)
             for name in {parsed.text(n) for n in cp.nodes_of_type(assignment, "identifier")}}
    return polynomial(parsed, assignment.child_by_field_name("right"), named)


def as_text(poly: Poly) -> str:
    """`poly` written as C arithmetic over its names (`HW + 2 * p - 1`; `0` for the zero polynomial), its terms in a
    fixed order."""
    terms = []
    for monomial, coefficient in sorted(poly, key=lambda term: (-len(term[0]), term[0])):
        factors = [*([str(abs(coefficient))] if abs(coefficient) != 1 or not monomial else []), *monomial]
        terms.append(("- " if coefficient < 0 else "+ ") + " * ".join(factors))
    text = " ".join(terms) or "0"
    return text[2:] if text.startswith("+ ") else "-" + text[2:] if text.startswith("- ") else text
