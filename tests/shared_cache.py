"""Parts of the engine's cache that this test run's caches share, made once a run instead of once a
test or module: each is content-addressed (a problem's probe by every byte of its files, a compile by
source, file name, flags, targets and toolchain, SASS features by cubin bytes, an artifact report by
compile key and policy version), so a shared entry is the entry a fresh cache would have made. A
test's verdicts and recorded store stay its own. Tests that judge a compile afresh (its time limit)
share the probes only."""

from __future__ import annotations

import os
from pathlib import Path

PROBES = ("problems",)
BUILDS_ENV = "KLINEAGE_TEST_BUILDS"  # where tests/cuda_tools.py keeps the run's CPU emulator builds, by content
SHARED_ENV = "KLINEAGE_TEST_SHARED"  # the run's shared folder (tests/dashboard_data.py keeps its corpus import there)
DERIVED = ("problems", "compile", "sass", "artifact")


def shared_root(base_temp: Path) -> Path:
    """One folder for the run: the xdist workers' base temps share a parent, a run without xdist has one."""
    root = (base_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else base_temp) / "shared-cache"
    root.mkdir(exist_ok=True)
    return root


def share(cache_dir: Path, root: Path, parts: tuple[str, ...] = DERIVED) -> Path:
    """`cache_dir` (made if need be) with each of `parts` a link to the run's shared folder of that part."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for part in parts:
        (root / part).mkdir(exist_ok=True)
        link = cache_dir / part
        if not link.is_symlink():
            link.symlink_to(root / part, target_is_directory=True)
    return cache_dir
