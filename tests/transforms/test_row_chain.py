"""A naive row kernel spelled as people write it (no row pointer: `x[(long long)row * n + j]`; the row's work in
`if (row < rows) { ... }`; the index as `threadIdx.x + blockIdx.x * blockDim.x`; sums as `mean = mean + e` and
`fmaf(d, d, squares)`; a `size_t` column index; the mean normalized after its loop) climbs the whole row chain
by analysis: serialize_reduction (a warp per row), uncache_row (the row in registers across its passes),
scalarize_row_cache (the cache filled 16 bytes a lane at a time). Each step is run on the CPU emulator
(tests/transforms/elementwise_emulator.cpp) against the naive kernel: row lengths short of a warp, past it, not
divisible by 4, divisible, longer than the cache, on misaligned pointers too."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import Anchor, get
from klineage.transforms._canonical import canonical
from tests.transforms import emulate
from tests.transforms.golden import compiles_without_spills, plan_of

NAIVE = KernelState(source="""// Row variance and centred values: two passes over x, no row pointer.
__global__ void kernel(const float* x, float* y, float* var, int rows, int n) {
    int row = threadIdx.x + blockIdx.x * blockDim.x;
    if (row < rows) {
        float mean = 0.0f;
        for (int j = 0; j < n; ++j) mean = mean + x[(long long)row * n + j];
        mean /= n;
        float squares = 0.0f;
        for (size_t j = 0; j < n; j++) {
            float d = x[(long long)row * n + j] - mean;
            squares = fmaf(d, d, squares);
            y[(long long)row * n + j] = d;
        }
        var[row] = squares / n;
    }
}
""", plan=plan_of('"x", "y", "var", { scalar = "rows", type = "i32" }, { scalar = "n", type = "i32" }',
                  grid="cdiv(rows, 128)", block=128))
STEPS = (("serialize_reduction", "row"), ("uncache_row", "x"), ("scalarize_row_cache", "row_cache"))


@pytest.fixture(scope="module")
def chain() -> dict[str, KernelState]:
    """Each step's kernel, by the transform that wrote it, from the one site each finds by analysis."""
    forms, state = {}, NAIVE
    for name, key in STEPS:
        transform = get(name)
        assert transform.forward_sites(state) == [Anchor("kernel", "function", key)], name
        state = forms[name] = transform.forward(state, Anchor("kernel", "function", key)).state
    return forms


def test_each_step_writes_its_mechanism_at_the_rows_offset(chain):
    assert "int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;" in chain["serialize_reduction"].source
    assert chain["serialize_reduction"].plan.launches[0].grid[0] == "(cdiv(rows, 128)) * 32"
    assert chain["uncache_row"].source.count("row_cache[cache_t] = x[(long long)row * n + j];") == 1
    vector = chain["scalarize_row_cache"].source
    # the row's offset has n as a factor: n % 4 == 0 makes it a multiple of 4 already
    assert "const bool row_vec4 = n % 4 == 0 && n <= 32 * 64 && " in vector
    assert "__ldg(reinterpret_cast<const float4*>(&x[(long long)row * n + cache_j4]))" in vector


def test_the_last_step_compiles_without_spills(chain, cache):
    compiles_without_spills(chain["scalarize_row_cache"], cache)


def _inputs(rows: int, n: int):
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(rows * 1000 + n)) * 3 + 1
    return ({"rows": rows, "n": n}, {"x": x.flatten()},
            {"y": (torch.float32, rows * n), "var": (torch.float32, rows)})


def test_every_step_computes_the_naive_values_on_the_cpu(chain, tmp_path):
    binaries = emulate.builds(tmp_path, {"naive": NAIVE, **chain})
    for rows, n in ((3, 5), (5, 32), (4, 70), (3, 256), (2, 2100)):  # 2,100 columns: past the 2,048 cache
        params, inputs, outputs = _inputs(rows, n)
        for shift in (0, 1):  # shift 1: every pointer 4 bytes off 16-byte alignment, the scalar layout
            runs = {name: emulate.run(binary, tmp_path / f"{name}-{rows}x{n}-{shift}", state, params, inputs,
                                      outputs, shift)
                    for name, (binary, state) in binaries.items()}
            for name in chain:
                for out in outputs:  # the warp sums in another order: fp32 reassociation, no more
                    torch.testing.assert_close(runs[name][out], runs["naive"][out], rtol=1e-5, atol=1e-5,
                                               msg=f"{name} {out} rows={rows} n={n} shift={shift}")


def test_each_step_goes_back_to_the_kernel_it_came_from(chain):
    """Backward undoes each step exactly; the first goes back to the naive kernel as the canonical forms spell it
    (its index, and `++j` for `j++`)."""
    naive = canonical(NAIVE)
    naive = KernelState(source=naive.source.replace("j++", "++j"), plan=naive.plan)
    previous = {"serialize_reduction": naive, "uncache_row": chain["serialize_reduction"],
                "scalarize_row_cache": chain["uncache_row"]}
    for name, state in chain.items():
        transform = get(name)
        anchors = [a for a in transform.find(state) if a.kind == "function"]
        assert transform.backward(state, anchors[0]).state == previous[name], name
    assert "int row = blockIdx.x * blockDim.x + threadIdx.x;" in canonical(NAIVE).source
