"""The committed GPU walks (corpus/lineages/*.gpu.json) replay from the recorded verdicts byte for
byte: every state, step, timing and rejection comes back the same, with no GPU.

A replay uses the transforms the walk named (accepted or rejected): a transform added to the
catalog since would propose new steps that the GPU never judged. Transforms the walk never named
had no site on its path, so leaving them out changes nothing; a changed rewrite of a named one
gives another kernel, a replay miss, and fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage import config, corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.lineage import Lineage
from klineage.transforms import catalog
from klineage.walk.walker import walk

WALKS = sorted((config.corpus_dir() / "lineages").glob("*.gpu.json"))


def test_gpu_walks_are_committed():
    names = {p.name for p in WALKS}
    assert {"row_softmax_warp_vec4.gpu.json", "topk_radix_select.gpu.json", "gemm_mma_sync.gpu.json"} <= names


@pytest.mark.parametrize("path", WALKS, ids=lambda p: p.name)
def test_gpu_walk_replays_byte_for_byte(path: Path, tmp_path):
    recorded = Lineage.load(path)
    named = {t.transform for t in recorded.transitions} | {r.transform for r in recorded.rejections}
    transforms = [t for name, t in catalog().items() if name in named]
    expert = next(e.load() for e in corpus.list_kernels() if e.load().fingerprint == recorded.expert.fingerprint)
    replayed = walk(corpus.problem_path(recorded.problem.operator), expert, gate_mode=GateMode.REPLAY,
                    cache=GateCache(None, config.recorded_dir()), transforms=transforms,
                    max_steps=recorded.limits.max_steps, max_rejections=recorded.limits.max_rejections)
    want, got = recorded.to_dict(), replayed.to_dict()
    assert (want.pop("gate"), got.pop("gate")) == ("gpu", "replay")
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
