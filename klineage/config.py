"""Engine settings, read from the environment in one place, each with a safe default."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from klineage.errors import KLineageError

REPO_ROOT = Path(__file__).resolve().parent.parent


class GateMode(str, Enum):
    GPU = "gpu"  # compile here, run on this machine's GPU
    REPLAY = "replay"  # serve recorded verdicts only; a miss is an error
    COMPILE_ONLY = "compile"  # static check, compile and features; nothing runs


def _path(name: str, default: Path) -> Path:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else default


def data_dir() -> Path:
    return _path("KLINEAGE_DATA_DIR", REPO_ROOT / "var")


def cache_dir() -> Path:
    """Compile and verdict caches of this machine (content-addressed, safe to delete)."""
    return _path("KLINEAGE_CACHE_DIR", data_dir() / "cache")


def recorded_dir() -> Path:
    """Committed verdicts measured on GPU hosts, which replay mode serves."""
    return _path("KLINEAGE_RECORDED_DIR", REPO_ROOT / "recorded")


def corpus_dir() -> Path:
    return _path("KLINEAGE_CORPUS_DIR", REPO_ROOT / "corpus")


def gate_mode(default: GateMode | None = None) -> GateMode:
    value = os.environ.get("KLINEAGE_GATE", "").strip().lower()
    if not value:
        return default or GateMode.GPU
    try:
        return GateMode(value)
    except ValueError:
        raise KLineageError(f"KLINEAGE_GATE must be one of {[m.value for m in GateMode]}, not {value!r}") from None


def replay_gpu() -> str:
    """The GPU whose recorded verdicts replay mode serves."""
    return os.environ.get("KLINEAGE_REPLAY_GPU", "NVIDIA H200").strip()


def runner_python() -> str:
    """The interpreter for the sandboxed GPU runner (it needs torch with CUDA and pycuda)."""
    import sys

    return os.environ.get("KLINEAGE_RUNNER_PYTHON", "").strip() or sys.executable


def sanitizer_path() -> str | None:
    """compute-sanitizer, if this machine has it."""
    import shutil

    explicit = os.environ.get("KLINEAGE_COMPUTE_SANITIZER", "").strip()
    if explicit:
        return explicit
    for candidate in ("compute-sanitizer", "/usr/local/cuda/bin/compute-sanitizer",
                      "/usr/local/cuda/compute-sanitizer/compute-sanitizer"):
        found = shutil.which(candidate)
        if found:
            return found
    return None
