"""untile_transpose: a transpose staged through a padded 32x33 shared tile becomes a direct strided copy;
forward finds naive transposes by analysis and sets the (32, 8) block and the tile grid in the plan."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

SITE = Anchor("kernel", "function", "tile")


@pytest.fixture(scope="module")
def transform():
    return get("untile_transpose")


def golden(which: str) -> KernelState:
    return load(HERE / "untile_transpose" / "float", which, "kernel")


def test_golden():
    check_golden("untile_transpose", "float")


def test_golden_kernels_compile(cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(which), cache)


def test_forward_finds_the_naive_transpose_by_analysis(transform):
    assert transform.forward_sites(golden("after")) == [SITE]
    assert transform.forward_sites(golden("before")) == []
    tiled = transform.forward(golden("after"), SITE).state
    assert "__shared__ float tile[32][33];" in tiled.source
    assert tiled.plan.launches[0].block == (32, 8, 1)
    assert tiled.plan.launches[0].grid[:2] == ("cdiv(cols, 32)", "cdiv(rows, 32)")


def _state(body: str, args: str = '"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }'):
    plan = (HERE / "untile_transpose" / "float" / "after.toml").read_text()
    plan = plan.replace('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', args)
    source = ("__global__ void kernel(const float* x, float* y, int rows, int cols) {\n"
              "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n    int r = blockIdx.y * blockDim.y + threadIdx.y;\n"
              + body + "}\n")
    return KernelState(source=source, plan=LaunchPlan.from_toml(plan))


@pytest.mark.parametrize("body, args, why", [
    ("    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c] + 1.0f;\n", None, "not a naive transpose"),
    ("    if (r >= rows && c >= cols) return;\n    y[c * rows + r] = x[r * cols + c];\n", None, "not a naive"),
    ("    if (r >= rows || c >= cols) return;\n    y[c * rows + r] = x[r * cols + c];\n    y[0] = 0.0f;\n", None,
     "not a naive"),
    ("    if (r < cols && c < rows) y[c * rows + r] = x[r * cols + c];\n", None, "bounds do not match"),
    ("    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c];\n    y[0] = 0.0f;\n", None, "not a naive"),
    ("    if (r < rows && c < cols) y[c * rows + r] = x[r * cols + c];\n",
     '"x", "x", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', "one buffer twice"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, args, why):
    state = _state(body, args) if args else _state(body)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


SPELLED = {  # body -> whether its subscripts are 64-bit
    "    if (r >= rows || c >= cols) return;\n    y[c * rows + r] = x[r * cols + c];\n": False,
    "    if (c >= cols || r >= rows) return;\n    y[c * rows + r] = x[r * cols + c];\n": False,
    "    if (r < rows && c < cols) {\n        y[c * rows + r] = x[r * cols + c];\n    }\n": False,
    "    if (r < rows && c < cols) y[(size_t)c * rows + r] = x[(size_t)r * cols + c];\n": True,
    "    if (r >= rows || c >= cols) return;\n    y[(long long)c * rows + r] = x[r * cols + c];\n": True,
}


@pytest.mark.parametrize("body", sampled(list(SPELLED), keep=list(SPELLED)[-1:]))
def test_a_transpose_spelled_another_common_way_is_tiled_and_a_64_bit_one_stays_64_bit(transform, cache, body):
    wide = SPELLED[body]
    (site,) = transform.forward_sites(_state(body))
    tiled = transform.forward(_state(body), site).state
    cast = "(size_t)" if wide else ""
    assert f"x[{cast}(r + k) * cols + c]" in tiled.source and f"y[{cast}(r_out + k) * rows + c_out]" in tiled.source
    naive = transform.backward(tiled, transform.find(tiled)[0]).state
    assert f"if (r < rows && c < cols) y[{cast}c * rows + r] = x[{cast}r * cols + c];" in naive.source
    assert transform.forward(naive, site).state.source == tiled.source
    compiles_without_spills(tiled, cache)
