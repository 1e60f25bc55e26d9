"""The GEMM workload of the expert corpus, checked without a GPU.

- The problem loads, its numerics are sound on CPU, its tolerances pass the fp64 truth and refuse
  a kernel that drops the K tail.
- The kernels (naive, mma_sync, mma_sync_any) load, pass the static check, resolve their plans for
  every case they support on an H200, and compile with the real nvcc (`-cubin -O3 -std=c++17
  -Xptxas -v`, sm_90 and sm_90a, as the gate builds them) without spills; their SASS has the
  instructions each mechanism should produce.
- A Python model of the mma kernels' index math (XOR swizzle, cp.async loader, ldmatrix
  addressing, mma fragments, epilogue, block rasterization, pipeline schedule) is checked to be
  bijective, free of shared-memory bank conflicts, and consistent with the PTX ISA's fragment
  layouts for ldmatrix and mma.m16n8k16; whole CTA tiles are emulated element by element from
  global memory to the output. A host build of the kernel's own index helpers (compiled by nvcc
  from kernel.cu itself) is compared with the model, so the model is the code's, not a paraphrase.
- The wgmma + TMA expert (sm_90a): its plan resolves to the tensor maps TMA needs (and refuses
  K % 8 != 0), it compiles for sm_90a without spills, and its SASS has HGMMA, UTMALDG, mbarrier
  and setmaxnreg instructions and no Ampere-path ones. Its descriptors (read from a host build of
  its helpers) match the PTX ISA's format; wgmma reads exactly where the 128B-swizzled TMA boxes
  wrote; accumulators follow the ISA's m64nNk16 layout through a conflict-free epilogue; whole CTAs
  are emulated from TMA boxes (zero fill at the edges) to the bounds-checked stores; and the
  full/empty mbarrier protocol is run under random schedules for hazards and deadlocks.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
import torch

from corpus_tools import SMEM_LIMIT, buffer_names
from cuda_tools import (
    MBarrier,
    assert_compiles_up_to_the_gpu,
    bank_groups,
    cdiv,
    count,
    ldmatrix_x4,
    ptx_a,
    ptx_b,
    ptx_c,
    ptx_wgmma_d,
    run_host_harness,
    sass_mnemonics,
    sass_opcodes,
    sm90a_resources,
    swizzle_128b,
)
from klineage.devices import H200
from klineage.errors import DocumentError
from klineage.gate.compile import CompileResult, compile_kernel
from klineage.kernel import KernelState, load_kernel
from klineage.launch import TensorMap, resolve
from klineage.problem import Tolerance, load_problem, tolerance_for, validate_numerics
from shared_cache import share

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "corpus" / "problems" / "gemm.py"
KERNELS = ROOT / "corpus" / "kernels" / "gemm"
MMA = ("mma_sync", "mma_sync_any")
ALL = ("naive", *MMA)
ENTRIES = {"naive": "gemm_bf16_naive", "mma_sync": "gemm_bf16_mma_sync", "mma_sync_any": "gemm_bf16_mma_sync_any"}


@cache
def problem():
    return load_problem(PROBLEM)


@cache
def kernel(name: str) -> KernelState:
    return load_kernel(KERNELS / name)


def buffers() -> set[str]:
    return buffer_names(problem())


# ---------------------------------------------------------------------------------------------
# The problem
# ---------------------------------------------------------------------------------------------


def test_problem_declarations():
    info = problem().info
    assert info.operator == "gemm" and info.math == "bf16" and info.headline == "headline"
    params = {c.name: c.params for c in info.cases}
    assert params["headline"] == {"M": 4096, "N": 4096, "K": 4096}
    assert params["ragged"] == {"M": 4095, "N": 4097, "K": 4100}
    assert params["skinny"] == {"M": 16, "N": 4096, "K": 4096}
    assert params["small"] == {"M": 64, "N": 80, "K": 96}
    assert params["odd_k"]["K"] % 8 and params["odd_k"]["K"] % 2  # rows not even 4-byte aligned
    assert params["ragged"]["K"] % 8  # rows 8 bytes off a 16-byte boundary
    assert params["ragged_mn"]["K"] % 8 == 0 and params["ragged_mn"]["K"] % 64  # aligned, partial K tile
    assert [(o.name, o.shape, o.dtype) for o in info.outputs] == [("y", ("M", "N"), "bfloat16")]
    tol = tolerance_for("bfloat16", info.tolerances)
    assert tol == Tolerance(rtol=2e-2, atol=1e-2, rel_l2=5e-3)
    assert 2 ** -7 < tol.rtol  # one bf16 step, at its widest relative size, is inside rtol
    for case in info.cases:
        m, n, k = (case.params[d] for d in "MNK")
        assert info.roofline[case.name] == {"flops": 2.0 * m * n * k, "bytes": 2.0 * (m * k + n * k + m * n)}
    assert info.has_vendor and not info.has_check


def test_problem_numerics_are_sound_on_cpu():
    assert validate_numerics(problem(), "cpu") == []


def test_inputs_are_bf16_varied_and_deterministic():
    case = dict(problem().info.case("odd_k").params)
    a = problem().make_inputs(case, 3, "cpu")
    b = problem().make_inputs(case, 3, "cpu")
    c = problem().make_inputs(case, 4, "cpu")
    assert set(a) == {"x", "W"}
    assert a["x"].shape == (1000, 1001) and a["W"].shape == (1000, 1001)
    for name in a:
        assert a[name].dtype == torch.bfloat16 and a[name].is_contiguous()
        assert torch.equal(a[name], b[name]) and not torch.equal(a[name], c[name])
    x = a["x"].float()
    zeros = (x == 0).float().mean(dim=1)
    assert (zeros > 0.8).any() and (zeros < 0.01).any()  # sparse rows beside dense ones
    scale = x.std(dim=1)
    assert scale.max() / scale.min() > 4  # per-row scales differ
    assert (x.abs().amax(dim=1) / x.std(dim=1) < 2.0).any()  # uniform rows (normal rows reach ~3.5 sigma)
    assert a["x"].stride(0) * 2 % 16  # rows of x are not 16-byte aligned


def test_reference_and_tolerance_are_meaningful():
    case = dict(problem().info.case("odd_k").params)
    inputs = problem().make_inputs(case, 0, "cpu")
    expected = problem().reference(inputs)["y"]
    assert expected.dtype == torch.bfloat16 and expected.shape == (1000, 1000)
    tol = tolerance_for("bfloat16", problem().info.tolerances)
    from klineage.gate.correctness import compare

    x, w = inputs["x"].double(), inputs["W"].double()
    truth = (x @ w.T).to(torch.bfloat16)
    assert compare("y", truth, expected, tol).passed
    assert compare("y", problem().vendor(inputs)["y"], expected, tol).passed  # the CPU bf16 matmul
    # The rounded truth and the fp32 reference differ in few elements, by one bf16 step at most.
    diff = (truth.double() - expected.double()).abs()
    assert (diff > 0).float().mean() < 0.01
    assert bool((diff <= expected.double().abs() * 2 ** -7 + 1e-6).all())
    # A kernel that drops the last K element (the tail an aligned-only loader would miss) fails.
    dropped = (x[:, :-1] @ w[:, :-1].T).to(torch.bfloat16)
    assert not compare("y", dropped, expected, tol).passed


# ---------------------------------------------------------------------------------------------
# Kernels: plans, static check, compile, SASS
# ---------------------------------------------------------------------------------------------


def env_for(state: KernelState, params: dict) -> dict:
    return {**params, **state.constants, **H200.facts()}


@pytest.mark.parametrize("name", ALL)
def test_plan_resolves_for_every_supported_case(name):
    state = kernel(name)
    assert state.plan.problem == "gemm" and state.plan.arch == "sm_90"
    assert [launch.entry for launch in state.plan.launches] == [ENTRIES[name]]
    supported = [c for c in problem().info.cases if state.plan.supports_case(c.params)]
    for case in supported:
        (launch,) = resolve(state.plan, env_for(state, case.params), buffers())
        assert launch.shared <= SMEM_LIMIT
        assert [a[1] for a in launch.args] == ["x", "W", "y", case.params["M"], case.params["N"], case.params["K"]]
        threads = math.prod(launch.block)
        c = state.constants
        if name == "naive":
            assert launch.grid[0] * c["TILE_N"] >= case.params["N"] and launch.grid[1] * c["TILE_M"] >= case.params["M"]
            assert threads == c["TILE_N"] * c["TILE_M"] and launch.shared == 0
        else:
            assert threads == c["THREADS"] == c["WARPS_M"] * c["WARPS_N"] * 32
            assert launch.shared == c["SMEM_BYTES"] == c["STAGES"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2
            tiles = math.ceil(case.params["M"] / c["BLOCK_M"]) * math.ceil(case.params["N"] / c["BLOCK_N"])
            assert launch.grid == (tiles, 1, 1)


def test_domains():
    cases = {c.name: c.params for c in problem().info.cases}
    aligned = {name for name, p in cases.items() if kernel("mma_sync").plan.supports_case(p)}
    assert aligned == {"headline", "ragged_mn", "skinny", "small"}
    assert "16-byte" in kernel("mma_sync").plan.supports_reason
    for name in ("naive", "mma_sync_any"):  # the experts covering every case
        assert not kernel(name).plan.supports
        assert all(kernel(name).plan.supports_case(p) for p in cases.values())


def test_mechanism_constants():
    c = kernel("mma_sync").constants
    assert (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["STAGES"]) == (128, 256, 64, 4)
    assert (c["WARP_M"], c["WARP_N"], c["THREADS"]) == (64, 64, 256)
    assert c["GROUP_M"] >= 1 and c["VEC"] == 8 and c["EPI_PAD"] == 8
    assert kernel("mma_sync_any").constants == c  # the same expert, plus a fallback loader


@pytest.mark.parametrize("name", ALL)
def test_static_check(name):
    static = pytest.importorskip("klineage.gate.static")
    report = static.static_check(kernel(name))
    assert report.ok, report.to_dict()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, shared_cache) -> dict[str, CompileResult]:
    cache_dir = share(tmp_path_factory.mktemp("gemm-compile"), shared_cache)  # the run's compiles
    return {name: compile_kernel(kernel(name), cache_dir) for name in ALL}


@pytest.mark.parametrize("name", ALL)
def test_compiles_without_spills(compiled, name):
    result = compiled[name]
    assert result.ok, result.log
    assert "-O3" in result.flags and "-Xptxas" in result.flags and "-std=c++17" in result.flags
    for arch in result.targets:
        res = result.resources_for(ENTRIES[name], arch)
        assert not res.spills and res.spill_store_bytes == 0 and res.spill_load_bytes == 0, res
        assert res.stack_bytes == 0, res
        assert res.registers <= 255
        assert res.shared_bytes == 0  # all shared memory is dynamic, sized by the plan
        if name in MMA:
            assert res.registers >= 128 + 64  # accumulators and both fragment buffers live in registers


@pytest.mark.parametrize("name", MMA)
def test_mma_sass_has_every_mechanism(compiled, name):
    c = kernel(name).constants
    per_k_tile = c["WARP_TILES_M"] * c["WARP_TILES_N"] * c["K_STEPS"]
    for arch in compiled[name].targets:
        ops = sass_opcodes(compiled[name], arch)
        # Tensor cores: the main loop's k-steps fully unrolled (one copy per instantiation).
        assert count(ops, r"^HMMA\.16816\.F32\.BF16$") % per_k_tile == 0 and count(ops, r"^HMMA\.16816\.F32\.BF16$")
        assert count(ops, r"^HMMA\b") == count(ops, r"^HMMA\.16816\.F32\.BF16$")
        # ldmatrix.x4, never transposed: (4 A + 4 B) per k-step, plus the first k-step's.
        assert count(ops, r"^LDSM\.16\.M88\.4$") >= (c["WARP_TILES_M"] + c["WARP_TILES_N"] // 2) * c["K_STEPS"]
        assert count(ops, r"^LDSM\b.*\.MT88") == 0
        # cp.async.cg of 16 bytes (L1 bypass), its groups and waits.
        assert count(ops, r"^LDGSTS\b.*\.BYPASS\b.*\.128$") >= c["A_LOADS"] + c["B_LOADS"]
        assert count(ops, r"^LDGSTS\b") == count(ops, r"^LDGSTS\b.*\.BYPASS\b.*\.128$")
        assert count(ops, r"^LDGDEPBAR$") >= 1 and count(ops, r"^DEPBAR\b") >= 1
        # No local memory: no spills and no dynamically indexed register arrays.
        assert count(ops, r"^(LDL|STL)\b") == 0
        # Epilogue: 16-byte shared loads and global stores (and the element path beside them).
        assert count(ops, r"^LDS\.128$") >= 1 and count(ops, r"^STG\.E\.128$") >= 1
        assert count(ops, r"^BAR\.SYNC\b") >= 3
        if name == "mma_sync_any":  # the fallback loader: 2-byte global loads, 16-byte shared stores
            assert count(ops, r"^LDG\b.*\.U16\b") >= 8 and count(ops, r"^STS\.128$") >= 1
        else:
            assert count(ops, r"^LDG\b") == 0  # every global read is a cp.async


def test_naive_sass_is_plain(compiled):
    for arch in compiled["naive"].targets:
        ops = sass_opcodes(compiled["naive"], arch)
        assert count(ops, r"^(HMMA|LDSM|LDGSTS|LDL|STL|BAR)\b") == 0
        assert count(ops, r"^LDG\b.*\.U16\b") >= 2 and count(ops, r"^FFMA\b") >= 1


# ---------------------------------------------------------------------------------------------
# A model of the mma kernels' index math, checked against the PTX ISA
# ---------------------------------------------------------------------------------------------


class Model:
    """The index functions of corpus/kernels/gemm/mma_sync*/kernel.cu, with its constants."""

    def __init__(self, c: dict):
        self.c = c
        for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "WARPS_M", "WARPS_N", "THREADS", "WARP_M", "WARP_N",
                    "MMA_M", "MMA_N", "MMA_K", "WARP_TILES_M", "WARP_TILES_N", "K_STEPS", "VEC", "CHUNK_BYTES",
                    "CHUNKS_PER_ROW", "ROW_BYTES", "SWIZZLE_ROWS", "A_STAGE_BYTES", "B_STAGE_BYTES",
                    "LOAD_ROWS_PER_PASS", "A_LOADS", "B_LOADS", "GROUP_M", "EPI_STRIDE", "EPI_CHUNKS_PER_ROW",
                    "EPI_VEC_PASSES", "ACC_ROW_HALF"):
            setattr(self, key, c[key])

    def swizzle_offset(self, row: int, chunk: int) -> int:
        return row * self.ROW_BYTES + (chunk ^ (row % self.SWIZZLE_ROWS)) * self.CHUNK_BYTES

    def loader(self, tid: int) -> tuple[int, int, int]:
        """(tile row of pass 0, chunk, swizzled byte offset of pass 0) of a thread's copies."""
        row, chunk = tid // self.CHUNKS_PER_ROW, tid % self.CHUNKS_PER_ROW
        return row, chunk, self.swizzle_offset(row, chunk)

    def pass_offset(self, offset: int, i: int) -> int:
        return offset + i * self.LOAD_ROWS_PER_PASS * self.ROW_BYTES

    @staticmethod
    def warp_position(warp: int, warps_n: int) -> tuple[int, int]:
        return warp // warps_n, warp % warps_n

    def fragment_addressing(self, warp_m: int, warp_n: int, lane: int) -> dict:
        a_row = warp_m * self.WARP_M + lane % 16
        b_row = warp_n * self.WARP_N + lane % 8 + 8 * (lane // 16)
        return {"a_row": a_row * self.ROW_BYTES, "b_row": b_row * self.ROW_BYTES, "a_half": lane // 16,
                "b_half": (lane // 8) % 2, "phase": lane % self.SWIZZLE_ROWS}

    def a_fragment_offset(self, fa: dict, ks: int, mt: int) -> int:
        return (fa["a_row"] + mt * self.MMA_M * self.ROW_BYTES
                + ((2 * ks + fa["a_half"]) ^ fa["phase"]) * self.CHUNK_BYTES)

    def b_fragment_offset(self, fa: dict, ks: int, np_: int) -> int:
        return (fa["b_row"] + np_ * 2 * self.MMA_N * self.ROW_BYTES
                + ((2 * ks + fa["b_half"]) ^ fa["phase"]) * self.CHUNK_BYTES)

    def accumulator_row(self, warp_m: int, mt: int, lane: int) -> int:
        return warp_m * self.WARP_M + mt * self.MMA_M + lane // 4

    def accumulator_col(self, warp_n: int, nt: int, lane: int) -> int:
        return warp_n * self.WARP_N + nt * self.MMA_N + 2 * (lane % 4)

    def tile_coordinates(self, block: int, tiles_m: int, tiles_n: int) -> tuple[int, int]:
        per_group = self.GROUP_M * tiles_n
        group = block // per_group
        first_m = group * self.GROUP_M
        rows = min(tiles_m - first_m, self.GROUP_M)
        in_group = block - group * per_group
        return first_m + in_group % rows, in_group // rows

    def warps(self):
        for warp in range(self.THREADS // 32):
            yield warp, *self.warp_position(warp, self.WARPS_N)


@cache
def model() -> Model:
    return Model(kernel("mma_sync").constants)


def test_swizzle_is_a_bijection_per_tile():
    m = model()
    for rows in (m.BLOCK_M, m.BLOCK_N):
        offsets = {m.swizzle_offset(r, c) for r in range(rows) for c in range(m.CHUNKS_PER_ROW)}
        assert offsets == set(range(0, rows * m.ROW_BYTES, m.CHUNK_BYTES))
        for r in range(rows):  # a row stays in its own 128 bytes: only chunks move
            assert {m.swizzle_offset(r, c) // m.ROW_BYTES for c in range(m.CHUNKS_PER_ROW)} == {r}
    assert m.A_STAGE_BYTES == m.BLOCK_M * m.ROW_BYTES and m.B_STAGE_BYTES == m.BLOCK_N * m.ROW_BYTES


def test_loader_covers_each_tile_once_and_is_coalesced_and_conflict_free():
    m = model()
    for rows, passes in ((m.BLOCK_M, m.A_LOADS), (m.BLOCK_N, m.B_LOADS)):
        seen = Counter()
        for tid in range(m.THREADS):
            row, chunk, offset = m.loader(tid)
            for i in range(passes):
                r = row + i * m.LOAD_ROWS_PER_PASS
                seen[(r, chunk)] += 1
                assert m.pass_offset(offset, i) == m.swizzle_offset(r, chunk)  # the pass shortcut is exact
        assert set(seen) == {(r, c) for r in range(rows) for c in range(m.CHUNKS_PER_ROW)}
        assert set(seen.values()) == {1}
    for warp in range(m.THREADS // 32):
        for i in range(m.B_LOADS):
            for quarter in range(4):  # 16-byte accesses are served 8 lanes at a time
                tids = [warp * 32 + quarter * 8 + q for q in range(8)]
                rows = {m.loader(t)[0] for t in tids}
                assert len(rows) == 1  # 8 lanes read one contiguous 128-byte row segment of global memory
                assert [m.loader(t)[1] for t in tids] == list(range(8))
                offsets = [m.pass_offset(m.loader(t)[2], i) for t in tids]
                assert sorted(bank_groups(offsets)) == list(range(8))


def test_ldmatrix_rows_are_conflict_free():
    m = model()
    for _, warp_m, warp_n in m.warps():
        fas = [m.fragment_addressing(warp_m, warp_n, lane) for lane in range(32)]
        for ks in range(m.K_STEPS):
            for tiles, offset in ((m.WARP_TILES_M, m.a_fragment_offset), (m.WARP_TILES_N // 2, m.b_fragment_offset)):
                for t in range(tiles):
                    addresses = [offset(fa, ks, t) for fa in fas]
                    assert all(a % 16 == 0 for a in addresses)
                    for j in range(4):  # one phase per 8x8 matrix
                        assert sorted(bank_groups(addresses[8 * j:8 * j + 8])) == list(range(8))


def test_fragments_match_the_ptx_layouts():
    """Through the swizzle, ldmatrix.x4 and the ISA's ldmatrix semantics, every element of every A
    and B fragment is the (row, k) element that mma.m16n8k16 expects in that register."""
    m = model()

    def logical(stage_rows):
        # byte offset of a 16-byte row read -> the 8 (tile row, k) pairs stored there
        where = {}
        for r in range(stage_rows):
            for c in range(m.CHUNKS_PER_ROW):
                where[m.swizzle_offset(r, c)] = [(r, c * m.VEC + e) for e in range(m.VEC)]
        return where.__getitem__

    a_rows, b_rows = logical(m.BLOCK_M), logical(m.BLOCK_N)
    a_cover, b_cover = Counter(), Counter()
    for _, warp_m, warp_n in m.warps():
        fas = [m.fragment_addressing(warp_m, warp_n, lane) for lane in range(32)]
        for ks in range(m.K_STEPS):
            for mt in range(m.WARP_TILES_M):
                regs = ldmatrix_x4([m.a_fragment_offset(fa, ks, mt) for fa in fas], a_rows)
                for lane in range(32):
                    for i in range(8):
                        r, k = ptx_a(lane, i)
                        got = regs[lane][i // 2][i % 2]
                        assert got == (warp_m * m.WARP_M + mt * m.MMA_M + r, ks * m.MMA_K + k), (lane, i)
                        a_cover[(warp_n, got)] += 1
            for np_ in range(m.WARP_TILES_N // 2):
                regs = ldmatrix_x4([m.b_fragment_offset(fa, ks, np_) for fa in fas], b_rows)
                for half in range(2):  # registers 0, 1: n8 tile 2 np; registers 2, 3: tile 2 np + 1
                    nt = 2 * np_ + half
                    for lane in range(32):
                        for i in range(4):
                            k, n = ptx_b(lane, i)
                            got = regs[lane][2 * half + i // 2][i % 2]
                            assert got == (warp_n * m.WARP_N + nt * m.MMA_N + n, ks * m.MMA_K + k), (lane, i)
                            b_cover[(warp_m, got)] += 1
    # Every warp column reads the whole A stage once, every warp row the whole B stage once.
    assert set(a_cover.values()) == {1} and len(a_cover) == m.WARPS_N * m.BLOCK_M * m.BLOCK_K
    assert set(b_cover.values()) == {1} and len(b_cover) == m.WARPS_M * m.BLOCK_N * m.BLOCK_K


def test_epilogue_covers_the_tile_once_without_conflicts():
    m = model()
    cover = Counter()
    for _, warp_m, warp_n in m.warps():
        for mt in range(m.WARP_TILES_M):
            for nt in range(m.WARP_TILES_N):
                for half in range(2):  # (c0, c1) then (c2, c3)
                    words = []
                    for lane in range(32):
                        row = m.accumulator_row(warp_m, mt, lane) + half * m.ACC_ROW_HALF
                        col = m.accumulator_col(warp_n, nt, lane)
                        r, c = ptx_c(lane, 2 * half)
                        assert (row, col) == (warp_m * m.WARP_M + mt * m.MMA_M + r,
                                              warp_n * m.WARP_N + nt * m.MMA_N + c)
                        cover[(row, col)] += 1
                        cover[(row, col + 1)] += 1
                        words.append((row * m.EPI_STRIDE + col) // 2)  # one 4-byte bf16x2 store
                    assert len({w % 32 for w in words}) == 32  # 32 lanes, 32 banks
    assert set(cover) == {(r, c) for r in range(m.BLOCK_M) for c in range(m.BLOCK_N)}
    assert set(cover.values()) == {1}
    # The 16-byte reads of the staged tile: 8 lanes per phase read one contiguous 128-byte segment.
    assert (m.EPI_STRIDE * 2) % 16 == 0
    chunks = Counter()
    for tid in range(m.THREADS):
        for p in range(m.EPI_VEC_PASSES):
            ident = tid + p * m.THREADS
            chunks[(ident // m.EPI_CHUNKS_PER_ROW, ident % m.EPI_CHUNKS_PER_ROW)] += 1
    assert set(chunks) == {(r, c) for r in range(m.BLOCK_M) for c in range(m.EPI_CHUNKS_PER_ROW)}
    for start in range(0, m.THREADS, 8):
        addresses = [(start + q) // m.EPI_CHUNKS_PER_ROW * m.EPI_STRIDE * 2 + (start + q) % m.EPI_CHUNKS_PER_ROW * 16
                     for q in range(8)]
        assert sorted(bank_groups(addresses)) == list(range(8))


@pytest.mark.parametrize("tiles", [(32, 16), (1, 16), (16, 12), (1, 1), (33, 7), (9, 3), (8, 1), (17, 2)])
def test_rasterization_is_a_bijection(tiles):
    m = model()
    tiles_m, tiles_n = tiles
    seen = [m.tile_coordinates(b, tiles_m, tiles_n) for b in range(tiles_m * tiles_n)]
    assert sorted(seen) == [(i, j) for i in range(tiles_m) for j in range(tiles_n)]
    # Within a full group, consecutive blocks walk down GROUP_M tile rows before the next column.
    if tiles_m >= m.GROUP_M:
        assert seen[:m.GROUP_M] == [(i, 0) for i in range(m.GROUP_M)]


def simulate_pipeline(k_tiles: int, stages: int, k_steps: int, wait_pending: int | None = None,
                      first_write_stage: int | None = None) -> list[tuple[int, int]]:
    """The main loop's schedule of cp.async writes, commit/wait groups, barriers and fragment reads,
    transcribed from the kernel. Raises AssertionError on a hazard: a fragment read of a stage whose
    tile is not guaranteed complete for every thread, or a write into a stage read since the last
    barrier. Returns the (K tile, k-step) order in which the MMAs consume fragments.
    wait_pending and first_write_stage replace the kernel's STAGES - 2 and STAGES - 1 (to show that
    the model catches a wrong schedule)."""
    pending = stages - 2 if wait_pending is None else wait_pending
    holds: dict[int, tuple[int, int]] = {}  # stage -> (tile, commit group) of its latest write
    group_writes: list[tuple[int, int]] = []  # writes of the group being formed
    committed = 0
    local_complete = 0  # groups this thread has waited for
    guaranteed = 0  # groups complete for every thread (as of the last barrier)
    read_since_barrier: set[int] = set()
    frags: dict[int, tuple[int, int]] = {}
    consumed = []

    def write(stage, tile):
        assert stage not in read_since_barrier, f"write to stage {stage} while it may be read (tile {tile})"
        group_writes.append((stage, tile))

    def commit():
        nonlocal committed, group_writes
        for stage, tile in group_writes:
            holds[stage] = (tile, committed)
        committed += 1
        group_writes = []

    def wait(pending):
        nonlocal local_complete
        local_complete = max(local_complete, committed - pending)

    def barrier():
        nonlocal guaranteed
        guaranteed = local_complete
        read_since_barrier.clear()

    def read(stage, tile, ks, buffer):
        read_since_barrier.add(stage)
        if tile < k_tiles:  # the last k-step prefetches past the end: values never used
            assert holds.get(stage, (None, None))[0] == tile, f"stage {stage} does not hold tile {tile}"
            assert holds[stage][1] < guaranteed, f"tile {tile} read before its group is complete everywhere"
        frags[buffer] = (tile, ks)

    for s in range(stages - 1):  # prologue
        write(s, s)
        commit()
    wait(pending)
    barrier()
    read_stage = 0
    write_stage = stages - 1 if first_write_stage is None else first_write_stage
    read(read_stage, 0, 0, 0)
    for kt in range(k_tiles):
        for ks in range(k_steps):
            if ks == k_steps - 1:
                wait(pending)
                barrier()
                read_stage = (read_stage + 1) % stages
            nxt = (ks + 1) % k_steps
            read(read_stage, kt if nxt else kt + 1, nxt, (ks + 1) % 2)
            fetch = kt + stages - 1
            if ks in (0, 1):
                write(write_stage, fetch)  # A tile, then the first half of B
            if ks == 2:
                write(write_stage, fetch)  # the second half of B
                commit()
                write_stage = (write_stage + 1) % stages
            consumed.append(frags[ks % 2])
    wait(0)
    barrier()
    assert not group_writes and local_complete == committed  # the epilogue may reuse every stage
    return consumed


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_pipeline_schedule_has_no_hazards(stages):
    m = model()
    for k_tiles in range(1, 12):
        consumed = simulate_pipeline(k_tiles, stages, m.K_STEPS)
        assert consumed == [(kt, ks) for kt in range(k_tiles) for ks in range(m.K_STEPS)]
    assert m.STAGES in (2, 3, 4, 5) and m.K_STEPS == 4  # the schedule above assumes copies at k-steps 0..2


def test_pipeline_model_catches_wrong_schedules():
    k_steps = model().K_STEPS
    with pytest.raises(AssertionError, match="before its group is complete"):
        simulate_pipeline(8, 4, k_steps, wait_pending=3)  # waiting for one group too few
    with pytest.raises(AssertionError, match="while it may be read"):
        simulate_pipeline(8, 4, k_steps, first_write_stage=0)  # overwriting the stage being read


def emulate_cta(m: Model, x: torch.Tensor, w: torch.Tensor, tile_m: int, tile_n: int, aligned: bool) -> torch.Tensor:
    """One CTA of the kernel, element by element: loader -> swizzled stages -> ldmatrix fragments
    (checked against the ISA's expectation) -> mma (float64) -> epilogue -> its BLOCK_M x BLOCK_N tile.
    aligned: the cp.async loader (whole 16-byte chunks in or out); else the scalar fallback."""
    M, K = x.shape
    N = w.shape[0]
    m0, n0 = tile_m * m.BLOCK_M, tile_n * m.BLOCK_N
    k_tiles = -(-K // m.BLOCK_K)
    acc = {}
    for kt in range(k_tiles):
        k0 = kt * m.BLOCK_K
        stages = {}
        for name, src, rows, base, passes, limit in (("a", x, m.BLOCK_M, m0, m.A_LOADS, M),
                                                     ("b", w, m.BLOCK_N, n0, m.B_LOADS, N)):
            smem: list = [None] * (rows * m.BLOCK_K)
            for tid in range(m.THREADS):
                row, chunk, offset = m.loader(tid)
                for i in range(passes):
                    g_row = base + row + i * m.LOAD_ROWS_PER_PASS
                    k = k0 + chunk * m.VEC
                    slot = m.pass_offset(offset, i) // 2
                    for e in range(m.VEC):
                        if aligned:
                            ok = g_row < limit and k < K
                            assert not ok or k + m.VEC <= K  # the aligned path never splits a chunk
                        else:
                            ok = g_row < limit and e < K - k  # k_left in load_rows_scalar
                        assert smem[slot + e] is None
                        smem[slot + e] = float(src[g_row, k + e]) if ok else 0.0
            assert None not in smem
            stages[name] = smem

        def row_reader(smem):
            return lambda offset: smem[offset // 2: offset // 2 + 8]

        for _, warp_m, warp_n in m.warps():
            fas = [m.fragment_addressing(warp_m, warp_n, lane) for lane in range(32)]
            for ks in range(m.K_STEPS):
                a_tiles = []
                for mt in range(m.WARP_TILES_M):
                    regs = ldmatrix_x4([m.a_fragment_offset(fa, ks, mt) for fa in fas], row_reader(stages["a"]))
                    tile = torch.zeros(16, 16, dtype=torch.float64)
                    for lane in range(32):
                        for i in range(8):
                            tile[ptx_a(lane, i)] = regs[lane][i // 2][i % 2]
                    a_tiles.append(tile)
                b_tiles = []
                for np_ in range(m.WARP_TILES_N // 2):
                    regs = ldmatrix_x4([m.b_fragment_offset(fa, ks, np_) for fa in fas], row_reader(stages["b"]))
                    for half in range(2):
                        tile = torch.zeros(16, 8, dtype=torch.float64)
                        for lane in range(32):
                            for i in range(4):
                                tile[ptx_b(lane, i)] = regs[lane][2 * half + i // 2][i % 2]
                        b_tiles.append(tile)
                for mt in range(m.WARP_TILES_M):
                    for nt in range(m.WARP_TILES_N):
                        key = (warp_m, warp_n, mt, nt)
                        acc[key] = acc.get(key, 0) + a_tiles[mt] @ b_tiles[nt]  # D += A B, per the ISA
    out = torch.full((m.BLOCK_M, m.BLOCK_N), float("nan"), dtype=torch.float64)
    for (warp_m, warp_n, mt, nt), d in acc.items():
        for lane in range(32):
            for half in range(2):
                row = m.accumulator_row(warp_m, mt, lane) + half * m.ACC_ROW_HALF
                col = m.accumulator_col(warp_n, nt, lane)
                for e in range(2):
                    out[row, col + e] = d[ptx_c(lane, 2 * half + e)]
    return out


@pytest.mark.parametrize("shape, aligned", [((100, 200, 72), True), ((130, 300, 136), True), ((70, 90, 77), False),
                                            ((40, 260, 130), False)])
def test_emulated_ctas_compute_the_gemm(shape, aligned):
    """Whole CTAs, edge tiles included (partial M, N and K tiles, zero fill, K % 8 != 0 for the
    fallback loader), give x @ W.T exactly in float64 (integer-valued inputs: no rounding)."""
    m = model()
    M, N, K = shape
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randint(-8, 9, (M, K), generator=gen, dtype=torch.float64)
    w = torch.randint(-8, 9, (N, K), generator=gen, dtype=torch.float64)
    expected = x @ w.T
    tiles_m, tiles_n = -(-M // m.BLOCK_M), -(-N // m.BLOCK_N)
    for block in range(tiles_m * tiles_n):
        tile_m, tile_n = m.tile_coordinates(block, tiles_m, tiles_n)
        tile = emulate_cta(m, x, w, tile_m, tile_n, aligned)
        assert not tile.isnan().any()  # every staged element written
        rows = slice(tile_m * m.BLOCK_M, min(M, (tile_m + 1) * m.BLOCK_M))
        cols = slice(tile_n * m.BLOCK_N, min(N, (tile_n + 1) * m.BLOCK_N))
        got = tile[: rows.stop - rows.start, : cols.stop - cols.start]
        assert torch.equal(got, expected[rows, cols])
        assert not tile[rows.stop - rows.start:, :].any() and not tile[:, cols.stop - cols.start:].any()


# ---------------------------------------------------------------------------------------------
# The model against the kernel's own helpers, built for the host by nvcc
# ---------------------------------------------------------------------------------------------

# The tile each block of a grid computes (tile_coordinates), printed by both experts' harnesses.
PRINT_TILES = r"""    const int grids[][2] = {{32, 16}, {1, 16}, {16, 12}, {1, 1}, {33, 7}, {9, 3}};
    for (const auto& g : grids)
        for (int b = 0; b < g[0] * g[1]; ++b) {
            int tm, tn;
            tile_coordinates(b, g[0], g[1], tm, tn);
            printf("tile %d %d %d %d %d\n", g[0], g[1], b, tm, tn);
        }
"""

HARNESS = r"""
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
// Make the kernel's __device__ helpers callable from host code; the asm helpers are never called
// here, and an inline function nobody calls is never emitted for the host. Device-only intrinsics
// in templates that the kernel instantiates become inert stubs: this program never launches it.
#undef __device__
#define __device__ __attribute__((host)) __attribute__((device))
#define __syncthreads() ((void)0)
#define __cvta_generic_to_shared(p) ((size_t)0)
#define __ldg(p) (*(p))
#include "KERNEL_CU"

static bf16 xs[1 << 23], ws[1 << 23];

int main()
{
    for (int row = 0; row < BLOCK_N; ++row)
        for (int c = 0; c < CHUNKS_PER_ROW; ++c) printf("swizzle %d %d %u\n", row, c, swizzle_offset(row, c));
""" + PRINT_TILES + r"""    const int cases[][5] = {{100, 200, 72, 0, 0}, {1999, 3001, 2056, 1920, 2816},
                            {64, 80, 96, 0, 0}, {300, 600, 77, 256, 512}};
    for (const auto& c : cases)
        for (int tid = 0; tid < THREADS; ++tid) {
            const TileLoader ld = make_tile_loader(xs, ws, c[0], c[1], c[2], c[3], c[4], tid);
            printf("loader %d %d %d %d %d %d %lld %lld %u %u %u %d %lld %d", c[0], c[1], c[2], c[3], c[4], tid,
                   (long long)(ld.a_src - xs), (long long)(ld.b_src - ws), ld.a_valid, ld.b_valid, ld.smem_offset,
                   ld.k_chunk, ld.row_step, ld.K);
            for (int i = 0; i < B_LOADS; ++i) printf(" %u", pass_offset(ld.smem_offset, i));
            printf("\n");
        }
    for (int warp = 0; warp < THREADS / WARP_SIZE; ++warp)
        for (int lane = 0; lane < WARP_SIZE; ++lane) {
            const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
            const FragmentAddressing fa = make_fragment_addressing(warp_m, warp_n, lane);
            for (int ks = 0; ks < K_STEPS; ++ks) {
                for (int mt = 0; mt < WARP_TILES_M; ++mt)
                    printf("afrag %d %d %d %d %u\n", warp, lane, ks, mt, a_fragment_offset(fa, ks, mt));
                for (int np = 0; np < WARP_TILES_N / 2; ++np)
                    printf("bfrag %d %d %d %d %u\n", warp, lane, ks, np, b_fragment_offset(fa, ks, np));
            }
            for (int mt = 0; mt < WARP_TILES_M; ++mt)
                for (int nt = 0; nt < WARP_TILES_N; ++nt)
                    printf("acc %d %d %d %d %d %d\n", warp, lane, mt, nt, accumulator_row(warp_m, mt, lane),
                           accumulator_col(warp_n, nt, lane));
        }
    return 0;
}
"""


@pytest.fixture(scope="module", params=MMA)
def host_tables(request, tmp_path_factory) -> dict[str, list[list[int]]]:
    work = tmp_path_factory.mktemp(f"harness-{request.param}")
    (work / "harness.cu").write_text(HARNESS.replace("KERNEL_CU", str(KERNELS / request.param / "kernel.cu")))
    return run_host_harness(work)


def test_kernel_helpers_match_the_model(host_tables):
    m = model()
    assert len(host_tables["swizzle"]) == m.BLOCK_N * m.CHUNKS_PER_ROW
    for row, chunk, offset in host_tables["swizzle"]:
        assert offset == m.swizzle_offset(row, chunk)
    for tiles_m, tiles_n, block, tm, tn in host_tables["tile"]:
        assert (tm, tn) == m.tile_coordinates(block, tiles_m, tiles_n)
    assert len(host_tables["loader"]) == 4 * m.THREADS
    for row_values in host_tables["loader"]:
        M, N, K, m0, n0, tid, a_src, b_src, a_valid, b_valid, offset, k_chunk, row_step, k_arg, *passes = row_values
        row, chunk, model_offset = m.loader(tid)
        assert (offset, k_chunk, row_step, k_arg) == (model_offset, chunk * m.VEC, m.LOAD_ROWS_PER_PASS * K, K)
        assert a_src == (m0 + row) * K + chunk * m.VEC and b_src == (n0 + row) * K + chunk * m.VEC
        assert a_valid == sum(1 << i for i in range(m.A_LOADS) if m0 + row + i * m.LOAD_ROWS_PER_PASS < M)
        assert b_valid == sum(1 << i for i in range(m.B_LOADS) if n0 + row + i * m.LOAD_ROWS_PER_PASS < N)
        assert passes == [m.pass_offset(model_offset, i) for i in range(m.B_LOADS)]
    for kind, offset_fn in (("afrag", m.a_fragment_offset), ("bfrag", m.b_fragment_offset)):
        for warp, lane, ks, t, offset in host_tables[kind]:
            fa = m.fragment_addressing(*m.warp_position(warp, m.WARPS_N), lane)
            assert offset == offset_fn(fa, ks, t), (kind, warp, lane, ks, t)
    assert len(host_tables["afrag"]) == m.THREADS * m.K_STEPS * m.WARP_TILES_M
    assert len(host_tables["acc"]) == m.THREADS * m.WARP_TILES_M * m.WARP_TILES_N
    for warp, lane, mt, nt, row, col in host_tables["acc"]:
        warp_m, warp_n = m.warp_position(warp, m.WARPS_N)
        assert (row, col) == (m.accumulator_row(warp_m, mt, lane), m.accumulator_col(warp_n, nt, lane))


def test_kernel_sources_share_the_expert():
    """mma_sync_any is mma_sync plus the fallback loader: every helper of mma_sync appears in it verbatim."""
    base = kernel("mma_sync").source
    other = kernel("mma_sync_any").source
    helpers = re.findall(r"^__device__ __forceinline__ [^\n]*?(\w+)\(", base, re.MULTILINE)
    assert len(helpers) >= 15
    for name in helpers:
        body = re.search(rf"^__device__ __forceinline__ [^\n]*?\b{name}\(.*?^}}", base, re.MULTILINE | re.DOTALL)
        assert body and body.group(0) in other, name


# ---------------------------------------------------------------------------------------------
# The wgmma + TMA expert (sm_90a): plan, compile, SASS, and models of its index math and pipeline
# ---------------------------------------------------------------------------------------------

WGMMA = "wgmma_tma"
WGMMA_ENTRY = "gemm_bf16_wgmma_tma"


def test_wgmma_plan_resolves_for_every_supported_case():
    state = kernel(WGMMA)
    c = state.constants
    assert state.plan.problem == "gemm" and state.plan.arch == "sm_90a"
    assert [launch.entry for launch in state.plan.launches] == [WGMMA_ENTRY]
    cases = {case.name: case.params for case in problem().info.cases}
    supported = {name for name, p in cases.items() if state.plan.supports_case(p)}
    assert supported == {"headline", "ragged_mn", "skinny", "small"}
    assert "16 bytes" in state.plan.supports_reason and "K % 8 == 0" in state.plan.supports_reason
    for name in supported:
        M, N, K = (cases[name][d] for d in "MNK")
        (launch,) = resolve(state.plan, env_for(state, cases[name]), buffers())
        assert launch.block == (c["THREADS"], 1, 1) == (384, 1, 1)
        assert launch.grid == (cdiv(M, c["BLOCK_M"]) * cdiv(N, c["BLOCK_N"]), 1, 1)
        assert launch.shared == c["SMEM_BYTES"] <= SMEM_LIMIT
        x_map, w_map, *rest = launch.args
        assert x_map == ("tensor_map", "x", TensorMap("bf16", (K, M), (2 * K,), (c["BLOCK_K"], c["BLOCK_M"]),
                                                      "128B", "256B"))
        assert w_map == ("tensor_map", "W", TensorMap("bf16", (K, N), (2 * K,), (c["BLOCK_K"], c["BLOCK_N"]),
                                                      "128B", "256B"))
        assert x_map[2].extent_bytes == M * K * 2 and w_map[2].extent_bytes == N * K * 2  # exactly the inputs
        assert rest == [("buffer", "y", ""), ("scalar", M, "i32"), ("scalar", N, "i32"), ("scalar", K, "i32")]
    for name in set(cases) - supported:  # outside the domain the maps themselves are refused
        with pytest.raises(DocumentError, match=r"strides\[0\] = \d+ bytes must be a positive multiple of 16"):
            resolve(state.plan, env_for(state, cases[name]), buffers())


def test_wgmma_mechanism_constants():
    c = kernel(WGMMA).constants
    assert (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["STAGES"]) == (128, 256, 64, 4)
    assert (c["THREADS"], c["CONSUMER_WARPGROUPS"], c["WG_M"], c["WGMMA_N"], c["ACC_REGS"]) == (384, 2, 64, 256, 128)
    assert c["ROW_BYTES"] == c["SWIZZLE_BYTES"] == 128 and c["SWIZZLE_ATOM_BYTES"] == 1024
    assert c["STAGE_BYTES"] == (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2 == 48 * 1024
    assert c["SMEM_BYTES"] == c["SMEM_ALIGN"] + c["STAGES"] * c["STAGE_BYTES"] + 2 * c["STAGES"] * 8
    assert (c["PRODUCER_REGS"], c["CONSUMER_REGS"]) == (40, 232)
    assert 128 * c["PRODUCER_REGS"] + 256 * c["CONSUMER_REGS"] <= 65536
    assert c["DESC_SBO_BYTES"] == 1024 and c["DESC_K_STEP"] == 2 and c["DESC_SWIZZLE_128B"] == 1
    assert c["GROUP_M"] >= 1 and c["VEC"] == 8 and c["EPI_PAD"] == 8


def test_wgmma_static_check():
    static = pytest.importorskip("klineage.gate.static")
    report = static.static_check(kernel(WGMMA))
    assert report.ok, report.to_dict()


@pytest.fixture(scope="module")
def wgmma_compiled(gate_cache) -> CompileResult:
    # Into the gate cache's compile folder, so that the compile-only gate below loads this result.
    return compile_kernel(kernel(WGMMA), gate_cache.local.root)


def test_wgmma_compiles_for_sm90a_without_spills(wgmma_compiled):
    res = sm90a_resources(wgmma_compiled, WGMMA_ENTRY)
    # __launch_bounds__(384, 1): 65536 / 384 registers, rounded down to a multiple of 8, at launch;
    # setmaxnreg then moves registers from the producer to the consumers.
    assert res.registers == 168, res
    assert res.barriers == 4  # __syncthreads, the consumers' barrier and one per consumer warpgroup


def test_wgmma_sass_has_every_mechanism(wgmma_compiled):
    c = kernel(WGMMA).constants
    mnemonics = sass_mnemonics(wgmma_compiled.cubin_bytes("sm_90a"))
    ops = sass_opcodes(wgmma_compiled, "sm_90a")
    # Warpgroup MMA: one k-tile's K_STEPS m64n256k16 instructions, all bf16 -> fp32, no mma.sync.
    assert mnemonics["HGMMA"] == c["K_STEPS"] == count(ops, r"^HGMMA\.64x256x16\.F32\.BF16$")
    assert mnemonics["WARPGROUP"] >= 2  # WARPGROUP.ARRIVE (wgmma.fence) and DEPBAR (wait_group)
    assert count(ops, r"^WARPGROUP\.DEPBAR\.LE$") == 2 and count(ops, r"^WARPGROUP\.ARRIVE$") == 1
    # TMA: two 2-D tensor loads (x and W tiles) and the descriptor prefetches.
    assert mnemonics["UTMALDG"] == 2 == count(ops, r"^UTMALDG\.2D$")
    assert count(ops, r"^UTMACCTL\.PF$") == 2
    # mbarriers: init, expect-tx arrive, consumer arrive, phase waits.
    assert count(ops, r"^SYNCS\.EXCH\.64$") == 2 * c["STAGES"]
    assert count(ops, r"^SYNCS\.ARRIVE\.TRANS64") >= 2 and count(ops, r"^SYNCS\.PHASECHK\.TRANS64\.TRYWAIT$") >= 2
    # Register rebalancing between the producer and the consumers.
    assert count(ops, r"^USETMAXREG\.DEALLOC") == 1 and count(ops, r"^USETMAXREG\.TRY_ALLOC") == 1
    # Every global read is a TMA load; nothing of the Ampere path is left; no local memory.
    assert sum(mnemonics[m] for m in ("LDG", "LDGSTS", "LDSM", "HMMA", "LDL", "STL")) == 0
    # Epilogue: bf16x2 packing, 4-byte staged stores, 16-byte reads and global stores (and the element path).
    assert count(ops, r"^F2FP\.BF16\.F32\.PACK_AB$") == c["ACC_REGS"] // 2
    assert count(ops, r"^STS$") == c["ACC_REGS"] // 2
    assert count(ops, r"^LDS\.128$") >= 1 and count(ops, r"^STG\.E\.128$") >= 1 and count(ops, r"^STG\.E\.U16$") >= 1
    assert count(ops, r"^BAR\.SYNC\b") == 4


# Host build of the kernel's own index helpers.

WGMMA_HARNESS = r"""
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#undef __device__
#define __device__ __attribute__((host)) __attribute__((device))
#define __syncthreads() ((void)0)
#define __cvta_generic_to_shared(p) ((size_t)0)
#include "KERNEL_CU"

int main()
{
    const unsigned addresses[] = {0x400u, 0x800u, 0x4400u, 0xc400u, 0x30400u, 0x3fc00u, 0x40400u, 0x1000400u};
    for (unsigned a : addresses) printf("desc %u %llu\n", a, (unsigned long long)smem_descriptor(a));
""" + PRINT_TILES + r"""    for (int warp = 0; warp < WARPGROUP_THREADS / WARP_SIZE; ++warp)
        for (int lane = 0; lane < WARP_SIZE; ++lane) printf("accrow %d %d %d\n", warp, lane, accumulator_row(warp, lane));
    for (int g = 0; g < ACC_REGS / 4; ++g)
        for (int lane = 0; lane < WARP_SIZE; ++lane) printf("acccol %d %d %d\n", g, lane, accumulator_col(g, lane));
    for (int t = 0; t < WARPGROUP_THREADS; ++t)
        for (int p = 0; p < EPI_VEC_PASSES; ++p) {
            int row, col;
            epilogue_chunk(t, p, row, col);
            printf("chunk %d %d %d %d\n", t, p, row, col);
        }
    return 0;
}
"""  # noqa: E501  (C++ harness source, kept as written)


@pytest.fixture(scope="module")
def wgmma_tables(tmp_path_factory) -> dict[str, list[list[int]]]:
    work = tmp_path_factory.mktemp("harness-wgmma")
    (work / "harness.cu").write_text(WGMMA_HARNESS.replace("KERNEL_CU", str(KERNELS / WGMMA / "kernel.cu")))
    return run_host_harness(work, arch="sm_90a")


def wgmma_descriptor(c: dict, address: int) -> int:
    """The PTX ISA's shared-memory matrix descriptor: start address >> 4 in bits 0-13, leading byte
    offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, base offset 0 in 49-51, swizzle in 62-63."""
    return (((address & 0x3FFFF) >> 4) | (c["DESC_LBO_BYTES"] >> 4) << 16 | (c["DESC_SBO_BYTES"] >> 4) << 32
            | c["DESC_SWIZZLE_128B"] << 62)


def tma_offset(row: int, k: int) -> int:
    """Byte offset from a 1024-aligned tile base where a 128B-swizzled TMA box stores element
    (row, k) of a box whose rows are 64 bf16 (128 bytes)."""
    return swizzle_128b(row * 128 + k * 2)


def wgmma_operand_offset(c: dict, desc_start: int, row: int, kk: int) -> int:
    """Byte address wgmma reads for element (row, k = kk) of a K-major operand slice, given the
    descriptor's start address: the canonical 128B-swizzle layout of 8-row groups SBO bytes apart,
    128-byte rows, bf16 contiguous along K, swizzled on the absolute address."""
    return swizzle_128b(desc_start + (row // 8) * c["DESC_SBO_BYTES"] + (row % 8) * c["ROW_BYTES"] + kk * 2)


def test_wgmma_descriptors_match_the_isa(wgmma_tables):
    c = kernel(WGMMA).constants
    assert len(wgmma_tables["desc"]) == 8
    for address, desc in wgmma_tables["desc"]:
        assert desc == wgmma_descriptor(c, address), hex(address)
    # Advancing a descriptor by DESC_K_STEP moves its start address by one k16 slice (32 bytes),
    # with no carry out of the 14-bit field for any stage address below 256 KiB.
    base = wgmma_descriptor(c, 0x400)
    assert base + c["DESC_K_STEP"] == wgmma_descriptor(c, 0x400 + c["WGMMA_K"] * 2)
    top = 0x400 + c["SMEM_BYTES"]
    assert wgmma_descriptor(c, top) + 3 * c["DESC_K_STEP"] == wgmma_descriptor(c, top + 3 * 32) and top < 1 << 18


def test_wgmma_reads_what_tma_wrote():
    """For every stage tile the kernel addresses (A rows of each consumer, all B rows), k16 step and
    element, the descriptor's address is where the 128B-swizzled TMA box put that element."""
    c = kernel(WGMMA).constants
    base = 0x400  # any 1024-aligned address: the swizzle pattern repeats every 1024 bytes
    for stage in range(c["STAGES"]):
        tiles = [(base + stage * c["STAGE_BYTES"] + consumer * c["WG_A_BYTES"], consumer * c["WG_M"], c["WGMMA_M"])
                 for consumer in range(c["CONSUMER_WARPGROUPS"])]
        tiles.append((base + stage * c["STAGE_BYTES"] + c["A_STAGE_BYTES"], 0, c["BLOCK_N"]))
        box_base = [base + stage * c["STAGE_BYTES"], base + stage * c["STAGE_BYTES"] + c["A_STAGE_BYTES"]]
        for start, first_row, rows in tiles:
            assert start % c["SWIZZLE_ATOM_BYTES"] == 0  # base offset 0 in the descriptor is right
            box = box_base[0] if rows == c["WGMMA_M"] else box_base[1]
            for ks in range(c["K_STEPS"]):
                desc_start = start + ks * c["DESC_K_STEP"] * 16
                for row in range(rows):
                    for kk in range(c["WGMMA_K"]):
                        got = wgmma_operand_offset(c, desc_start, row, kk)
                        assert got == box + tma_offset(first_row + row, ks * c["WGMMA_K"] + kk)
    # The same model with a wrong stride byte offset or k step disagrees with TMA: the check has teeth.
    wrong = {**c, "DESC_SBO_BYTES": 512}
    assert wgmma_operand_offset(wrong, base, 8, 0) != base + tma_offset(8, 0)
    assert wgmma_operand_offset(c, base + 16, 0, 0) != base + tma_offset(0, c["WGMMA_K"])


def test_wgmma_accumulators_and_epilogue(wgmma_tables):
    c = kernel(WGMMA).constants
    rows = {(w, lane): r for w, lane, r in wgmma_tables["accrow"]}
    cols = {(g, lane): col for g, lane, col in wgmma_tables["acccol"]}
    cover = Counter()
    for t in range(c["WARPGROUP_THREADS"]):
        warp, lane = t // 32, t % 32
        for i in range(c["ACC_REGS"]):
            row = rows[(warp, lane)] + (c["ACC_ROW_HALF"] if i % 4 >= 2 else 0)
            col = cols[(i // 4, lane)] + i % 2
            assert (row, col) == ptx_wgmma_d(t, i)
            cover[(row, col)] += 1
    assert set(cover) == {(r, col) for r in range(c["WG_M"]) for col in range(c["BLOCK_N"])}
    assert set(cover.values()) == {1}
    # Staged bf16x2 stores: the 32 lanes of one store hit 32 different banks.
    for warp in range(4):
        for g in range(c["ACC_REGS"] // 4):
            for half in range(2):
                words = [((rows[(warp, lane)] + half * c["ACC_ROW_HALF"]) * c["EPI_STRIDE"] + cols[(g, lane)]) // 2
                         for lane in range(32)]
                assert len({w % 32 for w in words}) == 32
    # 16-byte chunks: each once; a warp's pass is one contiguous 512-byte row segment of y; 8 lanes
    # at a time read 8 different 16-byte bank groups of the staged row.
    chunks = Counter()
    by_pass: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for t, p, row, col in wgmma_tables["chunk"]:
        chunks[(row, col)] += 1
        by_pass.setdefault((t // 32, p), []).append((row, col))
    assert set(chunks) == {(r, col) for r in range(c["WG_M"]) for col in range(0, c["BLOCK_N"], c["VEC"])}
    assert set(chunks.values()) == {1}
    for cells in by_pass.values():
        assert len({r for r, _ in cells}) == 1 and [col for _, col in cells] == list(range(0, c["BLOCK_N"], c["VEC"]))
        for q in range(0, 32, 8):
            addresses = [r * c["EPI_STRIDE"] * 2 + col * 2 for r, col in cells[q:q + 8]]
            assert sorted(bank_groups(addresses)) == list(range(8))
    assert c["CONSUMER_WARPGROUPS"] * c["EPI_WG_BYTES"] <= c["STAGES"] * c["STAGE_BYTES"]


def test_wgmma_rasterization_matches_the_mma_expert(wgmma_tables):
    m = model()
    assert kernel(WGMMA).constants["GROUP_M"] == m.GROUP_M
    for tiles_m, tiles_n, block, tm, tn in wgmma_tables["tile"]:
        assert (tm, tn) == m.tile_coordinates(block, tiles_m, tiles_n)


def emulate_wgmma_cta(c: dict, tables: dict, x: torch.Tensor, w: torch.Tensor, tile_m: int, tile_n: int,
                      y: torch.Tensor) -> None:
    """One CTA: TMA boxes (zero outside the tensor) into swizzled stages, wgmma operands read through
    the descriptors, D += A B^T in float64 per consumer warpgroup, accumulators by the ISA's D layout,
    staged rows and the bounds-checked 16-byte stores into y (rows of y 16-byte aligned)."""
    M, K = x.shape
    N = w.shape[0]
    m0, n0 = tile_m * c["BLOCK_M"], tile_n * c["BLOCK_N"]
    base = 0x400
    acc = [torch.zeros(c["WG_M"], c["BLOCK_N"], dtype=torch.float64) for _ in range(c["CONSUMER_WARPGROUPS"])]
    for kt in range(cdiv(K, c["BLOCK_K"])):
        smem = {}
        for src, rows, origin, tile in ((x, c["BLOCK_M"], m0, base), (w, c["BLOCK_N"], n0, base + c["A_STAGE_BYTES"])):
            box = torch.zeros(rows, c["BLOCK_K"], dtype=torch.float64)
            part = src[origin:origin + rows, kt * c["BLOCK_K"]:(kt + 1) * c["BLOCK_K"]]
            box[:part.shape[0], :part.shape[1]] = part  # the tensor map's out-of-bounds fill is zero
            for r in range(rows):
                for k in range(c["BLOCK_K"]):
                    smem[tile + tma_offset(r, k)] = float(box[r, k])
        for consumer in range(c["CONSUMER_WARPGROUPS"]):
            a_start = base + consumer * c["WG_A_BYTES"]
            b_start = base + c["A_STAGE_BYTES"]
            for ks in range(c["K_STEPS"]):
                a = torch.tensor([[smem[wgmma_operand_offset(c, a_start + 32 * ks, r, kk)]
                                   for kk in range(c["WGMMA_K"])] for r in range(c["WGMMA_M"])], dtype=torch.float64)
                b = torch.tensor([[smem[wgmma_operand_offset(c, b_start + 32 * ks, n, kk)]
                                   for kk in range(c["WGMMA_K"])] for n in range(c["BLOCK_N"])], dtype=torch.float64)
                acc[consumer] += a @ b.T
    rows = {(wp, lane): r for wp, lane, r in tables["accrow"]}
    cols = {(g, lane): col for g, lane, col in tables["acccol"]}
    for consumer in range(c["CONSUMER_WARPGROUPS"]):
        staged = torch.full((c["WG_M"], c["EPI_STRIDE"]), float("nan"), dtype=torch.float64)
        for t in range(c["WARPGROUP_THREADS"]):
            regs = [acc[consumer][ptx_wgmma_d(t, i)] for i in range(c["ACC_REGS"])]  # what the hardware leaves
            for i, value in enumerate(regs):
                row = rows[(t // 32, t % 32)] + (c["ACC_ROW_HALF"] if i % 4 >= 2 else 0)
                staged[row, cols[(i // 4, t % 32)] + i % 2] = value
        for _t, _p, row, col in tables["chunk"]:
            gm, gn = m0 + consumer * c["WG_M"] + row, n0 + col
            if gm < M and gn < N:
                assert not y[gm, gn:gn + c["VEC"]].isfinite().any()  # each element of y written once
                y[gm, gn:gn + c["VEC"]] = staged[row, col:col + c["VEC"]]


@pytest.mark.parametrize("shape", [(100, 264, 72), (130, 520, 136), (64, 80, 96)])
def test_emulated_wgmma_ctas_compute_the_gemm(wgmma_tables, shape):
    """Whole CTAs with edge tiles (partial M, N and K tiles filled with zeros by TMA) give x @ W.T
    exactly in float64 (integer-valued inputs), every element of y written once and nothing else."""
    c = kernel(WGMMA).constants
    M, N, K = shape
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randint(-8, 9, (M, K), generator=gen, dtype=torch.float64)
    w = torch.randint(-8, 9, (N, K), generator=gen, dtype=torch.float64)
    y = torch.full((M, N + 8), float("nan"), dtype=torch.float64)  # 8 guard columns past N
    tiles_m, tiles_n = cdiv(M, c["BLOCK_M"]), cdiv(N, c["BLOCK_N"])
    for block in range(tiles_m * tiles_n):
        tile_m, tile_n = model().tile_coordinates(block, tiles_m, tiles_n)
        emulate_wgmma_cta(c, wgmma_tables, x, w, tile_m, tile_n, y)
    assert torch.equal(y[:, :N], x @ w.T)
    assert y[:, N:].isnan().all()


def simulate_mbarrier_pipeline(k_tiles: int, stages: int, seed: int, consumer_warps: int = 8,
                               release_before_wait: bool = False, producer_parity: int = 1) -> None:
    """The kernel's producer / consumer protocol under a random schedule (transcribed from produce
    and consume): one producer thread, consumer warps that each wait for the full barrier, issue an
    MMA group reading the stage, wait until at most one group is pending and then release the previous
    stage; TMA copies and MMA groups finish at random later times. Raises AssertionError on a hazard
    (TMA writing a stage an unfinished MMA group reads, an MMA group issued on a stage that does not
    hold its K tile) or a deadlock. release_before_wait and producer_parity break the protocol on
    purpose, to show the model notices."""
    rng = random.Random(seed)
    tile_bytes = 1
    full = [MBarrier(1) for _ in range(stages)]
    empty = [MBarrier(consumer_warps) for _ in range(stages)]
    holds = [None] * stages  # K tile whose TMA copy into the stage has completed
    copying: dict[int, int] = {}  # stage -> K tile being copied
    producer = 0  # next K tile to load
    warps = [{"kt": 0, "groups": [], "waiting": False, "done": False} for _ in range(consumer_warps)]

    def reading(stage):
        return any(stage == s for wp in warps for s, _ in wp["groups"])

    steps = 0
    while not all(wp["done"] for wp in warps) or copying:
        steps += 1
        assert steps < 100_000
        actions = []
        if producer < k_tiles:
            s, rnd = producer % stages, producer // stages
            if empty[s].ready((rnd & 1) ^ 1 ^ (1 - producer_parity), rnd - 1 if rnd else -1):
                actions.append(("produce", s))
        for stage in copying:
            actions.append(("land", stage))
        for i, wp in enumerate(warps):
            if wp["done"]:
                continue
            if wp["groups"]:
                actions.append(("finish", i))
            if wp["waiting"]:  # in wgmma.wait_group 1 (or 0 at the end)
                limit = 0 if wp["kt"] == k_tiles else 1
                if len(wp["groups"]) <= limit:
                    actions.append(("resume", i))
            elif wp["kt"] < k_tiles:
                s, rnd = wp["kt"] % stages, wp["kt"] // stages
                if full[s].ready(rnd & 1, rnd):
                    actions.append(("issue", i))
        assert actions, "deadlock"
        kind, who = rng.choice(actions)
        if kind == "produce":
            s = who
            assert not reading(s), f"TMA overwrites stage {s} while an MMA group still reads it"
            full[s].arrive(expect_tx=2 * tile_bytes)
            copying[s] = producer
            producer += 1
        elif kind == "land":
            holds[who] = copying.pop(who)
            full[who].complete_tx(2 * tile_bytes)
        elif kind == "finish":
            warps[who]["groups"].pop(0)  # groups complete in order
        elif kind == "issue":
            wp = warps[who]
            s = wp["kt"] % stages
            assert holds[s] == wp["kt"] and s not in copying, f"stage {s} does not hold K tile {wp['kt']}"
            wp["groups"].append((s, wp["kt"]))
            if release_before_wait and wp["kt"] > 0:
                empty[(wp["kt"] - 1) % stages].arrive()
            wp["kt"] += 1
            wp["waiting"] = True
        elif kind == "resume":
            wp = warps[who]
            wp["waiting"] = False
            if wp["kt"] > 1 and not release_before_wait:
                empty[(wp["kt"] - 2) % stages].arrive()  # the stage of K tile kt - 1 (kt already advanced)
            if wp["kt"] == k_tiles and not wp["groups"]:
                wp["done"] = True
    assert producer == k_tiles and all(h is not None for h in holds[:min(stages, k_tiles)])


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_wgmma_pipeline_protocol_is_safe(stages):
    assert kernel(WGMMA).constants["STAGES"] in (2, 3, 4, 5)
    for k_tiles in (1, 2, 3, 5, 9, 17):
        for seed in range(20):
            simulate_mbarrier_pipeline(k_tiles, stages, seed)


def test_wgmma_pipeline_model_catches_wrong_protocols():
    with pytest.raises(AssertionError, match="while an MMA group still reads it"):
        for seed in range(50):
            simulate_mbarrier_pipeline(12, 4, seed, release_before_wait=True)
    with pytest.raises(AssertionError):  # a producer that waits for the wrong parity
        for seed in range(50):
            simulate_mbarrier_pipeline(12, 4, seed, producer_parity=0)


def test_wgmma_passes_the_gate_up_to_the_gpu(gate_cache):
    """Compile-only gate: static check, sm_90a compile, SASS features and the plan resolved on an
    H200 for every supported case (tensor maps included); unsupported cases are skipped, not run."""
    assert_compiles_up_to_the_gpu(PROBLEM, kernel(WGMMA), gate_cache, {"headline", "ragged_mn", "skinny", "small"},
                                  {"ragged", "odd_k"})
