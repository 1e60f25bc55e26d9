"""bench/skills_eval.py in parts: --only, the document rewritten after every strategy, --merge, and
the gpu_session.sh stage that runs a part. Real compile-only gates (real nvcc) on two small corpus
lineages at budget 2; the merge's arithmetic is checked on parts whose speedups are written in."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench_tools import bench_script, session_stage
from klineage import config
from klineage.errors import DocumentError
from klineage.lineage import Lineage
from klineage.optimize import Strategy
from klineage.optimize.result import run_speedup_within
from klineage.skills.induction import lineage_id

REPO = Path(__file__).resolve().parent.parent
skills = bench_script("skills_eval")

FILES = ("row_softmax_warp_vec4.dry.json", "topk_radix_select.dry.json")  # sorted by expert: softmax runs first
SOFTMAX = lineage_id(Lineage.load(config.corpus_dir() / "lineages" / FILES[0]))
TOPK = lineage_id(Lineage.load(config.corpus_dir() / "lineages" / FILES[1]))
PART_A = "row_softmax,topk:library"  # the library part: its vs-expert gate goes with it
PART_B = "topk:unconditioned_random,topk:unconditioned_greedy,topk:generated_only,topk_radix_select:no_library"


@pytest.fixture(scope="module")
def lineages(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lineages")
    for name in FILES:
        shutil.copy(config.corpus_dir() / "lineages" / name, folder / name)
    return folder


def evaluate(lineages: Path, out: Path, *argv: str) -> dict:
    assert skills.main(["--gate", "compile", "--budget", "2", "--lineages", str(lineages), "--out", str(out),
                        *argv]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(lineages, gate_cache, tmp_path_factory) -> dict[str, Path]:
    """The whole run, and the same split in two parts."""
    folder = tmp_path_factory.mktemp("runs")
    for name, argv in (("full", []), ("a", ["--only", PART_A]), ("b", ["--only", PART_B])):
        evaluate(lineages, folder / f"{name}.json", *argv)
    return {name: folder / f"{name}.json" for name in ("full", "a", "b")}


def merge(lineages: Path, out: Path, *parts: Path) -> dict:
    assert skills.main(["--merge", *map(str, parts), "--lineages", str(lineages), "--out", str(out)]) == 0
    return json.loads(out.read_text())


def refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        skills.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_only_selects_workloads_and_strategies(lineages):
    found, _ = skills.corpus_lineages(lineages)
    every = set(skills.STRATEGIES)
    assert skills.select(["topk"], found) == {TOPK: every}
    assert skills.select(["row_softmax_warp_vec4", "topk:library", "topk:unconditioned_greedy"], found) == {
        SOFTMAX: every, TOPK: {Strategy.LIBRARY, Strategy.UNCONDITIONED_GREEDY}}
    assert skills.select([TOPK], found) == {TOPK: every}, "a lineage id holds a colon of its own"
    assert skills.select([f"{TOPK}:generated_only", "topk:library"], found) == {
        TOPK: {Strategy.GENERATED_ONLY, Strategy.LIBRARY}}
    assert skills.select(["topk:library", "topk"], found) == {TOPK: every}


def test_only_refuses_what_selects_nothing(lineages, tmp_path, capsys):
    argv = ["--gate", "compile", "--lineages", str(lineages), "--out", str(tmp_path / "x.json"), "--only"]
    err = refused(capsys, [*argv, "topk,gemm"])
    assert "--only gemm: matches no workload" in err and "row_softmax" in err
    err = refused(capsys, [*argv, "topk:fastest"])
    assert "no strategy 'fastest'" in err and "unconditioned_greedy" in err
    assert "needs at least one SPEC" in refused(capsys, [*argv, ","])
    assert not (tmp_path / "x.json").exists(), "refused before anything ran"


def test_a_part_holds_its_strategies_and_says_it_is_a_part(runs):
    a, b, full = (json.loads(runs[n].read_text()) for n in ("a", "b", "full"))
    assert "partial" not in full, "a whole run that ended is the headline"
    assert a["partial"]["only"] == ["row_softmax", "topk:library"] and a["partial"]["complete"] is True
    assert "not the headline" in a["partial"]["note"]
    assert [(w["lineage"], list(w["strategies"])) for w in a["workloads"]] == [
        (SOFTMAX, [s.value for s in skills.STRATEGIES]), (TOPK, ["library"])]
    [topk] = b["workloads"]
    assert list(topk["strategies"]) == ["unconditioned_random", "unconditioned_greedy", "generated_only", "no_library"]
    assert topk["strategies"]["no_library"] == {"skipped": "the rewriter alone needs --rewriter llm"}
    # the vs-expert gate went with the library strategy: part a measured it (the compile gate says
    # why there is no ratio), part b never gated it
    assert a["workloads"][1]["vs_expert_reason"] == skills.NO_TIMING.format(mode="compile")
    assert topk["vs_expert"] is None and topk["vs_expert_reason"] == "the library strategy did not run"
    assert b["roundtrip_min_vs_expert"]["value"] is None


def test_a_run_cut_short_keeps_every_workload_that_finished(lineages, gate_cache, tmp_path, monkeypatch):
    # a corpus without the topk problem: the second workload raises before its first strategy
    (tmp_path / "corpus" / "problems").mkdir(parents=True)
    shutil.copy(config.corpus_dir() / "problems" / "row_softmax.py", tmp_path / "corpus" / "problems")
    library = str(config.corpus_dir() / "library" / "library.json")
    monkeypatch.setenv("KLINEAGE_CORPUS_DIR", str(tmp_path / "corpus"))
    out = tmp_path / "cut.json"
    with pytest.raises(DocumentError, match="topk"):
        skills.main(["--gate", "compile", "--budget", "2", "--lineages", str(lineages), "--library", library,
                     "--out", str(out)])
    document = json.loads(out.read_text())
    assert document["partial"] == {"only": [], "complete": False, "note": skills.PARTIAL_NOTE}
    [softmax] = document["workloads"]
    assert softmax["lineage"] == SOFTMAX and list(softmax["strategies"]) == [s.value for s in skills.STRATEGIES]
    ran = {s: r for s, r in softmax["strategies"].items() if s != "no_library"}
    assert all(1 <= r["evaluations"] <= 2 and r["stop"] for r in ran.values())  # a library may run out of cards
    assert ran["unconditioned_random"]["evaluations"] == ran["unconditioned_greedy"]["evaluations"] == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temp file is left behind"


def test_merging_the_parts_gives_the_whole_run(lineages, runs, tmp_path):
    full = json.loads(runs["full"].read_text())
    merged = merge(lineages, tmp_path / "merged.json", runs["b"], runs["a"])
    assert merged["workloads"] == full["workloads"]
    for key in ("roundtrip_min_vs_expert", "vs_unconditioned_geomean", "admission_rate"):
        assert merged[key] == full[key]
    assert merged["not_run"] == [] and "partial" not in merged
    facts = merged["provenance"]
    assert [p["file"] for p in facts["parts"]] == [str(runs["b"]), str(runs["a"])]
    assert facts["parts"][1]["partial"]["only"] == ["row_softmax", "topk:library"]
    assert (facts["gpu"], facts["budget"], facts["gate"]) == ("none", 2, "compile")
    assert merge(lineages, tmp_path / "twice.json", runs["a"], runs["a"], runs["b"])["workloads"] == \
        full["workloads"], "a row in two parts, identical, is no conflict"


def test_merge_computes_the_comparisons_again_from_the_rows(lineages, runs, tmp_path):
    a, b = (json.loads(runs[n].read_text()) for n in ("a", "b"))
    for part, host in ((a, "H200 (lane 0)"), (b, "H200 (lane 1)")):
        part["provenance"].update(gate="gpu", gpu=host)
    speedups = {(SOFTMAX, "library"): 1.5, (SOFTMAX, "unconditioned_random"): 1.2,
                (SOFTMAX, "unconditioned_greedy"): 1.0, (TOPK, "library"): 2.0,
                (TOPK, "unconditioned_random"): 1.0, (TOPK, "unconditioned_greedy"): 1.6}
    for part in (a, b):
        for row in part["workloads"]:
            for strategy, result in row["strategies"].items():
                if (row["lineage"], strategy) in speedups:
                    result["speedup"] = speedups[row["lineage"], strategy]
    for row, ratio in zip(a["workloads"], (1.1, 0.9)):  # what the library part measured against the expert
        row["vs_expert"], row["vs_expert_reason"] = ratio, ""
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, part in zip(paths, (a, b)):
        path.write_text(json.dumps(part))
    merged = merge(lineages, tmp_path / "merged.json", *paths)
    assert [(w["vs_expert"], w["vs_unconditioned"]) for w in merged["workloads"]] == [(1.1, 1.25), (0.9, 1.25)]
    assert merged["roundtrip_min_vs_expert"] == {"value": 0.9, "reason": ""}
    assert merged["vs_unconditioned_geomean"]["value"] == pytest.approx(1.25)
    assert merged["provenance"]["gpu"] == "mixed: H200 (lane 0) (a.json); H200 (lane 1) (b.json)"
    assert merged["provenance"]["driver"] == "unknown", "what the parts agree on is kept"
    assert merged["provenance"]["time_limit_s"] is None  # as the parts ran: no limit, kept as a value
    assert [w["vs_unconditioned_over"] for w in merged["workloads"]] == [["unconditioned_random",
                                                                         "unconditioned_greedy"]] * 2
    # Without the greedy runs the library is compared with random search alone, and each row says so.
    for row in b["workloads"]:
        row["strategies"].pop("unconditioned_greedy", None)
    paths[1].write_text(json.dumps(b))
    random_only = merge(lineages, tmp_path / "random_only.json", *paths)
    topk = random_only["workloads"][1]
    assert (topk["vs_unconditioned"], topk["vs_unconditioned_over"]) == (2.0, ["unconditioned_random"])
    assert random_only["not_run"] == [{"lineage": TOPK, "strategies": ["unconditioned_greedy"]}]
    assert random_only["vs_unconditioned_geomean"]["value"] is None  # the headline needs every strategy
    subset = random_only["measured_subset"]
    assert subset["workloads"] == [SOFTMAX, TOPK]
    assert subset["vs_unconditioned_geomean"]["value"] == pytest.approx((1.25 * 2.0) ** 0.5)


def run_row(stop: str, evaluations: int, speedup: float, **more) -> dict:
    return {"stop": stop, "evaluations": evaluations, "speedup": speedup, **more}


@pytest.mark.parametrize("library, compared", [
    (run_row("no_candidate", 2, 5.0), True),  # ended on its own within the random run's 7 evaluations
    (run_row("no_improvement", 9, 5.0), False),  # took more evaluations than random had, and cannot say its 7th
    (run_row("budget", 7, 5.0), True),  # cut by its budget at the same 7: one budget
    (run_row("budget", 9, 5.0), False),
])
def test_a_run_cut_after_n_evaluations_compares_with_what_the_other_had_under_n(library, compared):
    row = {"strategies": {"library": library, "unconditioned_random": run_row("time_limit", 7, 2.0)}}
    skills.compare(row, skills.GateMode.GPU, (1.0, ""))
    assert row["vs_unconditioned"] == (2.5 if compared else None)
    assert ("not at one budget" in row["vs_unconditioned_reason"]) is not compared
    assert row.get("vs_unconditioned_budgets") == ({"unconditioned_random": 7} if compared else None)


def test_a_run_that_went_further_is_read_at_the_cut_runs_budget():
    """The library took 9 evaluations; its speedups_by_budget say what it had after 7: that is what
    a random run cut after 7 is held against (and after 2, before any step, the library had 1.0)."""
    library = run_row("no_improvement", 9, 5.0, speedups_by_budget=[[3, 4.0], [8, 5.0]])
    row = {"strategies": {"library": library, "unconditioned_random": run_row("time_limit", 7, 2.0),
                          "unconditioned_greedy": run_row("no_candidate", 4, 1.5)}}
    skills.compare(row, skills.GateMode.GPU, (1.0, ""))
    assert (row["vs_unconditioned"], row["vs_unconditioned_reason"]) == (2.0, "")
    assert row["vs_unconditioned_budgets"] == {"unconditioned_random": 7, "unconditioned_greedy": None}  # both ended
    row["strategies"]["unconditioned_random"] = run_row("time_limit", 2, 1.25)
    skills.compare(row, skills.GateMode.GPU, (1.0, ""))
    assert row["vs_unconditioned"] == pytest.approx(0.8)  # 1.0 / 1.25: random was ahead after 2
    assert run_speedup_within(library, 10) == 5.0, "it ended on its own: more budget changes nothing"
    assert run_speedup_within(run_row("time_limit", 7, 2.0), 10) is None, "past its own end a cut run cannot tell"


def test_unconditioned_runs_at_different_budgets_each_compare_with_the_library():
    """The library ended on its own after 2 evaluations: a budget-40 random run and a greedy run cut
    after 20 both had more, so the library is held against the better of the two."""
    row = {"strategies": {"library": run_row("no_candidate", 2, 6.0),
                          "unconditioned_random": run_row("budget", 40, 2.0),
                          "unconditioned_greedy": run_row("time_limit", 20, 3.0)}}
    skills.compare(row, skills.GateMode.GPU, (1.0, ""))
    assert (row["vs_unconditioned"], row["vs_unconditioned_reason"]) == (2.0, "")
    row["strategies"]["unconditioned_greedy"] = run_row("time_limit", 1, 3.0)  # cut before the library ended
    skills.compare(row, skills.GateMode.GPU, (1.0, ""))
    assert row["vs_unconditioned"] is None and "after 1 evaluation(s)" in row["vs_unconditioned_reason"]


def test_library_waste_counts_every_evaluation_and_the_candidates_alone():
    rows = [{"strategies": {"library": run_row("no_candidate", 2, 3.0, wasted=0)}},
            {"strategies": {"library": {**run_row("no_improvement", 6, 1.0, wasted=5), "saved": 3}}}]
    assert skills.wasted(rows) == {"value": 5 / 8, "wasted": 5, "evaluations": 8, "candidate_evaluations": 6,
                                   "of_candidates": 5 / 6, "saved": 3, "reason": ""}
    assert "saved" not in skills.wasted(rows[:1])  # absent at 0, as the runs' stats keep it
    rows.append({"strategies": {"unconditioned_random": run_row("budget", 4, 1.0, wasted=3)}})
    assert skills.wasted(rows)["value"] is None


def test_a_time_limit_stops_the_run_between_gate_calls(gate_cache):
    from klineage import corpus
    from klineage.optimize import Stop, optimize

    naive = corpus.kernel_entry("row_softmax/naive").load()
    result = optimize(corpus.problem_path("row_softmax"), naive, strategy=Strategy.UNCONDITIONED_RANDOM, budget=5,
                      gate_mode="compile", cache=gate_cache, time_limit_s=1e-9)
    assert result.stop is Stop.TIME_LIMIT and result.stats.evaluations == 1  # the start kernel's gate only
    assert "time limit passed after 1 of 5 gate evaluations" in result.message


def test_a_workload_no_part_ran_makes_the_summaries_unknown(lineages, runs, tmp_path):
    merged = merge(lineages, tmp_path / "merged.json", runs["b"])
    # The rule rewriter alone (no_library) is skipped by design, so it is never missing.
    assert merged["not_run"] == [{"lineage": SOFTMAX, "strategies": [s.value for s in skills.STRATEGIES
                                                                      if s is not Strategy.NO_LIBRARY]},
                                 {"lineage": TOPK, "strategies": ["library"]}]
    for key in ("roundtrip_min_vs_expert", "vs_unconditioned_geomean"):
        assert merged[key]["value"] is None and SOFTMAX in merged[key]["reason"]
        assert "unknown is not a number" in merged[key]["reason"]
    # topk lacks its library run: no workload has both numbers, so the labelled subset is empty too.
    assert merged["measured_subset"]["workloads"] == []
    assert merged["measured_subset"]["roundtrip_min_vs_expert"]["value"] is None
    [topk] = merged["workloads"]
    assert topk["vs_expert_reason"] == "the library strategy did not run"


def test_merge_refuses_parts_that_do_not_fit(lineages, runs, tmp_path, capsys):
    a = json.loads(runs["a"].read_text())
    a["workloads"][1]["strategies"]["library"]["evaluations"] = 3
    other = tmp_path / "other.json"
    other.write_text(json.dumps(a))
    argv = ["--lineages", str(lineages), "--out", str(tmp_path / "m.json"), "--merge"]
    err = refused(capsys, [*argv, str(runs["a"]), str(other)])
    assert f"{TOPK} library: both {runs['a']} and {other} ran it" in err
    b = json.loads(runs["b"].read_text())
    b["provenance"]["budget"] = 3
    other.write_text(json.dumps(b))
    err = refused(capsys, [*argv, str(runs["a"]), str(other)])
    assert f"the parts differ in budget: {runs['a']}: 2; {other}: 3" in err
    shutil.copy(config.corpus_dir() / "library" / "library.json", tmp_path / "lib.json")
    err = refused(capsys, [*argv, str(runs["a"]), "--library", str(tmp_path / "lib.json")])
    assert f"the parts ran with library corpus/library/library.json, --library gives {tmp_path / 'lib.json'}" in err
    b = json.loads(runs["b"].read_text())
    b["admission_rate"]["admitted"] -= 1  # the library was admitted again between the two runs
    other.write_text(json.dumps(b))
    err = refused(capsys, [*argv, str(runs["a"]), str(other)])
    assert "the parts ran with the library admitted differently" in err
    assert not (tmp_path / "m.json").exists()


def test_merge_keeps_the_admission_the_parts_ran_with(lineages, runs, tmp_path):
    """The bundled library may be rebuilt and admitted again after the parts ran: the merge reports
    the admission they recorded, not the library file's today."""
    parts = []
    for name in ("a", "b"):
        doc = json.loads(runs[name].read_text())
        doc["admission_rate"] = {**doc["admission_rate"], "how": "the admission the runs saw"}
        parts.append(tmp_path / f"{name}.json")
        parts[-1].write_text(json.dumps(doc))
    out = tmp_path / "m.json"
    assert skills.main(["--lineages", str(lineages), "--out", str(out), "--merge",
                        *map(str, parts)]) == 0
    assert json.loads(out.read_text())["admission_rate"]["how"] == "the admission the runs saw"


def test_the_gpu_session_stage_runs_a_part(gate_cache, tmp_path):
    """The skills:SPEC stage's own function and command line, with python3 a shim that turns its GPU
    gate into the compile gate (no GPU here) and notes the arguments it was given."""
    assert subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu_session.sh")]).returncode == 0
    done, argv = session_stage("skills:topk:library@300", tmp_path, {
        "SKILLS_BUDGET": "2", "SKILLS_RUN_S": "100", "SKILLS_JOBS": "6", "LANE": "1", "SKILLS_JOBS_1": "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "=== skills:topk:library" in done.stdout and "limit 300 s" in done.stdout
    assert argv[:6] == ["bench/skills_eval.py", "--gate", "gpu", "--record", "--only", "topk:library"]
    assert argv[argv.index("--budget") + 1] == "2" and argv[argv.index("--time-limit-s") + 1] == "100"
    assert argv[argv.index("--jobs") + 1] == "2", "lane 1's own SKILLS_JOBS_1 before SKILLS_JOBS"
    document = json.loads((tmp_path / "out" / "results" / "skills-topk-library.json").read_text())
    assert document["partial"]["complete"] and [list(w["strategies"]) for w in document["workloads"]] == [["library"]]
    [topk] = document["workloads"]  # the bundled corpus: its GPU walk of topk
    assert topk["operator"] == "topk" and topk["lineage_gate"] == "gpu"
    assert [p.name for p in (tmp_path / "out" / "results" / "skills-docs").iterdir()] == [
        f"{topk['lineage'].replace('@', '-').replace(':', '-')}-library.json"]
    # what the run heard, line by line as it happened: a run killed before its row is written says how far it got
    log = [json.loads(line) for line in (tmp_path / "out" / "results" / "skills-topk-library.log.jsonl").open()]
    assert {(line["workload"], line["strategy"]) for line in log} == {(topk["lineage"], "library")}
    assert "gating the start kernel" in log[0]["message"]
    assert [line["seconds"] for line in log] == sorted(line["seconds"] for line in log)
    events = [line for line in log if "event" in line]
    run = topk["strategies"]["library"]
    assert events and events[-1]["evaluations"] == run["evaluations"]
    assert [e["attempt"]["index"] for e in events if e["event"] == "attempt"] == list(range(len(
        [e for e in events if e["event"] == "attempt"])))
    assert log[-1]["message"].startswith(run["stop"])


@pytest.mark.parametrize("stop", ["gate_error", "llm_budget", "start_failed"])
def test_a_run_that_did_not_end_on_its_own_is_no_budget_n_comparison(stop):
    """Only a run with no candidate left, or none faster, could not have changed with more budget."""
    assert "not at one budget" in skills.at_one_budget(run_row(stop, 2, 5.0), run_row("time_limit", 7, 2.0))[3]
    assert skills.at_one_budget(run_row("no_improvement", 7, 5.0), run_row("time_limit", 7, 2.0)) == (5.0, 2.0, 7, "")


@pytest.mark.parametrize("limit", ["0", "-5", "nan", "inf", "soon"])
def test_a_time_limit_must_be_a_positive_number_of_seconds(limit, capsys):
    assert "a time limit is a number of seconds > 0" in refused(capsys, ["--time-limit-s", limit])


def test_optimize_refuses_a_time_limit_that_is_not_positive(gate_cache):
    from klineage import corpus
    from klineage.errors import KLineageError
    from klineage.optimize import optimize

    naive = corpus.kernel_entry("row_softmax/naive").load()
    for limit in (0, -1.0, float("nan")):
        with pytest.raises(KLineageError, match="time limit is a number of seconds > 0"):
            optimize(corpus.problem_path("row_softmax"), naive, strategy=Strategy.UNCONDITIONED_RANDOM, budget=2,
                     gate_mode="compile", cache=gate_cache, time_limit_s=limit)


def test_holding_out_an_operator_leaves_its_walks_and_the_cards_only_they_taught():
    from klineage.skills.library import lineage_index, load_library

    library, index = load_library(config.REPO_ROOT / "corpus" / "library" / "library.json"), lineage_index()
    kept, walks = skills.held_out(library, index, "gemm")
    assert walks and set(walks) == {name for name, lin in index.items() if lin.problem.operator != "gemm"}
    dropped = [c.transform for c in library.cards if c not in kept.cards]
    assert dropped == ["block_swizzle"]  # GEMM's walk alone taught it; the rest conv2d's walks taught too
    for card in library.cards:
        assert (card in kept.cards) is any(ref.lineage in walks for ref in card.evidence)
    assert kept.provenance["held_out_operator"] == "gemm"


def test_a_held_out_part_says_so_and_does_not_merge_with_roundtrip_parts(lineages, runs, tmp_path, capsys):
    held = evaluate(lineages, tmp_path / "held.json", "--only", "topk:library", "--hold-out-operator")
    assert held["provenance"]["held_out"] == "operator"
    assert "held_out" not in json.loads(runs["a"].read_text())["provenance"]  # earlier parts merge as before
    err = refused(capsys, ["--merge", str(runs["a"]), str(tmp_path / "held.json"), "--lineages", str(lineages),
                           "--out", str(tmp_path / "merged.json")])
    assert "the parts differ in held_out" in err


def test_merge_reads_a_rows_budgets_off_its_document_and_refuses_another(tmp_path):
    """A part written before rows kept speedups_by_budget: merge reads them off the optimization
    document beside it (the H200 run of gdn_chunked_mma's library, which took its step at its 2nd
    evaluation), and refuses a document that is not the row's run."""
    measured = config.REPO_ROOT / "bench" / "results" / "skills-parts" / "session-9"
    library = "skills-row_softmax-library,topk-library,gemm_wgmma_tma-library,gdn_chunked_mma-library.json"
    random = ("skills-gdn_chunked_mma-unconditioned_random,gdn_chunked_mma-unconditioned_greedy,"
              "gdn_chunked_mma-generated_only.json")
    for name in (library, random):
        shutil.copy(measured / name, tmp_path / name)
    shutil.copytree(measured / "docs", tmp_path / "docs")
    [row] = [w for w in json.loads((tmp_path / library).read_text())["workloads"] if w["operator"] == "gdn"]
    assert "speedups_by_budget" not in row["strategies"]["library"]
    out = tmp_path / "merged.json"
    assert skills.main(["--merge", str(tmp_path / library), str(tmp_path / random), "--out", str(out)]) == 0
    [gdn] = [w for w in json.loads(out.read_text())["workloads"] if w["lineage"] == row["lineage"]]
    assert gdn["strategies"]["library"]["speedups_by_budget"] == [[2, row["strategies"]["library"]["speedup"]]]
    assert gdn["vs_unconditioned_budgets"] == {"unconditioned_random": 2, "unconditioned_greedy": 2}
    assert gdn["vs_unconditioned"] == row["strategies"]["library"]["speedup"]  # both random runs: 1.0 after 2
    document = tmp_path / "docs" / skills.document_name(row["lineage"], "library")
    doc = json.loads(document.read_text())
    doc["steps"], doc["stop"] = [], "no_improvement"
    document.write_text(json.dumps(doc))
    with pytest.raises(SystemExit):
        skills.main(["--merge", str(tmp_path / library), str(tmp_path / random), "--out", str(out)])


def test_the_expert_comparison_reports_no_ratio_from_a_timing_that_never_settled(monkeypatch):
    """A recorded H200 verdict (rope's walk step 3 timed on every case) stands for the best-vs-expert gate:
    as recorded, settled, its ratio is the row's vs_expert; marked unsettled, the same ratio is no
    measurement and the row says why instead."""
    import dataclasses

    from klineage.config import GateMode
    from klineage.walk.timing_audit import percase_step

    recorded = percase_step(Lineage.load(config.REPO_ROOT / "bench" / "walks" / "rope_pack8.gpu.json.gz"), 3)
    expected = recorded.profile["ratios"]["vs_baseline"]["overall"]
    settlement = {**recorded.profile["settlement"], "state": "unsettled", "reasons": ["spread 0.7 > 0.5"]}
    unsettled = dataclasses.replace(recorded, profile={**recorded.profile, "settlement": settlement})
    for verdict, ratio in ((recorded, expected), (unsettled, None)):
        monkeypatch.setattr(skills, "run_gate", lambda *args, verdict=verdict, **kwargs: verdict)
        got, reason, _ = skills.versus_expert(Path("problem.py"), None, None, GateMode.GPU)
        assert got == ratio
        assert (reason == "") if ratio else ("unsettled" in reason and "no settled paired ratio" in reason)
