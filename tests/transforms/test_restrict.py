"""restrict: drop `__restrict__` from one pointer parameter or local pointer; forward adds it back."""

from __future__ import annotations

import pytest

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.feature import Feature
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["parameter", "local"]
EXPERTS = ["row_softmax/warp_vec4", "gemm/mma_sync", "conv2d/implicit_gemm", "topk/radix_select"]


@pytest.fixture(scope="module")
def restrict():
    return get("restrict")


def golden(case: str, which: str):
    return load(HERE / "restrict" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("restrict", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


def test_anchors_are_function_kind_and_name(restrict):
    assert restrict.find(golden("parameter", "before")) == [Anchor("kernel", "parameter", "x"),
                                                             Anchor("kernel", "parameter", "y")]
    assert restrict.find(golden("local", "before")) == [Anchor("kernel", "declaration", "xv")]
    assert restrict.find(golden("local", "after")) == []


def test_other_spellings_and_layouts(restrict):
    state = golden("parameter", "before")
    variants = {
        "float * __restrict__ y": "float * y",
        "float *__restrict__ y": "float *y",
        "float* __restrict y": "float* y",
    }
    for written, plain in variants.items():
        source = state.source.replace("float* __restrict__ y", written)
        anchor = next(a for a in restrict.find(state.with_source(source)) if a.key.startswith("y"))
        assert anchor.key == ("y:__restrict" if "__restrict " in written else "y")
        rewrite = restrict.backward(state.with_source(source), anchor)
        assert plain + ", float a" in rewrite.state.source
        assert restrict.forward(rewrite.state, anchor).state.source == source


def test_overloads_sharing_a_parameter_name_get_ordinals(restrict):
    source = ("__device__ float get(const float* __restrict__ p) { return p[0]; }\n"
              "__device__ float get(const float* __restrict__ p, int i) { return p[i]; }\n"
              "__global__ void kernel(const float* x, float* y) { y[0] = get(x) + get(x, 1); }\n")
    state = golden("parameter", "before").with_source(source)
    anchors = restrict.find(state)
    assert [a.key for a in anchors] == ["p", "p#1"]
    rewrite = restrict.backward(state, anchors[1])
    assert "get(const float* __restrict__ p)" in rewrite.state.source
    assert "get(const float* p, int i)" in rewrite.state.source
    assert restrict.forward(rewrite.state, anchors[1]).state.source == source


def test_not_applicable_cases(restrict):
    before = golden("parameter", "before")
    with pytest.raises(NotApplicable, match="no pointer parameter 'n' in kernel"):
        restrict.backward(before, Anchor("kernel", "parameter", "n"))
    with pytest.raises(NotApplicable, match="'x' in kernel is not __restrict__"):
        restrict.backward(golden("parameter", "after"), Anchor("kernel", "parameter", "x"))
    with pytest.raises(NotApplicable, match="'x' in kernel is already restrict"):
        restrict.forward(before, Anchor("kernel", "parameter", "x"))
    with pytest.raises(NotApplicable, match="needs a parameter or declaration anchor"):
        restrict.backward(before, Anchor("kernel", "loop", "x"))


@pytest.mark.parametrize("name", EXPERTS)
def test_every_corpus_site_round_trips(name, restrict):
    state = kernel_entry(name).load()
    anchors = restrict.find(state)
    assert anchors
    for anchor in anchors:
        rewrite = restrict.backward(state, anchor)
        assert not cp.syntax_errors(rewrite.state.source)
        assert rewrite.state.source.count("__restrict__") == state.source.count("__restrict__") - 1
        assert restrict.forward(rewrite.state, anchor).state.source == state.source


@pytest.mark.parametrize("name", ["row_softmax/warp_vec4", "gemm/mma_sync"])
def test_kernel_parameters_lose_the_feature_and_compile(name, restrict, cache):
    state = kernel_entry(name).load()
    kernel = state.plan.launches[0].entry
    kernel_anchors = [a for a in restrict.find(state) if a.function == kernel]
    assert kernel_anchors and all(a.kind == "parameter" for a in kernel_anchors)
    for anchor in kernel_anchors:
        state = restrict.backward(state, anchor).state
    features = source_features(state.source)
    assert Feature(kernel, "restrict_ptr") not in features
    compiles_without_spills(state, cache)


def test_without_restrict_and_ldg_softmax_leaves_the_read_only_path(restrict, cache):
    state = kernel_entry("row_softmax/warp_vec4").load()
    entry = state.plan.launches[0].entry
    assert sass_features(compiles_without_spills(state, cache).cubin_bytes()).count("ldg_const", entry) > 0
    ldg = get("ldg")
    for transform in (restrict, ldg):
        while anchors := transform.find(state):
            state = transform.backward(state, anchors[0]).state
    assert not {f.name for f in source_features(state.source)} & {"restrict_ptr", "ldg"}
    assert sass_features(compiles_without_spills(state, cache).cubin_bytes()).count("ldg_const", entry) == 0
