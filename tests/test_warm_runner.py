"""The warm runner's plumbing, on any machine: real sandboxed runner processes. A job the warm runner
cannot judge cleanly (here: a request naming no kernel, which fails in every runner) is judged again
by a cold runner, so the outcome is the cold runner's, and the next job gets a fresh warm runner."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from klineage import corpus
from klineage.gate import execute
from klineage.gate.policy import GatePolicy
from klineage.gate.warm import WarmRunner

PROBLEM = Path(corpus.problem_path("row_softmax")).resolve()
REQUEST = {"mode": "run", "problem": str(PROBLEM), "cases": ["small"], "seeds": [0], "timing_case": "", "kernels": []}


def test_a_failed_job_is_judged_again_cold_and_the_next_gets_a_fresh_runner(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the runners' private folders go here
    policy = GatePolicy(timing=False)
    cold = execute.run_on_gpu(dict(REQUEST), {}, policy)
    assert cold.error  # the premise: no runner can judge this request
    with WarmRunner(PROBLEM) as runner:
        first = runner.run_on_gpu(dict(REQUEST), {}, policy)
        assert runner.session is None and runner.started == 1
        second = runner.run_on_gpu(dict(REQUEST), {}, policy)
        assert runner.started == 2
    for outcome in (first, second):
        assert outcome.error.splitlines()[0] == cold.error.splitlines()[0]
        assert outcome.findings == cold.findings
    assert not list(tmp_path.glob("klineage-run-*"))  # every runner's private folder was given back


def test_a_warm_runner_knows_what_holds_it_while_it_runs(tmp_path, monkeypatch):
    """Its verdicts name the sandbox as a cold runner's do (execute.held_by), from the isolation the
    sandbox announced when it started the runner, not from its end."""
    from klineage.gate.jail import launcher
    from klineage.gate.warm import _Session

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    session = _Session(PROBLEM, GatePolicy(timing=False))
    try:
        deadline = time.monotonic() + 30
        while not session.isolation and time.monotonic() < deadline:
            time.sleep(0.02)
        assert session.thread.is_alive() or session.ended is not None
        words = "; ".join(session.isolation)
        assert "rlimit cpu=" in words
        if launcher():
            assert words.startswith("bubblewrap ")
    finally:
        session.close()


def test_other_problems_and_modes_go_to_a_cold_runner():
    other = str(Path(corpus.problem_path("gemm")).resolve())
    with WarmRunner(PROBLEM) as runner:
        outcome = runner.run_on_gpu({**REQUEST, "problem": other}, {}, GatePolicy(timing=False))
        assert runner.started == 0 and outcome.error


def test_the_gate_cost_summary_compares_mean_seconds_per_candidate():
    from bench_tools import bench_script

    rows = [{"workload": "gdn", "policy": "timed", "runner": runner, "seconds": seconds, "same_as_cold": same}
            for runner, seconds, same in [("cold", 105.0, True), ("cold", 101.0, True), ("warm", 96.0, True),
                                          ("warm", 6.0, False)]]
    [line] = bench_script("gate_cost").summary(rows)
    assert (line["cold_s"], line["warm_first_s"], line["warm_steady_s"]) == (103.0, 96.0, 6.0)
    assert line["steady_over_cold"] == round(6 / 103, 3) and line["warm_over_cold"] == round(51 / 103, 3)
    assert line["complete"] and line["verdicts_agree"] is False
    [cut] = bench_script("gate_cost").summary(rows[:3])  # the stream cut after its first candidate
    assert cut["warm_steady_s"] is None and cut["steady_over_cold"] is None and not cut["complete"]


def test_gate_cost_parts_join_into_the_gate_suites_file(tmp_path, capsys):
    """Parts measured in separate device calls join into gate_cost.json's `warm_runner` entry, and the
    dashboard's gate cost line reads it; the gate suite's own rows stay."""
    from bench_tools import bench_script
    from skills_app.evidence import load_all

    part = {"provenance": {"gpu": "NVIDIA H200"},
            "rows": [{"workload": "gdn", "policy": "timed", "runner": r, "seconds": s, "same_as_cold": True}
                     for r, s in [("cold", 118.0, ), ("cold", 120.0), ("warm", 119.0), ("warm", 14.0)]]}
    (tmp_path / "gdn.json").write_text(json.dumps(part))
    into = tmp_path / "gate_cost.json"
    into.write_text(json.dumps({"provenance": {"gpu": "NVIDIA H200"}, "rows": []}))
    assert bench_script("gate_cost").main(["--merge", str(tmp_path / "gdn.json"), "--into", str(into)]) == 0
    joined = json.loads(into.read_text())
    assert joined["rows"] == [] and joined["warm_runner"]["summary"][0]["warm_steady_s"] == 14.0
    [cost] = [e for e in load_all(tmp_path) if e.title == "Gate cost"]
    assert "gdn timed 14.0 s against 119.0 s cold (0.12x)" in cost.headline


def test_a_later_part_replaces_an_earlier_parts_rows_of_the_same_workload_and_policy(tmp_path):
    """A re-measurement on newer code supersedes the old stream of that workload and policy only; the
    old part stays in the provenance, saying what of it was replaced."""
    from bench_tools import bench_script

    def part(name, streams):
        rows = [{"workload": w, "policy": p, "runner": r, "seconds": s, "same_as_cold": True}
                for w, p, s in streams for r in ("cold", "warm")]
        (tmp_path / name).write_text(json.dumps({"provenance": {"gpu": "NVIDIA H200"}, "rows": rows}))
        return str(tmp_path / name)

    old = part("old.json", [("gemm", "state", 10.0), ("row_softmax", "timed", 8.0)])
    new = part("new.json", [("row_softmax", "timed", 4.0)])
    into = tmp_path / "gate_cost.json"
    assert bench_script("gate_cost").main(["--merge", old, new, "--into", str(into)]) == 0
    joined = json.loads(into.read_text())["warm_runner"]
    kept = sorted((r["workload"], r["policy"], r["seconds"]) for r in joined["rows"])
    assert kept == [("gemm", "state", 10.0), ("gemm", "state", 10.0), ("row_softmax", "timed", 4.0),
                    ("row_softmax", "timed", 4.0)]
    assert [p.get("replaced_by_later_parts") for p in joined["provenance"]["parts"]] == [["row_softmax timed"], None]


def test_walks_and_optimizations_keep_a_warm_runner_on_the_gpu_only(monkeypatch):
    """`serial_runner` (what walk() and optimize() gate their one-at-a-time kernels through): a warm
    runner of the problem on the GPU gate, started at its first candidate and closed with the run;
    none where the gate runs nothing, or where KLINEAGE_WARM_RUNNER=0 asks for cold runners."""
    from klineage.config import GateMode
    from klineage.errors import KLineageError
    from klineage.gate.warm import serial_runner

    for mode in (GateMode.REPLAY, GateMode.COMPILE_ONLY):
        with serial_runner(PROBLEM, mode) as runner:
            assert runner is None
    with serial_runner(PROBLEM, GateMode.GPU) as runner:
        assert isinstance(runner, WarmRunner) and runner.problem == Path(PROBLEM).resolve()
        assert runner.started == 0 and runner.session is None  # nothing runs before a candidate comes
    monkeypatch.setenv("KLINEAGE_WARM_RUNNER", "0")
    with serial_runner(PROBLEM, GateMode.GPU) as runner:
        assert runner is None
    monkeypatch.setenv("KLINEAGE_WARM_RUNNER", "yes")
    with pytest.raises(KLineageError, match="KLINEAGE_WARM_RUNNER must be 1"):
        with serial_runner(PROBLEM, GateMode.GPU):
            pass
