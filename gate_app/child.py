"""A job's work, in a child process of the worker: `python -m gate_app.child < payload.json`.

It imports the engine and never Django. It speaks JSON lines on its original stdout, one object
each: {"progress": {"stage", "message"}} and {"event": {...}} (an optimization's attempts), then
{"result": ...} or {"error": "...", "type": ...}.
Anything else that writes to stdout (a library, a tool) is sent to stderr, which the worker keeps
as the job's log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from gate_app.childproc import guard


class Channel:
    def __init__(self, stream: TextIO):
        self._stream = stream

    def send(self, message: dict[str, Any]) -> None:
        self._stream.write(json.dumps(message, separators=(",", ":")) + "\n")
        self._stream.flush()

    def progress(self, stage: str, message: str, fraction: float | None = None) -> None:
        step: dict[str, Any] = {"stage": stage, "message": message}
        if fraction is not None:
            step["fraction"] = fraction
        self.send({"progress": step})


def run_gate_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    from klineage import uploads
    from klineage.config import GateMode
    from klineage.gate.pipeline import run_gate
    from klineage.gate.policy import GatePolicy

    problem = uploads.problem_path(payload["problem"])
    kernel = uploads.kernel_entry(payload["kernel"]).load()
    against = uploads.kernel_entry(payload["against"]).load() if payload.get("against") else None
    policy = GatePolicy.from_dict(payload.get("policy") or {})
    verdict = run_gate(problem, kernel, against=against, cases=payload.get("cases") or None, policy=policy,
                       mode=GateMode(payload.get("mode", "gpu")), progress=channel.progress,
                       record=bool(payload.get("record", False)))
    return verdict.to_dict()


_ACCEPTED = re.compile(r"step (\d+): accepted ")  # the walker's progress line for an accepted step


def _rewriter(name: str) -> Any:
    """None is the rule rewriter over the catalog; "llm" reads its settings from the environment."""
    if name != "llm":
        return None
    from klineage.rewriters.llm import LLMRewriter

    return LLMRewriter()


def run_walk_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Walk an expert (bundled or uploaded) backward; the result is the lineage document."""
    from klineage import uploads
    from klineage.config import GateMode
    from klineage.walk.walker import walk

    expert = uploads.kernel_entry(payload["kernel"]).load()
    max_steps = int(payload["max_steps"])

    def progress(stage: str, message: str) -> None:
        accepted = _ACCEPTED.match(message)
        channel.progress(stage, message, min(0.95, (int(accepted.group(1)) + 1) / max_steps) if accepted else None)

    lineage = walk(uploads.problem_path(payload["problem"]), expert, _rewriter(payload.get("rewriter", "rules")),
                   gate_mode=GateMode(payload["mode"]), max_steps=max_steps,
                   max_rejections=int(payload["max_rejections"]), progress=progress)
    return lineage.to_dict()


def run_optimize_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Optimize a kernel (bundled or uploaded) with the library the worker sent; the result is the
    optimization document. Each attempt and step goes to the worker as an event as it happens."""
    from klineage import config, uploads
    from klineage.config import GateMode
    from klineage.optimize import optimize
    from klineage.skills.library import Library

    problem = uploads.problem_path(payload["problem"])
    library = None
    if payload.get("library") is not None:
        library = Library.from_dict(payload["library"])
        if payload["scope"] == "other_operators":  # held out: only what was learnt on other operators
            from klineage.gate.execute import probe_problem

            operator = probe_problem(problem, config.cache_dir()).info.operator
            library = Library(tuple(c for c in library.cards if operator not in c.scope.operators),
                              {"path": f"{library.provenance.get('path', 'library')}, without {operator}'s cards"})
    result = optimize(problem, uploads.kernel_entry(payload["kernel"]).load(), strategy=payload["strategy"],
                      library=library, budget=int(payload["budget"]), gate_mode=GateMode(payload["mode"]),
                      rewriter=payload["rewriter"], seed=int(payload["seed"]), statuses=payload["statuses"],
                      time_limit_s=payload.get("time_limit_s"), progress=channel.progress,
                      on_event=lambda event: channel.send({"event": event.to_dict()}))
    return result.to_dict()


def run_probe_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Probe an uploaded problem file in the sandboxed runner: {"probe": ...}, or {"refused": why}
    when its file does not load or breaks the problem contract."""
    from klineage import config, uploads
    from klineage.errors import DocumentError
    from klineage.gate.execute import probe_problem

    path = uploads.problem_path(payload["problem"])
    channel.progress("probe", f"running {payload['problem']} in the sandboxed runner")
    try:
        return {"probe": probe_problem(path, config.cache_dir()).to_dict()}
    except DocumentError as exc:
        # The runner's own error repeats where it happened: keep its message, named as uploaded.
        message = str(exc).removeprefix(f"{exc.where}: ").removeprefix("DocumentError: ")
        return {"refused": message.replace(str(path), payload["problem"])}


def run_sleep_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Test-only work: sleeps in steps, optionally beside a grandchild in its own session (as the
    engine's sandboxed runner is), whose pid it reports so a test can see it die."""
    grandchild = None
    if payload.get("grandchild"):
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                      start_new_session=True)
        channel.progress("spawned", f"grandchild {grandchild.pid}")
    seconds = float(payload.get("seconds", 1.0))
    steps = max(1, int(payload.get("steps", 4)))
    for step in range(steps):
        time.sleep(seconds / steps)
        channel.progress("sleep", f"step {step + 1} of {steps}", (step + 1) / steps)
    if grandchild is not None:
        grandchild.kill()
        grandchild.wait()
    if payload.get("fail"):
        raise RuntimeError(str(payload["fail"]))
    return {"slept": seconds, "pid": os.getpid(), "echo": payload.get("echo"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "sees_database_url": "DATABASE_URL" in os.environ}


RUNNERS: dict[str, Callable[[dict[str, Any], Channel], dict[str, Any]]] = {
    "gate": run_gate_payload,
    "walk": run_walk_payload,
    "optimize": run_optimize_payload,
    "probe": run_probe_payload,
    "sleep": run_sleep_payload,
}


def main() -> int:
    guard()
    # Keep the protocol stream to ourselves: fd 1 becomes stderr for everyone else.
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    channel = Channel(protocol)
    try:
        payload = json.loads(sys.stdin.read())
        result = RUNNERS[payload["kind"]](payload, channel)
    except Exception as exc:  # reported to the worker, which fails the job with it
        import traceback

        from klineage.errors import KLineageError

        if not isinstance(exc, KLineageError):
            traceback.print_exc()
        channel.send({"error": str(exc) or type(exc).__name__, "type": type(exc).__name__})
        return 3
    channel.send({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
