"""The committed measurements under bench/results, summarised for the home page with provenance.

Each file is a JSON object with a `provenance` block (GPU or machine, commit, date, the script
that wrote it) and `rows`. Known files get a headline and a small table; any other file is listed
with its provenance. A file that cannot be read is listed as such instead of breaking the page.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.urls import reverse

from klineage.config import GateMode
from klineage.optimize.result import CodeCheck, better_unconditioned, library_run
from klineage.optimize.strategies import DEFAULT_ORDERING, DEFAULT_STRATEGY, Ordering, Strategy
from klineage.skills.card import DEFAULT_REQUIRED_RATIO
from klineage.skills.library import bundled_library
from klineage.skills.when import MIN_WHEN_CASES, REPEATABILITY
from klineage.transforms._row_vectors import WIDTH
from klineage.transforms.uncache_row import CACHE
from skills_app.budget_curve import budget_curve
from skills_app.models import SkillLibrary


def results_dir() -> Path:
    return Path(getattr(settings, "KLINEAGE_EVIDENCE_DIR", Path(settings.BASE_DIR) / "bench" / "results"))


@dataclass
class Evidence:
    name: str  # file name
    title: str
    headline: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    where: str = ""  # GPU or machine
    commit: str = ""
    date: str = ""
    written_by: str = ""
    sort_key: str = ""
    error: str = ""
    chart: dict[str, Any] | None = None  # skills.json: `skills_chart`, drawn by templates/_skills_chart.html
    curve: dict[str, Any] | None = None  # transfer: `budget_curve`, drawn by templates/_budget_curve.html
    link: dict[str, str] | None = None  # {"url", "label"}: where the dashboard shows what the file is about

    @property
    def provenance_label(self) -> str:
        parts = [p for p in (f"on {self.where}" if self.where else "", f"commit {self.commit}" if self.commit else "",
                             self.date) if p]
        return ", ".join(parts)


def load_all(folder: Path | None = None) -> list[Evidence]:
    """Every results file, newest first."""
    folder = folder or results_dir()
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            found.append(_summarise(path.name, data))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            found.append(Evidence(path.name, path.stem, error=f"unreadable: {type(exc).__name__}: {exc}"))
    return sorted(found, key=lambda e: e.sort_key, reverse=True)


def load(name: str, folder: Path | None = None) -> dict[str, Any] | None:
    path = (folder or results_dir()) / name
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _summarise(name: str, data: dict[str, Any]) -> Evidence:
    prov = data.get("provenance") or {}
    machine = prov.get("machine") or {}
    where = prov.get("gpu") or (f"{machine.get('cpu', '')} ({machine.get('cpus', '?')} CPUs)" if machine else "")
    date = str(prov.get("date", ""))
    evidence = Evidence(name, name.removesuffix(".json").replace("_", " "), where=str(where),
                        commit=str(prov.get("git_commit", ""))[:12], date=_format_date(date),
                        written_by=str(prov.get("written_by", "")), sort_key=date)
    summarise = _SUMMARIES.get(name) or (_sweep if name.startswith("sweep-") else None)
    if summarise:
        summarise(evidence, data)
    else:
        evidence.headline = f"{len(data.get('rows', []))} rows"
    return evidence


def _adversarial(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Adversarial suite"
    e.headline = (f"{data.get('rejected', '?')}/{data.get('total', '?')} rejected, "
                  f"{data.get('matching_reason', '?')} with the expected reason")
    e.columns = ["kernel", "expected", "gate's reason", "matches"]
    e.rows = [[r["kernel"]["name"], r.get("expected", ""), r.get("reason") or r.get("status", ""),
               "yes" if r.get("matches") else "NO"] for r in data.get("rows", [])]


def _example(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Example speedups"
    rows = data.get("rows", [])
    e.headline = "; ".join(f"{r['kernel']['name']} {r['ratio']:.2f}x vs {r['vs']}" for r in rows
                           if isinstance(r.get("ratio"), (int, float)))
    e.columns = ["kernel", "case", "vs", "speedup", "median µs", "roofline"]
    e.rows = [[r["kernel"]["name"], r.get("case", ""), r.get("vs", ""), _num(r.get("ratio"), "{:.2f}x"),
               _num(r.get("median_us"), "{:.1f}"), _num(r.get("roofline_fraction"), "{:.0%}")] for r in rows]


def _gate_cost(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Gate cost"
    rows = data.get("rows", [])
    e.headline = ", ".join(f"{r['kernel']['name']}: full gate {r.get('full_gate_s', 0):.1f} s, "
                           f"cached verdict {1000 * r.get('cached_verdict_s', 0):.0f} ms" for r in rows)
    warm = [w for w in (data.get("warm_runner") or {}).get("summary", []) if w.get("warm_steady_s") is not None]
    if warm:  # bench/gate_cost.py: a stream of candidates through one runner against a new runner for each
        e.headline += "; warm runner, per candidate after its first: " + ", ".join(
            f"{w['workload']} {w['policy']} {w['warm_steady_s']:.1f} s against {w['cold_s']:.1f} s cold "
            f"({w['steady_over_cold']:.2f}x)" for w in warm)
    e.columns = ["kernel", "cold compile s", "full gate s", "GPU run s", "cached verdict ms"]
    e.rows = [[r["kernel"]["name"], _num(r.get("cold_compile_s"), "{:.2f}"), _num(r.get("full_gate_s"), "{:.1f}"),
               _num(r.get("gpu_run_s"), "{:.1f}"),
               _num(1000 * r["cached_verdict_s"] if isinstance(r.get("cached_verdict_s"), (int, float)) else None,
                    "{:.0f}")] for r in rows]


def _jobs(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Job queue under load"
    e.headline = (f"{data.get('throughput_jobs_per_s', '?')} jobs/s; lost {data.get('lost', '?')}, "
                  f"duplicated {data.get('duplicated', '?')}")
    e.columns = ["database", "scenario", "jobs", "workers", "jobs/s", "lost", "duplicated"]
    e.rows = [[r.get("database", ""), r.get("scenario", ""), r.get("jobs", ""), r.get("workers", ""),
               r.get("throughput_jobs_per_s", ""), r.get("lost", ""), r.get("duplicated", "")]
              for r in data.get("rows", [])]


def _web_perf(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Dashboard page times"
    summary = data.get("summary") or {}
    e.headline = (f"library p95 {_num(summary.get('library_p95_ms'), '{:.0f}')} ms over "
                  f"{_num(summary.get('cards'), '{:,}')} cards; {_num(summary.get('lineage_p95_ms'), '{:.0f}')} ms "
                  f"for a 40-step lineage")
    e.columns = ["page", "p50 ms", "p95 ms"]
    e.rows = [[r.get("page", ""), _num(r.get("p50_ms"), "{:.1f}"), _num(r.get("p95_ms"), "{:.1f}")]
              for r in data.get("rows", [])]


def _corpus(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Expert corpus vs the vendor path"
    rows = [r for r in data.get("rows", []) if isinstance(r.get("ratio"), (int, float))]
    met = [r for r in rows if r.get("target") is not None and r.get("meets_target")]
    targeted = [r for r in rows if r.get("target") is not None]
    e.headline = f"{len(met)} of {len(targeted)} targets met" + "".join(
        f"{', ' if i else ': '}{r['kernel']['name']} {r['ratio']:.2f}x" for i, r in enumerate(targeted))
    e.columns = ["kernel", "vs vendor", "target", "roofline", "median µs", "vendor µs"]
    e.rows = [[r["kernel"]["name"], _num(r.get("ratio"), "{:.3f}x"), _num(r.get("target"), "{:.2f}x"),
               _num(r.get("roofline_fraction"), "{:.0%}"), _num(r.get("median_us"), "{:.1f}"),
               _num(r.get("vendor_median_us"), "{:.1f}")] for r in rows]


def _skills(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Skills"
    admission = data.get("admission_rate") or {}
    parts = [f"admission {admission.get('admitted', '?')}/{admission.get('cards', '?')} cards "
             f"({_num(admission.get('value'), '{:.0%}')})" if admission.get("value") is not None
             else "admission unknown"]
    for key, label in (("roundtrip_min_vs_expert", "roundtrip"), ("vs_unconditioned_geomean", "vs unconditioned")):
        value = (data.get(key) or {}).get("value")
        parts.append(f"{label} {_num(value, '{:.2f}x')}" if value is not None else f"{label} not measured")
    waste = data.get("library_wasted") or {}
    if waste.get("value") is not None:
        parts.append(f"library wasted {waste['wasted']}/{waste['evaluations']} evaluations ({waste['value']:.0%})")
    missing = len(data.get("not_run") or [])
    e.headline = "; ".join(parts) + (f" ({missing} workload(s) not fully run)" if missing else "")
    subset = data.get("measured_subset") or {}
    if subset.get("workloads"):  # what was measured, labelled as not the headline
        roundtrip, versus = ((subset.get(key) or {}).get("value")
                             for key in ("roundtrip_min_vs_expert", "vs_unconditioned_geomean"))
        e.headline += (f"; over the {len(subset['workloads'])} workload(s) measured: roundtrip "
                       f"{_num(roundtrip, '{:.2f}x')}, vs unconditioned {_num(versus, '{:.2f}x')}")
    # One row per workload: what each strategy bought at the same budget (start time / best time).
    strategies = ("library", "generated_only", "unconditioned_random", "unconditioned_greedy")
    e.columns = ["workload", "best / expert", *(s.replace("_", " ") for s in strategies), "library wasted"]
    e.rows = []
    for row in data.get("workloads") or []:
        ran = row.get("strategies") or {}
        e.rows.append(
            [
                row.get("lineage", "").split("@")[0],
                _num(row.get("vs_expert"), "{:.3f}"),
                *(_num((ran.get(s) or {}).get("speedup"), "{:.2f}x") for s in strategies),
                "{wasted}/{evaluations}".format(**ran["library"]) if "wasted" in ran.get("library", {}) else "–",
            ]
        )
    e.chart = skills_chart(data.get("workloads") or [])


def skills_chart(workloads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per workload that ran the library: its speedup over the naive end, the better unconditioned strategy's at
    the same budget (where skills_eval compared them: library speedup / vs_unconditioned), and a tick where the
    expert stands (library speedup / best-over-expert)."""
    measured = []
    for row in workloads:
        ran = row.get("strategies") or {}
        library = (ran.get("library") or {}).get("speedup")
        if not _positive(library):
            continue
        # skills_eval's own comparison: the better unconditioned run, only where it was at one budget
        versus = row.get("vs_unconditioned")
        unconditioned = library / versus if _positive(versus) else None
        expert = library / row["vs_expert"] if _positive(row.get("vs_expert")) else None
        measured.append((row.get("lineage", "").split("@")[0], library, unconditioned, expert))
    return speedup_chart(measured, kind="skills", tick="the expert",
                         caption="Speedup over each walk's naive end, log scale from 1×: the library (dark), the "
                                 "better unconditioned search at the same budget (light), the tick where the expert "
                                 "stands.")


def speedup_chart(measured: list[tuple[str, float, float | None, float | None]], *, kind: str, tick: str,
                  caption: str) -> dict[str, Any] | None:
    """(label, library, unconditioned, tick) speedups over a naive start on one log scale from 1x, drawn by
    templates/_skills_chart.html: two bars and a tick per label. SVG user units: a 320-wide view box, 46 units
    a label, the label above its two bars."""
    if not measured:
        return None
    span, height = 250, 46
    top = math.log(max(v for m in measured for v in m[1:] if v) * 1.3)

    def x(value: float) -> float:
        return round(span * math.log(max(value, 1.0)) / top, 1)

    bars = []
    for i, (label, library, unconditioned, expert) in enumerate(measured):
        y, at = i * height, x(expert) if expert else 0.0
        bars.append({"label": label, "label_y": y + 11, "y": y,  # values start right of their bar and the tick
                     "library": library, "library_w": x(library), "library_text_x": max(x(library), at) + 4,
                     "unconditioned": unconditioned, "unconditioned_w": x(unconditioned) if unconditioned else None,
                     "unconditioned_text_x": max(x(unconditioned), at) + 4 if unconditioned else None,
                     "expert": expert, "expert_x": x(expert) if expert else None})
    return {"bars": bars, "height": len(measured) * height + 4, "kind": kind, "tick": tick, "caption": caption}


STRATEGY_WORDS = {"library": "cards alone", "library_then_catalog": "the cards, then the catalog's forwards with the "
                                                                "budget they leave"}


def _transfer(e: Evidence, data: dict[str, Any]) -> None:
    prov = data.get("provenance") or {}
    library = str(prov.get("library") or "")
    # parts written before the strategy was recorded ran the cards alone
    strategy = prov.get("library_strategy", Strategy.LIBRARY.value)
    # a run drawing on another library than the bundled one, or not as optimize runs by default, says so: its
    # numbers answer for those cards, run that way
    named = [library] if library and not _bundled(library) else []
    default = strategy == DEFAULT_STRATEGY.value
    named += [] if default else [STRATEGY_WORDS.get(strategy, strategy)]
    # how the library's rounds were ordered (absent: a run from before orderings, as planned); a document not
    # ordered as optimize orders by default says so in its title, beside one that is
    ordering = str(prov.get("ordering") or Ordering.AS_PLANNED.value)
    named += [] if ordering == DEFAULT_ORDERING.value else [f"rounds {ordering.replace('_', ' ')}"]
    e.title = "Transfer to held-out operators" + (f" ({', '.join(named)})" if named else "")
    parts = prov.get("parts") or []  # a merged document: which commit measured which operators, and when
    if parts:
        e.commit = ", ".join(sorted({str(p.get("git_commit", ""))[:12] for p in parts if p.get("git_commit")}))
        latest = max((str(p.get("date", "")) for p in parts), default="")
        e.date, e.sort_key = _format_date(latest), latest
    measured = data.get("where_measured") or {}
    words = []
    for key, say in (("library_geomean_vs_naive", "library {value:.2f}x the naive kernel (geometric mean over {over})"),
                     ("vs_unconditioned_geomean", "{value:.2f}x the better unconditioned search at the same budget "
                                                  "(each search's own speedup; geometric mean over {over})"),
                     ("vs_unconditioned_paired_geomean", "{value:.2f}x the better unconditioned search's best "
                                                         "kernel, both paired with the naive kernel by the judging "
                                                         "gate (geometric mean over {over})"),
                     ("library_beats_eager_fraction", "faster than torch eager on {beats} of the {over} timed "
                                                      "against it")):
        where = measured.get(key) or {}
        n = len(where.get("operators") or [])
        if where.get("value") is None:
            words.append(f"{key.replace('_', ' ')}: not measured")
            continue
        # a number over fewer operators than the benchmark has says so: it is not the headline
        over = f"{n} operators" if n == where.get("of", n) else f"{n} operators (of {where['of']})"
        words.append(say.format(value=where["value"], over=over, beats=round(where["value"] * n)))
    said = STRATEGY_WORDS.get(strategy, strategy) + (": optimize's default" if default else "")
    # a replayed document's every verdict was measured on a GPU host earlier; say so, since no gate ran for it
    replayed = ", replayed off recorded verdicts" if prov.get("gate") == GateMode.REPLAY.value else ""
    ordered = f", rounds ordered {ordering.replace('_', ' ')}"
    # absent: a run from before the code check, which gated every candidate
    checked = (", a candidate running its best kernel's machine code not gated"
               if prov.get("code_check") == CodeCheck.SASS.value else ", every candidate gated (no code check)")
    e.headline = (f"strategy {strategy} ({said}){replayed}{ordered}, "
                  f"budget {prov.get('budget', '?')} gate evaluations{checked}, naive time / best time on each "
                  f"operator's headline case, paired, a ratio only where the timing settled: " + "; ".join(words))
    ratio = {(r["workload"], r["kernel"], r["vs"]): r.get("ratio") for r in data.get("rows", [])}
    e.columns = ["operator", "library vs naive", "library vs torch eager",
                 "better unconditioned vs naive (paired where the judging gate timed it)",
                 "library evaluations", "library steps"]
    e.rows, drawn = [], []
    for name, runs in sorted((data.get("runs") or {}).items()):
        library, searched = library_run(runs), better_unconditioned(runs)
        # where the judging gate paired the search's best with the naive kernel too, both bars come from it
        paired = ratio.get((name, "unconditioned_best", "naive"))
        better = paired if _positive(paired) else (searched["speedup"] if searched else None)
        naive_vs_eager = ratio.get((name, "naive", "eager"))  # eager time / naive time
        e.rows.append([name, _num(ratio.get((name, "library_best", "naive")), "{:.2f}x"),
                       _num(ratio.get((name, "library_best", "eager")), "{:.2f}x"), _num(better, "{:.2f}x"),
                       library.get("evaluations", "–"), " → ".join(library.get("steps") or []) or "–"])
        versus_naive = ratio.get((name, "library_best", "naive"))
        if _positive(versus_naive):
            # the scale starts at 1x: eager slower than the naive kernel gets no tick (the table has its ratio)
            eager = 1 / naive_vs_eager if _positive(naive_vs_eager) else None
            drawn.append((name, versus_naive, better, eager if eager and eager >= 1 else None))
    e.chart = speedup_chart(drawn, kind="transfer", tick="torch eager",
                            caption="Speedup over each held-out operator's naive kernel, log scale from 1×: the "
                                    "library's best as the judging gate paired it with the naive kernel (dark); the "
                                    "better unconditioned search at the same budget (light): its best kernel paired "
                                    "the same way where the judging gate timed it, else the speedup its own run "
                                    "measured; the tick where torch eager stands (where it was timed and is faster "
                                    "than the naive kernel).")
    points = data.get("by_budget") or []
    e.curve = budget_curve(points, caption=(
        "Geometric mean over the operators of each run's speedup over the naive kernel on the operator's headline "
        "case (its own: the product of its accepted steps' paired ratios, each timed in one process and settled) had "
        "it stopped after N gate evaluations, N from 1 (the naive kernel's own gate) to the budget; log scale from "
        "1×. " + _budget_words(points)))


def _budget_words(points: list[dict[str, Any]]) -> str:
    """Where the library's lead over the better unconditioned search is largest, and where it ends."""
    known = [p for p in points if isinstance(p.get("vs_unconditioned"), (int, float))]
    if not known:
        return ""
    best, last = max(known, key=lambda p: p["vs_unconditioned"]), known[-1]
    return (f"The library over the better search (per operator, then the geometric mean): "
            f"{best['vs_unconditioned']:.2f}× at {best['budget']} evaluations, {last['vs_unconditioned']:.2f}× at "
            f"{last['budget']}.")


def _bundled(library: str) -> bool:
    """Whether a run's recorded library path (relative to the checkout, or absolute) is the bundled library."""
    return (Path(settings.BASE_DIR) / library).resolve() == bundled_library().resolve()


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _multigpu(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Gate workers on several GPUs"
    rows = data.get("rows", [])
    best = max((r for r in rows if isinstance(r.get("efficiency"), (int, float))), key=lambda r: r["gpus"],
               default=None)
    e.headline = (
        f"{best['gpus']} GPUs at {best['efficiency']:.2f} efficiency ({_num(best.get('jobs_per_min'), '{:.1f}')}"
        f" jobs/min)"
        if best
        else f"{len(rows)} rows"
    )
    e.columns = ["run", "GPUs", "jobs/min", "efficiency", "failed", "ran twice"]
    e.rows = [[r.get("label", ""), r.get("gpus", ""), _num(r.get("jobs_per_min"), "{:.2f}"),
               _num(r.get("efficiency"), "{:.3f}"), r.get("failed", ""), r.get("ran_more_than_once", "")] for r in rows]


def _sweep(e: Evidence, data: dict[str, Any]) -> None:
    timed = [r for r in data.get("rows", []) if isinstance((r.get("timing") or {}).get("vs_vendor"), (int, float))]
    best = max(timed, key=lambda r: r["timing"]["vs_vendor"], default=None)
    e.title = f"Tuning sweep: {(best or {}).get('kernel', {}).get('name', e.name)}"
    e.headline = (f"best {best['variant']['name']}: {best['timing']['vs_vendor']:.3f}x vendor, "
                  f"{_num(best['timing'].get('vs_expert'), '{:.3f}x')} the expert ({len(timed)} variants timed)"
                  if best else f"{len(data.get('rows', []))} variants, none timed")
    e.columns = ["variant", "status", "median µs", "vs vendor", "vs expert"]
    e.rows = [[r["variant"]["name"], r.get("status", ""), _num((r.get("timing") or {}).get("median_us"), "{:.1f}"),
               _num((r.get("timing") or {}).get("vs_vendor"), "{:.3f}x"),
               _num((r.get("timing") or {}).get("vs_expert"), "{:.3f}x")] for r in data.get("rows", [])]


def _skills_replayed(e: Evidence, data: dict[str, Any]) -> None:
    _skills(e, data)
    e.title = "Skills: today's planner replayed on recorded H200 verdicts"
    e.chart = None  # its speedups are the GPU runs' (skills.json draws them); what it adds is the waste column


def _mma_peak(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "Ceiling of mma.sync beside cuBLAS"
    e.where = e.where or str(data.get("gpu", ""))  # the first file (session 8) has no provenance block
    rows = [r for r in data.get("rows", []) if isinstance(r.get("vs_cublas"), (int, float))]
    best = max(rows, key=lambda r: r["vs_cublas"], default=None)
    e.headline = (f"best {best['kernel']} {_num(best.get('tflops'), '{:.0f}')} TFLOP/s = {best['vs_cublas']:.3f}x "
                  f"cuBLAS ({_num(data.get('cublas_tflops'), '{:.0f}')} TFLOP/s on 4096^3 bf16)" if best else "no rows")
    e.columns = ["kernel", "CTAs / SM", "TFLOP/s", "vs cuBLAS"]
    e.rows = [[r["kernel"], r.get("ctas_per_sm", ""), _num(r.get("tflops"), "{:.1f}"), f"{r['vs_cublas']:.3f}x"]
              for r in rows]


def _preconditions(e: Evidence, data: dict[str, Any]) -> None:
    e.title = "When cards pay (per-case timings)"
    whens = data.get("whens") or {}
    pending = data.get("pending") or []
    e.headline = (f"of {data.get('admitted', '?')} admitted cards, {data.get('with_preconditions', '?')} with a timing "
                  f"precondition, {whens.get('uniform', data.get('uniform', '?'))} paid on every case measured, "
                  f"{whens.get('never', '?')} paid on none, {whens.get('mixed', '?')} mixed with nothing forced; "
                  f"{len(pending)} card(s) with a new precondition await admission; {_kept_out_words(data)} "
                  f"(a case paid where the forward step's "
                  f"paired time ratio to its parent reached {DEFAULT_REQUIRED_RATIO}x by more than the gate's "
                  f"{REPEATABILITY:.1%} run-to-run spread, per case of its problem); the admitted preconditions "
                  f"predict {_num(data.get('loo_accuracy'), '{:.2f}')} of their cases with each case left out and "
                  f"{_num(data.get('kernel_loo_accuracy'), '{:.2f}')} with each kernel left out: how they carry "
                  f"to a kernel not measured")
    e.columns = ["card", "transform", "status", "when", "holds on", "fails on", "leave-one-case-out",
                 "leave-one-kernel-out"]
    library = _stored_library((data.get("provenance") or {}).get("library"))
    stored = set(library.cards.values_list("short_id", flat=True)) if library else set()

    def card(short_id: str) -> Any:
        if short_id not in stored:
            return short_id
        return {"text": short_id, "url": reverse("skills:library-card", args=[library.name, short_id])}
    if library is not None:
        # the report's rows are the admitted cards (and those pending admission on a new precondition)
        e.link = {"url": library.get_absolute_url() + "?status=admitted",
                  "label": f"the admitted cards in the {library.name} library"}
    e.rows = [[card(r["card"]), r["transform"], r.get("status", "admitted"), r["sentence"], len(r["holds_on"]),
               len(r["fails_on"]), _num(r.get("loo_accuracy"), "{:.2f}"), _num(r.get("kernel_loo_accuracy"), "{:.2f}")]
              for r in [*data.get("rows", []), *pending]]


def _stored_library(provenance: Any) -> SkillLibrary | None:
    """The stored library a report was computed from: the one whose provenance is the report's, whole."""
    if not isinstance(provenance, dict) or not provenance:
        return None
    return SkillLibrary.objects.filter(provenance=provenance).order_by("name").first()


def _row_cache_when(e: Evidence, data: dict[str, Any]) -> None:
    """bench/row_cache_when.py: one forward step timed on every case of four operators, and its induced when."""
    e.title = "Where the 16-byte row cache pays (per case)"
    operators = [o for o in data.get("operators", []) if isinstance(o, dict)]
    cases = {c["case"]: c for o in operators for c in o.get("cases", [])}
    ratios = {(o["operator"], c["case"]): c for o in operators for c in o.get("cases", [])}
    timed = [c for c in ratios.values() if isinstance(c.get("ratio"), (int, float))]
    unsettled = [f"{o}:{c}" for (o, c), row in ratios.items() if row.get("settled") is False]
    when = data.get("when") or {}
    settled = "every timing settled" if not unsettled else f"not settled on {', '.join(unsettled)}"
    e.headline = (f"{when.get('sentence', 'no when induced')} (scalarize_row_cache's step against the scalar cache it "
                  f"came from: parent time / its time, paired, on {len(timed)} cases of {len(operators)} operators; "
                  f"{settled})")
    e.columns = ["case", "rows x cols", "path the flag takes", *(o["operator"] for o in operators)]
    for name, case in sorted(cases.items(), key=lambda item: (item[1]["params"].get("cols", 0), item[0])):
        rows, cols = case["params"].get("rows"), case["params"].get("cols")
        vector = isinstance(cols, int) and cols % WIDTH == 0 and cols <= 32 * CACHE  # the forward's flag, sizes only
        e.rows.append([name, f"{rows:,} x {cols:,}", "16-byte" if vector else "scalar",
                       *(_num(ratios.get((o["operator"], name), {}).get("ratio"), "{:.2f}x") for o in operators)])


def _kept_out_words(data: dict[str, Any]) -> str:
    kept = data.get("kept_out") or {}
    if not kept:
        return "no card kept out by its per-case effects"
    return (f"{sum(kept.values())} kept out because their per-case effects do not say where they pay: "
            + ", ".join(f"{n} {_KEPT_OUT.get(kind, kind)}" for kind, n in sorted(kept.items())))


_KEPT_OUT = {"never": "paid on none of their cases", "mixed": "paid on some with nothing saying where",
             "uniform": f"paid on all of fewer than {MIN_WHEN_CASES} cases"}

_SUMMARIES = {"adversarial.json": _adversarial, "preconditions.json": _preconditions, "example.json": _example,
              "gate_cost.json": _gate_cost,
              "jobs.json": _jobs, "web_perf.json": _web_perf, "corpus.json": _corpus, "skills.json": _skills,
              "skills-passed-over-replay.json": _skills_replayed, "mma-peak.json": _mma_peak,
              "multigpu.json": _multigpu, "transfer.json": _transfer, "transfer-h100.json": _transfer,
              "transfer-h100-planned.json": _transfer, "transfer-h100-code-check.json": _transfer,
              "transfer-h100-all.json": _transfer,
              "transfer-h200.json": _transfer, "transfer-h200-measured.json": _transfer,
              "transfer-library-run.json": _transfer,
              "transfer-cards-alone.json": _transfer, "row_cache_when.json": _row_cache_when}


def _num(value: Any, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "–"


def _format_date(value: str) -> str:
    try:
        return dt.datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return value
