"""The sandbox, with real subprocesses: limits, process-group cleanup, watchdog and environment."""

import json
import os
import resource
import signal
import sys
import textwrap
import time
from pathlib import Path

from klineage.gate.sandbox import Exit, SandboxResult, minimal_env, run

PY = sys.executable


def python(tmp_path: Path, code: str, *, timeout_s: float = 20, env: dict | None = None, **kwargs) -> SandboxResult:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code), encoding="utf-8")
    return run([PY, str(script)], cwd=tmp_path, timeout_s=timeout_s, env=env or minimal_env(), **kwargs)


def gone(pid: int, within_s: float = 3.0) -> bool:
    """True once `pid` no longer runs (a zombie waiting for its reaper counts as gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


# Normal exits


def test_normal_exit_and_return_code(tmp_path):
    result = run([PY, "-c", "import sys; print('hello'); print('oops', file=sys.stderr); sys.exit(7)"],
                 cwd=tmp_path, timeout_s=20, env=minimal_env())
    assert result.exit is Exit.FINISHED
    assert result.returncode == 7
    assert sorted(result.output.splitlines()) == ["hello", "oops"]  # stderr joins stdout
    assert result.output_bytes == len("hello\noops\n")
    assert not result.flooded
    assert 0 < result.seconds < 10


def test_zero_exit(tmp_path):
    result = run([PY, "-c", "pass"], cwd=tmp_path, timeout_s=20, env=minimal_env())
    assert (result.exit, result.returncode, result.output, result.output_bytes) == (Exit.FINISHED, 0, "", 0)


def test_runs_in_cwd_with_no_stdin(tmp_path):
    result = run([PY, "-c", "import os, sys; print(os.getcwd()); print(repr(sys.stdin.read()))"],
                 cwd=tmp_path, timeout_s=20, env=minimal_env())
    assert result.output.splitlines() == [str(tmp_path), "''"]


def test_child_runs_in_its_own_session(tmp_path):
    result = run([PY, "-c", "import os; print(os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())"],
                 cwd=tmp_path, timeout_s=20, env=minimal_env())
    assert result.output.strip() == "True True"


# Output


def test_output_is_capped_but_counted(tmp_path):
    result = python(tmp_path, """
        import sys
        for _ in range(100):
            sys.stdout.write("x" * 1000)
        sys.stdout.flush()
    """, output_cap=1000)
    assert result.exit is Exit.FINISHED and result.returncode == 0
    assert result.output == "x" * 1000
    assert result.output_bytes == 100_000
    assert result.flooded


def test_output_exactly_at_the_cap_is_not_a_flood(tmp_path):
    result = python(tmp_path, "import sys; sys.stdout.write('y' * 1000)", output_cap=1000)
    assert result.output == "y" * 1000
    assert result.output_bytes == 1000
    assert not result.flooded


def test_flood_of_undecodable_bytes_is_still_a_flood(tmp_path):
    # 2000 bytes, 1000 kept: re-encoded, the kept U+FFFD characters would count 3000 bytes.
    result = python(tmp_path, "import sys; sys.stdout.buffer.write(b'\\xff' * 2000)", output_cap=1000)
    assert result.output == "\ufffd" * 1000
    assert result.output_bytes == 2000
    assert result.flooded


def test_flood_that_cuts_a_character_at_the_cap(tmp_path):
    # 501 two-byte characters: the cap keeps 1001 bytes, half of the last character.
    result = python(tmp_path, "import sys; sys.stdout.buffer.write('é'.encode() * 501)", output_cap=1001)
    assert result.output == "é" * 500 + "\ufffd"
    assert result.output_bytes == 1002
    assert result.flooded


def test_huge_output_does_not_block_the_child(tmp_path):
    # Far more than a pipe buffer: the reader keeps draining after the cap.
    result = python(tmp_path, """
        import sys
        chunk = b"z" * 65536
        for _ in range(64):
            sys.stdout.buffer.write(chunk)
    """, output_cap=100)
    assert result.exit is Exit.FINISHED
    assert result.output_bytes == 64 * 65536
    assert result.flooded


# Limits and cleanup


def test_timeout_kills_the_process_and_its_children(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    result = python(tmp_path, f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        print("started", flush=True)
        time.sleep(60)
    """, timeout_s=1.5)
    assert result.exit is Exit.TIMEOUT
    assert result.returncode == -signal.SIGKILL
    assert result.output == "started\n"
    assert 1.5 <= result.seconds < 8
    grandchild = int(pidfile.read_text())
    assert gone(grandchild), f"grandchild {grandchild} survived the timeout"


def test_children_left_behind_by_a_finished_process_are_killed(tmp_path):
    pidfile = tmp_path / "orphan.pid"
    result = python(tmp_path, f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open({str(pidfile)!r}, "w").write(str(child.pid))
    """)
    assert result.exit is Exit.FINISHED and result.returncode == 0
    assert result.seconds < 8
    assert gone(int(pidfile.read_text()))


def test_segfault_is_signalled(tmp_path):
    result = run([PY, "-c", "import os; os.kill(os.getpid(), 11)"], cwd=tmp_path, timeout_s=20, env=minimal_env())
    assert result.exit is Exit.SIGNALLED
    assert result.returncode == -signal.SIGSEGV


def test_abort_is_signalled(tmp_path):
    result = run([PY, "-c", "import os; os.abort()"], cwd=tmp_path, timeout_s=20, env=minimal_env())
    assert result.exit is Exit.SIGNALLED
    assert result.returncode == -signal.SIGABRT


def test_sigkill_from_outside_is_signalled(tmp_path):
    # What the OOM killer does: the process did not choose to exit, and no limit of ours fired.
    result = run([PY, "-c", "import os; os.kill(os.getpid(), 9)"], cwd=tmp_path, timeout_s=20, env=minimal_env())
    assert result.exit is Exit.SIGNALLED
    assert result.returncode == -signal.SIGKILL


# The stall watchdog


def test_stall_watchdog_fires_on_a_pending_launch(tmp_path):
    progress = tmp_path / "progress.jsonl"
    result = python(tmp_path, f"""
        import json, time
        with open({str(progress)!r}, "a") as f:
            f.write(json.dumps({{"what": "launch 0", "waiting": True}}) + "\\n")
        time.sleep(60)
    """, timeout_s=30, progress_file=progress, stall_s=0.5)
    assert result.exit is Exit.STALLED
    assert result.returncode == -signal.SIGKILL
    assert result.seconds < 5  # well before the overall limit


def test_no_stall_when_waiting_is_answered(tmp_path):
    progress = tmp_path / "progress.jsonl"
    events = []
    result = python(tmp_path, f"""
        import json, time
        def emit(event):
            with open({str(progress)!r}, "a") as f:
                f.write(json.dumps(event) + "\\n")
        for i in range(3):
            emit({{"what": f"launch {{i}}", "waiting": True}})
            time.sleep(0.1)
            emit({{"waiting": False}})
            time.sleep(0.6)  # longer than stall_s, but nothing is pending
    """, timeout_s=30, progress_file=progress, stall_s=0.4, on_progress=events.append)
    assert result.exit is Exit.FINISHED and result.returncode == 0
    assert events == [e for i in range(3) for e in ({"what": f"launch {i}", "waiting": True}, {"waiting": False})]


def test_no_stall_without_progress_events(tmp_path):
    progress = tmp_path / "progress.jsonl"
    result = python(tmp_path, "import time; time.sleep(1.0)", progress_file=progress, stall_s=0.3)
    assert result.exit is Exit.FINISHED and result.returncode == 0


def test_on_progress_receives_every_event_in_order(tmp_path):
    progress = tmp_path / "progress.jsonl"
    events = []
    result = python(tmp_path, f"""
        import json, time
        def emit(event):
            with open({str(progress)!r}, "a") as f:
                f.write(json.dumps(event) + "\\n")
        emit({{"stage": "load"}})
        time.sleep(0.2)
        emit({{"stage": "correctness", "case": "small"}})
        emit({{"stage": "done", "seconds": 1.5}})  # written just before exit: still delivered
    """, progress_file=progress, on_progress=events.append)
    assert result.exit is Exit.FINISHED
    assert events == [{"stage": "load"}, {"stage": "correctness", "case": "small"}, {"stage": "done", "seconds": 1.5}]


# Environment and rlimits


def test_minimal_env_drops_secrets_and_keeps_path(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:pw@db/klineage")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    env = minimal_env({"KLINEAGE_EXTRA": "1"}, home=tmp_path / "home")
    assert "OPENAI_API_KEY" not in env and "DATABASE_URL" not in env
    result = run([PY, "-c", "import json, os; print(json.dumps(dict(os.environ)))"], cwd=tmp_path, timeout_s=20,
                 env=env)
    seen = json.loads(result.output)
    for secret in ("OPENAI_API_KEY", "DATABASE_URL", "AWS_SECRET_ACCESS_KEY"):
        assert secret not in seen
    assert seen["PATH"] == os.environ["PATH"]
    assert seen["CUDA_VISIBLE_DEVICES"] == "3"
    assert seen["HOME"] == str(tmp_path / "home")
    assert seen["LANG"] == "C.UTF-8"
    assert seen["PYTHONUNBUFFERED"] == "1"
    assert seen["KLINEAGE_EXTRA"] == "1"


def test_minimal_env_defaults(monkeypatch):
    monkeypatch.delenv("PATH", raising=False)
    env = minimal_env()
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["HOME"] == "/tmp"


def test_rlimits_in_the_child(tmp_path):
    result = run([PY, "-c", "import json, resource as r; print(json.dumps([r.getrlimit(r.RLIMIT_CORE), "
                            "r.getrlimit(r.RLIMIT_CPU), r.getrlimit(r.RLIMIT_FSIZE), r.getrlimit(r.RLIMIT_NOFILE)]))"],
                 cwd=tmp_path, timeout_s=20, env=minimal_env())
    core, cpu, fsize, nofile = json.loads(result.output)
    assert core == [0, 0]
    assert cpu == [50, 55]  # the wall-clock limit plus 30 s, then a 5 s grace to the hard limit
    assert fsize == [4 << 30, 4 << 30]
    assert nofile[0] <= 4096
    assert resource.getrlimit(resource.RLIMIT_CPU) != (50, 55)  # set in the child only


def test_a_garbage_progress_line_does_not_blind_the_watchdog(tmp_path):
    """A complete line that is not JSON is passed over; the waiting line after it still counts."""
    progress = tmp_path / "progress.jsonl"
    code = (
        "import json, sys, time\n"
        f"p = open({str(progress)!r}, 'a')\n"
        "p.write('not json\\n'); p.write('[1, 2]\\n'); p.write(json.dumps({'waiting': True}) + '\\n'); p.flush()\n"
        "time.sleep(30)\n"
    )
    result = run([sys.executable, "-c", code], cwd=tmp_path, timeout_s=20,
                 env=minimal_env(), progress_file=progress, stall_s=1.0)
    assert result.exit is Exit.STALLED
    assert result.seconds < 10


def test_a_carried_launcher_is_named_relative_to_the_checkout():
    """Verdicts say which bwrap isolated a run: a carried one (a GPU host's .hostbin/bwrap) by its place in the
    checkout, never by one machine's absolute path; a system one as it is."""
    from klineage import config
    from klineage.gate.jail import shown_launcher

    assert shown_launcher(str(config.REPO_ROOT / ".hostbin" / "bwrap")) == ".hostbin/bwrap"
    assert shown_launcher("/usr/bin/bwrap") == "/usr/bin/bwrap"


def test_on_start_hears_the_isolation_the_result_reports(tmp_path):
    """A long-lived child (a warm runner) reports results before it ends: its isolation is known at the start."""
    heard = []
    result = run([PY, "-c", "pass"], cwd=tmp_path, timeout_s=20, env=minimal_env(), on_start=heard.append)
    assert heard == [result.isolation] and any(w.startswith("rlimit cpu=") for w in result.isolation)
