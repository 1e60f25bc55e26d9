"""Dry walks (compile-only gate, real nvcc, real audit) of the corpus experts with the catalog as it is.

Each walk must finish (`complete`) within the step budget, and its last state must have lost every
tensor-core, async-copy, pipeline and vector-memory mechanism the catalog can remove: no HMMA, LDSM,
LDGSTS, 128-bit global loads or stores in the SASS, no shuffle where shuffle_to_shared still finds a
site. What remains is printed as a table (run with `-s` to see it) and asserted where it is known.

The gate cache is one temporary folder shared by the whole module, so each state compiles once; a
cold run compiles about 110 states (minutes on a busy machine). KLINEAGE_WALK_CORPUS_CACHE names a
folder to keep the cache in between runs instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.features.source import source_features
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.kernel import KernelState
from klineage.lineage import FeatureLevel, Lineage, RejectionCategory, Termination
from klineage.rewriters.rules import PRIORITY
from klineage.transforms import catalog
from klineage.walk.audit import MECHANISMS
from klineage.walk.walker import DEFAULT_POLICY, walk

EXPERTS = ("row_softmax/warp_vec4", "gemm/mma_sync", "conv2d/implicit_gemm", "topk/radix_select")
MAX_STEPS = 40
GONE_SASS = ("hmma", "ldsm", "ldgsts", "ldg_128", "stg_128")
GONE_SOURCE = ("mma_sync", "ldmatrix", "cp_async", "cp_async_wait", "multistage_pipeline", "xor_swizzle",
               "restrict_ptr", "ldg", "unroll_pragma", "vector_type_float2")
# What each walk is known to leave, and why (a mechanism the catalog cannot yet take apart at that
# site). Kept as a check that the table below does not silently grow.
KNOWN_LEFT: dict[str, set[str]] = {
    # float4 survives in the vec_* helpers' signatures (devectorize rewrites accesses, not types)
    "row_softmax/warp_vec4": {"vector_type_float4", "shared_array"},
    # scalarize_ldmatrix/scalarize_mma exchange fragments with shuffles shuffle_to_shared does not match;
    # uint4 survives as the register type of the synchronous 16-byte copy; bf162 packs the epilogue
    "gemm/mma_sync": {"shfl", "vector_type_int4", "vector_type_bf162", "dynamic_shared"},
    "conv2d/implicit_gemm": {"shfl", "vector_type_int4", "vector_type_half2", "dynamic_shared"},
    # the bitonic exchange's shuffles are no warp reduction shuffle_to_shared matches; launch_bounds is
    # refused (1024 threads per block need the register cap); the keys stay float4/uint4 arrays
    "topk/radix_select": {"shfl", "launch_bounds", "vector_type_float4", "vector_type_int4", "shared_array",
                          "dynamic_shared"},
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    kept = os.environ.get("KLINEAGE_WALK_CORPUS_CACHE")
    root = Path(kept) if kept else tmp_path_factory.mktemp("corpus_walks")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KLINEAGE_CACHE_DIR", str(root / "cache"))
        yield GateCache(root / "cache", root / "recorded")


@pytest.fixture(scope="module")
def table():
    rows: list[str] = []
    yield rows
    print("\n" + "\n".join([f"{'expert':24} {'steps':>5}  {'termination':12} remaining mechanism features"]
                           + rows))


def _sass_counts(problem, state: KernelState, cache: GateCache) -> dict[str, int]:
    verdict = run_gate(problem, state, policy=DEFAULT_POLICY, mode=GateMode.COMPILE_ONLY, cache=cache)
    counts: dict[str, int] = {}
    for row in verdict.features["sass"]["counts"]:
        counts[row["name"]] = counts.get(row["name"], 0) + int(row["count"])
    return counts


# The tensor-core experts take about 4 minutes each from a cold cache (the scalarized MMA states
# are large), topk's 1024-thread radix select about 1.5 and row_softmax's about 1 on two busy cores:
# they run with `pytest -m slow` (after a change to the catalog or the walker). The default suite walks row_softmax in
# tests/test_walk.py and replays every GPU walk byte for byte (tests/test_replay_walks.py).
SLOW = set(EXPERTS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in EXPERTS])
def test_corpus_expert_walks_to_the_end(name, cache, table):
    problem = corpus.problem_path(name.split("/")[0])
    lineage = walk(problem, corpus.kernel_entry(name).load(), gate_mode=GateMode.COMPILE_ONLY, cache=cache,
                   max_steps=MAX_STEPS, max_rejections=8)
    assert Lineage.from_json(lineage.to_json()) == lineage
    final = lineage.states[-1].kernel
    left_source = sorted({(f.locus, f.name) for f in source_features(final.source)
                          if f.name in MECHANISMS[FeatureLevel.SOURCE]})
    sass = _sass_counts(problem, final, cache)
    left_sass = {n: c for n, c in sorted(sass.items()) if n in MECHANISMS[FeatureLevel.SASS] and c}
    table.append(f"{name:24} {len(lineage.transitions):>5}  {lineage.termination.kind.value:12} "
                 + ", ".join(f"{locus}:{feature}" for locus, feature in left_source)
                 + (f" | SASS {left_sass}" if left_sass else ""))

    assert lineage.termination.kind is Termination.COMPLETE, lineage.termination.message
    assert not [r for r in lineage.rejections if r.category is RejectionCategory.AUDIT_MISMATCH], \
        [r.evidence.message for r in lineage.rejections if r.category is RejectionCategory.AUDIT_MISMATCH]
    for feature in GONE_SASS:
        assert not sass.get(feature), f"{name}: SASS {feature} x{sass.get(feature)} left"
    assert not [pair for pair in left_source if pair[1] in GONE_SOURCE], left_source
    if not catalog()["shuffle_to_shared"].find(final):
        if "shfl" not in KNOWN_LEFT[name]:
            assert not sass.get("shfl"), f"{name}: {sass.get('shfl')} SHFL left"
    else:
        pytest.fail(f"{name}: shuffle_to_shared still finds sites at the end")
    assert {feature for _, feature in left_source} <= KNOWN_LEFT[name], left_source

    # order: every substantive mechanism the walk removed came before the micro-optimizations
    rank = {t: i for i, t in enumerate(PRIORITY)}
    micro = rank["fast_math"]
    steps = [t.transform for t in lineage.transitions]
    first_micro = next((i for i, t in enumerate(steps) if rank.get(t, 0) >= micro), len(steps))
    assert all(rank.get(t, 0) >= micro for t in steps[first_micro:]), steps
