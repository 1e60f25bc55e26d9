"""uncache_row: a row a warp keeps in registers across its passes (when it fits; the passes as they were
otherwise) is read from memory in every pass; forward finds its sites by analysis on warp-per-row kernels."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

SITE = Anchor("kernel", "function", "in")


@pytest.fixture(scope="module")
def transform():
    return get("uncache_row")


def golden(which: str) -> KernelState:
    return load(HERE / "uncache_row" / "softmax", which, "kernel")


def test_golden():
    check_golden("uncache_row", "softmax")


def test_golden_kernels_compile(cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(which), cache)


def test_forward_follows_serialize_reduction_on_a_naive_softmax(transform):
    """The naive one-thread-per-row softmax has no site; a warp per row first, then the row cache."""
    naive = load(HERE / "serialize_reduction" / "softmax", "after", "kernel")
    assert transform.forward_sites(naive) == []
    warp = get("serialize_reduction").forward(naive, Anchor("kernel", "function", "row")).state
    assert transform.forward_sites(warp) == [SITE]
    cached = transform.forward(warp, SITE).state
    assert cached.source.count("row_cache[cache_t] = in[j];") == 1
    assert cached.source.count("if (n <= 32 * 64) {") == 3


@pytest.mark.parametrize("edit, why", [
    (("    const float* in = x + (long long)row * n;\n",
      "    const float* in = x + (long long)row * n;\n    in += 0;\n"), "moves in"),
    (("expf(in[j] - m) / s", "expf(in[j + 1] - m) / s"), "other than as in"),
    (("    float s = 0.0f;\n", "    float s = 0.0f;\n    if (m > 0.0f)\n"), "not in one block"),
])
def test_no_site_where_it_would_not_be_legal(transform, edit, why):
    state = golden("after")
    assert edit[0] in state.source
    changed = KernelState(source=state.source.replace(edit[0], edit[1]), plan=state.plan)
    assert transform.forward_sites(changed) == [] or why == "not in one block" and all(
        a.key != "in" for a in transform.forward_sites(changed))
    with pytest.raises(NotApplicable, match=why):
        transform.forward(changed, SITE)
