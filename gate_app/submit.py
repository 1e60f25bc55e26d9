"""Gates, walks and optimizations as people submit them (the /optimize/ page and POST /api/jobs/; a
kind's entry in gate_app.kinds names its check here): checked parameters, and a per-user quota of GPU
jobs enforced in the database.

The quota is counted inside the transaction that queues the job, after locking the submitter's
user row, so two submissions racing each other are counted one after the other: on PostgreSQL
the second waits for the first to commit (SELECT ... FOR UPDATE) and then sees its job; SQLite
takes its write lock at BEGIN (transaction_mode IMMEDIATE), which serialises them the same way.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from gate_app import kinds, queue, uploads
from gate_app.models import Job

GATE_MODES = ("gpu", "replay", "compile")
REWRITERS = ("rules", "llm")
WALK_LIMITS = {"max_steps": (1, 64), "max_rejections": (1, 32)}
BUDGET_LIMITS = (2, 256)  # gate evaluations, the start kernel's included
TIME_LIMITS_S = (10, 86400)  # an optimization's optional wall-clock limit
CARD_STATUSES = ("admitted", "candidate", "retired")
# Which cards of the library an optimization may draw on: all of them, or only those induced on
# other operators than the problem's (held out: does what was learnt elsewhere transfer?).
LIBRARY_SCOPES = {"all": "every card", "other_operators": "cards learnt on other operators only"}


class QuotaExceeded(queue.QueueError):
    """The submitter already has as many GPU jobs queued or running as the quota allows."""


def llm_configured() -> bool:
    """The LLM rewriter is offered only where a model is configured (KLINEAGE_LLM_MODEL)."""
    from klineage import config

    return bool(config.llm_model())


def kernel_choices() -> list[str]:
    """The kernels a walk or an optimization may start from: bundled, then uploaded."""
    return uploads.bundled_kernels() + uploads.kernel_names()


def problem_choices() -> list[str]:
    return uploads.bundled_problems() + uploads.usable_problems()


def _problem(problem: str | None, kernel: str) -> str:
    """The problem's name, checked with the kernel's (by name only: never a path on the server);
    default: the problem the kernel's plan names. Uploaded names are checked in the database."""
    from klineage import corpus
    from klineage.errors import KLineageError
    from klineage.uploads import is_uploaded

    if is_uploaded(kernel):
        default = uploads.kernel_problem(kernel)
    elif kernel in uploads.bundled_kernels():
        try:
            default = problem or corpus.kernel_entry(kernel).load().plan.problem
        except KLineageError as exc:
            raise queue.QueueError(str(exc)) from None
    else:
        raise queue.QueueError(f"no bundled kernel {kernel!r} (see the Kernels page)")
    problem = problem or default
    if is_uploaded(problem):
        uploads.check_problem(problem)
    elif problem not in uploads.bundled_problems():
        raise queue.QueueError(f"no bundled problem {problem!r} (bundled: {', '.join(uploads.bundled_problems())})")
    return problem


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise queue.QueueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def _whole(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise queue.QueueError(f"{name} must be a whole number from {low} to {high}, not {value!r}")
    return value


def _rewriter(value: Any) -> str:
    rewriter = _choice("rewriter", value, REWRITERS)
    if rewriter == "llm" and not llm_configured():
        raise queue.QueueError("the LLM rewriter is not configured here (set KLINEAGE_LLM_MODEL and "
                               "KLINEAGE_LLM_BASE_URL where the web server and workers run); use rules")
    return rewriter


def gate_params(problem: str, kernel: str, *, against: str | None = None, mode: str = "gpu",
                cases: list[str] | None = None, policy: dict[str, Any] | None = None,
                record: bool = False) -> dict[str, Any]:
    """Checked parameters of a gate job: bundled corpus names or uploaded ones (`uploaded/<name>`,
    checked against the database here, resolved from the data dir in the child), a known mode, a
    valid policy."""
    from klineage import corpus
    from klineage.errors import KLineageError
    from klineage.gate.policy import GatePolicy
    from klineage.uploads import is_uploaded

    if mode not in GATE_MODES:
        raise queue.QueueError(f"mode must be one of {GATE_MODES}, not {mode!r}")
    try:
        if is_uploaded(problem):
            uploads.check_problem(problem)
        else:
            corpus.problem_path(problem)
        for name in filter(None, (kernel, against)):
            if is_uploaded(name):
                uploads.kernel_problem(name)
            else:
                corpus.kernel_entry(name)
        GatePolicy.from_dict(policy or {})
    except KLineageError as exc:
        raise queue.QueueError(str(exc)) from None
    if cases is not None and (not isinstance(cases, list) or not all(isinstance(c, str) for c in cases)):
        raise queue.QueueError("cases must be a list of case names")
    params: dict[str, Any] = {"problem": problem, "kernel": kernel, "mode": mode}
    if against:
        params["against"] = against
    if cases:
        params["cases"] = cases
    if policy:
        params["policy"] = policy
    if record:
        params["record"] = True
    return params


def enqueue_gate(problem: str, kernel: str, *, against: str | None = None, mode: str = "gpu",
                 cases: list[str] | None = None, policy: dict[str, Any] | None = None, record: bool = False,
                 owner=None, idempotency_key: str | None = None, max_attempts: int = 3) -> Job:
    params = gate_params(problem, kernel, against=against, mode=mode, cases=cases, policy=policy, record=record)
    return queue.enqueue(Job.Kind.GATE, params, owner=owner, idempotency_key=idempotency_key,
                         max_attempts=max_attempts)


def gate_job_params(kernel: str, *, problem: str | None = None, against: str | None = None,
                    mode: str = "gpu") -> dict[str, Any]:
    """Checked parameters of one gate run of a kernel (bundled or uploaded), optionally timed against
    a baseline kernel besides the vendor path."""
    return gate_params(
        _problem(problem, kernel), kernel, against=against or None, mode=_choice("mode", mode, GATE_MODES)
    )


def walk_params(kernel: str, *, problem: str | None = None, rewriter: str = "rules", mode: str = "gpu",
                max_steps: int = 16, max_rejections: int = 4) -> dict[str, Any]:
    """Checked parameters of a backward walk of an expert kernel (bundled or uploaded)."""
    return {"problem": _problem(problem, kernel), "kernel": kernel, "rewriter": _rewriter(rewriter),
            "mode": _choice("mode", mode, GATE_MODES),
            "max_steps": _whole("max_steps", max_steps, *WALK_LIMITS["max_steps"]),
            "max_rejections": _whole("max_rejections", max_rejections, *WALK_LIMITS["max_rejections"])}


def gpu_jobs_held(owner) -> int:
    """GPU jobs of `owner` queued or running: what the quota counts."""
    return Job.objects.filter(owner=owner, needs=Job.Needs.GPU,
                              status__in=(Job.Status.QUEUED, Job.Status.RUNNING)).count()


def strategies() -> tuple[str, ...]:
    from klineage.optimize.strategies import Strategy

    return tuple(s.value for s in Strategy)


def default_strategy() -> str:
    """The strategy `klineage optimize` runs when none is named: the dashboard and the API offer the same."""
    from klineage.optimize.strategies import DEFAULT_STRATEGY

    return DEFAULT_STRATEGY.value


def optimize_params(kernel: str, *, problem: str | None = None, rewriter: str = "rules",
                    strategy: str | None = None, statuses: list[str] | tuple[str, ...] = ("admitted",),
                    scope: str = "all", budget: int = 16, mode: str = "gpu", seed: int = 0,
                    time_limit_s: int | None = None, library: str | None = None) -> dict[str, Any]:
    """Checked parameters of an optimization of a kernel (bundled or uploaded) with one of the
    database's skill libraries (`library`, by name; the default one where unnamed, recorded by name so
    the job says which it drew on); `time_limit_s` (whole seconds, optional) stops it gating
    candidates after that long, so that a GPU worker is not held longer than its owner wants."""
    strategy = _choice("strategy", strategy or default_strategy(), strategies())
    rewriter = _rewriter(rewriter)
    if strategy == "no_library" and rewriter == "rules":
        raise queue.QueueError("the no_library strategy needs the LLM rewriter: the rule rewriter has no forward "
                               "plan without cards")
    return {
        "problem": _problem(problem, kernel),
        "kernel": kernel,
        "rewriter": rewriter,
        "strategy": strategy,
        "statuses": _statuses(statuses),
        "scope": _choice("scope", scope, tuple(LIBRARY_SCOPES)),
        "budget": _whole("budget", budget, *BUDGET_LIMITS),
        "mode": _choice("mode", mode, GATE_MODES),
        "seed": _whole("seed", seed, 0, 2**31 - 1),
        "time_limit_s": None if time_limit_s is None else _whole("time_limit_s", time_limit_s, *TIME_LIMITS_S),
        **_library_param(strategy, library),
    }


def fit_params(kernel: str, *, problem: str | None = None, library: str | None = None,
               statuses: list[str] | tuple[str, ...] = ("admitted",)) -> dict[str, Any]:
    """Checked parameters of a fit report: which cards of a stored library (the default one where
    unnamed) would act on a kernel (bundled or uploaded), and why each other card would not."""
    return {"problem": _problem(problem, kernel), "kernel": kernel, "library": _library(library),
            "statuses": _statuses(statuses)}


def _statuses(statuses: list[str] | tuple[str, ...]) -> list[str]:
    if not isinstance(statuses, (list, tuple)) or not statuses:
        raise queue.QueueError(f"statuses must name at least one of {', '.join(CARD_STATUSES)}")
    for status in statuses:
        _choice("each of statuses", status, CARD_STATUSES)
    return sorted(set(statuses), key=CARD_STATUSES.index)


def draws_on_library(strategy: str) -> bool:
    from klineage.optimize.strategies import Strategy

    return Strategy(strategy).uses_library


def _library_param(strategy: str, library: str | None) -> dict[str, str]:
    """The library a strategy that draws on one reads, by name; nothing for one that draws on none."""
    if not draws_on_library(strategy):
        if library is not None:
            raise queue.QueueError(f"the {strategy} strategy draws on no skill library: leave library unset")
        return {}
    return {"library": _library(library)} if library is not None or library_choices() else {}


def library_choices() -> list[str]:
    """The names of the stored skill libraries, the default one first."""
    from skills_app.models import SkillLibrary

    default = SkillLibrary.objects.default()
    names = list(SkillLibrary.objects.order_by("name").values_list("name", flat=True))
    return sorted(names, key=lambda name: name != default.name) if default else names


def _library(name: str | None) -> str:
    names = library_choices()
    if not names:
        raise queue.QueueError("no skill library is stored: import one (manage.py load_corpus)")
    if name is None:
        return names[0]
    if not isinstance(name, str) or name not in names:
        raise queue.QueueError(f"library must be one of {', '.join(names)}: "
                               f"no skill library named {name!r} is stored")
    return name


def submit(kind: str, params: dict[str, Any], *, owner) -> Job:
    """Queue a checked gate run, walk or optimization for `owner`; QuotaExceeded when a GPU job would take
    them past KLINEAGE_GPU_JOB_QUOTA jobs queued or running."""
    needs = kinds.get(kind).needs(params)
    with transaction.atomic():
        if needs == Job.Needs.GPU:
            list(get_user_model().objects.select_for_update().filter(pk=owner.pk).values_list("pk", flat=True))
            held = gpu_jobs_held(owner)
            quota = settings.KLINEAGE_GPU_JOB_QUOTA
            if held >= quota:
                raise QuotaExceeded(f"you have {held} GPU job(s) queued or running and the quota is {quota}: "
                                    "wait for one to finish, cancel one, or submit in compile or replay mode")
        return queue.enqueue(kind, params, owner=owner, needs=needs)
