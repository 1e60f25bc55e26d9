"""devectorize: one vector access of global memory becomes per-component scalar accesses; forward
restores it. Goldens compile with nvcc; on the corpus experts the rewritten kernels compile without
spills and their SASS loses the 128-bit global accesses step by step."""

from __future__ import annotations

import json

import pytest

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.sass import sass_features
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.transforms import Anchor, Direction, NotApplicable, get
from sampled import sampled
from tests.transforms.golden import HERE, check_golden, load

CASES = ["load", "declaration", "expression", "store", "cast_load", "template", "template_load"]


@pytest.fixture(scope="module")
def devectorize():
    return get("devectorize")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "devectorize" / case, which, "kernel")


def compiled(state: KernelState, cache):
    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    for launch in state.plan.launches:
        assert not result.resources_for(launch.entry).spills, launch.entry
    return result


def sass_count(result, name: str) -> int:
    return sass_features(result.cubin_bytes()).count(name)


def head(anchor: Anchor) -> str:
    return anchor.key.split(" ")[0]


def facts(anchor: Anchor) -> dict:
    return json.loads(anchor.key.split(" ", 1)[1])


# ------------------------------------------------------------------------------------------------
# Goldens
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("devectorize", case)


# The SASS name each golden's site carries, and what is left of it after the rewrite.
GOLDEN_SASS = {"load": "ldg_128", "declaration": "ldg_128", "expression": "ldg_64", "store": "stg_128",
               "cast_load": "ldg_128", "template": "stg_128", "template_load": "ldg_128"}


# one golden per SASS access kind by default (128- and 64-bit loads, a 128-bit store); the rest: -m slow
@pytest.mark.parametrize("case", sampled(CASES, keep=("load", "expression", "store")))
def test_golden_kernels_compile_and_lose_the_vector_access(case, cache, devectorize):
    before, after = golden(case, "before"), golden(case, "after")
    name = GOLDEN_SASS[case]
    anchor = devectorize.find(before)[0]
    rewrite = devectorize.backward(before, anchor)
    assert name in rewrite.removes
    count_before = sass_count(compiled(before, cache), name)
    count_after = sass_count(compiled(after, cache), name)
    assert count_before > 0
    assert count_after == 0, f"{case}: the compiler re-vectorized {name}"


def test_anchor_names_view_and_ordinal_and_records_the_alignment_fact(devectorize):
    anchors = devectorize.find(golden("load", "before"))
    assert [(a.function, a.kind, head(a)) for a in anchors] == [("kernel", "access", "x4#0")]
    recorded = facts(anchors[0])
    assert recorded["view"] == "* __restrict__ x4 = reinterpret_cast<const float4*>(x)"
    assert (recorded["type"], recorded["bits"], recorded["align"], recorded["dir"]) == ("float4", 128, 16, "load")
    assert recorded["from"] == " v[b] = __ldg(x4 + j);"
    assert anchors[0].snippet == "__ldg(x4 + j)"
    rewrite = devectorize.backward(golden("load", "before"), anchors[0])
    assert rewrite.carrier == {"vector_bits": 128, "lanes": 4, "vector_type": "float4"}
    assert rewrite.removes == ("ldg_128",)
    assert rewrite.anchor == anchors[0]


def test_short_key_names_a_site_too(devectorize):
    state = golden("template", "before")
    rewrite = devectorize.backward(state, Anchor("scale_row", "access", "xv#0"))
    assert "Vec xv_val;" in rewrite.state.source
    assert rewrite.state.source.count("reinterpret_cast<const float*>(xv + j) + e") == 1


def test_every_site_of_a_kernel_unwinds_and_forward_rebuilds_it(devectorize):
    state = golden("template", "before")
    steps = []
    while anchors := devectorize.find(state):
        rewrite = devectorize.backward(state, anchors[0])
        steps.append((state, rewrite))
        state = rewrite.state
    assert [head(r.anchor) for _, r in steps] == ["yv#0", "xv#0"]
    assert not cp.syntax_errors(state.source)
    for previous, rewrite in reversed(steps):
        restored = devectorize.forward(state, rewrite.anchor)
        assert restored.direction is Direction.FORWARD and restored.adds == rewrite.removes
        assert restored.state.source == previous.source
        state = restored.state


def test_removes_the_vector_type_where_it_was_the_only_use(devectorize):
    source = """
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * i + 4 <= n) {
        const float s = x[i];
        const auto v = make_float4(s, s, s, s);
        *reinterpret_cast<float4*>(y + 4 * i) = v;
    }
}
"""
    state = KernelState(source=source, plan=golden("load", "before").plan)
    rewrite = devectorize.backward(state, devectorize.find(state)[0])
    assert rewrite.removes == ("stg_128", "vector_type_float4")  # make_float4 is a call, not the type
    assert "reinterpret_cast<float*>(y + 4 * i)[3] = v.w;" in rewrite.state.source


def test_a_vector_copy_splits_one_side_at_a_time(devectorize, cache):
    """`out[i] = in[i]` is two accesses: splitting the store reads `in[i]` once as a vector; splitting
    the load keeps the vector store. Each step takes away only its own SASS instruction class."""
    source = """
__global__ void kernel(const float4* __restrict__ in, float4* __restrict__ out, int n)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}
"""
    state = plain(source)
    store, load_ = devectorize.find(state)
    assert (head(store), head(load_)) == ("out#0", "in#0")
    split_store = devectorize.backward(state, store).state
    assert "  if (i < n) {\n    const float4 out_val = in[i];\n    reinterpret_cast<float*>(out + i)[0] = out_val.x;" \
        in split_store.source  # the function's own two-space indentation
    split_load = devectorize.backward(state, load_).state
    assert "out[i] = make_float4(reinterpret_cast<const float*>(in + i)[0]," in split_load.source
    counts = {}
    for name, result in (("both", compiled(state, cache)), ("store", compiled(split_store, cache)),
                         ("load", compiled(split_load, cache))):
        features = sass_features(result.cubin_bytes())
        counts[name] = (features.count("ldg_128"), features.count("stg_128"))
    assert counts == {"both": (1, 1), "store": (1, 0), "load": (0, 1)}


# ------------------------------------------------------------------------------------------------
# Not applicable
# ------------------------------------------------------------------------------------------------

SHARED = """
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float4 s4[128];
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    s4[threadIdx.x] = x4[threadIdx.x];
    __syncthreads();
    const float4 v = s4[127 - threadIdx.x];
    y[threadIdx.x] = v.x + v.w;
}
"""

CONDITIONAL = """
template <int V> struct VecOf;
template <> struct VecOf<1> { using type = float; };
template <> struct VecOf<4> { using type = float4; };

template <int V>
__device__ float first(const float* __restrict__ x, bool use, typename VecOf<V>::type zero)
{
    using Vec = typename VecOf<V>::type;
    const Vec* xv = reinterpret_cast<const Vec*>(x);
    const Vec v = use ? __ldg(xv + threadIdx.x) : zero;
    return *reinterpret_cast<const float*>(&v);
}

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    y[threadIdx.x] = first<4>(x, threadIdx.x % 2 == 0, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
}
"""


def plain(source: str) -> KernelState:
    return KernelState(source=source, plan=golden("load", "before").plan)


def test_shared_memory_is_not_a_site(devectorize):
    state = plain(SHARED)
    anchors = devectorize.find(state)
    assert [head(a) for a in anchors] == ["x4#0"]  # the global load feeding the shared store
    with pytest.raises(NotApplicable, match="s4#0 in kernel accesses shared memory; devectorize acts on global"):
        devectorize.backward(state, Anchor("kernel", "access", "s4#0"))


def test_a_conditional_load_of_a_dependent_type_cannot_move(devectorize):
    state = plain(CONDITIONAL)
    assert devectorize.find(state) == []
    with pytest.raises(NotApplicable, match="evaluated only conditionally"):
        devectorize.backward(state, Anchor("first", "access", "xv#0"))


def test_unknown_sites_and_stale_anchors(devectorize):
    before, after = golden("load", "before"), golden("load", "after")
    with pytest.raises(NotApplicable, match="no vector access x4#3 in kernel"):
        devectorize.backward(before, Anchor("kernel", "access", "x4#3"))
    with pytest.raises(NotApplicable, match="no vector access x4#0 in kernel"):
        devectorize.backward(after, Anchor("kernel", "access", "x4#0"))
    with pytest.raises(NotApplicable, match="does not record the vector access"):
        devectorize.forward(after, Anchor("kernel", "access", "x4#0"))
    anchor = devectorize.find(before)[0]
    # Forward needs the aligned view that vouched for the alignment.
    without_view = after.source.replace(
        "    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);\n", "")
    with pytest.raises(NotApplicable, match="no longer declared in kernel: nothing vouches for 16-byte alignment"):
        devectorize.forward(plain(without_view), anchor)
    # Forward only re-vectorizes the scalar text backward wrote.
    edited = after.source.replace("v[b].w = __ldg(x + 4 * j + 3);", "v[b].w = __ldg(x + 4 * j + 3) * 1.0f;")
    with pytest.raises(NotApplicable, match="not in kernel"):
        devectorize.forward(plain(edited), anchor)


# ------------------------------------------------------------------------------------------------
# The corpus experts
# ------------------------------------------------------------------------------------------------

def unwind(devectorize, state: KernelState) -> list[tuple[KernelState, object]]:
    steps = []
    while anchors := devectorize.find(state):
        rewrite = devectorize.backward(state, anchors[0])
        assert not cp.syntax_errors(rewrite.state.source)
        steps.append((state, rewrite))
        state = rewrite.state
    return steps


def test_row_softmax_float4_path(devectorize, cache):
    expert = kernel_entry("row_softmax/warp_vec4").load()
    entry = expert.plan.launches[0].entry
    anchors = devectorize.find(expert)
    assert [(a.function, head(a), facts(a)["dir"]) for a in anchors] == [
        ("softmax_row", "xv#0", "load"), ("softmax_row", "xv#1", "load"), ("softmax_row", "yv#0", "store"),
        ("softmax_row", "yv#1", "store"), ("softmax_row", "xv#2", "load")]
    steps = unwind(devectorize, expert)
    assert len(steps) == 5
    # Every step lowers the SASS count of what it declares, at the kernel entry (helpers are inlined).
    previous = compiled(expert, cache)
    for _, rewrite in steps:
        assert rewrite.removes in (("ldg_128",), ("stg_128",))
        result = compiled(rewrite.state, cache)
        name = rewrite.removes[0]
        assert sass_features(result.cubin_bytes()).count(name, entry) < \
            sass_features(previous.cubin_bytes()).count(name, entry), rewrite.anchor
        previous = result
    final = sass_features(previous.cubin_bytes())
    assert final.count("ldg_128", entry) == 0 and final.count("stg_128", entry) == 0
    assert final.count("ldg_32", entry) > 0
    # The float4 path is scalar in global memory; the registers still hold float4 (vec_max(float4) ...).
    last = steps[-1][1].state.source
    assert "sizeof(Vec) / sizeof(float)" in last and "__ldg(xv + j)" not in last and "yv[j] =" not in last
    state = steps[-1][1].state
    for before, rewrite in reversed(steps):
        state = devectorize.forward(state, rewrite.anchor).state
        assert state.source == before.source


def test_top_k_row_load(devectorize, cache):
    expert = kernel_entry("topk/radix_select").load()
    entry = expert.plan.launches[0].entry
    anchors = devectorize.find(expert)
    # The uint4 accesses of the keys live in shared memory: only the float4 row load is a site.
    assert [(a.function, head(a)) for a in anchors] == [("load_row_keys", "xv#0")]
    rewrite = devectorize.backward(expert, anchors[0])
    assert "v[b].w = __ldg(xr + 4 * j + 3);" in rewrite.state.source
    assert rewrite.removes == ("ldg_128",) and rewrite.carrier["vector_type"] == "float4"
    assert devectorize.find(rewrite.state) == []
    before = sass_features(compiled(expert, cache).cubin_bytes())
    after = sass_features(compiled(rewrite.state, cache).cubin_bytes())
    assert before.count("ldg_128", entry) > 0
    assert after.count("ldg_128", entry) == 0  # nvcc does not merge the four scalar loads again
    assert devectorize.forward(rewrite.state, rewrite.anchor).state.source == expert.source


@pytest.mark.parametrize("name, function, view", [("gemm/mma_sync", "store_tile_vectorized", "y#0"),
                                                  ("conv2d/implicit_gemm", "store_tile", "dst#0")])
def test_tensor_core_epilogue_stores(devectorize, cache, name, function, view):
    expert = kernel_entry(name).load()
    entry = expert.plan.launches[0].entry
    anchors = devectorize.find(expert)
    assert [(a.function, head(a)) for a in anchors] == [(function, view)]  # the staging reads are shared
    rewrite = devectorize.backward(expert, anchors[0])
    assert rewrite.removes == ("stg_128",) and rewrite.carrier["vector_type"] == "uint4"
    before = sass_features(compiled(expert, cache).cubin_bytes())
    after = sass_features(compiled(rewrite.state, cache).cubin_bytes())
    assert before.count("stg_128", entry) > 0 and after.count("stg_128", entry) == 0
    assert after.count("ldsm", entry) == before.count("ldsm", entry)  # nothing else moved
    assert devectorize.forward(rewrite.state, rewrite.anchor).state.source == expert.source
