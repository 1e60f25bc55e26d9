"""The sandbox with real bubblewrap, attacked as an uploaded problem file would attack it (issue 28).

Every attack runs through the real paths (`klineage gate ... --compile-only`, `probe_problem`) and
reports what it saw through its import-time exception. Each attack is also run once with
KLINEAGE_UNSAFE_NO_SANDBOX=1, which shows that it works where nothing stops it: the sandbox is what
makes it fail.
"""

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from klineage import config
from klineage.errors import DocumentError, KLineageError
from klineage.gate import execute, sandbox
from klineage.gate.jail import Access, Jail, SandboxUnavailable, toolkit_trees
from klineage.toolchain import find_toolchain

pytestmark = pytest.mark.skipif(config.bwrap_path() is None, reason="bubblewrap is not installed")

SECRET = f"s3cret-{uuid.uuid4().hex}"
ROW_SOFTMAX = config.REPO_ROOT / "corpus" / "problems" / "row_softmax.py"


@pytest.fixture
def instance(tmp_path, monkeypatch):
    """A data dir with a secret key and a SQLite database holding a session token, a cache dir, a
    secret in this process's environment, and a file in the repository's var/ (the default data dir)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "secret_key").write_text(SECRET)
    database = data / "klineage.sqlite3"
    with sqlite3.connect(database) as db:
        db.execute("create table session (token text)")
        db.execute("insert into session values (?)", (SECRET,))
    cache = tmp_path / "cache"
    cache.mkdir()
    var = config.REPO_ROOT / "var"
    var.mkdir(exist_ok=True)
    planted = var / f"test-secret-{uuid.uuid4().hex[:8]}"
    planted.write_text(SECRET)
    monkeypatch.setenv("KLINEAGE_DATA_DIR", str(data))
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(cache))
    monkeypatch.delenv(config.UNSAFE_NO_SANDBOX, raising=False)
    monkeypatch.delenv("KLINEAGE_BWRAP", raising=False)
    # Another process of this host with an API key in its environment (a web server, a worker).
    neighbour = subprocess.Popen(["sleep", "600"], env={"OPENAI_API_KEY": SECRET})
    yield {"data": data, "database": database, "cache": cache, "planted": planted}
    neighbour.kill()
    neighbour.wait()
    planted.unlink()


@pytest.fixture
def listener():
    """A TCP server on this host's loopback that records every connection it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[bool] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(True)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def hostile_problem(path: Path, targets: dict) -> Path:
    """A problem file that tries everything at import and raises a report of what worked."""
    code = f"""
    import json, os, socket, subprocess, sys
    targets = json.loads({json.dumps(json.dumps(targets))})
    seen = {{"uid": os.getuid(), "read": {{}}, "wrote": {{}}, "environ_secrets": [], "pids": []}}
    for name, path in targets["read"].items():
        try:
            with open(path, "rb") as handle:
                seen["read"][name] = targets["secret"] in handle.read().decode("latin-1")
        except OSError as exc:
            seen["read"][name] = type(exc).__name__
    for name, folder in targets["write"].items():
        try:
            with open(os.path.join(folder, "forged.json"), "w") as handle:
                handle.write("{{}}")
            seen["wrote"][name] = True
        except OSError as exc:
            seen["wrote"][name] = type(exc).__name__
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            seen["pids"].append(int(pid))
            try:
                with open(f"/proc/{{pid}}/environ", "rb") as handle:
                    if targets["secret"].encode() in handle.read():
                        seen["environ_secrets"].append(int(pid))
            except OSError:
                pass
    try:
        socket.create_connection(("127.0.0.1", targets["port"]), timeout=3).close()
        seen["loopback"] = "connected"
    except OSError as exc:
        seen["loopback"] = type(exc).__name__
    # A grandchild in a session of its own, whose parent exits at once: it must still end with the job.
    subprocess.Popen([sys.executable, "-c", "import os, time; pid = os.fork(); pid and os._exit(0); os.setsid(); time.sleep(600)",
                      targets["marker"]], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raise RuntimeError("REPORT" + json.dumps(seen) + "TROPER")
    """  # noqa: E501  (the hostile problem's source, kept as written)
    path.write_text(textwrap.dedent(code), encoding="utf-8")
    return path


def report(error: Exception) -> dict:
    found = re.search(r"REPORT(.*)TROPER", str(error))
    assert found, f"the hostile problem did not report: {error}"
    return json.loads(found.group(1))


def processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def attack(tmp_path: Path, instance: dict, port: int) -> tuple[dict, str]:
    marker = f"klineage-grandchild-{uuid.uuid4().hex}"
    targets = {
        "secret": SECRET, "port": port, "marker": marker,
        "read": {"secret_key": str(instance["data"] / "secret_key"), "database": str(instance["database"]),
                 "repo_var": str(instance["planted"]), "shadow": "/etc/shadow"},
        "write": {"cache": str(instance["cache"]), "problem_folder": str(tmp_path)},
    }
    problem = hostile_problem(tmp_path / "hostile.py", targets)
    with pytest.raises(DocumentError) as raised:
        execute.probe_problem(problem, config.cache_dir())
    return report(raised.value), marker


@pytest.mark.parametrize("with_cgroup", [True, False], ids=["cgroup", "namespaces-alone"])
def test_every_attack_of_a_hostile_problem_fails_in_the_sandbox(tmp_path, instance, listener, monkeypatch, with_cgroup):
    if not with_cgroup:  # an unprivileged developer has no cgroup: the PID namespace alone must end the grandchild
        monkeypatch.setattr(sandbox.cgroup, "open_group", lambda *args: None)
    port, accepted = listener
    seen, marker = attack(tmp_path, instance, port)
    assert seen["uid"] == 65534
    assert all(outcome in ("FileNotFoundError", "PermissionError") for outcome in seen["read"].values()), seen
    assert all(outcome in ("FileNotFoundError", "PermissionError", "OSError") for outcome in seen["wrote"].values()), (
        seen
    )
    assert not list(instance["cache"].iterdir()) and not (tmp_path / "forged.json").exists()
    assert seen["environ_secrets"] == [] and max(seen["pids"]) < 50  # its own few processes, none of ours
    assert seen["loopback"] != "connected" and not accepted
    time.sleep(0.5)
    assert processes_with(marker) == []


def test_the_same_attacks_succeed_without_the_sandbox(tmp_path, instance, listener, monkeypatch):
    """The attacks are real: unsandboxed, the same file reads the secrets and reaches the server."""
    monkeypatch.setenv(config.UNSAFE_NO_SANDBOX, "1")
    port, accepted = listener
    seen, marker = attack(tmp_path, instance, port)
    try:
        assert seen["read"]["secret_key"] is True and seen["read"]["database"] is True
        assert seen["read"]["repo_var"] is True
        assert seen["wrote"]["cache"] is True
        assert seen["loopback"] == "connected" and accepted
        assert seen["environ_secrets"]
    finally:
        for pid in processes_with(marker):
            os.kill(pid, 9)


def marked_problem(tmp_path: Path, marker: Path) -> Path:
    """row_softmax, with a line that writes a marker file at import."""
    source = ROW_SOFTMAX.read_text(encoding="utf-8")
    planted = f"import torch\nopen({str(marker)!r}, 'w').write('here')\n"
    problem = tmp_path / "marked.py"
    problem.write_text(source.replace("import torch\n", planted, 1), encoding="utf-8")
    return problem


def test_marker_written_at_import_stays_in_the_sandbox(tmp_path, instance):
    marker = Path("/tmp") / f"klineage-marker-{uuid.uuid4().hex}"
    problem = marked_problem(tmp_path, marker)
    env = {**os.environ, "KLINEAGE_CACHE_DIR": str(tmp_path / "cli-cache")}
    done = subprocess.run([sys.executable, "-m", "klineage", "gate", str(problem), "row_softmax/naive",
                           "--compile-only"], cwd=config.REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not marker.exists()
    probe = execute.probe_problem(problem)  # the probe itself, uncached
    assert probe.info.path == str(problem.resolve()) and not probe.numerics
    assert not marker.exists()


def test_missing_bubblewrap_refuses_with_the_install_message(tmp_path, instance, monkeypatch):
    monkeypatch.setenv("KLINEAGE_BWRAP", "/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match=r"apt-get install bubblewrap.*KLINEAGE_UNSAFE_NO_SANDBOX=1"):
        execute.probe_problem(ROW_SOFTMAX)
    env = {**os.environ, "KLINEAGE_CACHE_DIR": str(tmp_path / "cli-cache")}
    done = subprocess.run([sys.executable, "-m", "klineage", "gate", "row_softmax", "row_softmax/naive",
                           "--compile-only"], cwd=config.REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode != 0 and "apt-get install bubblewrap" in done.stdout + done.stderr


def test_unsafe_variable_runs_without_bubblewrap_and_warns(instance, monkeypatch, caplog):
    monkeypatch.setenv("KLINEAGE_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setenv(config.UNSAFE_NO_SANDBOX, "1")
    assert config.sandbox_disabled()
    with caplog.at_level("WARNING", logger="klineage.sandbox"):
        probe = execute.probe_problem(ROW_SOFTMAX)
    assert probe.info.operator == "row_softmax"
    assert any("WITHOUT a sandbox" in r.getMessage() for r in caplog.records)


def test_unsafe_variable_takes_only_0_or_1(monkeypatch):
    monkeypatch.setenv(config.UNSAFE_NO_SANDBOX, "yes")
    with pytest.raises(KLineageError, match="must be 1"):
        config.sandbox_disabled()


def in_jail(tmp_path: Path, access: Access, code: str, **kwargs) -> sandbox.SandboxResult:
    jail = Jail(access, tmp_path, python=sys.executable)
    return sandbox.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, timeout_s=60,
                       env=sandbox.minimal_env(home=tmp_path), jail=jail, **kwargs)


def test_gpu_view_only_for_gpu_work(tmp_path, instance):
    code = "import glob, os; print(os.path.isdir('/sys/class'), glob.glob('/dev/nvidia*'))"
    assert in_jail(tmp_path, Access.CPU, code).output.split()[0] == "False"
    gpu = in_jail(tmp_path, Access.GPU, code)
    assert gpu.output.split()[0] == "True", gpu.output
    assert "bubblewrap" in gpu.isolation[0]


def test_the_job_folder_is_its_only_writable_place_on_the_host(tmp_path, instance):
    private = Path("/tmp") / f"klineage-private-{uuid.uuid4().hex}"
    code = f"""
    import os
    open('result.json', 'w').write('{{}}')
    open('/tmp/{private.name}', 'w').write('gone with the job')
    for folder in ('/usr', '/etc', {str(config.REPO_ROOT)!r}):
        try:
            open(os.path.join(folder, 'x'), 'w')
            print('wrote', folder)
        except OSError as exc:
            print('refused', folder, type(exc).__name__)
    """
    result = in_jail(tmp_path, Access.CPU, code)
    assert (tmp_path / "result.json").read_text() == "{}"
    assert result.output.count("refused") == 3, result.output
    assert not private.exists()


def test_process_limit_holds_inside_the_job(tmp_path, instance, monkeypatch):
    monkeypatch.setenv("KLINEAGE_SANDBOX_PIDS", "40")
    code = """
    import threading, time
    started = 0
    try:
        for _ in range(200):
            threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
            started += 1
    except RuntimeError:
        pass
    print(started)
    """
    result = in_jail(tmp_path, Access.CPU, code)
    if not any("pids" in words or "nproc" in words for words in result.isolation):
        pytest.skip(f"no process limit can be set on this host: {result.isolation}")
    assert int(result.output.split()[-1]) < 40, (result.output, result.isolation)


def test_nvcc_includes_nothing_outside_the_toolkit(tmp_path, instance):
    """An #include of the secret key is the compiler's exfiltration channel: in the sandbox it finds nothing."""
    toolchain = find_toolchain()
    work = tmp_path / "nvcc"
    work.mkdir()
    (work / "k.cu").write_text(f'#include "{instance["data"] / "secret_key"}"\n__global__ void k() {{}}\n')
    jail = Jail(Access.COMPILER, work, readable=toolkit_trees(toolchain.nvcc))
    argv, env, _ = jail.command([toolchain.nvcc, "-cubin", "-arch=sm_90", "k.cu", "-o", "k.cubin"],
                                toolchain.environment(work))
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and SECRET not in done.stdout + done.stderr
    assert re.search(r"cannot open|No such file", done.stdout + done.stderr), done.stdout + done.stderr
    (work / "k.cu").write_text("#include <cuda_fp16.h>\n__global__ void k(__half *x) { x[0] = __float2half(1.f); }\n")
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (work / "k.cubin").stat().st_size > 0, done.stdout + done.stderr


def test_result_is_read_only_from_a_regular_capped_file_of_the_runner_shape(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"findings": []}))
    (tmp_path / "linked.json").symlink_to(elsewhere)
    assert execute._read_result(tmp_path / "linked.json") is None
    assert execute._read_result(elsewhere) == {"findings": []}
    (tmp_path / "shape.json").write_text(json.dumps({"findings": "all good"}))
    assert execute._read_result(tmp_path / "shape.json") is None
    (tmp_path / "list.json").write_text("[]")
    assert execute._read_result(tmp_path / "list.json") is None
    os.mkfifo(tmp_path / "fifo.json")  # opening it for reading would wait for a writer forever
    assert execute._read_result(tmp_path / "fifo.json") is None
    (tmp_path / "progress.jsonl").symlink_to("/dev/zero")  # read whole, it would never end
    assert sandbox._new_events(tmp_path / "progress.jsonl", 0) == ([], 0)


def test_memory_limit_holds_inside_the_job(tmp_path, instance, monkeypatch):
    monkeypatch.setenv("KLINEAGE_SANDBOX_MEMORY_MB", "200")
    result = in_jail(tmp_path, Access.CPU, "block = bytearray(600 << 20); print('allocated', len(block))")
    if not any("memory" in words for words in result.isolation):
        pytest.skip(f"no memory limit can be set on this host: {result.isolation}")
    assert "allocated" not in result.output and result.returncode != 0, (result.output, result.isolation)
    small = in_jail(tmp_path, Access.CPU, "block = bytearray(50 << 20); print('allocated', len(block))")
    assert "allocated" in small.output


def test_a_crash_inside_the_sandbox_reads_as_the_signal_that_killed_it(tmp_path, instance):
    result = in_jail(tmp_path, Access.CPU, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert (result.exit, result.returncode) == (sandbox.Exit.SIGNALLED, -11)
    assert (in_jail(tmp_path, Access.CPU, "raise SystemExit(3)").returncode) == 3
