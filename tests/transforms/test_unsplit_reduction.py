"""unsplit_reduction: a reduction split into chunks of 128 steps on grid y (partials in scratch, merged in chunk
order by a second launch) becomes one thread's loop; forward finds its sites by analysis. The split forms compute
the naive kernels' bits on the CPU emulator (tests/transforms/elementwise_emulator.cpp) over several chunks."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState, parse_constants
from klineage.launch import resolve
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.emulate import hard_rows
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["colsum", "colargmax"]


@pytest.fixture(scope="module")
def transform():
    return get("unsplit_reduction")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "unsplit_reduction" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("unsplit_reduction", case)


def test_golden_kernels_compile(cache):
    for case in CASES:
        for which in ("before", "after"):
            compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    naive = golden(case, "after")
    assert transform.forward_sites(naive) == [Anchor("kernel", "function", "c")]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(naive) == []


PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', "cdiv(cols, 128)",
               128)
HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n" \
       "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n"


@pytest.mark.parametrize("body, why", [
    ("    if (c >= cols) return;\n    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n"
     "    float t = 0.0f;\n    for (int r = 0; r < rows; ++r) t += x[r * cols + c] * s;\n    y[c] = t;\n", "2 loops"),
    ("    if (c >= cols) return;\n    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) { s += x[r * cols + c]; "
     "y[r * cols + c] = s; }\n", "running sum"),
    ("    if (c >= cols) return;\n    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n",
     "nothing after"),
    ("    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n    y[c] = s;\n",
     "no `if \\(c >= N\\) return;`"),
    ("    if (c >= cols) return;\n    float s = 0.0f;\n    for (int r = 0; r < 7; ++r) s += x[r * cols + c];\n"
     "    y[c] = s;\n", "`7` is not a name"),
    ("    if (c >= cols) return;\n    float split_s = 0.0f;\n"
     "    for (int r = 0; r < rows; ++r) split_s += x[r * cols + c];\n    y[c] = split_s;\n", "already names split"),
])
def test_no_site_where_a_split_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "c"))


def _columns(case: str, rows: int, cols: int) -> tuple[dict, dict, dict]:
    """(params, inputs, outputs with the scratch) for a rows x cols matrix: integer values for the sum (any order of
    the adds gives the same bits), for the argmax the hard rows' columns (ties, NaNs, infinities, signed zeros)."""
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    chunks = -(-rows // 128)
    if case == "colsum":
        x = torch.randint(-8, 9, (rows, cols), generator=g).float()
        return ({"rows": rows, "cols": cols}, {"dy": x.flatten()},
                {"db": (torch.float32, cols), "split_sum": (torch.float32, chunks * cols)})
    x = hard_rows(rows, g).t().contiguous()[:, :cols]
    cols = x.shape[1]
    return ({"rows": rows, "cols": cols}, {"x": x.flatten()},
            {"values": (torch.float32, cols), "rows_at": (torch.int64, cols),
             "split_best": (torch.float32, chunks * cols), "split_at": (torch.int64, chunks * cols)})


@pytest.mark.parametrize("case", sampled(CASES, keep=["colargmax"]))
def test_the_split_form_computes_the_naive_kernels_bits_on_the_cpu(case, tmp_path):
    """Rows in one chunk, in three (the last one short), at a chunk's edge: the merge's answer is the loop's."""
    naive, split = golden(case, "after"), golden(case, "before")
    binaries = {"naive": emulate.build(tmp_path / "naive", naive), "split": emulate.build(tmp_path / "split", split)}
    for rows, cols in ((1, 5), (129, 12), (300, 9)):
        params, inputs, outputs = _columns(case, rows, cols)
        runs = {form: emulate.run(binaries[form], tmp_path / f"{form}-{rows}", state, params, inputs, outputs)
                for form, state in (("naive", naive), ("split", split))}
        for name in ("db",) if case == "colsum" else ("values", "rows_at"):
            assert torch.equal(runs["split"][name].view(torch.uint8), runs["naive"][name].view(torch.uint8)), \
                (rows, cols, name)


@pytest.mark.parametrize("mutant", [("r < split_first + SPLIT", "r <= split_first + SPLIT"),
                                    ("split_index < at", "split_index > at")])
def test_a_chunk_that_overlaps_or_a_merge_that_breaks_ties_otherwise_is_caught(mutant, tmp_path):
    case = "colsum" if "SPLIT" in mutant[0] else "colargmax"
    split = golden(case, "before")
    assert mutant[0] in split.source
    broken = KernelState(source=split.source.replace(*mutant), plan=split.plan)
    params, inputs, outputs = _columns(case, 300, 12)
    naive = golden(case, "after")
    want = emulate.run(emulate.build(tmp_path / "naive", naive), tmp_path / "naive-run", naive, params, inputs,
                       outputs)
    got = emulate.run(emulate.build(tmp_path / "broken", broken), tmp_path / "broken-run", broken, params, inputs,
                      outputs)
    name = "db" if case == "colsum" else "rows_at"
    assert not torch.equal(got[name], want[name])


def test_a_case_with_no_rows_launches_one_chunk_and_the_merge_reads_none():
    split = golden("colsum", "before")
    launches = resolve(split.plan, {**parse_constants(split.source), "rows": 0, "cols": 5}, {"dy", "db", "split_sum"})
    assert [launch.grid for launch in launches] == [(1, 1, 1), (1, 1, 1)]
    assert "split < (rows + SPLIT - 1) / SPLIT" in split.source  # no rows: no chunk is merged, the sum stays 0


def test_a_loop_bound_that_is_a_product_is_said_in_the_plan_by_the_launchs_values(transform):
    plan = plan_of('"x", "y", { scalar = "cols", type = "i32" }, { scalar = "c", type = "i32" }, '
                   '{ scalar = "2 * h", type = "i32" }', "cdiv(cols, 128)", 128)
    naive = KernelState(source="__global__ void kernel(const float* x, float* y, int cols, int c, int hw) {\n"
                               "    int k = blockIdx.x * blockDim.x + threadIdx.x;\n    if (k >= cols) return;\n"
                               "    float s = 0.0f;\n    for (int r = 0; r < c * hw; ++r) s += x[r * cols + k];\n"
                               "    y[k] = s;\n}\n", plan=plan)
    split = transform.forward(naive, Anchor("kernel", "function", "k")).state
    assert split.plan.launches[0].grid[1] == "cdiv(max(c * (2 * h), 1), SPLIT)"
    assert "for (int split = 0; split < (c * hw + SPLIT - 1) / SPLIT; ++split)" in split.source


def test_a_count_cast_to_size_t_is_the_count_in_the_plan_and_stays_cast_in_the_kernel(transform, cache):
    naive = KernelState(source="__global__ void kernel(const float* x, float* y, int rows, int cols) {\n"
                               "    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
                               "    if (c >= (size_t)cols) return;\n    float s = 0.0f;\n"
                               "    for (size_t r = 0; r < (size_t)rows; ++r) s += x[r * cols + c];\n"
                               "    y[c] = s;\n}\n", plan=PLAN)
    (site,) = transform.forward_sites(naive)
    split = transform.forward(naive, site).state
    assert split.plan.launches[0].grid[1] == "cdiv(max(rows, 1), SPLIT)"
    assert "r < (size_t)rows && r < split_first + SPLIT" in split.source
    assert get("serialize_reduction").forward_sites(naive)  # the warp reductions read the cast bound too
    compiles_without_spills(split, cache)
