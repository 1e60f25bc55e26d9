"""Compiling kernel states with the real nvcc: results, entries, resources and the cache."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from klineage.errors import DocumentError
from klineage.gate import compile as compile_module
from klineage.gate.compile import (
    CompileResult,
    CompileStatus,
    compile_kernel,
    nvcc_flags,
    resolve_entry,
)
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan

KERNELS = Path(__file__).parent / "fixtures" / "kernels"


def kernel(file: str, entry: str, arch: str = "sm_90", flags: tuple[str, ...] = ()) -> KernelState:
    plan = LaunchPlan.from_toml(
        f'name = "{Path(file).stem}"\nproblem = "test"\narch = "{arch}"\nnvcc_flags = {json.dumps(list(flags))}\n'
        f'[[launch]]\nentry = "{entry}"\ngrid = 1\nblock = 32\n')
    return KernelState((KERNELS / file).read_text(), plan)


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    # One folder for the whole session, shared by every test module that compiles.
    path = tmp_path_factory.getbasetemp() / "compile-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module")
def copy(cache) -> CompileResult:
    return compile_kernel(kernel("copy.cu", "copy_float4"), cache)


def test_sm_90_builds_both_targets(copy):
    assert copy.ok and copy.status is CompileStatus.OK
    assert copy.arch == "sm_90"
    assert copy.targets == ("sm_90", "sm_90a")
    for arch in copy.targets:
        data = copy.cubin_bytes(arch)
        assert data.startswith(b"\x7fELF")
        assert Path(copy.cubin_paths[arch]).read_bytes() == data
    assert copy.cubin_bytes() == copy.cubin_bytes("sm_90")
    assert copy.toolchain.startswith("cuda-")
    assert any("-gencode=arch=compute_90a,code=sm_90a" in line for line in copy.log.splitlines())


def test_sm_90a_builds_only_sm_90a(cache):
    result = compile_kernel(kernel("copy.cu", "copy_float4", arch="sm_90a"), cache)
    assert result.ok and result.targets == ("sm_90a",)
    assert set(result.cubin_sha256) == {"sm_90a"}
    with pytest.raises(DocumentError, match="no cubin for sm_90"):
        result.cubin_bytes("sm_90")


def test_entries_and_resources(copy):
    assert copy.entries == {"copy_float4": "copy_float4", "twice_double": "twice_double"}
    for arch in copy.targets:
        res = copy.resources[arch]["copy_float4"]
        assert 0 < res.registers <= 255
        assert res.stack_bytes == 0 and not res.spills
        assert res.shared_bytes == 0
        assert res.param_cmem_bytes > 0  # the parameters live in constant bank 0
    assert copy.resources_for("copy_float4") == copy.resources["sm_90"]["copy_float4"]


def test_local_array_takes_a_stack_frame(cache):
    result = compile_kernel(kernel("local_array.cu", "local_array", flags=("-maxrregcount=32",)), cache)
    assert result.ok
    res = result.resources_for("local_array")
    assert res.registers <= 32
    assert res.stack_bytes >= 1024  # float a[256]
    assert res.user_cmem_bytes >= 1024  # __constant__ float kScale[256]
    assert "-maxrregcount=32" in result.flags


def test_shared_memory_and_barriers(cache):
    result = compile_kernel(kernel("misc_ops.cu", "histogram"), cache)
    res = result.resources_for("histogram")
    assert res.shared_bytes == 64 * 4 == result.static_shared("histogram")
    assert res.barriers >= 1


def test_compile_error_is_a_result(cache):
    state = kernel("broken.cu", "broken")
    result = compile_kernel(state, cache)
    assert not result.ok and result.status is CompileStatus.ERROR
    assert 'kernel.cu(3): error: identifier "undefined_name" is undefined' in result.log
    assert result.log.count("undefined_name\" is undefined") == 1  # the same error is not repeated per target
    assert result.entries == {} and result.cubin_sha256 == {}
    with pytest.raises(DocumentError, match="no cubin"):
        result.cubin_bytes()
    again = compile_kernel(state, cache)  # deterministic, so cached too
    assert again.cached and again.log == result.log


def test_arch_specific_code_fails_on_plain_sm_90():
    result = compile_kernel(kernel("hopper.cu", "wgmma_tile", arch="sm_90"))
    assert result.status is CompileStatus.ERROR
    assert "compute_90,code=sm_90\n" in result.log and "not supported on .target 'sm_90'" in result.log
    assert "klineage-nvcc" not in result.log  # the private work folder is not part of the log


def test_template_and_overloaded_entries(cache):
    result = compile_kernel(kernel("templates.cu", "scale<128>"), cache)
    assert result.ok
    assert resolve_entry(result, "scale<128>") == "_Z5scaleILi128EEvPff"
    assert resolve_entry(result, "scale< 128 >") == "_Z5scaleILi128EEvPff"
    assert resolve_entry(result, "void scale<128>(float*, float)") == "_Z5scaleILi128EEvPff"
    assert resolve_entry(result, "scale<64>") == "_Z5scaleILi64EEvPff"
    assert resolve_entry(result, "ops::fill<float,4>") == "_ZN3ops4fillIfLi4EEEvPT_S1_"
    assert resolve_entry(result, "_Z5scaleILi64EEvPff") == "_Z5scaleILi64EEvPff"
    assert resolve_entry(result, "twice(double*)") == "_Z5twicePd"
    with pytest.raises(DocumentError, match="ambiguous.*twice\\(double\\*\\).*twice\\(float\\*\\)"):
        resolve_entry(result, "twice")
    with pytest.raises(DocumentError, match=r"'scale<32>'.*available:.*void scale<128>\(float\*, float\)"):
        resolve_entry(result, "scale<32>")
    assert set(result.resources["sm_90"]) == set(result.entries)


def test_cache_hit(cache, copy):
    state = kernel("copy.cu", "copy_float4")
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        hit = compile_kernel(state, cache)
        timings.append(time.perf_counter() - started)
    assert min(timings) < 0.02
    assert hit.cached
    assert hit.cubin_sha256 == copy.cubin_sha256 and hit.entries == copy.entries
    assert hit.resources == copy.resources
    assert hit.cubin_bytes("sm_90a") == copy.cubin_bytes("sm_90a")
    folder = Path(hit.cubin_paths["sm_90"]).parent
    assert folder == cache / "compile" / hit.key[:2] / hit.key
    assert sorted(p.name for p in folder.iterdir()) == ["result.json", "sm_90.cubin", "sm_90a.cubin"]
    assert not list(folder.parent.glob(".tmp-*"))


def test_the_key_covers_source_flags_and_arch(copy, cache):
    base = kernel("copy.cu", "copy_float4")
    assert compile_kernel(base.with_source(base.source + "\n\n   \n"), cache).key == copy.key  # trailing blanks
    assert compile_kernel(base.with_source(base.source + "// note\n"), cache).key != copy.key
    assert compile_kernel(kernel("copy.cu", "copy_float4", flags=("-O2",)), cache).key != copy.key
    assert compile_kernel(kernel("copy.cu", "copy_float4", arch="sm_90a"), cache).key != copy.key


def test_plan_flags():
    assert nvcc_flags(kernel("copy.cu", "copy_float4").plan)[:6] == (
        "-cubin", "-std=c++17", "-lineinfo", "-Xptxas", "-v", "-O3")
    flags = nvcc_flags(kernel("copy.cu", "copy_float4", flags=("-O2", "--use_fast_math")).plan)
    assert "-O3" not in flags and flags[-2:] == ("-O2", "--use_fast_math")


def test_concurrent_workers_share_one_entry(tmp_path):
    state = kernel("warp_sum.cu", "warp_sum", arch="sm_90a")
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: compile_kernel(state, tmp_path), range(2)))
    assert all(r.ok for r in results)
    assert results[0].cubin_sha256 == results[1].cubin_sha256
    assert results[0].cubin_paths == results[1].cubin_paths
    (shard,) = (tmp_path / "compile").iterdir()
    assert [p.name for p in shard.iterdir()] == [results[0].key]
    assert compile_kernel(state, tmp_path).cached


def test_threads_of_one_process_run_nvcc_once_for_one_entry(tmp_path, monkeypatch):
    """A walk's gate that needs a state the background warming is compiling waits for that compile
    instead of running a second nvcc beside it."""
    runs = []
    real = compile_module._compile
    monkeypatch.setattr(compile_module, "_compile", lambda *args: runs.append(args[3]) or real(*args))
    state = kernel("warp_sum.cu", "warp_sum", arch="sm_90a")
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: compile_kernel(state, tmp_path), range(3)))
    assert len(runs) == 1 and all(r.ok for r in results)
    assert sum(not r.cached for r in results) == 1, "the threads that waited loaded the stored entry"


def test_without_cache_keeps_cubins_in_memory_and_is_reproducible():
    state = kernel("warp_sum.cu", "warp_sum", arch="sm_90a")
    result = compile_kernel(state)
    assert result.ok and not result.cached and result.cubin_paths == {}
    assert result.cubin_bytes().startswith(b"\x7fELF")
    assert compile_kernel(state).cubin_sha256 == result.cubin_sha256  # -lineinfo paths included
    with pytest.raises(DocumentError, match="not kept"):
        CompileResult.from_dict(result.to_dict()).cubin_bytes()


def test_nvcc_runs_without_the_callers_environment(monkeypatch):
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DLEAKED_FROM_ENVIRONMENT")
    source = ('#ifdef LEAKED_FROM_ENVIRONMENT\n#error the environment reached nvcc\n#endif\n'
              'extern "C" __global__ void k(int* x) { x[0] = 1; }\n')
    result = compile_kernel(kernel("copy.cu", "k", arch="sm_90a").with_source(source))
    assert result.ok, result.log


def test_timeout_is_reported_and_not_cached(cache):
    state = kernel("templates.cu", "scale<64>", flags=("-DTIMEOUT_CASE",))
    result = compile_kernel(state, cache, timeout_s=0.001)
    assert result.status is CompileStatus.TIMEOUT
    assert "ran past" in result.log
    assert not (cache / "compile" / result.key[:2] / result.key).exists()


def test_log_is_capped(cache):
    lines = "".join(f"  float v{i} = undefined_{i}_{'x' * 300};\n" for i in range(200))
    state = kernel("broken.cu", "broken").with_source(f'extern "C" __global__ void broken() {{\n{lines}}}\n')
    result = compile_kernel(state, cache)
    assert not result.ok
    assert len(result.log) < 21_000 and "characters cut" in result.log
    assert "undefined_0" in result.log  # the first errors are kept


def test_round_trip(copy):
    data = json.loads(json.dumps(copy.to_dict()))
    assert data["ok"] is True and data["status"] == "ok"
    assert CompileResult.from_dict(data) == copy
    with pytest.raises(DocumentError, match="missing 'entries'"):
        CompileResult.from_dict({k: v for k, v in data.items() if k != "entries"})
    with pytest.raises(DocumentError, match="malformed"):
        CompileResult.from_dict(data | {"status": "maybe"})
    with pytest.raises(DocumentError, match=r"resources\.sm_90\.copy_float4: needs exactly"):
        CompileResult.from_dict(data | {"resources": {"sm_90": {"copy_float4": {"registers": 1}}}})


def test_source_file_name_comes_from_the_plan(cache):
    plan = LaunchPlan.from_toml('name = "n"\nproblem = "p"\nsource = "gemm.cuh"\narch = "sm_90a"\n'
                                '[[launch]]\nentry = "broken"\ngrid = 1\nblock = 1\n')
    result = compile_kernel(KernelState((KERNELS / "broken.cu").read_text(), plan), cache)
    assert "gemm.cuh(3): error" in result.log
