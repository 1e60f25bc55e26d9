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

Then, in Chromium (Playwright, /usr/bin/chromium), the largest committed lineage, the GPU walk of
gdn_chunked_mma (bench/walks/, 64 steps and 117 rejected attempts), is loaded --loads times from a
live server on this machine: the navigation's transferred bytes (what came over the wire, compressed
if the server compressed it), its decoded size, the bytes of every request of the first screen
(the page, its CSS and scripts; diffs are fetched only when opened), the gzip size of the HTML (what
a compressing server sends) and the time to first paint and first contentful paint (Paint Timing),
each from the browser's own performance entries. `--no-browser` leaves this part out.
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
from urllib.request import urlopen

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "klineage_web.settings")

LIBRARY_TARGET_MS = 200
LINEAGE_TARGET_MS = 300
STEPS = 40
FIRST_PAINT_TARGET_MS = 500
FIRST_SCREEN_TARGET_BYTES = 150_000
LARGEST_WALK = "bench/walks/gdn_chunked_mma.gpu.json.gz"
CHROMIUM = "/usr/bin/chromium"


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


def browser_lineage(loads: int) -> dict:
    """The largest committed walk's lineage page in Chromium, from a live server (module docstring)."""
    import gzip
    import threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.wsgi import get_wsgi_application
    from playwright.sync_api import sync_playwright

    from skills_app.importer import import_lineage, read_json

    lineage, _ = import_lineage(read_json(REPO / LARGEST_WALK, LARGEST_WALK), source_path=LARGEST_WALK)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    class Threading(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    server = make_server("127.0.0.1", 0, StaticFilesHandler(get_wsgi_application()), Threading, Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/lineages/{lineage.id}/"
    samples = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
            for i in range(loads + 2):  # two to warm up
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                page = context.new_page()
                page.goto(url, wait_until="load")
                # under load the first frame can come after "load": its paint entries with it
                page.wait_for_function("performance.getEntriesByType('paint').length >= 2")
                sample = page.evaluate("""() => {
                    const nav = performance.getEntriesByType('navigation')[0];
                    const paint = Object.fromEntries(
                        performance.getEntriesByType('paint').map(p => [p.name, p.startTime]));
                    const resources = performance.getEntriesByType('resource');
                    return {transfer: nav.transferSize, encoded: nav.encodedBodySize, decoded: nav.decodedBodySize,
                            first_screen: nav.transferSize + resources.reduce((n, r) => n + r.transferSize, 0),
                            requests: 1 + resources.length, ttfb: nav.responseStart,
                            fp: paint['first-paint'], fcp: paint['first-contentful-paint']}; }""")
                html = page.content()
                context.close()
                if i >= 2:
                    samples.append(sample)
            browser.close()
        with urlopen(url) as response:
            body = response.read()
    finally:
        server.shutdown()
        server.server_close()
    first_paint = [s["fp"] for s in samples]
    last = samples[-1]
    compressed = last["transfer"] < last["decoded"]
    html_gzip = len(gzip.compress(body, compresslevel=6))
    return {
        "lineage": LARGEST_WALK, "url_path": f"/lineages/{lineage.id}/", "steps": lineage.accepted_count,
        "rejected_attempts": lineage.rejected_count, "loads": len(samples),
        "transferred_bytes": samples[-1]["transfer"], "decoded_bytes": samples[-1]["decoded"],
        "first_screen_transferred_bytes": samples[-1]["first_screen"], "first_screen_requests": samples[-1]["requests"],
        "html_gzip_bytes": html_gzip, "html_bytes": len(body), "compressed_by_server": compressed,
        # over the wire compressed: as sent where the server compressed; else the HTML gzipped plus the
        # static files as they came (uncompressed, so an upper bound)
        "first_screen_compressed_bytes": last["first_screen"] if compressed
        else html_gzip + last["first_screen"] - last["transfer"],
        "time_to_first_byte_ms_p50": percentile([s["ttfb"] for s in samples], 0.5),
        "first_paint_ms_p50": percentile(first_paint, 0.5), "first_paint_ms_max": round(max(first_paint), 1),
        "first_contentful_paint_ms_p50": percentile([s["fcp"] for s in samples], 0.5),
        "diff_rows_in_first_screen": html.count('<tr class="diff-'),
        "server": "wsgiref (threaded) on 127.0.0.1, one process",
        "targets": {"first_paint_ms": FIRST_PAINT_TARGET_MS,
                    "first_screen_compressed_bytes": FIRST_SCREEN_TARGET_BYTES},
    }


def provenance(args, database: str) -> dict:
    from klineage.gate.pipeline import git_commit

    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import django

    return {
        "written_by": "bench/web_perf.py", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
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
    parser.add_argument("--loads", type=int, default=10, help="Chromium loads of the largest lineage page")
    parser.add_argument("--no-browser", action="store_true", help="leave the Chromium measurement out")
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
    browser = None if args.no_browser else browser_lineage(args.loads)
    if browser:
        print(json.dumps(browser), flush=True)
    document = {
        "provenance": provenance(args, database),
        "summary": {"cards": filled["cards"], "card_import_s": filled["import_s"],
                    "library_p50_ms": percentile(library_times, 0.5), "library_p95_ms": percentile(library_times, 0.95),
                    "library_within_target": percentile(library_times, 0.95) < LIBRARY_TARGET_MS,
                    "lineage_p95_ms": lineage_row["p95_ms"],
                    "lineage_within_target": lineage_row["p95_ms"] < LINEAGE_TARGET_MS,
                    **({"largest_lineage_first_paint_ms": browser["first_paint_ms_p50"],
                        "largest_lineage_first_screen_compressed_bytes": browser["first_screen_compressed_bytes"],
                        "largest_lineage_within_target": browser["first_paint_ms_p50"] < FIRST_PAINT_TARGET_MS
                        and browser["first_screen_compressed_bytes"] < FIRST_SCREEN_TARGET_BYTES} if browser else {})},
        "rows": rows,
        **({"browser": browser} if browser else {}),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(document["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
