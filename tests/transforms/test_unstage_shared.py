"""unstage_shared: a shared tile staged from global memory by one plain store becomes direct global
reads at every read (the guard and its zero kept), and the store, the array and, with the function's
last shared memory, the barriers go; forward restages. Goldens: a 2-D tiled GEMM (one tile, then the
last), a 1-D stencil staged by a thread-strided loop with a guarded halo, ragged-edge tiles staged by
loops over r and c, and a dynamic shared row. Each before/after compiles with nvcc through the gate's
compile stage and loses shared stores and loads in SASS. Refused: a tile written twice, a source the
kernel writes, an index map that cannot be inverted, and the other shapes staging must not have. Pointer
views of a shared byte (or float) array at constant offsets are sites of their own: a staged view of a
GEMV's dynamic bytes, a halo row carved from another view, and a view that was the array's only one (the
array and its barrier go too). Refused there: views that could alias (the same start, a run-time offset,
another use of the array, a raw shared address), a view handed to a function. The last states of the
corpus walks hold no site, each shared buffer and view refused with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.documents import document_files, read_document_text
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, Direction, NotApplicable, get
from sampled import sampled
from shared_cache import share
from tests.transforms.golden import DEFAULT_PLAN, HERE, check_golden, load

CASES = ["gemm", "gemm_last", "stencil", "ragged", "dynamic", "views", "view_chain", "view_last"]
PLAN = LaunchPlan.from_toml(DEFAULT_PLAN.format(entry="kernel"))
LINEAGES = Path(__file__).resolve().parents[2] / "corpus" / "lineages"


@pytest.fixture(scope="module")
def unstage():
    return get("unstage_shared")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "unstage_shared" / case, which, "kernel")


def plain(source: str) -> KernelState:
    return KernelState(source=source, plan=PLAN)


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("unstage_shared", case)


# a plain tile and a view of one by default; the other goldens: -m slow
@pytest.mark.parametrize("case", sampled(CASES, keep=("gemm", "views")))
def test_golden_kernels_compile_and_lose_shared_traffic(case, cache, unstage):
    counts = {}
    for which in ("before", "after"):
        state = golden(case, which)
        result = compile_kernel(state, cache)
        assert result.ok, result.log[-3000:]
        assert not result.resources_for("kernel").spills
        sass = sass_features(result.cubin_bytes())
        counts[which] = (sass.count("lds"), sass.count("sts"))
    assert counts["after"][0] < counts["before"][0] and counts["after"][1] < counts["before"][1], counts
    declared = unstage.backward(golden(case, "before"), unstage.find(golden(case, "before"))[0]).removes
    assert {"lds", "sts"} <= set(declared)


def test_declared_features_follow_the_last_array(unstage):
    first = unstage.backward(golden("gemm", "before"), Anchor("kernel", "declaration", "As"))
    assert first.removes == ("lds", "sts")  # Bs is still a shared array of the kernel
    assert "__syncthreads();" in first.state.source  # and still needs its barriers
    last = unstage.backward(golden("gemm_last", "before"), Anchor("kernel", "declaration", "Bs"))
    assert last.removes == ("shared_array", "lds", "sts")
    assert "__syncthreads" not in last.state.source
    assert "shared_array" not in {f.name for f in source_features(last.state.source)}
    dynamic = unstage.backward(golden("dynamic", "before"), Anchor("kernel", "declaration", "row"))
    assert dynamic.removes == ("dynamic_shared", "lds", "sts")
    assert dynamic.state.plan == golden("dynamic", "before").plan


def test_reads_become_the_global_reads_they_stand_for(unstage):
    gemm = golden("gemm_last", "after").source
    assert "acc += A[row * K + t + k] * B[(t + k) * N + col];" in gemm
    ragged = golden("ragged", "after").source
    assert "((r0 + threadIdx.x < M && c0 + c < N) ? A[(r0 + threadIdx.x) * N + c0 + c] : 0.0f) * x[c0 + c]" in ragged
    stencil = golden("stencil", "after").source
    assert "? x[base + (threadIdx.x + d)] : 0.0f)" in stencil
    assert "(base + (threadIdx.x + d)) >= 0 && (base + (threadIdx.x + d)) < n" in stencil


def test_views_unstage_on_their_own(unstage):
    views = unstage.backward(golden("views", "before"), Anchor("kernel", "declaration", "x_s"))
    assert views.removes == ("lds", "sts")  # sum_s still views smem, and needs the barriers
    assert "unsigned char smem[]" in views.state.source and "__syncthreads();" in views.state.source
    assert "acc += a[static_cast<long long>(row) * n + k0 + i] * (k0 + i < n ? x[k0 + i] : 0.0f);" in \
        views.state.source
    chain = unstage.backward(golden("view_chain", "before"), Anchor("kernel", "declaration", "row_s"))
    assert "float* max_s = smem;" in chain.state.source and "row_s" not in chain.state.source
    last = unstage.backward(golden("view_last", "before"), Anchor("kernel", "declaration", "row"))
    assert last.removes == ("dynamic_shared", "lds", "sts")
    assert "smem" not in last.state.source and "__syncthreads" not in last.state.source
    assert "the view and the array smem it carved and 1 barrier(s) went" in last.note
    assert last.state.plan == golden("view_last", "before").plan
    restored = unstage.forward(last.state, last.anchor)
    assert restored.state.source == golden("view_last", "before").source


CARVED = """
constexpr int TILE = 128;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    extern __shared__ float smem[];
    float* x_s = smem;
    float* part_s = x_s + TILE;
    x_s[threadIdx.x] = x[blockIdx.x * TILE + threadIdx.x];
    __syncthreads();
    part_s[threadIdx.x] = 2.0f * x_s[TILE - 1 - threadIdx.x];
    __syncthreads();
    y[blockIdx.x * TILE + threadIdx.x] = part_s[(threadIdx.x + 1) % TILE];
}
"""


def test_a_view_other_views_are_offset_from_keeps_its_declaration(unstage):
    rewrite = unstage.backward(plain(CARVED), Anchor("kernel", "declaration", "x_s"))
    assert "float* x_s = smem;" in rewrite.state.source and "x_s[" not in rewrite.state.source
    assert "part_s[threadIdx.x] = 2.0f * x[blockIdx.x * TILE + (TILE - 1 - threadIdx.x)];" in rewrite.state.source
    assert "its declaration stays: other views are offset from it" in rewrite.note


def test_forward_restages_only_its_own_staging(unstage):
    before, after = golden("stencil", "before"), golden("stencil", "after")
    rewrite = unstage.backward(before, unstage.find(before)[0])
    restored = unstage.forward(after, rewrite.anchor)
    assert restored.direction is Direction.FORWARD and restored.state.source == before.source
    assert restored.adds == ("shared_array", "lds", "sts")
    with pytest.raises(NotApplicable, match="needs the definition of kernel"):
        unstage.forward(after, Anchor("kernel", "declaration", "window"))
    edited = plain(after.source.replace("acc += w[d]", "acc -= w[d]"))
    with pytest.raises(NotApplicable, match="is not the unstaged form of the recorded staging of window"):
        unstage.forward(edited, rewrite.anchor)


TWICE = """
constexpr int BLOCK = 128;
constexpr int R = 2;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    __shared__ float s[BLOCK + 2 * R];
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x + R] = x[i];
    if (threadIdx.x < R) s[threadIdx.x] = x[i - R];
    __syncthreads();
    y[i] = s[threadIdx.x] + s[threadIdx.x + R] + s[threadIdx.x + 2 * R];
}
"""

IN_PLACE = """
constexpr int BLOCK = 128;
__global__ void kernel(float* x, int n)
{
    __shared__ float s[BLOCK];
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x] = x[i];
    __syncthreads();
    x[i] = s[BLOCK - 1 - threadIdx.x];
}
"""

HALVED = """
constexpr int BLOCK = 128;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float s[BLOCK / 2];
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x / 2] = x[i];
    __syncthreads();
    y[i] = s[threadIdx.x / 2];
}
"""

HIDDEN_THREAD = """
constexpr int BLOCK = 32;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float s[BLOCK];
    s[threadIdx.x] = x[threadIdx.y * BLOCK + threadIdx.x];
    __syncthreads();
    y[threadIdx.y * BLOCK + threadIdx.x] = s[BLOCK - 1 - threadIdx.x];
}
"""

FLAT_INDEX = """
constexpr int ROWS = 8, COLS = 32;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int ld)
{
    __shared__ float tile[ROWS][COLS];
    for (int i = threadIdx.x; i < ROWS * COLS; i += blockDim.x) {
        const int r = i / COLS, c = i % COLS;
        tile[r][c] = x[blockIdx.x * ROWS * ld + i];
    }
    __syncthreads();
    y[blockIdx.x * COLS + threadIdx.x] = tile[threadIdx.x % ROWS][threadIdx.x % COLS];
}
"""

CONDITIONAL = """
constexpr int BLOCK = 128;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    __shared__ float s[BLOCK];
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) s[threadIdx.x] = x[i];
    __syncthreads();
    if (i < n) y[i] = s[threadIdx.x];
}
"""

NO_BARRIER = """
constexpr int BLOCK = 128;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float s[BLOCK];
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x] = x[i];
    y[i] = s[threadIdx.x ^ 1];
}
"""

COMPUTED = """
constexpr int BLOCK = 128;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float s[BLOCK];
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x] = 2.0f * x[i];
    __syncthreads();
    y[i] = s[BLOCK - 1 - threadIdx.x];
}
"""

PREVIOUS_PASS = """
constexpr int BLOCK = 128;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int passes)
{
    __shared__ float s[BLOCK];
    float carry = 0.0f;
    for (int p = 0; p < passes; ++p) {
        carry += s[BLOCK - 1 - threadIdx.x];
        __syncthreads();
        s[threadIdx.x] = x[p * BLOCK + threadIdx.x];
        __syncthreads();
        y[p * BLOCK + threadIdx.x] = s[threadIdx.x] + carry;
    }
}
"""

UNROLLED = """
constexpr int ROWS = 4, COLS = 32;
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int ld)
{
    __shared__ float tile[ROWS][COLS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
        tile[r][threadIdx.x] = x[(blockIdx.x * ROWS + r) * ld + threadIdx.x];
    __syncthreads();
    float acc = 0.0f;
    for (int r = 0; r < ROWS; ++r) acc += tile[r][COLS - 1 - threadIdx.x];
    y[blockIdx.x * COLS + threadIdx.x] = acc;
}
"""

ATOMIC = """
constexpr int BLOCK = 128;
__global__ void kernel(float* x, float* y)
{
    __shared__ float s[BLOCK];
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x] = x[i];
    __syncthreads();
    y[i] = s[BLOCK - 1 - threadIdx.x];
    atomicAdd(&x[i], 1.0f);
}
"""

ALIASED = """
constexpr int BLOCK = 128;
__global__ void kernel(const float* x, float* y)
{
    __shared__ float s[BLOCK];
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x] = x[i];
    __syncthreads();
    y[i] = s[BLOCK - 1 - threadIdx.x];
}
"""
ALIASED_PLAN = """
name = "aliased"
problem = "golden"
[[launch]]
entry = "kernel"
grid = [1]
block = [128]
args = [{ buffer = "data" }, { buffer = "data" }]
"""


@pytest.mark.parametrize("source, reason", [
    (TWICE, r"s in kernel: written 2 times \(lines 8, 9\)"),
    (IN_PLACE, r"the source x is written in the kernel \(line 9\)"),
    (HALVED, r"the tile index `threadIdx.x / 2` is not a variable \(plus an offset\): the index map cannot be "
             r"inverted syntactically"),
    (HIDDEN_THREAD, r"depends on threadIdx.y, which no tile index names: the index map is not invertible"),
    (FLAT_INDEX, r"i depends on threadIdx.x, which no tile index names: the index map is not invertible"),
    (CONDITIONAL, r"the store at line 7 is conditional \(inside `if`\)"),
    (NO_BARRIER, r"the tile is used at line 8 before a __syncthreads\(\) follows its store"),
    (COMPUTED, r"the staged value `2.0f \* x\[i\]` is not a plain global read"),
    (PREVIOUS_PASS, r"the read at line 8 is not after the barrier that follows the store in the same block"),
    (UNROLLED, r"unstaging would also remove unroll_pragma from kernel; remove it first"),
    (ATOMIC, r"the source x is passed to atomicAdd\(\) at line 10, which could write it"),
])
def test_not_applicable(unstage, source, reason):
    state = plain(source)
    assert unstage.find(state) == []
    assert [r[:2] for r in unstage.refusals(state)] == [("kernel", "tile" if "tile[" in source else "s")]
    with pytest.raises(NotApplicable, match=reason):
        unstage.backward(state, Anchor("kernel", "declaration", "tile" if "tile[" in source else "s"))


VIEW = """
constexpr int TILE = 128;
constexpr int OFF_A = 0;
constexpr int OFF_B = TILE * 4;
__global__ void helper(float* p) {{ p[threadIdx.x] = 0.0f; }}
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{{
    extern __shared__ __align__(16) unsigned char smem[];
    float* tile = reinterpret_cast<float*>(smem + {offset});
    float* other = reinterpret_cast<float*>(smem + OFF_B);
{extra}    tile[threadIdx.x] = x[blockIdx.x * TILE + threadIdx.x];
    __syncthreads();
    other[threadIdx.x] = 1.0f;
    y[blockIdx.x * TILE + threadIdx.x] = tile[TILE - 1 - threadIdx.x] + other[threadIdx.x];
}}
"""


def view(offset: str = "OFF_A", extra: str = "") -> str:
    return VIEW.format(offset=offset, extra=extra)


@pytest.mark.parametrize("source, reason", [
    (view("OFF_B"), r"tile in kernel: tile and other both start at byte 512 of smem: they alias"),
    (view("OFF_A + 64 * 2"), None),  # a site: its bytes end where `other` starts
    (view("n"), r"tile in kernel: its offset `n` into smem is not a compile-time constant"),
    (view(extra="    smem[0] = 1;\n"), r"tile in kernel: smem is also used at line 11 \(`smem\[0\] = 1;`\), not as a "
                                       r"view at a constant offset"),
    (view(extra="    helper(tile);\n"), r"tile in kernel: passed to helper\(\) at line 11, which is not followed"),
    (view(extra="    tile += 4;\n"), r"tile in kernel: used as a pointer or a row at line 11"),
    (view(extra="    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));\n"),
     r"tile in kernel: smem is also used at line 11"),
    (view().replace("unsigned char smem[];", "unsigned char smem[];\n    extern __shared__ float spare[];"),
     r"tile in kernel: dynamic shared memory is also declared as spare \(line 9\): it aliases smem"),
])
def test_views_that_could_alias_are_refused(unstage, source, reason):
    state = plain(source)
    if reason is None:
        assert Anchor("kernel", "declaration", "tile") in unstage.find(state)
        return
    assert Anchor("kernel", "declaration", "tile") not in unstage.find(state)
    with pytest.raises(NotApplicable, match=reason):
        unstage.backward(state, Anchor("kernel", "declaration", "tile"))


def test_a_raw_shared_address_names_what_blocks_it(unstage):
    state = plain(view(extra="    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));\n"))
    refused = {array: reason for _, array, reason in unstage.refusals(state)}
    assert "its raw shared address is taken at line 11" in refused["smem"]
    assert "inline asm, address arithmetic" in refused["smem"]


def test_a_buffer_passed_twice_is_refused(unstage):
    state = KernelState(source=ALIASED, plan=LaunchPlan.from_toml(ALIASED_PLAN))
    with pytest.raises(NotApplicable, match="the launch passes buffer data to x and to another parameter"):
        unstage.backward(state, Anchor("kernel", "declaration", "s"))
    assert unstage.find(plain(ALIASED))  # with two buffers it is a site
    with pytest.raises(NotApplicable, match="no shared array t in kernel"):
        unstage.backward(plain(ALIASED), Anchor("kernel", "declaration", "t"))


# The last states of the corpus's dry walks, after ldmatrix, MMA, pipelining and async copies are gone:
# every shared buffer there is a byte array carved by offsets (or its pointer views), reached through
# inline st.shared, helper pointers and shuffled addresses: none is a tile of element stores. Each array
# and view is refused with what blocks it.
RAW = "its raw shared address is taken at line"
ALSO = "smem is also used at line"
HELPER = "which is not followed: stores and reads in another function cannot be substituted here"
LAST_STATES = {
    "gemm_mma_sync": {("gemm_bf16_mma_sync", "smem"): RAW, ("gemm_bf16_mma_sync", "staged"): ALSO},
    "conv2d_implicit_gemm": {("conv2d_implicit_gemm", "smem"): RAW, ("conv2d_implicit_gemm", "out_s"): ALSO,
                             ("store_tile", "src"): "is not a shared array or view plus an offset"},
    # gdn_chunked: the marker of its scalarized mma_tile records the expert's asm verbatim (5 lines),
    # so the kernel's lines sit 5 below the expert's.
    "gdn_chunked": {
        ("gdn_chunked", "smem"): "it is carved into the pointer view(s) beta_s, g_s, k_s, kb_s, l_s, p_s, q_s, s_s, "
                                 "u_s, v_s, vn_s, w_s, x_s, each of which is a site of its own",
        **{("gdn_chunked", v): f"passed to stage_chunk() at line 194, {HELPER}"
           for v in ("k_s", "q_s", "v_s", "g_s", "beta_s")},
        **{("gdn_chunked", v): f"passed to mma_tile() at line {line}, {HELPER}"
           for v, line in (("vn_s", 278), ("s_s", 256), ("x_s", 246), ("p_s", 278))},
        ("gdn_chunked", "kb_s"): f"passed to mma_tile() at line 297, {HELPER}",
        ("gdn_chunked", "w_s"): f"passed to mma_tile() at line 256, {HELPER}",
        ("gdn_chunked", "u_s"): "copied into the pointer dst at line 247",
        ("gdn_chunked", "l_s"): "written 2 times (lines 211, 231)",
        ("gdn_chunked", "dst"): "its initializer `which == 0 ? w_s : u_s` is not a shared array or view",
    },
    "topk_radix_select": {
        ("topk_radix_select", "keys"): "smem is also used at line 386",
        ("topk_radix_select", "sel"): "its offset `static_cast<size_t>((S + 3) & ~3) * 4` into smem is not a "
                                      "compile-time constant",
        ("topk_radix_select", "smem"): "copied into the pointer sel at line 386",
        ("topk_radix_select", "hist"): f"passed to radix_select() at line 401, {HELPER}",
        ("topk_radix_select", "warp_sums"): f"passed to gather_selected() at line 404, {HELPER}",
        ("load_row_keys", "kv"): "its initializer `reinterpret_cast<uint4*>(keys)` is not a shared array or view",
        ("for_each_key", "kv"): "its initializer `reinterpret_cast<const uint4*>(keys)` is not a shared array",
        ("select_bucket", "shfl_scratch0"): "used as a pointer or a row at line 198",
        ("select_bucket", "shfl_row0"): "its initializer `shfl_scratch0[threadIdx.x >> 5]` is not",
        ("block_exclusive_scan", "shfl_scratch0"): "used as a pointer or a row at line 251",
        ("block_exclusive_scan", "shfl_row0"): "its initializer `shfl_scratch0[threadIdx.x >> 5]` is not",
        ("block_exclusive_scan", "shfl_scratch1"): "used as a pointer or a row at line 266",
        ("block_exclusive_scan", "shfl_row1"): "its initializer `shfl_scratch1[threadIdx.x >> 5]` is not",
    },
}


@pytest.mark.parametrize("name", sorted(LAST_STATES))
def test_corpus_last_states_hold_no_site(unstage, name):
    [path] = document_files(LINEAGES, f"{name}.dry.json")  # stored plain or gzip-compressed
    lineage = json.loads(read_document_text(path, "lineage"))
    last = lineage["states"][-1]
    state = KernelState(source=last["source"], plan=LaunchPlan.from_dict(last["plan"]))
    assert unstage.find(state) == []
    refused = {(function, array): reason for function, array, reason in unstage.refusals(state)}
    assert set(refused) == set(LAST_STATES[name])
    for key, reason in LAST_STATES[name].items():
        assert reason in refused[key], refused[key]


# A bf16 GEMM of the corpus's gemm problem (y = x W^T) with both operand tiles staged as fp32 and guarded
# at the ragged edges: the real walk (compile-only gate, step audit, forward check) takes it apart.
TILED_GEMM = """
#include <cuda_bf16.h>

constexpr int TILE = 16;

extern "C" __global__ void gemm_bf16_tiled(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                                           int M, int N, int K)
{
    __shared__ float xs[TILE][TILE];
    __shared__ float ws[TILE][TILE];
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    const int wrow = blockIdx.x * TILE + ty;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        xs[ty][tx] = (row < M && k0 + tx < K) ? x[row * K + k0 + tx] : __float2bfloat16(0.0f);
        ws[ty][tx] = (wrow < N && k0 + tx < K) ? w[wrow * K + k0 + tx] : __float2bfloat16(0.0f);
        __syncthreads();
        for (int k = 0; k < TILE; ++k)
            acc += xs[ty][k] * ws[tx][k];
        __syncthreads();
    }
    if (row < M && col < N)
        y[row * N + col] = __float2bfloat16(acc);
}
"""
TILED_PLAN = """
name = "gemm_tiled"
problem = "gemm"
[[launch]]
entry = "gemm_bf16_tiled"
grid = ["cdiv(N, 16)", "cdiv(M, 16)", 1]
block = [16, 16, 1]
args = ["x", "W", "y", { scalar = "M", type = "i32" }, { scalar = "N", type = "i32" }, { scalar = "K", type = "i32" }]
"""


def test_compile_only_walk_accepts_every_step(tmp_path, monkeypatch, unstage, shared_cache):
    from klineage import corpus
    from klineage.config import GateMode
    from klineage.gate.cache import GateCache
    from klineage.lineage import ForwardStatus, Termination
    from klineage.walk.walker import walk

    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache)))  # compiles: the run's
    expert = KernelState(source=TILED_GEMM, plan=LaunchPlan.from_toml(TILED_PLAN))
    lineage = walk(corpus.problem_path("gemm"), expert, gate_mode=GateMode.COMPILE_ONLY,
                   cache=GateCache(tmp_path / "cache", tmp_path / "recorded"), transforms=[unstage])
    assert lineage.termination.kind is Termination.COMPLETE, lineage.termination
    assert not lineage.rejections, [r.evidence.message for r in lineage.rejections]
    assert [t.transform for t in lineage.transitions] == ["unstage_shared"] * 2
    assert [t.forward.status for t in lineage.transitions] == [ForwardStatus.UNTIMED] * 2
    removed = [sorted(str(c) for c in t.features_removed if c.level.value == "source") for t in lineage.transitions]
    assert removed == [[], ["source gemm_bf16_tiled:shared_array", "source gemm_bf16_tiled:syncthreads"]]
    final = lineage.states[-1].kernel.source
    assert "__shared__" not in final and "__syncthreads" not in final
    assert ("acc += static_cast<float>((row < M && k0 + k < K) ? x[row * K + k0 + k] : __float2bfloat16(0.0f)) * "
            "static_cast<float>(((blockIdx.x * TILE + tx) < N && k0 + k < K) ? "
            "w[(blockIdx.x * TILE + tx) * K + k0 + k] : __float2bfloat16(0.0f));") in final


# A row softmax of the corpus's problem whose dynamic shared bytes hold the block's reduction slots and,
# after them, the staged row: the view of the row unstages under the real walk (compile-only gate, step
# audit, forward check); the reduction view, written again and again, stays.
VIEW_SOFTMAX = """
constexpr int THREADS = 256;
constexpr int OFF_RED = 0;              // [THREADS] float: the reductions
constexpr int OFF_ROW = THREADS * 4;    // [cols] float: the staged row

__device__ float block_reduce(float* red, float v, bool is_max)
{
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], red[threadIdx.x + s]) : red[threadIdx.x] + red[threadIdx.x + s];
        __syncthreads();
    }
    const float total = red[0];
    __syncthreads();
    return total;
}

extern "C" __global__ void row_softmax_views(const float* x, float* y, int rows, int cols)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float* red = reinterpret_cast<float*>(smem + OFF_RED);
    float* row_s = reinterpret_cast<float*>(smem + OFF_ROW);
    const float* xr = x + static_cast<long long>(blockIdx.x) * cols;
    float* yr = y + static_cast<long long>(blockIdx.x) * cols;
    for (int c = threadIdx.x; c < cols; c += THREADS) row_s[c] = xr[c];
    __syncthreads();
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, row_s[c]);
    m = block_reduce(red, m, true);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) s += expf(row_s[c] - m);
    s = block_reduce(red, s, false);
    for (int c = threadIdx.x; c < cols; c += THREADS) yr[c] = expf(row_s[c] - m) / s;
}
"""  # noqa: E501  (kernel source whose line numbers the tests name)
VIEW_SOFTMAX_PLAN = """
name = "row_softmax_views"
problem = "row_softmax"
[[launch]]
entry = "row_softmax_views"
grid = ["rows"]
block = ["THREADS"]
shared = "OFF_ROW + cols * 4"
args = ["x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }]
"""


def test_compile_only_walk_unstages_a_view(tmp_path, monkeypatch, unstage, shared_cache):
    from klineage import corpus
    from klineage.config import GateMode
    from klineage.gate.cache import GateCache
    from klineage.lineage import ForwardStatus, Termination
    from klineage.walk.walker import walk

    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache)))  # compiles: the run's
    expert = KernelState(source=VIEW_SOFTMAX, plan=LaunchPlan.from_toml(VIEW_SOFTMAX_PLAN))
    lineage = walk(corpus.problem_path("row_softmax"), expert, gate_mode=GateMode.COMPILE_ONLY,
                   cache=GateCache(tmp_path / "cache", tmp_path / "recorded"), transforms=[unstage])
    assert lineage.termination.kind is Termination.COMPLETE, lineage.termination
    assert [t.transform for t in lineage.transitions] == ["unstage_shared"]
    assert [t.anchor.key for t in lineage.transitions] == ["row_s"]
    assert [t.forward.status for t in lineage.transitions] == [ForwardStatus.UNTIMED]
    final = lineage.states[-1].kernel.source
    assert (
        "row_s[" not in final
        and "float* row_s" not in final
        and "float* red = reinterpret_cast<float*>(smem + OFF_RED);" in final
    )
    assert "for (int c = threadIdx.x; c < cols; c += THREADS) yr[c] = expf(xr[c] - m) / s;" in final
    assert not lineage.rejections  # `red`, written again and again, is no site: never proposed
