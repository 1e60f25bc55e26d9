"""Exhaustive parametrizations that the default run samples: the values named as kept run every time, the rest
carry the `slow` marker (`pytest -m slow` runs them). For families whose every member exercises the same
mechanism on another input (emulator shapes, mutants, golden cases): one or two members keep the mechanism
covered in CI, the whole family guards it before a GPU session or a change to the kernels it covers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest


def sampled(values: Iterable[Any], keep: Iterable[Any]) -> list[Any]:
    """`values` as pytest parameters, every one not in `keep` marked slow; a kept value that is not among
    `values` is an error (a renamed case must not silently drop out of the default run)."""
    values, keep = list(values), list(keep)
    missing = [k for k in keep if k not in values]
    if missing:
        raise ValueError(f"kept values {missing} are not parameters ({values})")
    return [v if v in keep else pytest.param(v, marks=pytest.mark.slow) for v in values]
