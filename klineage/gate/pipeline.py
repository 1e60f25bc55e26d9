"""The gate, stage by stage: probe the problem, static check, compile, features, plan, run on
the GPU (correctness, then paired timing), sanitizers; one verdict, cached by content."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from klineage import config, devices, expr
from klineage.config import GateMode
from klineage.errors import DocumentError, KLineageError, ReplayMiss
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.files import write_atomic
from klineage.fingerprint import sha256_bytes
from klineage.gate import execute, sweep
from klineage.gate.artifact import artifact_check
from klineage.gate.cache import GateCache, verdict_key
from klineage.gate.compile import CompileResult, CompileStatus, compile_kernel, resolve_entry
from klineage.gate.params import check_arguments, read_kernel_parameters
from klineage.gate.policy import GatePolicy, Sanitize, TimingScope
from klineage.gate.static import static_check
from klineage.gate.timing import PairedRatio, Settlement
from klineage.gate.verdict import GATE_VERSION, Finding, Reason, Status, Verdict
from klineage.kernel import KernelState
from klineage.launch import resolve
from klineage.toolchain import find_toolchain

Progress = Callable[[str, str], None]


class Runner(Protocol):
    """Runs a gate's request on the GPU: the `execute` module (a cold runner each time) or a warm runner."""

    def run_on_gpu(self, request: dict[str, Any], cubins: dict[str, bytes], policy: GatePolicy,
                   on_progress: Callable[[dict], None] | None = None) -> execute.RunOutcome: ...


def _quiet(stage: str, message: str) -> None:
    pass


@dataclass(frozen=True)
class Contender:
    """A kernel ready for the runner: compiled, its plan resolved for each case."""

    role: str
    state: KernelState
    compiled: CompileResult
    spec: dict[str, Any]


def default_cache() -> GateCache:
    return GateCache(config.cache_dir(), config.recorded_dir())


def git_commit() -> str:
    explicit = os.environ.get("KLINEAGE_GIT_COMMIT", "").strip()
    if explicit:
        return explicit
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=config.REPO_ROOT, capture_output=True, text=True,
                              timeout=10)
        return done.stdout.strip() if done.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def run_gate(problem_path: str | Path, kernel: KernelState, *, against: KernelState | None = None,
             cases: list[str] | None = None, policy: GatePolicy = GatePolicy(), mode: GateMode = GateMode.GPU,
             cache: GateCache | None = None, progress: Progress = _quiet, record: bool = False,
             judged_under: GatePolicy | None = None, runner: Runner | None = None) -> Verdict:
    """Judge `kernel` on the problem. In replay mode only recorded verdicts are served.

    `runner`: where the GPU run goes (a `warm.WarmRunner` for this problem); a cold runner by default.

    `judged_under`: a stronger untimed policy this kernel was probably judged under already (a
    walk's states); a pass stored under it answers a timed gate's correctness when no exact twin
    is stored (`GatePolicy.passes_imply`)."""
    cache = cache or default_cache()
    progress("probe", "reading the problem")
    timings: dict[str, float] = {}
    clock = time.monotonic()
    located = _locate(problem_path, kernel, against, cases, policy, mode)
    problem_path, probe, device, judged, skipped, key, parts, swept = located
    if probe is not None:
        timings["probe"] = time.monotonic() - clock
    problem_fp, toolchain_key = parts["problem"], parts["toolchain"]
    # Replay serves recorded verdicts; on a miss it still decides what needs no GPU (the static check,
    # nvcc, the policy on the artifact, the plan against the cubin): those rejections are the same on
    # every machine. A kernel that passes them needs its GPU verdict, and the miss is raised.
    missed: ReplayMiss | None = None
    if mode is GateMode.REPLAY:
        try:
            return _replayed(located, kernel, against, cases, policy, cache)
        except ReplayMiss as miss:
            if probe is None:
                raise
            missed = miss
    found = cache.lookup(key) if not record and missed is None else None
    if found is not None:
        return _served(*found)

    base = dict(kernel={"name": kernel.name, "fingerprint": kernel.fingerprint},
                problem={"operator": probe.info.operator, "fingerprint": problem_fp}, cases=tuple(judged),
                policy=policy.to_dict(),
                domain={"supports": kernel.plan.supports, "reason": kernel.plan.supports_reason, "skipped": skipped})

    def finish(status: Status, findings: list[Finding] = (), store: bool = True, twin: str = "",
               **stages: Any) -> Verdict:
        provenance = {"origin": "judged_without_gpu" if missed else "measured", "key": key, "key_parts": parts,
                      "gate_version": GATE_VERSION,
                      "git_commit": git_commit(),
                      "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        if twin:  # correctness and sanitizers were judged by this untimed verdict of the same kernel
            provenance["correctness_from"] = twin
        verdict = Verdict(status=status, findings=tuple(findings), timings=timings, provenance=provenance,
                          **base, **stages)
        if store and missed is None:
            cache.store(key, verdict, record=record)
        progress("done", verdict.status.value)
        return verdict

    progress("static", "static check")
    clock = time.monotonic()
    report = static_check(kernel)
    timings["static"] = time.monotonic() - clock
    if not report.ok:
        message = "; ".join(f"{f.rule} (line {f.line}): {f.message}" for f in report.findings[:3])
        return finish(Status.REJECTED, [Finding(Reason.STATIC_CHECK, "static", message)], static=report.to_dict())

    progress("compile", "nvcc")
    clock = time.monotonic()
    compiled = compile_kernel(kernel, cache_dir=config.cache_dir())
    timings["compile"] = time.monotonic() - clock
    if compiled.status is CompileStatus.TIMEOUT:  # says nothing of the kernel, only of this machine now
        return finish(Status.ERROR, [], store=False, static=report.to_dict(), compile=compiled.portable_dict(),
                      environment={"error": compiled.log[:2000]})
    if not compiled.ok:
        return finish(Status.REJECTED, [Finding(Reason.COMPILE_ERROR, "compile", _first_error(compiled.log),
                                                evidence={"log": compiled.log[-4000:]})],
                      static=report.to_dict(), compile=compiled.portable_dict())
    clock = time.monotonic()
    artifact = artifact_check(kernel, compiled, config.cache_dir())  # the policy on what nvcc produced
    timings["artifact"] = time.monotonic() - clock
    if not artifact.ok:
        return finish(Status.REJECTED, [artifact.finding()], static=report.to_dict(), compile=compiled.portable_dict())

    progress("features", "source and SASS features")
    clock = time.monotonic()
    features = {"source": [f.to_dict() for f in source_features(kernel.source)],
                "sass": _sass_features_cached(compiled.cubin_bytes(kernel.plan.arch))}
    timings["features"] = time.monotonic() - clock
    stages = {"static": report.to_dict(), "compile": compiled.portable_dict(), "features": features}

    try:
        candidate = contender("candidate", kernel, compiled, probe, judged + swept, device)
    except _PlanFailure as failure:
        return finish(Status.REJECTED, [failure.finding], **stages)
    if missed is not None:
        raise missed
    if mode is GateMode.COMPILE_ONLY:
        return finish(Status.COMPILED, **stages)

    timing_case = (policy.timing_case or probe.info.headline) if policy.timing else ""
    timing_case = timing_case if timing_case in judged else ""
    every_case = policy.timing_scope is TimingScope.EVERY_CASE and timing_case
    timed = [*judged, *swept] if every_case else [timing_case]
    contenders = [candidate]
    if against is not None and timing_case:
        against_compiled = compile_kernel(against, cache_dir=config.cache_dir())
        if not against_compiled.ok:
            raise KLineageError(f"the baseline kernel '{against.name}' does not compile "
                                f"({against_compiled.status.value}): {_first_error(against_compiled.log)}")
        contenders.append(contender("baseline", against, against_compiled, probe, timed, device))
    twin = _judged_twin(cache, policy, parts, judged_under) if timing_case and not record else None
    if twin is not None and twin.status is Status.REJECTED:
        return finish(Status.REJECTED, list(twin.findings), twin=twin.provenance["key"], **stages,
                      correctness=twin.correctness, sanitizer=twin.sanitizer)
    # With a passed twin only the timing runs (and re-checks the timing case once on the way).
    request = {"mode": "run", "problem": str(problem_path), "cases": [timing_case] if twin else judged,
               "seeds": [0] if twin else list(range(policy.seeds)), "timing_case": timing_case,
               "kernels": [c.spec for c in contenders], **({"timing_cases": timed} if every_case else {})}
    cubins = {c.role: c.compiled.cubin_bytes(c.state.plan.arch) for c in contenders}
    progress("run", f"timing on {timing_case} (correctness from its twin)" if twin else
             f"correctness on {len(judged)} case(s) x {policy.seeds} seeds" +
             (f", timing on {timing_case}" if timing_case else ""))
    clock = time.monotonic()
    outcome = (runner or execute).run_on_gpu(request, cubins, policy,
                                             on_progress=lambda e: progress("run", _describe(e)))
    timings["run"] = time.monotonic() - clock
    timings.update({f"run.{name}": float(sec) for name, sec in (outcome.result.get("phases") or {}).items()
                    if isinstance(sec, (int, float))})
    if outcome.error and not outcome.findings:  # the harness or the problem failed: judge nothing, cache nothing
        return finish(Status.ERROR, [], store=False, **stages,
                      environment={**outcome.result.get("environment", {}), "error": outcome.error[-6000:]})
    findings = list(outcome.findings)
    sanitizer: dict[str, Any] = {}
    runs_cleanly = not any(f.reason in (Reason.TIMEOUT, Reason.CRASH, Reason.OUTPUT_FLOOD) for f in findings)
    if twin is not None:
        sanitizer = dict(twin.sanitizer)
    elif policy.sanitize is Sanitize.ALWAYS and runs_cleanly or policy.sanitize is Sanitize.ON_PASS and not findings:
        small = _smallest(probe, judged)
        for tool in ("memcheck", "racecheck"):
            progress("sanitize", f"{tool} on case {small}")
            clock = time.monotonic()
            request_small = {**request, "mode": "sanitize", "cases": [small], "seeds": [0], "timing_case": "",
                             "kernels": [candidate.spec]}
            tool_findings, sanitizer[tool] = execute.sanitize(tool, request_small, {"candidate": cubins["candidate"]},
                                                               policy)
            timings[tool] = time.monotonic() - clock
            findings.extend(tool_findings)
    _decide_acceptance(outcome.result.get("profile", {}), policy, findings)
    status = Status.REJECTED if findings else Status.PASSED
    correctness = tuple(outcome.result.get("correctness", []))
    if twin is not None:  # the twin's records, and the timing run's own when it found a fault the twin did not
        correctness = twin.correctness + (correctness if findings else ())
    return finish(status, findings, twin=twin.provenance["key"] if twin else "", **stages, correctness=correctness,
                  profile=outcome.result.get("profile", {}), sanitizer=sanitizer,
                  environment={**outcome.result.get("environment", {}), "toolchain": toolchain_key,
                               "vendor_check": outcome.result.get("vendor_check", [])})


def _decide_acceptance(profile: dict[str, Any], policy: GatePolicy, findings: list[Finding]) -> None:
    """The paired test against the baseline, where the policy requires a ratio: only on a settled
    timing (an unsettled one decides nothing; `profile.settlement` says why)."""
    ratio = profile.get("ratios", {}).get("vs_baseline")
    settled = (profile.get("settlement") or {}).get("state") == Settlement.SETTLED.value
    if policy.require_ratio and not findings and ratio and settled:
        paired = PairedRatio(ratio["overall"], tuple(ratio["per_trial"]))
        profile["acceptance"] = {"required": policy.require_ratio, "accepted": paired.accepts(policy.require_ratio)}


def _judged_twin(cache: GateCache, policy: GatePolicy, parts: dict[str, Any],
                 judged_under: GatePolicy | None = None) -> Verdict | None:
    """The stored verdict of this gate's correctness twin (same kernel, problem, cases, GPU and
    toolchain, untimed policy), when it judged the kernel (passed or rejected); else a pass stored
    under `judged_under` where such a pass implies this policy's."""
    facts = {k: v for k, v in parts.items() if k != "version"}

    def stored(under: GatePolicy, statuses: tuple[Status, ...]) -> Verdict | None:
        key, _ = verdict_key(**{**facts, "policy": under.fingerprint, "against": "none"})
        found = cache.lookup(key)
        return found[0] if found is not None and found[0].status in statuses else None

    exact = stored(policy.correctness_twin(), (Status.PASSED, Status.REJECTED))
    if exact is not None or judged_under is None or judged_under.timing or not judged_under.passes_imply(policy):
        return exact
    return stored(judged_under, (Status.PASSED,))  # keyed by its own policy, as the state was gated


class _PlanFailure(Exception):
    def __init__(self, finding: Finding):
        self.finding = finding


def contender(role: str, state: KernelState, compiled: CompileResult, probe, cases: list[str],
               device: devices.DeviceSpec) -> Contender:
    """Resolve the plan for every case and check what can be checked without a GPU."""
    constants = state.constants
    outputs = {o.name for o in probe.info.outputs}
    inputs = set(probe.inputs)
    entries, static_shared, launches, scratch = {}, {}, {}, {}
    try:
        for launch in state.plan.launches:
            entries[launch.entry] = resolve_entry(compiled, launch.entry)
            declared = read_kernel_parameters(compiled.cubin_bytes(state.plan.arch), entries[launch.entry])
            check_arguments(launch.args, declared, launch.entry)
            static_shared[launch.entry] = compiled.static_shared(launch.entry)
        for case_name in cases:
            params = dict(probe.info.case(case_name).params)
            env = {**params, **constants, **device.facts()}
            case_scratch = [{"name": s.name, "dtype": s.dtype, "count": expr.evaluate_int(s.count, env), "init": s.init}
                            for s in state.plan.scratch]
            resolved = resolve(state.plan, env, inputs | outputs | {s["name"] for s in case_scratch})
            for launch in resolved:
                total = launch.shared + static_shared[launch.entry]
                if total > device.smem_per_block_optin:
                    raise _PlanFailure(Finding(Reason.RESOURCE_LIMIT, "plan",
                                               f"{launch.entry} needs {total} bytes of shared memory per block; "
                                               f"{device.name} allows {device.smem_per_block_optin}", case_name))
            launches[case_name] = [launch.to_dict() for launch in resolved]
            scratch[case_name] = case_scratch
    except DocumentError as exc:
        raise _PlanFailure(Finding(Reason.PLAN_ERROR, "plan", str(exc))) from None
    spec = {"role": role, "entries": entries, "static_shared": static_shared, "launches": launches, "scratch": scratch}
    return Contender(role, state, compiled, spec)


def _sass_features_cached(cubin: bytes) -> dict[str, Any]:
    """Disassembly costs more than the rest of a cached gate: keep its features by cubin content."""
    path = config.cache_dir() / "sass" / f"{sha256_bytes(cubin)}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    features = sass_features(cubin).to_dict()
    write_atomic(path, json.dumps(features))
    return features


class _Located(NamedTuple):
    """Where a gate's verdict is stored: its key, from the problem's probe and the kernel's domain."""
    problem_path: Path
    probe: Any
    device: devices.DeviceSpec
    judged: list[str]
    skipped: list[str]
    key: str
    parts: dict[str, Any]
    swept: list[str]  # the sweep cases a gate timing every case times too (klineage.gate.sweep)


def _locate(problem_path: str | Path, kernel: KernelState, against: KernelState | None, cases: list[str] | None,
            policy: GatePolicy, mode: GateMode) -> _Located:
    problem_path = Path(problem_path).resolve()
    gpu = {GateMode.GPU: execute.gpu_name, GateMode.REPLAY: config.replay_gpu}.get(mode, lambda: "none")()
    probe = None
    if mode is not GateMode.REPLAY or cases is None:
        probe = execute.probe_problem(problem_path, config.cache_dir())
        if probe.numerics:
            raise DocumentError(str(problem_path), "refused: " + "; ".join(probe.numerics))
    device = devices.lookup(gpu) if mode is GateMode.GPU else devices.DEFAULT
    judged, skipped = _cases(probe, kernel, cases, device)
    swept = (sweep.supported(probe.info if probe else None, [kernel, against], device.facts())
             if policy.timing_scope is TimingScope.EVERY_CASE and policy.timing else [])
    named = judged + sweep.key_names(probe.info, swept) if swept else judged
    key, parts = verdict_key(
        kernel=kernel.fingerprint,
        problem=execute.problem_fingerprint(problem_path),
        cases=named,
        gpu=gpu,
        toolchain=_toolchain_key(mode),
        policy=policy.fingerprint,
        against=against.fingerprint if against else "none",
        mode=GateMode.GPU.value if mode is GateMode.REPLAY else mode.value,
    )  # replay serves GPU verdicts
    return _Located(problem_path, probe, device, judged, skipped, key, parts, swept)


def stored_verdict(problem_path: str | Path, kernel: KernelState, *, against: KernelState | None = None,
                   policy: GatePolicy = GatePolicy(), mode: GateMode = GateMode.GPU,
                   cache: GateCache | None = None) -> Verdict | None:
    """The verdict `run_gate` would serve from a store for these arguments, running nothing (the
    problem's probe aside); None where it would have to judge (in replay: where nothing is recorded)."""
    cache = cache or default_cache()
    if mode is GateMode.REPLAY:
        try:
            return recorded_verdict(problem_path, kernel, against=against, policy=policy, cache=cache)
        except ReplayMiss:
            return None
    found = cache.lookup(_locate(problem_path, kernel, against, None, policy, mode).key)
    return _served(*found) if found else None


def recorded_verdict(problem_path: str | Path, kernel: KernelState, *, against: KernelState | None = None,
                     policy: GatePolicy = GatePolicy(), cache: GateCache | None = None) -> Verdict:
    """What replay serves for these arguments, judging nothing on a miss (ReplayMiss): lookups of
    recorded evidence (re-timings, per-case timings) must not compile hundreds of kernels to learn
    that they were never measured."""
    cache = cache or default_cache()
    located = _locate(problem_path, kernel, against, None, policy, GateMode.REPLAY)
    return _replayed(located, kernel, against, None, policy, cache)


def earlier_sweep_verdict(problem_path: str | Path, kernel: KernelState, *, against: KernelState | None = None,
                          policy: GatePolicy = GatePolicy(), cache: GateCache | None = None) -> Verdict:
    """What replay serves for a gate timing every case (`recorded_verdict`), or on a miss the verdict
    recorded while the problem's SWEEP table held fewer cases: a sweep grows by appending cases
    (klineage.problem), so the longest earlier table whose verdict is recorded is a prefix of today's.
    Its cases stay measurements of what they timed; the cases added since are simply not among them."""
    cache = cache or default_cache()
    located = _locate(problem_path, kernel, against, None, policy, GateMode.REPLAY)
    try:
        return _served(*cache.replay(located.key, located.parts))
    except ReplayMiss as missed:
        facts = {k: v for k, v in located.parts.items() if k not in ("version", "gate")}
        for cut in range(len(located.swept) - 1, -1, -1):  # the key as if the table held its first `cut` cases
            named = located.judged + sweep.key_names(located.probe.info, located.swept[:cut])
            try:  # as replay serves any key: recorded by this gate version, else by the newest earlier one
                return _served(*cache.replay(*verdict_key(**{**facts, "cases": named})))
            except ReplayMiss:
                continue
        raise missed


def _replayed(located: _Located, kernel: KernelState, against: KernelState | None, cases: list[str] | None,
              policy: GatePolicy, cache: GateCache) -> Verdict:
    try:
        return _served(*cache.replay(located.key, located.parts))
    except ReplayMiss:
        answered = _replay_with_vendor(located.problem_path, kernel, against, cases, policy, cache)
        if answered is None:
            raise
        return answered


def _cases(probe, kernel: KernelState, requested: list[str] | None,
           device: devices.DeviceSpec) -> tuple[list[str], list[str]]:
    if probe is None:  # replay with explicit cases: nothing to look up
        return list(requested or []), []
    names = [c.name for c in probe.info.cases]
    for name in requested or []:
        if name not in names:
            raise DocumentError(probe.info.operator, f"no case '{name}' (cases: {', '.join(names)})")
    wanted = requested or names
    facts = {**kernel.constants, **device.facts()}
    judged = [n for n in wanted if kernel.plan.supports_case(probe.info.case(n).params, facts)]
    skipped = [n for n in wanted if n not in judged]
    if not judged:
        raise DocumentError(kernel.name, f"supports none of the cases {wanted} ({kernel.plan.supports})")
    return judged, skipped


def _smallest(probe, cases: list[str]) -> str:
    def size(name: str) -> int:
        params = probe.info.case(name).params
        total = 1
        for value in params.values():
            if isinstance(value, int) and not isinstance(value, bool):
                total *= max(1, value)
        return total

    return min(cases, key=size)


def _toolchain_key(mode: GateMode) -> str:
    if mode is GateMode.REPLAY:
        return os.environ.get("KLINEAGE_REPLAY_TOOLCHAIN", "").strip() or find_toolchain().key
    return find_toolchain().key


def _replay_with_vendor(problem_path: Path, kernel: KernelState, against: KernelState | None,
                        cases: list[str] | None, policy: GatePolicy, cache: GateCache) -> Verdict | None:
    """A timed gate without the vendor is answered, in replay, by a recorded verdict of the same checks
    that timed the vendor as well (the dashboard's kernels list shows those): it measured everything
    asked and more. It says so in its provenance."""
    if not policy.timing or policy.vendor:
        return None
    wider = policy.with_(vendor=True)
    located = _locate(problem_path, kernel, against, cases, wider, GateMode.REPLAY)
    try:
        verdict, origin = cache.replay(located.key, located.parts)
    except ReplayMiss:
        return None
    served = _served(verdict, origin)
    data = served.to_dict()
    data["provenance"]["answered_by"] = "a recorded verdict of the same checks that also timed the vendor"
    return Verdict.from_dict(data)


def _served(verdict: Verdict, origin: str) -> Verdict:
    """A verdict from a store says so: its provenance names where it came from, and a verdict an
    earlier gate version made (replay serves those as recorded) says that too."""
    data = verdict.to_dict()
    data["provenance"] = {**data["provenance"], "served_from": origin}
    if verdict.gate_version < GATE_VERSION:
        data["provenance"]["earlier_gate"] = (f"made by gate version {verdict.gate_version}; the gate is now version "
                                              f"{GATE_VERSION}: served as recorded, not judged again")
    return Verdict.from_dict(data)


_GENERIC_ERRORS = ("Ptx assembly aborted due to errors", "compilation terminated")


def _first_error(log: str) -> str:
    """The line that says what went wrong: ptxas reports some failures only as `fatal` (C7602,
    too few registers for a wgmma) and then a generic `aborted due to errors` line, which says nothing."""
    lines = [line.strip() for line in log.splitlines()]
    flagged = [line for line in lines if "error" in line.lower() or "fatal" in line.lower()]
    specific = [line for line in flagged if not any(g in line for g in _GENERIC_ERRORS)]
    return ((specific or flagged or [line for line in lines if line] or ["nvcc failed"])[0])[:400]


def _describe(event: dict[str, Any]) -> str:
    if "seed" in event:
        return f"{event.get('kernel', '')} case {event.get('case')} seed {event.get('seed')}"
    if "trial" in event:
        return f"timing case {event.get('case')} trial {event.get('trial')}"
    return event.get("what", "")
