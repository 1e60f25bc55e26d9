"""What the foreign formats leave implicit, derived the same way for each: output shapes and dtypes per
case (by running the reference on fake tensors, which costs no arithmetic), case parameters taken from
keyword defaults, and a traffic-only roofline. Runs problem code: only inside the sandboxed runner."""

from __future__ import annotations

import math
from typing import Any, Callable

from klineage.errors import DocumentError
from klineage.problem import DTYPES, Case, OutputSpec


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
