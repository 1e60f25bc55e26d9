"""The committed GPU walks (corpus/lineages/*.gpu.json, and bench/walks/*.gpu.json: the Hopper experts
walked with warp_mma, kept out of the corpus so far) replay from the recorded verdicts byte for
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
from klineage.cli import main
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.lineage import Lineage
from klineage.walk.walker import transforms_named, walk

WALKS = sorted([*(config.corpus_dir() / "lineages").glob("*.gpu.json"),
                *(config.REPO_ROOT / "bench" / "walks").glob("*.gpu.json")])


def test_gpu_walks_are_committed():
    names = {p.name for p in WALKS}
    assert {"row_softmax_warp_vec4.gpu.json", "topk_radix_select.gpu.json", "gemm_mma_sync.gpu.json",
            "conv2d_implicit_gemm.gpu.json", "gemm_wgmma_tma.gpu.json", "conv2d_implicit_wgmma.gpu.json",
            "fmha_flash_mma.gpu.json", "fmha_flash_wgmma.gpu.json", "gdn_chunked.gpu.json",
            "gdn_chunked_mma.gpu.json", "gemm_mma_sync_any.gpu.json", "conv2d_implicit_gemm_any.gpu.json"} <= names


@pytest.mark.parametrize("path", WALKS, ids=lambda p: p.name)
def test_gpu_walk_replays_byte_for_byte(path: Path, tmp_path):
    recorded = Lineage.load(path)
    transforms = transforms_named(recorded)
    expert = next(e.load() for e in corpus.list_kernels() if e.load().fingerprint == recorded.expert.fingerprint)
    replayed = walk(corpus.problem_path(recorded.problem.operator), expert, gate_mode=GateMode.REPLAY,
                    cache=GateCache(None, config.recorded_dir()), transforms=transforms,
                    max_steps=recorded.limits.max_steps, max_rejections=recorded.limits.max_rejections)
    want, got = recorded.to_dict(), replayed.to_dict()
    assert (want.pop("gate"), got.pop("gate")) == ("gpu", "replay")
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def test_cli_replays_a_gpu_walk_as_it_ran(tmp_path, capsys):
    """`--as-in` takes the walk's transforms and limits; the full catalog today would propose a step
    (uncoarsen) that the GPU never judged, and replay refuses to guess."""
    topk = config.corpus_dir() / "lineages" / "topk_radix_select.gpu.json"
    out = tmp_path / "replayed.json"
    assert main(["walk", "topk/radix_select", "--gate", "replay", "--as-in", str(topk), "--out", str(out)]) == 0
    want, got = json.loads(topk.read_text()), json.loads(out.read_text())
    assert (want.pop("gate"), got.pop("gate")) == ("gpu", "replay") and got == want
    assert main(["walk", "topk/radix_select", "--gate", "replay", "--max-steps", "40", "--max-rejections", "8",
                 "--out", str(tmp_path / "full.json")]) == 2
    assert "no recorded verdict" in capsys.readouterr().err
