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
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["scale", "scale_wide", "gelu_mul", "stencil", "dropout"]
SITE = Anchor("kernel", "function", "i")


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_elementwise")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_elementwise" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_elementwise", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('gelu_mul', 'dropout')))
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
    ("    float s = 2.0f;\n    if (i < n) y[i] = s * x[i];\n", "between its element index"),
    ("    if (i < n) { y[i] = x[i]; y[i] = y[i] * 2.0f; }\n", "read after it is written"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


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
    return {"n": n}, {"x": x}, outputs


def _bits(tmp_path, case: str, packed: KernelState) -> list[str]:
    """Where `packed` computes other bits than the case's naive kernel, for sizes with and without a tail, on
    aligned and misaligned (shift 1) pointers."""
    return emulate.differences(tmp_path, golden(case, "after"), {"packed": packed}, ((1,), (5,), (64,), (2053,)),
                               lambda n: _inputs(case, n))


@pytest.mark.parametrize("case", ["stencil", "dropout"])
def test_the_packed_kernel_computes_the_naive_kernels_bits_on_the_cpu(tmp_path, case):
    """stencil: each lane gathers its own neighbours; dropout: a byte mask packed four to a uchar4 beside floats."""
    assert _bits(tmp_path, case, golden(case, "before")) == []


@pytest.mark.parametrize("case, old, new", [
    ("stencil", "(i + 2) + 1 < n ? x[(i + 2) + 1]", "(i + 1) + 1 < n ? x[(i + 1) + 1]"),  # another lane's neighbour
    ("dropout", "y4.z = mask4.z ?", "y4.z = mask4.y ?"),  # another lane's mask byte
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
