"""Compile-time constants shared by tile_constant and the transforms that check a constant change:
evaluating C integer expressions and checking a value against the kernel's static_asserts.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms.base import NotApplicable

_VECTOR_WIDTH = re.compile(r"^(?:VEC|VECTOR)(?:_\w+)?$")


VECTOR_TYPES = ("float2", "float4", "int2", "int4", "uint2", "uint4", "double2", "half2", "__half2",
                "__nv_bfloat162", "nv_bfloat162", "longlong2", "ulonglong2", "char4", "uchar4", "short4")


_C_OPERATORS = {"&&": "and", "||": "or", "/": "//"}


def c_expression(parsed: cp.ParsedSource, node: Node) -> str:
    """A C constant expression as a `klineage.expr` expression; ExpressionError when it has no such form."""
    kind = node.type
    if kind == "number_literal":
        text = parsed.text(node).rstrip("uUlL")
        if re.fullmatch(r"0[0-7]+", text):
            text = "0o" + text[1:]
        if not re.fullmatch(r"0[xX][0-9a-fA-F]+|0o[0-7]+|\d+", text):
            raise ExpressionError(parsed.text(node), "not an integer literal")
        return text
    if kind in ("true", "false"):
        return "True" if kind == "true" else "False"
    if kind == "identifier":
        return parsed.text(node)
    if kind == "parenthesized_expression" and node.named_child_count == 1:
        return f"({c_expression(parsed, node.named_children[0])})"
    if kind == "unary_expression":
        operator = parsed.text(node.child_by_field_name("operator"))
        operand = c_expression(parsed, node.child_by_field_name("argument"))
        return f"(not {operand})" if operator == "!" else f"({operator}{operand})"
    if kind == "binary_expression":
        operator = parsed.text(node.child_by_field_name("operator"))
        left = c_expression(parsed, node.child_by_field_name("left"))
        right = c_expression(parsed, node.child_by_field_name("right"))
        return f"({left} {_C_OPERATORS.get(operator, operator)} {right})"
    if kind == "conditional_expression":
        condition, consequence, alternative = (c_expression(parsed, node.child_by_field_name(f))
                                               for f in ("condition", "consequence", "alternative"))
        return f"({consequence} if {condition} else {alternative})"
    raise ExpressionError(parsed.text(node), f"'{kind}' is not a plain arithmetic expression")


def _evaluate(parsed: cp.ParsedSource, node: Node, constants: dict) -> object:
    return expr.evaluate(c_expression(parsed, node), constants)


def _static_asserts(parsed: cp.ParsedSource) -> list[tuple[Node, str]]:
    found = []
    for node in cp.nodes_of_type(parsed.root, "static_assert_declaration"):
        condition = node.child_by_field_name("condition")
        message = node.child_by_field_name("message")
        if condition is not None:
            found.append((condition, cp.string_value(parsed, message) if message is not None else ""))
    return found


def _uses(parsed: cp.ParsedSource, node: Node, name: str) -> bool:
    return any(parsed.text(n) == name for n in cp.nodes_of_type(node, "identifier"))


def check(old: KernelState, new_source: str, name: str) -> None:
    """Raise NotApplicable where the new constants break a static_assert, an exact division or a vector type."""
    before = old.constants
    after = parse_constants(new_source)
    parsed = cp.parse(old.source)
    for condition, message in _static_asserts(parsed):
        try:
            held, holds = bool(_evaluate(parsed, condition, before)), bool(_evaluate(parsed, condition, after))
        except ExpressionError:
            continue
        if held and not holds:
            raise NotApplicable(f"tile_constant: {name} = {after.get(name)} breaks "
                                f"static_assert({parsed.text(condition)}) \"{message}\"")
    for declaration in cp.declarations(parsed):
        if declaration.init is None or not declaration.constant:
            continue
        for division in cp.nodes_of_type(declaration.init, "binary_expression"):
            if parsed.text(division.child_by_field_name("operator")) not in ("/", "%"):
                continue
            if not _uses(parsed, division, name):
                continue
            left, right = division.child_by_field_name("left"), division.child_by_field_name("right")
            try:
                a0, b0 = _evaluate(parsed, left, before), _evaluate(parsed, right, before)
                a1, b1 = _evaluate(parsed, left, after), _evaluate(parsed, right, after)
            except ExpressionError:
                continue
            if not all(isinstance(v, int) for v in (a0, b0, a1, b1)) or b0 == 0:
                continue
            if b1 == 0:
                raise NotApplicable(f"tile_constant: {name} = {after.get(name)} makes `{parsed.text(right)}` zero "
                                    f"in {declaration.name}")
            operator = parsed.text(division.child_by_field_name("operator"))
            if operator == "/" and a0 % b0 == 0 and a1 % b1 != 0:
                raise NotApplicable(f"tile_constant: {name} = {after.get(name)} makes {declaration.name}'s "
                                    f"`{parsed.text(division)}` inexact ({a1} / {b1})")
            if operator == "/" and a0 // b0 > 0 and a1 // b1 == 0:
                raise NotApplicable(f"tile_constant: {name} = {after.get(name)} makes {declaration.name}'s "
                                    f"`{parsed.text(division)}` zero")
    if _VECTOR_WIDTH.match(name):
        for function in cp.functions(parsed):
            if not _uses(parsed, function.node, name):
                continue
            types = {parsed.text(n) for n in cp.nodes_of_type(function.node, "type_identifier")}
            vector = sorted(types & set(VECTOR_TYPES))
            if vector:
                raise NotApplicable(f"tile_constant: {name} is the width of the {vector[0]} accesses in "
                                    f"{function.name}; changing it alone would read the wrong elements "
                                    f"(devectorize first)")
