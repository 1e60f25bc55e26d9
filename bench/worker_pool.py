"""`manage.py gate_worker` processes for the benchmarks, each read as JSON-line events."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Worker:
    def __init__(self, name: str, env: dict[str, str], lease: float, placement: tuple[str, ...] = ("--cpu-only",)):
        """`placement`: --cpu-only, or --gpu N for a worker that owns GPU N."""
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "gate_worker", *placement, "--json-log", "--worker-id", name,
             "--poll-interval", "0.2", "--lease-seconds", str(lease)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.events: list[dict] = []
        self.other: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except json.JSONDecodeError:
                self.other.append(line.rstrip())

    def named(self, event: str) -> list[dict]:
        return [e for e in list(self.events) if e.get("event") == event]

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.named("ready"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} did not start: {self.other[-20:]}")
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.reader.join(timeout=10)
        return code
