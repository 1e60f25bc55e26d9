"""scalarize_row_cache: a warp's register row cache, filled and written 16 bytes a lane at a time where the row
divides by 4 and the pointers are aligned, goes back to one float a lane per 32 columns; forward finds its sites
by analysis on uncache_row's canonical cache. The vector form is run against the scalar one on the CPU
emulator (tests/transforms/elementwise_emulator.cpp) on aligned, misaligned, ragged and too-long rows."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.skills.materialize import structural_transforms
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

SITE = Anchor("kernel", "function", "row_cache")
# softmax: uncache_row's own golden cache; scaled_rows (written for this test): a per-column gain read plainly
# and an output whose row pitch is an argument, so the flag checks the offset too
CASES = ("softmax", "scaled_rows")


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_row_cache")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_row_cache" / case, which, "kernel")


def changed(state: KernelState, old: str, new: str) -> KernelState:
    assert old in state.source
    return KernelState(source=state.source.replace(old, new), plan=state.plan)


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_row_cache", case)


@pytest.mark.parametrize("case", CASES)
def test_the_vector_form_compiles_without_spills(case, cache):
    compiles_without_spills(golden(case, "before"), cache)


def test_forward_follows_uncache_row_on_a_naive_row_kernel(transform):
    """Naive one thread per row: no cache, no site; a warp per row, then the cache, then the 16-byte fill."""
    naive = load(HERE / "serialize_reduction" / "softmax", "after", "kernel")
    warp = get("serialize_reduction").forward(naive, Anchor("kernel", "function", "row")).state
    assert transform.forward_sites(naive) == transform.forward_sites(warp) == []
    cached = get("uncache_row").forward(warp, Anchor("kernel", "function", "in")).state
    assert transform.forward_sites(cached) == [SITE]
    assert transform.forward(cached, SITE).state.source == golden("softmax", "before").source


def test_the_flag_checks_every_vectorized_pointer_and_an_offset_without_the_bound(transform):
    source = golden("scaled_rows", "before").source
    assert ("const bool row_vec4 = n % 4 == 0 && n <= 32 * 64 && ((reinterpret_cast<unsigned long long>(in) | "
            "reinterpret_cast<unsigned long long>(y) | reinterpret_cast<unsigned long long>(gain)) & 15) == 0 && "
            "((long long)row * pitch) % 4 == 0;") in source
    assert source.count("if (row_vec4) {") == 2 and source.count("} else if (n <= 32 * 64) {") == 2
    softmax = golden("softmax", "before").source  # y's offset has n as a factor: a multiple of 4 already
    assert "% 4 == 0;" not in softmax.replace("& 15) == 0;", "")


def test_rows_no_thread_writes_are_loaded_through_the_read_only_cache(transform):
    """`gain` (a const parameter) and `in` (a const local started at one) go through `__ldg`; a `const_cast` in the
    kernel might write them, so there they are loaded plainly, unless the pass itself read them through `__ldg`."""
    vector = golden("scaled_rows", "before").source
    assert "const float4 cache_r0 = __ldg(reinterpret_cast<const float4*>(&in[cache_j4]));" in vector
    assert "const float4 cache_r1 = __ldg(reinterpret_cast<const float4*>(&gain[cache_j4]));" in vector
    cast = changed(golden("scaled_rows", "after"), "    float total = 0.0f;\n",
                   "    float total = 0.0f;\n    float* writable = const_cast<float*>(gain);\n")
    plain = transform.forward(cast, SITE).state.source
    assert "const float4 cache_r0 = *reinterpret_cast<const float4*>(&in[cache_j4]);" in plain
    assert "const float4 cache_r1 = *reinterpret_cast<const float4*>(&gain[cache_j4]);" in plain
    ldg = transform.forward(changed(cast, "gain[j];", "__ldg(&gain[j]);"), SITE).state.source
    assert "const float4 cache_r1 = __ldg(reinterpret_cast<const float4*>(&gain[cache_j4]));" in ldg


def test_the_bundled_devectorize_cards_lend_it_their_sites():
    """Retrieval by structure: a card of 16-byte vector accesses proposes this transform where a row cache is."""
    from klineage.skills.library import bundled_library, load_library

    cards = [c for c in load_library(bundled_library()).cards if c.transform == "devectorize"]
    assert cards and all("scalarize_row_cache" in {t.name for t in structural_transforms(c)} for c in cards)


@pytest.mark.parametrize("old, new, why", [
    ("* inv * gain[j];", "* inv * gain[j + 1];", r"gain is read or written at \[j \+ 1\]"),
    ("                    y[(long long)row * pitch + j] = row_cache[cache_t] * inv * gain[j];\n",
     "                    if (inv > 0.0f) y[(long long)row * pitch + j] = row_cache[cache_t] * inv * gain[j];\n",
     "writes y other than by one"),
    ("                    y[(long long)row * pitch + j] = row_cache[cache_t] * inv * gain[j];\n",
     "                    y[(long long)row * pitch + j] = row_cache[cache_t] * inv * gain[j];\n"
     "                    y[(long long)row * pitch + j] = 0.0f;\n", "writes y and uses it again"),
    ("total += fabsf(row_cache[cache_t]);", "total += fabsf(row_cache[cache_t]); __syncwarp();", "__syncwarp"),
    ("    const float* in = x + (long long)row * n;\n",
     "    const float* in = x + (long long)row * n;\n    in += 0;\n", "in is not declared, unchanged"),
    ("    float total = 0.0f;\n", "    float total = 0.0f;\n    int cache_q = 0;\n", "already names"),
    ("(long long)row * pitch + j] = row_cache", "(long long)row * total + j] = row_cache",
     "uses total, which is not fixed"),
])
def test_no_site_where_the_vector_layout_would_not_be_exact(transform, old, new, why):
    state = changed(golden("scaled_rows", "after"), old, new)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


# --- on the CPU: the vector form computes what the scalar cache computes ----------------------------------------

SHAPES = (4, 32, 128, 2048, 30, 2052)  # aligned (short, a warp's width, long, the cache's size), ragged, too long


def _inputs(case: str, n: int, pitch: int):
    rows = 5
    g = torch.Generator().manual_seed(n)
    inputs = {"x": torch.randn(rows * n, generator=g)}
    if case == "scaled_rows":
        inputs["gain"] = torch.rand(n, generator=g) + 0.5
        return {"rows": rows, "n": n, "pitch": pitch}, inputs, {"y": (torch.float32, rows * pitch)}
    return {"rows": rows, "n": n}, inputs, {"y": (torch.float32, rows * n)}


def _runs(forms: dict[str, KernelState], case: str, tmp_path, pitch_extra: int):
    binaries = emulate.builds(tmp_path, forms)
    runs = {}
    for n in SHAPES:
        params, inputs, outputs = _inputs(case, n, n + pitch_extra)
        for shift in (0, 1):
            runs[n, shift] = {name: emulate.run(binary, tmp_path / f"{name}-{n}-{shift}", state, params, inputs,
                                                outputs, shift)["y"] for name, (binary, state) in binaries.items()}
    return runs


@pytest.mark.parametrize("case, pitch_extra", [("softmax", 0), ("scaled_rows", 4), ("scaled_rows", 1)])
def test_the_vector_form_computes_the_scalar_caches_values(case, pitch_extra, tmp_path):
    """Aligned rows divisible by 4 take the vector layout (the sums run in another order: equal within float
    rounding); misaligned pointers (shift 1), ragged and too-long rows, and odd rows of an odd pitch take the
    scalar code, bit for bit."""
    runs = _runs({"scalar": golden(case, "after"), "vector": golden(case, "before")}, case, tmp_path, pitch_extra)
    for (n, shift), got in runs.items():
        pitch = n + pitch_extra if case == "scaled_rows" else n
        scalar_rows = [r for r in range(5) if shift or n % 4 or n > 2048 or r * pitch % 4]
        vector, scalar = got["vector"].view(5, pitch), got["scalar"].view(5, pitch)
        assert torch.equal(vector[scalar_rows].view(torch.int32), scalar[scalar_rows].view(torch.int32)), (n, shift)
        torch.testing.assert_close(vector, scalar, rtol=2e-6, atol=1e-7, equal_nan=True, msg=f"{case} n={n}")


def test_the_emulation_sees_the_vector_path_store_its_lanes_in_order(tmp_path):
    """Two components of the stored vector traded: caught on the aligned rows, so those rows ran the vector path."""
    vector = golden("scaled_rows", "before")
    broken = changed(vector, "make_float4(cache_v0[0], cache_v0[1]", "make_float4(cache_v0[1], cache_v0[0]")
    runs = _runs({"scalar": golden("scaled_rows", "after"), "broken": broken}, "scaled_rows", tmp_path, 4)
    wrong = {(n, shift) for (n, shift), got in runs.items()
             if not torch.allclose(got["broken"], got["scalar"], rtol=1e-5, atol=1e-6, equal_nan=True)}
    assert wrong == {(4, 0), (32, 0), (128, 0), (2048, 0)}


def test_uncache_row_leaves_a_vector_filled_cache_to_this_transform_first(transform):
    """Backward, the 16-byte fill comes off first: uncache_row refuses while the vector branches read the cache,
    then takes the scalar cache apart as ever."""
    vector = golden("softmax", "before")
    uncache = get("uncache_row")
    site = Anchor("kernel", "function", "in")
    with pytest.raises(NotApplicable, match="filled 16 bytes a lane at a time"):
        uncache.backward(vector, site)
    scalar = transform.backward(vector, SITE).state
    assert uncache.backward(scalar, site).state.source == load(HERE / "uncache_row" / "softmax", "after",
                                                                 "kernel").source
