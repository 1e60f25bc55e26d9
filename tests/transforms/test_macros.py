"""Function-like macros expanded as the preprocessor expands them (klineage/transforms/_macros.py): the analysis
forwards read a subscript written through a macro as the code the compiler sees. The preprocessor itself (`cpp`,
which every nvcc host has) is the oracle: each expansion must be its output, token for token."""

from __future__ import annotations

import re
import subprocess

import pytest

from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._macros import expanded
from tests.transforms.golden import plan_of

PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }')
USES = """__device__ int f(int q, int n) {
    return SQ(q+1) - -MUL(1, -q) + SQ(SQ(2)) + IDX(q, n - 1, n) * OFF(q) - SUB(q, -1) + TWICE(q)[0];
}
"""
DEFINES = """#define MUL(a, b) a*b
#define SQ(a) MUL(a, a)
#define IDX(r, c, C) ((r) * (C) + (c))
#define OFF(r) (r << 2)
#define SUB(a, b) a-b
#define TWICE(v) (&v)
"""


def _tokens(source: str) -> list[str]:
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    return re.findall(r"\w+|\S", code)


def _preprocessed(source: str) -> str:
    return subprocess.run(["cpp", "-P"], input=source, capture_output=True, text=True, check=True).stdout


def test_each_expansion_is_the_preprocessors_token_for_token():
    source = DEFINES + USES
    ours = expanded(KernelState(source=source, plan=PLAN)).source
    assert _tokens(ours) == _tokens(_preprocessed(source))
    # an argument left bare by its macro means what the preprocessor makes of it: no parentheses added
    assert "q+1*q+1" in ours and "- -1* -q" in ours and "q- -1" in ours


def test_a_loop_headed_by_a_macro_is_the_preprocessors_loop():
    """`CUDA_KERNEL_LOOP(i, n) { ... }` (Caffe's, PyTorch's legacy kernels) heads a statement: with plain names for
    arguments the grammar reads it as a function defined inside the body (C++ has none there), with an expression
    as a call missing its `;`; either way its expansion is the preprocessor's loop."""
    source = ("#define CUDA_KERNEL_LOOP(i, n) for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); "
              "i += blockDim.x * gridDim.x)\n"
              "__global__ void kernel(const float* x, float* y, int n) {\n"
              "    CUDA_KERNEL_LOOP(index, n - 1) { y[index] = x[index]; }\n"
              "    CUDA_KERNEL_LOOP(k, n) { y[k] += 1.0f; }\n}\n")
    ours = expanded(KernelState(source=source, plan=PLAN)).source
    assert "for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < (n); k += blockDim.x * gridDim.x) {" in ours
    assert _tokens(ours) == _tokens(_preprocessed(source))


@pytest.mark.parametrize("defines", [
    "#define SQ(a) a*a\n#undef SQ\n#define SQ(a) (a)*(a)\n",  # defined twice, undefined between
    "#define SQ(a) #a\n",  # stringified
    "#define SQ(a) a##a\n",  # pasted
    "#define SQ(...) __VA_ARGS__\n",  # variadic
    "#define SQ(a) SQ + a\n",  # names itself
    "#define SQ(a, b) a*b\n",  # called with another number of arguments
])
def test_a_macro_whose_expansion_is_not_certain_is_left_as_written(defines):
    source = defines + "__device__ int f(int q) { return SQ(q); }\n"
    assert expanded(KernelState(source=source, plan=PLAN)).source == source


def test_a_row_reduction_indexed_through_a_macro_is_a_site_and_writes_the_expansion():
    source = ("#define AT(r, c, C) ((r) * (C) + (c))\n"
              "__global__ void k(const float* x, float* y, int rows, int cols) {\n"
              "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "    if (r < rows) {\n"
              "        float s = 0.0f;\n"
              "        for (int j = 0; j < cols; ++j) s += x[AT(r, j, cols)];\n"
              "        y[r] = s;\n"
              "    }\n}\n")
    state = KernelState(source=source.replace("void k(", "void kernel("),
                        plan=plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
                                     grid="cdiv(rows, 128)", block=128))
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(state)
    written = transform.forward(state, site).state.source
    assert "AT(" not in written.split("\n", 1)[1] and "((r) * (cols) + (" in written, written


def test_an_object_like_macro_of_a_thread_coordinate_is_the_preprocessors_and_a_site():
    """`#define IDX (blockIdx.x * blockDim.x + threadIdx.x)` used as the index is expanded token for token as cpp
    expands it (inside a call of another macro too), and the elementwise forward finds the kernel; a constant's
    macro stays as written."""
    source = ("#define IDX (blockIdx.x * blockDim.x + threadIdx.x)\n#define SCALE 2.0f\n#define AT(i) y[i]\n"
              "__global__ void kernel(const float* x, float* y, int n) {\n    int i = IDX;\n"
              "    if (i < n) AT(i) = SCALE * x[i];\n    if (IDX == 0) y[0] = 1.0f;\n}\n")
    ours = expanded(KernelState(source=source, plan=PLAN)).source
    assert _tokens(ours) == _tokens(_preprocessed(source).replace("2.0f", "SCALE"))
    assert "int i = (blockIdx.x * blockDim.x + threadIdx.x);" in ours and "= SCALE * x[i]" in ours
    plan = plan_of('"x", "y", { scalar = "n", type = "i32" }', grid="cdiv(n, 256)")
    naive = KernelState(source=source.replace("    if (IDX == 0) y[0] = 1.0f;\n", ""), plan=plan)
    assert [site.key for site in get("scalarize_elementwise").forward_sites(naive)] == ["i"]
