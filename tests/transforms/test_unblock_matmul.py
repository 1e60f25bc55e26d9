"""unblock_matmul: a register-blocked product (each thread a 4 x 4 micro-tile of outputs from 64 x 64 shared tiles)
becomes untile_matmul's tiled form, one output per thread from 16 x 16 tiles; forward finds its sites by analysis on
the tiled form. Each output takes its products in the tiled (and naive) kernel's order with the same statement, so
the CPU emulator (tests/transforms/elementwise_emulator.cpp) must see the tiled kernel's bits, for sizes 64 and 16
divide and sizes they do not; a micro-tile offset out of place must show."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from klineage.kernel import KernelState, load_kernel
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

SITE = Anchor("kernel", "function", "block")
BMM = Path(__file__).resolve().parents[2] / "bench" / "transfer" / "bmm_small"
# bias_relu: B stored K x N, an epilogue reading a column's bias; batched: one layer of blocks per matrix, the update
# fused, an epilogue reading the output it writes; linear: B stored N x K (a linear layer's weight); half: __half
# operands, tiled and kept in registers in their own type; transposed_a: A stored K x M (C = A^T B), loaded across a
# padded tile; transposed_both: a batch of A^T B^T, the update fused
CASES = ("bias_relu", "batched", "linear", "half", "transposed_a", "transposed_both")
# M x N x K: one output, sizes 16 and 64 do not divide (the ragged and small transfer shapes among them), one whole
# block tile, and several blocks along both sides with ragged edges
SHAPES = ((1, 1, 1), (17, 9, 5), (50, 70, 33), (64, 64, 64), (70, 130, 40))


@pytest.fixture(scope="module")
def transform():
    return get("unblock_matmul")


def golden(which: str, case: str = "bias_relu") -> KernelState:
    return load(HERE / "unblock_matmul" / case, which, "kernel")


def edited(state: KernelState, old: str, new: str) -> KernelState:
    assert old in state.source, old
    return KernelState(source=state.source.replace(old, new), plan=state.plan)


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("unblock_matmul", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=("bias_relu", "half")))
def test_golden_kernels_compile_without_spills(cache, case):
    """A 4 x 4 micro-tile's 16 accumulators and 8 operand registers stay in registers."""
    for which in ("before", "after"):
        compiles_without_spills(golden(which, case), cache)


def test_forward_finds_the_tiled_product_by_analysis_and_not_the_naive_one(transform):
    assert transform.forward_sites(golden("after")) == [SITE]
    assert transform.forward_sites(golden("before")) == []
    assert transform.find(golden("after")) == [] and transform.find(golden("before")) == [SITE]
    assert transform.forward_sites(load(HERE / "untile_matmul" / "bias_relu", "after", "kernel")) == []
    launch = transform.forward(golden("after"), SITE).state.plan.launches[0]
    assert launch.block == (16, 16, 1) and launch.grid[:2] == ("cdiv(n, 64)", "cdiv(m, 64)")


def same_bits(reference: KernelState, blocked: KernelState, work: Path, inputs_of, output: str = "C",
              batch: int = 1, shapes=SHAPES, inout: bool = False, **scalars) -> None:
    """The blocked kernel's output bits are the reference's for each shape (m, n, k; `inputs_of(m, n, k,
    generator)` its inputs; `inout`: the output starts from random values, which the epilogue reads)."""
    binaries = emulate.builds(work, {"reference": reference, "blocked": blocked})
    nonzero, total = 0, 0
    for m, n, k in shapes:
        generator = torch.Generator().manual_seed(m * 10000 + n * 100 + k)
        inputs, count = inputs_of(m, n, k, generator), batch * m * n
        starting = {output: torch.randn(count, generator=generator)} if inout else None
        params = {"m": m, "n": n, "k": k, "batch": batch, **scalars}
        runs = {form: emulate.run(binary, work / f"{form}-{m}x{n}x{k}", state, params, inputs,
                                  {output: (torch.float32, count)}, starting=starting)[output]
                for form, (binary, state) in binaries.items()}
        assert torch.equal(runs["blocked"].view(torch.int32), runs["reference"].view(torch.int32)), (m, n, k)
        nonzero, total = nonzero + int((runs["reference"] != 0).sum()), total + count
    assert nonzero > total / 3  # the outputs' bits were compared, not mostly zeros (a relu zeroes about half)


def operands(left: str = "A", right: str = "B", batch: int = 1, dtype=torch.float32, vectors: tuple = ()):
    """inputs_of for a product: A (m x k) and B (k x n, or n x k) per matrix of the batch, and a vector of n for
    each name of `vectors` (a bias)."""
    return lambda m, n, k, g: {left: torch.randn(batch * m * k, generator=g).to(dtype),
                               right: torch.randn(batch * k * n, generator=g).to(dtype),
                               **{name: torch.randn(n, generator=g) for name in vectors}}


EMULATED = {"bias_relu": (operands(vectors=("bias",)), "C", {"alpha": 0.75}),
            "linear": (operands("x", "w", vectors=("b",)), "y", {}),
            "half": (operands(dtype=torch.float16), "C", {}),
            # A stored K x M (and B N x K): the same counts as M x K (and K x N)
            "transposed_a": (operands(), "C", {}),
            "transposed_both": (operands(batch=3), "C", {"batch": 3})}


# bias_relu (B as K x N) is covered by the bmm_small chain in the default run
@pytest.mark.parametrize("case", sampled(EMULATED, keep=("linear",)))
def test_the_micro_tiles_give_the_tiled_kernels_bits_on_the_cpu(case, tmp_path):
    inputs_of, output, scalars = EMULATED[case]
    same_bits(golden("after", case), golden("before", case), tmp_path, inputs_of, output, **scalars)


@pytest.mark.slow  # the untile test's emulation covers A stored K x M by default; this one adds the blocked form
def test_the_chain_from_a_naive_transposed_product_gives_its_bits(tmp_path):
    """naive A^T B (A stored K x M) -> untile_matmul -> unblock_matmul: the naive kernel's bits, on a shape with ragged
    edges and several blocks along both sides and one smaller than a tile (transposed_a's full sweep is slow)."""
    naive = load(HERE / "untile_matmul" / "transposed_a", "after", "kernel")
    tiled = get("untile_matmul").forward(naive, Anchor("kernel", "function", "tile")).state
    assert tiled == golden("after", "transposed_a")
    blocked = get("unblock_matmul").forward(tiled, SITE).state
    assert blocked == golden("before", "transposed_a")
    same_bits(naive, blocked, tmp_path, operands(), shapes=((17, 9, 5), (70, 130, 40)))


def test_the_batched_micro_tiles_give_the_tiled_kernels_bits_on_the_cpu(tmp_path):
    """Three matrices, the epilogue reading each output's own earlier value (beta) before it writes it."""
    same_bits(golden("after", "batched"), golden("before", "batched"), tmp_path, operands(batch=3), batch=3,
              inout=True, scale=0.5, beta=0.25)


@pytest.mark.parametrize("mutant", sampled([
    ("int c = block_c + 16 * block_j;", "int c = block_c + 4 * block_j;"),  # each output stored at another column
    ("block_rb[block_i] = block_b[k][threadIdx.x + 16 * block_i];",  # B's registers from the contiguous layout
     "block_rb[block_i] = block_b[k][threadIdx.x * 4 + block_i];"),
    ("block_a[threadIdx.y + 16 * block_i][threadIdx.x] =", "block_a[threadIdx.y * 4 + block_i][threadIdx.x] ="),
], keep=[("int c = block_c + 16 * block_j;", "int c = block_c + 4 * block_j;")]))
def test_the_emulation_sees_a_micro_tile_offset_out_of_place(transform, mutant, tmp_path):
    """The check can fail: a micro-tile output or operand taken 4 apart instead of 16 gives other bits; and the
    mutant is no longer the blocked form backward reads."""
    wrong = edited(golden("before"), *mutant)
    assert transform.find(wrong) == []
    with pytest.raises(AssertionError, match=r"\(\d+, \d+, \d+\)"):  # the bits' check, naming its sizes
        same_bits(golden("after"), wrong, tmp_path, operands(vectors=("bias",)), alpha=0.75)


def _entry_named_kernel(state: KernelState, entry: str) -> KernelState:
    """The state with its entry renamed `kernel`: the emulator runs an entry of that name."""
    return KernelState(source=state.source.replace(f"void {entry}(", "void kernel("),
                       plan=replace(state.plan, launches=tuple(replace(launch, entry="kernel")
                                                               for launch in state.plan.launches)))


def _bmm_cases() -> dict:
    spec = importlib.util.spec_from_file_location("bmm_small_problem", BMM / "problem.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


@pytest.mark.parametrize("case", sampled(("ragged", "small"), keep=("ragged",)))
def test_the_chain_from_the_naive_bmm_small_gives_its_bits(cache, case, tmp_path):
    """naive -> untile_matmul -> unblock_matmul on the held-out batch of small products: it compiles without spills
    and computes the naive kernel's bits on the operator's own ragged shapes."""
    naive = load_kernel(BMM / "naive")
    untile = get("untile_matmul")
    tiled = untile.forward(naive, untile.forward_sites(naive)[0]).state
    blocked_sites = get("unblock_matmul").forward_sites(tiled)
    assert [anchor.function for anchor in blocked_sites] == ["bmm"]
    blocked = get("unblock_matmul").forward(tiled, blocked_sites[0]).state
    assert blocked.plan.launches[0].grid == ("cdiv(n, 64)", "cdiv(m, 64)", "batch")
    compiles_without_spills(blocked, cache)
    shape = _bmm_cases()[case]
    same_bits(_entry_named_kernel(naive, "bmm"), _entry_named_kernel(blocked, "bmm"), tmp_path,
              operands("a", "b", batch=shape["batch"]), "c", batch=shape["batch"],
              shapes=((shape["m"], shape["n"], shape["k"]),))


@pytest.mark.parametrize("case", CASES)
def test_backward_then_untile_gives_the_naive_product_again(transform, case):
    """The blocked form climbs down both steps to untile_matmul's naive golden (the batched one has its own)."""
    tiled = transform.backward(golden("before", case), SITE).state
    naive = get("untile_matmul").backward(tiled, Anchor("kernel", "function", "tile")).state
    assert transform.forward(tiled, SITE).state == golden("before", case)
    if case != "batched":
        untiled = load(HERE / "untile_matmul" / case, "after", "kernel")
        assert naive.source.split("__global__")[1] == untiled.source.split("__global__")[1]


RELU = "C[r * N + c] = v > 0.0f ? v : 0.0f;"


@pytest.mark.parametrize("edit, why", [
    # the epilogue, run 16 times in a thread, must not tell
    (("float v = alpha * acc + bias[c];", "alpha = 2.0f * alpha;\n        float v = alpha * acc + bias[c];"),
     "assigns `alpha`, which outlives its output"),
    ((RELU, "atomicAdd(&C[r * N + c], v);"), "calls atomicAdd"),
    ((RELU, "*C = v;"), "takes an address or dereferences"),
    ((RELU, RELU + "\n        C[r * N + c + 1] = v;"), "touches C, which it writes, at another output"),
    ((RELU, "C[r * N + c] = v + C[r * N + c + 1];"), "touches C, which it writes, at another output"),
    (("float v = alpha * acc + bias[c];", "float v = alpha * acc + tile_a[0][0];"), "only finish"),
    (("float v = alpha * acc + bias[c];", "float v = alpha * acc + bias[threadIdx.x];"), "only finish"),
    (("float v = alpha * acc + bias[c];", "float v = alpha + bias[c];"), "only finish"),
    (("float v = alpha * acc + bias[c];", "float acc2 = acc;\n        float acc = acc2;\n        float v = alpha * acc "
                                          "+ bias[c];"), "only finish"),
    # the tiled form, exactly as untile_matmul writes it
    (("        C[r * N + c] = v > 0.0f ? v : 0.0f;\n    }\n",
      "        C[r * N + c] = v > 0.0f ? v : 0.0f;\n    }\n    if (r < M) {\n        C[0] = 1.0f;\n    }\n"),
     "not exactly the tiled product"),
    (("acc += tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x];",
      "acc += tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x] * 2.0f;"), "is not the product"),
    (("acc += tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x];",
      "acc = tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x];"), "is not the product"),
    # a barrier missing: neither the tiled form nor one tiled by hand
    (("        __syncthreads();\n    }", "    }"), "not two loads, a barrier"),
    (("float alpha)", "float block_r)"), "names 'block_r'"),
])
def test_no_site_where_it_would_not_be_legal(transform, edit, why):
    state = edited(golden("after"), *edit)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("old, new, why", [
    ('grid = ["cdiv(n, 16)", "cdiv(m, 16)"]', 'grid = ["cdiv(n, 16) + 1", "cdiv(m, 16)"]', "not the tiled one"),
    ("block = [16, 16]", "block = [16, 16, 2]", "more than 2 dimension"),
    ('"C", {', '"bias", {', "passes one buffer twice"),
])
def test_no_site_on_another_launch(transform, old, new, why):
    toml = (HERE / "unblock_matmul" / "bias_relu" / "after.toml").read_text()
    assert old in toml
    state = KernelState(source=golden("after").source, plan=LaunchPlan.from_toml(toml.replace(old, new)))
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_no_site_where_the_batch_epilogue_reads_another_matrix(transform):
    state = edited(golden("after", "batched"), "v += beta * C[b * M * N + r * N + c];",
                   "v += beta * C[(b + 1) * M * N + r * N + c];")
    with pytest.raises(NotApplicable, match="touches C, which it writes, at another output"):
        transform.forward(state, SITE)


# a linear layer over __half operands, its bias and its output's rounding through __half in the epilogue
HALF_EPILOGUE = """#include <cuda_fp16.h>

__global__ void kernel(const __half* __restrict__ A, const __half* __restrict__ B, const __half* __restrict__ bias,
                       float* __restrict__ C, int M, int N, int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r >= M || c >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += __half2float(A[r * K + k]) * __half2float(B[c * K + k]);
    acc += __half2float(bias[c]);
    C[r * N + c] = __half2float(__float2half_rn(fminf(fmaxf(acc, -1.0f), 1.0f)));
}
"""
HALF_PLAN = LaunchPlan.from_toml("""name = "half_epilogue"
problem = "half_epilogue"
[[launch]]
entry = "kernel"
grid = ["cdiv(n, 16)", "cdiv(m, 16)"]
block = [16, 16]
args = ["A", "B", "bias", "C", { scalar = "m", type = "i32" }, { scalar = "n", type = "i32" },
        { scalar = "k", type = "i32" }]
""")
HALF_STORE = "C[r * N + c] = __half2float(__float2half_rn(fminf(fmaxf(acc, -1.0f), 1.0f)));"


def _half_tiled(store: str = HALF_STORE) -> KernelState:
    naive = KernelState(source=HALF_EPILOGUE.replace(HALF_STORE, store), plan=HALF_PLAN)
    untile = get("untile_matmul")
    return untile.forward(naive, untile.forward_sites(naive)[0]).state


def test_an_epilogue_through_the_16_bit_conversions_gives_the_tiled_kernels_bits(transform, tmp_path):
    """`__half2float` and `__float2half_rn` are values of their argument alone: an epilogue reading a __half bias and
    rounding its output through __half runs once per micro-tile output as it ran once per thread."""
    tiled = _half_tiled()
    assert transform.forward_sites(tiled) == [SITE]
    blocked = transform.forward(tiled, SITE).state
    same_bits(tiled, blocked, tmp_path, lambda m, n, k, g: {name: torch.randn(count, generator=g).half()
                                                            for name, count in (("A", m * k), ("B", n * k),
                                                                                ("bias", n))},
              shapes=((17, 9, 5), (70, 130, 40)))


@pytest.mark.parametrize("store, why", [
    ("__stcs(&C[r * N + c], __half2float(__float2half(acc)));", "calls __stcs"),  # a store, with its effect
    (HALF_STORE + '\n    printf("%f", __half2float(bias[c]));', "calls printf"),
])
def test_no_site_where_a_16_bit_epilogue_calls_what_may_have_an_effect(transform, store, why):
    tiled = _half_tiled(store)
    assert transform.forward_sites(tiled) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(tiled, SITE)


# C = A^T B^T over 64-bit indexes and sizes (A stored K x M, B N x K): both operands loaded from a block's first row
# or column, which the 64-bit forms compute in 64 bits
WIDE = """#include <stdint.h>

__global__ void kernel(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc += A[k * M + r] * B[c * K + k];
        C[r * N + c] = acc;
    }
}
"""


def test_64_bit_indexes_are_blocked_in_their_own_width(transform, tmp_path):
    """The blocked form declares its first output's row and column, each output's, and the step along k in the tiled
    form's types, and forms a block's first row and column in 64 bits where those are: the naive kernel's bits."""
    plan = LaunchPlan.from_toml((HERE / "unblock_matmul" / "transposed_a" / "after.toml").read_text()
                                .replace('type = "i32"', 'type = "i64"'))
    naive = KernelState(source=WIDE, plan=plan)
    untile = get("untile_matmul")
    tiled = untile.forward(naive, untile.forward_sites(naive)[0]).state
    assert transform.forward_sites(tiled) == [SITE]
    blocked = transform.forward(tiled, SITE).state
    for line in ("long long block_c = (long long)blockIdx.x * 64 + threadIdx.x;",
                 "long long block_r = (long long)blockIdx.y * 64 + threadIdx.y;",
                 "for (int64_t block_k = 0; block_k < K; block_k += 16)",
                 "A[(block_k + threadIdx.y) * M + (long long)blockIdx.y * 64 + threadIdx.x + 16 * block_i]",
                 "B[((long long)blockIdx.x * 64 + threadIdx.y + 16 * block_i) * K",
                 "long long r = block_r + 16 * block_i;"):
        assert line in blocked.source, line
    assert transform.find(blocked) == [SITE] and transform.backward(blocked, SITE).state == tiled
    same_bits(naive, blocked, tmp_path, operands(), shapes=((17, 9, 5), (70, 130, 40)))


# A product tiled by hand, as the CUDA tutorials write it (the GPU fixture matmul_tiled's kernel): a tile of 32 named
# by a constant, the thread's coordinates in locals, the tiles counted by cdiv(K, 32), the columns of a tile named by
# locals, ternary loads, an epilogue without braces
HAND_TILED = (Path(__file__).resolve().parents[1] / "fixtures" / "gpu_problems" / "matmul_tiled" / "naive" /
              "kernel.cu").read_text().replace("void matmul_tiled(", "void kernel(")
# the same product as a linear layer writes it: y = relu(x W^T + b), W stored N x K, the loop stepping by the tile,
# loads by if / else, the products stopping at K, a braced epilogue
HAND_LINEAR = """__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, const float* b,
                       float* __restrict__ y, int m, int n, int k) {
    __shared__ float xs[16][16];
    __shared__ float ws[16][16];
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    float sum = 0;
    for (int k0 = 0; k0 < k; k0 += 16) {
        if (r < m && k0 + threadIdx.x < k) xs[threadIdx.y][threadIdx.x] = x[r * k + k0 + threadIdx.x];
        else xs[threadIdx.y][threadIdx.x] = 0.0f;
        if (c < n && k0 + threadIdx.y < k) ws[threadIdx.y][threadIdx.x] = w[c * k + k0 + threadIdx.y];
        else ws[threadIdx.y][threadIdx.x] = 0.0f;
        __syncthreads();
        for (int kk = 0; kk < 16 && k0 + kk < k; kk++) sum += ws[kk][threadIdx.x] * xs[threadIdx.y][kk];
        __syncthreads();
    }
    if (c < n && r < m) {
        float v = sum + b[c];
        y[r * n + c] = v > 0.0f ? v : 0.0f;
    }
}
"""


# a batch of products on grid z, each matrix reached through views of A and B at its start
HAND_BATCHED = """__global__ void kernel(const float* A, const float* B, float* C, int m, int n, int k) {
    __shared__ float sa[16][16];
    __shared__ float sb[16][16];
    int b = blockIdx.z;
    int row = blockIdx.y * 16 + threadIdx.y;
    int col = blockIdx.x * 16 + threadIdx.x;
    const float* Ab = A + (size_t)b * m * k;
    const float* Bb = B + (size_t)b * k * n;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += 16) {
        sa[threadIdx.y][threadIdx.x] = (row < m && k0 + threadIdx.x < k) ? Ab[row * k + k0 + threadIdx.x] : 0.0f;
        sb[threadIdx.y][threadIdx.x] = (k0 + threadIdx.y < k && col < n) ? Bb[(k0 + threadIdx.y) * n + col] : 0.0f;
        __syncthreads();
        for (int i = 0; i < 16; ++i) acc += sa[threadIdx.y][i] * sb[i][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) C[(size_t)b * m * n + row * n + col] = acc;
}
"""


def _hand(source: str, side: int, args: str = '"A", "B", "C"', layers: str = "") -> KernelState:
    grid = f'"cdiv(n, {side})", "cdiv(m, {side})"' + (f', "{layers}"' if layers else "")
    return KernelState(source=source, plan=LaunchPlan.from_toml(
        f'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = [{grid}]\n'
        f'block = [{side}, {side}]\nargs = [{args}, {{ scalar = "m", type = "i32" }}, '
        '{ scalar = "n", type = "i32" }, { scalar = "k", type = "i32" }]\n'))


# the block's coordinates in locals too, and the products fused
HAND_FUSED = HAND_TILED.replace("const int tx = threadIdx.x, ty = threadIdx.y;",
                                "const int tx = threadIdx.x, ty = threadIdx.y, bx = blockIdx.x, by = blockIdx.y;") \
    .replace("blockIdx.y * TILE + ty", "by * TILE + ty").replace("blockIdx.x * TILE + tx", "bx * TILE + tx") \
    .replace("acc += As[ty][i] * Bs[i][tx];", "acc = fmaf(As[ty][i], Bs[i][tx], acc);")
HANDS = {"tutorial": (lambda: _hand(HAND_TILED, 32), operands(), "C"),
         "batched": (lambda: _hand(HAND_BATCHED, 16, layers="batch"), operands(batch=3), "C"),
         "fused": (lambda: _hand(HAND_FUSED, 32), operands(), "C"),
         "linear": (lambda: _hand(HAND_LINEAR, 16, '"x", "w", "b", "y"'), operands("x", "w", vectors=("b",)), "y")}


def test_the_fused_spelling_names_the_blocks_coordinates_and_fuses_its_products():
    assert "int row = by * TILE + ty;" in HAND_FUSED and "acc = fmaf(As[ty][i], Bs[i][tx], acc);" in HAND_FUSED


@pytest.mark.parametrize("name", sampled(sorted(HANDS), keep=("tutorial", "linear", "batched")))
def test_a_product_tiled_by_hand_is_register_blocked_with_its_bits(transform, tmp_path, cache, name):
    """Read as the naive product it computes (the tiles' zeros past K add +0.0 to a sum started at +0.0, which
    changes nothing), it gets the register-blocked form, which gives its output bits on the CPU emulator."""
    make, inputs_of, output = HANDS[name]
    state = make()
    assert transform.forward_sites(state) == [SITE]
    blocked = transform.forward(state, SITE).state
    assert any(f"block_acc[block_i][block_j]{update};" in blocked.source for update in (
        " += block_ra[block_i] * block_rb[block_j]", " += block_rb[block_j] * block_ra[block_i]",
        " = fmaf(block_ra[block_i], block_rb[block_j], block_acc[block_i][block_j])"))
    assert blocked.plan.launches[0].block == (16, 16, 1)
    assert blocked.plan.launches[0].grid[:2] == ("cdiv(n, 64)", "cdiv(m, 64)")
    compiles_without_spills(blocked, cache)
    batch = 3 if name == "batched" else 1
    same_bits(state, blocked, tmp_path, inputs_of, output, batch=batch,
              shapes=((1, 1, 1), (50, 70, 33), (70, 130, 40)))


@pytest.mark.parametrize("old, new, why", [
    ("(row < m && ak < k) ?", "(ak < k) ?", "does not hold A"),  # rows past M loaded: read out of bounds
    ("B[bk * n + col]", "B[bk * n + col + 1]", "does not hold B"),
    ("i < TILE; ++i", "i < TILE - 1; ++i", "products"),  # a column of each tile left out
    ("t < (k + TILE - 1) / TILE", "t < k / TILE", "cdiv"),  # the last, partial tile left out
    ("if (row < m && col < n) C[row * n + col] = acc;", "if (row < m && col < n) C[row * n + col] = acc + tx;",
     "names tx"),  # the epilogue reads a local the blocked form does not declare
    ("__shared__ float As[TILE][TILE];", "__shared__ float As[TILE][16];", "is not 32 x 32"),
    ("        __syncthreads();\n    }", "    }", "a barrier"),  # the next tile overwrites one still read
    ("acc += As[ty][i] * Bs[i][tx]", "acc += As[ty][i] * Bs[tx][i]", "does not multiply"),
])
def test_no_site_on_a_hand_tiled_product_that_reads_or_sums_otherwise(transform, old, new, why):
    assert old in HAND_TILED
    state = _hand(HAND_TILED.replace(old, new), 32)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("old, new", [("A + (size_t)b * m * k;", "A + (size_t)b * m * k + row;"),  # a row's start
                                      ("int b = blockIdx.z;", "int b = blockIdx.z;\n    b += 1;")])  # a moved batch
def test_no_site_on_a_hand_tiled_batch_whose_views_start_otherwise(transform, old, new):
    assert old in HAND_BATCHED
    state = _hand(HAND_BATCHED.replace(old, new), 16, layers="batch")
    assert transform.forward_sites(state) == []


def test_no_site_on_a_hand_tiled_product_launched_on_another_block(transform):
    state = _hand(HAND_TILED, 16)  # the tile is 32 x 32, the block 16 x 16: a quarter of each tile loaded
    assert transform.forward_sites(state) == []


def test_the_tiled_form_padded_by_unpad_shared_keeps_its_site(transform):
    """unpad_shared's forward pads a tile by a column (no bank conflict to remove on these reads, but the catalog
    may take it first); the padded form reads as one tiled by hand, so register blocking stays open after it."""
    padding = get("unpad_shared")
    for site in padding.forward_sites(golden("after")):
        padded = padding.forward(golden("after"), site).state
        assert "[16 + 1]" in padded.source and transform.forward_sites(padded) == [SITE]
