"""Uploaded problems and kernels, kept content-addressed under the data dir.

    KLINEAGE_DATA_DIR/uploads/problems/<fingerprint>/<name>.py
    KLINEAGE_DATA_DIR/uploads/kernels/<fingerprint>/{kernel.cu, launch.toml}
    KLINEAGE_DATA_DIR/uploads/names/{problems,kernels}/<name>   (the fingerprint a name stands for)

Jobs name them `uploaded/<name>`; `problem_path` and `kernel_entry` resolve those names here and
bundled names in the corpus. Storing only writes files: an uploaded problem runs only inside the
sandboxed probe (klineage.gate.execute.probe_problem), like every problem.
"""

from __future__ import annotations

import re
from pathlib import Path

from klineage import config, corpus
from klineage.errors import DocumentError
from klineage.files import write_atomic
from klineage.kernel import PLAN_FILE

PREFIX = "uploaded/"
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")


def root() -> Path:
    return config.data_dir() / "uploads"


def is_uploaded(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def check_name(name: str, what: str) -> str:
    if not NAME.fullmatch(name):
        raise DocumentError(what, f"name {name!r} must be 1 to 64 letters, digits, '_' or '-' (not starting with '-')")
    return name


def store_problem(name: str, fingerprint: str, text: str) -> Path:
    """Write a problem file under its fingerprint and claim `name` for it."""
    folder = root() / "problems" / fingerprint
    path = folder / f"{check_name(name, 'problem')}.py"
    _write(path, text)
    _claim("problems", name, fingerprint)
    return path


def store_kernel(name: str, fingerprint: str, source_file: str, source: str, plan: str) -> Path:
    """Write a kernel's source and launch plan under its fingerprint and claim `name` for it."""
    folder = root() / "kernels" / fingerprint
    _write(folder / source_file, source)
    _write(folder / PLAN_FILE, plan)
    _claim("kernels", check_name(name, "kernel"), fingerprint)
    return folder


def problem_path(name: str) -> Path:
    """A problem file by name: `uploaded/<name>` from the data dir, anything else as the corpus resolves it."""
    if not is_uploaded(name):
        return corpus.problem_path(name)
    short = name.removeprefix(PREFIX)
    path = root() / "problems" / _address("problems", short) / f"{short}.py"
    if not path.is_file():
        raise DocumentError(name, "the uploaded problem's file is missing from the data dir")
    return path


def kernel_entry(name: str) -> corpus.KernelEntry:
    """A kernel by name: `uploaded/<name>` from the data dir, anything else as the corpus resolves it."""
    if not is_uploaded(name):
        return corpus.kernel_entry(name)
    folder = root() / "kernels" / _address("kernels", name.removeprefix(PREFIX))
    if not (folder / PLAN_FILE).is_file():
        raise DocumentError(name, "the uploaded kernel's files are missing from the data dir")
    return corpus.KernelEntry(name, folder)


def _address(kind: str, name: str) -> str:
    index = root() / "names" / kind / check_name(name, f"uploaded {kind[:-1]}")
    try:
        return index.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise DocumentError(PREFIX + name, f"no uploaded {kind[:-1]} of that name") from None


def _claim(kind: str, name: str, fingerprint: str) -> None:
    """Point `name` at `fingerprint`, once: a name never changes what it stands for."""
    index = root() / "names" / kind / name
    index.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(index, "x", encoding="ascii") as handle:
            handle.write(fingerprint)
    except FileExistsError:
        if index.read_text(encoding="ascii").strip() != fingerprint:
            raise DocumentError(PREFIX + name, f"an uploaded {kind[:-1]} of that name already exists, "
                                               "with other content") from None


def _write(path: Path, text: str) -> None:
    """Content-addressed: an existing file already holds these bytes."""
    if path.is_file():
        return
    write_atomic(path, text)
