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
from tests.transforms.golden import (
    HERE,
    assert_packs_are_128_bit,
    check_golden,
    compiles_without_spills,
    load,
    plan_of,
)

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
    ("    if (i < n) { if (x[i] > 0.0f) y[i] = x[i]; else if (x[i] < -1.0f) y[i] = 1.0f; }\n",
     "only under a condition"),  # neither branch of the inner if runs where x[i] is in [-1, 0]
    ("    if (i < n) atomicAdd(y, x[i]);\n", "loops, synchronizes"),
    ("    if (i < n) y[i] = foo(x[i]);\n", "calls foo"),
    ("    if (i < n) y[i] = *x + x[i];\n", "dereferences a pointer expression"),
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
    ("const float w = y[0];", "reads `y\\[0\\]`: memory the launch may write"),  # y is written: where, by whom?
    ("const float w = __ldg(x);", "may read memory"),
    ("int k = atomicAdd((int*)y, 1);", "have an effect"),
    ("float v = (y[0] = 1.0f);", "memory the launch may write"),
    ("int t = threadIdx.x % 32;", "name a thread coordinate"),
    ("int b = blockIdx.x * 2;", "name a thread coordinate"),
    ("float s = 2.0f;", "is assigned"),  # the body assigns it below
    ("int n = 4;", "names a parameter"),  # the guard's n is the parameter, not this local
    ("__shared__ float s;", "no scalar local"),
    ("static float s = 2.0f;", "no scalar local"),
    ("const float* p = x;", "no initialized scalar"),
    ("long long a = (long long)x;", "reads 'x'"),
])
def test_no_site_for_a_local_before_the_guard_that_is_not_a_plain_value(transform, local, why):
    body = "    if (i < n) { y[i] = x[i]; s = 1.0f; }\n" if why == "is assigned" else "    if (i < n) y[i] = x[i];\n"
    state = KernelState(source=HEAD + f"    {local}\n" + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("local, moved", [("const float w = x[0];", "const float w = x[0];"),
                                          ("const float w = 2.0f * x[n - 1];", "const float w = 2.0f * x[n - 1];"),
                                          ("float w = *x;", "float w = x[0];")])  # the element as a subscript
def test_a_local_read_from_memory_nothing_writes_moves_into_the_work(transform, local, moved, tmp_path):
    """A scale read from a `const` parameter before the guard (`float s = *scale;`): nothing in the launch writes
    it, so each element's work reads the same value; it moves into the work and the packed kernel computes the
    naive bits on the CPU."""
    naive = KernelState(source=HEAD + f"    {local}\n    if (i < n) y[i] = x[i] * w;\n}}\n", plan=PLAN)
    packed = transform.forward(naive, SITE).state
    assert packed.source.count(moved) == 5  # once a component and once in the tail loop

    def inputs_of(n: int) -> tuple[dict, dict, dict]:
        return {"n": n}, {"x": torch.randn(n, generator=torch.Generator().manual_seed(n))}, {"y": (torch.float32, n)}

    assert emulate.differences(tmp_path, naive, {"packed": packed}, ((5,), (64,), (130,)), inputs_of) == []


def test_a_local_read_from_a_const_parameter_stays_refused_past_a_const_cast(transform):
    """A `const_cast` may write the `const` parameter the local reads: its value would depend on where it is read."""
    state = KernelState(source=HEAD + "    const float w = x[0];\n    if (i < n) { y[i] = x[i] * w; "
                        "const_cast<float*>(x)[i] = 0.0f; }\n}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match="reads `x\\[0\\]`: memory the launch may write"):
        transform.forward(state, SITE)


@pytest.mark.parametrize("before, why", [
    ("int t = threadIdx.x % 32;", "name a thread coordinate"),  # every lane would read the first lane's thread
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
    assert emulate.differences(tmp_path, golden("concat_last", "after"),
                               {"packed": golden("concat_last", "before")},
                               ((4, 8, 4), (33, 5, 6), (1, 1, 2)), _concat) == []


def test_no_site_for_halves_or_a_buffer_passed_twice(transform):
    half = KernelState(source="#include <cuda_fp16.h>\n" + HEAD.replace("float*", "__half*") +
                       "    if (i < n) y[i] = x[i];\n}\n", plan=PLAN)
    with pytest.raises(NotApplicable, match="float, double, int, unsigned, 64-bit or 8-bit integers"):
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
                                          ("i < (size_t)n * 2", "(size_t)n * 2"),  # a product formed in 64 bits: kept
                                          ("i < (float)n * 2", None)])  # a float bound is no count
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



# The half-split ("rotate_half") rotary layout: one thread per pair (r * 2 * half + j, + half), four pairs a thread
ROTATE = "rotate_half"
ROTATE_SITE = Anchor("kernel", "function", "p")
ROTATE_PLAN = plan_of('"x", "cos_t", "sin_t", "y", { scalar = "rows", type = "i32" }, '
                      '{ scalar = "half", type = "i32" }', grid="cdiv(rows * half, 256)")
ROTATE_HEAD = ("__global__ void kernel(const float* x, const float* cos_t, const float* sin_t, float* y, int rows, "
               "int half) {\n    int p = blockIdx.x * blockDim.x + threadIdx.x;\n    if (p < rows * half) {\n")
SPLIT = "        int r = p / half, j = p % half;\n        int a = r * 2 * half + j;\n        int b = a + half;\n"
WORK = ("        float x1 = x[a], x2 = x[b];\n        float c = cos_t[r * half + j], s = sin_t[r * half + j];\n"
        "        y[a] = x1 * c - x2 * s;\n        y[b] = x2 * c + x1 * s;\n")


def _rotate(body: str) -> KernelState:
    return KernelState(source=ROTATE_HEAD + body + "    }\n}\n", plan=ROTATE_PLAN)


def test_the_half_split_pairs_golden_goes_both_ways(transform):
    """backward(before) == after and forward(after) == before, plans included; the naive kernel is a site (its
    index `p`), the vector form is not, and only the vector form is found for backward."""
    check_golden("scalarize_elementwise", ROTATE)
    assert [a.key for a in transform.forward_sites(golden(ROTATE, "after"))] == ["p"]
    assert transform.forward_sites(golden(ROTATE, "before")) == []
    assert transform.find(golden(ROTATE, "after")) == []


def test_the_half_split_vector_form_compiles_to_128_bit_loads_and_stores(cache):
    """nvcc (sm_90) builds both forms without spills; the vector form loads x twice and each table once in
    LDG.E.128 and stores y twice in STG.E.128, the naive form none."""
    assert_packs_are_128_bit(golden(ROTATE, "after"), golden(ROTATE, "before"), cache, loads=4)


@pytest.mark.parametrize("split, work", [
    # the offsets in other spellings: the low one from p itself, the high one written out, the table at p
    ("        int r = p / half;\n        int j = p % half;\n        int a = 2 * p - j;\n",
     "        float x1 = x[a], x2 = x[half + j + 2 * half * r];\n        float c = cos_t[p], s = sin_t[j + half * r];\n"
     "        y[a] = x1 * c - x2 * s;\n        y[a + half] = x2 * c + x1 * s;\n"),
])
def test_the_offsets_are_read_as_polynomials(transform, split, work):
    state = _rotate(split + work)
    packed = transform.forward(state, ROTATE_SITE).state
    assert "const float4 x_hi4 = *reinterpret_cast<const float4*>(x + (half + j + 2 * half * r));" in packed.source
    assert "const float4 cos_t4 = *reinterpret_cast<const float4*>(cos_t + p);" in packed.source
    assert "*reinterpret_cast<float4*>(y + (a + half)) = y_hi4;" in packed.source
    assert transform.backward(packed, ROTATE_SITE).state == state


@pytest.mark.parametrize("split, work, why", [
    # the second offset is not a + half: it overlaps the next pair's low element
    (SPLIT.replace("a + half;", "a + half + 1;"), WORK, r"reads `x\[b\]`: not a pointer parameter at a pair's"),
    # half assigned: the split and the tail would read another row length
    (SPLIT, WORK + "        half = 2;\n", "assigns 'half'"),
    # a write at another offset: another pair's element
    (SPLIT, WORK + "        y[a + 1] = 0.0f;\n", r"writes `y\[a \+ 1\]`"),
    # a read of x at a third place (the next pair's low element, and x's table entry)
    (SPLIT, WORK.replace("x1 * s;", "x[a + 1];"), r"reads `x\[a \+ 1\]`"),
    (SPLIT, WORK.replace("x1 * s;", "x[r * half + j];"), "'x' is touched at a pair's offsets and at its table"),
    # p split by something else: a remainder by another length, or no remainder at all
    (SPLIT.replace("p % half", "p % rows"), WORK, r"splits 'p' by `half` and by `rows`"),
    (SPLIT.replace("p % half", "p - r * half"), WORK, r"other than once by `p / H` and once by `p % H`"),
    # the row length a local, not a parameter: a quotient `dim / 2` is no product of parameters
    (SPLIT.replace("half", "(rows / 2)"), WORK, "is not a scalar parameter or a product of them"),
    # a lane's own pair index used as a value: every lane would read the first pair's
    (SPLIT, WORK.replace("x1 * s;", "x1 * s + j;"), "names 'j' outside its pairs' subscripts"),
    # a pair's element stored under a condition: the vector store would write garbage at the other lanes
    (SPLIT, WORK.replace("        y[b] =", "        if (c > 0.0f) y[b] ="), "written only under a condition"),
    # the table written
    (SPLIT, WORK + "        y[r * half + j] = 0.0f;\n", "touched at a pair's offsets and at its table"),
])
def test_no_site_where_half_split_pairs_would_not_pack(transform, split, work, why):
    state = _rotate(split + work)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, ROTATE_SITE)


def test_a_row_length_the_kernel_assigns_is_refused_even_outside_the_bound(transform):
    """The guard's bound names only `rows`, so the bound's own check passes; the split's `half` is assigned after
    the work, and the element loop would split the next pair by another length."""
    state = KernelState(source=(ROTATE_HEAD.replace("p < rows * half", "p < rows") + SPLIT + WORK +
                                "        half = 2;\n    }\n}\n"), plan=ROTATE_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match="assigns 'half', which its pairs' offsets read"):
        transform.forward(state, ROTATE_SITE)


def _rotate_inputs(rows: int, half: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(rows * 100 + half)
    return ({"rows": rows, "half": half},
            {"x": torch.randn(rows * 2 * half, generator=g), "cos_t": torch.randn(rows * half, generator=g),
             "sin_t": torch.randn(rows * half, generator=g)},
            {"y": (torch.float32, rows * 2 * half)})


@pytest.mark.parametrize("shapes", sampled([((3, 8), (5, 4), (2, 6)), ((7, 12), (1, 2), (33, 20), (4, 10))],
                                           keep=[((3, 8), (5, 4), (2, 6))]))
def test_the_half_split_vector_form_computes_the_naive_bits_on_the_cpu(tmp_path, shapes):
    """Rows of a half 4 divides (the vector path, on aligned pointers) and of one it does not (the element loop),
    each on aligned and misaligned (shift 1) pointers."""
    assert emulate.differences(tmp_path, golden(ROTATE, "after"), {"packed": golden(ROTATE, "before")}, shapes,
                               _rotate_inputs) == []


@pytest.mark.slow
def test_the_emulation_sees_a_half_split_lane_reading_another_pairs_sin(tmp_path):
    packed = golden(ROTATE, "before")
    wrong = packed.source.replace("float c = cos_t4.z, s = sin_t4.z;", "float c = cos_t4.z, s = sin_t4.y;")
    assert wrong != packed.source
    found = emulate.differences(tmp_path, golden(ROTATE, "after"), {"packed": KernelState(wrong, packed.plan)},
                                ((3, 8),), _rotate_inputs)
    assert found == ["packed 3x8-0 y"], found  # aligned only: the misaligned run takes the element loop


IF_ELSE = """__global__ void kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        if (v > 2.0f) y[i] = v;
        else if (v < -2.0f) { y[i] = 0.0f; }
        else y[i] = log1pf(expf(v));
    }
}
"""


def test_a_store_on_both_branches_of_an_if_else_is_a_store_at_every_element(transform, tmp_path):
    """A softplus with its thresholds as an if/else chain stores y[i] on every path, so every lane of the vector
    store holds a value: a site, whose packed kernel computes the naive bits on the CPU."""
    naive = KernelState(source=IF_ELSE, plan=PLAN)
    assert [a.key for a in transform.forward_sites(naive)] == ["i"]
    packed = transform.forward(naive, SITE).state
    assert "else if (v < -2.0f) { y4.x = 0.0f; }" in packed.source

    def inputs(n):
        return {"n": n}, {"x": torch.randn(n, generator=torch.Generator().manual_seed(n)) * 4}, \
            {"y": (torch.float32, n)}

    assert emulate.differences(tmp_path, naive, {"packed": packed}, ((5,), (2053,)), inputs) == []


def test_a_local_named_as_the_vector_form_names_its_own_is_renamed_apart(transform, tmp_path):
    """A local `e` (the tail loop's index) and one named like a pack (`x4`) are the kernel's to name: renamed `e_`
    and `x4_`, the kernel packs, and its bits are the naive kernel's on the CPU."""
    naive = KernelState(source=HEAD + "    if (i < n) {\n        float v = x[i];\n        float e = expf(-v);\n"
                                      "        float x4 = v / (1.0f + e);\n        y[i] = x4;\n    }\n}\n", plan=PLAN)
    (site,) = transform.forward_sites(naive)
    packed = transform.forward(naive, site).state
    assert "float e_ = expf(-v);" in packed.source and "float x4_ = v / (1.0f + e_);" in packed.source

    def inputs(n):
        return {"n": n}, {"x": torch.randn(n, generator=torch.Generator().manual_seed(n))}, {"y": (torch.float32, n)}

    assert emulate.differences(tmp_path, naive, {"packed": packed}, ((5,), (2053,)), inputs) == []


def test_a_bool_mask_is_read_as_bytes_and_never_packed_where_written(transform, tmp_path):
    """`const bool*` (torch.where's condition) packs four to a uchar4 beside floats, as an 8-bit mask does: its bytes
    hold 0 or 1, read as the same numbers, and the packed kernel gives the dropout kernel's bits; a bool array the
    kernel writes is refused with the reason (a packed byte would keep a value bool converts to 0 or 1)."""
    spelled = golden("dropout", "after").source.replace("const unsigned char* __restrict__ mask",
                                                        "const bool* __restrict__ mask")
    state = KernelState(source=spelled, plan=golden("dropout", "after").plan)
    (site,) = transform.forward_sites(state)
    packed = transform.forward(state, site).state
    assert "uchar4 mask4" in packed.source
    def inputs(n: int) -> tuple[dict, dict, dict]:
        params, arrays, outputs = _inputs("dropout", n)
        return params, {**arrays, "mask": arrays["mask"].to(torch.bool)}, outputs

    assert emulate.differences(tmp_path, state, {"packed": packed}, ((5,), (2053,)), inputs) == []
    written = KernelState(source=HEAD.replace("float* y", "bool* y") + "    if (i < n) y[i] = x[i] > 0.0f;\n}\n",
                          plan=PLAN)
    with pytest.raises(NotApplicable, match="'y' is a bool array the kernel writes"):
        transform.forward(written, SITE)


WIDE_PLAN = plan_of('"x", "idx", "y", "out", { scalar = "cols", type = "i32" }, { scalar = "n", type = "i32" }')
# torch.gather along rows with torch's int64 index, a float64 output and an int64 output beside it: every 64-bit
# spelling the packing names has its own vector type
WIDE = """#include <cstdint>
__global__ void kernel(const float* x, const int64_t* idx, double* y, long long* out, int cols, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int r = i / cols;
        float v = x[r * cols + idx[i]];
        y[i] = 2.5 * (double)v + 1.0;
        out[i] = idx[i] * 3 - (long long)r;
    }
}
"""


def test_64_bit_elements_pack_four_to_two_16_byte_accesses(transform, tmp_path, cache):
    """An int64 index (`int64_t`, which is `long`), a float64 and a `long long` array pack four to their CUDA 13
    `_16a` vectors (32 bytes, 16-byte aligned: two 128-bit accesses each, under the same alignment check): the
    packed kernel gives the naive kernel's bits on the CPU, aligned and not, with and without a tail, and moves
    its 64-bit arrays in 128-bit loads and stores."""
    naive = KernelState(source=WIDE, plan=WIDE_PLAN)
    (site,) = transform.forward_sites(naive)
    packed = transform.forward(naive, site).state
    assert "const long4_16a idx4 = *reinterpret_cast<const long4_16a*>(idx + i);" in packed.source
    assert "double4_16a y4;" in packed.source and "longlong4_16a out4;" in packed.source
    assert_packs_are_128_bit(naive, packed, cache, loads=2)

    def inputs(n: int) -> tuple[dict, dict, dict]:
        cols = 7
        g = torch.Generator().manual_seed(n)
        rows = -(-n // cols)
        return ({"cols": cols, "n": n},
                {"x": torch.randn(rows * cols, generator=g), "idx": torch.randint(0, cols, (n,), generator=g)},
                {"y": (torch.float64, n), "out": (torch.int64, n)})

    mutant = KernelState(packed.source.replace("idx4.y", "idx4.x"), packed.plan)  # a lane reads its neighbour's index
    found = emulate.differences(tmp_path, naive, {"packed": packed, "mutant": mutant}, ((5,), (64,), (2053,)), inputs)
    # only the mutant differs, and only on aligned pointers (misaligned ones take the element loop)
    assert found == [f"mutant {n}-0 {out}" for n in (5, 64, 2053) for out in ("y", "out")]
