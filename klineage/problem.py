"""Problems: the contract users write to, loaded and validated.

A problem file is Python. It declares `OPERATOR`, named `CASES` (parameters and dtypes),
`make_inputs(case, seed, device)`, `reference(inputs)` in PyTorch, `OUTPUTS`, optional `vendor`,
`VENDOR_TIMING` (how the vendor path is timed: "eager", and "graph" for a CUDA-graph replay too),
`TOLERANCES`, `check` (custom correctness), `RUN_TO_RUN` (whether two runs must match bit for bit: `RunToRun`)
and `roofline(case)`, and an optional `SWEEP`: more named
cases, timed only (a gate that times every case, `TimingScope.EVERY_CASE`), spanning the shapes where a
mechanism starts or stops paying. A sweep case is checked by its timed outputs, not by the
correctness seeds, and the `SWEEP` table is left out of the problem's fingerprint
(`contract_source`): adding or changing one keeps every recorded verdict's key; a gate that times
it names its parameters instead. Append new sweep cases at the end of the table: a step timed while
it was shorter keeps serving the cases it timed (`pipeline.earlier_sweep_verdict`), so only the steps
a new case is meant to decide need timing again. Files written for the reference
KLineage implementation (`make_inputs(seed, device)`, `torch_ref(*inputs)`) load too, as one case.

Loading a problem executes its code: the gate does that only inside its sandboxed runner
(`klineage.gate.probe`); callers outside it use the `ProblemInfo` the probe returns.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

from klineage import expr
from klineage.errors import DocumentError
from klineage.fingerprint import normalize_source, sha256_text


class VendorTiming(str, Enum):
    """How the profile times a problem's vendor path. EAGER calls it as a user would; GRAPH replays
    one CUDA-graph capture of it, which removes the host's per-launch cost (a many-kernel Python path
    such as FLA's is otherwise timed partly on how busy the host is)."""

    EAGER = "eager"
    GRAPH = "graph"


class RunToRun(str, Enum):
    """What two runs of a kernel on the same inputs must agree on. BITWISE (the default) catches races that
    happen to land within tolerance; WITHIN_TOLERANCE is for operators whose right answer has no single bit
    pattern, such as a scatter-add by floating-point atomics (the vendor path's order varies too): each run
    is judged against the reference on its own."""

    BITWISE = "bitwise"
    WITHIN_TOLERANCE = "within_tolerance"


DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
               "uint8": 1, "bool": 1}


@dataclass(frozen=True)
class Tolerance:
    """Elementwise |out - ref| <= atol + rtol * |ref| everywhere, and ||out - ref|| / ||ref|| <= rel_l2."""

    rtol: float
    atol: float
    rel_l2: float

    def to_dict(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol": self.atol, "rel_l2": self.rel_l2}

    @classmethod
    def from_dict(cls, data: Any, where: str, base: Tolerance | None = None) -> Tolerance:
        """A tolerance table; the fields it leaves out come from `base` (all are required without one)."""
        fields = ("rtol", "atol", "rel_l2")
        if not isinstance(data, dict):
            raise DocumentError(where, "a tolerance is a table of rtol, atol and rel_l2")
        unknown = sorted(str(k) for k in set(data) - set(fields))
        if unknown:
            raise DocumentError(where, f"unknown tolerance field(s) {', '.join(unknown)}: use rtol, atol, rel_l2")
        missing = [k for k in fields if k not in data]
        if missing and base is None:
            raise DocumentError(where, f"missing {', '.join(missing)}")
        values = {k: data[k] if k in data else base.to_dict()[k] for k in fields}
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise DocumentError(where, f"{key} must be a number in [0, 1), got {value!r}")
        return cls(**{k: float(v) for k, v in values.items()})


DEFAULT_TOLERANCES = {
    "float64": Tolerance(rtol=1e-7, atol=1e-9, rel_l2=1e-9),
    "float32": Tolerance(rtol=1e-4, atol=1e-5, rel_l2=1e-5),
    "float16": Tolerance(rtol=1e-2, atol=1e-2, rel_l2=5e-3),
    "bfloat16": Tolerance(rtol=2e-2, atol=2e-2, rel_l2=1e-2),
}
EXACT = Tolerance(rtol=0.0, atol=0.0, rel_l2=0.0)
# The reference implementation judges with allclose(rtol=atol=1e-2): problems from other formats keep that.
REFERENCE_TOLERANCES = {d: Tolerance(rtol=1e-2, atol=1e-2, rel_l2=1e-2) for d in ("float32", "float16", "bfloat16")}


def tolerance_for(dtype: str, overrides: dict[str, Tolerance], output: str | None = None) -> Tolerance:
    """The tolerance an output is judged with: its own entry, else its dtype's, else the dtype default."""
    if output is not None and output in overrides:
        return overrides[output]
    if dtype in overrides:
        return overrides[dtype]
    return DEFAULT_TOLERANCES.get(dtype, EXACT)


def parse_tolerances(raw: Any, outputs: tuple[OutputSpec, ...], where: str) -> dict[str, Tolerance]:
    """A problem's TOLERANCES: keys are float dtype names (every output of that dtype) or output names
    (that output alone, e.g. a small-magnitude `lse` beside a large `out`). A partial entry fills the
    rest from its dtype's own defaults; an output's entry from its dtype's (overridden) tolerance."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DocumentError(where, "TOLERANCES must be a dict of dtype or output name -> {rtol, atol, rel_l2}")
    by_output = {o.name: o for o in outputs}
    clash = sorted(set(by_output) & set(DTYPES))
    if clash:
        raise DocumentError(where, f"output(s) named like a dtype ({', '.join(clash)}) cannot take a tolerance")
    tolerances: dict[str, Tolerance] = {}
    for key, entry in raw.items():
        if key in DEFAULT_TOLERANCES:
            tolerances[key] = Tolerance.from_dict(entry, f"{where}: TOLERANCES[{key!r}]", DEFAULT_TOLERANCES[key])
        elif key in DTYPES:
            raise DocumentError(where, f"TOLERANCES[{key!r}]: {key} outputs are compared exactly; a tolerance "
                                       "would never be used")
        elif key not in by_output:
            raise DocumentError(where, f"TOLERANCES key {key!r} is neither a float dtype "
                                       f"({', '.join(DEFAULT_TOLERANCES)}) nor an output ({', '.join(by_output)})")
    for key, entry in raw.items():
        if key in by_output:
            tolerances[key] = _output_tolerance(by_output[key], entry, tolerances, f"{where}: TOLERANCES[{key!r}]")
    return tolerances


def _output_tolerance(out: OutputSpec, entry: Any, dtype_entries: dict[str, Tolerance], where: str) -> Tolerance:
    if out.dtype not in DTYPES:  # the dtype is a case parameter: no single base to fill from
        return Tolerance.from_dict(entry, f"{where} (its dtype comes from case parameter '{out.dtype}')")
    if out.dtype not in DEFAULT_TOLERANCES:
        raise DocumentError(where, f"output '{out.name}' is {out.dtype}, compared exactly; a tolerance would never "
                                   "be used")
    return Tolerance.from_dict(entry, where, dtype_entries.get(out.dtype, DEFAULT_TOLERANCES[out.dtype]))


@dataclass(frozen=True)
class OutputSpec:
    name: str
    shape: tuple[str | int, ...]  # expressions over case parameters
    dtype: str  # a dtype name, or the name of a case parameter holding one

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, name: str, data: Any, where: str) -> OutputSpec:
        if not isinstance(data, dict) or "shape" not in data or "dtype" not in data:
            raise DocumentError(where, f"output '{name}' needs 'shape' (a list) and 'dtype'")
        shape = data["shape"]
        if not isinstance(shape, (list, tuple)) or not shape:
            raise DocumentError(where, f"output '{name}': shape must be a non-empty list")
        for dim in shape:
            if isinstance(dim, str):
                try:
                    expr.parse(dim)
                except DocumentError as exc:
                    raise DocumentError(where, f"output '{name}': {exc}") from None
            elif not isinstance(dim, int) or isinstance(dim, bool):
                raise DocumentError(where, f"output '{name}': dimension {dim!r} is not a number or expression")
        return cls(name=name, shape=tuple(shape), dtype=str(data["dtype"]))

    def resolve(self, params: dict[str, Any]) -> tuple[tuple[int, ...], str]:
        dims = tuple(expr.evaluate_int(d, {k: v for k, v in params.items() if not isinstance(v, str)})
                     for d in self.shape)
        dtype = params.get(self.dtype, self.dtype) if self.dtype not in DTYPES else self.dtype
        if dtype not in DTYPES:
            raise DocumentError(self.name, f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        return dims, dtype


@dataclass(frozen=True)
class Case:
    name: str
    params: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        return cls(name=data["name"], params=dict(data["params"]))


@dataclass(frozen=True)
class ProblemInfo:
    """Everything about a problem that can travel as JSON: what the web and the orchestrator see."""

    operator: str
    path: str
    fingerprint: str
    cases: tuple[Case, ...]
    headline: str
    outputs: tuple[OutputSpec, ...]
    tolerances: dict[str, Tolerance]
    roofline: dict[str, dict[str, float]]  # case -> {"flops", "bytes"}
    has_vendor: bool
    has_check: bool
    legacy: bool
    description: str = ""
    math: str = "fp32"  # the unit its flops run on, for the roofline: fp32 | tf32 | fp16 | bf16
    vendor_timing: tuple[VendorTiming, ...] = (VendorTiming.EAGER,)
    source_format: str = "klineage"  # the file's format: klineage, keyword, kernelbench, flashinfer
    sweep: tuple[Case, ...] = ()  # timing-only cases (SWEEP)
    run_to_run: RunToRun = RunToRun.BITWISE

    def case(self, name: str) -> Case:
        for case in self.cases + self.sweep:
            if case.name == name:
                return case
        raise DocumentError(self.operator, f"no case '{name}' (cases: {', '.join(c.name for c in self.cases)})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "path": self.path,
            "fingerprint": self.fingerprint,
            "cases": [c.to_dict() for c in self.cases],
            "headline": self.headline,
            "outputs": [o.to_dict() for o in self.outputs],
            "tolerances": {k: t.to_dict() for k, t in self.tolerances.items()},
            "roofline": self.roofline,
            "has_vendor": self.has_vendor,
            "has_check": self.has_check,
            "legacy": self.legacy,
            "description": self.description,
            "math": self.math,
            "vendor_timing": [t.value for t in self.vendor_timing],
            "source_format": self.source_format,
            **({"sweep": [c.to_dict() for c in self.sweep]} if self.sweep else {}),
            # only when it differs: every recorded problem description keeps its bytes
            **({"run_to_run": self.run_to_run.value} if self.run_to_run is not RunToRun.BITWISE else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProblemInfo:
        return cls(
            operator=data["operator"],
            path=data["path"],
            fingerprint=data["fingerprint"],
            cases=tuple(Case.from_dict(c) for c in data["cases"]),
            headline=data["headline"],
            outputs=tuple(OutputSpec.from_dict(o["name"], o, "outputs") for o in data["outputs"]),
            tolerances={k: Tolerance.from_dict(v, k) for k, v in data["tolerances"].items()},
            roofline=data["roofline"],
            has_vendor=data["has_vendor"],
            has_check=data["has_check"],
            legacy=data["legacy"],
            description=data.get("description", ""),
            math=data.get("math", "fp32"),
            vendor_timing=tuple(VendorTiming(t) for t in data.get("vendor_timing", ["eager"])),
            source_format=data.get("source_format", "klineage"),
            sweep=tuple(Case.from_dict(c) for c in data.get("sweep", [])),
            run_to_run=RunToRun(data.get("run_to_run", RunToRun.BITWISE.value)),
        )


@dataclass
class Problem:
    """A loaded problem module. Only the sandboxed runner and trusted bundled files build one."""

    info: ProblemInfo
    make_inputs: Callable[[dict[str, Any], int, Any], dict[str, Any]]
    reference: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]  # (inputs, case params)
    vendor: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    check: Callable[..., str | None] | None = None
    module: ModuleType | None = field(default=None, repr=False)


def load_problem(path: str | Path) -> Problem:
    """Execute a problem file and validate its declarations (not its numerics: see `validate_numerics`)."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise DocumentError(where, "problem file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DocumentError(where, "problem file is not UTF-8") from None
    module = exec_module(path, where)
    if hasattr(module, "torch_ref") and not hasattr(module, "CASES"):
        return _load_legacy(module, path, text)
    return _load_modern(module, path, text)


def exec_module(path: Path, where: str) -> ModuleType:
    name = f"klineage_problem_{sha256_text(str(path.resolve()))[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DocumentError(where, "cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # while it runs: @dataclass and pickling look their module up there
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # the user's file failed: say how, in its own words
        raise DocumentError(where, f"raised {type(exc).__name__} while loading: {exc}") from None
    finally:
        sys.modules.pop(name, None)
    return module


def _require_callable(module: ModuleType, name: str, arity: int | tuple[int, ...] | None, where: str) -> Callable:
    fn = getattr(module, name, None)
    if not callable(fn):
        raise DocumentError(where, f"must define a function '{name}'")
    if arity is not None:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        allowed = (arity,) if isinstance(arity, int) else arity
        if len(params) not in allowed:
            wanted = " or ".join(str(a) for a in allowed)
            raise DocumentError(where, f"'{name}' must take {wanted} positional parameters, takes {len(params)}")
    return fn


def _load_modern(module: ModuleType, path: Path, text: str) -> Problem:
    where = str(path)
    operator = getattr(module, "OPERATOR", None)
    if not isinstance(operator, str) or not operator.isidentifier():
        raise DocumentError(where, "OPERATOR must be an identifier string, e.g. 'row_softmax'")
    raw_cases = getattr(module, "CASES", None)
    if not isinstance(raw_cases, dict) or not raw_cases:
        raise DocumentError(where, "CASES must be a non-empty dict of case name -> parameters")
    cases = [_case(name, params, where) for name, params in raw_cases.items()]
    sweep = _sweep(getattr(module, "SWEEP", None), raw_cases, where)
    headline = getattr(module, "HEADLINE", cases[0].name)
    if headline not in raw_cases:
        raise DocumentError(where, f"HEADLINE '{headline}' is not one of the CASES")

    raw_outputs = getattr(module, "OUTPUTS", None)
    if not isinstance(raw_outputs, dict) or not raw_outputs:
        raise DocumentError(where, "OUTPUTS must be a dict of output name -> {shape, dtype}")
    outputs = tuple(OutputSpec.from_dict(name, spec, f"{where}: OUTPUTS") for name, spec in raw_outputs.items())
    for case in cases + sweep:
        for out in outputs:
            try:
                dims, _ = out.resolve(case.params)
            except DocumentError as exc:
                raise DocumentError(where, f"case '{case.name}', output '{out.name}': {exc}") from None
            if min(dims) < 1:
                raise DocumentError(where, f"case '{case.name}': output '{out.name}' has an empty shape {dims}")

    tolerances = parse_tolerances(getattr(module, "TOLERANCES", None), outputs, where)
    make_inputs = _require_callable(module, "make_inputs", 3, where)
    # reference/vendor take (inputs) or (inputs, case) when the answer depends on a parameter (top-k's k).
    reference = _require_callable(module, "reference", (1, 2), where)
    vendor = _require_callable(module, "vendor", (1, 2), where) if hasattr(module, "vendor") else None
    check = _require_callable(module, "check", 4, where) if hasattr(module, "check") else None
    roofline_fn = _require_callable(module, "roofline", 1, where)
    roofline = {}
    for case in cases + sweep:
        try:
            figures = roofline_fn(dict(case.params))
        except Exception as exc:
            raise DocumentError(where, f"roofline({case.name}) raised {type(exc).__name__}: {exc}") from None
        if not isinstance(figures, dict) or not {"flops", "bytes"} <= set(figures):
            raise DocumentError(where, f"roofline({case.name}) must return {{'flops': ..., 'bytes': ...}}")
        if figures["bytes"] <= 0 or figures["flops"] < 0:
            raise DocumentError(where, f"roofline({case.name}) must give positive bytes and non-negative flops")
        roofline[case.name] = {"flops": float(figures["flops"]), "bytes": float(figures["bytes"])}
    math_unit = getattr(module, "MATH", "fp32")
    if math_unit not in ("fp32", "tf32", "fp16", "bf16"):
        raise DocumentError(where, f"MATH must be fp32, tf32, fp16 or bf16, not {math_unit!r}")
    vendor_timing = _vendor_timing(getattr(module, "VENDOR_TIMING", ("eager",)), vendor is not None, where)
    run_to_run = getattr(module, "RUN_TO_RUN", RunToRun.BITWISE.value)
    if not isinstance(run_to_run, str) or run_to_run not in {r.value for r in RunToRun}:
        raise DocumentError(where, f"RUN_TO_RUN must be one of {', '.join(repr(r.value) for r in RunToRun)}, "
                                   f"not {run_to_run!r}")
    info = ProblemInfo(
        operator=operator,
        path=str(path),
        fingerprint=sha256_text(normalize_source(contract_source(text))),
        cases=tuple(cases),
        headline=headline,
        outputs=outputs,
        tolerances=tolerances,
        roofline=roofline,
        has_vendor=vendor is not None,
        has_check=check is not None,
        legacy=False,
        description=(module.__doc__ or "").strip(),
        math=math_unit,
        vendor_timing=vendor_timing,
        sweep=tuple(sweep),
        run_to_run=RunToRun(run_to_run),
    )
    return Problem(info=info, make_inputs=make_inputs, reference=_as_dict_fn(reference, outputs),
                   vendor=_as_dict_fn(vendor, outputs) if vendor else None, check=check, module=module)


def _case(name: Any, params: Any, where: str) -> Case:
    if not isinstance(name, str) or not name.isidentifier():
        raise DocumentError(where, f"case name {name!r} must be an identifier")
    if not isinstance(params, dict):
        raise DocumentError(where, f"case '{name}' must be a dict of parameters")
    for key, value in params.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise DocumentError(where, f"case '{name}': parameter name {key!r} must be an identifier")
        if isinstance(value, float) and not math.isfinite(value):
            raise DocumentError(where, f"case '{name}': parameter '{key}' is not finite")
        if not isinstance(value, (int, float, str, bool)):
            raise DocumentError(where, f"case '{name}': parameter '{key}' must be a number, bool or string")
        if isinstance(value, str) and key.endswith("dtype") and value not in DTYPES:
            raise DocumentError(where, f"case '{name}': dtype {value!r} is not one of {', '.join(DTYPES)}")
    return Case(name=name, params=dict(params))


def _sweep(raw: Any, raw_cases: dict[str, Any], where: str) -> list[Case]:
    """The timing-only cases: named like CASES, none of them one of the CASES."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise DocumentError(where, "SWEEP must be a dict of case name -> parameters")
    clash = sorted(set(raw) & set(raw_cases))
    if clash:
        raise DocumentError(where, f"SWEEP case(s) {', '.join(map(str, clash))} are also CASES: name them apart")
    return [_case(name, params, f"{where}: SWEEP") for name, params in raw.items()]


@functools.lru_cache(maxsize=64)  # every gate lookup fingerprints its problem; the text rarely changes
def contract_source(text: str) -> str:
    """The problem file without its top-level `SWEEP = {literal}` statement and the blank lines after it
    (write its comments inside the braces): what its fingerprint is taken of.
    A sweep adds timing-only cases; it changes nothing a recorded verdict judged, so adding one must
    not orphan them. A file that does not parse is fingerprinted whole (loading it fails anyway)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # hostile nesting: read, not parsed
        return text
    lines = text.splitlines(keepends=True)
    for node in reversed(tree.body):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "SWEEP" for t in targets) and _literal(node.value):
            end = node.end_lineno
            while end < len(lines) and not lines[end].strip():  # and the blank lines that set it apart
                end += 1
            del lines[node.lineno - 1:end]
    return "".join(lines)


def _literal(node: ast.expr | None) -> bool:
    """Only a plain literal table is left out: a `SWEEP = ...` that runs code (`CASES.update(...)`) could
    change what the problem judges, so it stays in the fingerprint."""
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return False
    return node is not None


def _vendor_timing(value: Any, has_vendor: bool, where: str) -> tuple[VendorTiming, ...]:
    allowed = ", ".join(repr(t.value) for t in VendorTiming)
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or not value:
        raise DocumentError(where, f"VENDOR_TIMING must be a non-empty tuple of {allowed}, not {value!r}")
    try:
        timing = tuple(VendorTiming(v) for v in value)
    except ValueError:
        raise DocumentError(where, f"VENDOR_TIMING: {value!r} names a mode other than {allowed}") from None
    if len(set(timing)) != len(timing):
        raise DocumentError(where, f"VENDOR_TIMING names a mode twice: {value!r}")
    if timing != (VendorTiming.EAGER,) and not has_vendor:
        raise DocumentError(where, "VENDOR_TIMING is set but the problem has no vendor function")
    return timing


LEGACY_CASE = "default"


def _load_legacy(module: ModuleType, path: Path, text: str) -> Problem:
    """The reference implementation's files: make_inputs(seed, device) and torch_ref(*inputs)."""
    where = str(path)
    legacy_make = _require_callable(module, "make_inputs", 2, where)
    torch_ref = _require_callable(module, "torch_ref", None, where)
    import torch

    try:
        sample = legacy_make(0, "cpu")
        expected = torch_ref(*_as_tuple(sample))
    except Exception as exc:
        raise DocumentError(where, f"legacy make_inputs/torch_ref raised {type(exc).__name__}: {exc}") from None
    inputs = _as_tuple(sample)
    results = _as_tuple(expected)
    if not all(isinstance(t, torch.Tensor) for t in (*inputs, *results)):
        raise DocumentError(where, "legacy make_inputs and torch_ref must produce tensors")
    outputs = tuple(
        OutputSpec(name=f"out{i}", shape=tuple(t.shape) or (1,), dtype=str(t.dtype).removeprefix("torch."))
        for i, t in enumerate(results)
    )
    input_names = [f"in{i}" for i in range(len(inputs))]
    nbytes = sum(t.numel() * t.element_size() for t in (*inputs, *results))
    info = ProblemInfo(
        operator=str(getattr(module, "OPERATOR", path.stem)),
        path=str(path),
        fingerprint=sha256_text(normalize_source(text)),
        cases=(Case(name=LEGACY_CASE, params={}),),
        headline=LEGACY_CASE,
        outputs=outputs,
        tolerances=dict(REFERENCE_TOLERANCES),
        roofline={LEGACY_CASE: {"flops": 0.0, "bytes": float(nbytes)}},
        has_vendor=False,
        has_check=False,
        legacy=True,
        description=(module.__doc__ or "").strip(),
    )

    def make_inputs(case: dict[str, Any], seed: int, device: Any) -> dict[str, Any]:
        return dict(zip(input_names, _as_tuple(legacy_make(seed, device))))

    def reference(named: dict[str, Any], case: dict[str, Any] | None = None) -> dict[str, Any]:
        return dict(zip((o.name for o in outputs), _as_tuple(torch_ref(*named.values()))))

    return Problem(info=info, make_inputs=make_inputs, reference=reference, module=module)


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _as_dict_fn(fn: Callable | None, outputs: tuple[OutputSpec, ...]) -> Callable | None:
    """Let reference/vendor return a tensor, a tuple or a dict; always hand back a dict by output name."""
    if fn is None:
        return None
    names = [o.name for o in outputs]
    takes_case = len(inspect.signature(fn).parameters) == 2

    def wrapped(inputs: dict[str, Any], case: dict[str, Any] | None = None) -> dict[str, Any]:
        if takes_case and case is None:
            raise DocumentError(fn.__name__, "takes the case parameters, but none were given")
        result = fn(inputs, dict(case)) if takes_case else fn(inputs)
        if isinstance(result, dict):
            missing = set(names) - set(result)
            if missing:
                raise DocumentError(fn.__name__, f"did not return outputs {sorted(missing)}")
            return {n: result[n] for n in names}
        values = _as_tuple(result)
        if len(values) != len(names):
            raise DocumentError(fn.__name__, f"returned {len(values)} outputs, OUTPUTS declares {len(names)}")
        return dict(zip(names, values))

    return wrapped


def validate_numerics(problem: Problem, device: str = "cpu") -> list[str]:
    """Refuse problems a do-nothing kernel could pass. Returns readable findings (empty means sound).

    Runs the smallest case: inputs must depend on the seed and be reproducible from it; reference
    outputs must be finite, not near zero, and must change when the inputs change.
    """
    import torch

    findings = []
    case = min(problem.info.cases, key=lambda c: math.prod(
        max(1, v) for v in c.params.values() if isinstance(v, int) and not isinstance(v, bool)))
    params = dict(case.params)
    first = problem.make_inputs(params, 0, device)
    again = problem.make_inputs(params, 0, device)
    other = problem.make_inputs(params, 1, device)
    if not isinstance(first, dict) or not first or not all(isinstance(t, torch.Tensor) for t in first.values()):
        return [f"make_inputs must return a non-empty dict of name -> tensor (case '{case.name}')"]
    for name, tensor in first.items():
        if not torch.equal(tensor, again[name]):
            findings.append(f"input '{name}' differs between two calls with the same seed")
    if all(torch.equal(first[n], other[n]) for n in first):
        findings.append("inputs do not change with the seed")
    ref_a = problem.reference({k: v.clone() for k, v in first.items()}, params)
    ref_b = problem.reference({k: v.clone() for k, v in other.items()}, params)
    for out in problem.info.outputs:
        a, b = ref_a[out.name], ref_b[out.name]
        dims, _ = out.resolve(params)
        if tuple(a.shape) != dims and not problem.info.legacy:
            findings.append(f"reference output '{out.name}' has shape {tuple(a.shape)}, OUTPUTS says {dims}")
            continue
        if a.dtype.is_floating_point:
            af, bf = a.double(), b.double()
            if not torch.isfinite(af).all():
                findings.append(f"reference output '{out.name}' is not finite for seed 0")
                continue
            scale = af.norm() / math.sqrt(max(1, af.numel()))
            if scale < 1e-6:
                findings.append(f"reference output '{out.name}' is near zero (rms {scale:.2e}): zeros would pass")
            elif (af - bf).norm() <= 1e-6 * af.norm():
                findings.append(f"reference output '{out.name}' does not change with the inputs")
        elif torch.equal(a, b) and a.numel() > 1:
            findings.append(f"reference output '{out.name}' does not change with the inputs")
    return findings
