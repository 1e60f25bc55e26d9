"""Integer locals that only name a place read as their value (klineage/transforms/_index_locals.py): an offset named
before its subscripts is written into them, in parentheses where a sum would regroup, and the forwards then read
the kernel as its plain spelling; a local that could hold another value where it is read stays as written."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._index_locals import counts_inlined, folded
from tests.transforms import emulate
from tests.transforms.golden import plan_of

PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', grid="cdiv(rows, 128)",
               block=128)
HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n" \
       "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r >= rows) return;\n"


def _kernel(body: str) -> KernelState:
    return KernelState(source=HEAD + body + "}\n", plan=PLAN)


def _body(state: KernelState) -> str:
    return state.source.removeprefix(HEAD).removesuffix("}\n")


PLAIN = "    float s = 0.0f;\n    for (int j = 0; j < cols; ++j) s += x[r * cols + j] * x[r * cols + cols - 1 - j];\n" \
        "    y[r] = s;\n"
NAMED = "    const size_t base = r * cols;\n    size_t last = base + cols - 1;\n    float s = 0.0f;\n" \
        "    for (int j = 0; j < cols; ++j) s += x[base + j] * x[last - j];\n    y[r] = s;\n"


def test_named_offsets_read_as_the_plain_spelling(tmp_path):
    """A row's start and its last element named by locals (one from the other): folded, two passes, into the
    subscripts; serialize_reduction finds the plain spelling's site there, and the emulated rows agree."""
    named = _kernel(NAMED)
    assert _body(folded(named)) == PLAIN
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(_kernel(PLAIN))
    assert transform.forward_sites(named) == [site]

    def inputs(rows, cols):
        x = torch.randn(rows * cols, generator=torch.Generator().manual_seed(cols))
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows)}

    forms = {"folded": folded(named), "plain": _kernel(PLAIN)}
    assert emulate.differences(tmp_path, named, forms, ((3, 5), (130, 40)), inputs) == []


@pytest.mark.parametrize("use, written", [
    ("x[j * base]", "x[j * (r * cols)]"),  # a factor: parenthesized
    ("x[cols * rows - base]", "x[cols * rows - (r * cols)]"),  # subtracted: parenthesized
    ("x[base - j]", "x[r * cols - j]"),  # the left of a subtraction, a term of a sum: bare
    ("x[(size_t)base + j]", "x[(size_t)(r * cols) + j]"),  # cast: parenthesized
])
def test_the_value_is_parenthesized_where_a_sum_would_regroup(use, written):
    state = _kernel(f"    int base = r * cols;\n    for (int j = 0; j < cols; ++j) y[j] = {use};\n")
    assert _body(folded(state)) == f"    for (int j = 0; j < cols; ++j) y[j] = {written};\n"


@pytest.mark.parametrize("body", [
    # the local assigned, incremented, or read as a number of its own
    "    int base = r * cols;\n    base += 1;\n    y[base] = x[base];\n",
    "    int base = r * cols;\n    y[base++] = x[0];\n",
    "    int base = r * cols;\n    if (base < rows) y[base] = x[base];\n",
    "    int base = r * cols;\n    y[0] = (float)base;\n",
    # a name of its value written, declared again or addressed after it: the value could change
    "    int c = cols;\n    int base = r * c;\n    c = 2;\n    y[base] = x[0];\n",
    "    int c = cols;\n    int base = r * c;\n    { int c = 3; c += rows; y[base + c] = x[0]; }\n",
    "    int c = cols;\n    int base = r * c;\n    int* p = &c;\n    *p = 1;\n    y[base] = x[0];\n",
    # a thread coordinate (an index local the forwards read by its declaration), a call, a float
    "    int at = blockIdx.x * blockDim.x + threadIdx.x;\n    y[at] = x[at];\n",
    "    int base = min(r, cols);\n    y[base] = x[0];\n",
    "    float base = r * 0.5f;\n    y[(int)base] = x[0];\n",
    # a 32-bit local holding a value formed in 64 bits: it narrows, which the value alone would not
    "    int at = (size_t)r * cols;\n    y[at] = x[at];\n",
    "    long long wide = r;\n    int at = wide * cols;\n    y[at] = x[at];\n",
    "    int at = r * 2L;\n    y[at] = x[at];\n",
    # a subscript of an array the kernel writes
    "    int at = (int)y[0];\n    y[at] = x[at];\n",
])
def test_locals_that_could_hold_another_value_stay_as_written(body):
    state = _kernel(body)
    assert folded(state) is state


def test_a_name_declared_again_in_an_inner_block_folds_as_its_own():
    """The inner block's own `c` folds first (its value 3), then the offset that read the outer `c` (`cols`): each
    use names the element it did."""
    state = _kernel("    int c = cols;\n    int base = r * c;\n    { int c = 3; y[base + c] = x[0]; }\n")
    assert _body(folded(state)) == "    { y[r * (cols) + 3] = x[0]; }\n"


def test_an_offset_named_in_each_loop_folds_in_each():
    """The same name declared in two loops' bodies (each pass sets it afresh) folds in each, and the row forwards
    find the site of the plain spelling."""
    named = _kernel("    float s = 0.0f;\n    for (int j = 0; j < cols; ++j) { int at = r * cols + j; s += x[at]; }\n"
                    "    for (int j = 0; j < cols; ++j) { const int at = r * cols + j; y[at] = x[at] / s; }\n")
    assert "at" not in _body(folded(named)).replace("float", "")
    assert [a.key for a in get("serialize_reduction").forward_sites(named)] == ["r"]


def test_a_count_named_by_a_local_reads_as_its_arithmetic():
    """`int total = rows * cols;` bounding a flat guard and a loop is the product written out there (bare beside a
    comparison, in parentheses as a divisor), and the forwards read it as the plain count."""
    state = _kernel("    int total = rows * cols;\n    for (int j = 0; j < total; ++j) y[j] = x[j] / total;\n")
    assert _body(counts_inlined(state)) == \
        "    for (int j = 0; j < rows * cols; ++j) y[j] = x[j] / (rows * cols);\n"


@pytest.mark.parametrize("body", [
    # written, addressed, of a thread coordinate or an array, declared inside a block, narrowing a 64-bit product
    "    int total = rows * cols;\n    total -= 1;\n    y[0] = x[total];\n",
    "    int total = rows * cols;\n    int* p = &total;\n    y[0] = x[*p];\n",
    "    int total = rows * blockDim.x;\n    y[0] = x[total];\n",
    "    int total = rows * (int)x[0];\n    y[0] = x[total];\n",
    "    { int total = rows * cols; y[0] = x[total]; }\n",
    "    int total = (long long)rows * cols;\n    y[0] = x[total];\n",
    # a parameter it reads written later
    "    int total = rows * cols;\n    cols = 2;\n    y[0] = x[total];\n",
])
def test_counts_that_could_hold_another_value_stay_as_written(body):
    state = _kernel(body)
    assert counts_inlined(state) is state
