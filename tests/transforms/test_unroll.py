"""unroll: remove one `#pragma unroll [N]` before a loop; forward puts the same line back."""

from __future__ import annotations

import pytest

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.feature import Feature
from klineage.features.source import source_features
from klineage.transforms import Anchor, Direction, NotApplicable, get
from tests.sampled import sampled
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["plain", "factor", "nested"]
EXPERTS = ["row_softmax/warp_vec4", "gemm/mma_sync"]


@pytest.fixture(scope="module")
def unroll():
    return get("unroll")


def golden(case: str, which: str):
    return load(HERE / "unroll" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("unroll", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('nested',)))
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


def test_anchor_names_the_loop_variable_ordinal_and_pragma(unroll):
    (anchor,) = unroll.find(golden("factor", "before"))
    assert anchor == Anchor("kernel", "loop", "k#1:unroll 4")
    assert anchor.snippet.splitlines()[0] == "#pragma unroll 4"
    rewrite = unroll.backward(golden("factor", "before"), anchor)
    assert rewrite.carrier == {"unroll": "4"}
    assert rewrite.removes == ("unroll_pragma",) and rewrite.direction is Direction.BACKWARD
    (plain,) = unroll.find(golden("plain", "before"))
    assert plain.key == "k#0:unroll"
    assert unroll.backward(golden("plain", "before"), plain).carrier == {"unroll": "full"}


def test_forward_without_a_snippet_indents_like_the_loop(unroll):
    after = golden("factor", "after")
    rewrite = unroll.forward(after, Anchor("kernel", "loop", "k#1:unroll 4"))
    assert "\n    #pragma unroll 4\n    for (int k = 0; k < ITEMS; ++k) {" in rewrite.state.source
    assert not cp.syntax_errors(rewrite.state.source)


def test_nested_braceless_loops_keep_parsing(unroll):
    before = golden("nested", "before")
    anchors = unroll.find(before)
    assert [a.key for a in anchors] == ["j#0:unroll", "e#0:unroll"]
    state = before
    for _ in anchors:  # remove both, outer first
        state = unroll.backward(state, unroll.find(state)[0]).state
        assert not cp.syntax_errors(state.source)
    assert "#pragma" not in state.source


def test_not_applicable_cases(unroll):
    before = golden("factor", "before")
    with pytest.raises(NotApplicable, match="has no unroll pragma"):
        unroll.backward(before, Anchor("kernel", "loop", "k#0:unroll"))
    with pytest.raises(NotApplicable, match="has `#pragma unroll 4`, not `#pragma unroll 2`"):
        unroll.backward(before, Anchor("kernel", "loop", "k#1:unroll 2"))
    with pytest.raises(NotApplicable, match="no loop over 'q' number 0 in kernel"):
        unroll.backward(before, Anchor("kernel", "loop", "q#0:unroll"))
    with pytest.raises(NotApplicable, match="already has `#pragma unroll 4`"):
        unroll.forward(before, Anchor("kernel", "loop", "k#1:unroll 4"))
    with pytest.raises(NotApplicable, match="needs a loop anchor"):
        unroll.backward(before, Anchor("kernel", "call", "k#1"))


def test_nounroll_and_other_pragmas_are_not_sites(unroll):
    state = golden("plain", "before")
    for pragma in ("nounroll", "once"):
        other = state.with_source(state.source.replace("#pragma unroll", f"#pragma {pragma}"))
        assert unroll.find(other) == []


@pytest.mark.parametrize("name", EXPERTS)
def test_every_corpus_site_round_trips(name, unroll):
    state = kernel_entry(name).load()
    anchors = unroll.find(state)
    pragmas = sum(1 for loop in cp.loops(state.source) if loop.pragma.startswith("unroll"))
    assert len(anchors) == pragmas > 0
    assert len({(a.function, a.key) for a in anchors}) == len(anchors)  # anchors are distinct
    for anchor in anchors:
        rewrite = unroll.backward(state, anchor)
        assert not cp.syntax_errors(rewrite.state.source)
        assert len(unroll.find(rewrite.state)) == len(anchors) - 1
        assert unroll.forward(rewrite.state, anchor).state.source == state.source


def test_gemm_single_pragma_function_loses_the_feature_and_compiles(unroll, cache):
    state = kernel_entry("gemm/mma_sync").load()
    anchor = next(a for a in unroll.find(state) if a.function == "load_a_fragments")
    assert anchor.key == "mt#0:unroll"
    assert Feature("load_a_fragments", "unroll_pragma") in source_features(state.source)
    rewrite = unroll.backward(state, anchor)
    assert Feature("load_a_fragments", "unroll_pragma") not in source_features(rewrite.state.source)
    assert Feature("mma_warp_tile", "unroll_pragma") in source_features(rewrite.state.source)
    compiles_without_spills(rewrite.state, cache)


@pytest.mark.parametrize("name", EXPERTS)
def test_removing_every_pragma_compiles_without_spills(name, unroll, cache):
    state = kernel_entry(name).load()
    functions = {a.function for a in unroll.find(state)}
    while anchors := unroll.find(state):
        state = unroll.backward(state, anchors[0]).state
    features = source_features(state.source)
    assert not [f for f in features if f.name == "unroll_pragma"]
    assert all(Feature(function, "unroll_pragma") not in features for function in functions)
    compiles_without_spills(state, cache)
