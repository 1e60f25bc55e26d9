"""reciprocal_constant: a division by a constant becomes a multiplication by its reciprocal, folded by nvcc.

Forward: `a / C` -> `a * (1 / C)`, and `a /= C` -> `a *= (1 / C)`, at every division of a device function by
the same constant C (one site per distinct divisor of a function: a vectorized body divides once per lane and
in its tail, and those go together). `1 / C` is a constant expression of C's own type, which the compiler
folds, so the kernel multiplies where it divided. An fp32 IEEE division is a reciprocal estimate, two
refinement steps and a guarded branch to a slow-path subroutine, some ten instructions where a multiply is
one: in an elementwise kernel that moves 16-byte vectors, four divisions per thread can make it issue-bound
(`x * relu6(x + 3) / 6`). PyTorch's own hardswish multiplies by a sixth for this reason.

The product is not always the correctly rounded quotient: it is within about 1.5 ulp of it (the reciprocal is
rounded once, the product once), which the gate's tolerances judge like any other numerical change.

C is a floating constant expression: floating literals (`6.0f`, `.5`, `1e-3f`, `0x1p-3f`), integer literals
inside it, a cast of one to `float` or `double` (`float(6)`, `(float)6`, `static_cast<float>(6)`: what a
template's `scalar_t(6)` becomes once the kernel is specialized), signs, parentheses and + - * / among them;
its type is float or double by the usual conversions. An integer C is a site only under a float or double
dividend (`x / 6` with x a float divides as floats), its reciprocal then typed by its numerator, `(1.0f / 6)` or
`(1.0 / 6)` (`1 / 6` would be zero); an integer dividend divides as integers and is no site. Not a
site: a divisor whose reciprocal is subnormal or overflows, or that is a power of two (nvcc multiplies by its
exact reciprocal already); a division whose dividend is itself constant (folded already); a float divisor in
a function that declares or casts to `double` (the reciprocal would be rounded to float inside a double
computation); anything outside `__global__` and `__device__` functions. And a quotient that is not read as a
floating value all the way to where it is stored or returned: one ulp is nothing to a float result, but a whole
step where the value is truncated (`int k = i / 2.5f`, a cast to an integer, `floorf`, `__float2int_rz`, an `int`
parameter of a helper) or compared (`q > 1.0f`, a condition); so the path up from the division may pass only
arithmetic, float casts, conditional branches and calls of the math library or of the source's functions that take
a float there, and must end in a float, half or bf16 variable, array element or vector component, or a float
function's return. Nor a division of what a loop computed (`sum / 9.0f` after a window's loop, a row's mean):
it runs once for the loop's many loads, and folding it could not pay for the gate evaluation that measures it
(`_float_values.runs_per_element`).

Backward: every `X * (1 / C)` (and `X *= (1 / C)`) of the function with that divisor, where the numerator is
a literal one in any spelling (`1`, `1.0f`; over an integer C, a floating one of X's type), becomes `X / C`: the
correctly rounded quotient, correct wherever the product was. Forward only rewrites the operator and the divisor,
so spacing round-trips byte for byte.

Anchor: kind "divisor", key the divisor's text without whitespace.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._edit import Scope, operator, splice
from klineage.transforms._float_values import (
    FLOATING,
    blankless,
    constant,
    device_operations,
    floating_place,
    literal,
    runs_per_element,
    stays_floating,
    value_type,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

_RECIPROCAL_RANGE = (2.0 ** -125, 2.0 ** 125)  # |C| inside it: 1 / C is a normal number of either type
_DOUBLE = re.compile(r"\bdouble\b")


class _Site(NamedTuple):
    function: cp.Function
    expression: Node  # the division or product, or the compound assignment
    token: Node  # its operator: `/`, `/=`, `*`, `*=`
    divisor: Node  # C
    operand: Node  # what the rewrite replaces: C itself in a division, `(1 / C)` in a product
    one: str  # the reciprocal's numerator: `1`, or `1.0f` (`1.0`) over an integer C, which gives it its type


def _constant_dividend(parsed: cp.ParsedSource, node: Node) -> bool:
    return node.type == "binary_expression" and constant(parsed, node.child_by_field_name("left")) is not None


_ONES = {"float": "1.0f", "double": "1.0"}


def _divided(parsed: cp.ParsedSource) -> list[_Site]:
    """Each division by a constant whose reciprocal is normal and inexact, of a dividend that is not constant, in a
    function where no double computation could take in a float reciprocal: a floating C (reciprocal `1 / C`, of
    C's type), or an integer C under a float or double dividend (`x / 6`: `1.0f / 6` or `1.0 / 6`, typed by the
    numerator; under an integer dividend it divides as integers, and is no site)."""
    low, high = _RECIPROCAL_RANGE
    scope = Scope(parsed)
    sites = []
    for function, node, token in device_operations(parsed, ("/", "/=")):
        divisor = node.child_by_field_name("right")
        value = constant(parsed, divisor)
        if value is None or _constant_dividend(parsed, node):
            continue
        kind = value[0] if value[0] in FLOATING else value_type(scope, node.child_by_field_name("left"))
        if kind not in FLOATING:
            continue
        if not low < abs(value[1]) < high or abs(math.frexp(value[1])[0]) == 0.5:
            continue
        if kind == "float" and _DOUBLE.search(parsed.text(function.node)):
            continue
        stored = (floating_place(scope, node.child_by_field_name("left")) if token.type == "/="
                  else stays_floating(scope, node))
        if stored and runs_per_element(parsed, node):
            one = "1" if value[0] in FLOATING else _ONES[kind]
            sites.append(_Site(function, node, token, divisor, divisor, one))
    return sites


def _reciprocal_divisor(scope: Scope, factor: Node, dividend: Node) -> tuple[Node, str] | None:
    """(C, the numerator's text) of a factor `(1 / C)` whose numerator is a literal one and whose C is a floating
    constant, or an integer one under a floating numerator of the dividend's own type; else None."""
    parsed = scope.parsed
    if factor.type != "parenthesized_expression" or factor.named_child_count != 1:
        return None
    quotient = factor.named_children[0]
    if quotient.type != "binary_expression" or operator(quotient) != "/":
        return None
    one, divisor = quotient.child_by_field_name("left"), quotient.child_by_field_name("right")
    numerator, value = literal(parsed.text(one)) if one.type == "number_literal" else None, constant(parsed, divisor)
    if numerator is None or numerator[1] != 1.0 or value is None:
        return None
    if value[0] in FLOATING or (numerator[0] in FLOATING and value_type(scope, dividend) == numerator[0]):
        return divisor, parsed.text(one)
    return None


def _multiplied(parsed: cp.ParsedSource) -> list[_Site]:
    """Each `X * (1 / C)` and `X *= (1 / C)` of a device function, X not constant."""
    scope = Scope(parsed)
    sites = []
    for function, node, token in device_operations(parsed, ("*", "*=")):
        factor = node.child_by_field_name("right")
        found = _reciprocal_divisor(scope, factor, node.child_by_field_name("left"))
        if found is not None and not _constant_dividend(parsed, node):
            sites.append(_Site(function, node, token, found[0], factor, found[1]))
    return sites


def _anchors(parsed: cp.ParsedSource, sites: list[_Site]) -> list[Anchor]:
    anchors: list[Anchor] = []
    for site in sites:
        anchor = Anchor(site.function.name, "divisor", blankless(parsed, site.divisor), parsed.text(site.expression))
        if anchor not in anchors:
            anchors.append(anchor)
    return anchors


class ReciprocalConstant(Transform):
    name = "reciprocal_constant"
    intent = ("Multiply by a constant divisor's reciprocal, which the compiler folds, instead of dividing by "
              "the constant.")
    placement = Placement.ANALYSIS
    lent = False  # no walk has measured it yet: the catalog proposes it, cards of other mechanisms do not

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return _anchors(parsed, _multiplied(parsed))

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return _anchors(parsed, _divided(parsed))

    @staticmethod
    def _chosen(parsed: cp.ParsedSource, sites: list[_Site], anchor: Anchor) -> list[_Site]:
        if anchor.kind != "divisor":
            raise NotApplicable(f"reciprocal_constant needs a divisor anchor, not {anchor}")
        chosen = [site for site in sites if site.function.name == anchor.function
                  and blankless(parsed, site.divisor) == anchor.key]
        if not chosen:
            raise NotApplicable(f"reciprocal_constant: {anchor.function} has no site dividing by {anchor.key}")
        return chosen

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        edits = []
        for site in self._chosen(parsed, _multiplied(parsed), anchor):
            edits += [(site.token.start_byte, site.token.end_byte, "/" if site.token.type == "*" else "/="),
                      (site.operand.start_byte, site.operand.end_byte, parsed.text(site.divisor))]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{len(edits) // 2} product(s) by 1 / {anchor.key} became divisions")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        edits = []
        for site in self._chosen(parsed, _divided(parsed), anchor):
            edits += [(site.token.start_byte, site.token.end_byte, "*" if site.token.type == "/" else "*="),
                      (site.operand.start_byte, site.operand.end_byte, f"({site.one} / {parsed.text(site.divisor)})")]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source,
                            note=f"{len(edits) // 2} division(s) by {anchor.key} became products by its reciprocal")


register(ReciprocalConstant())
