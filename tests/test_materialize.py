"""Materialization: cards induced from the committed dry walk of row_softmax/warp_vec4, put on
kernels they did not come from (the bundled naive row softmax, and a tiny hand-written one under
tests/fixtures/materialize/), compiled by the real gate in compile-only mode (real nvcc), and the
added features read back from the verdict. Forward sites of each transform are checked on real
sources, carrier values included (unpad_shared too, on a tiled variant); the combined rewrite of the
tiny kernel is a golden file."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.kernel import KernelState, load_kernel
from klineage.launch import LaunchPlan
from klineage.skills.card import CardAnchor, Scope, SkillCard
from klineage.skills.materialize import apply_everywhere, forward_sites, materialize
from klineage.transforms import get
from library_data import dry_cards_by_transform

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "materialize" / "tiny_softmax"
GOLDEN = TINY / "all_forward.cu"
SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture(scope="module")
def cards() -> dict[str, SkillCard]:
    return dry_cards_by_transform()


def naive() -> KernelState:
    return corpus.kernel_entry("row_softmax/naive").load()


def tiny() -> KernelState:
    return load_kernel(TINY)


def compiled_features(state: KernelState, cache: GateCache) -> set[tuple[str, str]]:
    verdict = run_gate(SOFTMAX, state, mode=GateMode.COMPILE_ONLY, cache=cache)
    assert verdict.status is Status.COMPILED, [f.message for f in verdict.findings]
    return {(row["locus"], row["name"]) for row in verdict.features["source"]}


def test_the_dry_walk_gives_the_cards_these_tests_use(cards):
    assert set(cards) == {"launch_bounds", "restrict", "unroll"}
    assert cards["unroll"].carrier == {"unroll": ["full"]}


def test_unroll_card_on_the_naive_softmax_compiles_with_the_pragmas(cards, gate_cache):
    rewrites = materialize(cards["unroll"], naive())
    assert [r.anchor.key for r in rewrites] == ["stride#0:unroll", "stride#1:unroll"]
    for rewrite in rewrites:
        assert rewrite.state.source.count("#pragma unroll") == 1
        assert "    #pragma unroll\n    for (int stride = THREADS / 2;" in rewrite.state.source
    assert ("row_softmax_naive", "unroll_pragma") not in compiled_features(naive(), gate_cache)
    assert ("row_softmax_naive", "unroll_pragma") in compiled_features(rewrites[1].state, gate_cache)


def test_cards_whose_mechanism_is_already_there_materialize_to_nothing(cards):
    # the naive kernel already has __launch_bounds__ and __restrict__ pointers
    assert materialize(cards["launch_bounds"], naive()) == []
    assert materialize(cards["restrict"], naive()) == []


def test_every_card_on_the_tiny_kernel_compiles_and_adds_its_feature(cards, gate_cache):
    before = compiled_features(tiny(), gate_cache)
    expected = {"launch_bounds": (["launch_bounds(THREADS)"], "launch_bounds"),
                "restrict": (["x", "y"], "restrict_ptr"),
                "unroll": (["k#0:unroll"], "unroll_pragma")}
    for name, (keys, feature) in expected.items():
        rewrites = materialize(cards[name], tiny())
        assert [r.anchor.key for r in rewrites] == keys, name
        assert ("tiny_softmax", feature) not in before
        for rewrite in rewrites:
            assert rewrite.transform == name and rewrite.adds == (feature,)
            assert ("tiny_softmax", feature) in compiled_features(rewrite.state, gate_cache), name


def test_all_transforms_everywhere_on_the_tiny_kernel_match_the_golden_file(gate_cache):
    state = tiny()
    for name in ("unroll", "restrict", "ldg", "launch_bounds", "fast_math"):
        transform = get(name)
        for anchor in forward_sites(transform, tiny()):
            state = transform.forward(state, anchor).state
    if not GOLDEN.is_file():
        pytest.fail(f"no golden file {GOLDEN}")
    expected = GOLDEN.read_text(encoding="utf-8")
    assert state.source == expected, "".join(difflib.unified_diff(expected.splitlines(True),
                                                                  state.source.splitlines(True), "golden", "now"))
    features = {name for locus, name in compiled_features(state, gate_cache) if locus == "tiny_softmax"}
    assert {"unroll_pragma", "restrict_ptr", "ldg", "launch_bounds", "fast_math"} <= features


def test_apply_everywhere_chains_the_sites(cards):
    applied = apply_everywhere(cards["restrict"], tiny())
    assert applied is not None and applied.anchors == tuple(r.anchor for r in materialize(cards["restrict"], tiny()))
    assert "const float* __restrict__ x, float* __restrict__ y" in applied.state.source
    assert apply_everywhere(cards["restrict"], naive()) is None


def test_ldg_sites_are_reads_through_const_pointers_only():
    keys = [a.key for a in forward_sites(get("ldg"), tiny())]
    assert keys == ["xr + c#0", "xr + c#1", "xr + c#2"]  # never `*(yr + c) = ...`, a write through a plain pointer
    written = tiny().with_source(tiny().source.replace("const float* xr", "float* xr"))
    assert forward_sites(get("ldg"), written) == []
    plan = tiny().plan.to_dict()
    plan["launch"][0]["args"] = ["x", "x", {"scalar": "rows", "type": "i32"}, {"scalar": "cols", "type": "i32"}]
    in_place = KernelState(tiny().source, LaunchPlan.from_dict(plan, "in-place plan"))
    assert forward_sites(get("ldg"), in_place) == []  # y is x: what it reads, it writes


def test_fast_math_sites_follow_the_carrier():
    transform = get("fast_math")
    assert [a.key for a in transform.forward_sites(tiny())] == ["__expf#0", "__expf#1"]
    assert [a.key for a in transform.forward_sites(tiny(), {"fast": ["__expf"]})] == ["__expf#0", "__expf#1"]
    assert transform.forward_sites(tiny(), {"fast": ["__fdividef"]}) == []  # the evidence showed other intrinsics


def test_unroll_sites_need_a_small_constant_trip_count():
    transform = get("unroll")
    assert [a.key for a in transform.forward_sites(tiny(), {"unroll": ["4"]})] == ["k#0:unroll 4"]
    longer = tiny().with_source(tiny().source.replace("constexpr int SPLIT = 4;", "constexpr int SPLIT = 4;\n"
                                                      "constexpr int MANY = 65;").replace("k < SPLIT", "k < MANY"))
    assert transform.forward_sites(longer) == []  # 65 trips: left to the compiler
    assert [a.key for a in transform.forward_sites(naive())] == ["stride#0:unroll", "stride#1:unroll"]


def test_restrict_is_not_offered_where_the_plan_aliases_two_parameters():
    state = tiny()
    plan = state.plan.to_dict()
    plan["launch"][0]["args"] = ["x", "x", {"scalar": "rows", "type": "i32"}, {"scalar": "cols", "type": "i32"}]
    aliased = KernelState(state.source, LaunchPlan.from_dict(plan, "aliased plan"))
    assert [a.key for a in forward_sites(get("restrict"), state)] == ["x", "y"]
    assert forward_sites(get("restrict"), aliased) == []


def test_launch_bounds_needs_a_known_block_size(cards):
    state = tiny()
    plan = state.plan.to_dict()
    plan["launch"][0]["block"] = ["cols"]
    by_case = KernelState(state.source, LaunchPlan.from_dict(plan, "case-sized block"))
    assert forward_sites(get("launch_bounds"), by_case) == []
    # The walk's minimum blocks per SM is tuning for its own kernel's registers: never placed afresh.
    keys = [a.key for a in get("launch_bounds").forward_sites(state, {"launch_bounds": [["THREADS", "2"]]})]
    assert keys == ["launch_bounds(THREADS)"]
    assert [r.anchor.key for r in materialize(cards["launch_bounds"], state)] == ["launch_bounds(THREADS)"]


def test_a_card_without_a_mechanical_forward_materializes_to_nothing(cards):
    card = dataclasses.replace(cards["unroll"], id="", transform="unpipeline",
                               anchor=CardAnchor("loop"), scope=Scope(("row_softmax",)))
    assert materialize(card, tiny()) == [] and apply_everywhere(card, tiny()) is None


TILED = """constexpr int T = 32;
constexpr int THREADS = 128;  // named by the tiny plan
extern "C" __global__ void tiny_softmax(const float* x, float* y, int rows, int cols)
{
    __shared__ float tile[T][T];
    __shared__ float other[T][T];
    const int c = blockIdx.x * T + threadIdx.x, r = blockIdx.y * T + threadIdx.y;
    if (r < rows && c < cols) tile[threadIdx.y][threadIdx.x] = x[r * cols + c];
    other[threadIdx.y][threadIdx.x] = 0.0f;
    const float* row = &other[threadIdx.y][0];
    __syncthreads();
    const int tc = blockIdx.y * T + threadIdx.x, tr = blockIdx.x * T + threadIdx.y;
    if (tr < cols && tc < rows) y[tr * rows + tc] = tile[threadIdx.x][threadIdx.y] + row[1];
}
"""


def test_unpad_shared_pads_only_tiles_used_element_by_element(gate_cache):
    state = tiny().with_source(TILED)
    transform = get("unpad_shared")
    assert forward_sites(transform, tiny()) == []  # no shared tile
    [anchor] = transform.forward_sites(state, {"padding": [4]})  # `other` is addressed: never padded
    assert anchor.key == 'tile[1] {"from":"T + 4","to":"T"}'
    rewrite = transform.forward(state, anchor)
    assert "__shared__ float tile[T][T + 4];" in rewrite.state.source
    assert "__shared__ float other[T][T];" in rewrite.state.source
    assert transform.forward_sites(rewrite.state) == []  # padded already
    assert [a.key for a in transform.find(rewrite.state)] == [anchor.key]  # backward would take it off again
    assert [a.key for a in forward_sites(transform, state)] == ['tile[1] {"from":"T + 1","to":"T"}']
    compiled_features(rewrite.state, gate_cache)


def test_evidence_anchors_place_a_card_where_no_finder_can():
    """The roundtrip: at the naive end of the GEMM walk the scalarized MMA has no site a finder
    could place afresh, but the walk's own anchor still names it."""
    from klineage.features.source import source_features
    from klineage.lineage import Lineage
    from klineage.optimize.strategies import RewriterKind, Strategy, planner
    from klineage.skills.library import lineage_index, load_library, problem_infos
    from klineage.skills.materialize import evidence_anchors

    walk = Lineage.load(ROOT / "corpus" / "lineages" / "gemm_mma_sync.dry.json.gz")
    naive = walk.states[-1].kernel
    def has_mma(state: KernelState) -> bool:  # source comments name mma.sync too: ask the feature reader
        return any(f.name == "mma_sync" for f in source_features(state.source))

    assert not has_mma(naive)
    card = next(c for c in load_library(ROOT / "corpus" / "library" / "library.json").cards
                if c.transform == "scalarize_mma")
    assert materialize(card, naive) == [] and apply_everywhere(card, naive) is None
    index = lineage_index()
    anchors = evidence_anchors(card, index)
    assert walk.transitions[0].anchor in anchors and len(anchors) == len(set(anchors))
    [rewrite] = materialize(card, naive, anchors)
    assert rewrite.anchor == walk.transitions[0].anchor and has_mma(rewrite.state)
    assert apply_everywhere(card, naive, anchors).state.fingerprint == rewrite.state.fingerprint

    def first(strategy: Strategy):
        plan = planner(strategy, RewriterKind.RULES, cards=[card], problem=problem_infos({"gemm"})["gemm"],
                       statuses=[card.status], transforms=[], seed=0, lineages=index)
        return next(iter(plan(naive)))

    assert first(Strategy.LIBRARY).rewrite.state.fingerprint == rewrite.state.fingerprint
    assert first(Strategy.GENERATED_ONLY).rewrite is None  # stripped cards lend no anchors
