"""The kinds of job, one entry each: everything that differs from one kind to another.

An entry says what a kind takes (the keys of its parameters, and the function that checks what people
submit), whether it needs a GPU, the functions that do its work in each process (the worker's
handler, the child's runner and the job page's presenter) and the template of its job page. The functions
are named "module:function" and imported when first used, so this module imports neither Django nor any
other module of the app: the job's child (which never imports Django) finds its runner here, and the
modules holding the functions may import this one without closing a circle.

Adding a kind is adding an entry to BUILT_IN (with the functions and the page it names). Tests add kinds of their own
without touching it: the module that KLINEAGE_JOB_KINDS_MODULE names (importable, with a KINDS tuple of
JobKind) joins its kinds to these wherever the registry is read - the web server, a worker, the job's
child, which all inherit the variable. Only the built-in kinds are the database's choices.
"""

from __future__ import annotations

import enum
import functools
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from inspect import signature
from typing import Any

MODULE_ENV = "KLINEAGE_JOB_KINDS_MODULE"


class Needs(enum.StrEnum):
    """What a worker must have to run a job (the values Job.needs stores)."""

    CPU = "cpu"
    GPU = "gpu"


class Device(enum.Enum):
    """Where a kind's jobs run."""

    CPU = "any worker"
    GATE_MODE = "a GPU worker when its gate mode is gpu, else any worker (compile-only and replayed gates)"

    def needs(self, params: Mapping[str, Any]) -> Needs:
        if self is Device.GATE_MODE and params.get("mode", "gpu") == "gpu":
            return Needs.GPU
        return Needs.CPU


class Offered(enum.Enum):
    """Where people may submit a kind (the app queues the others itself)."""

    NOWHERE = "queued by the app only"
    PAGE = "the /optimize/ page"
    PAGE_AND_API = "the /optimize/ page and POST /api/jobs/"


class KindError(ValueError):
    """An unknown kind, parameters a kind does not take, or a malformed entry."""


@functools.cache
def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class JobKind:
    name: str
    label: str
    device: Device
    handler: str  # "module:function": the worker's side, given a gate_app.handlers.JobContext
    runner: str  # "module:function": the child's side, given the payload and a gate_app.child.Channel
    required: frozenset[str] = frozenset()  # the keys of a job's parameters
    optional: frozenset[str] = frozenset()  # keys it may have too (absent from jobs queued before they existed)
    offered: Offered = Offered.NOWHERE
    check: str = ""  # "module:function": check(kernel, **options) -> the checked parameters of a submission
    form: str = ""  # "module:FormClass": its form on the /optimize/ page
    presenter: str = ""  # "module:function": present(result, params) -> what a finished job's page adds to its context
    page: str = ""  # its job page's template, which extends gate_app/job.html (that page itself when empty)

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or not self.name.islower():
            raise KindError(f"a job kind's name is a lower-case identifier, not {self.name!r}")
        for field in ("handler", "runner", "check", "form", "presenter"):
            ref = getattr(self, field)
            if ref and (ref.count(":") != 1 or not all(ref.partition(":")[::2])):
                raise KindError(f"job kind {self.name}: {field} must be 'module:name', not {ref!r}")
        if self.required & self.optional:
            raise KindError(f"job kind {self.name}: {sorted(self.required & self.optional)} both required and optional")
        if self.page and not self.page.endswith(".html"):
            raise KindError(f"job kind {self.name}: page must name a template (.html), not {self.page!r}")
        if (self.offered is not Offered.NOWHERE) != bool(self.check and self.form):
            raise KindError(f"job kind {self.name}: a kind people submit has a check and a form, and only such a kind")

    def needs(self, params: Mapping[str, Any]) -> Needs:
        return self.device.needs(params)

    def check_keys(self, params: Mapping[str, Any]) -> None:
        """KindError unless `params` has every required key and no key the kind does not know."""
        if not self.required <= set(params) <= self.required | self.optional:
            raise KindError(f"{self.name} parameters must be exactly {sorted(self.required)}"
                            + (f" (and optionally {sorted(self.optional)})" if self.optional else "")
                            + f", not {sorted(params)}")

    @property
    def handle(self) -> Callable[..., Any]:
        return _load(self.handler)

    @property
    def run(self) -> Callable[..., dict[str, Any]]:
        return _load(self.runner)

    @property
    def check_params(self) -> Callable[..., dict[str, Any]]:
        return _load(self.check)

    def options(self) -> list[str]:
        """What a submission may set besides the kernel: the check's keyword parameters."""
        return [name for name in signature(self.check_params).parameters if name != "kernel"]

    @property
    def form_class(self) -> type:
        return _load(self.form)

    def present(self, result: Any, params: dict[str, Any]) -> dict[str, Any]:
        """What the page of a job of this kind that succeeded shows beyond its result (nothing without a presenter)."""
        return _load(self.presenter)(result, params) if self.presenter else {}


_REWRITING_KEYS = frozenset({"problem", "kernel", "rewriter", "mode"})  # walks and optimizations

BUILT_IN = (
    JobKind("gate", "gate", Device.GATE_MODE, handler="gate_app.work:run_gate_job",
            runner="gate_app.runners:run_gate_payload", required=frozenset({"problem", "kernel"}),
            optional=frozenset({"against", "mode", "cases", "policy", "record"}), offered=Offered.PAGE,
            check="gate_app.submit:gate_job_params", form="gate_app.forms:GateForm",
            presenter="gate_app.presenters:gate_job", page="gate_app/kinds/gate.html"),
    JobKind("walk", "backward walk", Device.GATE_MODE, handler="gate_app.work:run_walk_job",
            runner="gate_app.runners:run_walk_payload", required=_REWRITING_KEYS | {"max_steps", "max_rejections"},
            offered=Offered.PAGE_AND_API, check="gate_app.submit:walk_params", form="gate_app.forms:WalkForm",
            presenter="gate_app.presenters:walk_job", page="gate_app/kinds/walk.html"),
    JobKind("optimize", "optimize", Device.GATE_MODE, handler="gate_app.work:run_optimize_job",
            runner="gate_app.runners:run_optimize_payload",
            required=_REWRITING_KEYS | {"strategy", "statuses", "scope", "budget", "seed"},
            optional=frozenset({"time_limit_s", "library"}), offered=Offered.PAGE_AND_API,
            check="gate_app.submit:optimize_params",
            form="gate_app.forms:OptimizeForm", presenter="gate_app.presenters:optimize_job",
            page="gate_app/kinds/optimize.html"),
    JobKind("fit", "library fit", Device.CPU, handler="gate_app.work:run_fit_job",
            runner="gate_app.runners:run_fit_payload", required=frozenset({"problem", "kernel", "library", "statuses"}),
            offered=Offered.PAGE_AND_API, check="gate_app.submit:fit_params", form="gate_app.forms:FitForm",
            presenter="gate_app.presenters:fit_job", page="gate_app/kinds/fit.html"),
    JobKind("probe", "problem probe", Device.CPU, handler="gate_app.work:run_probe_job",
            runner="gate_app.runners:run_probe_payload", required=frozenset({"problem"}),
            page="gate_app/kinds/probe.html"),
)


def registry() -> dict[str, JobKind]:
    """Every kind known here: the built-in ones, then those of the module KLINEAGE_JOB_KINDS_MODULE names."""
    found = {kind.name: kind for kind in BUILT_IN}
    module = os.environ.get(MODULE_ENV, "").strip()
    if module:
        for kind in importlib.import_module(module).KINDS:
            if kind.name in found:
                raise KindError(f"{module} ({MODULE_ENV}) defines job kind {kind.name!r} again")
            found[kind.name] = kind
    return found


def get(name: str) -> JobKind:
    known = registry()
    if name not in known:
        raise KindError(f"unknown job kind {name!r} (known: {', '.join(sorted(known))})")
    return known[name]


def offered(*where: Offered) -> dict[str, JobKind]:
    """The kinds people may submit where `where` says."""
    return {name: kind for name, kind in registry().items() if kind.offered in where}


def choices() -> list[tuple[str, tuple[str, str]]]:
    """The built-in kinds as the members of Job.Kind (its name, then the value and label the database keeps)."""
    return [(kind.name.upper(), (kind.name, kind.label)) for kind in BUILT_IN]
