"""A control group per sandboxed job: a memory and a process limit the job cannot raise, and a way to
kill every process of the job whatever it did to its sessions and process groups.

cgroup v2 where this process may create a child group with the memory and pids controllers, else the
v1 `memory` and `pids` hierarchies where they are mounted and writable (hybrid hosts), else none (an
unprivileged developer): the caller keeps its rlimits either way, and `applied` says what held.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class JobGroup:
    version: int  # 2, or 1 for one group in each v1 hierarchy
    dirs: tuple[Path, ...]
    applied: tuple[str, ...]  # the limits written, in words

    def attach(self) -> None:
        """Move the calling process into the group (the child calls this before it execs)."""
        for folder in self.dirs:
            (folder / "cgroup.procs").write_text("0\n" if self.version == 2 else f"{os.getpid()}\n")

    def close(self) -> None:
        """Kill whatever the job left in the group and remove the group."""
        for folder in self.dirs:
            if self.version == 2:
                _write(folder / "cgroup.kill", "1")
            for _ in range(200):
                pids = _members(folder)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.01)
            try:
                folder.rmdir()
            except OSError:  # a process stuck in the driver keeps it; the next boot clears it
                pass


def open_group(memory_bytes: int, pids: int) -> JobGroup | None:
    """A fresh group with both limits, or None where no cgroup can be made here."""
    name = f"klineage-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    v2 = _v2_parent()
    if v2 is not None:
        group = _make(2, [(v2 / name, {"memory.max": memory_bytes, "pids.max": pids, "memory.swap.max": 0})])
        if group is not None:
            return group
    parents = {controller: _v1_parent(controller) for controller in ("memory", "pids")}
    if all(parents.values()):
        return _make(1, [(parents["memory"] / name, {"memory.limit_in_bytes": memory_bytes}),
                         (parents["pids"] / name, {"pids.max": pids})])
    return None


def _make(version: int, plan: list[tuple[Path, dict[str, int]]]) -> JobGroup | None:
    for folder, _ in plan:
        _sweep(folder.parent)
    made: list[Path] = []
    applied = []
    try:
        for folder, limits in plan:
            folder.mkdir()
            made.append(folder)
            for key, value in limits.items():
                if key == "memory.swap.max" and not (folder / key).exists():
                    continue  # no swap accounting: nothing to limit
                (folder / key).write_text(f"{value}\n")
                applied.append(f"cgroup v{version} {key}={value}")
    except OSError:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                pass
        return None
    return JobGroup(version, tuple(made), tuple(applied))


def _sweep(parent: Path) -> None:
    """Close the groups of KLineage processes that died before they could (killed with SIGKILL)."""
    for stale in parent.glob("klineage-*-*"):
        try:
            os.kill(int(stale.name.split("-")[1]), 0)
        except ProcessLookupError:
            JobGroup(2 if (stale / "cgroup.kill").exists() else 1, (stale,), ()).close()
        except (ValueError, PermissionError):
            pass


def _own(hierarchy: str) -> str | None:
    """This process's group in a hierarchy ('' for v2, a controller name for v1), from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controllers == "" if hierarchy == "" else hierarchy in controllers.split(",")):
            return path
    return None


def _v2_parent() -> Path | None:
    if not (ROOT / "cgroup.controllers").is_file():
        return None  # v1 or hybrid: /sys/fs/cgroup is not the unified hierarchy
    own = _own("")
    if own is None:
        return None
    parent = ROOT / own.lstrip("/")
    wanted = {"memory", "pids"}
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    if not wanted <= enabled:
        # Fails (EBUSY) when this group holds processes and is not the root: then no v2 group here.
        _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted - enabled)))
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
    return parent if wanted <= enabled and os.access(parent, os.W_OK) else None


def _v1_parent(controller: str) -> Path | None:
    own = _own(controller)
    mount = ROOT / controller
    if own is None or not (mount / "cgroup.procs").is_file():
        return None
    parent = mount / own.lstrip("/")
    return parent if os.access(parent, os.W_OK) else None


def _members(folder: Path) -> list[int]:
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass
