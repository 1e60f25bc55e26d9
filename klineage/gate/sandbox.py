"""Run untrusted work in a fresh subprocess: own process group, minimal environment, rlimits,
capped output, a wall-clock limit and a watchdog on progress. Results travel over a private
file, never over stdout, so nothing a kernel prints can speak for the harness.

With a `Jail` the process starts inside bubblewrap (klineage.gate.jail) and in a control group of
its own (klineage.gate.cgroup): the job's limits hold for all its descendants, and they all end with it."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from stat import S_ISREG

from klineage import config
from klineage.gate import cgroup
from klineage.gate.jail import Jail

# Variables a CUDA program needs; everything else (API keys, tokens, database URLs) stays out.
PASSED_THROUGH = ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
                  "NVIDIA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                  "NVSHMEM_DISABLE_NVLS", "PYTHONPATH", "TMPDIR", "OMP_NUM_THREADS")


class Exit(str, Enum):
    FINISHED = "finished"  # exited by itself (any return code)
    TIMEOUT = "timeout"  # wall-clock limit
    STALLED = "stalled"  # the watchdog saw no progress while a launch was pending
    SIGNALLED = "signalled"  # killed by a signal it did not ask for (segfault, OOM killer)


@dataclass(frozen=True)
class SandboxResult:
    exit: Exit
    returncode: int
    output: str  # the first `output_cap` bytes of stdout+stderr, decoded leniently
    output_bytes: int  # how much it printed in all
    seconds: float
    # Bytes kept in `output` before decoding; -1 when not known. Re-encoding `output` does not
    # give it back: each undecodable byte, or a character cut at the cap, becomes 3 bytes of U+FFFD.
    captured_bytes: int = -1
    isolation: tuple[str, ...] = ()  # the sandbox and the limits that applied, in words

    @property
    def flooded(self) -> bool:
        kept = self.captured_bytes if self.captured_bytes >= 0 else len(self.output.encode("utf-8", "replace"))
        return self.output_bytes > kept


def minimal_env(extra: dict[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({"LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                "HOME": str(home) if home else "/tmp"})
    env.update(extra or {})
    return env


FILE_SIZE_LIMIT = 4 << 30
PROGRESS_CAP = 64 << 20  # a progress file past this is a job flooding its parent: its events are no longer read


def _limits(cpu_seconds: int, nproc: int | None, group: cgroup.JobGroup | None) -> Callable[[], None]:
    def apply() -> None:
        if group is not None:
            group.attach()  # before the exec, so that nothing of the job starts outside the group
        # No RLIMIT_AS: CUDA reserves huge virtual ranges and would fail to start.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def _process_limit(pids: int) -> int | None:
    """RLIMIT_NPROC counts every process of the real uid, not the job's: the uid's processes now plus
    the job's share. None for root, whom the kernel does not hold to it (the cgroup does)."""
    uid = os.getuid()
    if uid == 0:
        return None
    running = 0
    for entry in Path("/proc").iterdir():
        try:
            running += entry.name.isdigit() and entry.stat().st_uid == uid
        except OSError:
            pass
    return running + pids


def _isolation(sandboxed: str, group: cgroup.JobGroup | None, cpu_seconds: int, nproc: int | None) -> tuple[str, ...]:
    words = [sandboxed] if sandboxed else []
    words += group.applied if group is not None else []
    words += [f"rlimit cpu={cpu_seconds} s", f"rlimit fsize={FILE_SIZE_LIMIT}", "rlimit core=0"]
    words += [f"rlimit nproc={nproc} (all processes of uid {os.getuid()})"] if nproc is not None else []
    return tuple(words)


def run(argv: list[str], *, cwd: Path, timeout_s: float, env: dict[str, str], output_cap: int = 64 * 1024,
        progress_file: Path | None = None, stall_s: float | None = None,
        on_progress: Callable[[dict], None] | None = None, jail: Jail | None = None,
        on_start: Callable[[tuple[str, ...]], None] | None = None) -> SandboxResult:
    """Run `argv` to completion or until a limit; always leaves no process of its group behind
    (with a `jail`, none of its sandbox or control group either). `on_start` hears the isolation, in
    words, before the child starts: a long-lived child's results are reported while it still runs.

    With `progress_file` and `stall_s`, the child appends JSON lines; one saying
    {"waiting": true} starts a stall clock that the next line stops (a launch that never
    returns is a hang, whatever the overall limit).
    """
    started = time.monotonic()
    group, sandboxed = None, ""
    if jail is not None:
        argv, env, sandboxed = jail.command(argv, env)
        group = cgroup.open_group(config.sandbox_memory_bytes(), config.sandbox_pids())
    cpu_seconds = int(timeout_s) + 30
    nproc = _process_limit(config.sandbox_pids()) if jail is not None else None
    isolation = _isolation(sandboxed, group, cpu_seconds, nproc)
    if on_start is not None:
        on_start(isolation)
    try:
        result = _supervise(
            argv,
            cwd,
            env,
            timeout_s,
            output_cap,
            progress_file,
            stall_s,
            on_progress,
            _limits(cpu_seconds, nproc, group),
            started,
            isolation,
        )
        if sandboxed.startswith("bubblewrap") and result.exit is Exit.FINISHED and 128 < result.returncode <= 192:
            # bwrap exits with 128 + N for a child that signal N killed
            result = replace(result, exit=Exit.SIGNALLED, returncode=128 - result.returncode)
        return result
    finally:
        if group is not None:
            group.close()


def _supervise(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float, output_cap: int,
               progress_file: Path | None, stall_s: float | None, on_progress: Callable[[dict], None] | None,
               preexec: Callable[[], None], started: float, isolation: tuple[str, ...]) -> SandboxResult:
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec)
    captured = bytearray()
    total = [0]

    def drain() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(65536):
            total[0] += len(chunk)
            if len(captured) < output_cap:
                captured.extend(chunk[: output_cap - len(captured)])

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    exit_kind = Exit.FINISHED
    seen_lines = 0
    waiting_since: float | None = None
    while proc.poll() is None:
        now = time.monotonic()
        if now - started > timeout_s:
            exit_kind = Exit.TIMEOUT
            break
        if progress_file is not None:
            events, consumed = _new_events(progress_file, seen_lines)
            seen_lines += consumed
            for event in events:
                waiting_since = now if event.get("waiting") else None
                if on_progress is not None:
                    on_progress(event)
            if stall_s is not None and waiting_since is not None and now - waiting_since > stall_s:
                exit_kind = Exit.STALLED
                break
        time.sleep(0.05)
    _kill_group(proc)
    reader.join(timeout=5)
    if progress_file is not None and on_progress is not None:
        for event in _new_events(progress_file, seen_lines)[0]:
            on_progress(event)
    code = proc.returncode if proc.returncode is not None else -9
    if exit_kind is Exit.FINISHED and code < 0:  # its own signal: our kill came after it had exited
        exit_kind = Exit.SIGNALLED
    return SandboxResult(exit_kind, code, captured.decode("utf-8", "replace"), total[0],
                         time.monotonic() - started, len(captured), isolation)


def read_capped(path: Path, cap: int) -> bytes | None:
    """A regular file a job wrote, if no bigger than `cap`; None for anything else. Never through a
    link the job planted (it could point at a secret, or at /dev/zero), and never blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        return handle.read(cap) if S_ISREG(info.st_mode) and info.st_size <= cap else None


def _new_events(path: Path, skip: int) -> tuple[list[dict], int]:
    """Events in complete lines after the first `skip`, and how many complete lines were read.

    A line without its newline is still being written; a complete line that is not a JSON
    object is passed over rather than allowed to hide every later event from the watchdog.
    """
    data = read_capped(path, PROGRESS_CAP)
    if data is None:
        return [], 0
    text = data.decode("utf-8", errors="replace")
    complete = text.split("\n")[:-1]
    events = []
    for line in complete[skip:]:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events, max(0, len(complete) - skip)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # a process stuck in the driver; nothing more can be done
        pass
