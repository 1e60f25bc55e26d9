"""Walk and optimize jobs end to end, queued through gate_app.submit and run by a real
`manage.py gate_worker` subprocess with a compile-only gate (real nvcc): a walk of
row_softmax/warp_vec4 whose lineage the worker imports so the lineage pages show it, and an
optimization of row_softmax/naive with cards induced from the bundled dry lineage, whose chart and
result the job row keeps."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import User

from gate_app import submit
from gate_app.models import Job
from klineage import config
from klineage.lineage import Lineage as EngineLineage
from klineage.skills import induce
from klineage.skills.library import Library
from services import sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)
from shared_cache import share
from skills_app.card_import import import_library
from skills_app.models import Lineage, LineageStep, SkillCard
from test_gate_worker import WorkerProcess

DRY_LINEAGE = config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.dry.json"


def dry_library() -> dict:
    """Cards induced from the bundled dry walk (candidates: nothing in a dry walk was timed)."""
    return Library(
        tuple(induce([EngineLineage.load(DRY_LINEAGE)])), {"lineages": ["row_softmax_warp_vec4 (dry)"]}
    ).to_dict()


def _finished(job_id: int, timeout_s: float) -> Job:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job_id)
        if job.finished:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not finished after {timeout_s}s:\n{Job.objects.get(pk=job_id).log}")


@pytest.fixture
def worker(sqlite_job_database, tmp_path, shared_cache):
    """A worker whose gates keep their verdicts in its own data folder and take their problem probes,
    compiles, SASS features and artifact reports from the run's (tests/shared_cache.py): no test here
    counts what its walks compile."""
    cache = share(tmp_path / "data" / "cache", shared_cache)
    process = WorkerProcess(sqlite_job_database, tmp_path / "data", "--cpu-only", "--poll-interval", "0.1",
                            env={"KLINEAGE_CACHE_DIR": str(cache)})
    yield process
    process.cleanup()


def test_walk_job_in_compile_mode_ends_with_its_lineage_in_the_database(worker, client):
    owner = User.objects.create_user("ada")
    params = submit.walk_params("row_softmax/warp_vec4", mode="compile", max_steps=2, max_rejections=2)
    assert params["problem"] == "row_softmax"  # the kernel's own problem by default
    job = submit.submit(Job.Kind.WALK, params, owner=owner)
    assert job.needs == Job.Needs.CPU and job.owner == owner

    job = _finished(job.pk, timeout_s=240)
    assert job.status == Job.Status.SUCCEEDED, f"{job.error}\n{job.log}"
    result = job.result
    assert result["expert"] == "row_softmax_warp_vec4" and result["gate"] == "compile"
    assert result["assurance"] == "unverified_compile_only"
    assert result["termination"]["kind"] == "step_limit" and result["stats"]["accepted"] == 2
    assert result["imported"] == "created"

    lineage = Lineage.objects.get(id=result["lineage"])
    assert lineage.operator == "row_softmax" and lineage.accepted_count == 2
    assert LineageStep.objects.filter(lineage=lineage, kind=LineageStep.Kind.ACCEPTED).count() == 2
    # progress streamed from the child: the walker's step lines, in the log and the fraction
    assert "walk: step 0: accepted" in job.log and "walk: step 1: accepted" in job.log
    assert "import: storing the lineage" in job.log
    assert job.progress == {"fraction": 1.0, "stage": "done", "message": "succeeded"}

    # the lineage page and the job page both show it
    page = client.get(result["url"])
    assert page.status_code == 200 and b"row_softmax_warp_vec4" in page.content
    assert result["url"].encode() in client.get(f"/jobs/{job.pk}/").content


def test_a_replay_walk_without_recordings_fails_with_the_reason_and_stores_nothing(worker):
    owner = User.objects.create_user("ada")
    params = submit.walk_params("row_softmax/naive", mode="replay", max_steps=1, max_rejections=1)
    job = _finished(submit.submit(Job.Kind.WALK, params, owner=owner).pk, timeout_s=120)
    assert job.status == Job.Status.FAILED and job.result is None
    assert job.error.startswith("ReplayMiss: ") and "no recorded verdict for the expert" in job.error
    assert job.attempts == 1  # an engine error is final: not retried
    assert not Lineage.objects.exists()


def test_the_same_walk_twice_imports_one_lineage(worker):
    owner = User.objects.create_user("ada")
    params = submit.walk_params("row_softmax/warp_vec4", mode="compile", max_steps=1, max_rejections=1)
    first = _finished(submit.submit(Job.Kind.WALK, params, owner=owner).pk, timeout_s=240)
    second = _finished(submit.submit(Job.Kind.WALK, params, owner=owner).pk, timeout_s=240)
    assert (first.result["imported"], second.result["imported"]) == ("created", "unchanged")
    assert first.result["lineage"] == second.result["lineage"]
    assert Lineage.objects.count() == 1


def test_optimize_job_in_compile_mode_keeps_its_chart_and_result(worker, client):
    import_library(dry_library())
    cards = SkillCard.objects.count()
    assert cards > 0
    owner = User.objects.create_user("ada")
    # the cards, then the catalog: the dry walk's unroll cards make kernels that run the naive kernel's machine code
    # (never gated: same_code), and the catalog's forwards gate kernels of its own
    params = submit.optimize_params("row_softmax/naive", strategy="library_then_catalog", statuses=["candidate"],
                                    budget=6, mode="compile")
    job = _finished(submit.submit(Job.Kind.OPTIMIZE, params, owner=owner).pk, timeout_s=300)
    assert job.status == Job.Status.SUCCEEDED, f"{job.error}\n{job.log}"

    result = job.result
    assert (result["kind"], result["gate"], result["strategy"]) == ("optimization", "compile", "library_then_catalog")
    assert params["library"] == "corpus"  # the default library, named in the job it queued
    assert result["library"] == {"path": f"the dashboard's library corpus ({cards} cards)", "statuses": ["candidate"],
                                 "cards": cards, "eligible": cards}
    assert result["speedup"] is None and result["steps"] == []  # compile-only: nothing timed, nothing taken
    assert result["best"]["name"] == "row_softmax_naive" and result["stats"]["evaluations"] <= 6
    gated = [a for a in result["attempts"] if a["evaluation"] is not None]
    assert gated and all(a["status"] == "untimed" for a in gated)

    chart = job.progress["chart"]  # folded from the child's events, kept once the job is done
    assert job.progress["stage"] == "done" and job.progress["fraction"] == 1.0
    assert chart["budget"] == 6 and chart["evaluations"] == result["stats"]["evaluations"]
    assert chart["tried"] == len(result["attempts"]) and chart["timed"] is False
    assert sum(chart["outcomes"].values()) == len(result["attempts"])
    assert chart["outcomes"]["untimed"] == len(gated)
    same = [a for a in result["attempts"] if a["status"] == "same_code"]
    assert same and chart["outcomes"]["same_code"] == len(same) == result["stats"]["same_code"]
    assert [p[0] for p in chart["points"]] == [a["evaluation"] for a in gated]
    assert chart["recent"][0]["index"] == result["attempts"][-1]["index"]
    assert f"attempt {gated[0]['index']}: untimed {gated[0]['transform']}" in job.log  # the loop's own line
    assert "attempt: #" not in job.log  # the chart's events add no second line per attempt

    page = client.get(f"/jobs/{job.pk}/").content.decode()
    # compile-only: the start kernel is not called optimized, and the page says why nothing is faster
    assert "Optimized kernel" not in page and "No faster kernel" in page and "row_softmax_naive" in page
    assert "Nothing can be shown faster without a GPU" in page and "compile-only gate" in page
    assert f"{len(same)} candidate{'s' if len(same) > 1 else ''} not gated: " in page  # the same-code kernels
    assert "the best kernel's machine code (same SASS and resources, launched alike)" in page
    assert result["ordering"] == "measured"  # a job runs the default ordering, and its page says what it means
    assert "each round tried last what this run or the library measured paying less than a step" in page

    # held out: every card was learnt on row_softmax, so none is offered and nothing is tried
    held_out = submit.optimize_params("row_softmax/naive", strategy="library", statuses=["candidate"], budget=6,
                                      mode="compile", scope="other_operators")
    job = _finished(submit.submit(Job.Kind.OPTIMIZE, held_out, owner=owner).pk, timeout_s=300)
    assert job.status == Job.Status.SUCCEEDED, f"{job.error}\n{job.log}"
    assert job.result["library"]["cards"] == 0 and "without row_softmax's cards" in job.result["library"]["path"]
    assert job.result["stop"] == "no_candidate" and job.result["attempts"] == []


def _event(kind: str, index: int, evaluation: int | None, status: str, speedup: float | None, steps: int,
           ratio: float | None = None) -> dict:
    """An OptimizationEvent.to_dict() as a GPU run sends it (the fields the chart reads)."""
    attempt = {"index": index, "round": steps, "parent": "p", "transform": "unroll", "card": "c38e5885c282abcdef",
               "anchor": None, "candidate": "c", "status": status, "message": f"attempt {index}",
               "evaluation": evaluation, "key": "", "verdict": None,
               "ratio": {"overall": ratio, "per_trial": [ratio]} if ratio else None, "score": None}
    return {"kind": kind, "attempt": attempt, "evaluations": evaluation or 1, "budget": 8, "steps": steps,
            "best": "b", "speedup": speedup}


def test_the_chart_of_a_timed_run_starts_at_the_start_kernel_and_steps_up():
    from gate_app.work import Chart

    chart = Chart(budget=8)
    chart.add(_event("attempt", 0, 2, "not_faster", 1.0, 0, 0.97))
    chart.add(_event("attempt", 1, None, "not_applicable", 1.0, 0))
    chart.add(_event("attempt", 2, 3, "faster", 1.0, 0, 1.25))
    line = chart.add(_event("step", 2, 3, "faster", 1.25, 1, 1.25))
    assert line == "#1 took unroll (1.250x); best speedup 1.250x"
    data = chart.data
    assert [p[:2] for p in data["points"]] == [[1, 1.0], [2, 1.0], [3, 1.25]]  # the step replaces its attempt's point
    assert data["tried"] == 3 and data["steps"] == 1 and data["speedup"] == 1.25 and data["timed"] is True
    assert data["outcomes"] == {"not_faster": 1, "not_applicable": 1, "faster": 1}
    assert [a["index"] for a in data["recent"]] == [2, 1, 0] and data["recent"][0]["card"] == "c38e5885c282"


def test_an_optimization_stops_at_its_time_limit_in_the_child():
    """The child hands the job's time limit to the loop: past it, no candidate is gated."""
    import io

    from gate_app.child import Channel
    from gate_app.runners import run_optimize_payload

    params = submit.optimize_params("row_softmax/naive", strategy="unconditioned_random", budget=6, mode="compile",
                                    time_limit_s=10)
    stream = io.StringIO()
    result = run_optimize_payload({"kind": "optimize", **params, "time_limit_s": 1e-9, "library": None},
                                  Channel(stream))
    assert result["stop"] == "time_limit" and result["stats"]["evaluations"] == 1
    assert '"progress"' in stream.getvalue()


def test_an_optimization_queued_before_time_limits_still_runs_its_checks():
    from gate_app import kinds

    optimize = kinds.get("optimize")
    older = {key: None for key in optimize.required}  # a job stored before time_limit_s existed
    optimize.check_keys(older)
    optimize.check_keys({**older, "time_limit_s": 60})
    with pytest.raises(kinds.KindError, match="and optionally"):
        optimize.check_keys({**older, "deadline": 60})


def test_the_outcome_chart_has_a_colour_for_every_attempt_status():
    """job.js colours the outcome bars by status: a status the loop can report and the page does not
    know would be drawn without one."""
    import re

    from klineage.optimize.result import AttemptStatus

    script = (config.REPO_ROOT / "gate_app" / "static" / "gate_app" / "job.js").read_text(encoding="utf-8")
    fills = re.search(r"const OUTCOME_FILL = \{(.*?)\};", script, re.S).group(1)
    assert set(re.findall(r"(\w+):", fills)) == {s.value for s in AttemptStatus}
