"""A sum that starts from a value other than zero (klineage/transforms/_sum_starts.py): the warp reductions read it
as the sum from zero with its start added after the loop, so a matrix-vector product with a bias (or a column sum
from a bias) gets its lanes; on integer values, which any order sums exactly, the warp form's outputs are the
naive kernel's bits. A start whose sum is read otherwise in its loop stays as written, and the reduction refuses
it as before."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import get
from klineage.transforms._sum_starts import started_at_zero
from tests.transforms import emulate

PLAN = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(rows, 128)"]\n'
                            'block = [128]\nargs = ["w", "x", "b", "y", { scalar = "rows", type = "i32" }, '
                            '{ scalar = "n", type = "i32" }]\n')
HEAD = ("__global__ void kernel(const float* w, const float* x, const float* b, float* y, int rows, int n) {\n"
        "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n")
GEMV = HEAD + "    float acc = b[row];\n    for (int j = 0; j < n; ++j) acc += w[row * n + j] * x[j];\n" \
              "    y[row] = acc;\n}\n"


def test_a_sum_from_a_bias_reads_as_a_sum_from_zero_with_the_bias_added_after():
    read = started_at_zero(KernelState(source=GEMV, plan=PLAN)).source
    assert read == HEAD + "    const float acc_start = b[row];\n    float acc = 0.0f;\n" \
                          "    for (int j = 0; j < n; ++j) acc += w[row * n + j] * x[j];\n" \
                          "    acc = acc_start + acc;\n    y[row] = acc;\n}\n"


@pytest.mark.parametrize("name", ["serialize_reduction", "serialize_block_reduction"])
def test_the_lanes_of_a_product_with_a_bias_give_its_bits_on_integer_values(name, tmp_path):
    state = KernelState(source=GEMV, plan=PLAN)
    transform = get(name)
    (site,) = transform.forward_sites(state)
    shared = transform.forward(state, site).state

    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict]:
        g = torch.Generator().manual_seed(rows * n)
        return ({"rows": rows, "n": n}, {"w": torch.randint(-8, 9, (rows * n,), generator=g).float(),
                                         "x": torch.randint(-8, 9, (n,), generator=g).float(),
                                         "b": torch.randint(-50, 51, (rows,), generator=g).float()},
                {"y": (torch.float32, rows)})

    assert emulate.differences(tmp_path, state, {"lanes": shared}, ((3, 5), (40, 70), (2, 300)), inputs_of) == []


@pytest.mark.parametrize("body", [
    # the sum read by its own loop, a statement between the start and the loop, its address taken, a zero start
    "    float acc = b[row];\n    for (int j = 0; j < n; ++j) acc += acc * x[j];\n    y[row] = acc;\n",
    "    float acc = b[row];\n    y[row] = acc;\n    for (int j = 0; j < n; ++j) acc += x[j];\n    y[row] = acc;\n",
    "    float acc = b[row];\n    for (int j = 0; j < n; ++j) { float* p = &acc; *p += x[j]; }\n    y[row] = acc;\n",
    "    float acc = 0.0f;\n    for (int j = 0; j < n; ++j) acc += x[j];\n    y[row] = acc;\n",
    "    float acc = b[row];\n    for (int j = 0; j < n; ++j) acc = fmaxf(acc, x[j]);\n    y[row] = acc;\n",
])
def test_a_start_whose_sum_is_read_otherwise_stays_as_written(body):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert started_at_zero(state) is state


def test_late_evaluates_the_start_after_the_loop():
    """`late` (the matrix product's forms, whose threads past the edge run the loop): the start itself moves after
    the loop, added there."""
    read = started_at_zero(KernelState(source=GEMV, plan=PLAN), late=True).source
    assert read == HEAD + "    float acc = 0.0f;\n    for (int j = 0; j < n; ++j) acc += w[row * n + j] * x[j];\n" \
                          "    acc += b[row];\n    y[row] = acc;\n}\n"


@pytest.mark.parametrize("start, loop", [
    ("b[row]", "for (int j = 0; j < n; ++j) { acc += x[j]; y[j] = 0.0f; }"),  # the loop writes an array element
    ("b[row] * n", "for (; n > 0; --n) acc += x[n];"),  # the loop assigns a name the start reads
    ("b[row]", "for (int j = 0; j < n; ++j) acc += atomicAdd(y, x[j]);"),  # the loop calls what has an effect
    ("atomicAdd(y, 1.0f)", "for (int j = 0; j < n; ++j) acc += x[j];"),  # the start has an effect
    ("b[row++]", "for (int j = 0; j < n; ++j) acc += x[j];"),  # the start assigns
])
def test_late_leaves_a_start_the_loop_could_change_as_written(start, loop):
    """Evaluated after the loop, the start must read what it read before it; where the loop could change that (or
    the start has an effect of its own) the sum stays as written."""
    state = KernelState(source=HEAD + f"    float acc = {start};\n    {loop}\n    y[row] = acc;\n}}\n", plan=PLAN)
    assert started_at_zero(state, late=True) is state
    assert started_at_zero(state) is not state  # evaluated where it was, each start is the same value
