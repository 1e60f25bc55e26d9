"""The web side of the security probes (issue 28), each run against a live local instance.

Starts `manage.py serve` on loopback with a fresh data dir and SQLite database, then tries what an
attacker tried before the fixes, and prints one JSON document:
{"provenance": {...}, "rows": [{"attack", "expected", "outcome", "passed"}]}, for the lead to merge
into bench/results/security.json beside the sandbox and kernel-policy rows. Loopback only; every
probe is bounded in time and bytes. About a minute on a quiet machine.

    .venv/bin/python bench/security_web.py [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.cookiejar
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from web_server import gate_workers, send_until_answered, wait_for  # noqa: E402

PASSWORD = "probe-password-for-olga-1"
HUGE = 600 * 1024 * 1024
SEND_CAP = 64 * 1024 * 1024  # the 600 MB probe never sends more than this
DEPTH = 100_000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Instance:
    """A served instance of its own: `manage.py serve` (dashboard + supervised worker) on loopback."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "KLINEAGE_DATA_DIR": str(data_dir), "KLINEAGE_JOB_KINDS_MODULE": "tests.job_kinds",
                    "PYTHONUNBUFFERED": "1"}
        for name in ("DATABASE_URL", "REDIS_URL", "KLINEAGE_HTTPS"):
            self.env.pop(name, None)
        self.lines: list[str] = []

    def start(self) -> None:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=self.env, check=True,
                       timeout=300)
        self.server = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{self.port}"], cwd=REPO,
                                       env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=lambda: self.lines.extend(self.server.stdout), daemon=True).start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.base + "/healthz", timeout=2).read()
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("the instance did not come up:\n" + "".join(self.lines))

    def stop(self) -> None:
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.server.kill()

    def workers(self) -> list[int]:
        return gate_workers(self.server.pid)


def _row(attack: str, expected: str, outcome: str, passed: bool) -> dict:
    return {"attack": attack, "expected": expected, "outcome": outcome, "passed": bool(passed)}


# Probes -------------------------------------------------------------------------------------------


def _login_form(instance: Instance):
    """A function that posts the login form as a browser would (CSRF cookie and token), giving the
    status and the page."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def post(username: str, password: str, timeout_s: float = 10) -> tuple[int, str]:
        page = opener.open(instance.base + "/accounts/login/", timeout=10).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        form = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": token.group(1) if token else ""}).encode()
        request = urllib.request.Request(instance.base + "/accounts/login/", form,
                                         headers={"Referer": instance.base + "/"})
        try:
            with opener.open(request, timeout=timeout_s) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as answered:
            return answered.code, answered.read().decode()

    return post


def probe_login(instance: Instance) -> dict:
    post = _login_form(instance)
    started = time.monotonic()
    answers = [post("olga", f"guess-{attempt}") for attempt in range(40)]
    took = time.monotonic() - started
    right = post("olga", PASSWORD)
    codes = [code for code, _ in answers]
    first_lock = codes.index(429) + 1 if 429 in codes else None
    said = first_lock is not None and "Too many failed logins" in answers[first_lock - 1][1]
    outcome = (f"40 wrong passwords in {took:.1f} s: locked (429) from attempt {first_lock}; the right password "
               f"afterwards answered {right[0]}" if first_lock else f"never locked; codes {sorted(set(codes))}")
    return _row("40 wrong passwords for one account from one address",
                "locked out after at most 5 failures, the right password refused while locked, a page that says so",
                outcome, first_lock is not None and first_lock <= 5 and set(codes[first_lock - 1:]) == {429}
                and right[0] == 429 and said)


def _send_until_answered(instance: Instance, head: bytes, piece: bytes) -> tuple[int, bytes, float]:
    started = time.monotonic()
    sent, answer = send_until_answered(instance.port, head, piece, cap=SEND_CAP)
    return sent, answer, time.monotonic() - started


def probe_body(instance: Instance) -> list[dict]:
    rows = []
    head = (b"POST /upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % HUGE)
    sent, answer, took = _send_until_answered(instance, head, b"x" * 65536)
    status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
    rows.append(_row("anonymous POST declaring a 600 MB body, streamed",
                     "413 before the body is read (a few MB at most in socket buffers)",
                     f"{status or 'no answer'} after {sent / 1e6:.1f} MB sent, {took:.2f} s",
                     status.startswith("HTTP/1.1 413") and sent < SEND_CAP))
    head = (b"POST /upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b"%x\r\n%s\r\n" % (65536, b"y" * 65536)
    sent, answer, took = _send_until_answered(instance, head, piece)
    status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
    rows.append(_row("anonymous chunked POST without a length, streamed without end",
                     "413 once the body passes the limit (under 1 MB), not after reading it all",
                     f"{status or 'no answer'} after {sent / 1e6:.1f} MB sent, {took:.2f} s",
                     status.startswith("HTTP/1.1 413") and sent < SEND_CAP))
    return rows


def _api(instance: Instance, path: str, body: bytes, token: str, content_type: str) -> tuple[int, str]:
    request = urllib.request.Request(instance.base + path, body, headers={"Authorization": f"Token {token}",
                                                                           "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as answered:
        return answered.code, answered.read().decode()


def probe_json(instance: Instance, token: str) -> dict:
    status, text = _api(instance, "/api/jobs/", b"[" * DEPTH + b"1" + b"]" * DEPTH, token, "application/json")
    return _row("API POST of JSON nested 100,000 deep", "400 naming the nesting, not a 500",
                f"{status}: {text[:160]}", status == 400 and "nested too deeply" in text)


def probe_plan(instance: Instance, token: str) -> list[dict]:
    kernel = REPO / "corpus/kernels/row_softmax/naive"
    plan = (kernel / "launch.toml").read_text().replace('name = "row_softmax_naive"', 'name = "probe_complex"')
    plan = plan.replace('grid = ["rows"]', 'grid = ["(-8)**0.5"]')
    boundary = "klineageprobe"
    parts = []
    files = (("source", "kernel.cu", (kernel / "kernel.cu").read_text()), ("plan", "launch.toml", plan))
    for field, name, data in files:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{name}"\r\n'
                     f"Content-Type: text/plain\r\n\r\n{data}\r\n")
    body = ("".join(parts) + f"--{boundary}--\r\n").encode()
    status, text = _api(instance, "/api/uploads/", body, token, f"multipart/form-data; boundary={boundary}")
    rows = [_row("upload of a kernel whose plan has grid (-8)**0.5", "refused at upload naming the case and expression",
                 f"{status}: {text[:200]}", status == 400 and "(-8)**0.5" in text and "case" in text)]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "kernel.cu").write_text((kernel / "kernel.cu").read_text())
        (Path(folder) / "launch.toml").write_text(plan)
        done = subprocess.run([sys.executable, "-m", "klineage", "gate", "row_softmax", folder, "--compile-only"],
                              cwd=REPO, env={**instance.env, "KLINEAGE_CACHE_DIR": str(Path(folder) / "cache")},
                              capture_output=True, text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    rows.append(_row("klineage gate on a kernel whose plan has grid (-8)**0.5", "exit 2 with a message, no traceback",
                     f"exit {done.returncode}: {last[:200]}",
                     done.returncode == 2 and "Traceback" not in done.stderr and "not a real number" in done.stderr))
    return rows


def probe_worker_kill(instance: Instance) -> dict:
    from gate_app import queue
    from gate_app.models import Job

    first = wait_for(instance.workers, 60)
    job_id = queue.enqueue("sleep", {"seconds": 3}).pk
    running = wait_for(lambda: Job.objects.filter(pk=job_id, status="running").first(), 60)
    os.kill(first[0], signal.SIGKILL)
    killed = time.monotonic()
    done = wait_for(lambda: Job.objects.filter(pk=job_id, status__in=Job.TERMINAL).first(), 90)
    took = time.monotonic() - killed
    again = [p for p in instance.workers() if p != first[0]]
    outcome = (f"job {job_id} {done.status if done else 'still ' + Job.objects.get(pk=job_id).status} "
               f"{took:.1f} s after the kill, attempts {done.attempts if done else '?'}; new worker: {bool(again)}")
    return _row("kill -9 of the serve command's worker in the middle of a job",
                "a new worker starts and the job is requeued and finished (no job left running)", outcome,
                bool(done) and done.status == "succeeded" and done.attempts == 2 and bool(again)
                and f"worker {running.worker_id} died" in done.log)


def probe_locked_db(instance: Instance) -> dict:
    post = _login_form(instance)  # a failed login is a write: django-axes records the attempt
    holder = sqlite3.connect(instance.data_dir / "klineage.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        status, text = post("nobody", "wrong", timeout_s=40)
        took = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    return _row("a write while another process holds the SQLite write lock",
                "503 with a message saying the database is busy (after SQLite's 20 s wait), not a bare 500",
                f"{status} after {took:.1f} s: {text[:120]}", status == 503 and "database is busy" in text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="klineage-security-web-") as folder:
        instance = Instance(Path(folder))
        os.environ.update({k: v for k, v in instance.env.items() if k.startswith("KLINEAGE_")})
        os.environ.pop("DATABASE_URL", None)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "klineage_web.settings")
        instance.start()
        import django

        django.setup()
        token = _setup_accounts()
        try:
            rows = [probe_login(instance), *probe_body(instance), probe_json(instance, token),
                    *probe_plan(instance, token), probe_worker_kill(instance), probe_locked_db(instance)]
        finally:
            instance.stop()
    document = {"provenance": _provenance(), "rows": rows}
    text = json.dumps(document, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if all(row["passed"] for row in rows) else 1


def _setup_accounts() -> str:
    """An operator account the probes attack (olga) or use (its API token), and the bundled problem
    the upload probe names, as the sandboxed probe describes it."""
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    from klineage.gate import execute
    from skills_app.models import Problem

    user = User.objects.create_user("olga", password=PASSWORD)
    user.groups.add(Group.objects.get(name="operator"))
    probed = execute.probe_problem(REPO / "corpus/problems/row_softmax.py", Path(tempfile.mkdtemp()))
    Problem.objects.create(operator="row_softmax", fingerprint=probed.info.fingerprint, info=probed.info.to_dict(),
                           path="corpus/problems/row_softmax.py", bundled=True, current=True)
    return Token.objects.create(user=user).key


def _provenance() -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"script": "bench/security_web.py", "commit": commit, "host": socket.gethostname(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "server": "manage.py serve (daphne, SQLite, one supervised worker) on 127.0.0.1"}


if __name__ == "__main__":
    sys.exit(main())
