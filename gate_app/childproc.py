"""Child processes that can always be stopped: a job's work runs in a child of the worker, and
the engine starts its own children (nvcc, the sandboxed GPU runner) in sessions of their own, so
killing one process group is not enough. `kill_tree` stops the whole tree, whatever groups it
spans; `guard`, called first thing in a child, makes the child stop its tree when the worker dies.

Linux only (it reads /proc and uses prctl); so is the engine's sandbox. No Django here: the
child imports this module.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

PARENT_ENV = "KLINEAGE_JOB_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # The command name is in parentheses and may itself hold spaces or parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, nearest first."""
    children = _children_map()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        nxt = []
        for parent in frontier:
            for child in children.get(parent, []):
                if child not in found:
                    found.append(child)
                    nxt.append(child)
        frontier = nxt
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(pid: int, include_root: bool = True) -> list[int]:
    """SIGKILL `pid` and everything below it, and the process groups they lead.

    The tree is frozen first (SIGSTOP, repeated until no new process appears), so nothing can
    fork its way out between looking and killing. Returns the pids signalled.
    """
    stopped: list[int] = [pid] if include_root else []
    if include_root:
        _signal(pid, signal.SIGSTOP)
    for _ in range(20):
        new = [p for p in descendants(pid) if p not in stopped]
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        stopped.extend(new)
    groups = set()
    for p in stopped:
        try:
            if os.getpgid(p) == p:  # a group leader: the engine's sessions; take its group too
                groups.add(p)
        except ProcessLookupError:
            pass
    for p in stopped:
        _signal(p, signal.SIGKILL)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in stopped:  # a stopped process killed by SIGKILL needs no SIGCONT, but be explicit
        _signal(p, signal.SIGCONT)
    return stopped


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return not any(alive(p) for p in pids)


def guard() -> None:
    """In a job's child: when the worker dies (even by SIGKILL), stop everything below us and exit.

    The kernel sends SIGTERM on the parent's death (PR_SET_PDEATHSIG); the handler kills this
    process's descendants, which live in their own sessions, then exits. A parent that died
    before the prctl took effect is caught by comparing with the pid the worker passed down.
    """

    def on_term(signum, frame):  # noqa: ARG001
        kill_tree(os.getpid(), include_root=False)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    expected = os.environ.get(PARENT_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        os._exit(128 + signal.SIGTERM)
