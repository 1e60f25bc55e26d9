"""A warp's butterfly as people spell it (klineage/transforms/_butterflies.py), read as the warp reductions write it:
every spelling of the full-warp xor butterfly, and a butterfly down whose sum only lane 0 reads. scalarize_row_walk
then vectorizes a hand-written warp-per-row product in any of them. On the CPU emulator the read kernel gives the
written one's bits (lane 0's, for the butterfly down), and a butterfly down whose other lanes store is caught."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._butterflies import butterflies_read
from tests.transforms import emulate
from tests.transforms.golden import HERE, load

WRITTEN = "for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);"
GOLDEN = load(HERE / "scalarize_row_walk" / "dot_rows", "after", "kernel")  # a warp a row, the forwards' butterfly


def spelled(butterfly: str, store: str = "if (lane == 0) y[row] = acc;") -> KernelState:
    assert WRITTEN in GOLDEN.source
    source = GOLDEN.source.replace(WRITTEN, butterfly).replace("if (lane == 0) y[row] = acc;", store)
    return KernelState(source=source, plan=GOLDEN.plan)


SPELLINGS = [
    "for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);",
    "for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xFFFFFFFF, acc, o);",
    "for (int mask = warpSize / 2; mask >= 1; mask = mask / 2) { acc += __shfl_xor_sync(0xffffffffU, acc, mask); }",
    "for (int i = 16; i != 0; i >>= 1) acc = acc + __shfl_xor_sync(0xffffffff, acc, i, 32);",
    "for (unsigned s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s, warpSize);",
    # a butterfly down: only lane 0 stores the sum
    "for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffff, acc, offset);",
]


@pytest.mark.parametrize("butterfly", SPELLINGS)
def test_each_spelling_reads_as_the_forwards_butterfly(butterfly):
    assert butterflies_read(spelled(butterfly)).source == GOLDEN.source


def test_a_butterfly_down_stored_by_lane_0_spelled_inline_reads_too():
    down = SPELLINGS[-1]
    store = "if ((threadIdx.x & 31) == 0) y[row] = acc;"
    assert butterflies_read(spelled(down, store)).source == spelled(WRITTEN, store).source


@pytest.mark.parametrize("butterfly, store", [
    ("for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0x0000ffff, acc, offset);", None),
    ("for (int offset = 8; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);", None),
    ("for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset, 16);", None),
    ("for (int offset = 16; offset > 1; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);", None),
    ("for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o) * o;", None),  # o read otherwise
    # a butterfly down whose sum lanes other than 0 read: theirs differ from the xor butterfly's
    (SPELLINGS[-1], "y[row * 32 + lane] = acc;"),
    (SPELLINGS[-1], "if (lane == 1) y[row] = acc;"),
    (SPELLINGS[-1], "if (lane == 0) y[row] = acc;\n    y[rows + row] = acc;"),
])
def test_what_another_butterfly_computes_stays_as_written(butterfly, store):
    state = spelled(butterfly, *(store,) if store else ())
    assert butterflies_read(state) is state


def test_scalarize_row_walk_vectorizes_each_spelling():
    transform = get("scalarize_row_walk")
    (site,) = transform.forward_sites(GOLDEN)
    expected = transform.forward(GOLDEN, site).state
    for butterfly in SPELLINGS:
        state = spelled(butterfly)
        assert transform.forward_sites(state) == [site], butterfly
        assert transform.forward(state, site).state == expected, butterfly


def test_the_butterfly_down_gives_lane_0_the_xor_butterflys_bits_on_the_cpu(tmp_path):
    """Lane 0's sum is the same bits either way; what lane 1 would store is not (the emulator runs every lane)."""
    down = spelled(SPELLINGS[-1])
    lane_one = spelled(SPELLINGS[-1], "if (lane == 1) y[row] = acc;")
    read_one = spelled(WRITTEN, "if (lane == 1) y[row] = acc;")
    binaries = emulate.builds(tmp_path, {"down": down, "read": butterflies_read(down), "one": lane_one,
                                         "one_read": read_one})
    g = torch.Generator().manual_seed(7)
    differs = False
    for n in (5, 64, 333):
        rows = 9
        inputs = {"x": torch.randn(rows * n, generator=g), "w": torch.randn(n, generator=g)}
        got = {name: emulate.run(binary, tmp_path / f"{name}-{n}", state, {"rows": rows, "n": n}, inputs,
                                 {"y": (torch.float32, rows)})["y"] for name, (binary, state) in binaries.items()}
        assert torch.equal(got["read"].view(torch.int32), got["down"].view(torch.int32)), n
        differs = differs or not torch.equal(got["one"], got["one_read"])
    assert differs
