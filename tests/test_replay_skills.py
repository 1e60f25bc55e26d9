"""The skills evaluation measured on the GPU replays from its recorded verdicts, workload for workload.

bench/results/skills-parts/ holds the parts that bench/gpu_session.sh's `skills:` stage wrote on the
H200 (bench/results/skills.json is their merge) and `library.json`, the library they ran with (the
bundled one of that commit; the bundled library has been rebuilt since). Each complete part is run
again here with the replay gate, that library and the same settings: every optimization decision,
evaluation count and ratio must come out as it did on the GPU (replay serves only recorded
verdicts; a miss fails the run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage import config

from bench_tools import bench_script

skills_eval = bench_script("skills_eval")

FOLDER = config.REPO_ROOT / "bench" / "results" / "skills-parts"
LIBRARY = FOLDER / "library.json"
PARTS = sorted(p for p in FOLDER.glob("*.json") if p != LIBRARY)
COMPLETE = [p for p in PARTS if json.loads(p.read_text())["partial"]["complete"]]


def test_there_are_complete_gpu_parts_to_replay():
    assert COMPLETE and all(json.loads(p.read_text())["provenance"]["gate"] == "gpu" for p in PARTS)


@pytest.mark.parametrize("part", COMPLETE, ids=lambda p: p.stem)
def test_a_gpu_part_replays_workload_for_workload(part: Path, tmp_path):
    measured = json.loads(part.read_text())
    facts = measured["provenance"]
    out = tmp_path / "replayed.json"
    assert skills_eval.main(["--gate", "replay", "--only", ",".join(measured["partial"]["only"]),
                             "--budget", str(facts["budget"]), "--seed", str(facts["seed"]),
                             "--statuses", ",".join(facts["statuses"]), "--library", str(LIBRARY),
                             "--out", str(out)]) == 0
    assert json.loads(out.read_text())["workloads"] == measured["workloads"]
