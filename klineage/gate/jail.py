"""The bubblewrap view a sandboxed process runs in (docs/sandbox.md).

A new user namespace (uid 65534, no capabilities, no further namespaces), new PID, IPC, UTS,
cgroup and network namespaces (no network at all, loopback included), a fresh /proc, a minimal
/dev, a private /tmp, and read-only binds of only what the process needs: the system's programs and
libraries, a few files of /etc, the runner interpreter's prefixes and import path, the repository's
code. The data dir, the caches, the recorded store and any SQLite database are masked where they
lie inside a bound tree. Only the job's scratch folder is writable. GPU device nodes and /sys are
bound for GPU work only.
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import subprocess
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from klineage import config
from klineage.errors import KLineageError

log = logging.getLogger("klineage.sandbox")

SANDBOX_UID = 65534  # nobody: what the process is inside its user namespace
SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read from /etc: the loader's cache, symlinked tools (cc, python3), name service rules.
# The rest of /etc (shadow, host keys, service credentials) stays out.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "nsswitch.conf", "localtime",
             "timezone", "os-release", "debian_version", "mime.types")
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`) "
                "or point KLINEAGE_BWRAP at a bwrap binary; on a developer's own machine only, "
                f"{config.UNSAFE_NO_SANDBOX}=1 runs untrusted code without a sandbox")


class SandboxUnavailable(KLineageError):
    """Untrusted code was about to run and no sandbox can hold it."""


class Access(str, Enum):
    CPU = "cpu"  # imports a problem file on the CPU (the probe): no device nodes
    GPU = "gpu"  # runs kernels: the NVIDIA device nodes and /sys
    COMPILER = "compiler"  # nvcc on untrusted source: the CUDA toolkit, nothing of the interpreter


@dataclass(frozen=True)
class Jail:
    access: Access
    workdir: Path  # the job's scratch folder: writable, and the working directory
    python: str | None = None  # the interpreter whose prefixes and import path are bound
    readable: tuple[Path, ...] = ()  # more read-only trees (the CUDA toolkit, compute-sanitizer)
    writable: tuple[Path, ...] = ()  # more writable folders of this job (a sanitizer's log)

    def __post_init__(self) -> None:
        for path in (self.workdir, *self.readable, *self.writable):
            if not Path(path).is_absolute():
                raise ValueError(f"sandbox paths must be absolute: {path}")

    def command(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str], str]:
        """`argv` and its environment wrapped in bwrap, the environment bwrap itself runs with, and
        what isolates it in words; the first two unchanged when the sandbox is disabled."""
        binary = launcher()
        if binary is None:
            return argv, env, f"NO SANDBOX ({config.UNSAFE_NO_SANDBOX}=1)"
        args = [binary, *_namespaces(), *_system()]
        args += ["--tmpfs", "/tmp"]  # before any bind below /tmp (a scratch folder, a carried site dir)
        readable = _outermost([*(runner_paths(self.python) if self.python else ()), *self.readable])
        for path in readable:
            args += ["--ro-bind", path, path]
        args += _masks(readable)
        scratch = [str(self.workdir), *map(str, self.writable)]
        for path in _outermost(scratch):
            args += ["--bind", path, path]
        args += ["--proc", "/proc", "--dev", "/dev"]
        if self.access is Access.GPU:
            args += ["--ro-bind", "/sys", "/sys"]
            for node in sorted(glob.glob("/dev/nvidia*")):
                args += ["--dev-bind", node, node]
        args += ["--remount-ro", "/", "--chdir", str(self.workdir), "--clearenv"]  # the root's own tmpfs too
        # Temporary files go to the sandbox's own /tmp: every sandboxed process is pid 2 in its namespace,
        # so two nvcc sharing a folder would write the same tmpxft_<pid>_* files over each other.
        inner = {**env, "TMPDIR": "/tmp", "USER": "nobody", "LOGNAME": "nobody"}
        for key, value in sorted(inner.items()):
            args += ["--setenv", key, value]
        return [*args, "--", *argv], _launcher_env(binary), f"bubblewrap {shown_launcher(binary)} ({self.access.value})"


def shown_launcher(binary: str) -> str:
    """The launcher as verdicts name it: a binary carried in the checkout (a GPU host's `.hostbin/bwrap`)
    relative to it, so recorded verdicts do not carry one machine's checkout path; a system one as it is."""
    path = Path(binary).resolve()
    return str(path.relative_to(config.REPO_ROOT)) if path.is_relative_to(config.REPO_ROOT) else binary


def launcher() -> str | None:
    """The bwrap to start untrusted code with; None when the sandbox is disabled (with a warning each
    time); SandboxUnavailable when it is missing or cannot make a sandbox on this host."""
    if config.sandbox_disabled():
        log.warning("%s=1: running untrusted code WITHOUT a sandbox (problem files and kernels can read "
                    "and change everything this user can); never set it on a shared or public instance",
                    config.UNSAFE_NO_SANDBOX)
        return None
    binary = config.bwrap_path()
    if binary is None:
        raise SandboxUnavailable(f"untrusted code runs only inside bubblewrap, which is not installed: {INSTALL_HINT}")
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise SandboxUnavailable(f"KLINEAGE_BWRAP names {binary!r}, which is not an executable file: {INSTALL_HINT}")
    return _checked(binary)


@functools.cache
def _checked(binary: str) -> str:
    """Start one empty sandbox per process and binary, so that a host that forbids user namespaces
    says so plainly instead of every job failing as a crash."""
    args = [binary, *_namespaces(), *_system(), "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        done = subprocess.run(args, env=_launcher_env(binary), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"bubblewrap ({binary}) did not start: {exc}") from None
    if done.returncode != 0:
        raise SandboxUnavailable(f"bubblewrap ({binary}) cannot make a sandbox on this host (user namespaces "
                                 f"disabled?): {done.stderr.strip()[-500:]}")
    log.info("sandbox: %s", binary)
    return binary


def _launcher_env(binary: str) -> dict[str, str]:
    """bwrap's own environment: its folder as the library path when it was carried beside its libraries."""
    folder = Path(binary).parent
    carried = any(folder.glob("lib*.so*"))
    return {"LD_LIBRARY_PATH": str(folder)} if carried else {}


def _namespaces() -> list[str]:
    return ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--disable-userns", "--hostname", "sandbox", "--die-with-parent", "--new-session"]


@functools.cache
def _system() -> tuple[str, ...]:
    args: list[str] = []
    for root in SYSTEM_ROOTS:
        if os.path.islink(root):  # merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(root), root]
        elif os.path.isdir(root):
            args += ["--ro-bind", root, root]
    for name in ETC_FILES:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return tuple(args)


@functools.cache
def runner_paths(python: str) -> tuple[str, ...]:
    """Trees the interpreter needs: its prefixes, its import path (site-packages, .pth entries,
    PYTHONPATH) and the repository; asked of the interpreter itself once per process."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": python_path()}
    code = ("import json, sys; print(json.dumps([sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, "
            "sys.base_exec_prefix, *sys.path]))")
    done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd="/")
    if done.returncode != 0:
        raise SandboxUnavailable(f"the runner interpreter {python} did not start: {done.stderr.strip()[-500:]}")
    entries = [Path(python).parent, Path(python).resolve().parent, config.REPO_ROOT]
    entries += [Path(p) for p in json.loads(done.stdout.splitlines()[-1]) if p and p != "/"]
    return tuple(str(p) for p in entries if p.is_absolute() and p.exists())


def toolkit_trees(tool: str) -> tuple[Path, ...]:
    """The CUDA toolkit a tool (nvcc, compute-sanitizer) belongs to: its folder's parent, and for the
    pip layout (site-packages/nvidia/cuda_nvcc/bin/nvcc) every nvidia package beside it."""
    trees = []
    for path in dict.fromkeys((Path(tool).absolute(), Path(tool).resolve())):
        root = path.parent.parent
        trees.append(root.parent if root.parent.name == "nvidia" else root)
    return tuple(trees)


def python_path() -> str:
    """The runner's PYTHONPATH: the repository first, then the caller's."""
    entries = [str(config.REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(entries)


def _outermost(paths: list[str | Path]) -> list[str]:
    """Absolute paths with those inside another (or inside a system root) left out, in order."""
    kept: list[str] = []
    for path in sorted({os.path.normpath(str(p)) for p in paths}, key=len):
        if not any(_inside(path, root) for root in [*kept, *SYSTEM_ROOTS]):
            kept.append(path)
    return kept


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _masks(bound: list[str]) -> list[str]:
    """Empty folders (and /dev/null for files) over every store of this instance inside a bound tree."""
    stores = [config.REPO_ROOT / "var", config.data_dir(), config.cache_dir(), config.recorded_dir()]
    database = os.environ.get("DATABASE_URL", "").strip()
    if database.startswith("sqlite:///"):
        path = database.removeprefix("sqlite:///").split("?")[0]
        if path.startswith("/"):  # a relative one lies in the data dir
            stores += [Path(path + suffix) for suffix in ("", "-wal", "-shm", "-journal")]
    args: list[str] = []
    for store in dict.fromkeys(stores):
        if not store.exists():
            continue
        for where in dict.fromkeys((str(store), str(store.resolve()))):
            if any(_inside(where, root) for root in bound):
                args += ["--tmpfs", where] if store.is_dir() else ["--ro-bind", "/dev/null", where]
    return args
