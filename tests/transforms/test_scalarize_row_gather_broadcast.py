"""scalarize_row_gather on column broadcasts: an elementwise kernel over a rows x cols matrix that reads an operand
once per column (`bias[c]`, `gamma[i % cols]`: a bias add, the scale and shift after a normalization, a per-channel
scale) gets 16-byte packs of every operand, the broadcast one included (with cols a multiple of the width, the
width's elements share one row and `bias + c` starts a 16-byte block), a scalar path otherwise. Goldens both ways,
nvcc with 128-bit loads of every packed operand, refusals with their reasons, and the naive kernel's bits on the
CPU emulator (row lengths that divide and that do not, a tail, aligned and misaligned pointers)."""

from __future__ import annotations

import pytest
import torch

from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms import emulate
from tests.transforms.golden import HERE, assert_packs_are_128_bit, check_golden, load, plan_of

FOLDER = HERE / "scalarize_row_gather"
SITE = Anchor("kernel", "function", "i")
# case -> the arrays its pack path loads (each one LDG.E.128 in SASS)
CASES = {"bias_gelu_float": ("x", "bias", "scale"), "scale_shift_float": ("x", "gamma", "beta"),
         "bias_residual_half": ("x", "residual", "bias"), "gather_column_bias": ("table", "bias")}
SHAPES = ((5, 16), (37, 24), (6, 13), (3, 1))  # rows, cols: dividing by 4 and 8, and not (a tail)


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_row_gather")


def golden(case: str, which: str) -> KernelState:
    return load(FOLDER / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_row_gather", case)


@pytest.mark.parametrize("case", CASES)
def test_every_packed_operand_the_broadcast_ones_included_is_one_128_bit_load(case, cache):
    """The naive kernel has no 128-bit access; the packed one loads each operand it packs (the broadcast ones too)
    as one LDG.E.128 and stores as STG.E.128, without spills."""
    assert_packs_are_128_bit(golden(case, "after"), golden(case, "before"), cache, loads=len(CASES[case]))


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    assert [a.key for a in transform.forward_sites(golden(case, "after"))] == ["i"]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(golden(case, "after")) == []
    assert [a.key for a in transform.find(golden(case, "before"))] == ["i"]


def test_the_broadcast_pack_starts_at_the_column_and_is_aligned_at_run_time(transform):
    rewrite = transform.forward(golden("bias_gelu_float", "after"), SITE)
    source = rewrite.state.source
    assert "if (cols % 4 == 0 && i + 3 < n && (((size_t)x | (size_t)bias | (size_t)scale | (size_t)out) & 15) " \
           "== 0) {" in source
    assert "const float4 bias4 = *reinterpret_cast<const float4*>(bias + c);" in source
    assert "    long long i = (long long)(blockIdx.x * blockDim.x + threadIdx.x) * 4;\n" in source  # int widened
    assert rewrite.adds == ("vector_type_float4",) and rewrite.carrier == {"width": 4}
    inline = transform.forward(golden("scale_shift_float", "after"), SITE).state.source
    assert "const float4 gamma4 = *reinterpret_cast<const float4*>(gamma + (i % cols));" in inline
    half = transform.forward(golden("bias_residual_half", "after"), SITE)
    assert "const uint4 bias8 = *reinterpret_cast<const uint4*>(bias + h);" in half.state.source
    assert half.adds == ("vector_type_int4",) and half.state.plan.launches[0].grid[0] == \
        "cdiv(cdiv(tokens * hidden, 128), 8)"


def test_an_operand_at_its_column_and_elsewhere_is_refused_with_its_reason(transform):
    state = golden("refused_affine_one_array", "after")
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=r"`affine\[cols \+ c\]` is neither element i, a column `c`, a row's "
                                            r"column `Y \* cols \+ c`, nor one value for the whole row"):
        transform.forward(state, SITE)


PLAN = plan_of('"x", "bias", "out", { scalar = "n", type = "i32" }, { scalar = "cols", type = "i32" }')
HEAD = ("__global__ void kernel(const float* x, const float* bias, float* out, int n, int cols) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) {\n")
SPLIT = "        int c = i % cols;\n"


@pytest.mark.parametrize("body, why", [
    (SPLIT + "        out[i] = x[i] + bias[c] + bias[i];\n", "'bias' is accessed at two places, `c` and `i`"),
    (SPLIT + "        out[i] = x[i] * bias[c] + bias[0];\n", "'bias' is read at a row-wide place and moved as a pack"),
    (SPLIT + "        out[i] = x[i] + bias[c + 1];\n", r"`bias\[c \+ 1\]` is neither element i, a column `c`"),
    (SPLIT + "        bias[c] = x[i];\n        out[i] = x[i];\n", "'bias' is written at column `c`, an element every "
                                                                   "row writes"),
    (SPLIT + "        out[i] = x[i];\n        bias[c] += x[i];\n", "'bias' is written at column `c`"),
    ("        out[i] = x[i];\n        bias[i % cols] = 0.0f;\n", r"written at column `i % cols`"),
    (SPLIT + "        out[i] = x[i] * bias[c] + c;\n", "uses 'c' beyond its subscripts"),
    ("        out[i] = x[i] + bias[i % cols] * (i % cols);\n", "uses 'i' beyond its subscripts"),
    ("        out[i] = x[i] + bias[i % cols] + bias[i % 8];\n", r"by one row length C .* \(it names 8, cols\)"),
    ("        out[i] = x[i] + bias[i % 6];\n", "row length 6 does not divide by the width 4"),
    ("        out[i] = x[i] + bias[(i + 1) % cols];\n", "by one row length C"),
    (SPLIT + "        out[i]++;\n        out[i] = x[i] * bias[c];\n", r"`out\[i\]\+\+` changes an element in place"),
    (SPLIT + "        cols = 4;\n        out[i] = x[i] * bias[c];\n", "no literal and no scalar parameter"),
    (SPLIT + "        if (x[i] > 0.0f) out[i] = x[i] * bias[c];\n", "written only under a condition"),
])
def test_no_site_where_a_broadcast_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "    }\n}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_no_site_for_a_broadcast_of_other_width_or_a_buffer_passed_twice(transform):
    mixed = KernelState(source=HEAD.replace("const float* bias", "const __half* bias") + SPLIT +
                        "        out[i] = x[i] + __half2float(bias[c]);\n    }\n}\n", plan=PLAN)
    with pytest.raises(NotApplicable, match="not all pointers to 32-bit float, int or unsigned, nor all to 16-bit"):
        transform.forward(mixed, SITE)
    halves = KernelState(source="#include <cuda_fp16.h>\n" + HEAD.replace("float*", "__half*") +
                         "        out[i] = __hadd(x[i], bias[i % 4]);\n    }\n}\n", plan=PLAN)
    with pytest.raises(NotApplicable, match="row length 4 does not divide by the width 8"):
        transform.forward(halves, SITE)
    twice = KernelState(source=HEAD + SPLIT + "        out[i] = x[i] + bias[c];\n    }\n}\n",
                        plan=plan_of('"x", "x", "out", { scalar = "n", type = "i32" }, '
                                     '{ scalar = "cols", type = "i32" }'))
    with pytest.raises(NotApplicable, match="one buffer twice"):
        transform.forward(twice, SITE)


def test_the_forwarded_bias_gelu_passes_the_compile_only_gate_on_its_problem(tmp_path):
    """Its own problem (the GPU test's): the static check, nvcc and the plan resolved for every case."""
    cache = GateCache(tmp_path / "cache", tmp_path / "recorded")
    verdict = run_gate(FOLDER / "bias_gelu_float" / "problem.py", golden("bias_gelu_float", "before"),
                       mode=GateMode.COMPILE_ONLY, cache=cache)
    assert verdict.status is Status.COMPILED, verdict.findings


# --- what the packs compute, on the CPU ---------------------------------------------------------------------

# a row-wide operand (one value per row, `inv[r]`) beside a broadcast one, the row length a literal: written here
ROW_SCALE = KernelState(
    source="__global__ void kernel(const float* x, const float* inv, const float* gamma, float* out, int n) {\n"
           "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
           "    if (i < n) {\n"
           "        int r = i / 16, c = i % 16;\n"
           "        out[i] = x[i] * inv[r] * gamma[c];\n"
           "    }\n"
           "}\n",
    plan=plan_of('"x", "inv", "gamma", "out", { scalar = "rows * 16", type = "i32" }', grid="cdiv(rows * 16, 64)",
                 block=64))


def _inputs(case: str, rows: int, cols: int) -> tuple[dict, dict, dict]:
    """(params, inputs, outputs) of a case for `rows` rows of `cols`."""
    generator = torch.Generator().manual_seed(rows * 1000 + cols)

    def randn(count: int, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(count, generator=generator).to(dtype)

    n = rows * cols
    if case == "bias_gelu_float":
        return {"rows": rows, "cols": cols}, {"x": randn(n), "bias": randn(cols), "scale": randn(cols)}, \
            {"out": (torch.float32, n)}
    if case == "scale_shift_float":
        return {"rows": rows, "cols": cols}, {"x": randn(n), "gamma": randn(cols), "beta": randn(cols)}, \
            {"out": (torch.float32, n)}
    if case == "bias_residual_half":
        return {"tokens": rows, "hidden": cols}, \
            {"x": randn(n, torch.half), "residual": randn(n, torch.half), "bias": randn(cols, torch.half)}, \
            {"y": (torch.float16, n)}
    if case == "row_scale":
        return {"rows": rows}, {"x": randn(rows * 16), "inv": randn(rows), "gamma": randn(16)}, \
            {"out": (torch.float32, rows * 16)}
    table = 7
    return {"rows": rows, "cols": cols}, \
        {"table": randn(table * cols), "bias": randn(cols),
         "idx": torch.randint(0, table, (rows,), generator=generator, dtype=torch.int32)}, \
        {"out": (torch.float32, n)}


def _emulated(tmp_path, case: str, naive: KernelState, sources: dict[str, KernelState]) -> list[str]:
    return emulate.differences(tmp_path, naive, sources, SHAPES, lambda rows, cols: _inputs(case, rows, cols))


@pytest.mark.parametrize("case", CASES)
def test_the_packed_kernel_computes_the_naive_kernels_bits_on_the_cpu(case, tmp_path):
    assert _emulated(tmp_path, case, golden(case, "after"), {"packed": golden(case, "before")}) == []


def test_a_row_wide_operand_beside_a_broadcast_one_computes_the_naive_bits(transform, tmp_path):
    packed = transform.forward(ROW_SCALE, SITE).state
    assert "const float4 gamma4 = *reinterpret_cast<const float4*>(gamma + c);" in packed.source
    assert "inv[r]" in packed.source and "inv4" not in packed.source  # read once per pack, never packed
    assert _emulated(tmp_path, "row_scale", ROW_SCALE, {"packed": packed}) == []


def test_the_emulation_sees_two_broadcast_lanes_traded(tmp_path):
    """The check can fail: lanes 1 and 2 of the broadcast bias traded compute other bits where the pack path runs
    (row lengths that divide by four, aligned pointers) and nowhere else."""
    packed = golden("bias_gelu_float", "before")
    swapped = packed.source.replace("x4.y + bias4.y", "x4.y + bias4.z").replace("x4.z + bias4.z", "x4.z + bias4.y")
    assert swapped != packed.source
    differences = _emulated(tmp_path, "bias_gelu_float", golden("bias_gelu_float", "after"),
                            {"swapped": KernelState(source=swapped, plan=packed.plan)})
    assert differences and all(d.split()[1] in ("5x16-0", "37x24-0") for d in differences), differences
