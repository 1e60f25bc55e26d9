"""The conv2d workload: its problem, its kernels (compiled with the real nvcc), and a CPU emulation of
the implicit-GEMM kernels that reproduces the reference convolution.

The emulation follows the kernel's own index arithmetic (pixel rows, the carried tap, zero-fill
predicates, the swizzle, the pipeline's stage order, ldmatrix lane addresses, the epilogue) while
the hardware it runs on (cp.async, ldmatrix, mma.sync m16n8k16 fragments) is modelled from the PTX
ISA, not from the kernel. Shared memory starts as NaN and the output as NaN, so reading a stage
before it is filled, or leaving an output unwritten, shows up as a wrong answer on the CPU instead
of only on the GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cuda_tools import sass_mnemonics
from klineage.devices import H200
from klineage.gate.compile import compile_kernel
from klineage.gate.correctness import compare
from klineage.kernel import KernelState, load_kernel
from klineage.launch import resolve
from klineage.problem import load_problem, tolerance_for, validate_numerics
from shared_cache import share

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "corpus" / "problems" / "conv2d.py"
KERNELS = ROOT / "corpus" / "kernels" / "conv2d"
EXPERT = "implicit_gemm"
TENSOR_CORE_KERNELS = ("implicit_gemm", "implicit_gemm_any")
ALL_KERNELS = ("implicit_gemm", "implicit_gemm_any", "direct")
ARG_NAMES = ("x", "w", "y", "N", "H", "W", "C", "F", "R", "S", "P", "Q", "stride", "pad")


@pytest.fixture(scope="module")
def problem():
    return load_problem(PROBLEM)


@pytest.fixture(scope="module")
def states() -> dict[str, KernelState]:
    return {name: load_kernel(KERNELS / name) for name in ALL_KERNELS}


@pytest.fixture(scope="module")
def compiled(states, tmp_path_factory, shared_cache):
    cache = share(tmp_path_factory.mktemp("conv2d-compile"), shared_cache)  # the run's compiles
    return {name: compile_kernel(state, cache) for name, state in states.items()}


def out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def plan_for(problem, state: KernelState, case_name: str):
    case = problem.info.case(case_name)
    env = {**case.params, **state.constants, **H200.facts()}
    buffers = {"x", "w"} | {o.name for o in problem.info.outputs} | {s.name for s in state.plan.scratch}
    return resolve(state.plan, env, buffers)


# ---- the problem -------------------------------------------------------------------------------

def test_problem_loads_and_its_numerics_are_sound(problem):
    info = problem.info
    assert info.operator == "conv2d" and info.headline == "headline" and info.math == "fp16"
    assert info.has_vendor and not info.has_check
    assert {"headline", "odd_hw", "odd_c", "strided", "small"} <= {c.name for c in info.cases}
    assert tolerance_for("float16", info.tolerances).to_dict() == {"rtol": 1e-2, "atol": 1e-2, "rel_l2": 5e-3}
    assert validate_numerics(problem, "cpu") == []


def test_cases_stress_what_they_claim(problem):
    params = {c.name: c.params for c in problem.info.cases}
    assert params["headline"] == {"N": 8, "H": 56, "W": 56, "C": 64, "F": 128, "R": 3, "S": 3, "stride": 1, "pad": 1}
    assert params["odd_hw"]["H"] % 2 == 1 and params["odd_hw"]["W"] % 2 == 1
    assert params["odd_c"]["C"] % 16 != 0 and params["odd_c"]["C"] % 32 != 0
    assert params["strided"]["stride"] == 2
    assert params["small"] == {"N": 1, "H": 9, "W": 9, "C": 8, "F": 16, "R": 3, "S": 3, "stride": 1, "pad": 1}
    assert any(p["C"] % 8 != 0 for p in params.values()), "a case the 16-byte copy cannot serve"


def test_reference_shapes_match_outputs_for_every_case(problem):
    for case in problem.info.cases:
        p = case.params
        inputs = problem.make_inputs(dict(p), 0, "cpu")
        assert tuple(inputs["x"].shape) == (p["N"], p["H"], p["W"], p["C"])
        assert tuple(inputs["w"].shape) == (p["F"], p["R"], p["S"], p["C"])
        for t in inputs.values():
            assert t.dtype == torch.float16 and t.is_contiguous() and torch.isfinite(t).all()
        y = problem.reference(inputs)["y"]
        (dims, dtype), = (o.resolve(p) for o in problem.info.outputs)
        assert tuple(y.shape) == dims, case.name
        assert dims == (p["N"], out_size(p["H"], p["R"], p["stride"], p["pad"]),
                        out_size(p["W"], p["S"], p["stride"], p["pad"]), p["F"])
        assert y.dtype == torch.float16 and dtype == "float16" and y.is_contiguous()
        assert torch.isfinite(y).all() and y.float().abs().max() < 1000  # far from fp16 overflow


def test_reference_is_a_convolution(problem):
    """An independent check of the reference: the small case, summed tap by tap in float64."""
    p = problem.info.case("small").params
    inputs = problem.make_inputs(dict(p), 3, "cpu")
    x, w = inputs["x"].double(), inputs["w"].double()
    xp = torch.nn.functional.pad(x, (0, 0, p["pad"], p["pad"], p["pad"], p["pad"]))
    P = out_size(p["H"], p["R"], p["stride"], p["pad"])
    Q = out_size(p["W"], p["S"], p["stride"], p["pad"])
    y = torch.zeros(p["N"], P, Q, p["F"], dtype=torch.float64)
    st = p["stride"]
    for r in range(p["R"]):
        for s in range(p["S"]):
            window = xp[:, r: r + st * (P - 1) + 1: st, s: s + st * (Q - 1) + 1: st, :]
            y += torch.einsum("npqc,fc->npqf", window, w[:, r, s, :])
    assert torch.equal(problem.reference(inputs)["y"], y.half())


def test_inputs_are_deterministic_and_varied(problem):
    p = problem.info.case("odd_hw").params
    a, b, c = (problem.make_inputs(dict(p), seed, "cpu") for seed in (5, 5, 6))
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["x"], c["x"])
    x = a["x"].float()
    assert (x == 0).float().mean() > 0.1  # ReLU and sparse planes
    assert (x < 0).any() and x.max() > 2.0  # signed planes and offset planes
    assert (a["w"] == 0).any() and (a["w"] < 0).any()


def test_roofline(problem):
    figures = problem.info.roofline["headline"]
    assert figures["flops"] == 2.0 * 25088 * 128 * 576
    assert figures["bytes"] == 2.0 * (8 * 56 * 56 * 64 + 128 * 9 * 64 + 25088 * 128)
    strided = problem.info.roofline["strided"]
    assert strided["flops"] == 2.0 * 2 * 29 * 29 * 64 * 9 * 32


def test_geometry_lookup(problem):
    module = problem.module
    x = torch.zeros(2, 57, 57, 32, dtype=torch.float16)
    w = torch.zeros(64, 3, 3, 32, dtype=torch.float16)
    assert module._geometry(x, w) == (2, 1)
    with pytest.raises(ValueError, match="no case"):
        module._geometry(x[:, :50], w)


# ---- the kernels: plans ------------------------------------------------------------------------

def test_kernels_load_and_name_the_problem(states):
    for name, state in states.items():
        assert state.plan.problem == "conv2d", name
        assert state.plan.arch == "sm_90"
    expert = states[EXPERT].constants
    for constant in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "WARPS_M", "WARPS_N", "STAGES", "SMEM_BYTES", "THREADS"):
        assert constant in expert, constant
    assert expert["THREADS"] == expert["WARPS_M"] * expert["WARPS_N"] * 32
    assert expert["SMEM_BYTES"] <= H200.smem_per_block_optin


def test_supports(problem, states):
    cases = {c.name: c.params for c in problem.info.cases}
    expert = states[EXPERT].plan
    assert expert.supports_reason
    assert {n for n, p in cases.items() if not expert.supports_case(p)} == {"stem"}  # C = 3
    for name in ("direct", "implicit_gemm_any"):  # the kernels that cover every case
        assert all(states[name].plan.supports_case(p) for p in cases.values()), name


@pytest.mark.parametrize("name", ALL_KERNELS)
def test_plans_resolve_for_every_supported_case(problem, states, name):
    state = states[name]
    for case in problem.info.cases:
        if not state.plan.supports_case(case.params):
            continue
        (launch,) = plan_for(problem, state, case.name)
        assert launch.entry == f"conv2d_{name}"
        assert launch.shared <= H200.smem_per_block_optin
        assert launch.block[0] * launch.block[1] * launch.block[2] == state.constants["THREADS"]
        args = dict(zip(ARG_NAMES, (a[1] for a in launch.args)))
        p = case.params
        assert args["P"] == out_size(p["H"], p["R"], p["stride"], p["pad"])
        assert args["Q"] == out_size(p["W"], p["S"], p["stride"], p["pad"])
        assert [args[k] for k in ("x", "w", "y")] == ["x", "w", "y"]


def test_headline_grid_is_one_wave(problem, states):
    (launch,) = plan_for(problem, states[EXPERT], "headline")
    constants = states[EXPERT].constants
    assert launch.grid == (-(-25088 // constants["BLOCK_M"]), 1, 1)
    assert launch.grid[0] * launch.grid[1] <= H200.num_sms  # every CTA starts at once, one per SM


def test_static_check(states):
    static = pytest.importorskip("klineage.gate.static")
    for name, state in states.items():
        report = static.static_check(state)
        assert report.ok, (name, report)


# ---- the kernels: real nvcc, ptxas resources, SASS --------------------------------------------

@pytest.mark.parametrize("name", ALL_KERNELS)
def test_compiles_without_spills(compiled, states, name):
    result = compiled[name]
    assert result.ok, result.log
    assert "-O3" in result.flags and "-cubin" in result.flags and "-std=c++17" in result.flags
    assert "-Xptxas" in result.flags and "-v" in result.flags
    for arch in result.targets:
        res = result.resources_for(f"conv2d_{name}", arch)
        assert not res.spills and res.stack_bytes == 0, (name, arch, res)
        assert res.registers <= 255
        if name in TENSOR_CORE_KERNELS:
            # One CTA per SM: its registers and dynamic shared memory must fit one SM.
            assert res.registers * states[name].constants["THREADS"] <= 65536
            assert res.shared_bytes + states[name].constants["SMEM_BYTES"] <= H200.smem_per_block_optin


@pytest.mark.parametrize("name", TENSOR_CORE_KERNELS)
def test_sass_uses_the_tensor_core_mechanisms(compiled, states, name):
    constants = states[name].constants
    ops = sass_mnemonics(compiled[name].cubin_bytes("sm_90"))
    per_stage_mma = constants["K_SLICES"] * constants["M_FRAGS"] * constants["N_FRAGS"]
    assert ops["HMMA"] >= per_stage_mma  # the K loop's stage, fully unrolled
    assert ops["LDSM"] >= constants["K_SLICES"] * (constants["M_FRAGS"] + constants["N_FRAGS"] // 2)
    assert ops["LDGSTS"] >= constants["A_PASSES"] + constants["B_PASSES"]
    assert ops["BAR"] >= 3  # the pipeline's barrier and the epilogue's two
    assert ops["LDL"] == 0 and ops["STL"] == 0
    assert ops["STG"] > 0 and ops["F2FP"] > 0  # fp16x2 packing in the epilogue


def test_sass_of_the_direct_kernel(compiled):
    ops = sass_mnemonics(compiled["direct"].cubin_bytes("sm_90"))
    assert ops["HMMA"] == 0 and ops["LDGSTS"] == 0 and ops["LDL"] == 0
    assert ops["FFMA"] > 0


# ---- CPU emulation of the implicit-GEMM kernels ------------------------------------------------

class Hardware:
    """The PTX semantics the kernel relies on, for all warps of a CTA at once (tensors [warp, lane, ...])."""

    def __init__(self, smem_bytes: int):
        self.smem = torch.full((smem_bytes // 2,), float("nan"), dtype=torch.float16)  # never-written reads NaN
        g = torch.arange(32) // 4
        t = torch.arange(32) % 4
        h = torch.arange(2)
        # mma.m16n8k16 .f16 A: a0..a7 in 4 registers; rows g (regs 0, 2) and g + 8 (regs 1, 3),
        # columns 2t + h (regs 0, 1) and 2t + h + 8 (regs 2, 3).
        reg = torch.arange(4)
        self.a_row = (g[:, None, None] + 8 * (reg[None, :, None] % 2)).expand(32, 4, 2)
        self.a_col = (2 * t[:, None, None] + h[None, None, :] + 8 * (reg[None, :, None] // 2)).expand(32, 4, 2)
        # B (16 x 8, "col"): b0..b3 in 2 registers; row (k) 2t + h + 8 * reg, column g.
        reg2 = torch.arange(2)
        self.b_row = (2 * t[:, None, None] + h[None, None, :] + 8 * reg2[None, :, None]).expand(32, 2, 2)
        self.b_col = g[:, None, None].expand(32, 2, 2)
        # C/D (16 x 8 fp32): c0..c3; row g + 8 * (e // 2), column 2t + e % 2.
        e = torch.arange(4)
        self.d_row = g[:, None] + 8 * (e[None, :] // 2)
        self.d_col = 2 * t[:, None] + e[None, :] % 2
        for rows, cols, n in ((self.a_row, self.a_col, 256), (self.b_row, self.b_col, 128),
                              (self.d_row, self.d_col, 128)):
            assert len({(int(r), int(c)) for r, c in zip(rows.flatten(), cols.flatten())}) == n

    def write16(self, byte_addr: torch.Tensor, values: torch.Tensor) -> None:
        """16-byte shared stores (cp.async or st.shared.v4): addresses [...], values [..., 8]."""
        assert (byte_addr % 16 == 0).all() and (byte_addr >= 0).all() and (byte_addr + 16 <= 2 * len(self.smem)).all()
        index = (byte_addr // 2)[..., None] + torch.arange(8)
        self.smem[index.flatten()] = values.reshape(-1).to(torch.float16)

    def ldmatrix_x4(self, byte_addr: torch.Tensor) -> torch.Tensor:
        """addresses [warps, 32] -> registers [warps, 32, 4, 2]: lanes 8i..8i+7 address the rows of
        matrix i; register i of lane l holds matrix i's row l // 4, columns 2 * (l % 4) + {0, 1}."""
        assert (byte_addr % 16 == 0).all()
        rows = self.smem[(byte_addr // 2)[..., None] + torch.arange(8)]  # [warps, 32, 8]
        lane = torch.arange(32)
        out = torch.empty(*byte_addr.shape[:-1], 32, 4, 2, dtype=torch.float16)
        for i in range(4):
            matrix = rows[:, 8 * i: 8 * i + 8, :]  # [warps, 8 rows, 8 columns]
            cols = (2 * (lane % 4))[:, None] + torch.arange(2)
            out[:, :, i, :] = matrix[:, (lane // 4)[:, None], cols]
        return out

    def mma_16816(self, d: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Every (i, j) MMA of a warp tile at once: d [warps, I, J, 32, 4] fp32 += A_i x B_j with
        A fragments a [warps, I, 32, 4, 2] and B fragments b [warps, J, 32, 2, 2], per the layouts."""
        A = torch.empty(*a.shape[:2], 256, dtype=torch.float32)
        B = torch.empty(*b.shape[:2], 128, dtype=torch.float32)
        A[..., (self.a_row * 16 + self.a_col).flatten()] = a.float().flatten(2)
        B[..., (self.b_row * 8 + self.b_col).flatten()] = b.float().flatten(2)
        D = torch.einsum("wimk,wjkn->wijmn", A.view(*a.shape[:2], 16, 16), B.view(*b.shape[:2], 16, 8))
        return d + D.flatten(3)[..., self.d_row * 8 + self.d_col]  # fp16 products are exact in fp32


def emulate_implicit_gemm(source_constants: dict, launch, inputs: dict, aligned: bool) -> torch.Tensor:
    """Run the kernel's index arithmetic for every CTA of the resolved launch; returns y flat."""
    k = source_constants
    BM, BN, BK = k["BLOCK_M"], k["BLOCK_N"], k["BLOCK_K"]
    T, VEC, RPP, STAGES = k["THREADS"], k["VEC"], k["ROWS_PER_PASS"], k["STAGES"]
    args = dict(zip(ARG_NAMES, (a[1] for a in launch.args)))
    N, H, W, C, F, R, S, P, Q, stride, pad = (args[n] for n in ARG_NAMES[3:])
    M, K = N * P * Q, R * S * C
    x, w = inputs["x"].reshape(-1), inputs["w"].reshape(-1)
    y = torch.full((M * F,), float("nan"), dtype=torch.float16)
    assert launch.block == (T, 1, 1) and launch.shared == k["SMEM_BYTES"]

    tid = torch.arange(T)
    chunk, row0 = tid % k["CHUNKS_PER_ROW"], tid // k["CHUNKS_PER_ROW"]
    a_rows = row0[:, None] + RPP * torch.arange(k["A_PASSES"])  # [T, A_PASSES]
    b_rows = row0[:, None] + RPP * torch.arange(k["B_PASSES"])
    warp, lane = torch.arange(T // 32)[:, None], torch.arange(32)[None, :]
    warp_row0 = (warp % k["WARPS_M"]) * k["WARP_TILE_M"]
    warp_col0 = (warp // k["WARPS_M"]) * k["WARP_TILE_N"]
    k_steps = -(-K // BK)

    def swizzle(row, ch):
        return row * k["ROW_BYTES"] + ((ch ^ (row & 7)) << 4)

    for bm in range(launch.grid[0]):
        for bn in range(launch.grid[1]):
            hw = Hardware(k["SMEM_BYTES"])
            m0, n0 = bm * BM, bn * BN
            # init_a_loader
            m = m0 + a_rows
            inside_m = m < M
            n_img = m // (P * Q)
            p = (m - n_img * P * Q) // Q
            q = m - n_img * P * Q - p * Q
            ih0 = torch.where(inside_m, p * stride - pad, k["INVALID_COORD"])
            iw0 = torch.where(inside_m, q * stride - pad, k["INVALID_COORD"])
            base = torch.where(inside_m, ((n_img * H + ih0) * W + iw0) * C, 0)
            # first_tap / tap_step
            tk = chunk * VEC
            rs = tk // C
            tc, tr = tk - rs * C, rs // S
            ts = rs - tr * S
            dr, ds, dc = (BK // C) // S, (BK // C) % S, BK % C

            def a_stage(s):
                return s * k["STAGE_BYTES"]

            def b_stage(s):
                return s * k["STAGE_BYTES"] + k["A_STAGE_BYTES"]

            def fill(stage):
                tr_, ts_, tc_ = tr[:, None], ts[:, None], tc[:, None]
                a_addr = a_stage(stage) + swizzle(a_rows, chunk[:, None])
                b_addr = b_stage(stage) + swizzle(b_rows, chunk[:, None])
                f = n0 + b_rows
                if aligned:  # load_stage: 16-byte cp.async, zero-fill when not inside
                    assert (tc + VEC <= C).all(), "a 16-byte copy would straddle two taps"
                    ih, iw = ih0 + tr_, iw0 + ts_
                    inside = (tr_ < R) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                    src = base + (tr_ * W + ts_) * C + tc_
                    assert (src[inside] % VEC == 0).all(), "16-byte copy from an unaligned address"
                    assert (src[inside] >= 0).all() and (src[inside] + VEC <= x.numel()).all()
                    vals = x[torch.where(inside, src, 0)[..., None] + torch.arange(VEC)]
                    hw.write16(a_addr, torch.where(inside[..., None], vals, torch.zeros((), dtype=torch.float16)))
                    b_inside = (tr_ < R) & (f < F)
                    b_src = f * K + tk[:, None]
                    assert (b_src[b_inside] % VEC == 0).all() and (b_src[b_inside] + VEC <= w.numel()).all()
                    vals = w[torch.where(b_inside, b_src, 0)[..., None] + torch.arange(VEC)]
                    hw.write16(b_addr, torch.where(b_inside[..., None], vals, torch.zeros((), dtype=torch.float16)))
                else:  # gather_stage: one fp16 at a time, each with its own tap (next_channel)
                    a_vals = torch.zeros(T, k["A_PASSES"], VEC, dtype=torch.float16)
                    er, es, ec, ek = tr.clone(), ts.clone(), tc.clone(), tk.clone()
                    for e in range(VEC):
                        ih, iw = ih0 + er[:, None], iw0 + es[:, None]
                        inside = (er[:, None] < R) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                        src = base + (er[:, None] * W + es[:, None]) * C + ec[:, None]
                        assert (src[inside] >= 0).all() and (src[inside] < x.numel()).all()
                        a_vals[:, :, e] = torch.where(
                            inside, x[torch.where(inside, src, 0)], torch.zeros((), dtype=torch.float16)
                        )
                        ek, ec = ek + 1, ec + 1
                        wrap_c = ec == C
                        ec, es = torch.where(wrap_c, 0, ec), torch.where(wrap_c, es + 1, es)
                        wrap_s = es == S
                        es, er = torch.where(wrap_s, 0, es), torch.where(wrap_s, er + 1, er)
                    hw.write16(a_addr, a_vals)
                    kk = tk[:, None, None] + torch.arange(VEC)
                    b_inside = (f[..., None] < F) & (kk < K)
                    b_src = f[..., None] * K + kk
                    b_vals = torch.where(
                        b_inside, w[torch.where(b_inside, b_src, 0)], torch.zeros((), dtype=torch.float16)
                    )
                    hw.write16(b_addr, b_vals)

            def advance():
                nonlocal tk, tr, ts, tc
                tk, tc, ts, tr = tk + BK, tc + dc, ts + ds, tr + dr
                carry = tc >= C
                tc, ts = torch.where(carry, tc - C, tc), torch.where(carry, ts + 1, ts)
                carry = ts >= S
                ts, tr = torch.where(carry, ts - S, ts), torch.where(carry, tr + 1, tr)
                # the carried tap is the division it replaces
                assert torch.equal((tr * S + ts) * C + tc, tk) and (tc < C).all() and (ts < S).all()

            acc = torch.zeros(T // 32, k["M_FRAGS"], k["N_FRAGS"], 32, 4, dtype=torch.float32)

            def compute_slice(stage, slice_):
                a_regs = [hw.ldmatrix_x4(a_stage(stage) + swizzle(warp_row0 + i * 16 + (lane & 15),
                                                                  2 * slice_ + (lane >> 4)))
                          for i in range(k["M_FRAGS"])]
                b_regs = [hw.ldmatrix_x4(b_stage(stage) + swizzle(warp_col0 + jp * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                                  2 * slice_ + ((lane >> 3) & 1)))
                          for jp in range(k["N_FRAGS"] // 2)]
                # B fragment j is registers 2 * (j % 2) and 2 * (j % 2) + 1 of ldmatrix j // 2
                b_frags = torch.stack([b_regs[j // 2][:, :, 2 * (j % 2): 2 * (j % 2) + 2, :]
                                       for j in range(k["N_FRAGS"])], dim=1)
                acc[:] = hw.mma_16816(acc, torch.stack(a_regs, dim=1), b_frags)

            # the pipeline, in the kernel's order; `groups` lists the K-step each committed cp.async
            # group copies, so that each wait_group can be checked to cover the step read next
            groups = []
            for s in range(STAGES - 1):
                fill(s)
                groups.append(s)
                advance()
            for kt in range(k_steps):
                s = kt % STAGES
                complete = groups[: len(groups) - (STAGES - 2)]  # cp.async.wait_group STAGES - 2
                assert kt in complete, f"step {kt} is read before its copies are waited for"
                compute_slice(s, 0)
                fill((kt + STAGES - 1) % STAGES)
                groups.append(kt + STAGES - 1)
                advance()
                for slice_ in range(1, k["K_SLICES"]):
                    compute_slice(s, slice_)

            # stage_accumulators: fp16x2 pairs into the padded tile at the start of shared memory
            g, t = lane // 4, lane % 4
            for i in range(k["M_FRAGS"]):
                for j in range(k["N_FRAGS"]):
                    row = warp_row0 + i * 16 + g
                    col = warp_col0 + j * 8 + 2 * t
                    for half, dr_ in ((0, 0), (2, 8)):
                        index = (row + dr_) * k["OUT_PITCH"] + col
                        assert (index + 2 <= k["OUT_BYTES"] // 2).all()
                        hw.smem[index] = acc[:, i, j, :, half].half()
                        hw.smem[index + 1] = acc[:, i, j, :, half + 1].half()
            # store_tile
            idx = torch.arange(BM * k["OUT_CHUNKS_PER_ROW"])
            row, ch = idx // k["OUT_CHUNKS_PER_ROW"], idx % k["OUT_CHUNKS_PER_ROW"]
            mm, f0 = m0 + row, n0 + ch * VEC
            keep = (mm < M) & (f0 < F)
            src = (row * k["OUT_PITCH"] + ch * VEC)[keep][:, None] + torch.arange(VEC)
            dst = (mm * F + f0)[keep][:, None] + torch.arange(VEC)
            in_row = (f0[keep][:, None] + torch.arange(VEC)) < F
            if F % VEC == 0:
                assert in_row.all() and (dst[:, 0] % VEC == 0).all()
            y[dst[in_row]] = hw.smem[src[in_row]]
    return y


EMULATED = [("implicit_gemm", "small"), ("implicit_gemm", "strided"), ("implicit_gemm", "odd_c"),
            ("implicit_gemm", "odd_hw"), ("implicit_gemm", "pointwise"),
            ("implicit_gemm_any", "stem"), ("implicit_gemm_any", "small")]


@pytest.mark.parametrize("name,case_name", EMULATED)
def test_emulated_implicit_gemm_reproduces_the_reference(problem, states, name, case_name):
    state = states[name]
    case = problem.info.case(case_name)
    assert state.plan.supports_case(case.params)
    (launch,) = plan_for(problem, state, case_name)
    inputs = problem.make_inputs(dict(case.params), 1, "cpu")
    expected = problem.reference(inputs)["y"]
    aligned = case.params["C"] % state.constants["VEC"] == 0  # the kernel's own dispatch
    got = emulate_implicit_gemm(state.constants, launch, inputs, aligned).reshape(expected.shape)
    assert not torch.isnan(got).any(), "unwritten outputs, or a stage read before it was filled"
    comparison = compare("y", got, expected, tolerance_for("float16", problem.info.tolerances))
    assert comparison.passed, comparison.message
    assert comparison.rel_l2 < 1e-3  # one fp16 rounding, not merely inside the tolerance


def test_emulated_direct_kernel_index_mapping(problem, states):
    """The direct kernel's mapping of (blockIdx, threadIdx) to (n, p, q, f), on the strided case."""
    case = problem.info.case("strided")
    (launch,) = plan_for(problem, states["direct"], "strided")
    args = dict(zip(ARG_NAMES, (a[1] for a in launch.args)))
    N, H, W, C, F, R, S, P, Q, stride, pad = (args[n] for n in ARG_NAMES[3:])
    inputs = problem.make_inputs(dict(case.params), 2, "cpu")
    x, w = inputs["x"].float(), inputs["w"].float()
    threads = states["direct"].constants["THREADS"]
    row = torch.arange(launch.grid[0])[:, None, None]
    j = (torch.arange(launch.grid[1])[None, :, None] * threads + torch.arange(threads)[None, None, :])
    live = (j < Q * F).expand(launch.grid[0], -1, -1)
    n, p = row // P, row % P
    q, f = j // F, j % F
    acc = torch.zeros(live.shape)
    for r in range(R):
        for s in range(S):
            ih, iw = p * stride - pad + r, q * stride - pad + s
            ok = ((ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)).expand_as(live)
            xs = x[n.clamp(0, N - 1), ih.clamp(0, H - 1), iw.clamp(0, W - 1)]  # [.., .., .., C]
            ws = w[f.clamp(0, F - 1), r, s]
            acc += torch.where(ok, (xs * ws).sum(-1), 0.0)
    y = torch.full((N * P * Q * F,), float("nan"))
    y[(row * Q * F + j).expand_as(live)[live]] = acc[live]
    got = y.half().reshape(N, P, Q, F)
    comparison = compare("y", got, problem.reference(inputs)["y"], tolerance_for("float16", problem.info.tolerances))
    assert comparison.passed, comparison.message
