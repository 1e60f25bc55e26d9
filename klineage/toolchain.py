"""Finding the CUDA tools: nvcc, cuobjdump, nvdisasm (for SASS) and a C++ demangler.

Each tool is looked up in order: its KLINEAGE_<TOOL> variable, PATH, $CUDA_HOME/bin,
/usr/local/cuda/bin, then the bin folders of NVIDIA's PyPI wheels (site-packages/nvidia/*/bin).
A system toolkit therefore wins over the wheels. The cuobjdump found may come from another CUDA
release than nvcc; it reads older cubins fine.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klineage.errors import ToolchainError

SYSTEM_DIRS = ("/usr/local/cuda/bin",)
# What to install when a tool is missing, for a machine without a CUDA toolkit.
INSTALL_HINT = {
    "nvcc": "pip install nvidia-cuda-nvcc nvidia-cuda-crt nvidia-cuda-runtime (or pip install 'klineage[cuda-pypi]')",
    "cuobjdump": "pip install nvidia-cuda-cuobjdump (or pip install 'klineage[cuda-pypi]')",
    "nvdisasm": "pip install nvidia-cuda-nvdisasm",
}
_ENV_NAME = {"nvcc": "KLINEAGE_NVCC", "cuobjdump": "KLINEAGE_CUOBJDUMP", "nvdisasm": "KLINEAGE_NVDISASM",
             "cu++filt": "KLINEAGE_CUXXFILT"}
_VERSION = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")
TOOL_TIMEOUT_S = 60


@dataclass(frozen=True)
class Toolchain:
    nvcc: str
    nvcc_version: str  # e.g. "13.0.88"
    cuobjdump: str
    cuobjdump_version: str
    nvdisasm: str | None = None  # cuobjdump -sass runs it; only SASS features need it
    demangler: str | None = None  # cu++filt, else binutils c++filt (same Itanium mangling)

    @property
    def key(self) -> str:
        """The compiler release, e.g. "cuda-13.0": what a cached compile depends on."""
        major, minor = self.nvcc_version.split(".")[:2]
        return f"cuda-{major}.{minor}"

    def environment(self, workdir: Path) -> dict[str, str]:
        """A minimal environment for running the tools: no NVCC_APPEND_FLAGS and the like can
        change a build, and temporary files stay in the private work folder."""
        tool_dirs = [str(Path(p).parent) for p in (self.nvcc, self.cuobjdump, self.nvdisasm) if p]
        # The host compiler (g++) comes from the caller's PATH.
        path = os.pathsep.join(dict.fromkeys(tool_dirs + os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)))
        env = {"PATH": path, "HOME": str(workdir), "TMPDIR": str(workdir), "LC_ALL": "C"}
        if self.nvdisasm:
            env["NVDISASM_PATH"] = str(Path(self.nvdisasm).parent)
        return env

    def require_nvdisasm(self) -> str:
        if not self.nvdisasm:
            raise ToolchainError(f"nvdisasm not found (cuobjdump -sass needs it): {INSTALL_HINT['nvdisasm']}, "
                                 f"or set {_ENV_NAME['nvdisasm']}")
        return self.nvdisasm

    def to_dict(self) -> dict[str, Any]:
        return {"nvcc": self.nvcc, "nvcc_version": self.nvcc_version, "cuobjdump": self.cuobjdump,
                "cuobjdump_version": self.cuobjdump_version, "nvdisasm": self.nvdisasm,
                "demangler": self.demangler, "key": self.key}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Toolchain:
        return cls(nvcc=data["nvcc"], nvcc_version=data["nvcc_version"], cuobjdump=data["cuobjdump"],
                   cuobjdump_version=data["cuobjdump_version"], nvdisasm=data.get("nvdisasm"),
                   demangler=data.get("demangler"))


@functools.cache
def find_toolchain() -> Toolchain:
    """The toolchain of this process's environment, found once."""
    return discover(os.environ)


def discover(env: Mapping[str, str], system_dirs: Iterable[str] = SYSTEM_DIRS,
             site_dirs: Iterable[str] | None = None) -> Toolchain:
    """Find every tool; ToolchainError names a missing required tool and how to install it."""
    system_dirs, site_dirs = tuple(system_dirs), tuple(sys.path if site_dirs is None else site_dirs)

    def find(tool: str) -> str | None:
        return locate(tool, env, system_dirs, site_dirs)

    nvcc, cuobjdump = find("nvcc"), find("cuobjdump")
    for tool, path in (("nvcc", nvcc), ("cuobjdump", cuobjdump)):
        if path is None:
            raise ToolchainError(f"{tool} not found on PATH, in $CUDA_HOME/bin, {', '.join(system_dirs) or '-'} "
                                 f"or the Python packages: {INSTALL_HINT[tool]}, or set {_ENV_NAME[tool]}")
    return Toolchain(nvcc=nvcc, nvcc_version=tool_version(nvcc), cuobjdump=cuobjdump,
                     cuobjdump_version=tool_version(cuobjdump), nvdisasm=find("nvdisasm"),
                     demangler=find("cu++filt") or shutil.which("c++filt", path=env.get("PATH", "")))


def locate(tool: str, env: Mapping[str, str], system_dirs: Iterable[str] = SYSTEM_DIRS,
           site_dirs: Iterable[str] = ()) -> str | None:
    """The first executable `tool` in search order, or None. A KLINEAGE_<TOOL> variable that
    names something unusable is an error rather than silently skipped."""
    override = env.get(_ENV_NAME[tool])
    if override:
        if not _executable(Path(override)):
            raise ToolchainError(f"{_ENV_NAME[tool]}={override} is not an executable file")
        return str(Path(override).absolute())
    for candidate in _candidates(tool, env, system_dirs, site_dirs):
        if _executable(candidate):
            return str(candidate)
    return None


def _candidates(tool: str, env: Mapping[str, str], system_dirs: Iterable[str],
                site_dirs: Iterable[str]) -> Iterator[Path]:
    on_path = shutil.which(tool, path=env.get("PATH", ""))
    if on_path:
        yield Path(on_path)
    if env.get("CUDA_HOME"):
        yield Path(env["CUDA_HOME"]) / "bin" / tool
    for folder in system_dirs:
        yield Path(folder) / tool
    for site in site_dirs:
        # Wheel layouts: nvidia/cu13/bin/<tool> (CUDA 13), nvidia/cuda_nvcc/bin/<tool> (CUDA 12).
        yield from sorted(Path(site).glob(f"nvidia/*/bin/{tool}"), key=_newest_first)


def _newest_first(path: Path) -> tuple[int, str]:
    folder = path.parent.parent.name
    major = int(folder[2:]) if re.fullmatch(r"cu\d+", folder) else 0
    return -major, folder


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def tool_version(path: str) -> str:
    match = _VERSION.search(run_tool([path, "--version"]))
    if not match:
        raise ToolchainError(f"{path} --version does not report a CUDA release")
    return match.group(3)


def run_tool(args: list[str], env: Mapping[str, str] | None = None, cwd: Path | None = None,
             timeout_s: float = TOOL_TIMEOUT_S) -> str:
    """Run a quick tool (cuobjdump, a demangler) and return its stdout; failures are ToolchainError."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, errors="replace", env=env, cwd=cwd,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"{Path(args[0]).name} could not run: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()[-2000:]
        raise ToolchainError(f"{Path(args[0]).name} {' '.join(args[1:2])} failed ({done.returncode}): {detail}")
    return done.stdout


def demangle(names: Iterable[str], toolchain: Toolchain) -> dict[str, str]:
    """Mangled -> demangled; names stay as they are without a demangler or when not mangled."""
    names = sorted(set(names))
    mangled = [n for n in names if n.startswith("_Z")]
    if not mangled or not toolchain.demangler:
        return {n: n for n in names}
    lines = run_tool([toolchain.demangler, *mangled]).splitlines()
    if len(lines) != len(mangled):
        raise ToolchainError(f"{toolchain.demangler} gave {len(lines)} names for {len(mangled)}")
    result = {n: n for n in names}
    result.update(zip(mangled, (line.strip() for line in lines)))
    return result
