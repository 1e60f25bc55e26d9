"""A stand-in for the GPU's timing in the optimize loop's CPU tests: every candidate goes through the real
compile-only gate (static check, nvcc, the plan), passes, and is timed against the best kernel by a script
`seconds(source)`, so that a test decides which rewrite pays. Everything else the loop does is real."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from klineage.config import GateMode
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.optimize import loop


def script_gpu_timing(monkeypatch, seconds: Callable[[str], float], runners: list | None = None) -> None:
    """Patch the loop's gate: a candidate's paired ratio is seconds(best) / seconds(candidate), the same in every
    trial; `runners`, when given, collects the runner each gate call was handed."""

    def gate(problem, kernel, *, against=None, policy, mode, cache, progress, runner):
        if runners is not None:
            runners.append(runner)
        verdict = run_gate(problem, kernel, against=against, policy=policy, mode=GateMode.COMPILE_ONLY, cache=cache)
        profile = {}
        if against is not None:
            ratio = seconds(against.source) / seconds(kernel.source)
            profile = {"ratios": {"vs_baseline": {"overall": ratio, "per_trial": [ratio] * 3}}}
        return dataclasses.replace(verdict, status=Status.PASSED, profile=profile)

    monkeypatch.setattr(loop, "run_gate", gate)
