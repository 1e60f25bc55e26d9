"""What the CPU tests of the fmha mma.sync kernels share (tests/test_corpus_fmha.py for fmha/flash_mma,
tests/test_corpus_fmha_r32.py for fmha/flash_mma_r32): the problem and its kernels; the base of their
index-math models (the XOR swizzle, the P re-packing, the tile count, the epilogue) and the checks of a
model against the PTX ISA's fragment layouts of ldmatrix and mma.m16n8k16, for coverage and for
shared-memory bank conflicts; and the host harness that runs a kernel's own helpers."""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path

from corpus_tools import buffer_names
from cuda_tools import bank_groups, ldmatrix_x4, ptx_a, ptx_b, ptx_c, run_host_harness
from klineage.devices import H200
from klineage.kernel import KernelState, load_kernel
from klineage.problem import load_problem, tolerance_for

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "corpus" / "problems" / "fmha.py"
KERNELS = ROOT / "corpus" / "kernels" / "fmha"


@cache
def problem():
    return load_problem(PROBLEM)


@cache
def kernel(name: str) -> KernelState:
    return load_kernel(KERNELS / name)


def buffers() -> set[str]:
    return buffer_names(problem())


def tolerance():
    return tolerance_for("float16", problem().info.tolerances)


def env_for(state: KernelState, params: dict) -> dict:
    return {**params, **state.constants, **H200.facts()}


# ---------------------------------------------------------------------------------------------
# The index math both kernels share, transcribed from their kernel.cu with its constants
# ---------------------------------------------------------------------------------------------


class FlashModel:
    WARP_M_TILES = 1  # m16 tiles of query rows per warp (flash_mma: one; a kernel's constant overrides it)

    def __init__(self, c: dict):
        self.c = c
        for key, value in c.items():
            setattr(self, key, value)

    def swizzle_offset(self, row: int, chunk: int) -> int:
        return row * self.ROW_BYTES + (chunk ^ (row % self.SWIZZLE_ROWS)) * self.CHUNK_BYTES

    def loader(self, tid: int, i: int) -> tuple[int, int, int]:
        """(tile row, chunk, byte offset) of a thread's copy in pass i of load_tile_async."""
        row, chunk = tid // self.CHUNKS_PER_ROW, tid % self.CHUNKS_PER_ROW
        offset = self.swizzle_offset(row, chunk) + i * self.LOAD_ROWS_PER_PASS * self.ROW_BYTES
        return row + i * self.LOAD_ROWS_PER_PASS, chunk, offset

    @staticmethod
    def pack_p_fragment(s, j: int):
        """s[nt][i] -> the 4 registers (lo, hi) of P's A fragment for k-step j (one m16 tile)."""
        return [(s[2 * j][0], s[2 * j][1]), (s[2 * j][2], s[2 * j][3]),
                (s[2 * j + 1][0], s[2 * j + 1][1]), (s[2 * j + 1][2], s[2 * j + 1][3])]

    def n_tiles(self, q0: int, s: int, causal: bool) -> int:
        last_row_end = min(q0 + self.BLOCK_M, s)
        return ((last_row_end if causal else s) + self.BLOCK_N - 1) // self.BLOCK_N

    def staging_offset(self, warp: int, lane: int, mt: int, dt: int, r: int) -> int:
        row_top = warp * self.WARP_ROWS + mt * self.MMA_M + lane // 4
        return self.swizzle_offset(row_top + r * self.ACC_ROW_HALF, dt) + 4 * (lane % 4)

    def output_chunk(self, warp: int, lane: int, p: int) -> tuple[int, int]:
        ident = p * 32 + lane
        return warp * self.WARP_ROWS + ident // self.CHUNKS_PER_ROW, ident % self.CHUNKS_PER_ROW


def tile_reader(rows: int, m: FlashModel, base: int = 0):
    """Byte address of a 16-byte row read in a swizzled tile at `base` -> the 8 (row, col) stored there."""
    where = {}
    for r in range(rows):
        for c in range(m.CHUNKS_PER_ROW):
            where[base + m.swizzle_offset(r, c)] = [(r, c * m.VEC + e) for e in range(m.VEC)]
    return where.__getitem__


def check_swizzle(m: FlashModel) -> None:
    """The swizzle is a bijection onto each tile (Q and K/V), keeps each row's chunks in that row, and the
    tiles are exactly their rows' bytes."""
    for rows in (m.BLOCK_M, m.BLOCK_N):
        offsets = {m.swizzle_offset(r, c) for r in range(rows) for c in range(m.CHUNKS_PER_ROW)}
        assert offsets == set(range(0, rows * m.ROW_BYTES, m.CHUNK_BYTES))
        for r in range(rows):
            assert {m.swizzle_offset(r, c) // m.ROW_BYTES for c in range(m.CHUNKS_PER_ROW)} == {r}
    assert m.Q_TILE_BYTES == m.BLOCK_M * m.ROW_BYTES and m.KV_TILE_BYTES == m.BLOCK_N * m.ROW_BYTES


def check_loader(m: FlashModel, loader, rows: int, passes: int) -> None:
    """loader(tid, i) -> (tile row, chunk, byte offset) of a thread's copy in pass i: every (row, chunk) of
    a tile of `rows` rows once, at its swizzled offset; each 8 lanes of a pass (a 16-byte access phase)
    read 8 consecutive chunks of one row (coalesced) into 8 different bank groups."""
    seen = Counter()
    for tid in range(m.THREADS):
        for i in range(passes):
            row, chunk, offset = loader(tid, i)
            assert offset == m.swizzle_offset(row, chunk)  # the pass shortcut is exact
            seen[(row, chunk)] += 1
    assert set(seen) == {(r, c) for r in range(rows) for c in range(m.CHUNKS_PER_ROW)}
    assert set(seen.values()) == {1}
    for i in range(passes):
        for start in range(0, m.THREADS, 8):  # 16-byte accesses are served 8 lanes at a time
            copies = [loader(t, i) for t in range(start, start + 8)]
            assert len({row for row, _, _ in copies}) == 1  # one contiguous 128-byte segment
            assert [chunk for _, chunk, _ in copies] == list(range(start % 16, start % 16 + 8))
            assert sorted(bank_groups([offset for _, _, offset in copies])) == list(range(8))


def check_conflict_free(addresses) -> None:
    """The 32 row addresses of an ldmatrix.x4: each 8-row matrix reads 8 different bank groups."""
    for j in range(4):
        assert sorted(bank_groups(addresses[8 * j: 8 * j + 8])) == list(range(8))


def check_q_fragments(m: FlashModel, q_addresses, q_rows) -> None:
    """Through plain ldmatrix at q_addresses(warp, ks, mt) (the 32 lanes' row addresses), every register
    holds the element mma.m16n8k16 expects of Q as the A operand of the warp's m16 tile mt at k-step ks
    (row, d); each warp reads only its own rows, and all of Q is read once."""
    q_cover = Counter()
    for warp in range(m.WARPS):
        mine = Counter()
        for ks in range(m.D_STEPS):
            for mt in range(m.WARP_M_TILES):
                addresses = q_addresses(warp, ks, mt)
                check_conflict_free(addresses)
                regs = ldmatrix_x4(addresses, q_rows)
                for lane in range(32):
                    for i in range(8):
                        r, k = ptx_a(lane, i)
                        got = regs[lane][i // 2][i % 2]
                        assert got == (warp * m.WARP_ROWS + mt * m.MMA_M + r, ks * m.MMA_K + k), (warp, mt, lane, i)
                        mine[got] += 1
        assert {row for row, _ in mine} == set(range(warp * m.WARP_ROWS, (warp + 1) * m.WARP_ROWS))
        q_cover.update(mine)
    assert set(q_cover.values()) == {1} and len(q_cover) == m.BLOCK_M * m.HEAD_DIM


def check_kv_fragments(m: FlashModel, k_addresses, v_addresses, k_rows, v_rows) -> None:
    """K through plain ldmatrix at k_addresses(ks, np_) as the B operand of Q K^T (k = d, n = key), V
    through ldmatrix.trans at v_addresses(j, dp) as the B operand of P V (k = key, n = d): every register
    holds the element mma.m16n8k16 expects (each x4 two n8 tiles), and a warp reads all of K and V once
    per key tile."""
    k_cover, v_cover = Counter(), Counter()
    for ks in range(m.D_STEPS):
        for np_ in range(m.S_TILES // 2):
            addresses = k_addresses(ks, np_)
            check_conflict_free(addresses)
            regs = ldmatrix_x4(addresses, k_rows)
            for half in range(2):
                for lane in range(32):
                    for i in range(4):
                        d, key = ptx_b(lane, i)
                        got = regs[lane][2 * half + i // 2][i % 2]
                        assert got == ((2 * np_ + half) * m.MMA_N + key, ks * m.MMA_K + d), (ks, np_, lane, i)
                        k_cover[got] += 1
    for j_step in range(m.PV_STEPS):
        for dp in range(m.O_TILES // 2):
            addresses = v_addresses(j_step, dp)
            check_conflict_free(addresses)
            regs = ldmatrix_x4(addresses, v_rows, trans=True)
            for half in range(2):
                for lane in range(32):
                    for i in range(4):
                        key, d = ptx_b(lane, i)
                        got = regs[lane][2 * half + i // 2][i % 2]
                        assert got == (j_step * m.MMA_K + key, (2 * dp + half) * m.MMA_N + d), (j_step, dp, lane, i)
                        v_cover[got] += 1
    for cover in (k_cover, v_cover):
        assert set(cover.values()) == {1} and len(cover) == m.BLOCK_N * m.HEAD_DIM


def check_score_repack(m: FlashModel) -> None:
    """For every lane, the (row, key) of score accumulator c_i of n8 tile nt (of one m16 tile), moved by
    pack_p_fragment, is exactly the (row, k) the A operand of P V k-step nt // 2 expects, every
    probability once; and the positions are the ones mask_scores assumes: key 8 nt + 2 (l % 4) + i % 2,
    row + 8 (i / 2)."""
    for lane in range(32):
        s = [[("score", nt, i) for i in range(4)] for nt in range(m.S_TILES)]
        position = {("score", nt, i): (ptx_c(lane, i)[0], nt * m.MMA_N + ptx_c(lane, i)[1])
                    for nt in range(m.S_TILES) for i in range(4)}  # (query row, key in the tile)
        used = Counter()
        for j in range(m.PV_STEPS):
            regs = m.pack_p_fragment(s, j)
            for i in range(8):
                element = regs[i // 2][i % 2]
                row, k = ptx_a(lane, i)
                assert position[element] == (row, j * m.MMA_K + k), (lane, j, i)
                used[element] += 1
        assert set(used.values()) == {1} and len(used) == m.S_TILES * 4
        for i in range(4):
            assert ptx_c(lane, i) == (lane // 4 + m.ACC_ROW_HALF * (i // 2), 2 * (lane % 4) + i % 2)


def check_epilogue(m: FlashModel) -> None:
    """The output staging (in the Q tile): each lane's (lo, hi) accumulator pair lands on its (row, col)
    of the tile, every element once, 32 lanes on 32 banks; the 16-byte read-back of a warp covers
    exactly its own rows (the ones it alone wrote, and alone read Q from), without bank conflicts."""
    q_rows = tile_reader(m.BLOCK_M, m)
    written = Counter()
    for warp in range(m.WARPS):
        for mt in range(m.WARP_M_TILES):
            for dt in range(m.O_TILES):
                for r in range(2):
                    words = []
                    for lane in range(32):
                        offset = m.staging_offset(warp, lane, mt, dt, r)
                        row, col = ptx_c(lane, 2 * r)
                        chunk_at = q_rows(offset - offset % 16)
                        element = chunk_at[(offset % 16) // 2]
                        assert element == (warp * m.WARP_ROWS + mt * m.MMA_M + row, dt * m.MMA_N + col)
                        written[element] += 1
                        words.append(offset // 4)
                    assert len({w % 32 for w in words}) == 32  # 32 lanes, 32 banks
        read = Counter()
        for p in range(m.OUT_PASSES):
            chunks = [m.output_chunk(warp, lane, p) for lane in range(32)]
            for start in range(0, 32, 8):
                phase = chunks[start:start + 8]
                assert len({row for row, _ in phase}) == 1
                assert sorted(bank_groups([m.swizzle_offset(*c) for c in phase])) == list(range(8))
            read.update(chunks)
        assert set(read) == {(warp * m.WARP_ROWS + r, c) for r in range(m.WARP_ROWS) for c in range(m.CHUNKS_PER_ROW)}
        assert set(read.values()) == {1}
    assert set(written.values()) == {1} and len(written) == m.BLOCK_M * m.HEAD_DIM // 2  # one (lo, hi) word each


# ---------------------------------------------------------------------------------------------
# The kernel's own helpers, built for the host by nvcc
# ---------------------------------------------------------------------------------------------

HARNESS_PRELUDE = r"""
#include <cuda_fp16.h>
#include <cstdint>
#include <cstdio>
// The kernel's __device__ helpers become callable from host code. Helpers that use device-only
// intrinsics (asm, shuffles) are never called here; the shuffle is stubbed so they still parse.
#undef __device__
#define __device__ __attribute__((host)) __attribute__((device))
#define __syncthreads() ((void)0)
#define __syncwarp() ((void)0)
#define __shfl_xor_sync(mask, x, offset) (x)
#define __cvta_generic_to_shared(p) ((size_t)0)
#include "KERNEL_CU"
"""


def kernel_helper_tables(work: Path, name: str, main: str) -> dict[str, list[list[int]]]:
    """Build HARNESS_PRELUDE with kernel `name`'s kernel.cu and `main` (which prints `KEY v1 v2 ...` lines)
    for the host, run it, and return its tables."""
    (work / "harness.cu").write_text(HARNESS_PRELUDE.replace("KERNEL_CU", str(KERNELS / name / "kernel.cu")) + main)
    return run_host_harness(work)


def check_swizzle_table(m: FlashModel, tables: dict[str, list[list[int]]]) -> None:
    """The kernel's swizzle_offset, for every (row, chunk) of the Q tile, is the model's."""
    assert len(tables["swizzle"]) == m.BLOCK_M * m.CHUNKS_PER_ROW
    for row, chunk, offset in tables["swizzle"]:
        assert offset == m.swizzle_offset(row, chunk)
