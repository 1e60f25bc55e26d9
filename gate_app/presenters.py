"""What the page of a finished job shows of its result, by kind (the presenters gate_app.kinds names: each
takes the result and gives the page's context): a gate's verdict; a walk's accepted steps; an
optimization's document, with the best kernel (highlighted source), the skills applied on the way with
their diffs, and every attempt. And the upload page's messages and lists."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from klineage_web.cuda_highlight import highlight_lines
from klineage_web.diff_rows import diff_lines
from klineage_web.short_ids import SHORT
from skills_app.models import Kernel, Problem, SkillCard, SkillLibrary


def _ratio(value: dict[str, Any] | None) -> float | None:
    return value["overall"] if value else None


def optimization(result: dict[str, Any], library: str | None = None) -> dict[str, Any]:
    """`library`: the name of the library the run drew on (the default one where the job named none)."""
    steps = result["steps"]
    best = steps[-1]["state"] if steps else result["start"]
    named = {s["card"][:SHORT] for s in steps if s["card"]} | {
        a["card"][:SHORT] for a in result["attempts"] if a["card"]
    }
    drawn_on = SkillLibrary.objects.filter(name=library).first() if library else SkillLibrary.objects.default()
    known = set(SkillCard.objects.filter(library=drawn_on, short_id__in=named).values_list("short_id", flat=True))

    def card(card_id: str) -> dict[str, str] | None:
        if not card_id:
            return None
        short = card_id[:SHORT]
        return {"short": short,
                "url": reverse("skills:library-card", args=[drawn_on.name, short]) if short in known else ""}

    return {
        "best": result["best"], "source": highlight_lines(best["source"]), "speedup": result["speedup"],
        "stop": result["stop"], "message": result["message"], "note": result["note"], "stats": result["stats"],
        "strategy": result["strategy"], "gate": result["gate"], "budget": result["budget"],
        "library": result["library"], "ordering": result.get("ordering", "as_planned"),  # absent: a run from before
        "applied": [{"index": s["index"], "transform": s["transform"], "card": card(s["card"]),
                     "ratio": _ratio(s["ratio"]), "diff": diff_lines(s["diff"])} for s in steps],
        "attempts": [{"index": a["index"], "round": a["round"], "transform": a["transform"], "card": card(a["card"]),
                      "status": a["status"], "ratio": _ratio(a["ratio"]), "message": a["message"]}
                     for a in result["attempts"]],
    }


def gate_verdict(result: dict[str, Any]) -> dict[str, Any]:
    """A finished gate job's verdict: its status and reason, and its page where the verdict is stored."""
    from skills_app.models import Verdict

    key = (result.get("provenance") or {}).get("key") or ""
    stored = bool(key) and Verdict.objects.filter(key=key).exists()
    return {"key": key, "status": result.get("status", ""), "reason": result.get("reason") or "",
            "url": reverse("skills:verdict", args=[key]) if stored else ""}


def walk_steps(lineage_id: str) -> list[dict[str, Any]]:
    """The accepted steps of a walk job's lineage, as the lineage overview's table shows them."""
    from skills_app.lineage_overview import step_row
    from skills_app.models import Lineage, LineageStep

    lineage = Lineage.objects.filter(id=lineage_id).first()
    if lineage is None:
        return []
    states = {s["fingerprint"]: s for s in lineage.document.get("states", [])}
    steps = (LineageStep.objects.filter(lineage=lineage, kind=LineageStep.Kind.ACCEPTED)
             .defer("backward_diff", "forward_diff", "parent_state__source", "child_state__source")
             .select_related("parent_state", "child_state").order_by("index"))
    return [step_row(step, states) for step in steps]


def gate_job(result: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"verdict": gate_verdict(result)}


def walk_job(result: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"walk": result, "walk_steps": walk_steps(result["lineage"])}


def optimize_job(result: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"optimization": optimization(result, params.get("library"))}


def fit_job(result: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The fit report with each card linked to its page in the library the job read (where still stored)."""
    library = SkillLibrary.objects.filter(name=params["library"]).first()
    stored = set(library.cards.values_list("card_id", flat=True)) if library else set()

    def row(fit: dict[str, Any]) -> dict[str, Any]:
        short = fit["card"][:SHORT]
        url = reverse("skills:library-card", args=[library.name, short]) if fit["card"] in stored else ""
        return {**fit, "short": short, "url": url}
    rows = [row(fit) for fit in result["fits"]]
    return {"fit": {**result, "library": params["library"], "proposed": [r for r in rows if r["fit"] == "proposed"],
                    "others": [r for r in rows if r["fit"] != "proposed"]}}


def upload_lines(outcome) -> list[str]:
    """What an upload (gate_app.uploads.Outcome) stored, one message each."""
    lines = []
    if outcome.problem is not None:
        name = outcome.problem.upload_name
        lines.append(f"Problem {name} " + ("was already uploaded" if name in outcome.unchanged else "stored") +
                     f"; its probe: {outcome.problem.get_probe_display()}" +
                     (f" (job #{outcome.probe_job.pk})" if outcome.probe_job else "") + ".")
    if outcome.kernel is not None:
        name = outcome.kernel.name
        lines.append(f"Kernel {name} " + ("was already uploaded." if name in outcome.unchanged else
                                          "passed the static check and is stored."))
    return lines


def uploads_listing() -> dict[str, Any]:
    """Uploaded problems (each with its latest probe job) and kernels, with their uploaders."""
    from gate_app.models import Job

    probes: dict[str, int] = {}
    for pk, params in Job.objects.filter(kind=Job.Kind.PROBE).order_by("id").values_list("id", "params"):
        probes[params.get("problem", "")] = pk
    problems = list(Problem.objects.exclude(upload_name="").select_related("uploaded_by").order_by("upload_name"))
    for problem in problems:
        problem.probe_job = probes.get(problem.upload_name)
    kernels = (Kernel.objects.filter(origin=Kernel.Origin.UPLOADED).select_related("current_state", "uploaded_by")
               .order_by("name"))
    return {"uploaded_problems": problems, "uploaded_kernels": kernels}
