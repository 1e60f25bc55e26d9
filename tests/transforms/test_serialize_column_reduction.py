"""serialize_column_reduction: four lanes per column (a warp walks 8 adjacent columns down 4 rows at a time, shuffles
among a column's lanes combine its reductions) becomes one thread per column; forward finds its sites by analysis
on kernels whose loops walk down columns, of one matrix or of a batch (one thread per output of (B, D), `d = i % D`
walking `x[(b * N + n) * D + d]`). The column forms compute the naive kernels' bits on the CPU emulator
(tests/transforms/elementwise_emulator.cpp), whose shuffles wait for exactly the lanes their mask names."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.emulate import hard_rows
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

ROW = {"colmean": "c", "colargmax": "c", "batched_mean": "i"}  # case -> its thread's column index
CASES = list(ROW)
MATRIX_CASES = ["colmean", "colargmax"]  # one matrix (rows, cols); batched_mean, a batch of them, has its own test


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
    assert transform.forward_sites(naive) == [Anchor("kernel", "function", ROW[case])]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(naive) == []
    # a whole warp per column is the other layout of the same mechanism: both are offered, the gate decides
    assert get("serialize_reduction").forward_sites(naive) == [Anchor("kernel", "function", ROW[case])]
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


@pytest.mark.parametrize("case", sampled(MATRIX_CASES, keep=["colargmax"]))
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
    binaries = emulate.builds(tmp_path, {"naive": naive, "broken": broken})
    (naive_binary, naive), (broken_binary, broken) = binaries["naive"], binaries["broken"]
    want = emulate.run(naive_binary, tmp_path / "naive-run", naive, params, inputs, outputs)
    try:
        got = emulate.run(broken_binary, tmp_path / "broken-run", broken, params, inputs, outputs)
    except AssertionError as complaint:  # the emulator refuses a shuffle with a lane its mask leaves out
        assert "outside its mask" in str(complaint)
        return
    assert not torch.equal(got["mean"], want["mean"])


def _batched(batches: int, rows: int, cols: int) -> tuple[dict, dict, dict]:
    """(params, inputs, outputs) for a batch of rows x cols matrices: integer values (any order of the adds gives
    the same bits)."""
    g = torch.Generator().manual_seed(batches * 100000 + rows * 1000 + cols)
    x = torch.randint(-8, 9, (batches, rows, cols), generator=g).float()
    return {"B": batches, "N": rows, "D": cols}, {"x": x.flatten()}, {"out": (torch.float32, batches * cols)}


def test_the_batched_column_form_computes_the_naive_kernels_bits_on_the_cpu(tmp_path):
    """Batches whose columns fill no group of 8 (a warp's groups straddle batches), one and a half groups, more than
    a warp; row counts under and past the 4 slices."""
    shapes = ((1, 1, 5), (5, 3, 3), (3, 33, 12), (2, 70, 33))
    assert emulate.differences(tmp_path, golden("batched_mean", "after"),
                               {"columns": golden("batched_mean", "before")}, shapes, _batched) == []


BATCHED_ARGS = '"x", "out", ' + ", ".join(f'{{ scalar = "{name}", type = "i32" }}' for name in "BND")
BATCHED_PLAN = plan_of(BATCHED_ARGS, "cdiv(B * D, 128)", 128)
BATCHED = "__global__ void kernel(const float* x, float* out, int B, int N, int D) {\n" \
          "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= B * D) return;\n    float s = 0.0f;\n"


@pytest.mark.parametrize("declared, loop, why", [
    # the column taken modulo N while the rows step by D: no column of N is walked down
    ("int b = i / D, d = i % N;", "s += x[(b * N + n) * D + d];", "by no multiple of N"),
    ("int b = i / D, d = i % D;", "s += x[b * N * D + n * N + d];", "by no multiple of D"),
    # the batch from another divisor, directly or through a local
    ("int b = i / N, d = i % D;", "s += x[(b * N + n) * D + d];", "b, which is no batch of 'd'"),
    ("int e = i / N, b = e, d = i % D;", "s += x[(b * N + n) * D + d];", "b, which is no batch of 'd'"),
    ("int b = i / D, d = i % D;", "s += x[(b * N + n) * D + d + i];", "does not walk down a column"),
    ("int b = i / D, d = i % D;", "s += x[(b * N + n) * D + d + d];", "d, which is no batch of 'd'"),
    ("int b = i / D, d = i % D;", "s += x[(b * D + d) * N + n];", "does not walk down a column"),  # along a row
    # a column assigned, or taken modulo a width the kernel changes, is no column
    ("int b = i / D, d = i % D;\n    d += 1;", "s += x[(b * N + n) * D + d];", "nothing walks down a column"),
    ("int b = i / D, d = i % D;\n    D -= 1;", "s += x[(b * N + n) * D + d];", "nothing walks down a column"),
    ("int b = i / D, d = i % D;", "{ int d = n; s += x[(b * N + n) * D + d]; }", "nothing walks down a column"),
])
def test_no_site_where_a_batch_is_not_walked_down_its_columns(transform, declared, loop, why):
    source = BATCHED + f"    {declared}\n    for (int n = 0; n < N; ++n) {loop}\n    out[i] = s;\n}}\n"
    state = KernelState(source=source, plan=BATCHED_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "i"))


def test_a_bag_of_gathered_rows_is_walked_down_its_columns(transform, cache):
    """An embedding bag: out[b, d] sums column d of the table's rows idx[b, k]; every transform of the column family
    reads it, and their forms compile."""
    source = ("__global__ void kernel(const float* table, const int* idx, float* out, int B, int N, int D) {\n"
              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= B * D) return;\n"
              "    int b = i / D, d = i % D;\n    float s = 0.0f;\n"
              "    for (int k = 0; k < N; ++k) s += table[(long long)idx[b * N + k] * D + d];\n    out[i] = s;\n}\n")
    args = BATCHED_ARGS.replace('"x"', '"table", "idx"')
    naive = KernelState(source=source, plan=plan_of(args, "cdiv(B * D, 128)", 128))
    for name in ("serialize_column_reduction", "serialize_reduction", "unsplit_reduction"):
        (site,) = get(name).forward_sites(naive)
        compiles_without_spills(get(name).forward(naive, site).state, cache)


GRID_Y = "__global__ void kernel(const float* x, float* out, int B, int N, int D) {\n" \
         "    int d = blockIdx.x * blockDim.x + threadIdx.x;\n    int b = blockIdx.y;\n    if (d >= D) return;\n" \
         "    float s = 0.0f;\n    for (int n = 0; n < N; ++n) s += x[((long long)b * N + n) * D + d];\n" \
         "    out[b * D + d] = s;\n}\n"


@pytest.mark.parametrize("takes_the_batch", [True, False])
def test_a_batch_on_grid_y_computes_the_naive_kernels_bits(transform, tmp_path, takes_the_batch):
    """One block row per batch (`b = blockIdx.y`). The warp forms read it as one thread per output on one axis (a
    batch's rows, flattened), bounded by the batch count that grid y is: the kernel's own parameter where it takes
    one, else a last parameter `int grid_y` it is given, which the plan passes as grid y's extent."""
    source, args = GRID_Y, BATCHED_ARGS
    if not takes_the_batch:
        source, args = GRID_Y.replace("int B, ", ""), BATCHED_ARGS.replace('{ scalar = "B", type = "i32" }, ', "")
    naive = KernelState(source=source, plan=plan_of(args, 'cdiv(D, 128)", "B', 128))
    forms = {}
    for name in ("serialize_column_reduction", "serialize_reduction"):
        (site,) = get(name).forward_sites(naive)
        forms[name] = get(name).forward(naive, site).state
        grid = forms[name].plan.launches[0].grid
        assert grid[1:] == (1, 1) and "B * D" in grid[0], grid
        assert ("int grid_y" in forms[name].source) != takes_the_batch
    assert emulate.differences(tmp_path, naive, forms, ((1, 3, 5), (3, 33, 12), (2, 70, 40)), _batched) == []


def test_no_site_where_a_block_is_two_dimensional_or_the_grid_x_is_read_again(transform):
    """A block of 2-D threads is no run of whole warps along x; blockIdx.x read beyond the column index would read
    the grown grid."""
    flat = plan_of(BATCHED_ARGS, 'cdiv(D, 128)", "B', 128)
    square = KernelState(source=GRID_Y, plan=replace(flat, launches=(replace(flat.launches[0], block=(32, 4, 1)),)))
    reread = KernelState(source=GRID_Y.replace("out[b * D + d] = s;", "out[b * D + d] = s + blockIdx.x;"), plan=flat)
    for state, why in ((square, "block has more than 1 dimension"), (reread, "blockIdx.x beyond its row index")):
        assert transform.forward_sites(state) == []
        with pytest.raises(NotApplicable, match=why):
            transform.forward(state, Anchor("kernel", "function", "d"))


STRIDED = "__global__ void kernel(const float* x, float* mean, float* peak, int rows, int cols) {\n" \
          "    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += blockDim.x * gridDim.x) {\n" \
          "        float s = 0.0f, m = -INFINITY;\n" \
          "        for (int r = 0; r < rows; ++r) {\n            s += x[r * cols + c];\n" \
          "            m = fmaxf(m, x[r * cols + c]);\n        }\n        mean[c] = s / rows;\n        peak[c] = m;\n" \
          "    }\n}\n"


def test_a_grid_stride_loop_over_columns_gets_both_warp_forms_and_the_naive_kernels_bits(tmp_path):
    """Two blocks of 128 threads striding over up to 600 columns: one thread per column on a grid that covers them,
    then 4 lanes (or a warp) per column, each column's own sums."""
    naive = KernelState(source=STRIDED, plan=plan_of('"x", "mean", "peak", { scalar = "rows", type = "i32" }, '
                                                     '{ scalar = "cols", type = "i32" }', "2", 128))
    forms = {}
    for name, growth in (("serialize_column_reduction", 4), ("serialize_reduction", 32)):
        (site,) = get(name).forward_sites(naive)
        forms[name] = get(name).forward(naive, site).state
        assert forms[name].plan.launches[0].grid[0] == f"(cdiv(cols, 128)) * {growth}"
        assert "gridDim" not in forms[name].source

    def inputs_of(rows, cols):
        inputs, outputs = _columns("colmean", rows, cols)
        return {"rows": rows, "cols": cols}, inputs, outputs

    assert emulate.differences(tmp_path, naive, forms, ((3, 12), (33, 300), (5, 600)), inputs_of) == []


def test_a_columns_atomic_is_made_by_one_lane_of_its_four_and_adds_each_column_once(transform, tmp_path):
    """The total of the column sums by one atomic a column (the loss a batch of columns adds to): the four lanes of
    a column hold its sum after their shuffles, and the slice-0 lane adds it. On integer values the total is the
    naive kernel's; backward gives every thread its atomic again."""
    source = HEAD + "    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n    atomicAdd(y, s);\n}\n"
    naive = KernelState(source=source, plan=PLAN)
    (site,) = transform.forward_sites(naive)
    columns = transform.forward(naive, site).state
    assert "    if (slice == 0) atomicAdd(y, s);\n" in columns.source
    (anchor,) = transform.find(columns)
    assert transform.backward(columns, anchor).state.source == source
    x = torch.randint(-8, 9, (33, 12), generator=torch.Generator().manual_seed(5)).float()
    totals = {form: emulate.run(binary, tmp_path / f"{form}-run", state, {"rows": 33, "cols": 12},
                                {"x": x.flatten()}, {"y": (torch.float32, 1)}, starting={"y": torch.zeros(1)})["y"]
              for form, (binary, state) in emulate.builds(tmp_path, {"naive": naive, "columns": columns}).items()}
    assert totals["columns"].item() == totals["naive"].item() == float(x.sum())
