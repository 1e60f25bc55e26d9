"""Issue 28's security report: every attack, what was expected, what happened, and whether it held.

    python bench/security_report.py [--out bench/results/security.json]

Rows come from three sources, none of them written here by hand:
- sandbox probes, run live on this machine with the real bubblewrap: a hostile problem file (tests/hostile.py)
  through `probe_problem` and through `klineage gate FILE row_softmax/naive --compile-only`, against a planted
  instance (secret key, SQLite database with sessions and tokens, a cache dir, a neighbour process with an API
  key in its environment, a loopback server), and nvcc compiling an `#include` of the secret key;
- the kernel evasion suite and cheats, from bench/results/adversarial.json (the H200 gate's verdicts);
- the web probes, from bench/results/security_web.json (bench/security_web.py against a live server).
With KLINEAGE_UNSAFE_NO_SANDBOX=1 the attacks work and the sandbox rows fail: the report can fail.
Exits 1 when any row failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

# tests/ holds the hostile problem file the report shares with the sandbox test: path first
from hostile import (  # noqa: E402
    Listener,
    hostile_problem,
    is_superuser,
    plant_instance,
    processes_with,
    report,
)
from klineage import config, corpus  # noqa: E402
from klineage.errors import KLineageError  # noqa: E402
from klineage.gate import execute  # noqa: E402
from klineage.gate.compile import CompileStatus, compile_kernel  # noqa: E402
from klineage.gate.pipeline import git_commit  # noqa: E402

REFUSED = "refused"
ADVERSARIAL = REPO / "bench" / "results" / "adversarial.json"
WEB = REPO / "bench" / "results" / "security_web.json"
KERNEL = "row_softmax/naive"


def row(attack: str, expected: str, outcome: str, passed: bool) -> dict:
    return {"attack": attack, "expected": expected, "outcome": outcome, "passed": bool(passed)}


@contextmanager
def planted_instance(root: Path, secret: str) -> Iterator[dict]:
    """The instance the hostile file attacks, with this process's KLINEAGE_DATA_DIR and KLINEAGE_CACHE_DIR
    pointing at it, a neighbour process holding an API key, and a loopback server."""
    instance = plant_instance(root, secret)
    saved = {name: os.environ.get(name) for name in ("KLINEAGE_DATA_DIR", "KLINEAGE_CACHE_DIR")}
    os.environ.update(KLINEAGE_DATA_DIR=str(instance["data"]), KLINEAGE_CACHE_DIR=str(instance["cache"]))
    neighbour = subprocess.Popen(["sleep", "600"], env={"OPENAI_API_KEY": secret})
    try:
        with Listener() as listener:
            yield {**instance, "listener": listener, "neighbour": neighbour.pid}
    finally:
        neighbour.kill()
        neighbour.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _via_probe(problem: Path) -> str:
    try:
        execute.probe_problem(problem, config.cache_dir())
    except KLineageError as exc:
        return str(exc)
    return "the probe succeeded"


def _via_cli(problem: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "klineage", "gate", str(problem), KERNEL, "--compile-only"],
                          cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=600, check=False)
    return f"exit {done.returncode}: {done.stdout}{done.stderr}"


PATHS = {"probe_problem": _via_probe, f"klineage gate FILE {KERNEL} --compile-only": _via_cli}


def _said(value: object) -> str:
    return "succeeded" if value is True else f"failed ({value})"


def attack_rows(path_name: str, instance: dict, secret: str, work: Path) -> list[dict]:
    """Every attempt of one run of the hostile file through one path, each judged on what the file saw and,
    where the attack would leave a trace, on the host after the job."""
    tag = uuid.uuid4().hex
    marker, tmp_marker = f"klineage-grandchild-{tag}", Path("/tmp") / f"klineage-marker-{tag}"
    cache, database, listener = instance["cache"], instance["database"], instance["listener"]
    targets = {"secret": secret, "port": listener.port, "marker": marker, "superuser": str(database),
               "tmp_marker": str(tmp_marker),
               "read": {"secret_key": str(instance["data"] / "secret_key"), "database": str(database)},
               "write": {"cache": str(cache)}}
    problem = hostile_problem(work / f"hostile-{tag}.py", targets)
    accepted_before = len(listener.accepted)
    message = PATHS[path_name](problem)
    seen = report(message)
    via = f" (hostile problem file via {path_name})"
    if seen is None:
        return [row("hostile problem file" + via, "a report of every attempt", message[-400:], False)]
    time.sleep(0.5)  # a grandchild that outlived the job has had time to show
    survivors = processes_with(marker)
    left_marker = tmp_marker.exists()
    superuser = is_superuser(database)
    forged = (cache / "forged.json").exists()
    accepted = len(listener.accepted) - accepted_before
    for pid in survivors:  # only where the sandbox failed (an unsandboxed run): leave the host clean
        os.kill(pid, 9)
    tmp_marker.unlink(missing_ok=True)
    (cache / "forged.json").unlink(missing_ok=True)
    uid = f"uid {seen['uid']}"
    return [
        row("read the secret key file in KLINEAGE_DATA_DIR" + via, REFUSED,
            f"{uid}: open {_said(seen['read']['secret_key'])}", seen["read"]["secret_key"] is not True),
        row("read the SQLite database's session and API-token rows" + via, REFUSED,
            f"{uid}: open {_said(seen['read']['database'])}", seen["read"]["database"] is not True),
        row("make user 'mallory' superuser by writing the SQLite database" + via, REFUSED,
            f"update {_said(seen['superuser'])}; on the host mallory is_superuser={int(superuser)}",
            seen["superuser"] is not True and not superuser),
        row(f"read OPENAI_API_KEY from /proc/{instance['neighbour']}/environ (a process of the host)" + via,
            REFUSED, f"saw {len(seen['pids'])} pids (highest {max(seen['pids'], default=0)}); the key found in "
            f"{len(seen['environ_secrets'])} environ files", not seen["environ_secrets"]),
        row(f"connect to a server on 127.0.0.1:{listener.port}" + via, REFUSED,
            f"connect: {seen['loopback']}; the server accepted {accepted} connections",
            seen["loopback"] != "connected" and accepted == 0),
        row("forge a verdict: write into KLINEAGE_CACHE_DIR" + via, REFUSED,
            f"write {_said(seen['wrote']['cache'])}; forged file on the host: {forged}",
            seen["wrote"]["cache"] is not True and not forged),
        row("leave a setsid double-fork grandchild running after the job" + via, REFUSED,
            f"processes left after the job: {len(survivors)}", not survivors),
        row(f"write a marker into the host's /tmp ({tmp_marker})" + via, REFUSED,
            f"write {_said(seen['tmp_marker'])} inside; on the host after the job: "
            f"{'present' if left_marker else 'absent'}", not left_marker),
    ]


def nvcc_row(instance: dict, secret: str) -> dict:
    """A kernel whose source includes the secret key, through the real compile (nvcc in its sandbox)."""
    key_file = instance["data"] / "secret_key"
    state = corpus.kernel_entry(KERNEL).load()
    state = state.with_source(f'#include "{key_file}"\n' + state.source)
    result = compile_kernel(state, cache_dir=None)
    leaked = secret in result.log
    refused = result.status is not CompileStatus.OK and not leaked
    outcome = f"nvcc {result.status.value}; the secret in its messages: {leaked}; log: {result.log.strip()[:200]}"
    return row(f"kernel #include \"{key_file}\" (read the secret key through nvcc)", REFUSED, outcome, refused)


def sandbox_rows(paths: tuple[str, ...] = tuple(PATHS)) -> list[dict]:
    secret = f"sk-fake-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="klineage-security-") as root:
        root = Path(root)
        with planted_instance(root, secret) as instance:
            rows = [r for name in paths for r in attack_rows(name, instance, secret, root)]
            return [*rows, nvcc_row(instance, secret)]


def _suite() -> dict[str, tuple[str, str]]:
    """Each adversarial kernel's name with what it tries (its plan's description and its expectation's why)
    and the reason its expect.toml says the gate must give."""
    found = {}
    for entry in corpus.list_kernels(adversarial=True):
        plan, expectation = entry.load().plan, entry.expectation
        tries = " ".join(part for part in (plan.description, expectation.get("why", "")) if part)
        found[plan.name] = (tries, expectation.get("reason", "(no expect.toml)"))
    return found


def evasion_rows(path: Path = ADVERSARIAL) -> tuple[list[dict], dict]:
    """One row per kernel of corpus/adversarial: expected is its expect.toml's reason today, outcome the
    reason the measured gate gave; a kernel the file does not hold is a failed row."""
    measured = json.loads(path.read_text(encoding="utf-8"))
    kept = {r["kernel"]["name"]: r for r in measured["rows"]}
    rows = []
    for name, (tries, expected) in sorted(_suite().items()):
        verdict = kept.pop(name, None)
        if verdict is None:
            rows.append(row(f"{name}: {tries}", expected, f"not in {path.name}: never measured", False))
            continue
        outcome = f"{verdict['status']}: {verdict['reason']}"
        outcome += f" ({verdict['message'][:200]})" if verdict["message"] else ""
        rows.append(row(f"{name} on {verdict['workload']}: {tries}", expected, outcome,
                        verdict["reason"] == expected and not verdict["accepted"]))
    for name in kept:
        rows.append(row(f"{name}: measured in {path.name}", "a kernel of corpus/adversarial",
                        "no such kernel folder", False))
    return rows, measured["provenance"]


def web_rows(path: Path = WEB) -> tuple[list[dict], dict]:
    measured = json.loads(path.read_text(encoding="utf-8"))
    return [row(r["attack"], r["expected"], r["outcome"], r["passed"]) for r in measured["rows"]], \
        measured["provenance"]


def _bwrap_version() -> str:
    done = subprocess.run([config.bwrap_path(), "--version"], capture_output=True, text=True, timeout=30, check=False)
    return done.stdout.strip() or f"bwrap (version unknown: exit {done.returncode})"


def build() -> dict:
    live = sandbox_rows()
    evasion, evasion_from = evasion_rows()
    web, web_from = web_rows()
    rows = [*live, *evasion, *web]
    sandbox_words = (f"NO SANDBOX ({config.UNSAFE_NO_SANDBOX}=1)" if config.sandbox_disabled()
                     else f"{_bwrap_version()} ({config.bwrap_path()})")
    return {
        "provenance": {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "machine": f"{platform.node()} ({platform.machine()}, {platform.platform()})",
            "written_by": "bench/security_report.py",
            "sources": {
                "sandbox": {"live": True, "rows": len(live), "sandbox": sandbox_words,
                            "how": "run here by this script: the hostile problem file of tests/hostile.py through "
                                   "probe_problem and the CLI, and nvcc on an #include of the secret key"},
                "evasion": {"live": False, "rows": len(evasion), "file": str(ADVERSARIAL.relative_to(REPO)),
                            "measured": evasion_from},
                "web": {"live": False, "rows": len(web), "file": str(WEB.relative_to(REPO)), "measured": web_from},
            },
            "passed": sum(r["passed"] for r in rows),
            "total": len(rows),
        },
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "security.json")
    args = parser.parse_args()
    document = build()
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    failed = [r["attack"] for r in document["rows"] if not r["passed"]]
    print(f"{document['provenance']['passed']} of {document['provenance']['total']} rows passed; wrote {args.out}")
    for attack in failed:
        print(f"FAILED: {attack}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
