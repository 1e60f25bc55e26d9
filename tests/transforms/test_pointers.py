"""Local pointers into a parameter read through the parameter (klineage/transforms/_pointers.py): a matrix product
that names its row and its batch's start reads as the product untile_matmul tiles, and computes the same bits;
pointers used as pointers, assigned or declared again stay as written."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, get
from klineage.transforms._pointers import inlined
from tests.transforms import emulate
from tests.transforms.golden import HERE, load

BATCHED = load(HERE / "untile_matmul" / "batched", "after", "kernel")
NAMED = BATCHED.source.replace(
    "    int b = blockIdx.z;\n",
    "    int b = blockIdx.z;\n    const float* Ab = A + b * M * K;\n    const float* __restrict__ Bb = B + b * K * N;\n"
).replace(
    "        float acc = 0.0f;\n",
    "        const float* a_row = Ab + r * K;\n        float acc = 0.0f;\n"
).replace("A[b * M * K + r * K + k] * B[b * K * N + k * N + c]", "a_row[k] * Bb[k * N + c]")


def test_named_starts_read_as_the_batched_product():
    named = KernelState(source=NAMED, plan=BATCHED.plan)
    assert named.source != BATCHED.source and "a_row[k] * Bb[k * N + c]" in named.source
    assert inlined(named).source == BATCHED.source
    tile = get("untile_matmul")
    site = Anchor("kernel", "function", "tile")
    assert tile.forward_sites(named) == [site]
    assert tile.forward(named, site).state == tile.forward(BATCHED, site).state


def test_the_tiles_of_the_named_kernel_give_its_bits_on_the_cpu(tmp_path):
    named = KernelState(source=NAMED, plan=BATCHED.plan)
    tiled = get("untile_matmul").forward(named, Anchor("kernel", "function", "tile")).state
    emulate.same_product_bits(named, tiled, tmp_path,
                              lambda m, n, k, g: {"A": torch.randn(3 * m * k, generator=g),
                                                        "B": torch.randn(3 * k * n, generator=g)}, "C", batch=3)


PLAN = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(n, 256)"]\n'
                            'block = [256]\nargs = ["x", "y", { scalar = "n", type = "i32" }]\n')
HEAD = "__global__ void kernel(const float* x, float* y, int n) {\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"


@pytest.mark.parametrize("body", [
    "    const float* p = x + 1;\n    y[i] = *p;\n",  # dereferenced
    "    const float* p = x + 1;\n    y[i] = p[i] + p[0];\n    p = x;\n",  # assigned
    "    const float* p = x + 1;\n    if (i < n) { const float* p = x + 2; y[i] = p[i]; }\n",  # declared again
    "    const float* p = x + n;\n    x = y;\n    y[i] = p[i];\n",  # its parameter assigned
    "    const float* p = x + (n > 4 ? 1 : 0);\n    y[i] = p[i];\n",  # an offset that is no plain arithmetic
    "    const float* p = x + n;\n    n = n + 1;\n    y[i] = p[i];\n",  # a name of its offset assigned after it
    "    const float* p = x + (int)y[0];\n    y[i] = p[i];\n",  # an element of an array the kernel writes
])
def test_a_pointer_the_kernel_uses_otherwise_stays_as_written(body):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert inlined(state) == state


def test_a_pointer_read_only_through_subscripts_is_inlined_with_its_index_kept_whole():
    body = "    const float* p = x + 2 * n;\n    if (i < n) y[i] = p[i] + p[n - i - 1];\n}\n"
    state = KernelState(source=HEAD + body, plan=PLAN)
    assert inlined(state).source == HEAD + "    if (i < n) y[i] = x[2 * n + i] + x[2 * n + n - i - 1];\n}\n"


GATHER_PLAN = LaunchPlan.from_toml(
    'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(rows * cols, 64)"]\nblock = [64]\n'
    'args = ["table", "idx", "out", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }]\n')
GATHER = """__global__ void kernel(const float* table, const int* idx, float* out, int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)rows * cols) {
        int r = i / cols;
        int c = i % cols;
        const float* src = table + (long long)idx[r] * cols;
        out[i] = src[c];
    }
}
"""


def test_a_gathered_rows_start_from_an_array_the_kernel_only_reads_is_inlined(tmp_path):
    """`src = table + idx[r] * cols`: idx is never written, so its element is one value wherever src is read; the
    row-gather forward then packs the copy, and the packed kernel computes the written kernel's bits."""
    state = KernelState(source=GATHER, plan=GATHER_PLAN)
    assert "out[i] = table[(long long)idx[r] * cols + c];" in inlined(state).source
    transform = get("scalarize_row_gather")
    (site,) = transform.forward_sites(state)
    packed = transform.forward(state, site).state

    def inputs(rows, cols):
        g = torch.Generator().manual_seed(cols)
        return ({"rows": rows, "cols": cols}, {"table": torch.randn(5 * cols, generator=g),
                                               "idx": torch.randint(0, 5, (rows,), generator=g, dtype=torch.int32)},
                {"out": (torch.float32, rows * cols)})

    assert emulate.differences(tmp_path, state, {"packed": packed}, ((3, 8), (7, 13)), inputs) == []
