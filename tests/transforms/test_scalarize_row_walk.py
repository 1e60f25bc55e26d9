"""scalarize_row_walk: a warp's walk over a row, four consecutive columns a lane per step as float4 loads where the row
divides by 4 and the pointers are aligned, goes back to one float a lane per 32 columns; forward finds its sites by
analysis on the warp forms `serialize_reduction` and the shuffle cards write. Goldens written for this test: row dot
products against a shared vector (a sum) and a row argmax from column 1 (the first largest column). The vector form
is run against the scalar walk on the CPU emulator on aligned, misaligned and ragged rows."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

SITE = Anchor("kernel", "loop", "walk:j#0")
CASES = ("dot_rows", "argmax_rows")


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_row_walk")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_row_walk" / case, which, "kernel")


def changed(state: KernelState, old: str, new: str) -> KernelState:
    assert old in state.source
    return KernelState(source=state.source.replace(old, new), plan=state.plan)


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_row_walk", case)


def test_the_vector_walk_compiles_to_128_bit_loads_without_spills(cache):
    from tests.cuda_tools import feature_counts

    counts = feature_counts(compiles_without_spills(golden("argmax_rows", "before"), cache))
    assert counts.get("ldg_128", 0) >= 1, counts


def test_the_walk_serialize_reduction_writes_is_a_site(transform):
    """A thread per row has no walk; the warp per row serialize_reduction gives it one, and this forward vectorizes
    it."""
    naive = load(HERE / "serialize_reduction" / "rowsum", "after", "kernel")
    assert transform.forward_sites(naive) == []
    warp = get("serialize_reduction").forward(naive, get("serialize_reduction").forward_sites(naive)[0]).state
    (site,) = transform.forward_sites(warp)
    assert "float4" in transform.forward(warp, site).state.source


def test_the_checks_cover_every_vectorized_pointer_and_the_row_length(transform):
    dot, argmax = golden("dot_rows", "before").source, golden("argmax_rows", "before").source
    assert ("if (n % 4 == 0 && ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(w)) "
            "& 15) == 0) {") in dot
    assert "if (w_j4 + w_k < 1) continue;" in argmax and "if (w_j4 + w_k <" not in dot


@pytest.mark.parametrize("case, old, new, why", [
    ("dot_rows", "acc += x[(long long)row * n + j] * w[j];", "acc += x[(long long)row * n + j] * w[j + 1];",
     r"w is read or written at \[j \+ 1\]"),
    ("dot_rows", "acc += x[(long long)row * n + j] * w[j];", "acc = x[(long long)row * n + j] * w[j];",
     "not a reduction"),  # the last column a lane saw: which lane takes a column would show
    ("dot_rows", "acc += x[(long long)row * n + j] * w[j];",
     "acc += x[(long long)row * n + j] * w[j];\n        y[j] = acc;", "running sum"),
    ("dot_rows", "acc += x[(long long)row * n + j] * w[j];",
     "acc += x[(long long)row * n + j] * w[j];\n        y[(long long)row * n + j] = 0.0f;", "y is written"),
    ("dot_rows", "acc += __shfl_xor_sync(0xffffffffu, acc, offset);", "acc += 0.0f;",
     "acc not combined across the warp"),  # a lane's own partial sum, written as it is
    ("dot_rows", "for (int offset = 16;", "acc *= 2.0f;\n    for (int offset = 16;", "acc not combined"),
    ("dot_rows", "const int lane = threadIdx.x % 32;", "const int lane = threadIdx.x % 16;", "no walk of a lane"),
    ("argmax_rows", "for (int j = 1 + lane;", "for (int j = lane + lane;", "no walk of a lane"),  # 2 lanes a column
    ("dot_rows", "float acc = 0.0f;", "float acc = 0.0f;\n    int w_k = 0;", "names w_"),
    ("argmax_rows", "const long long pair_index = __shfl_xor_sync(0xffffffffu, at, offset);",
     "const long long pair_index = at;", "at not combined"),
])
def test_no_site_where_the_lanes_columns_would_show(transform, case, old, new, why):
    state = changed(golden(case, "after"), old, new)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


# --- on the CPU: the vector walk computes what the scalar walk computes -------------------------------------------

SHAPES = (4, 128, 2048, 30, 129)  # aligned (a lane's one step, a warp's width of vectors, long), ragged


def _inputs(case: str, n: int):
    g = torch.Generator().manual_seed(n)
    if case == "argmax_rows":
        x = emulate.hard_rows(n, g)
        rows = x.shape[0]
        return ({"rows": rows, "n": n}, {"x": x.reshape(-1)},
                {"value": (torch.float32, rows), "index": (torch.int64, rows)})
    rows = 5
    return ({"rows": rows, "n": n}, {"x": torch.randn(rows * n, generator=g), "w": torch.randn(n, generator=g)},
            {"y": (torch.float32, rows)})


def _runs(forms: dict[str, KernelState], case: str, tmp_path):
    binaries = emulate.builds(tmp_path, forms)
    runs = {}
    for n in SHAPES:
        params, inputs, outputs = _inputs(case, n)
        for shift in (0, 1):
            runs[n, shift] = {name: emulate.run(binary, tmp_path / f"{name}-{n}-{shift}", state, params, inputs,
                                                outputs, shift) for name, (binary, state) in binaries.items()}
    return runs


def test_the_vector_argmax_gives_the_scalar_walks_bits_on_hard_rows(tmp_path):
    """Ties within and across lanes, NaNs, infinities, signed zeros: the first largest column, bit for bit."""
    runs = _runs({"scalar": golden("argmax_rows", "after"), "vector": golden("argmax_rows", "before")},
                 "argmax_rows", tmp_path)
    for key, got in runs.items():
        assert torch.equal(got["vector"]["index"], got["scalar"]["index"]), key
        assert torch.equal(got["vector"]["value"].view(torch.int32), got["scalar"]["value"].view(torch.int32)), key


def test_the_vector_sum_agrees_and_the_emulation_runs_the_vector_path(tmp_path):
    """Aligned rows divisible by 4 take the vector walk (the sum in another order: equal within float rounding),
    the others the scalar walk, bit for bit; a vector walk that drops a component is caught on exactly the rows
    that take it."""
    broken = changed(golden("dot_rows", "before"), "acc += w_v0[w_k] * w_v1[w_k];",
                     "if (w_k < 3) acc += w_v0[w_k] * w_v1[w_k];")
    runs = _runs({"scalar": golden("dot_rows", "after"), "vector": golden("dot_rows", "before"), "broken": broken},
                 "dot_rows", tmp_path)
    wrong = set()
    for (n, shift), got in runs.items():
        scalar, vector = got["scalar"]["y"], got["vector"]["y"]
        if shift or n % 4:
            assert torch.equal(vector.view(torch.int32), scalar.view(torch.int32)), (n, shift)
        torch.testing.assert_close(vector, scalar, rtol=1e-5, atol=1e-5, msg=f"n={n} shift={shift}")
        if not torch.allclose(got["broken"]["y"], scalar, rtol=1e-3, atol=1e-3):
            wrong.add((n, shift))
    assert wrong == {(4, 0), (128, 0), (2048, 0)}


def test_no_card_proposes_it_until_a_walk_measures_it():
    """The 16-byte vector cards lend scalarize_row_cache their sites but not this walk (`lent = False`): taken first
    in their path it would leave uncache_row, whose cache they measured far ahead, no site."""
    from klineage.skills.library import bundled_library, load_library
    from klineage.skills.materialize import structural_transforms

    cards = [c for c in load_library(bundled_library()).cards if c.transform == "devectorize"]
    lent = [{t.name for t in structural_transforms(c)} for c in cards]
    assert cards and all("scalarize_row_cache" in names and "scalarize_row_walk" not in names for names in lent)


def test_no_site_where_the_launch_is_not_whole_warps_or_passes_a_buffer_twice(transform):
    """The lane is a lane of a whole warp only in blocks of whole warps; a buffer passed twice may be written
    through another pointer while the walk reads it through the read-only cache."""
    state = golden("dot_rows", "after")
    plan = (HERE / "scalarize_row_walk" / "dot_rows" / "after.toml").read_text()
    for old, new, why in [("block = [128]", "block = [48]", "no multiple of 32"),
                          ('args = ["x", "w", "y"', 'args = ["x", "x", "y"', "passes one buffer twice")]:
        assert old in plan
        bad = KernelState(source=state.source, plan=LaunchPlan.from_toml(plan.replace(old, new)))
        assert transform.forward_sites(bad) == []
        with pytest.raises(NotApplicable, match=why):
            transform.forward(bad, SITE)
