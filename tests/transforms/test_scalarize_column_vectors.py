"""scalarize_column_vectors: a thread-per-column kernel whose threads own four adjacent columns, moved row by row as
16-byte vectors (the kernel as written where cols % 4 != 0 or a pointer is misaligned), becomes the kernel whose
threads own one column; forward finds its sites by analysis."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from klineage.kernel import KernelState, load_kernel
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

NAME = "scalarize_column_vectors"
CASES = {"bias_grad": "c", "split": "c", "column_max": "col", "mean_var": "c"}
SITE = Anchor("kernel", "function", "c")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def transform():
    return get(NAME)


def golden(case: str, which: str) -> KernelState:
    return load(HERE / NAME / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden(NAME, case)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_columns_by_analysis_and_backward_only_the_vector_form(transform, case):
    assert [a.key for a in transform.forward_sites(golden(case, "after"))] == [CASES[case]]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(golden(case, "after")) == []
    assert [a.key for a in transform.find(golden(case, "before"))] == [CASES[case]]


def test_the_vector_form_runs_each_statement_per_component_and_the_header_once():
    vector = golden("split", "before").source
    assert "if (cols % 4 == 0 && (((size_t)dy | (size_t)split_sum) & 15) == 0) {" in vector
    assert "const int split_first = (int)blockIdx.y * SPLIT;" in vector.split("} else")[0]  # once, not renamed
    assert "const float4 dy4 = reinterpret_cast<const float4*>(dy + (size_t)r * cols)[c4];" in vector
    assert "sum_w += dy4.w;" in vector
    assert "reinterpret_cast<float4*>(split_sum + (size_t)blockIdx.y * cols)[c4] = make_float4(\n" in vector
    kept = golden("column_max", "before").source  # the 64-bit indices stay scalar, one a component
    assert "indices[(4 * col4 + 3)] = where_w;" in kept and "} else {\n        if (col >= cols) return;" in kept
    two = golden("mean_var", "before").source  # a read in each loop: a vector of each
    assert "const float4 x4_1 = reinterpret_cast<const float4*>(x + r * cols)[c4];" in two


def test_the_bias_grad_benchmark_is_a_site_before_and_after_its_reduction_is_split(transform):
    """The naive kernel, and the split kernel and its merge that unsplit_reduction's forward leaves: each a site,
    each forwarded and scalarized back to its bytes, the plan unchanged."""
    naive = load_kernel(ROOT / "bench" / "transfer" / "bias_grad" / "naive")
    assert [(a.function, a.key) for a in transform.forward_sites(naive)] == [("bias_grad", "c")]
    vector = transform.forward(naive, transform.forward_sites(naive)[0]).state
    assert vector.plan == naive.plan and transform.backward(vector, transform.find(vector)[0]).state == naive
    unsplit = get("unsplit_reduction")
    split = unsplit.forward(naive, unsplit.forward_sites(naive)[0]).state
    sites = transform.forward_sites(split)
    assert [(a.function, a.key) for a in sites] == [("bias_grad", "c"), ("bias_grad_merge", "c")]
    state = split
    for site in sites:
        state = transform.forward(state, site).state
    assert [(a.function, a.key) for a in transform.find(state)] == [("bias_grad", "c"), ("bias_grad_merge", "c")]
    assert "make_float4(sum_x, sum_y, sum_z, sum_w)" in state.source and "split_sum4.w" in state.source
    for site in transform.find(state):
        state = transform.backward(state, site).state
    assert state == split


def test_the_column_max_corpus_kernel_is_a_site_in_its_canonical_spelling(transform):
    """`const int col = blockIdx.x * THREADS + threadIdx.x` (THREADS the block) read as the global index."""
    naive = load_kernel(ROOT / "corpus" / "kernels" / "column_max" / "naive")
    sites = transform.forward_sites(naive)
    assert [(a.function, a.key) for a in sites] == [("column_max_naive", "col")]
    vector = transform.forward(naive, sites[0]).state
    assert "reinterpret_cast<float4*>(values)[col4] = make_float4(best_x, best_y, best_z, best_w);" in vector.source
    back = transform.backward(vector, transform.find(vector)[0]).state
    assert back.source.replace("int col = blockIdx.x * blockDim.x", "const int col = blockIdx.x * THREADS") == \
        naive.source


@pytest.mark.parametrize("case", CASES)
def test_the_vector_form_compiles_to_128_bit_loads_and_stores(cache, case):
    from tests.cuda_tools import feature_counts

    counts = feature_counts(compiles_without_spills(golden(case, "before"), cache))
    assert counts.get("ldg_128", 0) >= 1 and counts.get("stg_128", 0) >= 1, counts


# ---- refusals -----------------------------------------------------------------------------------------------------
PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
               grid="cdiv(cols, 256)")
HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n" \
       "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n"
SUM = "float s = 0.0f;\nfor (int r = 0; r < rows; ++r) {\n    s += x[r * cols + c];\n}\ny[c] = s;"


def _kernel(work: str = SUM, head: str = HEAD, tail: str = "", plan: LaunchPlan = PLAN) -> KernelState:
    inside = "".join(f"        {line}\n" for line in work.splitlines())
    return KernelState(source=f"{head}    if (c < cols) {{\n{inside}    }}\n{tail}}}\n", plan=plan)


def _refused(transform, state: KernelState, why: str) -> None:
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("work, why", [
    (SUM.replace("s += x", "__syncthreads(); s += x"), r"synchronizes.*`__syncthreads`"),
    (SUM.replace("s += x[r * cols + c]", "s += __shfl_xor_sync(0xffffffffu, x[r * cols + c], 1)"),
     "`__shfl_xor_sync`"),
    (SUM.replace("y[c] = s;", "atomicAdd(&y[c], s);"), "`atomicAdd`"),
    (SUM.replace("s += x", "if (s > 1.0f) break; s += x"), "`break`"),
    (SUM.replace("s += x", "if (s > 1.0f) continue; s += x"), "`continue`"),
    (SUM.replace("s += x", "if (s > 1.0f) return; s += x"), "`return`"),
    (SUM.replace("s += x[r * cols + c];", "for (int k = 0; k < 2; ++k) s += x[r * cols + c];"), "nests a loop"),
    (SUM.replace("for (int r", "if (rows > 0) for (int r"), "runs one under a condition"),
    ("float s = 0.0f;\nint r = 0;\nwhile (r < rows) { s += x[r * cols + c]; ++r; }\ny[c] = s;", "`while`"),
    (SUM.replace("s += x[r * cols + c]", "s += x[r * cols + c] * threadIdx.x"), "`threadIdx.x`"),
    (SUM.replace("y[c] = s;", "y[c] = s + blockIdx.x;"), "`blockIdx.x`"),
    (SUM.replace("y[c] = s;", "y[c] = s; printf(\"%f\", s);"), "`printf`"),
    (SUM.replace("float s = 0.0f;", "static float t = 0.0f; float s = t;"), "`static`"),
    (SUM.replace("s += x[r * cols + c]", "s += *(x + r * cols + c)"), "dereferences"),
    (SUM.replace("x[r * cols + c]", "x[r * cols + c + 1]"), r"touches `x\[r \* cols \+ c \+ 1\]`, not"),
    (SUM.replace("x[r * cols + c]", "x[c * cols + r]"), r"touches `x\[c \* cols \+ r\]`, not"),  # a row per thread
    (SUM.replace("x[r * cols + c]", "x[r * rows + c]"), r"touches `x\[r \* rows \+ c\]`"),  # another row length
    (SUM.replace("x[r * cols + c]", "x[(r + c) * cols + c]"), "with E naming no column"),
    (SUM.replace("x[r * cols + c]", "x[r]"), r"touches `x\[r\]`"),
    (SUM.replace("y[c] = s;", "y[c + 1] = s;"), r"touches `y\[c \+ 1\]`"),
    ("float s = 0.0f;\nint k = 0;\nfor (int r = 0; r < rows; ++r) {\n    s += x[k * cols + c];\n    k += 2;\n}\n"
     "y[c] = s;", "with E naming no column"),  # a row of a local each column counts on its own
    (SUM.replace("int r = 0", "int r = c"), "loop header"),
    (SUM.replace("r < rows", "r < s"), "loop header"),
    (SUM.replace("s += x[r * cols + c];", "s += x[r * cols + c];\n    r += 1;"), "loop header"),
    ("float s = 0.0f;\nint r = 0;\nfor (; r < rows; ++r) {\n    s += x[r * cols + c];\n}\ny[c] = s;", "loop header"),
    ("float acc[2] = {0.0f, 0.0f};\nfor (int r = 0; r < rows; ++r) {\n    acc[0] += x[r * cols + c];\n}\n"
     "y[c] = acc[0];", r"subscripts `acc\[0\]`, no pointer parameter"),
    ("const float* p = x;\nfloat s = 0.0f;\nfor (int r = 0; r < rows; ++r) {\n    s += p[r * cols + c];\n}\n"
     "y[c] = s;", "uses the pointer 'x' other than as an array"),
    (SUM.replace("y[c] = s;", "y[c] = s;\ncols = 0;"), "row length 'cols' is no integer parameter it never"),
    (SUM.replace("y[c] = s;", "y[c] = s;\nc += 1;"), "assigns its column 'c'"),
    (SUM.replace("float s = 0.0f;", "float s = 0.0f, c4 = 0.0f;"), "names 'c4', which the vector form declares"),
    (SUM.replace("float s = 0.0f;", "float s = 0.0f, s_x = 1.0f;").replace("s += x", "s_x += x"),
     "names 's_x', which the vector form declares"),
    ("float s = 0.0f;\nfor (int r = 0; r < rows; ++r) {\n    { float t = x[r * cols + c]; s += t; }\n"
     "    { float t = 1.0f; s += t; }\n}\ny[c] = s;", "declares or uses its local 't' elsewhere too"),
    ("y[c] = 2.0f * x[c];", "walks no rows"),  # one element a thread: scalarize_elementwise's
    ("y[blockIdx.y * cols + c] = fmaxf(x[blockIdx.y * cols + c], 0.0f);", "walks no rows"),  # a row a block row
])
def test_no_site_where_the_work_could_not_run_per_component(transform, work, why):
    _refused(transform, _kernel(work), why)


@pytest.mark.parametrize("state, why", [
    (_kernel(tail="    y[0] = 1.0f;\n"), "runs statements after its column guard"),
    (_kernel(head=HEAD + "    if (c < cols) y[c] = 0.0f;\n"), "more than one column guard"),
    (KernelState(HEAD + "    for (int r = 0; r < rows; ++r) y[r] = x[r];\n}\n", PLAN), "no column guard"),
    (_kernel(head=HEAD.replace("blockIdx.x * blockDim.x + threadIdx.x", "threadIdx.x")),
     "not declared as the global thread index"),
    (_kernel(head=HEAD.replace("blockIdx.x * blockDim.x + threadIdx.x", "blockIdx.y * blockDim.y + threadIdx.y")),
     "not declared as the global thread index"),  # columns along y
    (_kernel(head=HEAD + "    float b = x[0];\n"), r"runs `float b = x\[0\];` before its guard"),
    (_kernel(SUM.replace("s += x", "t += x"), head=HEAD + "    float t = 0.0f;\n"),
     "runs `float t = 0.0f;` before its guard"),  # one local for the four components
    (_kernel(SUM.replace("y[c] = s;", "y[c] = s;\ng = s;"), head="__device__ float g;\n" + HEAD),
     "assigns 'g', no local of its own"),
    (_kernel(head=HEAD.replace("const float* x, float* y", "const double* x, double* y")),
     "moves no float, int or unsigned array"),
    (_kernel(plan=LaunchPlan.from_toml(
        'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(cols, 64)"]\nblock = [64, 4]\n'
        'args = ["x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }]\n')),
     "block of more than one dimension"),
    (_kernel(plan=plan_of('"x", "x", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
                          grid="cdiv(cols, 256)")), "passes one buffer twice"),
])
def test_no_site_for_what_the_kernel_does_around_its_columns(transform, state, why):
    _refused(transform, state, why)


def test_a_read_under_a_condition_or_of_a_written_array_stays_scalar(transform):
    """Loaded before its statement, a read under a condition could leave the rows, and one of an array the kernel
    writes could miss a store: each component reads its own element, as the thread of its column did."""
    work = ("float s = 0.0f;\nfor (int r = 0; r < rows; ++r) {\n    y[r * cols + c] = 2.0f;\n"
            "    s += r > 0 ? x[(r - 1) * cols + c] : y[r * cols + c];\n}\ny[c] = s;")
    vector = transform.forward(_kernel(work), SITE).state.source
    assert "s_z += r > 0 ? x[(r - 1) * cols + (4 * c4 + 2)] : y[r * cols + (4 * c4 + 2)];" in vector
    assert "reinterpret_cast<float4*>(y + r * cols)[c4] = make_float4(2.0f, 2.0f, 2.0f, 2.0f);" in vector
    assert transform.backward(KernelState(vector, PLAN), SITE).state.source == _kernel(work).source


def test_comments_and_layout_travel_with_the_kernel_as_written(transform):
    """A comment that says "do" or "return" is no loop or exit; a subscript split over lines reads as one; the
    guard's braced `return` form comes back byte for byte."""
    work = ("float s = 0.0f;  // do not return early\nfor (int r = 0; r < rows; ++r) {\n    // a row\n"
            "    s += x[r * cols +\n           c];\n}\ny[c] = s;")
    state = _kernel(work)
    vector = transform.forward(state, SITE).state
    assert "s_w += x4.w;" in vector.source and "// a row" not in vector.source.split("} else")[0]
    assert transform.backward(vector, SITE).state == state
    lines = "".join(f"    {line}\n" for line in work.splitlines())
    exits = KernelState(f"{HEAD}    if (c >= cols) {{ return; }}\n{lines}}}\n", PLAN)
    assert transform.backward(transform.forward(exits, SITE).state, SITE).state == exits


def test_a_read_through_the_read_only_cache_is_the_plain_read_it_vectorizes(transform):
    plain, cached = _kernel(), _kernel(SUM.replace("x[r * cols + c]", "__ldg(&x[r * cols + c])"))
    assert transform.forward_sites(cached) == transform.forward_sites(plain)
    assert transform.forward(cached, SITE).state == transform.forward(plain, SITE).state


# ---- the CPU emulator ---------------------------------------------------------------------------------------------
SHAPES = ((0, 8), (1, 4), (3, 5), (7, 12), (33, 64), (5, 130))  # (rows, cols): cols % 4 == 0 and not


ROWS_COLS = '{ scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }'


def _plan(args: str, grid: str = '"cdiv(cols, 64)"') -> LaunchPlan:
    """One launch of `kernel`, blocks of 64 threads (some columns past the last block's, some threads past cols)."""
    return LaunchPlan.from_toml(f'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = [{grid}]\n'
                                f'block = [64]\nargs = [{args}]\n')


def _forms(case: str, plan: LaunchPlan) -> tuple[KernelState, KernelState]:
    return tuple(KernelState(golden(case, which).source, plan) for which in ("after", "before"))


def _matrix(rows: int, cols: int, ties: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = torch.randint(-3, 3, (rows * cols,), generator=g).float() if ties else torch.randn(rows * cols, generator=g)
    if ties and x.numel() > 5:
        x[5] = float("nan")  # a NaN compares false: its column keeps its best
    return x


@pytest.mark.slow  # the split kernel below is the same sum over a 2-D grid
def test_the_bias_gradient_is_the_naive_kernels_bit_for_bit_on_the_cpu(tmp_path):
    """cols % 4 == 0 and not, aligned pointers and pointers one element off (the kernel as written): each column's
    float sum in the same order, so the same bits."""
    naive, vector = _forms("bias_grad", _plan('"dy", "db", ' + ROWS_COLS))

    def inputs(rows, cols):
        return {"rows": rows, "cols": cols}, {"dy": _matrix(rows, cols)}, {"db": (torch.float32, cols)}

    assert emulate.differences(tmp_path, naive, {"vector": vector}, SHAPES, inputs) == []


def test_the_emulation_sees_a_component_that_reads_another_column(tmp_path):
    naive, vector = _forms("bias_grad", _plan('"dy", "db", ' + ROWS_COLS))
    wrong = KernelState(vector.source.replace("sum_z += dy4.z;", "sum_z += dy4.y;"), vector.plan)

    def inputs(rows, cols):
        return {"rows": rows, "cols": cols}, {"dy": _matrix(rows, cols)}, {"db": (torch.float32, cols)}

    found = emulate.differences(tmp_path, naive, {"vector": wrong}, ((7, 12), (7, 13)), inputs)
    assert found == ["vector 7x12-0 db"], found  # aligned, cols % 4 == 0 only: elsewhere the kernel as written


def test_the_split_sums_over_a_two_dimensional_grid_are_the_naive_kernels(tmp_path):
    """blockIdx.y picks the rows of a split; every split's partial sums, bit for bit."""
    naive, vector = _forms("split", _plan('"dy", ' + ROWS_COLS + ', "split_sum"',
                                          grid='"cdiv(cols, 64)", "cdiv(max(rows, 1), SPLIT)"'))

    def inputs(rows, cols):
        return ({"rows": rows, "cols": cols}, {"dy": _matrix(rows, cols)},
                {"split_sum": (torch.float32, max((max(rows, 1) + 3) // 4, 1) * cols)})

    assert emulate.differences(tmp_path, naive, {"vector": vector}, SHAPES, inputs) == []


def test_the_column_maximum_and_its_row_are_the_naive_kernels(tmp_path):
    """Ties (the first row wins) and a NaN: the same values and 64-bit rows."""
    naive, vector = _forms("column_max", _plan('"x", "values", "indices", ' + ROWS_COLS))

    def inputs(rows, cols):
        return ({"rows": rows, "cols": cols}, {"x": _matrix(max(rows, 1), cols, ties=True)},
                {"values": (torch.float32, cols), "indices": (torch.int64, cols)})

    assert emulate.differences(tmp_path, naive, {"vector": vector}, SHAPES[1:], inputs) == []


@pytest.mark.slow  # the split sums and the maximum emulate the vector form by default
def test_the_mean_and_variance_are_the_naive_kernels(tmp_path):
    naive, vector = _forms("mean_var", _plan('"x", "mean", "var", "above", ' + ROWS_COLS))

    def inputs(rows, cols):
        return ({"rows": rows, "cols": cols}, {"x": _matrix(rows, cols)},
                {"mean": (torch.float32, cols), "var": (torch.float32, cols), "above": (torch.int32, cols)})

    assert emulate.differences(tmp_path, naive, {"vector": vector}, SHAPES, inputs) == []
