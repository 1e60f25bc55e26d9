"""The gated delta net (GDN) workload: its problem, its kernels (compiled with the real nvcc), and CPU
checks of the reference against independent forms of the same map.

- The reference (a vectorised token loop in fp64) is checked against the closed form
  S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, built matrix by matrix per head in
  a plain Python loop, and against hand-unrolled algebra for T = 1.
- A chunked (WY / UT transform) emulation, with the bf16 roundings FLA's Triton kernels make, shows
  that the tolerance admits the vendor path with margin, and that the chunked algebra is the same map.
- The recurrent kernel's own arithmetic (fp32 state, decay fused into S^T k, GVA head map) is
  emulated in fp32 and lands near one bf16 rounding of the reference.
- The chunked kernel is emulated in numpy phase by phase (same chunking, same in-place forward
  substitution, same bf16 roundings, operands gathered through the strides its source passes to
  `mma_tile`, checked against the source), and its fragment gather and accumulator map are checked
  lane by lane against the PTX ISA's m16n8k16 layouts.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from cuda_tools import sass_mnemonics
from klineage import expr
from klineage.devices import H200
from klineage.gate.compile import compile_kernel
from klineage.gate.correctness import compare
from klineage.kernel import KernelState, load_kernel
from klineage.launch import resolve
from klineage.problem import VendorTiming, load_problem, tolerance_for, validate_numerics
from shared_cache import share

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "corpus" / "problems" / "gdn.py"
KERNELS = ROOT / "corpus" / "kernels" / "gdn"
ALL_KERNELS = ("recurrent", "chunked")
INPUTS = ("q", "k", "v", "g", "beta")
ARG_NAMES = ("q", "k", "v", "g", "beta", "o", "B", "T", "H", "HV", "DK", "DV")
# A mid-sized case for CPU checks: GVA (3 value heads per q/k head), full head dim, a partial chunk.
MID = {"B": 1, "T": 200, "H": 2, "HV": 6, "DK": 128, "DV": 128}


@pytest.fixture(scope="module")
def problem():
    return load_problem(PROBLEM)


@pytest.fixture(scope="module")
def states() -> dict[str, KernelState]:
    return {name: load_kernel(KERNELS / name) for name in ALL_KERNELS}


@pytest.fixture(scope="module")
def compiled(states, tmp_path_factory, shared_cache):
    cache = share(tmp_path_factory.mktemp("gdn-compile"), shared_cache)  # the run's compiles
    return {name: compile_kernel(state, cache_dir=cache) for name, state in states.items()}


def plan_for(problem, state: KernelState, case_name: str):
    case = problem.info.case(case_name)
    env = {**case.params, **state.constants, **H200.facts()}
    buffers = set(INPUTS) | {o.name for o in problem.info.outputs} | {s.name for s in state.plan.scratch}
    return resolve(state.plan, env, buffers)


def bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


# ---- the problem -------------------------------------------------------------------------------

def test_problem_loads_and_its_numerics_are_sound(problem):
    info = problem.info
    assert info.operator == "gdn" and info.headline == "headline" and info.math == "bf16"
    assert info.has_vendor and not info.has_check
    assert info.vendor_timing == (VendorTiming.EAGER, VendorTiming.GRAPH)  # FLA eager and CUDA-graph replayed
    assert {c.name for c in info.cases} == {"headline", "ragged_t", "equal_heads", "small"}
    assert tolerance_for("bfloat16", info.tolerances).to_dict() == {"rtol": 3e-2, "atol": 6e-3, "rel_l2": 1.5e-2}
    assert validate_numerics(problem, "cpu") == []


def test_cases_stress_what_they_claim(problem):
    params = {c.name: c.params for c in problem.info.cases}
    assert params["headline"] == {"B": 1, "T": 4096, "H": 16, "HV": 48, "DK": 128, "DV": 128}
    assert params["ragged_t"]["T"] == 1000 and params["ragged_t"]["T"] % problem.module.CHUNK != 0
    assert params["equal_heads"]["H"] == params["equal_heads"]["HV"] == 16 and params["equal_heads"]["B"] > 1
    assert params["small"] == {"B": 1, "T": 100, "H": 2, "HV": 2, "DK": 64, "DV": 64}
    assert all(p["HV"] % p["H"] == 0 for p in params.values())


def test_inputs_have_fla_layout_and_ranges(problem):
    for case in problem.info.cases:
        p = case.params
        if p["T"] * p["HV"] > 100_000:  # the headline's generator is slow on CPU; shapes follow the same code
            continue
        x = problem.make_inputs(dict(p), 0, "cpu")
        assert tuple(x["q"].shape) == tuple(x["k"].shape) == (p["B"], p["T"], p["H"], p["DK"])
        assert tuple(x["v"].shape) == (p["B"], p["T"], p["HV"], p["DV"])
        assert tuple(x["g"].shape) == tuple(x["beta"].shape) == (p["B"], p["T"], p["HV"])
        assert x["g"].dtype == torch.float32
        assert all(x[n].dtype == torch.bfloat16 for n in ("q", "k", "v", "beta"))
        assert all(t.is_contiguous() for t in x.values())
        for n in ("q", "k"):
            norms = x[n].float().norm(dim=-1)
            assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2), n
        decay = x["g"].exp()
        assert (decay > 0).all() and (decay < 1).all()
        assert (decay > 0.95).float().mean() > 0.2 and (decay < 0.9).float().mean() > 0.2  # slow and fast heads
        beta = x["beta"].float()
        assert (beta > 0).all() and (beta <= 1).all() and beta.min() < 0.2 and beta.max() > 0.8


def test_inputs_are_deterministic_and_varied(problem):
    p = problem.info.case("small").params
    a, b, c = (problem.make_inputs(dict(p), seed, "cpu") for seed in (5, 5, 6))
    assert all(torch.equal(a[n], b[n]) for n in INPUTS)
    assert all(not torch.equal(a[n], c[n]) for n in INPUTS)


def closed_form(q, k, v, g, beta, scale):
    """Per (b, value head): S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = scale S_t^T q_t,
    in float64 with explicit matrices, one head at a time (no vectorisation shared with the reference)."""
    B, T, H, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    o = torch.zeros(B, T, HV, DV, dtype=torch.float64)
    eye = torch.eye(DK, dtype=torch.float64)
    for b in range(B):
        for h in range(HV):
            hq = h // (HV // H)
            S = torch.zeros(DK, DV, dtype=torch.float64)
            for t in range(T):
                kt, qt, vt = k[b, t, hq].double(), q[b, t, hq].double(), v[b, t, h].double()
                a, be = math.exp(float(g[b, t, h])), float(beta[b, t, h])
                S = a * (eye - be * torch.outer(kt, kt)) @ S + be * torch.outer(kt, vt)
                o[b, t, h] = scale * (S.T @ qt)
    return o


def test_reference_matches_the_closed_form(problem):
    module = problem.module
    p = {"B": 2, "T": 7, "H": 1, "HV": 3, "DK": 8, "DV": 5}  # GVA 3:1, batch of two
    x = problem.make_inputs(p, 11, "cpu")
    args = [x[n] for n in INPUTS]
    expected = closed_form(*args, scale=8 ** -0.5)
    got = module.recurrence(*args, scale=8 ** -0.5)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-13)
    # and through `reference`, rounded once to bf16
    assert torch.equal(problem.reference(x, p)["o"], expected.to(torch.bfloat16))


def test_reference_first_token_by_hand(problem):
    """T = 1: S_1 = beta k v^T, so o_1 = scale * beta * (k . q) v, whatever g is (S_0 = 0)."""
    p = {"B": 1, "T": 1, "H": 2, "HV": 4, "DK": 16, "DV": 8}
    x = problem.make_inputs(p, 3, "cpu")
    o = problem.module.recurrence(*(x[n] for n in INPUTS), scale=0.25)
    for h in range(4):
        hq = h // 2
        kq = float(x["k"][0, 0, hq].double() @ x["q"][0, 0, hq].double())
        want = 0.25 * float(x["beta"][0, 0, h]) * kq * x["v"][0, 0, h].double()
        assert torch.allclose(o[0, 0, h], want, rtol=1e-12, atol=1e-14)


def test_reference_two_tokens_by_hand():
    """T = 2, DK = DV = 1 (scalars): S1 = b1 v1 k1; S2 = a2 (1 - b2 k2^2) S1 + b2 k2 v2; o_t = scale S_t q_t."""
    module = load_problem(PROBLEM).module
    k1, k2, q1, q2, v1, v2, g1, g2, b1, b2 = 0.5, -0.75, 1.0, 0.25, 2.0, -1.0, -0.5, -0.125, 0.5, 0.75
    t = lambda *vals: torch.tensor(vals, dtype=torch.float64).reshape(1, 2, 1, -1)  # noqa: E731
    q, k, v = t(q1, q2), t(k1, k2), t(v1, v2)
    g = torch.tensor([[[g1], [g2]]], dtype=torch.float64)
    beta = torch.tensor([[[b1], [b2]]], dtype=torch.float64)
    o = module.recurrence(q, k, v, g, beta, scale=2.0).flatten()
    s1 = math.exp(g1) * 0.0 + b1 * (v1 - 0.0) * k1
    s2 = math.exp(g2) * (1 - b2 * k2 * k2) * s1 + b2 * k2 * v2
    assert o.tolist() == pytest.approx([2.0 * s1 * q1, 2.0 * s2 * q2], rel=1e-14)


def test_roofline(problem):
    figures = problem.info.roofline["headline"]
    c, d = 64, 128
    per_chunk = 2 * c * c * d * 5 + c ** 3 / 3 + 2 * c * d * d * 3
    assert figures["flops"] == pytest.approx(48 * 64 * per_chunk)
    assert figures["bytes"] == 2.0 * 4096 * 16 * 128 * 2 + 2.0 * 4096 * 48 * 128 * 2 + 6.0 * 4096 * 48
    ragged = problem.info.roofline["ragged_t"]
    assert ragged["flops"] == pytest.approx(48 * 16 * per_chunk)  # 1000 tokens pad to 16 chunks


# ---- the chunked form, as FLA computes it --------------------------------------------------------

def chunked(q, k, v, g, beta, scale, chunk=64, fla_rounding=True):
    """The chunked gated delta rule (WY / UT transform), vectorised over batch and heads.

    Per chunk of `chunk` tokens with in-chunk cumulative gates G: A = strict_tril(beta_i (k_i . k_j)
    exp(G_i - G_j)); T = (I + A)^-1 (a unit lower-triangular solve); w = T (beta exp(G) k), u = T (beta v);
    v_new = u - w S; o = scale ((q exp(G)) S + tril(q k^T exp(G_i - G_j)) v_new);
    S <- exp(G_last) S + (k exp(G_last - G))^T v_new. With `fla_rounding`, T, w, u, v_new, the state
    fed to the matmuls and the attention block are rounded to bf16, as FLA stores or casts them."""
    rnd = bf if fla_rounding else (lambda x: x)
    B, Tn, H, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    grp = HV // H
    dt = torch.float32 if fla_rounding else torch.float64
    q, k = (x.to(dt).repeat_interleave(grp, 2) for x in (q, k))
    v, g, beta = (x.to(dt) for x in (v, g, beta))
    n = -(-Tn // chunk)
    pad = n * chunk - Tn

    def blocks(x):  # [B, T, HV, ...] -> [B, HV, n, chunk, ...], zero-padded (g = 0, beta = 0, k = 0)
        x = torch.cat([x, x.new_zeros(B, pad, *x.shape[2:])], 1)
        return x.transpose(1, 2).reshape(B, HV, n, chunk, *x.shape[3:])

    q, k, v, g, beta = map(blocks, (q, k, v, g, beta))
    G = g.cumsum(-1)
    strict = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool), -1)
    causal = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool), 0)
    eye = torch.eye(chunk, dtype=dt)
    S = torch.zeros(B, HV, DK, DV, dtype=dt)
    o = torch.empty(B, HV, n, chunk, DV, dtype=dt)
    for c in range(n):
        qc, kc, vc, Gc, bc = q[:, :, c], k[:, :, c], v[:, :, c], G[:, :, c], beta[:, :, c]
        diff = Gc[..., :, None] - Gc[..., None, :]
        A = torch.where(strict, bc[..., None] * (kc @ kc.transpose(-1, -2)) * diff.masked_fill(~strict, 0).exp(), 0)
        Tinv = rnd(torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True))
        w = rnd(Tinv @ (bc[..., None] * Gc.exp()[..., None] * kc))
        u = rnd(Tinv @ (bc[..., None] * vc))
        Sm = rnd(S)
        v_new = rnd(u - w @ Sm)
        P = torch.where(causal, (qc @ kc.transpose(-1, -2)) * diff.masked_fill(~causal, 0).exp(), 0)
        o[:, :, c] = scale * ((qc * Gc.exp()[..., None]) @ Sm + rnd(P) @ v_new)
        last = Gc[..., -1:]
        S = last.exp()[..., None] * S + (kc * (last - Gc).exp()[..., None]).transpose(-1, -2) @ v_new
    return o.reshape(B, HV, n * chunk, DV)[:, :, :Tn].transpose(1, 2)


def test_chunked_algebra_is_the_recurrence(problem):
    """In fp64 with no rounding, the chunked form and the recurrence agree to ~1e-12 (partial last chunk, GVA)."""
    p = {"B": 1, "T": 150, "H": 1, "HV": 2, "DK": 32, "DV": 16}
    x = problem.make_inputs(p, 4, "cpu")
    args = [x[n] for n in INPUTS]
    ref = problem.module.recurrence(*args, scale=32 ** -0.5)
    for chunk in (16, 64):
        got = chunked(*args, scale=32 ** -0.5, chunk=chunk, fla_rounding=False)
        assert torch.allclose(got, ref, rtol=1e-9, atol=1e-11), chunk


@pytest.mark.parametrize("params", [MID, "small"], ids=["mid_gva", "small"])
def test_tolerance_admits_fla_rounding(problem, params):
    """The vendor's bf16 intermediates, emulated, pass with margin: rel_l2 near 4e-3 (bound 1.5e-2)."""
    p = dict(problem.info.case(params).params) if isinstance(params, str) else dict(params)
    tol = tolerance_for("bfloat16", problem.info.tolerances)
    for seed in (0, 1):
        x = problem.make_inputs(p, seed, "cpu")
        expected = problem.reference(x, p)["o"]
        got = chunked(*(x[n] for n in INPUTS), scale=p["DK"] ** -0.5).to(torch.bfloat16)
        comparison = compare("o", got, expected, tol)
        assert comparison.passed, comparison.message
        assert comparison.rel_l2 < tol.rel_l2 / 2
        err = (got.double() - expected.double()).abs()
        assert (err / (tol.atol + tol.rtol * expected.double().abs())).max() < 0.5


def test_tolerance_refuses_wrong_kernels(problem):
    """Plausible mistakes fail: no gate, beta ignored, the wrong GVA head map, one token late."""
    p = {"B": 1, "T": 130, "H": 2, "HV": 6, "DK": 64, "DV": 32}
    x = problem.make_inputs(p, 2, "cpu")
    tol = tolerance_for("bfloat16", problem.info.tolerances)
    expected = problem.reference(x, p)["o"]
    rec = problem.module.recurrence
    s = p["DK"] ** -0.5
    q, k, v, g, beta = (x[n] for n in INPUTS)
    wrong = {
        "no_gate": rec(q, k, v, torch.zeros_like(g), beta, s),
        "beta_one": rec(q, k, v, g, torch.ones_like(beta), s),
        # value head hv reading q/k head hv % H instead of hv // (HV // H): pass the heads pre-expanded
        "head_modulo": rec(q.repeat(1, 1, 3, 1), k.repeat(1, 1, 3, 1), v, g, beta, s),
        "late": torch.cat([torch.zeros_like(expected[:, :1]).double(), rec(q, k, v, g, beta, s)[:, :-1]], 1),
    }
    for name, got in wrong.items():
        assert not compare("o", got.to(torch.bfloat16), expected, tol).passed, name


# ---- the kernels: plans ------------------------------------------------------------------------

def test_kernels_load_and_name_the_problem(states):
    for name, state in states.items():
        assert state.plan.problem == "gdn", name
        assert state.plan.arch == "sm_90"
    k = states["recurrent"].constants
    for constant in ("MAX_DK", "MAX_DV", "ROW_SPLIT", "ROWS_PER_THREAD", "THREADS", "TOKENS_PER_TILE", "SMEM_BYTES"):
        assert constant in k, constant
    assert k["THREADS"] == k["MAX_DV"] * k["ROW_SPLIT"] <= 1024
    assert k["SMEM_BYTES"] == 4 * k["TOKENS_PER_TILE"] * (2 * k["MAX_DK"] + k["MAX_DV"] + 2)


def test_recurrent_covers_every_case(problem, states):
    state = states["recurrent"]
    assert state.plan.supports_reason
    for case in problem.info.cases:
        assert state.plan.supports_case(case.params, state.constants), case.name


@pytest.mark.parametrize("name", ALL_KERNELS)
def test_plans_resolve_for_every_case(problem, states, name):
    state = states[name]
    for case in problem.info.cases:
        if not state.plan.supports_case(case.params, state.constants):
            continue
        (launch,) = plan_for(problem, state, case.name)
        p = case.params
        assert launch.entry == f"gdn_{name}"
        assert launch.grid == (p["B"] * p["HV"], 1, 1)
        assert launch.block == (state.constants["THREADS"], 1, 1)
        assert launch.shared == state.constants["SMEM_BYTES"] <= H200.smem_per_block_optin
        args = dict(zip(ARG_NAMES, (a[1] for a in launch.args)))
        assert [args[n] for n in ("q", "k", "v", "g", "beta", "o")] == ["q", "k", "v", "g", "beta", "o"]
        assert [args[n] for n in ("B", "T", "H", "HV", "DK", "DV")] == [p[n] for n in ("B", "T", "H", "HV", "DK", "DV")]


def test_static_check(states):
    static = pytest.importorskip("klineage.gate.static")
    for name, state in states.items():
        report = static.static_check(state)
        assert report.ok, (name, report)


# ---- the kernels: real nvcc, ptxas resources ---------------------------------------------------

@pytest.mark.parametrize("name", ALL_KERNELS)
def test_compiles_without_spills(compiled, states, name):
    result = compiled[name]
    assert result.ok, result.log
    assert "-O3" in result.flags and "-cubin" in result.flags and "-std=c++17" in result.flags
    for arch in result.targets:
        res = result.resources_for(f"gdn_{name}", arch)
        assert not res.spills and res.stack_bytes == 0, (name, arch, res)
        # One CTA of THREADS threads must fit one SM's register file (the state lives in registers).
        assert res.registers * states[name].constants["THREADS"] <= 65536, res.registers
        assert res.shared_bytes + states[name].constants["SMEM_BYTES"] <= H200.smem_per_block_optin


# ---- the recurrent kernel's arithmetic, emulated -----------------------------------------------

def emulate_recurrent(constants: dict, launch, inputs: dict) -> torch.Tensor:
    """The kernel's per-CTA arithmetic in fp32: CTA x = b * HV + hv, q/k head hv / (HV / H), state rows
    slice + ROW_SPLIT * i summed per slice then across the ROW_SPLIT lanes (the shuffle tree), the decay
    multiplied into S before S^T k, o = (S^T q) * (1 / sqrt(DK)) rounded to bf16; unwritten o stays NaN."""
    args = dict(zip(ARG_NAMES, (a[1] for a in launch.args)))
    B, T, H, HV, DK, DV = (args[n] for n in ARG_NAMES[6:])
    R, MAX_DK = constants["ROW_SPLIT"], constants["MAX_DK"]
    rows = constants["ROWS_PER_THREAD"]
    f32 = torch.float32
    o = torch.full((B, T, HV, DV), float("nan"), dtype=torch.bfloat16)
    scale = torch.tensor(1.0, dtype=f32) / torch.sqrt(torch.tensor(float(DK), dtype=f32))

    def pad_rows(x):  # [.., DK] -> [.., ROW_SPLIT, ROWS_PER_THREAD]: row slice + R * i
        x = torch.cat([x, x.new_zeros(*x.shape[:-1], MAX_DK - DK)], -1)
        return x.reshape(*x.shape[:-1], rows, R).transpose(-1, -2)

    for cta in range(launch.grid[0]):
        b, hv = cta // HV, cta % HV
        hq = hv // (HV // H)
        s = torch.zeros(R, rows, DV, dtype=f32)
        qs, ks = pad_rows(inputs["q"][b, :, hq].float()), pad_rows(inputs["k"][b, :, hq].float())
        for t in range(T):
            a = torch.exp(inputs["g"][b, t, hv].float())
            s = s * a
            kv = (s * ks[t][..., None]).sum(1).sum(0)  # per-slice fp32 sums, then across slices
            u = inputs["beta"][b, t, hv].float() * (inputs["v"][b, t, hv].float() - kv)
            s = s + ks[t][..., None] * u
            o[b, t, hv] = ((s * qs[t][..., None]).sum(1).sum(0) * scale).to(torch.bfloat16)
    return o


def test_emulated_recurrent_kernel_reproduces_the_reference(problem, states):
    state = states["recurrent"]
    for case_name in ("small",):
        (launch,) = plan_for(problem, state, case_name)
        p = problem.info.case(case_name).params
        x = problem.make_inputs(dict(p), 1, "cpu")
        got = emulate_recurrent(state.constants, launch, x)
        assert not torch.isnan(got.float()).any(), "unwritten outputs"
        comparison = compare("o", got, problem.reference(x, p)["o"], tolerance_for("bfloat16", problem.info.tolerances))
        assert comparison.passed, comparison.message
        assert comparison.rel_l2 < 2.5e-3  # one bf16 rounding of o, not merely inside the tolerance


# ---- the chunked kernel's algebra, emulated in numpy ---------------------------------------------

def bf16_np(x):
    """Round float32 to the nearest bfloat16 (ties to even), kept as float32: __float2bfloat16_rn."""
    import numpy as np

    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def emulate_chunked(constants: dict, launch, inputs: dict, calls: list | None = None):
    """The chunked kernel, CTA by CTA and phase by phase, in numpy fp32: the same staging (zeros past T and
    past DK / DV), the same sequential in-chunk gate sum, the same forward substitution in place, the same
    bf16 roundings (X, beta e^G k, beta v, W, U, S as an operand, Vn, P, k e^(G_last - G)), and each mma
    operand gathered through the kernel's own strides: A(m, k) = A[m * a_m + k * a_k],
    B(k, n) = B[k * b_k + n * b_n]."""
    import numpy as np

    c = constants
    C, DKM, DVM = c["CHUNK"], c["MAX_DK"], c["MAX_DV"]
    args = dict(zip(ARG_NAMES, (a[1] for a in launch.args)))
    B, T, H, HV, DK, DV = (args[n] for n in ARG_NAMES[6:])
    f32 = np.float32
    q = inputs["q"].float().numpy()
    k = inputs["k"].float().numpy()
    v = inputs["v"].float().numpy()
    g = inputs["g"].numpy().astype(f32)
    beta = inputs["beta"].float().numpy()
    o = np.full((B, T, HV, DV), np.nan, dtype=f32)
    scale = f32(1.0) / np.sqrt(f32(DK))

    def mma(A, a_m, a_k, Bm, b_k, b_n, M, N, K):
        """All tiles of one tile loop: fp32 sums of bf16 operands (S is rounded as it is loaded)."""
        if calls is not None:
            calls.append((a_m, a_k, b_k, b_n, K))
        m, kk, n = np.arange(M), np.arange(K), np.arange(N)
        a = bf16_np(A.reshape(-1)[m[:, None] * a_m + kk[None, :] * a_k])
        b = bf16_np(Bm.reshape(-1)[kk[:, None] * b_k + n[None, :] * b_n])
        return (a.astype(np.float64) @ b.astype(np.float64)).astype(f32)

    i_idx, j_idx = np.arange(C)[:, None], np.arange(C)[None, :]
    for cta in range(launch.grid[0]):
        b, hv = cta // HV, cta % HV
        hq = hv // (HV // H)
        S = np.zeros((DKM, DVM), dtype=f32)
        for t0 in range(0, T, C):
            # stage_chunk
            n_tok = min(C, T - t0)
            k_s = np.zeros((C, DKM), f32)
            q_s = np.zeros((C, DKM), f32)
            v_s = np.zeros((C, DVM), f32)
            g_s = np.zeros(C, f32)
            beta_s = np.zeros(C, f32)
            k_s[:n_tok, :DK] = k[b, t0:t0 + n_tok, hq]
            q_s[:n_tok, :DK] = q[b, t0:t0 + n_tok, hq]
            v_s[:n_tok, :DV] = v[b, t0:t0 + n_tok, hv]
            g_s[:n_tok] = g[b, t0:t0 + n_tok, hv]
            beta_s[:n_tok] = beta[b, t0:t0 + n_tok, hv]
            # gate: sequential fp32 sum
            acc = f32(0)
            for i in range(C):
                acc = f32(acc + g_s[i])
                g_s[i] = acc
            g_last = g_s[C - 1]
            # L, KB, beta v
            kk = mma(k_s, DKM, 1, k_s, 1, DKM, C, C, DKM)
            with np.errstate(over="ignore"):
                L = np.where(i_idx > j_idx, beta_s[:, None] * kk * np.exp(g_s[:, None] - g_s[None, :]), f32(0)).astype(
                    f32
                )
            kb_s = bf16_np(beta_s[:, None] * np.exp(g_s)[:, None] * k_s)
            v_s = bf16_np(beta_s[:, None] * v_s)
            # solve, in place over L: row i from rows < i
            for i in range(1, C):
                x = L[i, :i].copy()
                for m in range(1, i):  # x[j] += L[i, m] X[m, j] for j < m, in increasing m as the kernel
                    x[:m] = (x[:m] + L[i, m] * L[m, :m]).astype(f32)
                L[i, :i] = -x
            x_s = bf16_np(np.where(i_idx == j_idx, f32(1), np.where(i_idx > j_idx, L, f32(0))).astype(f32))
            w_s = bf16_np(mma(x_s, C, 1, kb_s, DKM, 1, C, DKM, C))
            u_s = bf16_np(mma(x_s, C, 1, v_s, DKM, 1, C, DVM, C))
            vn_s = bf16_np(u_s - mma(w_s, DKM, 1, S, DVM, 1, C, DVM, DKM))
            qk = mma(q_s, DKM, 1, k_s, 1, DKM, C, C, DKM)
            with np.errstate(over="ignore", invalid="ignore"):
                p_s = bf16_np(np.where(i_idx >= j_idx, qk * np.exp(g_s[:, None] - g_s[None, :]), f32(0)).astype(f32))
            inter = mma(q_s, DKM, 1, S, DVM, 1, C, DVM, DKM)
            intra = mma(p_s, C, 1, vn_s, DVM, 1, C, DVM, C)
            out = scale * (np.exp(g_s)[:, None] * inter + intra)
            o[b, t0:t0 + n_tok, hv] = out[:n_tok, :DV]
            kb_s = bf16_np(np.exp(g_last - g_s)[:, None] * k_s)
            S = (np.exp(g_last) * S + mma(kb_s, 1, DKM, vn_s, DVM, 1, DKM, DVM, C)).astype(f32)
    return torch.from_numpy(o).to(torch.bfloat16)


@pytest.mark.parametrize("case_name", ["small", "mid_gva"])
def test_emulated_chunked_kernel_reproduces_the_reference(problem, states, case_name):
    state = states["chunked"]
    if case_name == "mid_gva":
        params = dict(MID)
        env = {**params, **state.constants, **H200.facts()}
        buffers = set(INPUTS) | {"o"}
        (launch,) = resolve(state.plan, env, buffers)
    else:
        params = problem.info.case(case_name).params
        (launch,) = plan_for(problem, state, case_name)
    x = problem.make_inputs(dict(params), 1, "cpu")
    got = emulate_chunked(state.constants, launch, x)
    assert not torch.isnan(got.float()).any(), "unwritten outputs"
    tol = tolerance_for("bfloat16", problem.info.tolerances)
    comparison = compare("o", got, problem.reference(x, params)["o"], tol)
    assert comparison.passed, comparison.message
    assert comparison.rel_l2 < tol.rel_l2 / 2  # FLA-like rounding, with margin


def test_emulation_uses_the_kernels_mma_strides(problem, states):
    """Every mma_tile call in the chunked kernel's source (strides and K evaluated with its constants) is
    one the emulation makes, and vice versa: the emulation gathers operands as the kernel does."""
    state = states["chunked"]
    source = (KERNELS / "chunked" / "kernel.cu").read_text()
    body = source[source.index("gdn_chunked("):]
    found = []
    for call in re.findall(r"mma_tile\(([^;]*)\);", body):
        parts = [p.strip() for p in call.split(",")]
        assert len(parts) == 10, parts
        values = [expr.evaluate_int(p, state.constants) for p in (parts[2], parts[3], parts[5], parts[6], parts[9])]
        found.append(tuple(values) * (2 if "?" in parts[4] else 1))  # W and U share one call
    expected = Counter()
    for f in found:
        for i in range(0, len(f), 5):
            expected[f[i:i + 5]] += 1
    calls = []
    (launch,) = plan_for(problem, state, "small")
    p = problem.info.case("small").params
    emulate_chunked(state.constants, launch, problem.make_inputs(dict(p), 0, "cpu"), calls)
    chunks = launch.grid[0] * -(-p["T"] // state.constants["CHUNK"])
    expected = Counter({call: count * chunks for call, count in expected.items()})
    assert Counter(calls) == expected


# PTX ISA, mma.m16n8k16 with .bf16 operands: (row, column) of each element held by lane l, g = l / 4,
# t = l % 4. A: (register, half); B: (register, half), row = k; C/D: accumulator element.
ISA_A = {(0, 0): lambda g, t: (g, 2 * t), (0, 1): lambda g, t: (g, 2 * t + 1),
         (1, 0): lambda g, t: (g + 8, 2 * t), (1, 1): lambda g, t: (g + 8, 2 * t + 1),
         (2, 0): lambda g, t: (g, 2 * t + 8), (2, 1): lambda g, t: (g, 2 * t + 9),
         (3, 0): lambda g, t: (g + 8, 2 * t + 8), (3, 1): lambda g, t: (g + 8, 2 * t + 9)}
ISA_B = {(0, 0): lambda g, t: (2 * t, g), (0, 1): lambda g, t: (2 * t + 1, g),
         (1, 0): lambda g, t: (2 * t + 8, g), (1, 1): lambda g, t: (2 * t + 9, g)}
ISA_C = {0: lambda g, t: (g, 2 * t), 1: lambda g, t: (g, 2 * t + 1),
         2: lambda g, t: (g + 8, 2 * t), 3: lambda g, t: (g + 8, 2 * t + 1)}


@pytest.mark.parametrize("strides", [(128, 1, 1, 128), (64, 1, 128, 1), (1, 128, 128, 1), (128, 1, 128, 1)])
def test_mma_fragments_follow_the_isa(strides):
    """The kernel's fragment gather (mma_tile) and accumulator map (acc_row / acc_col), lane by lane, for
    the stride patterns it uses (K K^T, X KB, KB^T Vn, W S): placing each lane's registers where the ISA
    puts them and reading each lane's accumulators back where the kernel stores them gives A B."""
    a_m, a_k, b_k, b_n = strides
    gen = torch.Generator().manual_seed(7)
    A = torch.randn(128 * 128, generator=gen, dtype=torch.float64)
    Bm = torch.randn(128 * 128, generator=gen, dtype=torch.float64)
    m0, n0, K = 32, 40, 64
    m, n, kk = torch.arange(16), torch.arange(8), torch.arange(K)
    want = A[(m0 + m)[:, None] * a_m + kk[None, :] * a_k] @ Bm[kk[:, None] * b_k + (n0 + n)[None, :] * b_n]
    D = torch.zeros(16, 8, dtype=torch.float64)  # the hardware accumulator tile
    for k0 in range(0, K, 16):
        Ahw = torch.full((16, 16), float("nan"), dtype=torch.float64)
        Bhw = torch.full((16, 8), float("nan"), dtype=torch.float64)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            # the kernel's gather: r0 = (m0 + g) a_m, r1 = (m0 + g + 8) a_m, ka = k0 + 2t, col = (n0 + g) b_n
            r0, r1, ka, col = (m0 + g) * a_m, (m0 + g + 8) * a_m, k0 + 2 * t, (n0 + g) * b_n
            regs_a = [(r0 + ka * a_k, r0 + (ka + 1) * a_k), (r1 + ka * a_k, r1 + (ka + 1) * a_k),
                      (r0 + (ka + 8) * a_k, r0 + (ka + 9) * a_k), (r1 + (ka + 8) * a_k, r1 + (ka + 9) * a_k)]
            regs_b = [(ka * b_k + col, (ka + 1) * b_k + col), ((ka + 8) * b_k + col, (ka + 9) * b_k + col)]
            for (r, h), where in ISA_A.items():
                Ahw[where(g, t)] = A[regs_a[r][h]]
            for (r, h), where in ISA_B.items():
                Bhw[where(g, t)] = Bm[regs_b[r][h]]
        assert not Ahw.isnan().any() and not Bhw.isnan().any()
        D += Ahw @ Bhw
    got = torch.full((16, 8), float("nan"), dtype=torch.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for e, where in ISA_C.items():
            # acc_row / acc_col: m0 + g + (e >= 2 ? 8 : 0), n0 + 2t + (e & 1), relative to (m0, n0)
            row, column = g + (8 if e >= 2 else 0), 2 * t + (e & 1)
            assert got[row, column].isnan(), "two accumulators stored to one element"
            got[row, column] = D[where(g, t)]
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_sass(compiled):
    chunked = sass_mnemonics(compiled["chunked"].cubin_bytes("sm_90"))
    assert chunked["HMMA"] >= 7  # one per mma_tile site at least (the k loops may unroll)
    assert chunked["LDL"] == 0 and chunked["STL"] == 0 and chunked["F2FP"] > 0
    recurrent = sass_mnemonics(compiled["recurrent"].cubin_bytes("sm_90"))
    assert recurrent["HMMA"] == 0 and recurrent["LDL"] == 0 and recurrent["STL"] == 0
    assert recurrent["SHFL"] >= 2 and recurrent["FFMA"] >= 2 * 32  # the unrolled row loops
