"""serialize_block_reduction: a block a row (threads stride the row, shuffles and a shared slot a warp combine the
reductions) becomes one thread a row; forward finds its sites by analysis where serialize_reduction's reading
holds and the loops only reduce. The block form is run on the CPU emulator (tests/transforms/elementwise_emulator.cpp:
whole blocks, barriers checked) against the naive kernel, on rows longer than the block and shorter than a warp."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.emulate import hard_rows
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["softmax", "rowsum", "loss", "argmax", "softmax_online", "welford"]


@pytest.fixture(scope="module")
def transform():
    return get("serialize_block_reduction")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "serialize_block_reduction" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("serialize_block_reduction", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=("softmax",)))
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    naive = golden(case, "after")
    assert transform.forward_sites(naive) == [Anchor("kernel", "function", "row")]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(naive) == []
    # the warp form's transform reads neither the block form as its own nor the block form as naive
    assert get("serialize_reduction").find(golden(case, "before")) == []
    assert get("serialize_reduction").forward_sites(golden(case, "before")) == []


def _row_stats(rows: int, n: int) -> tuple[dict, dict, dict]:
    """Integer values: any order of the adds gives the same bits, so the block form must give the naive ones."""
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randint(-8, 9, (rows * n,), generator=g).float()
    return {"rows": rows, "n": n}, {"x": x}, {"y": (torch.float32, 2 * rows)}


def test_the_block_form_computes_the_naive_kernels_bits(tmp_path):
    """Rows shorter than a warp, than a block, and longer than two blocks; one row and a few."""
    naive, block = golden("rowsum", "after"), golden("rowsum", "before")
    assert emulate.differences(tmp_path, naive, {"block": block}, ((1, 5), (3, 200), (2, 700)), _row_stats) == []


def test_the_emulation_sees_a_fold_that_skips_a_warp(tmp_path):
    block = golden("rowsum", "before")
    wrong = KernelState(source=block.source.replace(" + block_sum[7];", ";"), plan=block.plan)
    assert wrong.source != block.source
    assert emulate.differences(tmp_path, golden("rowsum", "after"), {"wrong": wrong}, ((2, 700),), _row_stats)


JOINS = [None, ("for (int block_warp = 1;", "for (int block_warp = 8;")]  # a join that keeps warp 0's tuple


@pytest.mark.parametrize("mutant", JOINS)
def test_the_block_forms_joins_give_the_naive_argmax_bits_and_statistics(mutant, tmp_path):
    """The warps' (value, index) pairs, online maxima and Welford triples joined through shared slots: the argmax on
    hard rows (ties, NaNs, infinities, signed zeros) to the bit, the one-pass softmax and the Welford norm to
    rounding, for rows shorter than a warp and longer than two blocks. A join that keeps warp 0's tuple is caught."""
    def broken(case: str) -> KernelState:
        block = golden(case, "before")
        return block if mutant is None else KernelState(source=block.source.replace(*mutant), plan=block.plan)

    def hard(rows: int, n: int) -> tuple[dict, dict, dict]:
        x = hard_rows(n, torch.Generator().manual_seed(n))
        return ({"rows": x.shape[0], "n": n}, {"x": x.flatten(), "w": torch.ones(n)},
                {"peak": (torch.float32, x.shape[0]), "where": (torch.int64, x.shape[0])})

    def normal(rows: int, n: int) -> tuple[dict, dict, dict]:
        x = torch.randn(rows * n, generator=torch.Generator().manual_seed(n)) * 3 + 1
        return {"rows": rows, "n": n}, {"x": x}, {"y": (torch.float32, rows * n)}

    found = {"argmax": emulate.differences(tmp_path / "argmax", golden("argmax", "after"),
                                           {"block": broken("argmax")}, ((0, 5), (0, 700)), hard)}
    for case in ("softmax_online", "welford"):
        forms = emulate.builds(tmp_path / case, {"naive": golden(case, "after"), "block": broken(case)})
        found[case] = []
        for n in (5, 700):
            params, inputs, outputs = normal(3, n)
            runs = {form: emulate.run(binary, tmp_path / case / f"{form}-{n}", state, params, inputs, outputs)["y"]
                    for form, (binary, state) in forms.items()}
            if not torch.allclose(runs["block"], runs["naive"], rtol=1e-4, atol=1e-4):
                found[case].append(n)
    assert all(not differ if mutant is None else differ for differ in found.values()), found


ROW = ("__global__ void kernel(const float* x, float* y, int rows, int n) {\n"
       "    int row = blockIdx.x * blockDim.x + threadIdx.x;\nGUARD"
       "    float s = 0.0f;\n    LOOP\n    y[row] = s;\nCLOSE}\n")


def _row(guard: str, loop: str) -> str:
    return ROW.replace("GUARD", guard).replace("LOOP", loop).replace("CLOSE", "    }\n" if guard else "")
PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "n", type = "i32" }', "cdiv(rows, 128)", 128)


@pytest.mark.parametrize("guard, loop, why", [
    ("    if (row < rows) {\n", "for (int j = 0; j < n; ++j) { s += x[row * n + j]; y[row * n + j] = s; }",
     "running sum"),  # a scan: each lane needs the earlier lanes' totals
    ("", "for (int j = 0; j < n; ++j) s += x[row * n + j];", "under no guard"),  # no row count for the grid
    # a guard that holds only part of the rows' work: launched as its count, the later rows would never run
    ("    if (row < n) y[row] = 0.0f;\n    if (row < rows) {\n", "for (int j = 0; j < n; ++j) s += x[row * n + j];",
     "under no guard"),
    # the count changed by the kernel: the plan's value would not be the kernel's
    ("    if (row < rows) {\n    rows = rows / 2;\n", "for (int j = 0; j < n; ++j) s += x[row * n + j];",
     "assigns or declares rows"),
])
def test_refused_with_the_reason(transform, guard, loop, why):
    state = KernelState(source=_row(guard, loop), plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "row"))


def test_the_grid_is_the_row_count_in_the_plans_terms_and_back(transform):
    naive = KernelState(source=_row("    if (row < rows) {\n", "for (int j = 0; j < n; ++j) s += x[row * n + j];"),
                        plan=plan_of('"x", "y", { scalar = "b * t", type = "i32" }, { scalar = "n", type = "i32" }',
                                     "cdiv(b * t, 128)", 128))
    block = transform.forward(naive, transform.forward_sites(naive)[0]).state
    assert (block.plan.launches[0].grid[0], block.plan.launches[0].block[0]) == ("(b * t)", 256)
    serial = transform.backward(block, transform.find(block)[0]).state
    assert serial.source == naive.source
    assert (serial.plan.launches[0].grid[0], serial.plan.launches[0].block[0]) == ("cdiv((b * t), 256)", 256)


@pytest.mark.parametrize("loop", [
    "    for (int j = 0; j < n; ++j) {\n        y[row * n + j] = (running += 2.0f * x[row * n + j]);\n    }\n",
    "    for (int j = 0; j < n; ++j) y[row * n + j] = running += 2.0f * x[row * n + j];\n",
    "    for (int j = 0; j < n; ++j) {\n        y[row * n + j] = running = running + 2.0f * x[row * n + j];\n    }\n",
    "    for (int j = 0; j < n; ++j) {\n        y[row * n + j] = (running += 2.0f * x[row * n + j]) * 0.5f;\n    }\n",
])
def test_a_running_sum_stored_by_its_update_is_no_block_site(transform, loop):
    """The serialize_reduction golden running sum with its update inside its store: a scan however spelled (or a
    value no lane holds), which the block form does not combine. Read as a plain loop, its lanes would each have
    stored a sum of their own columns."""
    naive = load(HERE / "serialize_reduction" / "cumsum", "after", "kernel")
    scan = "    for (int j = 0; j < n; ++j) {\n        running += 2.0f * x[row * n + j];\n" \
           "        y[row * n + j] = running;\n    }\n"
    assert scan in naive.source
    assert transform.forward_sites(KernelState(source=naive.source.replace(scan, loop), plan=naive.plan)) == []


def test_the_block_form_of_an_argmax_that_keeps_the_last_tie_gives_its_bits_and_reads_back(tmp_path):
    """`>=` (the last of equal values): the warps' pairs and the shared slots join to the larger index on ties, the
    hard rows come out to the bit, and the backward reads the block form it wrote back to the loop."""
    naive = golden("argmax", "after")
    last = KernelState(source=naive.source.replace("if (v > top) {", "if (v >= top) {"), plan=naive.plan)
    transform = get("serialize_block_reduction")
    (site,) = transform.forward_sites(last)
    block = transform.forward(last, site).state
    assert "(pair_value == top && pair_index > top_at)" in block.source
    assert "(block_top[block_warp] == top && block_top_at[block_warp] > top_at)" in block.source
    (found,) = transform.find(block)
    assert transform.backward(block, found).state.source.count("if (v >= top) {") == 1

    def hard(rows: int, n: int) -> tuple[dict, dict, dict]:
        x = hard_rows(n, torch.Generator().manual_seed(n))
        return ({"rows": x.shape[0], "n": n}, {"x": x.flatten(), "w": torch.ones(n)},
                {"peak": (torch.float32, x.shape[0]), "where": (torch.int64, x.shape[0])})

    assert emulate.differences(tmp_path, last, {"block": block}, ((0, 5), (0, 700)), hard) == []
