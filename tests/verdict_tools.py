"""GPU verdicts made without a GPU, for tests of what the gate decides from stored verdicts.

The verdict is the compile-only gate's own (real probe, nvcc and features) re-keyed as the GPU
gate would key it (KLINEAGE_GPU_NAME names the GPU), with the status and findings the test says."""

from __future__ import annotations

from pathlib import Path

from klineage.config import GateMode
from klineage.gate.cache import GateCache, VerdictStore, verdict_key
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy
from klineage.gate.verdict import Finding, Verdict
from klineage.kernel import KernelState


def store_gpu_verdict(cache: GateCache, problem: Path, kernel: KernelState, policy: GatePolicy, status: str,
                      findings: tuple[Finding, ...] = (), store: VerdictStore | None = None,
                      against: KernelState | None = None, **sections) -> Verdict:
    compiled = run_gate(problem, kernel, against=against, mode=GateMode.COMPILE_ONLY, cache=cache, policy=policy)
    parts = {k: v for k, v in compiled.provenance["key_parts"].items() if k != "version"}
    key, parts = verdict_key(**{**parts, "gpu": "NVIDIA H200", "mode": GateMode.GPU.value})
    data = compiled.to_dict()
    data.update(status=status, provenance={**data["provenance"], "key": key, "key_parts": parts},
                findings=[f.to_dict() for f in findings], **sections)
    verdict = Verdict.from_dict(data)
    (store or cache.local).put(key, verdict)
    return verdict
