"""fmha/flash_mma_r32 (flash attention on mma.sync with 32 query rows, two m16 tiles, per warp), checked
without a GPU.

- The plan resolves for every case of the problem on an H200 (D = 128 everywhere) with the shared memory
  and threads that let two CTAs share an SM; a head dimension outside the domain is refused.
- The kernel passes the static check and compiles for sm_90 (and sm_90a) as the gate builds it: no
  spill, no stack, no warning, at most 255 registers, enough of them for the 128 output and 64 score
  accumulators. Its SASS has exactly the MMAs, ldmatrix (plain and transposed) and cp.async the
  unrolled loops issue; per key tile and 128 query rows it reads 320 ldmatrix.x4 from shared memory
  where fmha/flash_mma reads 512, for the same 1024 MMAs (each K and V fragment feeds two).
- A model of the index math (XOR swizzle, the Q and the K/V loaders with their unchecked and checked
  paths, per-lane fragment bases moved by an immediate and one XOR, the score accumulator -> P
  A-operand re-packing, the epilogue) is checked against the PTX ISA's fragment layouts for ldmatrix
  and mma.m16n8k16, for coverage and for shared-memory bank conflicts; the XOR needs tile bases at
  multiples of 256 bytes, and the model shows it. The kernel's own helpers, built for the host by nvcc,
  agree with the model.
- Masks: the per-row bound (mask_bound) is, key for key, "past S or (causal) after the row"; the
  warp-level decisions (mask this tile, skip this tile) are exactly right on every tile of every
  warp, so skipped tiles hold only masked keys and unmasked tiles none.
- The kernel source itself runs on the CPU (tests/fmha_mma_emulator.cpp: each CUDA thread a fiber,
  ldmatrix / mma.sync / cp.async / shuffles emulated per the PTX ISA, the plan's launch as resolved,
  guarded buffers, NaN-filled shared memory) on ragged, causal and ragged-causal shapes: the output
  passes the problem's reference, agrees with fmha/flash_mma's source run the same way, and is the
  same bit for bit under schedules that interleave or skew threads and warps and land cp.async early
  or late. A shared window that is not 256-byte aligned breaks it (and not flash_mma). The emulator
  catches the bugs it is there for (a missing barrier, wait or __syncwarp, a prefetch into the stage
  being read, an off-by-one mask bound, causal skip or loader fast path).
"""

from __future__ import annotations

import math
import re
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from corpus_tools import SMEM_LIMIT
from cuda_tools import build_mma_emulator, ptx_helper_bodies, run_mma_emulator, sass_opcodes
from fmha_tools import (
    KERNELS,
    ROOT,
    FlashModel,
    buffers,
    check_epilogue,
    check_kv_fragments,
    check_loader,
    check_q_fragments,
    check_score_repack,
    check_swizzle,
    check_swizzle_table,
    env_for,
    kernel_helper_tables,
    problem,
    tile_reader,
    tolerance,
)
from fmha_tools import kernel as fmha_kernel
from klineage.features.sass import sass_features
from klineage.gate.compile import CompileResult, compile_kernel
from klineage.gate.correctness import compare
from klineage.kernel import KernelState
from klineage.launch import resolve
from sampled import sampled
from shared_cache import share

NAME = "flash_mma_r32"
ENTRY = "fmha_flash_mma_r32"
BASELINE = "flash_mma"
EMULATOR = Path(__file__).resolve().parent / "fmha_mma_emulator.cpp"
SM_SHARED = 233472   # bytes of shared memory per SM on sm_90 (228 KiB)
RESERVED_SHARED = 1024  # per CTA, reserved by the system on sm_80 and later
SM_REGISTERS = 65536


def kernel(name: str = NAME) -> KernelState:
    return fmha_kernel(name)


@cache
def constants() -> dict:
    return kernel().constants


# ---------------------------------------------------------------------------------------------
# Plan, domain, constants
# ---------------------------------------------------------------------------------------------


def test_plan_resolves_for_every_case():
    state, c = kernel(), constants()
    assert state.plan.problem == "fmha" and state.plan.arch == "sm_90"
    assert [launch.entry for launch in state.plan.launches] == [ENTRY]
    assert "HEAD_DIM = 128" in state.plan.supports_reason
    for case in problem().info.cases:
        p = case.params
        assert state.plan.supports_case(p, c), case.name
        (launch,) = resolve(state.plan, env_for(state, p), buffers())
        assert [a[1] for a in launch.args] == ["q", "k", "v", "o", p["S"], p["causal"]]
        assert launch.grid == (math.ceil(p["S"] / c["BLOCK_M"]), p["B"] * p["H"], 1)
        assert launch.block == (c["THREADS"], 1, 1) == (128, 1, 1)
        assert launch.shared == c["SMEM_BYTES"] == (c["BLOCK_M"] + 2 * c["STAGES"] * c["BLOCK_N"]) * c["HEAD_DIM"] * 2
        assert launch.shared <= SMEM_LIMIT


def test_domain_is_the_head_dimension():
    plan, c = kernel().plan, constants()
    case = dict(problem().info.case("small").params)
    assert plan.supports_case(case, c)
    assert not plan.supports_case({**case, "D": 64}, c) and not plan.supports_case({**case, "D": 256}, c)
    assert plan.supports == kernel(BASELINE).plan.supports  # the same domain as flash_mma


def test_mechanism_constants():
    c = constants()
    assert (c["BLOCK_M"], c["BLOCK_N"], c["HEAD_DIM"], c["WARPS"], c["STAGES"]) == (128, 64, 128, 4, 2)
    assert c["WARP_ROWS"] == 32 and c["WARP_M_TILES"] == 2 and c["WARP_ROWS"] == c["WARP_M_TILES"] * c["MMA_M"]
    assert (c["D_STEPS"], c["S_TILES"], c["PV_STEPS"], c["O_TILES"]) == (8, 8, 4, 16)
    assert c["LOAD_ROWS_PER_PASS"] == 8 and (c["Q_LOADS"], c["KV_LOADS"]) == (16, 8)
    assert c["OUT_PASSES"] == 16 and c["SMEM_BYTES"] == 96 * 1024
    assert (c["PAIR_BYTES"], c["ROW_BLOCK_BYTES"], c["TILE_ALIGN"]) == (32, 4096, 256)
    # The same tiles as flash_mma over the CTA, half the warps.
    base = kernel(BASELINE).constants
    assert (base["BLOCK_M"], base["BLOCK_N"], base["STAGES"], base["WARPS"]) == (128, 64, 2, 8)
    assert c["SCALE_LOG2"] == pytest.approx(1.4426950408889634 / math.sqrt(128), rel=1e-7)


def test_static_check():
    from klineage.gate.static import static_check

    report = static_check(kernel())
    assert report.ok, report.to_dict()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, shared_cache) -> dict[str, CompileResult]:
    cache_dir = share(tmp_path_factory.mktemp("fmha-r32-compile"), shared_cache)  # the run's compiles
    return {name: compile_kernel(kernel(name), cache_dir=cache_dir) for name in (NAME, BASELINE)}


def test_compiles_without_spills_and_two_ctas_fit_an_sm(compiled):
    result = compiled[NAME]
    assert result.ok, result.log
    assert "warning" not in result.log.lower()
    assert "-Xptxas=-O1" in kernel().plan.nvcc_flags  # see the kernel's header comment, "Registers"
    c = constants()
    for arch in result.targets:
        res = result.resources_for(ENTRY, arch)
        assert not res.spills and res.stack_bytes == 0, res
        assert res.shared_bytes == 0 and res.registers <= 255
        # 128 O and 64 S accumulators, 4 row maxima and 4 row sums live in registers.
        assert res.registers >= 128 + 64 + 8
        # Two CTAs per SM: registers (allocated per warp in units of 256) and shared memory.
        per_warp = -(-res.registers * 32 // 256) * 256
        assert 2 * c["WARPS"] * per_warp <= SM_REGISTERS
        assert 2 * (c["SMEM_BYTES"] + RESERVED_SHARED) <= SM_SHARED


def test_sass_has_every_mechanism_in_the_counts_the_loops_unroll_to(compiled):
    c = constants()
    for arch in compiled[NAME].targets:
        ops = sass_opcodes(compiled[NAME], arch)
        mt = c["WARP_M_TILES"]
        # Per key tile: Q K^T and P V for each of the warp's m16 tiles.
        assert ops["HMMA.16816.F32"] == mt * (c["D_STEPS"] * c["S_TILES"] + c["PV_STEPS"] * c["O_TILES"]) == 256
        # ldmatrix: per k-step, the Q fragments of each m16 tile and one x4 per pair of n8 key tiles;
        # V transposed, one x4 per pair of d tiles and k-step of P V. Nothing of Q before the loop.
        assert ops["LDSM.16.M88.4"] == c["D_STEPS"] * (mt + c["S_TILES"] // 2) == 48
        assert ops["LDSM.16.MT88.4"] == c["PV_STEPS"] * c["O_TILES"] // 2 == 32
        # cp.async: Q once; K and V (two per row) on the unchecked and the checked path, in the
        # prologue (STAGES - 1 tiles, unrolled) and in the loop.
        assert ops["LDGSTS.E.BYPASS.128"] == c["Q_LOADS"] + 2 * 2 * c["KV_LOADS"] * c["STAGES"]
        assert ops["MUFU.EX2"] >= mt * 2 * (2 * c["S_TILES"] + 1)  # an ex2 per probability and per alpha
        assert ops["SHFL.BFLY"] >= mt * 2 * 4  # quad max and quad sum of each row
        assert ops["BAR.SYNC.DEFER_BLOCKING"] == 1  # one barrier per key tile
        assert ops["STG.E.128"] == c["OUT_PASSES"] and ops["LDS.128"] == c["OUT_PASSES"]
        for op in ops:
            assert not op.startswith(("LDL", "STL")), op  # no spills
            assert not op.startswith("LDG."), op  # global memory is read through cp.async only
        features = sass_features(compiled[NAME].cubin_bytes(arch))
        assert features.count("hmma") == 256 and features.count("ldsm") == 80 and features.count("ldl") == 0


def test_shared_memory_reads_per_mma_fall_from_flash_mma(compiled):
    """Per key tile and 128 query rows (one CTA of each), the loop's ldmatrix.x4 count over its MMA count:
    flash_mma 8 warps x 64 (K and V) for 1024 MMAs, flash_mma_r32 4 warps x 80 (Q, K and V) for 1024."""
    c, base = constants(), kernel(BASELINE).constants
    ours, theirs = sass_opcodes(compiled[NAME], "sm_90"), sass_opcodes(compiled[BASELINE], "sm_90")
    their_q = base["D_STEPS"]  # flash_mma's Q fragments are loaded once, before the loop
    their_loop_ldsm = theirs["LDSM.16.M88.4"] - their_q + theirs["LDSM.16.MT88.4"]
    our_loop_ldsm = ours["LDSM.16.M88.4"] + ours["LDSM.16.MT88.4"]
    assert (base["WARPS"] * their_loop_ldsm, c["WARPS"] * our_loop_ldsm) == (512, 320)
    assert base["WARPS"] * theirs["HMMA.16816.F32"] == c["WARPS"] * ours["HMMA.16816.F32"] == 1024
    # Each x4 load of K or V holds two n8 B fragments, and each feeds WARP_M_TILES MMAs (flash_mma: one).
    our_kv = ours["LDSM.16.M88.4"] - c["D_STEPS"] * c["WARP_M_TILES"] + ours["LDSM.16.MT88.4"]
    their_kv = their_loop_ldsm
    assert ours["HMMA.16816.F32"] == 2 * c["WARP_M_TILES"] * our_kv and theirs["HMMA.16816.F32"] == 2 * their_kv


# ---------------------------------------------------------------------------------------------
# A model of flash_mma_r32's index helpers, transcribed from kernel.cu with its constants
# ---------------------------------------------------------------------------------------------


class Model(FlashModel):

    def kv_loader(self, tid: int, i: int, row0: int, s_len: int) -> list[tuple[int, int, int | None]]:
        """load_kv_tile_async for thread tid, pass i of the tile at key row0: [(stage offset, element
        offset in the head it reads or None for a zero fill, path)] for its K copy and its V copy."""
        row, chunk = tid // self.CHUNKS_PER_ROW, tid % self.CHUNKS_PER_ROW
        dst = self.swizzle_offset(row, chunk)
        first = (row0 + row) * self.HEAD_DIM + chunk * self.VEC
        rows_left = s_len - row0 - row
        to = dst + i * self.LOAD_ROWS_PER_PASS * self.ROW_BYTES
        at = first + i * self.LOAD_ROWS_PER_PASS * self.HEAD_DIM
        if (self.KV_LOADS - 1) * self.LOAD_ROWS_PER_PASS < rows_left:  # unchecked path
            return [(to, at, "full"), (to + self.KV_TILE_BYTES, at, "full")]
        ok = i * self.LOAD_ROWS_PER_PASS < rows_left
        return [(to, at if ok else None, "checked"), (to + self.KV_TILE_BYTES, at if ok else None, "checked")]

    def fragment_address(self, lane_address: int, pair: int, block: int) -> int:
        return (lane_address ^ (pair * self.PAIR_BYTES)) + block * self.ROW_BLOCK_BYTES

    def q_lane_offset(self, warp: int, lane: int) -> int:
        return self.swizzle_offset(warp * self.WARP_ROWS + lane % 16, lane // 16)

    def k_lane_offset(self, lane: int) -> int:
        return self.swizzle_offset(lane % 8 + 8 * (lane // 16), (lane // 8) % 2)

    def v_lane_offset(self, lane: int) -> int:
        return self.swizzle_offset(lane % 8 + 8 * ((lane // 8) % 2), lane // 16)

    # What each fragment load must address: the row and chunk the layouts ask for (as flash_mma does).
    def q_intended(self, warp: int, lane: int, mt: int, ks: int) -> int:
        return self.swizzle_offset(warp * self.WARP_ROWS + mt * self.MMA_M + lane % 16, 2 * ks + lane // 16)

    def k_intended(self, lane: int, ks: int, np_: int) -> int:
        return self.swizzle_offset(2 * self.MMA_N * np_ + lane % 8 + 8 * (lane // 16), 2 * ks + (lane // 8) % 2)

    def v_intended(self, lane: int, j: int, dp: int) -> int:
        return self.swizzle_offset(self.MMA_K * j + lane % 8 + 8 * ((lane // 8) % 2), 2 * dp + lane // 16)

    def warp_skips(self, key0: int, warp_row0: int, causal: bool) -> bool:
        return causal and key0 > warp_row0 + self.WARP_ROWS - 1

    def warp_masks(self, key0: int, warp_row0: int, s: int, causal: bool) -> bool:
        return key0 + self.BLOCK_N > s or (causal and key0 + self.BLOCK_N - 1 > warp_row0)

    @staticmethod
    def mask_bound(key0: int, row: int, s: int, causal: bool, lane: int) -> int:
        col_end = min(s - key0, row - key0 + 1) if causal else s - key0
        return col_end - 2 * (lane % 4)


@cache
def model() -> Model:
    return Model(constants())


def test_swizzle_is_a_bijection_per_tile():
    m = model()
    check_swizzle(m)
    assert m.SMEM_BYTES == m.Q_TILE_BYTES + m.STAGES * 2 * m.KV_TILE_BYTES


def test_q_loader_covers_the_tile_once_and_is_coalesced_and_conflict_free():
    m = model()
    check_loader(m, m.loader, m.BLOCK_M, m.Q_LOADS)


@pytest.mark.parametrize("s_len", [64, 100, 128, 250, 1000, 2048])
def test_kv_loader_copies_every_row_below_s_and_zero_fills_the_rest(s_len):
    """Both paths of load_kv_tile_async: every (row, chunk) of the K and the V tile written once, from
    row0 + row of the head when that row is below S, zeros (src-size 0) otherwise; the unchecked path
    is taken only by threads whose every row is below S, and by all of them in a full tile."""
    m = model()
    for row0 in range(0, s_len, m.BLOCK_N):
        written = {}
        paths = set()
        for tid in range(m.THREADS):
            for i in range(m.KV_LOADS):
                for which, (to, at, path) in zip("kv", m.kv_loader(tid, i, row0, s_len)):
                    paths.add(path)
                    tile_offset = to - (m.KV_TILE_BYTES if which == "v" else 0)
                    assert 0 <= tile_offset < m.KV_TILE_BYTES
                    assert (which, tile_offset) not in written
                    row, chunk = divmod(tile_offset, m.ROW_BYTES)
                    chunk = (chunk // m.CHUNK_BYTES) ^ (row % m.SWIZZLE_ROWS)  # undo the swizzle
                    want = (row0 + row) * m.HEAD_DIM + chunk * m.VEC if row0 + row < s_len else None
                    assert at == want, (row0, tid, i, which)
                    written[(which, tile_offset)] = at
        assert len(written) == 2 * m.KV_TILE_BYTES // m.CHUNK_BYTES
        assert paths == ({"full"} if row0 + m.BLOCK_N <= s_len else {"checked"} | ({"full"} & paths))


def test_fragments_match_the_ptx_layouts_and_are_conflict_free():
    """Through the swizzle, fragment_address and ldmatrix (plain for Q and K, .trans for V), every register
    holds the element mma.m16n8k16 expects: Q as the A operand of each m16 tile (row, d), K as the B
    operand of Q K^T (k = d, n = key), V as the B operand of P V (k = key, n = d). Each warp reads only
    its own 32 rows of Q, and all of K and V once per key tile."""
    m = model()
    q_base, k_base = 1024, 1024 + m.Q_TILE_BYTES + m.STAGE_BYTES  # the second stage
    v_base = k_base + m.KV_TILE_BYTES
    q_rows, k_rows, v_rows = tile_reader(m.BLOCK_M, m, q_base), tile_reader(m.BLOCK_N, m, k_base), \
        tile_reader(m.BLOCK_N, m, v_base)

    def q_addresses(warp, ks, mt):
        addresses = [m.fragment_address(q_base + m.q_lane_offset(warp, lane), ks, mt) for lane in range(32)]
        assert addresses == [q_base + m.q_intended(warp, lane, mt, ks) for lane in range(32)]
        return addresses

    def k_addresses(ks, np_):
        addresses = [m.fragment_address(k_base + m.k_lane_offset(lane), ks, np_) for lane in range(32)]
        assert addresses == [k_base + m.k_intended(lane, ks, np_) for lane in range(32)]
        return addresses

    def v_addresses(j_step, dp):
        addresses = [m.fragment_address(v_base + m.v_lane_offset(lane), dp, j_step) for lane in range(32)]
        assert addresses == [v_base + m.v_intended(lane, j_step, dp) for lane in range(32)]
        return addresses

    check_q_fragments(m, q_addresses, q_rows)
    check_kv_fragments(m, k_addresses, v_addresses, k_rows, v_rows)


def test_the_xor_step_needs_tile_bases_at_multiples_of_256():
    """fragment_address XORs the whole shared address: exact for every tile base the kernel uses (the
    1024-aligned window plus multiples of 256), wrong for a base that is not a multiple of 256."""
    m = model()
    bases = {1024 + m.Q_TILE_BYTES + st * m.STAGE_BYTES + kv * m.KV_TILE_BYTES
             for st in range(m.STAGES) for kv in range(2)} | {0, 1024}
    assert all(b % m.TILE_ALIGN == 0 for b in bases) and m.TILE_ALIGN == m.ROW_BYTES
    for base in sorted(bases) + [128, 1024 + 32]:
        exact = all(m.fragment_address(base + m.k_lane_offset(lane), ks, np_) == base + m.k_intended(lane, ks, np_)
                    for lane in range(32) for ks in range(m.D_STEPS) for np_ in range(m.S_TILES // 2))
        assert exact == (base % m.TILE_ALIGN == 0), base


def test_score_accumulators_repack_into_the_p_a_operand():
    """For every lane and m16 tile, the (row, key) of score accumulator c_i of n8 tile nt, moved by
    pack_p_fragment, is exactly the (row, k) the A operand of P V k-step nt // 2 expects; and the
    positions are the ones mask_scores assumes: key 8 nt + 2 (l % 4) + i % 2, row + 8 (i / 2)."""
    check_score_repack(model())


def test_epilogue_covers_the_tile_once_without_conflicts():
    check_epilogue(model())


# ---------------------------------------------------------------------------------------------
# Masks and tile decisions
# ---------------------------------------------------------------------------------------------


def test_mask_bound_is_past_s_or_after_the_row_key_for_key():
    m = model()
    for s_len in (1, 63, 64, 100, 250, 777):
        for key0 in range(0, s_len + m.BLOCK_N, m.BLOCK_N):
            for row in range(max(0, key0 - 70), key0 + 140, 3):
                for causal in (False, True):
                    for lane in range(4):
                        bound = m.mask_bound(key0, row, s_len, causal, lane)
                        for nt in range(m.S_TILES):
                            for e in range(2):
                                key = key0 + nt * m.MMA_N + 2 * (lane % 4) + e
                                masked = key >= s_len or (causal and key > row)
                                assert (nt * m.MMA_N + e >= bound) == masked, (s_len, key0, row, causal, lane, nt, e)


@pytest.mark.parametrize("s_len", [64, 100, 128, 200, 250, 777, 1000, 2048])
def test_warp_decisions_skip_and_mask_exactly_the_right_tiles(s_len):
    """Per CTA the key tiles are exactly those a stored row needs (causal tile skipping); per warp, a
    skipped tile holds no key any of its rows needs, and a tile the warp does not mask has no key to
    mask for any of its rows (rows past S included: they are computed, never stored)."""
    m = model()
    for causal in (False, True):
        for q0 in range(0, s_len, m.BLOCK_M):
            rows = range(q0, min(q0 + m.BLOCK_M, s_len))
            needed = {key // m.BLOCK_N for r in rows for key in range(r + 1 if causal else s_len)}
            assert set(range(m.n_tiles(q0, s_len, causal))) == needed
            for t in range(m.n_tiles(q0, s_len, causal)):
                key0 = t * m.BLOCK_N
                keys = range(key0, key0 + m.BLOCK_N)
                for warp in range(m.WARPS):
                    warp_row0 = q0 + warp * m.WARP_ROWS
                    warp_rows = range(warp_row0, warp_row0 + m.WARP_ROWS)
                    visible = [(r, key) for r in warp_rows for key in keys if key < s_len and not (causal and key > r)]
                    masked_any = any(key >= s_len or (causal and key > r) for r in warp_rows for key in keys)
                    assert m.warp_skips(key0, warp_row0, causal) == (not visible)
                    if not m.warp_skips(key0, warp_row0, causal):
                        assert m.warp_masks(key0, warp_row0, s_len, causal) == masked_any
    # Causal tiles at the diagonal: warps 0 and 1 of a query tile skip its last key tile.
    assert m.warp_skips(64, 0, True) and m.warp_skips(64, 32, True) and not m.warp_skips(64, 64, True)


# ---------------------------------------------------------------------------------------------
# The model against the kernel's own helpers, built for the host by nvcc
# ---------------------------------------------------------------------------------------------

HARNESS_MAIN = r"""
int main()
{
    for (int row = 0; row < BLOCK_M; ++row)
        for (int c = 0; c < CHUNKS_PER_ROW; ++c) printf("swizzle %d %d %u\n", row, c, swizzle_offset(row, c));
    for (int lane = 0; lane < WARP_SIZE; ++lane) {
        for (int warp = 0; warp < WARPS; ++warp) printf("qlane %d %d %u\n", warp, lane, q_lane_offset(warp, lane));
        printf("klane %d %u\n", lane, k_lane_offset(lane));
        printf("vlane %d %u\n", lane, v_lane_offset(lane));
    }
    const uint32_t bases[] = {0u, 1024u, 1024u + Q_TILE_BYTES, 1024u + Q_TILE_BYTES + KV_TILE_BYTES, 128u};
    for (uint32_t base : bases)
        for (int lane = 0; lane < 32; ++lane)
            for (int pair = 0; pair < 8; ++pair)
                for (int block = 0; block < 4; ++block)
                    printf("fragment %u %d %d %d %u\n", base, lane, pair, block,
                           fragment_address(base + k_lane_offset(lane), pair, block));
    for (int S : {1, 100, 250, 777})
        for (int key0 = 0; key0 < S + BLOCK_N; key0 += BLOCK_N)
            for (int row = key0 > 70 ? key0 - 70 : 0; row < key0 + 140; row += 7)
                for (int causal = 0; causal < 2; ++causal)
                    for (int lane = 0; lane < 4; ++lane)
                        printf("bound %d %d %d %d %d %d\n", S, key0, row, causal, lane,
                               mask_bound(key0, row, S, causal != 0, lane));
    return 0;
}
"""


@pytest.fixture(scope="module")
def host_tables(tmp_path_factory) -> dict[str, list[list[int]]]:
    return kernel_helper_tables(tmp_path_factory.mktemp("fmha-r32-harness"), NAME, HARNESS_MAIN)


def test_kernel_helpers_match_the_model(host_tables):
    m = model()
    check_swizzle_table(m, host_tables)
    assert len(host_tables["qlane"]) == 32 * m.WARPS
    for warp, lane, offset in host_tables["qlane"]:
        assert offset == m.q_lane_offset(warp, lane)
    for lane, offset in host_tables["klane"]:
        assert offset == m.k_lane_offset(lane)
    for lane, offset in host_tables["vlane"]:
        assert offset == m.v_lane_offset(lane)
    assert len(host_tables["fragment"]) == 5 * 32 * 8 * 4
    for base, lane, pair, block, address in host_tables["fragment"]:
        assert address == m.fragment_address(base + m.k_lane_offset(lane), pair, block)
    assert len(host_tables["bound"]) > 1000
    for s_len, key0, row, causal, lane, bound in host_tables["bound"]:
        assert bound == m.mask_bound(key0, row, s_len, bool(causal), lane)


def test_kernel_source_matches_the_model_where_no_harness_reaches():
    """The P re-packing, the masking compare, the loaders' path choice and bounds, the tile count, the
    warp decisions and the reference point of the online softmax are inline code: check the source says
    what the model does."""
    source = kernel().source
    for line in ("a[0] = pack_half2(s[2 * j][0], s[2 * j][1]);", "a[1] = pack_half2(s[2 * j][2], s[2 * j][3]);",
                 "a[2] = pack_half2(s[2 * j + 1][0], s[2 * j + 1][1]);",
                 "a[3] = pack_half2(s[2 * j + 1][2], s[2 * j + 1][3]);",
                 "const int bound = mask_bound(key0, row_top + mt * MMA_M + h * ACC_ROW_HALF, S, causal, lane);",
                 "if (nt * MMA_N + e >= bound) s[mt][nt][2 * h + e] = -INFINITY;",
                 "if ((KV_LOADS - 1) * LOAD_ROWS_PER_PASS < rows_left) {",
                 "const bool ok = i * LOAD_ROWS_PER_PASS < rows_left;",
                 "const long long kv_first = head + (tid / CHUNKS_PER_ROW) * HEAD_DIM + (tid % CHUNKS_PER_ROW) * VEC;",
                 "const int kv_rows = S - tid / CHUNKS_PER_ROW;",
                 "const int n_tiles = (is_causal ? last_row_end + BLOCK_N - 1 : S + BLOCK_N - 1) / BLOCK_N;",
                 "if (is_causal && key0 > warp_row0 + WARP_ROWS - 1) continue;",
                 "if (key0 + BLOCK_N > S || (is_causal && key0 + BLOCK_N - 1 > warp_row0))",
                 "const int warp_row0 = q0 + warp * WARP_ROWS;",
                 "const float m_scaled = (m_new == -INFINITY) ? 0.0f : m_new * scale_log2;",
                 "const float alpha = fast_exp2(m[mt][r] * scale_log2 - m_scaled);",
                 "const float p = fast_exp2(fmaf(s[mt][nt][2 * r + e], scale_log2, -m_scaled));",
                 "const uint32_t at = swizzle_offset(row_top + r * ACC_ROW_HALF, dt) + 4 * (lane % 4);",
                 "const int row = warp * WARP_ROWS + id / CHUNKS_PER_ROW;",
                 "extern __shared__ __align__(1024) unsigned char smem[];"):
        assert line in source, line


# ---------------------------------------------------------------------------------------------
# The kernel source, run on the CPU
# ---------------------------------------------------------------------------------------------

# The PTX wrappers the emulator replaces, and the PTX each one holds.
PTX_HELPERS = {
    "cp_async_16": "cp.async.cg.shared.global [%0], [%1], 16, %2;",
    "cp_async_commit": "cp.async.commit_group;",
    "cp_async_wait": "cp.async.wait_group %0;",
    "ldmatrix_x4": "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];",
    "ldmatrix_x4_trans": "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];",
    "mma_f16_16816": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};",
}


@pytest.mark.parametrize("name", [NAME, BASELINE])
def test_ptx_wrappers_are_what_the_emulator_replaces(name):
    """Each wrapper the emulator stands in for is one asm statement holding the PTX it names, with the
    operands in the order the emulator's version takes them; no other asm in the source."""
    source = kernel(name).source
    bodies = ptx_helper_bodies(source, PTX_HELPERS)
    for helper, body in bodies.items():
        code = body[body.index("{"):]
        literals = re.findall(r'"((?:[^"\\]|\\.)*)"', code)
        assert re.sub(r'"(?:[^"\\]|\\.)*"', '""', code).count(";") == 1, (helper, code)
        assert code.lstrip("{ \n").startswith("asm volatile(")
        template = "".join(lit for lit in literals if "%" in lit or "." in lit).replace("\\n", "")
        assert template == PTX_HELPERS[helper], (helper, template)
    assert '"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])' in bodies["mma_f16_16816"]
    assert '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)' in bodies["mma_f16_16816"]
    assert ':: "r"(smem_addr), "l"(gmem), "r"(src_bytes)' in bodies["cp_async_16"]
    rest = source
    for body in bodies.values():
        rest = rest.replace(body, "")
    assert "asm" not in re.sub(r"//[^\n]*", "", rest)


def build_emulator(work: Path, source: str, entry: str) -> Path:
    return build_mma_emulator(work, EMULATOR, source, PTX_HELPERS, f"KERNEL_ENTRY={entry}",
                              f'KERNEL_ENTRY_NAME="{entry}"')


def emulate(binary: Path, state: KernelState, params: dict, x: dict, order: str = "forward", copies: str = "eager",
            seed: int = 0, window_base: int = 1024) -> tuple[torch.Tensor | None, str]:
    """Run the plan's launch on the emulator; (o, "") or (None, the emulator's complaint)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (launch,) = resolve(state.plan, env_for(state, params), buffers())
        complaint = run_mma_emulator(binary, work, x, [f"o float16 {x['q'].numel()} output"], [launch], order, seed,
                                     copies, window_base)
        if complaint:
            return None, complaint
        raw = np.frombuffer((work / "o.bin").read_bytes(), dtype=np.int16).copy()
        return torch.from_numpy(raw).view(torch.float16).reshape(x["q"].shape), ""


@pytest.fixture(scope="module")
def emulators(tmp_path_factory) -> dict[str, Path]:
    return {name: build_emulator(tmp_path_factory.mktemp(f"emulator-{name}"), kernel(name).source,
                                 kernel(name).plan.launches[0].entry) for name in (NAME, BASELINE)}


def check_against_reference(got: torch.Tensor, x: dict, params: dict):
    expected = problem().reference(x, params)["o"]
    comparison = compare("o", got, expected, tolerance())
    assert comparison.passed, comparison.message
    assert comparison.rel_l2 < tolerance().rel_l2 * 0.2, comparison.rel_l2  # two fp16 roundings' worth
    return comparison


# CPU shapes: the problem's small case; one head of the ragged cases; a causal shape of full tiles;
# a ragged causal shape whose key tail leaves one loader thread exactly at the unchecked path's edge.
SHAPES = {
    "small": dict(problem().info.case("small").params),
    "ragged": {**problem().info.case("ragged").params, "B": 1, "H": 1},
    "ragged_causal": {**problem().info.case("ragged_causal").params, "H": 2},
    "causal": {**problem().info.case("causal").params, "B": 1, "H": 1, "S": 512},
    "edge": {"B": 1, "H": 1, "S": 250, "D": 128, "causal": 1},
}
SCHEDULES = [("forward", "eager"), ("reverse", "late"), ("random", "late"), ("warps", "late"),
             ("warps_reverse", "eager")]


@pytest.mark.parametrize("shape", sampled(SHAPES, keep=("small", "edge")))  # ragged and causal ones: -m slow
def test_emulated_kernel_reproduces_the_reference(emulators, shape):
    params = dict(SHAPES[shape])
    x = problem().make_inputs(dict(params), 1, "cpu")
    schedules = SCHEDULES if shape in ("small", "edge") else SCHEDULES[:1] + SCHEDULES[3:4]
    first = None
    for order, copies in schedules:
        got, complaint = emulate(emulators[NAME], kernel(), params, x, order, copies, seed=7)
        assert got is not None, (order, copies, complaint)
        if first is None:
            assert not torch.isnan(got.float()).any(), "unwritten outputs"
            check_against_reference(got, x, params)
            first = got
        else:  # no race: the schedule changes nothing
            assert torch.equal(got.view(torch.int16), first.view(torch.int16)), (order, copies)
    # fmha/flash_mma's source, run the same way, computes the same rows with the same roundings
    # (one row per quad of lanes, the same fp32 order within a row): the two agree to an fp16 step.
    theirs, complaint = emulate(emulators[BASELINE], kernel(BASELINE), params, x)
    assert theirs is not None, complaint
    diff = (first.float() - theirs.float()).abs()
    assert float(diff.max()) <= 2.0 ** -10 * max(1.0, float(theirs.float().abs().max()))


def test_the_gpu_probe_builds_from_the_kernel_source(tmp_path):
    """tests/test_gpu_fmha_r32.py appends its shared-window probe to kernel.cu; it builds with the
    plan's flags, and its parameter table takes the probe's one pointer."""
    from gpu_tools import build_probes
    from klineage.gate.params import pack_parameters, read_kernel_parameters
    from test_gpu_fmha_r32 import PROBE_FLAGS, PROBES

    assert set(PROBE_FLAGS) == set(kernel().plan.nvcc_flags)
    cubin, log = build_probes(tmp_path, (KERNELS / NAME / "kernel.cu").read_text() + PROBES, *PROBE_FLAGS,
                              "-Xptxas", "-v")
    assert "spill" not in log.replace("0 bytes spill", "") and "warning" not in log.lower()
    declared = read_kernel_parameters(cubin, "smem_base_probe")
    assert declared is not None
    blob = pack_parameters((("buffer", "out", ""),), {"out": 1 << 40}, {}, declared, "smem_base_probe")
    assert len(blob) == declared.total == 8


def test_a_shared_window_off_256_bytes_breaks_the_xor_step(emulators):
    """The kernel relies on its shared memory starting at a multiple of TILE_ALIGN (the __align__(1024)
    of its declaration): with the window at 1024 + 128 it reads outside its tiles or computes garbage;
    flash_mma, which adds every offset, does not care."""
    params = dict(SHAPES["small"])
    x = problem().make_inputs(dict(params), 1, "cpu")
    got, complaint = emulate(emulators[NAME], kernel(), params, x, window_base=1024 + 128)
    expected = problem().reference(x, params)["o"]
    assert got is None or not compare("o", got, expected, tolerance()).passed, complaint
    theirs, complaint = emulate(emulators[BASELINE], kernel(BASELINE), params, x, window_base=1024 + 128)
    assert theirs is not None, complaint
    assert compare("o", theirs, expected, tolerance()).passed


def sweep_variants():
    """The variants of bench/sweeps/fmha_r32.toml, built by the carrier sweep's own transforms."""
    from bench_tools import bench_script

    tool = bench_script("carrier_sweep")
    sweep = tool.load_sweep(ROOT / "bench" / "sweeps" / "fmha_r32.toml")
    assert sweep.expert.fingerprint == kernel().fingerprint and sweep.variants[0].is_expert
    return sweep, tool


@pytest.mark.slow  # run before a GPU session spends time on the sweep (`pytest -m slow`)
def test_every_sweep_variant_is_correct_on_the_emulator(tmp_path):
    """Before a variant of the carrier sweep costs GPU time: its source (BLOCK_N 32, deeper rings, 256-row
    CTAs of 8 warps), built by tile_constant, runs the ragged causal edge shape and the small case on
    the emulator with its own resolved plan, and passes the reference."""
    sweep, tool = sweep_variants()
    assert 3 <= len(sweep.variants) - 1 <= 5
    for variant in sweep.variants[1:]:
        built = tool.build_variant(sweep.expert, variant)
        assert built.state is not None, (variant.name, built.reason)
        c = built.state.constants
        assert c["WARP_M_TILES"] == 2 and c["THREADS"] == 32 * c["WARPS"], variant.name
        work = tmp_path / variant.name
        work.mkdir()
        binary = build_emulator(work, built.state.source, ENTRY)
        for shape in ("edge", "small"):
            params = dict(SHAPES[shape])
            x = problem().make_inputs(dict(params), 4, "cpu")
            got, complaint = emulate(binary, built.state, params, x, "warps", "late")
            assert got is not None, (variant.name, shape, complaint)
            check_against_reference(got, x, params)


def mutant_outcome(work: Path, mutant: str, shape: str = "edge") -> list[str]:
    """Build the emulator on a mutated source and say, per schedule, how the run went."""
    binary = build_emulator(work, mutant, ENTRY)
    params = dict(SHAPES[shape])
    x = problem().make_inputs(dict(params), 2, "cpu")
    expected = problem().reference(x, params)["o"]
    outcomes = []
    for order, copies in (("warps", "late"), ("warps_reverse", "late"), ("random", "eager"), ("forward", "late")):
        got, complaint = emulate(binary, kernel(), params, x, order, copies, seed=3)
        if got is None:
            outcomes.append(f"error: {complaint}")
        else:
            outcomes.append("passed" if compare("o", got, expected, tolerance()).passed else "wrong")
    return outcomes


MUTANTS = {
    "no barrier before a key tile": ("        cp_async_wait<STAGES - 2>();\n        __syncthreads();\n",
                                     "        cp_async_wait<STAGES - 2>();\n"),
    "waits one cp.async group short": ("cp_async_wait<STAGES - 2>();", "cp_async_wait<STAGES - 1>();"),
    "no __syncwarp before the output stores": ("    __syncwarp();\n", ""),
    "prefetch into the stage being read": ("(static_cast<uint32_t>(fetch) % STAGES) * STAGE_BYTES",
                                           "(static_cast<uint32_t>(t) % STAGES) * STAGE_BYTES"),
    "causal bound one key short": ("min(S - key0, row - key0 + 1)", "min(S - key0, row - key0)"),
    "causal skip takes the diagonal tile": ("if (is_causal && key0 > warp_row0 + WARP_ROWS - 1) continue;",
                                            "if (is_causal && key0 >= warp_row0) continue;"),
    "unchecked loader path one row early": ("if ((KV_LOADS - 1) * LOAD_ROWS_PER_PASS < rows_left) {",
                                            "if ((KV_LOADS - 1) * LOAD_ROWS_PER_PASS <= rows_left) {"),
    "B fragment halves swapped in P V": ("mma_f16_16816(o[mt][2 * dp], a[mt], vf[0], vf[1]);",
                                         "mma_f16_16816(o[mt][2 * dp], a[mt], vf[1], vf[0]);"),
}


@pytest.mark.parametrize("mutant", sampled(MUTANTS, keep=("no barrier before a key tile",
                                                      "waits one cp.async group short")))
def test_the_emulator_catches_known_bugs(tmp_path, mutant):
    old, new = MUTANTS[mutant]
    source = kernel().source
    assert source.count(old) == 1, mutant
    outcomes = mutant_outcome(tmp_path, source.replace(old, new))
    assert any(o != "passed" for o in outcomes), outcomes


def test_the_emulator_passes_the_unmutated_source_on_the_mutant_shape(tmp_path):
    assert mutant_outcome(tmp_path, kernel().source) == ["passed"] * 4
