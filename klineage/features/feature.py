"""A feature: a named property observed at a locus (a kernel function) of a kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from klineage.errors import DocumentError


@dataclass(frozen=True, order=True)
class Feature:
    locus: str  # the kernel function, demangled where possible
    name: str  # e.g. "ldg_128", "hmma"

    def __post_init__(self) -> None:
        if not isinstance(self.locus, str) or not isinstance(self.name, str) or not self.name:
            raise DocumentError("feature", f"needs a text locus and a non-empty name, not "
                                           f"{self.locus!r}, {self.name!r}")

    def __str__(self) -> str:
        return f"{self.locus}:{self.name}"

    def to_dict(self) -> dict[str, str]:
        return {"locus": self.locus, "name": self.name}

    @classmethod
    def from_dict(cls, data: Any, where: str = "feature") -> Feature:
        if not isinstance(data, dict) or set(data) != {"locus", "name"}:
            raise DocumentError(where, f"a feature is a table with exactly 'locus' and 'name', not {data!r}")
        return cls(locus=data["locus"], name=data["name"])
