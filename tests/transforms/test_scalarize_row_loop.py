"""scalarize_row_loop: a warp's strided loop over a row read in one pass, taken four columns a lane at a time with
16-byte loads and stores where the row divides by 4 and the pointers are aligned, goes back to one column a lane
per 32; forward finds its sites by analysis. On the CPU emulator (tests/transforms/elementwise_emulator.cpp) the
vector form gives the scalar loop's values (a sum: within rounding; an argmax: the same bits, ties and NaNs
included) on aligned, misaligned and ragged rows."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.skills.materialize import structural_transforms
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load
from tests.transforms.test_serialize_reduction import hard_rows

SITE = Anchor("kernel", "function", "row_loop")
# weighted_rows (written for this test): a store and a sum in one pass; argmax: serialize_reduction's warp arg
# reduction, whose loop starts one column in (its first column is the start value)
CASES = ("weighted_rows", "argmax")


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_row_loop")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_row_loop" / case, which, "kernel")


def changed(state: KernelState, old: str, new: str) -> KernelState:
    assert old in state.source
    return KernelState(source=state.source.replace(old, new), plan=state.plan)


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_row_loop", case)


@pytest.mark.parametrize("case", CASES)
def test_the_vector_form_compiles_without_spills(case, cache):
    compiles_without_spills(golden(case, "before"), cache)


def test_a_loop_that_starts_one_column_in_takes_its_first_columns_one_a_lane_then_whole_vectors(transform):
    source = golden("argmax", "before").source
    assert "for (int j = 1 + lane; j < 4 && j < n; j += 32) {" in source
    assert "for (int row_j4 = 4 + 4 * lane; row_j4 < n; row_j4 += 128) {" in source


def test_forward_follows_serialize_reduction_on_a_naive_row_sum(transform):
    naive = load(HERE / "serialize_reduction" / "rowsum", "after", "kernel")
    assert transform.forward_sites(naive) == []
    warp = get("serialize_reduction").forward(naive, Anchor("kernel", "function", "row")).state
    assert transform.forward_sites(warp) == [SITE]
    assert "x[row * n + row_j4]" in transform.forward(warp, SITE).state.source


def test_a_row_read_in_several_passes_is_left_to_the_register_cache(transform):
    """The warp softmax reads its row in three loops: uncache_row's site, not this one's."""
    warp = load(HERE / "uncache_row" / "softmax", "after", "kernel")
    assert get("uncache_row").forward_sites(warp) and transform.forward_sites(warp) == []
    with pytest.raises(NotApplicable, match="read in more than one strided loop"):
        transform.forward(warp, SITE)


def test_the_bundled_devectorize_cards_lend_it_their_sites():
    from klineage.skills.library import bundled_library, load_library

    cards = [c for c in load_library(bundled_library()).cards if c.transform == "devectorize"]
    assert cards and all("scalarize_row_loop" in {t.name for t in structural_transforms(c)} for c in cards)


@pytest.mark.parametrize("old, new, why", [
    ("* w[j];", "* w[j + 1];", r"w is read or written at \[j \+ 1\]"),
    ("        y[(long long)row * n + j] = v;\n", "        if (v > 0.0f) y[(long long)row * n + j] = v;\n",
     "writes y other than by one"),
    ("        acc += v;\n", "        acc += v;\n        acc += y[(long long)row * n + j];\n",
     "writes y and uses it again"),
    ("        acc += v;\n", "        acc += v;\n        __syncwarp();\n", "__syncwarp"),
    ("        acc += v;\n", "        acc += v;\n        w += 0;\n", "assigns w"),
    ("    float acc = 0.0f;\n", "    float acc = 0.0f;\n    int row_k = 0;\n", "already names"),
    ("for (int j = lane; j < n; j += 32)", "for (int j = lane; j < n; j += 16)", "no strided warp loop"),
])
def test_no_site_where_the_vector_walk_would_not_be_exact(transform, old, new, why):
    state = changed(golden("weighted_rows", "after"), old, new)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


# --- on the CPU ------------------------------------------------------------------------------------------------

SHAPES = (4, 36, 256, 30, 70)  # aligned (less than a step, past a warp's step, several steps), ragged


def _runs(forms: dict[str, KernelState], case: str, tmp_path) -> dict[tuple[int, int], dict[str, dict]]:
    binaries = {name: emulate.build(tmp_path / name, state) for name, state in forms.items()}
    runs = {}
    for n in SHAPES:
        x = hard_rows(n, torch.Generator().manual_seed(n)) if case == "argmax" else \
            torch.randn(6, n, generator=torch.Generator().manual_seed(n))
        rows = x.shape[0]
        inputs = {"x": x.flatten(), "w": torch.ones(n) if case == "argmax" else torch.rand(n) + 0.5}
        outputs = {"peak": (torch.float32, rows), "where": (torch.int64, rows)} if case == "argmax" else \
            {"y": (torch.float32, rows * n), "total": (torch.float32, rows)}
        for shift in (0, 1):
            runs[n, shift] = {name: emulate.run(binary, tmp_path / f"{name}-{n}-{shift}", forms[name],
                                                {"rows": rows, "n": n}, inputs, outputs, shift)
                              for name, binary in binaries.items()}
    return runs


def test_the_vector_sum_gives_the_scalar_loops_values_and_its_bits_where_it_is_not_taken(tmp_path):
    runs = _runs({"scalar": golden("weighted_rows", "after"), "vector": golden("weighted_rows", "before")},
                 "weighted_rows", tmp_path)
    for (n, shift), got in runs.items():
        for out in ("y", "total"):
            if shift or n % 4:
                assert torch.equal(got["vector"][out].view(torch.int32), got["scalar"][out].view(torch.int32))
            torch.testing.assert_close(got["vector"][out], got["scalar"][out], rtol=2e-6, atol=1e-6,
                                       msg=f"n={n} shift={shift} {out}")


def test_the_vector_argmax_gives_the_scalar_loops_bits(tmp_path):
    """Each lane still meets its columns in increasing order: ties go to the first column, a NaN start stays."""
    runs = _runs({"scalar": golden("argmax", "after"), "vector": golden("argmax", "before")}, "argmax", tmp_path)
    for (n, shift), got in runs.items():
        assert torch.equal(got["vector"]["where"], got["scalar"]["where"]), (n, shift)
        assert torch.equal(got["vector"]["peak"].view(torch.int32), got["scalar"]["peak"].view(torch.int32))


def test_the_emulation_sees_the_vector_walk_meet_a_lanes_columns_out_of_order(tmp_path):
    """Ties broken toward the later column inside a vector: caught on aligned rows only, so they ran it."""
    broken = changed(golden("argmax", "before"), "for (int row_k = 0; row_k < 4; ++row_k)",
                     "for (int row_k = 3; row_k >= 0; --row_k)")
    runs = _runs({"scalar": golden("argmax", "after"), "broken": broken}, "argmax", tmp_path)
    wrong = {key for key, got in runs.items() if not torch.equal(got["broken"]["where"], got["scalar"]["where"])}
    assert wrong and all(shift == 0 and n % 4 == 0 for n, shift in wrong)
