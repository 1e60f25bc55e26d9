"""A running sum, product or extreme whose first element is handled before its loop (klineage/transforms/
_peeled_scans.py): the warp scans read it as the loop from 0, started from the operation's exact identity, so it
gets its lanes and their rows are the naive loop's to the bit (a -0.0 first element included). Peeled steps that
are not the loop's first, and read-backs that are not of the element just stored, stay as written."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import get
from klineage.transforms._peeled_scans import unpeeled
from tests.transforms import emulate

PLAN = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(rows, 128)"]\n'
                            'block = [128]\nargs = ["x", "y", { scalar = "rows", type = "i32" }, '
                            '{ scalar = "n", type = "i32" }]\n')
HEAD = ("__global__ void kernel(const float* x, float* y, int rows, int n) {\n"
        "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r >= rows) return;\n")
PEELED = ("    float acc = x[r * n];\n    y[r * n] = acc;\n    for (int j = 1; j < n; ++j) {\n"
          "        acc += x[r * n + j];\n        y[r * n + j] = acc;\n    }\n}\n")
# the running value read back from the element stored before, through row pointers
READ_BACK = ("    const float* xr = x + r * n;\n    float* yr = y + r * n;\n    yr[0] = xr[0];\n"
             "    for (int j = 1; j < n; j++)\n        yr[j] = yr[j - 1] + xr[j];\n}\n")
CUMMAX = ("    float m = x[r * n];\n    y[r * n] = m;\n    for (int j = 1; j < n; ++j) {\n"
          "        m = fmaxf(m, x[r * n + j]);\n        y[r * n + j] = m;\n    }\n}\n")
FROM_ZERO = ("    float acc = -0.0f;\n    for (int j = 0; j < n; ++j) {\n        acc += x[r * n + j];\n"
             "        y[r * n + j] = acc;\n    }\n}\n")


def _state(body: str) -> KernelState:
    return KernelState(source=HEAD + body, plan=PLAN)


def test_a_peeled_first_step_is_the_loops_first_from_the_exact_identity():
    assert unpeeled(_state(PEELED)).source == HEAD + FROM_ZERO


@pytest.mark.parametrize("first", [
    "    float acc;\n    acc = x[r * n];\n    y[r * n] = acc;\n",  # the start assigned
    "    y[r * n] = x[r * n];\n    float acc = x[r * n];\n",  # the store first, of the start's own expression
    "    float acc = x[r * n + 0];\n    y[r * n] = x[(r * n)];\n",  # the same places spelled otherwise
])
def test_the_peeled_step_spelled_otherwise_reads_the_same(first):
    body = PEELED.replace("    float acc = x[r * n];\n    y[r * n] = acc;\n", first)
    read = unpeeled(_state(body)).source
    assert "for (int j = 0; j < n; ++j) {" in read and "-0.0f" in read and "y[r * n] =" not in read


WIDE = PEELED.replace("r * n", "(long long)r * n")


def test_a_widened_offset_is_the_same_place_where_it_is_widened_alike():
    """`(long long)r * n` is a name of its own times n in the polynomials: the same place in the peeled step and at
    index 0 of the loop; `(long long)(r * n)`, whose product may wrap where the widened one does not, is not."""
    assert "for (int j = 0; j < n; ++j) {" in unpeeled(_state(WIDE)).source
    narrowed = _state(WIDE.replace("float acc = x[(long long)r * n];", "float acc = x[(long long)(r * n)];"))
    assert unpeeled(narrowed) == narrowed


def test_the_read_back_running_value_is_a_local_of_the_elements_type():
    assert unpeeled(_state(READ_BACK)).source == HEAD + (
        "    const float* xr = x + r * n;\n    float* yr = y + r * n;\n    float running = -0.0f;\n"
        "    for (int j = 0; j < n; j++) {\n        running += xr[j];\n        yr[j] = running;\n    }\n}\n")


def test_a_running_extreme_and_product_start_from_their_identities():
    assert "float m = __int_as_float(0x7fc00000);" in unpeeled(_state(CUMMAX)).source
    product = unpeeled(_state(PEELED.replace("acc += ", "acc *= "))).source
    assert "float acc = 1.0f;" in product and "for (int j = 0;" in product
    by_call = unpeeled(_state(READ_BACK.replace("yr[j - 1] + xr[j]", "fminf(xr[j], yr[j - 1])"))).source
    assert "float running = __int_as_float(0x7fc00000);" in by_call and "running = fminf(running, xr[j]);" in by_call


@pytest.mark.parametrize("body", [
    PEELED.replace("float acc = x[r * n];", "float acc = x[r * n + 1];"),  # not the loop's first element
    PEELED.replace("y[r * n] = acc;", "y[r * n + 1] = acc;"),  # stored elsewhere
    PEELED.replace("int j = 1;", "int j = 2;"),  # two elements peeled
    PEELED.replace("float acc = x[r * n];", "float acc = 2.0f * x[r * n];"),  # another value than the loop's
    PEELED.replace("    y[r * n] = acc;\n", "    y[r * n] = acc;\n    acc = acc;\n"),  # not just before the loop
    PEELED.replace("    float acc = x[r * n];\n    y[r * n] = acc;\n",  # the store before the start: an older value
                   "    float acc = 0.0f;\n    y[r * n] = acc;\n    acc = x[r * n];\n"),
    READ_BACK.replace("yr[j - 1] + xr[j]", "yr[j - 2] + xr[j]"),  # read back from two before
    READ_BACK.replace("yr[j - 1] + xr[j]", "yr[j - 1] + yr[j]"),  # the value reads the stored array
    READ_BACK.replace("yr[0] = xr[0];", "yr[0] = 0.0f;"),  # the first element is not the loop's value at 0
    READ_BACK.replace("yr[j - 1] + xr[j]", "yr[j - 1] - xr[j]"),  # no scan's operation
])
def test_what_is_not_the_loops_own_first_step_stays_as_written(body):
    state = _state(body)
    assert unpeeled(state) == state


def test_a_double_running_sum_reads_back_in_doubles():
    state = KernelState(source=(HEAD + READ_BACK).replace("float*", "double*"), plan=PLAN)
    assert "double running = -0.0;" in unpeeled(state).source


ROWS = 3
COLUMNS = (1, 31, 32, 70)


def _rows(case: str, n: int) -> torch.Tensor:
    """Small integers (sums exact in any order), each row's first element -0.0 for the sums (a start of +0.0 would
    store +0.0 there); negative ones for the running maximum (a lane past the row's end contributing zero would
    show)."""
    g = torch.Generator().manual_seed(n)
    values = torch.randint(-9, 0 if case == "cummax" else 10, (ROWS, n), generator=g).float()
    if case != "cummax":
        values[:, 0] = -0.0
    return values.reshape(-1)


@pytest.mark.parametrize("case", ["peeled", "read_back", "cummax"])
def test_the_warp_scan_of_a_peeled_row_gives_the_naive_bits_on_the_cpu(case, tmp_path):
    """serialize_reduction's warp scan of each spelling against the naive loop as written, rows shorter than a warp,
    of one and past two: every element's bits; and a mutant that starts a sum from +0.0 is caught."""
    naive = _state({"peeled": PEELED, "read_back": READ_BACK, "cummax": CUMMAX}[case])
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(naive)
    warp = transform.forward(naive, site).state
    forms = {"warp": warp}
    if case != "cummax":
        forms["mutant"] = KernelState(source=warp.source.replace("= -0.0f;", "= 0.0f;"), plan=warp.plan)
        assert forms["mutant"] != warp
    found = emulate.differences(tmp_path, naive, forms, tuple((n,) for n in COLUMNS),
                                lambda n: ({"rows": ROWS, "n": n}, {"x": _rows(case, n)},
                                           {"y": (torch.float32, ROWS * n)}))
    assert [line for line in found if line.startswith("warp")] == []
    assert case == "cummax" or len(found) == 2 * len(COLUMNS)  # the mutant, aligned and not, at every length
