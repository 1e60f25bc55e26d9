"""conv2d/implicit_wgmma, the Hopper conv expert (wgmma fed by TMA halo boxes), checked without a GPU.

- The plan: the domain (stride 1, C % 8 == 0, a patch's halo fits its slot) and the literals in it
  agree with the kernel's constants; the launch resolves for every supported case on an H200 to the
  grid, shared memory, 4-D (x) and 3-D (w) tensor maps and scalars the kernel expects; C = 3 is
  refused by the tensor maps themselves.
- The build: the static check, sm_90a with the real nvcc without spills, and SASS with HGMMA
  64x128x16, UTMALDG.4D/.3D, mbarriers and nothing of the Ampere path.
- The index math, read from a host build of the kernel's own helpers (kernel.cu compiled by nvcc):
  descriptors against the PTX ISA's format; patches cover every output pixel once; the rotated K
  order visits every K block once, and the loops' division-free walk (next_k_block_tap) is that
  order; its first `boxes` steps read each halo box once (first_read_of_box), every A operand inside
  the box whose barrier is waited on, one barrier per (consumer, box); for every tap, k16 step and element
  the wgmma operand address is
  where the 128B-swizzled TMA box put that input element (the mechanism the kernel rests on); the
  accumulator layout follows the ISA's m64nNk16 D layout through a conflict-free epilogue.
- Whole launches emulated from the tensor maps to y for every supported case (TMA boxes with zero
  fill into NaN-initialised shared memory, wgmma operands read through the descriptors, fp32 -> fp16
  staging, masked 16-byte stores): the reference convolution, every element of y written once; the
  same emulation with a wrong pad or stride byte offset fails.
- The producer / consumer mbarrier protocol, byte for byte, for every supported case and domain
  corner, every first K block and 1 .. 3 consumers (a barrier per halo box, issued in order of first
  read; filter ring; epilogue reusing the halo slot) under random schedules: no MMA reads bytes that
  have not landed, no hazard, no deadlock, every box barrier gets exactly its box's bytes and each
  consumer waits on exactly the boxes it reads; broken protocols are caught. The issue order puts
  16 KiB + (j + 1) boxes, not whole halos, ahead of consumer j's first MMAs.
- The compile-only gate.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

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
    sass_opcodes,
    sm90a_resources,
    swizzle_128b,
)
from klineage.devices import H200
from klineage.errors import DocumentError
from klineage.gate.compile import CompileResult, compile_kernel
from klineage.gate.correctness import compare
from klineage.gate.params import KernelParameters, check_tensor_map_buffer, pack_parameters, read_kernel_parameters
from klineage.kernel import KernelState, load_kernel
from klineage.launch import TensorMap, resolve
from klineage.problem import load_problem, tolerance_for

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "corpus" / "problems" / "conv2d.py"
KERNEL = ROOT / "corpus" / "kernels" / "conv2d" / "implicit_wgmma"
ENTRY = "conv2d_implicit_wgmma"
SUPPORTED = {"headline", "odd_hw", "odd_c", "pointwise", "small"}
HALO_BASE = 0x400  # a 1024-aligned shared address for consumer 0's halo slot in the host tables


@cache
def problem():
    return load_problem(PROBLEM)


@cache
def kernel() -> KernelState:
    return load_kernel(KERNEL)


@cache
def const() -> dict:
    return kernel().constants


def cases() -> dict[str, dict]:
    return {case.name: dict(case.params) for case in problem().info.cases}


def out_size(size: int, kernel_size: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel_size) // stride + 1


def plan_for(params: dict):
    env = {**params, **const(), **H200.facts()}
    return resolve(kernel().plan, env, {"x", "w", "y"})


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


def test_domain():
    plan = kernel().plan
    assert plan.problem == "conv2d" and plan.arch == "sm_90a"
    assert {name for name, p in cases().items() if plan.supports_case(p)} == SUPPORTED
    assert "stride 1" in plan.supports_reason.lower() and "C % 8 == 0" in plan.supports_reason
    # The literals of the predicate are the kernel's constants (a predicate sees case parameters only).
    c = const()
    assert plan.supports == (f"stride == 1 and C % 8 == 0 and cdiv(C, {c['BOX_C']}) * S * "
                             f"(R + {c['PATCH_P'] - 1}) <= {c['HALO_CAPACITY_ROWS']}")
    base = {"N": 1, "H": 16, "W": 16, "F": 64, "stride": 1, "pad": 1}
    for C, R, fits in ((64, 3, True), (72, 3, False), (192, 1, True), (256, 1, False), (8, 5, False), (8, 1, True)):
        assert plan.supports_case({**base, "C": C, "R": R, "S": R}) is fits, (C, R)
        # what the predicate admits is exactly what fits a halo slot
        rows = cdiv(C, c["BOX_C"]) * R * (R + c["PATCH_P"] - 1)
        assert (rows * c["HALO_ROW_BYTES"] <= c["HALO_SLOT_BYTES"]) is fits


def test_mechanism_constants():
    c = const()
    assert (c["PATCH_P"], c["PATCH_Q"], c["PATCHES_PER_CTA"], c["BLOCK_M"], c["BLOCK_N"]) == (8, 8, 3, 192, 128)
    assert (c["THREADS"], c["CONSUMER_WARPGROUPS"], c["WGMMA_N"], c["ACC_REGS"], c["K_STEPS"]) == (416, 3, 128, 64, 4)
    assert c["ROW_BYTES"] == c["SWIZZLE_BYTES"] == 128 and c["HALO_ROW_BYTES"] == c["SWIZZLE_ATOM_BYTES"] == 1024
    assert c["B_STAGE_BYTES"] == c["BLOCK_N"] * c["BOX_C"] * 2 == 16 * 1024
    # Barriers: full and empty per ring stage, and one per halo box a slot can hold: a box has R + 7 >= 8
    # rows, so at most HALO_CAPACITY_ROWS // 8 = 3 of them (1x1 filters up to 192 channels).
    assert c["HALO_BOXES_MAX"] == c["HALO_CAPACITY_ROWS"] // c["PATCH_P"] == 3 and c["MBARRIER_BYTES"] == 8
    assert c["HALO_BARRIERS"] == c["CONSUMER_WARPGROUPS"] * c["HALO_BOXES_MAX"]
    assert c["SMEM_BYTES"] == (c["SMEM_ALIGN"] + c["CONSUMER_WARPGROUPS"] * c["HALO_SLOT_BYTES"]
                               + c["STAGES"] * c["B_STAGE_BYTES"] + (2 * c["STAGES"] + c["HALO_BARRIERS"]) * 8)
    # One CTA per SM: its shared memory plus the driver's reserve fits an H200 SM.
    assert c["SMEM_BYTES"] <= SMEM_LIMIT and c["SMEM_BYTES"] + 1024 <= 233472
    assert c["DESC_SBO_BYTES"] == 1024 and c["DESC_K_STEP"] == 2 and c["DESC_SWIZZLE_128B"] == 1
    assert c["EPI_BYTES"] <= c["HALO_SLOT_BYTES"] and c["VEC"] == 8 and c["EPI_PAD"] == 8


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_plan_resolves_for_every_supported_case(name):
    c = const()
    p = cases()[name]
    N, H, W, C, F, R, S, pad = (p[k] for k in ("N", "H", "W", "C", "F", "R", "S", "pad"))
    P, Q = out_size(H, R, 1, pad), out_size(W, S, 1, pad)
    (launch,) = plan_for(p)
    assert launch.entry == ENTRY
    patches = N * cdiv(P, 8) * cdiv(Q, 8)
    assert launch.grid == (cdiv(patches, 3), cdiv(F, c["BLOCK_N"]), 1)
    assert launch.block == (416, 1, 1) and launch.shared == c["SMEM_BYTES"]
    x_map, w_map, *rest = launch.args
    assert x_map == ("tensor_map", "x", TensorMap("f16", (C, W, H, N), (2 * C, 2 * W * C, 2 * H * W * C),
                                                  (64, 8, R + 7, 1), "128B", "256B"))
    assert w_map == ("tensor_map", "w", TensorMap("f16", (C, R * S, F), (2 * C, 2 * R * S * C), (64, 1, 128),
                                                  "128B", "256B"))
    assert x_map[2].extent_bytes == N * H * W * C * 2 and w_map[2].extent_bytes == F * R * S * C * 2
    # The transaction bytes the producer announces are what the boxes deliver (zero fill included).
    assert 2 * (64 * 8 * (R + 7)) == (R + 7) * c["HALO_ROW_BYTES"] and 2 * 64 * 128 == c["B_STAGE_BYTES"]
    assert rest == [("buffer", "y", ""), ("scalar", N, "i32"), ("scalar", P, "i32"), ("scalar", Q, "i32"),
                    ("scalar", F, "i32"), ("scalar", C, "i32"), ("scalar", R, "i32"), ("scalar", S, "i32"),
                    ("scalar", pad, "i32")]


def test_headline_is_one_wave_of_whole_patches():
    (launch,) = plan_for(cases()["headline"])
    assert launch.grid == (131, 1, 1) and launch.grid[0] <= H200.num_sms  # 392 patches of 8 x 8, 3 per CTA
    assert 392 * 64 == 8 * 56 * 56  # 56 = 7 * 8: no pixel of the headline is computed and thrown away


def test_outside_the_domain():
    plan = kernel().plan
    # stride 2: the maps would resolve, the kernel would compute a stride-1 convolution; the domain refuses it.
    assert not plan.supports_case(cases()["strided"])
    plan_for(cases()["strided"])
    # C = 3: pixel rows 6 bytes apart; the tensor map itself is refused.
    with pytest.raises(DocumentError, match=r"strides\[0\] = 6 bytes must be a positive multiple of 16"):
        plan_for(cases()["stem"])


def test_static_check():
    static = pytest.importorskip("klineage.gate.static")
    report = static.static_check(kernel())
    assert report.ok, report.to_dict()


# ---------------------------------------------------------------------------------------------
# The build
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(gate_cache) -> CompileResult:
    # Into the gate cache's compile folder, so that the compile-only gate below loads this result.
    return compile_kernel(kernel(), gate_cache.local.root)


def test_compiles_for_sm90a_without_spills(compiled):
    res = sm90a_resources(compiled, ENTRY)
    assert "-O3" in compiled.flags and "-Xptxas" in compiled.flags and "-std=c++17" in compiled.flags
    assert 64 < res.registers <= 128, res  # 64 accumulators; __launch_bounds__(416, 1) allows 128+
    assert res.barriers == 4  # __syncthreads and one named barrier per consumer warpgroup
    assert "warning" not in compiled.log.lower(), compiled.log


def test_the_plan_packs_into_the_cubins_parameter_layout(compiled):
    """Two 64-byte aligned CUtensorMaps, the output pointer and eight i32 scalars, at the offsets the
    cubin declares, and each map within (and over the whole of) the buffer the runner gives it."""
    declared = read_kernel_parameters(compiled.cubin_bytes("sm_90a"), ENTRY)
    assert declared == KernelParameters((48, 176, 304, 312, 316, 320, 324, 328, 332, 336, 340),
                                        (128, 128, 8, 4, 4, 4, 4, 4, 4, 4, 4), 344)
    p = cases()["headline"]
    (launch,) = plan_for(p)
    pointers = {"x": 0x7F00_0000_0000, "w": 0x7F00_1000_0000, "y": 0x7F00_2000_0000}
    blob = pack_parameters(launch.args, pointers, {0: b"\xaa" * 128, 1: b"\xbb" * 128}, declared, ENTRY)
    assert blob[:48] == bytes(48) and blob[48:176] == b"\xaa" * 128 and blob[176:304] == b"\xbb" * 128
    assert struct.unpack_from("<Q8i", blob, 304) == (pointers["y"], 8, 56, 56, 128, 64, 3, 3, 1) and len(blob) == 344
    inputs = problem().make_inputs(dict(p), 0, "cpu")
    for (kind, name, spec), buffer in zip(launch.args[:2], (inputs["x"], inputs["w"])):
        assert kind == "tensor_map"
        check_tensor_map_buffer(name, spec, 0x1000, buffer.numel() * buffer.element_size(), "float16")
        assert spec.extent_bytes == buffer.numel() * buffer.element_size()


def test_sass_has_every_mechanism(compiled):
    c = const()
    mnemonics = sass_mnemonics(compiled.cubin_bytes("sm_90a"))
    ops = sass_opcodes(compiled)
    # Warpgroup MMA: one K block's K_STEPS m64n128k16 instructions (fp16 in, fp32 out), no mma.sync.
    assert mnemonics["HGMMA"] == c["K_STEPS"] == count(ops, r"^HGMMA\.64x128x16\.F32$")
    assert count(ops, r"^WARPGROUP\.ARRIVE$") == 1 and count(ops, r"^WARPGROUP\.DEPBAR\.LE$") == 2
    # TMA: one loop over the K blocks issues each 3-D filter box of w and, while the step is a box's
    # first read, that 4-D halo box of x for each patch (the loop over the patches unrolled);
    # descriptor prefetches.
    assert count(ops, r"^UTMALDG\.3D$") == 1 and count(ops, r"^UTMALDG\.4D$") == c["PATCHES_PER_CTA"]
    assert mnemonics["UTMALDG"] == count(ops, r"^UTMALDG\.[34]D$") and count(ops, r"^UTMACCTL\.PF$") == 2
    # mbarriers: full and empty per stage and one per halo box initialised; expect-tx and consumer
    # arrives; waits (empty by the producer, halo box and full by the consumers).
    assert count(ops, r"^SYNCS\.EXCH\.64$") == 2 * c["STAGES"] + c["HALO_BARRIERS"]
    assert count(ops, r"^SYNCS\.ARRIVE\.TRANS64") >= 3 and count(ops, r"^SYNCS\.PHASECHK\.TRANS64\.TRYWAIT$") >= 3
    # Every global read is a TMA load; nothing of the Ampere path; no local memory.
    assert sum(mnemonics[m] for m in ("LDG", "LDGSTS", "LDSM", "HMMA", "LDL", "STL")) == 0
    # Epilogue: fp16x2 packing, 4-byte staged stores, 16-byte reads and global stores (and the element path).
    assert count(ops, r"^F2FP\.F16\.F32\.PACK_AB$") == c["ACC_REGS"] // 2 == count(ops, r"^STS$")
    assert count(ops, r"^LDS\.128$") >= 1 and count(ops, r"^STG\.E\.128$") >= 1 and count(ops, r"^STG\.E\.U16$") >= 1
    assert count(ops, r"^BAR\.SYNC\b") >= 1 + 2 * c["CONSUMER_WARPGROUPS"]


# ---------------------------------------------------------------------------------------------
# Host build of the kernel's own index helpers
# ---------------------------------------------------------------------------------------------

HARNESS = r"""
#include <cuda_fp16.h>
#include <cstdint>
#include <cstdio>
#undef __device__
#define __device__ __attribute__((host)) __attribute__((device))
#define __syncthreads() ((void)0)
#define __cvta_generic_to_shared(p) ((size_t)0)
#include "KERNEL_CU"

struct Case { int N, H, W, C, F, R, S, pad; };
static const Case cases[] = { CASES };

int main()
{
    const unsigned addresses[] = {0x400u, 0x800u, 0x4400u, 0x7c00u, 0x16400u, 0x36400u, 0x3fc00u, 0x40400u};
    for (unsigned a : addresses) printf("desc %u %llu\n", a, (unsigned long long)smem_descriptor(a));
    for (int warp = 0; warp < WARPGROUP_THREADS / WARP_SIZE; ++warp)
        for (int lane = 0; lane < WARP_SIZE; ++lane) printf("accrow %d %d %d\n", warp, lane, accumulator_row(warp, lane));
    for (int g = 0; g < ACC_REGS / 4; ++g)
        for (int lane = 0; lane < WARP_SIZE; ++lane) printf("acccol %d %d %d\n", g, lane, accumulator_col(g, lane));
    for (int t = 0; t < WARPGROUP_THREADS; ++t)
        for (int p = 0; p < EPI_VEC_PASSES; ++p) {
            int row, col;
            epilogue_chunk(t, p, row, col);
            printf("chunk %d %d %d %d\n", t, p, row, col);
        }
    for (int t = 0; t < WARPGROUP_THREADS; ++t)
        for (int p = 0; p < EPI_SCALAR_PASSES; ++p) {
            int row, col;
            epilogue_element(t, p, row, col);
            printf("element %d %d %d %d\n", t, p, row, col);
        }
    for (int j = 0; j < CONSUMER_WARPGROUPS; ++j)
        for (int b = 0; b < HALO_BOXES_MAX; ++b) printf("hbar %d %d %u\n", j, b, halo_barrier(0u, j, b));
    for (int m = 0; m < WGMMA_M; ++m) {
        int dp, dq;
        patch_pixel(m, dp, dq);
        printf("pixel %d %d %d\n", m, dp, dq);
    }
    for (int ci = 0; ci < (int)(sizeof(cases) / sizeof(cases[0])); ++ci) {
        const Case& c = cases[ci];
        const int P = c.H + 2 * c.pad - c.R + 1, Q = c.W + 2 * c.pad - c.S + 1;  // stride 1
        const ConvShape sh = make_shape(c.N, P, Q, c.F, c.C, c.R, c.S, c.pad);
        printf("shape %d %d %d %d %d %d %d %d %d %d\n", ci, sh.patches_p, sh.patches_q, sh.patches, sh.c_chunks,
               sh.k_blocks, sh.box_bytes, sh.P, sh.Q, sh.boxes);
        for (int step = 0; step < sh.k_blocks; ++step)
            printf("firstread %d %d %d\n", ci, step, (int)first_read_of_box(step, sh));
        for (int patch = 0; patch < sh.patches; ++patch) {
            int n, p0, q0;
            patch_origin(patch, sh, n, p0, q0);
            printf("patch %d %d %d %d %d\n", ci, patch, n, p0, q0);
            for (int chunk = 0; chunk < sh.c_chunks; ++chunk)
                for (int s = 0; s < sh.S; ++s) {
                    int cc, w, h;
                    halo_box_coords(chunk, s, p0, q0, sh, cc, w, h);
                    printf("box %d %d %d %d %d %d %d %d\n", ci, patch, chunk, s, halo_box_index(chunk, s, sh), cc, w, h);
                }
        }
        for (int first = 0; first < sh.k_blocks; ++first)
            for (int step = 0; step < sh.k_blocks; ++step)
                printf("rot %d %d %d %d\n", ci, first, step, rotated_k_block(step, first, sh.k_blocks));
        for (int first = 0; first < sh.k_blocks; ++first) {  // the loops' walk: one division, then steps
            int r, s, chunk;
            k_block_tap(first, sh, r, s, chunk);
            for (int step = 0; step <= sh.k_blocks; ++step) {
                printf("walk %d %d %d %d %d %d\n", ci, first, step, r, s, chunk);
                next_k_block_tap(sh, r, s, chunk);
            }
        }
        for (int kb = 0; kb < sh.k_blocks; ++kb) {
            int r, s, chunk;
            k_block_tap(kb, sh, r, s, chunk);
            printf("tap %d %d %d %d %d\n", ci, kb, r, s, chunk);
            for (int j = 0; j < CONSUMER_WARPGROUPS; ++j) {
                const uint32_t slot = HALO_BASE + j * HALO_SLOT_BYTES;
                const uint32_t a = a_operand(slot, r, s, chunk, sh);
                printf("aop %d %d %d %u %llu\n", ci, kb, j, a, (unsigned long long)smem_descriptor(a));
            }
        }
        for (int stage = 0; stage < STAGES; ++stage) {
            const uint32_t b = HALO_BASE + HALO_BYTES + stage * B_STAGE_BYTES;
            printf("bop %d %d %u %llu\n", ci, stage, b, (unsigned long long)smem_descriptor(b));
        }
        const int probes[][4] = {{0, 0, 0, 0}, {c.N - 1, P - 1, Q - 1, c.F - 1}, {c.N / 2, P / 3, Q - 2, c.F / 2}};
        for (const auto& pr : probes)
            printf("out %d %d %d %d %d %lld\n", ci, pr[0], pr[1], pr[2], pr[3], output_offset(pr[0], pr[1], pr[2], pr[3], sh));
    }
    return 0;
}
"""  # noqa: E501  (C++ harness source, kept as written)

# Every supported case of the problem, and shapes at the corners of the domain: two 64-channel chunks
# (1x1) with F over two 128-filter tiles, an even 2x2 filter with pad 0, a 5x1 filter (R != S), 14 K
# blocks (7x1, two chunks), more than the ring has stages, the widest 1x1 (three chunks: three halo
# boxes of 8 rows, a full complement of box barriers) and a single K block (one box, one stage).
EXTRA_SHAPES = {"two_chunks_f200": {"N": 1, "H": 12, "W": 10, "C": 128, "F": 200, "R": 1, "S": 1, "pad": 0},
                "even_filter": {"N": 2, "H": 9, "W": 17, "C": 16, "F": 24, "R": 2, "S": 2, "pad": 0},
                "tall_filter": {"N": 1, "H": 11, "W": 13, "C": 24, "F": 40, "R": 5, "S": 1, "pad": 2},
                "ring_wraps": {"N": 1, "H": 10, "W": 9, "C": 128, "F": 16, "R": 7, "S": 1, "pad": 3},
                "three_chunks": {"N": 1, "H": 8, "W": 19, "C": 192, "F": 64, "R": 1, "S": 1, "pad": 0},
                "one_block": {"N": 2, "H": 5, "W": 7, "C": 16, "F": 8, "R": 1, "S": 1, "pad": 0}}
HARNESS_CASES = [*sorted(SUPPORTED), *EXTRA_SHAPES]


def case_params(name: str) -> dict:
    return {**EXTRA_SHAPES[name], "stride": 1} if name in EXTRA_SHAPES else cases()[name]


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, list[list[int]]]:
    rows = []
    for name in HARNESS_CASES:
        p = case_params(name)
        assert kernel().plan.supports_case(p), name
        rows.append("{" + ", ".join(str(p[k]) for k in ("N", "H", "W", "C", "F", "R", "S", "pad")) + "}")
    source = (HARNESS.replace("KERNEL_CU", str(KERNEL / "kernel.cu")).replace("CASES", ", ".join(rows))
              .replace("HALO_BASE", str(HALO_BASE)))
    work = tmp_path_factory.mktemp("harness-conv-wgmma")
    (work / "harness.cu").write_text(source)
    return run_host_harness(work, arch="sm_90a")


class Case:
    """One shape's tables from the host build, by the case's name."""

    def __init__(self, tables: dict, name: str):
        ci = HARNESS_CASES.index(name)
        self.name = name
        self.params = case_params(name)
        (shape,) = [r[1:] for r in tables["shape"] if r[0] == ci]
        (self.patches_p, self.patches_q, self.patches, self.c_chunks, self.k_blocks, self.box_bytes,
         self.P, self.Q, self.halo_boxes) = shape
        self.first_read = {r[1]: bool(r[2]) for r in tables["firstread"] if r[0] == ci}  # step -> first_read_of_box
        self.origin = {r[1]: tuple(r[2:]) for r in tables["patch"] if r[0] == ci}  # patch -> (n, p0, q0)
        self.boxes = {(r[1], r[2], r[3]): tuple(r[4:]) for r in tables["box"] if r[0] == ci}  # -> (index, c, w, h)
        self.rot = {(r[1], r[2]): r[3] for r in tables["rot"] if r[0] == ci}  # (first, step) -> K block
        self.tap = {r[1]: tuple(r[2:]) for r in tables["tap"] if r[0] == ci}  # K block -> (r, s, chunk)
        self.kb_of = {tap: kb for kb, tap in self.tap.items()}
        # (first, step) -> (r, s, chunk) as produce / consume reach it (steps 0 .. k_blocks)
        self.walk = {(r[1], r[2]): tuple(r[3:]) for r in tables["walk"] if r[0] == ci}
        self.aop = {(r[1], r[2]): (r[3], r[4]) for r in tables["aop"] if r[0] == ci}  # (kb, consumer) -> (addr, desc)
        self.bop = {r[1]: (r[2], r[3]) for r in tables["bop"] if r[0] == ci}  # stage -> (addr, desc)
        self.out = [tuple(r[1:]) for r in tables["out"] if r[0] == ci]


# ---- the PTX ISA's side ------------------------------------------------------------------------


def decode_descriptor(desc: int) -> dict:
    """The fields of a wgmma shared-memory matrix descriptor (PTX ISA, matrix descriptor format)."""
    return {"start": (desc & 0x3FFF) << 4, "lbo": ((desc >> 16) & 0x3FFF) << 4, "sbo": ((desc >> 32) & 0x3FFF) << 4,
            "base_offset": (desc >> 49) & 7, "swizzle": desc >> 62,
            "reserved": desc & ~((0x3FFF) | (0x3FFF << 16) | (0x3FFF << 32) | (7 << 49) | (3 << 62))}


def tma_box_offset(index: tuple, box: tuple, element_bytes: int = 2):
    """Byte offset from a 1024-aligned destination where a 128B-swizzled TMA box puts element
    `index` (innermost first): the box is stored densely, innermost dimension contiguous, then the
    swizzle moves 16-byte chunks within each 1024-byte atom."""
    linear = 0
    for i, b in zip(reversed(index), reversed(box)):
        linear = linear * b + i
    return swizzle_128b(linear * element_bytes)


def wgmma_operand_address(start, sbo, row, kk):
    """Byte address wgmma reads for element (row, k = kk) of a K-major fp16 operand in the 128B
    swizzle mode: 8-line groups SBO bytes apart, 128-byte lines, swizzled on the absolute address
    (base offset 0: the pattern starts on a 1024-byte boundary)."""
    return swizzle_128b(start + (row // 8) * sbo + (row % 8) * 128 + kk * 2)


# ---- checks of the helpers ---------------------------------------------------------------------


def test_descriptors_match_the_isa(tables):
    c = const()
    assert len(tables["desc"]) == 8
    for address, desc in tables["desc"]:
        fields = decode_descriptor(desc)
        assert fields == {"start": address & 0x3FFF0, "lbo": c["DESC_LBO_BYTES"], "sbo": 1024, "base_offset": 0,
                          "swizzle": 1, "reserved": 0}, hex(address)
        # the kernel's k16 step moves the start address 32 bytes, with no carry out of the field
        assert decode_descriptor(desc + 3 * c["DESC_K_STEP"])["start"] == (address & 0x3FFF0) + 96


def test_patches_cover_every_output_pixel_once(tables):
    for name in HARNESS_CASES:
        case = Case(tables, name)
        p = case.params
        assert (case.P, case.Q) == (out_size(p["H"], p["R"], 1, p["pad"]), out_size(p["W"], p["S"], 1, p["pad"]))
        assert (case.patches_p, case.patches_q) == (cdiv(case.P, 8), cdiv(case.Q, 8))
        assert case.patches == p["N"] * case.patches_p * case.patches_q == len(case.origin)
        pixels = Counter()
        for _patch, (n, p0, q0) in case.origin.items():
            assert p0 % 8 == 0 and q0 % 8 == 0 and 0 <= n < p["N"] and p0 < case.P and q0 < case.Q
            for dp in range(8):
                for dq in range(8):
                    if p0 + dp < case.P and q0 + dq < case.Q:
                        pixels[(n, p0 + dp, q0 + dq)] += 1
        assert len(pixels) == p["N"] * case.P * case.Q and set(pixels.values()) == {1}, name
        # a CTA's three patches are neighbours along q where the row allows it
        n0, r0, q0 = case.origin[0]
        if case.patches_q >= 2:
            assert case.origin[1] == (n0, r0, q0 + 8)


def test_patch_pixels_and_output_offsets(tables):
    assert [tuple(r[1:]) for r in tables["pixel"]] == [(m // 8, m % 8) for m in range(64)]
    for name in HARNESS_CASES:
        case = Case(tables, name)
        for n, p, q, f, offset in case.out:
            assert offset == ((n * case.P + p) * case.Q + q) * case.params["F"] + f  # NHWC


def test_k_blocks_and_their_rotation(tables):
    for name in HARNESS_CASES:
        case = Case(tables, name)
        p = case.params
        assert case.c_chunks == cdiv(p["C"], 64) and case.k_blocks == p["R"] * p["S"] * case.c_chunks
        # K block kb = (tap r*S + s) * c_chunks + chunk: the order of w's inner dimensions, each once
        assert {kb: case.tap[kb] for kb in range(case.k_blocks)} == {
            ((r * p["S"] + s) * case.c_chunks + ch): (r, s, ch)
            for r in range(p["R"]) for s in range(p["S"]) for ch in range(case.c_chunks)}
        for first in range(case.k_blocks):  # every CTA visits every K block once, starting at its own
            order = [case.rot[(first, step)] for step in range(case.k_blocks)]
            assert order == [(first + step) % case.k_blocks for step in range(case.k_blocks)]
            # ... and the loops, stepping with next_k_block_tap from the tap of block `first`, walk
            # exactly that order, and would come back to `first` after the last step.
            walk = [case.walk[(first, step)] for step in range(case.k_blocks + 1)]
            assert walk == [case.tap[kb] for kb in order] + [case.tap[first]]


def test_halo_boxes_are_the_input_window_of_each_tap(tables):
    """Box (chunk, s) starts at input column q0 - pad + s and row p0 - pad; boxes tile the slot in
    order, each box_bytes = (R + 7) rows of 1024 bytes, and the slot holds them all."""
    c = const()
    for name in HARNESS_CASES:
        case = Case(tables, name)
        p = case.params
        assert case.box_bytes == (p["R"] + 7) * c["HALO_ROW_BYTES"]
        assert case.c_chunks * p["S"] * case.box_bytes <= c["HALO_SLOT_BYTES"]
        for (patch, chunk, s), (index, cc, w, h) in case.boxes.items():
            n, p0, q0 = case.origin[patch]
            assert (index, cc, w, h) == (chunk * p["S"] + s, 64 * chunk, q0 - p["pad"] + s, p0 - p["pad"])


def a_operand_span(case: Case, kb: int, consumer: int) -> tuple[int, int]:
    """Bytes [lo, hi) of consumer's halo slot that the A operand of K block kb spans, from the kernel's
    own operand address: 8 core groups (patch rows) of 8 lines x 128 bytes, SBO = 1024 apart."""
    c = const()
    lo = case.aop[(kb, consumer)][0] - (HALO_BASE + consumer * c["HALO_SLOT_BYTES"])
    return lo, lo + c["PATCH_P"] * c["HALO_ROW_BYTES"]


def test_halo_boxes_in_order_of_need(tables):
    """The per-box barriers rest on this: in every CTA's rotated K order (every first block), steps
    0 .. boxes - 1 -- exactly those first_read_of_box marks -- read each halo box once, and every later
    step reads a box read before; the A operand of a step lies wholly inside the box (chunk, s) of its
    tap, the box whose barrier the consumer waits on. Box barriers are distinct, one per (consumer,
    box), inside the HALO_BARRIERS the kernel initialises, and no supported shape has more boxes."""
    c = const()
    for name in HARNESS_CASES:
        case = Case(tables, name)
        p = case.params
        assert case.halo_boxes == case.c_chunks * p["S"] <= c["HALO_BOXES_MAX"]
        assert case.k_blocks == p["R"] * case.halo_boxes
        assert [case.first_read[step] for step in range(case.k_blocks)] == [step < case.halo_boxes
                                                                            for step in range(case.k_blocks)]
        for first in range(case.k_blocks):
            seen = []
            for step in range(case.k_blocks):
                r, s, chunk = case.walk[(first, step)]
                kb = case.kb_of[(r, s, chunk)]
                box = case.boxes[(0, chunk, s)][0]
                if case.first_read[step]:
                    assert box not in seen, (name, first, step)
                    seen.append(box)
                else:
                    assert box in seen, (name, first, step)
                for j in range(c["CONSUMER_WARPGROUPS"]):
                    lo, hi = a_operand_span(case, kb, j)
                    assert box * case.box_bytes <= lo and hi <= (box + 1) * case.box_bytes, (name, kb, j)
            assert sorted(seen) == list(range(case.halo_boxes))
    bars = {(j, b): addr for j, b, addr in tables["hbar"]}
    assert len(bars) == c["HALO_BARRIERS"] == len(set(bars.values()))
    assert sorted(bars.values()) == [8 * i for i in range(c["HALO_BARRIERS"])]
    # The widest shapes the domain admits still fit: 1x1 up to 192 channels, 3x3 up to 64, 3x1 up to 64.
    for C, R, S in ((192, 1, 1), (64, 3, 3), (64, 1, 3), (8, 7, 1)):
        assert cdiv(C, c["BOX_C"]) * S * (R + 7) <= c["HALO_CAPACITY_ROWS"]
        assert cdiv(C, c["BOX_C"]) * S <= c["HALO_BOXES_MAX"]


def test_wgmma_reads_what_tma_wrote(tables):
    """The mechanism the kernel rests on. For every case, K block, consumer, k16 step, operand row m
    and k: the address the A descriptor makes wgmma read is where the 128B-swizzled TMA box (chunk,
    s) stored input element (image row p0 - pad + r + m // 8, column q0 - pad + s + m % 8, channel
    64 chunk + 16 ks + kk) -- exactly A[m, k] of the implicit GEMM. Likewise B from the filter box."""
    c = const()
    for name in HARNESS_CASES:
        case = Case(tables, name)
        p = case.params
        box = (64, 8, p["R"] + 7, 1)
        for kb in range(case.k_blocks):
            r, s, chunk = case.tap[kb]
            for j in range(c["CONSUMER_WARPGROUPS"]):
                addr, desc = case.aop[(kb, j)]
                slot = HALO_BASE + j * c["HALO_SLOT_BYTES"]
                assert slot % 1024 == 0
                fields = decode_descriptor(desc)
                assert fields["start"] == addr and fields["sbo"] == 1024 and fields["base_offset"] == 0
                assert (addr - slot) % 1024 == 0  # every operand starts on a swizzle atom
                box_base = slot + (chunk * p["S"] + s) * case.box_bytes
                for ks in range(c["K_STEPS"]):
                    start = decode_descriptor(desc + ks * c["DESC_K_STEP"])["start"]
                    for m in range(64):
                        for kk in range(16):
                            got = wgmma_operand_address(start, fields["sbo"], m, kk)
                            # element (channel, box column, box row, image) of the box
                            want = box_base + tma_box_offset((16 * ks + kk, m % 8, r + m // 8, 0), box)
                            assert got == want, (name, kb, j, ks, m, kk)
        b_box = (64, 1, 128)
        for _stage, (addr, desc) in case.bop.items():
            fields = decode_descriptor(desc)
            assert fields["start"] == addr and addr % 1024 == 0 and fields["sbo"] == 1024
            for ks in range(c["K_STEPS"]):
                start = decode_descriptor(desc + ks * c["DESC_K_STEP"])["start"]
                for f in range(128):
                    for kk in range(16):
                        assert wgmma_operand_address(start, 1024, f, kk) == addr + tma_box_offset((16 * ks + kk, 0, f),
                                                                                                  b_box)
    # With a 512-byte stride byte offset, or without the swizzle, wgmma would read elsewhere.
    assert wgmma_operand_address(0x400, 512, 8, 0) != 0x400 + tma_box_offset((0, 0, 1, 0), (64, 8, 10, 1))
    assert 0x400 + 1 * 128 + 0 * 2 != 0x400 + tma_box_offset((0, 1, 0, 0), (64, 8, 10, 1))


def test_accumulators_and_epilogue(tables):
    c = const()
    rows = {(w, lane): r for w, lane, r in tables["accrow"]}
    cols = {(g, lane): col for g, lane, col in tables["acccol"]}
    cover = Counter()
    for t in range(128):
        warp, lane = t // 32, t % 32
        for i in range(c["ACC_REGS"]):
            row = rows[(warp, lane)] + (c["ACC_ROW_HALF"] if i % 4 >= 2 else 0)
            col = cols[(i // 4, lane)] + i % 2
            assert (row, col) == ptx_wgmma_d(t, i)
            cover[(row, col)] += 1
    assert set(cover) == {(r, col) for r in range(64) for col in range(128)} and set(cover.values()) == {1}
    # Staged fp16x2 stores: the 32 lanes of one store hit 32 different banks.
    for warp in range(4):
        for g in range(c["ACC_REGS"] // 4):
            for half in range(2):
                words = [
                    ((rows[(warp, lane)] + half * 8) * c["EPI_STRIDE"] + cols[(g, lane)]) // 2 for lane in range(32)
                ]
                assert len({w % 32 for w in words}) == 32
    # 16-byte chunks: each once; a warp's pass is two whole output pixels (512 contiguous bytes of y
    # when the two pixels are neighbours along q); 8 lanes at a time read 8 different bank groups.
    chunks = Counter()
    by_pass: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for t, p, row, col in tables["chunk"]:
        chunks[(row, col)] += 1
        by_pass.setdefault((t // 32, p), []).append((row, col))
    assert set(chunks) == {(r, col) for r in range(64) for col in range(0, 128, 8)} and set(chunks.values()) == {1}
    for cells in by_pass.values():
        assert [col for _, col in cells] == 2 * list(range(0, 128, 8))
        first, second = cells[0][0], cells[16][0]
        assert second == first + 1 and first % 2 == 0 and first // 8 == second // 8  # same patch row, q and q + 1
        for q in range(0, 32, 8):
            addresses = [r * c["EPI_STRIDE"] * 2 + col * 2 for r, col in cells[q:q + 8]]
            assert sorted((a // 16) % 8 for a in addresses) == list(range(8))
    # The element path (F % 8 != 0): each element once, a warp's 32 lanes on consecutive filters of one pixel.
    elements = Counter()
    for t, p, row, col in tables["element"]:
        elements[(row, col)] += 1
        assert (row, col) == divmod(t + 128 * p, 128)
    assert set(elements) == {(r, col) for r in range(64) for col in range(128)} and set(elements.values()) == {1}


# ---------------------------------------------------------------------------------------------
# Whole launches, emulated
# ---------------------------------------------------------------------------------------------


def emulate(case: Case, tables: dict, inputs: dict, launch, pad_error: int = 0, sbo: int | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every CTA of the launch, all patches at once: halo boxes written by the TMA model (zeros out of
    bounds) into NaN-initialised slots, filter boxes likewise into the ring, wgmma operands read
    through the kernel's descriptors in each CTA's rotated K order (the loops' walk), D accumulated in float64, then
    the ISA's accumulator layout staged by the kernel's mapping, rounded to fp16 and stored by the
    kernel's chunks and masks. Returns y (NaN where never written) and a count of writes per element.
    pad_error and sbo break the emulated kernel on purpose, to show the emulation notices."""
    c = const()
    p = case.params
    N, H, W, C, F, R, S = (p[k] for k in ("N", "H", "W", "C", "F", "R", "S"))
    P, Q = case.P, case.Q
    x = inputs["x"].double()
    w = inputs["w"].double()
    assert launch.grid == (cdiv(case.patches, 3), cdiv(F, 128), 1)
    patches = case.patches
    slot_elems = c["HALO_SLOT_BYTES"] // 2

    # Halo slots: every box of every patch, as TMA lays it out.
    halo = torch.full((patches, slot_elems), float("nan"), dtype=torch.float64)
    ch, col, row = torch.meshgrid(torch.arange(64), torch.arange(8), torch.arange(R + 7), indexing="ij")
    box = (64, 8, R + 7, 1)
    local = tma_box_offset((ch, col, row, torch.zeros_like(ch)), box) // 2  # [64, 8, R+7] element offsets
    for chunk in range(case.c_chunks):
        for s in range(S):
            coords = torch.tensor([case.boxes[(pt, chunk, s)] for pt in range(patches)])  # [patches, 4]
            index, c0, w0, h0 = coords.unbind(1)
            h0 = h0 - pad_error
            n = torch.tensor([case.origin[pt][0] for pt in range(patches)])
            gc = c0[:, None, None, None] + ch
            gw = w0[:, None, None, None] + col
            gh = h0[:, None, None, None] + row
            inside = (gc < C) & (gw >= 0) & (gw < W) & (gh >= 0) & (gh < H)
            values = x[n[:, None, None, None].expand_as(gc), gh.clamp(0, H - 1), gw.clamp(0, W - 1), gc.clamp(0, C - 1)]
            values = torch.where(inside, values, torch.zeros((), dtype=torch.float64))
            where = index[:, None, None, None] * (case.box_bytes // 2) + local
            assert int(where.max()) < slot_elems
            halo.scatter_(1, where.reshape(patches, -1), values.reshape(patches, -1))

    # Accumulate: each patch in its CTA's rotated K order, as next_k_block_tap walks it.
    m_idx, kk_idx = torch.meshgrid(torch.arange(64), torch.arange(16), indexing="ij")
    f_idx, kf_idx = torch.meshgrid(torch.arange(128), torch.arange(16), indexing="ij")
    b_local = tma_box_offset((torch.arange(64)[None, :], torch.zeros(1, 64, dtype=torch.long),
                              torch.arange(128)[:, None]), (64, 1, 128)) // 2  # [128 f, 64 c]
    cta = torch.arange(patches) // 3
    consumer = torch.arange(patches) % 3
    y = torch.full((N, P, Q, F), float("nan"), dtype=torch.float64)
    writes = torch.zeros((N, P, Q, F), dtype=torch.int32)
    for f_tile in range(launch.grid[1]):
        f0 = 128 * f_tile
        # The ring's stage for each K block (which stage a block lands in does not change its bytes).
        stages = torch.full((case.k_blocks, c["B_STAGE_BYTES"] // 2), float("nan"), dtype=torch.float64)
        for kb in range(case.k_blocks):
            r, s, chunk = case.tap[kb]
            gf = f0 + torch.arange(128)[:, None]
            gc = 64 * chunk + torch.arange(64)[None, :]
            inside = (gf < F) & (gc < C)
            values = torch.where(
                inside, w[gf.clamp(max=F - 1), r, s, gc.clamp(max=C - 1)], torch.zeros((), dtype=torch.float64)
            )
            stages[kb, b_local.reshape(-1)] = values.reshape(-1)
        acc = torch.zeros(patches, 64, 128, dtype=torch.float64)
        for step in range(case.k_blocks):
            kb = torch.tensor([case.kb_of[case.walk[(int(b) % case.k_blocks, step)]] for b in cta])
            a_start = torch.tensor([case.aop[(int(k), int(j))][0] for k, j in zip(kb, consumer)])
            a_desc = [case.aop[(int(k), int(j))][1] for k, j in zip(kb, consumer)]
            slot = HALO_BASE + consumer * c["HALO_SLOT_BYTES"]
            b_addr, b_desc = case.bop[0]
            for ks in range(c["K_STEPS"]):
                starts = torch.tensor([decode_descriptor(d + ks * c["DESC_K_STEP"])["start"] for d in a_desc])
                assert torch.equal(starts, a_start + 32 * ks)
                a_sbo = sbo or decode_descriptor(a_desc[0])["sbo"]
                a_addr = wgmma_operand_address(starts[:, None, None], a_sbo, m_idx, kk_idx) - slot[:, None, None]
                A = torch.gather(halo, 1, (a_addr // 2).reshape(patches, -1)).view(patches, 64, 16)
                b_start = decode_descriptor(b_desc + ks * c["DESC_K_STEP"])["start"]
                b_el = (wgmma_operand_address(b_start, 1024, f_idx, kf_idx) - b_addr) // 2
                B = stages[kb][:, b_el.reshape(-1)].view(patches, 128, 16)
                acc += A @ B.transpose(1, 2)
        # Epilogue: registers (ISA layout) -> staged rows (the kernel's mapping) -> fp16 -> y.
        rows = {(wp, lane): rr for wp, lane, rr in tables["accrow"]}
        cols = {(g, lane): cc for g, lane, cc in tables["acccol"]}
        t_i = [(t, i) for t in range(128) for i in range(c["ACC_REGS"])]
        isa = torch.tensor([ptx_wgmma_d(t, i) for t, i in t_i])
        kern = torch.tensor([(rows[(t // 32, t % 32)] + (8 if i % 4 >= 2 else 0), cols[(i // 4, t % 32)] + i % 2)
                             for t, i in t_i])
        staged = torch.full((patches, 64, c["EPI_STRIDE"]), float("nan"), dtype=torch.float64)
        staged[:, kern[:, 0], kern[:, 1]] = acc[:, isa[:, 0], isa[:, 1]].float().half().double()
        # The vector path's chunks (F % 8 == 0 in every emulated shape), all patches at once.
        assert F % 8 == 0
        pixel = {m: (dp, dq) for m, dp, dq in tables["pixel"]}
        srow = torch.tensor([r[2] for r in tables["chunk"]])
        scol = torch.tensor([r[3] for r in tables["chunk"]])
        dp = torch.tensor([pixel[int(r)][0] for r in srow])
        dq = torch.tensor([pixel[int(r)][1] for r in srow])
        origin = torch.tensor([case.origin[pt] for pt in range(patches)])  # [patches, (n, p0, q0)]
        pp = origin[:, 1:2] + dp
        qq = origin[:, 2:3] + dq
        ff = f0 + scol.expand_as(pp)
        keep = (pp < P) & (qq < Q) & (ff < F)
        flat = ((origin[:, 0:1] * P + pp) * Q + qq) * F + ff  # NHWC element offset of the chunk
        lanes = torch.arange(8)
        where = (flat[keep][:, None] + lanes)
        values = staged[torch.arange(patches)[:, None].expand_as(pp)[keep][:, None],
                        srow.expand_as(pp)[keep][:, None], scol.expand_as(pp)[keep][:, None] + lanes]
        y.view(-1)[where.reshape(-1)] = values.reshape(-1)
        writes.view(-1).index_add_(0, where.reshape(-1), torch.ones(where.numel(), dtype=torch.int32))
    return y, writes


EMULATED = sorted(SUPPORTED)


@pytest.mark.parametrize("name", EMULATED)
def test_emulated_launch_reproduces_the_reference(tables, name):
    case = Case(tables, name)
    (launch,) = plan_for(case.params)
    inputs = problem().make_inputs(dict(case.params), 1, "cpu")
    expected = problem().reference(inputs)["y"]
    y, writes = emulate(case, tables, inputs, launch)
    assert writes.eq(1).all(), "an element of y written twice or never"
    got = y.half()
    assert got.shape == expected.shape
    comparison = compare("y", got, expected, tolerance_for("float16", problem().info.tolerances))
    assert comparison.passed, comparison.message
    assert comparison.rel_l2 < 1e-3  # one fp16 rounding, not merely inside the tolerance


@pytest.mark.parametrize("name", list(EXTRA_SHAPES))
def test_emulated_launch_at_the_domain_corners(tables, name):
    """Two channel chunks with F over two filter tiles, an even filter with pad 0, a 5x1 filter, more K
    blocks than stages: integer inputs, so the float64 emulation equals the exact convolution."""
    case = Case(tables, name)
    p = case.params
    (launch,) = plan_for(p)
    gen = torch.Generator().manual_seed(len(name))
    x = torch.randint(-4, 5, (p["N"], p["H"], p["W"], p["C"]), generator=gen).half()
    w = torch.randint(-3, 4, (p["F"], p["R"], p["S"], p["C"]), generator=gen).half()
    y, writes = emulate(case, tables, {"x": x, "w": w}, launch)
    assert writes.eq(1).all()
    truth = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2),
                                       padding=p["pad"]).permute(0, 2, 3, 1)
    assert torch.equal(y, truth.half().double())


def test_the_emulation_has_teeth(tables):
    case = Case(tables, "small")
    (launch,) = plan_for(case.params)
    inputs = problem().make_inputs(dict(case.params), 2, "cpu")
    expected = problem().reference(inputs)["y"]
    tol = tolerance_for("float16", problem().info.tolerances)
    for broken in ({"pad_error": 1}, {"sbo": 512}):
        y, _ = emulate(case, tables, inputs, launch, **broken)
        assert not compare("y", y.half(), expected, tol).passed, broken


# ---------------------------------------------------------------------------------------------
# The mbarrier protocol under random schedules
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HaloGeometry:
    """One CTA's halo and K loop as the protocol sees them, from the kernel's own helpers (the host
    tables): step i of the K loop reads the slot bytes spans[i] (its A operand, from a_operand) and,
    where first_read_of_box marks the step, first waits on the barrier of box waits[i] (halo_box_index
    of its tap; None elsewhere). A box has box_bytes, a patch `boxes` of them."""
    k_blocks: int
    boxes: int
    box_bytes: int
    spans: tuple[tuple[int, int], ...]
    waits: tuple[int | None, ...]


def halo_geometry(case: Case, first: int) -> HaloGeometry:
    spans, waits = [], []
    for step in range(case.k_blocks):
        r, s, chunk = case.walk[(first, step)]  # the K block of step `step` as consume reaches it
        kb = case.kb_of[(r, s, chunk)]
        spans.append(a_operand_span(case, kb, 0))
        waits.append(case.boxes[(0, chunk, s)][0] if case.first_read[step] else None)
    return HaloGeometry(case.k_blocks, case.halo_boxes, case.box_bytes, tuple(spans), tuple(waits))


def producer_program(geo: HaloGeometry, active: int, boxes_last: bool = False) -> list[tuple]:
    """produce(), transcribed: per K step, filter block `step` into the next ring stage (waits for the
    stage to be free), then, where the step is a box's first read, that box of patch 0 .. active - 1
    (no wait). boxes_last issues every filter block before any box (a wrong order, on purpose)."""
    program: list[tuple] = []
    for step in range(geo.k_blocks):
        program.append(("ring", step))
        if geo.waits[step] is not None:
            program += [("halo", j, geo.waits[step]) for j in range(active)]
    if boxes_last:
        program = [i for i in program if i[0] == "ring"] + [i for i in program if i[0] == "halo"]
    return program


def simulate_cta(geo: HaloGeometry, active: int, stages: int, seed: int, early_release: bool = False,
                 skip_epilogue_barrier: bool = False, one_box_wait: bool = False, halo_tx_bytes: int | None = None,
                 boxes_last: bool = False) -> None:
    """produce / consume / the epilogue of one CTA, transcribed, byte for byte: one producer thread
    (producer_program; each expect-tx announces B_STAGE_BYTES or box_bytes on the barrier the TMA
    counts on), `active` consumer warpgroups of 4 warps each (per K step: the box barrier where the step
    is the box's first read, the full wait, an MMA group reading the halo bytes of the step's A operand
    and the stage, wait_group 1, release of the previous stage; then wait_group 0, the warpgroup
    barrier, staging into the halo slot). All HALO_BARRIERS box barriers exist, as the kernel
    initialises them. TMA copies land at random later times, a halo box in 1 .. 3 pieces of whole
    rows, each piece completing its bytes on the box's barrier; MMA groups finish at random later times.

    Asserts: no MMA reads halo bytes that have not landed or a stage that does not hold its K block; no
    TMA overwrites a stage an MMA reads; no epilogue overwrites a slot an MMA or a copy still uses; no
    deadlock; and at the end every box barrier of an active patch completed its one phase with exactly
    box_bytes, the others were never touched, every halo byte landed once, and each consumer waited on
    exactly the boxes it read. The keyword arguments break the protocol on purpose: release a stage
    early, skip the epilogue barrier, wait only on the first box's barrier, announce other byte counts
    on the box barriers, issue the boxes after all filter blocks."""
    c = const()
    rng = random.Random(seed)
    warps_per_wg = c["WARPS_PER_WARPGROUP"]
    row_bytes = c["HALO_ROW_BYTES"]
    full = [MBarrier(1) for _ in range(stages)]
    empty = [MBarrier(active * warps_per_wg) for _ in range(stages)]
    halo_bar = {(j, b): MBarrier(1) for j in range(c["CONSUMER_WARPGROUPS"]) for b in range(c["HALO_BOXES_MAX"])}
    announced = Counter()  # bytes announced on each box barrier
    delivered = Counter()  # bytes completed on each box barrier
    landed = [Counter() for _ in range(active)]  # slot row -> times written by TMA
    holds = [None] * stages  # K step whose filter box has landed in the stage
    copying: list[dict] = []  # in-flight TMA copies
    program = producer_program(geo, active, boxes_last)
    pc = 0
    warps = [{"wg": i // warps_per_wg, "step": 0, "groups": [], "waiting": False, "state": "loop", "halo_ok": False,
              "waited": set(), "read": set()} for i in range(active * warps_per_wg)]
    arrived = [0] * active  # warps of each warpgroup at the epilogue barrier

    def box_to_wait(step):
        if one_box_wait:
            return geo.waits[0] if step == 0 else None
        return geo.waits[step]

    def reading_stage(stage):
        return any(g[0] == stage for wp in warps for g in wp["groups"])

    def slot_in_use(wg):
        return any(wp["wg"] == wg and wp["groups"] for wp in warps) or any(
            cp["kind"] == "halo" and cp["wg"] == wg for cp in copying)

    def ring_round(step):
        return step % stages, step // stages

    steps = 0
    while not all(wp["state"] == "done" for wp in warps):
        steps += 1
        assert steps < 400_000
        actions = []
        if pc < len(program):
            item = program[pc]
            if item[0] == "halo":
                actions.append(("halo_issue", None))
            else:
                s, rnd = ring_round(item[1])
                if empty[s].ready((rnd & 1) ^ 1, rnd - 1 if rnd else -1):
                    actions.append(("ring_issue", s))
        actions += [("land", k) for k in range(len(copying))]
        for i, wp in enumerate(warps):
            if wp["groups"]:
                actions.append(("finish", i))
            if wp["state"] == "loop":
                if wp["waiting"]:
                    if len(wp["groups"]) <= 1:
                        actions.append(("resume", i))
                elif wp["step"] < geo.k_blocks:
                    box = box_to_wait(wp["step"])
                    if box is not None and not wp["halo_ok"]:
                        if halo_bar[(wp["wg"], box)].ready(0, 0):
                            actions.append(("halo_ok", i))
                    else:
                        s, rnd = ring_round(wp["step"])
                        if full[s].ready(rnd & 1, rnd):
                            actions.append(("issue", i))
                elif not wp["groups"]:  # wait_group 0
                    actions.append(("to_barrier", i))
            elif wp["state"] == "barrier" and (arrived[wp["wg"]] == warps_per_wg or skip_epilogue_barrier):
                actions.append(("stage_out", i))
        assert actions, "deadlock"
        kind, who = rng.choice(actions)
        if kind == "halo_issue":
            _, j, box = program[pc]
            nbytes = geo.box_bytes if halo_tx_bytes is None else halo_tx_bytes
            halo_bar[(j, box)].arrive(expect_tx=nbytes)
            announced[(j, box)] += nbytes
            rows = list(range(box * geo.box_bytes // row_bytes, (box + 1) * geo.box_bytes // row_bytes))
            cuts = sorted(rng.sample(range(1, len(rows)), min(rng.randint(0, 2), len(rows) - 1)))
            pieces = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)])]  # 1 .. 3 pieces of whole rows
            copying.append({"kind": "halo", "wg": j, "box": box, "pieces": pieces})
            pc += 1
        elif kind == "ring_issue":
            assert not reading_stage(who), f"TMA overwrites stage {who} while an MMA group still reads it"
            full[who].arrive(expect_tx=c["B_STAGE_BYTES"])
            copying.append({"kind": "ring", "stage": who, "step": program[pc][1]})
            pc += 1
        elif kind == "land":
            cp = copying[who]
            if cp["kind"] == "halo":
                rows = cp["pieces"].pop(rng.randrange(len(cp["pieces"])))  # pieces land in any order
                for row in rows:
                    landed[cp["wg"]][row] += 1
                delivered[(cp["wg"], cp["box"])] += len(rows) * row_bytes
                if not cp["pieces"]:
                    copying.pop(who)
                halo_bar[(cp["wg"], cp["box"])].complete_tx(len(rows) * row_bytes)
            else:
                copying.pop(who)
                holds[cp["stage"]] = cp["step"]
                full[cp["stage"]].complete_tx(c["B_STAGE_BYTES"])
        elif kind == "finish":
            warps[who]["groups"].pop(0)  # groups complete in order
        elif kind == "halo_ok":
            wp = warps[who]
            wp["halo_ok"] = True
            wp["waited"].add(box_to_wait(wp["step"]))
        elif kind == "issue":
            wp = warps[who]
            s, _ = ring_round(wp["step"])
            assert holds[s] == wp["step"] and not any(cp["kind"] == "ring" and cp["stage"] == s for cp in copying), \
                f"stage {s} does not hold K step {wp['step']}"
            lo, hi = geo.spans[wp["step"]]
            assert all(landed[wp["wg"]][row] for row in range(lo // row_bytes, hi // row_bytes)), \
                "an MMA reads halo bytes that have not landed"
            wp["read"].add(lo // geo.box_bytes)
            wp["groups"].append((s, wp["step"]))
            if early_release and wp["step"] > 0:
                empty[(wp["step"] - 1) % stages].arrive()
            wp["step"] += 1
            wp["waiting"] = True
            wp["halo_ok"] = False
        elif kind == "resume":
            wp = warps[who]
            wp["waiting"] = False
            if wp["step"] > 1 and not early_release:
                empty[(wp["step"] - 2) % stages].arrive()  # the stage of the previous K step
        elif kind == "to_barrier":
            warps[who]["state"] = "barrier"
            arrived[warps[who]["wg"]] += 1
        elif kind == "stage_out":
            wg = warps[who]["wg"]
            assert not slot_in_use(wg), "the epilogue overwrites a halo slot an MMA or a TMA copy still uses"
            warps[who]["state"] = "done"
    assert pc == len(program) and not copying
    # Every box barrier of an active patch: one phase, completed by exactly the bytes announced, which
    # are the box's; the barriers of absent boxes and idle consumers untouched.
    for (j, box), bar in halo_bar.items():
        if j < active and box < geo.boxes:
            assert bar.phase == 1 and bar.tx == 0, f"box {box} of consumer {j}: phase {bar.phase}, tx {bar.tx}"
            assert delivered[(j, box)] == announced[(j, box)] == geo.box_bytes, "a box barrier got other bytes"
        else:
            assert bar.phase == 0 and bar.pending == bar.expected and not announced[(j, box)]
    for j in range(active):
        assert landed[j] == Counter(range(geo.boxes * geo.box_bytes // row_bytes)), "halo rows landed twice or never"
    for wp in warps:  # each consumer waited on the barriers of exactly the boxes it read
        assert wp["waited"] == wp["read"] == set(range(geo.boxes)), (wp["waited"], wp["read"])


PROTOCOL_SEEDS = 2


@pytest.mark.parametrize("name", HARNESS_CASES)
def test_pipeline_protocol_is_safe(tables, name):
    """Every supported case and domain corner, every CTA's first K block, 1 .. 3 active consumers, the
    expert's ring; and a 2-stage ring, which wraps its phases many times and holds fewer stages than
    a patch has boxes (the headline: 3 boxes)."""
    case = Case(tables, name)
    stages = const()["STAGES"]
    for first in range(case.k_blocks):
        geo = halo_geometry(case, first)
        for active in (1, 2, 3):
            for seed in range(PROTOCOL_SEEDS):
                simulate_cta(geo, active, stages, seed)
        simulate_cta(geo, 3, 2, first)


def test_first_mmas_wait_for_one_box_not_the_whole_halo(tables):
    """The point of the per-box barriers and the issue order. Consumer j's first K block needs filter
    block 0 and its patch's first box; the producer issues them among the first 1 + (j + 1) loads, so
    16 KiB + (j + 1) boxes are in flight ahead of it (headline: 26, 36, 46 KiB), where one barrier per
    halo, issued whole after filter block 0, held it for 16 KiB + (j + 1) halos (46, 76, 106 KiB). Its
    step i < boxes likewise waits only for what steps 0 .. i of all consumers need."""
    c = const()
    stage = c["B_STAGE_BYTES"]

    def bytes_ahead(program, geo, need):
        last = max(program.index(item) for item in need)
        return sum(stage if item[0] == "ring" else geo.box_bytes for item in program[:last + 1])

    for name in HARNESS_CASES:
        case = Case(tables, name)
        for first in range(case.k_blocks):
            geo = halo_geometry(case, first)
            for active in (1, 2, 3):
                program = producer_program(geo, active)
                for j in range(active):
                    for step in range(case.halo_boxes):
                        need = [("ring", i) for i in range(step + 1)] + [("halo", j, geo.waits[step])]
                        assert bytes_ahead(program, geo, need) == ((step + 1) * stage
                                                                   + (step * active + j + 1) * geo.box_bytes)
    headline = Case(tables, "headline")
    geo = halo_geometry(headline, 0)
    program = producer_program(geo, 3)
    kib = [bytes_ahead(program, geo, [("ring", 0), ("halo", j, geo.waits[0])]) // 1024 for j in range(3)]
    assert kib == [26, 36, 46]
    whole_halo = [(stage + (j + 1) * headline.halo_boxes * geo.box_bytes) // 1024 for j in range(3)]
    assert whole_halo == [46, 76, 106]


def test_pipeline_model_catches_wrong_protocols(tables):
    headline = halo_geometry(Case(tables, "headline"), 4)
    with pytest.raises(AssertionError, match="while an MMA group still reads it"):
        for seed in range(200):
            simulate_cta(headline, 3, 2, seed, early_release=True)
    with pytest.raises(AssertionError, match="halo slot"):
        for seed in range(200):
            simulate_cta(halo_geometry(Case(tables, "pointwise"), 0), 3, 8, seed, skip_epilogue_barrier=True)
    # One barrier waited for where a patch has several boxes: the later boxes are read before they land.
    with pytest.raises(AssertionError, match="have not landed"):
        for seed in range(200):
            simulate_cta(headline, 3, 8, seed, one_box_wait=True)
    # A box barrier announced the whole halo's bytes (the old single barrier's count): it never completes.
    with pytest.raises(AssertionError, match="deadlock"):
        simulate_cta(headline, 3, 8, 0, halo_tx_bytes=headline.boxes * headline.box_bytes)
    # ... or less than a box: the phase completes before the box has landed.
    with pytest.raises(AssertionError):
        for seed in range(200):
            simulate_cta(headline, 3, 8, seed, halo_tx_bytes=headline.box_bytes - 1024)
    # Every filter block before any box: with more K blocks than stages, the producer waits for a stage
    # that consumers waiting for their boxes never release.
    with pytest.raises(AssertionError, match="deadlock"):
        simulate_cta(halo_geometry(Case(tables, "ring_wraps"), 0), 3, 8, 0, boxes_last=True)


# ---------------------------------------------------------------------------------------------
# The gate, up to the GPU
# ---------------------------------------------------------------------------------------------


def test_passes_the_gate_up_to_the_gpu(gate_cache):
    """Compile-only gate: static check, sm_90a compile, SASS features and the plan resolved on an
    H200 for every supported case (tensor maps included); unsupported cases are skipped, not run."""
    assert_compiles_up_to_the_gpu(PROBLEM, kernel(), gate_cache, SUPPORTED, {"strided", "stem"})
