"""`manage.py serve`: the embedded default in one command, the dashboard and one local gate worker.

The worker owns GPU 0 when this machine has a GPU, otherwise it runs compile-only and replayed
work and the dashboard says which jobs wait for a GPU worker. Stopping the server stops the worker.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from django.core.management import call_command
from django.core.management.base import BaseCommand

from klineage.errors import KLineageError
from klineage.gate.execute import gpu_name


class Command(BaseCommand):
    help = "Run the dashboard and one local gate worker (SQLite, no other service needed)."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args, addrport: str, **options):
        try:
            gpu = ["--gpu", "0"] if gpu_name() else []
        except KLineageError:
            gpu = []
        worker = subprocess.Popen([sys.executable, "manage.py", "gate_worker", *gpu])
        self.stdout.write(f"gate worker started (pid {worker.pid}, {'GPU 0' if gpu else 'no GPU: CPU jobs only'})")
        try:
            call_command("runserver", addrport, use_reloader=False)
        finally:
            worker.send_signal(signal.SIGTERM)  # it finishes or requeues its job, then exits
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
