"""Launch plans: the declarative, host-code-free description of how a kernel runs.

A plan (TOML) lists scratch buffers and the launches in order; every number in it is a safe
expression over case parameters, constants parsed from the source, and device facts.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from klineage import expr
from klineage.errors import DocumentError, ExpressionError

ARCHES = ("sm_90", "sm_90a")
SCALAR_TYPES = ("i32", "u32", "i64", "u64", "f32", "f64")
SCRATCH_INIT = ("poison", "zero")
# Flags a plan may pass to nvcc: optimisation and code-generation choices only, nothing that
# reads or writes files or changes include paths.
ALLOWED_FLAG_PREFIXES = ("-O", "--use_fast_math", "-lineinfo", "-maxrregcount=", "-D", "--ftz=", "--prec-div=",
                         "--prec-sqrt=", "--fmad=", "-Xptxas=-O", "--extra-device-vectorization")
MAX_LAUNCHES = 16
MAX_ARGS = 64


class ArgKind(str, Enum):
    BUFFER = "buffer"  # an input, output or scratch buffer, by name
    SCALAR = "scalar"


@dataclass(frozen=True)
class Arg:
    kind: ArgKind
    name: str = ""  # BUFFER: buffer name
    value: str | int | float = 0  # SCALAR: expression
    type: str = ""  # SCALAR: one of SCALAR_TYPES

    def to_dict(self) -> dict[str, Any]:
        if self.kind is ArgKind.BUFFER:
            return {"buffer": self.name}
        return {"scalar": self.value, "type": self.type}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Arg:
        if isinstance(data, str):
            _check_identifier(data, where)
            return cls(ArgKind.BUFFER, name=data)
        if not isinstance(data, dict):
            raise DocumentError(where, f"an argument is a buffer name or a table, not {data!r}")
        if "buffer" in data:
            _only(data, {"buffer"}, where)
            _check_identifier(data["buffer"], where)
            return cls(ArgKind.BUFFER, name=data["buffer"])
        if "scalar" in data:
            _only(data, {"scalar", "type"}, where)
            kind = data.get("type", "i32")
            if kind not in SCALAR_TYPES:
                raise DocumentError(where, f"scalar type '{kind}' is not one of {', '.join(SCALAR_TYPES)}")
            value = data["scalar"]
            if isinstance(value, str):
                _parse(value, where)
            elif not isinstance(value, (int, float)) or isinstance(value, bool):
                raise DocumentError(where, f"scalar must be a number or an expression, not {value!r}")
            return cls(ArgKind.SCALAR, value=value, type=kind)
        raise DocumentError(where, "an argument table needs 'buffer' or 'scalar'")


@dataclass(frozen=True)
class Scratch:
    name: str
    dtype: str
    count: str | int
    init: str = "poison"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "count": self.count, "init": self.init}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Scratch:
        if not isinstance(data, dict):
            raise DocumentError(where, "a scratch buffer is a table")
        _only(data, {"name", "dtype", "count", "init"}, where)
        for key in ("name", "dtype", "count"):
            if key not in data:
                raise DocumentError(where, f"scratch buffer needs '{key}'")
        _check_identifier(data["name"], where)
        init = data.get("init", "poison")
        if init not in SCRATCH_INIT:
            raise DocumentError(where, f"scratch init must be one of {SCRATCH_INIT}, not {init!r}")
        _check_expr(data["count"], where)
        return cls(data["name"], str(data["dtype"]), data["count"], init)


@dataclass(frozen=True)
class Launch:
    entry: str
    grid: tuple[str | int, str | int, str | int]
    block: tuple[str | int, str | int, str | int]
    shared: str | int = 0
    args: tuple[Arg, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "grid": list(self.grid),
            "block": list(self.block),
            "shared": self.shared,
            "args": [a.to_dict() for a in self.args],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Launch:
        if not isinstance(data, dict):
            raise DocumentError(where, "a launch is a table")
        _only(data, {"entry", "grid", "block", "shared", "args"}, where)
        for key in ("entry", "grid", "block"):
            if key not in data:
                raise DocumentError(where, f"launch needs '{key}'")
        entry = data["entry"]
        if not isinstance(entry, str) or not entry.strip():
            raise DocumentError(where, "entry must name a __global__ function")
        args = data.get("args", [])
        if not isinstance(args, list) or len(args) > MAX_ARGS:
            raise DocumentError(where, f"args must be a list of at most {MAX_ARGS}")
        shared = data.get("shared", 0)
        _check_expr(shared, f"{where}.shared")
        return cls(
            entry=entry.strip(),
            grid=_dims(data["grid"], f"{where}.grid"),
            block=_dims(data["block"], f"{where}.block"),
            shared=shared,
            args=tuple(Arg.from_dict(a, f"{where}.args[{i}]") for i, a in enumerate(args)),
        )


@dataclass(frozen=True)
class LaunchPlan:
    name: str
    problem: str  # the operator this kernel implements
    source: str = "kernel.cu"
    arch: str = "sm_90"
    supports: str = ""  # predicate over case parameters; empty means every case
    supports_reason: str = ""
    nvcc_flags: tuple[str, ...] = ()
    scratch: tuple[Scratch, ...] = ()
    launches: tuple[Launch, ...] = field(default_factory=tuple)
    description: str = ""

    def __post_init__(self) -> None:
        if not self.launches:
            raise DocumentError(self.name or "launch plan", "needs at least one [[launch]]")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "problem": self.problem,
            "source": self.source,
            "arch": self.arch,
            "supports": self.supports,
            "supports_reason": self.supports_reason,
            "nvcc_flags": list(self.nvcc_flags),
            "scratch": [s.to_dict() for s in self.scratch],
            "launch": [launch.to_dict() for launch in self.launches],
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "launch plan") -> LaunchPlan:
        if not isinstance(data, dict):
            raise DocumentError(where, "must be a table")
        known = {"name", "problem", "source", "arch", "supports", "supports_reason", "nvcc_flags",
                 "scratch", "launch", "description"}
        _only(data, known, where)
        for key in ("name", "problem", "launch"):
            if key not in data:
                raise DocumentError(where, f"missing '{key}'")
        arch = data.get("arch", "sm_90")
        if arch not in ARCHES:
            raise DocumentError(where, f"arch must be one of {', '.join(ARCHES)}, not {arch!r}")
        supports = data.get("supports", "")
        if supports:
            _parse(supports, f"{where}.supports")
            if not data.get("supports_reason"):
                raise DocumentError(where, "'supports' needs a 'supports_reason' (the hardware reason)")
        flags = data.get("nvcc_flags", [])
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise DocumentError(where, "nvcc_flags must be a list of strings")
        for flag in flags:
            if not flag.startswith(ALLOWED_FLAG_PREFIXES) or any(c in flag for c in " ;|&$`\n,"):
                raise DocumentError(where, f"nvcc flag {flag!r} is not allowed")
        launches = data["launch"]
        if not isinstance(launches, list) or not 1 <= len(launches) <= MAX_LAUNCHES:
            raise DocumentError(where, f"'launch' must list 1 to {MAX_LAUNCHES} launches ([[launch]])")
        scratch = data.get("scratch", [])
        if not isinstance(scratch, list):
            raise DocumentError(where, "'scratch' must be a list of tables ([[scratch]])")
        source = data.get("source", "kernel.cu")
        if not isinstance(source, str) or "/" in source or source.startswith("."):
            raise DocumentError(where, "source must be a file name next to the plan")
        return cls(
            name=str(data["name"]),
            problem=str(data["problem"]),
            source=source,
            arch=arch,
            supports=supports,
            supports_reason=str(data.get("supports_reason", "")),
            nvcc_flags=tuple(flags),
            scratch=tuple(Scratch.from_dict(s, f"{where}.scratch[{i}]") for i, s in enumerate(scratch)),
            launches=tuple(Launch.from_dict(x, f"{where}.launch[{i}]") for i, x in enumerate(launches)),
            description=str(data.get("description", "")),
        )

    @classmethod
    def from_toml(cls, text: str, where: str = "launch.toml") -> LaunchPlan:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise DocumentError(where, f"not valid TOML: {exc}") from None
        return cls.from_dict(data, where)

    @classmethod
    def from_file(cls, path: Path) -> LaunchPlan:
        return cls.from_toml(Path(path).read_text(encoding="utf-8"), str(path))

    def supports_case(self, params: dict[str, Any], facts: dict[str, Any] | None = None) -> bool:
        """Whether the declared domain holds; `facts` are source constants and device facts."""
        if not self.supports:
            return True
        return bool(expr.evaluate(self.supports, numeric({**(facts or {}), **params})))


@dataclass(frozen=True)
class ResolvedLaunch:
    """A launch with every expression evaluated for one case on one device."""

    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    args: tuple[tuple[str, Any, str], ...]  # ("buffer", name, "") | ("scalar", value, type)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "grid": list(self.grid), "block": list(self.block),
                "shared": self.shared, "args": [list(a) for a in self.args]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResolvedLaunch:
        return cls(data["entry"], tuple(data["grid"]), tuple(data["block"]), int(data["shared"]),
                   tuple(tuple(a) for a in data["args"]))


def numeric(params: dict[str, Any]) -> dict[str, int | float | bool]:
    """Case parameters that expressions can use (numbers and booleans)."""
    return {k: v for k, v in params.items() if isinstance(v, (int, float, bool))}


def resolve(plan: LaunchPlan, env: dict[str, Any], buffers: set[str]) -> list[ResolvedLaunch]:
    """Evaluate a plan for one environment (case params + constants + device facts).

    `buffers` are the names of inputs, outputs and scratch buffers known for the case.
    Raises DocumentError naming the launch and the field that is wrong.
    """
    env = numeric(env)
    resolved = []
    for i, launch in enumerate(plan.launches):
        where = f"{plan.name}.launch[{i}] ({launch.entry})"
        grid = tuple(_evaluate(expr.evaluate_int, d, env, f"{where}.grid") for d in launch.grid)
        block = tuple(_evaluate(expr.evaluate_int, d, env, f"{where}.block") for d in launch.block)
        if min(grid) < 1 or grid[0] > 2**31 - 1 or max(grid[1:]) > 65535:
            raise DocumentError(where, f"grid {grid} is outside the hardware limits")
        if min(block) < 1 or block[0] > 1024 or block[1] > 1024 or block[2] > 64:
            raise DocumentError(where, f"block {block} is outside the hardware limits")
        if block[0] * block[1] * block[2] > 1024:
            raise DocumentError(where, f"block {block} has more than 1024 threads")
        shared = _evaluate(expr.evaluate_int, launch.shared, env, f"{where}.shared")
        if shared < 0:
            raise DocumentError(where, f"dynamic shared memory is negative ({shared})")
        args = []
        for j, arg in enumerate(launch.args):
            if arg.kind is ArgKind.BUFFER:
                if arg.name not in buffers:
                    raise DocumentError(where, f"unknown buffer '{arg.name}' (known: {', '.join(sorted(buffers))})")
                args.append(("buffer", arg.name, ""))
            else:
                value = _evaluate(expr.evaluate, arg.value, env, f"{where}.args[{j}]")
                args.append(("scalar", float(value) if arg.type.startswith("f") else int(value), arg.type))
        resolved.append(ResolvedLaunch(launch.entry, grid, block, shared, tuple(args)))
    return resolved


def _dims(value: Any, where: str) -> tuple[str | int, str | int, str | int]:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not 1 <= len(value) <= 3:
        raise DocumentError(where, "must be an expression or a list of 1 to 3 expressions")
    for item in value:
        _check_expr(item, where)
    return tuple(list(value) + [1] * (3 - len(value)))


def _check_expr(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DocumentError(where, f"must be a whole number or an expression, not {value!r}")
    if isinstance(value, str):
        _parse(value, where)


def _parse(text: str, where: str) -> None:
    """Vet an expression; a refusal names where in the plan it sits."""
    try:
        expr.parse(text)
    except ExpressionError as exc:
        raise ExpressionError(where, str(exc)) from None


def _evaluate(fn: Any, value: str | int | float, env: dict[str, Any], where: str) -> Any:
    try:
        return fn(value, env)
    except ExpressionError as exc:
        raise ExpressionError(where, str(exc)) from None


def _check_identifier(name: Any, where: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise DocumentError(where, f"{name!r} is not a valid buffer name")


def _only(data: dict, allowed: set[str], where: str) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise DocumentError(where, f"unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
