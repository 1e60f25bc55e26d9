"""Finding the CUDA tools, with the real tools of this machine."""

import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from klineage.errors import ToolchainError
from klineage.toolchain import Toolchain, demangle, discover, find_toolchain, locate


@pytest.fixture(scope="module")
def toolchain() -> Toolchain:
    return find_toolchain()


def _fake_tool(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_finds_working_tools(toolchain):
    for tool in (toolchain.nvcc, toolchain.cuobjdump):
        assert os.access(tool, os.X_OK)
    assert re.fullmatch(r"\d+\.\d+\.\d+", toolchain.nvcc_version)
    assert re.fullmatch(r"\d+\.\d+\.\d+", toolchain.cuobjdump_version)
    major, minor = toolchain.nvcc_version.split(".")[:2]
    assert toolchain.key == f"cuda-{major}.{minor}"


def test_system_nvcc_is_preferred(toolchain):
    on_path = shutil.which("nvcc")
    if on_path is None:
        pytest.skip("no nvcc on PATH")
    assert toolchain.nvcc == on_path


def test_find_toolchain_is_cached(toolchain):
    assert find_toolchain() is toolchain


def test_round_trip(toolchain):
    data = toolchain.to_dict()
    assert data["key"] == toolchain.key
    assert Toolchain.from_dict(data) == toolchain


def test_env_variable_wins(toolchain):
    found = discover({"KLINEAGE_NVCC": toolchain.nvcc, "KLINEAGE_CUOBJDUMP": toolchain.cuobjdump, "PATH": ""},
                     system_dirs=(), site_dirs=())
    assert found.nvcc == toolchain.nvcc
    assert found.cuobjdump == toolchain.cuobjdump


def test_env_variable_naming_nothing_is_an_error(tmp_path):
    with pytest.raises(ToolchainError, match="KLINEAGE_NVCC=.*not an executable"):
        locate("nvcc", {"KLINEAGE_NVCC": str(tmp_path / "missing-nvcc")})


def test_missing_nvcc_says_what_to_install(tmp_path):
    with pytest.raises(ToolchainError, match=r"nvcc not found.*pip install nvidia-cuda-nvcc.*klineage\[cuda-pypi\]"):
        discover({"PATH": ""}, system_dirs=(), site_dirs=[str(tmp_path)])


def test_missing_cuobjdump_says_what_to_install(toolchain, tmp_path):
    with pytest.raises(ToolchainError, match="cuobjdump not found.*pip install nvidia-cuda-cuobjdump"):
        discover({"KLINEAGE_NVCC": toolchain.nvcc, "PATH": ""}, system_dirs=(), site_dirs=[str(tmp_path)])


def test_cuda_home_comes_before_system_dirs(tmp_path):
    home_nvcc = _fake_tool(tmp_path / "home" / "bin" / "nvcc")
    system_nvcc = _fake_tool(tmp_path / "system" / "nvcc")
    env = {"PATH": "", "CUDA_HOME": str(tmp_path / "home")}
    assert locate("nvcc", env, system_dirs=[str(system_nvcc.parent)]) == str(home_nvcc)
    assert locate("nvcc", {"PATH": ""}, system_dirs=[str(system_nvcc.parent)]) == str(system_nvcc)


def test_wheel_layouts_newest_first(tmp_path):
    _fake_tool(tmp_path / "nvidia" / "cu12" / "bin" / "nvcc")
    newest = _fake_tool(tmp_path / "nvidia" / "cu13" / "bin" / "nvcc")
    (tmp_path / "nvidia" / "cu14" / "bin").mkdir(parents=True)
    (tmp_path / "nvidia" / "cu14" / "bin" / "nvcc").write_text("not executable")
    assert locate("nvcc", {"PATH": ""}, system_dirs=(), site_dirs=[str(tmp_path)]) == str(newest)


def test_finds_the_installed_cuobjdump_wheel():
    nvidia = pytest.importorskip("nvidia")
    site = Path(next(iter(nvidia.__path__))).parent
    if not list(site.glob("nvidia/*/bin/cuobjdump")):
        pytest.skip("nvidia-cuda-cuobjdump wheel not installed")
    found = locate("cuobjdump", {"PATH": ""}, system_dirs=(), site_dirs=[str(site)])
    assert found is not None and "/nvidia/" in found and found.endswith("/bin/cuobjdump")


def test_environment_is_minimal(toolchain, tmp_path, monkeypatch):
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DLEAKED")
    env = toolchain.environment(tmp_path)
    assert "NVCC_APPEND_FLAGS" not in env
    assert env["TMPDIR"] == str(tmp_path)
    assert str(Path(toolchain.nvcc).parent) in env["PATH"].split(os.pathsep)


def test_demangle(toolchain):
    if toolchain.demangler is None:
        pytest.skip("no cu++filt or c++filt")
    names = demangle(["_Z1kILi128EEvPf", "_ZN3ops4fillIfLi4EEEvPT_S1_", "copy4"], toolchain)
    assert names == {"_Z1kILi128EEvPf": "void k<128>(float*)",
                     "_ZN3ops4fillIfLi4EEEvPT_S1_": "void ops::fill<float, 4>(float*, float)",
                     "copy4": "copy4"}


def test_missing_nvdisasm_says_what_to_install(toolchain):
    without = Toolchain.from_dict(toolchain.to_dict() | {"nvdisasm": None})
    with pytest.raises(ToolchainError, match="pip install nvidia-cuda-nvdisasm"):
        without.require_nvdisasm()
