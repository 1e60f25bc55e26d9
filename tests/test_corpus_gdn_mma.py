"""gdn/chunked_mma, checked without a GPU.

- The plan: two launches (the chunk-local prep over every chunk, then the state recurrence over value
  slices) and three scratch buffers resolve for every case of the problem on an H200, with the shared
  memory each launch asks for inside the opt-in limit.
- The source passes the static check and compiles with the real nvcc (as the gate builds it) without
  spills or stack; its SASS has the tensor-core path (HMMA fed by LDSM, LDGSTS copies).
- The algorithm: a numpy model of both launches (tests/gdn_mma_model.py: the kernel's chunking, gate sum,
  blocked triangular solve, operand forms and bf16 roundings) reproduces the problem's fp64 recurrence on
  every case shape, with FLA-like error.
- The code: the kernel source itself runs on the CPU (tests/gdn_mma_emulator.cpp): each CUDA thread a
  fiber, ldmatrix / mma.sync / cp.async emulated per the PTX ISA, the plan's grids, blocks, shared sizes
  and arguments as resolved, guarded global buffers, NaN-filled shared memory and scratch. Its output
  passes the reference, matches the model to within a bf16 rounding, and is the same bit for bit under
  schedules that interleave or skew threads and warps differently and with cp.async landing early or late.
  The emulator is shown to catch the bugs it is there for: each __syncthreads removed, a missing
  cp.async wait, a missing __syncwarp, swapped mma operands.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from cuda_tools import build_mma_emulator, ptx_helper_bodies, run_mma_emulator, sass_mnemonics
from gdn_mma_model import chunked_mma, prep_scratch, scratch_mismatch
from klineage import expr
from klineage.devices import H200
from klineage.gate.compile import compile_kernel
from klineage.gate.correctness import compare
from klineage.kernel import load_kernel
from klineage.launch import resolve
from klineage.problem import load_problem, tolerance_for
from sampled import sampled
from shared_cache import share

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "corpus" / "problems" / "gdn.py"
KERNEL = ROOT / "corpus" / "kernels" / "gdn" / "chunked_mma"
EMULATOR = Path(__file__).resolve().parent / "gdn_mma_emulator.cpp"
INPUTS = ("q", "k", "v", "g", "beta")
ENTRIES = ("gdn_chunk_prep", "gdn_chunk_state")
# The PTX wrappers the emulator replaces, and the PTX each one holds (the address cast has none).
PTX_HELPERS = {
    "smem_u32": "",
    "ldsm_x4": "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];",
    "ldsm_x4_t": "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];",
    "mma_bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};",
    "cp_async16": "cp.async.cg.shared.global [%0], [%1], 16, %2;",
    "cp_async_commit": "cp.async.commit_group;",
    "cp_async_wait_all": "cp.async.wait_group 0;",
}
# CPU shapes: GVA with a partial chunk; a batch of two without GVA, ragged; DV split into two slices.
MID = {"B": 1, "T": 200, "H": 2, "HV": 6, "DK": 128, "DV": 128}
BATCH = {"B": 2, "T": 130, "H": 2, "HV": 2, "DK": 128, "DV": 128}
NARROW = {"B": 1, "T": 64, "H": 1, "HV": 1, "DK": 64, "DV": 32}  # one full chunk, half a slice of DV
MUTANT = {"B": 1, "T": 130, "H": 1, "HV": 2, "DK": 128, "DV": 128}


@pytest.fixture(scope="module")
def problem():
    return load_problem(PROBLEM)


@pytest.fixture(scope="module")
def state():
    return load_kernel(KERNEL)


def tolerance(problem):
    return tolerance_for("bfloat16", problem.info.tolerances)


def plan_env(state, params: dict) -> dict:
    return {**params, **state.constants, **H200.facts()}


def scratch_counts(state, params: dict) -> dict[str, tuple[str, int]]:
    env = plan_env(state, params)
    return {s.name: (s.dtype, expr.evaluate_int(s.count, env)) for s in state.plan.scratch}


def launches_for(state, params: dict):
    buffers = set(INPUTS) | {"o"} | {s.name for s in state.plan.scratch}
    return resolve(state.plan, plan_env(state, params), buffers)


# ---- the plan -----------------------------------------------------------------------------------

def test_plan_resolves_for_every_case(problem, state):
    c = state.constants
    assert state.plan.problem == "gdn" and state.plan.arch == "sm_90"
    assert [launch.entry for launch in state.plan.launches] == list(ENTRIES)
    assert {s.name: s.init for s in state.plan.scratch} == {"wy_x": "poison", "qk_p": "poison", "gate_cum": "poison"}
    for case in problem.info.cases:
        p = dict(case.params)
        assert state.plan.supports_case(p, c), case.name
        prep, run = launches_for(state, p)
        chunks = -(-p["T"] // c["CHUNK"])
        assert prep.grid == (chunks, p["HV"], p["B"]) and prep.block == (c["PREP_THREADS"], 1, 1)
        assert run.grid == (-(-p["DV"] // c["BV"]), p["HV"], p["B"]) and run.block == (c["STATE_THREADS"], 1, 1)
        assert prep.shared == c["PREP_SMEM"] and run.shared == c["STATE_SMEM"] <= H200.smem_per_block_optin
        args = [a[1] for a in prep.args]
        assert args == ["q", "k", "g", "beta", "wy_x", "qk_p", "gate_cum", *(p[n] for n in ("B", "T", "H", "HV", "DK"))]
        args = [a[1] for a in run.args]
        assert args == ["q", "k", "v", "wy_x", "qk_p", "gate_cum", "o",
                        *(p[n] for n in ("B", "T", "H", "HV", "DK", "DV"))]
        # launch 1 writes every element launch 2 reads: whole padded chunks of X, P and G
        counts = scratch_counts(state, p)
        per_chunk = p["B"] * p["HV"] * chunks
        assert counts == {"wy_x": ("bfloat16", per_chunk * 64 * 64), "qk_p": ("bfloat16", per_chunk * 64 * 64),
                          "gate_cum": ("float32", per_chunk * 64)}


def test_shared_memory_layout(state):
    c = state.constants
    assert c["PREP_SMEM"] == 38656 and c["STATE_SMEM"] == 171520
    # five prep CTAs share an SM (its 228 KB, less 1 KB reserved per CTA); the state CTA has one to itself
    assert 5 * (c["PREP_SMEM"] + 1024) <= 228 * 1024 < 6 * (c["PREP_SMEM"] + 1024)
    offsets = [c[n] for n in ("S_OFF_K", "S_OFF_Q", "S_OFF_X", "S_OFF_P", "S_OFF_V", "S_OFF_G", "STAGE_BYTES",
                              "S_OFF_SB", "S_OFF_R", "S_OFF_VN", "S_OFF_VD", "STATE_SMEM")]
    assert offsets == sorted(offsets) and all(o % 16 == 0 for o in offsets)
    # 16 bytes of padding per row: the 8 rows of an ldmatrix phase start in 8 different 16-byte bank groups
    for stride in (c["KSTRIDE"], c["CSTRIDE"], c["VSTRIDE"]):
        assert len({(r * stride * 2 // 16) % 8 for r in range(8)}) == 8, stride


def test_unsupported_shapes_are_refused(state):
    c = state.constants
    base = {"B": 1, "T": 64, "H": 1, "HV": 1, "DK": 128, "DV": 128}
    assert state.plan.supports_case(base, c)
    for change in ({"DK": 256}, {"DV": 136}, {"HV": 3, "H": 2}, {"DK": 100}, {"DV": 60}):
        assert not state.plan.supports_case({**base, **change}, c), change


def test_static_check(state):
    static = pytest.importorskip("klineage.gate.static")
    report = static.static_check(state)
    assert report.ok, report


# ---- the compiled kernel ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compiled(state, tmp_path_factory, shared_cache):
    cache = share(tmp_path_factory.mktemp("gdn-mma-compile"), shared_cache)  # the run's compiles
    return compile_kernel(state, cache_dir=cache)


def test_compiles_without_spills(compiled, state):
    assert compiled.ok, compiled.log
    c = state.constants
    for arch in compiled.targets:
        for entry, threads, shared in (("gdn_chunk_prep", c["PREP_THREADS"], c["PREP_SMEM"]),
                                       ("gdn_chunk_state", c["STATE_THREADS"], c["STATE_SMEM"])):
            res = compiled.resources_for(entry, arch)
            assert not res.spills and res.stack_bytes == 0, (entry, arch, res)
            assert res.registers * threads <= 65536, (entry, res.registers)
            assert res.shared_bytes == 0 and shared <= H200.smem_per_block_optin


def test_sass_has_the_tensor_core_path(compiled):
    sass = sass_mnemonics(compiled.cubin_bytes("sm_90"))
    assert sass["LDL"] == 0 and sass["STL"] == 0
    # prep: 8 k-steps x 4 column pairs x 4; state: K S and Q S (64), Xb R (16), P Vn (16), K^T Vd (32) per warp
    assert sass["HMMA"] == 128 + 128
    assert sass["LDSM"] >= 48 + 64 and sass["LDGSTS"] >= 8 and sass["F2FP"] > 0


def test_ptx_wrappers_are_what_the_emulator_replaces(state):
    """Each wrapper the emulator stands in for is one statement: the asm it names (or the address cast)."""
    for name, body in ptx_helper_bodies(state.source, PTX_HELPERS).items():
        code = body[body.index("{"):]
        literals = re.findall(r'"((?:[^"\\]|\\.)*)"', code)
        statements = re.sub(r'"(?:[^"\\]|\\.)*"', '""', code).count(";")
        assert statements == 1, (name, code)
        if name == "smem_u32":
            assert "return static_cast<uint32_t>(__cvta_generic_to_shared(p));" in code and not literals
            continue
        assert code.lstrip("{ \n").startswith("asm volatile(")
        template = "".join(lit for lit in literals if "%" in lit or "." in lit).replace("\\n", "")
        assert template == PTX_HELPERS[name], (name, template)
    bodies = ptx_helper_bodies(state.source, PTX_HELPERS)
    # the operand order of the mma: D, A (4 registers), B (2), C = D
    assert '"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])' in bodies["mma_bf16"]
    assert '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)' in bodies["mma_bf16"]
    assert '"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)' in bodies["cp_async16"]


# ---- the algorithm, in numpy ----------------------------------------------------------------------

def check_against_reference(problem, got: torch.Tensor, x: dict, params: dict, factor: float = 0.5):
    expected = problem.reference(x, params)["o"]
    tol = tolerance(problem)
    comparison = compare("o", got, expected, tol)
    assert comparison.passed, comparison.message
    assert comparison.rel_l2 < tol.rel_l2 * factor, comparison.rel_l2  # FLA-like rounding error, with margin
    return comparison


@pytest.mark.parametrize("shape", ["small", "ragged_t", "mid", "batch", "narrow"])
def test_model_reproduces_the_reference(problem, shape):
    named = {"mid": MID, "batch": BATCH, "narrow": NARROW}
    params = dict(named[shape]) if shape in named else dict(problem.info.case(shape).params)
    for seed in (0, 1) if shape != "ragged_t" else (0,):
        x = problem.make_inputs(dict(params), seed, "cpu")
        got = torch.from_numpy(chunked_mma(*(x[n] for n in INPUTS))).to(torch.bfloat16)
        comparison = check_against_reference(problem, got, x, params)
        assert comparison.rel_l2 < 5e-3, comparison.rel_l2


@pytest.mark.slow
@pytest.mark.parametrize("case", ["equal_heads", "headline"])
def test_model_reproduces_the_reference_on_the_big_cases(problem, case):
    params = dict(problem.info.case(case).params)
    x = problem.make_inputs(dict(params), 0, "cpu")
    got = torch.from_numpy(chunked_mma(*(x[n] for n in INPUTS))).to(torch.bfloat16)
    check_against_reference(problem, got, x, params)


def test_model_solve_inverts_the_chunk_system():
    """The blocked solve (diagonal blocks by forward substitution, then block rows) gives (I + L)^-1."""
    from gdn_mma_model import prep

    gen = np.random.default_rng(3)
    n, c, d = 4, 64, 128
    k = gen.standard_normal((n, c, d)).astype(np.float32)
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True) + 0.3).astype(np.float32)  # correlated keys
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(np.float32)
    graw = -np.abs(gen.standard_normal((n, c)) * 0.05).astype(np.float32)
    beta = gen.uniform(0.0, 1.0, (n, c)).astype(np.float32)
    _, _, G, X = prep(k, k, graw, beta)
    kk = k.astype(np.float64) @ k.transpose(0, 2, 1).astype(np.float64)
    i, j = np.arange(c)[:, None], np.arange(c)[None, :]
    L = np.where(i > j, beta[:, :, None] * kk * np.exp(np.where(i > j, G[:, :, None] - G[:, None, :], 0.0)), 0.0)
    want = np.linalg.inv(np.eye(c) + L)
    assert np.abs(X - want).max() < 1e-4 * max(1.0, np.abs(want).max())


# ---- the kernel source, run on the CPU --------------------------------------------------------------

def build_emulator(work: Path, source: str) -> Path:
    return build_mma_emulator(work, EMULATOR, source, PTX_HELPERS)


def emulate(binary: Path, state, params: dict, x: dict, order: str = "forward", copies: str = "eager",
            seed: int = 0, scratch: dict | None = None) -> tuple[torch.Tensor | None, str]:
    """Run the plan's launches on the emulator; (o, "") or (None, the emulator's complaint). `scratch`, if
    given, receives the scratch buffers as launch 1 left them (float32 numpy arrays)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        B, T, HV, DV = (params[n] for n in ("B", "T", "HV", "DV"))
        others = [f"o bfloat16 {B * T * HV * DV} output"]
        others += [f"{name} {dtype} {count} scratch" for name, (dtype, count) in scratch_counts(state, params).items()]
        complaint = run_mma_emulator(binary, work, x, others, launches_for(state, params), order, seed, copies)
        if complaint:
            return None, complaint
        if scratch is not None:
            for name, (dtype, _) in scratch_counts(state, params).items():
                raw = (work / f"{name}.bin").read_bytes()
                scratch[name] = (np.frombuffer(raw, np.float32) if dtype == "float32" else
                                 (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32))
        raw = np.frombuffer((work / "o.bin").read_bytes(), dtype=np.int16).copy()
        return torch.from_numpy(raw).view(torch.bfloat16).reshape(B, T, HV, DV), ""


@pytest.fixture(scope="module")
def emulator(state, tmp_path_factory) -> Path:
    return build_emulator(tmp_path_factory.mktemp("gdn-emulator"), state.source)


def close_to_model(got: torch.Tensor, x: dict) -> None:
    """The emulated kernel and the model differ only in the order of fp32 sums, which now and then moves a
    bf16 rounding of an intermediate by a step: a few elements apart, by far less than either is from the
    reference (rel_l2 ~1e-4 against ~4e-3)."""
    model = torch.from_numpy(chunked_mma(*(x[n] for n in INPUTS)))
    diff = (got.float() - model).abs()
    assert float(diff.norm() / model.norm()) < 1e-3
    assert float(diff.max()) <= 2.0 ** -8 * float(model.abs().max())
    assert float((diff > 0).float().mean()) < 0.01


SCHEDULES = [("forward", "eager"), ("reverse", "late"), ("random", "late"), ("warps", "late"),
             ("warps_reverse", "eager")]


@pytest.mark.parametrize("shape", sampled(["small", "mid", "batch", "narrow"], keep=("small", "narrow")))
def test_emulated_kernel_reproduces_the_reference(problem, state, emulator, shape):
    named = {"mid": MID, "batch": BATCH, "narrow": NARROW}
    params = dict(named[shape]) if shape in named else dict(problem.info.case(shape).params)
    x = problem.make_inputs(dict(params), 1, "cpu")
    first = None
    for order, copies in SCHEDULES if shape in ("small", "mid") else SCHEDULES[:1] + SCHEDULES[-2:]:
        got, complaint = emulate(emulator, state, params, x, order, copies, seed=7)
        assert got is not None, (order, copies, complaint)
        if first is None:
            assert not torch.isnan(got.float()).any(), "unwritten outputs"
            check_against_reference(problem, got, x, params)
            close_to_model(got, x)
            first = got
        else:  # no race: the schedule changes nothing
            assert torch.equal(got.view(torch.int16), first.view(torch.int16)), (order, copies)


@pytest.mark.parametrize("shape", ["mid", "batch"])
def test_emulated_launch_1_writes_the_model_scratch(problem, state, emulator, shape):
    """Launch 1's scratch (what tests/test_gpu_gdn.py checks first on the GPU, with the same comparison)."""
    params = dict(MID if shape == "mid" else BATCH)
    x = problem.make_inputs(dict(params), 3, "cpu")
    scratch: dict = {}
    got, complaint = emulate(emulator, state, params, x, scratch=scratch)
    assert got is not None, complaint
    Xb, P, G = prep_scratch(*(x[n] for n in ("q", "k", "g", "beta")))
    n = Xb.shape[0]
    assert np.array_equal(scratch["gate_cum"].reshape(n, 64), G)  # the same sequential fp32 sum
    assert scratch_mismatch(scratch["wy_x"].reshape(n, 64, 64), Xb) == ""
    assert scratch_mismatch(scratch["qk_p"].reshape(n, 64, 64), P) == ""
    # and the mismatch test has teeth: a transposed P, or X without beta, is refused
    assert scratch_mismatch(scratch["qk_p"].reshape(n, 64, 64).transpose(0, 2, 1), P) != ""
    assert scratch_mismatch(scratch["wy_x"].reshape(n, 64, 64), prep_scratch_unscaled(x)) != ""


def prep_scratch_unscaled(x: dict) -> np.ndarray:
    from gdn_mma_model import bf16
    from gdn_mma_model import prep_scratch as model

    beta = torch.ones_like(x["beta"])
    return bf16(model(x["q"], x["k"], x["g"], beta)[0])


def mutant_outcome(tmp_path, problem, state, mutant: str) -> list[str]:
    """Build the emulator on a mutated source and say, per schedule, how the run went."""
    binary = build_emulator(tmp_path, mutant)
    params = dict(MUTANT)
    x = problem.make_inputs(dict(params), 2, "cpu")
    expected = problem.reference(x, params)["o"]
    outcomes = []
    for order, copies in (("warps", "late"), ("warps_reverse", "late"), ("warps", "eager"), ("warps_reverse", "eager")):
        got, complaint = emulate(binary, state, params, x, order, copies)
        if got is None:
            outcomes.append(f"error: {complaint}")
        else:
            comparison = compare("o", got, expected, tolerance(problem))
            outcomes.append("passed" if comparison.passed else "wrong")
    return outcomes


MUTANTS = {
    "no cp.async wait": ("        cp_async_wait_all();  // the next chunk's stage\n", ""),
    "no __syncwarp before the output stores": ("        __syncwarp();\n", ""),
    "B fragment halves swapped in Xb R": (
        "mma_bf16(vn[2 * np], a, bm[0], bm[1]);",
        "mma_bf16(vn[2 * np], a, bm[1], bm[0]);",
    ),
    "prefetch into the stage being read": (
        "load_chunk(smem + ((c + 1) & 1) * STAGE_BYTES",
        "load_chunk(smem + (c & 1) * STAGE_BYTES",
    ),
    "diagonal solve skips the last row": (
        "for (int i = 0; i < SUB; ++i) {\n            float s",
        "for (int i = 0; i < SUB - 1; ++i) {\n            float s",
    ),
}


@pytest.mark.parametrize("mutant", sampled(MUTANTS, keep=("no cp.async wait",
                                                      "no __syncwarp before the output stores")))
def test_the_emulator_catches_known_bugs(tmp_path, problem, state, mutant):
    old, new = MUTANTS[mutant]
    assert state.source.count(old) == 1
    outcomes = mutant_outcome(tmp_path, problem, state, state.source.replace(old, new))
    assert any(o != "passed" for o in outcomes), outcomes


def test_the_emulator_passes_the_unmutated_source_on_the_mutant_shape(tmp_path, problem, state):
    assert mutant_outcome(tmp_path, problem, state, state.source) == ["passed"] * 4


@pytest.mark.slow
@pytest.mark.parametrize("index", range(11))
def test_every_barrier_is_needed(tmp_path, problem, state, index):
    """Remove each __syncthreads in turn: some schedule then gives a wrong answer or an emulator error."""
    positions = [m.start() for m in re.finditer(r"__syncthreads\(\);", state.source)]
    assert len(positions) == 11
    at = positions[index]
    mutant = state.source[:at] + state.source[at + len("__syncthreads();"):]
    outcomes = mutant_outcome(tmp_path, problem, state, mutant)
    assert any(o != "passed" for o in outcomes), (state.source[:at].count("\n") + 1, outcomes)
