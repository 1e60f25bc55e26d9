"""Server-side page times of the skill library and a long lineage, through Django's test client.

    python bench/web_perf.py                    # 10,000 cards, 40 requests per page
    python bench/web_perf.py --cards 2000 --requests 20 --out /tmp/web_perf.json

A fresh SQLite database (in a temporary data dir) is migrated, then filled through the real
importers: the committed dry walk of row_softmax/warp_vec4 made into a GPU-style walk with a refused
unroll (tests/library_data.py), the cards induced from it and varied into --cards distinct valid
cards (ids derived from their content), and a 40-step lineage built from real states: five copies
of the dry walk's nine states (each copy's source tagged with a comment line, so each state is
distinct), chained, with every diff recomputed from the sources, and eight rejected attempts; every
other state of it carries a gate verdict that timed the vendor (a recorded one moved onto it), so the
page draws vendor bars for half its steps and says "not timed" for the rest.

Each page is requested a few times to warm up, then --requests times; the whole request (URL
resolution, queries, template rendering) is timed. Writes bench/results/web_perf.json with
p50/p95 per page, the library pages' p95 over all their requests, and the machine it ran on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "klineage_web.settings")

LIBRARY_TARGET_MS = 200
LINEAGE_TARGET_MS = 300
STEPS = 40


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 2)


def long_lineage(steps: int = STEPS) -> dict:
    """A valid lineage of `steps` accepted steps over real kernel states (see the module docstring)."""
    import copy

    from klineage.kernel import KernelState
    from klineage.launch import LaunchPlan
    from klineage.lineage import unified_diff
    from lineage_data import dry_walk

    dry = dry_walk()
    per_copy = len(dry["states"])
    states = []
    for i in range(steps + 1):
        state = copy.deepcopy(dry["states"][i % per_copy])
        state["source"] = f"// synthetic copy {i // per_copy}\n" + state["source"]
        state["fingerprint"] = KernelState(state["source"], LaunchPlan.from_dict(state["plan"])).fingerprint
        states.append(state)
    kernels = [KernelState(s["source"], LaunchPlan.from_dict(s["plan"])) for s in states]
    transitions = []
    for i in range(steps):
        within = i % per_copy < per_copy - 1
        template = copy.deepcopy(dry["transitions"][i % per_copy if within else 0])
        template.update(index=i, parent=states[i]["fingerprint"], child=states[i + 1]["fingerprint"],
                        backward_diff=unified_diff(kernels[i], kernels[i + 1], "parent", "child"),
                        forward_diff=unified_diff(kernels[i + 1], kernels[i], "child", "parent"))
        if not within:
            template.update(features_removed=[], features_added=[], note="synthetic: joins two copies of the walk")
        transitions.append(template)
    rejections = [{"step": step, "parent": states[step]["fingerprint"], "transform": "vectorize",
                   "category": "compile_error", "reason": "compile_error", "cases_failed": [],
                   "anchor": {"function": "softmax_row", "kind": "loop", "key": "i#0", "snippet": "for (...)"},
                   "evidence": {"message": "nvcc failed: identifier \"v4\" is undefined", "stage": "compile",
                                "case": "", "log": "kernel.cu(41): error: identifier \"v4\" is undefined",
                                "worst": {}, "audit": {}}} for step in range(0, steps, steps // 8)]
    dry.update(states=states, transitions=transitions, rejections=rejections,
               expert={"name": dry["expert"]["name"], "fingerprint": states[0]["fingerprint"]},
               limits={"max_steps": steps, "max_rejections": len(rejections)},
               termination={"kind": "step_limit", "message": f"stopped after {steps} steps (synthetic)"},
               stats={**dry["stats"], "accepted": steps, "rejected": len(rejections),
                      "gate_evaluations": steps + len(rejections) + 1})
    return dry


def fill(cards: int) -> dict:
    from django.core.management import call_command

    from library_data import library_document, many_cards, real_cards, timed_lineage
    from lineage_data import vendor_verdict
    from skills_app.card_import import import_library
    from skills_app.importer import import_lineage, store_verdict
    from skills_app.models import SkillCard

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    import_lineage(timed_lineage().to_dict())
    document = long_lineage()
    long, _ = import_lineage(document)
    for state in document["states"][::2]:
        store_verdict(*vendor_verdict(state["fingerprint"], state["plan"]["name"], 0.9, [0.89, 0.9, 0.91]))
    documents = [c.to_dict() for c in real_cards()] + many_cards(cards - 4)
    built = time.perf_counter()
    import_library(library_document(documents))
    imported = time.perf_counter()
    unroll = SkillCard.objects.filter(transform="unroll", risk_count__gt=0).order_by("card_id").first()
    return {"lineage": long.id, "card": unroll.short_id, "cards": SkillCard.objects.count(),
            "import_s": round(imported - built, 2), "build_s": round(built - started, 2)}


def measure(client, url: str, requests: int) -> tuple[list[float], int]:
    for _ in range(3):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    return times, len(response.content)


def provenance(args, database: str) -> dict:
    from klineage.gate.pipeline import git_commit

    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import django

    return {
        "written_by": "bench/web_perf.py", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": {"host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "os": platform.platform(),
                    "python": platform.python_version(), "django": django.get_version(),
                    "load_average_1m_at_end": round(os.getloadavg()[0], 2),
                    "note": "shared machine: other processes ran alongside; the load average says how busy it was"},
        "database": database,
        "workload": {"cards": args.cards, "requests_per_page": args.requests, "lineage_steps": STEPS,
                     "client": "django.test.Client (whole request in process: routing, queries, templates)"},
        "targets_ms": {"library_p95": LIBRARY_TARGET_MS, "lineage_p95": LINEAGE_TARGET_MS},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "web_perf.json")
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="klineage-web-perf-")
    os.environ["KLINEAGE_DATA_DIR"] = data_dir
    os.environ["DATABASE_URL"] = f"sqlite:///{data_dir}/web_perf.sqlite3"
    os.environ["KLINEAGE_READ_OPEN"] = "1"
    import django

    django.setup()
    from django.db import connection
    from django.test import Client

    filled = fill(args.cards)
    with connection.cursor() as cursor:
        cursor.execute("select sqlite_version()")
        database = f"SQLite {cursor.fetchone()[0]}"
    print(f"{filled['cards']} cards imported in {filled['import_s']} s", flush=True)
    card = filled["card"]
    pages = [
        ("library", "library, first page (by gain)", "/library/"),
        ("library", "library, page 100", "/library/?page=100"),
        ("library", "library, search", "/library/?q=pragma+unroll"),
        ("library", "library, operator + status", "/library/?operator=gemm&status=admitted"),
        ("library", "library, feature + platform", "/library/?feature=kernel/launch_bounds&platform=sm90a"),
        ("library", "library, intent, sorted by transform", "/library/?intent=variant+99&sort=transform"),
        ("library", "library, sorted by id, page 150", "/library/?sort=id&page=150"),
        ("card", "card page", f"/library/{card}/"),
        ("card", "card SKILL.md", f"/library/{card}/SKILL.md"),
        ("api", "api cards list", "/api/cards/?operator=gemm&ordering=-median_gain"),
        ("lineage", f"lineage page, {STEPS} steps", f"/lineages/{filled['lineage']}/"),
    ]
    client = Client(HTTP_HOST="localhost")
    rows, library_times = [], []
    for group, name, url in pages:
        times, size = measure(client, url, args.requests)
        if group == "library":
            library_times += times
        rows.append({"page": name, "group": group, "url": url, "requests": len(times),
                     "p50_ms": percentile(times, 0.5), "p95_ms": percentile(times, 0.95),
                     "max_ms": round(max(times), 2), "bytes": size})
        print(f"{name:42s} p50 {rows[-1]['p50_ms']:7.1f} ms  p95 {rows[-1]['p95_ms']:7.1f} ms  {size} bytes",
              flush=True)
    lineage_row = next(r for r in rows if r["group"] == "lineage")
    document = {
        "provenance": provenance(args, database),
        "summary": {"cards": filled["cards"], "card_import_s": filled["import_s"],
                    "library_p50_ms": percentile(library_times, 0.5), "library_p95_ms": percentile(library_times, 0.95),
                    "library_within_target": percentile(library_times, 0.95) < LIBRARY_TARGET_MS,
                    "lineage_p95_ms": lineage_row["p95_ms"],
                    "lineage_within_target": lineage_row["p95_ms"] < LINEAGE_TARGET_MS},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(document["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
