"""untile_transpose: a transpose staged through a padded 32x33 shared tile becomes a direct strided copy;
forward finds naive transposes by analysis (on a 2-D index, a 1-D index split into a row and a column, or a batch of
them with the matrix from grid z; the 2-D copy in the spellings that copy the same elements, its refusals naming
the part that differs) and sets the (32, 8) block and the tile grid in the plan."""

from __future__ import annotations

import re

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from klineage.transforms.base import refusals
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

SITE = Anchor("kernel", "function", "tile")


@pytest.fixture(scope="module")
def transform():
    return get("untile_transpose")


def golden(which: str, case: str = "float") -> KernelState:
    return load(HERE / "untile_transpose" / case, which, "kernel")


@pytest.mark.parametrize("case", ["float", "batched"])
def test_golden(case):
    check_golden("untile_transpose", case)


def test_golden_kernels_compile(cache):
    for case in ("float", "flat", "batched"):
        for which in ("before", "after"):
            compiles_without_spills(golden(which, case), cache)


def test_forward_finds_the_naive_transpose_by_analysis(transform):
    assert transform.forward_sites(golden("after")) == [SITE]
    assert transform.forward_sites(golden("before")) == []
    tiled = transform.forward(golden("after"), SITE).state
    assert "__shared__ float tile[32][33];" in tiled.source
    assert tiled.plan.launches[0].block == (32, 8, 1)
    assert tiled.plan.launches[0].grid[:2] == ("cdiv(cols, 32)", "cdiv(rows, 32)")


def _state(body: str, args: str = '"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }'):
    plan = (HERE / "untile_transpose" / "float" / "after.toml").read_text()
    plan = plan.replace('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', args)
    source = ("__global__ void kernel(const float* x, float* y, int rows, int cols) {\n"
              "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n    int r = blockIdx.y * blockDim.y + threadIdx.y;\n"
              + body + "}\n")
    return KernelState(source=source, plan=LaunchPlan.from_toml(plan))


@pytest.mark.parametrize("body, args, why", [
    ("    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c] + 1.0f;\n", None, "not a naive transpose"),
    ("    if (r >= rows && c >= cols) return;\n    y[c * rows + r] = x[r * cols + c];\n", None, "not a naive"),
    ("    if (r >= rows || c >= cols) return;\n    y[c * rows + r] = x[r * cols + c];\n    y[0] = 0.0f;\n", None,
     "not a naive"),
    ("    if (r < cols && c < rows) y[c * rows + r] = x[r * cols + c];\n", None, "bounds do not match"),
    ("    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c];\n    y[0] = 0.0f;\n", None, "not a naive"),
    ("    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c];\n",
     '"x", "x", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', "one buffer twice"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, args, why):
    state = _state(body, args) if args else _state(body)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


SPELLED = {  # body -> whether its subscripts are 64-bit
    "    if (r >= rows || c >= cols) return;\n    y[c * rows + r] = x[r * cols + c];\n": False,
    "    if (c >= cols || r >= rows) return;\n    y[c * rows + r] = x[r * cols + c];\n": False,
    "    if (r < rows && c < cols) {\n        y[c * rows + r] = x[r * cols + c];\n    }\n": False,
    "    if (r < rows && c < cols) y[(size_t)c * rows + r] = x[(size_t)r * cols + c];\n": True,
    "    if (r >= rows || c >= cols) return;\n    y[(long long)c * rows + r] = x[r * cols + c];\n": True,
}


@pytest.mark.parametrize("body", sampled(list(SPELLED), keep=list(SPELLED)[-1:]))
def test_a_transpose_spelled_another_common_way_is_tiled_and_a_64_bit_one_stays_64_bit(transform, cache, body):
    wide = SPELLED[body]
    (site,) = transform.forward_sites(_state(body))
    tiled = transform.forward(_state(body), site).state
    cast = "(size_t)" if wide else ""
    assert f"x[{cast}(r + k) * cols + c]" in tiled.source and f"y[{cast}(r_out + k) * rows + c_out]" in tiled.source
    naive = transform.backward(tiled, transform.find(tiled)[0]).state
    assert f"if (r < rows && c < cols) y[{cast}c * rows + r] = x[{cast}r * cols + c];" in naive.source
    assert transform.forward(naive, site).state.source == tiled.source
    compiles_without_spills(tiled, cache)


# --- the 1-D spelling: one index over the elements, split into a row and a column ----------------------------------

def test_the_1d_spelling_is_tiled_on_the_2d_launch_and_goes_back_as_the_2d_form(transform):
    """forward(flat/after) is flat/before, the 2-D tile grid whatever the 1-D grid was; backward writes the 2-D
    naive form, which computes the same."""
    flat = golden("after", "flat")
    assert transform.forward_sites(flat) == [SITE]
    tiled = transform.forward(flat, SITE).state
    assert (tiled.source, tiled.plan) == (golden("before", "flat").source, golden("before", "flat").plan)
    naive = transform.backward(tiled, SITE).state
    assert "    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c];\n" in naive.source
    assert naive.plan == golden("after").plan


def _copy(rows: int, cols: int) -> tuple[dict, dict, dict]:
    n = rows * cols
    return ({"rows": rows, "cols": cols}, {"x": torch.randn(n, generator=torch.Generator().manual_seed(n))},
            {"y": (torch.float32, n)})


def test_the_tiled_form_of_the_1d_spelling_computes_its_bits_on_the_cpu(tmp_path):
    """Shapes 32 divides and does not, a lone row and a lone column, on aligned and misaligned pointers."""
    shapes = ((1, 1), (3, 5), (32, 64), (33, 40), (1, 70), (70, 1))
    found = emulate.differences(tmp_path, golden("after", "flat"), {"tiled": golden("before", "flat")}, shapes,
                                _copy)
    assert found == []


FLAT_HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n    int i = " \
    "blockIdx.x * blockDim.x + threadIdx.x;\n"
FLAT_PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
                    "cdiv(rows * cols, 256)")


def _flat(guarded: str, guard: str = "i < rows * cols") -> KernelState:
    return KernelState(source=FLAT_HEAD + f"    if ({guard}) {{ {guarded} }}\n}}\n", plan=FLAT_PLAN)


@pytest.mark.parametrize("state, why", [
    (_flat("int r = i / rows, c = i % rows; y[c * rows + r] = x[i];"), "bounds do not match"),  # rows: no column
    (_flat("int r = i / cols, c = i % rows; y[c * rows + r] = x[i];"), "not split by one factor"),
    (_flat("int r = i / cols, c = i % cols; y[c * rows + r] = x[i];", "i < rows * rows"), "not split by one factor"),
    (_flat("int c = i / cols, r = i % cols; y[c * rows + r] = x[i];"), "not a naive transpose"),  # r the column
    (_flat("int r = i / cols, c = i % cols; y[c * rows + r] = x[c * cols + r];"), "not a naive transpose"),
    (_flat("int r = i / cols, c = i % cols; y[c * rows + r] = x[i];", "i < rows"), "not a naive transpose"),
    (_flat("int r = i / cols, c = i % cols; y[c * rows + r] = x[i];", "i <= rows * cols"), "not a naive"),
    (_flat("int r = i / cols, c = i % cols; y[c * rows + r] = x[i + 1];"), "not a naive transpose"),
    (_flat("int r = i / cols; int c = i % cols; int q = i / cols; y[c * rows + r] = x[i];"), "more than a row"),
    (_flat("int r = i / cols; y[r] = x[i];"), "not split into a row"),
    (_flat("int r = i / cols, c = i % cols; y[c * rows + r] = x[i]; y[0] = 0.0f;"), "declares no row"),
    (_flat("int r = i / cols, rows = i % cols; y[rows * rows + r] = x[i];"), "named as the index or a count"),
    (KernelState(source=FLAT_HEAD + "    if (i > rows * cols) return;\n    int r = i / cols, c = i % cols;\n"
                 "    y[c * rows + r] = x[i];\n}\n", plan=FLAT_PLAN), "not a naive transpose"),
])
def test_no_site_where_the_1d_spelling_is_no_transpose(transform, state, why):
    """The attacks: a divisor that is not the column count, two divisors, a count the divisor is no factor of, the
    row and the column swapped in the copy, a guard that is not the element count (or lets one more in), a read at
    another element, a third part, no column, a second store, a column that hides the row count from the copy (which
    the 2-D reading would take for the count), an early return that lets the last element in."""
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


# --- a batch of transposes, the matrix from grid z ----------------------------------------------------------------

def _batched_copy(batch: int, rows: int, cols: int) -> tuple[dict, dict, dict]:
    n = batch * rows * cols
    return ({"batch": batch, "rows": rows, "cols": cols},
            {"x": torch.randn(n, generator=torch.Generator().manual_seed(n))}, {"y": (torch.float32, n)})


BATCHED_SHAPES = ((1, 1, 1), (3, 3, 5), (2, 32, 64), (3, 33, 40), (2, 1, 70), (3, 70, 1))


def test_a_batch_keeps_its_grid_z_and_both_offsets(transform):
    tiled = transform.forward(golden("after", "batched"), SITE).state
    assert tiled.plan.launches[0].grid == ("cdiv(cols, 32)", "cdiv(rows, 32)", "batch")
    assert "x[(b * rows + r + k) * cols + c]" in tiled.source and "y[(b * cols + r_out + k) * rows + c_out]" in \
        tiled.source


def test_the_tiled_form_of_a_batch_computes_its_bits_on_the_cpu(tmp_path):
    """Batches of one to three matrices, shapes 32 divides and does not, a lone row and a lone column, on aligned
    and misaligned pointers: every matrix lands at its own place."""
    found = emulate.differences(tmp_path, golden("after", "batched"), {"tiled": golden("before", "batched")},
                                BATCHED_SHAPES, _batched_copy)
    assert found == []


def test_the_emulation_sees_a_batch_offset_by_the_wrong_count(tmp_path):
    """The check can fail: a tiled form that reads each matrix rows * rows past the last (not rows * cols)."""
    tiled = golden("before", "batched")
    wrong = tiled.source.replace("x[(b * rows + r + k) * cols + c]", "x[(b * cols + r + k) * cols + c]")
    assert wrong != tiled.source
    found = emulate.differences(tmp_path, golden("after", "batched"),
                                {"wrong": KernelState(source=wrong, plan=tiled.plan)}, ((2, 3, 5),),
                                _batched_copy)
    assert found


BATCH_ARGS = '"x", "y", { scalar = "batch", type = "i32" }, { scalar = "rows", type = "i32" }, ' \
    '{ scalar = "cols", type = "i32" }'


def _batched(copy: str, batch: str = "int b = blockIdx.z;", block: str = "32, 8") -> KernelState:
    source = ("__global__ void kernel(const float* x, float* y, int batch, int rows, int cols) {\n"
              "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n    int r = blockIdx.y * blockDim.y + threadIdx.y;\n"
              f"    {batch}\n    if (r < rows && c < cols) {copy}\n}}\n")
    plan = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\n'
                                'grid = ["cdiv(cols, 32)", "cdiv(rows, 8)", "batch"]\n'
                                f"block = [{block}]\nargs = [{BATCH_ARGS}]\n")
    return KernelState(source=source, plan=plan)


ROWS_READ = "x[(b * rows + r) * cols + c]"


@pytest.mark.parametrize("state, why", [
    (_batched(f"y[(b * rows + c) * rows + r] = {ROWS_READ};"), "do not both add its batch's offset b \\* rows"),
    (_batched("y[(b * cols + c) * rows + r] = x[(b * cols + r) * cols + c];"), "do not both add its batch's offset"),
    (_batched(f"y[c * rows + r] = {ROWS_READ};"), "do not both add its batch's offset"),
    (_batched("y[(b * cols + c) * rows + r] = x[r * cols + c];"), "do not both add its batch's offset"),
    (_batched(f"y[(2 * b * cols + c) * rows + r] = {ROWS_READ};"), "do not both add its batch's offset"),
    # its batch index read nowhere goes (`_canonical`): a 2-D transpose launched on a 3-D grid
    (_batched("y[c * rows + r] = x[r * cols + c];"), "more than 2 dimension"),
    (_batched(f"y[(b * cols + c) * rows + r] = {ROWS_READ} * b;"), "not a naive transpose"),
    (_batched(f"y[(b * cols + c) * rows + r] = {ROWS_READ};", "int b = blockIdx.z + 1;"), "not a naive transpose"),
    (_batched(f"y[(b * cols + c) * rows + r] = {ROWS_READ};", "int b = blockIdx.y;"), "not a naive transpose"),
    (_batched("y[((int)b * cols + c) * rows + r] = x[((int)b * rows + r) * cols + c];"), "not a naive transpose"),
    (_batched("y[(k * cols + c) * rows + r] = x[(k * rows + r) * cols + c];", "int k = blockIdx.z;"),
     "names what the tiled form declares"),
    (_batched(f"y[(b * cols + c) * rows + r] = {ROWS_READ};", block="32, 4, 2"), "more than 2 dimensions"),
])
def test_no_site_where_the_batch_is_not_each_matrixs_own(transform, state, why):
    """The attacks: the write's offset of another size than the read's (rows * rows), both of another size than a
    matrix (cols * cols), an offset missing on either side, twice the offset, none on either side (every layer of z
    would write one matrix), the batch in the value, z shifted, a batch from grid y, a narrowing cast, a batch named
    as the tiled form's pass counter, a block that is 3-D."""
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_a_2d_transpose_on_a_3d_grid_stays_refused(transform):
    """Without a batch every layer of z writes the same matrix: no site, as before."""
    state = _batched("y[c * rows + r] = x[r * cols + c];", batch="")
    with pytest.raises(NotApplicable, match="more than 2 dimension"):
        transform.forward(state, SITE)


# --- spellings of the 2-D copy that a fuzz found refused: each copies exactly what the plain form does ----------------

NAIVE_HEAD = "__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {\n"
INDEXES = "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n    int r = blockIdx.y * blockDim.y + threadIdx.y;\n"
GUARDED = "    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c];\n"
SPELLINGS = {  # name -> (the naive kernel, the tiled form's read of the tile's rows)
    "size_t indexes": (NAIVE_HEAD + "    size_t col = (size_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
                       "    size_t row = (size_t)blockIdx.y * blockDim.y + threadIdx.y;\n"
                       "    if (row < rows && col < cols) y[col * rows + row] = x[row * cols + col];\n}\n",
                       "x[(size_t)(row + k) * cols + col]"),
    "long long indexes": (NAIVE_HEAD + "    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                          "    long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y;\n" + GUARDED + "}\n",
                          "x[(size_t)(r + k) * cols + c]"),
    "block sizes by macros": ("#define TX 32\n#define TY 8\n" + NAIVE_HEAD +
                              "    int c = blockIdx.x * TX + threadIdx.x;\n    int r = blockIdx.y * TY + threadIdx.y;\n"
                              + GUARDED + "}\n", "x[(r + k) * cols + c]"),
    "nested guards": (NAIVE_HEAD + INDEXES + "    if (r < rows) {\n        if (c < cols) {\n"
                      "            y[c * rows + r] = x[r * cols + c];\n        }\n    }\n}\n", "x[(r + k) * cols + c]"),
    "temporaries": (NAIVE_HEAD + INDEXES + "    if (c < cols && r < rows) {\n        int src = r * cols + c;\n"
                    "        int dst = c * rows + r;\n        float v = x[src];\n        y[dst] = v;\n    }\n}\n",
                    "x[(r + k) * cols + c]"),
    "the row declared first": (NAIVE_HEAD + "    int r = blockIdx.y * blockDim.y + threadIdx.y;\n"
                               "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n" + GUARDED + "}\n",
                               "x[(r + k) * cols + c]"),
}


def _naive(source: str) -> KernelState:
    return KernelState(source=source, plan=golden("after").plan)


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_a_spelling_the_fuzz_found_is_tiled_and_compiles(transform, cache, name):
    """The forward finds the site and writes the tiled form (64-bit subscripts where the indexes were 64-bit), which
    backward takes to the plain naive form and the forward back to itself."""
    source, read = SPELLINGS[name]
    assert transform.forward_sites(_naive(source)) == [SITE]
    tiled = transform.forward(_naive(source), SITE).state
    assert "__shared__ float tile[32][33];" in tiled.source and read in tiled.source
    assert tiled.plan == golden("before").plan
    naive = transform.backward(tiled, SITE).state
    assert transform.forward(naive, SITE).state.source == tiled.source
    compiles_without_spills(tiled, cache)


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_the_tiled_form_of_a_spelling_computes_its_bits_on_the_cpu(transform, tmp_path, name):
    """A ragged shape (32 divides neither side) and a square one, on aligned and misaligned pointers."""
    naive = _naive(SPELLINGS[name][0])
    tiled = transform.forward(naive, SITE).state
    assert emulate.differences(tmp_path, naive, {"tiled": tiled}, ((45, 37), (64, 64)), _copy) == []


NEAR = NAIVE_HEAD + INDEXES
WIDE_INDEXES = "    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n" \
    "    long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y;\n"


@pytest.mark.parametrize("source, why", [
    (NEAR + "    if (r < rows) { if (c < cols) y[c * rows + r] = x[c * cols + r]; }\n}\n",
     r"it reads x\[c \* cols \+ r\], not x\[r \* cols \+ c\]"),
    (NEAR + "    if (r < rows) { y[c * rows + r] = x[r * cols + c]; }\n}\n", "no guard bounds c"),
    (NEAR + "    if (r >= rows) return;\n    if (r >= cols) return;\n    y[c * rows + r] = x[r * cols + c];\n}\n",
     "its guard bounds r twice"),
    (NEAR + "    if (r < rows) { if (c < rows) y[c * rows + r] = x[r * cols + c]; }\n}\n",
     "the guard bounds r by rows and c by rows, the subscripts are of a rows x cols matrix"),
    (NEAR + "    if (r < rows) { if (c < cols) y[c * rows + r] = x[r * cols + c]; y[0] = 0.0f; }\n}\n",
     r"`y\[0\] = 0.0f;` follows its guarded work"),
    ("#define TY 4\n" + NAIVE_HEAD + "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n"
     "    int r = blockIdx.y * TY + threadIdx.y;\n" + GUARDED + "}\n",
     "no row index .* a block size it names must be every launch's along y"),
    (NEAR + "    if (r < rows && c < cols) {\n        int src = r * cols + c;\n        float v = x[src + 1];\n"
     "        y[c * rows + r] = v;\n    }\n}\n", r"it reads x\[\(r \* cols \+ c\) \+ 1\]"),
    (NEAR + "    if (r < rows && c < cols) { int src = (size_t)r * cols + c; y[c * rows + r] = x[src]; }\n}\n",
     "narrows a 64-bit subscript to 32 bits"),
    (NAIVE_HEAD + WIDE_INDEXES + "    if (r < rows && c < cols) { int src = r * cols + c; y[c * rows + r] = x[src]; }\n"
     "}\n", "narrows a 64-bit subscript to 32 bits"),
    (NEAR + "    if (r < rows && c < cols) { int v = x[r * cols + c]; y[c * rows + r] = v; }\n}\n",
     r"`int v` holds an element of x \(float\) as int"),
    (NEAR + "    if (r < rows && c < cols) { int cols = 2 * r; y[c * rows + r] = x[r * cols + c]; }\n}\n",
     "its temporary cols hides another cols"),
    (NEAR + "    if (r < rows && c < cols) { float v = x[r * cols + c]; y[c * rows + r] = 2.0f * v; }\n}\n",
     "is no copy"),
    (NAIVE_HEAD.replace("int rows, int cols", "long long rows, long long cols") + WIDE_INDEXES + GUARDED + "}\n",
     "64-bit indexes run to rows and cols, not both `int`"),
    (NAIVE_HEAD + "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n"
     "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n" + GUARDED + "}\n", "two indexes along x, r and c"),
])
def test_no_site_where_a_spelling_copies_other_elements(transform, source, why):
    """The attacks, each a near miss of an accepted spelling: a read at X's transposed element, a guard that
    bounds the row alone (or the row twice, or the column by the row count), a store outside the inner guard, a
    macro block size that is not the launch's, a temporary read one element on, a temporary that narrows a 64-bit
    subscript (by its cast, or by the indexes' width), a value temporary of another type, a temporary that hides a
    count, a value changed on its way, 64-bit indexes over 64-bit counts, both indexes along x. Each refusal names
    the part that differs, and a caller collecting refusals sees it."""
    state = _naive(source)
    with refusals() as seen:
        assert transform.forward_sites(state) == []
    assert len(seen) == 1 and re.search(why, seen[0]), seen
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)
