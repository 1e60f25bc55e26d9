"""sync_copies: cp.async global->shared copies become a register load and a shared store (the
zero-fill kept), one site per step; once no asynchronous copy is left, the commit/wait helpers and
statements go, one per step; forward restores each. Goldens (a helper-based 2-stage ring, an inline
4-byte cp.async.ca, __pipeline_memcpy_async, and the commit step of the ring) compile with nvcc and
lose LDGSTS. On the corpus experts, after unpipeline, the rewritten kernels compile without spills,
their SASS has no LDGSTS, the copy schedule still reads every tile only after the barrier that
follows its stores, and a compile-only walk accepts every step through the real step audit."""

from __future__ import annotations

import re

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.gate.cache import GateCache
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.lineage import ForwardStatus, Termination
from klineage.transforms import Anchor, Direction, NotApplicable, get
from klineage.walk.walker import walk
from sampled import sampled
from shared_cache import share
from tests.transforms.golden import DEFAULT_PLAN, HERE, check_golden, load
from tests.transforms.test_unpipeline import EXPERTS, expert, family, run_schedule, unpipelined

CASES = ["helper", "inline", "pipeline", "groups"]
COPY_CASES = ["helper", "inline", "pipeline"]
ASYNC = {"cp_async", "cp_async_wait", "multistage_pipeline"}
PLAN = LaunchPlan.from_toml(DEFAULT_PLAN.format(entry="kernel"))


@pytest.fixture(scope="module")
def sync_copies():
    return get("sync_copies")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "sync_copies" / case, which, "kernel")


def compiled(state: KernelState, cache):
    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    for launch in state.plan.launches:
        for arch in result.targets:
            resources = result.resources_for(launch.entry, arch)
            assert not resources.spills and resources.stack_bytes == 0, (launch.entry, arch, resources)
    return result


def async_features(state: KernelState) -> set[str]:
    return {f.name for f in source_features(state.source)} & ASYNC


def synchronous(state: KernelState) -> KernelState:
    transform = get("sync_copies")
    while anchors := transform.find(state):
        state = transform.backward(state, anchors[0]).state
    return state


# ------------------------------------------------------------------------------------------------
# Goldens
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("sync_copies", case)


@pytest.mark.parametrize("case", COPY_CASES)
def test_golden_kernels_compile_and_lose_ldgsts(case, cache):
    before, after = golden(case, "before"), golden(case, "after")
    sass_before = sass_features(compiled(before, cache).cubin_bytes())
    sass_after = sass_features(compiled(after, cache).cubin_bytes())
    assert sass_before.count("ldgsts", "kernel") > 0
    assert sass_after.count("ldgsts", "kernel") == 0
    assert sass_after.count("sts", "kernel") > 0 and sass_after.count("bar_sync", "kernel") > 0
    assert async_features(before) == {"cp_async", "cp_async_wait"} | (
        {"multistage_pipeline"} if case == "helper" else set())  # two stages, one in flight
    assert "cp_async" not in async_features(after)
    assert "cp_async_wait" in async_features(after)  # the commits and waits are later steps
    last = synchronous(before)
    assert not async_features(last) and not get("sync_copies").find(last)
    compiled(last, cache)


def test_golden_commit_step(cache):
    before, after = golden("groups", "before"), golden("groups", "after")
    # The ring's copy step done (only the header comment differs from helper/after.cu).
    assert before.source.split("#include", 1)[1] == golden("helper", "after").source.split("#include", 1)[1]
    assert {f.locus for f in source_features(before.source) if f.name == "cp_async_wait"} == {
        "cp_async_commit", "cp_async_wait"}
    assert {f.locus for f in source_features(after.source) if f.name == "cp_async_wait"} == {"cp_async_wait"}
    assert re.search(r"void cp_async_commit\(\)\n\{\n\}", after.source)
    compiled(after, cache)


def test_anchors_and_snippets(sync_copies):
    helper = sync_copies.find(golden("helper", "before"))
    assert helper == [Anchor("cp_async_16", "function", "cp_async_16"),
                      Anchor("cp_async_commit", "function", "cp_async_commit"),
                      Anchor("cp_async_wait", "function", "cp_async_wait")]
    # The snippet keeps the original definition the step changes.
    assert [f.name for f in cp.functions(helper[0].snippet)] == ["cp_async_16"]
    assert helper[2].snippet.startswith("template <int PENDING>\n__device__")
    assert sync_copies.find(golden("inline", "before")) == [
        Anchor("kernel", "asm", "cp.async#0"), Anchor("kernel", "asm", "group#0"), Anchor("kernel", "asm", "group#1")]
    assert sync_copies.find(golden("pipeline", "before")) == [
        Anchor("kernel", "call", "cp.async#0"), Anchor("kernel", "call", "group#0"),
        Anchor("kernel", "call", "group#1")]
    assert [a.key for a in sync_copies.find(golden("helper", "after"))] == ["cp_async_commit", "cp_async_wait"]
    rewrite = sync_copies.backward(golden("helper", "before"), helper[0])
    assert rewrite.carrier == {"copy_bytes": 16, "cache": "cg"}
    assert rewrite.removes == ("cp_async", "ldgsts") and rewrite.adds == ("sts",)
    assert "zero-fill kept" in rewrite.note
    commit = sync_copies.backward(golden("groups", "before"), Anchor("cp_async_commit", "function", "cp_async_commit"))
    assert commit.removes == ("cp_async_wait",) and commit.adds == ()
    assert sync_copies.forward(commit.state, commit.anchor).adds == ("cp_async_wait",)
    assert set(sync_copies.removes) == set(rewrite.removes) | set(commit.removes)


def test_zero_fill_is_kept_as_a_predicate(sync_copies):
    after = golden("helper", "after").source
    assert "if (src_bytes != 0) copied = __ldcg(reinterpret_cast<const uint4*>(gmem));" in after
    assert "uint4 copied = make_uint4(0u, 0u, 0u, 0u);" in after
    assert 'st.shared.v4.u32 [%0], {%1, %2, %3, %4};' in after
    last = synchronous(golden("helper", "before")).source
    # The commit and wait helpers stay (their calls are no-ops now), with empty bodies.
    assert re.search(r"void cp_async_commit\(\)\n\{\n\}", last)
    assert re.search(r"void cp_async_wait\(\)\n\{\n\}", last)
    assert last.count("__syncthreads();") == golden("helper", "before").source.count("__syncthreads();")


def test_commits_and_waits_wait_for_the_last_copy(sync_copies):
    state = golden("helper", "before")
    with pytest.raises(NotApplicable, match="1 cp.async copy still commit and wait through cp_async_commit"):
        sync_copies.backward(state, Anchor("cp_async_commit", "function", "cp_async_commit"))
    # Forward of a copy whose waits are gone would leave it unwaited: the steps go back in order.
    steps = []
    while anchors := sync_copies.find(state):
        rewrite = sync_copies.backward(state, anchors[0])
        steps.append(rewrite)
        state = rewrite.state
    with pytest.raises(NotApplicable, match="nothing waiting for it"):
        sync_copies.forward(state, steps[0].anchor)
    with pytest.raises(NotApplicable, match="needs the definition backward recorded"):
        sync_copies.forward(state, Anchor("kernel", "asm", "group#0"))


def test_an_unprovable_src_size_gets_the_general_copy(sync_copies, cache):
    state = golden("helper", "before")
    state = state.with_source(state.source.replace("i < n ? 16 : 0", "min(max(4 * (n - i), 0), 16)"))
    rewrite = sync_copies.backward(state, sync_copies.find(state)[0])
    source = rewrite.state.source
    assert "if (src_bytes >= 16) {" in source and "// a partial copy" in source
    assert "if (i < src_bytes) words[i / 4] |=" in source
    sass = sass_features(compiled(rewrite.state, cache).cubin_bytes())
    assert sass.count("ldgsts") == 0 and sass.count("ldl") == sass.count("stl") == 0
    assert sync_copies.forward(rewrite.state, rewrite.anchor).state.source == state.source


def test_copies_go_one_at_a_time_then_the_groups(sync_copies, cache):
    state = golden("helper", "before")
    source = state.source.replace(
        "// Thread t copies", "__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void* gmem)\n{\n"
        '    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\\n" :: "r"(smem_addr), "l"(gmem) : "memory");\n'
        "}\n\n// Thread t copies")
    source = source.replace("    cp_async_16(stage + 16 * threadIdx.x, i < n ? x + i : x, i < n ? 16 : 0);\n",
                            "    if (threadIdx.x % 2)\n"
                            "        cp_async_16(stage + 16 * threadIdx.x, i < n ? x + i : x, i < n ? 16 : 0);\n"
                            "    else\n"
                            "        for (int j = 0; j < 4; ++j) cp_async_4(stage + 16 * threadIdx.x + 4 * j, "
                            "x + min(i + j, n - 1));\n")
    state = state.with_source(source)
    compiled(state, cache)
    steps = []
    while anchors := sync_copies.find(state):
        rewrite = sync_copies.backward(state, anchors[0])
        steps.append((state, rewrite))
        state = rewrite.state
    assert [r.anchor.key for _, r in steps] == ["cp_async_16", "cp_async_4", "cp_async_commit", "cp_async_wait"]
    assert [r.removes for _, r in steps] == [("cp_async", "ldgsts")] * 2 + [("cp_async_wait",)] * 2
    assert not async_features(state)
    assert sass_features(compiled(steps[1][1].state, cache).cubin_bytes()).count("ldgsts") == 0
    for previous, rewrite in reversed(steps):
        restored = sync_copies.forward(state, rewrite.anchor)
        assert restored.direction is Direction.FORWARD and restored.adds == rewrite.removes
        assert restored.state.source == previous.source
        state = restored.state


def test_commit_and_wait_macros_empty_their_expansion(sync_copies, cache):
    state = golden("helper", "before")
    source = state.source.replace("template <int PENDING>\n", "")
    commit = '#define CP_ASYNC_COMMIT() asm volatile("cp.async.commit_group;\\n" ::: "memory")\n'
    wait = '#define CP_ASYNC_WAIT(n) asm volatile("cp.async.wait_group %0;\\n" :: "n"(n) : "memory")\n'
    source = re.sub(r"__device__ __forceinline__ void cp_async_commit\(\)\n\{\n.*?\n\}\n", lambda _: commit, source,
                    flags=re.S)
    source = re.sub(r"__device__ __forceinline__ void cp_async_wait\(\)\n\{\n.*?\n\}\n", lambda _: wait, source,
                    flags=re.S)
    source = source.replace("cp_async_commit();", "CP_ASYNC_COMMIT();")
    source = source.replace("cp_async_wait<STAGES - 2>();", "CP_ASYNC_WAIT(STAGES - 2);")
    source = source.replace("cp_async_wait<0>();", "CP_ASYNC_WAIT(0);")
    state = state.with_source(source)
    compiled(state, cache)
    steps = []
    while anchors := sync_copies.find(state):
        steps.append((state, sync_copies.backward(state, anchors[0])))
        state = steps[-1][1].state
    assert [(r.anchor.function, r.anchor.kind, r.anchor.key) for _, r in steps] == [
        ("cp_async_16", "function", "cp_async_16"), ("kernel", "macro", "CP_ASYNC_COMMIT"),
        ("kernel", "macro", "CP_ASYNC_WAIT")]
    assert "#define CP_ASYNC_COMMIT()\n" in state.source and "#define CP_ASYNC_WAIT(n)\n" in state.source
    assert not async_features(state)
    compiled(state, cache)
    for parent, rewrite in reversed(steps):
        state = sync_copies.forward(state, rewrite.anchor).state
        assert state.source == parent.source


def test_forward_without_a_snippet_writes_the_canonical_cp_async(sync_copies, cache):
    canonical = ('asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"(smem_addr), "l"(gmem), '
                 '"r"(src_bytes) : "memory");')
    forward = sync_copies.forward(golden("helper", "after"), Anchor("cp_async_16", "function", "cp_async_16"))
    assert canonical in forward.state.source and "wait_group 0" not in forward.state.source
    # With nothing left that waits for cp.async groups, the copy is committed and waited for at once.
    bare = synchronous(golden("helper", "before"))
    forward = sync_copies.forward(bare, Anchor("cp_async_16", "function", "cp_async_16"))
    source = forward.state.source
    assert canonical in source
    assert 'asm volatile("cp.async.commit_group;\\n" ::: "memory");' in source
    assert 'asm volatile("cp.async.wait_group 0;\\n" ::: "memory");' in source
    assert sass_features(compiled(forward.state, cache).cubin_bytes()).count("ldgsts", "kernel") > 0
    inline = sync_copies.forward(golden("inline", "after"), Anchor("kernel", "asm", "cp.async#0"))
    assert 'asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\\n" :: "r"(dst), "l"(src) : "memory");' in \
        inline.state.source
    compiled(inline.state, cache)
    with pytest.raises(NotApplicable, match="rewrites st.shared units only"):
        sync_copies.forward(golden("pipeline", "after"), Anchor("kernel", "call", "cp.async#0"))
    with pytest.raises(NotApplicable, match="no synchronous copy written by sync_copies"):
        sync_copies.forward(golden("helper", "before"), Anchor("cp_async_16", "function", "cp_async_16"))


def test_cuda_memcpy_async_per_thread(sync_copies, cache):
    source = """#include <cuda/barrier>
#include <cooperative_groups.h>

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ __align__(16) float tile[128];
    __shared__ cuda::barrier<cuda::thread_scope_block> bar;
    if (threadIdx.x == 0) init(&bar, blockDim.x);
    __syncthreads();
    cuda::memcpy_async(&tile[threadIdx.x], x + blockIdx.x * 128 + threadIdx.x, sizeof(float), bar);
    bar.arrive_and_wait();
    y[blockIdx.x * 128 + threadIdx.x] = tile[127 - threadIdx.x];
}
"""
    state = KernelState(source, PLAN)
    compiled(state, cache)
    anchors = sync_copies.find(state)
    assert anchors == [Anchor("kernel", "call", "cp.async#0")]
    rewrite = sync_copies.backward(state, anchors[0])
    assert "memcpy(&tile[threadIdx.x], x + blockIdx.x * 128 + threadIdx.x, sizeof(float));" in rewrite.state.source
    assert "bar.arrive_and_wait();" in rewrite.state.source
    assert "cp_async" not in {f.name for f in source_features(rewrite.state.source)}
    compiled(rewrite.state, cache)
    assert sync_copies.forward(rewrite.state, rewrite.anchor).state.source == source
    group = source.replace("cuda::memcpy_async(&tile", "cuda::memcpy_async(cooperative_groups::this_thread_block(), "
                                                         "&tile")
    with pytest.raises(NotApplicable, match="thread group"):
        sync_copies.backward(KernelState(group, PLAN), Anchor("kernel", "call", "cp.async#0"))


def test_declines_with_the_reason(sync_copies):
    hgemm = KernelState((HERE.parent / "fixtures" / "static" / "hgemm_mma.cu").read_text(), PLAN)
    macro = [a for a in sync_copies.find(hgemm) if a.kind == "macro"]
    assert macro == [Anchor("<file>", "macro", "CP_ASYNC_CG"), Anchor("hgemm", "macro", "CP_ASYNC_COMMIT"),
                     Anchor("hgemm", "macro", "CP_ASYNC_WAIT")]  # group macros: at the function using them
    with pytest.raises(NotApplicable, match="spliced where the macro is used"):
        sync_copies.backward(hgemm, macro[0])
    with pytest.raises(NotApplicable, match="1 cp.async copy still commit and wait through CP_ASYNC_COMMIT"):
        sync_copies.backward(hgemm, macro[1])
    hinted = golden("helper", "before")
    hinted = hinted.with_source(hinted.source.replace(
        '"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n"',
        '"cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\\n"').replace(
        '"r"(src_bytes) : "memory"', '"r"(src_bytes), "l"(0ull) : "memory"'))
    with pytest.raises(NotApplicable, match="not a plain cp.async"):
        sync_copies.backward(hinted, Anchor("cp_async_16", "function", "cp_async_16"))
    mixed = golden("groups", "before")
    mixed = mixed.with_source(mixed.source.replace('"cp.async.commit_group;\\n"',
                                                   '"cp.async.commit_group;\\nbar.sync 0;\\n"'))
    assert [a.key for a in sync_copies.find(mixed)] == ["cp_async_wait"]  # no longer a commit-only helper
    with pytest.raises(NotApplicable, match="mixes cp.async commit/wait with other instructions"):
        sync_copies.backward(mixed, Anchor("cp_async_wait", "function", "cp_async_wait"))
    with pytest.raises(NotApplicable, match="no cp.async copy at kernel/asm:cp.async#1"):
        sync_copies.backward(golden("inline", "before"), Anchor("kernel", "asm", "cp.async#1"))


# ------------------------------------------------------------------------------------------------
# The corpus experts: unpipeline first (the catalog's order), then sync_copies
# ------------------------------------------------------------------------------------------------


# one gemm expert by default; the others repeat its rewrite on other pipelines: -m slow
@pytest.mark.parametrize("name", sampled(EXPERTS, keep=("gemm/mma_sync",)))
def test_expert_copies_become_synchronous(name, sync_copies, cache):
    function, entry = EXPERTS[name]
    state = unpipelined(name)
    anchors = sync_copies.find(state)
    assert anchors == [Anchor("cp_async_16", "function", "cp_async_16"),
                       Anchor("cp_async_commit", "function", "cp_async_commit"),
                       Anchor("cp_async_wait", "function", "cp_async_wait")]
    rewrite = sync_copies.backward(state, anchors[0])
    after = rewrite.state
    assert not cp.syntax_errors(after.source)
    assert "zero-fill kept" in rewrite.note
    assert async_features(state) == {"cp_async", "cp_async_wait"}
    assert async_features(after) == {"cp_async_wait"}
    assert after.plan == state.plan
    sass_before = sass_features(compiled(state, cache).cubin_bytes())
    sass_after = sass_features(compiled(after, cache).cubin_bytes())
    assert sass_before.count("ldgsts", entry) > 0
    assert sass_after.count("ldgsts", entry) == 0
    # Each 16-byte cp.async became a 16-byte global load and a 16-byte shared store.
    assert sass_after.count("ldg_128", entry) == sass_before.count("ldgsts", entry)
    assert sass_after.count("sts", entry) >= sass_before.count("sts", entry) + sass_before.count("ldgsts", entry)
    assert sass_after.count("bar_sync", entry) == sass_before.count("bar_sync", entry)
    assert sass_after.count("hmma", entry) == sass_before.count("hmma", entry)
    assert sync_copies.forward(after, rewrite.anchor).state.source == state.source
    # Then the commit and the wait helper, one step each; forward gives every parent back.
    steps = [(state, rewrite)]
    while anchors := sync_copies.find(steps[-1][1].state):
        steps.append((steps[-1][1].state, sync_copies.backward(steps[-1][1].state, anchors[0])))
    last = steps[-1][1].state
    assert len(steps) == 3 and not async_features(last)
    compiled(last, cache)
    for parent, step in steps:
        assert sync_copies.forward(step.state, step.anchor).state.source == parent.source


@pytest.mark.parametrize("name", ["gemm/mma_sync", "conv2d/implicit_gemm"])
@pytest.mark.parametrize("tiles", [1, 2, 5])
def test_expert_schedule_with_synchronous_copies(name, tiles):
    function, _ = EXPERTS[name]
    run_schedule(synchronous(unpipelined(name)), function, family(name), tiles, 1, synchronous=True)


def test_experts_without_unpipeline_first_still_rewrite(sync_copies, cache):
    """The walk removes the pipeline first (after = ("unpipeline",)), but the copies of a ring
    pipeline can also be made synchronous on their own: the stores land in the stage the ring frees
    behind its barrier, and the now empty waits cost nothing."""
    state = expert("conv2d/implicit_gemm")
    after = synchronous(state)
    assert not async_features(after) and "__syncthreads();" in after.source
    assert sass_features(compiled(after, cache).cubin_bytes()).count("ldgsts") == 0
    run_schedule(after, "conv2d_implicit_gemm", "conv", 5, 4, synchronous=True)
    assert kernel_entry("conv2d/implicit_gemm").load().source == state.source


def test_compile_only_walk_accepts_every_step(tmp_path, monkeypatch, shared_cache):
    """The walk end to end on the GEMM expert with these two transforms: the gate (compile-only),
    the step audit (one mechanism at one locus, declared features gone, LDGSTS fewer) and the
    forward check accept unpipeline, then the copy, the commit and the wait. Its verdicts are its own, its
    probes and compiles the run's (tests/shared_cache.py)."""
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache)))
    lineage = walk(corpus.problem_path("gemm"), expert("gemm/mma_sync"), gate_mode=GateMode.COMPILE_ONLY,
                   cache=GateCache(tmp_path / "cache", tmp_path / "recorded"),
                   transforms=[get("unpipeline"), get("sync_copies")])
    assert lineage.termination.kind is Termination.COMPLETE, lineage.termination
    assert not lineage.rejections
    assert [t.transform for t in lineage.transitions] == ["unpipeline"] + ["sync_copies"] * 3
    removed = [sorted(str(c) for c in t.features_removed) for t in lineage.transitions]
    assert removed == [["source gemm_bf16_mma_sync:multistage_pipeline"],
                       ["sass gemm_bf16_mma_sync:ldgsts", "source cp_async_16:cp_async"],
                       ["source cp_async_commit:cp_async_wait"], ["source cp_async_wait:cp_async_wait"]]
    assert [t.forward.status for t in lineage.transitions] == [ForwardStatus.NO_MECHANICAL_FORWARD] + \
        [ForwardStatus.UNTIMED] * 3


def test_forward_refuses_another_kernels_recorded_helper(sync_copies):
    """GEMM's and conv2d's walks both record a `cp_async_16`, with other parameters (`int src_bytes`
    and `bool valid`); restoring conv2d's into GEMM would change what GEMM's callers pass."""
    from klineage import config
    from klineage.lineage import Lineage

    walks = {name: Lineage.load(config.corpus_dir() / "lineages" / f"{name}.gpu.json")
             for name in ("gemm_mma_sync", "conv2d_implicit_gemm")}
    copies = {name: next(i for i, t in enumerate(w.transitions) if t.transform == "sync_copies")
              for name, w in walks.items()}
    gemm, first = walks["gemm_mma_sync"], copies["gemm_mma_sync"]
    state = gemm.states[first + 3].kernel
    for step in (first + 2, first + 1):  # the wait and commit helpers go back before the copy
        state = sync_copies.forward(state, gemm.transitions[step].anchor).state
    foreign = walks["conv2d_implicit_gemm"].transitions[copies["conv2d_implicit_gemm"]].anchor
    assert foreign.function == gemm.transitions[first].anchor.function == "cp_async_16"
    with pytest.raises(NotApplicable, match=r"bool valid.*int src_bytes.*another kernel's"):
        sync_copies.forward(state, foreign)
    assert sync_copies.forward(state, gemm.transitions[first].anchor).state.fingerprint == \
        gemm.states[first].kernel.fingerprint
