"""Carrier sweep: tuning-constant variants of one kernel, built by the tile_constant transform,
compiled, then gated one after another on the GPU, with one table at the end.

    python bench/carrier_sweep.py bench/sweeps/conv2d.toml --out results/sweep-conv2d.json
    python bench/carrier_sweep.py bench/sweeps/conv2d.toml --out /tmp/c.json --compile-only
    python bench/carrier_sweep.py bench/sweeps/fmha.toml --estimate-only   # GPU seconds, nothing run
Options: --max-variants N (the first N, the expert counts), --only a,b (by name), --budget-s S (start
no variant the estimate says would end past S seconds), --record (keep the verdicts in the recorded store).

A sweep file names the problem and the kernel and lists variants:

    problem = "conv2d"                    # optional: the kernel's plan names its problem
    kernel = "conv2d/implicit_gemm"       # a bundled kernel name or a kernel folder
    description = "why these variants"
    include_expert = true                 # variant 0: the unmodified kernel, timed like the rest
    against_expert = true                 # time every variant paired with the expert (vs expert)

    [policy]                              # GatePolicy fields over the sweep's defaults (DEFAULT_POLICY)
    trials = 3

    [[variant]]
    name = "m96_w2x2"                     # optional; default: the overrides, joined
    why = "two 4-warp CTAs per SM, one balanced wave"
    constants = { BLOCK_M = 96, WARPS_M = 2 }
    nvcc_flags = ["-Xptxas=-O3"]          # optional, appended to the plan's (the plan's allow-list applies)
    launch_bounds = "THREADS, 2"          # optional: the kernel's __launch_bounds__ arguments, replaced

Each variant is built from the expert through the transform catalog, so the transforms' own safety
checks apply: every `NAME = NEW` is a tile_constant rewrite keyed `NAME=NEW` (a static_assert that
held and would fail, an exact division that would turn inexact, a vector width tied to a vector type:
NotApplicable, and the variant becomes a row with that reason). Overrides are applied one at a time
in any order that the transform accepts; where constants are tied by an assert so that no single
change can come first (fmha's BLOCK_M == WARPS * 16), the remaining changes are made together and
held to the same check (`tile_constant.check`) from the state before them to the state after them.
`launch_bounds` removes the kernel's attribute and adds the new one through the launch_bounds
transform (backward, then forward), after the constants (the removal is checked at the new block size). nvcc
ignores -maxrregcount for a kernel with __launch_bounds__,
so a register cap needs `launch_bounds = "THREADS, 2"` (min blocks per SM), not a flag.

Then every variant is compiled here (all at once, in parallel, into the gate's compile cache) and
reported: registers, spills, shared memory, CTAs per SM and waves on the headline case. Unless
--compile-only, each variant then goes through the full gate (`run_gate`) under the sweep policy,
one at a time (timing must not share the GPU): correctness on every case in the kernel's declared
domain, timing on the headline against the vendor path (and, paired, against the expert). A
variant that is refused, fails to compile or is wrong is a row with its reason, never the end of
the sweep. The JSON is rewritten after every variant, so a run cut short keeps what it measured.
Verdicts are fresh (a private verdict cache); --record also stores them in the recorded store.

The JSON: `provenance` (gpu, driver, cuda, torch, toolchain, git commit, sweep file and its sha256,
policy), `estimate`, `left_out`, and one row per variant: its overrides and why, the rewrites made
(transform, key, note), status and reason, compile facts (registers, spills, shared bytes, CTAs per
SM and what limits them, grid and waves on the headline), SASS counts (hmma, ldsm, ldgsts, ldl, stl),
per-case correctness, and timing (median us, vendor and expert medians, vs vendor and vs expert with
their per-trial ratios, the spread of the per-trial medians). Ratios are reference time / variant
time: above 1 is faster. vs expert is paired (the expert timed in the same rounds) unless
against_expert = false, where it is the variant's vs-vendor ratio over the expert's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from klineage import config, corpus, devices  # noqa: E402
from klineage.config import GateMode  # noqa: E402
from klineage.errors import DocumentError, KLineageError  # noqa: E402
from klineage.features import cuda_parser as cp  # noqa: E402
from klineage.gate.cache import GateCache, VerdictStore, read_verdict_file  # noqa: E402
from klineage.gate.compile import CompileResult, compile_kernel  # noqa: E402
from klineage.gate.policy import GatePolicy  # noqa: E402
from klineage.gate.verdict import Status, Verdict  # noqa: E402
from klineage.kernel import KernelState  # noqa: E402
from klineage.launch import LaunchPlan, resolve  # noqa: E402
from klineage.transforms import Anchor, Direction, NotApplicable, Rewrite, tile_constant  # noqa: E402
from klineage.transforms import get as get_transform  # noqa: E402

# The sweep's gate policy: a short timing, still paired with the vendor path and checked on every case.
DEFAULT_POLICY = {"seeds": 1, "sanitize": "never", "vendor": True, "timing": True, "trials": 3,
                  "trial_seconds": 1.0, "input_sets": 2}
# Per-SM limits of sm_90 (H100 / H200), as the CUDA occupancy calculator counts them.
SM90 = {"registers": 65536, "register_unit": 256, "max_threads": 2048, "max_blocks": 32,
        "shared_bytes": 233472, "shared_reserved_per_block": 1024}
TOP_KEYS = {"problem", "kernel", "description", "include_expert", "against_expert", "policy", "variant"}
VARIANT_KEYS = {"name", "why", "constants", "nvcc_flags", "launch_bounds"}
MAX_CONSTANT = 1 << 16
_NAME = re.compile(r"^[A-Za-z0-9_.,=+-]{1,80}$")
_BOUNDS = re.compile(r"^[A-Za-z0-9_ ,*+/()-]{1,80}$")
EXPERT = "expert"
FALLBACK_GATE_S = 30.0  # seconds per variant when no recorded verdict of the kernel says better


@dataclass(frozen=True)
class Variant:
    name: str
    constants: dict[str, int] = field(default_factory=dict)  # only values that differ from the expert's
    nvcc_flags: tuple[str, ...] = ()
    launch_bounds: str = ""
    why: str = ""
    unchanged: tuple[str, ...] = ()  # overrides that named the expert's own value

    @property
    def is_expert(self) -> bool:
        return not self.constants and not self.nvcc_flags and not self.launch_bounds

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "constants": dict(self.constants), "nvcc_flags": list(self.nvcc_flags),
                "launch_bounds": self.launch_bounds, "why": self.why, "unchanged": list(self.unchanged)}


@dataclass(frozen=True)
class Sweep:
    path: str
    problem: str
    problem_path: Path
    kernel: str
    expert: KernelState
    variants: tuple[Variant, ...]  # the expert first when included
    policy: GatePolicy
    against_expert: bool
    description: str = ""
    sha256: str = ""


@dataclass(frozen=True)
class Built:
    """A variant's kernel state, or why the transforms refused it."""

    variant: Variant
    state: KernelState | None
    steps: tuple[dict[str, Any], ...] = ()  # one per rewrite: transform, key, note, carrier
    mode: str = ""  # "sequential" | "joint" | "" (nothing to rewrite)
    reason: str = ""  # NotApplicable (or plan) message when state is None
    notes: tuple[str, ...] = ()


# ---- the sweep file --------------------------------------------------------------------------------

def tuning_sites(state: KernelState) -> dict[str, int]:
    """The constants tile_constant can set in this source (name -> literal value)."""
    finder = getattr(tile_constant, "_constants", None)
    if finder is not None:
        return {c.name: c.value for c in finder(cp.parse(state.source))}
    sites = {}  # older or newer module without the helper: its anchors name the sites that have a step
    for anchor in get_transform("tile_constant").find(state):
        name, _, rest = anchor.key.partition(":")
        sites[name] = int(rest.split("->")[0])
    return sites


def load_sweep(path: str | Path) -> Sweep:
    """Parse and check a sweep file; DocumentError names the file and the entry that is wrong."""
    path = Path(path)
    where = str(path)
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise DocumentError(where, f"cannot read the sweep file ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DocumentError(where, f"not a TOML file: {exc}") from None
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise DocumentError(where, f"unknown keys {unknown} (known: {sorted(TOP_KEYS)})")
    if not isinstance(data.get("kernel"), str) or not data["kernel"].strip():
        raise DocumentError(where, "needs kernel = \"<bundled kernel name or folder>\"")
    try:
        expert = corpus.kernel_entry(data["kernel"]).load()
    except DocumentError as exc:
        raise DocumentError(where, f"unknown kernel {data['kernel']!r}: {exc}") from None
    problem = data.get("problem", expert.plan.problem)
    if not isinstance(problem, str) or problem != expert.plan.problem:
        raise DocumentError(where, f"problem {problem!r} is not the kernel's ({expert.plan.problem!r})")
    try:
        problem_path = corpus.problem_path(problem)
    except DocumentError as exc:
        raise DocumentError(where, f"unknown problem {problem!r}: {exc}") from None
    for key in ("include_expert", "against_expert"):
        if not isinstance(data.get(key, True), bool):
            raise DocumentError(where, f"{key} must be true or false")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise DocumentError(where, "description must be a string")
    policy_table = data.get("policy", {})
    if not isinstance(policy_table, dict):
        raise DocumentError(where, "[policy] must be a table of GatePolicy fields")
    try:
        policy = GatePolicy.from_dict({**DEFAULT_POLICY, **policy_table})
    except DocumentError as exc:
        raise DocumentError(f"{where} [policy]", str(exc)) from None

    entries = data.get("variant", [])
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise DocumentError(where, "needs at least one [[variant]] table")
    sites = tuning_sites(expert)
    known = expert.constants
    variants = [Variant(EXPERT, why="the unmodified kernel")] if data.get("include_expert", True) else []
    seen: dict[tuple, str] = {}
    for i, entry in enumerate(entries):
        variant = _variant(f"{where} variant[{i}]", entry, expert, sites, known)
        if variant.name in {v.name for v in variants}:
            raise DocumentError(f"{where} variant[{i}]", f"name {variant.name!r} is used twice")
        identity = (tuple(sorted(variant.constants.items())), variant.nvcc_flags, variant.launch_bounds)
        if identity in seen:
            raise DocumentError(f"{where} variant[{i}]", f"the same changes as variant {seen[identity]!r}")
        seen[identity] = variant.name
        variants.append(variant)
    return Sweep(path=where, problem=problem, problem_path=problem_path, kernel=data["kernel"], expert=expert,
                 variants=tuple(variants), policy=policy, against_expert=data.get("against_expert", True),
                 description=description, sha256=hashlib.sha256(raw).hexdigest())


def _variant(where: str, entry: dict, expert: KernelState, sites: dict[str, int], known: dict) -> Variant:
    unknown = sorted(set(entry) - VARIANT_KEYS)
    if unknown:
        raise DocumentError(where, f"unknown keys {unknown} (known: {sorted(VARIANT_KEYS)})")
    constants = entry.get("constants", {})
    if not isinstance(constants, dict):
        raise DocumentError(where, "constants must be a table, e.g. { BLOCK_M = 128, STAGES = 3 }")
    changed, unchanged = {}, []
    for name, value in constants.items():
        if name not in sites:
            if name in known:
                raise DocumentError(where, f"{name} is not a tuning constant that tile_constant can set (it is "
                                           f"derived from others, or not named as a knob); settable: "
                                           f"{', '.join(sites) or 'none'}")
            raise DocumentError(where, f"unknown constant {name!r}; the kernel's tuning constants: "
                                       f"{', '.join(sites) or 'none'}")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONSTANT:
            raise DocumentError(where, f"{name} = {value!r}: needs a whole number from 1 to {MAX_CONSTANT}")
        if value == sites[name]:
            unchanged.append(name)
        else:
            changed[name] = value
    flags = entry.get("nvcc_flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise DocumentError(where, "nvcc_flags must be a list of strings")
    if flags:
        try:
            LaunchPlan.from_dict({**expert.plan.to_dict(), "nvcc_flags": [*expert.plan.nvcc_flags, *flags]})
        except DocumentError as exc:
            raise DocumentError(where, f"nvcc_flags: {exc}") from None
    bounds = entry.get("launch_bounds", "")
    if not isinstance(bounds, str) or (bounds and not _BOUNDS.match(bounds.strip())):
        raise DocumentError(where, "launch_bounds must be the attribute's arguments, e.g. \"THREADS, 2\"")
    why = entry.get("why", "")
    if not isinstance(why, str):
        raise DocumentError(where, "why must be a string")
    name = entry.get("name") or _default_name(changed, flags, bounds)
    if not isinstance(name, str) or not _NAME.match(name) or name == EXPERT:
        raise DocumentError(where, f"name {name!r}: 1 to 80 of A-Z a-z 0-9 _ . , = + -, and not {EXPERT!r}")
    variant = Variant(name=name, constants=changed, nvcc_flags=tuple(flags), launch_bounds=" ".join(bounds.split()),
                      why=why, unchanged=tuple(unchanged))
    if variant.is_expert:
        raise DocumentError(where, f"variant {name!r} changes nothing (every value is the expert's)")
    return variant


def _default_name(constants: dict[str, int], flags: list[str], bounds: str) -> str:
    parts = [f"{k}={v}" for k, v in constants.items()]
    if bounds:
        parts.append("lb=" + re.sub(r"[^A-Za-z0-9_]+", "_", bounds).strip("_"))
    parts += [re.sub(r"[^A-Za-z0-9_.=+-]+", "_", f).strip("_") for f in flags]
    return ",".join(parts)[:80] or "variant"


# ---- building a variant ----------------------------------------------------------------------------

def build_variant(expert: KernelState, variant: Variant) -> Built:
    """Apply the variant through the transforms; a refusal is a Built with a reason, not an exception."""
    steps: list[dict[str, Any]] = []
    notes = []
    state = expert
    mode = ""
    try:
        if variant.constants:
            state, mode = _set_constants(state, variant.constants, steps)
        if variant.launch_bounds:  # after the constants: removing the attribute is checked at the new size
            state = _replace_launch_bounds(state, variant.launch_bounds, steps)
        if variant.nvcc_flags:
            plan = LaunchPlan.from_dict({**state.plan.to_dict(),
                                         "nvcc_flags": [*state.plan.nvcc_flags, *variant.nvcc_flags]})
            state = KernelState(source=state.source, plan=plan)
            if any(f.startswith("-maxrregcount") for f in variant.nvcc_flags) and "__launch_bounds__" in state.source:
                notes.append("nvcc ignores -maxrregcount for a kernel with __launch_bounds__: "
                             "cap registers with launch_bounds = \"THREADS, 2\" instead")
    except NotApplicable as exc:
        return Built(variant, None, tuple(steps), reason=str(exc), notes=tuple(notes))
    except KLineageError as exc:
        return Built(variant, None, tuple(steps), reason=f"{type(exc).__name__}: {exc}", notes=tuple(notes))
    return Built(variant, state, tuple(steps), mode=mode, notes=tuple(notes))


def _record(rewrite: Rewrite) -> dict[str, Any]:
    return {"transform": rewrite.transform, "direction": rewrite.direction.value, "key": rewrite.anchor.key,
            "function": rewrite.anchor.function, "note": rewrite.note, "carrier": rewrite.carrier}


def _replace_launch_bounds(state: KernelState, arguments: str, steps: list[dict[str, Any]]) -> KernelState:
    transform = get_transform("launch_bounds")
    entries = {launch.entry.split("<")[0].strip() for launch in state.plan.launches}
    parsed = cp.parse(state.source)
    kernels = [f for f in cp.functions(parsed) if f.is_kernel and f.name in entries]
    if not kernels:
        raise NotApplicable(f"launch_bounds: no launched __global__ function among {sorted(entries)}")
    for function in kernels:
        if function.launch_bounds and "".join(",".join(function.launch_bounds).split()) == "".join(arguments.split()):
            raise NotApplicable(f"launch_bounds: {function.name} already has __launch_bounds__({arguments})")
    for anchor in [a for a in transform.find(state) if a.function in entries]:
        rewrite = transform.backward(state, anchor)
        steps.append(_record(rewrite))
        state = rewrite.state
    for function in kernels:
        rewrite = transform.forward(state, Anchor(function.name, "function", f"launch_bounds({arguments})"))
        steps.append(_record(rewrite))
        state = rewrite.state
    return state


def _set_constants(state: KernelState, wanted: dict[str, int], steps: list[dict[str, Any]]) -> tuple[KernelState, str]:
    """One tile_constant rewrite per constant, in the first order the transform accepts each step;
    constants that no order can change one at a time are changed together (the joint step)."""
    transform = get_transform("tile_constant")
    before = state
    one_by_one = 0
    pending = dict(wanted)
    refusals: dict[str, str] = {}
    progress = True
    while pending and progress:
        progress = False
        for name, value in list(pending.items()):
            try:
                rewrite = transform.backward(state, Anchor("<file>", "declaration", f"{name}={value}"))
            except NotApplicable as exc:
                refusals[name] = str(exc)
                continue
            steps.append(_record(rewrite))
            state = rewrite.state
            one_by_one += 1
            del pending[name]
            refusals.pop(name, None)
            progress = True
    if not pending:
        return state, "sequential"
    # No single remaining change keeps the kernel's asserts: make them together, and hold the result
    # to the transform's own check from `before` (the state before any constant changed).
    finder = getattr(tile_constant, "_constants", None)
    if finder is None:
        raise NotApplicable("; ".join(refusals[n] for n in pending))
    parsed = cp.parse(state.source)
    sites = {c.name: c for c in finder(parsed)}
    if any(name not in sites for name in pending):
        raise NotApplicable("; ".join(refusals[n] for n in pending))
    data = parsed.data
    for name in sorted(pending, key=lambda n: sites[n].digits[0], reverse=True):
        start, end = sites[name].digits
        data = data[:start] + str(pending[name]).encode() + data[end:]
    source = data.decode("utf-8")
    try:
        for name in wanted:
            tile_constant.check(before, source, name)
    except NotApplicable as exc:
        one_at_a_time = "; ".join(f"{refusals[n]}" for n in pending)
        raise NotApplicable(f"{exc} (changed together; one at a time: {one_at_a_time})") from None
    old = {name: sites[name].value for name in pending}
    key = ",".join(f"{name}={value}" for name, value in pending.items())
    rewrite = transform.rewrite(state, Anchor("<file>", "declaration", key), Direction.BACKWARD, source,
                                carrier={"constants": {n: {"old": old[n], "new": v} for n, v in pending.items()}},
                                note="together: " + ", ".join(f"{n}: {old[n]} -> {v}" for n, v in pending.items()))
    steps.append(_record(rewrite) | {"joint": True})
    return rewrite.state, "sequential+joint" if one_by_one else "joint"


# ---- resources and occupancy -----------------------------------------------------------------------

def occupancy(registers: int, threads: int, shared: int) -> dict[str, Any]:
    """CTAs of one kernel resident per SM on sm_90, and what limits them."""
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(max(registers, 1) * 32 / SM90["register_unit"]) * SM90["register_unit"]
    limits = {
        "registers": (SM90["registers"] // per_warp) // warps if warps else 0,
        "threads": SM90["max_threads"] // threads if threads else 0,
        "shared": SM90["shared_bytes"] // (shared + SM90["shared_reserved_per_block"]),
        "blocks": SM90["max_blocks"],
    }
    ctas = min(limits.values())
    return {"ctas_per_sm": ctas, "limited_by": sorted(k for k, v in limits.items() if v == ctas), "limits": limits,
            "warps_per_sm": ctas * warps}


def compile_facts(state: KernelState, compiled: CompileResult | dict, probe, case: str,
                  device: devices.DeviceSpec = devices.DEFAULT) -> dict[str, Any]:
    """Registers, spills, shared memory, and occupancy of the first launch on `case`."""
    if isinstance(compiled, dict):
        compiled = CompileResult.from_dict(compiled)
    launch = state.plan.launches[0]
    resources = compiled.resources_for(launch.entry)
    facts: dict[str, Any] = {
        "registers": resources.registers, "spill_store_bytes": resources.spill_store_bytes,
        "spill_load_bytes": resources.spill_load_bytes, "stack_bytes": resources.stack_bytes,
        "static_shared_bytes": resources.shared_bytes, "barriers": resources.barriers,
        "compile_seconds": compiled.seconds,
    }
    params = dict(probe.info.case(case).params)
    env = {**params, **state.constants, **device.facts()}
    buffers = set(probe.inputs) | {o.name for o in probe.info.outputs} | {s.name for s in state.plan.scratch}
    try:
        resolved = resolve(state.plan, env, buffers)[0]
    except DocumentError as exc:
        return facts | {"launch_error": str(exc)}
    threads = resolved.block[0] * resolved.block[1] * resolved.block[2]
    shared = resolved.shared + resources.shared_bytes
    ctas = resolved.grid[0] * resolved.grid[1] * resolved.grid[2]
    occ = occupancy(resources.registers, threads, shared)
    slots = occ["ctas_per_sm"] * device.num_sms
    facts |= {"case": case, "grid": list(resolved.grid), "block": list(resolved.block), "threads": threads,
              "ctas": ctas, "shared_bytes": shared, **occ,
              "waves": round(ctas / slots, 3) if slots else None}
    return facts


def sass_facts(features: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in (features.get("sass") or {}).get("counts", []):
        counts[item["name"]] = counts.get(item["name"], 0) + int(item["count"])
    return {name: counts.get(name, 0) for name in ("hmma", "ldsm", "ldgsts", "ldl", "stl", "bar_sync")}


# ---- gating ------------------------------------------------------------------------------------------

def precompile(built: list[Built], workers: int | None = None) -> dict[str, float]:
    """Compile every buildable variant at once into the gate's compile cache (run_gate then finds it)."""
    states = [b for b in built if b.state is not None]
    workers = workers or max(1, min(len(states), (os.cpu_count() or 2) // 2, 8))
    seconds: dict[str, float] = {}

    def one(b: Built) -> None:
        started = time.monotonic()
        try:
            compile_kernel(b.state, cache_dir=config.cache_dir())
        except Exception:  # the gate's own compile stage reports it, with its reason
            pass
        seconds[b.variant.name] = time.monotonic() - started

    if states:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, states))
    return seconds


def gate_row(sweep: Sweep, built: Built, *, mode: GateMode, cache: GateCache, record: bool,
             probe, expert_row: dict | None) -> tuple[dict[str, Any], Verdict | None]:
    """One variant through the gate: a row, whatever happens."""
    from klineage.gate.pipeline import run_gate

    variant = built.variant
    row: dict[str, Any] = {"variant": variant.to_dict(), "rewrite": {"mode": built.mode, "steps": list(built.steps)},
                           "notes": list(built.notes), "status": None, "reason": None, "message": ""}
    started = time.monotonic()
    if built.state is None:
        row |= {"status": "not_applicable", "reason": "not_applicable", "message": built.reason,
                "seconds": time.monotonic() - started}
        return row, None
    row["kernel"] = {"name": built.state.name, "fingerprint": built.state.fingerprint}
    against = sweep.expert if (sweep.against_expert and mode is GateMode.GPU and not variant.is_expert) else None
    try:
        verdict = run_gate(sweep.problem_path, built.state, against=against, policy=sweep.policy, mode=mode,
                           cache=cache, record=record)
    except Exception as exc:  # a harness failure is a row too: the sweep goes on
        row |= {"status": "error", "reason": "harness", "message": f"{type(exc).__name__}: {exc}"[:2000],
                "seconds": time.monotonic() - started}
        try:  # what the compile cache knows about it still belongs in the row
            compiled = compile_kernel(built.state, cache_dir=config.cache_dir())
            if compiled.ok:
                row["compile"] = compile_facts(built.state, compiled, probe, probe.info.headline)
        except Exception:
            pass
        return row, None
    row |= {"status": verdict.status.value, "reason": verdict.reason.value if verdict.reason else None,
            "message": verdict.describe(width=400) if verdict.status not in (Status.PASSED, Status.COMPILED) else "",
            "cases": list(verdict.cases), "skipped_cases": verdict.domain.get("skipped", []),
            "verdict_key": verdict.provenance.get("key"), "gate_timings": verdict.timings,
            "seconds": time.monotonic() - started}
    if verdict.compile.get("ok"):
        case = probe.info.headline if probe.info.headline in verdict.cases else (verdict.cases or [""])[0]
        try:
            row["compile"] = compile_facts(built.state, verdict.compile, probe, case)
        except (DocumentError, KeyError, StopIteration) as exc:
            row["compile"] = {"error": f"{type(exc).__name__}: {exc}"}
        row["sass"] = sass_facts(verdict.features)
    elif verdict.compile:
        row["compile"] = {"error": (verdict.findings[0].message if verdict.findings else "")[:400]}
    if verdict.status is Status.ERROR:
        row["message"] = str(verdict.environment.get("error", ""))[-2000:]
    row["correctness"] = [correctness_summary(c) for c in verdict.correctness]
    row["timing"] = timing_facts(verdict.profile, variant.is_expert, expert_row)
    return row, verdict


def correctness_summary(record: dict[str, Any]) -> dict[str, Any]:
    """One case of the runner's correctness record: passed, seeds, the worst relative L2 error."""
    errors = [o.get("rel_l2") for seed in record.get("seeds", []) for o in (seed.get("outputs") or {}).values()]
    errors = [e for e in errors if isinstance(e, (int, float))]
    return {"case": record.get("case"), "kernel": record.get("kernel"), "passed": record.get("passed"),
            "seeds": [seed.get("seed") for seed in record.get("seeds", [])],
            "worst_rel_l2": max(errors) if errors else None}


def timing_facts(profile: dict[str, Any], is_expert: bool, expert_row: dict | None) -> dict[str, Any] | None:
    if not profile or "contenders" not in profile:
        return None
    contenders, ratios = profile["contenders"], profile.get("ratios", {})
    candidate = contenders["candidate"]
    medians = candidate.get("trial_medians_us") or [candidate["median_us"]]
    facts = {"case": profile.get("case"), "median_us": candidate["median_us"], "p10_us": candidate["p10_us"],
             "p90_us": candidate["p90_us"], "samples": candidate["count"], "trial_medians_us": medians,
             "trial_spread": (max(medians) - min(medians)) / candidate["median_us"] if candidate["median_us"] else None,
             "vendor_us": contenders.get("vendor", {}).get("median_us"),
             "expert_us": contenders.get("baseline", {}).get("median_us"),
             "vs_vendor": ratios.get("vs_vendor", {}).get("overall"),
             "vs_vendor_trials": ratios.get("vs_vendor", {}).get("per_trial"),
             "vs_expert": None, "vs_expert_trials": None, "vs_expert_how": None,
             "roofline_fraction": (profile.get("roofline") or {}).get("fraction", {}).get("candidate")}
    if "vs_baseline" in ratios:
        facts |= {"vs_expert": ratios["vs_baseline"]["overall"], "vs_expert_trials": ratios["vs_baseline"]["per_trial"],
                  "vs_expert_how": "paired"}
    elif is_expert:
        facts |= {"vs_expert": 1.0, "vs_expert_how": "itself"}
    else:
        expert_vendor = ((expert_row or {}).get("timing") or {}).get("vs_vendor")
        if expert_vendor and facts["vs_vendor"]:
            facts |= {"vs_expert": facts["vs_vendor"] / expert_vendor, "vs_expert_how": "via vendor"}
    return facts


# ---- the estimate ------------------------------------------------------------------------------------

def recorded_basis(kernel_name: str) -> dict[str, Any] | None:
    """The newest recorded GPU verdict of the kernel (any version) with stage timings."""
    newest = None
    folders = {config.recorded_dir(), REPO / "recorded"}
    for folder in folders:
        for path in VerdictStore(folder).files():
            try:
                data = read_verdict_file(path)
            except (OSError, DocumentError):
                continue
            if data.get("kernel", {}).get("name") != kernel_name or "run" not in data.get("timings", {}):
                continue
            if newest is None or data["provenance"]["created"] > newest["provenance"]["created"]:
                newest = data
    return newest


def estimate(sweep: Sweep, count: int, compile_only: bool) -> dict[str, Any]:
    """Seconds the sweep should take, from the stage timings of the kernel's recorded verdict."""
    # nvcc takes ~1.5 s per variant (both targets at once) on each worker; the problem's probe, once, ~5 s.
    compile_s = 1.5 * math.ceil(count / max(1, min(8, (os.cpu_count() or 2) // 2))) + 5.0
    if compile_only:
        return {"variants": count, "per_variant_s": 1.0, "gpu_s": 0.0, "total_s": compile_s + count,
                "basis": "compile only: nvcc and SASS features, no GPU"}
    basis = recorded_basis(sweep.expert.name)
    policy = sweep.policy
    if basis is None:
        per = FALLBACK_GATE_S
        how = f"no recorded verdict of {sweep.expert.name}: {FALLBACK_GATE_S:.0f} s per variant assumed"
    else:
        t, old = basis["timings"], basis["policy"]
        correctness = t.get("run.correctness", 0.0) * policy.seeds / max(1, old.get("seeds", 3))
        profile = t.get("run.profile", 0.0) * policy.input_sets / max(1, old.get("input_sets", 3))
        profile *= 1.3 if sweep.against_expert else 1.0
        fixed = t["run"] - t.get("run.correctness", 0.0) - t.get("run.profile", 0.0)
        if not policy.timing:
            profile = 0.0
        per = fixed + correctness + profile + t.get("static", 0.3) + t.get("features", 0.8)
        how = (f"stage timings of the recorded verdict of {sweep.expert.name} ({basis['provenance']['created']}, "
               f"{old.get('seeds')} seeds, {old.get('input_sets', 3)} input sets), scaled to this policy")
    return {"variants": count, "per_variant_s": round(per, 1), "gpu_s": round(per * count, 1),
            "total_s": round(per * count + compile_s, 1), "basis": how}


# ---- the sweep ---------------------------------------------------------------------------------------

def provenance(sweep: Sweep, measured: Verdict | None, mode: GateMode) -> dict[str, Any]:
    from gate_suite import provenance as gate_provenance  # bench/gate_suite.py: gpu, driver, torch, commit
    from klineage.toolchain import find_toolchain

    found = gate_provenance(measured)
    if found.get("toolchain") in (None, "unknown"):
        try:
            found["toolchain"] = find_toolchain().key
        except KLineageError:
            pass
    if measured is None and mode is GateMode.COMPILE_ONLY:
        found["gpu"] = "none (compile only)"
    return found | {"written_by": "bench/carrier_sweep.py", "mode": mode.value, "sweep": sweep.path,
                    "sweep_sha256": sweep.sha256, "problem": sweep.problem, "kernel": sweep.kernel,
                    "expert_fingerprint": sweep.expert.fingerprint, "policy": sweep.policy.to_dict(),
                    "against_expert": sweep.against_expert, "device_limits": SM90,
                    "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}


def run_sweep(sweep: Sweep, *, out: Path | None, compile_only: bool = False, max_variants: int | None = None,
              only: list[str] | None = None, record: bool = False, budget_s: float | None = None,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    from klineage.gate import execute

    mode = GateMode.COMPILE_ONLY if compile_only else GateMode.GPU
    variants = list(sweep.variants)
    if only:
        missing = sorted(set(only) - {v.name for v in variants})
        if missing:
            raise DocumentError(sweep.path, f"no variants named {missing}")
        variants = [v for v in variants if v.name in only]
    left_out = []
    if max_variants is not None and len(variants) > max_variants:
        left_out = [v.name for v in variants[max_variants:]]
        variants = variants[:max_variants]
    guess = estimate(sweep, len(variants), compile_only)
    say(f"sweep {sweep.path}: {sweep.kernel} on {sweep.problem}, {len(variants)} variant(s)"
        + (f" ({len(left_out)} left out by --max-variants)" if left_out else "") + f", {mode.value}")
    say(f"estimate: {guess['variants']} x ~{guess['per_variant_s']} s = ~{guess['gpu_s']} s of GPU time, "
        f"~{guess['total_s']} s in all ({guess['basis']})")

    if mode is GateMode.GPU:
        execute.gpu_name()  # no GPU: say so once, before anything is built
    probe = execute.probe_problem(sweep.problem_path, config.cache_dir())
    built = [build_variant(sweep.expert, v) for v in variants]
    clock = time.monotonic()
    precompile(built)
    say(f"built and compiled {sum(b.state is not None for b in built)} of {len(built)} variant(s) "
        f"in {time.monotonic() - clock:.1f} s")

    scratch = Path(tempfile.mkdtemp(prefix="klineage-sweep-"))
    cache = GateCache(scratch / "verdicts", config.recorded_dir() if record else None)
    rows: list[dict[str, Any]] = []
    measured: Verdict | None = None
    expert_row = None
    started = time.monotonic()

    def document() -> dict[str, Any]:
        return {"provenance": provenance(sweep, measured, mode), "description": sweep.description,
                "estimate": guess, "seconds": round(time.monotonic() - started, 1), "left_out": left_out,
                "rows": rows}

    try:
        for i, b in enumerate(built):
            spent = time.monotonic() - started
            if budget_s is not None and i and spent + guess["per_variant_s"] > budget_s:
                left_out.extend(x.variant.name for x in built[i:])
                say(f"budget: {spent:.0f} s spent of {budget_s:.0f} s; left out {len(built) - i} variant(s)")
                break
            row, verdict = gate_row(sweep, b, mode=mode, cache=cache, record=record, probe=probe,
                                    expert_row=expert_row)
            row["index"] = i
            rows.append(row)
            if b.variant.is_expert:
                expert_row = row
            if verdict is not None and verdict.environment.get("gpu"):
                measured = verdict
            say(progress_line(i, len(built), row))
            if out is not None:
                write(out, document())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    final = document()
    if out is not None:
        write(out, final)
    return final


def write(out: Path, document: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, out)


# ---- output ------------------------------------------------------------------------------------------

def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def progress_line(i: int, total: int, row: dict[str, Any]) -> str:
    name = row["variant"]["name"]
    c = row.get("compile") or {}
    facts = ""
    if "registers" in c:
        facts = (f" [regs {c['registers']}, spill {c['spill_store_bytes'] + c['spill_load_bytes']} B, "
                 f"smem {c.get('shared_bytes', c['static_shared_bytes']) / 1024:.1f} KiB, "
                 f"{c.get('ctas_per_sm', '?')} CTA/SM, {c.get('ctas', '?')} CTAs]")
    t = row.get("timing") or {}
    timing = ""
    if t.get("median_us") is not None:
        timing = (f" {t['median_us']:.1f} us, {_ratio(t['vs_vendor'])} vendor, {_ratio(t['vs_expert'])} expert"
                  f" ({t['vs_expert_how'] or '-'})")
    why = "" if row["status"] in ("passed", "compiled") else f" -- {row['reason']}: {row['message'][:300]}"
    return f"[{i + 1}/{total}] {name}: {row['status']}{timing}{facts} in {row.get('seconds', 0):.1f} s{why}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'#':>2} {'variant':30} {'regs':>4} {'spill':>5} {'smem KiB':>8} {'CTA/SM':>6} {'CTAs':>5} "
            f"{'waves':>5} {'status':14} {'median us':>9} {'vs vendor':>9} {'vs expert':>9} {'spread':>6}")
    lines = [head, "-" * len(head)]
    for row in rows:
        c = row.get("compile") or {}
        t = row.get("timing") or {}
        regs = str(c.get("registers", "-"))
        spill = str(c["spill_store_bytes"] + c["spill_load_bytes"]) if "registers" in c else "-"
        smem = f"{c['shared_bytes'] / 1024:.1f}" if "shared_bytes" in c else "-"
        waves = f"{c['waves']:.2f}" if c.get("waves") is not None else "-"
        median = f"{t['median_us']:.1f}" if t.get("median_us") is not None else "-"
        spread = f"{t['trial_spread']:.1%}" if t.get("trial_spread") is not None else "-"
        status = row["status"] if row["status"] in ("passed", "compiled") else f"{row['status']}"
        lines.append(f"{row.get('index', 0):>2} {row['variant']['name'][:30]:30} {regs:>4} {spill:>5} {smem:>8} "
                     f"{str(c.get('ctas_per_sm', '-')):>6} {str(c.get('ctas', '-')):>5} {waves:>5} {status[:14]:14} "
                     f"{median:>9} {_ratio(t.get('vs_vendor')):>9} {_ratio(t.get('vs_expert')):>9} {spread:>6}")
    reasons = [f"  {row['variant']['name']}: {row['reason']}: {' '.join(row['message'].split())[:400]}"
               for row in rows if row["status"] not in ("passed", "compiled")]
    notes = [f"  {row['variant']['name']}: {note}" for row in rows for note in row.get("notes", [])]
    if reasons:
        lines += ["why not:", *reasons]
    if notes:
        lines += ["notes:", *notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", help="sweep file (TOML), e.g. bench/sweeps/conv2d.toml")
    parser.add_argument("--out", help="where to write the results JSON (needed unless --estimate-only)")
    parser.add_argument("--compile-only", action="store_true", help="build and compile every variant; run nothing")
    parser.add_argument("--max-variants", type=int, help="gate at most this many variants (the expert counts)")
    parser.add_argument("--only", help="comma-separated variant names (the expert is named 'expert')")
    parser.add_argument("--budget-s", type=float, help="start no variant that the estimate says would end past this")
    parser.add_argument("--record", action="store_true", help="also store the verdicts in the recorded store")
    parser.add_argument("--estimate-only", action="store_true", help="print the GPU-time estimate and stop")
    args = parser.parse_args(argv)
    if args.max_variants is not None and args.max_variants < 1:
        parser.error("--max-variants must be at least 1")
    if not args.out and not args.estimate_only:
        parser.error("--out is required")
    try:
        sweep = load_sweep(args.sweep)
        only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
        if args.estimate_only:
            count = len(only) if only else len(sweep.variants)
            count = min(count, args.max_variants or count)
            guess = estimate(sweep, count, args.compile_only)
            print(f"{sweep.path}: {guess['variants']} variant(s) x ~{guess['per_variant_s']} s = "
                  f"~{guess['gpu_s']} s of GPU time, ~{guess['total_s']} s in all ({guess['basis']})")
            return 0
        result = run_sweep(sweep, out=Path(args.out), compile_only=args.compile_only, max_variants=args.max_variants,
                           only=only, record=args.record, budget_s=args.budget_s)
    except KLineageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table(result["rows"]))
    print(f"{result['seconds']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
