"""Welford's running mean and M2 (klineage/transforms/_welford.py): the count-based update is read however its
statements are commonly spelled, an update counted by the loop index is counted by a local first (`counted`), and
anything that is not that fold stays unread. tests/transforms/test_serialize_reduction.py runs the warp form against
the naive loop on the CPU emulator."""

from __future__ import annotations

import pytest

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms._welford import Welford, counted, welford

BODY = {"step": "++n;", "deviation": "float d = v - mean;", "mean": "mean += d / n;", "m2": "m2 += d * (v - mean);"}


def _read(order: tuple[str, ...] = ("step", "deviation", "mean", "m2"), **spelled: str) -> Welford | None:
    parts = BODY | spelled
    body = " ".join(parts[key] for key in order)
    parsed = cp.parse(f"__global__ void k(const float* x, int n0) {{ float mean = 0.0f, m2 = 0.0f; int n = 0; "
                      f"for (int j = 0; j < n0; ++j) {{ float v = x[j]; {body} }} }}")
    (loop,) = cp.nodes_of_type(parsed.root, "for_statement")
    return welford(parsed, loop.child_by_field_name("body"))


@pytest.mark.parametrize("spelled", [{}, {"step": "n++;"}, {"step": "n += 1;"}, {"mean": "mean += d / (float)n;"},
                                     {"m2": "m2 += (v - mean) * d;"}, {"mean": "mean+=d/n;"}])
def test_each_spelling_of_the_update_is_read(spelled):
    assert _read(**spelled) == Welford("n", "mean", "m2")


def test_the_step_may_follow_the_deviation():
    assert _read(("deviation", "step", "mean", "m2")) == Welford("n", "mean", "m2")


@pytest.mark.parametrize("spelled", [
    {"m2": "m2 += d * (v - mean) * 2.0f;"},  # not the squared deviation
    {"m2": "m2 += d * d;"},  # the deviation from the old mean twice: biased
    {"mean": "mean += d / (n + 1);"},  # a count off by one
    {"step": "n += 2;"},  # counting twice
    {"deviation": "float d = v - m2;"},  # a deviation from another local
])
def test_other_updates_are_not_read(spelled):
    assert _read(**spelled) is None


def test_an_index_count_is_written_as_a_local_of_the_index_type():
    source = ("__global__ void k(const float* x, float* y, long long n) {\n    float mean = 0.0f, m2 = 0.0f;\n"
              "    for (long long j = 0; j < n; j++) {\n        float v = x[j];\n        float d = v - mean;\n"
              "        mean += d / (float)(j + 1);\n        m2 += d * (v - mean);\n    }\n    y[0] = m2;\n}\n")
    plan = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "k"\ngrid = [1]\nblock = [1]\n'
                                'args = ["x", "y", { scalar = "n", type = "i64" }]\n')
    read = counted(KernelState(source=source, plan=plan)).source
    assert "    long long mean_count = 0;\n    for (long long j = 0; j < n; j++) {\n        ++mean_count;\n" in read
    assert "mean += d / mean_count;" in read and "j + 1" not in read
    other = source.replace("(float)(j + 1)", "(float)(j + 2)")
    assert counted(KernelState(source=other, plan=plan)).source == other
