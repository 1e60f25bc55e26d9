"""The parent side of the sandboxed runner: build a request, run it, read the private result,
and turn what happened (a timeout, a flood, a dead process, a sanitizer report) into findings."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klineage import config
from klineage.errors import DocumentError, KLineageError
from klineage.files import write_atomic
from klineage.fingerprint import sha256_bytes, sha256_text
from klineage.gate import sandbox
from klineage.gate.jail import Access, Jail, python_path, toolkit_trees
from klineage.gate.policy import GatePolicy
from klineage.gate.verdict import Finding, Reason
from klineage.problem import ProblemInfo
from klineage.problem_formats import fingerprint, source_files

PROBE_VERSION = 1
RESULT_CAP = 256 << 20  # bytes of a result file read at all; a bigger one is the job misbehaving
# What a runner's result may hold at its top level, and of which type (klineage.gate.runner.main).
RESULT_SHAPE = {"findings": list, "correctness": list, "profile": dict, "error": str, "traceback": str,
                "problem": dict, "numerics": list, "inputs": dict, "environment": dict, "vendor_check": list,
                "phases": dict}
log = logging.getLogger("klineage.sandbox")


@dataclass(frozen=True)
class ProbeResult:
    info: ProblemInfo
    numerics: tuple[str, ...]  # findings that make the problem unusable; empty when sound
    inputs: dict[str, dict[str, Any]]  # input name -> {dtype, shape} on the smallest case

    def to_dict(self) -> dict[str, Any]:
        return {"version": PROBE_VERSION, "problem": self.info.to_dict(), "numerics": list(self.numerics),
                "inputs": self.inputs}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        return cls(ProblemInfo.from_dict(data["problem"]), tuple(data["numerics"]), dict(data["inputs"]))


@dataclass
class RunOutcome:
    result: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    error: str = ""  # the harness or problem failed: no judgement on the kernel
    seconds: float = 0.0
    output_excerpt: str = ""
    isolation: tuple[str, ...] = ()  # the sandbox and limits it ran under (sandbox.SandboxResult.isolation)


def held_by(result: dict[str, Any], isolation: tuple[str, ...]) -> None:
    """Written by the parent, after the runner's own facts: the verdict says what held the run."""
    result["environment"] = {**result.get("environment", {}), "sandbox": "; ".join(isolation)}


def problem_fingerprint(path: Path) -> str:
    """The content fingerprint of a problem of any format (a trace's workloads and tensors included)."""
    return fingerprint(path)


def _runner_env(extra: dict[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
    return sandbox.minimal_env({"PYTHONPATH": python_path(), **(extra or {})}, home=home)


def _workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="klineage-run-"))  # mode 0700: a private channel


def _read_result(path: Path) -> dict[str, Any] | None:
    """The runner's result, if a capped regular file in the runner's shape; None otherwise."""
    data = sandbox.read_capped(path, RESULT_CAP)
    try:
        result = json.loads(data.decode("utf-8")) if data is not None else None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(result, dict) or any(not isinstance(result.get(k, t()), t) for k, t in RESULT_SHAPE.items()):
        return None
    return result


def _stage_problem(path: Path, work: Path) -> Path:
    """A copy of the problem's files in the job's scratch folder, laid out as beside the original (a
    trace's workloads and tensors sit in folders next to its definition): the sandbox shows the runner
    no other folder of ours (an uploaded problem lives in the data dir). Gives the staged first file."""
    files = [f.resolve() for f in source_files(path)]
    root = Path(os.path.commonpath([f.parent for f in files]))
    for source in files:
        staged = work / "problem" / source.relative_to(root)
        staged.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, staged)
    return work / "problem" / files[0].relative_to(root)


def _jail(access: Access, work: Path, readable: tuple[Path, ...] = (), writable: tuple[Path, ...] = ()) -> Jail:
    return Jail(access, work, python=config.runner_python(), readable=readable, writable=writable)


def _said(outcome: sandbox.SandboxResult) -> None:
    log.info("runner: %s", "; ".join(outcome.isolation))


def probe_problem(path: str | Path, cache_dir: Path | None = None, device: str = "cpu",
                  timeout_s: float = 300) -> ProbeResult:
    """Load and validate a problem file in the sandbox (its code never runs in this process)."""
    path = Path(path).resolve()
    problem_fingerprint(path)  # a missing or undecodable file is named here
    # by every byte of every source file, SWEEP included (the fingerprint leaves it out): a changed sweep is probed
    # again
    whole = sha256_text(" ".join(sha256_bytes(f.read_bytes()) for f in source_files(path)))
    cached = cache_dir / "problems" / f"{whole}.json" if cache_dir else None
    if cached and cached.is_file():
        probe = ProbeResult.from_dict(json.loads(cached.read_text(encoding="utf-8")))
        return ProbeResult(ProblemInfo.from_dict({**probe.info.to_dict(), "path": str(path)}), probe.numerics,
                           probe.inputs)
    work = _workdir()
    try:
        staged = _stage_problem(path, work)
        request = {"mode": "probe", "problem": str(staged), "device": device}
        (work / "request.json").write_text(json.dumps(request), encoding="utf-8")
        outcome = sandbox.run([config.runner_python(), "-m", "klineage.gate.runner", "request.json", "result.json"],
                              cwd=work, timeout_s=timeout_s, env=_runner_env(home=work),
                              jail=_jail(Access.CPU if device == "cpu" else Access.GPU, work))
        _said(outcome)
        result = _read_result(work / "result.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result is None or not ("error" in result or {"problem", "numerics", "inputs"} <= result.keys()):
        raise DocumentError(
            str(path),
            f"loading the problem failed ({outcome.exit.value}, code "
            f"{outcome.returncode}): {outcome.output[-2000:].replace(str(staged), str(path))}",
        )
    if "error" in result:
        raise DocumentError(str(path), result["error"].replace(str(staged), str(path)))
    info = ProblemInfo.from_dict({**result["problem"], "path": str(path)})  # the user's file, not the staged copy
    probe = ProbeResult(info, tuple(result["numerics"]), result["inputs"])
    if cached:
        write_atomic(cached, json.dumps(probe.to_dict()))
    return probe


def run_on_gpu(request: dict[str, Any], cubins: dict[str, bytes], policy: GatePolicy,
               on_progress: Callable[[dict], None] | None = None,
               wrap: list[str] | None = None, extra_env: dict[str, str] | None = None,
               timeout_s: float | None = None, stall_s: float | None = None,
               readable: tuple[Path, ...] = (), writable: tuple[Path, ...] = ()) -> RunOutcome:
    """Run the runner once. `cubins` maps kernel role -> cubin bytes; `wrap` prefixes the command
    (compute-sanitizer, whose trees `readable` and `writable` add to the sandbox's view).
    Everything the kernel could do to the process is turned into findings."""
    work = _workdir()
    try:
        problem = Path(request["problem"])
        staged = _stage_problem(problem, work)
        request = {**request, "problem": str(staged)}
        for spec in request["kernels"]:
            cubin = work / f"{spec['role']}.cubin"
            cubin.write_bytes(cubins[spec["role"]])
            spec["cubin"] = str(cubin)
        request = {**request, "progress": str(work / "progress.jsonl"), "policy": policy.to_dict()}
        (work / "request.json").write_text(json.dumps(request), encoding="utf-8")
        argv = [*(wrap or []), config.runner_python(), "-m", "klineage.gate.runner", "request.json", "result.json"]
        events: list[dict] = []

        def seen(event: dict) -> None:
            events.append(event)
            if on_progress:
                on_progress(event)

        outcome = sandbox.run(argv, cwd=work, timeout_s=timeout_s or policy.run_timeout_s,
                              env=_runner_env(extra_env, home=work), output_cap=policy.output_cap,
                              progress_file=work / "progress.jsonl", stall_s=stall_s or policy.launch_timeout_s,
                              on_progress=seen, jail=_jail(Access.GPU, work, readable, writable))
        _said(outcome)
        result = _read_result(work / "result.json") or {}
        held_by(result, outcome.isolation)
        run = RunOutcome(result=result, seconds=outcome.seconds, output_excerpt=outcome.output[-4000:],
                         isolation=outcome.isolation)
        last = next((e for e in reversed(events) if "what" in e or "case" in e), {})
        case = last.get("case", "")
        if outcome.exit is sandbox.Exit.STALLED:
            run.findings.append(Finding(Reason.TIMEOUT, "run", f"'{last.get('what', 'a launch')}' did not finish "
                                        f"within {stall_s or policy.launch_timeout_s:.0f} s", case))
        elif outcome.exit is sandbox.Exit.TIMEOUT:
            run.findings.append(
                Finding(Reason.TIMEOUT, "run", f"the run exceeded {timeout_s or policy.run_timeout_s:.0f} s", case)
            )
        if outcome.flooded:
            run.findings.append(Finding(Reason.OUTPUT_FLOOD, "run", f"printed {outcome.output_bytes} bytes; the limit "
                                        f"is {policy.output_cap}", case, {"excerpt": outcome.output[:500]}))
        run.findings.extend(Finding.from_dict(f) for f in result.get("findings", []))
        if not result and not run.findings:
            reason = Reason.CRASH
            run.findings.append(Finding(reason, "run", f"the runner died ({outcome.exit.value}, code "
                                        f"{outcome.returncode}) during '{last.get('what', last.get('stage', '?'))}'",
                                        case, {"output": outcome.output[-2000:]}))
        if "error" in result and not run.findings:
            run.error = (result["error"] + "\n" + result.get("traceback", "")).replace(str(staged), str(problem))
        return run
    finally:
        shutil.rmtree(work, ignore_errors=True)


_MEMCHECK_ERROR = re.compile(r"Invalid __(global|shared|local)__ (read|write)|Misaligned|Out-of-range|"
                             r"Address .* is out of bounds", re.IGNORECASE)
# memcheck ends with "ERROR SUMMARY: N errors", racecheck with "RACECHECK SUMMARY: N hazards displayed
# (E errors, W warnings)"; a log cut short has neither, but its hazard lines still count.
_ERROR_SUMMARY = re.compile(r"(?:ERROR SUMMARY:\s*(\d+)\s+error|RACECHECK SUMMARY:.*?\((\d+)\s+error)", re.IGNORECASE)
_RACE = re.compile(r"Potential \w+ hazard detected|Race reported", re.IGNORECASE)


def sanitize(
    tool: str, request: dict[str, Any], cubins: dict[str, bytes], policy: GatePolicy
) -> tuple[list[Finding], dict]:
    """Run the candidate once under compute-sanitizer (memcheck or racecheck) on one small case."""
    binary = config.sanitizer_path()
    if binary is None:
        return [], {"tool": tool, "status": "unavailable"}
    log_file = Path(tempfile.mkdtemp(prefix="klineage-san-")) / "sanitizer.log"
    wrap = [binary, "--tool", tool, "--log-file", str(log_file), "--print-limit", "20", "--error-exitcode", "86"]
    if tool == "racecheck":
        wrap += ["--racecheck-report", "hazard"]
    try:
        # Separate allocations, so memcheck knows each buffer's true bounds.
        run = run_on_gpu(request, cubins, policy, wrap=wrap, extra_env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
                         timeout_s=max(600.0, policy.run_timeout_s), stall_s=max(120.0, 20 * policy.launch_timeout_s),
                         readable=toolkit_trees(binary), writable=(log_file.parent,))
        text = (sandbox.read_capped(log_file, RESULT_CAP) or b"").decode("utf-8", errors="replace")
    finally:
        shutil.rmtree(log_file.parent, ignore_errors=True)
    summary = _ERROR_SUMMARY.search(text)
    errors = int(summary.group(1) or summary.group(2)) if summary else None
    if tool == "racecheck" and not errors and _RACE.search(text):
        errors = len(_RACE.findall(text))
    report = {"tool": tool, "errors": errors, "excerpt": text[:3000], "seconds": run.seconds}
    findings = [f for f in run.findings if f.reason in (Reason.TIMEOUT, Reason.OUTPUT_FLOOD)]
    if errors is None and not findings:
        report["status"] = "no summary"  # the sanitizer itself failed to run: say so, judge nothing
        report["output"] = run.output_excerpt[-1500:]
        return [], report
    report["status"] = "clean" if not errors else "errors"
    if errors:
        if tool == "memcheck" and _MEMCHECK_ERROR.search(text):
            findings.append(Finding(Reason.MEMCHECK, "sanitizer", f"memcheck found {errors} invalid access(es)",
                                    request["cases"][0], {"excerpt": text[:1500]}))
        elif tool == "racecheck" and _RACE.search(text):
            findings.append(Finding(Reason.RACE, "sanitizer", f"racecheck found {errors} shared-memory hazard(s)",
                                    request["cases"][0], {"excerpt": text[:1500]}))
        else:
            findings.append(
                Finding(
                    Reason.MEMCHECK if tool == "memcheck" else Reason.RACE,
                    "sanitizer",
                    f"{tool} reported {errors} error(s)",
                    request["cases"][0],
                    {"excerpt": text[:1500]},
                )
            )
    return findings, report


def gpu_count() -> int:
    """GPUs on this host, whatever CUDA_VISIBLE_DEVICES says; 1 when nvidia-smi cannot tell."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 1
    import subprocess

    done = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                          timeout=30)
    return max(1, sum(1 for line in done.stdout.splitlines() if line.strip()))


def gpu_name() -> str:
    """The name of the GPU the runner will use; an error when there is none."""
    explicit = os.environ.get("KLINEAGE_GPU_NAME", "").strip()
    if explicit:
        return explicit
    return _smi_gpu_name(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0")


@functools.cache
def _smi_gpu_name(visible: str) -> str:
    """Asked once per process and device: every gate call needs it, and nvidia-smi can take seconds."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise KLineageError(
            "no GPU here (nvidia-smi not found): use --compile-only, or --gate replay for recorded verdicts"
        )
    import subprocess

    args = [smi, "--query-gpu=name", "--format=csv,noheader"] + (["-i", visible] if visible.isdigit() else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not names:
        raise KLineageError(f"nvidia-smi found no GPU: {done.stderr.strip() or done.stdout.strip()}")
    return names[0]

