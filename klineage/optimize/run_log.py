"""A run's progress as it happens, one JSON line a message or event (`RunLog`).

A benchmark keeps it beside its document: the document is written when a run returns, so a run killed
before that (a call's outer timeout) leaves nothing else to say how far it got or where its time went
(which gate stage, which window of candidates). Lines are appended and flushed one at a time, so a kill
loses at most the line being written.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from klineage.optimize.result import OptimizationEvent

# a benchmark's --log option
LOG_HELP = ("append each run's progress and events to FILE as JSON lines, as they happen (a run killed before it "
            "returns writes no row: this says how far it got and where its time went)")


class RunLog:
    """Appends to `path` what one run hears, each line labelled (`labels`: the workload and strategy, say)
    with the time and the seconds since the log was opened."""

    def __init__(self, path: Path, **labels: str) -> None:
        self.path = path
        self.labels = labels
        self.began = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)

    def progress(self, stage: str, message: str, fraction: float | None) -> None:
        """An `optimize` progress callback."""
        self._write({"stage": stage, "message": message, "fraction": fraction})

    def event(self, event: OptimizationEvent) -> None:
        """An `optimize` event sink: the attempt in brief, and where the run stands after it."""
        attempt = event.attempt
        self._write({"event": event.kind.value, "evaluations": event.evaluations, "budget": event.budget,
                     "steps": event.steps, "speedup": event.speedup, "best": event.best,
                     "attempt": {"index": attempt.index, "transform": attempt.transform,
                                 "status": attempt.status.value,
                                 "ratio": attempt.ratio.overall if attempt.ratio is not None else None}})

    def _write(self, record: dict[str, Any]) -> None:
        line = {"at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "seconds": round(time.monotonic() - self.began, 3), **self.labels, **record}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def logged(path: str | Path | None, **labels: str) -> dict[str, Any]:
    """`optimize`'s progress and on_event arguments that append to `path` (`RunLog`); none without a path."""
    if not path:
        return {}
    log = RunLog(Path(path), **labels)
    return {"progress": log.progress, "on_event": log.event}
