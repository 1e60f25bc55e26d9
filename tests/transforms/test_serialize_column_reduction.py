"""serialize_column_reduction: four lanes per column (a warp walks 8 adjacent columns down 4 rows at a time, shuffles
among a column's lanes combine its reductions) becomes one thread per column; forward finds its sites by analysis
on kernels whose loops walk down columns. The column forms compute the naive kernels' bits on the CPU emulator
(tests/transforms/elementwise_emulator.cpp), whose shuffles wait for exactly the lanes their mask names."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.emulate import hard_rows
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["colmean", "colargmax"]


@pytest.fixture(scope="module")
def transform():
    return get("serialize_column_reduction")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "serialize_column_reduction" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("serialize_column_reduction", case)


def test_golden_kernels_compile(cache):
    for case in CASES:
        for which in ("before", "after"):
            compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis_beside_a_warp_per_column(transform, case):
    naive = golden(case, "after")
    assert transform.forward_sites(naive) == [Anchor("kernel", "function", "c")]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(naive) == []
    # a whole warp per column is the other layout of the same mechanism: both are offered, the gate decides
    assert get("serialize_reduction").forward_sites(naive) == [Anchor("kernel", "function", "c")]
    assert get("serialize_reduction").find(golden(case, "before")) == []


PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', "cdiv(cols, 128)",
               128)
HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n" \
       "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n    if (c >= cols) return;\n    float s = 0.0f;\n"


@pytest.mark.parametrize("loop, why", [
    ("for (int r = 0; r < rows; ++r) s += x[c * rows + r];", "does not walk down a column"),  # along a row
    ("for (int r = 0; r < rows; ++r) s += x[r * cols + c + r];", "does not walk down a column"),
    ("for (int r = 0; r < rows; ++r) s += x[r * cols] * x[r];", "nothing walks down a column"),
    ("for (int r = 0; r < rows; ++r) { s += x[r * cols + c]; y[r * cols + c] = s; }", "running sum"),
])
def test_no_site_where_the_loop_does_not_walk_down_columns(transform, loop, why):
    state = KernelState(source=HEAD + f"    {loop}\n    y[c] = s;\n}}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "c"))


def _columns(case: str, rows: int, cols: int) -> tuple[dict, dict]:
    """(inputs, outputs) for a rows x cols matrix: integer values for the mean (so any order of the adds gives the
    same bits), for the argmax the hard rows' columns (ties, NaNs, infinities, signed zeros) side by side."""
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    if case == "colmean":
        x = torch.randint(-8, 9, (rows, cols), generator=g).float()
        return {"x": x.flatten()}, {"mean": (torch.float32, cols), "peak": (torch.float32, cols)}
    x = hard_rows(rows, g).t().contiguous()[:, :cols]
    return {"x": x.flatten()}, {"values": (torch.float32, x.shape[1]), "rows_at": (torch.int64, x.shape[1])}


@pytest.mark.parametrize("case", sampled(CASES, keep=["colargmax"]))
def test_the_column_form_computes_the_naive_kernels_bits_on_the_cpu(case, tmp_path):
    """Column counts that fill no group of 8, one and a half groups, several blocks; row counts under and past the
    4 slices: the lanes past the last column leave together, the others combine exactly their own rows."""
    shapes = ((1, 5), (3, 12), (33, 12), (70, 9)) if case == "colargmax" else ((1, 5), (3, 12), (33, 300), (70, 9))

    def inputs_of(rows, cols):
        inputs, outputs = _columns(case, rows, cols)
        return {"rows": rows, "cols": outputs[next(iter(outputs))][1]}, inputs, outputs

    assert emulate.differences(tmp_path, golden(case, "after"), {"columns": golden(case, "before")}, shapes,
                               inputs_of) == []


@pytest.mark.parametrize("mutant", [("r += 4", "r += 8"), ("0x01010101u", "0x00010101u")])
def test_a_layout_that_skips_rows_or_a_lane_is_caught(mutant, tmp_path):
    columns = golden("colmean", "before")
    assert mutant[0] in columns.source
    broken = KernelState(source=columns.source.replace(*mutant), plan=columns.plan)
    naive = golden("colmean", "after")
    inputs, outputs = _columns("colmean", 33, 12)
    params = {"rows": 33, "cols": 12}
    want = emulate.run(emulate.build(tmp_path / "naive", naive), tmp_path / "naive-run", naive, params, inputs,
                       outputs)
    binary = emulate.build(tmp_path / "broken", broken)
    try:
        got = emulate.run(binary, tmp_path / "broken-run", broken, params, inputs, outputs)
    except AssertionError as complaint:  # the emulator refuses a shuffle with a lane its mask leaves out
        assert "outside its mask" in str(complaint)
        return
    assert not torch.equal(got["mean"], want["mean"])
