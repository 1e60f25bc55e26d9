"""What the pages show of a verdict document, computed once in Python so templates stay plain.

Every function takes the engine's documents (plain dicts) and tolerates missing parts: a
compile-only verdict has no correctness, a static-check rejection has no compile record.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from klineage import devices
from klineage.errors import DocumentError

ROLE_ORDER = {"candidate": 0, "baseline": 1, "vendor": 2}
ROLE_LABELS = {"candidate": "this kernel", "baseline": "baseline", "vendor": "vendor"}
STAGES = ("probe", "static", "compile", "plan", "features", "run", "memcheck", "racecheck")


@dataclass
class CaseResult:
    case: str
    passed: bool
    seeds: int
    outputs: list[str]
    worst_abs: float | None  # None with `unbounded`: the worst element was never written or not finite
    worst_rel_l2: float | None
    unbounded: bool
    bad: int
    numel: int
    message: str


@dataclass
class Bar:
    role: str
    label: str
    median_us: float
    p10_us: float
    p90_us: float
    count: int
    fraction: float | None  # of the roofline floor
    speedup: float | None  # the candidate's speedup over this contender (>1: candidate faster)
    # Coordinates on a 0..100 scale, for the SVG.
    x_median: float = 0.0
    x_p10: float = 0.0
    x_p90: float = 0.0


@dataclass
class Timing:
    case: str
    bars: list[Bar]
    floor_us: float | None
    x_floor: float | None
    scale_us: float
    ratios: dict[str, dict[str, Any]] = field(default_factory=dict)


def case_results(document: dict[str, Any], role: str = "candidate") -> list[CaseResult]:
    """Per case: passed or not, seeds run, and the worst error over seeds and outputs."""
    results = []
    for record in document.get("correctness", []):
        if record.get("kernel", "candidate") != role:
            continue
        worst_abs = worst_rel = None
        unbounded = False
        bad = numel = 0
        message = ""
        names: list[str] = []
        worst_key = (-1.0, -1.0)
        for seed in record.get("seeds", []):
            for name, output in (seed.get("outputs") or {}).items():
                if name not in names:
                    names.append(name)
                bad += int(output.get("bad_count") or 0)
                numel += int(output.get("numel") or 0)
                abs_err, rel = output.get("max_abs_err"), output.get("rel_l2")
                failed = not output.get("passed", True)
                if failed and (abs_err is None or rel is None):
                    unbounded = True
                key = (float("inf") if abs_err is None and failed else float(abs_err or 0.0),
                       float(rel or 0.0))
                if key > worst_key:
                    worst_key, message = key, output.get("message", "")
                if abs_err is not None:
                    worst_abs = max(worst_abs or 0.0, float(abs_err))
                if rel is not None:
                    worst_rel = max(worst_rel or 0.0, float(rel))
        results.append(CaseResult(record.get("case", ""), bool(record.get("passed")), len(record.get("seeds", [])),
                                  names, worst_abs, worst_rel, unbounded, bad, numel, message))
    return results


def timing(document: dict[str, Any]) -> Timing | None:
    """The paired timing of the candidate against its baseline and the vendor path, scaled for bars."""
    profile = document.get("profile") or {}
    contenders = profile.get("contenders") or {}
    if not contenders:
        return None
    roofline = profile.get("roofline") or {}
    fractions = roofline.get("fraction") or {}
    candidate = contenders.get("candidate", {}).get("median_us")
    bars = []
    for role in sorted(contenders, key=lambda r: (ROLE_ORDER.get(r, 9), r)):
        stats = contenders[role]
        median = float(stats.get("median_us") or 0.0)
        speedup = median / candidate if candidate and role != "candidate" and median else None
        bars.append(Bar(role, ROLE_LABELS.get(role, role), median, float(stats.get("p10_us") or median),
                        float(stats.get("p90_us") or median), int(stats.get("count") or 0), fractions.get(role),
                        speedup))
    floor = roofline.get("floor_us")
    scale = max([b.p90_us for b in bars] + [b.median_us for b in bars] + [floor or 0.0]) * 1.05 or 1.0
    for bar in bars:
        bar.x_median, bar.x_p10, bar.x_p90 = (_scaled(v, scale) for v in (bar.median_us, bar.p10_us, bar.p90_us))
    return Timing(profile.get("case", ""), bars, floor, _scaled(floor, scale) if floor else None, scale,
                  profile.get("ratios") or {})


def resources(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Registers, shared memory, stack and spills per (arch, entry) from the compile record."""
    rows = []
    for arch, entries in sorted((document.get("compile") or {}).get("resources", {}).items()):
        for entry, figures in sorted(entries.items()):
            rows.append({"arch": arch, "entry": entry, **figures})
    return rows


def source_features(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Source features grouped by name, with the functions (loci) they occur in."""
    grouped: dict[str, list[str]] = {}
    for feature in (document.get("features") or {}).get("source", []):
        grouped.setdefault(feature.get("name", "?"), []).append(feature.get("locus", ""))
    return [{"name": name, "loci": sorted(set(loci))} for name, loci in sorted(grouped.items())]


def sass_features(document: dict[str, Any]) -> list[dict[str, Any]]:
    counts = (document.get("features") or {}).get("sass", {}).get("counts", [])
    top = max((c.get("count", 0) for c in counts), default=0) or 1
    return [{**c, "width": round(100 * c.get("count", 0) / top, 1)}
            for c in sorted(counts, key=lambda c: (c.get("locus", ""), -c.get("count", 0), c.get("name", "")))]


def stages(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The gate stages that ran, in order: outcome, the reasons found there, seconds taken."""
    timings = document.get("timings") or {}
    sanitizer = document.get("sanitizer") or {}
    found: dict[str, list[str]] = {}
    for finding in document.get("findings", []):
        stage = finding.get("stage", "")
        if stage == "correctness":
            stage = "run"
        elif stage == "sanitizer":
            stage = "racecheck" if finding.get("reason") == "race" else "memcheck"
        found.setdefault(stage, [])
        if finding.get("reason") not in found[stage]:
            found[stage].append(finding.get("reason", ""))
    names = [s for s in STAGES if s in timings or s in found]
    names += sorted(s for s in set(timings) | set(found) if s not in names)
    rows = []
    for stage in names:
        if found.get(stage):
            outcome = "rejected"
        elif stage in sanitizer:
            outcome = sanitizer[stage].get("status", "ran")
        elif stage in ("probe", "features"):
            outcome = "done"
        else:
            outcome = "passed"
        rows.append({"name": stage, "outcome": outcome, "reasons": found.get(stage, []),
                     "seconds": timings.get(stage)})
    return rows


def provenance(document: dict[str, Any], served_from: str = "recorded") -> dict[str, Any]:
    """Where a verdict comes from, with a one-line label: "recorded on GPU X, commit Y, date"."""
    prov = document.get("provenance") or {}
    parts = prov.get("key_parts") or {}
    environment = document.get("environment") or {}
    gpu = environment.get("gpu") or parts.get("gpu") or "an unknown GPU"
    commit = prov.get("git_commit") or "unknown"
    created = prov.get("created") or ""
    try:
        date = dt.datetime.fromisoformat(created).strftime("%Y-%m-%d %H:%M UTC") if created else "an unknown date"
    except ValueError:
        date = created
    verb = {"recorded": "recorded", "cache": "measured (from this machine's cache)",
            "measured": "measured"}.get(served_from, served_from)
    if parts.get("mode") == "compile":
        label = f"compiled only ({prov.get('origin', 'measured')}), commit {commit}, {date}"
    else:
        label = f"{verb} on {gpu}, commit {commit}, {date}"
    return {"label": label, "gpu": gpu, "commit": commit, "date": date, "created": created,
            "origin": prov.get("origin", ""), "key_parts": parts,
            "environment": {k: v for k, v in environment.items() if not isinstance(v, (list, dict))}}


def roofline_rows(info: dict[str, Any], gpu: str = devices.DEFAULT.name) -> list[dict[str, Any]]:
    """Per case: flops, minimum bytes, arithmetic intensity and the floor time on a GPU."""
    try:
        spec = devices.lookup(gpu)
    except DocumentError:
        spec = devices.DEFAULT
    peak = spec.flops_per_s.get(info.get("math", "fp32"), 0.0)
    rows = []
    for case in info.get("cases", []):
        figures = (info.get("roofline") or {}).get(case["name"], {})
        flops, nbytes = float(figures.get("flops", 0.0)), float(figures.get("bytes", 0.0))
        compute_us = flops / peak * 1e6 if peak else 0.0
        memory_us = nbytes / spec.dram_bytes_per_s * 1e6 if nbytes else 0.0
        rows.append({
            "case": case["name"], "params": case.get("params", {}), "headline": case["name"] == info.get("headline"),
            "flops": flops, "bytes": nbytes, "intensity": flops / nbytes if nbytes else None,
            "floor_us": max(compute_us, memory_us), "bound": "compute" if compute_us > memory_us else "memory",
        })
    return rows


def _scaled(value: float, scale: float) -> float:
    return round(max(0.0, min(100.0, 100.0 * value / scale)), 2) if scale else 0.0
