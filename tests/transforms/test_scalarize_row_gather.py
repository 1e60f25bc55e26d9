"""scalarize_row_gather: 16 bytes of a row per thread, reached through a computed row base (an index array, a
permutation) or read once per column (a column broadcast: `bias[c]`, `gamma[i % cols]`) and moved as one vector
where the row length divides and the pointers are aligned, a scalar path otherwise, become one element per thread;
forward finds its sites by analysis and refuses, with the reason, where it cannot show the rewrite legal; what it
writes computes the naive kernel's bits (CPU emulator: row lengths that divide and that do not, aligned and
misaligned pointers, a tail)."""

from __future__ import annotations

import pytest
import torch

from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.kernel import KernelState
from klineage.skills.materialize import structural_transforms
from klineage.transforms import Anchor, NotApplicable, get
from sampled import sampled
from shared_cache import share
from tests.transforms import emulate
from tests.transforms.golden import HERE, assert_packs_are_128_bit, check_golden, load, plan_of

# case -> the arrays its pack path loads (each one LDG.E.128 in SASS); the last four read column broadcasts
CASES = {"embedding_float": ("weight",), "gather_half": ("src",), "scatter_rows_int": ("src",),
         "select_rows_int_index": ("table",), "bias_gelu_float": ("x", "bias", "scale"),
         "scale_shift_float": ("x", "gamma", "beta"), "bias_residual_half": ("x", "residual", "bias"),
         "gather_column_bias": ("table", "bias")}
SITE = Anchor("kernel", "function", "i")
FOLDER = HERE / "scalarize_row_gather"


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_row_gather")


def golden(case: str, which: str) -> KernelState:
    return load(FOLDER / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_row_gather", case)


# a float row gather and a half kernel of three arrays by default; the other goldens: -m slow
@pytest.mark.parametrize("case", sampled(CASES, keep=("embedding_float", "bias_residual_half")))
def test_golden_kernels_compile_without_spills_and_the_packs_are_128_bit(case, cache):
    """The naive kernel has no 128-bit access; the packed one loads each array it packs (broadcast ones too) as one
    LDG.E.128 and stores as STG.E.128, without spills."""
    assert_packs_are_128_bit(golden(case, "after"), golden(case, "before"), cache, loads=len(CASES[case]))


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    assert [a.key for a in transform.forward_sites(golden(case, "after"))] == ["i"]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(golden(case, "after")) == []
    assert [a.key for a in transform.find(golden(case, "before"))] == ["i"]


def test_the_pack_path_is_guarded_the_row_base_read_once_and_the_rest_scalar(transform):
    rewrite = transform.forward(golden("embedding_float", "after"), SITE)
    source = rewrite.state.source
    assert "if (dim % 4 == 0 && i + 3 < (long long)n_tokens * dim && (((size_t)weight | (size_t)out) & 15) == 0) {" \
        in source
    assert source.count("tokens[t]") == 2  # once for the pack, once in the scalar loop
    assert "for (long long e = i; e < (long long)n_tokens * dim && e < i + 4; ++e) {" in source
    assert rewrite.state.plan.launches[0].grid[0] == "cdiv(cdiv(n_tokens * dim, 256), 4)"
    assert rewrite.adds == ("vector_type_float4",) and rewrite.carrier == {"width": 4}
    half = transform.forward(golden("gather_half", "after"), SITE)
    assert half.adds == ("vector_type_int4",) and half.carrier == {"width": 8}
    assert half.state.plan.launches[0].grid[0] == "cdiv(cdiv(n, 128), 8)"


def test_the_bundled_devectorize_cards_lend_it_their_sites():
    """A card of devectorize (16-byte vector accesses) proposes this transform's sites: retrieval by structure."""
    from klineage.skills.library import bundled_library, load_library

    cards = [c for c in load_library(bundled_library()).cards if c.transform == "devectorize"]
    assert cards
    assert all("scalarize_row_gather" in {t.name for t in structural_transforms(c)} for c in cards)


def test_a_32_bit_element_index_is_widened_before_it_is_scaled(transform):
    """`int i` times four may wrap where i did not: the vector form's index is 64-bit, from the exact 32-bit
    thread index, and backward gives the `int` index back."""
    packed = transform.forward(golden("select_rows_int_index", "after"), SITE).state.source
    assert "    long long i = (long long)(blockIdx.x * blockDim.x + threadIdx.x) * 4;\n" in packed
    assert "int i" not in packed


PLAN = plan_of('"table", "idx", "out", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
               grid="cdiv(rows * cols, 256)")
HEAD = ("__global__ void kernel(const float* table, const int* idx, float* out, int rows, int cols) {\n"
        "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i >= (long long)rows * cols) return;\n")
SPLIT = "    int r = i / cols, c = i % cols;\n"
ROW = "table[(long long)idx[r] * cols + c]"


@pytest.mark.parametrize("body, why", [
    ("    int r = i / 6, c = i % 6;\n    out[i] = table[(long long)idx[r] * 6 + c];\n",
     "row length 6 does not divide by the width 4"),
    (SPLIT + f"    out[i] = {ROW} * idx[c];\n", "'idx' is read at a row-wide place and moved as a pack"),
    (SPLIT + "    out[i] = table[(long long)idx[r] * cols + c + 1];\n", "is neither element i"),
    (SPLIT + "    out[i] = table[(long long)idx[r] * (cols + 1) + c];\n", "is neither element i"),
    (SPLIT + f"    out[i] = {ROW} + c;\n", "uses 'c' beyond its subscripts"),
    (SPLIT + f"    out[i] = {ROW} - table[i];\n", "'table' is accessed at two places"),
    (SPLIT + f"    idx[r] = 0;\n    out[i] = {ROW};\n", "a place the whole row shares"),
    (SPLIT + "    out[i] = table[(long long)out[r] * cols + c];\n", "'out' is read at a row-wide place"),
    (SPLIT + f"    out[i] = foo({ROW});\n", "calls foo"),
    (SPLIT + f"    if (idx[r] >= 0) out[i] = {ROW};\n", "written only under a condition"),
    (SPLIT + "    r = idx[r];\n    out[i] = table[(long long)r * cols + c];\n", "assigns its row or column 'r'"),
    (SPLIT + "    out[i] = *(table + (long long)idx[r] * cols + c);\n", "dereferences a pointer"),
    (SPLIT + f"    out[i] = {ROW};\n    cols = 0;\n", "assigns 'cols' of its bound"),  # the tail reads it again
    (SPLIT + f"    float e = {ROW};\n    out[i] = e;\n", "names 'e'"),
    ("    int r = i / cols, e = i % cols;\n    out[i] = table[(long long)idx[r] * cols + e];\n", "names 'e'"),
    ("    int r = i / cols, c4 = i % cols;\n    out[i] = table[(long long)idx[r] * cols + c4];\n", "a pack would take"),
    ("    out[i] = table[i];\n", "does not split 'i' by one row length C"),
    ("    int r = i / cols, c = i % rows;\n    out[i] = table[(long long)idx[r] * cols + c];\n",
     r"by one row length C .* \(it names cols, rows\)"),
    (SPLIT + f"    for (int k = 0; k < 2; ++k) out[i] = {ROW};\n", "loops"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


UNPACKABLE = r"not all pointers to float, double, int, unsigned, 64-bit or 8-bit integers, nor all to __half"


def test_no_site_for_data_it_cannot_pack_or_a_buffer_passed_twice(transform):
    mixed = KernelState(source="#include <cuda_fp16.h>\n" + HEAD.replace("float* out", "__half* out") + SPLIT +
                        f"    out[i] = __float2half({ROW});\n}}\n",
                        plan=PLAN)
    with pytest.raises(NotApplicable, match=UNPACKABLE):
        transform.forward(mixed, SITE)
    twice = KernelState(source=HEAD + SPLIT + f"    out[i] = {ROW};\n}}\n",
                        plan=plan_of('"table", "idx", "table", { scalar = "rows", type = "i32" }, '
                                     '{ scalar = "cols", type = "i32" }', grid="cdiv(rows * cols, 256)"))
    with pytest.raises(NotApplicable, match="one buffer twice"):
        transform.forward(twice, SITE)


@pytest.mark.parametrize("case", ["embedding_float", "bias_gelu_float"])
def test_the_forwarded_kernel_passes_the_compile_only_gate_on_its_problem(case, tmp_path, shared_cache):
    """Its own problem (the GPU test's): the static check, nvcc and the plan resolved for every case."""
    cache = GateCache(share(tmp_path / "cache", shared_cache), tmp_path / "recorded")  # probes, compiles: the run's
    verdict = run_gate(FOLDER / case / "problem.py", golden(case, "before"), mode=GateMode.COMPILE_ONLY, cache=cache)
    assert verdict.status is Status.COMPILED, verdict.findings


# --- column broadcasts -------------------------------------------------------------------------------------

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


BROADCAST_PLAN = plan_of('"x", "bias", "out", { scalar = "n", type = "i32" }, { scalar = "cols", type = "i32" }')
BROADCAST_HEAD = ("__global__ void kernel(const float* x, const float* bias, float* out, int n, int cols) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) {\n")
COLUMN = "        int c = i % cols;\n"


@pytest.mark.parametrize("body, why", [
    (COLUMN + "        out[i] = x[i] + bias[c] + bias[i];\n", "'bias' is accessed at two places, `c` and `i`"),
    (COLUMN + "        out[i] = x[i] * bias[c] + bias[0];\n", "'bias' is read at a row-wide place and moved as a pack"),
    (COLUMN + "        out[i] = x[i] + bias[c + 1];\n", r"`bias\[c \+ 1\]` is neither element i, a column `c`"),
    (COLUMN + "        bias[c] = x[i];\n        out[i] = x[i];\n", "'bias' is written at column `c`, an element every "
                                                                   "row writes"),
    (COLUMN + "        out[i] = x[i];\n        bias[c] += x[i];\n", "'bias' is written at column `c`"),
    ("        out[i] = x[i];\n        bias[i % cols] = 0.0f;\n", r"written at column `i % cols`"),
    (COLUMN + "        out[i] = x[i] * bias[c] + c;\n", "uses 'c' beyond its subscripts"),
    ("        out[i] = x[i] + bias[i % cols] * (i % cols);\n", "uses 'i' beyond its subscripts"),
    ("        out[i] = x[i] + bias[i % cols] + bias[i % 8];\n", r"by one row length C .* \(it names 8, cols\)"),
    ("        out[i] = x[i] + bias[i % 6];\n", "row length 6 does not divide by the width 4"),
    ("        out[i] = x[i] + bias[(i + 1) % cols];\n", "by one row length C"),
    (COLUMN + "        out[i]++;\n        out[i] = x[i] * bias[c];\n", r"`out\[i\]\+\+` changes an element in place"),
    (COLUMN + "        cols = 4;\n        out[i] = x[i] * bias[c];\n", "no literal and no scalar parameter"),
    (COLUMN + "        if (x[i] > 0.0f) out[i] = x[i] * bias[c];\n", "written only under a condition"),
])
def test_no_site_where_a_broadcast_would_not_be_legal(transform, body, why):
    state = KernelState(source=BROADCAST_HEAD + body + "    }\n}\n", plan=BROADCAST_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_no_site_for_a_broadcast_of_other_width_or_a_buffer_passed_twice(transform):
    mixed = KernelState(source=BROADCAST_HEAD.replace("const float* bias", "const __half* bias") + COLUMN +
                        "        out[i] = x[i] + __half2float(bias[c]);\n    }\n}\n", plan=BROADCAST_PLAN)
    with pytest.raises(NotApplicable, match=UNPACKABLE):
        transform.forward(mixed, SITE)
    halves = KernelState(source="#include <cuda_fp16.h>\n" + BROADCAST_HEAD.replace("float*", "__half*") +
                         "        out[i] = __hadd(x[i], bias[i % 4]);\n    }\n}\n", plan=BROADCAST_PLAN)
    with pytest.raises(NotApplicable, match="row length 4 does not divide by the width 8"):
        transform.forward(halves, SITE)
    twice = KernelState(source=BROADCAST_HEAD + COLUMN + "        out[i] = x[i] + bias[c];\n    }\n}\n",
                        plan=plan_of('"x", "x", "out", { scalar = "n", type = "i32" }, '
                                     '{ scalar = "cols", type = "i32" }'))
    with pytest.raises(NotApplicable, match="one buffer twice"):
        transform.forward(twice, SITE)


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


def _inputs(case: str, rows: int, cols: int, tail: int) -> tuple[dict, dict, dict]:
    """(params, inputs, outputs) of a golden case: `rows` rows of `cols`, `tail` elements short of the whole
    where the case's bound is its own parameter (the broadcast cases' bound is rows * cols: a row length that
    does not divide by the width makes their tail)."""
    generator = torch.Generator().manual_seed(rows * 1000 + cols)

    def randn(count: int, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(count, generator=generator).to(dtype)

    n = rows * cols
    broadcast = {"bias_gelu_float": ({"rows": rows, "cols": cols},
                                     {"x": randn(n), "bias": randn(cols), "scale": randn(cols)}),
                 "scale_shift_float": ({"rows": rows, "cols": cols},
                                       {"x": randn(n), "gamma": randn(cols), "beta": randn(cols)}),
                 "gather_column_bias": ({"rows": rows, "cols": cols},
                                        {"table": randn(7 * cols), "bias": randn(cols),
                                         "idx": torch.randint(0, 7, (rows,), generator=generator, dtype=torch.int32)})}
    if case in broadcast:
        return (*broadcast[case], {"out": (torch.float32, n)})
    if case == "bias_residual_half":
        return ({"tokens": rows, "hidden": cols},
                {"x": randn(n, torch.half), "residual": randn(n, torch.half), "bias": randn(cols, torch.half)},
                {"y": (torch.float16, n)})
    if case == "row_scale":
        return ({"rows": rows}, {"x": randn(rows * 16), "inv": randn(rows), "gamma": randn(16)},
                {"out": (torch.float32, rows * 16)})
    if case == "embedding_float":
        vocab = 11
        return ({"n_tokens": rows, "dim": cols},
                {"weight": torch.randn(vocab * cols, generator=generator),
                 "tokens": torch.randint(0, vocab, (rows,), generator=generator, dtype=torch.int64)},
                {"out": (torch.float32, rows * cols)})
    if case == "select_rows_int_index":
        table = 13
        return ({"rows": rows, "cols": cols},
                {"table": torch.randn(table * cols, generator=generator),
                 "idx": torch.randint(0, table, (rows,), generator=generator, dtype=torch.int32)},
                {"out": (torch.float32, rows * cols)})
    if case == "gather_half":
        table = 9
        return ({"gain": 0.75, "n": rows * cols - tail, "width": cols},
                {"src": torch.randn(table * cols, generator=generator).half(),
                 "perm": torch.randint(0, table, (rows,), generator=generator, dtype=torch.int32)},
                {"dst": (torch.float16, rows * cols)})
    return ({"rows": rows, "cols": cols},
            {"src": torch.randint(-1000, 1000, (rows * cols,), generator=generator, dtype=torch.int32),
             "dest": torch.randperm(rows, generator=generator).to(torch.int32),
             "keep": torch.randint(0, 2, (rows,), generator=generator, dtype=torch.int32)},
            {"out": (torch.int32, rows * cols)})


SHAPES = ((5, 16, 0), (37, 24, 3), (6, 13, 5), (3, 1, 0))  # rows, cols (dividing by the width and not), tail


def _emulated(tmp_path, case: str, sources: dict[str, KernelState], naive: KernelState | None = None) -> list[str]:
    """Where the forms of `sources` compute other bits than the naive kernel (the case's golden unless given; empty
    when nowhere): row lengths that divide by the width and that do not, a tail, aligned and misaligned (shift 1)
    pointers."""
    return emulate.differences(tmp_path, naive or golden(case, "after"), sources, SHAPES,
                               lambda rows, cols, tail: _inputs(case, rows, cols, tail))


# one float gather and one half broadcast case by default; the other dtypes and shapes of the same packing under -m slow
@pytest.mark.parametrize("case", sampled(CASES, keep=("embedding_float", "bias_residual_half")))
def test_the_packed_kernel_computes_the_naive_kernels_bits_on_the_cpu(case, tmp_path):
    assert _emulated(tmp_path, case, {"packed": golden(case, "before")}) == []


def test_a_row_wide_operand_beside_a_broadcast_one_computes_the_naive_bits(transform, tmp_path):
    packed = transform.forward(ROW_SCALE, SITE).state
    assert "const float4 gamma4 = *reinterpret_cast<const float4*>(gamma + c);" in packed.source
    assert "inv[r]" in packed.source and "inv4" not in packed.source  # read once per pack, never packed
    assert _emulated(tmp_path, "row_scale", {"packed": packed}, naive=ROW_SCALE) == []


# the row length a local of two parameters and the column split before the guard (`sunk` moves it into the work)
LOCAL_ROW = KernelState(
    source="__global__ void kernel(const float* x, const float* gamma, float* out, int rows, int groups, int group) {\n"
           "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
           "    const int cols = groups * group;\n"
           "    int c = i % cols;\n"
           "    if (i >= rows * cols) return;\n"
           "    out[i] = x[i] * gamma[c];\n"
           "}\n",
    plan=plan_of('"x", "gamma", "out", { scalar = "rows", type = "i32" }, { scalar = "groups", type = "i32" }, '
                 '{ scalar = "group", type = "i32" }', grid="cdiv(rows * groups * group, 64)", block=64))


def test_a_row_length_declared_before_the_guard_packs_its_columns(transform, tmp_path):
    packed = transform.forward(LOCAL_ROW, SITE).state
    assert "    const int cols = groups * group;\n    if (i >= rows * cols) return;\n    if (cols % 4 == 0 && " \
           "i + 3 < rows * cols && " in packed.source
    assert "const float4 gamma4 = *reinterpret_cast<const float4*>(gamma + c);" in packed.source

    def inputs(rows: int, groups: int, group: int) -> tuple[dict, dict, dict]:
        generator, cols = torch.Generator().manual_seed(rows), groups * group
        return ({"rows": rows, "groups": groups, "group": group},
                {"x": torch.randn(rows * cols, generator=generator), "gamma": torch.randn(cols, generator=generator)},
                {"out": (torch.float32, rows * cols)})
    assert emulate.differences(tmp_path, LOCAL_ROW, {"packed": packed}, ((5, 2, 8), (7, 3, 5)), inputs) == []


@pytest.mark.parametrize("case, lanes", [("embedding_float", ("out4.y = weight4.", "out4.z = weight4.")),
                                         ("bias_gelu_float", ("x4.y + bias4.", "x4.z + bias4."))])
def test_the_emulation_sees_two_lanes_traded(tmp_path, case, lanes):
    """The check can fail: a pack whose lanes 1 and 2 trade places (the gathered row's, the broadcast bias's) computes
    other bits where the pack path runs (rows that divide by four, aligned pointers) and nowhere else."""
    packed = golden(case, "before")
    swapped = packed.source.replace(lanes[0] + "y", lanes[0] + "z").replace(lanes[1] + "z", lanes[1] + "y")
    assert swapped.count(lanes[0] + "z") == swapped.count(lanes[1] + "y") == 1
    differences = _emulated(tmp_path, case, {"swapped": KernelState(source=swapped, plan=packed.plan)})
    assert differences and all(d.split()[1] in ("5x16x0-0", "37x24x3-0") for d in differences), differences


DEQUANT = KernelState(
    source="__global__ void kernel(const unsigned char* q, const float* scale, float* y, int rows, int cols) {\n"
           "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
           "    if (i < rows * cols) {\n"
           "        int r = i / cols;\n"
           "        y[i] = static_cast<float>(q[i]) * scale[r];\n"
           "    }\n"
           "}\n",
    plan=plan_of('"q", "scale", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
                 grid="cdiv(rows * cols, 64)", block=64))


def test_bytes_beside_floats_pack_four_to_a_uchar4_and_compute_the_naive_bits(transform, tmp_path):
    """A row of quantized bytes scaled by its row's scale: the bytes ride four to a uchar4 beside the float4 of y
    (the feature the rewrite names is the float4's: the 4-byte pack has none), and the bits are the naive kernel's."""
    (site, *_) = transform.forward_sites(DEQUANT)
    rewrite = transform.forward(DEQUANT, site)
    assert "uchar4" in rewrite.state.source and rewrite.adds == ("vector_type_float4",)

    def inputs(rows, cols, tail):
        g = torch.Generator().manual_seed(cols)
        q = torch.randint(0, 256, (rows * cols,), generator=g, dtype=torch.uint8)
        return {"rows": rows, "cols": cols}, {"q": q, "scale": torch.rand(rows, generator=g)}, \
            {"y": (torch.float32, rows * cols)}

    assert emulate.differences(tmp_path, DEQUANT, {"packed": rewrite.state}, SHAPES, inputs) == []


SCATTER = "scatter_add_float"


def test_a_scatter_add_adds_four_elements_of_a_row_with_one_vector_atomic(transform, cache):
    """`atomicAdd(&out[idx[r] * cols + c], v)`, one element a thread: four lanes' values in a float4 added by sm_90's
    vector atomicAdd (one REDG.E.ADD.F32x4 where the naive kernel makes four scalar ones), the source loaded as
    a float4; the element loop keeps each scalar atomic for a row length 4 does not divide."""
    from tests.cuda_tools import count, sass_opcodes
    from tests.transforms.golden import compiles_without_spills

    check_golden("scalarize_row_gather", SCATTER)
    naive, packed = golden(SCATTER, "after"), golden(SCATTER, "before")
    assert [a.key for a in transform.forward_sites(naive)] == ["i"]
    vector = sass_opcodes(compiles_without_spills(packed, cache), "sm_90")
    assert count(vector, r"^REDG?\.E\.ADD\.F32x4") == 1 and count(vector, r"^LDG\.E\.128") >= 1, vector
    assert count(sass_opcodes(compiles_without_spills(naive, cache), "sm_90"), r"F32x4") == 0


def test_the_vector_atomics_add_up_to_the_naive_sums_on_the_cpu(tmp_path):
    """Rows scattered to a few targets (many adds to one element), integer values (sums exact in any order of the
    atomics), rows whose length 4 divides and does not, aligned and misaligned; a pack added to the wrong row is
    caught."""
    naive, packed = golden(SCATTER, "after"), golden(SCATTER, "before")
    wrong = KernelState(source=packed.source.replace("out + ((long long)idx[r] * cols + c)",
                                                     "out + ((long long)idx[0] * cols + c)"), plan=packed.plan)
    assert wrong.source != packed.source

    def inputs(rows: int, cols: int) -> tuple[dict, dict, dict, dict]:
        g = torch.Generator().manual_seed(rows * 100 + cols)
        return ({"rows": rows, "cols": cols},
                {"src": torch.randint(-9, 10, (rows * cols,), generator=g).float(),
                 "idx": torch.randint(0, 3, (rows,), generator=g, dtype=torch.int32),
                 "w": torch.randint(-2, 3, (rows,), generator=g).float()},
                {"out": (torch.float32, 3 * cols)}, {"out": torch.zeros(3 * cols)})

    found = emulate.differences(tmp_path, naive, {"packed": packed, "wrong": wrong}, ((6, 8), (5, 7), (9, 64)),
                                inputs)
    assert found and all(line.startswith("wrong") for line in found), found


@pytest.mark.parametrize("body, why", [
    ("    atomicAdd(&out[(long long)idx[r] * cols + c], src[i] + out[i]);\n", "accessed"),
    ("    atomicAdd(&out[(long long)idx[r] * cols + c], out[(long long)idx[r] * cols + c] + src[i]);\n", "accessed"),
    ("    atomicAdd(&out[idx[i]], src[i]);\n", "neither element"),
    # under a condition: a lane with nothing to add would add +0.0 (which turns a -0.0 into +0.0)
    ("    if (src[i] != 0.0f) atomicAdd(&out[(long long)idx[r] * cols + c], src[i]);\n", "pointer expression"),
    ("    atomicAdd(&count[(long long)idx[r] * cols + c], 1);\n", "holds no float"),
])
def test_no_vector_atomic_where_the_lanes_elements_need_not_be_one_vector(transform, body, why):
    source = ("__global__ void kernel(const float* __restrict__ src, const int* __restrict__ idx, "
              "float* __restrict__ out, int* __restrict__ count, int rows, int cols) {\n"
              "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
              "    if (i >= (long long)rows * cols) return;\n    int r = i / cols;\n    int c = i % cols;\n" + body +
              "}\n")
    state = KernelState(source=source, plan=plan_of('"src", "idx", "out", "count", { scalar = "rows", type = "i32" }, '
                                                    '{ scalar = "cols", type = "i32" }', grid="cdiv(rows * cols, 256)"))
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)
