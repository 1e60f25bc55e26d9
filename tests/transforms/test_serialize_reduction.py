"""serialize_reduction: one warp per row (lanes stride the row, shuffles combine the reductions) becomes one
thread per row; forward finds its sites by analysis on any kernel where the rewrite is legal. An arg reduction
(the best value and its first column) is combined by a (value, index) shuffle that gives the naive loop's bits,
checked on the CPU emulator (tests/transforms/elementwise_emulator.cpp) with ties, NaNs, infinities and signed
zeros."""

from __future__ import annotations

import re

import pytest
import torch

from klineage import devices, expr
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get, refusals
from klineage.transforms._scan_spellings import respelled
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.emulate import hard_rows
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["softmax", "softmax_online", "welford", "rowsum", "rowprod", "cumsum", "cumprod", "cumsum_exclusive",
         "cumsum_reverse", "cummax", "argmax", "argmin", "loss"]


@pytest.fixture(scope="module")
def transform():
    return get("serialize_reduction")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "serialize_reduction" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("serialize_reduction", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('softmax', 'argmax', 'loss')))
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    naive = golden(case, "after")
    assert transform.forward_sites(naive) == [Anchor("kernel", "function", "row")]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(naive) == []


PLAN_TEXT = """
name = "t"
problem = "t"
[[launch]]
entry = "kernel"
grid = ["cdiv(rows, 128)"]
block = [128]
args = ["x", "y", { scalar = "rows", type = "i32" }, { scalar = "n", type = "i32" }]
"""
PLAN = LaunchPlan.from_toml(PLAN_TEXT)

HEAD = "__global__ void kernel(const float* x, float* y, int rows, int n) {\n" \
       "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n"


ARG = "    float b = x[row * n];\n    long long a = 0;\n    for (int j = 1; j < n; ++j) {{ if ({cmp}) {{ {then} }} }}\n"


@pytest.mark.parametrize("body, why", [
    # a sum from another start is read as one from zero with the start added after its loop (_sum_starts), only
    # where nothing stands between the start and the loop: each lane would count it
    ("    float s = 1.0f;\n    y[row] = s;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n    y[row] = s;\n",
     "zero"),
    ("    float s = 0.0f;\n    s += 1.0f;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n    y[row] = s;\n",
     "before its loop"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { s += x[row * n + j]; y[row] = s; }\n", "index"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j] = y[row * n + j + 1] * 2.0f;\n", "other lanes may write"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j] = 1.0f;\n    y[row * n] *= 2.0f;\n", "both stored"),
    # a loop from another column: its lanes hold other elements
    ("    for (int j = 0; j < n; ++j) y[row * n + j] = 1.0f;\n"
     "    for (int j = 1; j < n; ++j) y[row * n + j] *= 2.0f;\n", "other lanes may write"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j]++;\n", "no store or reduction"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) s = s * 0.5f + x[row * n + j];\n", "reduction"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) s = s + s * x[row * n + j];\n", "not a reduction"),
    # the larger value where the compare fails: a NaN would be taken, which max never takes
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) s = s > x[row * n + j] ? s : x[row * n + j];\n",
     "not a reduction"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { s += x[row * n + j]; s = fmaxf(s, x[j]); }\n",
     "combined two ways"),
    # a sum may start past column 0 (every lane from zero), a running sum may not (its lanes would miss the first)
    ("    float s = 0.0f;\n    for (int j = 1; j < n; ++j) { s += x[row * n + j]; y[row * n + j] = s; }\n",
     "unit-step"),
    # a chunk's loop starts at a local the same in every lane: one the kernel assigns is not
    ("    int first = 0;\n    first += 1;\n    float s = 0.0f;\n"
     "    for (int j = first; j < n; ++j) s += x[row * n + j];\n    y[row] = s;\n",
     "neither a scalar parameter nor one local, never assigned"),
    # a nest, read as one loop over its pairs (`_nests.py`), whose store the pairs of one j would all make
    ("    for (int j = 0; j < n; ++j) for (int k = 0; k < n; ++k) y[row * n + j] = x[k];\n", "one to one"),
    ("    for (int j = 0; j < n; ++j) for (int k = j; k < n; ++k) y[row * n + j] = x[k];\n", "no store or reduction"),
    ("    __shared__ float t[32];\n    for (int j = 0; j < n; ++j) y[row * n + j] = x[j];\n", "shares memory"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j] = x[row * n + j] + threadIdx.x;\n", "threadIdx"),
    # the grid grows along x: a block's index there is the row's alone
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n    y[row] = s + blockIdx.x;\n",
     "blockIdx.x beyond its row index"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j] = foo(x[j]);\n", "calls foo"),
    ("    for (int j = 0; j < n; ++j) atomicAdd(y + row, x[row * n + j]);\n", "shares memory"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { s += x[row * n + j]; y[row * n] = s; }\n",
     "loop index does not say"),
    # stores two lanes could make to one element at once, where the serial loop's last write wins
    ("    for (int j = 0; j < n; ++j) y[row * n + j / 2] = x[row * n + j];\n", "one to one"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j % 4] = x[row * n + j];\n", "one to one"),
    ("    for (int j = 0; j < n; ++j) y[row * n + (j & 1)] = x[row * n + j];\n", "one to one"),
    # a stride that may be 0 (a local, no parameter the loop's bound or the row's guard shows nonzero)
    ("    int m = n - 1;\n    for (int j = 0; j < n; ++j) y[row * n + j * m] = x[row * n + j];\n", "one to one"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j - j] = x[row * n + j];\n", "one to one"),
    ("    for (int j = 0; j < n; ++j) y[(row + j) * (j + 1)] = x[row * n + j];\n", "one to one"),
    ("    for (int j = 0; j < n; ++j) y[(row * n + j) * 0] = x[row * n + j];\n", "one to one"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { s += x[row * n + j]; y[row * n + j / 2] = s; }\n",
     "loop index does not say one to one"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { s += x[row * n + j] * s; y[row * n + j] = s; }\n",
     "not a reduction"),
    # arg reductions: a compare, the value and the loop index taken together, nothing else; the last of equal
    # values (`>=`) from an index below every column
    (ARG.replace("a = 0;", "a = 1;").format(cmp="x[row * n + j] >= b", then="b = x[row * n + j]; a = j;"),
     "keeps the last of equal values"),
    (ARG.format(cmp="x[row * n + j] > b", then="b = x[row * n + j]; a = j + 1;"), "no arg reduction"),
    (ARG.format(cmp="x[row * n + j] > b", then="b = x[row * n + j] + 1.0f; a = j;"), "no arg reduction"),
    (ARG.format(cmp="x[row * n + j] + a > b", then="b = x[row * n + j] + a; a = j;"), "no arg reduction"),
    (ARG.format(cmp="x[row * n + j] > b", then="b = x[row * n + j]; a = j; y[row] = b;"), "no arg reduction"),
    (ARG.format(cmp="x[row * n + j] > b", then="b = x[row * n + j]; a = j; } else { a = 0;"),
     "no arg reduction"),
    ("    long long a = 0;\n    a += 1;\n" + ARG.format(cmp="x[row * n + j] > b", then="b = x[row * n + j]; a = j;")
     .replace("    long long a = 0;\n", "", 1), "before its loop"),
    (ARG.format(cmp="x[row * n + j] > b", then="b = x[row * n + j]; a = j;").replace("long long a", "short a"),
     "shuffle type"),
    ("    int pair_value = 0;\n" + ARG.format(cmp="x[row * n + j] > b", then="b = x[row * n + j]; a = j;"),
     "pair_"),
    # an assignment's value inside an expression in a row loop is the serial running value, which no lane holds
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { float v = (s += x[row * n + j]); y[row * n + j] = v; }\n",
     "'s' is assigned inside a larger expression"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) y[row * n + j] = s++;\n", "assigned inside a larger"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) y[row * n + j] = x[row * n + j] * (s = x[row * n + j]);\n"
     "    y[row] = s;\n", "assigned inside a larger"),
    # ... or read through its address or a reference
    ("    float s = 0.0f;\n    float* p = &s;\n"
     "    for (int j = 0; j < n; ++j) { s += x[row * n + j]; y[row * n + j] = *p; }\n", "address of accumulator 's'"),
    ("    float s = 0.0f;\n    float& r = s;\n"
     "    for (int j = 0; j < n; ++j) { s += x[row * n + j]; y[row * n + j] = r; }\n", "bound to a reference"),
    # a scan through a temporary of another type rounds each step otherwise: the sum is then read beyond its update
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) {\n        double v = x[row * n + j];\n        s += v;\n"
     "        y[row * n + j] = s;\n    }\n", "read inside its loop"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) {\n        float v = x[row * n + j];\n        s += v;\n"
     "        y[row * n + j] = s + v;\n    }\n", "read inside its loop"),
    # a sum declared without a value and set first inside an `if`, or read before it is set
    ("    float s;\n    if (n > 0) s = 0.0f;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n    y[row] = s;\n",
     "'s' is declared without a value and first named other than by an assignment"),
    ("    float s;\n    y[row] = s;\n    s = 0.0f;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n",
     "declared without a value"),
    ("    float s;\n    s = 0.0f;\n    s = 1.0f;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n"
     "    y[row] = s;\n", "before its loop"),
    # the row's own name assigned in the loop before the column declares one of that name: no column temporary
    ("    float s = 0.0f;\n    float t = 0.0f;\n    for (int j = 0; j < n; ++j) {\n        t = x[row * n + j];\n"
     "        float t = 2.0f;\n        s += t;\n    }\n    y[row] = s + t;\n", "not a reduction: `t = "),
    # a loop index declared before its loop and read after it: each lane would hold its own last index
    ("    int j;\n    float s = 0.0f;\n    for (j = 0; j < n; ++j) s += x[row * n + j];\n    y[row] = s + j;\n",
     "the index 'j' of `for .j = 0; j < n; ..j.` is declared outside the loop and named outside the loops"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "row"))


WINDOW = "    float s = 0.0f;\n    for (int k = {start}; k < {bound}; ++k) s += x[row * n + k];\n    y[row] = s;\n}}\n"


@pytest.mark.parametrize("start, bound, steps", [("0", "9", 9), ("1", "TAPS", 4), ("0", "(long long)3 * 3", 9)])
def test_no_site_where_every_loop_is_shorter_than_a_warp_by_its_source(transform, start, bound, steps):
    """A pooling window or a stencil's taps, fixed in the source: 32 lanes would share fewer elements than lanes
    (a nest read as one loop is the product of its bounds)."""
    state = KernelState(source="constexpr int TAPS = 5;\n" + HEAD + WINDOW.format(start=start, bound=bound), plan=PLAN)
    with refusals() as why:
        assert transform.forward_sites(state) == []
    assert f"at most {steps} step(s), fixed in its source: the 32 lanes" in why[0]
    block = get("serialize_block_reduction")  # 256 lanes: a fixed 64 steps is short for a block, not for a warp
    long = KernelState(source=HEAD + WINDOW.format(start="0", bound="64"), plan=PLAN)
    assert transform.forward_sites(long) and not block.forward_sites(long)


@pytest.mark.parametrize("update, combine", [
    ("s = s + x[row * n + j];", "s += __shfl_xor_sync(0xffffffffu, s, offset)"),
    ("s = x[row * n + j] + s;", "s += __shfl_xor_sync(0xffffffffu, s, offset)"),
    ("s -= x[row * n + j];", "s += __shfl_xor_sync(0xffffffffu, s, offset)"),  # each lane's partial is minus a sum
    ("s = fmaf(x[row * n + j], x[row * n + j], s);", "s += __shfl_xor_sync(0xffffffffu, s, offset)"),
    ("s = fmaxf(x[row * n + j], s);", "s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, offset))"),
    ("s = min(s, x[row * n + j]);", "s = min(s, __shfl_xor_sync(0xffffffffu, s, offset))"),
    ("if (x[row * n + j] > s) s = x[row * n + j];", "s = max(s, __shfl_xor_sync(0xffffffffu, s, offset))"),
    ("s = s < x[row * n + j] ? x[row * n + j] : s;", "s = max(s, __shfl_xor_sync(0xffffffffu, s, offset))"),
])
def test_a_reduction_spelled_any_common_way_is_combined_by_its_operation(transform, update, combine):
    start = "0.0f" if "+" in combine else "x[row * n]"
    state = KernelState(source=HEAD + f"    float s = {start};\n    for (int j = 0; j < n; ++j) {update}\n"
                                      "    y[row] = s;\n}\n", plan=PLAN)
    assert transform.forward_sites(state) == [Anchor("kernel", "function", "row")]
    assert f"for (int offset = 16; offset > 0; offset /= 2) {combine};" in \
        transform.forward(state, Anchor("kernel", "function", "row")).state.source


# a product over a sum is expanded: `(row * n + j) * 2` names j times 2
@pytest.mark.parametrize("store", ["y[row * n + n - 1 - j]", "y[2 * j + row * n]", "y[row * n + (j * 2)]",
                                   "y[(row * n + j) * 1]", "y[((row * n) / 2 + j) * 2]"])
def test_a_store_that_moves_one_to_one_with_the_loop_index_is_a_site(transform, store):
    state = KernelState(source=HEAD + f"    for (int j = 0; j < n; ++j) {store} = x[row * n + j];\n}}\n", plan=PLAN)
    assert transform.forward_sites(state) == [Anchor("kernel", "function", "row")]


def test_a_row_loop_keeps_its_index_type_both_ways(transform):
    naive = KernelState(source=HEAD + "    float s = 0.0f;\n    for (size_t j = 0; j < n; j++) s += x[row * n + j];\n"
                                      "    y[row] = s;\n}\n", plan=PLAN)
    warp = transform.forward(naive, Anchor("kernel", "function", "row")).state
    assert "for (size_t j = lane; j < n; j += 32)" in warp.source
    assert "for (size_t j = 0; j < n; ++j)" in transform.backward(warp, transform.find(warp)[0]).state.source


WIDE_ROWS = ["size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;",
             "int64_t row = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;",
             "const long long row = threadIdx.x + (long long)blockIdx.x * blockDim.x;"]


@pytest.mark.parametrize("declared", sampled(WIDE_ROWS, keep=WIDE_ROWS[:1]))
def test_a_64_bit_row_index_stays_64_bit_both_ways(transform, cache, declared):
    head = HEAD.replace("int row = blockIdx.x * blockDim.x + threadIdx.x;", declared)
    naive = KernelState(source="#include <cstdint>\n" + head + "    float s = 0.0f;\n"
                               "    for (int j = 0; j < n; ++j) s += x[row * n + j];\n    y[row] = s;\n}\n", plan=PLAN)
    (site,) = transform.forward_sites(naive)
    warp = transform.forward(naive, site).state
    assert "long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;" in warp.source
    assert "long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;" in \
        transform.backward(warp, transform.find(warp)[0]).state.source
    compiles_without_spills(warp, cache)


HELPER_ROW = ("__device__ __forceinline__ float sq(float v) { return v * v; }\n" + HEAD +
              "    const float* in = x + row * n;\n    float* out = y + row * n;\n    float s = 0.0f;\n"
              "    for (int j = 0; j < n; ++j) s += sq(in[j]);\n"
              "    for (int j = 0; j < n; ++j) out[j] = in[j] * rsqrtf(s / n + 1e-6f);\n}\n")


def test_a_pure_helper_and_a_pointer_to_the_output_row_are_read_through(transform):
    state = KernelState(source=HELPER_ROW, plan=PLAN)
    assert transform.forward_sites(state) == [Anchor("kernel", "function", "row")]
    warp = transform.forward(state, Anchor("kernel", "function", "row")).state.source
    assert "for (int j = lane; j < n; j += 32) s += sq(in[j]);" in warp
    assert "for (int j = lane; j < n; j += 32) out[j] = in[j]" in warp


READ_BACK = HEAD.replace("float* y", "float* __restrict__ y").replace("const float* x",
                                                                     "const float* __restrict__ x") + \
    "    const float* in = x + row * n;\n    float* out = y + row * n;\n    float m = -INFINITY;\n" \
    "    for (int j = 0; j < n; ++j) if (in[j] > m) m = in[j];\n    float sum = 0.f;\n" \
    "    for (int j = 0; j < n; ++j) { float e = expf(in[j] - m); out[j] = e; sum += e; }\n" \
    "    const float inv = 1.f / sum;\n    for (int j = 0; j < n; ++j) out[j] *= inv;\n}\n"


def test_a_lane_reads_back_the_elements_it_wrote(transform, tmp_path):
    """Softmax written as exponentials stored, then rescaled in place: each lane rescales the columns it stored
    (the same loop index, the same start), so the warp form computes the serial one's rows."""
    naive = KernelState(source="#include <cmath>\n" + READ_BACK, plan=PLAN)
    (site,) = transform.forward_sites(naive)
    warp = transform.forward(naive, site).state
    assert "for (int j = lane; j < n; j += 32) out[j] *= inv;" in warp.source
    results = {}
    for form, (binary, state) in emulate.builds(tmp_path, {"naive": naive, "warp": warp}).items():
        for n in (1, 33, 70):
            x = torch.randn(5, n, generator=torch.Generator().manual_seed(n))
            results[form, n] = emulate.run(binary, tmp_path / f"{form}-{n}", state, {"rows": 5, "n": n},
                                           {"x": x.flatten()}, {"y": (torch.float32, 5 * n)})["y"]
    for n in (1, 33, 70):
        torch.testing.assert_close(results["warp", n], results["naive", n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("old, new", [
    ("out[j] = in[j]", "out[j] = out[j + 1] + in[j]"),  # the output row read back at a neighbour's element
    ("    float s = 0.0f;\n", "    float s = y[row * n];\n"),  # ... or through the array it points into
    ("    float* out = y + row * n;\n", "    float* out = y + row * n;\n    float* last = out + n - 1;\n"
                                       "    float t = last[0];\n"),  # ... or through a pointer into that pointer
    ("{ return v * v; }", "{ return v * v * threadIdx.x; }"),  # a helper that reads a thread coordinate
])
def test_no_site_where_the_row_is_read_back_or_a_helper_has_an_effect(transform, old, new):
    state = KernelState(source=HELPER_ROW.replace(old, new), plan=PLAN)
    assert HELPER_ROW.replace(old, new) != HELPER_ROW
    assert transform.forward_sites(state) == []


def test_an_accumulator_updated_after_its_loop_is_combined_first(transform, cache):
    """`mean /= n` after the loop: the butterfly right after the loop leaves every lane the row's sum, so the
    update and everything after it are the same in all 32 lanes."""
    body = ("    float mean = 0.0f;\n    for (int j = 0; j < n; ++j) mean += x[row * n + j];\n    mean /= n;\n"
            "    float squares = 0.0f;\n    for (int j = 0; j < n; ++j) {\n        float d = x[row * n + j] - mean;\n"
            "        squares += d * d;\n    }\n    y[row] = squares / n;\n")
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == [Anchor("kernel", "function", "row")]
    warp = transform.forward(state, Anchor("kernel", "function", "row")).state
    butterfly = "for (int offset = 16; offset > 0; offset /= 2) mean += __shfl_xor_sync(0xffffffffu, mean, offset);"
    assert warp.source.index(butterfly) < warp.source.index("mean /= n;")
    compiles_without_spills(warp, cache)


def test_no_site_when_a_warp_would_straddle_rows(transform):
    naive = golden("softmax", "after")
    plan = LaunchPlan.from_toml(PLAN_TEXT.replace("[128]", "[100]"))
    assert transform.forward_sites(KernelState(source=naive.source, plan=plan)) == []
    with pytest.raises(NotApplicable, match="no multiple of 32"):
        transform.forward(KernelState(source=naive.source, plan=plan), Anchor("kernel", "function", "row"))


def test_the_tail_of_a_row_is_the_loops_own_bound(transform):
    """n = 33: lane 0 takes columns 0 and 32, lanes 1..31 one column each: the strided loop keeps `j < n`."""
    rewritten = transform.forward(golden("softmax", "after"), Anchor("kernel", "function", "row")).state
    assert "for (int j = lane; j < n; j += 32)" in rewritten.source
    assert rewritten.plan.launches[0].grid[0] == "(cdiv(rows, 128)) * 32"


# --- an arg reduction, on the CPU: the warp's (value, index) is the naive loop's, bit for bit --------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


ARG_OUTPUTS = {"argmax": {"peak": torch.float32, "where": torch.int64}, "argmin": {"low_at": torch.int32}}


def _runs(forms: dict[str, KernelState], case: str, tmp_path) -> dict[str, dict[int, dict[str, torch.Tensor]]]:
    """form -> n -> output -> tensor, each form run on the same hard rows for n columns (one, a few, past a
    warp, no multiple of 32)."""
    runs = {}
    for form, (binary, state) in emulate.builds(tmp_path, forms).items():
        runs[form] = {}
        for n in (1, 5, 33, 70):
            x = hard_rows(n, torch.Generator().manual_seed(n))
            rows = x.shape[0]
            inputs = {"x": x.flatten(), **({"w": torch.ones(n)} if case == "argmax" else {})}  # x * 1 is x
            outputs = {"peak": (torch.float32, rows), "where": (torch.int64, rows)} if case == "argmax" else \
                {"low_at": (torch.int32, rows), "total": (torch.float32, rows)}
            runs[form][n] = emulate.run(binary, tmp_path / f"{form}-{n}", state, {"rows": rows, "n": n},
                                        inputs, outputs)
    return runs


@pytest.mark.parametrize("case", sampled(["argmax", "argmin"], keep=["argmax"]))
def test_the_warp_arg_reduction_gives_the_naive_loops_bits(case, tmp_path):
    runs = _runs({"naive": golden(case, "after"), "warp": golden(case, "before")}, case, tmp_path)
    for n, naive in runs["naive"].items():
        for out in ARG_OUTPUTS[case]:
            assert torch.equal(_bits(runs["warp"][n][out]), _bits(naive[out])), (case, n, out)
    naive = runs["naive"][70]
    if case == "argmax":  # the rows say what they test: a NaN start stays, ties go to the first column
        assert torch.isnan(naive["peak"][3]) and naive["where"][3] == 0 and naive["where"][8] == 0
        assert naive["where"][1] == int(torch.argmax((hard_rows(70, torch.Generator().manual_seed(70))[1] == 2)
                                                     .int()))
        assert naive["where"][9] == 69 and torch.signbit(naive["peak"][7]) == torch.signbit(
            hard_rows(70, torch.Generator().manual_seed(70))[7][0])


def test_an_index_kept_as_int64_t_is_shuffled_as_the_64_bit_integer_it_is(transform, tmp_path):
    """torch keeps an argmax's index in int64: `int64_t top_at` (long on the hosts nvcc targets, which
    __shfl_xor_sync carries) gives the same warp form and the naive loop's bits."""
    naive = golden("argmax", "after")
    spelled = KernelState(source=naive.source.replace("long long top_at = 0;", "int64_t top_at = 0;"), plan=naive.plan)
    assert spelled.source != naive.source
    (site,) = transform.forward_sites(spelled)
    warp = transform.forward(spelled, site).state
    assert "const int64_t pair_index = __shfl_xor_sync(0xffffffffu, top_at, offset);" in warp.source
    runs = _runs({"naive": spelled, "warp": warp}, "argmax", tmp_path)
    for n, serial in runs["naive"].items():
        for out in ARG_OUTPUTS["argmax"]:
            assert torch.equal(_bits(runs["warp"][n][out]), _bits(serial[out])), (n, out)


LAST = golden("argmax", "after").source.replace("if (v > top) {", "if (v >= top) {")  # the last of equal values


def test_an_arg_reduction_that_keeps_the_last_of_equal_values_gives_the_naive_bits(transform, tmp_path):
    """`>=` takes a column equal to the best so far: the pairs join to the larger index on equal values, and on the
    hard rows (ties, NaNs, signed zeros) the warp's pair is the loop's, bit for bit; a join that keeps the first is
    caught."""
    naive = KernelState(source=LAST, plan=golden("argmax", "after").plan)
    (site,) = transform.forward_sites(naive)
    warp = transform.forward(naive, site).state
    assert "if (pair_value > top || (pair_value == top && pair_index > top_at)) {" in warp.source
    first = KernelState(source=warp.source.replace("pair_index > top_at", "pair_index < top_at"), plan=warp.plan)
    runs = _runs({"naive": naive, "warp": warp, "first": first}, "argmax", tmp_path)
    for n, serial in runs["naive"].items():
        for out in ARG_OUTPUTS["argmax"]:
            assert torch.equal(_bits(runs["warp"][n][out]), _bits(serial[out])), (n, out)
    assert runs["naive"][70]["where"][2] > runs["naive"][70]["where"][1] - 70  # the rows hold ties: a real test
    assert any(not torch.equal(runs["first"][n]["where"], runs["naive"][n]["where"]) for n in runs["naive"])


@pytest.mark.parametrize("start, loop_from, site", [
    ("float top = -INFINITY;\n    long long top_at = -1;", 0, True),  # below every column
    ("float top = -INFINITY;\n    long long top_at = 0;", 0, True),  # the first column's, from an infinity
    ("float top = 0.0f;\n    long long top_at = 0;", 0, False),  # a zero start could tie a -0.0 in column 0
    ("float top = in[0] * w[0];\n    long long top_at = n;", 1, False),  # past every column
])
def test_the_last_of_equal_values_needs_a_start_index_below_the_columns(transform, start, loop_from, site):
    naive = golden("argmax", "after")
    source = LAST.replace("float top = in[0] * w[0];\n    long long top_at = 0;", start).replace(
        "for (int j = 1;", f"for (int j = {loop_from};")
    assert start in source
    with refusals() as seen:
        found = transform.forward_sites(KernelState(source=source, plan=naive.plan))
    assert bool(found) == site, seen
    assert site or any("keeps the last of equal values" in reason for reason in seen), seen


TIE_MUTANTS = [("pair_index < top_at", "pair_index > top_at"), (" || (pair_value == top && pair_index < top_at)", "")]


# both break a tie the other way (the last column of the tie, or whichever lane's came): one catches the mechanism
@pytest.mark.parametrize("mutant", sampled(TIE_MUTANTS, keep=TIE_MUTANTS[1:]))
def test_a_combine_that_breaks_ties_otherwise_is_caught(mutant, tmp_path):
    warp = golden("argmax", "before")
    assert mutant[0] in warp.source
    broken = KernelState(source=warp.source.replace(mutant[0], mutant[1]), plan=warp.plan)
    runs = _runs({"naive": golden("argmax", "after"), "mutant": broken}, "argmax", tmp_path)
    assert any(not torch.equal(runs["mutant"][n]["where"], runs["naive"][n]["where"]) for n in runs["naive"])


KEPT = """__global__ void kernel(const float* x, float* y, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float hi = -INFINITY, lo = INFINITY, mid = -INFINITY;
    for (int j = 0; j < n; ++j) {
        float v = x[row * n + j];
        if (v > hi) hi = v;
        if (lo > v) { lo = v; }
        mid = v > mid ? v : mid;
    }
    y[3 * row] = hi;
    y[3 * row + 1] = lo;
    y[3 * row + 2] = mid;
}
"""


def test_a_kept_extreme_gives_the_naive_loops_values_with_nans_and_infinities(transform, tmp_path):
    """`if (v > hi) hi = v;` (and `mid = v > mid ? v : mid`) keeps the largest value and never takes a NaN; the warp
    combines lanes by max and min, which never take one either: the naive values on every hard row (signed zeros
    compare equal)."""
    naive = KernelState(source=KEPT, plan=PLAN)
    warp = transform.forward(naive, Anchor("kernel", "function", "row")).state
    assert "hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, offset));" in warp.source
    assert "lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, offset));" in warp.source
    assert "mid = max(mid, __shfl_xor_sync(0xffffffffu, mid, offset));" in warp.source
    binaries = emulate.builds(tmp_path, {"naive": naive, "warp": warp})
    for n in (1, 5, 33, 70):
        x = hard_rows(n, torch.Generator().manual_seed(n))
        runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}", state, {"rows": x.shape[0], "n": n},
                                  {"x": x.flatten()}, {"y": (torch.float32, 3 * x.shape[0])})["y"]
                for form, (binary, state) in binaries.items()}
        torch.testing.assert_close(runs["warp"], runs["naive"], rtol=0, atol=0, equal_nan=True, msg=f"n={n}")


def test_a_half_precision_row_is_read_through_its_conversions(transform, cache):
    """A row of __half summed in float: the conversions are pure calls, the float sum is shuffled."""
    source = ("#include <cuda_fp16.h>\n" + HEAD.replace("const float* x", "const __half* x") +
              "    float s = 0.0f;\n    for (int j = 0; j < n; ++j) {\n"
              "        float v = __half2float(x[row * n + j]);\n        s += v * v;\n    }\n"
              "    y[row] = rsqrtf(s / n + 1e-6f);\n}\n")
    state = KernelState(source=source, plan=PLAN)
    assert transform.forward_sites(state) == [Anchor("kernel", "function", "row")]
    compiles_without_spills(transform.forward(state, Anchor("kernel", "function", "row")).state, cache)


def test_a_row_quantized_through_rounding_conversions_gets_a_warp_and_the_naive_bits(transform, tmp_path):
    """int8 quantization of each row by its largest magnitude: a kept extreme, then a store per element through
    `__float2int_rn` (a conversion rounded as named, a value of its argument alone); on the CPU the warp form's
    scales and codes are the naive kernel's bits."""
    source = ("__global__ void kernel(const float* x, float* y, int* q, int rows, int n) {\n"
              "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n"
              "    float m = 0.0f;\n    for (int j = 0; j < n; ++j) m = fmaxf(m, fabsf(x[row * n + j]));\n"
              "    const float scale = m > 0.0f ? m / 127.0f : 1.0f;\n    y[row] = scale;\n"
              "    for (int j = 0; j < n; ++j) q[row * n + j] = __float2int_rn(x[row * n + j] / scale);\n}\n")
    state = KernelState(source=source, plan=LaunchPlan.from_toml(PLAN_TEXT.replace('"x", "y",', '"x", "y", "q",')))
    (site,) = transform.forward_sites(state)
    warp = transform.forward(state, site).state

    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict]:
        x = torch.randn(rows * n, generator=torch.Generator().manual_seed(rows * n)) * 4
        return {"rows": rows, "n": n}, {"x": x}, {"y": (torch.float32, rows), "q": (torch.int32, rows * n)}

    assert emulate.differences(tmp_path, state, {"warp": warp}, ((3, 5), (40, 70)), inputs_of) == []


def test_a_residual_added_in_place_to_an_array_named_x_gets_a_warp_and_the_naive_bits(transform, tmp_path):
    """`x[...] += res[...]` then a norm of the sum, the buffer named `x`: the `x` of `threadIdx.x` is no use of the
    array, so the row is read back by the lane that stored it, and the warp form's sums and outputs are the naive
    kernel's bits (whole numbers, so that the sum's order does not show)."""
    source = ("__global__ void kernel(float* x, const float* res, float* y, int rows, int n) {\n"
              "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n"
              "    float s = 0.0f;\n"
              "    for (int j = 0; j < n; ++j) { x[row * n + j] += res[row * n + j]; s += x[row * n + j]; }\n"
              "    const float mean = s / n;\n"
              "    for (int j = 0; j < n; ++j) y[row * n + j] = x[row * n + j] - mean;\n}\n")
    state = KernelState(source=source, plan=LaunchPlan.from_toml(PLAN_TEXT.replace('"x", "y",', '"x", "res", "y",')))
    (site,) = transform.forward_sites(state)
    warp = transform.forward(state, site).state

    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict, dict]:
        g = torch.Generator().manual_seed(rows * n)  # whole numbers: every order of the sums is exact
        x, res = (torch.randint(-8, 9, (rows * n,), generator=g).float() for _ in range(2))
        return ({"rows": rows, "n": n}, {"res": res}, {"x": (torch.float32, rows * n), "y": (torch.float32, rows * n)},
                {"x": x})

    assert emulate.differences(tmp_path, state, {"warp": warp}, ((3, 5), (40, 70)), inputs_of) == []


def test_a_loop_from_a_scalar_parameter_gets_a_warp_and_the_naive_bits(transform, tmp_path):
    """A sum over the columns from `first` on (a scalar parameter, the same for every lane): each lane starts at
    `first + lane`; on integer values the warp form's sums are the naive loop's bits, `first` past the row's end too."""
    source = ("__global__ void kernel(const float* x, float* y, int rows, int n, int first) {\n"
              "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n"
              "    float s = 0.0f;\n    for (int j = first; j < n; ++j) s += x[row * n + j];\n    y[row] = s;\n}\n")
    n_arg = '{ scalar = "n", type = "i32" }'
    plan = LaunchPlan.from_toml(PLAN_TEXT.replace(f"{n_arg}]", f'{n_arg}, {{ scalar = "first", type = "i32" }}]'))
    state = KernelState(source=source, plan=plan)
    (site,) = transform.forward_sites(state)
    warp = transform.forward(state, site).state
    assert "for (int j = first + lane; j < n; j += 32)" in warp.source

    def inputs_of(rows: int, n: int, first: int) -> tuple[dict, dict, dict]:
        x = torch.randint(-8, 9, (rows * n,), generator=torch.Generator().manual_seed(rows * n)).float()
        return {"rows": rows, "n": n, "first": first}, {"x": x}, {"y": (torch.float32, rows)}

    assert emulate.differences(tmp_path, state, {"warp": warp}, ((3, 5, 2), (40, 70, 33), (5, 9, 12)),
                               inputs_of) == []


# (where row's elements start, the stride): the loop's bound, or the count the row's guard compares against
@pytest.mark.parametrize("start, stride", [("row * n * n", "n"), ("row", "rows")])
def test_a_store_strided_by_a_count_that_cannot_be_zero_where_the_loop_runs_is_one_to_one(transform, tmp_path,
                                                                                          start, stride):
    """`y[start + j * stride]`: distinct steps name distinct elements when the stride is not zero, which holds where
    the loop runs if the stride bounds the loop (`j < n`) or the guard the row passed (`row < rows`). On integer
    values the warp form stores the naive kernel's bits."""
    source = HEAD + f"    for (int j = 0; j < n; ++j) y[{start} + j * {stride}] = 2.0f * x[row * n + j];\n}}\n"
    state = KernelState(source=source, plan=PLAN)
    (site,) = transform.forward_sites(state)
    warp = transform.forward(state, site).state

    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict]:
        x = torch.randint(-8, 9, (rows * n,), generator=torch.Generator().manual_seed(rows * n)).float()
        return {"rows": rows, "n": n}, {"x": x}, {"y": (torch.float32, rows * n * n)}

    assert emulate.differences(tmp_path, state, {"warp": warp}, ((3, 5), (40, 33)), inputs_of) == []


def test_a_guard_the_loop_is_not_under_shows_no_stride_nonzero(transform):
    """`row < rows` guards a store before the loop, not the loop: where rows is 0 the loop still runs (n > 0), and
    `j * rows` names one element for every step."""
    source = ("__global__ void kernel(const float* x, float* y, int rows, int n) {\n"
              "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "    if (row < rows) {\n        y[row] = 0.0f;\n    }\n"
              "    for (int j = 0; j < n; ++j) y[row + j * rows] = x[j];\n}\n")
    with refusals() as why:
        assert transform.forward_sites(KernelState(source=source, plan=PLAN)) == []
    assert any("does not move one to one" in line for line in why), why


def test_a_row_whose_length_is_a_product_of_names_is_read(transform):
    """`j < c * hw` (a group of channels and their pixels): the lanes stride it as written, and back."""
    plan = LaunchPlan.from_toml(PLAN_TEXT.replace('{ scalar = "n", type = "i32" }',
                                                  '{ scalar = "c", type = "i32" }, { scalar = "hw", type = "i32" }'))
    naive = KernelState(source=HEAD.replace("int n)", "int c, int hw)") +
                        "    float s = 0.0f;\n    for (int j = 0; j < c * hw; ++j) s += x[row * c * hw + j];\n"
                        "    y[row] = s;\n}\n", plan=plan)
    warp = transform.forward(naive, Anchor("kernel", "function", "row")).state
    assert "for (int j = lane; j < c * hw; j += 32)" in warp.source
    assert transform.backward(warp, transform.find(warp)[0]).state.source == naive.source


STRIDED = "__global__ void kernel(const float* x, float* y, int rows, int n) {\n" \
          "    for (int row = blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += blockDim.x * gridDim.x) {\n" \
          "        float s = 0.0f;\n        for (int j = 0; j < n; ++j) s += x[row * n + j];\n" \
          "        y[row] = s;\n    }\n}\n"
STRIDED_PLAN = LaunchPlan.from_toml(PLAN_TEXT.replace('"cdiv(rows, 128)"', '"80"'))


def test_a_grid_stride_loop_over_rows_gets_a_warp_a_row_on_a_grid_that_covers_them(transform):
    """A fixed grid of 80 blocks strides over the rows: read as one thread per row on cdiv(rows, 128) blocks, then a
    warp a row on 32 times as many (tests/transforms/test_flatten.py runs both on the CPU)."""
    naive = KernelState(source=STRIDED, plan=STRIDED_PLAN)
    (site,) = transform.forward_sites(naive)
    warp = transform.forward(naive, site).state
    assert "int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;\n    const int lane = threadIdx.x % 32;\n" \
        "    if (row < rows) {" in warp.source and "gridDim" not in warp.source
    assert warp.plan.launches[0].grid[0] == "(cdiv(rows, 128)) * 32"


@pytest.mark.parametrize("old, new, why", [
    ("        y[row] = s;\n", "        y[row] = s;\n        row += 1;\n", "changes its element index 'row'"),
    ("row += blockDim.x * gridDim.x", "row += 32 * gridDim.x", "is not `row < n; row += blockDim.x * gridDim.x`"),
    ("    }\n}\n", "    }\n    y[0] = 0.0f;\n}\n", "is not one grid-stride loop"),
    ("        y[row] = s;\n", "        if (s < 0.0f) return;\n        y[row] = s;\n", "(`return`)"),
])
def test_no_site_where_a_grid_stride_loop_is_not_one_thread_per_row(transform, old, new, why):
    """The attacks: the row written in the loop, a stride of a warp a block (not the grid), work after the loop, a
    `return` that would end the thread's later rows too. The loop is then left as written, which names gridDim."""
    state = KernelState(source=STRIDED.replace(old, new), plan=STRIDED_PLAN)
    assert state.source != STRIDED
    with refusals() as refused:
        assert transform.forward_sites(state) == []
    assert any(why in line for line in refused), refused
    with pytest.raises(NotApplicable, match="gridDim"):
        transform.forward(state, Anchor("kernel", "function", "row"))


# --- a perfect nest of two loops: one loop over its pairs, which the lanes stride -------------------------------

BN_STATS = """__global__ void bn_stats(const float* __restrict__ x, float* __restrict__ mean, float* __restrict__ var, \
int N, int C, int HW) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f, q = 0.0f;
    for (int n = 0; n < N; ++n)
        for (int k = 0; k < HW; ++k) { float v = x[((long long)n * C + c) * HW + k]; s += v; q += v * v; }
    float m = s / (N * HW);
    mean[c] = m; var[c] = q / (N * HW) - m * m;
}
"""
BN_ARGS = ('"x", "mean", "var", { scalar = "N", type = "i32" }, { scalar = "C", type = "i32" }, '
           '{ scalar = "HW", type = "i32" }')
BN_PLAN = LaunchPlan.from_toml(f'name = "t"\nproblem = "t"\n[[launch]]\nentry = "bn_stats"\ngrid = ["cdiv(C, 128)"]\n'
                               f"block = [128]\nargs = [{BN_ARGS}]\n")


def _written() -> KernelState:
    """The golden nest as written (`bn_stats/written.cu`), on the golden serial plan."""
    return KernelState(source=(HERE / "serialize_reduction" / "bn_stats" / "written.cu").read_text(),
                       plan=golden("bn_stats", "after").plan)


def test_a_perfect_nest_is_read_as_one_loop_over_its_pairs(transform):
    """`for (n < N) for (k < HW)` is read as `for (n_k < (long long)N * HW)` with n and k its quotient and remainder
    (`_nests.py`): the pairs in the nest's order, so the serial kernel's bits, and then one row loop the lanes
    stride. The golden pair is that loop's warp form and its serial form; the written nest forwards to the same."""
    assert transform.forward_sites(KernelState(source=BN_STATS, plan=BN_PLAN)) == [Anchor("bn_stats", "function", "c")]
    check_golden("serialize_reduction", "bn_stats")
    written = _written()
    (site,) = transform.forward_sites(written)
    assert transform.forward(written, site).state == golden("bn_stats", "before")


def test_a_nest_given_a_warp_computes_the_nests_statistics(tmp_path):
    """On the CPU emulator, the warp form of the nest against the nest as written, for counts that are no multiple
    of 32 (one image, one pixel, a channel count past a block): on integer values, whose sums are exact in any
    order, to the bit; on normal values, to rounding."""
    forms = {"naive": _written(), "warp": golden("bn_stats", "before")}
    binaries = emulate.builds(tmp_path, forms)
    for n, c, hw in ((1, 3, 1), (1, 2, 70), (4, 5, 1), (3, 130, 11)):
        g = torch.Generator().manual_seed(n * 1000 + c * 10 + hw)
        for exact, x in ((True, torch.randint(-3, 4, (n, c, hw), generator=g).float()),
                         (False, torch.randn(n, c, hw, generator=g))):
            runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}-{c}-{hw}-{exact}", state,
                                      {"N": n, "C": c, "HW": hw}, {"x": x.flatten()},
                                      {"mean": (torch.float32, c), "var": (torch.float32, c)})
                    for form, (binary, state) in binaries.items()}
            for out in ("mean", "var"):
                if exact:
                    assert torch.equal(runs["warp"][out].view(torch.int32), runs["naive"][out].view(torch.int32))
                else:
                    torch.testing.assert_close(runs["warp"][out], runs["naive"][out], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(runs["naive"]["mean"], x.double().mean(dim=(0, 2)).float(), rtol=1e-5,
                                       atol=1e-6)


BN_APPLY = """__global__ void bn_apply(const float* __restrict__ x, float* __restrict__ y, int N, int C, int HW) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C) {
        float s = 0.0f;
        for (int n = 0; n < N; ++n)
            for (int k = 0; k < HW; ++k) s += x[(n * C + c) * HW + k];
        float m = s / (N * HW);
        for (int n = 0; n < N; ++n)
            for (int k = 0; k < HW; ++k) {
                int idx = (n * C + c) * HW + k;
                y[idx] = x[idx] - m;
            }
    }
}
"""
BN_APPLY_PLAN = LaunchPlan.from_toml(
    'name = "t"\nproblem = "t"\n[[launch]]\nentry = "bn_apply"\ngrid = ["cdiv(C, 128)"]\nblock = [128]\n'
    'args = ["x", "y", { scalar = "N", type = "i32" }, { scalar = "C", type = "i32" }, '
    '{ scalar = "HW", type = "i32" }]\n')


@pytest.mark.parametrize("name", ["serialize_reduction", "serialize_block_reduction"])
def test_a_nest_that_stores_each_pair_once_gets_its_lanes_and_the_naive_bits(name, tmp_path):
    """A batch norm's normalizing nest stores `y[(n * C + c) * HW + k]`: k a term of its own, n's term times HW and
    C (not zero below the guard), so distinct pairs of the nest read as one loop store distinct elements and the
    lanes that stride the pairs never write one element twice. On integer values the lanes' outputs are the
    nest's bits."""
    state = KernelState(source=BN_APPLY, plan=BN_APPLY_PLAN)
    transform = get(name)
    (site,) = transform.forward_sites(state)
    shared = transform.forward(state, site).state

    def inputs_of(n: int, c: int, hw: int) -> tuple[dict, dict, dict]:
        g = torch.Generator().manual_seed(n * 1000 + c * 10 + hw)
        return ({"N": n, "C": c, "HW": hw}, {"x": torch.randint(-4, 5, (n * c * hw,), generator=g).float()},
                {"y": (torch.float32, n * c * hw)})

    assert emulate.differences(tmp_path, state, {"lanes": shared}, ((1, 3, 1), (3, 5, 70), (2, 130, 11)),
                               inputs_of) == []


@pytest.mark.parametrize("store", ["y[(n * C + c) * HW] = x[idx] - m;",  # every k of an n on one element
                                   "y[n * C + c + k] = x[idx] - m;",  # n's term not times HW: pairs overlap
                                   "y[(n * C + c) * HW + 2 * k] = x[idx] - m;",  # k times 2: past its image
                                   "y[(n * c + C) * HW + k] = x[idx] - m;"])  # n times c, zero in channel 0
def test_no_site_where_a_nest_might_store_one_element_from_two_pairs(store):
    source = BN_APPLY.replace("y[idx] = x[idx] - m;", store)
    assert source != BN_APPLY
    state = KernelState(source=source, plan=BN_APPLY_PLAN)
    for name in ("serialize_reduction", "serialize_block_reduction"):
        with refusals() as refused:
            assert get(name).forward_sites(state) == []
        assert any("one to one" in line for line in refused), refused


@pytest.mark.parametrize("old, new, why", [
    ("int k = 0;", "int k = 1;", "start it at 0"),
    ("int k = 0;", "int k = n;", "start it at 0"),  # a triangular nest
    ("q += v * v;", "q += v * v; HW -= v > 8.0f;", "never assigns"),  # a count the body changes
    ("for (int k", "float w = 1.0f;\n        for (int k", "more than its inner loop"),  # a statement between them
    ("q += v * v;", "q += v * v; if (v != v) break;", "jumps (`break`)"),
])
def test_no_site_where_two_loops_are_no_perfect_nest(transform, old, new, why):
    source = BN_STATS.replace(old, new, 1)
    if "float w" in new:
        source = source.replace("    for (int n = 0; n < N; ++n)\n", "    for (int n = 0; n < N; ++n) {\n").replace(
            "q += v * v; }\n", "q += v * v; }\n    }\n")
    assert source != BN_STATS
    state = KernelState(source=source, plan=BN_PLAN)
    with refusals() as refused:
        assert transform.forward_sites(state) == []
    assert any(line.startswith("bn_stats: ") and why in line for line in refused), refused
    with pytest.raises(NotApplicable):
        transform.forward(state, Anchor("bn_stats", "function", "c"))


LOSS_HEAD = "__global__ void kernel(const float* x, const int* t, float* loss, float* y, int rows, int n) {\n" \
            "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n" \
            "    float s = 0.0f;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n"
LOSS_PLAN = LaunchPlan.from_toml(PLAN_TEXT.replace('args = ["x", "y",', 'args = ["x", "t", "loss", "y",'))


@pytest.mark.parametrize("tail, why", [
    ("    float old = atomicAdd(loss, s);\n    y[row] = old;\n", "atomicAdd"),  # its old value differs by lane
    ("    atomicAdd(loss, s);\n    y[row] = loss[0];\n", "atomicAdd"),  # the loss read back: a lane sees others'
    ("    atomicExch(loss, s);\n", "atomicExch"),
    ("    atomicAdd(loss + t[row], s);\n    atomicAdd(loss, 1.0f);\n", "atomicAdd"),  # one array, two places
    ("    atomicAdd(&y[row], s);\n    y[row] = 0.0f;\n", "atomicAdd"),  # an array the kernel also stores to
])
def test_no_site_where_a_rows_atomic_is_not_made_once_into_an_array_nothing_else_touches(transform, tail, why):
    state = KernelState(source=LOSS_HEAD + tail + "}\n", plan=LOSS_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "row"))


def test_an_atomic_inside_a_row_loop_is_no_site(transform):
    state = KernelState(source=LOSS_HEAD.replace("s += x[row * n + j];", "atomicAdd(loss, x[row * n + j]);")
                        + "    y[row] = s;\n}\n", plan=LOSS_PLAN)
    with refusals() as why:
        assert transform.forward_sites(state) == []
    assert any("atomicAdd" in reason for reason in why)


def test_a_rows_atomics_each_made_by_one_lane_wherever_they_sit_outside_the_loops(transform):
    """Before the loops or after them, into two arrays or at a place the row names: the row's lanes compute the same
    address and value there, so lane 0 makes each; backward gives every thread its atomics again."""
    source = LOSS_HEAD.replace("    float s = 0.0f;\n", "    atomicMax((int*)t + row % 4, n);\n    float s = 0.0f;\n") \
        + "    atomicAdd(&loss[row / 8], s);\n}\n"
    naive = KernelState(source=source, plan=LOSS_PLAN)
    (site,) = transform.forward_sites(naive)
    warp = transform.forward(naive, site).state
    assert "    if (lane == 0) atomicMax((int*)t + row % 4, n);\n" in warp.source
    assert "    if (lane == 0) atomicAdd(&loss[row / 8], s);\n" in warp.source
    (anchor,) = transform.find(warp)
    assert transform.backward(warp, anchor).state.source == source


def _loss_inputs(rows: int, n: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(rows * 100 + n)
    return ({"rows": rows, "n": n}, {"logits": torch.randn(rows * n, generator=g) * 4,
                                      "target": torch.randint(0, n, (rows,), generator=g, dtype=torch.int32)},
            {"loss": (torch.float32, 1)})


def test_the_warp_loss_adds_each_rows_term_once(tmp_path):
    """On the CPU emulator the warp form's mean cross-entropy is the naive one's (the row's exponentials summed in
    another order); without the lane's guard every row's term is added 32 times, which is caught."""
    naive, warp = golden("loss", "after"), golden("loss", "before")
    unguarded = KernelState(source=warp.source.replace("if (lane == 0) ", ""), plan=warp.plan)
    assert unguarded.source != warp.source
    forms = {"naive": naive, "warp": warp, "unguarded": unguarded}
    runs = {}
    for form, (binary, state) in emulate.builds(tmp_path, forms).items():
        for rows, n in ((1, 1), (5, 33), (9, 70)):
            params, inputs, outputs = _loss_inputs(rows, n)
            runs[form, rows] = emulate.run(binary, tmp_path / f"{form}-{rows}", state, params, inputs, outputs,
                                           starting={"loss": torch.zeros(1)})["loss"]
    for rows in (1, 5, 9):
        torch.testing.assert_close(runs["warp", rows], runs["naive", rows], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(runs["unguarded", rows], 32 * runs["naive", rows], rtol=1e-5, atol=1e-5)


ONLINE_MUTANTS = [
    # a pair's own factor of one not taken as it is: a lane that saw no column (rows shorter than the warp) adds NaN
    ("(m == pair_joined ? s : s * expf(m - pair_joined))", "s * expf(m - pair_joined)"),
    ("m = pair_joined;\n", ""),  # the maximum never joined: each lane normalizes by its own
]


@pytest.mark.parametrize("mutant", sampled([None, *ONLINE_MUTANTS], keep=[None, ONLINE_MUTANTS[0]]))
def test_the_one_pass_softmax_given_a_warp_computes_the_naive_rows_and_broken_joins_do_not(mutant, tmp_path):
    """The running maximum and the sum rescaled to it, a warp a row, against the naive loop on the CPU emulator
    (rows shorter than a warp, of one column, past two warps): to rounding, the sum being taken in another order. A
    join that rescales a lane which saw nothing, or never joins the maxima, is caught."""
    close = _rows_close_to_naive(tmp_path, "softmax_online", mutant, scale=4.0, shift=0.0, tolerance=1e-5)
    assert all(close) if mutant is None else not all(close)


def _rows_close_to_naive(tmp_path, case: str, mutant: tuple[str, str] | None, scale: float, shift: float,
                         tolerance: float) -> list[bool]:
    """For rows of 1, 5, 32 and 70 columns (three rows each, normal values scaled and shifted), whether the golden
    warp form of `case` (with `mutant` made) gives the naive golden's rows to `tolerance`."""
    warp = golden(case, "before")
    if mutant is not None:
        assert mutant[0] in warp.source
        warp = KernelState(source=warp.source.replace(*mutant), plan=warp.plan)
    forms = emulate.builds(tmp_path, {"naive": golden(case, "after"), "warp": warp})
    close = []
    for n in (1, 5, 32, 70):
        x = torch.randn(3 * n, generator=torch.Generator().manual_seed(n)) * scale + shift
        runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}", state, {"rows": 3, "n": n}, {"x": x},
                                  {"y": (torch.float32, 3 * n)})["y"] for form, (binary, state) in forms.items()}
        close.append(torch.allclose(runs["warp"], runs["naive"], rtol=tolerance, atol=tolerance))
    return close


WELFORD_MUTANTS = [
    ("if (pair_total > 0) {", "if (true) {"),  # two lanes that saw nothing divide zero by zero
    (" + pair_delta * pair_delta * ((float)count * (float)pair_count / (float)pair_total)", ""),  # means apart lost
]


@pytest.mark.parametrize("mutant", sampled([None, *WELFORD_MUTANTS], keep=[None, WELFORD_MUTANTS[1]]))
def test_welfords_triple_given_a_warp_normalizes_the_naive_rows_and_broken_joins_do_not(mutant, tmp_path):
    """The count, mean and M2 joined by Chan's pairwise update, a warp a row, against the naive loop on the CPU
    emulator (rows shorter than a warp, of one column, past two warps): to rounding. A join that divides by the
    count of two empty lanes, or forgets the spread between the lanes' means, is caught."""
    close = _rows_close_to_naive(tmp_path, "welford", mutant, scale=3.0, shift=1.0, tolerance=1e-4)
    assert all(close) if mutant is None else not all(close)


def test_a_welford_mean_counted_by_the_loop_index_is_counted_by_a_local(transform):
    """`mean += d / (float)(j + 1)` in a loop from 0 by ones: the same bits as the golden's counter (j + 1 is the
    count wherever the index is), so its warp form is the golden's."""
    counted = golden("welford", "after")
    by_index = counted.source.replace("    int count = 0;\n", "").replace("        ++count;\n", "").replace(
        "mean += d / count;", "mean += d / (float)(j + 1);")
    (site,) = transform.forward_sites(KernelState(source=by_index, plan=counted.plan))
    warp = transform.forward(KernelState(source=by_index, plan=counted.plan), site).state
    assert warp.source == re.sub(r"\bcount\b", "mean_count", golden("welford", "before").source)


SCANS = {"cumsum": torch.float32, "cumprod": torch.float32, "cumsum_exclusive": torch.int32,
         "cumsum_reverse": torch.float32, "cummax": torch.float32}


def _scan_rows(case: str, rows: int, n: int) -> torch.Tensor:
    """Values whose sums and products are exact in any order: small integers, or +-1, +-2 and +-0.5 for products
    (powers of two, never past float32's range in 70 columns); for a running maximum, negative ones (a lane past the
    row's end that contributed zero, not NaN, would show in the row's maximum)."""
    g = torch.Generator().manual_seed(rows * 100 + n)
    if case == "cumprod":
        choices = torch.tensor([1.0, -1.0, 2.0, -2.0, 0.5, -0.5])
        return choices[torch.randint(0, 6, (rows * n,), generator=g)]
    return torch.randint(-9, 0 if case == "cummax" else 10, (rows * n,), generator=g).to(SCANS[case])


def _scanned(tmp_path, case: str, forms: dict[str, KernelState]) -> dict:
    runs = {}
    for form, (binary, state) in emulate.builds(tmp_path, forms).items():
        for n in (1, 31, 32, 70):
            kind = SCANS[case]
            runs[form, n] = emulate.run(binary, tmp_path / f"{form}-{n}", state, {"rows": 3, "n": n},
                                        {"x": _scan_rows(case, 3, n)}, {"y": (kind, 3 * n), "total": (kind, 3)})
    return runs


@pytest.mark.parametrize("case", sampled(list(SCANS), keep=["cumprod", "cumsum_reverse", "cummax"]))
def test_the_warp_scans_give_the_naive_rows_on_the_cpu(case, tmp_path):
    """A running sum, a running product, an exclusive running sum, a running sum from the row's end and a running
    maximum, a warp a row: every prefix and every row's total is the naive loop's (values exact in any order), for
    rows shorter than a warp, of one, and past two."""
    runs = _scanned(tmp_path, case, {"naive": golden(case, "after"), "warp": golden(case, "before")})
    for n in (1, 31, 32, 70):
        for name in ("y", "total"):
            assert torch.equal(runs["warp", n][name], runs["naive", n][name]), (n, name)


SCAN_MUTANTS = [
    ("cumsum_exclusive", ("lane == 0 ? running : running + scan_before", "running + scan_value")),  # inclusive
    ("cumsum_exclusive", ("lane == 0 ? running : running + scan_before", "running + scan_before")),  # lane 0 shifted
    ("cumprod", ("float scan_value = 1;", "float scan_value = 0;")),  # lanes past the row end zero the carry
    ("cumsum_reverse", ("const int j = n - 1 - (scan_base + lane);", "const int j = n - (scan_base + lane);")),
    ("cumsum_reverse", ("if (j >= 0) y[", "if (j > 0) y[")),  # the first column never stored
    # lanes past the row's end that contribute zero, not NaN, to a running maximum raise a negative row's maximum
    ("cummax", ("float scan_value = __int_as_float(0x7fc00000);", "float scan_value = 0.0f;")),
]


@pytest.mark.parametrize("scan_mutant", sampled(SCAN_MUTANTS, keep=SCAN_MUTANTS[:1] + SCAN_MUTANTS[3:4]))
def test_a_scan_that_stores_the_wrong_prefix_is_caught(scan_mutant, tmp_path):
    case, mutant = scan_mutant
    warp = golden(case, "before")
    assert mutant[0] in warp.source
    broken = KernelState(source=warp.source.replace(*mutant), plan=warp.plan)
    runs = _scanned(tmp_path, case, {"naive": golden(case, "after"), "broken": broken})
    assert any(not torch.equal(runs["broken", n][name], runs["naive", n][name])
               for n in (1, 31, 32, 70) for name in ("y", "total"))



def _powers_of_two(rows: int, n: int) -> torch.Tensor:
    """+-1, +-2 and +-0.5: products exact in any order, far from float32's limits in 70 columns."""
    choices = torch.tensor([1.0, -1.0, 2.0, -2.0, 0.5, -0.5])
    return choices[torch.randint(0, 6, (rows * n,), generator=torch.Generator().manual_seed(rows * 100 + n))]


def test_a_row_product_is_combined_by_products_and_split_into_chunks_merged_by_products(tmp_path):
    """`product *= x` (or `product = product * x`, kept as written) starting at one: the warp's partial products
    multiplied by a butterfly, and unsplit_reduction's chunks multiplied in the merge; both give the naive rows on
    the CPU."""
    naive, warp = golden("rowprod", "after"), golden("rowprod", "before")
    update = "product *= x[row * n + j];"
    spelled = KernelState(source=naive.source.replace(update, "product = product * x[row * n + j];"), plan=naive.plan)
    spelled_warp = get("serialize_reduction").forward(spelled, Anchor("kernel", "function", "row")).state
    assert spelled_warp.source == warp.source.replace(update, "product = product * x[row * n + j];")
    unsplit = get("unsplit_reduction")
    split = unsplit.forward(naive, Anchor("kernel", "function", "row")).state
    assert "product *= split_product[(size_t)split * rows + row];" in split.source
    for n in (1, 33, 300):
        x = _powers_of_two(5, n)
        chunks = expr.evaluate_int(split.plan.launches[0].grid[1], {**devices.DEFAULT.facts(), "rows": 5, "n": n})
        outputs = {"naive": {"y": (torch.float32, 5)}, "warp": {"y": (torch.float32, 5)},
                   "split": {"y": (torch.float32, 5), "split_product": (torch.float32, chunks * 5)}}
        runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}", state, {"rows": 5, "n": n}, {"x": x},
                                  outputs[form])["y"]
                for form, (binary, state) in emulate.builds(tmp_path, {"naive": naive, "warp": warp,
                                                                       "split": split}).items()}
        assert torch.equal(runs["warp"], runs["naive"]) and torch.equal(runs["split"], runs["naive"]), n
        assert torch.equal(runs["naive"], x.view(5, n).prod(1))


def test_no_site_where_a_product_does_not_start_at_one(transform):
    naive = golden("rowprod", "after")
    state = KernelState(source=naive.source.replace("float product = 1.0f;", "float product = 2.0f;"), plan=naive.plan)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match="product 'product' does not start at one"):
        transform.forward(state, Anchor("kernel", "function", "row"))


@pytest.mark.parametrize("loop, why", [
    ("for (int j = n - 1; j >= 0; --j) y[row * n + j] = x[row * n + j];", "no running sum or product"),
    ("for (int j = n - 1; j > 0; --j) { s += x[row * n + j]; y[row * n + j] = s; }", "not a unit-step loop"),
    ("for (int j = n - 2; j >= 0; --j) { s += x[row * n + j]; y[row * n + j] = s; }", "not a unit-step loop"),
])
def test_no_site_where_a_loop_down_the_row_is_not_a_whole_running_sum(transform, loop, why):
    state = KernelState(source=HEAD + f"    float s = 0.0f;\n    {loop}\n}}\n", plan=PLAN)
    with refusals() as reasons:
        assert transform.forward_sites(state) == []
    assert any(why in reason for reason in reasons), reasons


# --- spellings: a scan's update inside its store or through a temporary (`respelled`), a variable set after its
# declaration, a loop index declared before its loops (C's, `_canonical.py`); each read as the form it spells, or no
# site with the reason ---------------------------------------------------------------------------------------------

SCAN_LOOP = "    for (int j = 0; j < n; ++j) {\n        running += 2.0f * x[row * n + j];\n" \
            "        y[row * n + j] = running;\n    }\n"


def _cumsum(loop: str) -> KernelState:
    """The golden running sum with its loop spelled `loop`."""
    naive = golden("cumsum", "after")
    assert SCAN_LOOP in naive.source
    return KernelState(source=naive.source.replace(SCAN_LOOP, loop), plan=naive.plan)


def _body(*lines: str) -> str:
    return "    for (int j = 0; j < n; ++j) {\n" + "".join(f"        {line}\n" for line in lines) + "    }\n"


CUMMAX_LOOP = _body("running = fmaxf(running, x[row * n + j]);", "y[row * n + j] = running;")


# the fuzz's spellings that store the running value an update inside the store gives: each the scan, or no site
STORED_UPDATES = {
    "parenthesized": (_body("y[row * n + j] = (running += 2.0f * x[row * n + j]);"), None),
    "unbraced": ("    for (int j = 0; j < n; ++j) y[row * n + j] = running += 2.0f * x[row * n + j];\n", None),
    "chained": (_body("y[row * n + j] = running = running + 2.0f * x[row * n + j];"), None),
    "scaled": (_body("y[row * n + j] = (running += 2.0f * x[row * n + j]) * 0.5f;"),
               "'running' is assigned inside a larger expression in a row loop"),
}


@pytest.mark.parametrize("spelling", list(STORED_UPDATES))
def test_a_running_sum_updated_inside_its_store_is_the_scan_or_no_site(transform, spelling, tmp_path):
    """`y[...] = (running += e);`: the update sits inside the store. A forward that saw no accumulator there would
    stride the loop as it stands, each lane storing a sum of its own columns (that form, caught on the CPU below).
    The value stored is the running value after the update, so the store is the scan's own (its forward is the
    golden scan's, whose rows on the CPU are the spelled kernel's); a store of anything else is no scan the warp
    computes."""
    loop, why = STORED_UPDATES[spelling]
    naive = _cumsum(loop)
    if why is not None:
        with refusals() as reasons:
            assert transform.forward_sites(naive) == []
        assert any(why in reason for reason in reasons), reasons
        with pytest.raises(NotApplicable, match=why):
            transform.forward(naive, Anchor("kernel", "function", "row"))
        return
    (site,) = transform.forward_sites(naive)
    warp = transform.forward(naive, site).state
    assert warp == golden("cumsum", "before")
    strided = KernelState(source=naive.source.replace(
        "int row = blockIdx.x * blockDim.x + threadIdx.x;",
        "int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;\n    const int lane = threadIdx.x % 32;").replace(
        "for (int j = 0; j < n; ++j)", "for (int j = lane; j < n; j += 32)"), plan=warp.plan)
    runs = _scanned(tmp_path, "cumsum", {"naive": naive, "warp": warp, "strided": strided})
    for n in (1, 31, 32, 70):
        for name in ("y", "total"):
            assert torch.equal(runs["warp", n][name], runs["naive", n][name]), (n, name)
    assert not torch.equal(runs["strided", 70]["y"], runs["naive", 70]["y"])  # the old forward's rows


# (golden case, its loop as the golden writes it, the loop spelled otherwise): the update `acc = acc + e` or through
# a temporary of the accumulator's type, inclusive, exclusive, a product and from the row's end
SCAN_SPELLINGS = {
    "plus": ("cumsum", SCAN_LOOP,
             _body("running = running + 2.0f * x[row * n + j];", "y[row * n + j] = running;")),
    "plus_after": ("cumsum", SCAN_LOOP,
                   _body("running = 2.0f * x[row * n + j] + running;", "y[row * n + j] = running;")),
    "temporary": ("cumsum", SCAN_LOOP,
                  _body("float v = 2.0f * x[row * n + j];", "running += v;", "y[row * n + j] = running;")),
    "const_temporary_plus": ("cumsum", SCAN_LOOP, _body("const float v = 2.0f * x[row * n + j];",
                                                        "running = running + v;", "y[row * n + j] = running;")),
    "exclusive_temporary": ("cumsum_exclusive",
                            _body("y[row * n + j] = running;", "running += x[row * n + j];"),
                            _body("int v = x[row * n + j];", "y[row * n + j] = running;", "running = running + v;")),
    "product": ("cumprod", _body("running *= x[row * n + j];", "y[row * n + j] = running;"),
                _body("running = x[row * n + j] * running;", "y[row * n + j] = running;")),
    "reverse_temporary": ("cumsum_reverse",
                          "    for (int j = n - 1; j >= 0; --j) {\n        running += x[row * n + j];\n"
                          "        y[row * n + j] = running;\n    }\n",
                          "    for (int j = n - 1; j >= 0; --j) {\n        float v = x[row * n + j];\n"
                          "        running += v;\n        y[row * n + j] = running;\n    }\n"),
    # a running maximum kept by a compare, from -INFINITY: fmaxf's
    "kept_maximum": ("cummax", CUMMAX_LOOP,
                     _body("if (x[row * n + j] > running) running = x[row * n + j];", "y[row * n + j] = running;")),
    "kept_ternary_temporary": ("cummax", CUMMAX_LOOP,
                               _body("float v = x[row * n + j];", "running = running < v ? v : running;",
                                     "y[row * n + j] = running;")),
}


def _scan_spelled(spelling: str) -> tuple[str, KernelState]:
    case, loop, spelled = SCAN_SPELLINGS[spelling]
    naive = golden(case, "after")
    assert loop in naive.source
    return case, KernelState(source=naive.source.replace(loop, spelled), plan=naive.plan)


@pytest.mark.parametrize("spelling", list(SCAN_SPELLINGS))
def test_a_scan_spelled_through_a_temporary_or_as_acc_plus_is_the_golden_scan(transform, spelling):
    case, naive = _scan_spelled(spelling)
    (site,) = transform.forward_sites(naive)
    assert transform.forward(naive, site).state == golden(case, "before")


@pytest.mark.parametrize("spelling", sampled(SCAN_SPELLINGS, keep=["temporary", "exclusive_temporary",
                                                                   "kept_ternary_temporary"]))
def test_a_spelled_scans_warp_form_gives_its_rows_on_the_cpu(transform, spelling, tmp_path):
    case, naive = _scan_spelled(spelling)
    runs = _scanned(tmp_path, case, {"naive": naive, "warp": transform.forward(naive, transform.forward_sites(naive)[0])
                                     .state})
    for n in (1, 31, 32, 70):
        for name in ("y", "total"):
            assert torch.equal(runs["warp", n][name], runs["naive", n][name]), (spelling, n, name)


@pytest.mark.parametrize("start", ["x[row * n]", "NAN", "y[row]"])
def test_a_running_extreme_kept_by_a_compare_from_what_may_be_nan_stays_as_written(start):
    """The compare keeps a NaN start where fmaxf would take the first element: only a start that is a number (an
    infinity, a literal) is read as fmaxf's running maximum."""
    _, naive = _scan_spelled("kept_maximum")
    state = KernelState(source=naive.source.replace("float running = -INFINITY;", f"float running = {start};"),
                        plan=naive.plan)
    assert f"float running = {start};" in state.source and respelled(state) == state


LAYER_NORM = """__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, \
const float* __restrict__ b, float* __restrict__ y, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += in[j];
    float mean = sum / n;
    float squares = 0.0f;
    for (int j = 0; j < n; ++j) { float d = in[j] - mean; squares += d * d; }
    float rstd = 1.0f / sqrtf(squares / n + 1e-5f);
    for (int j = 0; j < n; ++j) y[(long long)row * n + j] = (in[j] - mean) * rstd * w[j] + b[j];
}
"""
LN_PLAN = LaunchPlan.from_toml(PLAN_TEXT.replace('args = ["x", "y",', 'args = ["x", "w", "b", "y",'))
# the mean and the scale declared with no value and set later (no accumulators: read as written)
MEAN_APART = LAYER_NORM.replace("    float sum = 0.0f;\n", "    float mean, rstd;\n    float sum = 0.0f;\n") \
    .replace("float mean =", "mean =").replace("float rstd =", "rstd =")
# the fuzz's layer norms, each with the form it spells: the sums declared with the other locals and set later, one
# loop index for the three loops
LN_SPELLINGS = {
    "declared_before": (MEAN_APART.replace("    float mean, rstd;\n    float sum = 0.0f;\n",
                                           "    float sum, squares, mean, rstd;\n    sum = 0.0f;\n")
                        .replace("float squares = 0.0f;", "squares = 0.0f;"), MEAN_APART),
    "index_before": (LAYER_NORM.replace("    float sum = 0.0f;\n", "    int j;\n    float sum = 0.0f;\n")
                     .replace("for (int j = 0;", "for (j = 0;"), LAYER_NORM),
}


def test_sums_declared_before_and_a_loop_index_declared_before_read_as_declared_where_set(transform, tmp_path):
    """`float sum, mean; sum = 0.0f;` and `int j; for (j = 0; ...)` (C's spellings, `_canonical.py` reads them):
    nothing reads sum before it is set, nothing reads j outside the loops that set it, so the forward is the one of
    the sums declared where set and of loops that declare their index, and its rows on the CPU are the spelled
    kernels' (float sums in another order: to rounding)."""
    forms = {}
    for spelling, (source, spells) in LN_SPELLINGS.items():
        assert source.count("float sum") == 1 and source != spells
        naive, written = KernelState(source=source, plan=LN_PLAN), KernelState(source=spells, plan=LN_PLAN)
        (site,) = transform.forward_sites(written)
        warp = transform.forward(written, site).state
        assert "for (int offset = 16; offset > 0; offset /= 2) squares += " in warp.source
        assert transform.forward_sites(naive) == [site]
        assert transform.forward(naive, site).state == warp, spelling
        forms |= {spelling: naive, f"{spelling} warp": warp}
    binaries = emulate.builds(tmp_path, forms)
    for rows, n in ((3, 1), (5, 33), (4, 70)):
        g = torch.Generator().manual_seed(rows * 100 + n)
        inputs = {"x": torch.randn(rows * n, generator=g), "w": torch.randn(n, generator=g),
                  "b": torch.randn(n, generator=g)}
        runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}".replace(" ", "-"), state, {"rows": rows, "n": n},
                                  inputs, {"y": (torch.float32, rows * n)})["y"]
                for form, (binary, state) in binaries.items()}
        for spelling in LN_SPELLINGS:
            torch.testing.assert_close(runs[f"{spelling} warp"], runs[spelling], rtol=1e-5, atol=1e-5)


def test_a_running_sum_declared_before_its_guard_and_set_after_it_is_the_golden_scan(transform, tmp_path):
    naive = golden("cumsum", "after")
    old = "    if (row >= rows) return;\n    float running = 0.0f;\n"
    assert old in naive.source
    spelled = KernelState(source=naive.source.replace(old, "    float running;\n    if (row >= rows) return;\n"
                                                           "    running = 0.0f;\n"), plan=naive.plan)
    (site,) = transform.forward_sites(spelled)
    warp = transform.forward(spelled, site).state
    assert warp == golden("cumsum", "before")
    runs = _scanned(tmp_path, "cumsum", {"naive": spelled, "warp": warp})
    for n in (1, 31, 32, 70):
        for name in ("y", "total"):
            assert torch.equal(runs["warp", n][name], runs["naive", n][name]), (n, name)


@pytest.mark.parametrize("loop, name", [
    ("for (int j = 0; j < n; ++j) if (m[row * n + j]) s += x[row * n + j];", "s"),
    ("for (int j = 0; j < n; ++j) { if (x[row * n + j] != 0.0f) { c++; } }", "c"),
    ("for (int j = 0; j < n; ++j) if (m[row * n + j] > 0) s = s + 2.0f * x[row * n + j];", "s"),
    ("for (int j = 0; j < n; ++j) if (m[row * n + j]) s -= x[row * n + j];", "s"),  # lanes' partials summed
])
def test_an_update_under_a_condition_of_the_element_gets_a_warp_and_the_naive_bits(transform, tmp_path, loop, name):
    """A masked sum, a count of nonzeros: each lane folds the elements it takes whose condition holds, the warp
    combines the partials; on integer values, which any order sums exactly, the warp form's results are the naive
    loop's bits. A condition that reads the accumulator is no such update (refused below)."""
    source = ("__global__ void kernel(const float* x, const int* m, float* y, int rows, int n) {\n"
              "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n"
              f"    float s = 0.0f;\n    int c = 0;\n    {loop}\n    y[row] = s + c;\n}}\n")
    state = KernelState(source=source, plan=LaunchPlan.from_toml(PLAN_TEXT.replace('"x", "y",', '"x", "m", "y",')))
    (site,) = transform.forward_sites(state)
    warp = transform.forward(state, site).state
    assert f"{name} += __shfl_xor_sync" in warp.source

    assert emulate.differences(tmp_path, state, {"warp": warp}, ((3, 5), (40, 70)), _masked(per_element=False)) == []


def test_no_site_where_the_condition_reads_the_accumulator(transform):
    source = ("__global__ void kernel(const float* x, float* y, int rows, int n) {\n"
              "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n"
              "    float s = 0.0f;\n    for (int j = 0; j < n; ++j) if (s < 10.0f) s += x[row * n + j];\n"
              "    y[row] = s;\n}\n")
    state = KernelState(source=source, plan=LaunchPlan.from_toml(PLAN_TEXT))
    with pytest.raises(NotApplicable, match="no update under a condition of the element alone"):
        transform.forward(state, Anchor("kernel", "function", "row"))


@pytest.mark.parametrize("body", [
    "{ if (m[row * n + j]) s += x[row * n + j]; y[row * n + j] = s; }",  # a masked cumsum
    "{ y[row * n + j] = s; if (m[row * n + j] != 0) s = s + x[row * n + j]; }",  # exclusive, spelled out
])
def test_a_masked_scan_gets_a_warp_scan_and_the_naive_bits(transform, tmp_path, body):
    """A running sum that adds only where a mask keeps the element reads as the scan adding `m ? x : 0`; on integer
    values (any order sums them exactly) the warp scan's outputs are the naive loop's bits, ragged rows included."""
    source = ("__global__ void kernel(const float* x, const int* m, float* y, int rows, int n) {\n"
              "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n"
              f"    float s = 0.0f;\n    for (int j = 0; j < n; ++j) {body}\n}}\n")
    state = KernelState(source=source, plan=LaunchPlan.from_toml(PLAN_TEXT.replace('"x", "y",', '"x", "m", "y",')))
    (site,) = transform.forward_sites(state)
    warp = transform.forward(state, site).state
    assert "__shfl_up_sync" in warp.source

    assert emulate.differences(tmp_path, state, {"warp": warp}, ((3, 5), (40, 70)), _masked(per_element=True)) == []


def _masked(per_element: bool):
    """inputs_of for rows x n integer values (any order sums them exactly) and a 0/1 int mask; the output one value a
    row, or one an element (`per_element`: a scan's)."""
    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict]:
        g = torch.Generator().manual_seed(rows * n)
        x = torch.randint(-3, 4, (rows * n,), generator=g).float()
        return ({"rows": rows, "n": n}, {"x": x, "m": torch.randint(0, 2, (rows * n,), generator=g).int()},
                {"y": (torch.float32, rows * n if per_element else rows)})

    return inputs_of


QUANTIZE = """__global__ void kernel(const float* x, float* y, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[row * n + j]));
    float s = amax / 7.0f;
    if (s == 0.0f) s = 1.0f;
    for (int j = 0; j < n; j++) {
        float v = rintf(x[row * n + j] / s);
        v = fminf(fmaxf(v, -7.0f), 7.0f);
        y[row * n + j] = v * s;
    }
}
"""


def test_a_columns_own_temporary_assigned_again_is_no_accumulator(transform, tmp_path):
    """A row's absmax quantization clamps each column's value in a temporary declared in the loop and assigned again:
    every lane computes it for its own columns, so the row gets its warp and the naive bits; a local declared
    before the loop that carries a column's value to the next is no such temporary (no reduction either)."""
    plan = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "n", type = "i32" }',
                   grid="cdiv(rows, 128)", block=128)
    naive = KernelState(source=QUANTIZE, plan=plan)
    (site,) = transform.forward_sites(naive)
    warp = transform.forward(naive, site).state

    def inputs(rows: int, n: int) -> tuple[dict, dict, dict]:
        x = torch.randint(-20, 21, (rows * n,), generator=torch.Generator().manual_seed(n)).float()
        return {"rows": rows, "n": n}, {"x": x}, {"y": (torch.float32, rows * n)}

    assert emulate.differences(tmp_path, naive, {"warp": warp}, ((3, 5), (4, 70)), inputs) == []
    carried = QUANTIZE.replace("        y[row * n + j] = v * s;\n", "        y[row * n + j] = v * s - prev;\n"
                               "        prev = v;\n").replace("    float s =", "    float prev = 0.0f;\n    float s =")
    with refusals() as seen:
        assert transform.forward_sites(KernelState(carried, plan)) == []
    assert any("not a reduction" in reason for reason in seen), seen


@pytest.mark.parametrize("case", ["cumsum", "cumsum_exclusive"])
def test_a_running_sum_kept_in_double_and_stored_cast_is_scanned_in_double(transform, case, tmp_path):
    """`double running; ... y[...] = (float)running;`: the lanes scan in double and each store converts the running
    value as the loop's did; the backward reads the warp form back to that loop, and on the CPU the rows are the
    loop's (integers: exact in any order)."""
    naive = golden(case, "after")
    kind = "int" if case == "cumsum_exclusive" else "float"
    source = naive.source.replace(f"{kind} running = 0", "double running = 0").replace(
        "y[row * n + j] = running;", f"y[row * n + j] = ({kind})running;")
    assert source.count("double running") == 1 and f"({kind})running;" in source
    state = KernelState(source=source, plan=naive.plan)
    (site,) = transform.forward_sites(state)
    warp = transform.forward(state, site).state
    assert f"= ({kind})(" in warp.source and "const double scan_up" in warp.source
    (found,) = transform.find(warp)
    assert transform.forward(transform.backward(warp, found).state, site).state == warp
    runs = _scanned(tmp_path, case, {"naive": state, "warp": warp})
    for n in (1, 31, 32, 70):
        assert torch.equal(runs["warp", n]["y"], runs["naive", n]["y"]), n
