"""untile_matmul: a matrix product staged through 16 x 16 shared tiles of A and B becomes one thread per output
reading both operands from global memory; forward finds its sites by analysis. The tiled form sums the products in
the naive kernel's order, so the CPU emulator (tests/transforms/elementwise_emulator.cpp) must see the naive
kernel's bits, for sizes that 16 divides and sizes it does not."""

from __future__ import annotations

import textwrap

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, edited, load

SITE = Anchor("kernel", "function", "tile")


@pytest.fixture(scope="module")
def transform():
    return get("untile_matmul")


# bias_relu: B stored K x N; linear: B stored N x K (a linear layer's weight), loaded across a padded tile;
# batched: a batch of small products, one layer of blocks per matrix (blockIdx.z), each operand at its batch's start;
# half: __half operands read through __half2float, tiled in their own type; transposed_a: A stored K x M (C = A^T B),
# loaded across a padded tile; transposed_both: a batch of A^T B^T, the update fused; distance: a sum of squared
# differences of A's and B's rows (no product), B stored N x K
CASES = ("bias_relu", "linear", "batched", "half", "transposed_a", "transposed_both", "distance")


def golden(which: str, case: str = "bias_relu") -> KernelState:
    return load(HERE / "untile_matmul" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("untile_matmul", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('linear', 'half', 'transposed_a')))
def test_golden_kernels_compile(cache, case):
    for which in ("before", "after"):
        compiles_without_spills(golden(which, case), cache)


def test_forward_finds_the_naive_product_by_analysis(transform):
    assert transform.forward_sites(golden("after")) == [SITE]
    assert transform.forward_sites(golden("before")) == []
    assert transform.find(golden("after")) == []
    tiled = transform.forward(golden("after"), SITE).state
    assert tiled.plan.launches[0].block == (16, 16, 1)
    assert tiled.plan.launches[0].grid[:2] == ("cdiv(n, 16)", "cdiv(m, 16)")


UPDATE = "acc += A[r * K + k] * B[k * N + c];"


def test_operands_read_through_the_read_only_cache_are_tiled_as_plain_reads(transform):
    """`__ldg(&A[...])` in the product loop: the tiled loop reads the operands from shared memory, which a
    read-only global load cannot address, so the reads are plain ones there (the tiled kernel of the plain
    spelling), never `__ldg(&tile_a[...])`."""
    naive = golden("after")
    cached = KernelState(source=naive.source.replace(UPDATE, "acc += __ldg(&A[r * K + k]) * __ldg(&B[k * N + c]);"),
                         plan=naive.plan)
    assert cached.source != naive.source
    tiled = transform.forward(cached, SITE).state
    assert "__ldg(&tile_" not in tiled.source and tiled == transform.forward(naive, SITE).state


@pytest.mark.parametrize("update", sampled([UPDATE, "acc += B[k * N + c] * A[r * K + k];",
                                            "acc = fmaf(A[r * K + k], B[k * N + c], acc);"], keep=[UPDATE]))
def test_the_tiles_give_the_naive_kernels_bits_on_the_cpu(transform, update, tmp_path):
    """The product loop's statement as written (either operand first, or fused) is the tiled loop's, on tiles."""
    naive = KernelState(source=golden("after").source.replace(UPDATE, update), plan=golden("after").plan)
    tiled = transform.forward(naive, SITE).state
    assert update.replace("A[r * K + k]", "tile_a[threadIdx.y][k]").replace("B[k * N + c]", "tile_b[k][threadIdx.x]") \
        in tiled.source
    assert transform.backward(tiled, SITE).state == naive
    emulate.same_product_bits(naive, tiled, tmp_path, lambda m, n, k, g: {"A": torch.randn(m * k, generator=g),
                                                                                 "B": torch.randn(k * n, generator=g),
                                                                                 "bias": torch.randn(n, generator=g)},
                              "C", alpha=0.75)


def test_the_linear_layers_tiles_give_the_naive_kernels_bits_on_the_cpu(tmp_path):
    emulate.same_product_bits(golden("after", "linear"), golden("before", "linear"), tmp_path,
               lambda m, n, k, g: {"x": torch.randn(m * k, generator=g), "w": torch.randn(n * k, generator=g),
                                   "b": torch.randn(n, generator=g)}, "y")


def test_the_batched_tiles_give_the_naive_kernels_bits_on_the_cpu(tmp_path):
    emulate.same_product_bits(golden("after", "batched"), golden("before", "batched"), tmp_path,
               lambda m, n, k, g: {"A": torch.randn(3 * m * k, generator=g), "B": torch.randn(3 * k * n, generator=g)},
               "C", batch=3)


def transposed_operands(batch: int = 1):
    """inputs_of for A stored K x M and B (K x N or N x K) per matrix of the batch: the same counts either way."""
    return lambda m, n, k, g: {"A": torch.randn(batch * k * m, generator=g),
                               "B": torch.randn(batch * k * n, generator=g)}


@pytest.mark.parametrize("case", sampled(("transposed_a", "transposed_both"), keep=("transposed_a",)))
def test_the_transposed_tiles_give_the_naive_kernels_bits_on_the_cpu(case, tmp_path):
    """A stored K x M, loaded along r across a padded tile (and B stored N x K, a batch of three): the naive bits."""
    batch = 3 if case == "transposed_both" else 1
    emulate.same_product_bits(golden("after", case), golden("before", case), tmp_path, transposed_operands(batch),
                              "C", batch=batch)


@pytest.mark.slow
def test_the_emulation_sees_a_transposed_tile_loaded_the_other_way(tmp_path):
    """The check can fail: A^T's tile loaded with the lanes along k (A read as if stored M x K) gives other bits."""
    tiled = golden("before", "transposed_a")
    load = "A[(tile_k + threadIdx.y) * M + blockIdx.y * 16 + threadIdx.x]"
    wrong = KernelState(source=tiled.source.replace(load, "A[(tile_k + threadIdx.x) * M + blockIdx.y * 16 + "
                                                          "threadIdx.y]"), plan=tiled.plan)
    assert load in tiled.source and wrong.source != tiled.source
    with pytest.raises(AssertionError, match=r"\(\d+, \d+, \d+\)"):
        emulate.same_product_bits(golden("after", "transposed_a"), wrong, tmp_path, transposed_operands(), "C")


@pytest.mark.parametrize("update", ["acc += B[k * N + c] * A[k * M + r];",
                                    "acc = fmaf(A[k * M + r], B[c * K + k], acc);"])
def test_a_transposed_product_reads_either_operand_first_and_b_either_way(transform, update):
    naive = golden("after", "transposed_a")
    state = KernelState(source=naive.source.replace("acc += A[k * M + r] * B[k * N + c];", update), plan=naive.plan)
    assert state.source != naive.source
    tiled = transform.forward(state, SITE).state
    assert "__shared__ float tile_a[16][17];" in tiled.source
    assert ("__shared__ float tile_b[16][17];" in tiled.source) == ("B[c * K + k]" in update)
    assert transform.find(tiled) == [SITE] and transform.backward(tiled, SITE).state == state


HALF_UPDATE = "acc += __half2float(A[r * K + k]) * __half2float(B[k * N + c]);"


@pytest.mark.parametrize("spelling", sampled(["half", "bfloat16"], keep=["bfloat16"]))
def test_16_bit_tiles_give_the_naive_kernels_bits_on_the_cpu(transform, spelling, tmp_path):
    """The tiles hold the operands' own 16-bit elements, and the update converts them as the naive loop did."""
    naive = golden("after", "half")
    dtype = torch.float16
    if spelling == "bfloat16":  # the other 16-bit type, and the fused spelling of the update
        naive = KernelState(source=naive.source.replace("#include <cuda_fp16.h>", "#include <cuda_bf16.h>").replace(
            "__half*", "__nv_bfloat16*").replace(
            HALF_UPDATE, "acc = fmaf(__bfloat162float(A[r * K + k]), __bfloat162float(B[k * N + c]), acc);"),
            plan=naive.plan)
        dtype = torch.bfloat16
    tiled = transform.forward(naive, SITE).state
    assert f"__shared__ {'__half' if dtype == torch.float16 else '__nv_bfloat16'} tile_a[16][16];" in tiled.source
    assert transform.backward(tiled, SITE).state == naive
    emulate.same_product_bits(naive, tiled, tmp_path,
                              lambda m, n, k, g: {"A": torch.randn(m * k, generator=g).to(dtype),
                                                        "B": torch.randn(k * n, generator=g).to(dtype)}, "C")


def test_no_site_where_a_16_bit_operand_is_read_without_its_conversion(transform):
    naive = golden("after", "half")
    for update in ("acc += __half2float(A[r * K + k]) * B[k * N + c];",
                   "acc += __bfloat162float(A[r * K + k]) * __half2float(B[k * N + c]);"):
        state = KernelState(source=naive.source.replace(HALF_UPDATE, update), plan=naive.plan)
        assert state.source != naive.source and transform.forward_sites(state) == []
        with pytest.raises(NotApplicable, match="read through their conversion to float"):
            transform.forward(state, SITE)


def test_the_emulation_sees_a_batch_started_at_the_wrong_matrix(tmp_path):
    """The check can fail: B moved to batch b + 1's start (or past the end) gives other bits."""
    tiled = golden("before", "batched")
    wrong = KernelState(source=tiled.source.replace("B += b * K * N;", "B += (b + 1) % 3 * K * N;"), plan=tiled.plan)
    assert wrong.source != tiled.source
    with pytest.raises(AssertionError, match=r"\(\d+, \d+, \d+\)"):  # the bits' check, naming its sizes
        emulate.same_product_bits(golden("after", "batched"), wrong, tmp_path,
                   lambda m, n, k, g: {"A": torch.randn(3 * m * k, generator=g),
                                             "B": torch.randn(3 * k * n, generator=g)}, "C", batch=3)


@pytest.mark.parametrize("edit, why", [
    (("acc += A[r * K + k] * B[k * N + c];", "acc += A[r * K + k] * B[k * N + c] + k;"), "names k besides"),
    (("acc += A[r * K + k] * B[k * N + c];", "acc += A[k * K + r] * B[k * N + c];"), "A\\[r \\* K \\+ k\\]"),
    (("float acc = 0.0f;", "double acc = 0.0;"), "not a naive matrix product"),
    (("float v = alpha * acc + bias[c];", "float v = alpha * acc + A[c];"), "epilogue"),
    (("float v = alpha * acc + bias[c];", "float v = alpha * acc + bias[threadIdx.x];"), "epilogue"),
    (("float v = alpha * acc + bias[c];", "float v = alpha + bias[c];"), "epilogue"),
    (("if (r < M && c < N) {", "if (r < M && c < K) {"), "A\\[r \\* K \\+ k\\]"),
    # A stored K x M is read at A[k * M + r]: not with another leading dimension, nor at another output's column
    (("acc += A[r * K + k] * B[k * N + c];", "acc += A[k * K + r] * B[k * N + c];"), "or A\\[k \\* M \\+ r\\]"),
    (("acc += A[r * K + k] * B[k * N + c];", "acc += A[k * M + c] * B[k * N + c];"), "or A\\[k \\* M \\+ r\\]"),
    (("acc += A[r * K + k] * B[k * N + c];", "acc += A[k * M + r] * B[k * M + c];"), "or B\\[c \\* K \\+ k\\]"),
])
def test_no_site_where_it_would_not_be_legal(transform, edit, why):
    naive = golden("after")
    assert edit[0] in naive.source
    state = KernelState(source=naive.source.replace(edit[0], edit[1]), plan=naive.plan)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("edit, why", [
    (("A[b * M * K + r * K + k]", "A[r * M * K + r * K + k]"), "offsets A by `r \\* M \\* K`"),
    (("const float* __restrict__ A", "const float* const A"), "A is a const pointer"),
    (("block = [16, 16]", "block = [16, 16, 2]"), "three-dimensional"),
    (("int b = blockIdx.z;\n", ""), "offsets A by `b"),  # no batch index: b names no parameter
])
def test_no_site_on_a_batched_product_where_it_would_not_be_legal(transform, edit, why):
    naive = golden("after", "batched")
    toml = (HERE / "untile_matmul" / "batched" / "after.toml").read_text()
    assert edit[0] in naive.source + toml
    state = KernelState(source=naive.source.replace(*edit), plan=LaunchPlan.from_toml(toml.replace(*edit)))
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def _batch_bounded(guard: str, returning: bool = False) -> tuple[KernelState, KernelState]:
    """(the batched golden's naive kernel taking the batch count and bounding its batch index by `guard` joined to
    the two bounds (or returning past them), the tiled golden taking the count too)."""
    naive, tiled = golden("after", "batched"), golden("before", "batched")
    toml = (HERE / "untile_matmul" / "batched" / "after.toml").read_text().replace(
        '{ scalar = "k", type = "i32" }]', '{ scalar = "k", type = "i32" }, { scalar = "batch", type = "i32" }]')
    source = naive.source.replace("int K) {", "int K, int L) {")
    work = source[source.index("        float acc"):source.rindex("    }\n}")]
    source = source.replace("if (r < M && c < N) {", f"if ({guard}) {{") if not returning else \
        source.replace("    if (r < M && c < N) {\n" + work + "    }\n",
                       f"    if ({guard}) return;\n" + textwrap.indent(textwrap.dedent(work), "    "))
    plan = LaunchPlan.from_toml(toml)
    return (KernelState(source=source, plan=plan),
            KernelState(source=tiled.source.replace("int K) {", "int K, int L) {"), plan=plan))


@pytest.mark.parametrize("guard, returning", [("b < L && r < M && c < N", False), ("r < M && c < N && b < L", False),
                                              ("b >= L || r >= M || c >= N", True)])
def test_a_batch_bounded_by_the_grids_own_layers_is_tiled_as_one_unbounded(transform, guard, returning):
    """`b < L` beside the two bounds (KernelBench's 3-D tensor-matrix product) always holds where every launch has L
    layers of blocks along z and passes L: the tiled kernel is the unbounded batch's."""
    naive, tiled = _batch_bounded(guard, returning)
    assert guard in naive.source
    assert transform.forward_sites(naive) == [SITE]
    assert transform.forward(naive, SITE).state == tiled


@pytest.mark.parametrize("guard", ["b < M && r < M && c < N", "b <= L && r < M && c < N", "b < L || r < M && c < N"])
def test_no_site_where_the_batch_bound_is_not_the_grids_layers(transform, guard):
    """A batch bounded by another count than the grid's layers (or not below it) could skip a matrix the tiles
    would compute: refused."""
    naive, _ = _batch_bounded(guard)
    assert transform.forward_sites(naive) == []
    with pytest.raises(NotApplicable, match="guard is not"):
        transform.forward(naive, SITE)


def test_no_site_on_a_three_dimensional_launch(transform):
    naive = golden("after")
    plan = (HERE / "untile_matmul" / "bias_relu" / "after.toml").read_text().replace("block = [16, 16]",
                                                                                   "block = [16, 16, 2]")
    state = KernelState(source=naive.source, plan=LaunchPlan.from_toml(plan))
    assert transform.forward_sites(state) == []


def test_no_site_where_a_launch_passes_another_count_of_arguments(transform):
    """The tiled grid is written from what each launch passes for M and N: a launch that does not match the kernel's
    parameters is no site (rather than a site whose forward then fails)."""
    naive = golden("after")
    plan = (HERE / "untile_matmul" / "bias_relu" / "after.toml").read_text().replace(
        'args = ["A", ', 'args = ["A", "A2", ')
    state = KernelState(source=naive.source, plan=LaunchPlan.from_toml(plan))
    assert state.plan != naive.plan and transform.forward_sites(state) == []


def test_the_naive_product_may_declare_its_row_first_and_return_past_the_edge(transform):
    """The two indexes in either order, and `if (r >= M || c >= N) return;` before the work: the same tiled
    kernel as from the golden's own spelling."""
    naive = golden("after").source
    x = "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n"
    y = "    int r = blockIdx.y * blockDim.y + threadIdx.y;\n"
    guarded = naive[naive.index("    if (r < M && c < N) {\n"):naive.rindex("    }\n}")]
    work = textwrap.dedent(guarded.split("\n", 1)[1])
    spellings = [naive.replace(x + y, y + x),
                 naive.replace(guarded + "    }\n", "    if (c >= N || r >= M) return;\n" +
                               textwrap.indent(work, "    "))]
    for source in spellings:
        state = KernelState(source=source, plan=golden("after").plan)
        assert transform.forward_sites(state) == [SITE], source
        assert transform.forward(state, SITE).state == golden("before"), source


HEAD = ("__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, "
        "const float* __restrict__ bias,\n                       float* __restrict__ C, int M, int N, int K, "
        "float alpha) {\n")
FLAT = HEAD + """    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M * N) {
        int r = i / N;
        int c = i % N;
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[r * K + k] * B[k * N + c];
        float v = alpha * acc + bias[c];
        C[i] = v > 0.0f ? v : 0.0f;
    }
}
"""
FLAT_PLAN = LaunchPlan.from_toml((HERE / "untile_matmul" / "bias_relu" / "after.toml").read_text()
                                 .replace('grid = ["cdiv(n, 16)", "cdiv(m, 16)"]', 'grid = ["cdiv(m * n, 256)"]')
                                 .replace("block = [16, 16]", "block = [256]"))


TWO_D = HEAD + """    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[r * K + k] * B[k * N + c];
        int i = r * N + c;
        float v = alpha * acc + bias[c];
        C[i] = v > 0.0f ? v : 0.0f;
    }
}
"""

def _flat_spellings() -> list[str]:
    returning = FLAT.replace("    if (i < M * N) {\n", "    if (i >= M * N) return;\n").replace(
        "        C[i] = v > 0.0f ? v : 0.0f;\n    }\n", "        C[i] = v > 0.0f ? v : 0.0f;\n")
    split = "        int r = i / N;\n        int c = i % N;\n"
    return [FLAT, FLAT.replace("i < M * N", "i < N * M"),
            FLAT.replace(split, "        int c = i % N;\n        int r = i / N;\n"),
            FLAT.replace(split, "        int r = i / N, c = i % N;\n"),
            FLAT.replace("blockIdx.x * blockDim.x + threadIdx.x", "threadIdx.x + blockIdx.x * blockDim.x"),
            returning]


@pytest.mark.parametrize("spelling", range(6))
def test_a_flat_product_is_tiled_as_the_2d_form_it_spells(transform, spelling):
    """One thread per output on a 1-D launch, `r = i / N` and `c = i % N` (in either order, or one declaration), under
    `i < M * N` or returning past it: the tiled kernel the 2-D spelling gives, on the 2-D tiled launch (the flat
    index, declared again from the row and column, read as its value `r * N + c` where the epilogue names it);
    backward writes that 2-D spelling."""
    state = KernelState(source=_flat_spellings()[spelling], plan=FLAT_PLAN)
    assert transform.forward_sites(state) == [SITE]
    tiled = transform.forward(state, SITE).state
    assert tiled == transform.forward(KernelState(source=TWO_D, plan=golden("after").plan), SITE).state
    assert tiled.plan.launches[0].grid[:2] == ("cdiv(n, 16)", "cdiv(m, 16)")
    two_d = TWO_D.replace("        int i = r * N + c;\n", "").replace("C[i]", "C[r * N + c]")
    assert transform.backward(tiled, SITE).state.source == two_d


def test_the_flat_products_tiles_give_its_bits_on_the_cpu(transform, tmp_path):
    tiled = transform.forward(KernelState(source=FLAT, plan=FLAT_PLAN), SITE).state
    emulate.same_product_bits(KernelState(source=FLAT, plan=FLAT_PLAN), tiled, tmp_path,
                              lambda m, n, k, g: {"A": torch.randn(m * k, generator=g),
                                                  "B": torch.randn(k * n, generator=g),
                                                  "bias": torch.randn(n, generator=g)}, "C", alpha=0.75)


@pytest.mark.parametrize("edit, why", [
    (("int c = i % N;", "int c = i % K;"), "not declared first as"),  # the column of another width
    (("if (i < M * N) {", "if (i < M * K) {"), "the guard's count is not M \\* N"),
    (("if (i < M * N) {", "if (i < M + N) {"), "the guard is not"),
    (("* B[k * N + c];", "* B[k * N + c] + bias[i];"), "'i' is named before the epilogue"),
    (("float v = alpha * acc + bias[c];", "float v = alpha * acc + bias[c];\n        r += 1;"), "assigned"),
    (("int i = blockIdx.x * blockDim.x + threadIdx.x;", "int i = blockIdx.y * blockDim.y + threadIdx.y;"),
     "no 1-D index"),
])
def test_no_site_where_a_flat_product_is_not_one_output_a_thread(transform, edit, why):
    assert edit[0] in FLAT
    state = KernelState(source=FLAT.replace(*edit), plan=FLAT_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def _pairs(m: int, n: int, k: int, g: torch.Generator) -> dict:
    return {"A": torch.randn(m * k, generator=g), "B": torch.randn(n * k, generator=g)}


def test_a_sum_of_another_function_of_the_two_elements_is_tiled_to_the_naive_bits(transform, tmp_path):
    """Euclidean distances between rows: the sum of squared differences is tiled as a product is, the update kept
    with tile reads in every place it read A or B; written with a local (`float d = A - B; acc += d * d;`) it is the
    same sum with the local's value in its place. The tiles give the naive kernel's bits on the CPU emulator."""
    naive, tiled = golden("after", "distance"), golden("before", "distance")
    local = KernelState(source=naive.source.replace(
        "for (int k = 0; k < K; ++k) acc += (A[r * K + k] - B[c * K + k]) * (A[r * K + k] - B[c * K + k]);",
        "for (int k = 0; k < K; ++k) {\n            float d = A[r * K + k] - B[c * K + k];\n"
        "            acc += d * d;\n        }"), plan=naive.plan)
    assert local.source != naive.source
    assert transform.forward(local, SITE).state == tiled
    emulate.same_product_bits(naive, tiled, tmp_path, _pairs, "C")
    emulate.same_product_bits(local, tiled, tmp_path / "local", _pairs, "C")
    assert get("unblock_matmul").forward_sites(tiled) == []  # its micro-tiles multiply-add: a product only


@pytest.mark.parametrize("update, why", [
    ("acc += (A[r * K + k] - B[c * K + k]) * k;", "names k besides"),  # the tile's k is not the product's
    ("acc += (A[r * K + k] - B[c * K + k]) * C[0];", "one element of each of two arrays"),
    ("acc += A[r * K + k] - A[r * K + k + 1] + B[c * K + k];", "one element of each of two arrays"),
    ("acc += fabsf(A[r * K + k] - B[c * K + k]) * M;", "names M besides"),
    ("acc += my_abs(A[r * K + k] - B[c * K + k]);", "names my_abs besides"),
    ("{ float d = A[r * K + k] - B[c * K + k]; acc += 1.0f; }", "not read by its sum"),
    ("{ float d = A[r * K + k] - B[c * K + k]; acc += d; acc += d; }", "not one sum"),
    ("acc -= A[r * K + k] - B[c * K + k];", "not one sum"),
])
def test_no_site_where_a_sum_is_not_of_one_element_of_each_operand(transform, update, why):
    naive = golden("after", "distance")
    line = "acc += (A[r * K + k] - B[c * K + k]) * (A[r * K + k] - B[c * K + k]);"
    state = KernelState(source=naive.source.replace(line, update), plan=naive.plan)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def _widened(c: str, r: str, k: str, sizes: str = "int") -> KernelState:
    """The golden naive product with its column, row and k declared `c`, `r` and `k` (types; each 64-bit one cast
    on its block coordinate, as PyTorch extensions write it), its sizes of type `sizes`."""
    naive = golden("after")
    source = naive.source.replace("int M, int N, int K", f"{sizes} M, {sizes} N, {sizes} K")
    for kind, name, axis in ((c, "c", "x"), (r, "r", "y")):
        cast = "" if kind == "int" else f"({kind})"
        source = source.replace(f"int {name} = blockIdx.{axis}", f"{kind} {name} = {cast}blockIdx.{axis}")
    return KernelState(source=source.replace("for (int k = 0;", f"for ({k} k = 0;"), plan=naive.plan)


@pytest.mark.parametrize("c, r, k, sizes", [("int64_t", "int64_t", "int64_t", "int64_t"),
                                            ("size_t", "size_t", "size_t", "size_t"),
                                            ("long long", "long long", "int", "int"),  # 64-bit indexes, int sizes
                                            ("int64_t", "int", "long", "int")])  # one index of each width
def test_64_bit_indexes_are_tiled_in_their_own_width(transform, c, r, k, sizes):
    """Each index of the tiled form has the naive one's width (`long long` for every 64-bit spelling, the k step the
    loop index's own type), and a block's first column or row is formed in it: a 64-bit index of 64-bit sizes may
    pass what an int holds, and over int sizes r * N and the operands' subscripts are formed in 64 bits, which the
    epilogue, run as written, relies on. Backward writes the naive product back in the canonical spelling."""
    state = _widened(c, r, k, sizes)
    assert transform.forward_sites(state) == [SITE]
    tiled = transform.forward(state, SITE).state
    for kind, name, axis in ((c, "c", "x"), (r, "r", "y")):
        wide = "" if kind == "int" else "(long long)"
        assert f"{'int' if kind == 'int' else 'long long'} {name} = {wide}blockIdx.{axis} * 16" in tiled.source
    assert f"for ({k} tile_k = 0; tile_k < K; tile_k += 16)" in tiled.source
    naive = transform.backward(tiled, SITE).state
    assert f"for ({k} k = 0; k < K; ++k)" in naive.source
    assert transform.forward(naive, SITE).state == tiled
    assert get("unblock_matmul").forward_sites(tiled) == [Anchor("kernel", "function", "block")]


def test_tiles_of_mixed_widths_give_the_naive_kernels_bits_on_the_cpu(transform, tmp_path):
    state = _widened("int64_t", "int", "long", "int")
    emulate.same_product_bits(state, transform.forward(state, SITE).state, tmp_path,
                              lambda m, n, k, g: {"A": torch.randn(m * k, generator=g),
                                                  "B": torch.randn(k * n, generator=g),
                                                  "bias": torch.randn(n, generator=g)}, "C", alpha=0.75)


@pytest.mark.parametrize("edit, why", [
    # an unsigned index that a subtraction reads (c - 1 wraps at 0): signed 64 bits would give another value
    (("float v = alpha * acc + bias[c];", "float v = alpha * acc + bias[c] + (float)(c - 1);"), "two indexes"),
    # a 64-bit index narrowed into 32 bits: kept as written, never read as an index
    (("long long c = (long long)blockIdx.x", "int c = (long long)blockIdx.x"), "two indexes"),
    (("for (long k = 0;", "for (short k = 0;"), "no zeroed float and loop over k"),  # would wrap at 2^15
])
def test_no_site_where_a_wider_index_could_take_another_value(transform, edit, why):
    state = _widened("size_t" if "(c - 1)" in edit[1] else "long long", "long long", "long", "int64_t")
    assert edit[0] in state.source
    state = KernelState(source=state.source.replace(*edit), plan=state.plan)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_no_site_where_a_64_bit_flat_index_is_split_into_32_bits(transform):
    """`int r = i / N` of a 64-bit i keeps only the row's low 32 bits past INT_MAX rows, which the 2-D form's row
    never does: refused. 64-bit rows and columns of a 32-bit i (widened) are read."""
    wide = FLAT.replace("int M, int N, int K", "int64_t M, int64_t N, int64_t K").replace(
        "int i = blockIdx.x", "int64_t i = (int64_t)blockIdx.x")
    split = "        int r = i / N;\n        int c = i % N;\n"
    assert split in wide
    state = KernelState(source=wide, plan=FLAT_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match="split into a 32-bit row or column"):
        transform.forward(state, SITE)
    widened = FLAT.replace(split, "        int64_t r = i / N;\n        int64_t c = i % N;\n")
    tiled = transform.forward(KernelState(source=widened, plan=FLAT_PLAN), SITE).state
    assert "long long c = (long long)blockIdx.x * 16 + threadIdx.x;" in tiled.source



ROW_OF_COLUMNS = (HERE / "spellings" / "products" / "u_row_of_columns.cu").read_text()
ROW_PLAN = LaunchPlan.from_toml((HERE / "spellings" / "products" / "u_row_of_columns.toml").read_text())
STORE = "C[row * N + col] = fmaxf(acc, 0.0f);"


@pytest.mark.parametrize("edits, why", [
    # a column reads the output the column before it wrote: in order one after another, a race in parallel
    ([(STORE, "C[row * N + col] = fmaxf(acc, 0.0f) + (col > 0 ? C[row * N + col - 1] : 0.0f);")],
     "touched at 2 places"),
    # a value carried from column to column: declared before the loop, or the row moved
    ([("    for (int col = 0;", "    float carry = 0.0f;\n    for (int col = 0;"),
      (STORE, STORE + "\n        carry += acc;")], "before one loop"),
    ([(STORE, STORE + "\n        row += M;")], "assigns `row`"),
    ([(STORE, "atomicAdd(&C[row * N + col], acc);")], "calls atomicAdd"),
    ([("for (int col = 0; col < N; ++col)", "for (int col = 1; col < N; ++col)")], "from 0"),  # a column left out
    ([("if (row >= M) return;", "if (row >= M - 1) return;")], "returning"),
])
def test_no_site_where_a_rows_columns_could_see_each_other(transform, edits, why):
    """A thread per row looping over its columns is read as a thread per output only where no column can see what
    another did."""
    source = ROW_OF_COLUMNS
    for old, new in edits:
        assert old in source
        source = source.replace(old, new)
    state = KernelState(source=source, plan=ROW_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("product", "function", "tile"))


# a linear layer's sum started from its bias, as people write it: the forms start it from zero and add the bias after
# the loop, under the guard (their threads past the matrix's edge run the loop too, and must not read bias there)
STARTED = TWO_D.replace("float acc = 0.0f;", "float acc = bias[c];").replace("alpha * acc + bias[c]", "alpha * acc")
ADDED_AFTER = TWO_D.replace(
    "acc += A[r * K + k] * B[k * N + c];\n", "acc += A[r * K + k] * B[k * N + c];\n        acc += bias[c];\n"
).replace("alpha * acc + bias[c]", "alpha * acc")
ROW_STARTED = ROW_OF_COLUMNS.replace("float* C,", "const float* bias, float* C,").replace(
    "float acc = 0.0f;", "float acc = bias[col];")
ROW_STARTED_PLAN = LaunchPlan.from_toml((HERE / "spellings" / "products" / "u_row_of_columns.toml").read_text()
                                        .replace('"B", "C"', '"B", "bias", "C"'))


def _whole_numbers(m: int, n: int, k: int, g: torch.Generator) -> dict:
    """Operands and bias of small whole numbers: every sum is exact in any order, so a bias added after the loop
    gives the bits of one added first, and a bias read at another column would not."""
    def whole(count: int) -> torch.Tensor:
        return torch.randint(-4, 5, (count,), generator=g).float()
    return {"A": whole(m * k), "B": whole(k * n), "bias": whole(n)}


def test_a_sum_started_from_the_bias_is_tiled_with_the_bias_added_after_its_loop(transform, tmp_path):
    """The 2-D, flat and row-of-columns spellings of a product whose sum starts at bias[c]: each tiled as the
    spelling that starts at zero and adds the bias after the loop, whose bits it gives on the CPU emulator where the
    sums are exact. Its backward is that spelling (the naive form starting from zero)."""
    plan = golden("after").plan
    started = KernelState(source=STARTED, plan=plan)
    assert transform.forward_sites(started) == [SITE]
    tiled = transform.forward(started, SITE).state
    assert tiled == transform.forward(KernelState(source=ADDED_AFTER, plan=plan), SITE).state
    assert "acc += bias[c];" in tiled.source.split("__syncthreads();\n    }")[-1]  # under the guard
    assert transform.backward(tiled, SITE).state.source == ADDED_AFTER.replace("        int i = r * N + c;\n", "") \
        .replace("C[i]", "C[r * N + c]")
    emulate.same_product_bits(started, tiled, tmp_path / "2d", _whole_numbers, "C", alpha=0.75)
    flat = FLAT.replace("float acc = 0.0f;", "float acc = bias[c];").replace("alpha * acc + bias[c]", "alpha * acc")
    assert transform.forward(KernelState(source=flat, plan=FLAT_PLAN), SITE).state == tiled
    rows = KernelState(source=ROW_STARTED, plan=ROW_STARTED_PLAN)
    (site,) = transform.forward_sites(rows)
    emulate.same_product_bits(rows, transform.forward(rows, site).state, tmp_path / "rows", _whole_numbers, "C")


@pytest.mark.slow  # the emulator builds twice more; the 2-D case above runs by default (suite time)
def test_a_bias_started_product_is_register_blocked_with_its_bits(transform, tmp_path):
    started = KernelState(source=STARTED, plan=golden("after").plan)
    tiled = transform.forward(started, SITE).state
    unblock = get("unblock_matmul")
    (site,) = unblock.forward_sites(tiled)
    emulate.same_product_bits(started, unblock.forward(tiled, site).state, tmp_path, _whole_numbers, "C",
                              alpha=0.75)


@pytest.mark.parametrize("start, why", [
    ("atomicAdd(&bias[c], 1.0f)", "no zeroed float"),  # a start with an effect is evaluated where it was, once
    ("bias[c]++", "no zeroed float"),  # a start that assigns
    ("A[r * K]", "does not only finish the accumulator"),  # a start reading an operand: the epilogue may not
])
def test_no_site_where_the_bias_cannot_be_added_after_the_loop(transform, start, why):
    state = KernelState(source=STARTED.replace("float acc = bias[c];", f"float acc = {start};"),
                        plan=golden("after").plan)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


LAYER_ROWS = (HERE / "spellings" / "products" / "v_row_on_grid_layer.cu").read_text()
LAYER_PLAN = (HERE / "spellings" / "products" / "v_row_on_grid_layer.toml").read_text()


def test_a_row_on_a_grid_layer_is_tiled_as_the_2d_form_it_spells(transform):
    """`int row = blockIdx.y;` on a 1-D block, every grid M layers along y: tiled as the 2-D index bounded by M (which
    held in every block as launched), its guard returning or wrapping the work."""
    two_d = LAYER_ROWS.replace("int row = blockIdx.y;", "int row = blockIdx.y * blockDim.y + threadIdx.y;") \
        .replace("if (col < N) {", "if (row < M && col < N) {")
    plan = LaunchPlan.from_toml(LAYER_PLAN)
    site = Anchor("product", "function", "tile")
    tiled = transform.forward(KernelState(source=two_d, plan=plan), site).state
    returning = LAYER_ROWS.replace("    if (col < N) {\n", "    if (col >= N) return;\n").replace(
        "0.01f * acc;\n    }\n", "0.01f * acc;\n")
    row_first = LAYER_ROWS.replace("    int row = blockIdx.y;\n", "").replace(
        "int col =", "int row = blockIdx.y;\n    int col =")
    for source in (LAYER_ROWS, returning, row_first):
        state = KernelState(source=source, plan=plan)
        assert transform.forward_sites(state) == [site], source
        assert transform.forward(state, site).state == tiled, source
    assert tiled.plan.launches[0].grid[:2] == ("cdiv(n, 16)", "cdiv(m, 16)")


@pytest.mark.parametrize("old, new, why", [
    ("block = [256]", "block = [128, 2]", "block is not 1-D"),  # threadIdx.y would move the row
    ('"m"]', '"m", 2]', "more than 2 dimension"),  # grid z would run every row twice
    ("int row = blockIdx.y;", "int row = blockIdx.y;\n    row += 1;", "assigned"),
    ("if (col < N) {", "if (col <= N) {", "guard is not"),
    ("if (col < N) {", "if (col < N && row < K) {", "guard is not"),
])
def test_no_site_where_a_grid_layer_is_not_a_bounded_row(transform, old, new, why):
    state = edited(LAYER_ROWS, LAYER_PLAN, old, new)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("product", "function", "tile"))


STRIDED = (HERE / "spellings" / "products" / "w_grid_stride.cu").read_text()
STRIDED_PLAN = LaunchPlan.from_toml((HERE / "spellings" / "products" / "w_grid_stride.toml").read_text())


@pytest.mark.parametrize("old, new, why", [
    ("i < M * N;", "i < M * K;", "the guard's count is not M \\* N"),  # not every output, or not once each
    ("int r = i / N, c = i % N;", "int r = i / N, c = i % N;\n        i += 1;", "changes its element index"),
    ("C[i] = ", "C[i + blockDim.x * gridDim.x - 1] = ", "uses its stride"),  # another iteration's output
    ("C[i] = ", "__syncthreads();\n        C[i] = ", "synchronizes"),
])
def test_no_site_where_a_grid_stride_loop_is_not_one_output_an_iteration(transform, old, new, why):
    assert old in STRIDED
    state = KernelState(source=STRIDED.replace(old, new), plan=STRIDED_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("product", "function", "tile"))


def test_a_row_layer_the_kernel_is_not_told_of_gets_its_count_as_a_parameter(transform):
    """The grid alone carried M: the tiled kernel takes it as `int grid_y`, passed the grid's own extent."""
    folder = HERE / "spellings" / "products"
    state = KernelState(source=(folder / "x_row_layer_count_unpassed.cu").read_text(),
                        plan=LaunchPlan.from_toml((folder / "x_row_layer_count_unpassed.toml").read_text()))
    tiled = transform.forward(state, Anchor("product", "function", "tile")).state
    assert "float* C, int N, int K, int grid_y) {" in tiled.source
    assert "if (row < grid_y && col < N) {" in tiled.source
    (launch,) = tiled.plan.launches
    assert launch.grid[:2] == ("cdiv(n, 16)", "cdiv(m, 16)") and launch.args[-1].value == "m"
