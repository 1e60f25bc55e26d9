"""The bundled corpus: problems, kernels and the adversarial suite, found by name or path."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from klineage import config
from klineage.errors import DocumentError
from klineage.kernel import PLAN_FILE, KernelState, load_kernel


@dataclass(frozen=True)
class KernelEntry:
    name: str  # "row_softmax/naive" or "adversarial/hang"
    path: Path

    def load(self) -> KernelState:
        return load_kernel(self.path)

    @property
    def expectation(self) -> dict:
        """For the adversarial suite: the reason the gate must give (expect.toml)."""
        expect = self.path / "expect.toml"
        return tomllib.loads(expect.read_text(encoding="utf-8")) if expect.is_file() else {}


def problem_path(name_or_path: str | Path, root: Path | None = None) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    bundled = (root or config.corpus_dir()) / "problems" / f"{name_or_path}.py"
    if bundled.is_file():
        return bundled
    known = ", ".join(p.stem for p in list_problems(root)) or "none"
    raise DocumentError(str(name_or_path), f"no such problem file or bundled problem (bundled: {known})")


def list_problems(root: Path | None = None) -> list[Path]:
    return sorted(((root or config.corpus_dir()) / "problems").glob("*.py"))


def list_kernels(root: Path | None = None, adversarial: bool = False) -> list[KernelEntry]:
    base = root or config.corpus_dir()
    folder = base / ("adversarial" if adversarial else "kernels")
    return [KernelEntry(str(plan.parent.relative_to(base / "kernels" if not adversarial else base)), plan.parent)
            for plan in sorted(folder.glob(f"**/{PLAN_FILE}"))]


def kernel_entry(name_or_path: str | Path, root: Path | None = None) -> KernelEntry:
    path = Path(name_or_path)
    if (path / PLAN_FILE).is_file() or (path.is_file() and path.name == PLAN_FILE):
        folder = path if path.is_dir() else path.parent
        return KernelEntry(folder.name, folder)
    for entry in list_kernels(root) + list_kernels(root, adversarial=True):
        if entry.name == str(name_or_path):
            return entry
    raise DocumentError(str(name_or_path), "no such kernel folder or bundled kernel (see `klineage kernels`)")
