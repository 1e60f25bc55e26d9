"""An arg reduction that keeps only the index and reads the best value back through it (`if (row[c] < row[best])
best = c;`, klineage/transforms/_arg_reduction.py's `held_best`): the warp reductions read it with the value held
in a local, so an argmin spelled so gets its lanes, and their outputs are the loop's to the bit, ties included. A
loop that reads the index otherwise or reads another element back stays as written; one that keeps the last of
equal values (`<=`) is held alike. An update written as two selections, the index's first, is read as the `if`
(`chosen_best`)."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import get
from klineage.transforms._arg_reduction import chosen_best, held_best
from tests.transforms import emulate

PLAN = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(rows, 128)"]\n'
                            'block = [128]\nargs = ["x", "y", { scalar = "rows", type = "i32" }, '
                            '{ scalar = "n", type = "i32" }]\n')
HEAD = ("__global__ void kernel(const float* x, float* y, int rows, int n) {\n"
        "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r >= rows) return;\n"
        "    const float* row = x + r * n;\n    int best = 0;\n")
LOOP = "    for (int c = 1; c < n; ++c)\n        if (row[c] < row[best]) best = c;\n"
TAIL = "    y[r] = (float)best;\n}\n"


def test_the_best_value_read_back_is_held_in_a_local_read_where_the_loop_starts():
    read = held_best(KernelState(source=HEAD + LOOP + TAIL, plan=PLAN)).source
    assert read == HEAD + ("    float best_value = row[best];\n    for (int c = 1; c < n; ++c)\n"
                           "        if (row[c] < best_value) {\n            best_value = row[c];\n"
                           "            best = c;\n        }\n") + TAIL


def test_a_mirrored_compare_keeps_its_side():
    loop = LOOP.replace("row[c] < row[best]", "row[best] > row[c]")
    read = held_best(KernelState(source=HEAD + loop + TAIL, plan=PLAN)).source
    assert "if (best_value > row[c]) {" in read and "float best_value = row[best];" in read


@pytest.mark.parametrize("loop", [
    LOOP.replace("row[best]", "row[best + 1]"),  # reads another element back
    LOOP.replace("best = c;", "best = c + 1;"),  # keeps no loop index
    LOOP.replace("best = c;", "{ best = c; y[r] = row[best]; }"),  # reads the index in the loop besides
    LOOP.replace("row[c] < row[best]", "row[c] < x[best]"),  # two arrays
])
def test_other_loops_stay_as_written(loop):
    state = KernelState(source=HEAD + loop + TAIL, plan=PLAN)
    assert held_best(state) == state


@pytest.mark.parametrize("compare", ["<", "<="])
def test_the_lanes_of_an_argmin_read_back_give_its_bits(tmp_path, compare):
    """The first index on ties (`<`), or the last (`<=`, read as the arg reduction that keeps the last of equal
    values: its start index 0 is below the loop's first column)."""
    state = KernelState(source=HEAD + LOOP.replace("row[c] < row[best]", f"row[c] {compare} row[best]") + TAIL,
                        plan=PLAN)
    transform = get("serialize_reduction")  # a warp a row (the block form keeps no arg reductions)
    (site,) = transform.forward_sites(state)
    shared = transform.forward(state, site).state

    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict]:
        g = torch.Generator().manual_seed(rows * n)  # few values: ties everywhere, which the first index wins
        return ({"rows": rows, "n": n}, {"x": torch.randint(-3, 4, (rows * n,), generator=g).float()},
                {"y": (torch.float32, rows)})

    assert emulate.differences(tmp_path, state, {"lanes": shared}, ((3, 5), (40, 70), (2, 300), (5, 1)),
                               inputs_of) == []


CHOSEN = ("    float best = -INFINITY;\n    int at = 0;\n    for (int c = 0; c < n; ++c) {\n"
          "        float v = x[r * n + c];\n        at = v > best ? c : at;\n        best = v > best ? v : best;\n"
          "    }\n    y[r] = (float)at;\n}\n")
HEAD_PLAIN = ("__global__ void kernel(const float* x, float* y, int rows, int n) {\n"
              "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r >= rows) return;\n")


def test_an_arg_reduction_chosen_by_two_selections_is_the_if_and_gives_its_bits(tmp_path):
    """`at = v > best ? c : at; best = v > best ? v : best;`: the index chosen first, both compares see the old best,
    so it is the `if` the warp reductions read; its lanes give the loop's first index on rows full of ties."""
    state = KernelState(source=HEAD_PLAIN + CHOSEN, plan=PLAN)
    assert "if (v > best) {\n            best = v;\n            at = c;\n        }" in chosen_best(state).source
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(state)
    shared = transform.forward(state, site).state

    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict]:
        g = torch.Generator().manual_seed(rows * n)
        return ({"rows": rows, "n": n}, {"x": torch.randint(-3, 4, (rows * n,), generator=g).float()},
                {"y": (torch.float32, rows)})

    assert emulate.differences(tmp_path, state, {"lanes": shared}, ((3, 5), (40, 70)), inputs_of) == []


@pytest.mark.parametrize("loop", [
    # the value chosen first: the index's compare then sees the new best
    CHOSEN.replace("        at = v > best ? c : at;\n        best = v > best ? v : best;\n",
                   "        best = v > best ? v : best;\n        at = v > best ? c : at;\n"),
    CHOSEN.replace("at = v > best ? c : at;", "at = v >= best ? c : at;"),  # two compares
    CHOSEN.replace("best = v > best ? v : best;", "best = v > best ? v : at;"),  # keeps another value
])
def test_selections_that_are_not_one_if_stay_as_written(loop):
    state = KernelState(source=HEAD_PLAIN + loop, plan=PLAN)
    assert chosen_best(state) == state
