"""Problems in the formats people already have: the reference's keyword files, KernelBench files and
FlashInfer trace definitions load into the contract (probed in the sandboxed runner subprocess, CPU
torch), describe themselves on the command line, and gate compile-only (and on the GPU) with a kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from klineage.config import GateMode
from klineage.errors import DocumentError
from klineage.gate.execute import probe_problem, problem_fingerprint
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.kernel import load_kernel
from klineage.problem_formats import ProblemFormat, detect, source_files
from sampled import sampled
from shared_cache import PROBES, share

FORMATS = Path(__file__).parent / "fixtures" / "formats"
TRACES = FORMATS / "flashinfer"

# fixture -> (format, operator, inputs on the smallest case, outputs {name: (shape, dtype)}, cases)
EXPECTED = {
    "keyword/vector_scale.py": (ProblemFormat.KEYWORD, "vector_scale", {"x": [4096]},
                                {"out0": ([4096], "float32")}, {"default": {"alpha": 2.5, "length": 4096,
                                                                            "dtype": "float32"}}),
    "keyword/vector_add_cases.py": (ProblemFormat.KEYWORD, "vector_add", {"x": [1000], "y": [1000]},
                                    {"out0": (["n"], "float32")},
                                    {"small": {"n": 1000}, "large": {"n": 1 << 20}, "odd": {"n": 12345}}),
    "keyword/add_and_diff.py": (ProblemFormat.KEYWORD, "add_and_diff", {"x": [33, 256], "y": [33, 256]},
                                {"out0": (["rows", 256], "float32"), "out1": (["rows", 256], "float32")},
                                {"default": {"scale": 1e-3, "rows": 64, "cols": 256},
                                 "rows": {"scale": 1e-3, "rows": 33, "cols": 256}}),
    "keyword/conv2d_nhwc.py": (ProblemFormat.KEYWORD, "conv2d_nhwc", {"activation": [2, 12, 12, 8], "weight": [72, 16]},
                               {"out0": ([2, 12, "width", "filters"], "float32")},
                               {"default": {"kernel": 3, "padding": 1, "batch": 2, "channels": 8, "height": 12,
                                            "width": 12, "filters": 16, "dtype": "float32"},
                                "wide": {"kernel": 3, "padding": 1, "batch": 2, "channels": 8, "height": 12,
                                         "width": 24, "filters": 32, "dtype": "float32"}}),
    "kernelbench/scale_residual.py": (ProblemFormat.KERNELBENCH, "scale_residual", {"in0": [16, 4096]},
                                      {"out0": ([16, 4096], "float32")},
                                      {"default": {"batch_size": 16, "dim": 4096, "scale": 0.5}}),
    "kernelbench/vector_add.py": (ProblemFormat.KERNELBENCH, "vector_add", {"in0": [100003], "in1": [100003]},
                                  {"out0": (["N"], "float32")}, {"large": {"N": 1 << 20}, "ragged": {"N": 100003}}),
    "kernelbench/linear_relu_pair.py": (ProblemFormat.KERNELBENCH, "linear_relu_pair",
                                        {"in0": [32, 64], "w_linear_weight": [48, 64], "w_linear_bias": [48]},
                                        {"out0": ([32, 48], "float32"), "out1": ([32], "float32")},
                                        {"default": {"batch_size": 32, "in_features": 64, "out_features": 48}}),
    "flashinfer/definitions/vector_scale.json": (
        ProblemFormat.FLASHINFER, "vector_scale", {"x": [33]}, {"y": (["N"], "float32")},
        {"w0": {"N": 4096, "alpha": 2.5, "workload": 0}, "w1": {"N": 1000003, "alpha": -0.75, "workload": 1},
         "w2": {"N": 33, "alpha": 3, "workload": 2}}),
    "flashinfer/definitions/elementwise/add_sub_d256.json": (
        ProblemFormat.FLASHINFER, "add_sub_d256", {"a": [3, 256], "b": [3, 256]},
        {"s": (["rows", "D"], "float32"), "d": (["rows", "D"], "float32")},
        {"w0": {"D": 256, "rows": 64, "workload": 0}, "w1": {"D": 256, "rows": 3, "workload": 1}}),
    "flashinfer/definitions/rmsnorm_h128.json": (
        ProblemFormat.FLASHINFER, "rmsnorm_h128", {"hidden": [1, 128], "weight": [128]},
        {"output": (["batch_size", "hidden_size"], "float32")},
        {"w0": {"hidden_size": 128, "batch_size": 8, "eps": 1e-6, "workload": 0},
         "w1": {"hidden_size": 128, "batch_size": 1, "eps": 1e-5, "workload": 1}}),
}

# problem fixture -> kernel folder (tests/fixtures/formats/kernels/...)
KERNELS = {
    "keyword/vector_scale.py": "keyword_vector_scale",
    "kernelbench/vector_add.py": "kernelbench_vector_add",
    "flashinfer/definitions/vector_scale.json": "flashinfer_vector_scale",
    "flashinfer/definitions/elementwise/add_sub_d256.json": "flashinfer_add_sub",
}


@pytest.fixture(scope="module")
def probes(tmp_path_factory, shared_cache) -> Path:
    """The run's problem probes (tests/shared_cache.py, content-addressed: what the sandboxed runner made of
    these very bytes), which the compile-only gates below find too: each fixture is run in the sandbox once."""
    return share(tmp_path_factory.mktemp("format-probes"), shared_cache, PROBES)


# A fixture run in the sandbox costs a runner start (about 2.5 s): the default run keeps a multi-output keyword
# problem, the richest KernelBench one and the FlashInfer definitions (parsed, not run); the rest under -m slow.
LOADED_BY_DEFAULT = ["keyword/add_and_diff.py", "kernelbench/linear_relu_pair.py",
                     *(name for name in EXPECTED if name.startswith("flashinfer/"))]


@pytest.mark.parametrize("fixture", sampled(sorted(EXPECTED), keep=LOADED_BY_DEFAULT))
def test_each_fixture_loads_in_the_sandboxed_runner(fixture, probes):
    kind, operator, inputs, outputs, cases = EXPECTED[fixture]
    path = FORMATS / fixture
    assert detect(path) is kind
    probe = probe_problem(path, probes)  # the runner subprocess executes the file; this process only parses it
    info = probe.info
    assert probe.numerics == (), probe.numerics
    assert (info.source_format, info.operator) == (kind.value, operator)
    assert {name: spec["shape"] for name, spec in probe.inputs.items()} == inputs
    assert {o.name: (list(o.shape), o.dtype) for o in info.outputs} == outputs
    assert {c.name: c.params for c in info.cases} == cases
    assert info.fingerprint == problem_fingerprint(path)
    assert set(info.roofline) == set(cases) and all(r["bytes"] > 0 for r in info.roofline.values())


def test_problem_code_is_not_run_by_detection(tmp_path):
    path = tmp_path / "kb.py"
    path.write_text("raise SystemExit('ran')\nclass Model: pass\ndef get_inputs(): return []\n", encoding="utf-8")
    assert detect(path) is ProblemFormat.KERNELBENCH  # parsed, not executed
    with pytest.raises(DocumentError, match="ran"):
        probe_problem(path)  # the runner executes it and says how it failed


def test_multi_output_tolerances_and_vendor(probes):
    add_and_diff = probe_problem(FORMATS / "keyword/add_and_diff.py", probes).info
    assert add_and_diff.tolerances["out1"].atol == 1e-6  # the small output's own atol
    kernelbench = probe_problem(FORMATS / "kernelbench/linear_relu_pair.py", probes).info
    assert kernelbench.has_vendor and kernelbench.tolerances["float32"].rtol == 1e-2  # the reference's allclose


def test_trace_fingerprint_covers_workloads_and_tensors_and_not_the_location(tmp_path):
    copy = tmp_path / "trace"
    shutil.copytree(TRACES, copy)
    definition = Path("definitions/rmsnorm_h128.json")
    assert problem_fingerprint(copy / definition) == problem_fingerprint(TRACES / definition)
    assert [p.name for p in source_files(copy / definition)] == [
        "rmsnorm_h128.json", "rmsnorm_h128.jsonl", "rmsnorm_weight_h128.safetensors"]
    before = problem_fingerprint(copy / definition)
    blob = copy / "blob" / "rmsnorm_weight_h128.safetensors"
    blob.write_bytes(blob.read_bytes()[:-4] + b"\x00\x00\x80\x3f")  # the last weight becomes 1.0
    assert problem_fingerprint(copy / definition) != before


def trace(tmp_path: Path, workload: dict, definition: str = "vector_scale.json") -> Path:
    root = tmp_path / "trace"
    (root / "definitions").mkdir(parents=True)
    (root / "workloads").mkdir()
    shutil.copy(TRACES / "definitions" / definition, root / "definitions" / definition)
    (root / "workloads" / definition.replace(".json", ".jsonl")).write_text(json.dumps(workload) + "\n")
    return root / "definitions" / definition


@pytest.mark.parametrize("workload, fragment", [
    ({"uuid": "u", "axes": {"N": 8}, "inputs": {"x": {"type": "safetensors", "path": "../../etc/passwd",
                                                       "tensor_key": "x"}, "alpha": {"type": "scalar", "value": 1}}},
     "leaves the trace folder"),
    ({"uuid": "u", "axes": {}, "inputs": {"x": {"type": "random"}, "alpha": {"type": "scalar", "value": 1}}},
     "workload axes [] are not the var axes ['N']"),
    ({"uuid": "u", "axes": {"N": 8}, "inputs": {"x": {"type": "random"}, "alpha": {"type": "random"}}},
     "input 'alpha': a scalar input cannot be random"),
    ({"uuid": "u", "axes": {"N": 8}, "inputs": {"x": {"type": "zeros"}, "alpha": {"type": "scalar", "value": 1}}},
     "type 'zeros' is not one of random, scalar, safetensors"),
])
def test_bad_workloads_are_refused_naming_the_problem(tmp_path, workload, fragment):
    with pytest.raises(DocumentError) as info:
        problem_fingerprint(trace(tmp_path, workload))
    assert fragment in str(info.value)


def test_float8_and_missing_workloads_are_refused(tmp_path):
    path = trace(tmp_path, {"uuid": "u", "axes": {"N": 8}, "inputs": {"x": {"type": "random"},
                                                                      "alpha": {"type": "scalar", "value": 1}}})
    (path.parent.parent / "workloads" / "vector_scale.jsonl").unlink()
    with pytest.raises(DocumentError, match="no workloads: looked for"):
        problem_fingerprint(path)
    path.write_text(path.read_text().replace('"dtype": "float32"}}', '"dtype": "float8_e4m3"}}'))
    with pytest.raises(DocumentError, match="dtype 'float8_e4m3' is not one of"):
        problem_fingerprint(path)


def test_problems_command_describes_any_format(probes):
    paths = [str(FORMATS / "keyword/vector_scale.py"), str(TRACES / "definitions/elementwise/add_sub_d256.json")]
    # the run's probes (the loading test's of these very files), not the machine's cache: cold in CI, it probed again
    env = {**os.environ, "KLINEAGE_CACHE_DIR": str(probes)}
    done = subprocess.run([sys.executable, "-m", "klineage", "problems", *paths, "--json"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    assert [d["format"] for d in described] == ["keyword", "flashinfer"]
    assert described[1]["inputs"] == {"a": {"dtype": "float32", "shape": [3, 256]},
                                      "b": {"dtype": "float32", "shape": [3, 256]}}
    assert [o["name"] for o in described[1]["outputs"]] == ["s", "d"]
    assert [c["name"] for c in described[1]["cases"]] == ["w0", "w1"]


@pytest.mark.parametrize("fixture", sorted(KERNELS))
def test_each_format_gates_compile_only_with_a_matching_kernel(fixture, gate_cache):
    kernel = load_kernel(FORMATS / "kernels" / KERNELS[fixture])
    verdict = run_gate(FORMATS / fixture, kernel, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    assert verdict.status is Status.COMPILED, [f.message for f in verdict.findings]

