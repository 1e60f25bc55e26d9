"""The reference implementation's keyword files:

    def make_inputs(*, batch=8, dim=1024, dtype=torch.float16, device="cuda", seed=0) -> dict[str, Tensor]
    def torch_ref(x, w, *, eps=1e-6) -> Tensor | tuple[Tensor, ...]

The keyword parameters' defaults (of both functions, less `seed` and `device`) are the case parameters a
launch plan can use; without a `CASES` table the file is one case, `default`. A `CASES` table beside it
names cases that override some of those defaults, e.g. `CASES = {"small": {"batch": 2}}`; `HEADLINE` and
`TOLERANCES` work as in this project's files. torch_ref receives the tensors by name and the keyword
parameters it declares (every case parameter when it takes `**params`); its results are the outputs
`out0`, `out1`, ...
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from klineage.errors import DocumentError
from klineage.problem import Case, Problem, exec_module
from klineage.problem_formats.derived import as_argument, module_problem, parameter_value, result_tensors

DEFAULT_CASE = "default"
_NOT_SIZES = ("seed", "device")


def _keyword_defaults(fn: Any, where: str) -> dict[str, Any]:
    params = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and p.name not in _NOT_SIZES:
            if p.default is p.empty:
                raise DocumentError(where, f"'{fn.__name__}': keyword '{p.name}' needs a default (its case value)")
            params[p.name] = parameter_value(p.name, p.default, where)
    return params


def _cases(module: Any, defaults: dict[str, Any], where: str) -> list[Case]:
    raw = getattr(module, "CASES", None)
    if raw is None:
        return [Case(name=DEFAULT_CASE, params=dict(defaults))]
    if not isinstance(raw, dict) or not raw:
        raise DocumentError(where, "CASES must be a non-empty dict of case name -> parameter overrides")
    cases = []
    for name, overrides in raw.items():
        if not isinstance(name, str) or not name.isidentifier() or not isinstance(overrides, dict):
            raise DocumentError(where, f"case {name!r} must be an identifier naming a dict of parameters")
        unknown = sorted(set(overrides) - set(defaults))
        if unknown:
            raise DocumentError(where, f"case '{name}': {', '.join(unknown)} not among the keyword parameters "
                                       f"({', '.join(defaults)})")
        cases.append(Case(name=name, params={**defaults, **{k: parameter_value(k, v, where)
                                                             for k, v in overrides.items()}}))
    return cases


def load(path: Path) -> Problem:
    where = str(path)
    module = exec_module(path, where)
    make, ref = module.make_inputs, module.torch_ref
    make_sizes = _keyword_defaults(make, where)
    ref_params = _keyword_defaults(ref, where)
    accepts = set(inspect.signature(make).parameters)
    if not {"seed", "device"} <= accepts:
        raise DocumentError(where, "'make_inputs' must take the keywords seed and device")
    defaults = {**ref_params, **make_sizes}
    cases = _cases(module, defaults, where)

    def make_inputs(case: dict[str, Any], seed: int, device: Any) -> dict[str, Any]:
        sizes = {k: as_argument(case[k]) for k in make_sizes}
        inputs = make(seed=seed, device=device, **sizes)
        if not isinstance(inputs, dict):
            raise DocumentError(where, "make_inputs must return a dict of name -> tensor")
        return inputs

    # torch_ref(**tensors, **params): a reference taking **params gets every case parameter, else those it names.
    takes_all = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(ref).parameters.values())

    def run(inputs: dict[str, Any], case: dict[str, Any]) -> tuple:
        wanted = case if takes_all else {k: case[k] for k in ref_params}
        return result_tensors(ref(**inputs, **{k: as_argument(v) for k, v in wanted.items()}), where)

    return module_problem(module, path, cases, make_inputs, run, source_format="keyword",
                          what="make_inputs/torch_ref")
