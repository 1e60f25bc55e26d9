"""Vector replay (klineage.skills.replay): a lineage's recorded forward diff re-applied to a kernel,
strictly (every hunk's old lines verbatim, exactly once), on the committed GEMM walk."""

from __future__ import annotations

import dataclasses
import json

import pytest

from klineage import config
from klineage.documents import document_files
from klineage.lineage import Lineage, unified_diff
from klineage.skills.card import SkillCard
from klineage.skills.induction import induce, lineage_id
from klineage.skills.library import lineage_index
from klineage.skills.replay import apply_diff, replay, replay_diff
from klineage.transforms.base import Direction

GEMM = config.corpus_dir() / "lineages" / "gemm_mma_sync.gpu.json"

DIFF = """--- a/kernel.cu
+++ b/kernel.cu
@@ -2,2 +2,2 @@
 int a = 1;
-int b = 2;
+int b = 3;
@@ -5,1 +5,2 @@
 return;
+// done
"""


def test_apply_diff_needs_every_hunk_exactly_once():
    assert apply_diff("x\nint a = 1;\nint b = 2;\ny\nreturn;", DIFF.split("+++ b/kernel.cu\n")[1]) == \
        "x\nint a = 1;\nint b = 3;\ny\nreturn;\n// done"
    hunks = DIFF.split("+++ b/kernel.cu\n")[1]
    assert apply_diff("int a = 1;\nint b = 5;\nreturn;", hunks) is None  # a removed line differs
    assert apply_diff("int a = 1;\nint b = 2;\nint a = 1;\nint b = 2;\nreturn;", hunks) is None  # ambiguous
    assert apply_diff("int a = 1;\nint b = 2;", hunks) is None  # the second hunk finds no context


def test_apply_diff_ignores_indentation_only_where_nothing_else_matches():
    hunks = DIFF.split("+++ b/kernel.cu\n")[1]
    # a restored #pragma may be indented otherwise than the expert's: the lines still match
    assert apply_diff("x\n    int a = 1;\n  int b = 2;  \ny\nreturn;", hunks) == \
        "x\nint a = 1;\nint b = 3;\ny\nreturn;\n// done"
    # verbatim wins: the exact place is taken though another matches with its blanks ignored
    assert apply_diff("  int a = 1;\n  int b = 2;\nint a = 1;\nint b = 2;\nreturn;", hunks) == \
        "  int a = 1;\n  int b = 2;\nint a = 1;\nint b = 3;\nreturn;\n// done"
    # two places that match only with blanks ignored are still ambiguous
    assert apply_diff(" int a = 1;\n int b = 2;\n  int a = 1;\n  int b = 2;\nreturn;", hunks) is None
    assert apply_diff("int a = 1;\nint  b = 2;\nreturn;", hunks) is None  # blanks inside a line still count


@pytest.fixture(scope="module")
def walk() -> Lineage:
    return Lineage.load(GEMM)


@pytest.fixture(scope="module")
def unpipeline(walk) -> SkillCard:
    [card] = [c for c in induce([walk], None) if c.transform == "unpipeline"]
    return card


def test_replay_restores_a_step_without_a_mechanical_forward(walk, unpipeline):
    step = walk.transitions[2]
    assert step.transform == "unpipeline" and step.forward.status.value == "no_mechanical_forward"
    child, parent = walk.states[3].kernel, walk.states[2].kernel
    [rewrite] = replay(unpipeline, child, {lineage_id(walk): walk})
    assert rewrite.state.fingerprint == parent.fingerprint
    assert rewrite.direction is Direction.FORWARD and rewrite.anchor == step.anchor


def test_replay_is_strict_where_later_steps_rewrote_the_context(walk, unpipeline):
    """At the naive end the copies are synchronous again: the pipeline's diff has no place there
    until the async copies are back (the loop replans after each step)."""
    assert replay(unpipeline, walk.states[-1].kernel, {lineage_id(walk): walk}) == []
    assert replay(unpipeline, walk.states[-1].kernel, {}) == []  # no lineage at hand, nothing to replay


def test_replay_diff_carries_a_plan_change(walk):
    state = walk.states[0].kernel
    changed = dataclasses.replace(state, plan=dataclasses.replace(state.plan, description="replayed plan"))
    diff = unified_diff(state, changed, "child", "parent")
    assert "launch.json" in diff
    assert replay_diff(state, diff).fingerprint == changed.fingerprint
    assert replay_diff(changed, diff) is None  # already applied: the old lines are gone
    broken = diff.replace('+ "description": "replayed plan",', '+ "description": "replayed plan",\n+ "arch": "sm_42",')
    assert broken != diff
    assert replay_diff(state, broken) is None  # a plan the launch-plan reader refuses


def test_the_lineage_index_reaches_every_committed_walk():
    index = lineage_index()
    for path in document_files(config.corpus_dir() / "lineages"):
        assert lineage_id(Lineage.load(path)) in index
    assert json.loads(GEMM.read_text())["gate"] == "gpu"
