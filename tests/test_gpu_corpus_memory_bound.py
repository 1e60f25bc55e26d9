"""The memory-bound corpus workloads on a real GPU (sm_90; skipped elsewhere).

For each of the nine problems: the naive kernel passes the gate on every case and seed (timed against
the vendor path on the headline), and the expert passes it too, timed against the vendor and the naive
kernel on the headline, at TARGET_VS_VENDOR of the vendor's speed or better. Verdicts are recorded
where KLINEAGE_RECORDED_DIR is set (bench/gpu_session.sh sets it). Run with -s to see the ratios.

    python -m pytest tests/test_gpu_corpus_memory_bound.py -v -s -n 0
"""

from __future__ import annotations

import os

import pytest

from gpu_tools import (
    assert_passes_every_case,
    kernel_named,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    timed_gate,
    timing_ratios,
)
from klineage import corpus
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from test_corpus_memory_bound import WORKLOADS

pytestmark = pytest.mark.gpu
TARGET_VS_VENDOR = 1.0



def _cases(name: str) -> set[str]:
    from klineage.problem import load_problem

    return {c.name for c in load_problem(corpus.problem_path(name)).info.cases}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_naive_passes_every_case(name, cache):
    naive = f"{name}/{WORKLOADS[name][0]}"
    verdict = run_gate(corpus.problem_path(name), kernel_named(naive), cache=cache,
                       policy=GatePolicy(sanitize=Sanitize.NEVER), record=bool(os.environ.get("KLINEAGE_RECORDED_DIR")))
    assert_passes_every_case(verdict, _cases(name))
    ratio = verdict.profile["ratios"]["vs_vendor"]["overall"]
    print(f"\n{naive}: {ratio:.3f}x the vendor on the headline")


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_expert_passes_every_case_and_beats_the_vendor(name, cache):
    naive, expert = (f"{name}/{k}" for k in WORKLOADS[name])
    verdict = timed_gate(corpus.problem_path(name), expert, naive, cache)
    assert_passes_every_case(verdict, _cases(name))
    vs_vendor, vs_naive = timing_ratios(verdict, expert, "the vendor", naive)
    assert vs_naive > 1.0, f"{expert} is not faster than {naive}"
    assert vs_vendor >= TARGET_VS_VENDOR, f"{expert}: {vs_vendor:.3f}x the vendor, the target is {TARGET_VS_VENDOR}x"
