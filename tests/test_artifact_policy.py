"""The kernel policy on what nvcc produced: the evasion suite (corpus/adversarial/evade_*, plan_*,
copy_out_of_bounds) through the compile-only gate with real nvcc, the artifact check on its own
(so a rule the source check happens to catch first is still shown to hold on the cubin), the
nvcc flag allow-list, and plan arguments against the cubin's parameter table."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.errors import DocumentError
from klineage.gate import compile as compile_module
from klineage.gate.artifact import ArtifactReport, artifact_check, include_edges, include_findings
from klineage.gate.cache import GateCache
from klineage.gate.compile import compile_kernel
from klineage.gate.nvcc_flags import refused_flags
from klineage.gate.pipeline import run_gate
from klineage.gate.static import Rule, static_check
from klineage.gate.verdict import Reason, Status
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from shared_cache import share

SOFTMAX = corpus.problem_path("row_softmax")
# Folder -> the policy rule the cubin (or, for a flag, the plan) breaks. Folders whose rule the
# artifact shows are checked on the artifact alone too.
RULES = {
    "evade_attribute_device": Rule.DEVICE_STATE, "evade_location_device": Rule.DEVICE_STATE,
    "evade_attribute_managed": Rule.MANAGED_MEMORY, "evade_const_cast": Rule.DEVICE_STATE,
    "evade_static_local": Rule.DEVICE_STATE, "evade_macro_device": Rule.DEVICE_STATE,
    "evade_align_comment": Rule.DEVICE_STATE, "evade_ptx_global": Rule.DEVICE_STATE,
    "evade_device_malloc": Rule.EXTERN_CALL, "evade_timer_hex_escape": Rule.TIMER,
    "evade_timer_octal_escape": Rule.TIMER, "evade_timer_unicode_escape": Rule.TIMER,
    "evade_timer_line_splice": Rule.TIMER, "evade_timer_stringize": Rule.TIMER,
    "evade_include_splice": Rule.INCLUDE,
    "evade_flag_timer": Rule.NVCC_FLAG, "evade_flag_device": Rule.NVCC_FLAG, "evade_flag_pragma": Rule.NVCC_FLAG,
}
PLAN_CASES = {"plan_wrong_arity": "argument 4 (scalar 'rows * cols' of type i32) has no parameter",
              "plan_wrong_size": "argument 3 (scalar 'cols' of type i32) is 4 bytes; the kernel's parameter 3 is 8"}
ON_THE_ARTIFACT = [name for name, rule in RULES.items() if rule is not Rule.NVCC_FLAG]
SUITE = [*RULES, *PLAN_CASES, "copy_out_of_bounds"]
EVIDENCE = {Rule.DEVICE_STATE: {"symbol", "section"}, Rule.MANAGED_MEMORY: {"symbol"}, Rule.EXTERN_CALL: {"symbol"},
            Rule.TIMER: {"function", "sass"}, Rule.INCLUDE: {"header"}}


def _state(name: str) -> KernelState:
    return corpus.kernel_entry(f"adversarial/{name}").load()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, shared_cache) -> Path:
    """One cache for the module (the gate's too), its compiles and artifact reports made two at a
    time up front; its problem probe, compiles and artifact reports are the run's (tests/shared_cache.py),
    its verdicts its own."""
    folder = share(tmp_path_factory.mktemp("artifact-cache"), shared_cache)

    def judge(name: str) -> None:
        state = _state(name)
        artifact_check(state, compile_kernel(state, folder), folder)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KLINEAGE_CACHE_DIR", str(folder))
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(judge, [*ON_THE_ARTIFACT, *PLAN_CASES, "copy_out_of_bounds"]))
        yield folder


@pytest.fixture()
def gate_cache(cache_dir, monkeypatch) -> GateCache:
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(cache_dir))
    return GateCache(cache_dir, cache_dir / "recorded")


def test_the_suite_is_on_disk_with_its_expectations():
    names = {e.name.removeprefix("adversarial/") for e in corpus.list_kernels(adversarial=True)}
    assert set(SUITE) <= names
    for name in SUITE:
        expected = corpus.kernel_entry(f"adversarial/{name}").expectation["reason"]
        assert expected == ("plan_error" if name in PLAN_CASES else
                            "out_of_bounds_write" if name == "copy_out_of_bounds" else "static_check")


@pytest.mark.parametrize("name", SUITE)
def test_the_compile_only_gate_rejects_each_evasion_with_its_reason(gate_cache, name):
    verdict = run_gate(SOFTMAX, _state(name), mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    if name == "copy_out_of_bounds":  # the stray copy is a run-time fault: the GPU gate's guards see it
        assert verdict.status is Status.COMPILED
        return
    assert verdict.status is Status.REJECTED, verdict.findings
    finding = verdict.findings[0]
    if name in PLAN_CASES:
        assert finding.reason is Reason.PLAN_ERROR and PLAN_CASES[name] in finding.message
        return
    assert finding.reason is Reason.STATIC_CHECK
    rules = {f["rule"] for f in verdict.static["findings"]} if finding.stage == "static" else {
        f["rule"] for f in finding.evidence["artifact"]}
    # The source check stops some of them first, for this rule or for not parsing (a macro used
    # as a qualifier); the artifact check below shows the rule holds on the cubin regardless.
    assert RULES[name].value in rules or (finding.stage == "static" and "syntax" in rules), verdict.findings
    if finding.stage == "artifact":
        assert f"{RULES[name].value} on the artifact" in finding.message


@pytest.mark.parametrize("name", ON_THE_ARTIFACT)
def test_the_artifact_check_names_the_rule_and_its_evidence(cache_dir, name):
    state = _state(name)
    report = artifact_check(state, compile_kernel(state, cache_dir), cache_dir)
    found = [f for f in report.findings if f.rule is RULES[name]]
    assert found, report.findings
    assert EVIDENCE[RULES[name]] <= set(found[0].evidence) and found[0].evidence["target"] == "sm_90, sm_90a"
    assert ArtifactReport.from_dict(report.to_dict()) == report


@pytest.mark.parametrize("name, rule", [("evade_flag_timer", Rule.TIMER), ("evade_flag_device", Rule.DEVICE_STATE)])
def test_a_flag_that_slipped_past_the_allow_list_is_still_caught_on_the_artifact(tmp_path, monkeypatch, name, rule):
    monkeypatch.setattr(compile_module, "refused_flags", lambda flags: ())
    state = _state(name)
    compiled = compile_kernel(state, tmp_path)
    assert compiled.ok, compiled.log[-2000:]
    assert rule in {f.rule for f in artifact_check(state, compiled).findings}


def test_printf_and_clock_stay_allowed(tmp_path):
    """printf is bounded by the run-time output cap (adversarial/printf_flood), clock64 counts
    cycles, not wall time: the artifact check keeps what the source policy allows."""
    source = ('extern "C" __global__ void k(float* y, int n) {\n'
              '    long long start = clock64();\n'
              '    if (threadIdx.x == 0) printf("n=%d\\n", n);\n'
              '    y[threadIdx.x] = static_cast<float>(clock64() - start);\n}\n')
    plan = LaunchPlan.from_toml('name = "k"\nproblem = "p"\narch = "sm_90a"\n'
                                '[[launch]]\nentry = "k"\ngrid = [1]\nblock = [32]\n'
                                'args = ["y", {scalar = 1, type = "i32"}]\n')
    state = KernelState(source=source, plan=plan)
    report = artifact_check(state, compile_kernel(state, tmp_path), tmp_path)
    assert report.ok, report.findings
    assert (tmp_path / "artifact").is_dir(), "the report is cached by the compile's key"


def test_compile_never_hands_a_refused_flag_to_nvcc(tmp_path):
    state = _state("evade_flag_device")
    with pytest.raises(DocumentError, match="-DPERSIST=__device__"):
        compile_kernel(state, tmp_path)
    assert not (tmp_path / "compile").exists()


def test_the_corpus_flags_pass_and_the_evasive_ones_do_not():
    allowed = ["-O3", "-O0", "--ftz=true", "-Xptxas=-O1", "--use_fast_math", "-maxrregcount=128", "-DTILE=128",
               "-DUSE_SPLIT", "--prec-div=false", "-lineinfo", "-std=c++20"]
    refused = ["-DTIMER=%globaltimer", "-D__device__=", "-Dpersist=__device__", "-DX=_Pragma(\"unroll\")",
               "-U__CUDA_ARCH__", "-I/tmp", "-include", "--pre-include=cub/cub.cuh", "-Xcompiler=-include",
               "-ccbin=/bin/sh", "-rdc=true", "--keep", "-o", "-Xptxas=-O3,-v", "-O3 -DX", "-Ofast", "-G"]
    assert refused_flags(allowed) == ()
    assert refused_flags(refused) == tuple(refused)


def test_include_edges_follow_the_preprocessors_line_markers():
    markers = ['# 0 "kernel.cu"', '# 0 "<command-line>"', '# 1 "/cuda/include/cuda_runtime.h" 1 3 4',
               '# 12 "/cuda/include/cuda_runtime.h" 3 4', '# 1 "/cuda/include/crt/host_defines.h" 1 3 4',
               '# 13 "/cuda/include/cuda_runtime.h" 2 3 4', '# 0 "<command-line>" 2', '# 1 "kernel.cu"',
               '# 1 "/cuda/include/cccl/cub/cub.cuh" 1 3 4',
               '# 1 "/cuda/include/cccl/cub/device/device_reduce.cuh" 1 3 4',
               '# 2 "/cuda/include/cccl/cub/cub.cuh" 2 3 4', '# 3 "kernel.cu" 2',
               '# 1 "/cuda/include/cuda_fp16.h" 1 3 4', '# 4 "kernel.cu" 2']
    edges = include_edges(markers)
    assert (("<command-line>",), "/cuda/include/cuda_runtime.h") in edges  # nvcc's -include, not the source's
    assert (("kernel.cu",), "/cuda/include/cccl/cub/cub.cuh") in edges
    assert (("kernel.cu", "/cuda/include/cccl/cub/cub.cuh"), "/cuda/include/cccl/cub/device/device_reduce.cuh") in edges
    assert (("kernel.cu",), "/cuda/include/cuda_fp16.h") in edges
    findings = list(include_findings(markers, "kernel.cu"))
    assert [(f.rule, f.evidence["header"]) for f in findings] == [
        (Rule.INCLUDE, "/cuda/include/cccl/cub/cub.cuh"), (Rule.LIBRARY_DELEGATION, "/cuda/include/cccl/cub/cub.cuh")]


def test_a_name_with_a_dollar_is_refused_at_the_source():
    """printf's format strings are `$str` symbols, which the artifact check lets through in a
    module that prints; a C++ name with '$' could take that name, so the source check refuses '$'
    outside comments and literals."""
    plan = LaunchPlan.from_toml('name = "k"\nproblem = "p"\n[[launch]]\nentry = "k"\ngrid = [1]\nblock = [32]\n'
                                'args = ["y"]\n')
    source = ('// costs $0\n__attribute__((device)) char $str[8] = "a$";\n'
              'extern "C" __global__ void k(char* y) { $str[0]++; y[0] = $str[0]; printf("$"); }\n')
    findings = static_check(KernelState(source=source, plan=plan)).findings
    assert [(f.rule, f.line) for f in findings] == [(Rule.PREPROCESSOR_TRICK, 2)]
