"""One CPU thread per xdist worker for torch (OpenMP, MKL) and numpy (OpenBLAS).

The default run has two workers on CI's two cores. Each library's pool otherwise takes every core, so two
workers run four spinning threads on two cores and each pool's barrier waits on a thread the other worker's
pool has descheduled: test_corpus_gdn_mma's numpy model of the ragged case took 3 s alone and 26 s beside a
second copy of itself (89 s in a full run), 3 s each with one thread. Set before torch or numpy is imported
(tests/conftest.py, a worker's first import of the project), so that the processes a test starts inherit it;
`worker_environ` gives a test the environment as the run found it, for a process whose own choice of thread
count the test checks (tests/test_gate_worker.py)."""

from __future__ import annotations

import os
import sys

VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_SET_HERE: list[str] = []


def one_thread_per_worker() -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process has the machine to itself
    for name in VARIABLES:
        if name not in os.environ:
            os.environ[name] = "1"
            _SET_HERE.append(name)
    if "torch" in sys.modules:  # too late for the variable: its pools read it on import
        sys.modules["torch"].set_num_threads(1)


def worker_environ() -> dict[str, str]:
    """os.environ without the variables `one_thread_per_worker` set."""
    return {k: v for k, v in os.environ.items() if k not in _SET_HERE}
