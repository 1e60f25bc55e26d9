"""The sandbox with real bubblewrap, attacked as an uploaded problem file would attack it (issue 28).

Every attack runs through the real paths (`klineage gate ... --compile-only`, `probe_problem`) and
reports what it saw through its import-time exception. Each attack is also run once with
KLINEAGE_UNSAFE_NO_SANDBOX=1, which shows that it works where nothing stops it: the sandbox is what
makes it fail.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from hostile import Listener, hostile_problem, plant_instance, processes_with, report
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
    planted_instance = plant_instance(tmp_path, SECRET)
    var = config.REPO_ROOT / "var"
    var.mkdir(exist_ok=True)
    planted = var / f"test-secret-{uuid.uuid4().hex[:8]}"
    planted.write_text(SECRET)
    monkeypatch.setenv("KLINEAGE_DATA_DIR", str(planted_instance["data"]))
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(planted_instance["cache"]))
    monkeypatch.delenv(config.UNSAFE_NO_SANDBOX, raising=False)
    monkeypatch.delenv("KLINEAGE_BWRAP", raising=False)
    # Another process of this host with an API key in its environment (a web server, a worker).
    neighbour = subprocess.Popen(["sleep", "600"], env={"OPENAI_API_KEY": SECRET})
    yield {**planted_instance, "planted": planted}
    neighbour.kill()
    neighbour.wait()
    planted.unlink()


@pytest.fixture
def listener():
    """A TCP server on this host's loopback that records every connection it accepts."""
    with Listener() as server:
        yield server.port, server.accepted


def _report(error: Exception) -> dict:
    seen = report(str(error))
    assert seen is not None, f"the hostile problem did not report: {error}"
    return seen


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
    return _report(raised.value), marker


@pytest.mark.parametrize("with_cgroup", [True, False], ids=["cgroup", "namespaces-alone"])
def test_every_attack_of_a_hostile_problem_fails_in_the_sandbox(tmp_path, instance, listener, monkeypatch, with_cgroup):
    if not with_cgroup:  # an unprivileged developer has no cgroup: the PID namespace alone must end the grandchild
        monkeypatch.setattr(sandbox.cgroup, "open_group", lambda *args: None)
    port, accepted = listener
    seen, marker = attack(tmp_path, instance, port)
    assert seen["uid"] == 65534
    assert all(outcome in ("FileNotFoundError", "PermissionError") for outcome in seen["read"].values()), seen
    refusals = ("FileNotFoundError", "PermissionError", "OSError")
    assert all(outcome in refusals for outcome in seen["wrote"].values()), seen
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
