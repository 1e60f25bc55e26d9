"""The static check: each rule rejects what it names, and leaves honest kernels alone."""

from pathlib import Path

import pytest

from klineage.errors import DocumentError
from klineage.gate.static import MAX_PER_RULE, Rule, StaticFinding, StaticReport, static_check
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan

FIXTURE = Path(__file__).parent / "fixtures" / "static" / "hgemm_mma.cu"


def check(source: str, *entries: str) -> StaticReport:
    launches = [{"entry": entry, "grid": 1, "block": 32} for entry in entries or ("k",)]
    plan = LaunchPlan.from_dict({"name": "t", "problem": "p", "launch": launches})
    return static_check(KernelState(source=source, plan=plan))


def rules(report: StaticReport) -> set[Rule]:
    return {finding.rule for finding in report.findings}


def only(report: StaticReport, rule: Rule) -> list[StaticFinding]:
    assert rules(report) == {rule}, report.findings
    return [f for f in report.findings if f.rule is rule]


def kernel(body: str = "") -> str:
    return f"__global__ void k(float* x) {{\n{body}\n}}\n"


def test_realistic_kernel_passes():
    report = check(FIXTURE.read_text(), "hgemm", "scale_rows")
    assert report.ok and report.findings == ()


def test_source_size_limits_and_no_parse_beyond_them():
    big = kernel("x[0] = 1;") + "// " + "x" * (512 * 1024) + "\n"
    (finding,) = only(check(big), Rule.SOURCE_SIZE)
    assert "KiB" in finding.message
    long = kernel("\n" * 19_998)
    assert "20001 lines" in only(check(long), Rule.SOURCE_SIZE)[0].message
    assert check(kernel("\n" * 19_997)).ok
    # Over the limit, nothing else is judged (even a source without a kernel).
    assert rules(check("int y;\n" * 20_001)) == {Rule.SOURCE_SIZE}


def test_syntax_errors_name_their_position():
    (finding,) = only(check(kernel("x[0] = ;")), Rule.SYNTAX)
    assert finding.line == 2
    assert "line 2, column 6: '='" in finding.message


def test_findings_per_rule_are_capped():
    body = "\n".join("x[0] = ;" for _ in range(MAX_PER_RULE + 3))
    findings = only(check(kernel(body)), Rule.SYNTAX)
    assert len(findings) == MAX_PER_RULE
    assert findings[-1].message.endswith("(and 3 more like it)")


def test_a_source_needs_a_global_function():
    report = check("__device__ float f(float v) { return v; }\n", "f")
    assert Rule.GLOBAL_FUNCTION in rules(report)


@pytest.mark.parametrize("entry, fragment", [
    ("missing", "'missing' is not defined"),
    ("helper", "'helper' is not __global__"),
    ("k<128>", "'k' is not a template"),
    ("tiled", "'tiled' is a template; name an instance"),
])
def test_plan_entries_must_name_global_functions(entry, fragment):
    source = kernel() + "__device__ void helper() {}\ntemplate <int N> __global__ void tiled(float* x) {}\n"
    (finding,) = only(check(source, entry), Rule.PLAN_ENTRY)
    assert fragment in finding.message and entry in finding.message


@pytest.mark.parametrize("entry", [
    "k", "tiled<128>", "tiled< 64 >", "void tiled<128>(float*)", "ns::inner", "_Z5tiledILi128EEvPf", "_ZN2ns5innerEv",
])
def test_plan_entry_forms_the_compiler_accepts(entry):
    source = (kernel() + "template <int N> __global__ void tiled(float* x) {}\n"
              "namespace ns { __global__ void inner() {} }\n")
    assert check(source, entry).ok


@pytest.mark.parametrize("header", [
    "cuda_fp16.h", "cuda_bf16.h", "mma.h", "cuda_pipeline.h", "cooperative_groups.h", "cooperative_groups/reduce.h",
    "cuda/pipeline", "cuda/barrier", "cuda/std/utility", "cub/block/block_reduce.cuh", "cub/warp/warp_reduce.cuh",
    "cstdint", "cmath", "type_traits",
])
def test_allowed_includes(header):
    assert check(f"#include <{header}>\n" + kernel()).ok


@pytest.mark.parametrize("line", [
    "#include <stdio.h>", '#include "helpers.cuh"', "#include <cub/block/../../evil.h>", "#include_next <cmath>",
])
def test_other_includes_are_rejected(line):
    (finding,) = only(check(line + "\n" + kernel()), Rule.INCLUDE)
    assert finding.line == 1


@pytest.mark.parametrize("code, library", [
    ("cublasSgemm(handle, 0, 0, 1, 1, 1, &a, x, 1, x, 1, &b, x, 1);", "cuBLAS"),
    ("cudnnHandle_t h;", "cuDNN"),
    ("cutlass::gemm::GemmShape<128, 128, 32> shape;", "CUTLASS"),
    ("using namespace cute;\nauto t = make_tensor(x);", "CuTe"),
    ("thrust::sort(thrust::device, x, x + 4);", "Thrust"),
    ("cub::DeviceReduce::Sum(nullptr, n, x, x, 4);", "CUB"),
    ("at::Tensor t;", "ATen"),
    ("torch::Tensor t;", "PyTorch"),
])
def test_library_delegation(code, library):
    findings = only(check(kernel(code)), Rule.LIBRARY_DELEGATION)
    assert library in findings[0].message and findings[0].line == 2


def test_library_headers_are_named_as_delegation():
    report = check("#include <cublas_v2.h>\n" + kernel())
    assert rules(report) == {Rule.INCLUDE, Rule.LIBRARY_DELEGATION}


@pytest.mark.parametrize("code", [
    "child<<<1, 32>>>(x);",
    "cudaMalloc(&x, 16);",
    "cudaMemcpyAsync(x, x, 16, cudaMemcpyDeviceToDevice, 0);",
    "cudaDeviceSynchronize();",
    "cudaStreamCreateWithFlags(&s, 1);",
    "cudaLaunchDevice(f, buffer, grid, block, 0, 0);",
    "cudaGraphLaunch(g, 0);",
])
def test_host_runtime_and_dynamic_parallelism(code):
    (finding,) = only(check("__global__ void child(float* x) {}\n" + kernel(code)), Rule.HOST_RUNTIME)
    assert finding.line == 3


def test_device_side_runtime_intrinsics_are_fine():
    body = "cudaGridDependencySynchronize();\ncuda::memcpy_async(x, x, 16, bar);\nlong long t = clock64();"
    assert check(kernel(body)).ok


@pytest.mark.parametrize("code", [
    'unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));',
    'unsigned t; asm volatile("mov.u32 %0, %%global" "timer_lo;" : "=r"(t));',
    "auto now = cuda::std::chrono::system_clock::now();",
])
def test_timer_reads(code):
    (finding,) = only(check(kernel(code)), Rule.TIMER)
    assert finding.line == 2


@pytest.mark.parametrize("source, name", [
    ("__device__ int calls;\n" + kernel("calls++;"), "calls"),
    ("__device__ float* cache;\n" + kernel(), "cache"),
    ("__device__ const float* table;\n" + kernel(), "table"),  # the pointer itself can be rewritten
    ("namespace detail { __device__ float last[256]; }\n" + kernel(), "last"),
    (kernel("static int seen = 0;\nseen++;"), "seen"),
])
def test_mutable_device_state_is_rejected(source, name):
    (finding,) = only(check(source), Rule.DEVICE_STATE)
    assert name in finding.message and "[[scratch]]" in finding.message


def test_constant_device_data_is_fine():
    source = ("__constant__ float weights[16];\n__device__ const float bias[2] = {0.f, 1.f};\n"
              "__device__ constexpr int tile = 64;\n__device__ float* const fixed = nullptr;\n"
              "__shared__ float shared_tile[32];\n" + kernel("static const int k = 3;\n__shared__ float s[32];"))
    assert check(source).ok


def test_managed_memory():
    (finding,) = only(check("__managed__ int shared_with_host;\n" + kernel()), Rule.MANAGED_MEMORY)
    assert finding.line == 1


@pytest.mark.parametrize("pragma", ["#pragma once", "#pragma nv_diag_suppress 177", "#pragma GCC optimize(\"O0\")"])
def test_pragmas_other_than_unroll(pragma):
    (finding,) = only(check(pragma + "\n" + kernel()), Rule.PRAGMA)
    assert finding.line == 1 and pragma.split()[1] in finding.message


def test_unroll_pragmas_are_fine():
    body = ("#pragma unroll\nfor (int i = 0; i < 4; ++i) x[i] = 0;\n"
            "#pragma unroll 2\nfor (;;) {}\n"
            "#pragma nounroll\nwhile (1) {}")
    assert check(kernel(body)).ok


@pytest.mark.parametrize("source, line", [
    ("#define HEADER <stdio.h>\n#include HEADER\n" + kernel(), 2),
    ("#define CALL(a, b) a##b(x)\n" + kernel(), 1),
])
def test_preprocessor_tricks(source, line):
    (finding,) = only(check(source), Rule.PREPROCESSOR_TRICK)
    assert finding.line == line


def test_pragma_operator_is_a_preprocessor_trick():
    # `_Pragma(...)` cannot be parsed as a statement, so it is a syntax error too.
    assert Rule.PREPROCESSOR_TRICK in rules(check('#define NO_OPT _Pragma("GCC optimize(0)")\n' + kernel()))


def test_macros_cannot_hide_forbidden_code():
    source = ("#define ALLOC(p) cudaMalloc(&p, 16)\n"
              "#define STATE __device__ int counter;\n"
              '#define NOW(t) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t))\n'
              + kernel())
    report = check(source)
    assert {(f.rule, f.line) for f in report.findings} == {
        (Rule.HOST_RUNTIME, 1), (Rule.DEVICE_STATE, 2), (Rule.TIMER, 3)}
    assert all("in macro" in f.message for f in report.findings)


def test_comments_are_not_code():
    assert check(kernel("// cudaMalloc, cublasSgemm, %globaltimer, child<<<1, 1>>>()")).ok


def test_report_round_trip():
    report = check("#include <stdio.h>\n" + kernel("x[0] = ;"))
    data = report.to_dict()
    assert data["ok"] is False and data["findings"][0] == {"rule": "syntax", "message": report.findings[0].message,
                                                           "line": 3}
    assert StaticReport.from_dict(data) == report
    assert StaticReport.from_dict({"ok": True, "findings": []}).ok


@pytest.mark.parametrize("data", [
    {"findings": [{"rule": "no_such_rule", "message": "m", "line": 1}]},
    {"findings": "none"},
    {"ok": True, "findings": [{"rule": "syntax", "message": "m", "line": 1}]},
])
def test_report_from_bad_dict(data):
    with pytest.raises(DocumentError):
        StaticReport.from_dict(data)
