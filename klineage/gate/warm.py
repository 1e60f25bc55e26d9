"""A warm runner: one sandboxed runner process per worker and problem that keeps torch, the problem,
its vendor path and the CUDA context loaded, and judges candidates one after another (issue 29).

A cold gate pays seconds to import torch and load the problem in every runner, and GDN's vendor
builds its Triton kernels in every runner (91 s of a 105-s gate). A warm runner pays that once.

Only a clean pass is taken from it. Any finding, harness error, output over the cap, a runner that
died or one that took too long ends the warm runner, and that candidate is judged again by a cold
runner (`execute.run_on_gpu`). So a fault's verdict is the cold runner's by construction, and the
next candidate gets a fresh warm runner. The runner process goes through the same `sandbox.run` as a
cold one, in a thread of its own; the two talk through files in the runner's private folder.

    with WarmRunner(problem_path) as runner:
        verdict = run_gate(problem_path, kernel, policy=policy, runner=runner)
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from klineage import config
from klineage.config import GateMode
from klineage.files import write_atomic
from klineage.gate import execute, sandbox
from klineage.gate.jail import Access
from klineage.gate.policy import GatePolicy

WARM_LIFE_S = 3600.0  # the sandbox's wall-clock limit for one warm runner; a new one starts before it runs out
READY_S = 300.0  # importing torch, loading the problem and creating the context, before the first job


class _Session:
    """One warm runner process and its folder: inbox (jobs), outbox (results), one folder per job."""

    def __init__(self, problem: Path, policy: GatePolicy):
        self.work = execute._workdir()
        problem = execute._stage_problem(problem, self.work)  # the sandbox shows the runner only its folder
        self.inbox, self.outbox = self.work / "inbox", self.work / "outbox"
        self.inbox.mkdir()
        self.outbox.mkdir()
        self.progress = self.work / "progress.jsonl"
        request = {"mode": "serve", "problem": str(problem), "inbox": str(self.inbox), "outbox": str(self.outbox),
                   "progress": str(self.progress)}
        (self.work / "request.json").write_text(json.dumps(request), encoding="utf-8")
        self.jobs = 0
        self.listener: Callable[[dict], None] | None = None
        self.started = time.monotonic()
        self.ended: sandbox.SandboxResult | None = None
        self.isolation: tuple[str, ...] = ()  # what holds the runner, in words, once the sandbox has started it
        self.thread = threading.Thread(target=self._serve, args=(policy,), daemon=True)
        self.thread.start()

    def _serve(self, policy: GatePolicy) -> None:
        argv = [config.runner_python(), "-m", "klineage.gate.runner", "request.json", "result.json"]
        self.ended = sandbox.run(argv, cwd=self.work, timeout_s=WARM_LIFE_S, env=execute._runner_env(home=self.work),
                                 output_cap=policy.output_cap, progress_file=self.progress,
                                 stall_s=policy.launch_timeout_s, on_progress=self._seen,
                                 jail=execute._jail(Access.GPU, self.work), on_start=self._held)

    def _held(self, isolation: tuple[str, ...]) -> None:
        self.isolation = isolation

    def _seen(self, event: dict) -> None:
        if self.listener is not None:
            self.listener(event)

    def usable(self, policy: GatePolicy) -> bool:
        """Alive, and with time left for a whole run before the sandbox's limit."""
        return self.thread.is_alive() and time.monotonic() - self.started < WARM_LIFE_S - policy.run_timeout_s

    def judge(self, request: dict[str, Any], cubins: dict[str, bytes], policy: GatePolicy,
              on_progress: Callable[[dict], None] | None) -> execute.RunOutcome | None:
        """The run's outcome where the candidate passed cleanly here; None where a cold runner must judge it."""
        number, self.jobs = self.jobs, self.jobs + 1
        folder = self.work / f"job-{number}"
        folder.mkdir()
        kernels = []
        for spec in request["kernels"]:
            (folder / f"{spec['role']}.cubin").write_bytes(cubins[spec["role"]])
            kernels.append({**spec, "cubin": str(folder / f"{spec['role']}.cubin")})
        output = folder / "output.log"
        job = {**request, "kernels": kernels, "policy": policy.to_dict(), "output": str(output)}
        write_atomic(self.inbox / f"{number}.json", json.dumps(job))
        self.listener = on_progress
        clock = time.monotonic()
        deadline = clock + policy.run_timeout_s + (READY_S if number == 0 else 0.0)
        answer = self.outbox / f"{number}.json"
        while not answer.is_file() and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.listener = None
        result = execute._read_result(answer)
        # read as the cold runner's files are: a capped regular file, never through a planted link
        printed = sandbox.read_capped(output, policy.output_cap)
        unreadable = printed is None and os.path.lexists(output)  # over the cap, a link, a FIFO: cold judges it
        if result is None or result["findings"] or "error" in result or unreadable:
            return None
        excerpt = (printed or b"")[-4000:].decode("utf-8", "replace")
        execute.held_by(result, self.isolation)
        return execute.RunOutcome(result=result, seconds=time.monotonic() - clock, output_excerpt=excerpt,
                                  isolation=self.isolation)

    def close(self) -> None:
        """Ask the runner to end, and give its folder back. A runner that does not answer is left to
        the sandbox's limits (a hung launch: the stall watchdog; anything else: WARM_LIFE_S)."""
        (self.inbox / "stop").touch()
        self.thread.join(timeout=30)
        if not self.thread.is_alive():
            shutil.rmtree(self.work, ignore_errors=True)


class WarmRunner:
    """A warm runner for one problem, restarted after every candidate it cannot judge cleanly."""

    def __init__(self, problem_path: str | Path):
        self.problem = Path(problem_path).resolve()
        self.session: _Session | None = None
        self.started = 0  # runner processes started: how often a candidate needed a fresh one

    def run_on_gpu(self, request: dict[str, Any], cubins: dict[str, bytes], policy: GatePolicy,
                   on_progress: Callable[[dict], None] | None = None) -> execute.RunOutcome:
        """What `execute.run_on_gpu` gives for this request."""
        if request.get("mode") != "run" or Path(request["problem"]).resolve() != self.problem:
            return execute.run_on_gpu(request, cubins, policy, on_progress=on_progress)
        if self.session is None or not self.session.usable(policy):
            self.close()
            self.session = _Session(self.problem, policy)
            self.started += 1
        outcome = self.session.judge(request, cubins, policy, on_progress)
        if outcome is None:  # a fault, an error, a flood, a death or a delay: judged again, cold
            self.close()
            cold_request = {**request, "kernels": [dict(spec) for spec in request["kernels"]]}
            return execute.run_on_gpu(cold_request, cubins, policy, on_progress=on_progress)
        return outcome

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def __enter__(self) -> WarmRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def serial_runner(problem_path: str | Path, mode: GateMode) -> Iterator[WarmRunner | None]:
    """The warm runner for a walk's or an optimization's one-at-a-time gates (every timing, and the
    states no prefetch judged) on the GPU; None where the gate runs nothing (replay, compile) or
    KLINEAGE_WARM_RUNNER=0. Prefetch threads keep their cold runners: a warm runner judges one
    candidate at a time, and correctness judged side by side needs a process each."""
    if mode is not GateMode.GPU or not config.warm_runners():
        yield None
        return
    with WarmRunner(problem_path) as runner:
        yield runner
