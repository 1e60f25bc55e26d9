"""The corpus's measured standing, from the verdicts recorded on the GPU host: one row per bundled
kernel whose current source has a recorded, timed verdict (the newest one), with each expert's target.

    python bench/corpus_table.py            # writes bench/results/corpus.json, prints a table

It measures nothing: every number comes from a verdict in `recorded/` (written by the gate on the
H200, `bench/gpu_session.sh`). A kernel whose current fingerprint has no timed verdict there is
listed under `unmeasured`, so an edited kernel never shows an old kernel's numbers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Minimum speed ratio against the vendor path on the headline case.
TARGETS = {"topk/radix_select": 3.0, "conv2d/implicit_gemm": 1.2, "conv2d/implicit_gemm_any": 1.2,
           "gemm/mma_sync": 0.70, "gemm/mma_sync_any": 0.70, "gemm/wgmma_tma": 0.95, "fmha/flash_mma": 0.55,
           "fmha/flash_mma_r32": 0.55, "fmha/flash_wgmma": 0.9, "conv2d/implicit_wgmma": 1.2, "gdn/chunked": 1.0,
           "gdn/chunked_mma": 1.0}


def recorded_verdicts(folder: Path) -> list[dict]:
    from klineage.gate.cache import VerdictStore, read_verdict_file

    return [read_verdict_file(path) for path in VerdictStore(folder).files()]


def newest_timed(verdicts: list[dict], of_kernel) -> dict | None:
    """The newest verdict with a vendor ratio whose kernel {name, fingerprint} `of_kernel` accepts
    (a baseline kernel may have been timed beside them: the ratio is still candidate vs vendor, paired)."""
    timed = [v for v in verdicts if of_kernel(v["kernel"])
             and ((v.get("profile") or {}).get("ratios") or {}).get("vs_vendor")]
    return max(timed, key=lambda v: v["provenance"]["created"], default=None)


def row(name: str, verdict: dict) -> dict:
    profile = verdict["profile"]
    ratio = profile["ratios"]["vs_vendor"]
    contenders = profile["contenders"]
    target = TARGETS.get(name)
    env = verdict.get("environment") or {}
    return {
        "workload": verdict["problem"]["operator"],
        "kernel": {"name": name, "fingerprint": verdict["kernel"]["fingerprint"]},
        "vs": "vendor", "ratio": ratio["overall"], "ratio_trials": ratio["per_trial"],
        "correct": verdict["status"] == "passed", "status": verdict["status"], "case": profile["case"],
        "median_us": contenders["candidate"]["median_us"], "vendor_median_us": contenders["vendor"]["median_us"],
        "roofline_fraction": profile["roofline"]["fraction"]["candidate"],
        "vendor_roofline_fraction": profile["roofline"]["fraction"]["vendor"],
        "cases_checked": verdict["provenance"]["key_parts"]["cases"],
        "baseline_timed_beside": verdict["provenance"]["key_parts"].get("against", "none"),
        "target": target, "meets_target": None if target is None else ratio["overall"] >= target,
        "verdict_key": verdict["provenance"]["key"], "measured_at": verdict["provenance"]["created"],
        "measured_commit": verdict["provenance"].get("git_commit"), "gpu": env.get("gpu"),
        "driver": env.get("driver"), "torch": env.get("torch"), "toolchain": env.get("toolchain"),
        # Problems with VENDOR_TIMING ("eager", "graph") also time the vendor replayed from a CUDA graph.
        "vs_vendor_graph": (profile["ratios"].get("vs_vendor_graph") or {}).get("overall"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recorded", type=Path, default=REPO / "recorded")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "corpus.json")
    args = parser.parse_args()
    from klineage import corpus
    from klineage.gate.pipeline import git_commit

    verdicts = recorded_verdicts(args.recorded)
    rows, unmeasured, earlier = [], [], []
    for entry in corpus.list_kernels():
        if entry.name.startswith("adversarial/"):
            continue
        state = entry.load()
        found = newest_timed(verdicts, lambda k: k["fingerprint"] == state.fingerprint)
        if found is None:
            unmeasured.append(entry.name)
            earlier_found = newest_timed(  # the same kernel before its source was last edited
                verdicts, lambda k: k["name"] == state.name and k["fingerprint"] != state.fingerprint)
            if earlier_found is not None:  # history, kept apart: the source measured is not the current one
                earlier.append(row(entry.name, earlier_found) | {"current_fingerprint": state.fingerprint})
        else:
            rows.append(row(entry.name, found))
    first = rows[0] if rows else {}
    document = {
        "provenance": {"written_by": "bench/corpus_table.py", "git_commit": git_commit(),
                       "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                       "gpu": first.get("gpu"), "driver": first.get("driver"), "torch": first.get("torch"),
                       "source": "recorded gate verdicts (recorded/); each row names its verdict and commit"},
        "rows": rows, "unmeasured": unmeasured,
        # unmeasured kernels whose earlier source was timed: that measurement, not of the current source
        "earlier_sources": earlier,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"{'kernel':28} {'ratio':>7} {'target':>7} {'roofline':>8} {'median us':>10} {'vendor us':>10}")
    for r in rows:
        target = "" if r["target"] is None else f"{r['target']:.2f}"
        print(f"{r['kernel']['name']:28} {r['ratio']:7.3f} {target:>7} {r['roofline_fraction']:8.0%} "
              f"{r['median_us']:10.1f} {r['vendor_median_us']:10.1f}")
    print(f"unmeasured: {', '.join(unmeasured) or 'none'}")
    for r in earlier:
        print(f"  {r['kernel']['name']}: {r['ratio']:.3f}x on an earlier source ({r['kernel']['fingerprint'][:12]}, "
              f"{r['measured_at']})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
