"""Launch plans: the declarative, host-code-free description of how a kernel runs.

A plan (TOML) lists scratch buffers and the launches in order; every number in it is a safe
expression over case parameters, constants parsed from the source, and device facts.

A launch argument is a buffer (its device pointer), a scalar, or a TMA tensor map over a buffer
(sm_90 and later): the runner encodes the map with the driver's cuTensorMapEncodeTiled and passes
the 128-byte CUtensorMap by value, for a `const __grid_constant__` kernel parameter.

    { tensor_map = "x", dtype = "bf16", dims = ["K", "M"], strides = ["K * 2"],
      box = ["BLOCK_K", "BLOCK_M"], swizzle = "128B", l2_promotion = "256B" }

dims and box list the dimensions innermost first (dims[0] is contiguous in memory); strides are
the byte strides of dims 1 .. rank-1 (dimension 0's stride is the element size). Elements outside
dims read as zeros. swizzle is none, 32B, 64B or 128B (the shared-memory layout the kernel's
descriptors must match); l2_promotion is none, 64B, 128B or 256B (256B when left out).
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

# TMA tensor maps (cuTensorMapEncodeTiled). Element types: plan name -> (CUtensorMapDataType,
# bytes per element, the torch dtype of the buffer it may map).
TENSOR_MAP_DTYPES = {
    "u8": (0, 1, "uint8"), "u16": (1, 2, "uint16"), "u32": (2, 4, "uint32"), "i32": (3, 4, "int32"),
    "u64": (4, 8, "uint64"), "i64": (5, 8, "int64"), "f16": (6, 2, "float16"), "f32": (7, 4, "float32"),
    "f64": (8, 8, "float64"), "bf16": (9, 2, "bfloat16"),
}
TENSOR_MAP_SWIZZLES = {"none": (0, 0), "32B": (1, 32), "64B": (2, 64), "128B": (3, 128)}  # -> (enum, span bytes)
TENSOR_MAP_L2_PROMOTIONS = {"none": 0, "64B": 1, "128B": 2, "256B": 3}
TENSOR_MAP_ARCHES = ("sm_90", "sm_90a")  # the Hopper tensor memory accelerator
TENSOR_MAP_MAX_RANK = 5
TENSOR_MAP_MAX_BOX = 256  # elements per box dimension
TENSOR_MAP_MAX_DIM = 2**32  # elements per dimension
TENSOR_MAP_MAX_STRIDE = 2**40  # bytes
TENSOR_MAP_ALIGN = 16  # bytes: global address, strides and the box's inner extent
_TENSOR_MAP_KEYS = {"tensor_map", "dtype", "dims", "strides", "box", "swizzle", "l2_promotion"}


class ArgKind(str, Enum):
    BUFFER = "buffer"  # an input, output or scratch buffer, by name
    SCALAR = "scalar"
    TENSOR_MAP = "tensor_map"  # a TMA descriptor over a buffer, passed by value


@dataclass(frozen=True)
class Arg:
    kind: ArgKind
    name: str = ""  # BUFFER, TENSOR_MAP: buffer name
    value: str | int | float = 0  # SCALAR: expression
    type: str = ""  # SCALAR: one of SCALAR_TYPES; TENSOR_MAP: one of TENSOR_MAP_DTYPES
    # TENSOR_MAP only: expressions, innermost dimension first
    dims: tuple[str | int, ...] = ()
    strides: tuple[str | int, ...] = ()  # bytes, dims 1 .. rank-1
    box: tuple[str | int, ...] = ()
    swizzle: str = ""
    l2_promotion: str = ""

    def to_dict(self) -> dict[str, Any]:
        if self.kind is ArgKind.BUFFER:
            return {"buffer": self.name}
        if self.kind is ArgKind.TENSOR_MAP:
            return {"tensor_map": self.name, "dtype": self.type, "dims": list(self.dims),
                    "strides": list(self.strides), "box": list(self.box), "swizzle": self.swizzle,
                    "l2_promotion": self.l2_promotion}
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
        if "tensor_map" in data:
            return cls._tensor_map(data, where)
        raise DocumentError(where, "an argument table needs 'buffer', 'scalar' or 'tensor_map'")

    @classmethod
    def _tensor_map(cls, data: dict, where: str) -> Arg:
        _only(data, _TENSOR_MAP_KEYS, where)
        _check_identifier(data["tensor_map"], where)
        for key in ("dtype", "dims", "box"):
            if key not in data:
                raise DocumentError(where, f"tensor map needs '{key}'")
        dtype = data["dtype"]
        if dtype not in TENSOR_MAP_DTYPES:
            raise DocumentError(where, f"tensor map dtype {dtype!r} is not one of {', '.join(TENSOR_MAP_DTYPES)}")
        dims = _expression_list(data["dims"], f"{where}.dims")
        rank = len(dims)
        if not 1 <= rank <= TENSOR_MAP_MAX_RANK:
            raise DocumentError(where, f"tensor map rank must be 1 to {TENSOR_MAP_MAX_RANK}, not {rank} (dims)")
        box = _expression_list(data["box"], f"{where}.box")
        if len(box) != rank:
            raise DocumentError(where, f"box has {len(box)} dimensions; dims has {rank}")
        strides = _expression_list(data.get("strides", []), f"{where}.strides")
        if len(strides) != rank - 1:
            raise DocumentError(where, f"strides lists the byte strides of dims 1 .. rank-1: {rank - 1} "
                                       f"expression(s) for rank {rank}, not {len(strides)}")
        swizzle = data.get("swizzle", "none")
        if swizzle not in TENSOR_MAP_SWIZZLES:
            raise DocumentError(where, f"swizzle {swizzle!r} is not one of {', '.join(TENSOR_MAP_SWIZZLES)}")
        l2 = data.get("l2_promotion", "256B")
        if l2 not in TENSOR_MAP_L2_PROMOTIONS:
            raise DocumentError(where, f"l2_promotion {l2!r} is not one of {', '.join(TENSOR_MAP_L2_PROMOTIONS)}")
        arg = cls(ArgKind.TENSOR_MAP, name=data["tensor_map"], type=dtype, dims=dims, strides=strides, box=box,
                  swizzle=swizzle, l2_promotion=l2)
        # Whatever is already a number is checked now; the rest when the plan is resolved.
        _check_tensor_map(arg, [d if isinstance(d, int) else None for d in dims],
                          [d if isinstance(d, int) else None for d in strides],
                          [b if isinstance(b, int) else None for b in box], where)
        return arg


@dataclass(frozen=True)
class TensorMap:
    """A resolved tensor map: what cuTensorMapEncodeTiled needs besides the buffer's address."""

    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, dims 1 .. rank-1
    box: tuple[int, ...]
    swizzle: str
    l2_promotion: str

    @property
    def element_bytes(self) -> int:
        return TENSOR_MAP_DTYPES[self.dtype][1]

    @property
    def extent_bytes(self) -> int:
        """Bytes from the map's first element to just past its last one."""
        last = sum((d - 1) * s for d, s in zip(self.dims[1:], self.strides)) + (self.dims[0] - 1) * self.element_bytes
        return last + self.element_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "dims": list(self.dims), "strides": list(self.strides), "box": list(self.box),
                "swizzle": self.swizzle, "l2_promotion": self.l2_promotion}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorMap:
        return cls(data["dtype"], tuple(int(d) for d in data["dims"]), tuple(int(s) for s in data["strides"]),
                   tuple(int(b) for b in data["box"]), data["swizzle"], data["l2_promotion"])


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
        parsed = tuple(Launch.from_dict(x, f"{where}.launch[{i}]") for i, x in enumerate(launches))
        for i, launch in enumerate(parsed):
            for j, arg in enumerate(launch.args):
                if arg.kind is ArgKind.TENSOR_MAP and arch not in TENSOR_MAP_ARCHES:
                    raise DocumentError(f"{where}.launch[{i}].args[{j}]",
                                        f"tensor maps need arch {' or '.join(TENSOR_MAP_ARCHES)}, not {arch}")
        return cls(
            name=str(data["name"]),
            problem=str(data["problem"]),
            source=source,
            arch=arch,
            supports=supports,
            supports_reason=str(data.get("supports_reason", "")),
            nvcc_flags=tuple(flags),
            scratch=tuple(Scratch.from_dict(s, f"{where}.scratch[{i}]") for i, s in enumerate(scratch)),
            launches=parsed,
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
    # ("buffer", name, "") | ("scalar", value, type) | ("tensor_map", buffer name, TensorMap)
    args: tuple[tuple[str, Any, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "grid": list(self.grid), "block": list(self.block), "shared": self.shared,
                "args": [[kind, value, extra.to_dict() if isinstance(extra, TensorMap) else extra]
                         for kind, value, extra in self.args]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResolvedLaunch:
        args = tuple((kind, value, TensorMap.from_dict(extra) if kind == ArgKind.TENSOR_MAP.value else extra)
                     for kind, value, extra in data["args"])
        return cls(data["entry"], tuple(data["grid"]), tuple(data["block"]), int(data["shared"]), args)


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
            elif arg.kind is ArgKind.TENSOR_MAP:
                if arg.name not in buffers:
                    raise DocumentError(where, f"tensor map over unknown buffer '{arg.name}' "
                                               f"(known: {', '.join(sorted(buffers))})")
                here = f"{where}.args[{j}]"
                dims = tuple(_evaluate(expr.evaluate_int, d, env, f"{here}.dims") for d in arg.dims)
                strides = tuple(_evaluate(expr.evaluate_int, s, env, f"{here}.strides") for s in arg.strides)
                box = tuple(_evaluate(expr.evaluate_int, b, env, f"{here}.box") for b in arg.box)
                _check_tensor_map(arg, list(dims), list(strides), list(box), here)
                args.append(("tensor_map", arg.name, TensorMap(arg.type, dims, strides, box, arg.swizzle,
                                                               arg.l2_promotion)))
            else:
                value = _evaluate(expr.evaluate, arg.value, env, f"{where}.args[{j}]")
                args.append(("scalar", float(value) if arg.type.startswith("f") else int(value), arg.type))
        resolved.append(ResolvedLaunch(launch.entry, grid, block, shared, tuple(args)))
    return resolved


def _expression_list(value: Any, where: str) -> tuple[str | int, ...]:
    if not isinstance(value, list):
        raise DocumentError(where, f"must be a list of expressions, not {value!r}")
    for item in value:
        _check_expr(item, where)
    return tuple(value)


def _check_tensor_map(arg: Arg, dims: list[int | None], strides: list[int | None], box: list[int | None],
                      where: str) -> None:
    """The limits of cuTensorMapEncodeTiled (interleave none) on whichever values are known."""
    name = f"tensor map '{arg.name}'"
    element = TENSOR_MAP_DTYPES[arg.type][1]
    for i, d in enumerate(dims):
        if d is not None and not 1 <= d <= TENSOR_MAP_MAX_DIM:
            raise DocumentError(where, f"{name}: dims[{i}] = {d} is outside 1 .. 2**32")
    for i, s in enumerate(strides):
        if s is not None and (s <= 0 or s % TENSOR_MAP_ALIGN or s >= TENSOR_MAP_MAX_STRIDE):
            raise DocumentError(where, f"{name}: strides[{i}] = {s} bytes must be a positive multiple of "
                                       f"{TENSOR_MAP_ALIGN} below 2**40 (TMA needs 16-byte aligned rows)")
    for i, b in enumerate(box):
        if b is not None and not 1 <= b <= TENSOR_MAP_MAX_BOX:
            raise DocumentError(where, f"{name}: box[{i}] = {b} is outside 1 .. {TENSOR_MAP_MAX_BOX}")
    if box and box[0] is not None:
        inner = box[0] * element
        if inner % TENSOR_MAP_ALIGN:
            raise DocumentError(where, f"{name}: the box's inner extent is {inner} bytes "
                                       f"({box[0]} x {arg.type}); it must be a multiple of {TENSOR_MAP_ALIGN}")
        span = TENSOR_MAP_SWIZZLES[arg.swizzle][1]
        if span and inner > span:
            raise DocumentError(where, f"{name}: the box's inner extent is {inner} bytes ({box[0]} x {arg.type}); "
                                       f"swizzle {arg.swizzle} allows at most {span}")


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
