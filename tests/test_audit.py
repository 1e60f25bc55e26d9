"""The step audit on real verdicts: small kernels compiled through the gate (compile-only) before
and after real rewrites. The transforms here are test-only (never registered in the catalog), so
the audit is tested apart from the catalog's progress; tests/test_walk.py reuses them."""

from __future__ import annotations

from klineage import corpus
from klineage.config import GateMode
from klineage.features import cuda_parser as cp
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.lineage import FeatureChange, FeatureLevel
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform
from klineage.walk.audit import MECHANISMS, audit

SOFTMAX = corpus.problem_path("row_softmax")

PLAN = """
name = "audit_probe"
problem = "row_softmax"
arch = "sm_90"
nvcc_flags = ["-O3"]

[[launch]]
entry = "probe"
grid = ["rows"]
block = [128]
shared = 0
args = ["x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }]
"""

# Two `#pragma unroll` loops and two `__restrict__` pointers: enough for one removal, two
# removals, and the last removal at a function. Not a softmax: compile-only gates run nothing.
SOURCE = """\
extern "C" __global__ void probe(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + static_cast<size_t>(row) * cols;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) acc += xr[(threadIdx.x + k) % cols];
    float scale = 1.0f;
#pragma unroll
    for (int k = 0; k < 3; ++k) scale *= 0.5f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[static_cast<size_t>(row) * cols + c] = acc * scale;
}
"""


def probe_state(source: str = SOURCE) -> KernelState:
    return KernelState(source=source, plan=LaunchPlan.from_toml(PLAN))


def _line_start(data: bytes, offset: int) -> int:
    return data.rfind(b"\n", 0, offset) + 1


class PragmaUnroll(Transform):
    """Test-only: remove one `#pragma unroll` line; forward puts `#pragma unroll` back at column 0."""

    name = "test_unroll"
    intent = "let the compiler unroll a short fixed-count loop"
    removes = ("unroll_pragma",)

    def _loops(self, state: KernelState) -> list[tuple[Anchor, cp.Loop]]:
        found, counter = [], {}
        for loop in cp.loops(state.source):
            function = loop.function or "<file>"
            index = counter[function] = counter.get(function, -1) + 1
            found.append((Anchor(function, "loop", f"loop#{index}"), loop))
        return found

    def find(self, state: KernelState) -> list[Anchor]:
        return [anchor for anchor, loop in self._loops(state) if loop.pragma.startswith("unroll")]

    def _loop(self, state: KernelState, anchor: Anchor) -> cp.Loop:
        for candidate, loop in self._loops(state):
            if candidate == anchor:
                return loop
        raise NotApplicable(f"{self.name}: no loop {anchor}")

    def strip(self, state: KernelState, anchor: Anchor) -> bytes:
        loop = self._loop(state, anchor)
        if not loop.pragma.startswith("unroll"):
            raise NotApplicable(f"{self.name}: the loop at {anchor} has no unroll pragma")
        data = cp.parse(state.source).data
        start = _line_start(data, loop.pragma_node.start_byte)
        end = loop.pragma_node.end_byte
        if not data[:end].endswith(b"\n"):
            end = data.index(b"\n", end) + 1
        return data[:start] + data[end:]

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        return self.rewrite(state, anchor, Direction.BACKWARD, self.strip(state, anchor).decode())

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        loop = self._loop(state, anchor)
        if loop.pragma:
            raise NotApplicable(f"{self.name}: the loop at {anchor} already has a pragma")
        data = cp.parse(state.source).data
        start = _line_start(data, loop.node.start_byte)
        return self.rewrite(
            state, anchor, Direction.FORWARD, (data[:start] + b"#pragma unroll\n" + data[start:]).decode()
        )


class RestrictRemover(Transform):
    """Test-only: drop one `__restrict__` (and the blank after it). No mechanical forward."""

    name = "test_restrict"
    intent = "promise the compiler that pointers do not alias"
    removes = ("restrict_ptr",)

    def __init__(self, removes: tuple[str, ...] = ("restrict_ptr",), after: tuple[str, ...] = ()):
        self.removes = removes
        self.after = after

    def _qualifiers(self, state: KernelState) -> list[tuple[Anchor, object]]:
        parsed = cp.parse(state.source)
        found, counter = [], {}
        for node in cp.nodes_of_type(parsed.root, "type_qualifier"):
            if parsed.text(node) != "__restrict__":
                continue
            function = cp.function_of(node) or "<file>"
            index = counter[function] = counter.get(function, -1) + 1
            found.append((Anchor(function, "qualifier", f"restrict#{index}"), node))
        return found

    def find(self, state: KernelState) -> list[Anchor]:
        return [anchor for anchor, _ in self._qualifiers(state)]

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        for candidate, node in self._qualifiers(state):
            if candidate == anchor:
                data = cp.parse(state.source).data
                end = node.end_byte + (data[node.end_byte:node.end_byte + 1] == b" ")
                return self.rewrite(state, anchor, Direction.BACKWARD, (data[:node.start_byte] + data[end:]).decode())
        raise NotApplicable(f"{self.name}: no qualifier {anchor}")


class GreedyUnroll(PragmaUnroll):
    """Test-only and wrong on purpose: removes the pragma AND every `__restrict__` of the function,
    declaring only the pragma."""

    name = "test_greedy_unroll"

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        source = self.strip(state, anchor).decode().replace("__restrict__ ", "")
        return self.rewrite(state, anchor, Direction.BACKWARD, source)


class IdleUnroll(PragmaUnroll):
    """Test-only and wrong on purpose: claims to remove a pragma, only adds a comment."""

    name = "test_idle_unroll"

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        return self.rewrite(state, anchor, Direction.BACKWARD, "// simplified\n" + state.source)


def compiled(state: KernelState, cache: GateCache):
    verdict = run_gate(SOFTMAX, state, mode=GateMode.COMPILE_ONLY, cache=cache)
    assert verdict.status is Status.COMPILED, verdict.findings
    return verdict


def step(transform: Transform, cache: GateCache, parent: KernelState | None = None, which: int = 0):
    parent = parent or probe_state()
    rewrite = transform.backward(parent, transform.find(parent)[which])
    return audit(compiled(parent, cache), compiled(rewrite.state, cache), rewrite, transform, parent=parent)


def test_the_probe_kernel_has_what_the_tests_remove(gate_cache):
    verdict = compiled(probe_state(), gate_cache)
    source = {(f["locus"], f["name"]) for f in verdict.features["source"]}
    assert {("probe", "unroll_pragma"), ("probe", "restrict_ptr")} <= source
    assert {"unroll_pragma", "restrict_ptr"} <= MECHANISMS[FeatureLevel.SOURCE]


def test_declared_removal_passes(gate_cache):
    result = step(PragmaUnroll(), gate_cache)
    assert result.ok, result.message
    assert not result.unexpected and not result.failures
    assert "unroll_pragma" in result.message
    assert any("test_unroll sites at probe: 2 -> 1" in c for c in result.checks)


def test_last_removal_at_a_function_must_take_the_feature_away(gate_cache):
    parent = PragmaUnroll().backward(probe_state(), PragmaUnroll().find(probe_state())[0]).state
    result = step(PragmaUnroll(), gate_cache, parent)
    assert result.ok, result.message
    assert FeatureChange(FeatureLevel.SOURCE, "probe", "unroll_pragma") in result.removed


def test_removing_two_mechanisms_fails_as_unexpected(gate_cache):
    result = step(GreedyUnroll(), gate_cache)
    assert not result.ok
    assert FeatureChange(FeatureLevel.SOURCE, "probe", "restrict_ptr") in result.unexpected
    assert "undeclared mechanism" in result.message


def test_removing_nothing_fails(gate_cache):
    result = step(IdleUnroll(), gate_cache)
    assert not result.ok
    assert "a step removes exactly one" in result.message
    assert not result.removed


def test_declared_sass_feature_must_decrease(gate_cache):
    parent = probe_state()
    before = compiled(parent, gate_cache)
    const_loads = sum(r["count"] for r in before.features["sass"]["counts"] if r["name"] == "ldg_const")
    assert const_loads > 0, "const __restrict__ loads go through the read-only path"
    # While either pointer is __restrict__, the loads of x cannot alias a store: they stay read-only.
    kept = step(RestrictRemover(removes=("restrict_ptr", "ldg_const")), gate_cache)
    assert not kept.ok and f"count went {const_loads} -> {const_loads}" in kept.message
    # Without the last one the read-only path goes away: the declared SASS removal holds.
    transform = RestrictRemover(removes=("restrict_ptr", "ldg_const"))
    one_left = transform.backward(parent, transform.find(parent)[0]).state
    sass_ok = step(transform, gate_cache, one_left)
    assert sass_ok.ok, sass_ok.message
    assert any(c.startswith(f"sass ldg_const: {const_loads} -> ") for c in sass_ok.checks)
    assert FeatureChange(FeatureLevel.SOURCE, "probe", "restrict_ptr") in sass_ok.removed
    # hmma never occurs in this kernel, so it cannot decrease: the declaration is wrong.
    wrong = step(RestrictRemover(removes=("restrict_ptr", "hmma")), gate_cache)
    assert not wrong.ok and "hmma" in wrong.message


def test_unknown_fails(gate_cache):
    parent = probe_state()
    rewrite = PragmaUnroll().backward(parent, PragmaUnroll().find(parent)[0])
    before, after = compiled(parent, gate_cache), compiled(rewrite.state, gate_cache)
    # a declared name that is no feature at all
    odd = Rewrite(rewrite.transform, rewrite.direction, rewrite.anchor, rewrite.state, removes=("unroll_magic",))
    assert not audit(before, after, odd, PragmaUnroll(), parent=parent).ok
    # a rewrite that declares nothing is audited by its sites alone (CTA order, padding have no feature)
    silent = Rewrite(rewrite.transform, rewrite.direction, rewrite.anchor, rewrite.state)
    quiet = audit(before, after, silent, PragmaUnroll(), parent=parent)
    assert quiet.ok and "one test_unroll site" in quiet.message
    idle = IdleUnroll().backward(parent, IdleUnroll().find(parent)[0])
    idle = Rewrite(idle.transform, idle.direction, idle.anchor, idle.state)
    assert not audit(before, compiled(idle.state, gate_cache), idle, IdleUnroll(), parent=parent).ok
    # no transform to count sites with
    assert "unknown transform" in audit(before, after, rewrite, None, parent=parent).message
    # a verdict without features (what a failed compile leaves)
    bare = type(after).from_dict({**after.to_dict(), "features": {}})
    result = audit(before, bare, rewrite, PragmaUnroll(), parent=parent)
    assert not result.ok and result.message.startswith("unknown")
    # contradictory: removed and added at once
    both = Rewrite(rewrite.transform, rewrite.direction, rewrite.anchor, rewrite.state, removes=("unroll_pragma",),
                   adds=("unroll_pragma",))
    assert "both removed and added" in audit(before, after, both, PragmaUnroll(), parent=parent).message


def test_anchor_must_be_a_site_of_the_transform(gate_cache):
    parent = probe_state()
    rewrite = PragmaUnroll().backward(parent, PragmaUnroll().find(parent)[0])
    moved = Rewrite(rewrite.transform, rewrite.direction, Anchor("probe", "loop", "loop#7"), rewrite.state,
                    removes=rewrite.removes)
    result = audit(compiled(parent, gate_cache), compiled(rewrite.state, gate_cache), moved, PragmaUnroll(),
                   parent=parent)
    assert not result.ok and "not one of test_unroll's sites" in result.message


def test_forward_of_the_test_transform_gives_back_the_parent():
    parent = probe_state()
    transform = PragmaUnroll()
    for anchor in transform.find(parent):
        child = transform.backward(parent, anchor).state
        assert transform.forward(child, anchor).state.source == parent.source


# Real experts: a pipeline that vanishes undeclared, and a swizzle family spanning three functions.

GEMM = corpus.problem_path("gemm")


def gemm_compiled(state: KernelState, cache: GateCache):
    verdict = run_gate(GEMM, state, mode=GateMode.COMPILE_ONLY, cache=cache)
    assert verdict.status is Status.COMPILED, verdict.findings
    return verdict


def test_an_undeclared_pipeline_removal_fails(gate_cache):
    from dataclasses import replace

    from klineage.transforms import get

    assert "multistage_pipeline" in MECHANISMS[FeatureLevel.SOURCE]
    expert = corpus.kernel_entry("gemm/mma_sync").load()
    unpipeline = get("unpipeline")
    rewrite = unpipeline.backward(expert, unpipeline.find(expert)[0])
    parent, child = gemm_compiled(expert, gate_cache), gemm_compiled(rewrite.state, gate_cache)
    assert audit(parent, child, rewrite, unpipeline, parent=expert).ok
    silent = replace(rewrite, removes=())
    result = audit(parent, child, silent, unpipeline, parent=expert)
    assert not result.ok and any(c.name == "multistage_pipeline" for c in result.unexpected)


def test_a_family_step_removes_one_swizzle_from_every_function_of_its_family(gate_cache):
    from klineage.transforms import get
    from klineage.walk.audit import FAMILY, FUNCTION, scope_of

    unswizzle = get("unswizzle_shared")
    assert scope_of(unswizzle) == FAMILY and scope_of(PragmaUnroll()) == FUNCTION and scope_of(None) == FUNCTION
    expert = corpus.kernel_entry("gemm/mma_sync").load()
    anchors = unswizzle.find(expert)
    assert len(anchors) == 1
    rewrite = unswizzle.backward(expert, anchors[0])
    parent, child = gemm_compiled(expert, gate_cache), gemm_compiled(rewrite.state, gate_cache)
    result = audit(parent, child, rewrite, unswizzle, parent=expert)
    assert result.ok, result.failures
    gone = {c.locus for c in result.removed if c.name == "xor_swizzle"}
    assert gone == {"swizzle_offset", "a_fragment_offset", "b_fragment_offset"}
    assert any("acts on a family" in c for c in result.checks)

    class PerFunction(type(unswizzle)):
        scope = FUNCTION

    narrow = audit(parent, child, rewrite, PerFunction(), parent=expert)
    assert not narrow.ok and any("also vanished from" in f for f in narrow.failures)
