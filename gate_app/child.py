"""A job's work, in a child process of the worker: `python -m gate_app.child < payload.json`. The
payload's "kind" picks the runner (gate_app.kinds; the runners of the built-in kinds are in
gate_app.runners).

It imports the engine and never Django. It speaks JSON lines on its original stdout, one object
each: {"progress": {"stage", "message"}} and {"event": {...}} (an optimization's attempts), then
{"result": ...} or {"error": "...", "type": ...}.
Anything else that writes to stdout (a library, a tool) is sent to stderr, which the worker keeps
as the job's log.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from gate_app import kinds
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


def main() -> int:
    guard()
    # Keep the protocol stream to ourselves: fd 1 becomes stderr for everyone else.
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    channel = Channel(protocol)
    try:
        payload = json.loads(sys.stdin.read())
        result = kinds.get(payload["kind"]).run(payload, channel)
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
