"""Safe arithmetic expressions for launch plans and case predicates.

Plans say `grid = ["cdiv(N, BLOCK_N)", "cdiv(M, BLOCK_M)", 1]`; predicates say `K % 8 == 0`.
Only names, numbers, arithmetic, comparisons, boolean logic, conditionals and a few pure
functions are allowed: a plan is data, never code.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from klineage.errors import ExpressionError

Number = int | float | bool


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


FUNCTIONS: dict[str, Any] = {
    "cdiv": _cdiv,
    "round_up": _round_up,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "log2": lambda x: int(math.log2(x)),
    "is_pow2": lambda x: x > 0 and (x & (x - 1)) == 0,
}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
_MAX_LENGTH = 400
_MAX_BITS = 256  # no launch dimension or size needs more; bigger integers only cost time and memory


def parse(text: str) -> ast.Expression:
    """Parse and vet an expression; raise ExpressionError naming what is not allowed."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError(repr(text), "an expression must be a non-empty string")
    tree = _parse(text)
    if isinstance(tree, tuple):
        raise ExpressionError(*tree)
    return tree


# Refusals are kept too: a kernel's constants are tried one by one, and most `constexpr` texts (casts,
# templates) are refused, the same ones thousands of times over a walk or a corpus import.
@lru_cache(maxsize=4096)
def _parse(text: str) -> ast.Expression | tuple[str, str]:
    """The vetted tree, or where and why it is refused."""
    try:
        if len(text) > _MAX_LENGTH:
            raise ExpressionError(text[:40] + "...", f"longer than {_MAX_LENGTH} characters")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(text, f"syntax error: {exc.msg}") from None
        for node in ast.walk(tree):
            _vet(node, text)
    except ExpressionError as exc:
        return exc.where, exc.message
    return tree


def _vet(node: ast.AST, text: str) -> None:
    allowed = (
        ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
        ast.Name, ast.Load, ast.Constant, ast.And, ast.Or,
        *_BINARY, *_COMPARE, *_UNARY,
    )
    if not isinstance(node, allowed):
        raise ExpressionError(text, f"'{type(node).__name__}' is not allowed in an expression")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
        raise ExpressionError(text, f"only numbers are allowed as literals, not {node.value!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExpressionError(text, f"unknown function; allowed: {', '.join(sorted(FUNCTIONS))}")
        if node.keywords:
            raise ExpressionError(text, "keyword arguments are not allowed")


def names(text: str) -> set[str]:
    """The free variable names an expression uses (function names excluded)."""
    return set(_names(text))


@lru_cache(maxsize=4096)  # a plan's few expressions are asked for their names once per case, per gate
def _names(text: str) -> frozenset[str]:
    tree = parse(text)
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return frozenset({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - called)


def evaluate(text: str | int | float, env: Mapping[str, Number]) -> Number:
    """Evaluate a vetted expression over `env`; plain numbers pass through."""
    if isinstance(text, bool) or isinstance(text, (int, float)):
        return text
    tree = parse(text)
    try:
        value = _eval(tree.body, env, text)
    except ExpressionError:
        raise
    except ZeroDivisionError:
        raise ExpressionError(text, "division by zero") from None
    except OverflowError:
        raise ExpressionError(text, "a value is too large for a number") from None
    except (TypeError, ValueError) as exc:
        raise ExpressionError(text, f"cannot be evaluated: {exc}") from None
    return _real(value, text)


def _real(value: Any, text: str) -> Number:
    """A launch dimension, size or flag is a finite real number; anything else is the plan's error."""
    if isinstance(value, complex):
        raise ExpressionError(text, f"the result {value} is not a real number (a fractional power of a "
                                    "negative number?)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError(text, f"the result {value} is not a finite number")
    return value


def evaluate_int(text: str | int, env: Mapping[str, Number]) -> int:
    value = evaluate(text, env)
    if isinstance(value, float):
        if not value.is_integer():
            raise ExpressionError(str(text), f"must be a whole number, got {value}")
        value = int(value)
    return int(value)


def _eval(node: ast.AST, env: Mapping[str, Number], text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            known = ", ".join(sorted(env)) or "none"
            raise ExpressionError(text, f"unknown name '{node.id}' (known: {known})")
        return env[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env, text), _eval(node.right, env, text)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ExpressionError(text, "exponent too large")
        if isinstance(node.op, ast.LShift) and isinstance(right, int) and right > _MAX_BITS:
            raise ExpressionError(text, f"value too large (more than {_MAX_BITS} bits)")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, int) and value.bit_length() > _MAX_BITS:
            raise ExpressionError(text, f"value too large (more than {_MAX_BITS} bits)")
        return _real(value, text)  # a complex or infinite part would only fail later, further from its cause
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env, text))
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, env, text) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, text)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env, text)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, env, text) else node.orelse, env, text)
    if isinstance(node, ast.Call):
        return FUNCTIONS[node.func.id](*(_eval(a, env, text) for a in node.args))
    raise ExpressionError(text, f"cannot evaluate '{type(node).__name__}'")
