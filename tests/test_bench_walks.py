"""The dry walks kept in bench/walks/ for the next GPU walks' prefetch (bench/walks/README.md) start
from today's corpus experts and are what today's catalog does: every step's backward rewrite, made
again here at its anchor (no compile), gives the child the walk recorded. A prefetch guessed from a
stale walk would judge kernels the GPU walk never reaches."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage import config, corpus
from klineage.config import GateMode
from klineage.documents import document_files, document_stem
from klineage.lineage import Lineage, Termination
from klineage.transforms import get

WALKS = document_files(config.bench_walks_dir(), "*.dry.json")
HOPPER = {"gemm_wgmma_tma": "gemm/wgmma_tma", "conv2d_implicit_wgmma": "conv2d/implicit_wgmma",
          "fmha_flash_wgmma": "fmha/flash_wgmma"}
# Walks that go further than the corpus's: gdn/chunked_mma's stopped at 40 steps (this one is not
# cut), fmha/flash_mma's kept its cp.async ring (unpipeline now takes it).
FURTHER = {"gdn_chunked_mma": "gdn/chunked_mma", "fmha_flash_mma": "fmha/flash_mma"}
# The corpus's other experts, never walked before: the any-shape GEMM and conv2d, and FMHA's 32-rows
# per warp kernel (the one that meets the mma.sync target).
VARIANTS = {"gemm_mma_sync_any": "gemm/mma_sync_any", "conv2d_implicit_gemm_any": "conv2d/implicit_gemm_any",
            "fmha_flash_mma_r32": "fmha/flash_mma_r32"}
# The memory-bound experts (docs/corpus.md), kept here rather than in corpus/lineages until their
# GPU walks: the library is built from corpus/lineages, and compile-only steps carry no effect.
MEMORY_BOUND = {name.replace("/", "_"): name for name in (
    "group_norm/smem_vec4", "causal_softmax/warp_vec4", "rope/pack8", "column_max/split_vec4",
    "logcumsumexp/block_scan", "nchw_to_nhwc/smem_tile", "embedding_bag/gather_vec4", "sgd_nesterov/vec4_grid",
    "add_rms_norm/pack8_regs")}
# Corpus experts walked on the GPU before a transform that now takes one of their steps: row_softmax/warp_vec4
# keeps its row in a register array, which uncache_row takes apart first.
REWALK = {"row_softmax_warp_vec4": "row_softmax/warp_vec4"}
EXPERTS = HOPPER | FURTHER | VARIANTS | MEMORY_BOUND | REWALK


def test_the_walks_for_the_next_gpu_walks_are_these():
    assert sorted(document_stem(p, ".dry.json") for p in WALKS) == sorted(EXPERTS)


def test_the_walks_are_kept_compressed():
    """Uncompressed they were 28 MB, and the tree copied to a GPU host may hold 64 MiB at most."""
    assert not list(config.bench_walks_dir().glob("*.json"))


@pytest.mark.parametrize("path", WALKS, ids=lambda p: p.name)
def test_each_step_is_what_the_catalog_does_today(path: Path):
    walk, name = Lineage.load(path), document_stem(path, ".dry.json")
    expert = corpus.kernel_entry(EXPERTS[name]).load()
    assert walk.gate is GateMode.COMPILE_ONLY and walk.termination.kind is Termination.COMPLETE
    assert walk.expert.fingerprint == expert.fingerprint
    assert (walk.transitions[0].transform == "warp_mma") == (name in HOPPER), "the Hopper walks start with warp_mma"
    states = {s.fingerprint: s.kernel for s in walk.states}
    for step in walk.transitions:
        rewrite = get(step.transform).backward(states[step.parent], step.anchor)
        assert rewrite.state.fingerprint == step.child, f"step {step.index} ({step.transform}) is stale"
