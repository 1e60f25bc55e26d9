"""What the foreign formats leave implicit, derived the same way for each: output shapes and dtypes per
case (by running the reference on fake tensors, which costs no arithmetic), case parameters taken from
keyword defaults, and a traffic-only roofline. Runs problem code: only inside the sandboxed runner."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from klineage.errors import DocumentError
from klineage.fingerprint import normalize_source, sha256_text
from klineage.problem import DTYPES, REFERENCE_TOLERANCES, Case, OutputSpec, Problem, ProblemInfo, parse_tolerances


def dtype_name(dtype: Any) -> str:
    """A torch dtype as one of the contract's names; anything else is refused by name."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise DocumentError("dtype", f"{name} is not one of {', '.join(DTYPES)}")
    return name


def parameter_value(name: str, value: Any, where: str) -> Any:
    """A keyword default or module constant as a case parameter (a number, bool, string or dtype name)."""
    import torch

    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise DocumentError(where, f"parameter '{name}' = {value!r} is not a number, bool, string or torch dtype")


def as_argument(value: Any) -> Any:
    """A case parameter as the problem's own code expects it (dtype names back to torch dtypes)."""
    import torch

    return getattr(torch, value) if isinstance(value, str) and value in DTYPES and value != "bool" else value


def result_tensors(result: Any, where: str) -> tuple:
    import torch

    values = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        raise DocumentError(where, "the reference must return a tensor or a tuple of tensors")
    return values


def infer_outputs(names: list[str] | None, cases: list[Case], run: Callable[[Case], tuple], where: str
                  ) -> tuple[tuple[OutputSpec, ...], list[Case]]:
    """Output specs from the reference's results on every case. A dimension equal on every case is a
    number; one equal to a case parameter on every case is that parameter; any other is a new case
    parameter `<output>_dim<i>` (so a plan can size a grid from it)."""
    shapes: list[list[tuple[int, ...]]] = []
    dtypes: list[str] = []
    for case in cases:
        results = run(case)
        if names is not None and len(results) != len(names):
            raise DocumentError(where, f"case '{case.name}': the reference returned {len(results)} outputs, "
                                       f"the definition declares {len(names)}")
        if dtypes and len(results) != len(dtypes):
            raise DocumentError(where, f"case '{case.name}': the reference returned {len(results)} outputs, "
                                       f"{len(dtypes)} on case '{cases[0].name}'")
        found = [dtype_name(t.dtype) for t in results]
        if dtypes and found != dtypes:
            raise DocumentError(where, f"case '{case.name}': output dtypes {found} differ from {dtypes}")
        dtypes = found
        shapes.append([tuple(t.shape) or (1,) for t in results])
    names = names or [f"out{i}" for i in range(len(dtypes))]
    extra: list[dict[str, int]] = [{} for _ in cases]
    outputs = []
    for index, name in enumerate(names):
        ranks = {len(per_case[index]) for per_case in shapes}
        if len(ranks) != 1:
            raise DocumentError(where, f"output '{name}' changes rank between cases")
        dims: list[str | int] = []
        for axis in range(ranks.pop()):
            values = [per_case[index][axis] for per_case in shapes]
            if len(set(values)) == 1:
                dims.append(values[0])
                continue
            same = [k for k, v in cases[0].params.items() if all(c.params.get(k) == n and type(c.params.get(k)) is int
                                                               for c, n in zip(cases, values))]
            if same:
                dims.append(same[0])
                continue
            param = f"{name}_dim{axis}"
            for params, value in zip(extra, values):
                params[param] = value
            dims.append(param)
        outputs.append(OutputSpec(name=name, shape=tuple(dims), dtype=dtypes[index]))
    cases = [Case(name=c.name, params={**c.params, **more}) for c, more in zip(cases, extra)]
    return tuple(outputs), cases


def fake_run(call: Callable[[], Any]) -> Any:
    """Run `call` on fake tensors (shapes and dtypes only); data-dependent code runs for real instead."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return call()
    except Exception:  # .item(), .tolist() or an operator without a fake kernel: compute it
        return call()


def traffic_roofline(inputs: dict[str, Any], outputs: tuple) -> dict[str, float]:
    """Bytes read and written once, and no flop count: these formats do not declare one."""
    tensors = [*inputs.values(), *outputs]
    return {"flops": 0.0, "bytes": float(sum(t.numel() * t.element_size() for t in tensors))}


def module_problem(module: ModuleType, path: Path, cases: list[Case], make_inputs: Callable, run: Callable, *,
                   source_format: str, what: str, vendor: bool = False) -> Problem:
    """A Python-module problem of a foreign format: `run(inputs, case params)` gives its result tensors,
    from which the outputs, any extra size parameters and the roofline are derived. `HEADLINE`,
    `OPERATOR` and `TOLERANCES` beside the format's own names work as in this project's files."""
    where = str(path)
    roofline = {}

    def shapes(case: Case) -> tuple:
        inputs = make_inputs(case.params, 0, "cpu")
        outputs = fake_run(lambda: run(inputs, case.params))
        roofline[case.name] = traffic_roofline(inputs, outputs)
        return outputs

    try:
        outputs, cases = infer_outputs(None, cases, shapes, where)
    except DocumentError:
        raise
    except Exception as exc:
        raise DocumentError(where, f"{what} raised {type(exc).__name__}: {exc}") from None
    names = [o.name for o in outputs]

    def reference(inputs: dict[str, Any], case: dict[str, Any] | None = None) -> dict[str, Any]:
        return dict(zip(names, run(inputs, case or cases[0].params)))

    headline = getattr(module, "HEADLINE", cases[0].name)
    if headline not in {c.name for c in cases}:
        raise DocumentError(where, f"HEADLINE '{headline}' is not one of the cases")
    declared = getattr(module, "TOLERANCES", None)
    info = ProblemInfo(
        operator=str(getattr(module, "OPERATOR", path.stem)),
        path=where,
        fingerprint=sha256_text(normalize_source(path.read_text(encoding="utf-8"))),
        cases=tuple(cases),
        headline=headline,
        outputs=outputs,
        tolerances=dict(REFERENCE_TOLERANCES) if declared is None else parse_tolerances(declared, outputs, where),
        roofline=roofline,
        has_vendor=vendor,
        has_check=False,
        legacy=False,
        description=(module.__doc__ or "").strip(),
        source_format=source_format,
    )
    return Problem(info=info, make_inputs=make_inputs, reference=reference, vendor=reference if vendor else None,
                   module=module)
