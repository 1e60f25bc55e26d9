"""bench/same_code_census.py on one operator of the committed H100 transfer document: two of its searches replayed
off the H100's recorded verdicts, each gated candidate compiled here (real nvcc) and compared with its best."""

from __future__ import annotations

import json

from bench_tools import bench_script
from klineage import config

PART = config.REPO_ROOT / "bench" / "results" / "transfer-h100.json"


def test_the_census_finds_the_ldg_nvcc_had_already_applied_to_gelu_mul(tmp_path, monkeypatch):
    monkeypatch.setenv("KLINEAGE_REPLAY_GPU", "NVIDIA H100 80GB HBM3")
    document = json.loads(PART.read_text(encoding="utf-8"))
    part = tmp_path / "gelu_mul.json"
    # the greedy search left out (its seven gate calls would add compiles, not a mechanism)
    runs = {s: r for s, r in document["runs"]["gelu_mul"].items() if s != "unconditioned_greedy"}
    runs["unconditioned_random"] = runs["unconditioned_random"] | {"evaluations": 3}  # not the run that replays
    part.write_text(json.dumps(document | {"runs": {"gelu_mul": runs}}), encoding="utf-8")
    result = bench_script("same_code_census").report(part)
    replayed = document["runs"]["gelu_mul"]["unconditioned_random"]["evaluations"]
    [error] = result["errors"]
    assert error.startswith(f"gelu_mul unconditioned_random: the replay is not the recorded run (evaluations "
                            f"{replayed}, not 3)")
    assert set(result["by_strategy"]) == {"library_then_catalog"}, "its rows are left out"
    gated = {s: r["evaluations"] - 1 for s, r in runs.items() if s in result["by_strategy"]}  # the start's: no row
    assert {s: v["gated"] for s, v in result["by_strategy"].items()} == gated, "every gated candidate, each once"
    same = [r for r in result["rows"] if r["code"] == "same"]
    # the gate operand is read once through a const __restrict__ pointer: nvcc emits the read-only load already
    assert same and {r["transform"] for r in same} >= {"ldg_subscript"}
    assert all(v["same_code"] >= 1 for v in result["by_strategy"].values())
    assert result["same_code"] == len(same) < result["gated"]
    assert sum(result["by_status"].values()) == len(same) and {r["status"] for r in same} <= {"not_faster", "faster"}


def test_a_document_whose_searches_ran_with_the_check_is_refused(tmp_path):
    document = json.loads(PART.read_text(encoding="utf-8"))
    part = tmp_path / "checked.json"
    part.write_text(json.dumps(document | {"provenance": document["provenance"] | {"code_check": "sass"}}))
    out = tmp_path / "out.json"
    assert bench_script("same_code_census").main(["--part", str(part), "--out", str(out)]) == 2
    assert not out.exists()
