"""The memory-bound corpus workloads: nine problems, each with a naive and an expert kernel.

Everything here runs on a CPU: each problem loads and passes the numerics checks, its cases and its
timing-only SWEEP table cover the shapes the contract asks for, the vendor path computes the same
operator as the reference (CPU torch, every case but the large ones), every launch plan resolves on
the H200's facts for every case and sweep case, and every kernel passes the compile-only gate (the
sandboxed probe, static check, real nvcc for sm_90 and sm_90a, resources) without spills.
What the kernels compute on a GPU is tests/test_gpu_corpus_memory_bound.py's business.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest
import torch

from cuda_tools import emulator_command
from klineage import corpus, expr
from klineage.config import GateMode
from klineage.devices import H200
from klineage.gate.cache import GateCache
from klineage.gate.correctness import compare
from klineage.gate.pipeline import run_gate
from klineage.kernel import load_kernel
from klineage.launch import resolve
from klineage.lineage import Lineage
from klineage.problem import load_problem, tolerance_for, validate_numerics
from klineage.toolchain import find_toolchain

ROOT = Path(__file__).resolve().parent.parent

# problem -> (naive kernel, expert kernel), folders under corpus/kernels/<problem>/
WORKLOADS = {
    "group_norm": ("naive", "smem_vec4"),
    "causal_softmax": ("naive", "warp_vec4"),
    "rope": ("naive", "pack8"),
    "column_max": ("naive", "split_vec4"),
    "logcumsumexp": ("naive", "block_scan"),
    "nchw_to_nhwc": ("naive", "smem_tile"),
    "embedding_bag": ("naive", "gather_vec4"),
    "sgd_nesterov": ("naive", "vec4_grid"),
    "add_rms_norm": ("naive", "pack8_regs"),
}
KERNELS = [f"{p}/{k}" for p, pair in WORKLOADS.items() for k in pair]
HEADLINE_MIN_BYTES = 64 * 2**20  # the headline must be bandwidth-bound, far above launch overhead
VENDOR_CHECK_MAX_BYTES = 32 * 2**20  # cases (by roofline traffic) the CPU reference and vendor finish in a blink


@cache
def _problem(name: str):
    return load_problem(corpus.problem_path(name))


def _sweep(name: str) -> dict:
    return _problem(name).module.SWEEP


def _traffic(name: str, params: dict) -> float:
    """The problem's own roofline bytes for any parameters (a case or a sweep case)."""
    return float(_problem(name).module.roofline(dict(params))["bytes"])


# --- the problems ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_problem_loads_and_its_numerics_are_sound(name):
    problem = _problem(name)
    info = problem.info
    assert info.operator == name
    assert info.headline == "headline" and info.has_vendor and not info.legacy
    assert {"headline", "small"} <= {c.name for c in info.cases} and len(info.cases) >= 6
    assert info.roofline["headline"]["bytes"] >= HEADLINE_MIN_BYTES
    # the smallest case is small enough for the sanitizer
    assert info.roofline["small"]["bytes"] < 2**20
    assert validate_numerics(problem, "cpu") == []


def test_the_corpus_holds_each_new_problem_and_kernel_once():
    bundled = {entry.name for entry in corpus.list_kernels()}
    assert set(KERNELS) <= bundled
    for name in WORKLOADS:
        assert corpus.problem_path(name) == ROOT / "corpus" / "problems" / f"{name}.py"
        for kernel in WORKLOADS[name]:
            assert load_kernel(ROOT / "corpus" / "kernels" / name / kernel).plan.problem == name


def test_no_operator_is_also_a_held_out_transfer_operator():
    """The transfer benchmark's held-out operators (bench/transfer/<operator>/) must be unseen by the corpus."""
    held_out = ROOT / "bench" / "transfer"
    if not held_out.is_dir():
        pytest.skip("no bench/transfer/ on this branch")
    assert not set(WORKLOADS) & {p.name for p in held_out.iterdir() if p.is_dir()}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_sweep_table_spans_the_shapes_and_is_ignored_by_the_contract(name):
    """SWEEP: at least six timing-only cases, named apart from CASES, with exactly the headline's
    parameters. A loader that does not parse SWEEP ignores it (it is only an unknown module name)."""
    problem = _problem(name)
    sweep = _sweep(name)
    cases = {c.name: c.params for c in problem.info.cases}
    assert isinstance(sweep, dict) and len(sweep) >= 6
    assert not set(sweep) & set(cases)
    for case_name, params in sweep.items():
        assert case_name.isidentifier() and set(params) == set(cases["headline"]), case_name
        assert all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in params.values())
    parsed = getattr(problem.info, "sweep", None)
    if parsed is not None:  # a branch that parses SWEEP: the same table
        assert {c.name for c in parsed} == set(sweep)
    # spanning: some sweep cases move less traffic than the headline, some as much or more
    traffic = [_traffic(name, params) for params in sweep.values()]
    assert min(traffic) < _traffic(name, cases["headline"]) <= 2 * max(traffic)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_reference_has_the_declared_outputs_and_the_vendor_computes_the_same_operator(name):
    problem = _problem(name)
    checked = 0
    for case in problem.info.cases:
        params = dict(case.params)
        if problem.info.roofline[case.name]["bytes"] > VENDOR_CHECK_MAX_BYTES:
            continue
        inputs = problem.make_inputs(params, 2, "cpu")
        expected = problem.reference({k: v.clone() for k, v in inputs.items()}, params)
        vendor = problem.vendor({k: v.clone() for k, v in inputs.items()}, params)
        for out in problem.info.outputs:
            shape, dtype = out.resolve(params)
            ref = expected[out.name]
            assert tuple(ref.shape) == shape and str(ref.dtype).removeprefix("torch.") == dtype, (case.name, out.name)
            if problem.check is None:
                result = compare(out.name, vendor[out.name].to(ref.dtype), ref,
                                 tolerance_for(dtype, problem.info.tolerances))
                assert result.passed, (case.name, result)
        checked += 1
    assert checked >= 4, "too few cases small enough to check on the CPU"


def test_the_reference_catches_the_hard_cases():
    """A few of the traps the inputs set, seen through the reference."""
    # column_max: ties at the maximum go to the first row
    problem = _problem("column_max")
    params = dict(problem.info.case("ragged").params)
    x = problem.make_inputs(params, 0, "cpu")["x"]
    ref = problem.reference({"x": x}, params)
    ties = (x == ref["values"][None, :]).sum(0) > 1
    assert ties.any()
    first = (x == ref["values"][None, :]).float().argmax(0)
    assert torch.equal(ref["indices"], first)
    # causal_softmax: the hidden keys are zero, every row sums to one
    problem = _problem("causal_softmax")
    params = dict(problem.info.case("ragged").params)
    y = problem.reference(problem.make_inputs(params, 0, "cpu"), params)["y"].double()
    assert torch.allclose(y.sum(-1), torch.ones_like(y.sum(-1)))
    assert (y[:, 0, params["sk"] - params["sq"] + 1:] == 0).all()
    # group_norm: some groups sit tens of standard deviations from zero, where E[x^2] - E[x]^2 in fp32
    # keeps only a few digits of the variance
    problem = _problem("group_norm")
    params = dict(problem.info.case("ragged").params)
    x = problem.make_inputs(params, 0, "cpu")["x"].reshape(params["n"], params["groups"], -1).double()
    assert (x.mean(-1).abs() / x.std(-1)).max() > 15


# --- the kernels: plans and the compile-only gate ---------------------------------------------------

def _buffers(name: str, state) -> set[str]:
    problem = _problem(name)
    inputs = problem.make_inputs(dict(problem.info.case("small").params), 0, "cpu")
    return set(inputs) | {o.name for o in problem.info.outputs} | {s.name for s in state.plan.scratch}


@pytest.mark.parametrize("kernel", KERNELS)
def test_plan_resolves_for_every_case_and_sweep_case(kernel):
    name = kernel.split("/")[0]
    state = corpus.kernel_entry(kernel).load()
    problem = _problem(name)
    buffers = _buffers(name, state)
    every = {c.name: dict(c.params) for c in problem.info.cases} | _sweep(name)
    for case_name, params in every.items():
        assert state.plan.supports_case(params), (kernel, case_name)
        env = {**params, **state.constants, **H200.facts()}
        launches = resolve(state.plan, env, buffers)
        for launch in launches:
            assert min(launch.grid) >= 1 and math.prod(launch.block) <= 1024, (kernel, case_name)
            assert launch.shared + 4096 <= H200.smem_per_block_optin, (kernel, case_name)


def _gate_compile_only(kernel: str, cache: GateCache) -> dict:
    """The compile-only verdict as `klineage gate --compile-only --json` prints it (run here, in-process: the
    CLI's own path is tests/test_gate_pipeline.py's)."""
    verdict = run_gate(corpus.problem_path(kernel.split("/")[0]), corpus.kernel_entry(kernel).load(),
                       mode=GateMode.COMPILE_ONLY, cache=cache)
    return verdict.to_dict()


@pytest.fixture(scope="module")
def verdicts(gate_cache) -> dict[str, dict]:
    """The compile-only gate of every kernel, side by side (each gate is mostly waiting on nvcc and the
    sandbox), into the module's gate cache with no verdict: its problem probes and compiles are the run's
    (tests/shared_cache.py; the library tests probe every bundled problem too, about 3 s of CPU each)."""
    # One kernel per problem first, side by side (each probes its own problem in the sandbox), so that
    # the second kernel of a problem finds its probe cached.
    waves = [[f"{name}/{pair[wave]}" for name, pair in WORKLOADS.items()] for wave in (0, 1)]
    found = {}
    with ThreadPoolExecutor(max_workers=6) as pool:
        for wave in waves:
            found |= dict(zip(wave, pool.map(lambda k: _gate_compile_only(k, gate_cache), wave)))
    return {kernel: found[kernel] for kernel in KERNELS}


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_passes_the_compile_only_gate_without_spills(kernel, verdicts):
    verdict = verdicts[kernel]
    assert verdict["status"] == "compiled", verdict["findings"]
    assert verdict["static"]["ok"]
    problem = _problem(kernel.split("/")[0])
    assert set(verdict["cases"]) == {c.name for c in problem.info.cases}
    assert not verdict["domain"]["skipped"]
    compiled = verdict["compile"]
    assert compiled["ok"] and set(compiled["targets"]) >= {"sm_90"}
    log = compiled["log"]
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert frames and all(f == ("0", "0", "0") for f in frames), log


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_expert_names_its_mechanisms(name):
    """The backward walk finds mechanisms by their names: constants for block sizes, vector widths and
    caches, and the mechanism markers in the source."""
    expert = corpus.kernel_entry(f"{name}/{WORKLOADS[name][1]}").load()
    source = expert.source
    assert "__restrict__" in source and "__launch_bounds__" in source
    assert "THREADS" in expert.constants
    # a 16-byte vector access, or (the transpose) a padded shared-memory tile
    assert re.search(r"\b(float4|uint4)\b", source) or {"TILE", "PAD"} <= set(expert.constants)
    naive = corpus.kernel_entry(f"{name}/{WORKLOADS[name][0]}").load().source
    assert not re.search(r"\b(float4|uint4|__shfl_\w+)\b", naive), "the naive kernel is scalar and shuffle-free"


# --- the kernels' own source on the CPU (tests/memory_bound_emulator.cpp) -------------------------------
# Small shapes that reach every path: the scalar and the vector one, rows past a register or shared-memory
# cache, bags and rows past a block, a partial last tile or chunk.
EMULATED = {
    "group_norm": [{"n": 2, "c": 6, "hw": 37, "groups": 3}, {"n": 1, "c": 8, "hw": 4100, "groups": 2}],
    "causal_softmax": [{"bh": 3, "sq": 7, "sk": 33, "scale": 0.125}, {"bh": 1, "sq": 3, "sk": 2064, "scale": 0.125}],
    "rope": [{"b": 1, "s": 5, "h": 2, "d": 6}, {"b": 1, "s": 3, "h": 2, "d": 32}],
    "column_max": [{"rows": 33, "cols": 65}, {"rows": 300, "cols": 12}],
    "logcumsumexp": [{"rows": 3, "cols": 257}, {"rows": 2, "cols": 4100}],
    "nchw_to_nhwc": [{"n": 2, "c": 5, "hw": 33}, {"n": 1, "c": 40, "hw": 70}],
    "embedding_bag": [{"bags": 5, "bag": 3, "d": 33, "num": 11}, {"bags": 2, "bag": 130, "d": 520, "num": 50}],
    "sgd_nesterov": [{"n": 7}, {"n": 4099}],
    "add_rms_norm": [{"rows": 3, "d": 257}, {"rows": 2, "d": 8200}],
}
EMULATOR = Path(__file__).resolve().parent / "memory_bound_emulator.cpp"


def _emulated_source(kernel: str, source: str | None = None) -> str:
    """The kernel's source in a namespace of its own, its dynamic shared memory the emulator's smem."""
    source = source if source is not None else corpus.kernel_entry(kernel).load().source
    source = re.sub(r"extern __shared__ (\w+) (\w+)\[\];", r"\1* \2 = reinterpret_cast<\1*>(smem);", source)
    space = "k_" + kernel.replace("/", "_")
    return f"namespace {space} {{\n{source}\n}}  // namespace {space}\nusing namespace {space};\n"


def build_emulator(work: Path, sources: dict[str, str | None]) -> Path:
    """One CPU build of the kernels `sources` names (their corpus source where the value is None), as
    tests/cuda_tools.py builds its emulators."""
    (work / "kernels_emu.inc").write_text("".join(_emulated_source(k, s) for k, s in sources.items()))
    shutil.copy(EMULATOR, work / "emulator.cpp")  # a quoted include is found beside the file that includes it
    toolchain = find_toolchain()
    build = subprocess.run(emulator_command(EMULATOR.parent, "kernels_emu.inc"), cwd=work,
                           capture_output=True, text=True, env=toolchain.environment(work), timeout=600)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    return work / "emulator"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    return build_emulator(tmp_path_factory.mktemp("mb-emulator"), dict.fromkeys(KERNELS))


def emulate(
    binary: Path, work: Path, kernel: str, params: dict, inputs: dict, order: str = "random"
) -> tuple[dict, str]:
    """Run the kernel's plan for `params` on the emulator: (outputs by name, "") or ({}, the complaint)."""
    import struct

    name = kernel.split("/")[0]
    state = corpus.kernel_entry(kernel).load()
    problem = _problem(name)
    env = {**params, **state.constants, **H200.facts()}
    launches = resolve(state.plan, env, _buffers(name, state))
    lines = []
    for key, tensor in inputs.items():
        (work / f"{key}.bin").write_bytes(tensor.contiguous().view(torch.uint8).numpy().tobytes())
        lines.append(f"buffer {key} {str(tensor.dtype).removeprefix('torch.')} {tensor.numel()} input")
    shapes = {}
    for out in problem.info.outputs:
        shapes[out.name] = out.resolve(params)
        lines.append(f"buffer {out.name} {shapes[out.name][1]} {math.prod(shapes[out.name][0])} output")
    for scratch in state.plan.scratch:
        lines.append(f"buffer {scratch.name} {scratch.dtype} {expr.evaluate_int(scratch.count, env)} scratch")
    for launch in launches:
        args = []
        for kind, value, type_name in launch.args:
            if kind == "buffer":
                args.append(f"buf:{value}")
            elif type_name == "f32":  # the float's bits, as the emulator's i32 argument
                args.append(f"i32:{struct.unpack('<i', struct.pack('<f', float(value)))[0]}")
            else:
                args.append(f"i32:{int(value)}")
        lines.append(" ".join(["launch", launch.entry, *map(str, launch.grid), *map(str, launch.block),
                               str(launch.shared), *args]))
    (work / "plan.txt").write_text("\n".join(lines) + "\n")
    run = subprocess.run([str(binary), str(work), order, "7", "eager"], capture_output=True, text=True, timeout=300)
    if run.returncode:
        return {}, run.stderr.strip() or f"exit {run.returncode}"
    outputs = {}
    for out, (shape, dtype) in shapes.items():
        raw = bytearray((work / f"{out}.bin").read_bytes())
        outputs[out] = torch.frombuffer(raw, dtype=getattr(torch, dtype)).reshape(shape)
    return outputs, ""


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_kernel_source_computes_the_reference_on_the_cpu_emulator(kernel, emulator, tmp_path):
    name = kernel.split("/")[0]
    problem = _problem(name)
    for index, params in enumerate(EMULATED[name]):
        inputs = problem.make_inputs(dict(params), 3, "cpu")
        expected = problem.reference({k: v.clone() for k, v in inputs.items()}, dict(params))
        for order in ("random", "warps_reverse"):
            work = tmp_path / f"{index}-{order}"
            work.mkdir()
            got, complaint = emulate(emulator, work, kernel, params, inputs, order)
            assert not complaint, (params, order, complaint)
            for out in problem.info.outputs:
                result = compare(out.name, got[out.name], expected[out.name],
                                 tolerance_for(out.resolve(params)[1], problem.info.tolerances))
                assert result.passed, (params, order, result.message)


# Mutants the emulator must catch: a barrier removed lets a warp read shared memory other warps have not
# written yet (the transpose tile) or overwrite totals others still read (the scan's next tile).
MUTANTS = {
    "nchw_to_nhwc/smem_tile": ("    __syncthreads();\n", ""),
    "logcumsumexp/block_scan": ("        __syncthreads();  // warp_total is rewritten by the next tile\n", ""),
}


def _mutated(kernel: str) -> str:
    source = corpus.kernel_entry(kernel).load().source
    old, new = MUTANTS[kernel]
    assert source.count(old) == 1, kernel
    return source.replace(old, new)


@pytest.fixture(scope="module")
def mutant_emulator(tmp_path_factory) -> Path:
    """One build with every mutant in place of its kernel: each kernel has a namespace of its own, and a
    test runs only its mutant's plan, so the other mutants are never called."""
    return build_emulator(tmp_path_factory.mktemp("mb-mutants"), dict.fromkeys(KERNELS) | {
        kernel: _mutated(kernel) for kernel in MUTANTS})


@pytest.mark.parametrize("kernel", sorted(MUTANTS))
def test_the_emulator_catches_a_missing_barrier(kernel, mutant_emulator, tmp_path):
    assert _mutated(kernel) != corpus.kernel_entry(kernel).load().source
    binary = mutant_emulator
    name = kernel.split("/")[0]
    problem = _problem(name)
    params = EMULATED[name][1]
    inputs = problem.make_inputs(dict(params), 3, "cpu")
    expected = problem.reference({k: v.clone() for k, v in inputs.items()}, dict(params))
    (tmp_path / "run").mkdir()
    got, complaint = emulate(binary, tmp_path / "run", kernel, params, inputs, "warps")
    assert not complaint, complaint
    out = problem.info.outputs[0]
    result = compare(out.name, got[out.name], expected[out.name],
                     tolerance_for(out.resolve(params)[1], problem.info.tolerances))
    assert not result.passed, "the mutant passed: the emulator would not see this bug"


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_expert_has_a_dry_walk_of_its_current_source(name):
    """bench/walks/<problem>_<expert>.dry.json.gz (the next GPU walk's prefetch; kept out of the library
    until walked on a GPU) walks the expert and problem as they are now."""
    expert = WORKLOADS[name][1]
    walk = Lineage.load(ROOT / "bench" / "walks" / f"{name}_{expert}.dry.json.gz").to_dict()
    assert walk["gate"] == "compile" and walk["transitions"]
    assert walk["expert"]["fingerprint"] == corpus.kernel_entry(f"{name}/{expert}").load().fingerprint
    assert walk["problem"]["fingerprint"] == _problem(name).info.fingerprint
