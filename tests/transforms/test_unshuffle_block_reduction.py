"""unshuffle_block_reduction: a block reduction through warp shuffles becomes the shared-memory tree; forward reads
the tree however a hand-written kernel spells it, writes every tree of the kernel as shuffles, and refuses with the
reason a tree whose slots, block or index it cannot account for."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import NotApplicable, get, refusals
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = HERE / "unshuffle_block_reduction"
ROW_ARGS = '"x", "out", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }'


@pytest.fixture(scope="module")
def transform():
    return get("unshuffle_block_reduction")


@pytest.mark.parametrize("case", ["rowsum", "softmax"])
def test_golden(case):
    check_golden("unshuffle_block_reduction", case)


@pytest.mark.parametrize("case", ["rowsum", "softmax"])
def test_golden_kernels_compile(cache, case):
    for which in ("before", "after"):
        compiles_without_spills(load(CASES / case, which, "kernel"), cache)


def _spelled() -> KernelState:
    """A softmax as someone might write it: a block size macro, an unsigned index, a comment between the tree's
    statements, a braced combine with the partner first, `s /= 2` and `s = s >> 1`, `red[s + t]`."""
    folder = CASES / "softmax"
    return KernelState(source=(folder / "spelled.cu").read_text(),
                       plan=LaunchPlan.from_toml((folder / "before.toml").read_text()))


def test_forward_reads_a_hand_written_spelling_of_both_trees(transform):
    spelled = _spelled()
    (site,) = transform.forward_sites(spelled)
    rewrite = transform.forward(spelled, site)
    assert rewrite.state.source == load(CASES / "softmax", "before", "kernel").source
    assert rewrite.state.plan == spelled.plan and "2 block reduction(s)" in rewrite.note


def _barriers_in_loops(source: str) -> int:
    from klineage.features import cuda_parser as cp

    return sum(cp.parse(source).text(loop.node).count("__syncthreads") for loop in cp.loops(source))


def test_the_shuffle_form_has_no_barrier_per_level(transform, cache):
    """The tree waits at a barrier in every level of its loop (log2(256) + 1 in all); the shuffle form's two
    barriers are outside any loop, and it exchanges through SHFL in SASS."""
    from tests.cuda_tools import feature_counts

    tree, shuffled = (load(CASES / "rowsum", which, "kernel") for which in ("after", "before"))
    assert _barriers_in_loops(tree.source) == 1 and _barriers_in_loops(shuffled.source) == 0
    assert shuffled.source.count("__syncthreads") == 2
    counts = [feature_counts(compiles_without_spills(state, cache)) for state in (tree, shuffled)]
    assert counts[0].get("shfl", 0) == 0 and counts[1].get("shfl", 0) >= 2, counts


def _inputs(rows: int, cols: int):
    """Small whole numbers: every order of adding them gives the same float, so the forms must agree to the bit."""
    x = torch.randint(-8, 9, (rows * cols,), generator=torch.Generator().manual_seed(rows * 1000 + cols)).float()
    return {"rows": rows, "cols": cols}, {"x": x}, {"out": (torch.float32, rows)}


@pytest.mark.parametrize("threads", [32, 64, 256, 1024])
def test_the_shuffled_sum_is_the_trees_on_the_cpu_emulator(transform, tmp_path, threads):
    """One warp, two, eight and thirty-two: the first warp's guarded pass over the warps' sums, for every count."""
    from tests.transforms import emulate

    folder = CASES / "rowsum"
    source = (folder / "after.cu").read_text().replace("partial[256]", "partial[1024]")
    tree = KernelState(source=source, plan=plan_of(ROW_ARGS, grid="rows", block=threads))
    shuffled = transform.forward(tree, transform.forward_sites(tree)[0]).state
    assert emulate.differences(tmp_path, tree, {"shuffled": shuffled}, ((3, 1), (5, 77), (2, 3000)), _inputs) == []


MAX = """__global__ void kernel(const float* x, float* out, int rows, int cols) {
    __shared__ float m[128];
    float v = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) v = fmaxf(v, x[blockIdx.x * cols + c]);
    m[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x >> 1; s > 0; s >>= 1) {
        if (threadIdx.x < s) m[threadIdx.x] = fmaxf(m[threadIdx.x], m[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = m[0];
}
"""


@pytest.mark.parametrize("declared", ["int row = blockIdx.x, t = threadIdx.x;", "const int t = threadIdx.x;",
                                      "unsigned row = blockIdx.x, lo = 0, t = threadIdx.x;"])
def test_a_tree_indexed_by_a_local_declared_beside_others_is_read(transform, declared):
    """The thread's index held by a local, declared alone or after other locals of its declaration (as people write
    `int row = blockIdx.x, tid = threadIdx.x;`): the same index."""
    source = MAX.replace("threadIdx.x", "t").replace("__shared__ float m[128];",
                                                     f"__shared__ float m[128];\n    {declared}")
    state = KernelState(source=source, plan=plan_of(ROW_ARGS, grid="rows", block=128))
    (site,) = transform.forward_sites(state)
    assert "__shfl_down_sync" in transform.forward(state, site).state.source


def test_a_max_of_any_floats_is_the_trees_to_the_bit(transform, tmp_path):
    from tests.transforms import emulate

    tree = KernelState(source=MAX, plan=plan_of(ROW_ARGS, grid="rows", block=128))
    shuffled = transform.forward(tree, transform.forward_sites(tree)[0]).state
    assert "fmaxf(m_v, __shfl_down_sync(0xffffffffu, m_v, m_o))" in shuffled.source

    def inputs_of(rows: int, cols: int):
        x = torch.randn(rows * cols, generator=torch.Generator().manual_seed(cols))
        return {"rows": rows, "cols": cols}, {"x": x}, {"out": (torch.float32, rows)}

    assert emulate.differences(tmp_path, tree, {"shuffled": shuffled}, ((4, 100), (2, 1000)), inputs_of) == []


INTERLEAVED = """__global__ void kernel(const float* x, float* out, int rows, int cols) {
    __shared__ int sdata[256];
    unsigned int tid = threadIdx.x;
    int count = 0;
    for (int c = tid; c < cols; c += blockDim.x) count += x[blockIdx.x * cols + c] > 0.0f;
    sdata[tid] = count;
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (tid % (2 * s) == 0) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = sdata[0];
}
"""


@pytest.mark.parametrize("step, guard", [("s *= 2", "tid % (2 * s) == 0"), ("s <<= 1", "(tid & (s * 2 - 1)) == 0"),
                                         ("s = s * 2", "tid % (s << 1) == 0")])
@pytest.mark.parametrize("pragma", ["", "#pragma unroll\n    "])
def test_the_interleaved_tree_is_read_too(transform, step, guard, pragma):
    """The tutorial's first tree doubles the distance between the slots it adds, the adding threads spread out;
    it leaves the same total in slot 0. An unroll pragma on the loop is read past (the shuffle form has none)."""
    source = INTERLEAVED.replace("s *= 2", step).replace("tid % (2 * s) == 0", guard).replace(
        "    for (unsigned int s = 1", f"    {pragma}for (unsigned int s = 1")
    state = KernelState(source=source, plan=plan_of(ROW_ARGS, grid="rows", block=256))
    (site,) = transform.forward_sites(state)
    shuffled = transform.forward(state, site).state.source
    assert "sdata_v = sdata_v + __shfl_down_sync(0xffffffffu, sdata_v, sdata_o);" in shuffled
    assert "int sdata_v = count;" in shuffled and "s *= 2" not in shuffled


def test_an_integer_count_through_the_interleaved_tree_is_the_trees_on_the_cpu_emulator(transform, tmp_path):
    from tests.transforms import emulate

    tree = KernelState(source=INTERLEAVED, plan=plan_of(ROW_ARGS, grid="rows", block=256))
    shuffled = transform.forward(tree, transform.forward_sites(tree)[0]).state
    assert emulate.differences(tmp_path, tree, {"shuffled": shuffled}, ((3, 1000), (2, 7)), _inputs) == []


DYNAMIC = INTERLEAVED.replace("__shared__ int sdata[256];", "extern __shared__ int sdata[];")


def _dynamic(shared: str, source: str = DYNAMIC) -> KernelState:
    plan = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["rows"]\n'
                                f'block = [256]\nshared = "{shared}"\nargs = [{ROW_ARGS}]\n')
    return KernelState(source=source, plan=plan)


def test_an_extern_shared_array_holds_what_the_launch_gives_it(transform, cache):
    state = _dynamic("256 * 4")
    (site,) = transform.forward_sites(state)
    shuffled = transform.forward(state, site).state
    assert "if ((tid & 31) == 0) sdata[tid >> 5] = sdata_v;" in shuffled.source
    compiles_without_spills(shuffled, cache)
    refused = {
        "16 * 4": "sdata holds fewer than 32 values",
        "rows * 4": "sdata's size (the dynamic shared memory of its launch) is no constant",
    }
    for shared, reason in refused.items():
        with refusals() as why:
            assert transform.forward_sites(_dynamic(shared)) == []
        assert reason in " ".join(why)
    aliased = DYNAMIC.replace("extern __shared__ int sdata[];", "extern __shared__ int sdata[];\n    "
                                                                 "extern __shared__ float other[];")
    with refusals() as why:
        assert transform.forward_sites(_dynamic("256 * 4", aliased)) == []
    assert "more than one extern __shared__ array" in " ".join(why)


MOMENTS = """__global__ void kernel(const float* x, float* out, int rows, int cols) {
    __shared__ float s_sum[128];
    __shared__ float s_sq[128];
    float a = 0.0f, b = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[blockIdx.x * cols + c];
        a += v;
        b += v * v;
    }
    s_sum[threadIdx.x] = a;
    s_sq[threadIdx.x] = b;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            s_sum[threadIdx.x] += s_sum[threadIdx.x + s];
            s_sq[threadIdx.x] += s_sq[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s_sq[0] / cols - (s_sum[0] / cols) * (s_sum[0] / cols);
}
"""


def test_a_tree_of_two_arrays_becomes_a_shuffle_reduction_of_each(transform, tmp_path):
    """A layer norm's sum and sum of squares reduced by one tree: each array gets its own shuffle reduction, one
    after the other; the backward gives a tree each, which the forward writes back to the same kernel. On whole
    numbers the variance per row is the tree's to the bit."""
    from tests.transforms import emulate

    tree = KernelState(source=MOMENTS, plan=plan_of(ROW_ARGS, grid="rows", block=128))
    (site,) = transform.forward_sites(tree)
    shuffled = transform.forward(tree, site)
    assert "2 block reduction(s)" in shuffled.note and shuffled.state.source.count("__syncthreads") == 4
    assert shuffled.state.source.index("s_sum_v = a;") < shuffled.state.source.index("s_sq_v = b;")
    (found,) = transform.find(shuffled.state)
    separate = transform.backward(shuffled.state, found).state
    assert separate.source.count("for (int s_sum_s") == 1 and separate.source.count("for (int s_sq_s") == 1
    assert transform.forward(separate, found).state.source == shuffled.state.source
    assert emulate.differences(tmp_path, tree, {"shuffled": shuffled.state}, ((3, 100), (2, 1000)), _inputs) == []


def test_a_tree_of_two_arrays_is_taken_whole_or_not_at_all(transform):
    volatile = MOMENTS.replace("__shared__ float s_sq[128];", "__shared__ volatile float s_sq[128];")
    assert "s_sq is volatile" in _refusal(transform, volatile)
    combine = "s_sq[threadIdx.x] += s_sq[threadIdx.x + s];"
    crossed = MOMENTS.replace(combine, "s_sq[threadIdx.x] += s_sum[threadIdx.x + s];")
    assert "not a sum, max or min of two slots" in _refusal(transform, crossed)
    twice = MOMENTS.replace(combine, "s_sum[threadIdx.x] += s_sum[threadIdx.x + s];")
    assert "holds no tree reduction" in _refusal(transform, twice)
    feeds = MOMENTS.replace("s_sq[threadIdx.x] = b;", "s_sq[threadIdx.x] = b + s_sum[threadIdx.x];")
    assert "starts from a value that reads s_sum, s_sq" in _refusal(transform, feeds)


def _refusal(transform, source: str, block: int = 128) -> str:
    with refusals() as why:
        assert transform.forward_sites(KernelState(source=source, plan=plan_of(ROW_ARGS, grid="rows",
                                                                                block=block))) == []
    return " ".join(why)


def _max_with(old: str, new: str) -> str:
    assert old in MAX
    return MAX.replace(old, new)


REFUSED = {
    "another slot read after the tree": (_max_with("out[blockIdx.x] = m[0];", "out[blockIdx.x] = m[0] + m[1];"),
                                         "other than by reading m[0]"),
    "a slot written after the tree": (
        _max_with("if (threadIdx.x == 0) out", "m[0] = 0.0f;\n    if (threadIdx.x == 0) out"),
        "other than by reading m[0]"),
    "a slot incremented after the tree": (
        _max_with("if (threadIdx.x == 0) out", "++m[0];\n    if (threadIdx.x == 0) out"),
        "other than by reading m[0]"),
    "a slot's address taken": (_max_with("out[blockIdx.x] = m[0];", "out[blockIdx.x] = *(&m[0] + 1);"),
                               "other than by reading m[0]"),
    "a start value that reads the array": (_max_with("m[threadIdx.x] = v;", "m[threadIdx.x] = v + m[threadIdx.x];"),
                                           "starts from a value that reads m"),
    "the array passed whole": (_max_with("out[blockIdx.x] = m[0];", "out[blockIdx.x] = *m;"),
                               "other than by reading m[0]"),
    "a macro naming the array": ("#define FIRST m[1]\n" + _max_with("= m[0];", "= FIRST;"), "a macro names m"),
    "a volatile array": (_max_with("__shared__ float m", "__shared__ volatile float m"), "m is volatile"),
    "a product": (_max_with("fmaxf(m[threadIdx.x], m[threadIdx.x + s])", "m[threadIdx.x] * m[threadIdx.x + s]"),
                  "not a sum, max or min"),
    "a difference": (_max_with("fmaxf(m[threadIdx.x], m[threadIdx.x + s])", "m[threadIdx.x + s] - m[threadIdx.x]"),
                     "not a sum, max or min"),
    "an interleaved tree that stops short of the block": (
        INTERLEAVED.replace("s < blockDim.x", "s < 64").replace("sdata[256]", "sdata[128]").replace("sdata", "m"),
        "bounded by 64, which does not span the 128-thread block"),
    "an interleaved tree whose guard skips no slot": (INTERLEAVED.replace("tid % (2 * s) == 0", "tid % s == 0"),
                                                       "holds no tree reduction"),
    "a tree from a constant that is not half the block": (_max_with("blockDim.x >> 1", "32"),
                                                          "does not span the 128-thread block"),
    "a slot by another index": (_max_with("m[threadIdx.x] = v;", "m[threadIdx.x ^ 1] = v;"),
                                "holds no tree reduction"),
    "a local index that moves": (MAX.replace("threadIdx.x", "t").replace(
        "__shared__ float m[128];", "__shared__ float m[128];\n    int t = threadIdx.x;\n    t += 0;"),
        "not the thread's index"),
    "a name the forward form declares": (_max_with("float v = -INFINITY;", "float v = -INFINITY, m_v = 0.0f;"),
                                         "already names 'm_v'"),
    "too few slots": (_max_with("m[128]", "m[16]"), "fewer than 32 values"),
    "a barrier missing between the levels": (_max_with("        __syncthreads();\n    }", "    }"),
                                             "holds no tree reduction"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_tree_it_cannot_account_for_is_no_site(transform, case):
    source, reason = REFUSED[case]
    assert reason in _refusal(transform, source)


@pytest.mark.parametrize("block, reason", [(96, "no power of two from 32 to 1024"), (16, "no multiple of 32"),
                                           (2048, "no power of two from 32 to 1024")])
def test_a_block_that_is_no_power_of_two_from_32_to_1024_is_refused(transform, block, reason):
    """The tree halves blockDim.x: with 96 threads it drops values, so the shuffle form would compute otherwise;
    with 16 a warp's shuffle would wait on lanes that do not exist."""
    assert reason in _refusal(transform, MAX, block=block)


def test_a_two_dimensional_block_is_refused(transform):
    plan = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["rows"]\n'
                                f"block = [64, 2]\nargs = [{ROW_ARGS}]\n")
    with refusals() as why:
        assert transform.forward_sites(KernelState(source=MAX, plan=plan)) == []
    assert "more than 1 dimension" in " ".join(why)


def test_backward_refuses_a_shuffle_form_that_would_not_come_back(transform):
    """An edited shuffle form (a different first-warp guard) is not the forward's own output: rewritten as a tree
    it would be another kernel, so it is no simplification."""
    before = load(CASES / "rowsum", "before", "kernel")
    edited = KernelState(source=before.source.replace("partial_v = tid < partial_n ? partial[tid] : partial_v;",
                                                      "partial_v = tid < partial_n ? partial[tid] : 0.0f;"),
                         plan=before.plan)
    assert transform.find(edited) == []
    with pytest.raises(NotApplicable, match="no block reduction through warp shuffles"):
        transform.backward(edited, transform.find(before)[0])


def test_backward_refuses_a_first_warp_pass_that_combines_otherwise(transform):
    """The first warp's pass multiplies where the warps' pass adds: it reads as the form, but as a tree (one
    operator) it would shuffle back to another kernel."""
    before = load(CASES / "rowsum", "before", "kernel")
    edited = KernelState(source=before.source.replace("partial_v = partial_v + partial_w;",
                                                      "partial_v = partial_v * partial_w;"), plan=before.plan)
    (site,) = transform.find(edited)
    with pytest.raises(NotApplicable, match="as a tree, kernel would not shuffle back to this kernel"):
        transform.backward(edited, site)


def test_wider_characters_in_comments_move_no_offset(transform):
    """tree-sitter counts bytes: a comment of two- and three-byte characters before and inside the kernel changes
    nothing in what the forward writes, and the backward reads the form back across it."""
    plain = KernelState(source=MAX, plan=plan_of(ROW_ARGS, grid="rows", block=128))
    note = "// Σ, ×, — and the row’s max\n"
    inside = MAX.replace("    __syncthreads();\n    for", "    __syncthreads();  // ×2\n    for")
    wide = KernelState(source=note + inside, plan=plain.plan)
    shuffled = transform.forward(wide, transform.forward_sites(wide)[0]).state
    assert shuffled.source == note + transform.forward(plain, transform.forward_sites(plain)[0]).state.source
    (site,) = transform.find(shuffled)
    tree = transform.backward(shuffled, site).state
    assert tree.source.startswith(note) and transform.forward(tree, site).state.source == shuffled.source


def test_the_anchor_must_name_the_kernels_trees(transform):
    after = load(CASES / "rowsum", "after", "kernel")
    from klineage.transforms.base import Anchor

    with pytest.raises(NotApplicable, match="keyed `trees`"):
        transform.forward(after, Anchor("kernel", "function", "loops*2"))
