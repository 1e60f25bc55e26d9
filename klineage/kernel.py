"""Kernel states: CUDA C++ device source plus its launch plan, fingerprinted by content."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klineage import expr
from klineage.errors import DocumentError, ExpressionError
from klineage.fingerprint import normalize_source, sha256_json
from klineage.launch import LaunchPlan

PLAN_FILE = "launch.toml"
DOCUMENT_VERSION = 1

# `constexpr int NAME = 128;`, `static constexpr unsigned NAME = A * 2;`, `const int NAME = 4;`
_CONSTEXPR = re.compile(
    r"^\s*(?:static\s+)?(?:constexpr|const)\s+(?:unsigned\s+|signed\s+)?"
    r"(?:int|long|long long|size_t|int32_t|int64_t|uint32_t|uint64_t|unsigned|float|double|bool)\s+"
    r"([A-Za-z_]\w*)\s*=\s*([^;{}]+);",
    re.MULTILINE,
)
# Horizontal blanks only: `\s` would let an empty `#define FLAG` take the next line as its value.
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+([^\n\\]+)$", re.MULTILINE)
# Suffixes of whole number tokens only: not the 'F' of 0x1F, not the 'U' of a name like TILE_2U.
_INT_SUFFIX = re.compile(r"(?<![\w.])(0[xX][0-9a-fA-F]+|\d+)(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)\b")
_FLOAT_SUFFIX = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[fF]\b")
_FLOAT_LITERAL = re.compile(r"(?<![\w.])(?:\d+\.\d*|\.\d+|\d+[eE][+-]?\d+)")
_NAME = re.compile(r"[A-Za-z_]\w*")


def parse_constants(source: str) -> dict[str, int | float]:
    """Namespace-level numeric constants a launch plan may name.

    Later definitions may use earlier ones; anything that is not a plain arithmetic expression
    (casts, calls, templates) is skipped, since a plan cannot depend on it anyway.
    """
    return dict(_constants_of(source))  # a copy: callers may add to it


# Walks, audits and imports ask for the same sources' constants thousands of times.
@functools.lru_cache(maxsize=512)
def _constants_of(source: str) -> tuple[tuple[str, int | float], ...]:
    found: list[tuple[int, str, str]] = []
    for pattern in (_CONSTEXPR, _DEFINE):
        for match in pattern.finditer(source):
            found.append((match.start(), match.group(1), match.group(2)))
    constants: dict[str, int | float] = {}
    for _, name, text in sorted(found):
        text = text.split("//")[0].strip()
        text = _FLOAT_SUFFIX.sub(r"\1", _INT_SUFFIX.sub(r"\1", text))
        floating = _FLOAT_LITERAL.search(text) or any(
            isinstance(constants.get(n), float) for n in _NAME.findall(text))
        if not floating:
            text = re.sub(r"(?<!/)/(?!/)", "//", text)  # C integer division
        try:
            value = expr.evaluate(text, constants)
        except ExpressionError:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            constants[name] = value
    return tuple(constants.items())


@dataclass(frozen=True)
class KernelState:
    source: str
    plan: LaunchPlan

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise DocumentError(self.plan.name, "kernel source is empty")

    @property
    def name(self) -> str:
        return self.plan.name

    @functools.cached_property  # asked for by every lookup; source and plan never change
    def fingerprint(self) -> str:
        return sha256_json({"source": normalize_source(self.source), "plan": self.plan.to_dict()})

    @property
    def constants(self) -> dict[str, int | float]:
        return parse_constants(self.source)

    def with_source(self, source: str) -> KernelState:
        return KernelState(source=source, plan=self.plan)

    def to_dict(self) -> dict[str, Any]:
        return {"version": DOCUMENT_VERSION, "fingerprint": self.fingerprint,
                "source": self.source, "plan": self.plan.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str = "kernel state") -> KernelState:
        if not isinstance(data, dict) or "source" not in data or "plan" not in data:
            raise DocumentError(where, "needs 'source' and 'plan'")
        if data.get("version", DOCUMENT_VERSION) != DOCUMENT_VERSION:
            raise DocumentError(where, f"unsupported version {data.get('version')!r}")
        state = cls(source=data["source"], plan=LaunchPlan.from_dict(data["plan"], f"{where}.plan"))
        claimed = data.get("fingerprint")
        if claimed and claimed != state.fingerprint:
            raise DocumentError(where, "fingerprint does not match its source and plan")
        return state


def load_kernel(path: str | Path) -> KernelState:
    """Load a kernel from its folder (with launch.toml) or from the launch.toml itself."""
    path = Path(path)
    plan_path = path / PLAN_FILE if path.is_dir() else path
    if not plan_path.is_file():
        raise DocumentError(str(path), f"no {PLAN_FILE} found")
    plan = LaunchPlan.from_file(plan_path)
    source_path = plan_path.parent / plan.source
    if not source_path.is_file():
        raise DocumentError(str(plan_path), f"source file '{plan.source}' not found next to the plan")
    raw = source_path.read_bytes()
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(str(source_path), f"source is not UTF-8 (byte {exc.start})") from None
    return KernelState(source=source, plan=plan)
