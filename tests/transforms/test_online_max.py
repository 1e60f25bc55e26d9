"""The one-pass softmax normalizer (klineage/transforms/_online_max.py): a running maximum with a sum rescaled to
it is read however its three statements are commonly spelled, and anything that is not that fold stays unread (the
warp reduction then refuses the loop as before). tests/transforms/test_serialize_reduction.py runs the warp form
against the naive loop on the CPU emulator."""

from __future__ import annotations

import pytest

from klineage.features import cuda_parser as cp
from klineage.transforms._online_max import OnlineMax, online_max

LOOP = ("for (int j = 0; j < n; ++j) {{ float v = x[j]; float t = {larger}; s = {update}; m = t; }}")
PLAIN = {"larger": "fmaxf(m, v)", "update": "s * expf(m - t) + expf(v - t)"}


def _read(**spelled: str) -> OnlineMax | None:
    parsed = cp.parse(f"__global__ void k(const float* x, int n) {{ float m = -INFINITY, s = 0.0f; "
                      f"{LOOP.format(**(PLAIN | spelled))} }}")
    (loop,) = cp.nodes_of_type(parsed.root, "for_statement")
    return online_max(parsed, loop.child_by_field_name("body"))


@pytest.mark.parametrize("spelled", [{}, {"larger": "fmaxf(v, m)"}, {"larger": "max(m, v)"},
                                     {"update": "expf(v - t) + s * expf(m - t)"},
                                     {"update": "__expf(m - t) * s + __expf(v - t)"}])
def test_each_spelling_of_the_fold_is_read(spelled):
    exp = "__expf" if "__expf" in spelled.get("update", "") else "expf"
    assert _read(**spelled) == OnlineMax("m", "s", exp)


@pytest.mark.parametrize("spelled", [
    {"larger": "fminf(m, v)"},  # a running minimum: no softmax normalizer
    {"update": "s * expf(m - t) + expf(v - m)"},  # the new term scaled to the old maximum
    {"update": "s * expf(t - m) + expf(v - t)"},  # the old sum scaled up
    {"update": "s + expf(v - t)"},  # never rescaled
    {"update": "s * expf(m - t) + expf(v - t) + m"},  # the maximum added besides
    {"update": "s * expf(m - t) + __expf(v - t)"},  # two exponentials
])
def test_other_folds_are_not_read(spelled):
    assert _read(**spelled) is None
