"""FlashInfer trace definitions (the format of flashinfer-bench and the reference implementation's later
version): a JSON definition with `axes` (`const` with a value, or `var`), `inputs` and `outputs` (shapes as
lists of axis names, `null` for a scalar input; dtypes) and a `reference` Python source defining `run()`;
its workloads in a JSONL file, one per line (`{"definition", "workload": {"uuid", "axes", "inputs"}}` or the
bare workload), each input `random`, `scalar` (a value) or `safetensors` (a file and a tensor key).

Where the files are, as in both layouts: the definition at `ROOT/definitions/[OP_TYPE/]NAME.json`, its
workloads at `ROOT/workloads/[OP_TYPE/]NAME.jsonl` (or `NAME.jsonl` beside the definition), and safetensors
paths relative to ROOT (the folder holding `definitions/`, else the definition's folder); a path that leaves
ROOT is refused. Each workload is a case `w0`, `w1`, ... whose parameters are the const axes, the workload's
var axes, its scalar inputs and `workload` (its line index). Random floats are standard normal, random
integers uniform in [0, 64), drawn from the seed; safetensors inputs are the same for every seed. `run`
gets the inputs by name and its results are the outputs in the definition's order. There is no vendor path.

A small reader rather than the `flashinfer-bench` package: that package brings FlashInfer and TVM-FFI into
the runner to parse two JSON shapes; the fixtures in tests/fixtures/formats/flashinfer follow its schema.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any

from klineage.errors import DocumentError
from klineage.fingerprint import normalize_source, sha256_bytes, sha256_json, sha256_text
from klineage.problem import REFERENCE_TOLERANCES, Case, OutputSpec, Problem, ProblemInfo
from klineage.problem_formats.derived import result_tensors

# The schema's dtypes that the contract can hold (the float8/float4 ones cannot be compared here yet).
DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "bool")
INPUT_KINDS = ("random", "scalar", "safetensors")
RANDOM_INT_HIGH = 64
WORKLOAD = "workload"  # the case parameter holding the workload's line index (its inputs' sources)


def _object(value: Any, what: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise DocumentError(where, f"{what} must be an object")
    return value


def read_definition(path: Path) -> dict[str, Any]:
    where = str(path)
    try:
        definition = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DocumentError(where, f"not JSON: {exc}") from None
    definition = _object(definition, "a definition", where)
    for key in ("name", "axes", "inputs", "outputs", "reference"):
        if key not in definition:
            raise DocumentError(where, f"a trace definition needs '{key}'")
    axes = _object(definition["axes"], "axes", where)
    for name, axis in axes.items():
        axis = _object(axis, f"axis '{name}'", where)
        if not str(name).isidentifier():
            raise DocumentError(where, f"axis name {name!r} must be an identifier")
        if axis.get("type") == "const":
            if not isinstance(axis.get("value"), int) or isinstance(axis.get("value"), bool) or axis["value"] < 1:
                raise DocumentError(where, f"const axis '{name}' needs a positive integer value")
        elif axis.get("type") != "var":
            raise DocumentError(where, f"axis '{name}': type must be 'const' or 'var', not {axis.get('type')!r}")
    for group in ("inputs", "outputs"):
        for name, spec in _object(definition[group], group, where).items():
            spec = _object(spec, f"{group[:-1]} '{name}'", where)
            if not str(name).isidentifier():
                raise DocumentError(where, f"{group[:-1]} name {name!r} must be an identifier")
            if spec.get("dtype") not in DTYPES:
                raise DocumentError(where, f"{group[:-1]} '{name}': dtype {spec.get('dtype')!r} is not one of "
                                           f"{', '.join(DTYPES)}")
            shape = spec.get("shape")
            if shape is None and group == "inputs":
                continue  # a scalar input
            if not isinstance(shape, list) or not shape:
                raise DocumentError(where, f"{group[:-1]} '{name}': shape must be a non-empty list of axis names"
                                    + (" (scalar and 0-d outputs are not supported)" if group == "outputs" else ""))
            undefined = [a for a in shape if a not in axes]
            if undefined:
                raise DocumentError(where, f"{group[:-1]} '{name}' uses undefined axes {undefined}")
    if not isinstance(definition["reference"], str) or "def run(" not in definition["reference"]:
        raise DocumentError(where, "reference must be Python source defining run()")
    return definition


def trace_root(path: Path) -> Path:
    for parent in path.resolve().parents:
        if parent.name == "definitions":
            return parent.parent
    return path.resolve().parent


def workloads_file(path: Path) -> Path:
    path = path.resolve()
    root = trace_root(path)
    candidates = []
    if (root / "definitions") in path.parents:
        candidates.append(root / "workloads" / path.relative_to(root / "definitions").with_suffix(".jsonl"))
    candidates.append(path.with_suffix(".jsonl"))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise DocumentError(str(path), f"no workloads: looked for {' and '.join(str(c) for c in candidates)}")


def read_workloads(path: Path, definition: dict[str, Any]) -> list[dict[str, Any]]:
    source = workloads_file(path)
    workloads = []
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{source}:{number}"
        if not line.strip():
            continue
        try:
            row = _object(json.loads(line), "a workload line", where)
        except json.JSONDecodeError as exc:
            raise DocumentError(where, f"not JSON: {exc}") from None
        if "workload" in row:
            if row.get("definition") not in (None, definition["name"]):
                raise DocumentError(where, f"workload of '{row['definition']}', not '{definition['name']}'")
            row = _object(row["workload"], "workload", where)
        workloads.append(_checked_workload(row, definition, where))
    if not workloads:
        raise DocumentError(str(source), "no workloads in the file")
    return workloads


def _checked_workload(row: dict[str, Any], definition: dict[str, Any], where: str) -> dict[str, Any]:
    axes = _object(row.get("axes", {}), "workload axes", where)
    wanted = {n for n, a in definition["axes"].items() if a["type"] == "var"}
    if set(axes) != wanted:
        raise DocumentError(where, f"workload axes {sorted(axes)} are not the var axes {sorted(wanted)}")
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in axes.values()):
        raise DocumentError(where, "workload axis values must be positive integers")
    inputs = _object(row.get("inputs", {}), "workload inputs", where)
    if set(inputs) != set(definition["inputs"]):
        raise DocumentError(where, f"workload inputs {sorted(inputs)} are not the definition's "
                                   f"{sorted(definition['inputs'])}")
    for name, spec in inputs.items():
        kind = _object(spec, f"input '{name}'", where).get("type")
        if kind not in INPUT_KINDS:
            raise DocumentError(where, f"input '{name}': type {kind!r} is not one of {', '.join(INPUT_KINDS)}")
        scalar = definition["inputs"][name].get("shape") is None
        if scalar != (kind == "scalar"):
            raise DocumentError(where, f"input '{name}': a {'scalar' if scalar else 'tensor'} input cannot be {kind}")
        if kind == "scalar" and not isinstance(spec.get("value"), (int, float, bool)):
            raise DocumentError(where, f"input '{name}': a scalar needs a number or bool value")
        if kind == "safetensors":
            for key in ("path", "tensor_key"):
                if not isinstance(spec.get(key), str) or not spec[key]:
                    raise DocumentError(where, f"input '{name}': safetensors needs '{key}'")
    return {"uuid": str(row.get("uuid", "")), "axes": axes, "inputs": inputs}


def tensor_file(root: Path, relative: str, where: str) -> Path:
    candidate = (root / relative).resolve()
    if Path(relative).is_absolute() or not candidate.is_relative_to(root.resolve()):
        raise DocumentError(where, f"safetensors path {relative!r} leaves the trace folder {root}")
    if not candidate.is_file():
        raise DocumentError(where, f"safetensors file {candidate} not found")
    return candidate


def trace_files(path: Path) -> list[Path]:
    """The definition, its workloads and every safetensors file they name (for the fingerprint)."""
    path = Path(path)
    definition = read_definition(path)
    source = workloads_file(path)
    root = trace_root(path)
    tensors = sorted({tensor_file(root, spec["path"], str(source))
                      for w in read_workloads(path, definition) for spec in w["inputs"].values()
                      if spec["type"] == "safetensors"})
    return [path, source, *tensors]


def trace_fingerprint(path: Path) -> str:
    """A trace's content fingerprint: its normalized definition and the bytes of every file it reads,
    named relative to the definition (the same on every machine)."""
    files = trace_files(path)
    base = files[0].resolve().parent
    return sha256_json({
        "definition": sha256_text(normalize_source(files[0].read_text(encoding="utf-8"))),
        "files": {os.path.relpath(f.resolve(), base): sha256_bytes(f.read_bytes()) for f in files[1:]},
    })


def load(path: Path) -> Problem:
    import torch

    where = str(path)
    definition = read_definition(path)
    workloads = read_workloads(path, definition)
    root = trace_root(path)
    const = {n: a["value"] for n, a in definition["axes"].items() if a["type"] == "const"}
    tensor_inputs = [n for n, s in definition["inputs"].items() if s.get("shape") is not None]
    scalars = [n for n in definition["inputs"] if n not in tensor_inputs]
    cases = [Case(name=f"w{i}", params={**const, **w["axes"], **{n: w["inputs"][n]["value"] for n in scalars},
                                        WORKLOAD: i}) for i, w in enumerate(workloads)]
    outputs = tuple(OutputSpec(name=n, shape=tuple(s["shape"]), dtype=s["dtype"])
                    for n, s in definition["outputs"].items())
    files: dict[Path, dict[str, Any]] = {}

    def shape_of(name: str, params: dict[str, Any]) -> tuple[int, ...]:
        return tuple(params[a] for a in definition["inputs"][name]["shape"])

    def make_inputs(case: dict[str, Any], seed: int, device: Any) -> dict[str, Any]:
        workload = workloads[case[WORKLOAD]]
        generator = torch.Generator(device="cpu").manual_seed(seed)
        inputs = {}
        for name in tensor_inputs:
            spec, declared = workload["inputs"][name], definition["inputs"][name]
            dtype, shape = getattr(torch, declared["dtype"]), shape_of(name, case)
            if spec["type"] == "safetensors":
                file = tensor_file(root, spec["path"], where)
                if file not in files:
                    from safetensors.torch import load_file  # only traces with tensor files need the package

                    files[file] = load_file(str(file))
                tensors = files[file]
                if spec["tensor_key"] not in tensors:
                    raise DocumentError(str(file), f"no tensor '{spec['tensor_key']}' (input '{name}')")
                tensor = tensors[spec["tensor_key"]]
                if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                    raise DocumentError(str(file), f"tensor '{spec['tensor_key']}' is {tuple(tensor.shape)} "
                                                   f"{tensor.dtype}; input '{name}' needs {shape} {dtype}")
            elif dtype.is_floating_point:
                tensor = torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
            else:
                high = 2 if dtype == torch.bool else RANDOM_INT_HIGH
                tensor = torch.randint(0, high, shape, generator=generator).to(dtype)
            inputs[name] = tensor.to(device)
        return inputs

    module = types.ModuleType(f"klineage_trace_{sha256_text(where)[:12]}")
    try:
        exec(compile(definition["reference"], f"{where}:reference", "exec"), vars(module))  # noqa: S102 (sandbox)
    except Exception as exc:
        raise DocumentError(where, f"the reference raised {type(exc).__name__} while loading: {exc}") from None
    if not callable(getattr(module, "run", None)):
        raise DocumentError(where, "the reference defines no function run()")
    names = [o.name for o in outputs]

    def reference(inputs: dict[str, Any], case: dict[str, Any] | None = None) -> dict[str, Any]:
        params = case or cases[0].params
        result = module.run(**inputs, **{n: params[n] for n in scalars})
        if isinstance(result, dict):
            return {n: result[n] for n in names}
        values = result_tensors(result, where)
        if len(values) != len(names):
            raise DocumentError(where, f"run() returned {len(values)} outputs, the definition declares {len(names)}")
        return dict(zip(names, values))

    def traffic(params: dict[str, Any]) -> float:
        sizes = [(shape_of(n, params), definition["inputs"][n]["dtype"]) for n in tensor_inputs]
        sizes += [out.resolve(params) for out in outputs]
        return float(sum(torch.Size(s).numel() * getattr(torch, d).itemsize for s, d in sizes))

    info = ProblemInfo(
        operator=str(definition["name"]).replace("-", "_"),
        path=where,
        fingerprint=trace_fingerprint(path),
        cases=tuple(cases),
        headline=cases[0].name,
        outputs=outputs,
        tolerances=dict(REFERENCE_TOLERANCES),
        roofline={c.name: {"flops": 0.0, "bytes": traffic(c.params)} for c in cases},
        has_vendor=False,
        has_check=False,
        legacy=False,
        description=str(definition.get("description", "")),
        source_format="flashinfer",
    )
    return Problem(info=info, make_inputs=make_inputs, reference=reference, module=module)
