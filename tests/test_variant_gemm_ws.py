"""The warp-specialized mma.sync GEMM variant (bench/variants/gemm_mma_sync_ws), checked without a GPU.

- Its plan resolves for every GEMM case in its domain (K % 8 == 0) with 384 threads and the ring
  plus its mbarriers as dynamic shared memory, and it passes the gate's static check.
- It compiles with the real nvcc as the gate builds it (sm_90a): no spills, no stack, at most 168
  registers (so 384 threads launch), and the gate's own SASS feature reader finds tensor-core MMAs,
  ldmatrix, cp.async and mbarrier instructions; setmaxnreg is there, and the only CTA-wide barrier
  (barrier 0) is the one before the role split.
- The producer's copy addressing (transcribed from copy_tile_rows) covers each tile once, zero-fills
  exactly the rows past M / N and the chunks past K, and never names an out-of-bounds source.
- The full / empty mbarrier protocol (transcribed from run_producer and run_consumer) is run under
  random schedules for hazards and deadlocks, including K tiles fewer than the stages.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest

from corpus_tools import SMEM_LIMIT, buffer_names
from cuda_tools import MBarrier, cdiv
from klineage.devices import H200
from klineage.features.sass import SassFeatures, disassemble
from klineage.gate import pipeline
from klineage.gate.compile import CompileResult, compile_kernel
from klineage.kernel import KernelState, load_kernel
from klineage.launch import resolve
from klineage.problem import load_problem

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "bench" / "variants" / "gemm_mma_sync_ws"
CORPUS = ROOT / "corpus" / "kernels" / "gemm" / "mma_sync"
PROBLEM = ROOT / "corpus" / "problems" / "gemm.py"
ENTRY = "gemm_bf16_mma_sync_ws"
MAX_REGISTERS = 168  # 65536 / 384 rounded down to a multiple of 8: what lets 384 threads launch


@cache
def variant() -> KernelState:
    return load_kernel(FOLDER)


@cache
def problem():
    return load_problem(PROBLEM)


# ---------------------------------------------------------------------------------------------
# Plan, constants, static check
# ---------------------------------------------------------------------------------------------


def test_plan_resolves_for_every_supported_case():
    state = variant()
    c = state.constants
    assert state.plan.problem == "gemm" and state.plan.arch == "sm_90a"
    assert [launch.entry for launch in state.plan.launches] == [ENTRY]
    cases = {case.name: case.params for case in problem().info.cases}
    supported = {name for name, p in cases.items() if state.plan.supports_case(p)}
    corpus = load_kernel(CORPUS)
    assert supported == {name for name, p in cases.items() if corpus.plan.supports_case(p)}
    assert supported == {"headline", "ragged_mn", "skinny", "small"}
    for name in supported:
        params = cases[name]
        (launch,) = resolve(state.plan, {**params, **c, **H200.facts()}, buffer_names(problem()))
        assert launch.block == (c["THREADS"], 1, 1) == (384, 1, 1)
        tiles = cdiv(params["M"], c["BLOCK_M"]) * cdiv(params["N"], c["BLOCK_N"])
        assert launch.grid == (tiles, 1, 1)
        assert launch.shared == c["SMEM_BYTES"] == c["RING_BYTES"] + 2 * c["STAGES"] * 8 <= SMEM_LIMIT
        assert [a[1] for a in launch.args] == ["x", "W", "y", params["M"], params["N"], params["K"]]


def test_constants_match_the_corpus_tiling_and_fit_the_register_file():
    c, corpus = variant().constants, load_kernel(CORPUS).constants
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "WARP_M", "WARP_N", "GROUP_M", "EPI_PAD", "VEC"):
        assert c[name] == corpus[name], name
    assert (c["PRODUCER_THREADS"], c["CONSUMER_THREADS"], c["THREADS"]) == (128, 256, 384)
    assert c["PRODUCER_REGS"] % 8 == 0 and c["CONSUMER_REGS"] % 8 == 0
    assert 24 <= c["PRODUCER_REGS"] <= MAX_REGISTERS <= c["CONSUMER_REGS"] <= 256
    assert c["PRODUCER_THREADS"] * c["PRODUCER_REGS"] + c["CONSUMER_THREADS"] * c["CONSUMER_REGS"] <= 65536
    # The pool the consumers grow from is what the producer gives back (168 each at launch).
    assert (c["PRODUCER_THREADS"] * (MAX_REGISTERS - c["PRODUCER_REGS"])
            >= c["CONSUMER_THREADS"] * (c["CONSUMER_REGS"] - MAX_REGISTERS))


def test_static_check():
    static = pytest.importorskip("klineage.gate.static")
    report = static.static_check(variant())
    assert report.ok, report.to_dict()


# ---------------------------------------------------------------------------------------------
# Compile (real nvcc) and SASS
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled() -> CompileResult:
    return compile_kernel(variant())  # no cache: the cubin stays in memory


@pytest.fixture(scope="module")
def features(compiled, tmp_path_factory) -> SassFeatures:
    """The gate's own reader (pipeline._sass_features_cached), with its cache in a folder of ours."""
    assert compiled.ok, compiled.log
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KLINEAGE_CACHE_DIR", str(tmp_path_factory.mktemp("ws-cache")))
        return SassFeatures.from_dict(pipeline._sass_features_cached(compiled.cubin_bytes()))


def test_compiles_without_spills_within_168_registers(compiled):
    assert compiled.ok, compiled.log
    assert compiled.targets == ("sm_90a",)
    assert "-O3" in compiled.flags and "-Xptxas" in compiled.flags
    res = compiled.resources_for(ENTRY)
    assert not res.spills and res.spill_store_bytes == 0 and res.spill_load_bytes == 0, res
    assert res.stack_bytes == 0, res
    assert res.registers <= MAX_REGISTERS, res
    assert res.shared_bytes == 0  # all shared memory is dynamic, sized by the plan


def test_sass_has_every_mechanism(features):
    c = variant().constants
    per_k_tile = (c["WARP_M"] // 16) * (c["WARP_N"] // 8) * c["K_STEPS"]
    assert features.count("hmma") >= per_k_tile and features.count("hmma") % per_k_tile == 0
    assert features.count("ldsm") >= (c["WARP_M"] // 16 + c["WARP_N"] // 16) * c["K_STEPS"]
    assert features.count("ldgsts") >= c["A_LOADS"] + c["B_LOADS"]
    assert features.count("mbarrier") >= 3  # init, arrive, try_wait
    assert features.count("ldl") == 0 and features.count("stl") == 0
    assert features.count("hgmma") == 0  # the tensor-core path stays mma.sync
    assert features.count("ldg_128") == 0 and features.count("ldg_32") == 0  # every global read is a cp.async


def test_sass_has_setmaxnreg_and_one_cta_wide_barrier(compiled):
    (instructions,) = disassemble(compiled.cubin_bytes()).values()
    opcodes = [i.split()[1] if i.startswith("@") else i.split()[0] for i in instructions]
    c = variant().constants
    assert f"USETMAXREG.DEALLOC.CTAPOOL {c['PRODUCER_REGS']:#x}" in " ".join(instructions)
    assert any(op.startswith("USETMAXREG.TRY_ALLOC") for op in opcodes)
    assert any(op.startswith("ARRIVES.LDGSTSBAR") for op in opcodes)  # cp.async.mbarrier.arrive.noinc
    barriers = [i for i in instructions if i.split()[0].startswith("BAR.")]
    cta_wide = [b for b in barriers if b.rstrip(" ;").endswith(" 0x0")]
    assert len(cta_wide) == 1, barriers  # __syncthreads after the mbarrier init only
    assert all(b == cta_wide[0] or "0x1, 0x100" in b for b in barriers), barriers  # the consumers' bar.sync 1, 256


# ---------------------------------------------------------------------------------------------
# The producer's copies, transcribed from copy_tile_rows / run_producer
# ---------------------------------------------------------------------------------------------


def producer_copies(c, rows_total: int, K: int, r0: int, kt: int, passes: int):
    """(shared byte offset, source element or None for a zero-fill, address passed) of every copy of
    one operand tile: rows_total rows of K elements, the tile starting at row r0, K tile kt."""
    copies = []
    for t in range(c["PRODUCER_THREADS"]):
        row, chunk = t // c["CHUNKS_PER_ROW"], t % c["CHUNKS_PER_ROW"]
        own = row * c["ROW_BYTES"] + ((chunk ^ (row % c["SWIZZLE_ROWS"])) * c["CHUNK_BYTES"])
        src = (r0 + row) * K + chunk * c["VEC"] + kt * c["BLOCK_K"]
        k_left = K - chunk * c["VEC"] - kt * c["BLOCK_K"]
        rows = rows_total - (r0 + row) if k_left > 0 else 0
        address = src if rows > 0 else 0  # the fallback is the matrix's first element
        for i in range(passes):
            ok = i * c["LOAD_ROWS_PER_PASS"] < rows
            if i > 0 and ok:
                address += c["LOAD_ROWS_PER_PASS"] * K
            copies.append((own + i * c["PASS_BYTES"], address if ok else None, address))
    return copies


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1999, 3001, 2056), (16, 4096, 4096), (64, 80, 96)])
def test_producer_covers_tiles_and_zero_fills_exactly_the_edges(shape):
    c = variant().constants
    M, N, K = shape
    for rows_total, block, passes in ((M, c["BLOCK_M"], c["A_LOADS"]), (N, c["BLOCK_N"], c["B_LOADS"])):
        last = cdiv(rows_total, block) - 1
        for r0 in {0, last * block}:
            for kt in {0, cdiv(K, c["BLOCK_K"]) - 1}:
                copies = producer_copies(c, rows_total, K, r0, kt, passes)
                offsets = sorted(o for o, _, _ in copies)
                assert offsets == list(range(0, block * c["ROW_BYTES"], c["CHUNK_BYTES"]))  # each chunk once
                for offset, src, address in copies:
                    row = offset // c["ROW_BYTES"]
                    chunk = ((offset % c["ROW_BYTES"]) // c["CHUNK_BYTES"]) ^ (row % c["SWIZZLE_ROWS"])
                    k = kt * c["BLOCK_K"] + chunk * c["VEC"]
                    inside = r0 + row < rows_total and k < K
                    assert (src is not None) == inside, (offset, src)
                    if inside:
                        assert src == (r0 + row) * K + k
                    assert 0 <= address <= rows_total * K - c["VEC"]  # zero-fills still name the matrix


# ---------------------------------------------------------------------------------------------
# The mbarrier protocol, transcribed from run_producer and run_consumer
# ---------------------------------------------------------------------------------------------


def simulate_ring(k_tiles: int, stages: int, seed: int, producers: int = 4, warps: int = 8,
                  producer_parity: int = 1, release_early: bool = False) -> None:
    """Producer threads each wait empty[s] on parity (lap & 1) ^ producer_parity, issue their copies
    into s and arrive (noinc) on full[s], the arrival firing once all their earlier copies landed
    (copies land in any order). Consumer warps wait full[s] on parity lap & 1, read the stage, then
    arrive on empty[s] (release_early: before reading). When every warp has left the loop the ring
    becomes the staging tile. Raises AssertionError on a hazard or a deadlock."""
    rng = random.Random(seed)
    full = [MBarrier(producers) for _ in range(stages)]
    empty = [MBarrier(warps) for _ in range(stages)]
    holds = [[None] * producers for _ in range(stages)]  # K tile each producer thread's copies left in s
    issued = [[] for _ in range(producers)]  # per thread: [stage, K tile, landed, arrived]
    next_tile = [0] * producers
    consumers = [{"kt": 0, "reading": False} for _ in range(warps)]

    def readers(s):
        return [w for w in consumers if w["reading"] and w["kt"] % stages == s]

    def fire_arrivals(j):
        for unit in issued[j]:
            if not unit[2]:
                return  # an earlier copy of this thread is still in flight
            if not unit[3]:
                unit[3] = True
                full[unit[0]].arrive()

    steps = 0
    while any(w["kt"] < k_tiles for w in consumers):
        steps += 1
        assert steps < 200_000
        actions = []
        for j in range(producers):
            kt = next_tile[j]
            if kt < k_tiles:
                s, lap = kt % stages, kt // stages
                if empty[s].ready((lap & 1) ^ producer_parity, lap - 1):
                    actions.append(("issue", j))
            actions += [("land", (j, n)) for n, unit in enumerate(issued[j]) if not unit[2]]
        for i, w in enumerate(consumers):
            if w["kt"] >= k_tiles:
                continue
            s, lap = w["kt"] % stages, w["kt"] // stages
            if w["reading"]:
                actions.append(("release", i))
            elif full[s].ready(lap & 1, lap):
                actions.append(("acquire", i))
        assert actions, "deadlock"
        kind, who = rng.choice(actions)
        if kind == "issue":
            kt = next_tile[who]
            assert not readers(kt % stages), f"copies into stage {kt % stages} while a warp reads it"
            issued[who].append([kt % stages, kt, False, False])
            next_tile[who] += 1
        elif kind == "land":
            j, n = who
            unit = issued[j][n]
            assert not readers(unit[0]), f"a copy lands in stage {unit[0]} while a warp reads it"
            unit[2] = True
            holds[unit[0]][j] = unit[1]
            fire_arrivals(j)
        elif kind == "acquire":
            w = consumers[who]
            s = w["kt"] % stages
            assert holds[s] == [w["kt"]] * producers, f"stage {s} does not hold K tile {w['kt']}"
            w["reading"] = True
            if release_early:
                empty[s].arrive()
        else:  # release: the last fragments of the stage are loaded
            w = consumers[who]
            if not release_early:
                empty[w["kt"] % stages].arrive()
            w["reading"] = False
            w["kt"] += 1
    # Epilogue: the ring is reused, so every copy must have landed, and no producer has more to do.
    assert all(next_tile[j] == k_tiles for j in range(producers))
    assert all(unit[2] for units in issued for unit in units), "a copy is in flight into the staging tile"


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("k_tiles", [0, 1, 2, 3, 4, 5, 9, 33])
def test_ring_protocol_is_safe(stages, k_tiles):
    for seed in range(20):
        simulate_ring(k_tiles, stages, seed)


def test_ring_model_catches_wrong_protocols():
    with pytest.raises(AssertionError):  # waiting on parity 0 of a fresh empty barrier never returns
        simulate_ring(6, 4, 0, producer_parity=0)
    caught = 0
    for seed in range(50):
        try:
            simulate_ring(12, 2, seed, release_early=True)
        except AssertionError:
            caught += 1
    assert caught > 0


def test_variant_k_tile_count_is_shared_by_both_roles():
    source = variant().source
    assert source.count("(K + BLOCK_K - 1) / BLOCK_K") == 1  # one k_tiles, computed in cta_tile
    assert source.count("cta_tile(M, N, K)") == 2  # by the producer and by the consumers
