"""Reads through the read-only cache (klineage/transforms/_readonly.py `plain_reads`): the analysis forwards that read
a kernel's subscripts (elementwise packs, row gathers, transpose tiles) read `__ldg(&a[k])` as `a[k]`, so a kernel
its author (or the `ldg_subscript` forward) wrote with `__ldg` is still their site, and they write the kernel they
write from the plain one."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._readonly import plain_reads
from tests.transforms.golden import plan_of

PLAN = plan_of('"t", "idx", "y", { scalar = "n", type = "i32" }')


def _kernel(body: str) -> KernelState:
    return KernelState(source="__global__ void kernel(const float* __restrict__ t, const int* __restrict__ idx, "
                              f"float* __restrict__ y, int n) {{\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                              f"    if (i < n) {body}\n}}\n", plan=PLAN)


@pytest.mark.parametrize("spelled, plain", [
    ("y[i] = __ldg(&t[i]) * 2.0f;", "y[i] = t[i] * 2.0f;"),
    ("y[i] = __ldg(&(t[i])) + __ldg( &t[i] );", "y[i] = t[i] + t[i];"),
    ("y[i] = __ldg(&t[__ldg(&idx[i])]);", "y[i] = t[idx[i]];"),  # a gather: the inner read on a later pass
])
def test_each_read_through_the_cache_becomes_the_plain_read(spelled, plain):
    assert plain_reads(_kernel(spelled)).source == _kernel(plain).source


@pytest.mark.parametrize("kept", ["y[i] = __ldg(t + i);", "y[i] = __ldg(&t[i] + 1);", "y[i] = t[i];"])
def test_other_spellings_are_left_as_written(kept):
    state = _kernel(kept)
    assert plain_reads(state) is state


BIAS_PLAN = plan_of('"x", "b", "y", { scalar = "n", type = "i32" }, { scalar = "cols", type = "i32" }')


def _bias(body: str) -> KernelState:
    return KernelState(source="__global__ void kernel(const float* __restrict__ x, const float* __restrict__ b, "
                              "float* __restrict__ y, int n, int cols) {\n"
                              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                              f"    if (i < n) y[i] = {body};\n}}\n", plan=BIAS_PLAN)


@pytest.mark.parametrize("transform", ["scalarize_elementwise", "scalarize_row_gather"])
def test_the_forward_of_a_cached_read_is_the_forward_of_the_plain_read(transform):
    cached, plain = _bias("__ldg(&x[i]) + __ldg(&b[i % cols])"), _bias("x[i] + b[i % cols]")
    forward = get(transform)
    (site,) = forward.forward_sites(plain)
    assert forward.forward_sites(cached) == [site]
    assert forward.forward(cached, site).state == forward.forward(plain, site).state
