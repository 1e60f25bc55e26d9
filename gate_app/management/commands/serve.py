"""`manage.py serve`: the embedded default in one command, the dashboard and one local gate worker.

The worker owns GPU 0 when this machine has a GPU, otherwise it runs compile-only and replayed
work and the dashboard says which jobs wait for a GPU worker. The worker is supervised: when it
dies (a crash, `kill -9`, the OOM killer), the job it held goes back to the queue at once and a
new worker starts, after a pause that grows while workers keep dying young. Stopping the server
stops the worker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection

from gate_app import queue
from klineage.errors import KLineageError
from klineage.gate.execute import gpu_name

YOUNG_SECONDS = 30.0  # a worker that dies sooner than this counts toward the growing pause
FIRST_PAUSE, LONGEST_PAUSE = 1.0, 30.0


class Supervisor:
    """Runs one gate worker process and starts a new one whenever it dies unasked."""

    def __init__(self, gpu: list[str], say):
        self.gpu = gpu
        self.say = say
        self.process: subprocess.Popen | None = None
        self.worker_id = ""
        self.restarts = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            # Named here, so that the supervisor can hand back the jobs of a worker it saw die.
            self.worker_id = f"{socket.gethostname()}:serve{os.getpid()}:{self.restarts}"
            self.process = subprocess.Popen([sys.executable, "manage.py", "gate_worker", *self.gpu,
                                             "--worker-id", self.worker_id])
        where = "GPU 0" if self.gpu else "no GPU: CPU jobs only"
        self.say(f"gate worker started (pid {self.process.pid}, {where})")

    def _watch(self) -> None:
        pause = FIRST_PAUSE
        while not self._stopping.is_set():
            started = time.monotonic()
            code = self.process.wait()
            if self._stopping.is_set():
                return
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            report = self._requeue(self.worker_id)
            held = f"; job(s) {', '.join(map(str, report.requeued + report.failed))} back to the queue or failed " \
                   f"by their attempts" if report else ""
            pause = pause * 2 if time.monotonic() - started < YOUNG_SECONDS else FIRST_PAUSE
            pause = min(pause, LONGEST_PAUSE)
            self.say(f"gate worker pid {self.process.pid} {how}{held}; starting another in {pause:.0f} s")
            if self._stopping.wait(pause):
                return
            self.restarts += 1
            self._spawn()

    @staticmethod
    def _requeue(worker_id: str) -> queue.ReapReport:
        try:
            return queue.reap_worker(worker_id)
        finally:
            connection.close()  # this thread's own connection

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # it finishes or requeues its job, then exits
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


class Command(BaseCommand):
    help = "Run the dashboard and one supervised local gate worker (SQLite, no other service needed)."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args, addrport: str, **options):
        try:
            gpu = ["--gpu", "0"] if gpu_name() else []
        except KLineageError:
            gpu = []
        supervisor = Supervisor(gpu, say=lambda line: self.stdout.write(line))
        supervisor.start()
        try:
            call_command("runserver", addrport, use_reloader=False)
        finally:
            supervisor.stop()
