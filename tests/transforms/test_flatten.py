"""Elementwise kernels written on a 2-D launch or as a grid-stride loop, row kernels on blocks of one thread, as a
grid-stride loop over rows or over a batch's rows on a 2-D launch, and kernels one thread of the launch runs, read as
one thread per element or row on a 1-D launch (klineage/transforms/_flatten.py): the golden flat forms, the bits the
flat kernel and the forwards' rewrites of it compute on the CPU against the kernel as written, and the kernels left
as written, each with its reason."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import Arg, ArgKind, LaunchPlan
from klineage.transforms import get, refusals
from klineage.transforms._canonical import canonical
from klineage.transforms._flatten import ELEMENTS, Shape, flattened
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, compiles_without_spills, edited

CASES = ["rows_on_y", "tiles", "grid_stride", "grid_stride_while", "one_thread_blocks", "first_thread_rows",
         "grid_stride_rows", "one_thread", "first_thread_of_grid", "batch_rows"]
LONE = ("one_thread", "first_thread_of_grid")  # one thread of the whole launch works: read as one row
# (rows, cols): a ragged row, rows of whole packs, a tail in every row; the grid-stride loops read n = rows * cols,
# and their grid of 128 threads strides over the larger ones
SHAPES = [(3, 5), (4, 64), (7, 130)]
# the grid-stride loop over rows, its grid one warp: no stride, one and two more, rows short of a warp and past it
ROW_SHAPES = [(3, 5), (40, 33), (70, 64)]
ROWS = frozenset({Shape.GRID_STRIDE_ROWS})  # what the warp reductions ask to read besides blocks of one thread
LONE_ROW = frozenset({Shape.ONE_THREAD})  # ... and a kernel one thread runs
BATCH_ROWS = frozenset({Shape.MATRIX_ROWS})  # ... and a batch's rows on a 2-D launch
BATCH = 3  # the matrices of the batch_rows case


def _state(case: str, which: str) -> KernelState:
    folder = HERE / "flatten" / case
    return KernelState(source=(folder / f"{which}.cu").read_text(),
                       plan=LaunchPlan.from_toml((folder / f"{which}.toml").read_text()))


@pytest.mark.parametrize("case", CASES)
def test_golden_flat_forms(case):
    shapes = ROWS if case == "grid_stride_rows" else LONE_ROW if case in LONE else BATCH_ROWS if \
        case == "batch_rows" else ELEMENTS
    flat = flattened(canonical(_state(case, "written")), shapes)
    assert flat.source == _state(case, "flat").source
    assert flat.plan == _state(case, "flat").plan
    assert flattened(flat, shapes) == flat  # a 1-D kernel is left as it is


def test_the_elementwise_forwards_do_not_read_a_grid_stride_loop_over_rows():
    """Its work loops: no element's work. The default reading leaves it as written, with the reason."""
    written = canonical(_state("grid_stride_rows", "written"))
    with refusals() as refused:
        assert flattened(written) == written
    assert any("loops, synchronizes, jumps or names the grid or a thread (`for`)" in line for line in refused)


@pytest.mark.parametrize("case", CASES)
def test_the_flat_kernels_compile(case, cache):
    compiles_without_spills(_state(case, "flat"), cache)


def _inputs(case: str, rows: int, cols: int) -> tuple[dict, dict, dict]:
    generator = torch.Generator().manual_seed(rows * 1000 + cols)
    x = torch.randn(rows * cols, generator=generator) * 8
    if case == "grid_stride_rows":  # a row's largest element and sum: integers, which any order sums exactly
        return {"rows": rows, "cols": cols}, {"x": x.round()}, {"y": (torch.float32, 2 * rows)}
    if case == "batch_rows":  # the same, of every row of BATCH matrices
        x = torch.randn(BATCH * rows * cols, generator=generator) * 8
        return {"batch": BATCH, "rows": rows, "cols": cols}, {"x": x.round()}, {"y": (torch.float32, 2 * BATCH * rows)}
    if case in LONE:  # the sum (and the largest) of every element: integers again
        return {"rows": rows, "cols": cols}, {"x": x.round()}, {"y": (torch.float32, 2)}
    if case.startswith("grid_stride"):
        return {"n": rows * cols}, {"x": x}, {"y": (torch.float32, rows * cols)}
    if case in ("one_thread_blocks", "first_thread_rows"):  # a row's largest element: any order gives its bits
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows)}
    if case == "rows_on_y":
        inputs = {"x": x, "b": torch.randn(cols, generator=generator)}
    else:
        inputs = {"x": x, "scale": torch.randn(rows, generator=generator),
                  "shift": torch.randn(cols, generator=generator)}
    return {"rows": rows, "cols": cols}, inputs, {"y": (torch.float32, rows * cols)}


def _differences(tmp_path: Path, case: str, forms: dict[str, KernelState]) -> list[str]:
    """Where each of `forms` computes other bits than the kernel as written, on aligned and misaligned pointers.
    The emulator runs whole warps only: blocks of one thread are judged against their flat form instead, which runs
    each row's code as written, one thread a row."""
    if case in ("one_thread_blocks", "one_thread"):
        reference, forms = _state(case, "flat"), {name: form for name, form in forms.items() if name != "flat"}
    else:
        reference = _state(case, "written")
    shapes = ROW_SHAPES if case in ("grid_stride_rows", "batch_rows") else SHAPES
    return emulate.differences(tmp_path, reference, forms, tuple(shapes),
                               lambda rows, cols: _inputs(case, rows, cols))


FORWARDS = {  # case -> the forwards that find a site in the kernel as written
    # b at its column (row_gather), b gathered by each lane (elementwise), strided (grid_stride)
    "rows_on_y": ("scalarize_row_gather", "scalarize_elementwise", "uncoarsen_grid_stride"),
    # the element named by a local (`at = (size_t)row * cols + col`) read as the flat index: packed
    "tiles": ("scalarize_row_gather", "scalarize_elementwise", "uncoarsen_grid_stride"),
    "grid_stride": ("scalarize_elementwise",),  # a grid-stride loop is uncoarsen_grid_stride's own form
    "grid_stride_while": ("scalarize_elementwise",),  # the same loop spelled with `while`
    # `<<<rows, 1>>>`: a thread per row, then a warp per row, or the row's loop in chunks over the GPU
    "one_thread_blocks": ("serialize_reduction", "unsplit_reduction"),
    "first_thread_rows": ("serialize_reduction", "unsplit_reduction"),  # the first thread of a warp alone: the same
    "grid_stride_rows": ("serialize_reduction",),  # a thread per row on a grid covering the rows, then a warp each
    "one_thread": ("serialize_reduction", "unsplit_reduction"),  # `<<<1, 1>>>`: one row, a warp, or chunks
    "first_thread_of_grid": ("serialize_reduction", "unsplit_reduction"),  # the grid's first thread alone: the same
    "batch_rows": ("serialize_reduction",),  # a thread per row of every matrix, on one axis; then a warp each
}


@pytest.mark.parametrize("case", sampled(FORWARDS, keep=("rows_on_y", "first_thread_rows", "grid_stride_rows",
                                                         "one_thread", "batch_rows")))
def test_the_flat_kernel_and_the_forwards_on_it_compute_the_written_kernels_bits(tmp_path, case):
    """Each forward from the kernel as a user wrote it: it finds exactly these sites, and every rewrite computes
    the written kernel's bits."""
    written = _state(case, "written")
    forwards = FORWARDS[case]
    found = {name for name in ANALYSIS if get(name).forward_sites(written)}
    assert found == set(forwards)
    forms = {"flat": _state(case, "flat")}
    for name in forwards:
        if name == "unsplit_reduction":  # its chunks' partials live in scratch: emulated in its own tests
            continue
        transform = get(name)
        forms[name] = transform.forward(written, transform.forward_sites(written)[0]).state
    if case == "rows_on_y":
        assert "const float4 b4 = *reinterpret_cast<const float4*>(b + col);" in forms["scalarize_row_gather"].source
    assert _differences(tmp_path, case, forms) == []


ANALYSIS = ("scalarize_elementwise", "scalarize_half_packs", "scalarize_row_gather", "uncoarsen_grid_stride",
            "serialize_reduction", "unsplit_reduction", "untile_transpose", "untile_matmul")


@pytest.mark.parametrize("element", sampled(["(size_t)row * cols + col", "(long long)row * cols + col",
                                             "static_cast<size_t>(row) * cols + col", "col + (int64_t)row * cols"],
                                            keep=["(size_t)row * cols + col", "static_cast<size_t>(row) * cols + col"]))
def test_an_element_offset_formed_in_64_bits_is_the_flat_index(tmp_path, element):
    """A 2-D kernel whose author forms `row * cols + col` in 64 bits (a cast on the row) is flattened onto a 64-bit
    index with every such subscript the index itself, so the elementwise forwards pack it; on the CPU the packed
    kernel computes the written kernel's bits."""
    written = _state("rows_on_y", "written")
    written = KernelState(source=written.source.replace("row * cols + col", element), plan=written.plan)
    flat = flattened(canonical(written))
    assert "long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;" in flat.source
    assert "float v = x[i] + b[col];" in flat.source and "y[i] = " in flat.source
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(written)
    packed = transform.forward(written, site).state
    assert "*reinterpret_cast<float4*>(y + i)" in packed.source
    assert emulate.differences(tmp_path, _state("rows_on_y", "written"), {"packed": packed}, ((4, 64), (7, 130)),
                               lambda rows, cols: _inputs("rows_on_y", rows, cols)) == []


@pytest.mark.parametrize("indexes, guard", [
    ("size_t col = (size_t)blockIdx.x * blockDim.x + threadIdx.x;\n    size_t row = blockIdx.y;", "col < (size_t)cols"),
    ("long long col = threadIdx.x + (long long)blockIdx.x * blockDim.x;\n    long long row = blockIdx.y;",
     "col < cols"),
])
def test_64_bit_indexes_and_a_cast_bound_are_the_flat_64_bit_index(tmp_path, indexes, guard):
    """The column and row declared 64-bit and the guard's count cast to their width: flattened onto a 64-bit index,
    packed by the elementwise forward, the written kernel's bits on the CPU."""
    written = _state("rows_on_y", "written")
    spelled = written.source.replace("int col = threadIdx.x + blockIdx.x * blockDim.x;\n    int row = blockIdx.y;",
                                     indexes).replace("if (col < cols)", f"if ({guard})")
    assert spelled.count(guard) == 1 and indexes in spelled
    spelled = KernelState(source=spelled, plan=written.plan)
    assert "long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;" in flattened(canonical(spelled)).source
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(spelled)
    packed = transform.forward(spelled, site).state
    assert emulate.differences(tmp_path, written, {"packed": packed}, ((4, 64), (7, 130)),
                               lambda rows, cols: _inputs("rows_on_y", rows, cols)) == []


ROW_LOCALS = ("int col = threadIdx.x + blockIdx.x * blockDim.x;\n    int row = blockIdx.y;",
              "int col = threadIdx.x + blockIdx.x * blockDim.x;\n    float bias = b[col % cols];\n"
              "    int row = blockIdx.y;\n    const int base = row * cols;")


@pytest.mark.parametrize("returning", [False, True])
def test_locals_a_2d_kernel_declares_before_its_guard_move_inside_it(tmp_path, returning):
    """`int h = bh % H;` and kin between (or among) the indexes and the guard: read inside the guard, where the
    threads the guard keeps compute them as before, then flattened and packed; the written kernel's bits on the
    CPU (a local read from memory, one naming the row, declared between the indexes)."""
    written = _state("rows_on_y", "written")
    source = written.source.replace(ROW_LOCALS[0], ROW_LOCALS[1]).replace(
        "float v = x[row * cols + col] + b[col];", "float v = x[base + col] + bias;")
    if returning:
        source = source.replace("    if (col < cols) {\n", "    if (col >= cols) return;\n").replace(
            "v : 0.0f;\n    }\n", "v : 0.0f;\n")
    spelled = KernelState(source=source, plan=written.plan)
    flat = flattened(canonical(spelled))
    assert "int i = blockIdx.x * blockDim.x + threadIdx.x;" in flat.source and "const int base = row * cols;" in \
        flat.source.split("if (i < rows * cols) {")[1]
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(spelled)
    packed = transform.forward(spelled, site).state
    assert emulate.differences(tmp_path, spelled, {"packed": packed}, ((4, 64), (7, 130)),
                               lambda rows, cols: _inputs("rows_on_y", rows, cols)) == []


@pytest.mark.parametrize("local", [
    "    const int limit = cols;\n",  # the guard names it: it must be there before the guard
    "    float seen = atomicAdd(y, 0.0f);\n",  # an effect every thread made, the guard's or not
])
def test_locals_before_the_guard_stay_where_moving_them_would_tell(local):
    written = _state("rows_on_y", "written")
    source = written.source.replace("    if (col < cols) {", local + "    if (col < cols) {")
    if "limit" in local:
        source = source.replace("if (col < cols)", "if (col < limit)")
    spelled = KernelState(source=source, plan=written.plan)
    assert flattened(canonical(spelled)) == canonical(spelled)


def test_the_emulation_sees_a_column_split_the_wrong_way(tmp_path):
    """The check can fail: a flat form whose column is one off adds another column's bias."""
    flat = _state("rows_on_y", "flat")
    wrong = flat.source.replace("int col = i % cols;", "int col = (i + 1) % cols;")
    assert wrong != flat.source
    assert _differences(tmp_path, "rows_on_y", {"wrong": KernelState(source=wrong, plan=flat.plan)})


ARGS = '"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }'
HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n"
ROWS_ON_Y = "    int col = blockIdx.x * blockDim.x + threadIdx.x;\n    int row = blockIdx.y;\n"


def _plan(grid: str = '"cdiv(cols, 256)", "rows"', block: str = "256") -> LaunchPlan:
    return LaunchPlan.from_toml(f'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = [{grid}]\n'
                                f"block = [{block}]\nargs = [{ARGS}]\n")


@pytest.mark.parametrize("body, plan, why", [
    (ROWS_ON_Y + "    if (col < cols) for (int k = 0; k < 2; ++k) y[row * cols + col] += x[k];\n", _plan(),
     "loops, synchronizes"),
    (ROWS_ON_Y + "    if (col < cols) y[row * cols + col] = x[row * cols + col];\n", _plan(block="256, 4"),
     "on a block more than one row high"),
    (ROWS_ON_Y + "    if (col < cols) { row = row + 1; y[row * cols + col] = x[col]; }\n", _plan(),
     "changes its row or column"),
    (ROWS_ON_Y + "    if (col < cols) y[row * cols + col] = x[row * cols + col] * threadIdx.y;\n", _plan(),
     "names a thread coordinate"),
    ("    int col = blockIdx.x * blockDim.x + threadIdx.x;\n    int row = blockIdx.y * blockDim.y + threadIdx.y;\n"
     "    if (row < rows || col < cols) y[row * cols + col] = x[row * cols + col];\n",
     _plan('"cdiv(cols, 16)", "cdiv(rows, 16)"', "16, 16"), r"guard is not `row < M && col < N`"),
])
def test_left_as_written_with_the_reason(body, plan, why):
    state = KernelState(source=HEAD + body + "}\n", plan=plan)
    with refusals() as refused:
        assert flattened(canonical(state)) == canonical(state)
    assert any(why in line for line in refused), refused


def test_a_row_count_only_the_grid_carried_becomes_a_parameter(tmp_path):
    """Rows from blockIdx.y on a grid `rows` blocks down, a count the kernel never takes (nothing bounds y): the flat
    form's bound needs it, so the kernel takes a last parameter `int grid_y` that the plan passes as the grid's y
    extent. The forwards pack it as any flat kernel, and on the CPU the packed kernel computes the written one's
    bits, on aligned and misaligned pointers."""
    written = KernelState(
        source="__global__ void kernel(const float* x, float* y, int cols) {\n" + ROWS_ON_Y
        + "    if (col < cols) y[row * cols + col] = 2.0f * x[row * cols + col];\n}\n",
        plan=LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\n'
                                  'grid = ["cdiv(cols, 256)", "rows"]\nblock = [256]\n'
                                  'args = ["x", "y", { scalar = "cols", type = "i32" }]\n'))
    flat = flattened(canonical(written))
    assert "int cols, int grid_y) {" in flat.source and "if (i < grid_y * cols) {" in flat.source
    (launch,) = flat.plan.launches
    assert launch.args[-1] == Arg(ArgKind.SCALAR, value="rows", type="i32")
    assert launch.grid == ("cdiv(rows * cols, 256)", 1, 1)
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(written)
    packed = transform.forward(written, site).state
    assert "*reinterpret_cast<float4*>(y + i)" in packed.source

    def inputs(rows: int, cols: int) -> tuple[dict, dict, dict]:
        x = torch.randn(rows * cols, generator=torch.Generator().manual_seed(rows * 1000 + cols))
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows * cols)}

    assert emulate.differences(tmp_path, written, {"packed": packed}, ((4, 64), (7, 130)), inputs) == []


def test_a_batch_on_grid_z_is_read_flat_too(tmp_path):
    """A batch's rows on grid z (`int b = blockIdx.z;`, a grid one block high), its count only the grid's: read flat
    with `int grid_z` given, packed, and on the CPU the packed kernel computes the written one's bits. Grid y of
    more than one block would run each element that many times: left as written."""
    source = ("__global__ void kernel(const float* x, float* y, float lo, float hi, int n) {\n"
              "    int b = blockIdx.z;\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "    if (i < n) y[b * n + i] = fminf(fmaxf(x[b * n + i], lo), hi);\n}\n")

    def plan(grid_y: str) -> LaunchPlan:
        return LaunchPlan.from_toml(
            f'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(n, 256)", "{grid_y}", "B"]\n'
            'block = [256]\nargs = ["x", "y", { scalar = "lo", type = "f32" }, { scalar = "hi", type = "f32" }, '
            '{ scalar = "n", type = "i32" }]\n')

    written = KernelState(source=source, plan=plan("1"))
    flat = flattened(canonical(written))
    assert "int n, int grid_z) {" in flat.source and flat.plan.launches[0].grid == ("cdiv(B * n, 256)", 1, 1)
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(written)
    packed = transform.forward(written, site).state

    def inputs(batch: int, n: int) -> tuple[dict, dict, dict]:
        x = torch.randn(batch * n, generator=torch.Generator().manual_seed(batch * 1000 + n)) * 4
        return {"B": batch, "n": n, "lo": -1.0, "hi": 2.0}, {"x": x}, {"y": (torch.float32, batch * n)}

    assert emulate.differences(tmp_path, written, {"packed": packed}, ((3, 64), (2, 130)), inputs) == []
    high = KernelState(source=source, plan=plan("2"))
    with refusals() as refused:
        assert flattened(canonical(high)) == canonical(high)
    assert any("on a grid more than one block high" in line for line in refused), refused


def test_blocks_of_one_thread_on_a_grid_the_kernel_never_takes_count_rows_by_it():
    """`<<<rows + 1, 1>>>` with no parameter passed that many: the kernel takes the grid's extent, `int grid_x`,
    and its flat form runs rows + 1 rows as the written one did."""
    state = KernelState(source=ROW_HEAD + "    y[row] = x[row];\n}\n", plan=_row_plan(grid="rows + 1"))
    flat = flattened(canonical(state))
    assert "int rows, int grid_x) {" in flat.source and "if (row < grid_x) {" in flat.source
    assert flat.plan.launches[0].args[-1] == Arg(ArgKind.SCALAR, value="rows + 1", type="i32")
    assert flat.plan.launches[0].grid[0] == "cdiv((rows + 1), 256)"


def test_a_naive_transpose_stays_2d_for_its_tiling_forward():
    """A transpose writes y at the transposed place: the elementwise forwards refuse its flat form, and
    untile_transpose still finds the 2-D kernel it tiles."""
    naive = HERE / "untile_transpose" / "float" / "after.cu"
    state = KernelState(source=naive.read_text(), plan=LaunchPlan.from_toml(naive.with_suffix(".toml").read_text()))
    assert get("untile_transpose").forward_sites(state)
    assert get("scalarize_elementwise").forward_sites(state) == []
    assert get("scalarize_row_gather").forward_sites(state) == []


STRIDE_PLAN = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["264"]\n'
                                   'block = [256]\nargs = ["x", "y", { scalar = "n", type = "i32" }]\n')
STRIDE_HEAD = "__global__ void kernel(const float* x, float* y, int n) {\n"
LOOP = "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)"


@pytest.mark.parametrize("body, why", [
    (LOOP + " y[i] = x[i] * gridDim.x;\n", "names the grid or a thread"),
    (LOOP.replace("+= blockDim", "+= 2 * blockDim") + " y[i] = x[i];\n", "is not `i < n; i += blockDim.x * gridDim.x`"),
    (LOOP + " { y[i] = x[i]; i += 1; }\n", "changes its element index 'i'"),
    (LOOP + " { if (x[i] < 0.0f) continue; y[i] = x[i]; }\n", "jumps or names the grid"),  # `if` holds no loop
    ("    float s = 0.0f;\n" + LOOP + " s += x[i];\n    y[0] = s;\n", "is not one grid-stride loop over elements"),
    (LOOP.replace("i < n", "i < n - 1") + " y[i] = x[i];\n", "is not `i < n"),
    ("    int step = blockDim.x * gridDim.x;\n" + LOOP.replace("blockDim.x * gridDim.x", "step") +
     " y[i] = x[i] * step;\n", "uses its stride 'step'"),
    ("    float t = 2.0f;\n" + LOOP + " y[i] = x[i] * t;\n", "does more than declare its stride"),
])
def test_a_grid_stride_loop_left_as_written_with_the_reason(body, why):
    state = KernelState(source=STRIDE_HEAD + body + "}\n", plan=STRIDE_PLAN)
    with refusals() as refused:
        assert flattened(canonical(state)) == canonical(state)
    assert any(why in line for line in refused), refused


INDEX = "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
STEP = "        i += blockDim.x * gridDim.x;\n"


def _while(work: str, step: str = STEP, after: str = "") -> str:
    return INDEX + "    while (i < n) {\n" + work + step + "    }\n" + after


@pytest.mark.parametrize("body, why", [
    (_while("        y[i] = x[i];\n", STEP.replace("blockDim.x * ", "")), "is not `i < n; i += blockDim.x"),
    (_while("        y[i] = x[i];\n", after="    y[0] = i;\n"), "is not one grid-stride loop over elements"),
    (_while("        if (x[i] < 0.0f) continue;\n        y[i] = x[i];\n"), "jumps or names the grid or a thread"),
    (_while("        float v = x[i];\n" + STEP + "        y[i] = v;\n", ""), "is not `i < n; i += blockDim.x"),
    (_while("        y[i] = x[i];\n        i += 1;\n"), "changes its element index 'i'"),
    (INDEX + "    i += 1;\n" + _while("        y[i] = x[i];\n").removeprefix(INDEX), "changes its index 'i' before"),
    # the step joined to the work by a comma: its statements run in order (`_c_style`), the step first
    (_while("", "        i += blockDim.x * gridDim.x, y[i] = x[i];\n"), "its step is not the grid's extent"),
])
def test_a_grid_stride_while_loop_left_as_written_with_the_reason(body, why):
    """The `while` spelling is the `for` loop only where the grid's width steps the index once, last; the attacks: a
    step by the block count; the index read after the loop; a `continue` past the step; the step before the work's
    last statement; a second write; a write before the loop; the step joined before the work by a comma."""
    state = KernelState(source=STRIDE_HEAD + body + "}\n", plan=STRIDE_PLAN)
    with refusals() as refused:
        assert flattened(canonical(state)) == canonical(state)
    assert any(why in line for line in refused), refused
    assert get("scalarize_elementwise").forward_sites(state) == []


@pytest.mark.parametrize("loop, index", [
    ("for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)n; "
     "i += (size_t)blockDim.x * gridDim.x)", "long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"),
    ("for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; "
     "i += static_cast<int64_t>(blockDim.x) * gridDim.x)",
     "long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"),
    ("for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < static_cast<int>(n); i += blockDim.x * gridDim.x)",
     "int i = blockIdx.x * blockDim.x + threadIdx.x;"),
])
def test_a_grid_stride_loop_with_casts_on_its_grid_or_count_is_one_thread_per_element(loop, index):
    state = KernelState(source="#include <cstdint>\n" + STRIDE_HEAD + f"    {loop} y[i] = 2.0f * x[i];\n}}\n",
                        plan=STRIDE_PLAN)
    flat = flattened(canonical(state))
    assert f"{index}\n    if (i < n) y[i] = 2.0f * x[i];" in flat.source
    assert flat.plan.launches[0].grid[0] == "cdiv(n, 256)"
    assert len(get("scalarize_elementwise").forward_sites(state)) == 1


def test_a_cast_product_bound_is_left_as_written():
    """`(size_t)rows * cols` is a 64-bit product: read as `rows * cols` it would wrap at 2^31 where it did not."""
    state = KernelState(source=STRIDE_HEAD.replace("int n", "int rows, int cols") +
                        "    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)rows * cols; "
                        "i += blockDim.x * gridDim.x) y[i] = x[i];\n}\n", plan=STRIDE_PLAN)
    assert flattened(canonical(state)) == canonical(state)


def _row_plan(grid: str = "rows", block: int = 1) -> LaunchPlan:
    return LaunchPlan.from_toml(f'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["{grid}"]\n'
                                f'block = [{block}]\nargs = ["x", "y", {{ scalar = "rows", type = "i32" }}]\n')


ROW_HEAD = "__global__ void kernel(const float* x, float* y, int rows) {\n    int row = blockIdx.x;\n"


WIDE_BLOCK = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["rows"]\n'
                                  'block = [32, 2]\nargs = ["x", "y", { scalar = "rows", type = "i32" }]\n')


@pytest.mark.parametrize("body, plan, why", [
    ("    y[row] = x[row] * threadIdx.x;\n", _row_plan(), "names a thread or block coordinate"),
    # wider blocks whose first thread alone works, attacked: a barrier the others never reach, another thread
    # working, the others working in an else or after the first's block, a second row of threads (threadIdx.y)
    ("    if (threadIdx.x != 0) return;\n    __syncthreads();\n    y[row] = x[row];\n", _row_plan(block=32),
     "(`__syncthreads`)"),
    ("    if (threadIdx.x != 1) return;\n    y[row] = x[row];\n", _row_plan(block=32),
     "blocks of more than one thread"),
    ("    if (threadIdx.x == 0) {\n        y[row] = x[row];\n    } else {\n        y[row] = 0.0f;\n    }\n",
     _row_plan(block=32), "blocks of more than one thread"),
    ("    if (threadIdx.x == 0) {\n        y[row] = x[row];\n    }\n    y[row] += 1.0f;\n", _row_plan(block=32),
     "blocks of more than one thread"),
    ("    if (threadIdx.x != 0) return;\n    y[row] = x[row];\n", WIDE_BLOCK, "more than 1 dimension(s)"),
    ("    __shared__ float s[1];\n    s[0] = x[row];\n    y[row] = s[0];\n", _row_plan(), "`__shared__`"),
    ("    row += 1;\n    y[row] = x[row];\n", _row_plan(), "changes its row 'row'"),
    ("    y[row] = x[row];\n", _row_plan(block=32), "blocks of more than one thread"),
    # the first thread's guard bounding the row by another count than the grid's, or letting others through
    ("    if (threadIdx.x == 0 && row < rows - 1) {\n        y[row] = x[row];\n    }\n", _row_plan(block=32),
     "blocks of more than one thread"),
    ("    if (threadIdx.x != 0 || row >= 7) return;\n    y[row] = x[row];\n", _row_plan(block=32),
     "bounds its row by '7', not by the grid's extent 'rows'"),
    ("    if (threadIdx.x != 0 && row >= rows) return;\n    y[row] = x[row];\n", _row_plan(block=32),
     "blocks of more than one thread"),
    ("    if (threadIdx.x == 0 || row < rows) {\n        y[row] = x[row];\n    }\n", _row_plan(block=32),
     "blocks of more than one thread"),
])
def test_blocks_of_one_thread_left_as_written_with_the_reason(body, plan, why):
    state = KernelState(source=ROW_HEAD + body + "}\n", plan=plan)
    with refusals() as refused:
        assert flattened(canonical(state)) == canonical(state)
    assert any(why in line for line in refused), refused


def _lone_plan(grid: str = "1", block: str = "1") -> LaunchPlan:
    return LaunchPlan.from_toml(f'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = [{grid}]\n'
                                f'block = [{block}]\nargs = ["x", "y", {{ scalar = "n", type = "i32" }}]\n')


LONE_HEAD = "__global__ void kernel(const float* x, float* y, int n) {\n"
LONE_SUM = "float s = 0.0f;\n        for (int j = 0; j < n; ++j) s += x[j];\n        y[0] = s;\n"
FIRST = "    if (threadIdx.x == 0 && blockIdx.x == 0) {\n        "
INDEX_ZERO = "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i == 0) {\n        "
LONE_FLAT = "    " + LONE_SUM.replace("        ", "    ")  # the sum at the kernel's top level
OTHERS_RETURN = "    if (threadIdx.x != 0 || blockIdx.x != 0) return;\n"


@pytest.mark.parametrize("body, plan, why", [
    # no coordinate at all: every thread of a larger launch runs the whole work (each block's thread, each lane)
    ("    " + LONE_SUM.replace("        ", "    "), _lone_plan(grid='"rows"'), "launched on more than one thread"),
    ("    " + LONE_SUM.replace("        ", "    "), _lone_plan(block="32"), "launched on more than one thread"),
    # the first thread of the grid, attacked: a second row of threads that passes the guard too, a barrier only it
    # reaches, another thread's coordinate in the work, a moved index, the others working after the guard
    (FIRST + LONE_SUM + "    }\n", _lone_plan(grid='"4"', block="32, 2"), "more than 1 dimension(s)"),
    (FIRST + "__syncthreads();\n        " + LONE_SUM + "    }\n", _lone_plan(grid='"4"', block="64"),
     "(`__syncthreads`)"),
    (FIRST + LONE_SUM.replace("y[0]", "y[threadIdx.x]") + "    }\n", _lone_plan(grid='"4"', block="64"),
     "(`threadIdx`)"),
    (INDEX_ZERO + "i += 1;\n        " + LONE_SUM + "    }\n", _lone_plan(grid='"4"', block="64"),
     "changes its index 'i'"),
])
def test_a_kernel_one_thread_runs_left_as_written_with_the_reason(body, plan, why):
    state = KernelState(source=LONE_HEAD + body + "}\n", plan=plan)
    with refusals() as refused:
        assert flattened(canonical(state), LONE_ROW) == canonical(state)
    assert any(why in line for line in refused), refused


@pytest.mark.parametrize("body", [
    "    if (threadIdx.x == 0) {\n        " + LONE_SUM + "    }\n",  # the first thread of every block
    "    if (threadIdx.x == 0 || blockIdx.x == 0) {\n        " + LONE_SUM + "    }\n",
    INDEX_ZERO.replace("i == 0", "i == 1") + LONE_SUM + "    }\n",  # one thread, but not the first: no row 0
    FIRST + LONE_SUM + "    } else {\n        y[1] = 0.0f;\n    }\n",  # the others work too
    FIRST + LONE_SUM + "    }\n    y[1] = 0.0f;\n",
    # returns that let other threads through: thread 0 of every block, any thread of block 0, thread 1 of block 1
    "    if (threadIdx.x != 0) return;\n" + LONE_FLAT,
    OTHERS_RETURN.replace("||", "&&") + LONE_FLAT,
    OTHERS_RETURN.replace("threadIdx.x != 0 ||", "threadIdx.x != 1 ||") + LONE_FLAT,
])
def test_a_guard_that_lets_more_than_the_grids_first_thread_work_is_no_lone_thread(body):
    state = KernelState(source=LONE_HEAD + body + "}\n", plan=_lone_plan(grid='"4"', block="64"))
    assert flattened(canonical(state), LONE_ROW) == canonical(state)


@pytest.mark.parametrize("body", [
    FIRST + LONE_SUM + "    }\n",
    FIRST.replace("threadIdx.x == 0 && blockIdx.x == 0", "blockIdx.x == 0 && threadIdx.x == 0") + LONE_SUM + "    }\n",
    FIRST.replace("threadIdx.x == 0 && blockIdx.x == 0", "!threadIdx.x && 0 == blockIdx.x") + LONE_SUM + "    }\n",
    # the others return first
    OTHERS_RETURN + LONE_FLAT,
    OTHERS_RETURN.replace("threadIdx.x != 0 || blockIdx.x != 0", "blockIdx.x > 0 || threadIdx.x") + LONE_FLAT,
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i > 0) return;\n" + LONE_FLAT,
])
def test_the_first_thread_of_the_grid_is_read_as_one_row_whichever_way_its_guard_is_spelled(body):
    state = KernelState(source=LONE_HEAD + body + "}\n", plan=_lone_plan(grid='"cdiv(n, 256)"', block="256"))
    flat = flattened(canonical(state), LONE_ROW)
    assert re.search(r"int (row|i) = blockIdx\.x \* blockDim\.x \+ threadIdx\.x;\n    if \(\1 < 1\) \{", flat.source)
    assert [(launch.grid, launch.block) for launch in flat.plan.launches] == [((1, 1, 1), (32, 1, 1))]


ROW_LOOP = "    for (int row = blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += blockDim.x * gridDim.x) {\n"
ROW_WORK = "        float s = 0.0f;\n        for (int j = 0; j < cols; ++j) s += x[row * cols + j];\n"


def _rows(body: str, after: str = "") -> KernelState:
    """A grid-stride loop over rows on a grid of a fixed size."""
    return KernelState(source=HEAD + body + after + "}\n", plan=_plan('"80"', "128"))


@pytest.mark.parametrize("state, why", [
    (_rows(ROW_LOOP + ROW_WORK + "        row += 1;\n        y[row] = s;\n    }\n"), "changes its element index 'row'"),
    (_rows(ROW_LOOP.replace("blockDim.x * gridDim.x", "gridDim.x") + ROW_WORK + "        y[row] = s;\n    }\n"),
     "is not `row < n; row += blockDim.x * gridDim.x`"),
    (_rows(ROW_LOOP.replace("blockDim.x * gridDim.x", "32 * gridDim.x") + ROW_WORK + "        y[row] = s;\n    }\n"),
     "is not `row < n; row += blockDim.x * gridDim.x`"),
    (_rows(ROW_LOOP + ROW_WORK + "        y[row] = s;\n    }\n", after="    y[0] = 0.0f;\n"),
     "is not one grid-stride loop"),
    (_rows(ROW_LOOP + ROW_WORK + "        if (s < 0.0f) return;\n        y[row] = s;\n    }\n"), "(`return`)"),
    (_rows(ROW_LOOP + ROW_WORK + "        if (s < 0.0f) break;\n        y[row] = s;\n    }\n"), "(`break`)"),
    (_rows(ROW_LOOP + ROW_WORK + "        if (s < 0.0f) continue;\n        y[row] = s;\n    }\n"), "(`continue`)"),
    (_rows(ROW_LOOP + ROW_WORK + "        y[row] = s * threadIdx.x;\n    }\n"), "(`threadIdx`)"),
    (_rows(ROW_LOOP + ROW_WORK + "        __syncthreads();\n        y[row] = s;\n    }\n"), "(`__syncthreads`)"),
    (_rows(ROW_LOOP + ROW_WORK + "        y[row] = s + gridDim.x;\n    }\n"), "(`gridDim`)"),
])
def test_a_grid_stride_loop_over_rows_left_as_written_with_the_reason(state, why):
    """The attacks: the row written in the body; a stride of a thread a block, or of a warp a block (not the grid);
    work after the loop; a jump that would end the thread's later rows (`return`, `break`) or skip the rest of a
    row (`continue`); a thread coordinate, a barrier or the grid in the row's work."""
    with refusals() as refused:
        assert flattened(canonical(state), ROWS) == canonical(state)
    assert any(why in line for line in refused), refused
    assert get("serialize_reduction").forward_sites(state) == []


def test_a_batch_on_grid_x_beside_columns_along_y_is_read_flat(tmp_path):
    """The axes swapped (`int b = blockIdx.x;`, the column `threadIdx.x + blockIdx.y * blockDim.x`; B blocks along
    x): each (b, column) is still one thread, so the flat form and the forwards on it give the written kernel's
    bits. The column's blocks along x instead (`blockIdx.x * blockDim.x + threadIdx.x` beside `blockIdx.x`) tell no
    row apart: left as written."""
    source = ("__global__ void kernel(const float* x, float* y, float lo, float hi, int B, int n) {\n"
              "    int b = blockIdx.x;\n    int i = threadIdx.x + blockIdx.y * blockDim.x;\n"
              "    if (i < n) y[b * n + i] = fminf(fmaxf(x[b * n + i], lo), hi);\n}\n")
    plan = LaunchPlan.from_toml(
        'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["B", "cdiv(n, 256)"]\nblock = [256]\n'
        'args = ["x", "y", { scalar = "lo", type = "f32" }, { scalar = "hi", type = "f32" }, '
        '{ scalar = "B", type = "i32" }, { scalar = "n", type = "i32" }]\n')
    written = KernelState(source=source, plan=plan)
    flat = flattened(canonical(written))
    assert flat.plan.launches[0].grid == ("cdiv(B * n, 256)", 1, 1), flat.plan
    assert "if (idx < B * n) {" in flat.source and "int b = idx / n;" in flat.source, flat.source
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(written)
    packed = transform.forward(written, site).state

    def inputs(batch: int, n: int) -> tuple[dict, dict, dict]:
        x = torch.randn(batch * n, generator=torch.Generator().manual_seed(batch * 1000 + n)) * 4
        return {"B": batch, "n": n, "lo": -1.0, "hi": 2.0}, {"x": x}, {"y": (torch.float32, batch * n)}

    assert emulate.differences(tmp_path, written, {"packed": packed}, ((3, 64), (2, 130)), inputs) == []
    along_x = KernelState(source=source.replace("threadIdx.x + blockIdx.y * blockDim.x",
                                                "blockIdx.x * blockDim.x + threadIdx.x"), plan=plan)
    with refusals() as refused:
        assert flattened(canonical(along_x)) == canonical(along_x)
    assert any("more than 1 dimension" in line for line in refused), refused


@pytest.mark.parametrize("body, plan, why", [
    (ROWS_ON_Y + "    if (col < cols) { float s = 0.0f; for (int k = 0; k < 4; ++k) s += x[k * cols + threadIdx.x];"
                 " y[row * cols + col] = s; }\n", _plan(), "names a thread coordinate (`threadIdx`)"),
    (ROWS_ON_Y + "    if (col < cols) { __shared__ float t[32]; t[0] = x[col]; y[row * cols + col] = t[0]; }\n",
     _plan(), "(`__shared__`)"),
    (ROWS_ON_Y + "    if (col < cols) { float s = 0.0f; for (int k = 0; k < 4; ++k) s += x[k];"
                 " y[row * cols + col] = s; }\n", _plan(block="256, 2"), "on a block more than one row high"),
])
def test_a_batchs_rows_left_as_written_with_the_reason(body, plan, why):
    """Read as rows (each thread's work may loop), a 2-D launch must still be one whose threads the flat index tells
    apart: no coordinate, barrier or shared memory in the work, one row of threads a block."""
    state = canonical(KernelState(source=HEAD + body + "}\n", plan=plan))
    with refusals() as refused:
        assert flattened(state, BATCH_ROWS) == state
    assert any(why in line for line in refused), refused


@pytest.mark.parametrize("guard", ["if (threadIdx.x == 0 && row < rows) {", "if (row < rows && threadIdx.x == 0) {",
                                   "if (threadIdx.x != 0 || row >= rows) return;",
                                   "if (row >= rows || 0 != threadIdx.x) return;"])
def test_a_first_thread_guard_that_bounds_the_row_by_the_grid_is_the_first_thread_alone(guard):
    """The row bound in the first thread's guard is the grid's extent, which the flat form's own guard holds."""
    work = "        y[row] = x[row];\n"
    body = f"    {guard}\n{work}    }}\n" if guard.endswith("{") else f"    {guard}\n{work}"
    written = flattened(canonical(KernelState(source=ROW_HEAD + body + "}\n", plan=_row_plan(block=32))))
    plain = flattened(canonical(KernelState(source=ROW_HEAD + "    if (threadIdx.x != 0) return;\n" + work + "}\n",
                                            plan=_row_plan(block=32))))
    assert written == plain and "blockIdx.x * blockDim.x + threadIdx.x" in written.source


@pytest.mark.parametrize("guard", ["row < rows && col < cols", "col < cols && row < rows"])
def test_a_row_bound_by_the_grids_own_extent_is_the_column_guard(guard):
    """`row = blockIdx.y` on a grid `rows` blocks high bounded again (`row < rows`, an embedding's `t < tokens`) is
    true for every block: the kernel flattens as the column guard alone does. A bound by another count stays
    refused, with the reason."""
    written = _state("rows_on_y", "written")
    spelled = KernelState(source=written.source.replace("if (col < cols)", f"if ({guard})"), plan=written.plan)
    assert flattened(canonical(spelled)) == flattened(canonical(written))
    other = KernelState(source=written.source.replace("if (col < cols)", "if (row < cols && col < cols)"),
                        plan=written.plan)
    with refusals() as refused:
        assert flattened(canonical(other)) == canonical(other)
    assert any("bounds row by cols, not by the grid's y extent rows" in line for line in refused), refused


@pytest.mark.parametrize("element", ["b * (T * D) + i", "(size_t)b * T * D + i", "i + D * T * b"])
def test_a_batchs_elements_bounded_by_a_product_of_counts_are_read_flat(tmp_path, element):
    """A per-batch scale with the batch on grid y and its elements bounded by `T * D`: the element `b * (T * D) + i`
    however grouped, ordered or widened is the flat index, the bound grouped, and on the CPU the packed kernel gives
    the written one's bits (batches whose element count 4 divides and does not)."""
    source = ("__global__ void kernel(const float* x, const float* s, float* y, int T, int D) {\n"
              "    int b = blockIdx.y;\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
              f"    if (i >= T * D) return;\n    y[{element}] = x[{element}] * s[b];\n}}\n")
    plan = LaunchPlan.from_toml(
        'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(T * D, 256)", "B"]\nblock = [256]\n'
        'args = ["x", "s", "y", { scalar = "T", type = "i32" }, { scalar = "D", type = "i32" }]\n')
    written = KernelState(source=source, plan=plan)
    flat = flattened(canonical(written))
    assert "int b = idx / (T * D);" in flat.source and "y[idx] = x[idx] * s[b];" in flat.source, flat.source
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(written)
    packed = transform.forward(written, site).state

    def inputs(batch: int, t: int, d: int) -> tuple[dict, dict, dict]:
        g = torch.Generator().manual_seed(batch * 100 + t * d)
        return ({"B": batch, "T": t, "D": d}, {"x": torch.randn(batch * t * d, generator=g),
                                                "s": torch.randn(batch, generator=g)},
                {"y": (torch.float32, batch * t * d)})

    assert emulate.differences(tmp_path, written, {"packed": packed}, ((3, 4, 16), (2, 5, 7)), inputs) == []


@pytest.mark.parametrize("named, site", [
    ("size_t at = (size_t)row * cols + col;", True),  # the element named once, read only as a subscript
    ("int at = col + cols * row;", True),
    ("int at = row * cols + col + 1;", False),  # another element
])
def test_a_local_naming_the_element_is_the_flat_index(tmp_path, named, site):
    """`idx = row * cols + col; y[idx] = f(x[idx])` in a 2-D kernel: the local is the flat index, so the elementwise
    forwards pack it and the packed kernel gives the written kernel's bits on the CPU; a local naming another
    element is no flat index (no site)."""
    written = _state("rows_on_y", "written")
    source = written.source.replace("        float v = x[row * cols + col] + b[col];\n        y[row * cols + col] =",
                                    f"        {named}\n        float v = x[at] + b[col];\n        y[at] =")
    assert source != written.source
    state = KernelState(source=source, plan=written.plan)
    transform = get("scalarize_elementwise")
    if not site:
        assert transform.forward_sites(state) == []
        return
    (found,) = transform.forward_sites(state)
    packed = transform.forward(state, found).state
    assert " at" not in packed.source.split("{", 1)[1]
    assert emulate.differences(tmp_path, written, {"packed": packed}, ((4, 64), (7, 130)),
                               lambda rows, cols: _inputs("rows_on_y", rows, cols)) == []


@pytest.mark.parametrize("guard, block", [("", 1), ("    if (threadIdx.x != 0) return;\n", 64)])
def test_a_row_that_is_blockidx_itself_is_named_and_read_as_a_row(tmp_path, guard, block):
    """`x[blockIdx.x * cols + j]` in a kernel of blocks of one thread, or of wider blocks whose first thread alone
    works: the row is named by a local of blockIdx.x's own type, so the row forwards read it (a warp a row) and
    the rows' maxima are the written kernel's bits."""
    written = _state("one_thread_blocks", "written")  # the same rows with the row named: its plan
    source = ("__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {\n"
              f"{guard}    float best = x[blockIdx.x * cols];\n"
              "    for (int j = 1; j < cols; ++j) best = fmaxf(best, x[blockIdx.x * cols + j]);\n"
              "    y[blockIdx.x] = best;\n}\n")
    plan = replace(written.plan, launches=tuple(replace(launch, block=(block, 1, 1))
                                                for launch in written.plan.launches))
    state = KernelState(source=source, plan=plan)
    flat = flattened(canonical(state), frozenset({Shape.ONE_THREAD_BLOCKS})).source
    assert "if (row < rows) {" in flat and "x[row * cols + j]" in flat and "blockIdx.x * cols" not in flat, flat
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(state)
    shared = transform.forward(state, site).state
    # the emulator runs whole warps: the reference is the golden's flat form of the same rows (its own test shows it
    # is the written kernel)
    assert emulate.differences(tmp_path, _state("one_thread_blocks", "flat"), {"shared": shared}, ((3, 5), (40, 70)),
                               lambda rows, cols: _inputs("one_thread_blocks", rows, cols)) == []


@pytest.mark.parametrize("source, block", [
    # every thread of a wider block works: blockIdx.x is no row of one thread
    ("    float best = x[blockIdx.x * cols];\n    y[blockIdx.x] = best;\n", 64),
    # the block size named: a coordinate of a global index, not a row
    ("    y[blockIdx.x] = x[blockIdx.x * blockDim.x];\n", 1),
])
def test_a_blockidx_that_is_no_row_of_one_thread_is_left_as_written(source, block):
    written = _state("one_thread_blocks", "written")
    plan = replace(written.plan, launches=tuple(replace(launch, block=(block, 1, 1))
                                                for launch in written.plan.launches))
    state = KernelState(source="__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, "
                               "int cols) {\n" + source + "}\n", plan=plan)
    assert "const unsigned int" not in flattened(canonical(state), frozenset({Shape.ONE_THREAD_BLOCKS})).source


NCHW = """__global__ void kernel(const float* x, const float* bias, float* y, int C, int HW) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    int c = blockIdx.y;
    int n = blockIdx.z;
    if (p < HW) {
        size_t idx = ((size_t)n * C + c) * HW + p;
        float v = x[idx] + bias[c];
        y[idx] = v > 0.0f ? v : 0.01f * v;
    }
}
"""
NCHW_PLAN = ('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(hw, 128)", "c", "n"]\n'
             'block = [128]\nargs = ["x", "bias", "y", { scalar = "c", type = "i32" }, '
             '{ scalar = "hw", type = "i32" }]\n')


def _nchw(n: int, c: int, hw: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(n * 100 + c * 10 + hw)
    inputs = {"x": torch.randn(n * c * hw, generator=g), "bias": torch.randn(c, generator=g)}
    return {"n": n, "c": c, "hw": hw}, inputs, {"y": (torch.float32, n * c * hw)}


# 64-bit indexes, the layers declared after a guard that returns, the element's terms apart
NCHW_WIDE = """__global__ void kernel(const float* x, const float* bias, float* y, int C, int HW) {
    int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= HW) return;
    int64_t c = blockIdx.y;
    int64_t n = blockIdx.z;
    int64_t idx = n * C * HW + c * HW + p;
    float v = x[idx] + bias[c];
    y[idx] = v > 0.0f ? v : 0.01f * v;
}
"""


@pytest.mark.parametrize("source", [NCHW, NCHW_WIDE], ids=["int", "int64_after_return"])
def test_an_nchw_kernel_on_a_3d_grid_is_one_thread_per_element_and_packed(tmp_path, source):
    """The channel a layer along y, the image along z (`_layers.py`): joined into one row, the element
    `((size_t)n * C + c) * HW + p` read over it, then flat and packed; the written kernel's bits on the CPU."""
    assert source.count("blockIdx") == 3
    written = KernelState(source=source, plan=LaunchPlan.from_toml(NCHW_PLAN))
    flat = flattened(canonical(written))
    assert "float v = x[i] + bias[c];" in flat.source and "c = layer % C;" in flat.source
    assert flat.plan.launches[0].grid[0] == "cdiv(((c) * (n)) * hw, 128)"
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(written)
    packed = transform.forward(written, site).state
    assert "*reinterpret_cast<float4*>(y + i) = y4;" in packed.source
    swapped = KernelState(source=flat.source.replace("c = layer % C;", "c = layer / C;"), plan=flat.plan)
    assert swapped.source != flat.source
    found = emulate.differences(tmp_path, written, {"flat": flat, "packed": packed, "swapped": swapped},
                                ((2, 3, 64), (3, 5, 7)), _nchw)
    assert found and all("swapped" in line for line in found)  # the channel split the wrong way is caught


@pytest.mark.parametrize("old, new", [
    ('block = [128]', 'block = [64, 2]'),  # threadIdx.y would move the channel
    ('"c", "n"]', '"c + 1", "n"]'),  # no parameter is the channels' count
    ("if (p < HW) {", "if (p < HW && c < C) {"),  # the guard names the channel
    ("size_t idx", "c += 0;\n        size_t idx"),  # the channel assigned
])
def test_an_nchw_kernel_is_left_as_written_where_its_layers_cannot_join(old, new):
    written = canonical(edited(NCHW, NCHW_PLAN, old, new))
    assert flattened(written) == written
