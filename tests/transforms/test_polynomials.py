"""Integer index expressions as polynomials (klineage/transforms/_polynomials.py): two spellings of one place
compare equal, a name given a value reads as it (a constant of 0 too), and anything but sums, differences and
products of names and decimal integers is no polynomial."""

from __future__ import annotations

import pytest

from klineage.transforms._polynomials import constant, of_text, variable


@pytest.mark.parametrize("one, other", [
    ("r * 2 * h + j", "j + 2 * h * r"),
    ("(b * R + r) * C + c", "b * R * C + r * C + c"),
    ("r * n + 0", "r * n"),
    ("(long long)r * n", "(long long)r * n"),
])
def test_spellings_of_one_place_compare_equal(one, other):
    assert of_text(one) is not None and of_text(one) == of_text(other)


def test_names_given_values_read_as_them():
    assert of_text("T * 4 + t", {"T": constant(16)}) == of_text("64 + t")
    assert of_text("OFF + t", {"OFF": constant(0)}) == variable("t")  # a zero is a value too, not the name


@pytest.mark.parametrize("text", ["r / 2", "r % n", "r << 1", "1.5 * r", "x[r]", "f(r)", "r * n +"])
def test_what_is_no_polynomial(text):
    assert of_text(text) is None
