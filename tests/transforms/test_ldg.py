"""ldg: one `__ldg(ptr)` becomes a plain load `*(ptr)`; forward wraps it back."""

from __future__ import annotations

import pytest

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.feature import Feature
from klineage.features.source import source_features
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["plain", "member"]


@pytest.fixture(scope="module")
def ldg():
    return get("ldg")


def golden(case: str, which: str):
    return load(HERE / "ldg" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("ldg", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


def test_anchors_name_the_pointer_expression_and_ordinal(ldg):
    assert ldg.find(golden("member", "before")) == [Anchor("kernel", "call", "v + i#0"),
                                                     Anchor("kernel", "call", "v + i#1")]
    # The ordinal counts plain loads of the same expression too, so it survives the rewrite.
    assert ldg.find(golden("member", "after")) == [Anchor("kernel", "call", "v + i#1")]
    after = ldg.backward(golden("member", "after"), Anchor("kernel", "call", "v + i#1")).state
    assert "(*(v + i)).x + (*(v + i)).w" in after.source
    assert ldg.forward(after, Anchor("kernel", "call", "v + i#1")).state.source == golden("member", "after").source
    assert "__ldg(v + i).x + (*(v + i)).w" in ldg.forward(after, Anchor("kernel", "call", "v + i#0")).state.source


def test_nested_loads_unwind_inner_after_outer(ldg):
    state = golden("plain", "before")
    while anchors := ldg.find(state):
        state = ldg.backward(state, anchors[0]).state
    assert "y[i] = *(x + *(&idx[i]));" in state.source
    assert not cp.syntax_errors(state.source)


def test_not_applicable_cases(ldg):
    before, after = golden("plain", "before"), golden("plain", "after")
    with pytest.raises(NotApplicable, match="no load of 'y' number 0 in kernel"):
        ldg.backward(before, Anchor("kernel", "call", "y#0"))
    with pytest.raises(NotApplicable, match="already a plain dereference"):
        ldg.backward(after, Anchor("kernel", "call", "x + __ldg(&idx[i])#0"))
    with pytest.raises(NotApplicable, match="already uses __ldg"):
        ldg.forward(before, Anchor("kernel", "call", "x + __ldg(&idx[i])#0"))
    with pytest.raises(NotApplicable, match="needs a call anchor"):
        ldg.backward(before, Anchor("kernel", "call", "x + i"))


@pytest.mark.parametrize("name", ["row_softmax/warp_vec4", "topk/radix_select"])
def test_corpus_loads_become_plain_and_compile(name, ldg, cache):
    state = kernel_entry(name).load()
    anchors = ldg.find(state)
    assert anchors
    functions = {a.function for a in anchors}
    for anchor in anchors:
        rewrite = ldg.backward(state, anchor)
        assert not cp.syntax_errors(rewrite.state.source)
        assert rewrite.state.source.count("__ldg(") == state.source.count("__ldg(") - 1
        assert ldg.forward(rewrite.state, anchor).state.source == state.source
    while anchors := ldg.find(state):
        state = ldg.backward(state, anchors[0]).state
    features = source_features(state.source)
    assert all(Feature(function, "ldg") not in features for function in functions)
    compiles_without_spills(state, cache)


@pytest.mark.parametrize("name", ["gemm/mma_sync", "conv2d/implicit_gemm"])
def test_experts_without_ldg_have_no_sites(name, ldg):
    assert ldg.find(kernel_entry(name).load()) == []
