"""The analysis forwards find their site however a naive kernel is commonly spelled.

tests/transforms/spellings/<family>/ holds one kernel per spelling people write for the same naive form (a row
reduction, an elementwise map, a reduction down columns, a transpose), each with its family's launch: the index
64-bit or unsigned, the guard an early return or a wrapping `if`, a helper `__device__` function, local pointers
into a row, casts on a count or on the grid, a softmax that rescales its output in place, braces, `#pragma unroll`,
a double accumulator, reads through the read-only cache (`__ldg(&x[i])`). Each must be a site of its family's
forwards. Known gaps, not listed here: a grid-stride `while` loop, and a transpose written as a 1-D index split into
row and column.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.kernel import load_kernel
from klineage.transforms import get
from tests.sampled import sampled
from tests.transforms.golden import compiles_without_spills

SPELLINGS = Path(__file__).parent / "spellings"
ROWS = {"serialize_reduction"}
COLUMNS = {"serialize_reduction", "serialize_column_reduction", "unsplit_reduction"}
EXPECTED = {
    "rows": {name: ROWS for name in ("a_wrapped_if", "b_size_t", "c_helper", "d_int64", "e_while", "f_define",
                                     "g_softmax_inf", "h_softmax_flt_max", "j_mean_var", "k_double_acc",
                                     "m_pragma_unroll", "n_ldg")}
    | {"i_matvec": ROWS | {"unsplit_reduction"}, "l_argmax_idx": ROWS | {"unsplit_reduction"}},
    "elementwise": {name: {"scalarize_elementwise", "uncoarsen_grid_stride"}
                    for name in ("a_return_guard", "c_helper", "d_no_restrict", "e_unsigned", "g_int64_n", "h_ldg")}
    | {"b_size_t_stride": {"scalarize_elementwise"}},  # a grid-stride loop is its own coarsened form
    "columns": {name: COLUMNS for name in ("a_if_wrap", "c_size_t", "d_mean", "e_double", "f_ldg")}
    | {"b_pointer_walk": COLUMNS - {"serialize_column_reduction"}},  # a pointer down the column: no 4-lane form
    "transpose": {name: {"untile_transpose"} for name in ("a_2d_if", "c_return", "d_ldg")},
}
ALL = [(family, name) for family, names in EXPECTED.items() for name in names]


def _folders(tmp_path: Path, family: str, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "launch.toml").write_text((SPELLINGS / family / "launch.toml").read_text())
    (folder / "kernel.cu").write_text((SPELLINGS / family / f"{name}.cu").read_text())
    return folder


def test_every_spelling_on_disk_is_listed():
    on_disk = {(f.parent.name, f.stem) for f in SPELLINGS.glob("*/*.cu")}
    assert on_disk == set(ALL)


@pytest.mark.parametrize("family, name", ALL)
def test_each_spelling_is_a_site_of_its_familys_forwards(tmp_path, family, name):
    state = load_kernel(_folders(tmp_path, family, name))
    for transform in sorted(EXPECTED[family][name]):
        (site,) = get(transform).forward_sites(state)
        assert get(transform).forward(state, site).state.source != state.source, transform


@pytest.mark.parametrize("spelling", sampled(ALL, keep=[("rows", "h_softmax_flt_max"), ("columns", "c_size_t"),
                                                        ("transpose", "c_return")]))
def test_each_spellings_forwards_compile(tmp_path, cache, spelling):
    family, name = spelling
    state = load_kernel(_folders(tmp_path, family, name))
    for transform in sorted(EXPECTED[family][name]):
        (site,) = get(transform).forward_sites(state)
        compiles_without_spills(get(transform).forward(state, site).state, cache)
