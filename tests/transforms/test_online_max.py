"""The one-pass softmax normalizer (klineage/transforms/_online_max.py): a running maximum with a sum rescaled to
it is read however its three statements are commonly spelled, and anything that is not that fold stays unread (the
warp reduction then refuses the loop as before). tests/transforms/test_serialize_reduction.py runs the warp form
against the naive loop on the CPU emulator."""

from __future__ import annotations

import pytest
import torch

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._online_max import OnlineMax, online_max
from tests.transforms import emulate
from tests.transforms.golden import HERE, load

LOOP = ("for (int j = 0; j < n; ++j) {{ float v = x[j]; float t = {larger}; s = {update}; m = t; }}")
PLAIN = {"larger": "fmaxf(m, v)", "update": "s * expf(m - t) + expf(v - t)"}
BRANCHED = ("for (int j = 0; j < n; ++j) {{ float v = x[j]; if ({compare}) {{ s = {new}; m = v; }} "
            "else {{ {old}; }} }}")
BRANCH = {"compare": "v > m", "new": "s * expf(m - v) + 1.0f", "old": "s += expf(v - m)"}


def _loop_read(loop_text: str) -> OnlineMax | None:
    parsed = cp.parse(f"__global__ void k(const float* x, int n) {{ float m = -INFINITY, s = 0.0f; {loop_text} }}")
    (loop,) = cp.nodes_of_type(parsed.root, "for_statement")
    return online_max(parsed, loop.child_by_field_name("body"))


def _read(**spelled: str) -> OnlineMax | None:
    return _loop_read(LOOP.format(**(PLAIN | spelled)))


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


@pytest.mark.parametrize("spelled", [{}, {"compare": "m < v"}, {"new": "1.0f + s * expf(m - v)"},
                                     {"old": "s = s + expf(v - m)"}, {"new": "s * __expf(m - v) + 1.0f",
                                                                      "old": "s += __expf(v - m)"}])
def test_the_fold_written_with_a_branch_is_read(spelled):
    exp = "__expf" if "__expf" in spelled.get("new", "") else "expf"
    assert _loop_read(BRANCHED.format(**(BRANCH | spelled))) == OnlineMax("m", "s", exp)


@pytest.mark.parametrize("spelled", [
    {"compare": "v >= m"},  # equal values take the branch: the same sums, but not the spelling read
    {"new": "s * expf(m - v) + 2.0f"},  # the new value counted twice
    {"old": "s += expf(m - v)"},  # the old maximum's term scaled the wrong way
    {"new": "s * expf(m - v) + 1.0f; y0 = m", "old": "s += expf(v - m)"},  # more in the branch
])
def test_other_branches_are_not_read(spelled):
    assert _loop_read(BRANCHED.format(**(BRANCH | spelled))) is None


def test_the_branched_fold_given_a_warp_computes_the_naive_rows(tmp_path):
    """The golden one-pass softmax with its fold written as the branch: the lanes run the branch as written, the
    join is the same, and the rows are the naive kernel's to rounding."""
    golden = load(HERE / "serialize_reduction" / "softmax_online", "after", "kernel")
    fold = ("        float m_new = fmaxf(m, v);\n        s = s * expf(m - m_new) + expf(v - m_new);\n"
            "        m = m_new;\n")
    assert fold in golden.source
    naive = KernelState(source=golden.source.replace(fold, "        if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }"
                                                           " else { s += expf(v - m); }\n"), plan=golden.plan)
    (site,) = get("serialize_reduction").forward_sites(naive)
    warp = get("serialize_reduction").forward(naive, site).state

    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict]:
        x = torch.randn(rows * n, generator=torch.Generator().manual_seed(n)) * 4
        return {"rows": rows, "n": n}, {"x": x}, {"y": (torch.float32, rows * n)}

    forms = emulate.builds(tmp_path, {"naive": naive, "warp": warp})
    for n in (1, 5, 70):
        params, inputs, outputs = inputs_of(3, n)
        runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}", state, params, inputs, outputs)["y"]
                for form, (binary, state) in forms.items()}
        torch.testing.assert_close(runs["warp"], runs["naive"], rtol=1e-5, atol=1e-6)
