"""Welford's running mean and M2 (klineage/transforms/_welford.py): the count-based update is read however its
statements are commonly spelled, an update counted by the loop index is counted by a local first (`counted`), and
anything that is not that fold stays unread. tests/transforms/test_serialize_reduction.py runs the warp form against
the naive loop on the CPU emulator."""

from __future__ import annotations

import pytest
import torch

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import get
from klineage.transforms._welford import Welford, counted, welford
from tests.transforms import emulate
from tests.transforms.golden import HERE, load

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


@pytest.mark.parametrize("second, m2, read", [
    ("float d2 = v - mean;", "m2 += d * d2;", True),  # the second deviation from the updated mean, named first
    ("float d2 = v - mean;", "m2 += d2 * d;", True),
    ("float d2 = v - m2;", "m2 += d * d2;", False),  # from another local
    ("float d2 = x[0] - mean;", "m2 += d * d2;", False),  # of another value
])
def test_a_named_second_deviation_is_read_as_the_update_it_spells(second, m2, read):
    found = _read(("step", "deviation", "mean", "second", "m2"), second=second, m2=m2)
    assert found == (Welford("n", "mean", "m2") if read else None)


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


def test_the_named_second_deviation_given_a_warp_normalizes_the_naive_rows(tmp_path):
    """The golden Welford norm with M2's factor named (`float d2 = v - mean; m2 += d * d2;`): the lanes run it as
    written and the triples join as the golden's; the rows are the naive kernel's to rounding."""
    golden = load(HERE / "serialize_reduction" / "welford", "after", "kernel")
    assert "        m2 += d * (v - mean);\n" in golden.source
    naive = KernelState(source=golden.source.replace("        m2 += d * (v - mean);\n",
                                                     "        float d2 = v - mean;\n        m2 += d * d2;\n"),
                        plan=golden.plan)
    (site,) = get("serialize_reduction").forward_sites(naive)
    warp = get("serialize_reduction").forward(naive, site).state
    forms = emulate.builds(tmp_path, {"naive": naive, "warp": warp})
    for n in (1, 5, 70):
        x = torch.randn(3 * n, generator=torch.Generator().manual_seed(n)) * 3 + 1
        runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}", state, {"rows": 3, "n": n}, {"x": x},
                                  {"y": (torch.float32, 3 * n)})["y"] for form, (binary, state) in forms.items()}
        torch.testing.assert_close(runs["warp"], runs["naive"], rtol=1e-4, atol=1e-4)
