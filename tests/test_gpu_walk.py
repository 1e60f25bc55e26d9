"""A walk on a real GPU (skipped without one): prefetched states, timed forward steps (kernels as
loaded, or exchanging places), every verdict recorded, and the recording replays the same lineage
byte for byte."""

from __future__ import annotations

import json

import pytest

from klineage import config, corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.gate.execute import gpu_name
from klineage.gate.policy import Placement
from klineage.gate.prefetch import prefetch
from klineage.lineage import ForwardStatus, Termination
from klineage.walk.prefetch import guessed_states
from klineage.walk.walker import DEFAULT_POLICY, walk

pytestmark = pytest.mark.gpu
SOFTMAX = corpus.problem_path("row_softmax")
DRY = config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.full.dry.json"


@pytest.mark.parametrize("placement", list(Placement))
def test_gpu_walk_is_timed_recorded_and_replays(tmp_path, monkeypatch, placement):
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    cache = GateCache(tmp_path / "cache", tmp_path / "recorded")
    guess = guessed_states(DRY, expert)[:4]
    done = prefetch(SOFTMAX, guess, DEFAULT_POLICY, cache, jobs=4)
    assert done.judged.get("passed") == 4 and not done.errors, done

    lineage = walk(SOFTMAX, expert, gate_mode=GateMode.GPU, cache=cache, max_steps=3, record=True, placement=placement)
    assert lineage.termination.kind is Termination.STEP_LIMIT, lineage.termination
    assert len(lineage.transitions) == 3
    for step in lineage.transitions:
        assert step.forward.status in (
            ForwardStatus.VERIFIED,
            ForwardStatus.SLOWER,
            ForwardStatus.NO_MECHANICAL_FORWARD,
        )
        if step.forward.status is not ForwardStatus.NO_MECHANICAL_FORWARD:
            assert step.forward.timing is not None and len(step.forward.timing.per_trial) == DEFAULT_POLICY.trials

    replay_cache = GateCache(None, tmp_path / "recorded")
    monkeypatch.setenv("KLINEAGE_REPLAY_GPU", gpu_name())  # replayed as recorded: on this host's GPU, whichever it is
    assert lineage.policy["forward_timing"].get("placement", "as_loaded") == placement.value
    replayed = walk(SOFTMAX, expert, gate_mode=GateMode.REPLAY, cache=replay_cache, max_steps=3, placement=placement)
    recorded, again = lineage.to_dict(), replayed.to_dict()
    recorded.pop("gate"), again.pop("gate")
    assert json.dumps(again, sort_keys=True) == json.dumps(recorded, sort_keys=True)
