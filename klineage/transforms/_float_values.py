"""What a CUDA expression's value is, read off the parse: constant arithmetic, float or double types, and
whether a value stays floating up to where it is stored. Shared by the forwards that trade an exact division for
a faster one (reciprocal_constant, fast_math's `__fdividef`), which must not place a result one ulp off where it is
truncated or compared.

Types are read conservatively from declarations, parameters, literals, casts and the math library's float
functions; anything else reads as unknown, and an unknown value is no site.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._calls import MATH_CALLS
from klineage.transforms._edit import (
    Scope,
    call_arguments,
    cast_name,
    is_written,
    operator,
    params,
    unparen,
    written_names,
)

FLOATING = ("float", "double")
# where a quotient may be stored, and read as a value: its rounding to these never truncates
_FLOATING_STORES = frozenset({"float", "double", "__half", "half", "__nv_bfloat16", "nv_bfloat16"})
_FLOATING_VECTORS = frozenset(f"{kind}{n}" for kind in FLOATING for n in (1, 2, 3, 4))
# the math library's single-precision functions (and min, max), whose value is a float of their arguments: not a
# rounding to a whole number, a conversion, a reinterpretation or an integer intrinsic
_FLOAT_VALUED = re.compile(r"^(?:__)?[a-z0-9]+f$|^__f[a-z]+_r[nzud]$|^(?:min|max)$")
_ROUNDING = re.compile(r"^(?:floor|ceil|round|trunc|rint|nearbyint|lrint|llrint|lround|llround)f?$")
FLOAT_MATH = frozenset(name for name in MATH_CALLS if _FLOAT_VALUED.match(name) and not _ROUNDING.match(name))
_COMPARING = frozenset({"<", "<=", ">", ">=", "==", "!=", "&&", "||", "%", "&", "|", "^", "<<", ">>"})


def literal(text: str) -> tuple[str, float] | None:
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
        return literal(parsed.text(node))
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
    cast, argument = cast_of(parsed, node)
    if cast in FLOATING and argument is not None:
        inner = constant(parsed, argument)
        return inner and (cast, inner[1])
    return None


def cast_of(parsed: cp.ParsedSource, node: Node) -> tuple[str, Node | None]:
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


_INTEGERS = frozenset({"int", "unsigned", "unsigned int", "long", "long long", "unsigned long", "unsigned long long",
                       "short", "char", "size_t", "ptrdiff_t", "int32_t", "int64_t", "uint32_t", "uint64_t", "int8_t",
                       "uint8_t", "int16_t", "uint16_t", "bool"})
_FLOAT_CALL = re.compile(r"^(?:__)?[a-z0-9]+f$")  # expf, __expf, fminf, rsqrtf: single precision by name


def _declared(scope: Scope, name_node: Node, indirection: str) -> str | None:
    """The declared type of the variable `name_node` names (a local's or a parameter's), where it is read
    `indirection` deep ("*": an element of the array it points to or is); None otherwise."""
    if name_node.type != "identifier":
        return None
    name = scope.parsed.text(name_node)
    declaration = scope.declaration(name, name_node)
    if declaration is not None:
        kind, depth = declaration.type, declaration.indirection + "*" * len(declaration.dims)
    else:
        param = scope.param(name, name_node)
        if param is None:
            return None
        kind, depth = param[2].type, param[2].indirection
    return kind if depth == indirection else None


def _declared_type(scope: Scope, name_node: Node, indirection: str) -> str | None:
    """The arithmetic type ("float", "double" or "int") of a variable read `indirection` deep, or None."""
    kind = _declared(scope, name_node, indirection)
    return kind if kind in FLOATING else "int" if kind in _INTEGERS else None


def value_type(scope: Scope, node: Node) -> str | None:
    """The arithmetic type of an expression: "float", "double" or "int" (any integer), None where it cannot tell.
    A float function of the math library (`expf`, `fminf`) is float, an overloaded one (`exp`, `std::exp`) of its
    arguments' floating type; arithmetic takes the usual conversions."""
    parsed, kind = scope.parsed, node.type
    if kind == "number_literal":
        value = literal(parsed.text(node))
        return value[0] if value else None
    if kind == "identifier":
        return _declared_type(scope, node, "")
    if kind == "subscript_expression":
        base = unparen(node.child_by_field_name("argument"))
        return _declared_type(scope, base, "*") if base.type == "identifier" else None
    if kind == "field_expression":  # a component of a float4, a double2
        vector = _declared(scope, unparen(node.child_by_field_name("argument")), "")
        return vector.rstrip("1234") if vector in _FLOATING_VECTORS else None
    if kind == "parenthesized_expression" and node.named_child_count == 1:
        return value_type(scope, node.named_children[0])
    if kind == "unary_expression" and operator(node) in ("-", "+"):
        return value_type(scope, node.child_by_field_name("argument"))
    if kind == "binary_expression" and operator(node) in ("+", "-", "*", "/"):
        left = value_type(scope, node.child_by_field_name("left"))
        right = value_type(scope, node.child_by_field_name("right"))
        return _promoted(left, right) if left and right else None
    if kind == "conditional_expression":
        branches = {value_type(scope, node.child_by_field_name(side)) for side in ("consequence", "alternative")}
        return branches.pop() if len(branches) == 1 else None
    if kind in ("cast_expression", "call_expression"):
        cast = cast_of(parsed, node)[0]
        if cast:
            return cast if cast in FLOATING else "int" if cast in _INTEGERS else None
        name = cp.call_name(node) if kind == "call_expression" else ""
        if _FLOAT_CALL.match(name) and name in FLOAT_MATH:
            return "float"
        if f"{name}f" in FLOAT_MATH:  # `exp`, `std::exp`: the overload its arguments' floating type selects
            types = {value_type(scope, argument) for argument in call_arguments(node)}
            return "double" if "double" in types and types <= set(FLOATING) else "float" if types == {"float"} else None
    return None


def _floating_variable(scope: Scope, target: Node, indirection: str) -> bool:
    """Whether `target` names a variable (or, with indirection "*", the array it points to) of a floating type."""
    return _declared(scope, target, indirection) in _FLOATING_STORES | _FLOATING_VECTORS


def floating_place(scope: Scope, target: Node) -> bool:
    """Whether an assignment's left side is a floating place: a float local or parameter, an element of a float
    array, a component of a float vector (`w.x` of a `float4`)."""
    target = unparen(target)
    if target.type == "subscript_expression":
        return _floating_variable(scope, unparen(target.child_by_field_name("argument")), "*")
    if target.type == "pointer_expression" and operator(target) == "*":
        return _floating_variable(scope, unparen(target.child_by_field_name("argument")), "*")
    if target.type == "field_expression":
        return _declared(scope, unparen(target.child_by_field_name("argument")), "") in _FLOATING_VECTORS
    return _floating_variable(scope, target, "")


def _argument_stays_floating(scope: Scope, call: Node, argument: Node) -> bool:
    """A float function of the math library, or the source's own whose every definition takes a floating
    value there."""
    name = cp.call_name(call)
    if name in FLOAT_MATH:
        return True
    position = [a.id for a in call_arguments(call)].index(argument.id)
    taken = [params(scope.parsed, f.node) for f in scope.functions if f.name == name]
    return bool(taken) and all(position < len(p) and p[position].type in _FLOATING_STORES
                               and not p[position].indirection for p in taken)


_PASSING = frozenset({"binary_expression", "parenthesized_expression", "unary_expression", "conditional_expression",
                      "cast_expression"})


def stays_floating(scope: Scope, node: Node) -> bool:
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
            cast = cast_of(parsed, call)[0]
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
                    and floating_place(scope, parent.child_by_field_name("left")))
        if kind == "return_statement":
            function = cp.enclosing_function(parent)
            returned = function.child_by_field_name("type") if function is not None else None
            return returned is not None and parsed.text(returned) in _FLOATING_STORES
        if (kind not in _PASSING or operator(parent) in _COMPARING or operator(parent) in ("!", "~")
                or (kind == "cast_expression" and cast_of(parsed, parent)[0] not in _FLOATING_STORES)
                or (kind == "conditional_expression" and parent.child_by_field_name("condition").id == child.id)):
            return False
        child, parent = parent, parent.parent
    return False


_LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop")


def runs_per_element(parsed: cp.ParsedSource, node: Node) -> bool:
    """Whether code at `node` runs once per element a thread handles: inside a loop, or reading nothing a loop of
    its function assigns, a variable or an array's element (an elementwise body and its vector lanes, a helper it
    calls; not `1.0f / partial[0]` after a block's tree fills `partial`). What a thread makes of a
    loop's result (`sum / cols` after a row's loop, a pooled window's mean) runs once for the loop's many loads,
    where making it cheaper could not pay for the gate evaluation that measures it."""
    function = cp.enclosing_function(node)
    ancestor = node.parent
    while ancestor is not None and ancestor != function:
        if ancestor.type in _LOOPS:
            return True
        ancestor = ancestor.parent
    if function is None:
        return False
    loops = cp.nodes_of_type(function, *_LOOPS)
    looped = set().union(*(written_names(parsed, loop) for loop in loops))
    elements = [e for loop in loops for e in cp.nodes_of_type(loop, "subscript_expression") if is_written(e)]
    looped |= {parsed.text(base) for base in (unparen(e.child_by_field_name("argument")) for e in elements)
               if base.type == "identifier"}
    return not looped & {parsed.text(name) for name in cp.nodes_of_type(node, "identifier")}


def _device_functions(parsed: cp.ParsedSource) -> dict[int, cp.Function]:
    return {f.node.id: f for f in cp.functions(parsed) if {"__global__", "__device__"} & set(f.qualifiers)}


def blankless(parsed: cp.ParsedSource, node: Node) -> str:
    """An expression's text without blanks: the key of a division, however it was spaced."""
    return re.sub(r"\s+", "", parsed.text(node))


def device_operations(parsed: cp.ParsedSource, tokens: tuple[str, str]) -> Iterator[tuple[cp.Function, Node, Node]]:
    """(function, expression, operator token) of each binary operation or compound assignment of a device
    function whose operator is one of `tokens`."""
    device = _device_functions(parsed)
    for node in cp.nodes_of_type(parsed.root, "binary_expression", "assignment_expression"):
        definition = cp.enclosing_function(node)
        function = device.get(definition.id) if definition is not None else None
        token = node.child_by_field_name("operator")
        if function is not None and token is not None and token.type in tokens:
            yield function, node, token
