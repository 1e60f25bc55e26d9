"""The worker's side of the built-in kinds of job (gate_app.kinds names them): gates, walks,
optimizations and probes; the engine work runs in the child (gate_app.runners). The worker has checked
a job's parameter keys against its kind before its handler runs.

A gate's child returns the verdict's document, kept as the job's result.

A walk's child returns the lineage document; the worker imports it here (skills_app's importer),
so it is on the lineage pages, and keeps a summary as the job's result. An optimization gets the
database's skill library from here, and its child returns the optimization document, kept whole as
the result; on the way, each attempt the loop reports is folded into a small chart (best speedup
by gate evaluation, candidates by outcome, the latest few) kept in the job's progress, so a page
opened or reloaded at any moment draws the run so far from the job row alone.
"""

from __future__ import annotations

import time
from typing import Any

from gate_app.handlers import JobContext, JobError
from gate_app.submit import GATE_MODES

RECENT_ATTEMPTS = 8  # attempts listed live on the job page
GATE_STAGES = {"probe": 0.05, "static": 0.1, "compile": 0.2, "features": 0.4, "run": 0.5, "sanitize": 0.85,
               "done": 1.0}


def run_gate_job(ctx: JobContext) -> dict[str, Any]:
    """Judge a kernel on a problem (bundled or uploaded); the result is the verdict's dictionary."""
    params = ctx.params
    if params.get("mode", "gpu") not in GATE_MODES:
        raise JobError(f"unknown gate mode {params.get('mode')!r}")
    ctx.stage_fractions = GATE_STAGES
    ctx.progress("start", f"{params.get('kernel')} on {params.get('problem')} ({params.get('mode', 'gpu')})", 0.01)
    return ctx.run_child(params)


def run_walk_job(ctx: JobContext) -> dict[str, Any]:
    """Walk an expert (bundled or uploaded) backward in the child, then import its lineage here; the result says
    which lineage and how the walk ended."""
    from django.urls import reverse

    from skills_app.importer import ImportRefused, import_lineage

    params = ctx.params
    ctx.progress("start", f"walk {params['kernel']} on {params['problem']} ({params['mode']} gate, "
                          f"{params['rewriter']} rewriter)", 0.01)
    document = ctx.run_child(params)
    ctx.progress("import", "storing the lineage", 0.97)
    try:
        lineage, action = import_lineage(document, where=f"job {ctx.job.pk}'s lineage")
    except ImportRefused as exc:
        raise JobError(str(exc)) from None
    ctx.log(f"lineage {lineage.id[:12]} {action}")
    return {"lineage": lineage.id, "url": reverse("skills:lineage", args=[lineage.id]), "imported": action,
            "expert": lineage.expert_name, "operator": lineage.operator, "gate": lineage.gate_mode,
            "assurance": lineage.assurance, "termination": document["termination"], "stats": document["stats"]}


def library_document(name: str | None = None) -> dict[str, Any]:
    """Every card of the database's library `name` (the default one where None), as a library document
    for the child (which filters by status and scope itself, so the result counts the cards it was
    offered)."""
    from skills_app.models import SkillCard, SkillLibrary

    library = SkillLibrary.objects.filter(name=name).first() if name else SkillLibrary.objects.default()
    rows = SkillCard.objects.filter(library=library).order_by("card_id").values_list("document", "readmission")
    # A card sent back to admission (a disputed step behind it, or today's rule) is offered as a candidate only.
    cards = [{**document, "status": "candidate"} if marked and document["status"] == "admitted" else document
             for document, marked in rows]
    where = f"the dashboard's library {library.name}" if library else "the dashboard's library (none stored)"
    return {"version": 1, "provenance": {"path": f"{where} ({len(cards)} cards)"}, "cards": cards}


class Chart:
    """What the job page draws, folded from the loop's events."""

    def __init__(self, budget: int):
        self.started = time.monotonic()
        self.data: dict[str, Any] = {"budget": budget, "evaluations": 1, "tried": 0, "steps": 0, "speedup": None,
                                     "timed": True, "points": [], "outcomes": {}, "recent": []}

    def add(self, event: dict[str, Any]) -> str:
        """Fold one event in; the line that says what it was."""
        data, attempt = self.data, event["attempt"]
        data.update(evaluations=event["evaluations"], steps=event["steps"], speedup=event["speedup"],
                    timed=event["speedup"] is not None)
        ratio = (attempt.get("ratio") or {}).get("overall")
        if event["kind"] == "attempt":
            data["tried"] += 1
            data["outcomes"][attempt["status"]] = data["outcomes"].get(attempt["status"], 0) + 1
            data["recent"] = ([{"index": attempt["index"], "transform": attempt["transform"],
                                "card": attempt["card"][:12], "status": attempt["status"], "ratio": ratio,
                                "message": attempt["message"][:200]}] + data["recent"])[:RECENT_ATTEMPTS]
        if not data["points"] and event["speedup"] is not None:
            data["points"].append([1, 1.0, 0.0])  # the start kernel: gate call 1, the baseline
        if attempt["evaluation"] is not None or event["kind"] == "step":
            point = [event["evaluations"], event["speedup"], round(time.monotonic() - self.started, 1)]
            if data["points"] and data["points"][-1][0] == point[0]:
                data["points"][-1] = point
            else:
                data["points"].append(point)
        if event["kind"] == "step":
            return f"#{event['steps']} took {attempt['transform']} ({ratio:.3f}x); best speedup {event['speedup']:.3f}x"
        where = f" (card {attempt['card'][:12]})" if attempt["card"] else ""
        return f"#{attempt['index']} {attempt['transform']}{where} {attempt['status']}: {attempt['message']}"


def run_optimize_job(ctx: JobContext) -> dict[str, Any]:
    """Optimize a kernel (bundled or uploaded) in the child with the database's library; the result is the
    optimization document."""
    from klineage.optimize.strategies import Strategy

    params = ctx.params
    library = library_document(params.get("library")) if Strategy(params["strategy"]).uses_library else None
    ctx.progress("start", f"{params['strategy']} optimization of {params['kernel']} on {params['problem']} "
                          f"({params['mode']} gate, {params['rewriter']} rewriter, budget {params['budget']})"
                 + (f"; {len(library['cards'])} cards in the library" if library is not None else ""), 0.01)
    chart = Chart(params["budget"])
    ctx.set_detail("chart", chart.data)

    def on_event(event: dict[str, Any]) -> None:
        # The loop's own progress lines already log each attempt; this one only carries the chart.
        line = chart.add(event)
        ctx.progress(event["kind"], line, event["evaluations"] / event["budget"], log=False)

    # The child is sent the library itself, in place of its name.
    return ctx.run_child({**params, "library": library}, on_event=on_event)


def run_fit_job(ctx: JobContext) -> dict[str, Any]:
    """Which cards of the library would act on the kernel, worked out in the child (the kernel's source is
    read and its problem probed there); the result lists every card's fit."""
    params = ctx.params
    library = library_document(params["library"])
    ctx.progress("start", f"fit of {len(library['cards'])} cards of {params['library']} on {params['kernel']}", 0.01)
    # The child is sent the library itself, in place of its name.
    return ctx.run_child({**params, "library": library})


def run_probe_job(ctx: JobContext) -> dict[str, Any]:
    """Probe an uploaded problem in the child (the sandboxed runner loads it there), then record on
    its Problem row what the probe found, or why it refused the file."""
    from gate_app.uploads import record_probe

    params = ctx.params
    ctx.progress("start", f"probe {params['problem']}", 0.01)
    outcome = ctx.run_child(params)
    problem = record_probe(params["problem"], outcome.get("probe"), outcome.get("refused", ""))
    ctx.log(f"{params['problem']}: {problem.get_probe_display()}")
    return {"problem": params["problem"], "probe": problem.probe, "operator": problem.operator,
            "cases": [case["name"] for case in problem.cases], "refused": problem.probe_error}
