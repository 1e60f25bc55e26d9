"""Safe expressions: what a launch plan may compute, and everything it may not."""

import time

import pytest

from klineage import expr
from klineage.errors import DocumentError, ExpressionError

ENV = {"N": 1000, "M": 37, "BLOCK": 128, "K": 64, "flag": True, "scale": 0.5}


# Arithmetic


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("N - M", 963),
        ("N // BLOCK", 7),
        ("N % BLOCK", 104),
        ("N / 8", 125.0),
        ("7 / 2", 3.5),
        ("-7 // 2", -4),
        ("2 ** 10", 1024),
        ("1 << 5", 32),
        ("1024 >> 3", 128),
        ("0b1100 & 0b1010", 0b1000),
        ("0b1100 | 0b1010", 0b1110),
        ("0b1100 ^ 0b1010", 0b0110),
        ("~0", -1),
        ("-N", -1000),
        ("+M", 37),
        ("scale * 4", 2.0),
        ("0x10 + 1", 17),
        ("2 ** 64", 2**64),
    ],
)
def test_arithmetic(text, expected):
    value = expr.evaluate(text, ENV)
    assert value == expected
    assert type(value) is type(expected)


def test_plain_numbers_pass_through_unchanged():
    assert expr.evaluate(5, {}) == 5
    assert expr.evaluate(2.5, {}) == 2.5
    assert expr.evaluate(True, {}) is True


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cdiv(N, BLOCK)", 8),
        ("cdiv(1024, BLOCK)", 8),
        ("cdiv(1, 128)", 1),
        ("cdiv(0, 128)", 0),
        ("round_up(N, BLOCK)", 1024),
        ("round_up(1024, BLOCK)", 1024),
        ("round_up(M, 8)", 40),
        ("min(N, M, K)", 37),
        ("max(N, M, K)", 1000),
        ("abs(M - N)", 963),
        ("int(N / 3)", 333),
        ("log2(BLOCK)", 7),
        ("log2(1000)", 9),
        ("is_pow2(BLOCK)", True),
        ("is_pow2(N)", False),
        ("is_pow2(1)", True),
        ("is_pow2(0)", False),
        ("is_pow2(-4)", False),
        ("cdiv(N, min(BLOCK, 2 * K))", 8),
    ],
)
def test_functions(text, expected):
    assert expr.evaluate(text, ENV) == expected


# Comparisons, boolean logic, conditionals


@pytest.mark.parametrize(
    "text, expected",
    [
        ("K % 8 == 0", True),
        ("N % 8 == 0 and M % 8 == 0", False),
        ("N % 8 == 0 or M % 8 == 0", True),
        ("not flag", False),
        ("N != M", True),
        ("M < K <= BLOCK", True),
        ("M < BLOCK < K", False),  # chained: every link must hold
        ("N >= 1000 > M", True),
        ("N > 1000", False),
        ("BLOCK if N > 512 else K", 128),
        ("BLOCK if N > 5000 else K", 64),
        ("flag and is_pow2(K)", True),
    ],
)
def test_comparisons_logic_conditionals(text, expected):
    assert expr.evaluate(text, ENV) == expected


def test_conditional_does_not_evaluate_the_branch_not_taken():
    # The other branch divides by zero: it must never run.
    assert expr.evaluate("1 if N > 0 else 1 // 0", ENV) == 1
    with pytest.raises(ExpressionError, match="division by zero"):
        expr.evaluate("1 if N < 0 else 1 // 0", ENV)


def test_names_lists_free_variables_but_not_functions():
    assert expr.names("cdiv(N, BLOCK) * M + max(K, 2)") == {"N", "BLOCK", "M", "K"}
    assert expr.names("3 + 4") == set()


# Refusals at parse time


@pytest.mark.parametrize(
    "text, message",
    [
        ("N.bit_length()", "unknown function"),
        ("N.bit_length", "'Attribute' is not allowed"),
        ("(1).real", "'Attribute' is not allowed"),
        ("x[0]", "'Subscript' is not allowed"),
        ("[1, 2][0]", "is not allowed"),
        ("(lambda: 1)()", "unknown function"),
        ("lambda: 1", "'Lambda' is not allowed"),
        ("'abc'", "only numbers are allowed as literals, not 'abc'"),
        ("b'abc'", "only numbers are allowed as literals, not b'abc'"),
        ("None", "only numbers are allowed as literals, not None"),
        ("open(1)", "unknown function; allowed: abs, cdiv, int, is_pow2, log2, max, min, round_up"),
        ("eval(1)", "unknown function"),
        ("__import__('os')", "unknown function"),
        ("__import__", None),  # a bare name parses; it is unknown at evaluation
        ("min(1, key=2)", "keyword arguments are not allowed"),
        ("max(*[1, 2])", "is not allowed"),
        ("[x for x in N]", "'ListComp' is not allowed"),
        ("(x := 3)", "'NamedExpr' is not allowed"),
        ("N if N else", "syntax error"),
        ("1 +", "syntax error"),
        ("", "must be a non-empty string"),
        ("   ", "must be a non-empty string"),
        ("{1: 2}", "'Dict' is not allowed"),
        ("f'{N}'", "is not allowed"),
        ("1 @ 2", "'MatMult' is not allowed"),
    ],
)
def test_refused_constructs(text, message):
    if message is None:
        expr.parse(text)
        with pytest.raises(ExpressionError, match="unknown name '__import__'"):
            expr.evaluate(text, ENV)
        return
    with pytest.raises(ExpressionError) as info:
        expr.parse(text)
    assert message in str(info.value)
    assert isinstance(info.value, DocumentError)


def test_refusal_names_the_expression():
    with pytest.raises(ExpressionError) as info:
        expr.evaluate("N.real + 1", ENV)
    assert info.value.where == "N.real + 1"
    assert str(info.value).startswith("N.real + 1: ")


def test_non_string_is_refused():
    with pytest.raises(ExpressionError, match="non-empty string"):
        expr.parse(None)
    with pytest.raises(ExpressionError, match="non-empty string"):
        expr.parse(["N"])


def test_overlong_text_is_refused():
    text = "10" + "+1" * 199  # 400 characters: still allowed
    assert len(text) == 400
    assert expr.evaluate(text, {}) == 209
    with pytest.raises(ExpressionError, match="longer than 400 characters") as info:
        expr.parse(text + "+1")
    assert info.value.where == text[:40] + "..."


# Refusals at evaluation time


def test_huge_exponent_is_refused():
    with pytest.raises(ExpressionError, match="exponent too large"):
        expr.evaluate("2 ** 65", {})
    with pytest.raises(ExpressionError, match="exponent too large"):
        expr.evaluate("2 ** N", ENV)
    with pytest.raises(ExpressionError, match="exponent too large"):
        expr.evaluate("9 ** 9 ** 9", {})


@pytest.mark.parametrize(
    "text",
    [
        "((((((9 ** 64) ** 64) ** 64) ** 64) ** 64) ** 64)",
        "1 << 10 ** 18",
        "1 << 100000000",
        "(2 ** 64) ** 64 * (2 ** 64) ** 64 * (2 ** 64) ** 64",
    ],
)
def test_values_too_large_are_refused_quickly(text):
    # Each step alone is small; nested, they would take minutes and gigabytes.
    started = time.monotonic()
    with pytest.raises(ExpressionError, match="too large"):
        expr.evaluate(text, {})
    assert time.monotonic() - started < 1.0


def test_large_but_reasonable_values_are_fine():
    assert expr.evaluate("(2 ** 64) ** 3", {}) == 2**192
    assert expr.evaluate("1 << 255", {}) == 2**255
    with pytest.raises(ExpressionError, match=r"^1 << 256: value too large \(more than 256 bits\)$"):
        expr.evaluate("1 << 256", {})


def test_evaluation_errors_name_the_text_once():
    with pytest.raises(ExpressionError) as info:
        expr.evaluate("2 ** 100", {})
    assert str(info.value) == "2 ** 100: exponent too large"


def test_unknown_name_lists_known_names():
    with pytest.raises(ExpressionError) as info:
        expr.evaluate("cdiv(ROWS, BLOCK)", {"BLOCK": 128, "N": 4, "K": 2})
    assert str(info.value) == "cdiv(ROWS, BLOCK): unknown name 'ROWS' (known: BLOCK, K, N)"


def test_unknown_name_with_empty_env_says_none():
    with pytest.raises(ExpressionError, match=r"unknown name 'N' \(known: none\)"):
        expr.evaluate("N + 1", {})


@pytest.mark.parametrize("text", ["N / 0", "N // (M - 37)", "N % 0", "cdiv(N, 0)", "round_up(N, K - 64)"])
def test_division_by_zero(text):
    with pytest.raises(ExpressionError) as info:
        expr.evaluate(text, ENV)
    assert str(info.value) == f"{text}: division by zero"


@pytest.mark.parametrize(
    "text, message",
    [
        ("log2(0)", "math domain error"),
        ("is_pow2(2.5)", "unsupported operand"),
        ("1 << -1", "negative shift count"),
        ("min()", "expected at least 1 argument"),
        ("cdiv(1)", "missing 1 required positional argument"),
    ],
)
def test_runtime_errors_become_expression_errors(text, message):
    with pytest.raises(ExpressionError, match=message):
        expr.evaluate(text, {})


def test_evaluate_int():
    assert expr.evaluate_int("N / 8", ENV) == 125
    assert type(expr.evaluate_int("N / 8", ENV)) is int
    assert expr.evaluate_int("cdiv(N, BLOCK)", ENV) == 8
    assert expr.evaluate_int(7, {}) == 7
    assert expr.evaluate_int("K > 3", ENV) == 1


def test_evaluate_int_rejects_fractions():
    with pytest.raises(ExpressionError) as info:
        expr.evaluate_int("5 / 2", {})
    assert str(info.value) == "5 / 2: must be a whole number, got 2.5"
    with pytest.raises(ExpressionError, match="must be a whole number, got 2.5"):
        expr.evaluate_int(2.5, {})
    with pytest.raises(ExpressionError, match="the result inf is not a finite number"):
        expr.evaluate_int("1e308 * 10", {})
