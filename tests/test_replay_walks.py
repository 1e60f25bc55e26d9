"""The committed GPU walks (corpus/lineages/*.gpu.json, and bench/walks/*.gpu.json.gz: the Hopper experts
walked with warp_mma, kept out of the corpus so far) replay from the recorded verdicts byte for
byte: every state, step, timing and rejection comes back the same, with no GPU.

A replay uses the transforms the walk named (accepted or rejected): a transform added to the
catalog since would propose new steps that the GPU never judged. Transforms the walk never named
had no site on its path, so leaving them out changes nothing; a changed rewrite of a named one
gives another kernel, a replay miss, and fails here."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from klineage import config, corpus
from klineage.cli import main
from klineage.config import GateMode
from klineage.documents import document_files, document_stem
from klineage.gate.cache import GateCache
from klineage.gate.machine_code import CodeCheck, CodeIdentity
from klineage.lineage import ForwardStatus, Lineage
from klineage.walk.step_code import StepCodes
from klineage.walk.walker import transforms_named, walk
from sampled import sampled

WALKS = sorted([*document_files(config.corpus_dir() / "lineages", "*.gpu.json"),
                *document_files(config.bench_walks_dir(), "*.gpu.json")])
# The default run replays walks that together name every transform any walk names (a changed rewrite of one
# shows on them); the others replay under -m slow, before a GPU session or a change to a transform.
REPLAYED_BY_DEFAULT = ("gemm_mma_sync_any.gpu.json.gz", "gemm_wgmma_tma.gpu.json.gz",
                       "row_softmax_warp_vec4.gpu.json.gz", "logcumsumexp_block_scan.gpu.json.gz")


def test_gpu_walks_are_committed():
    names = {document_stem(p, ".gpu.json") for p in WALKS}
    assert {"row_softmax_warp_vec4", "topk_radix_select", "gemm_mma_sync", "conv2d_implicit_gemm", "gemm_wgmma_tma",
            "conv2d_implicit_wgmma", "fmha_flash_mma", "fmha_flash_wgmma", "gdn_chunked", "gdn_chunked_mma",
            "gemm_mma_sync_any", "conv2d_implicit_gemm_any", "fmha_flash_mma_r32"} <= names


def test_the_walks_replayed_by_default_name_every_transform_the_walks_name():
    def named(paths) -> set[str]:
        return {t.name for path in paths for t in transforms_named(Lineage.load(path))}

    assert named(p for p in WALKS if p.name in REPLAYED_BY_DEFAULT) == named(WALKS)


@pytest.mark.parametrize("path", sampled(WALKS, keep=[p for p in WALKS if p.name in REPLAYED_BY_DEFAULT]),
                         ids=lambda p: p.name)
def test_gpu_walk_replays_byte_for_byte(path: Path, tmp_path):
    assert_replays_as_recorded(Lineage.load(path))


def assert_replays_as_recorded(recorded: Lineage, code_check: CodeCheck = CodeCheck.NONE) -> None:
    """The walk again in replay mode, with the transforms and limits it ran with, gives its document."""
    expert = next(e.load() for e in corpus.list_kernels() if e.load().fingerprint == recorded.expert.fingerprint)
    replayed = walk(corpus.problem_path(recorded.problem.operator), expert, gate_mode=GateMode.REPLAY,
                    cache=GateCache(None, config.recorded_dir()), transforms=transforms_named(recorded),
                    max_steps=recorded.limits.max_steps, max_rejections=recorded.limits.max_rejections,
                    code_check=code_check)
    want, got = recorded.to_dict(), replayed.to_dict()
    assert (want.pop("gate"), got.pop("gate")) == ("gpu", "replay")
    # the gate seconds are the served verdicts' own: a state judged again since by a later gate version is
    # served that verdict, which took its own time (row_softmax/warp_vec4's second GPU walk gated one state of
    # the first again); every outcome and ratio must still be the walk's
    want["stats"].pop("seconds"), got["stats"].pop("seconds")
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def test_cli_replays_a_gpu_walk_as_it_ran(tmp_path, capsys):
    """`--as-in` takes the walk's transforms and limits; the full catalog today would propose a step
    (uncoarsen) that the GPU never judged, and replay refuses to guess. Both paths may be .gz, as
    in bench/walks/."""
    topk = config.corpus_dir() / "lineages" / "topk_radix_select.gpu.json"
    as_in, out = Lineage.load(topk).save(tmp_path / "topk.gpu.json.gz"), tmp_path / "replayed.gpu.json.gz"
    assert main(["walk", "topk/radix_select", "--gate", "replay", "--as-in", str(as_in), "--out", str(out)]) == 0
    want, got = json.loads(topk.read_text()), json.loads(gzip.decompress(out.read_bytes()))
    assert (want.pop("gate"), got.pop("gate")) == ("gpu", "replay") and got == want
    assert main(["walk", "topk/radix_select", "--gate", "replay", "--max-steps", "40", "--max-rejections", "8",
                 "--out", str(tmp_path / "full.json")]) == 2
    assert "no recorded verdict" in capsys.readouterr().err


def test_the_walk_with_the_code_check_replays_and_times_only_the_steps_that_change_the_code(monkeypatch):
    """bench/walks/code-check/: embedding_bag/gather_vec4 walked on an H100 with `code_check` SASS. The steps
    whose child runs its parent's machine code (restrict, unroll, an ldg nvcc had already made) are accepted
    untimed, the same steps the CPU census names; the walk ends on the kernel the walk without the check reached,
    with a third fewer gate calls."""
    monkeypatch.setenv("KLINEAGE_REPLAY_GPU", "NVIDIA H100 80GB HBM3")
    path = config.bench_walks_dir() / "code-check" / "embedding_bag_gather_vec4.gpu.json.gz"
    recorded, unchecked = Lineage.load(path), Lineage.load(config.bench_walks_dir() / path.name)
    assert_replays_as_recorded(recorded, CodeCheck.SASS)
    same = [t for t in recorded.transitions if t.forward.status is ForwardStatus.SAME_CODE]
    assert len(same) == 11 and all(t.forward.timing is None for t in same)
    assert {t.transform for t in same} == {"ldg", "restrict", "unroll"}
    # the GPU host's check and the CPU census of the walk without it (corpus/step_code.json) agree step by step
    census = StepCodes.load(config.corpus_dir() / "step_code.json")
    assert [census.of(unchecked, i) is CodeIdentity.SAME for i in range(len(unchecked.transitions))] == \
        [t.forward.status is ForwardStatus.SAME_CODE for t in recorded.transitions]
    assert recorded.states[-1].kernel.fingerprint == unchecked.states[-1].kernel.fingerprint
    assert (recorded.stats.gate_evaluations, unchecked.stats.gate_evaluations) == (22, 33)
