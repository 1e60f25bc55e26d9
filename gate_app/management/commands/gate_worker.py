"""`manage.py gate_worker [--gpu N]`: run queued jobs, one process per GPU.

Without --gpu the worker looks for a GPU; on a machine without one it runs only jobs that need
none (compile-only and replayed gates) and says which queued jobs wait for a GPU worker.
SIGTERM finishes the current job within --drain-seconds or gives it back to the queue, then
exits 0.
"""

from django.core.management.base import BaseCommand, CommandError

from klineage.errors import KLineageError


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(text)
    return value


class Command(BaseCommand):
    help = "Run queued gate jobs: one worker process per GPU, or one without a GPU for compile-only work."

    def add_arguments(self, parser):
        gpu = parser.add_mutually_exclusive_group()
        gpu.add_argument("--gpu", metavar="N", help="the GPU index this worker owns (CUDA_VISIBLE_DEVICES of its jobs)")
        gpu.add_argument("--cpu-only", action="store_true", help="claim only jobs that need no GPU, even on a GPU host")
        parser.add_argument("--once", action="store_true", help="run at most one job, then exit")
        parser.add_argument("--poll-interval", type=_positive, default=0.5, metavar="S",
                            help="seconds between looks at the queue when idle (default 0.5)")
        parser.add_argument("--lease-seconds", type=_positive, default=30.0, metavar="S",
                            help="how long a claim lasts without a heartbeat (default 30; heartbeats every third)")
        parser.add_argument("--drain-seconds", type=float, default=10.0, metavar="S",
                            help="on SIGTERM, how long the current job may still run before it is "
                                 "stopped and given back to the queue (default 10)")
        parser.add_argument("--reap-seconds", type=_positive, default=None, metavar="S",
                            help="how often to requeue jobs of dead workers (default: half the lease, at most 15)")
        parser.add_argument("--worker-id", help="a name for this worker (default host:pid:gpuN:random)")
        parser.add_argument("--json-log", action="store_true", help="one JSON object per line on stdout")

    def handle(self, *args, **options):
        from gate_app.worker import JobWorker, detect_capabilities

        try:
            capabilities = detect_capabilities(options["gpu"], options["cpu_only"])
        except KLineageError as exc:
            raise CommandError(str(exc)) from None
        worker = JobWorker(capabilities=capabilities, worker_id=options["worker_id"],
                           lease_seconds=options["lease_seconds"], poll_interval=options["poll_interval"],
                           reap_seconds=options["reap_seconds"], drain_seconds=options["drain_seconds"],
                           once=options["once"], json_log=options["json_log"], out=self.stdout)
        code = worker.run()
        if code:
            raise SystemExit(code)
