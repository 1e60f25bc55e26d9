"""The canonical thread index (klineage/transforms/_canonical.py): every equivalent spelling of a naive kernel's
index reads as the canonical one, so each analysis forward finds the same site and writes the same kernel
however the index was spelled; spellings whose value could differ are left as written."""

from __future__ import annotations

import re
import textwrap

import pytest

from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._canonical import canonical
from tests.transforms.golden import HERE, compiles_without_spills, load, plan_of

PLAN = plan_of('"x", "y", { scalar = "n", type = "i32" }')
NARROW = "int i = blockIdx.x * blockDim.x + threadIdx.x;"
WIDE = "long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"


def _index_line(declaration: str, use: str = "if (i < n) y[i] = x[i] * 2.0f;") -> str:
    state = KernelState(source=f"__global__ void kernel(const float* x, float* y, int n) {{\n    {declaration}\n"
                               f"    {use}\n}}\n", plan=PLAN)
    return canonical(state).source.splitlines()[1].strip()


@pytest.mark.parametrize("spelled, canonical_line", [
    ("int i = threadIdx.x + blockIdx.x * blockDim.x;", NARROW),
    ("int i = blockDim.x * blockIdx.x + threadIdx.x;", NARROW),
    ("const int i = (blockIdx.x * blockDim.x) + threadIdx.x;", NARROW),
    ("int32_t i = threadIdx.x + (blockDim.x * blockIdx.x);", NARROW),
    ("unsigned i = blockIdx.x * blockDim.x + threadIdx.x;", NARROW),
    ("auto i = threadIdx.x + blockIdx.x * blockDim.x;", NARROW),
    ("size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;", WIDE),
    ("size_t i = blockIdx.x * blockDim.x + threadIdx.x;", WIDE),
    ("const int64_t i = static_cast<int64_t>(blockDim.x) * blockIdx.x + threadIdx.x;", WIDE),
    ("long i = blockIdx.x * (long)blockDim.x + threadIdx.x;", WIDE),
    ("auto i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;", WIDE),
    ("int i = blockIdx.x * 256 + threadIdx.x;", NARROW),  # every launch's block, as its number
    # the whole sum cast, as PyTorch extensions write it: to 32 bits the sum, to 64 the sum widened once formed
    ("int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);", NARROW),
    ("const int i = (int)(threadIdx.x + blockIdx.x * blockDim.x);", NARROW),
    ("int64_t i = static_cast<int64_t>(blockIdx.x * blockDim.x + threadIdx.x);", WIDE),
    # a coordinate cast to 32 bits keeps its value (below 2^31), as PyTorch extensions write it
    ("int i = (int)blockIdx.x * blockDim.x + threadIdx.x;", NARROW),
    ("int i = static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);", NARROW),
    ("int64_t i = (int64_t)blockIdx.x * (unsigned)blockDim.x + threadIdx.x;", WIDE),
])
def test_equivalent_spellings_become_the_canonical_index(spelled, canonical_line):
    assert _index_line(spelled) == canonical_line


@pytest.mark.parametrize("spelled, use", [
    # an unsigned index read where signed arithmetic gives another value: left as written
    ("unsigned i = blockIdx.x * blockDim.x + threadIdx.x;", "if (i < n) y[i] = x[i - 1];"),
    ("size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;", "if (i < n) y[i] = x[(i >> 1)];"),
    ("unsigned i = blockIdx.x * blockDim.x + threadIdx.x;", "if (i < n) { i += 1; y[i] = x[i]; }"),
    ("auto i = blockIdx.x * blockDim.x + threadIdx.x;", "if (i < n) y[i] = x[n / 2 % i];"),
    # a 64-bit product narrowed into 32 bits, mixed axes, a term too many or a stride that is no block's width
    ("int i = (long long)blockIdx.x * blockDim.x + threadIdx.x;", "if (i < n) y[i] = x[i];"),
    ("int i = static_cast<int>((long long)blockIdx.x * blockDim.x + threadIdx.x);", "if (i < n) y[i] = x[i];"),
    ("int i = static_cast<short>(blockIdx.x * blockDim.x + threadIdx.x);", "if (i < n) y[i] = x[i];"),
    ("int i = (short)blockIdx.x * blockDim.x + threadIdx.x;", "if (i < n) y[i] = x[i];"),
    ("int i = blockIdx.y * blockDim.x + threadIdx.x;", "if (i < n) y[i] = x[i];"),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x + 1;", "if (i < n) y[i] = x[i];"),
    ("int i = blockIdx.x * 128 + threadIdx.x;", "if (i < n) y[i] = x[i];"),
    ("float i = blockIdx.x * blockDim.x + threadIdx.x;", "if (i < n) y[0] = x[0];"),
])
def test_spellings_that_could_mean_another_value_are_left_alone(spelled, use):
    assert _index_line(spelled, use) == spelled


def test_a_kernel_already_canonical_is_the_same_state():
    state = load(HERE / "scalarize_elementwise" / "scale", "after", "kernel")
    assert canonical(state) is state


def _respelled(state: KernelState, spellings: dict[str, str]) -> KernelState:
    source = state.source
    for canonical_init, spelled in spellings.items():
        source, count = re.subn(rf"(?:int|long long) (\w+) = {re.escape(canonical_init)};",
                                lambda m: spelled.format(m[1]), source)
        assert count, (canonical_init, state.source)
    return KernelState(source=source, plan=state.plan)


X = "blockIdx.x * blockDim.x + threadIdx.x"
X_WIDE = "(long long)blockIdx.x * blockDim.x + threadIdx.x"
Y = "blockIdx.y * blockDim.y + threadIdx.y"
SPELLINGS = {
    "order": {X: "int {} = threadIdx.x + blockIdx.x * blockDim.x;", X_WIDE: "int64_t {} = threadIdx.x + "
              "blockIdx.x * (long long)blockDim.x;", Y: "int {} = threadIdx.y + blockDim.y * blockIdx.y;"},
    "qualified": {X: "const unsigned {} = blockDim.x * blockIdx.x + threadIdx.x;",
                  X_WIDE: "const size_t {} = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;",
                  Y: "const auto {} = (blockIdx.y * blockDim.y) + threadIdx.y;"},
}
# (transform, its naive golden, the canonical indexes it declares), one per analysis forward that reads the index
NAIVE = [("serialize_reduction", "serialize_reduction/softmax", (X,)),
         ("serialize_reduction", "serialize_reduction/argmax", (X,)),
         ("scalarize_elementwise", "scalarize_elementwise/scale", (X,)),
         ("scalarize_elementwise", "scalarize_elementwise/scale_wide", (X_WIDE,)),
         ("scalarize_half_packs", "scalarize_half_packs/axpy_half", (X,)),
         ("uncoarsen_grid_stride", "uncoarsen_grid_stride/leaky_relu", (X,)),
         ("scalarize_row_gather", "scalarize_row_gather/embedding_float", (X_WIDE,)),
         ("untile_transpose", "untile_transpose/float", (X, Y)),
         ("untile_matmul", "untile_matmul/bias_relu", (X, Y)),
         ("unprivatize_histogram", "unprivatize_histogram/guarded", (X,))]


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("name, folder, indexes", NAIVE, ids=[f"{n}-{f.split('/')[1]}" for n, f, _ in NAIVE])
def test_each_forward_writes_the_same_kernel_from_a_respelled_index(name, folder, indexes, spelling):
    transform, naive = get(name), load(HERE / folder, "after", "kernel")
    respelled = _respelled(naive, {index: SPELLINGS[spelling][index] for index in indexes})
    assert respelled.source != naive.source
    sites = transform.forward_sites(naive)
    assert sites and transform.forward_sites(respelled) == sites
    for site in sites:
        assert transform.forward(respelled, site).state == transform.forward(naive, site).state


def test_the_wide_vector_form_compiles_and_steps_its_tail_in_64_bits(cache):
    vector = load(HERE / "scalarize_elementwise" / "scale_wide", "before", "kernel")
    assert "long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;" in vector.source
    assert "for (long long e = i; e < n && e < i + 4; ++e)" in vector.source
    compiles_without_spills(vector, cache)


@pytest.mark.parametrize("name, folder", [("scalarize_elementwise", "scale"), ("scalarize_elementwise", "gelu_mul"),
                                          ("scalarize_half_packs", "axpy_half")])
def test_the_packed_forwards_read_the_return_form_as_the_if_form(name, folder, cache):
    """`if (i >= n) return;` and the work after it is `if (i < n) { work }` to the packed forwards: the same site
    and the same vector kernel, which compiles."""
    naive = load(HERE / name / folder, "after", "kernel")
    guard = re.search(r"\n( +)if \(i < n\) (.*)\n}\n$", naive.source, re.S)
    assert guard, naive.source
    indent, work = guard[1], guard[2].strip()
    work = textwrap.indent(textwrap.dedent(work[1:-1].rstrip().strip("\n")) if work.startswith("{") else work, indent)
    head = naive.source[:guard.start()]
    returning = KernelState(source=f"{head}\n{indent}if (i >= n) return;\n{work}\n}}\n", plan=naive.plan)
    blocked = KernelState(source=f"{head}\n{indent}if (i < n) {{\n{re.sub('(?m)^', '    ', work)}\n{indent}}}\n}}\n",
                          plan=naive.plan)
    transform = get(name)
    sites = transform.forward_sites(blocked)
    assert sites and transform.forward_sites(returning) == sites
    vector = transform.forward(returning, sites[0]).state
    assert vector == transform.forward(blocked, sites[0]).state
    compiles_without_spills(vector, cache)


@pytest.mark.parametrize("name", ["scalarize_elementwise", "uncoarsen_grid_stride"])
def test_a_guard_with_the_bound_first_reads_as_the_index_first(name):
    """`if (n > i) work` is `if (i < n) work`, and `if (n <= i) return;` is `if (i >= n) return;`."""
    naive = load(HERE / "scalarize_elementwise" / "scale", "after", "kernel")
    work = "y[i] = a * x[i] + b;"
    assert f"if (i < n) {work}" in naive.source
    forms = {spelled: KernelState(source=naive.source.replace(f"if (i < n) {work}", spelled), plan=naive.plan)
             for spelled in (f"if (i < n) {{\n        {work}\n    }}", f"if (n > i) {{\n        {work}\n    }}",
                             f"if (n <= i) return;\n    {work}", f"if (i >= n) return;\n    {work}")}
    transform = get(name)
    written = {transform.forward(state, transform.forward_sites(state)[0]).state for state in forms.values()}
    assert len(written) == 1


def _strided(head: str, loop: str, after: str = "") -> KernelState:
    return KernelState(source="__global__ void kernel(const float* x, float* y, int n) {\n" + head + loop +
                       "        y[i] = x[i] * 2.0f;\n" + after + "}\n", plan=PLAN)


GRID_STRIDE = "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n"
STRIDE = "    int stride = blockDim.x * gridDim.x;\n"


@pytest.mark.parametrize("index", ["int index = blockIdx.x * blockDim.x + threadIdx.x;",
                                   "const int index = threadIdx.x + blockIdx.x * blockDim.x;"])
def test_a_grid_stride_loop_from_an_index_local_starts_at_the_index(index):
    """CUDA's own spelling (`int index = ...; int stride = ...; for (int i = index; ...)`) reads as the loop the
    forwards know, and both grid-stride forwards write what they write from it."""
    spelled = _strided(f"    {index}\n" + STRIDE, "    for (int i = index; i < n; i += stride)\n")
    plain = _strided(STRIDE, GRID_STRIDE)
    assert canonical(spelled) == plain
    for name in ("scalarize_elementwise", "scalarize_grid_stride"):
        transform = get(name)
        (site,) = transform.forward_sites(spelled)
        assert transform.forward(spelled, site).state == transform.forward(plain, site).state


@pytest.mark.parametrize("head, loop, after", [
    # the local read again after the loop, or written; a 32-bit loop index from a 64-bit local; not the index
    ("    int index = blockIdx.x * blockDim.x + threadIdx.x;\n", "    for (int i = index; i < n; i += stride)\n",
     "    if (index == 0) y[0] = 1.0f;\n"),
    ("    int index = blockIdx.x * blockDim.x + threadIdx.x;\n    index += 1;\n",
     "    for (int i = index; i < n; i += stride)\n", ""),
    ("    long long index = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n",
     "    for (int i = index; i < n; i += stride)\n", ""),
    ("    int index = blockIdx.x * blockDim.x + threadIdx.x + 1;\n",
     "    for (int i = index; i < n; i += stride)\n", ""),
])
def test_a_loop_from_a_local_that_could_hold_another_value_is_left_alone(head, loop, after):
    spelled = _strided(head + STRIDE, loop, after)
    assert "for (int i = index;" in canonical(spelled).source


def test_indexes_declared_together_are_declared_one_by_one():
    state = KernelState(source="__global__ void kernel(const float* x, float* y, int n) {\n"
                               "    const int half = n / 2, i = threadIdx.x + blockIdx.x * blockDim.x;\n"
                               "    float a = 0.0f, b = 1.0f;\n"
                               "    if (i < half) { y[i] = x[i] * b + a; }\n}\n", plan=PLAN)
    lines = [line.strip() for line in canonical(state).source.splitlines()[1:4]]
    # in their order (a later local may read an earlier one), each with the shared type; the index canonical;
    # the floats, which read no coordinate, as written
    assert lines == ["const int half = n / 2;", NARROW, "float a = 0.0f, b = 1.0f;"]


def test_a_loops_declarations_stay_together():
    source = ("__global__ void kernel(const float* x, float* y, int n) {\n"
              "    for (int i = blockIdx.x * blockDim.x + threadIdx.x, s = 0; i < n; i += blockDim.x * gridDim.x)"
              " y[i] = x[i] + s;\n}\n")
    assert canonical(KernelState(source=source, plan=PLAN)).source == source


def test_a_coordinate_read_through_a_local_is_the_coordinate_and_the_local_goes_once_unread():
    ours = _index_line("const int tid = threadIdx.x;\n    const int bid = blockIdx.x;\n"
                       "    int i = bid * blockDim.x + tid;")
    assert ours == NARROW  # the locals gone: the index is the kernel's first line
    kept = canonical(KernelState(source="__global__ void kernel(const float* x, float* y, int n) {\n"
                                        "    int t = threadIdx.x;\n    int i = blockIdx.x * blockDim.x + t;\n"
                                        "    if (i < n) y[i] = x[i] * t;\n}\n", plan=PLAN)).source
    assert "    int t = threadIdx.x;\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n" in kept  # still read


@pytest.mark.parametrize("local", ["int t = threadIdx.x;\n    t += 1;",  # assigned: no longer the coordinate
                                   "long long t = threadIdx.x;"])  # 64 bits: the sum's width would change
def test_a_local_that_may_not_hold_the_coordinate_is_no_coordinate(local):
    source = (f"__global__ void kernel(const float* x, float* y, int n) {{\n    {local}\n"
              "    int i = blockIdx.x * blockDim.x + t;\n    if (i < n) y[i] = x[i];\n}\n")
    assert "int i = blockIdx.x * blockDim.x + t;" in canonical(KernelState(source=source, plan=PLAN)).source



@pytest.mark.parametrize("spelled, plain", [
    ("const int b = blockIdx.z;", "int b = blockIdx.z;"),
    ("const int row = static_cast<int>(blockIdx.y);", "int row = blockIdx.y;"),
    ("int row = (int)blockIdx.y;", "int row = blockIdx.y;"),
])
def test_a_coordinate_local_written_const_or_cast_is_the_plain_local(spelled, plain):
    """A batch's or a row's coordinate: `const` changes no value, nor does a cast to int of a coordinate (below
    2^31); a cast to a narrower type or a 64-bit local is left as written."""
    use = "if (i < n) y[i + b * n] = x[i];" if " b " in spelled else "if (i < n) y[i + row * n] = x[i];"
    state = KernelState(source=f"__global__ void kernel(const float* x, float* y, int n) {{\n    {spelled}\n"
                               f"    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    {use}\n}}\n", plan=PLAN)
    assert canonical(state).source.splitlines()[1].strip() == plain
    for kept in ("short row = (short)blockIdx.y;", "long long row = blockIdx.y;"):
        left = KernelState(source=state.source.replace(spelled, kept), plan=PLAN)
        assert canonical(left).source.splitlines()[1].strip() == kept


def _layered(body: str) -> KernelState:
    return KernelState(source=f"__global__ void kernel(const float* x, float* y, int batch, int n) {{\n{body}}}\n",
                       plan=PLAN)


def test_a_layer_read_inline_is_named_by_a_local_of_its_own_type():
    """`blockIdx.z` read where it is used (a batch's offset, `blockIdx.z * n`) is named first by an `unsigned int`
    local, blockIdx.z's own type, so `batch * n` is formed in the same unsigned arithmetic; a name the kernel has
    (its `batch` parameter) is not taken."""
    state = _layered(f"    {NARROW}\n    if (i < n) y[blockIdx.z * n + i] = x[(size_t)blockIdx.z * n + i];\n")
    named = _layered(f"    unsigned int batch1 = blockIdx.z;\n    {NARROW}\n"
                     "    if (i < n) y[batch1 * n + i] = x[(size_t)batch1 * n + i];\n")
    assert canonical(state).source == named.source


@pytest.mark.parametrize("body", [
    # a local already holds the layer: the readers read it as it is
    "    int b = blockIdx.z;\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[b * n + i] = x[i];\n",
    # a 3-D thread index: blockIdx.z is not a layer there
    "    int z = blockIdx.z * blockDim.z + threadIdx.z;\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[z * n + i] = x[i];\n",
])
def test_a_layer_held_by_a_local_or_in_a_3d_index_is_left_alone(body):
    assert "unsigned int batch" not in canonical(_layered(body)).source


TILE_PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
                    grid='cdiv(cols, 16)", "cdiv(rows, 8)', block="16, 8")


@pytest.mark.parametrize("constants, row, column, canonical_row", [
    # each axis's block size named by a constant, or one square TILE for both where the block is square
    ("#define TX 16\n#define TY 8\n", "blockIdx.y * TY + threadIdx.y", "threadIdx.x + TX * blockIdx.x",
     "int r = blockIdx.y * blockDim.y + threadIdx.y;"),
    ("constexpr int ROWS = 8;\n", "threadIdx.y + blockIdx.y * ROWS", "blockIdx.x * 16 + threadIdx.x",
     "int r = blockIdx.y * blockDim.y + threadIdx.y;"),
    # the constant is not the launch's size along the axis it stands in: left as written
    ("#define TX 16\n", "blockIdx.y * TX + threadIdx.y", "blockIdx.x * TX + threadIdx.x",
     "int r = blockIdx.y * TX + threadIdx.y;"),
])
def test_a_block_size_constant_is_blockdim_along_the_axis_it_equals(constants, row, column, canonical_row):
    state = KernelState(source=f"{constants}__global__ void kernel(const float* x, float* y, int rows, int cols) {{\n"
                               f"    int r = {row};\n    int c = {column};\n"
                               f"    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c];\n}}\n",
                        plan=TILE_PLAN)
    lines = [line.strip() for line in canonical(state).source.splitlines()]
    assert canonical_row in lines
    assert "int c = blockIdx.x * blockDim.x + threadIdx.x;" in lines
