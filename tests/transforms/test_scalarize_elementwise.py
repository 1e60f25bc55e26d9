"""scalarize_elementwise: four elements per thread as 16-byte vectors (a scalar path for the tail and for
misaligned pointers) become one element per thread; forward finds its sites by analysis."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["scale", "scale_wide", "gelu_mul", "stencil", "dropout", "concat_last", "rotary_pairs"]
SITE = Anchor("kernel", "function", "i")


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_elementwise")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_elementwise" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_elementwise", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('gelu_mul', 'dropout', 'rotary_pairs')))
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    assert [a.key for a in transform.forward_sites(golden(case, "after"))] == ["i"]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(golden(case, "after")) == []


def test_the_vector_path_is_guarded_and_the_tail_is_scalar(transform):
    vector = transform.forward(golden("scale", "after"), SITE).state
    assert "if (i + 3 < n && (((size_t)x | (size_t)y) & 15) == 0) {" in vector.source
    assert "for (int e = i; e < n && e < i + 4; ++e) y[e] = a * x[e] + b;" in vector.source
    assert vector.plan.launches[0].grid[0] == "cdiv(cdiv(n, 256), 4)"


PLAN = LaunchPlan.from_toml("""
name = "t"
problem = "t"
[[launch]]
entry = "kernel"
grid = ["cdiv(n, 256)"]
block = [256]
args = ["x", "y", { scalar = "n", type = "i32" }]
""")
HEAD = "__global__ void kernel(const float* x, float* y, int n) {\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"


@pytest.mark.parametrize("body, why", [
    ("    if (i < n) y[i + 1] = x[i];\n", r"writes `y\[i \+ 1\]`, not element i"),
    ("    if (i < n) y[i] = y[i + 1];\n", "'y' is written and read at other elements than i"),
    ("    if (i < n) { y[i] = x[i]; i = i + 1; }\n", "writes or declares 'i'"),
    ("    if (i < n && x[i] > 0) y[i] = x[i];\n", "guard is not"),
    ("    if (i < n) { if (x[i] > 0.0f) y[i] = x[i]; }\n", "only under a condition"),
    ("    if (i < n) atomicAdd(y, x[i]);\n", "loops, synchronizes"),
    ("    if (i < n) y[i] = foo(x[i]);\n", "calls foo"),
    ("    if (i < n) y[i] = *(x + i);\n", "dereferences a pointer expression"),
    ("    float s = 2.0f;\n    y[0] = s;\n    if (i < n) y[i] = s * x[i];\n", "between its element index"),
    ("    if (i < n) { y[i] = x[i]; n = 0; }\n", "assigns 'n' of its bound"),  # the tail would read it again
    ("    if (i < n) { y[i] = x[i]; y[i] = y[i] * 2.0f; }\n", "read after it is written"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("local, why", [
    ("const float w = x[0];", "may read memory"),
    ("const float w = __ldg(x);", "may read memory"),
    ("int k = atomicAdd((int*)y, 1);", "have an effect"),
    ("float v = (y[0] = 1.0f);", "may read memory, have an effect"),
    ("int t = threadIdx.x;", "name a thread coordinate"),
    ("int b = blockIdx.x * 2;", "name a thread coordinate"),
    ("float s = 2.0f;", "is assigned"),  # the body assigns it below
    ("int n = 4;", "names a parameter"),  # the guard's n is the parameter, not this local
    ("__shared__ float s;", "no scalar local"),
    ("static float s = 2.0f;", "no scalar local"),
    ("const float* p = x;", "no initialized scalar"),
    ("long long a = (long long)x;", "reads 'x'"),
    ("int e = n;", "takes a name the vector form declares"),  # the tail's own `e`
])
def test_no_site_for_a_local_before_the_guard_that_is_not_a_plain_value(transform, local, why):
    body = "    if (i < n) { y[i] = x[i]; s = 1.0f; }\n" if why == "is assigned" else "    if (i < n) y[i] = x[i];\n"
    state = KernelState(source=HEAD + f"    {local}\n" + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("before, why", [
    ("int t = threadIdx.x;", "name a thread coordinate"),  # every lane would read the first lane's thread
    ("y[0] = 0.0f;", r"runs `y\[0\] = 0.0f;` before its element index"),
])
def test_before_the_index_only_scalar_locals(transform, before, why):
    head = HEAD.replace("    int i", f"    {before}\n    int i")
    state = KernelState(source=head + "    if (i < n) y[i] = x[i];\n}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_a_count_declared_before_the_index_is_a_bound(transform):
    state = KernelState(source=HEAD.replace("    int i", "    const int m = n - 1;\n    int i") +
                        "    if (i < m + 1) y[i] = x[i];\n}\n", plan=PLAN)
    assert "if (i + 3 < m + 1 && " in transform.forward(state, SITE).state.source


def test_a_bound_that_names_the_element_through_a_local_is_refused(transform):
    state = KernelState(source=HEAD + "    const int m = i + 1;\n    if (i < n - m) y[i] = x[i];\n}\n", plan=PLAN)
    with pytest.raises(NotApplicable, match="local 'm' before the guard names 'i'"):
        transform.forward(state, SITE)


SPLIT_FIRST = """__global__ void kernel(const float* a, const float* b, float* out, int rows, int ca, int cb) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int cols = ca + cb;
    int r = i / cols, c = i % cols;
    if (i >= rows * cols) return;
    out[i] = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
}
"""


def test_the_locals_before_the_guard_stay_where_they_are(transform):
    """A local of parameters stays between the index and the vector guard, which copies a bound of it; a local of
    the index moves into the body, once per lane."""
    naive = KernelState(source=SPLIT_FIRST, plan=golden("concat_last", "after").plan)
    packed = transform.forward(naive, SITE).state.source
    assert "    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;\n    const int cols = ca + cb;\n    if (i + 3 < " \
           "rows * cols && (((size_t)out) & 15) == 0) {\n" in packed
    assert "            int r = (i + 3) / cols, c = (i + 3) % cols;\n            out4.w = " in packed
    assert "        for (int e = i; e < rows * cols && e < i + 4; ++e) {\n            int r = e / cols" in packed


def _concat(rows: int, ca: int, cb: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(rows * 100 + ca)
    return ({"rows": rows, "ca": ca, "cb": cb},
            {"a": torch.randn(rows * ca, generator=g), "b": torch.randn(rows * cb, generator=g)},
            {"out": (torch.float32, rows * (ca + cb))})


def test_the_packed_concatenation_computes_the_naive_bits_on_the_cpu(tmp_path):
    """Rows of a length 4 divides and of one it does not, aligned and misaligned: every lane and the tail see the
    row length declared before the guard."""
    assert emulate.differences(tmp_path, golden("concat_last", "after"), {"packed": golden("concat_last", "before")},
                               ((4, 8, 4), (33, 5, 6), (1, 1, 2)), _concat) == []


def test_no_site_for_halves_or_a_buffer_passed_twice(transform):
    half = KernelState(source="#include <cuda_fp16.h>\n" + HEAD.replace("float*", "__half*") +
                       "    if (i < n) y[i] = x[i];\n}\n", plan=PLAN)
    with pytest.raises(NotApplicable, match="float, int, unsigned or 8-bit integers"):
        transform.forward(half, SITE)
    plan = (HERE / "scalarize_elementwise" / "scale" / "after.toml").read_text().replace('"y"', '"x"')
    twice = KernelState(source=golden("scale", "after").source, plan=LaunchPlan.from_toml(plan))
    with pytest.raises(NotApplicable, match="one buffer twice"):
        transform.forward(twice, SITE)


def _inputs(case: str, n: int) -> tuple[dict, dict, dict]:
    generator = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=generator)
    outputs = {"y": (torch.float32, n)}
    if case == "dropout":
        mask = (torch.rand(n, generator=generator) < 0.5).to(torch.uint8)
        return {"n": n, "scale": 2.0}, {"x": x, "mask": mask}, outputs
    if case == "rotary_pairs":  # n pairs
        return ({"pairs": n}, {"x": torch.randn(2 * n, generator=generator), "cos_t": x,
                               "sin_t": torch.randn(n, generator=generator)}, {"y": (torch.float32, 2 * n)})
    return {"n": n}, {"x": x}, outputs


def _bits(tmp_path, case: str, packed: KernelState) -> list[str]:
    """Where `packed` computes other bits than the case's naive kernel, for sizes with and without a tail, on
    aligned and misaligned (shift 1) pointers."""
    return emulate.differences(tmp_path, golden(case, "after"), {"packed": packed}, ((1,), (5,), (64,), (2053,)),
                               lambda n: _inputs(case, n))


@pytest.mark.parametrize("case", ["stencil", "dropout", "rotary_pairs"])
def test_the_packed_kernel_computes_the_naive_kernels_bits_on_the_cpu(tmp_path, case):
    """stencil: each lane gathers its own neighbours; dropout: a byte mask packed four to a uchar4 beside floats;
    rotary_pairs: two pairs to a float4, each pair's cos and sin gathered."""
    assert _bits(tmp_path, case, golden(case, "before")) == []


@pytest.mark.parametrize("case, old, new", [
    ("stencil", "(i + 2) + 1 < n ? x[(i + 2) + 1]", "(i + 1) + 1 < n ? x[(i + 1) + 1]"),  # another lane's neighbour
    ("dropout", "y4.z = mask4.z ?", "y4.z = mask4.y ?"),  # another lane's mask byte
    ("rotary_pairs", "y4.z = x0 * cos_t[(i + 1)]", "y4.z = x0 * cos_t[i]"),  # another pair's cos
])
def test_the_emulation_sees_a_lane_reading_another_lanes_data(tmp_path, case, old, new):
    """The check can fail: a lane reading what belongs to another computes other bits on the vector path."""
    packed = golden(case, "before")
    wrong = packed.source.replace(old, new)
    assert wrong != packed.source
    differences = _bits(tmp_path, case, KernelState(source=wrong, plan=packed.plan))
    assert differences and all("-0 " in d for d in differences), differences  # aligned: the vector path


@pytest.mark.parametrize("guard, bound", [("i < (unsigned)n", "n"), ("static_cast<long long>(n) > i", "n"),
                                          ("i < (size_t)n * 2", None)])  # a cast product is its own width
def test_a_guard_with_a_cast_count_reads_as_the_count(transform, guard, bound):
    state = KernelState(source=HEAD.replace("int i", "unsigned int i") + f"    if ({guard}) y[i] = x[i] + 1.0f;\n}}\n",
                        plan=PLAN)
    sites = transform.forward_sites(state)
    assert len(sites) == (bound is not None)
    if sites:
        assert f"if (i + 3 < {bound} && " in transform.forward(state, sites[0]).state.source


PAIRS_HEAD = HEAD.replace("int n)", "int pairs)")
PAIRS_PLAN = plan_of('"x", "y", { scalar = "pairs", type = "i32" }', grid="cdiv(pairs, 256)")


def test_the_two_elements_of_a_pair_pack_two_pairs_a_vector(transform):
    """`[2 * i + j]` in either order of its terms and factors is element j of pair i: two pairs to a float4."""
    state = KernelState(source=PAIRS_HEAD + "    if (i < pairs) { y[i * 2] = x[1 + 2 * i]; y[1 + i * 2] = x[2 * i]; "
                                            "}\n}\n", plan=PAIRS_PLAN)
    packed = transform.forward(state, SITE).state
    assert "{ y4.z = x4.w; y4.w = x4.z; }" in packed.source and "int i = (blockIdx.x * blockDim.x + threadIdx.x) * 2;" \
        in packed.source
    assert packed.plan.launches[0].grid[0] == "cdiv(cdiv(pairs, 256), 2)"
    assert transform.backward(packed, SITE).state == state


def test_the_stores_say_what_an_index_owns(transform):
    """A pairwise sum writes `y[i]`: one element an index, four a thread, its reads at `[2 * i + j]` gathered."""
    state = KernelState(source=PAIRS_HEAD + "    if (i < pairs) y[i] = x[2 * i] + x[2 * i + 1];\n}\n", plan=PAIRS_PLAN)
    packed = transform.forward(state, SITE).state.source
    assert "{ y4.w = x[2 * (i + 3)] + x[2 * (i + 3) + 1]; }" in packed and "if (i + 3 < pairs && (((size_t)y) & 15)" \
        in packed


@pytest.mark.parametrize("body, why", [
    ("y[2 * i] = x[2 * i];", "not at every element of its index"),
    ("y[2 * i] = x[2 * i]; if (x[2 * i] > 0.0f) y[2 * i + 1] = 1.0f;", "written only under a condition"),
    ("y[2 * i] = x[2 * i]; y[2 * i + 1] = 0.0f; y[4 * i + 3] = 0.0f;", r"writes at `\[2 \* i \+ j\]` and at `\[4"),
    ("y[4 * i] = x[i]; y[4 * i + 1] = x[i]; y[4 * i + 2] = x[i]; y[4 * i + 3] = x[i];", "do not fill a 4-element pack"),
    ("y[2 * i] = x[2 * i]; y[2 * i + 1] = 0.0f; y[2 * i + 2] = 0.0f;", r"writes `y\[2 \* i \+ 2\]`, not element"),
    ("y[2 * i] = x[2 * i]; y[2 * i + 1] = 0.0f; y[i] = 0.0f;", r"writes at `\[i\]` and at `\[2 \* i \+ j\]`"),
    ("y[2 * i] = y[i]; y[2 * i + 1] = 0.0f;", "'y' is written and read at other elements than 2 \\* i \\+ j"),
])
def test_no_site_where_a_pair_would_not_pack(transform, body, why):
    state = KernelState(source=PAIRS_HEAD + f"    if (i < pairs) {{ {body} }}\n}}\n", plan=PAIRS_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)

