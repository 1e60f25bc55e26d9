"""launch_bounds: remove `__launch_bounds__(...)` from one kernel; forward restores the same bounds."""

from __future__ import annotations

import pytest

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.feature import Feature
from klineage.features.source import source_features
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["same_line", "own_line", "before_type"]
EXPERTS = ["row_softmax/warp_vec4", "gemm/mma_sync", "conv2d/implicit_gemm"]
PLAN = 'name = "golden"\nproblem = "golden"\n[[launch]]\nentry = "kernel"\ngrid = [1]\nblock = [{block}]\n'


@pytest.fixture(scope="module")
def bounds():
    return get("launch_bounds")


def golden(case: str, which: str):
    return load(HERE / "launch_bounds" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("launch_bounds", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('own_line',)))
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


def test_anchor_carries_the_bounds(bounds):
    (anchor,) = bounds.find(golden("own_line", "before"))
    assert anchor == Anchor("kernel", "function", "launch_bounds(THREADS, MIN_BLOCKS)")
    rewrite = bounds.backward(golden("own_line", "before"), anchor)
    assert rewrite.carrier == {"launch_bounds": ["THREADS", "MIN_BLOCKS"]}
    assert rewrite.removes == ("launch_bounds",)
    assert bounds.find(rewrite.state) == []
    assert [a.key for a in bounds.find(golden("before_type", "before"))] == ["launch_bounds(64)@void"]
    # The arguments travel as written, so forward gives back the same bytes.
    tight = golden("same_line", "before")
    tight = tight.with_source(tight.source.replace("__launch_bounds__(128, 4)", "__launch_bounds__(128,4)"))
    (anchor,) = bounds.find(tight)
    assert anchor.key == "launch_bounds(128,4)"
    rewrite = bounds.backward(tight, anchor)
    assert rewrite.state.source == golden("same_line", "after").source
    assert rewrite.carrier == {"launch_bounds": ["128", "4"]}
    assert bounds.forward(rewrite.state, anchor).state.source == tight.source


def test_big_blocks_are_not_applicable(bounds):
    # Without the bound, up to 255 registers per thread: a 512-thread block might not launch.
    source = golden("same_line", "before").source.replace("__launch_bounds__(128, 4)", "__launch_bounds__(512)")
    state = KernelState(source, LaunchPlan.from_toml(PLAN.format(block=512)))
    with pytest.raises(NotApplicable, match="launched with 512 threads per block"):
        bounds.backward(state, Anchor("kernel", "function", "launch_bounds(512)"))
    by_case = KernelState(source, LaunchPlan.from_toml(PLAN.format(block='"threads"')))
    with pytest.raises(NotApplicable, match="block size `threads` depends on the case"):
        bounds.backward(by_case, Anchor("kernel", "function", "launch_bounds(512)"))
    # A bound of at most 256 threads is safe whatever the plan says: a bigger block never launched.
    small = KernelState(golden("same_line", "before").source, LaunchPlan.from_toml(PLAN.format(block='"threads"')))
    assert bounds.backward(small, bounds.find(small)[0]).state.source == golden("same_line", "after").source


def test_not_applicable_cases(bounds):
    before, after = golden("same_line", "before"), golden("same_line", "after")
    with pytest.raises(NotApplicable, match=r"has __launch_bounds__\(128, 4\), not __launch_bounds__\(256\)"):
        bounds.backward(before, Anchor("kernel", "function", "launch_bounds(256)"))
    with pytest.raises(NotApplicable, match="kernel has no __launch_bounds__"):
        bounds.backward(after, Anchor("kernel", "function", "launch_bounds(128, 4)"))
    with pytest.raises(NotApplicable, match="kernel already has __launch_bounds__"):
        bounds.forward(before, Anchor("kernel", "function", "launch_bounds(128, 4)"))
    with pytest.raises(NotApplicable, match="no __global__ function 'other'"):
        bounds.backward(before, Anchor("other", "function", "launch_bounds(128, 4)"))


@pytest.mark.parametrize("name", EXPERTS)
def test_experts_lose_the_bounds_and_compile_without_spills(name, bounds, cache):
    state = kernel_entry(name).load()
    kernel = state.plan.launches[0].entry
    (anchor,) = bounds.find(state)
    assert anchor.function == kernel
    rewrite = bounds.backward(state, anchor)
    assert not cp.syntax_errors(rewrite.state.source)
    assert Feature(kernel, "launch_bounds") in source_features(state.source)
    assert Feature(kernel, "launch_bounds") not in source_features(rewrite.state.source)
    assert bounds.forward(rewrite.state, anchor).state.source == state.source
    result = compiles_without_spills(rewrite.state, cache)
    assert result.resources_for(kernel).registers <= 255


def test_thousand_thread_topk_keeps_its_bounds(bounds):
    state = kernel_entry("topk/radix_select").load()
    (anchor,) = bounds.find(state)
    with pytest.raises(NotApplicable, match="launched with 1024 threads per block"):
        bounds.backward(state, anchor)
