"""Speculative gating: judge kernels that will probably be gated soon, several at once.

A gate run is bound by the host (process start, torch, building inputs), not by the GPU, so one
GPU can judge several kernels side by side. Correctness and sanitizer verdicts do not depend on what
else runs on the GPU; timings do, so only untimed gates are prefetched, and timed gates still run
one at a time (reusing the prefetched correctness: `GatePolicy.correctness_twin`). A walk prefetches
the states of a guess (a compile-only walk of the same expert); `optimize` prefetches the next
candidates of a round. Verdicts land in the content-addressed cache, and the caller, which decides
everything itself, finds there whatever the guess got right. A wrong guess costs GPU time only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from klineage import config
from klineage.config import GateMode
from klineage.errors import KLineageError
from klineage.gate.cache import GateCache
from klineage.gate.compile import compile_kernel
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy
from klineage.kernel import KernelState

Progress = Callable[[str, str], None]
# Enough to stay ahead of a walk (one state per step of 35-50 s on FMHA, 15-20 s to compile one);
# six at once beside the walk's own gate, its first step took 156 s on the H200 host (the next one 50 s).
WARM_JOBS = 2


@dataclass(frozen=True)
class Prefetched:
    states: int
    judged: dict[str, int]  # verdict status -> count
    errors: tuple[str, ...]  # states the gate could not judge, with why


def prefetch(problem: str | Path, states: Iterable[KernelState], policy: GatePolicy, cache: GateCache, *,
             jobs: int = 4, progress: Progress | None = None, mode: GateMode = GateMode.GPU,
             keep: bool = False) -> Prefetched:
    """Gate `states` under an untimed policy, `jobs` at a time, into `cache`; with `keep`, every
    verdict also into the recorded store (a walk cut by its time limit resumes from them on the next
    GPU host instead of judging its states again). Gates run in threads of this process: every
    cache write must be safe between threads too."""
    if policy.timing:
        raise KLineageError("prefetch judges untimed gates only: timings taken side by side are not comparable")
    states = list(states)
    judged: dict[str, int] = {}
    errors: list[str] = []
    say = progress or (lambda stage, message: None)
    with _threads_per_job(jobs), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_gate, problem, state, policy=policy, mode=mode, cache=cache): state
                   for state in states}
        for done, future in enumerate(as_completed(futures), 1):
            state = futures[future]
            try:
                verdict = future.result()
                status = verdict.status.value
                if keep:
                    cache.keep(verdict)
            except KLineageError as exc:
                status = "error"
                errors.append(f"{state.fingerprint[:12]}: {exc}")
            judged[status] = judged.get(status, 0) + 1
            say("prefetch", f"{done}/{len(states)} states judged ({state.fingerprint[:12]}: {status})")
    return Prefetched(len(states), judged, tuple(errors))


@contextmanager
def warming(states: Iterable[KernelState], jobs: int = WARM_JOBS) -> Iterator[list[Future]]:
    """Compile `states` in the background, `jobs` at a time in the order given, while the caller
    goes on. A walk resumed on a fresh GPU host finds its verdicts recorded, so no gate compiled
    its states there, and each forward timing would compile its child first (an FMHA state takes
    15-20 s); compiled ahead in walk order, they are ready when the walk reaches them (a gate
    that needs one being compiled waits for it). On leaving, the compiles not yet begun are
    dropped; the caller compiles whatever it still needs itself."""
    pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="warm")
    try:
        yield [pool.submit(compile_kernel, state, cache_dir=config.cache_dir()) for state in states]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


@contextmanager
def _threads_per_job(jobs: int) -> Iterator[None]:
    """Runners build inputs with torch's CPU thread pool; side by side, each gets its share of the
    cores this process was given (OMP_NUM_THREADS when a worker set it, else all of them)."""
    before = os.environ.get("OMP_NUM_THREADS")
    cores = int(before) if before and before.isdigit() else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, cores // max(1, jobs)))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before
