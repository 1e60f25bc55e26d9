"""Compiling a kernel state to cubins with nvcc, with each entry's resources and symbols.

A compile error is a result (status ERROR with nvcc's log), not an exception: the gate reports it.
Results are cached by content in `cache_dir/compile/<ab>/<key>/` (one `<arch>.cubin` per target
plus `result.json`). A result is written to a temporary folder and renamed into place, so
concurrent workers see a whole result or none.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from klineage import config
from klineage.entries import normalized, strip_bracketed
from klineage.errors import DocumentError, ToolchainError
from klineage.fingerprint import normalize_source, sha256_bytes, sha256_json
from klineage.gate.jail import Access, Jail, toolkit_trees
from klineage.gate.nvcc_flags import refusal, refused_flags
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.toolchain import Toolchain, demangle, find_toolchain, run_tool

# A plan for sm_90 also builds sm_90a, so the arch-specific build can be compared with it.
ARCH_TARGETS = {"sm_90": ("sm_90", "sm_90a"), "sm_90a": ("sm_90a",)}
BASE_FLAGS = ("-cubin", "-std=c++17", "-lineinfo", "-Xptxas", "-v")
DEFAULT_OPT = "-O3"  # left out when the plan picks its own -O level
LOG_LIMIT = 20_000  # characters of nvcc output kept in a result
PARSE_LIMIT = 4_000_000  # bytes of nvcc output read at all, whatever it prints
RESULT_FILE = "result.json"
RESULT_VERSION = 2


class CompileStatus(str, Enum):
    OK = "ok"
    ERROR = "error"  # nvcc rejected the source
    TIMEOUT = "timeout"  # nvcc ran past the limit; never cached, since it depends on the machine


@dataclass(frozen=True)
class Resources:
    """What ptxas reported for one entry on one target, plus its constant banks."""

    registers: int
    barriers: int
    stack_bytes: int  # stack frame per thread (local arrays and spills)
    spill_store_bytes: int
    spill_load_bytes: int
    shared_bytes: int  # static __shared__
    param_cmem_bytes: int  # constant bank 0: the kernel's parameters
    user_cmem_bytes: int  # the module's __constant__ data, shared by all its entries

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Any, where: str = "resources") -> Resources:
        if not isinstance(data, dict) or set(data) != set(cls.__dataclass_fields__):
            raise DocumentError(where, f"needs exactly {sorted(cls.__dataclass_fields__)}")
        return cls(**{k: int(v) for k, v in data.items()})


@dataclass(frozen=True)
class CompileResult:
    status: CompileStatus
    arch: str  # the plan's arch: the cubin the gate runs
    targets: tuple[str, ...]
    flags: tuple[str, ...]
    key: str  # the cache key: source, flags, targets and toolchain
    toolchain: str  # Toolchain.key, e.g. "cuda-13.0"
    log: str
    seconds: float  # how long nvcc took when the result was made
    cached: bool = False
    cubin_sha256: dict[str, str] = field(default_factory=dict)  # arch -> sha256
    cubin_paths: dict[str, str] = field(default_factory=dict)  # arch -> cached file (empty without a cache)
    entries: dict[str, str] = field(default_factory=dict)  # demangled -> mangled __global__ symbol
    resources: dict[str, dict[str, Resources]] = field(default_factory=dict)  # arch -> demangled -> ...
    cubins: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)  # in memory, fresh results

    @property
    def ok(self) -> bool:
        return self.status is CompileStatus.OK

    def cubin_bytes(self, arch: str | None = None) -> bytes:
        arch = arch or self.arch
        if arch not in self.cubin_sha256:
            raise DocumentError("compile result", f"no cubin for {arch} ({self.status.value}; "
                                                  f"cubins: {', '.join(self.cubin_sha256) or 'none'})")
        if arch in self.cubins:
            return self.cubins[arch]
        if arch not in self.cubin_paths:
            raise DocumentError("compile result", f"the {arch} cubin was not kept (compiled without a cache)")
        data = Path(self.cubin_paths[arch]).read_bytes()
        if sha256_bytes(data) != self.cubin_sha256[arch]:
            raise DocumentError(self.cubin_paths[arch], "cubin does not match its sha256; delete the cached folder")
        return data

    def resources_for(self, entry: str, arch: str | None = None) -> Resources:
        mangled = resolve_entry(self, entry)
        demangled = next(d for d, m in self.entries.items() if m == mangled)
        return self.resources[arch or self.arch][demangled]

    def static_shared(self, entry: str, arch: str | None = None) -> int:
        """Static __shared__ bytes of an entry: launch-time dynamic shared memory adds to it."""
        return self.resources_for(entry, arch).shared_bytes

    def portable_dict(self) -> dict[str, Any]:
        """`to_dict` without the cubins' paths, which name this machine's cache: what a verdict keeps
        (the cubins are identified by `cubin_sha256`)."""
        return {k: v for k, v in self.to_dict().items() if k != "cubin_paths"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": RESULT_VERSION, "status": self.status.value, "ok": self.ok, "arch": self.arch,
            "targets": list(self.targets), "flags": list(self.flags), "key": self.key,
            "toolchain": self.toolchain, "log": self.log, "seconds": self.seconds, "cached": self.cached,
            "cubin_sha256": dict(self.cubin_sha256), "cubin_paths": dict(self.cubin_paths),
            "entries": dict(self.entries),
            "resources": {arch: {name: r.to_dict() for name, r in per.items()}
                          for arch, per in self.resources.items()},
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "compile result") -> CompileResult:
        if not isinstance(data, dict):
            raise DocumentError(where, "must be a table")
        if data.get("version") != RESULT_VERSION:
            raise DocumentError(where, f"unsupported version {data.get('version')!r}")
        try:
            return cls(
                status=CompileStatus(data["status"]), arch=data["arch"], targets=tuple(data["targets"]),
                flags=tuple(data["flags"]), key=data["key"], toolchain=data["toolchain"], log=data["log"],
                seconds=float(data["seconds"]), cached=bool(data.get("cached", False)),
                cubin_sha256=dict(data["cubin_sha256"]), cubin_paths=dict(data.get("cubin_paths", {})),
                entries=dict(data["entries"]),
                resources={arch: {name: Resources.from_dict(r, f"{where}.resources.{arch}.{name}")
                                  for name, r in per.items()} for arch, per in data["resources"].items()},
            )
        except DocumentError:
            raise
        except KeyError as exc:
            raise DocumentError(where, f"missing {exc.args[0]!r}") from None
        except (ValueError, TypeError, AttributeError) as exc:
            raise DocumentError(where, f"malformed: {exc}") from None


def compile_kernel(state: KernelState, cache_dir: Path | None = None, timeout_s: float | None = None,
                   toolchain: Toolchain | None = None) -> CompileResult:
    """Compile `state` for its plan's targets; cache_dir None compiles without a cache; timeout_s
    None: `config.compile_timeout_s()`."""
    timeout_s = config.compile_timeout_s() if timeout_s is None else timeout_s
    toolchain = toolchain or find_toolchain()
    targets = ARCH_TARGETS[state.plan.arch]
    flags = nvcc_flags(state.plan)
    # The file name is in the key too: nvcc's messages and the line table name it.
    key = sha256_json({"version": RESULT_VERSION, "source": normalize_source(state.source),
                       "file": state.plan.source, "flags": flags, "targets": targets, "toolchain": toolchain.key})
    folder = Path(cache_dir) / "compile" / key[:2] / key if cache_dir is not None else None
    if folder is None:
        return _compile(state, flags, targets, key, toolchain, timeout_s)
    with _one_compile_of(folder):  # a walk's gate waits for the compile warming began, not a second nvcc
        if (folder / RESULT_FILE).is_file():
            return _load(folder)
        result = _compile(state, flags, targets, key, toolchain, timeout_s)
        return _store(result, folder) if result.status is not CompileStatus.TIMEOUT else result


_ENTRY_LOCKS: dict[Path, threading.Lock] = {}
_ENTRY_LOCKS_GUARD = threading.Lock()


@contextmanager
def _one_compile_of(folder: Path) -> Iterator[None]:
    """Threads of this process compile one cache entry once: the later ones wait and load it."""
    with _ENTRY_LOCKS_GUARD:
        lock = _ENTRY_LOCKS.setdefault(folder, threading.Lock())
    with lock:
        yield


def nvcc_flags(plan: LaunchPlan) -> tuple[str, ...]:
    """Every nvcc flag but the per-target -gencode, source and output. A flag outside the
    allow-list never reaches nvcc, whoever asks for the compile (DocumentError)."""
    for flag in refused_flags(plan.nvcc_flags):
        raise DocumentError(f"launch plan '{plan.name}'", refusal(flag))
    own_opt = any(f.startswith("-O") for f in plan.nvcc_flags)
    return (*BASE_FLAGS, *(() if own_opt else (DEFAULT_OPT,)), *plan.nvcc_flags)


def preprocessed_markers(state: KernelState, toolchain: Toolchain | None = None,
                         timeout_s: float | None = None) -> dict[str, list[str]]:
    """Per target, the line markers (`# 1 "/path/header.h" 1 3`) of nvcc's own device-side
    preprocessing of the state, with the flags its compile uses: the include tree as the
    compiler walked it, whatever the source's spelling."""
    timeout_s = config.compile_timeout_s() if timeout_s is None else timeout_s
    toolchain = toolchain or find_toolchain()
    targets = ARCH_TARGETS[state.plan.arch]
    flags = tuple(f for f in nvcc_flags(state.plan) if f not in _NOT_PREPROCESSING) + ("-E",)
    with _work_folder(f"E-{uuid.uuid4().hex}") as work:
        source = Path(state.plan.source).name
        (work / source).write_text(normalize_source(state.source), encoding="utf-8")
        codes = _run_nvcc(toolchain, flags, targets, source, work, timeout_s, suffix="ii")
        if codes is None:
            raise ToolchainError(f"nvcc -E ran past {timeout_s:g} s")
        failed = [t for t in targets if codes[t] != 0]
        if failed:
            raise ToolchainError(f"nvcc -E failed for {failed[0]} though the compile passed: "
                                 f"{_read_capped(work / f'{failed[0]}.log', LOG_LIMIT)}")
        markers = {}
        for target in targets:
            with open(work / f"{target}.ii", encoding="utf-8", errors="replace") as text:
                markers[target] = [line.rstrip("\n") for line in text if line.startswith("# ")]
        return markers


_NOT_PREPROCESSING = ("-cubin", "-Xptxas", "-v", "-lineinfo")  # BASE_FLAGS that concern code generation only


def gencode(target: str) -> str:
    number = target.removeprefix("sm_")
    return f"-gencode=arch=compute_{number},code=sm_{number}"


def resolve_entry(result: CompileResult, entry: str) -> str:
    """The mangled symbol for a plan's entry: an extern "C" name, a template instance such as
    `gemm<128, 64>`, a full signature or the mangled name itself (whitespace does not matter)."""
    wanted = normalized(entry)
    matches = {mangled for demangled, mangled in result.entries.items()
               if wanted == mangled or wanted in _name_forms(demangled)}
    if len(matches) == 1:
        return matches.pop()
    available = ", ".join(sorted(result.entries)) or "none"
    if matches:
        choices = ", ".join(sorted(d for d, m in result.entries.items() if m in matches))
        raise DocumentError(f"entry '{entry}'", f"is ambiguous; give the full signature: {choices}")
    raise DocumentError(f"entry '{entry}'", f"no __global__ function of that name; available: {available}")


def _name_forms(demangled: str) -> set[str]:
    """`void k<128>(float*)` is also `k<128>(float*)` and `k<128>`."""
    full = normalized(demangled)
    return {full, _strip_return_type(full), _strip_return_type(strip_bracketed(full, "(", ")"))}


def _strip_return_type(name: str) -> str:
    start, depth = 0, 0
    for i, char in enumerate(name):
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(char, 0)
        if char == " " and depth == 0:
            start = i + 1
    return name[start:]


def _compile(state: KernelState, flags: tuple[str, ...], targets: tuple[str, ...], key: str,
             toolchain: Toolchain, timeout_s: float) -> CompileResult:
    with _work_folder(key) as work:
        source = Path(state.plan.source).name  # its own name, so nvcc's messages point at the user's file
        (work / source).write_text(normalize_source(state.source), encoding="utf-8")
        os.utime(work / source, (0, 0))  # the line table records the file's mtime
        started = time.monotonic()
        codes = _run_nvcc(toolchain, flags, targets, source, work, timeout_s)
        seconds = round(time.monotonic() - started, 3)
        # Messages about nvcc's temporary files name the work folder; it means nothing later.
        outputs = {t: _read_capped(work / f"{t}.log", PARSE_LIMIT).replace(f"{work}/", "") for t in targets}

        def made(status: CompileStatus, log: str, **found: Any) -> CompileResult:
            return CompileResult(status=status, arch=state.plan.arch, targets=targets, flags=flags, key=key,
                                 toolchain=toolchain.key, log=_cap(log), seconds=seconds, **found)

        if codes is None:
            return made(CompileStatus.TIMEOUT, f"nvcc ran past {timeout_s:g} s and was stopped\n\n"
                        + _join_logs(outputs, targets))
        failed = [t for t in targets if codes[t] != 0]
        if failed:
            return made(CompileStatus.ERROR, _join_logs(outputs, failed))
        cubins = {t: (work / f"{t}.cubin").read_bytes() for t in targets}
        entries, resources = _inspect(toolchain, work, targets, outputs)
        return made(CompileStatus.OK, _join_logs(outputs, targets), entries=entries, resources=resources,
                    cubin_sha256={t: sha256_bytes(b) for t, b in cubins.items()}, cubins=cubins)


@contextmanager
def _work_folder(key: str) -> Iterator[Path]:
    """A private folder to compile in. nvcc writes its path into the -lineinfo debug data, so a
    folder named by the key keeps cubins byte-identical from one compile to the next; a compile of
    the same key already running elsewhere leaves this one a random folder instead."""
    root = Path(tempfile.gettempdir()) / f"klineage-nvcc-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    folder = root / key
    try:
        folder.mkdir()
    except FileExistsError:
        folder = Path(tempfile.mkdtemp(prefix="busy-", dir=root))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_nvcc(toolchain: Toolchain, flags: tuple[str, ...], targets: tuple[str, ...], source: str,
              work: Path, timeout_s: float, suffix: str = "cubin") -> dict[str, int] | None:
    """Run one nvcc per target at once (nvcc -cubin takes a single target), writing
    `<target>.<suffix>`; None on timeout."""
    # In the sandbox: an #include (however spelt) reaches only the toolkit and the system's headers.
    jail = Jail(Access.COMPILER, work, readable=toolkit_trees(toolchain.nvcc))
    procs = {}
    for target in targets:
        # -x cu: the plan's file name need not end in .cu
        argv, env, _ = jail.command([toolchain.nvcc, *flags, gencode(target), "-x", "cu", source, "-o",
                                     f"{target}.{suffix}"], toolchain.environment(work))
        with open(work / f"{target}.log", "wb") as log:
            procs[target] = subprocess.Popen(
                argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)  # its own process group, so cicc and ptxas die with it
    deadline = time.monotonic() + timeout_s
    try:
        return {t: _wait(p, max(0.0, deadline - time.monotonic())) for t, p in procs.items()}
    except subprocess.TimeoutExpired:
        return None
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    """`proc.wait(timeout=timeout_s)`, woken by the kernel the moment the process ends (a pidfd): Popen.wait with a
    timeout polls, sleeping up to 50 ms between looks, which every compile of a fraction of a second waited out.
    Where pidfds are missing (not Linux, a kernel before 5.3) it is Popen.wait as it was."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd_open, or the process is gone (reaped already)
        return proc.wait(timeout=timeout_s)
    try:
        readable = select.poll()  # not select.select: a busy process's descriptors may pass FD_SETSIZE
        readable.register(pidfd, select.POLLIN)
        if not readable.poll(math.ceil(timeout_s * 1000)):
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
    finally:
        os.close(pidfd)
    return proc.wait()


def _inspect(toolchain: Toolchain, work: Path, targets: tuple[str, ...],
             outputs: dict[str, str]) -> tuple[dict[str, str], dict[str, dict[str, Resources]]]:
    """Entry symbols from the cubins' symbol tables, resources from ptxas -v and cuobjdump."""
    dumps = {t: run_tool([toolchain.cuobjdump, "-symbols", "-res-usage", f"{t}.cubin"],
                         env=toolchain.environment(work), cwd=work) for t in targets}
    # ptxas names every entry it compiles; the symbol table says the same in a format that has
    # changed between cuobjdump releases (13.0 prefixes STT_/STB_/STO_), so both are read.
    mangled = sorted({name for dump in dumps.values() for name in _ENTRY_SYMBOL.findall(dump)} |
                     {name for text in outputs.values() for name in _COMPILING.findall(text)})
    names = demangle(mangled, toolchain)
    resources = {}
    for target in targets:
        ptxas = _parse_ptxas(outputs[target])
        user_cmem, param_cmem = _parse_res_usage(dumps[target])
        per_entry = {}
        for symbol in mangled:
            if symbol not in ptxas:
                raise ToolchainError(f"ptxas -v reported nothing for {symbol} on {target}")
            per_entry[names[symbol]] = Resources(**ptxas[symbol], param_cmem_bytes=param_cmem.get(symbol, 0),
                                                 user_cmem_bytes=user_cmem)
        resources[target] = per_entry
    return {names[m]: m for m in mangled}, resources


_ENTRY_SYMBOL = re.compile(r"^(?:STT_)?FUNC\s+\S+\s+\S+\s+(?:STO_)?ENTRY\s+(\S+)\s*$", re.MULTILINE)
_COMPILING = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CONSTANT = re.compile(r"CONSTANT\[\d+\]:(\d+)")


def _parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """Per mangled entry: registers, barriers, smem (the "Used" line of the entry being compiled)
    and its stack frame (the "Function properties" block, which may come before or after)."""
    used: dict[str, dict[str, int]] = {}
    frames: dict[str, dict[str, int]] = {}
    entry = properties = None
    for line in text.splitlines():
        if match := _COMPILING.search(line):
            entry = match.group(1)
        elif match := _PROPERTIES.search(line):
            properties = match.group(1)
        elif (match := _FRAME.search(line)) and properties:
            frames[properties] = {"stack_bytes": int(match.group(1)), "spill_store_bytes": int(match.group(2)),
                                  "spill_load_bytes": int(match.group(3))}
        elif (match := _USED.search(line)) and entry:
            used[entry] = {"registers": int(match.group(1)), "barriers": _first_int(_BARRIERS, line),
                           "shared_bytes": _first_int(_SMEM, line)}
    zero_frame = {"stack_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0}
    return {name: values | frames.get(name, zero_frame) for name, values in used.items()}


def _parse_res_usage(text: str) -> tuple[int, dict[str, int]]:
    """(the module's __constant__ bytes, per mangled function its parameter bank bytes).
    ptxas 13 no longer prints cmem, so this comes from cuobjdump -res-usage."""
    common, per_function, section = 0, {}, None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "Common:":
            section = None
        elif stripped.startswith("Function ") and stripped.endswith(":"):
            section = stripped.removeprefix("Function ").removesuffix(":")
        elif "CONSTANT[" in stripped:
            total = sum(int(n) for n in _CONSTANT.findall(stripped))
            if section is None:
                common += total
            else:
                per_function[section] = total
    return common, per_function


def _first_int(pattern: re.Pattern[str], line: str) -> int:
    match = pattern.search(line)
    return int(match.group(1)) if match else 0


def _join_logs(outputs: dict[str, str], targets: list[str] | tuple[str, ...]) -> str:
    parts, seen = [], set()
    for target in targets:
        text = outputs[target].strip()
        if text not in seen:  # a front-end error reads the same for every target
            seen.add(text)
            parts.append(f"# nvcc {gencode(target)}\n{text}")
    return "\n\n".join(parts)


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")


def _cap(text: str, limit: int = LOG_LIMIT) -> str:
    """Keep the head (the first errors) and the tail (the summary) of a long log."""
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


def _load(folder: Path) -> CompileResult:
    path = folder / RESULT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DocumentError(str(path), f"cached compile result unreadable ({exc}); delete its folder") from None
    result = CompileResult.from_dict(data, str(path))
    paths = {arch: str(folder / name) for arch, name in result.cubin_paths.items()}
    return replace(result, cached=True, cubin_paths=paths)


def _store(result: CompileResult, folder: Path) -> CompileResult:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        names = {arch: f"{arch}.cubin" for arch in result.cubins}
        for arch, name in names.items():
            (staging / name).write_bytes(result.cubins[arch])
        record = replace(result, cubin_paths=names).to_dict()
        (staging / RESULT_FILE).write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
        try:
            staging.rename(folder)
        except OSError:
            if not (folder / RESULT_FILE).is_file():
                raise
            return _load(folder)  # another worker stored this key first: every caller gets its result
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return replace(result, cubin_paths={arch: str(folder / name) for arch, name in names.items()})
