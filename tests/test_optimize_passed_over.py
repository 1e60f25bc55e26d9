"""The library passes over a card alone when none of its measurements would have been a step: its
effects (median and every trial at the required ratio) and its passed admission trials. Such a
candidate costs no gate call and is recorded `passed_over`; unknown effects are tried, and the
card still travels in its walk's path and its whole mechanism.

The replayed run is the GPU's: every gate call the planner makes here was measured on the H200
by the session-8 run of the earlier planner (bench/results/skills-parts/session-8), so the replay
gate reproduces it from the recorded verdicts alone, and the committed
bench/results/skills-passed-over-replay.json must be what this code makes of them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench_tools import bench_script
from klineage import config
from klineage.lineage import Lineage
from klineage.optimize.result import AttemptStatus
from klineage.optimize.strategies import RewriterKind, Strategy, planner, short_of
from klineage.skills.card import CardStatus, Trial
from klineage.skills.library import lineage_index, load_library, problem_infos
from klineage.transforms import catalog

ROOT = config.REPO_ROOT
LIBRARY = ROOT / "corpus" / "library" / "library.json"


@pytest.fixture(scope="module")
def library():
    return load_library(LIBRARY)


def _card(library, prefix: str):
    return next(c for c in library.cards if c.id.startswith(prefix))


def test_a_card_none_of_whose_effects_would_be_a_step_is_short(library):
    unroll = _card(library, "d6b44a18")  # 25 effects; one trial reached 1.014x, no effect in every trial
    assert max(t for e in unroll.effects for t in e.per_trial) > 1.01
    assert "none of its 25 measured effect(s)" in short_of(unroll, 1.01)
    assert short_of(unroll, None) == ""
    assert short_of(unroll, 1.0) == ""  # an effect at 1.000x or better in every trial would be a step at 1.0


def test_one_effect_or_passed_trial_that_would_be_a_step_is_enough(library):
    unroll = _card(library, "d6b44a18")
    effect = dataclasses.replace(unroll.effects[0], ratio=1.02, per_trial=(1.02, 1.03, 1.02))
    assert short_of(dataclasses.replace(unroll, effects=unroll.effects + (effect,)), 1.01) == ""
    trial = Trial(state="f" * 64, passed=True, ratio=1.025)
    assert short_of(dataclasses.replace(unroll, verification_log=unroll.verification_log + (trial,)), 1.01) == ""
    failed = Trial(state="f" * 64, passed=False, ratio=1.5)  # a failed trial is no measurement of the card's gain
    assert short_of(dataclasses.replace(unroll, verification_log=unroll.verification_log + (failed,)), 1.01)


def test_a_card_with_nothing_measured_is_tried(library):
    unmeasured = _card(library, "6567dea5")
    assert not unmeasured.effects and short_of(unmeasured, 1.01) == ""


@pytest.mark.parametrize("strategy, passed_over", [(Strategy.LIBRARY, True), (Strategy.GENERATED_ONLY, False)])
def test_only_the_library_strategy_passes_over(library, strategy, passed_over):
    """Generated-only is the ablation without the lineages' evidence of where and when: it tries them."""
    walk = Lineage.load(ROOT / "corpus" / "lineages" / "conv2d_implicit_gemm.gpu.json")
    card = _card(library, "c00f2cba")  # unroll: 17 effects, none a step at 1.01x
    plan = planner(strategy, RewriterKind.RULES, cards=[card], problem=problem_infos({"conv2d"})["conv2d"],
                   statuses=(CardStatus.ADMITTED,), transforms=list(catalog().values()), seed=0,
                   lineages=lineage_index(), required_ratio=1.01)
    kernels = [c for c in plan(walk.states[-1].kernel) if c.rewrite is not None]
    assert kernels and all(bool(c.passed_over) is passed_over for c in kernels)


def test_the_replayed_gdn_run_spends_no_gate_call_on_a_passed_over_card(tmp_path):
    skills = bench_script("skills_eval")
    out = tmp_path / "gdn.json"
    assert skills.main(["--gate", "replay", "--only", "gdn_chunked:library", "--budget", "40", "--out", str(out),
                        "--documents", str(tmp_path / "docs")]) == 0
    [row] = json.loads(out.read_text())["workloads"]
    [doc] = (tmp_path / "docs").iterdir()
    attempts = json.loads(doc.read_text())["attempts"]
    passed_over = [a for a in attempts if a["status"] == AttemptStatus.PASSED_OVER.value]
    assert passed_over and all(a["evaluation"] is None and a["candidate"] for a in passed_over)
    library_row = row["strategies"]["library"]
    assert (library_row["evaluations"], library_row["wasted"]) == (2, 0)  # the GPU run of the earlier planner: 24, 22
    committed = json.loads((ROOT / "bench" / "results" / "skills-passed-over-replay.json").read_text())
    [same] = [w for w in committed["workloads"] if w["lineage"] == row["lineage"]]
    assert same["strategies"] == row["strategies"] and same["vs_expert"] == row["vs_expert"]
