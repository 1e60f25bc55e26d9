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
its type is float or double by the usual conversions, never an integer (`a * (1 / 6)` would be zero). Not a
site: a divisor whose reciprocal is subnormal or overflows, or that is a power of two (nvcc multiplies by its
exact reciprocal already); a division whose dividend is itself constant (folded already); a float divisor in
a function that declares or casts to `double` (the reciprocal would be rounded to float inside a double
computation); anything outside `__global__` and `__device__` functions. And a quotient that is not read as a
floating value all the way to where it is stored or returned: one ulp is nothing to a float result, but a whole
step where the value is truncated (`int k = i / 2.5f`, a cast to an integer, `floorf`, `__float2int_rz`, an `int`
parameter of a helper) or compared (`q > 1.0f`, a condition); so the path up from the division may pass only
arithmetic, float casts, conditional branches and calls of the math library or of the source's functions that take
a float there, and must end in a float, half or bf16 variable, array element or vector component, or a float
function's return.

Backward: every `X * (1 / C)` (and `X *= (1 / C)`) of the function with that divisor, where the numerator is
a literal one in any spelling (`1`, `1.0f`), becomes `X / C`: the correctly rounded quotient, correct wherever
the product was. Forward only rewrites the operator and the divisor, so spacing round-trips byte for byte.

Anchor: kind "divisor", key the divisor's text without whitespace.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._edit import Scope, call_arguments, cast_name, operator, params, splice, unparen
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

FLOATING = ("float", "double")
_RECIPROCAL_RANGE = (2.0 ** -125, 2.0 ** 125)  # |C| inside it: 1 / C is a normal number of either type
_DOUBLE = re.compile(r"\bdouble\b")
# where a quotient may be stored, and read as a value: its rounding to these never truncates
_FLOATING_STORES = frozenset({"float", "double", "__half", "half", "__nv_bfloat16", "nv_bfloat16"})
_FLOATING_VECTORS = frozenset(f"{kind}{n}" for kind in FLOATING for n in (1, 2, 3, 4))
# float functions of CUDA's math library: their arguments stay floating (an integer rounding is none of them)
_FLOAT_MATH = re.compile(r"^(?:__)?(?:exp2?|exp10|expm1|log2?|log10|log1p|sqrt|rsqrt|cbrt|pow|sin|cos|tan|tanh|"
                         r"sinh|cosh|erfc?|fabs|fmin|fmax|fma|fdivide|hypot|atan2?|asin|acos|copysign|sigmoid)f?$|"
                         r"^(?:min|max|__saturatef|__f(?:add|sub|mul|div|ma)_r[nzud])$")
_COMPARING = frozenset({"<", "<=", ">", ">=", "==", "!=", "&&", "||", "%", "&", "|", "^", "<<", ">>"})


def _literal(text: str) -> tuple[str, float] | None:
    """(type, value) of a number literal; None for a long double or anything unreadable."""
    text = text.replace("'", "").lower()
    hexadecimal = text.lstrip("+-").startswith("0x")
    floating = "p" in text if hexadecimal else ("." in text or "e" in text)
    try:
        if floating:
            if text.endswith("l"):
                return None
            kind = "float" if text.endswith("f") else "double"
            digits = text.removesuffix("f")
            return kind, float.fromhex(digits) if hexadecimal else float(digits)
        digits = text.rstrip("ul")
        sign = -1 if digits.startswith("-") else 1
        digits = digits.lstrip("+-")
        octal = len(digits) > 1 and digits.startswith("0") and digits.isdigit()
        return "int", float(sign * int(digits, 8 if octal else 0))
    except ValueError:
        return None


def _promoted(left: str, right: str) -> str:
    return "double" if "double" in (left, right) else "float" if "float" in (left, right) else "int"


def constant(parsed: cp.ParsedSource, node: Node) -> tuple[str, float] | None:
    """(type, value) of an arithmetic constant expression ("float", "double" or "int"), None if it is not one."""
    kind = node.type
    if kind == "number_literal":
        return _literal(parsed.text(node))
    if kind == "parenthesized_expression" and node.named_child_count == 1:
        return constant(parsed, node.named_children[0])
    if kind == "unary_expression" and operator(node) in ("-", "+"):
        inner = constant(parsed, node.child_by_field_name("argument"))
        return inner and (inner[0], -inner[1] if operator(node) == "-" else inner[1])
    if kind == "binary_expression" and operator(node) in ("+", "-", "*", "/"):
        left = constant(parsed, node.child_by_field_name("left"))
        right = constant(parsed, node.child_by_field_name("right"))
        if left is None or right is None:
            return None
        promoted = _promoted(left[0], right[0])
        if operator(node) == "/" and (promoted == "int" or right[1] == 0):
            return None  # C truncates an integer quotient; a zero divisor is no constant
        a, b = left[1], right[1]
        return promoted, {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0.0}[operator(node)]
    cast, argument = _cast(parsed, node)
    if cast in FLOATING and argument is not None:
        inner = constant(parsed, argument)
        return inner and (cast, inner[1])
    return None


def _cast(parsed: cp.ParsedSource, node: Node) -> tuple[str, Node | None]:
    """The type and operand of `float(x)`, `(float)x` or `static_cast<float>(x)`; ("", None) otherwise."""
    if node.type == "cast_expression":
        return parsed.text(node.child_by_field_name("type")).strip(), node.child_by_field_name("value")
    if node.type == "call_expression" and len(call_arguments(node)) == 1:
        callee = node.child_by_field_name("function")
        if callee.type == "primitive_type":
            return parsed.text(callee), call_arguments(node)[0]
        if cast_name(node) == "static_cast":
            kind = callee.child_by_field_name("arguments")
            return parsed.text(kind)[1:-1].strip(), call_arguments(node)[0]
    return "", None


def _key(parsed: cp.ParsedSource, node: Node) -> str:
    return re.sub(r"\s+", "", parsed.text(node))


def _device_functions(parsed: cp.ParsedSource) -> dict[int, cp.Function]:
    return {f.node.id: f for f in cp.functions(parsed) if {"__global__", "__device__"} & set(f.qualifiers)}


class _Site(NamedTuple):
    function: cp.Function
    expression: Node  # the division or product, or the compound assignment
    token: Node  # its operator: `/`, `/=`, `*`, `*=`
    divisor: Node  # C
    operand: Node  # what the rewrite replaces: C itself in a division, `(1 / C)` in a product


def _operations(parsed: cp.ParsedSource, tokens: tuple[str, str]) -> Iterator[tuple[cp.Function, Node, Node]]:
    """(function, expression, operator token) of each binary operation or compound assignment of a device
    function whose operator is one of `tokens`."""
    device = _device_functions(parsed)
    for node in cp.nodes_of_type(parsed.root, "binary_expression", "assignment_expression"):
        definition = cp.enclosing_function(node)
        function = device.get(definition.id) if definition is not None else None
        token = node.child_by_field_name("operator")
        if function is not None and token is not None and token.type in tokens:
            yield function, node, token


def _floating_variable(scope: Scope, target: Node, indirection: str) -> bool:
    """Whether `target` names a variable (or, with indirection "*", the array it points to) of a floating type."""
    if target.type != "identifier":
        return False
    name = scope.parsed.text(target)
    declaration = scope.declaration(name, target)
    if declaration is not None:
        depth = declaration.indirection + "*" * len(declaration.dims)
        return declaration.type in _FLOATING_STORES | _FLOATING_VECTORS and depth == indirection
    param = scope.param(name, target)
    return param is not None and param[2].type in _FLOATING_STORES and param[2].indirection == indirection


def _floating_place(scope: Scope, target: Node) -> bool:
    """Whether an assignment's left side is a floating place: a float local or parameter, an element of a float
    array, a component of a float vector (`w.x` of a `float4`)."""
    target = unparen(target)
    if target.type == "subscript_expression":
        return _floating_variable(scope, unparen(target.child_by_field_name("argument")), "*")
    if target.type == "pointer_expression" and operator(target) == "*":
        return _floating_variable(scope, unparen(target.child_by_field_name("argument")), "*")
    if target.type == "field_expression":
        vector = unparen(target.child_by_field_name("argument"))
        declaration = scope.declaration(scope.parsed.text(vector), vector) if vector.type == "identifier" else None
        return declaration is not None and declaration.type in _FLOATING_VECTORS and not declaration.indirection
    return _floating_variable(scope, target, "")


def _argument_stays_floating(scope: Scope, call: Node, argument: Node) -> bool:
    """A float function of the math library, or the source's own whose every definition takes a floating
    value there."""
    name = cp.call_name(call)
    if _FLOAT_MATH.match(name):
        return True
    position = [a.id for a in call_arguments(call)].index(argument.id)
    taken = [params(scope.parsed, f.node) for f in scope.functions if f.name == name]
    return bool(taken) and all(position < len(p) and p[position].type in _FLOATING_STORES
                               and not p[position].indirection for p in taken)


_PASSING = frozenset({"binary_expression", "parenthesized_expression", "unary_expression", "conditional_expression",
                      "cast_expression"})


def _stays_floating(scope: Scope, node: Node) -> bool:
    """Whether a quotient is only ever read as a floating value up to where it is stored or returned. A product
    by the reciprocal can be an ulp from the quotient, which nothing numerical notices but an integer conversion,
    a rounding call or a comparison can turn into a whole step (`int k = i / 2.5f` with i = 5): those, and any
    place this cannot type, are no site."""
    parsed = scope.parsed
    child, parent = node, node.parent
    while parent is not None:
        kind = parent.type
        if kind == "argument_list":  # a call's argument, or a functional cast's operand
            call = parent.parent
            cast = _cast(parsed, call)[0]
            if cast not in _FLOATING_STORES and (cast or not _argument_stays_floating(scope, call, child)):
                return False
            child, parent = call, call.parent
            continue
        if kind == "init_declarator":
            declaration = parent.parent
            type_node = declaration.child_by_field_name("type") if declaration is not None else None
            return (type_node is not None and parsed.text(type_node) in _FLOATING_STORES
                    and parent.child_by_field_name("declarator").type == "identifier")
        if kind == "assignment_expression":
            return (parent.child_by_field_name("right").id == child.id
                    and _floating_place(scope, parent.child_by_field_name("left")))
        if kind == "return_statement":
            function = cp.enclosing_function(parent)
            returned = function.child_by_field_name("type") if function is not None else None
            return returned is not None and parsed.text(returned) in _FLOATING_STORES
        if (kind not in _PASSING or operator(parent) in _COMPARING or operator(parent) in ("!", "~")
                or (kind == "cast_expression" and _cast(parsed, parent)[0] not in _FLOATING_STORES)
                or (kind == "conditional_expression" and parent.child_by_field_name("condition").id == child.id)):
            return False
        child, parent = parent, parent.parent
    return False


def _constant_dividend(parsed: cp.ParsedSource, node: Node) -> bool:
    return node.type == "binary_expression" and constant(parsed, node.child_by_field_name("left")) is not None


def _divided(parsed: cp.ParsedSource) -> list[_Site]:
    """Each division by a floating constant whose reciprocal is normal and inexact, of a dividend that is not
    constant, in a function where no double computation could take in a float reciprocal."""
    low, high = _RECIPROCAL_RANGE
    scope = Scope(parsed)
    sites = []
    for function, node, token in _operations(parsed, ("/", "/=")):
        divisor = node.child_by_field_name("right")
        value = constant(parsed, divisor)
        if value is None or value[0] not in FLOATING or _constant_dividend(parsed, node):
            continue
        kind, number = value
        if not low < abs(number) < high or abs(math.frexp(number)[0]) == 0.5:
            continue
        if kind == "float" and _DOUBLE.search(parsed.text(function.node)):
            continue
        stored = (_floating_place(scope, node.child_by_field_name("left")) if token.type == "/="
                  else _stays_floating(scope, node))
        if stored:
            sites.append(_Site(function, node, token, divisor, divisor))
    return sites


def _reciprocal_divisor(parsed: cp.ParsedSource, factor: Node) -> Node | None:
    """C of a factor `(1 / C)` whose numerator is a literal one and whose C is a floating constant; else None."""
    if factor.type != "parenthesized_expression" or factor.named_child_count != 1:
        return None
    quotient = factor.named_children[0]
    if quotient.type != "binary_expression" or operator(quotient) != "/":
        return None
    one = quotient.child_by_field_name("left")
    if one.type != "number_literal" or (_literal(parsed.text(one)) or ("", 0.0))[1] != 1.0:
        return None
    divisor = quotient.child_by_field_name("right")
    value = constant(parsed, divisor)
    return divisor if value is not None and value[0] in FLOATING else None


def _multiplied(parsed: cp.ParsedSource) -> list[_Site]:
    """Each `X * (1 / C)` and `X *= (1 / C)` of a device function, X not constant."""
    sites = []
    for function, node, token in _operations(parsed, ("*", "*=")):
        factor = node.child_by_field_name("right")
        divisor = _reciprocal_divisor(parsed, factor)
        if divisor is not None and not _constant_dividend(parsed, node):
            sites.append(_Site(function, node, token, divisor, factor))
    return sites


def _anchors(parsed: cp.ParsedSource, sites: list[_Site]) -> list[Anchor]:
    anchors: list[Anchor] = []
    for site in sites:
        anchor = Anchor(site.function.name, "divisor", _key(parsed, site.divisor), parsed.text(site.expression))
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
                  and _key(parsed, site.divisor) == anchor.key]
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
                      (site.operand.start_byte, site.operand.end_byte, f"(1 / {parsed.text(site.divisor)})")]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source,
                            note=f"{len(edits) // 2} division(s) by {anchor.key} became products by its reciprocal")


register(ReciprocalConstant())
