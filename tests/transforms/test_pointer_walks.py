"""Pointers walked by a counted loop read at the loop's index (klineage/transforms/_pointer_walks.py): a row summed
through `*p; ++p;` reads as its subscripts, the row forwards find the site they find there, and the emulated rows
agree; a walk that could read another element, or a pointer read otherwise, stays as written."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._pointer_walks import walked
from tests.transforms import emulate
from tests.transforms.golden import plan_of

PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', grid="cdiv(rows, 128)",
               block=128)
HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n" \
       "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r >= rows) return;\n" \
       "    const float* p = x + r * cols;\n    float s = 0.0f;\n"


def _kernel(loop: str) -> KernelState:
    return KernelState(source=HEAD + loop + "    y[r] = s;\n}\n", plan=PLAN)


SUBSCRIPTS = "    for (int j = 0; j < cols; ++j) {\n        s += p[j] * p[j] - p[j + (1)];\n    }\n"
WALKS = {
    "++p": "    for (int j = 0; j < cols; ++j) {\n        s += *p * *p - p[1];\n        ++p;\n    }\n",
    "p += 1": "    for (int j = 0; j < cols; j++) {\n        s += (*p) * (*p) - p[1];\n        p += 1;\n    }\n",
}


@pytest.mark.parametrize("walk", WALKS)
def test_a_walked_row_reads_as_its_subscripts(walk, tmp_path):
    """`*p` is p[j] and `p[1]` is p[j + (1)] at step j, the step gone; serialize_reduction finds the site it finds on
    the subscript spelling, and the emulated sums agree (rows shorter and longer than a block)."""
    state = _kernel(WALKS[walk])
    expected = _kernel(SUBSCRIPTS).source
    if walk == "p += 1":  # the parentheses it was written with stay
        expected = expected.replace("++j", "j++").replace("p[j] * p[j]", "(p[j]) * (p[j])")
    assert walked(state).source == expected
    transform = get("serialize_reduction")
    assert [a.key for a in transform.forward_sites(state)] == ["r"]

    def inputs(rows, cols):
        x = torch.randn(rows * cols + 1, generator=torch.Generator().manual_seed(cols))
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows)}

    assert emulate.differences(tmp_path, state, {"walked": walked(state)}, ((3, 5), (130, 40)), inputs) == []


def test_a_column_walk_reads_at_its_stride():
    state = _kernel("    for (int i = 0; i < rows; ++i) {\n        s += *p;\n        p += cols;\n    }\n")
    assert "        s += p[i * cols];\n    }\n" in walked(state).source


@pytest.mark.parametrize("loop", [
    # a step the body can skip, a step that is not last, a stride or index the loop writes
    "    for (int j = 0; j < cols; ++j) {\n        if (j == 2) continue;\n        s += *p;\n        ++p;\n    }\n",
    "    for (int j = 0; j < cols; ++j) {\n        ++p;\n        s += *p;\n    }\n",
    "    int k = 1;\n    for (int j = 0; j < cols; ++j) {\n        s += *p;\n        k = j;\n        p += k;\n    }\n",
    "    for (int j = 0; j < cols; ++j) {\n        s += *p;\n        j += 1;\n        ++p;\n    }\n",
    # the pointer read after its loop, or as a pointer, or stepped twice
    "    for (int j = 0; j < cols; ++j) {\n        s += *p;\n        ++p;\n    }\n    s += *p;\n",
    "    for (int j = 0; j < cols; ++j) {\n        s += *(p + 1);\n        ++p;\n    }\n",
    "    for (int j = 0; j < cols; ++j) {\n        s += *p++;\n        ++p;\n    }\n",
    # a loop that is not counted from 0 by one
    "    for (int j = 1; j < cols; ++j) {\n        s += *p;\n        ++p;\n    }\n",
    "    for (int j = 0; j < cols; j += 2) {\n        s += *p;\n        ++p;\n    }\n",
])
def test_walks_that_could_read_another_element_stay_as_written(loop):
    state = _kernel(loop)
    assert walked(state) is state
