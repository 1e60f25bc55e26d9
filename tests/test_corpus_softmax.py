"""The bundled row_softmax corpus: its problem file, two good kernels and the adversarial suite.

Everything here runs on a CPU: the problem's numerics in PyTorch, every kernel through the real
nvcc (cubin for sm_90; skipped only where no CUDA compiler is installed), and every launch plan
resolved for every case against the H200's facts. What the kernels do on a GPU is the gate's
business (each adversarial folder's expect.toml says which reason the gate must give).
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from functools import cache, lru_cache
from pathlib import Path

import pytest
import torch

from klineage import devices
from klineage.gate.compile import compile_kernel
from klineage.gate.verdict import Reason
from klineage.kernel import load_kernel
from klineage.launch import resolve
from klineage.problem import LEGACY_CASE, load_problem, validate_numerics
from shared_cache import share
from tests.test_artifact_policy import ON_THE_ARTIFACT, PLAN_CASES

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
PROBLEM_FILE = CORPUS / "problems" / "row_softmax.py"
LEGACY_FILE = CORPUS / "problems" / "legacy_vector_add.py"
GOOD_DIRS = sorted(p for p in (CORPUS / "kernels" / "row_softmax").iterdir() if p.is_dir())
ADVERSARIAL_DIRS = sorted(p for p in (CORPUS / "adversarial").iterdir() if p.is_dir())
ALL_DIRS = GOOD_DIRS + ADVERSARIAL_DIRS

# The suite's contract: each adversarial kernel and the reason the gate must reject it with.
EXPECTED_REASONS = {
    "write_zeros": "incorrect",
    "write_nothing": "unwritten_output",
    "first_row_only": "unwritten_output",
    "read_out_of_bounds": "memcheck",
    "write_out_of_bounds": "out_of_bounds_write",
    "hang": "timeout",
    "huge_shared": "resource_limit",
    "printf_flood": "output_flood",
    "race_no_barrier": "race",
    "cache_by_pointer": "static_check",
    "modify_input": "input_modified",
    "low_precision": "incorrect",
    "hidden_library": "static_check",
    # the evasion suite of the kernel policy on the artifact (tests/test_artifact_policy.py)
    "copy_out_of_bounds": "out_of_bounds_write",
    "evade_align_comment": "static_check",
    "evade_attribute_device": "static_check",
    "evade_attribute_managed": "static_check",
    "evade_const_cast": "static_check",
    "evade_device_malloc": "static_check",
    "evade_flag_device": "static_check",
    "evade_flag_pragma": "static_check",
    "evade_flag_timer": "static_check",
    "evade_include_splice": "static_check",
    "evade_location_device": "static_check",
    "evade_macro_device": "static_check",
    "evade_ptx_global": "static_check",
    "evade_static_local": "static_check",
    "evade_timer_hex_escape": "static_check",
    "evade_timer_line_splice": "static_check",
    "evade_timer_octal_escape": "static_check",
    "evade_timer_stringize": "static_check",
    "evade_timer_unicode_escape": "static_check",
    "plan_wrong_arity": "plan_error",
    "plan_wrong_size": "plan_error",
}


# Kernels the gate compiles anyway in a run, through its shared compile cache (tests/shared_cache.py): the good
# kernels (the softmax walks' and gates' starts) and the evasion suite tests/test_artifact_policy.py compiles up
# front. Their compile is the gate's own (real nvcc, sm_90 and sm_90a), read back where it is already made; a
# second, raw nvcc of each cost about 11 s a run. The rest are compiled here only, by one raw nvcc.
GATE_COMPILED = {"row_softmax/naive", "row_softmax/warp_vec4", "adversarial/copy_out_of_bounds",
                 *(f"adversarial/{name}" for name in [*ON_THE_ARTIFACT, *PLAN_CASES])}


def _ids(dirs: list[Path]) -> list[str]:
    return [f"{d.parent.name}/{d.name}" for d in dirs]


@lru_cache(maxsize=1)
def _problem():
    return load_problem(PROBLEM_FILE)


@cache
def _input_names(case: str) -> frozenset[str]:
    problem = _problem()
    return frozenset(problem.make_inputs(dict(problem.info.case(case).params), 0, "cpu"))


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).is_file()), None)


def _compile(folder: Path, out_dir: Path) -> subprocess.CompletedProcess:
    """The real compiler, as the gate runs it: one cubin for the plan's architecture."""
    state = load_kernel(folder)
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    command = [nvcc, "-cubin", f"-arch={state.plan.arch}", "-O3", "-std=c++17", *state.plan.nvcc_flags,
               str(folder / state.plan.source), "-o", str(out_dir / f"{folder.name}.cubin")]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=out_dir)


def _expect(folder: Path) -> dict:
    return tomllib.loads((folder / "expect.toml").read_text(encoding="utf-8"))


# --- the problem ---------------------------------------------------------------------------------

def test_problem_loads_and_its_numerics_are_sound():
    problem = _problem()
    info = problem.info
    assert info.operator == "row_softmax"
    assert info.headline == "headline"
    assert info.math == "fp32"
    assert not info.legacy and info.has_vendor
    assert validate_numerics(problem, "cpu") == []


def test_cases_cover_ragged_and_tiny_shapes():
    cases = {c.name: c.params for c in _problem().info.cases}
    assert {"headline", "small"} <= set(cases)
    headline = cases["headline"]
    assert 8 * headline["rows"] * headline["cols"] >= 512 * 2**20  # far above launch overhead
    # Some width divisible by no vector or tile size, some narrower than a warp, some row count
    # smaller than a block of rows.
    assert any(p["cols"] % 4 and p["cols"] % 32 for p in cases.values())
    assert any(p["cols"] < 32 for p in cases.values())
    assert any(p["rows"] < 8 for p in cases.values())


@pytest.mark.parametrize("case", [c.name for c in load_problem(PROBLEM_FILE).info.cases])
def test_every_case_has_outputs_of_the_declared_shape(case):
    problem = _problem()
    params = dict(problem.info.case(case).params)
    inputs = problem.make_inputs(params, 1, "cpu")
    assert set(inputs) == {"x"}
    x = inputs["x"]
    assert x.dtype == torch.float32 and tuple(x.shape) == (params["rows"], params["cols"])
    assert torch.isfinite(x).all()
    expected = problem.reference({k: v.clone() for k, v in inputs.items()})
    for out in problem.info.outputs:
        dims, dtype = out.resolve(params)
        got = expected[out.name]
        assert tuple(got.shape) == dims
        assert str(got.dtype).removeprefix("torch.") == dtype
    # Softmax rows sum to one: the reference computes what the docstring says.
    assert torch.allclose(expected["y"].double().sum(dim=1), torch.ones(params["rows"], dtype=torch.float64),
                          atol=1e-5)


def test_inputs_are_reproducible_and_mix_distributions():
    problem = _problem()
    params = dict(problem.info.case("ragged").params)
    a = problem.make_inputs(params, 3, "cpu")["x"]
    assert torch.equal(a, problem.make_inputs(params, 3, "cpu")["x"])
    assert not torch.equal(a, problem.make_inputs(params, 4, "cpu")["x"])
    row_max, row_min = a.amax(dim=1), a.amin(dim=1)
    assert (row_max.abs() > 90).any(), "rows offset by hundreds stress the max subtraction"
    assert (row_max == row_min).any(), "constant rows (every output 1/cols) are part of the mix"
    assert (row_max - row_min > 150).any(), "near-one-hot rows of large spread are part of the mix"


def test_vendor_path_meets_the_tolerance_on_the_small_case():
    from klineage.gate.correctness import compare
    from klineage.problem import tolerance_for

    problem = _problem()
    params = dict(problem.info.case("small").params)
    inputs = problem.make_inputs(params, 0, "cpu")
    tol = tolerance_for("float32", problem.info.tolerances)
    expected = problem.reference(inputs)["y"]
    assert compare("y", problem.vendor(inputs)["y"], expected, tol).passed
    # ...and the tolerance is tight enough to refuse fp16 arithmetic and zeros.
    assert not compare("y", torch.softmax(inputs["x"].half().float(), dim=-1), expected, tol).passed
    assert not compare("y", torch.zeros_like(expected), expected, tol).passed


def test_roofline_counts_one_read_and_one_write():
    info = _problem().info
    for case in info.cases:
        n = case.params["rows"] * case.params["cols"]
        assert info.roofline[case.name] == {"flops": 5.0 * n, "bytes": 8.0 * n}


def test_legacy_problem_loads_as_one_default_case():
    problem = load_problem(LEGACY_FILE)
    info = problem.info
    assert info.legacy
    assert [c.name for c in info.cases] == [LEGACY_CASE] == ["default"]
    assert [o.name for o in info.outputs] == ["out0"]
    inputs = problem.make_inputs({}, 0, "cpu")
    assert list(inputs) == ["in0", "in1"]
    out = problem.reference(inputs)["out0"]
    assert torch.equal(out, inputs["in0"] + inputs["in1"])
    assert validate_numerics(problem, "cpu") == []


# --- kernels and plans -----------------------------------------------------------------------------

def test_corpus_has_the_expected_folders():
    assert [d.name for d in GOOD_DIRS] == ["naive", "warp_vec4"]
    assert {d.name for d in ADVERSARIAL_DIRS} == set(EXPECTED_REASONS)


@pytest.mark.parametrize("folder", ALL_DIRS, ids=_ids(ALL_DIRS))
def test_kernel_folder_loads(folder):
    state = load_kernel(folder)
    assert state.plan.problem == "row_softmax"
    assert state.plan.arch == "sm_90"
    assert "THREADS" in state.constants  # plans name their block size, never a bare number
    for launch in state.plan.launches:
        assert launch.entry in state.source


@pytest.mark.parametrize("folder", ALL_DIRS, ids=_ids(ALL_DIRS))
def test_plan_resolves_for_every_case(folder):
    state = load_kernel(folder)
    problem = _problem()
    facts = devices.H200.facts()
    scratch = {s.name for s in state.plan.scratch}
    for case in problem.info.cases:
        params = dict(case.params)
        assert state.plan.supports_case(params), f"{folder.name} should support {case.name}"
        buffers = set(_input_names(case.name)) | {o.name for o in problem.info.outputs} | scratch
        launches = resolve(state.plan, {**params, **state.constants, **facts}, buffers)
        assert launches
        for launch in launches:
            if folder.name == "huge_shared":  # it must ask for more than the GPU can grant
                assert launch.shared > facts["smem_per_block_optin"]
            else:
                assert launch.shared <= facts["smem_per_block_optin"]


@pytest.mark.parametrize("folder", GOOD_DIRS, ids=_ids(GOOD_DIRS))
def test_good_kernels_launch_a_block_for_every_row(folder):
    state = load_kernel(folder)
    assert not state.plan.supports, "the good kernels handle every shape"
    problem = _problem()
    for case in problem.info.cases:
        params = dict(case.params)
        (launch,) = resolve(state.plan, {**params, **state.constants, **devices.H200.facts()}, {"x", "y"})
        assert launch.grid == (params["rows"], 1, 1)
        assert launch.block == (state.constants["THREADS"], 1, 1)
        assert [a[1] for a in launch.args] == ["x", "y", params["rows"], params["cols"]]


@pytest.fixture(scope="module")
def gate_compiles(tmp_path_factory, shared_cache) -> Path:
    return share(tmp_path_factory.mktemp("softmax-compiles"), shared_cache, ("compile",))


@pytest.mark.parametrize("folder", ALL_DIRS, ids=_ids(ALL_DIRS))
def test_kernel_compiles_with_nvcc_for_sm_90(folder, tmp_path, gate_compiles):
    if folder in ADVERSARIAL_DIRS and _expect(folder).get("compiles", True) is False:
        pytest.skip("this adversarial kernel is meant not to compile")
    if f"{folder.parent.name}/{folder.name}" in GATE_COMPILED:
        if _nvcc() is None:
            pytest.skip("no nvcc on this machine")
        compiled = compile_kernel(load_kernel(folder), gate_compiles)
        assert compiled.ok, compiled.log[-4000:]
        assert "sm_90" in compiled.targets and compiled.cubin_bytes("sm_90")
        return
    result = _compile(folder, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / f"{folder.name}.cubin").stat().st_size > 0


# --- the adversarial suite's expectations ------------------------------------------------------------

@pytest.mark.parametrize("folder", ADVERSARIAL_DIRS, ids=_ids(ADVERSARIAL_DIRS))
def test_expectation_names_a_valid_reason(folder):
    expect = _expect(folder)
    assert set(expect) <= {"reason", "why", "compiles"}
    reason = Reason(expect["reason"])  # raises on an unknown reason
    assert reason.value == EXPECTED_REASONS[folder.name]
    assert isinstance(expect["why"], str) and len(expect["why"]) > 20
    assert isinstance(expect.get("compiles", True), bool)
