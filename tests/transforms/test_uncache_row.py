"""uncache_row: a row a warp or a block keeps in registers across its passes (when it fits; the passes as they
were otherwise) is read from memory in every pass; forward finds its sites by analysis on warp-per-row and
block-per-row kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from klineage.kernel import KernelState, load_kernel
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

SITE = Anchor("kernel", "function", "in")


@pytest.fixture(scope="module")
def transform():
    return get("uncache_row")


# softmax: the canonical form the forward writes (a warp a row); block_softmax: the same on a block a row, the
# columns strided by the block; register_array: the spelling of hand-written kernels, a per-thread array filled in
# one pass and read in later ones
CASES = ("softmax", "block_softmax", "register_array")


def golden(which: str, case: str = "softmax") -> KernelState:
    return load(HERE / "uncache_row" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("uncache_row", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(cache, case):
    for which in ("before", "after"):
        compiles_without_spills(golden(which, case), cache)


def test_forward_follows_serialize_reduction_on_a_naive_softmax(transform):
    """The naive one-thread-per-row softmax has no site; a warp per row first, then the row cache."""
    naive = load(HERE / "serialize_reduction" / "softmax", "after", "kernel")
    assert transform.forward_sites(naive) == []
    warp = get("serialize_reduction").forward(naive, Anchor("kernel", "function", "row")).state
    assert transform.forward_sites(warp) == [SITE]
    cached = transform.forward(warp, SITE).state
    assert cached.source.count("row_cache[cache_t] = in[j];") == 1
    assert cached.source.count("if (n <= 32 * 64) {") == 3


@pytest.mark.parametrize("edit, why", [
    (("    const float* in = x + (long long)row * n;\n",
      "    const float* in = x + (long long)row * n;\n    in += 0;\n"), "moves in"),
    (("expf(in[j] - m) / s", "expf(in[j + 1] - m) / s"), r"not at \[j\] or \[X \+ j\]"),
    (("    float s = 0.0f;\n", "    float s = 0.0f;\n    if (m > 0.0f)\n"), "not in one block"),
])
def test_no_site_where_it_would_not_be_legal(transform, edit, why):
    state = golden("after")
    assert edit[0] in state.source
    changed = KernelState(source=state.source.replace(edit[0], edit[1]), plan=state.plan)
    assert transform.forward_sites(changed) == [] or why == "not in one block" and all(
        a.key != "in" for a in transform.forward_sites(changed))
    with pytest.raises(NotApplicable, match=why):
        transform.forward(changed, SITE)


ARRAY = Anchor("kernel", "array", "held")


def test_the_array_site_is_in_the_function_that_declares_it(transform):
    """Moved into a device function (as the corpus's softmax experts have it), the site follows it there."""
    state = golden("before", "register_array")
    source = state.source.replace('extern "C" __global__ void kernel(', "__device__ void rows(").replace(
        "\n}\n", "\n}\n", 1) + ('\nextern "C" __global__ void kernel(const float* __restrict__ x, '
                               "float* __restrict__ y, int n) { rows(x, y, n); }\n")
    moved = KernelState(source=source, plan=state.plan)
    assert [a for a in transform.find(moved) if a.kind == "array"] == [Anchor("rows", "array", "held")]
    uncached = transform.backward(moved, Anchor("rows", "array", "held")).state
    assert uncached.source.count("(row[c])") == 3
    assert transform.forward(uncached, Anchor("rows", "array", "held")).state == moved


@pytest.mark.parametrize("edit, why", [
    (("            sum += held[k];\n", "            sum += row[c];\n"), "does not read it: it is consumed once"),
    (("    const float mean =", "    row += n;\n    const float mean ="), "'row', which the stored value depends on"),
    (("    float squares = 0.0f;\n#pragma unroll\n    for (int k = 0; k < PER_THREAD; ++k) {\n"
      "        const int c = k * THREADS + tid;",
      "    float squares = 0.0f;\n#pragma unroll\n    for (int k = 0; k < PER_THREAD; ++k) {\n"
      "        const int c = k * THREADS + tid + 1;"), "'c' of the stored value is not declared alike"),
    (("if (c < n) out[c] = (held[k] - mean) * rstd;", "if (c < n) held[k] = (held[k] - mean) * rstd;"),
     "not stored exactly once"),
    (("    const float mean =", "    held[0] += 1.0f;\n    const float mean ="), "used other than as held"),
])
def test_no_array_site_where_uncaching_would_change_what_is_read(transform, edit, why):
    state = golden("before", "register_array")
    assert edit[0] in state.source
    changed = KernelState(source=state.source.replace(edit[0], edit[1]), plan=state.plan)
    assert [a for a in transform.find(changed) if a.kind == "array"] == []
    with pytest.raises(NotApplicable, match=why):
        transform.backward(changed, ARRAY)


@pytest.mark.parametrize("expert", ["row_softmax/warp_vec4", "causal_softmax/warp_vec4"])
def test_the_corpus_softmax_experts_keep_their_row_in_a_register_array(transform, expert):
    """What a walk of these experts can now take apart: the later passes load the row again, exactly undone."""
    state = load_kernel(Path(__file__).resolve().parents[2] / "corpus" / "kernels" / expert)
    site = Anchor("softmax_row", "array", "cache")
    assert [a for a in transform.find(state) if a.kind == "array"] == [site]
    uncached = transform.backward(state, site).state
    assert "(__ldg(xv + j))" in uncached.source
    assert transform.forward(uncached, site).state == state


def test_a_row_read_through_ldg_becomes_a_register_read_whole(transform):
    """`__ldg(&in[j])` (the ldg card's spelling) must not become `__ldg(&row_cache[cache_t])`: a global load of
    a local address, which the H200 faulted on ("operation not supported on global/shared address space")."""
    state = golden("after")
    ldg = KernelState(source=state.source.replace("in[j]", "__ldg(&in[j])"), plan=state.plan)
    assert ldg.source.count("__ldg(&in[j])") == 3
    assert transform.forward_sites(ldg) == [SITE]
    cached = transform.forward(ldg, SITE).state.source
    assert "row_cache[cache_t] = in[j];" in cached and "&row_cache" not in cached
    assert cached.count("__ldg(&in[j])") == 3  # the rows that do not fit keep their passes verbatim


def test_no_site_where_a_pass_takes_the_rows_address(transform):
    state = golden("after")
    escaped = KernelState(source=state.source.replace("m = fmaxf(m, in[j]);", "m = fmaxf(m, *(&in[j]));"),
                          plan=state.plan)
    assert escaped.source != state.source
    assert transform.forward_sites(escaped) == []
    with pytest.raises(NotApplicable, match="takes the address of in"):
        transform.forward(escaped, SITE)


def test_ldg_then_row_cache_compiles_without_spills(transform, cache):
    state = golden("after")
    ldg = KernelState(source=state.source.replace("in[j]", "__ldg(&in[j])"), plan=state.plan)
    compiles_without_spills(transform.forward(ldg, SITE).state, cache)


@pytest.mark.parametrize("declared", ["float const* in = x + (long long)row * n;",
                                      "const float* const in = x + (long long)row * n;",
                                      "const float *__restrict__ in = &x[(long long)row * n];"])
def test_the_row_pointer_may_be_qualified_any_way(transform, declared):
    """A pointer to const floats however it is spelled is cached, and then filled 16 bytes a lane at a time
    through the read-only path (it points into a const parameter)."""
    naive = golden("after")
    assert "const float* in = x + (long long)row * n;" in naive.source
    state = KernelState(source=naive.source.replace("const float* in = x + (long long)row * n;", declared),
                        plan=naive.plan)
    assert transform.forward_sites(state) == [SITE]
    cached = transform.forward(state, SITE).state
    assert cached.source.count("row_cache[cache_t] = in[j];") == 1
    vector = get("scalarize_row_cache")
    packed = vector.forward(cached, vector.forward_sites(cached)[0]).state
    assert "__ldg(reinterpret_cast<const float4*>(&in[cache_j4]))" in packed.source


def test_forward_follows_serialize_block_reduction_on_a_naive_softmax(transform):
    """A block a row first (its passes strided by the block's 256 threads), then the row cache: 64 values a thread,
    what 16384 registers leave each of 256 threads."""
    naive = load(HERE / "serialize_reduction" / "softmax", "after", "kernel")
    block = get("serialize_block_reduction").forward(naive, Anchor("kernel", "function", "row")).state
    assert transform.forward_sites(block) == [SITE]
    cached = transform.forward(block, SITE).state
    assert cached.source.count("if (n <= 256 * 64) {") == 3
    assert cached.source.count("const int j = lane + 256 * cache_t;") == 3


HAND_WRITTEN = """#define BLOCK 256
__global__ void kernel(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    __shared__ float red[BLOCK];
    int row = blockIdx.x, tid = threadIdx.x;
    const float* x = in + (size_t)row * cols;
    float m = -INFINITY;
    for (int j = tid; j < cols; j += BLOCK) m = fmaxf(m, x[j]);
    red[tid] = m;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] = fmaxf(red[tid], red[tid + s]);
        __syncthreads();
    }
    const float top = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int j = tid; j < cols; j += BLOCK) sum += x[j] - top;
    red[tid] = sum;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        __syncthreads();
    }
    for (int j = tid; j < cols; j += BLOCK) out[(size_t)row * cols + j] = (x[j] - top) / red[0];
}
"""
HAND_ARGS = '"in", "out", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }'


@pytest.mark.parametrize("case", sampled([("BLOCK", "256", 64), ("blockDim.x", "256", 64), ("blockDim.x", "1024", 16)],
                                         keep=[("BLOCK", "256", 64), ("blockDim.x", "1024", 16)]))
def test_a_hand_written_block_row_is_cached_and_computes_its_bits(transform, tmp_path, cache, case):
    """A block-per-row kernel as people write it (a thread index declared beside the row, passes stepping by a
    block-size constant or blockDim.x, shared-memory trees between them) keeps its row in what the block's register
    budget leaves a thread (16 of 1024 threads), and on the CPU its outputs are the kernel's own bits for rows that
    fit and one that does not (the passes as they were)."""
    stride, threads, cached = case
    source = HAND_WRITTEN.replace("j += BLOCK", f"j += {stride}").replace("BLOCK 256", f"BLOCK {threads}")
    state = KernelState(source=source, plan=plan_of(HAND_ARGS, grid="rows", block=int(threads)))
    site = Anchor("kernel", "function", "x")
    assert transform.forward_sites(state) == [site]
    form = transform.forward(state, site).state
    assert form.source.count(f"if (cols <= {stride} * {cached}) {{") == 3
    compiles_without_spills(form, cache)

    def inputs_of(rows: int, cols: int) -> tuple[dict, dict, dict]:
        g = torch.Generator().manual_seed(rows * cols)  # whole numbers: the trees' sums are exact in any order
        return ({"rows": rows, "cols": cols}, {"in": torch.randint(-8, 9, (rows * cols,), generator=g).float()},
                {"out": (torch.float32, rows * cols)})

    past = int(threads) * cached + 3  # a row the cache cannot hold
    assert emulate.differences(tmp_path, state, {"cached": form}, ((3, 5), (2, 700), (1, past)), inputs_of) == []


@pytest.mark.parametrize("old, new, why", [
    ("int row = blockIdx.x, tid = threadIdx.x;", "int row = blockIdx.x, tid = threadIdx.x + 1;", "start at tid"),
    ("int row = blockIdx.x, tid = threadIdx.x;", "int row = blockIdx.x, tid = threadIdx.x;\n    tid %= 128;",
     "start at tid"),  # assigned: no longer the thread's index
    ("for (int j = tid; j < cols; j += BLOCK) sum", "for (int j = tid; j < cols; j += blockDim.x) sum",
     "step or stop differently"),  # slot t would hold another column in that pass
])
def test_no_block_site_where_a_thread_might_not_start_at_its_index(transform, old, new, why):
    assert old in HAND_WRITTEN
    state = KernelState(source=HAND_WRITTEN.replace(old, new), plan=plan_of(HAND_ARGS, grid="rows"))
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "x"))
