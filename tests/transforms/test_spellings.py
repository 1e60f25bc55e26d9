"""The analysis forwards find their site however a naive kernel is commonly spelled.

tests/transforms/spellings/<family>/ holds one kernel per spelling people write for the same naive form (a row
reduction, an elementwise map, a reduction down columns, a transpose), each with its family's launch: the index
64-bit or unsigned, the guard an early return or a wrapping `if`, a helper `__device__` function, local pointers into
a row, casts on a count or on the grid, a softmax that rescales its output in place, braces, `#pragma unroll`, a
double accumulator, C++'s overloads of the math on floats (`fmax`) and functional casts (`float(20)`), a row of
doubles, the block size written as its number (a template's instance), an index written through a function-like macro
(or a loop headed by one, Caffe's `CUDA_KERNEL_LOOP`), the index read through locals holding the coordinates (`const
int tid = threadIdx.x;`), reads through the read-only cache (`__ldg(&x[i])`), a grid-stride loop as `for` or `while`
(over elements; over rows or columns on a fixed grid, launched by `<name>.toml` beside the spelling), a transpose on
one 1-D index split into a row and a column (its own family: a 1-D launch), a batch of transposes, its matrix from
grid z (its own family: a 3-D grid; the batch's offset a row of rows or a term of its own, 64-bit, or read from
`blockIdx.z` where it is used, as a batch of products may be too), a batch of column
sums (mean pooling, one thread per output of (B, D): its own family; a batch on grid y launched by its
`<name>.toml`), scalar locals before the guard (a threshold, a 64-bit count; a concatenation's row length: its own
family), one thread per pair (a rotary embedding on interleaved pairs: its own family), a loss whose rows each add
their term by one atomic (its own family), running products, exclusive sums and sums from the row's end (its own
family), and matrix products spelled flat on a 1-D launch or summing other functions of the two elements, such as
distances (their own family; a batch's indexes in one declaration, its rows offset inside the row's product,
64-bit indexes and sizes, the index's coordinate cast to int, a row of columns on one thread, a row from a layer
of the grid whose count the kernel may not take, a grid-stride loop over the outputs), and whole reductions to one
value written for one thread (their own family). Each must be a site of its family's forwards; where the CPU
emulator runs the family (elementwise maps, concatenations, pairs and transposes), every forward's kernel computes
the spelling's bits.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from klineage.kernel import KernelState, load_kernel
from klineage.transforms import get
from klineage.transforms.base import with_plan
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import compiles_without_spills

SPELLINGS = Path(__file__).parent / "spellings"
ROWS = {"serialize_reduction"}
COLUMNS = {"serialize_reduction", "serialize_column_reduction", "unsplit_reduction"}
ELEMENTWISE = {"scalarize_elementwise", "uncoarsen_grid_stride"}
EXPECTED = {
    "rows": {name: ROWS for name in ("a_wrapped_if", "b_size_t", "c_helper", "d_int64", "e_while", "f_define",
                                     "g_softmax_inf", "h_softmax_flt_max", "j_mean_var", "k_double_acc",
                                     "m_pragma_unroll", "n_ldg", "r_macro_index",
                                     "t_fmax_overload", "u_double_rows", "v_block_literal", "w_pointer_walk",
                                     "x_local_store_index", "y_argmin_read_back")}
    | {"i_matvec": ROWS | {"unsplit_reduction"}, "l_argmax_idx": ROWS | {"unsplit_reduction"},
       "o_grid_stride": ROWS, "p_while_size_t": ROWS,  # a grid-stride loop over rows, each on a fixed grid
       "q_channels_nchw": ROWS,  # stores strided by a count the guard shows is not zero
       "s_batch_on_grid_y": ROWS},  # a (B, T, D) tensor's rows: the batch on grid y, its row along x
    "elementwise": {name: ELEMENTWISE for name in ("a_return_guard", "c_helper", "d_no_restrict", "e_unsigned",
                                                   "g_int64_n", "h_ldg", "k_local_limit", "l_local_count",
                                                   "m_functional_cast", "n_thread_locals")}
    | {name: {"scalarize_elementwise"}  # a grid-stride loop is its own coarsened form
       for name in ("b_size_t_stride", "i_while_stride", "j_while_size_t", "o_kernel_loop_macro")},
    "columns": {name: COLUMNS for name in ("a_if_wrap", "c_size_t", "d_mean", "e_double", "f_ldg", "i_argmax_int64")}
    | {name: COLUMNS - {"serialize_column_reduction"}  # a pointer down the column: no 4-lane form
       for name in ("b_pointer_walk", "h_pointer_steps")}
    | {"g_grid_stride": COLUMNS - {"unsplit_reduction"}},  # a grid-stride loop over columns: unsplit reads no loop
    "concat": {name: ELEMENTWISE for name in ("a_local_cols", "b_guard_product", "c_split_first", "d_int64_total")},
    "pairs": {name: ELEMENTWISE for name in ("a_if_pairs", "b_return_odd_first", "c_int64_fma", "d_ldg_local")},
    "transpose": {name: {"untile_transpose"} for name in ("a_2d_if", "c_return", "d_ldg", "e_row_pointers")},
    "transpose_flat": {name: {"untile_transpose"} for name in ("a_split", "b_split_2d_read", "c_return_size_t")},
    "transpose_batched": {name: {"untile_transpose"}
                          for name in ("a_row_major", "b_offset_terms", "c_int64_cast", "d_size_t_ldg",
                                       "e_inline_layer")},
    "batched_columns": {name: COLUMNS for name in ("a_return_guard", "b_if_wrap", "c_int64", "d_ldg")}
    | {"e_grid_y": COLUMNS - {"unsplit_reduction"},  # grid y is the batch's: no chunks there
       "f_grid_x_batch": COLUMNS},  # the batch on grid x, the columns' blocks on y: one thread per output on x
    # each row's term of a loss added by one atomic outside the loops; one loop also splits into chunks
    "row_losses": {"a_kl_div": ROWS | {"unsplit_reduction"}, "b_cosine": ROWS | {"unsplit_reduction"},
                   "c_cross_entropy": ROWS},
    "scans": {name: ROWS for name in ("a_cumprod", "b_exclusive", "c_reverse", "d_reverse_exclusive_product",
                                      "e_cummin_reverse")},
    # a whole reduction to one value on one thread (`<<<1, 1>>>`, or the grid's first thread: `<name>.toml`)
    "whole": {name: ROWS | {"unsplit_reduction"} for name in ("a_one_thread", "b_first_of_grid", "c_index_zero",
                                                                "d_double", "e_argmax", "f_others_return")},
    # flat on a 1-D launch (launched by `<name>.toml`), or sums of other functions of the two elements
    "products": {name: {"untile_matmul"} for name in ("a_flat", "b_flat_return", "c_distance_local",
                                                       "d_l1_distance", "e_batched_one_declaration",
                                                       "f_pragma_unroll", "g_offset_locals", "h_batch_pointers",
                                                       "i_nested_guards", "j_named_elements", "k_define_tile",
                                                       "l_flat_total", "m_batch_bounded", "n_inline_layer",
                                                       "o_flat_int_cast", "p_int64_indexes", "q_size_t_row_pointer",
                                                       "r_flat_int64", "s_batched_int64",
                                                       "t_wide_indexes_int_sizes", "u_row_of_columns",
                                                       "v_row_on_grid_layer", "w_grid_stride",
                                                       "x_row_layer_count_unpassed")},
}
ALL = [(family, name) for family, names in EXPECTED.items() for name in names]


def _folders(tmp_path: Path, family: str, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    own = SPELLINGS / family / f"{name}.toml"  # a spelling launched otherwise than its family
    (folder / "launch.toml").write_text((own if own.is_file() else SPELLINGS / family / "launch.toml").read_text())
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
                                                        ("transpose", "c_return"), ("batched_columns", "c_int64"),
                                                        ("transpose_batched", "c_int64_cast"),
                                                        ("columns", "g_grid_stride"), ("row_losses", "b_cosine"),
                                                        ("scans", "d_reverse_exclusive_product"),
                                                        ("products", "b_flat_return"),
                                                        ("products", "e_batched_one_declaration"),
                                                        ("products", "p_int64_indexes"),
                                                        ("rows", "r_macro_index"),
                                                        ("whole", "c_index_zero")]))
def test_each_spellings_forwards_compile(tmp_path, cache, spelling):
    family, name = spelling
    state = load_kernel(_folders(tmp_path, family, name))
    for transform in sorted(EXPECTED[family][name]):
        (site,) = get(transform).forward_sites(state)
        compiles_without_spills(get(transform).forward(state, site).state, cache)


def _copy(rows: int, cols: int) -> tuple[dict, dict, dict]:
    n = rows * cols
    return ({"rows": rows, "cols": cols}, {"x": torch.randn(n, generator=torch.Generator().manual_seed(n))},
            {"y": (torch.float32, n)})


def _batched_copy(batch: int, rows: int, cols: int) -> tuple[dict, dict, dict]:
    n = batch * rows * cols
    return ({"batch": batch, "rows": rows, "cols": cols},
            {"x": torch.randn(n, generator=torch.Generator().manual_seed(n))}, {"y": (torch.float32, n)})


def _map(n: int) -> tuple[dict, dict, dict]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 16  # softplus past 20 too
    return {"n": n}, {"x": x}, {"y": (torch.float32, n)}


def _concat(rows: int, ca: int, cb: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(rows * 100 + ca)
    return ({"rows": rows, "ca": ca, "cb": cb},
            {"a": torch.randn(rows * ca, generator=g), "b": torch.randn(rows * cb, generator=g)},
            {"out": (torch.float32, rows * (ca + cb))})


def _pairs(pairs: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(pairs)
    return ({"pairs": pairs}, {"x": torch.randn(2 * pairs, generator=g), "cos_t": torch.randn(pairs, generator=g),
                               "sin_t": torch.randn(pairs, generator=g)}, {"y": (torch.float32, 2 * pairs)})


# family -> (its sizes, their (params, inputs, outputs)): the families the emulator runs; a size each that the
# forwards' packs and tiles divide and one that leaves a tail
EMULATED = {"elementwise": (((4,), (2053,)), _map), "concat": (((4, 8, 4), (33, 5, 6)), _concat),
            "pairs": (((8,), (1027,)), _pairs), "transpose": (((32, 64), (33, 40)), _copy),
            "transpose_flat": (((32, 64), (33, 40)), _copy),
            "transpose_batched": (((2, 32, 64), (3, 33, 40)), _batched_copy)}


def _as_kernel(state: KernelState) -> KernelState:
    """The state with its entry named `kernel`, the entry the emulator runs."""
    (entry,) = {launch.entry for launch in state.plan.launches}
    launches = tuple(replace(launch, entry="kernel") for launch in state.plan.launches)
    return KernelState(source=re.sub(rf"\b{entry}\b", "kernel", state.source),
                       plan=with_plan(state, launches=launches))


@pytest.mark.parametrize("spelling", sampled([s for s in ALL if s[0] in EMULATED],
                                             # the other families' forms are bit-checked by their transforms' own
                                             # emulator tests (the 1-D and batched transposes, concat, the pairs)
                                             keep=[("elementwise", "j_while_size_t"),
                                                   ("transpose_batched", "e_inline_layer")]))
def test_each_spellings_forwards_compute_its_bits_on_the_cpu(tmp_path, spelling):
    family, name = spelling
    state = _as_kernel(load_kernel(_folders(tmp_path, family, name)))
    forms = {transform: get(transform).forward(state, get(transform).forward_sites(state)[0]).state
             for transform in sorted(EXPECTED[family][name])}
    sizes, inputs = EMULATED[family]
    assert emulate.differences(tmp_path / "emulated", state, forms, sizes, inputs) == []


def _operands(batch: int):
    """inputs_of for a batch of products: A and B hold batch * K * M and batch * K * N elements in either layout."""
    return lambda m, n, k, g: {"A": torch.randn(batch * m * k, generator=g),
                               "B": torch.randn(batch * k * n, generator=g)}


@pytest.mark.parametrize("name", sampled(sorted(EXPECTED["products"]),
                                          # one of each reading by default (the rest under -m slow)
                                          keep=["g_offset_locals", "j_named_elements", "n_inline_layer",
                                                "o_flat_int_cast", "p_int64_indexes", "r_flat_int64",
                                                "u_row_of_columns", "v_row_on_grid_layer", "w_grid_stride",
                                                "x_row_layer_count_unpassed"]))
def test_each_products_tiles_compute_its_bits_on_the_cpu(tmp_path, name):
    """The tiled kernel of each product spelling gives the spelling's own output bits on the CPU emulator, for sizes
    16 does and does not divide (and every matrix of a batch)."""
    state = _as_kernel(load_kernel(_folders(tmp_path, "products", name)))
    (site,) = get("untile_matmul").forward_sites(state)
    tiled = get("untile_matmul").forward(state, site).state
    batch = 3 if len(state.plan.launches[0].grid) == 3 else 1
    emulate.same_product_bits(state, tiled, tmp_path / "emulated", _operands(batch), "C", batch=batch)
