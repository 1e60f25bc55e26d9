"""Uploads from the /upload/ page: a problem file, a kernel (source and launch plan), or both.

Nothing uploaded runs here. A problem file is checked as text only (size, UTF-8, its name), stored
content-addressed by klineage.uploads, and probed by a CPU `probe` job whose child runs the
sandboxed runner; the job records what the probe found, or its refusal, on the Problem row. A
kernel's plan is parsed by the engine, its expressions are evaluated for every case of its problem
(where the problem's cases are known: a bundled problem, or an uploaded one already probed), and its
source passes the gate's static check before anything is stored; a refusal stores nothing and says
why. Everything is checked before anything is written, so one bad file of an upload stores none of it;
the same content uploaded again creates nothing new.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from django.db import transaction

from gate_app import queue
from gate_app.models import Job
from klineage import corpus, devices, expr, uploads
from klineage.errors import DocumentError
from klineage.gate.execute import ProbeResult
from klineage.gate.static import MAX_BYTES, StaticFinding, static_check
from klineage.kernel import KernelState as EngineKernelState
from klineage.launch import ArgKind, LaunchPlan, numeric, resolve
from klineage.problem_formats import python_fingerprint
from skills_app.importer import store_kernel_state
from skills_app.models import Kernel, Problem

LIMITS = {"problem file": 256 * 1024, "kernel source": MAX_BYTES, "launch plan": 64 * 1024}
SUFFIXES = {"problem file": ".py", "kernel source": ".cu", "launch plan": ".toml"}
# The files of an upload: the form's and POST /api/uploads/'s field names, and what each one is.
FIELDS = {"problem": "problem file", "source": "kernel source", "plan": "launch plan"}


class UploadRefused(Exception):
    """Bad input: nothing of the upload was stored. `findings` are the static check's, if it ran."""

    def __init__(self, message: str, findings: tuple[StaticFinding, ...] = ()):
        super().__init__(message)
        self.message = message
        self.findings = findings


@dataclass(frozen=True)
class File:
    """An uploaded file as the form received it."""

    name: str
    data: bytes


@dataclass
class Outcome:
    """What an upload stored (or found already stored), for the page's message."""

    problem: Problem | None = None
    kernel: Kernel | None = None
    probe_job: Job | None = None
    unchanged: list[str] = field(default_factory=list)


def received(files: Mapping[str, Any]) -> dict[str, File | None]:
    """The files of an upload as Django received them (UploadedFile objects under FIELDS' keys, None or
    missing for a file not given), each read whole, or UploadRefused for one larger than any file of an
    upload may be, before it is read. What the /upload/ form and POST /api/uploads/ hand to upload()."""
    largest = max(LIMITS.values())
    chosen: dict[str, File | None] = {}
    for key in FIELDS:
        given = files.get(key)
        if given is not None and given.size > largest:
            raise UploadRefused(f"'{given.name}' is {given.size} bytes; the limit is {largest}")
        chosen[key] = File(given.name, given.read()) if given is not None else None
    return chosen


def upload(problem: File | None, source: File | None, plan: File | None, *, owner) -> Outcome:
    """Check every file given, then store them all (the problem first: the plan may name it), or
    raise UploadRefused having stored none. `owner` is the signed-in user: recorded as the uploader of
    what is new, and the owner of its probe job; content uploaded before keeps its first uploader."""
    if problem is None and source is None and plan is None:
        raise UploadRefused("choose a problem file, or a kernel's source and launch plan, or both")
    if (source is None) != (plan is None):
        raise UploadRefused("a kernel needs both files: its source (.cu) and its launch plan (launch.toml)")
    new_problem = _check_problem(problem) if problem else None
    kernel = _check_kernel(source, plan, new_problem) if source and plan else None
    outcome = Outcome()
    try:
        with transaction.atomic():
            if new_problem:
                _store_problem(new_problem, owner, outcome)
            if kernel:
                _store_kernel(kernel, owner, outcome)
    except DocumentError as exc:  # a name claimed by other content meanwhile
        raise UploadRefused(str(exc)) from None
    return outcome


# Checking -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Problem:
    name: str  # uploaded/<stem>
    fingerprint: str
    text: str


@dataclass(frozen=True)
class _Kernel:
    name: str  # uploaded/<plan name>
    state: EngineKernelState
    plan_text: str
    problem: Problem | None  # None: a bundled problem not imported here, or the one uploaded with it


def _text(upload: File, what: str) -> str:
    if PurePath(upload.name).suffix != SUFFIXES[what]:
        raise UploadRefused(f"the {what} must be a {SUFFIXES[what]} file, not '{upload.name}'")
    if len(upload.data) > LIMITS[what]:
        raise UploadRefused(f"the {what} '{upload.name}' is {len(upload.data)} bytes; the limit is {LIMITS[what]}")
    if b"\x00" in upload.data:
        raise UploadRefused(f"the {what} '{upload.name}' is a binary file (it holds NUL bytes)")
    try:
        text = upload.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UploadRefused(f"the {what} '{upload.name}' is not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise UploadRefused(f"the {what} '{upload.name}' is empty")
    return text


def _name(name: str, what: str) -> str:
    try:
        return uploads.PREFIX + uploads.check_name(name, what)
    except DocumentError as exc:
        raise UploadRefused(str(exc)) from None


def _check_problem(upload: File) -> _Problem:
    text = _text(upload, "problem file")
    name = _name(PurePath(upload.name).stem, "problem file")
    fingerprint = python_fingerprint(text)
    same = Problem.objects.filter(fingerprint=fingerprint).first()
    if same is not None and same.upload_name != name:
        known = same.upload_name or f"the {'bundled' if same.bundled else 'stored'} problem {same.operator}"
        raise UploadRefused(f"'{upload.name}' has the same content as {known}: use that name")
    if Problem.objects.filter(upload_name=name).exclude(fingerprint=fingerprint).exists():
        raise UploadRefused(f"an uploaded problem named {name} already exists with other content: rename the file")
    return _Problem(name, fingerprint, text)


def _check_kernel(source: File, plan_file: File, new_problem: _Problem | None) -> _Kernel:
    plan_text = _text(plan_file, "launch plan")
    source_text = _text(source, "kernel source")
    try:
        plan = LaunchPlan.from_toml(plan_text, plan_file.name)
    except DocumentError as exc:
        raise UploadRefused(str(exc)) from None
    name = _name(plan.name, f"{plan_file.name}: name")
    if plan.source != source.name:
        raise UploadRefused(f"{plan_file.name} names its source '{plan.source}', but the uploaded source is "
                            f"'{source.name}'")
    problem = _plan_problem(plan, new_problem)
    state = EngineKernelState(source_text, plan)
    _check_plan_cases(state, problem)
    report = static_check(state)
    if not report.ok:
        raise UploadRefused(f"the gate's static check refused {name}: nothing was stored", report.findings)
    if Kernel.objects.filter(name=name).exclude(current_state__fingerprint=state.fingerprint).exists():
        raise UploadRefused(f"an uploaded kernel named {name} already exists with other content: rename it in "
                            f"{plan_file.name}")
    same = Kernel.objects.filter(current_state__fingerprint=state.fingerprint).exclude(name=name).first()
    if same is not None:
        raise UploadRefused(f"this kernel has the same source and plan as {same.name}: use that name")
    return _Kernel(name, state, plan_text, problem)


def _plan_problem(plan: LaunchPlan, new_problem: _Problem | None) -> Problem | None:
    """The Problem row of the problem the plan names (bundled or uploaded); refused when it names none."""
    if new_problem is not None and plan.problem == new_problem.name:
        return None
    if uploads.is_uploaded(plan.problem):
        found = Problem.objects.filter(upload_name=plan.problem).first()
        if found is not None and found.probe != Problem.Probe.REFUSED:
            return found
        if found is not None:
            raise UploadRefused(f"the launch plan names problem {plan.problem}, which its probe refused: "
                                f"{found.probe_error}")
    elif plan.problem in bundled_problems():
        return Problem.objects.filter(operator=plan.problem, current=True).first()
    uploaded = ", ".join(usable_problems()) or "none yet"
    raise UploadRefused(f"the launch plan names problem '{plan.problem}', which is neither a bundled problem "
                        f"({', '.join(bundled_problems())}) nor an uploaded one ({uploaded})")


def _check_plan_cases(state: EngineKernelState, problem: Problem | None) -> None:
    """Evaluate the plan as the gate will, for every case of the problem the plan supports (on the
    default GPU's facts), so that a plan which cannot launch some case is refused now, naming the case
    and the expression, rather than failing in a job later. Buffer names are checked by the gate,
    which alone knows the problem's inputs."""
    cases = (problem.info or {}).get("cases", []) if problem is not None else []
    plan = state.plan
    facts = {**state.constants, **devices.DEFAULT.facts()}
    buffers = {arg.name for launch in plan.launches for arg in launch.args
               if arg.kind in (ArgKind.BUFFER, ArgKind.TENSOR_MAP)}
    for case in cases:
        params = numeric(case["params"])
        try:
            if not plan.supports_case(params, facts):
                continue
            env = {**params, **facts}
            for scratch in plan.scratch:
                expr.evaluate_int(scratch.count, env)
            resolve(plan, env, buffers)
        except DocumentError as exc:
            values = ", ".join(f"{k}={v}" for k, v in params.items())
            raise UploadRefused(f"the launch plan does not work for case '{case['name']}' ({values}) of "
                                f"{plan.problem}: {exc}") from None


# Storing ------------------------------------------------------------------------------------------


def _store_problem(checked: _Problem, owner, outcome: Outcome) -> None:
    row = Problem.objects.filter(upload_name=checked.name).first()
    if row is None:
        stem = checked.name.removeprefix(uploads.PREFIX)
        path = uploads.store_problem(stem, checked.fingerprint, checked.text)
        row = Problem.objects.create(operator="", fingerprint=checked.fingerprint, info={}, path=str(
            path.relative_to(uploads.root().parent)), upload_name=checked.name, probe=Problem.Probe.PENDING,
            uploaded_by=owner)
    else:
        outcome.unchanged.append(checked.name)
    outcome.problem = row
    live = Job.objects.filter(kind=Job.Kind.PROBE, params__problem=checked.name,
                              status__in=(Job.Status.QUEUED, Job.Status.RUNNING)).first()
    if row.probe == Problem.Probe.PENDING:  # a cancelled or lost probe is queued again
        outcome.probe_job = live or queue.enqueue(Job.Kind.PROBE, {"problem": checked.name}, owner=owner)


def _store_kernel(checked: _Kernel, owner, outcome: Outcome) -> None:
    found = Kernel.objects.filter(name=checked.name).first()
    if found is not None:
        outcome.kernel = found
        outcome.unchanged.append(checked.name)
        return
    plan = checked.state.plan
    uploads.store_kernel(plan.name, checked.state.fingerprint, plan.source, checked.state.source, checked.plan_text)
    state, _ = store_kernel_state(checked.state.to_dict(), where=checked.name)
    with_it = outcome.problem is not None and outcome.problem.upload_name == plan.problem
    problem = outcome.problem if with_it else checked.problem
    outcome.kernel = Kernel.objects.create(name=checked.name, operator=plan.problem, problem=problem,
                                           current_state=state, origin=Kernel.Origin.UPLOADED, uploaded_by=owner)
    if state.kernel_id is None:
        state.kernel = outcome.kernel
        state.save(update_fields=["kernel"])


# What jobs may name: bundled problems and kernels, and uploaded ones -------------------------------


def bundled_kernels() -> list[str]:
    return [entry.name for entry in corpus.list_kernels()]


def bundled_problems() -> list[str]:
    return [path.stem for path in corpus.list_problems()]


def usable_problems() -> list[str]:
    """Uploaded problems jobs may name: not refused by their probe (a pending one is probed by the job)."""
    return list(Problem.objects.exclude(upload_name="").exclude(probe=Problem.Probe.REFUSED)
                .order_by("upload_name").values_list("upload_name", flat=True))


def kernel_names() -> list[str]:
    return list(Kernel.objects.filter(origin=Kernel.Origin.UPLOADED).order_by("name").values_list("name", flat=True))


def check_problem(name: str) -> None:
    """An uploaded problem's name, as a job may use it; QueueError says why not."""
    found = Problem.objects.filter(upload_name=name).first()
    if found is None:
        raise queue.QueueError(f"no uploaded problem {name!r} (see the Upload page)")
    if found.probe == Problem.Probe.REFUSED:
        raise queue.QueueError(f"the uploaded problem {name} was refused by its probe: {found.probe_error}")


def kernel_problem(name: str) -> str:
    """The problem an uploaded kernel's plan names; QueueError when no such kernel was uploaded."""
    found = Kernel.objects.filter(name=name, origin=Kernel.Origin.UPLOADED).select_related("current_state").first()
    if found is None:
        raise queue.QueueError(f"no uploaded kernel {name!r} (see the Upload page)")
    return found.current_state.plan["problem"]


def record_probe(name: str, probe: dict | None, refused: str) -> Problem:
    """Record on the uploaded problem's row what its probe found (a ProbeResult's dictionary), or why
    it refused the file. A probe whose numerics make the problem unusable refuses it too."""
    with transaction.atomic():
        row = Problem.objects.select_for_update().get(upload_name=name)
        if probe is not None:
            result = ProbeResult.from_dict(probe)
            if result.info.fingerprint != row.fingerprint:
                refused = "the probed file is not the uploaded one (its fingerprint differs)"
            else:
                row.info = {**result.info.to_dict(), "path": row.path}
                row.operator = result.info.operator
                row.numerics = list(result.numerics)
                refused = "; ".join(result.numerics)
        row.probe = Problem.Probe.REFUSED if refused else Problem.Probe.SOUND
        row.probe_error = refused
        row.save()
    return row
