"""fmha/flash_wgmma, the Hopper flash-attention expert (wgmma + TMA, sm_90a), checked without a GPU.

- The plan resolves for every case of the problem (D = 128 everywhere) to a persistent grid (at
  most one CTA per SM; PERSISTENT = 0 gives one per tile) and the three 3-D tensor maps TMA needs
  ([B*H][S][D], 64-column boxes, 128B swizzle), each covering exactly its input; a head dimension
  outside the domain is refused; the cubin's parameter table takes the plan.
- The kernel passes the static check, compiles for sm_90a without spills, warnings or serialized
  wgmma, and its SASS has the mechanisms: HGMMA 64x128x16 from shared memory (Q K^T) and with a
  register A and a transposed B (P V), UTMALDG.3D, mbarriers, setmaxnreg, the ping-pong named
  barriers, MUFU.EX2, and nothing of the Ampere path. In the SASS, no instruction touches the
  registers of a wgmma group between its issue and the wait that retires it.
- A host build of the kernel's own helpers (nvcc, from kernel.cu itself) gives its descriptors,
  operand addresses, accumulator layout, P packing, masks, key-tile order, ring stages, tile
  schedule, softmax and epilogue indexing; these are checked against the PTX ISA's layouts: the
  K-major and MN-major 128B-swizzle canonical layouts that wgmma reads through a descriptor (wgmma
  reads exactly where TMA wrote, for Q, K and the transposed V), the m64nNk16 accumulator layout,
  and the register-A fragment layout for 16-bit types (the score accumulators are, register for
  register, the A operand of P V). The schedule covers every tile once, keeps a round's heads few
  (L2) and balances the causal case.
- Persistent CTAs are emulated tile after tile from TMA boxes (zero fill past S) through the
  kernel's descriptors, the accumulator registers, the per-thread online softmax with quad
  shuffles, the P re-packing, the transposed-V product and the staged epilogue to the
  bounds-checked stores, in the kernel's order (key tiles last to first, rescale before each P V,
  K/V rings carried across tiles), and give the problem's reference.
- The Q, K and V full/empty mbarriers and the ping-pong named barriers of a CTA's tiles are run
  under random schedules for hazards (TMA overwriting a stage a wgmma still reads, a wgmma reading
  a stage that does not hold its tile), deadlocks and unbalanced barriers; broken variants are
  caught.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from functools import cache

import numpy as np
import pytest
import torch

from corpus_tools import SMEM_LIMIT
from cuda_tools import (
    MBarrier,
    assert_compiles_up_to_the_gpu,
    cdiv,
    count,
    ptx_wgmma_d,
    run_host_harness,
    sass_mnemonics,
    sm90a_resources,
    swizzle_128b,
)
from fmha_tools import KERNELS, PROBLEM, buffers, problem, tolerance
from klineage.devices import H200
from klineage.errors import DocumentError
from klineage.features.sass import disassemble
from klineage.gate.compile import CompileResult, compile_kernel
from klineage.gate.correctness import compare
from klineage.gate.params import KernelParameters, pack_parameters, read_kernel_parameters
from klineage.kernel import KernelState, load_kernel
from klineage.launch import TensorMap, resolve

EXPERT = KERNELS / "flash_wgmma"
ENTRY = "fmha_flash_wgmma"
LOG2E = 1.4426950408889634


@cache
def state() -> KernelState:
    return load_kernel(EXPERT)


@cache
def constants() -> dict:
    return state().constants


def env_for(params: dict) -> dict:
    return {**params, **constants(), **H200.facts()}


# ---------------------------------------------------------------------------------------------
# Plan, domain, parameters
# ---------------------------------------------------------------------------------------------


def test_plan_resolves_for_every_case():
    c = constants()
    plan = state().plan
    assert plan.problem == "fmha" and plan.arch == "sm_90a"
    assert [launch.entry for launch in plan.launches] == [ENTRY]
    assert "16 bytes" in plan.supports_reason and "HEAD_DIM = 128" in plan.supports_reason
    for case in problem().info.cases:
        p = case.params
        b, h, s, d = (p[n] for n in ("B", "H", "S", "D"))
        assert plan.supports_case(p, c), case.name
        (launch,) = resolve(plan, env_for(p), buffers())
        tiles = cdiv(s, c["BLOCK_M"]) * b * h
        assert launch.grid == (min(H200.num_sms, tiles), 1, 1)  # persistent: one CTA per SM at most
        assert launch.block == (c["THREADS"], 1, 1) == (384, 1, 1)
        assert launch.shared == c["SMEM_BYTES"] <= SMEM_LIMIT
        maps = launch.args[:3]
        for (kind, _name, spec), rows in zip(maps, (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_N"])):
            assert kind == "tensor_map"
            assert spec == TensorMap("f16", (d, s, b * h), (2 * d, 2 * s * d), (c["SPAN"], rows, 1), "128B", "256B")
            assert spec.extent_bytes == b * h * s * d * 2  # exactly the input buffer
            assert spec.box[0] * 2 == c["SWIZZLE_BYTES"]  # one box row is one swizzle span
        assert [m[1] for m in maps] == ["q", "k", "v"]
        assert launch.args[3:] == (("buffer", "o", ""), ("scalar", s, "i32"), ("scalar", b * h, "i32"),
                                   ("scalar", p["causal"], "i32"))
        # PERSISTENT = 0 (a carrier sweep's variant): the same code with one CTA per tile.
        (single,) = resolve(plan, {**env_for(p), "PERSISTENT": 0}, buffers())
        assert single.grid == (tiles, 1, 1)


def test_domain_is_the_head_dimension():
    plan, c = state().plan, constants()
    case = dict(problem().info.case("small").params)
    assert not plan.supports_case({**case, "D": 64}, c)
    assert not plan.supports_case({**case, "D": 256}, c)
    # Outside the domain a head dimension whose rows are not 16-byte multiples is refused by the maps.
    with pytest.raises(DocumentError, match=r"strides\[0\] = 200 bytes must be a positive multiple of 16"):
        resolve(plan, env_for({**case, "D": 100}), buffers())


def test_mechanism_constants():
    c = constants()
    assert (c["HEAD_DIM"], c["BLOCK_M"], c["BLOCK_N"], c["STAGES"]) == (128, 128, 128, 2)
    assert (c["THREADS"], c["CONSUMER_WARPGROUPS"], c["WG_M"], c["S_N"], c["O_N"]) == (384, 2, 64, 128, 128)
    assert (c["S_REGS"], c["O_REGS"], c["P_REGS"], c["QK_STEPS"], c["PV_STEPS"]) == (64, 64, 32, 8, 8)
    assert c["SPAN"] == 64 and c["D_SPANS"] == 2 and c["SWIZZLE_ATOM_BYTES"] == 1024
    assert c["Q_TILE_BYTES"] == c["BLOCK_M"] * c["HEAD_DIM"] * 2
    assert c["KV_TILE_BYTES"] == c["BLOCK_N"] * c["HEAD_DIM"] * 2
    assert c["STAGE_ROW_BYTES"] == 272 and c["WG_O_BYTES"] == 64 * 272
    assert c["TILES_BYTES"] == c["Q_TILE_BYTES"] + 2 * c["STAGES"] * c["KV_TILE_BYTES"] + 2 * c["WG_O_BYTES"]
    assert c["SMEM_BYTES"] == c["SMEM_ALIGN"] + c["TILES_BYTES"] + 8 * (2 + 4 * c["STAGES"]) <= SMEM_LIMIT
    assert c["PERSISTENT"] == 1
    assert (c["PRODUCER_REGS"], c["CONSUMER_REGS"]) == (40, 232)
    assert 128 * c["PRODUCER_REGS"] + 256 * c["CONSUMER_REGS"] <= 65536
    # S, O and P plus the softmax state fit the consumers' budget with room for addressing.
    assert c["S_REGS"] + c["O_REGS"] + c["P_REGS"] + 6 < c["CONSUMER_REGS"] - 24
    assert c["DESC_SBO_BYTES"] == 1024 and c["DESC_V_LBO_BYTES"] == c["KV_SPAN_BYTES"] == c["BLOCK_N"] * 128
    assert c["QK_STEP_BYTES"] == 32 and c["PV_STEP_BYTES"] == 2048
    assert c["OUT_PASSES"] == 8 and c["VEC"] == 8


def test_static_check():
    from klineage.gate.static import static_check

    report = static_check(state())
    assert report.ok, report.to_dict()


@pytest.fixture(scope="module")
def compiled(gate_cache) -> CompileResult:
    # Into the gate cache's compile folder, so that the compile-only gate below loads this result.
    return compile_kernel(state(), gate_cache.local.root)


def test_the_plan_packs_into_the_cubin_parameter_layout(compiled):
    assert compiled.ok, compiled.log
    declared = read_kernel_parameters(compiled.cubin_bytes("sm_90a"), ENTRY)
    # Three 64-byte aligned tensor maps (the first where the constant bank address is 64-aligned),
    # then the output pointer and three ints.
    assert declared == KernelParameters((48, 176, 304, 432, 440, 444, 448), (128, 128, 128, 8, 4, 4, 4), 452)
    p = dict(problem().info.case("ragged").params)
    (launch,) = resolve(state().plan, env_for(p), buffers())
    pointers = {"q": 0x7F00_0000_0000, "k": 0x7F00_1000_0000, "v": 0x7F00_2000_0000, "o": 0x7F00_3000_0000}
    maps = {0: b"\xaa" * 128, 1: b"\xbb" * 128, 2: b"\xcc" * 128}
    blob = pack_parameters(launch.args, pointers, maps, declared)
    assert blob[48:176] == maps[0] and blob[176:304] == maps[1] and blob[304:432] == maps[2]
    assert blob[432:452] == (pointers["o"].to_bytes(8, "little") + p["S"].to_bytes(4, "little")
                             + (p["B"] * p["H"]).to_bytes(4, "little") + bytes(4))


# ---------------------------------------------------------------------------------------------
# Compile and SASS
# ---------------------------------------------------------------------------------------------


def test_compiles_for_sm90a_without_spills(compiled):
    res = sm90a_resources(compiled, ENTRY)
    assert "warning" not in compiled.log.lower(), compiled.log
    # __launch_bounds__(384, 1) caps the launch at 65536 / 384 registers (rounded down to 8);
    # setmaxnreg moves the producer's share to the consumers.
    assert res.registers == 168, res


def sass(compiled) -> list[str]:
    (instructions,) = disassemble(compiled.cubin_bytes("sm_90a")).values()
    return [i for i in instructions if not i.startswith("@!PT")]


def opcodes(compiled) -> Counter:
    return Counter(words[1] if words[0].startswith("@") else words[0] for words in (i.split() for i in sass(compiled)))


def test_sass_has_every_mechanism(compiled):
    c = constants()
    ops = opcodes(compiled)
    mnemonics = sass_mnemonics(compiled.cubin_bytes("sm_90a"))
    hgmma = [i for i in sass(compiled) if i.startswith("HGMMA")]
    # Two copies of each product (the first tile and the loop; the loop and the last P V).
    assert len(hgmma) == 2 * (c["QK_STEPS"] + c["PV_STEPS"]) == mnemonics["HGMMA"]
    assert all(i.startswith("HGMMA.64x128x16.F32 ") for i in hgmma)
    from_shared = [i for i in hgmma if re.match(r"HGMMA\S* R\d+, gdesc\[", i)]
    register_a = [i for i in hgmma if re.match(r"HGMMA\S* R\d+, R\d+, gdesc\[UR\d+\]\.tnspB, ", i)]
    assert len(from_shared) == 2 * c["QK_STEPS"] and len(register_a) == 2 * c["PV_STEPS"]
    assert sum(", RZ, !UPT" in i for i in from_shared) == 2  # the first k-step of S ignores old contents
    assert count(ops, r"^WARPGROUP\.ARRIVE$") == 4 and count(ops, r"^WARPGROUP\.DEPBAR\.LE$") == 4
    # TMA: Q, K and V as two 64-column boxes each, and the three descriptor prefetches.
    assert count(ops, r"^UTMALDG\.3D$") == 3 * c["D_SPANS"] and count(ops, r"^UTMACCTL\.PF$") == 3
    # mbarriers: Q full / empty, and full / empty for both rings; expect-tx arrivals, consumer arrivals, waits.
    assert count(ops, r"^SYNCS\.EXCH\.64$") == 2 + 4 * c["STAGES"]
    assert count(ops, r"^SYNCS\.ARRIVE\.TRANS64$") >= 3 and count(ops, r"^SYNCS\.ARRIVE\.TRANS64\.A1T0$") >= 5
    assert count(ops, r"^SYNCS\.PHASECHK\.TRANS64\.TRYWAIT$") >= 6
    assert count(ops, r"^USETMAXREG\.DEALLOC") == 1 and count(ops, r"^USETMAXREG\.TRY_ALLOC") == 1
    # Named barriers: __syncthreads and three ping-pong waits; four ping-pong passes.
    assert count(ops, r"^BAR\.SYNC") == 4 and count(ops, r"^BAR\.ARV$") == 4
    # Softmax: an ex2 per probability and per alpha in both copies; quad shuffles; P packed to fp16.
    assert count(ops, r"^MUFU\.EX2$") == 2 * (c["S_REGS"] + 2)
    assert count(ops, r"^SHFL\.BFLY") >= 2 * 2 * 2 + 4
    assert count(ops, r"^F2FP\.F16\.F32\.PACK_AB$") == 2 * c["P_REGS"] + c["O_REGS"] // 2
    # Epilogue: 4-byte staged stores, 16-byte reads and global stores.
    assert count(ops, r"^STS$") == c["O_REGS"] // 2
    assert count(ops, r"^LDS\.128$") == c["OUT_PASSES"] and count(ops, r"^STG\.E\.128$") == c["OUT_PASSES"]
    # Every global read is a TMA load; nothing of the Ampere path; no local memory.
    assert sum(mnemonics[m] for m in ("LDG", "LDGSTS", "LDSM", "HMMA", "LDL", "STL")) == 0


_HGMMA = re.compile(r"^HGMMA\S* (R\d+), (?:(R\d+), )?gdesc")
_REGISTER = re.compile(r"\bR(\d+)\b")


def wgmma_register_windows(instructions: list[str]) -> list[tuple[set[int], list[str]]]:
    """For each committed wgmma group (consecutive HGMMA up to the one with gsb0), the registers it
    owns (accumulators and register A operands) and the instructions between its issue and the
    WARPGROUP.DEPBAR that retires it, in program order."""
    groups: list[dict] = []
    current: set[int] = set()
    pending: list[dict] = []
    for instruction in instructions:
        match = _HGMMA.match(instruction)
        if match:
            base = int(match.group(1)[1:])
            current |= set(range(base, base + 64))
            if match.group(2):
                a = int(match.group(2)[1:])
                current |= set(range(a, a + 4))
            if "gsb0" in instruction:
                group = {"registers": current, "between": []}
                groups.append(group)
                pending.append(group)
                current = set()
            continue
        depbar = re.match(r"^WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", instruction)
        if depbar:
            while len(pending) > int(depbar.group(1), 16):
                pending.pop(0)
            continue
        for group in pending:
            group["between"].append(instruction)
    return [(g["registers"], g["between"]) for g in groups]


def test_no_instruction_touches_a_wgmma_groups_registers_before_its_wait(compiled):
    """What ptxas made of the asynchronous MMAs: between the issue of a group (S, or O and P) and the
    wait that retires it, no instruction reads or writes its accumulators or A registers; so
    softmax work on S_i runs while P V owns O and P, and the rescale of O runs while Q K^T owns S."""
    windows = wgmma_register_windows(sass(compiled))
    assert len(windows) == 4  # S_0; S_i and P V in the loop; the last P V
    for registers, between in windows:
        assert len(registers) in (64, 64 + 32)
        touched = [i for i in between if set(map(int, _REGISTER.findall(i.split(";")[0]))) & registers]
        assert touched == [], touched[:5]
    # The loop's S group overlaps its P V group's issue and the softmax; the check has something to check.
    assert max(len(between) for _, between in windows) > 200
    # The model sees a touch when there is one.
    fake = ["HGMMA.64x128x16.F32 R24, gdesc[UR4], R24, gsb0 ;", "FMUL R30, R30, R2 ;",
            "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"]
    ((registers, between),) = wgmma_register_windows(fake)
    assert between == ["FMUL R30, R30, R2 ;"] and 30 in registers


# ---------------------------------------------------------------------------------------------
# The kernel's helpers, built for the host
# ---------------------------------------------------------------------------------------------

HARNESS = r"""
#include <cuda_fp16.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
// The kernel's __device__ helpers become callable from host code. Helpers that use device-only
// intrinsics (asm) are never called here; shuffles are the identity (a quad of equal lanes).
#undef __device__
#define __device__ __attribute__((host)) __attribute__((device))
#define __syncthreads() ((void)0)
#define __syncwarp() ((void)0)
#define __shfl_xor_sync(mask, x, offset) (x)
#define __cvta_generic_to_shared(p) ((size_t)0)
#include "KERNEL_CU"

static unsigned bits(float f) { unsigned u; memcpy(&u, &f, 4); return u; }

int main()
{
    printf("scale %u\n", bits(SCALE_LOG2));
    const unsigned addresses[] = {0x400u, 0x800u, 0x8400u, 0x10400u, 0x28400u, 0x3fc00u, 0x40400u, 0x1000400u};
    for (unsigned a : addresses)
        printf("desc %u %llu %llu\n", a, (unsigned long long)k_major_descriptor(a), (unsigned long long)v_descriptor(a));
    // Operand addresses and the descriptors the kernel builds from them, for a tile at 0x400.
    for (int c = 0; c < CONSUMER_WARPGROUPS; ++c)
        for (int ks = 0; ks < QK_STEPS; ++ks)
            printf("qaddr %d %d %u %llu\n", c, ks, q_operand_address(0x400u, c, ks),
                   (unsigned long long)k_major_descriptor(q_operand_address(0x400u, c, ks)));
    for (int ks = 0; ks < QK_STEPS; ++ks)
        printf("kaddr %d %u %llu\n", ks, k_operand_address(0x400u, ks),
               (unsigned long long)k_major_descriptor(k_operand_address(0x400u, ks)));
    for (int kk = 0; kk < PV_STEPS; ++kk)
        printf("vaddr %d %u %llu\n", kk, v_operand_address(0x400u, kk),
               (unsigned long long)v_descriptor(v_operand_address(0x400u, kk)));
    for (int w = 0; w < WGMMA_M / ROWS_PER_WARP; ++w)
        for (int lane = 0; lane < WARP_SIZE; ++lane)
            for (int i = 0; i < S_REGS; ++i)
                printf("acc %d %d %d %d %d\n", w, lane, i, accumulator_row(w, lane, i), accumulator_col(lane, i));
    {
        uint32_t p[P_REGS];
        float s[S_REGS];
        for (int i = 0; i < S_REGS; ++i) s[i] = (float)(i + 1);  // exact in fp16
        pack_p(p, s);
        for (int i = 0; i < P_REGS; ++i) printf("pack %d %u\n", i, p[i]);
    }
    {
        float o[O_REGS];
        const float alpha[ROWS_PER_THREAD] = {2.0f, 3.0f};
        for (int i = 0; i < O_REGS; ++i) o[i] = 1.0f;
        rescale_output(o, alpha);
        for (int i = 0; i < O_REGS; ++i) printf("rescale %d %d\n", i, (int)o[i]);
    }
    // Masks for key tiles at several offsets from the rows, ragged and not, causal and not.
    const int mask_cases[][5] = {{0, 0, 2048, 1, 0}, {0, 5, 2048, 1, 7}, {128, 130, 2048, 1, 13}, {768, 700, 777, 1, 31},
                                 {768, 770, 777, 0, 6}, {896, 900, 1000, 0, 22}, {0, 64, 100, 0, 3}, {0, 99, 100, 1, 30},
                                 {256, 300, 2048, 1, 9}, {640, 776, 777, 1, 1}};
    for (const auto& m : mask_cases) {
        float s[S_REGS];
        for (int i = 0; i < S_REGS; ++i) s[i] = 1.0f;
        mask_scores(s, m[0], m[1], m[2], m[3] != 0, m[4]);
        printf("mask %d %d %d %d %d", m[0], m[1], m[2], m[3], m[4]);
        for (int i = 0; i < S_REGS; ++i) printf(" %d", s[i] == -INFINITY ? 1 : 0);
        printf("\n");
    }
    const int lengths[] = {1, 64, 100, 127, 128, 129, 256, 777, 1000, 2048};
    for (int S : lengths)
        for (int causal = 0; causal < 2; ++causal)
            for (int q0 = 0; q0 < S; q0 += BLOCK_M) {
                const int n = key_tile_count(q0, S, causal != 0);
                for (int i = 0; i < n; ++i) {
                    const int key0 = key_tile_start(i, n);
                    printf("tile %d %d %d %d %d %d %d\n", S, causal, q0, n, i, key0,
                           tile_needs_mask(key0, q0, S, causal != 0) ? 1 : 0);
                }
            }
    for (int i = 0; i < 9; ++i) printf("ring %d %d %u\n", i, ring_stage(i), ring_parity(i));
    // The persistent schedule: every CTA's tiles, round by round, for grids of several sizes.
    const int schedules[][2] = {{132, 8192}, {132, 512}, {5, 56}, {7, 64}, {1, 3}, {10, 10}, {4, 2}, {132, 100}};
    for (const auto& g : schedules)
        for (int block = 0; block < g[0]; ++block)
            for (int round = 0;; ++round) {
                const int t = scheduled_tile(round, block, g[0]);
                if (t >= g[1]) break;
                printf("sched %d %d %d %d %d\n", g[0], g[1], block, round, t);
            }
    // Tiles -> (query tile, head) and make_tile, for the problem's cases and a few more.
    const int shapes[][3] = {{2048, 512, 0}, {2048, 32, 1}, {1000, 8, 0}, {777, 8, 1}, {100, 2, 0}, {129, 3, 1}};
    for (const auto& sh : shapes) {
        const int q_tiles = (sh[0] + BLOCK_M - 1) / BLOCK_M;
        for (int t = 0; t < q_tiles * sh[1]; ++t) {
            int q_tile, head;
            tile_coordinates(t, q_tiles, sh[1], sh[2] != 0, q_tile, head);
            const Tile tile = make_tile(t, sh[0], sh[1], sh[2] != 0);
            printf("coord %d %d %d %d %d %d %d %d %d\n", sh[0], sh[1], sh[2], t, q_tile, head, tile.q0, tile.head,
                   tile.n_tiles);
        }
    }
    for (int row = 0; row < WG_M; ++row)
        for (int d = 0; d < HEAD_DIM; d += 2) printf("stage %d %d %u\n", row, d, staging_offset(row, d));
    for (int w = 0; w < WGMMA_M / ROWS_PER_WARP; ++w)
        for (int lane = 0; lane < WARP_SIZE; ++lane)
            for (int p = 0; p < OUT_PASSES; ++p) {
                int row, chunk;
                output_chunk(w, lane, p, row, chunk);
                printf("out %d %d %d %d %d\n", w, lane, p, row, chunk);
            }
    // online_softmax for one thread whose quad agrees (shuffles are the identity here): a first
    // tile from m = -inf, a later tile with a higher max, a tile of masked keys, an all-masked row.
    {
        float s[S_REGS], m[ROWS_PER_THREAD] = {-INFINITY, -INFINITY}, l[ROWS_PER_THREAD] = {0.0f, 0.0f};
        float alpha[ROWS_PER_THREAD];
        for (int round = 0; round < 4; ++round) {
            for (int i = 0; i < S_REGS; ++i) {
                const int r = (i % 4) / 2;
                float x = (float)((i * 37 + round * 11) % 23) - 11.0f + 4.0f * round * r;
                if (round == 2 && i % 3 == 0) x = -INFINITY;
                if (round == 3) x = r == 1 ? -INFINITY : x;
                s[i] = x;
            }
            if (round == 3) { m[1] = -INFINITY; l[1] = 0.0f; }  // row 1 has seen only masked keys
            online_softmax(s, m, l, alpha);
            printf("softmax %d %u %u %u %u %u %u", round, bits(m[0]), bits(m[1]), bits(l[0]), bits(l[1]),
                   bits(alpha[0]), bits(alpha[1]));
            for (int i = 0; i < S_REGS; ++i) printf(" %u", bits(s[i]));
            printf("\n");
        }
    }
    return 0;
}
"""  # noqa: E501  (C++ harness source, kept as written)


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, list[list[int]]]:
    work = tmp_path_factory.mktemp("fmha-wgmma-harness")
    (work / "harness.cu").write_text(HARNESS.replace("KERNEL_CU", str(EXPERT / "kernel.cu")))
    return run_host_harness(work, arch="sm_90a")


def as_float(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


# ---------------------------------------------------------------------------------------------
# The PTX ISA, as models
# ---------------------------------------------------------------------------------------------


def isa_descriptor(address: int, lbo: int, sbo: int, swizzle: int = 1) -> int:
    """Shared-memory matrix descriptor: start address >> 4 in bits 0-13, leading byte offset >> 4
    in 16-29, stride byte offset >> 4 in 32-45, base offset 0 in 49-51, swizzle mode in 62-63."""
    return ((address & 0x3FFFF) >> 4) | (lbo >> 4) << 16 | (sbo >> 4) << 32 | swizzle << 62


def decode(desc: int) -> tuple[int, int, int, int]:
    """(start, leading byte offset, stride byte offset, swizzle mode) of a descriptor."""
    return (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, desc >> 62


def tma_offset(row, col):
    """Byte offset from a 1024-aligned block where a 128B-swizzled TMA box of 64-element fp16 rows
    stores element (row, col)."""
    return swizzle_128b(row * 128 + col * 2)


def k_major_reads(desc: int, rows: int):
    """[rows, 16] byte addresses wgmma reads for (row, k) of a K-major operand (A = M x K, or B
    read as N x K) under 128B swizzle: 8-row groups SBO apart, 128-byte rows, k contiguous; the
    leading byte offset is unused (PTX ISA canonical layout ((8,m),(T,2k)):((8T,SBO),(1,T)))."""
    start, _, sbo, mode = decode(desc)
    assert mode == 1
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    return swizzle_128b(start + (r // 8) * sbo + (r % 8) * 128 + k * 2)


def mn_major_reads(desc: int, n: int):
    """[16, n] byte addresses wgmma reads for (k, n) of an MN-major B operand (transpose-B) under
    128B swizzle: 64 contiguous n per 128-byte row, the next 64 n LBO further; k rows 128 bytes
    apart, 8-row groups of k SBO apart (canonical layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)))."""
    start, lbo, sbo, mode = decode(desc)
    assert mode == 1
    k = np.arange(16)[:, None]
    col = np.arange(n)[None, :]
    return swizzle_128b(start + (col // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + (col % 64) * 2)


def isa_register_a(t: int, v: int) -> tuple[int, int]:
    """(row, k) of value v (register v // 2, low half for even v) of warpgroup thread t in the
    register A fragment of wgmma .m64nNk16 with 16-bit types."""
    warp, lane = t // 32, t % 32
    return 16 * warp + lane // 4 + 8 * ((v // 2) % 2), 2 * (lane % 4) + v % 2 + 8 * (v // 4)


# ---------------------------------------------------------------------------------------------
# Helpers against the ISA
# ---------------------------------------------------------------------------------------------


def test_descriptors_match_the_isa(tables):
    c = constants()
    assert len(tables["desc"]) == 8
    for address, k_desc, v_desc in tables["desc"]:
        assert k_desc == isa_descriptor(address, c["DESC_K_LBO_BYTES"], 1024), hex(address)
        assert v_desc == isa_descriptor(address, c["KV_SPAN_BYTES"], 1024), hex(address)
    for _cons, _ks, address, desc in tables["qaddr"]:
        assert desc == isa_descriptor(address, c["DESC_K_LBO_BYTES"], 1024)
    for rows, lbo in ((tables["kaddr"], c["DESC_K_LBO_BYTES"]), (tables["vaddr"], c["KV_SPAN_BYTES"])):
        for _, address, desc in rows:
            assert desc == isa_descriptor(address, lbo, 1024)
    # Operand addresses stay below 2^18 (the descriptor's address field) for any shared base.
    assert 0x400 + c["SMEM_BYTES"] < 1 << 18
    assert as_float(tables["scale"][0][0]) == np.float32(LOG2E / math.sqrt(128))


def kernel_address_tables(tables):
    q = {(cons, ks): a for cons, ks, a, _ in tables["qaddr"]}
    k = {ks: a for ks, a, _ in tables["kaddr"]}
    v = {kk: a for kk, a, _ in tables["vaddr"]}
    return q, k, v


def kernel_descriptor_tables(tables):
    """The descriptors the kernel builds for the operands of a tile at 0x400 (its own bits)."""
    q = {(cons, ks): desc for cons, ks, _, desc in tables["qaddr"]}
    k = {ks: desc for ks, _, desc in tables["kaddr"]}
    v = {kk: desc for kk, _, desc in tables["vaddr"]}
    return q, k, v


def test_wgmma_reads_what_tma_wrote(tables):
    """Every element of every k16 step: Q (A, K-major) for each consumer's 64 rows, K (B, K-major,
    keys as N) and V (B, MN-major through the transpose bit, d as N, keys as K) are read by wgmma
    from the address where the 128B-swizzled TMA box of the kernel's layout stored them."""
    c = constants()
    base = 0x400  # the tables' tile base: any 1024-aligned address
    q_addr, k_addr, v_addr = kernel_address_tables(tables)
    span = c["SPAN"]
    rows = np.arange(64)[:, None]
    kk = np.arange(16)[None, :]
    for consumer in range(c["CONSUMER_WARPGROUPS"]):
        for ks in range(c["QK_STEPS"]):
            got = k_major_reads(isa_descriptor(q_addr[(consumer, ks)], c["DESC_K_LBO_BYTES"], 1024), 64)
            d = ks * 16 + kk
            want = base + (d // span) * c["Q_SPAN_BYTES"] + tma_offset(consumer * c["WG_M"] + rows, d % span)
            assert np.array_equal(got, want), (consumer, ks)
    keys = np.arange(c["BLOCK_N"])[:, None]
    for ks in range(c["QK_STEPS"]):
        got = k_major_reads(isa_descriptor(k_addr[ks], c["DESC_K_LBO_BYTES"], 1024), c["BLOCK_N"])
        d = ks * 16 + kk
        assert np.array_equal(got, base + (d // span) * c["KV_SPAN_BYTES"] + tma_offset(keys, d % span)), ks
    d = np.arange(c["HEAD_DIM"])[None, :]
    key16 = np.arange(16)[:, None]
    for step in range(c["PV_STEPS"]):
        got = mn_major_reads(isa_descriptor(v_addr[step], c["KV_SPAN_BYTES"], 1024), c["HEAD_DIM"])
        want = base + (d // span) * c["KV_SPAN_BYTES"] + tma_offset(step * 16 + key16, d % span)
        assert np.array_equal(got, want), step
    # Each product reads its whole tile exactly once.
    for reads in ([k_major_reads(isa_descriptor(k_addr[ks], 16, 1024), c["BLOCK_N"]) for ks in range(8)],
                  [mn_major_reads(isa_descriptor(v_addr[s], c["KV_SPAN_BYTES"], 1024), 128) for s in range(8)]):
        flat = np.concatenate([r.ravel() for r in reads])
        assert len(set(flat.tolist())) == c["BLOCK_N"] * c["HEAD_DIM"] == flat.size
    # The models have teeth: V through a K-major descriptor, a wrong leading offset, or no swizzle
    # read elsewhere than TMA wrote.
    wrong_lbo = mn_major_reads(isa_descriptor(v_addr[1], 2048, 1024), 128)
    assert not np.array_equal(wrong_lbo, base + (d // span) * c["KV_SPAN_BYTES"] + tma_offset(16 + key16, d % span))
    as_k_major = k_major_reads(isa_descriptor(v_addr[0], 16, 1024), 128)[:, :16]  # (n, k) for n < 16
    assert not np.array_equal(as_k_major.T, (base + tma_offset(key16, np.arange(16)[None, :]))[:16])
    assert not np.array_equal(k_major_reads(isa_descriptor(q_addr[(0, 1)], 16, 1024), 64),
                              base + rows * 128 + (16 + kk) * 2)


def test_accumulator_layout_is_the_isa_layout(tables):
    c = constants()
    cover = Counter()
    for warp, lane, i, row, col in tables["acc"]:
        assert (row, col) == ptx_wgmma_d(32 * warp + lane, i)
        cover[(row, col)] += 1
    assert set(cover) == {(r, col) for r in range(64) for col in range(c["S_N"])} and set(cover.values()) == {1}


def test_score_accumulators_are_the_a_fragments_of_p_v(tables):
    """P register 4 kk + v // 2 (half v % 2) comes from score accumulator 8 kk + v (pack_p), and that
    accumulator holds exactly the (row, key) the register-A layout puts at value v of k16 step kk."""
    c = constants()
    halves = {}
    for i, word in tables["pack"]:
        lo, hi = np.array([word & 0xFFFF, word >> 16], dtype=np.uint16).view(np.float16).astype(int)
        halves[(i, 0)], halves[(i, 1)] = lo - 1, hi - 1  # s[j] = j + 1 in the harness
    used = Counter()
    for t in range(128):
        for kk in range(c["PV_STEPS"]):
            for v in range(8):
                source = halves[(c["P_REGS_PER_STEP"] * kk + v // 2, v % 2)]
                row, key = ptx_wgmma_d(t, source)
                a_row, a_k = isa_register_a(t, v)
                assert (row, key) == (a_row, 16 * kk + a_k), (t, kk, v)
                used[source] += t == 0
    assert sorted(used) == list(range(c["S_REGS"])) and set(used.values()) == {1}


def test_rescale_scales_each_row_by_its_own_factor(tables):
    for i, value in tables["rescale"]:
        row_half = ptx_wgmma_d(0, i)[0] // 8
        assert value == (2, 3)[row_half]


def model_mask(key0: int, row_top: int, s_len: int, causal: int, lane: int) -> list[int]:
    out = []
    for i in range(64):
        row, col = ptx_wgmma_d(lane, i)  # warp 0: row_top is the row of lane // 4
        row = row_top + (row - lane // 4)
        key = key0 + col
        out.append(int(key >= s_len or (causal and key > row)))
    return out


def test_masks(tables):
    assert len(tables["mask"]) == 10
    masked_somewhere = 0
    for key0, row_top, s_len, causal, lane, *bits in tables["mask"]:
        assert bits == model_mask(key0, row_top, s_len, causal, lane), (key0, row_top, s_len, causal, lane)
        masked_somewhere += 0 < sum(bits) < 64
    assert masked_somewhere >= 5


def test_key_tiles_run_last_first_and_only_the_first_can_need_a_mask(tables):
    c = constants()
    bn, bm = c["BLOCK_N"], c["BLOCK_M"]
    seen = set()
    for s_len, causal, q0, n, i, key0, needs in tables["tile"]:
        seen.add((s_len, causal, q0))
        rows = range(q0, min(q0 + bm, s_len))
        needed = {key // bn for r in rows for key in range(r + 1 if causal else s_len)}
        assert n == len(needed) and key0 == (n - 1 - i) * bn and key0 // bn in needed
        # A tile is masked exactly when some key of it is masked for some row of the CTA (rows
        # past S included: they are computed, never stored).
        any_masked = any(key >= s_len or (causal and key > r)
                         for r in range(q0, q0 + bm) for key in range(key0, key0 + bn))
        assert needs == int(any_masked)
        if i > 0:
            assert not needs  # with BLOCK_M == BLOCK_N only the first (last) key tile is ever masked
    assert len(seen) == sum(2 * cdiv(s, bm) for s in (1, 64, 100, 127, 128, 129, 256, 777, 1000, 2048))


def test_ring_stages_and_parities(tables):
    for i, stage, parity in tables["ring"]:
        assert (stage, parity) == (i % 2, (i // 2) % 2)


def test_epilogue_staging_is_conflict_free_and_covers_the_tile(tables):
    """Staged output element (row, d) of a warpgroup sits in a padded row of its own block; the
    4-byte stores of one instruction hit 32 banks; the 16-byte reads of an 8-lane phase hit 8 bank
    groups; a warp reads back only rows it staged; 16 lanes store one whole 256-byte row of o, and
    every chunk of the 64 x 128 tile is stored once."""
    c = constants()
    stage = {(row, d): off for row, d, off in tables["stage"]}
    for (row, d), off in stage.items():
        assert off == row * c["STAGE_ROW_BYTES"] + 2 * d
    assert len({off // 4 for off in stage.values()}) == 64 * 64  # fp16 pairs, each its own word
    assert max(stage.values()) + 4 <= c["WG_O_BYTES"]  # inside the warpgroup's block
    for warp in range(4):
        for i in range(0, 64, 2):
            banks = {stage[ptx_wgmma_d(32 * warp + lane, i)] // 4 % 32 for lane in range(32)}
            assert len(banks) == 32, (warp, i)
    chunks = Counter()
    passes: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for warp, _lane, p, row, chunk in tables["out"]:
        assert warp * 16 <= row < warp * 16 + 16  # a warp reads back only rows it staged
        chunks[(row, chunk)] += 1
        passes.setdefault((warp, p), []).append((row, chunk))
    assert set(chunks) == {(r, ch) for r in range(64) for ch in range(16)} and set(chunks.values()) == {1}
    for cells in passes.values():
        for q in range(0, 32, 8):
            groups = [(stage[(row, chunk * 8)] // 16) % 8 for row, chunk in cells[q:q + 8]]
            assert sorted(groups) == list(range(8))
        for half in (cells[:16], cells[16:]):  # 16 lanes store one 256-byte row
            assert len({row for row, _ in half}) == 1 and sorted(ch for _, ch in half) == list(range(16))


def test_the_schedule_covers_every_tile_once_in_snake_rounds(tables):
    runs: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for grid, tiles, block, round_, tile in tables["sched"]:
        assert tile == model_scheduled_tile(round_, block, grid)
        assert round_ * grid <= tile < (round_ + 1) * grid  # a round is one contiguous range of tiles
        runs.setdefault((grid, tiles), []).append((block, round_, tile))
    assert len(runs) == 8
    for (grid, tiles), rows in runs.items():
        assert sorted(t for _, _, t in rows) == list(range(tiles)), (grid, tiles)
        for block in range(grid):
            rounds = [r for b, r, _ in rows if b == block]
            assert rounds == list(range(len(rounds)))  # a CTA's rounds end at the first tile past the end


def test_tile_order_is_head_major_or_heaviest_first_and_balanced(tables):
    """Without the mask, a round of 132 CTAs on the headline touches at most 10 heads (their K and V,
    10 MB, stay in L2); with it, query tiles come heaviest first, and the snake spreads the causal
    case's work over 132 CTAs within 10% of the mean."""
    c = constants()
    by_shape: dict[tuple[int, int, int], list] = {}
    for s_len, heads, causal, t, q_tile, head, q0, tile_head, n in tables["coord"]:
        assert (q_tile, head) == model_tile_coordinates(t, cdiv(s_len, c["BLOCK_M"]), heads, bool(causal))
        assert (q0, tile_head) == (q_tile * c["BLOCK_M"], head)
        assert n == cdiv(min(q0 + c["BLOCK_M"], s_len) if causal else s_len, c["BLOCK_N"])
        by_shape.setdefault((s_len, heads, causal), []).append((t, q_tile, head, n))
    for (s_len, heads, causal), rows in by_shape.items():
        assert sorted((q, h) for _, q, h, _ in rows) == sorted((q, h) for q in range(cdiv(s_len, 128))
                                                               for h in range(heads))
        if causal:
            costs = [n for _, _, _, n in sorted(rows)]
            assert costs == sorted(costs, reverse=True)
    headline = sorted(by_shape[(2048, 512, 0)])
    for start in range(0, len(headline), 132):
        assert len({h for _, _, h, _ in headline[start:start + 132]}) <= 10
    causal = {t: n for t, _, _, n in by_shape[(2048, 32, 1)]}
    grid = min(132, len(causal))
    loads = [sum(causal[t] for t in (model_scheduled_tile(r, b, grid) for r in range(len(causal))) if t < len(causal))
             for b in range(grid)]
    assert max(loads) <= 1.1 * sum(loads) / grid


def test_online_softmax_for_one_thread(tables):
    """The host build of online_softmax (its quad reduced to one thread): rows are accumulators
    4 j + {0, 1} and 4 j + {2, 3}; probabilities are 2^(c s - c m); alpha = 2^(c m_old - c m_new);
    a row of masked keys keeps m = -inf, alpha 0 and p 0, with no NaN."""
    c = np.float32(as_float(tables["scale"][0][0]))
    m = np.array([-np.inf, -np.inf], np.float32)
    row_sum = np.zeros(2, np.float32)
    for rnd, m0, m1, l0, l1, a0, a1, *sbits in tables["softmax"]:
        s = np.array([((i * 37 + rnd * 11) % 23) - 11.0 + 4.0 * rnd * ((i % 4) // 2) for i in range(64)], np.float32)
        if rnd == 2:
            s[::3] = -np.inf
        if rnd == 3:
            s[[i for i in range(64) if (i % 4) // 2 == 1]] = -np.inf
            m[1], row_sum[1] = -np.inf, 0
        got = np.array([as_float(b) for b in sbits], np.float32)
        for r in range(2):
            idx = [i for i in range(64) if (i % 4) // 2 == r]
            m_new = max(m[r], s[idx].max())
            ref = np.float32(0) if m_new == -np.inf else np.float32(m_new * c)
            with np.errstate(invalid="raise"):
                alpha = np.exp2(np.float32(m[r] * c) - ref)
                p = np.exp2(s[idx] * c - ref)
            assert np.allclose(got[idx], p, rtol=1e-6, atol=0) and not np.isnan(got[idx]).any()
            assert np.isclose(as_float((a0, a1)[r]), alpha, rtol=1e-6, atol=0)
            assert as_float((m0, m1)[r]) == m_new
            row_sum[r] = row_sum[r] * alpha + p.sum()
            assert np.isclose(as_float((l0, l1)[r]), row_sum[r], rtol=1e-5)
            m[r] = m_new
        if rnd == 3:
            assert as_float(m1) == -np.inf and as_float(a1) == 0 and as_float(l1) == 0
            assert all(as_float(sbits[i]) == 0 for i in range(64) if (i % 4) // 2 == 1)


def test_kernel_source_orders_the_pipeline_as_modelled():
    """The consumer's and producer's orders are inline code, not callable helpers: check the source
    says what the pipeline model and the CTA emulation below assume."""
    source = state().source
    start = source.index("__device__ __forceinline__ void consume_tile(")
    body = source[start:source.index("// The kernel: a 1-D grid")]
    order = ["mbar_wait(sm.q_full, static_cast<uint32_t>(round & 1));",
             "mbar_wait(sm.k_full + MBAR_BYTES * ks, ring_parity(ring));", "schedule_wait(consumer);",
             "issue_scores(s, sm.q, consumer, sm.k + ks * KV_TILE_BYTES);", "schedule_pass(consumer);",
             "wgmma_wait<0>();", "mbar_arrive(sm.k_empty + MBAR_BYTES * ks);",
             "if (n_tiles == 1) mbar_arrive(sm.q_empty);",
             "mask_scores(s, key0, row_top, S, causal, lane);", "online_softmax(s, m, l, alpha);", "pack_p(p, s);",
             "for (int i = 1; i < n_tiles; ++i) {", "mbar_wait(sm.k_full + MBAR_BYTES * ks, ring_parity(ring + i));",
             "schedule_wait(consumer);", "issue_scores(s, sm.q, consumer, sm.k + ks * KV_TILE_BYTES);",
             "rescale_output(o, alpha);", "mbar_wait(sm.v_full + MBAR_BYTES * vs, ring_parity(ring + i - 1));",
             "issue_pv(o, p, sm.v + vs * KV_TILE_BYTES);", "schedule_pass(consumer);", "wgmma_wait<1>();",
             "mbar_arrive(sm.k_empty + MBAR_BYTES * ks);", "if (i == n_tiles - 1) mbar_arrive(sm.q_empty);",
             "mask_scores(s, key0, row_top, S, causal, lane);",
             "online_softmax(s, m, l, alpha);", "wgmma_wait<0>();", "mbar_arrive(sm.v_empty + MBAR_BYTES * vs);",
             "pack_p(p, s);", "mbar_wait(sm.v_full + MBAR_BYTES * vs, ring_parity(ring + n_tiles - 1));",
             "schedule_wait(consumer);", "rescale_output(o, alpha);", "issue_pv(o, p, sm.v + vs * KV_TILE_BYTES);",
             "if (consumer == 0 || !last_tile) schedule_pass(consumer);", "wgmma_wait<0>();",
             "mbar_arrive(sm.v_empty + MBAR_BYTES * vs);", "store_output("]
    at = 0
    for line in order:
        found = body.find(line, at)
        assert found >= 0, line
        at = found + len(line)
    assert "const int row_top = q0 + consumer * WG_M + warp * ROWS_PER_WARP + lane / QUAD;" in body
    for line in ("if (consumer == 1) schedule_pass(consumer);",
                 "const bool last_tile = scheduled_tile(round + 1, blockIdx.x, gridDim.x) >= tiles;",
                 "consume_tile(sm, staging, o, t, ring, round, last_tile, consumer, warp, lane, S, is_causal);",
                 "ring += t.n_tiles;"):
        assert line in source, line
    produce = source[source.index("__device__ __forceinline__ void produce("):source.index("// Consumer warpgroup c")]
    order = ["const int index = scheduled_tile(round, blockIdx.x, gridDim.x);",
             "mbar_wait(sm.q_empty, static_cast<uint32_t>(round & 1) ^ 1);",
             "mbar_arrive_expect_tx(sm.q_full, Q_TILE_BYTES);", "for (int i = 0; i <= t.n_tiles; ++i) {",
             "load_kv_tile(sm.k, sm.k_full, sm.k_empty, map_k, ring + i, key_tile_start(i, t.n_tiles), t.head);",
             "load_kv_tile(sm.v, sm.v_full, sm.v_empty, map_v, ring + i - 1, "
             "key_tile_start(i - 1, t.n_tiles), t.head);",
             "ring += t.n_tiles;"]
    at = 0
    for line in order:
        found = produce.find(line, at)
        assert found >= 0, line
        at = found + len(line)


# ---------------------------------------------------------------------------------------------
# Whole CTAs: TMA boxes -> swizzled shared memory -> descriptors -> wgmma -> registers -> softmax
# -> P re-packing -> transposed-V wgmma -> staged epilogue -> bounds-checked stores
# ---------------------------------------------------------------------------------------------


def model_scheduled_tile(round_: int, block: int, grid: int) -> int:
    return round_ * grid + (block if round_ % 2 == 0 else grid - 1 - block)


def model_tile_coordinates(tile: int, q_tiles: int, heads: int, causal: bool) -> tuple[int, int]:
    if causal:
        return q_tiles - 1 - tile // heads, tile % heads
    return tile % q_tiles, tile // q_tiles


class Layouts:
    """The kernel's tables, as numpy index arrays for vectorized emulation."""

    def __init__(self, tables, c):
        self.c = c
        acc = np.array(tables["acc"])  # warp, lane, i, row, col
        t = acc[:, 0] * 32 + acc[:, 1]
        self.acc_row = np.zeros((128, 64), int)
        self.acc_col = np.zeros((128, 64), int)
        self.acc_row[t, acc[:, 2]] = acc[:, 3]
        self.acc_col[t, acc[:, 2]] = acc[:, 4]
        pack = {}
        for i, word in tables["pack"]:
            lo, hi = np.array([word & 0xFFFF, word >> 16], dtype=np.uint16).view(np.float16).astype(int) - 1
            pack[i] = (lo, hi)
        # P registers -> the A matrix of P V: value v of k16 step kk of thread t, from pack_p's source.
        cells = [(t, pack[c["P_REGS_PER_STEP"] * kk + v // 2][v % 2], isa_register_a(t, v)[0],
                  16 * kk + isa_register_a(t, v)[1])
                 for t in range(128) for kk in range(c["PV_STEPS"]) for v in range(8)]
        self.pack_t, self.pack_src, self.pack_row, self.pack_col = (np.array(x) for x in zip(*cells))
        self.q_desc, self.k_desc, self.v_desc = kernel_descriptor_tables(tables)
        stage = {(row, d): off for row, d, off in tables["stage"]}
        # Element index (byte offset / 2) in a staging block of accumulator i of thread t.
        self.stage_elem = np.array([[stage[(self.acc_row[t, i], self.acc_col[t, i] - self.acc_col[t, i] % 2)] // 2
                                     + self.acc_col[t, i] % 2 for i in range(64)] for t in range(128)])
        out = np.array(tables["out"])  # warp, lane, pass, row, chunk
        self.out_row, self.out_chunk = out[:, 3], out[:, 4]
        self.out_elem = np.array([stage[(row, chunk * 8)] // 2 for row, chunk in zip(self.out_row, self.out_chunk)])


class EmulatedCTA:
    """A persistent CTA of fmha_flash_wgmma: its tiles in the schedule's order, the K/V ring
    counter carried from tile to tile, shared memory as fp16 elements by byte offset / 2 (NaN where
    nothing was written). qkv(head) gives q, k, v of a head ([S, D] float32 of fp16 values);
    v_transposed = False reads V as a K-major B operand (the hardware without the transpose bit)."""

    BASE = 0x400  # a 1024-aligned shared base (the tables' operand addresses assume this one)

    def __init__(self, lay: Layouts, qkv, s_len: int, heads: int, causal: bool, v_transposed: bool = True):
        self.lay, self.c, self.qkv = lay, lay.c, qkv
        self.s_len, self.heads, self.causal, self.v_transposed = s_len, heads, causal, v_transposed
        self.smem = np.full((self.BASE + self.c["TILES_BYTES"]) // 2, np.nan, np.float64)
        self.ring = 0
        self._reads: dict = {}

    def run(self, block: int, grid: int, out) -> list[tuple[int, int]]:
        """Every tile of CTA `block` of `grid`; rows stored into out[head]; returns (head, q0) per tile."""
        c = self.c
        q_tiles = cdiv(self.s_len, c["BLOCK_M"])
        done = []
        for round_ in range(10**6):
            index = model_scheduled_tile(round_, block, grid)
            if index >= q_tiles * self.heads:
                break
            q_tile, head = model_tile_coordinates(index, q_tiles, self.heads, self.causal)
            n = self.tile(q_tile * c["BLOCK_M"], head, out[head])
            self.ring += n
            done.append((head, q_tile * c["BLOCK_M"]))
        return done

    def tma_tile(self, block: int, span_bytes: int, src, row0: int, rows: int) -> None:
        r = np.arange(rows)[:, None]
        for h in range(self.c["D_SPANS"]):
            values = np.zeros((rows, 64))
            part = src[row0:row0 + rows, h * 64:(h + 1) * 64]
            values[:part.shape[0]] = part  # rows past S: the map's zero fill
            self.smem[(block + h * span_bytes + tma_offset(r, np.arange(64)[None, :])) // 2] = values

    def read(self, desc: int, tile: int, kind: str, extent: int):
        """The operand wgmma reads through a descriptor of the tables (tile at 0x400) moved to `tile`."""
        assert (desc & 0x3FFF) + ((tile - 0x400) >> 4) < 1 << 14
        key = (desc + ((tile - 0x400) >> 4), kind, extent)
        if key not in self._reads:
            if kind == "k":
                self._reads[key] = k_major_reads(key[0], extent) // 2
            elif self.v_transposed:
                self._reads[key] = mn_major_reads(key[0], extent) // 2
            else:
                self._reads[key] = k_major_reads(key[0], extent).T // 2
        return self.smem[self._reads[key]]

    def tile(self, q0: int, head: int, out) -> int:
        c, lay, smem = self.c, self.lay, self.smem
        q, k, v = self.qkv(head)
        s_len, causal, base = self.s_len, self.causal, self.BASE
        bn = c["BLOCK_N"]
        self.tma_tile(base, c["Q_SPAN_BYTES"], q, q0, c["BLOCK_M"])
        n = cdiv(min(q0 + c["BLOCK_M"], s_len) if causal else s_len, bn)
        scale = np.float32(LOG2E / math.sqrt(128))
        lane = np.arange(128) % 32

        def stage(ring_offset: int, j: int) -> int:
            return base + ring_offset + ((self.ring + j) % c["STAGES"]) * c["KV_TILE_BYTES"]

        for consumer in range(c["CONSUMER_WARPGROUPS"]):
            row_top = q0 + consumer * c["WG_M"] + (np.arange(128) // 32) * 16 + lane // 4
            o = np.zeros((128, 64), np.float32)
            m = np.full((128, 2), -np.inf, np.float32)
            row_sum = np.zeros((128, 2), np.float32)
            alpha = np.ones((128, 2), np.float32)

            def scores(i: int):
                key0 = (n - 1 - i) * bn
                at = stage(c["K_RING_OFFSET"], i)
                self.tma_tile(at, c["KV_SPAN_BYTES"], k, key0, bn)  # the producer's load of K_i
                acc = np.zeros((64, bn))
                for ks in range(c["QK_STEPS"]):
                    acc += (self.read(lay.q_desc[(consumer, ks)], base, "k", 64)
                            @ self.read(lay.k_desc[ks], at, "k", bn).T)
                s = acc.astype(np.float32)[lay.acc_row, lay.acc_col]  # registers as the hardware leaves them
                if key0 + bn > s_len or (causal and key0 + bn - 1 > q0):  # tile_needs_mask, mask_scores
                    key = key0 + lay.acc_col
                    row = row_top[:, None] + (lay.acc_row - lay.acc_row[:, :1])
                    s = np.where((key >= s_len) | (causal & (key > row)), np.float32(-np.inf), s)
                return s

            def softmax(s):
                for r in range(2):
                    idx = [i for i in range(64) if (i % 4) // 2 == r]
                    tile_max = s[:, idx].max(axis=1)
                    quad_max = np.repeat(tile_max.reshape(32, 4).max(axis=1), 4)  # two xor-shuffles over the quad
                    m_new = np.maximum(m[:, r], quad_max)
                    ref = np.where(m_new == -np.inf, np.float32(0), m_new * scale).astype(np.float32)
                    with np.errstate(invalid="raise"):
                        alpha[:, r] = np.exp2((m[:, r] * scale).astype(np.float32) - ref)
                        s[:, idx] = np.exp2(s[:, idx] * scale - ref[:, None])
                    m[:, r] = m_new
                    row_sum[:, r] = row_sum[:, r] * alpha[:, r] + s[:, idx].sum(axis=1)
                return s

            def pack(s):
                """P registers (pack_p, fp16 rounding) -> the 64 x BLOCK_N A matrix of P V."""
                a = np.full((64, bn), np.nan)
                a[lay.pack_row, lay.pack_col] = s.astype(np.float16).astype(np.float64)[lay.pack_t, lay.pack_src]
                assert not np.isnan(a).any()
                return a

            def pv(i: int, p_mat):
                nonlocal o
                key0 = (n - 1 - i) * bn
                at = stage(c["V_RING_OFFSET"], i)
                self.tma_tile(at, c["KV_SPAN_BYTES"], v, key0, bn)  # the producer's load of V_i
                o = o * alpha[:, (np.arange(64) % 4) // 2]  # rescale_output
                update = np.zeros((64, c["HEAD_DIM"]))
                for step in range(c["PV_STEPS"]):
                    update += p_mat[:, 16 * step:16 * step + 16] @ self.read(lay.v_desc[step], at, "v", c["HEAD_DIM"])
                o = (o + update[lay.acc_row, lay.acc_col]).astype(np.float32)

            p_mat = pack(softmax(scores(0)))
            for i in range(1, n):
                s_next = scores(i)
                pv(i - 1, p_mat)
                p_mat = pack(softmax(s_next))
            pv(n - 1, p_mat)

            # store_output: normalise, stage in the warpgroup's own block, read back 16 bytes, store.
            total = np.repeat(row_sum.reshape(32, 4, 2).sum(axis=1), 4, axis=0)
            inv = np.where(total > 0, 1 / np.where(total > 0, total, 1), 0).astype(np.float32)
            staging = (base + c["O_STAGE_OFFSET"] + consumer * c["WG_O_BYTES"]) // 2
            smem[staging + lay.stage_elem] = (o * inv[:, (np.arange(64) % 4) // 2]).astype(np.float16)
            for row, chunk, elem in zip(lay.out_row, lay.out_chunk, lay.out_elem):
                g = q0 + consumer * c["WG_M"] + row
                if g < s_len:
                    values = smem[staging + elem:staging + elem + 8]
                    assert not np.isnan(values).any()
                    assert np.isnan(out[g, chunk * 8:chunk * 8 + 8]).all()  # each element once
                    out[g, chunk * 8:chunk * 8 + 8] = values
        return n


@pytest.mark.parametrize("case_name, seed, grid, blocks", [("small", 0, 1, "all"), ("ragged_causal", 1, 5, "all"),
                                                           ("ragged", 2, 7, (0, 6)), ("causal", 3, 132, (0, 131))])
def test_emulated_ctas_compute_attention(tables, case_name, seed, grid, blocks):
    """Persistent CTAs, each through its tiles in the schedule's order with the K/V rings carried
    over, give the reference within the problem's tolerances: small (one CTA, both heads), ragged
    (a partial last query tile and key tile), ragged_causal (7 query tiles whose diagonal and
    ragged tail meet; every CTA of the grid, so every row is stored exactly once), causal (the
    heaviest and lightest CTAs of the 132). Rows are stored once, and nothing else."""
    c = constants()
    lay = Layouts(tables, c)
    params = dict(problem().info.case(case_name).params)
    inputs = problem().make_inputs(params, seed, "cpu")
    s_len, d, heads = params["S"], params["D"], params["B"] * params["H"]
    qkv = {n: inputs[n].reshape(heads, s_len, d).float().numpy() for n in "qkv"}
    out = np.full((heads, s_len, d), np.nan)
    done = []
    for block in range(grid) if blocks == "all" else blocks:
        cta = EmulatedCTA(lay, lambda h: (qkv["q"][h], qkv["k"][h], qkv["v"][h]), s_len, heads, bool(params["causal"]))
        done += cta.run(block, grid, out)
    assert len(done) == len(set(done))
    if blocks == "all":
        assert len(done) == heads * cdiv(s_len, c["BLOCK_M"]) and not np.isnan(out).any()  # every row stored
    expected = problem().reference(inputs, params)["o"].reshape(heads, s_len, d)
    for head, q0 in done:
        rows = slice(q0, min(q0 + c["BLOCK_M"], s_len))
        got = torch.from_numpy(out[head, rows])
        assert not got.isnan().any()
        assert compare("o", got.half(), expected[head, rows], tolerance()).passed, (case_name, head, q0)
    untouched = np.ones((heads, s_len), bool)
    for head, q0 in done:
        untouched[head, q0:q0 + c["BLOCK_M"]] = False
    assert np.isnan(out[untouched]).all()


def test_emulation_catches_a_wrong_transpose(tables):
    """The same CTA with V read as a K-major operand (no transpose bit) is far off the attention."""
    c = constants()
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((100, 128)).astype(np.float16).astype(np.float32) for _ in range(3))
    scores = q.astype(np.float64) @ k.T.astype(np.float64) / math.sqrt(128)
    probs = np.exp(scores - scores.max(1, keepdims=True))
    want = (probs / probs.sum(1, keepdims=True)) @ v
    lay = Layouts(tables, c)
    for transposed, close in ((True, True), (False, False)):
        got = np.full((1, 100, 128), np.nan)
        EmulatedCTA(lay, lambda h: (q, k, v), 100, 1, False, v_transposed=transposed).run(0, 1, got)
        assert (np.abs(got[0] - want).max() < 1e-2) == close


# ---------------------------------------------------------------------------------------------
# The pipeline protocol under random schedules
# ---------------------------------------------------------------------------------------------


def consumer_program(c: int, ns: list[int], *, last_pass: bool = False, early_release: bool = False,
                     early_q_release: bool = False) -> list[tuple]:
    """consume_tile() over a CTA's tiles (ns: key tiles per tile) as a list of steps;
    ("issue", [(ring, index), ...]) issues one commit group reading those ring slots."""
    steps: list[tuple] = []
    ring = 0
    for r, n in enumerate(ns):
        last_tile = r == len(ns) - 1
        q_release = [("release", "q", r)]
        steps += [("wait_full", "q", r), ("wait_full", "k", ring), ("sched_wait",), ("issue", [("k", ring), ("q", r)]),
                  ("sched_pass",), ("wait_groups", 0), ("release", "k", ring)]
        if n == 1 or early_q_release:
            steps += q_release
        for i in range(1, n):
            j = ring + i
            steps += [("wait_full", "k", j), ("sched_wait",), ("issue", [("k", j), ("q", r)]),
                      ("wait_full", "v", j - 1), ("issue", [("v", j - 1)]), ("sched_pass",)]
            last_s = q_release if i == n - 1 and not early_q_release else []
            if early_release:
                steps += [("release", "k", j), ("release", "v", j - 1), *last_s, ("wait_groups", 0)]
            else:
                steps += [("wait_groups", 1), ("release", "k", j), *last_s, ("wait_groups", 0), ("release", "v", j - 1)]
        steps += [("wait_full", "v", ring + n - 1), ("sched_wait",), ("issue", [("v", ring + n - 1)])]
        if c == 0 or not last_tile or last_pass:
            steps.append(("sched_pass",))
        steps += [("wait_groups", 0), ("release", "v", ring + n - 1)]
        ring += n
    return steps


def producer_program(ns: list[int]) -> list[tuple[str, int]]:
    """produce(): per tile, Q (once the last one is released), then K_0, K_1, V_0, ..., V_(n-1)."""
    loads: list[tuple[str, int]] = []
    ring = 0
    for r, n in enumerate(ns):
        loads.append(("q", r))
        for i in range(n + 1):
            if i < n:
                loads.append(("k", ring + i))
            if i > 0:
                loads.append(("v", ring + i - 1))
        ring += n
    return loads


def simulate_pipeline(ns: list[int], seed: int, stages: int = 2, **variant) -> None:
    """produce() and two consume_tile() loops under a random schedule; TMA copies and wgmma groups
    complete at random later times (groups in order per consumer). The Q tile is a ring of one
    stage. Raises AssertionError on a hazard, a deadlock, or named barriers left unbalanced."""
    rng = random.Random(seed)
    warps = 4  # per consumer warpgroup; its warps arrive together in this model
    depth = {"q": 1, "k": stages, "v": stages}
    full = {ring: [MBarrier(1) for _ in range(depth[ring])] for ring in depth}
    empty = {ring: [MBarrier(2 * warps) for _ in range(depth[ring])] for ring in depth}
    holds = {ring: [None] * depth[ring] for ring in depth}
    copying: list[tuple[str, int, int]] = []  # (ring, stage, index)
    producer = producer_program(ns)
    produced = 0
    programs = [consumer_program(c, ns, **variant) for c in range(2)]
    pc = [0, 0]
    groups: list[list[list[tuple[str, int]]]] = [[], []]  # committed, unfinished groups: the slots they read
    sched_arrivals = [1, 0]  # pending bar.arrive on each consumer's ping-pong barrier: consumer 1's first pass

    def reading(ring: str, stage: int) -> bool:
        return any(rg == ring and j % depth[ring] == stage for g in groups for grp in g for rg, j in grp)

    steps = 0
    while pc != [len(programs[0]), len(programs[1])] or copying or any(groups):
        steps += 1
        assert steps < 400_000
        actions = []
        if produced < len(producer):
            ring, j = producer[produced]
            st = depth[ring]
            if empty[ring][j % st].ready(((j // st) & 1) ^ 1, j // st - 1 if j >= st else -1):
                actions.append(("produce",))
        actions += [("land", x) for x in range(len(copying))]
        actions += [("finish", cons) for cons in range(2) if groups[cons]]
        for cons in range(2):
            if pc[cons] == len(programs[cons]):
                continue
            step = programs[cons][pc[cons]]
            kind = step[0]
            if kind == "wait_full":
                ring, j = step[1], step[2]
                ok = full[ring][j % depth[ring]].ready((j // depth[ring]) & 1, j // depth[ring])
            elif kind == "sched_wait":
                ok = sched_arrivals[cons] >= 1
            elif kind == "wait_groups":
                ok = len(groups[cons]) <= step[1]
            else:
                ok = True
            if ok:
                actions.append(("step", cons))
        assert actions, "deadlock"
        action = rng.choice(actions)
        if action[0] == "produce":
            ring, j = producer[produced]
            produced += 1
            stage = j % depth[ring]
            assert not reading(ring, stage), f"TMA overwrites {ring} stage {stage} while a wgmma group reads it"
            full[ring][stage].arrive(expect_tx=2)
            copying.append((ring, stage, j))
        elif action[0] == "land":
            ring, stage, j = copying.pop(action[1])
            holds[ring][stage] = j
            full[ring][stage].complete_tx(2)
        elif action[0] == "finish":
            groups[action[1]].pop(0)
        else:
            cons = action[1]
            step = programs[cons][pc[cons]]
            pc[cons] += 1
            kind = step[0]
            if kind == "sched_wait":
                sched_arrivals[cons] -= 1
            elif kind == "sched_pass":
                assert sched_arrivals[cons ^ 1] == 0, "a second pass before the other consumer took its turn"
                sched_arrivals[cons ^ 1] += 1
            elif kind == "issue":
                for ring, j in step[1]:
                    stage = j % depth[ring]
                    assert holds[ring][stage] == j and not any(r == ring and x == stage for r, x, _ in copying), \
                        f"{ring} stage {stage} does not hold {ring} tile {j}"
                groups[cons].append(step[1])
            elif kind == "release":
                ring, j = step[1], step[2]
                empty[ring][j % depth[ring]].arrive(count=warps)
    assert produced == len(producer)
    assert sched_arrivals == [0, 0], f"ping-pong barriers left with arrivals {sched_arrivals}"


@pytest.mark.parametrize("ns", [[1], [2], [3], [7], [16], [2, 2, 2], [16, 16, 16], [4, 3, 2, 1], [1, 1, 1, 1],
                                [5, 1, 7, 2]])
def test_pipeline_protocol_is_safe(ns):
    """A persistent CTA's tiles (key tiles per tile: one head's ragged or causal mix)."""
    assert constants()["STAGES"] == 2
    for seed in range(30):
        simulate_pipeline(ns, seed)


def test_pipeline_model_catches_wrong_protocols():
    with pytest.raises(AssertionError, match="left with arrivals"):  # consumer 1 passes its last turn too
        simulate_pipeline([3, 2], 0, last_pass=True)
    with pytest.raises(AssertionError, match="while a wgmma group reads it"):  # stages released before the wait
        for seed in range(100):
            simulate_pipeline([6], seed, early_release=True)
    with pytest.raises(AssertionError, match="TMA overwrites q stage 0"):  # Q released before its last S
        for seed in range(200):
            simulate_pipeline([4, 4, 4], seed, early_q_release=True)


def test_the_gpu_probes_build_from_the_kernel_source(tmp_path):
    """tests/test_gpu_fmha_wgmma.py appends its probe kernels to kernel.cu; they build for sm_90a
    without spills here, and their parameter tables take the probes' arguments."""
    from gpu_tools import build_probes
    from test_gpu_fmha_wgmma import PROBE_FLAGS, PROBES, head_map

    cubin, log = build_probes(tmp_path, (EXPERT / "kernel.cu").read_text() + PROBES, *PROBE_FLAGS, "-Xptxas", "-v")
    assert "spill" not in log.replace("0 bytes spill", "") and "warning" not in log.lower()
    spec = head_map(128, 1, 128)
    maps = {i: bytes([i + 1]) * 128 for i in range(2)}
    for name, args in (("tma_head_box", (("tensor_map", "q", spec), ("buffer", "out", ""), ("scalar", 0, "i32"),
                                         ("scalar", 0, "i32"), ("scalar", 0, "i32"))),
                       ("qk_probe", (("tensor_map", "q", spec), ("tensor_map", "k", spec), ("buffer", "out", ""),
                                     ("scalar", 1, "i32"))),
                       ("pv_probe", (("tensor_map", "v", spec), ("buffer", "p", ""), ("buffer", "out", "")))):
        declared = read_kernel_parameters(cubin, name)
        assert declared is not None and declared.offsets[0] == 48  # 64-byte aligned in the constant bank
        n_maps = sum(a[0] == "tensor_map" for a in args)
        blob = pack_parameters(args, {"q": 1 << 40, "k": 2 << 40, "v": 3 << 40, "p": 4 << 40, "out": 5 << 40},
                               {i: maps[i] for i in range(n_maps)}, declared, name)
        assert len(blob) == declared.total and blob[declared.offsets[0]:declared.offsets[0] + 128] == maps[0]


def test_passes_the_gate_up_to_the_gpu(gate_cache):
    """Compile-only gate: static check, sm_90a compile, SASS features and the plan resolved on an
    H200 for every case (tensor maps included); no case is outside the domain."""
    assert_compiles_up_to_the_gpu(PROBLEM, state(), gate_cache,
                                  {"headline", "causal", "ragged", "ragged_causal", "small"}, set())
