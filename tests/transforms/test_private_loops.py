"""A row loop whose columns each run a loop of their own (`_warp_reduction._private_loop`): a thread per row that
reduces over its output columns' products (a linear layer's row summed, or its logsumexp), each column's dot over k
its own, gets a warp (and a block) a row, the lanes taking the columns and each running its columns' dots whole. On
whole numbers, which any order sums exactly, the warp and block forms give the naive kernel's bits on the CPU
emulator; a column loop that writes memory, reads the row's sum or assigns what another column sees is refused."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms import emulate

PLAN_TEXT = ('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(m, 128)"]\nblock = [128]\n'
             'args = ["x", "W", "b", "out", { scalar = "m", type = "i32" }, { scalar = "n", type = "i32" }, '
             '{ scalar = "k", type = "i32" }]\n')
PLAN = LaunchPlan.from_toml(PLAN_TEXT)
HEAD = ("__global__ void kernel(const float* x, const float* W, const float* b, float* out, int M, int N, int K) {\n"
        "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r >= M) return;\n")
DOT = "        for (int k = 0; k < K; ++k) acc += x[r * K + k] * W[n * K + k];\n"
ROW_SUM = HEAD + ("    float s = 0.0f;\n    for (int n = 0; n < N; ++n) {\n        float acc = 0.0f;\n" + DOT +
                  "        s += fmaxf(acc + b[n], 0.0f);\n    }\n    out[r] = s;\n}\n")
FORWARDS = ("serialize_reduction", "serialize_block_reduction")


def _whole(m: int, n: int, k: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(m * n + k)
    x, w, b = (torch.randint(-3, 4, (count,), generator=g).float() for count in (m * k, n * k, n))
    return {"m": m, "n": n, "k": k}, {"x": x, "W": w, "b": b}, {"out": (torch.float32, m)}


@pytest.mark.parametrize("name", FORWARDS)
def test_the_row_sum_of_a_linear_layer_gets_its_lanes_and_the_naive_bits(name, tmp_path):
    state = KernelState(source=ROW_SUM, plan=PLAN)
    transform = get(name)
    (site,) = transform.forward_sites(state)
    shared = transform.forward(state, site).state
    assert DOT in shared.source  # each lane runs its columns' dots whole
    assert emulate.differences(tmp_path, state, {name: shared}, ((3, 5, 4), (40, 70, 9), (2, 300, 3)), _whole) == []


def test_a_rows_column_values_stored_then_read_back_get_a_warp_and_the_naive_bits(tmp_path):
    """Two passes over the columns, as a logsumexp of a linear layer takes them: the first stores each column's value
    (its sum started from the bias) and keeps the maximum, the second reads what it stored: the lane that stored a
    column reads it back. Whole numbers (the second pass sums differences, not exponentials) show every bit."""
    source = HEAD.replace("float* out,", "float* tmp, float* out,") + (
        "    float mx = -INFINITY;\n    for (int n = 0; n < N; ++n) {\n        float acc = b[n];\n" + DOT +
        "        tmp[r * N + n] = acc;\n        mx = fmaxf(mx, acc);\n    }\n"
        "    float s = 0.0f;\n    for (int n = 0; n < N; ++n) s += tmp[r * N + n] - mx;\n"
        "    out[r] = mx + s;\n}\n")
    state = KernelState(source=source, plan=LaunchPlan.from_toml(PLAN_TEXT.replace('"b", "out"', '"b", "tmp", "out"')))
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(state)
    warp = transform.forward(state, site).state

    def inputs_of(m: int, n: int, k: int) -> tuple[dict, dict, dict]:
        params, inputs, _ = _whole(m, n, k)
        return params, inputs, {"out": (torch.float32, m), "tmp": (torch.float32, m * n)}

    assert emulate.differences(tmp_path, state, {"warp": warp}, ((3, 5, 4), (40, 70, 9)), inputs_of) == []


def test_no_site_where_a_columns_own_loop_assigns_a_name_declared_after_it():
    """`t` declared again after the column's loop: the loop assigns the row's `t` (declared before the row loop),
    which the next column and the store after the loop see."""
    source = ROW_SUM.replace("    float s = 0.0f;\n", "    float s = 0.0f;\n    float t = 0.0f;\n").replace(
        "acc += x[r * K + k] * W[n * K + k];", "{ acc += x[r * K + k] * W[n * K + k]; t = acc; }").replace(
        "        s += fmaxf(acc + b[n], 0.0f);\n", "        float t = acc;\n        s += fmaxf(t + b[n], 0.0f);\n"
    ).replace("out[r] = s;", "out[r] = s + t;")
    state = KernelState(source=source, plan=PLAN)
    for name in FORWARDS:
        assert get(name).forward_sites(state) == [], name


@pytest.mark.parametrize("new, why", [
    # the column's loop writes memory (another lane's column may read it), or assigns what every column sees
    ("{ acc += x[r * K + k] * W[n * K + k]; out[k] = 0.0f; }", "no store or reduction"),
    ("{ acc += x[r * K + k] * W[n * K + k]; M = k; }", "no store or reduction"),
    ("acc += s * x[r * K + k] * W[n * K + k];", "read inside its loop"),  # the row's sum, a lane's partial
    ("acc += atomicAdd(out, 1.0f);", "synchronizes"),
])
def test_no_site_where_a_columns_own_loop_could_tell(new, why):
    state = KernelState(source=ROW_SUM.replace("acc += x[r * K + k] * W[n * K + k];", new), plan=PLAN)
    for name in FORWARDS:
        assert get(name).forward_sites(state) == [], name
    with pytest.raises(NotApplicable, match=why):
        get("serialize_reduction").forward(state, Anchor("kernel", "function", "r"))
