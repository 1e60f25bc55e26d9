"""Summarise the verdicts bench/corpus_memory_bound.sh wrote: one row per kernel.

    python bench/corpus_memory_bound.py OUT/corpus_mb --out OUT/corpus_memory_bound.json

It measures nothing: every number is read from a gate verdict in the folder (`<problem>_<kernel>.correct.json`,
every case x seeds untimed; `<problem>_expert.timed.json`, the headline timed against the naive kernel and the
vendor). A row says whether the kernel passed every case, its headline speed ratio against torch eager
(vendor time / kernel time: paired per trial for an expert; for a naive kernel the ratio of the medians of
its expert's timed gate, `paired: false`), the medians in microseconds, the expert's fraction of the H200
roofline, and whether the timing settled (each contender's spread (p90 - p10) / median under the target).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _settled(profile: dict, target: float) -> bool:
    """Every contender's samples within the spread target (p90 - p10 over the median)."""
    return all((c["p90_us"] - c["p10_us"]) / c["median_us"] < target for c in profile["contenders"].values()
               if c.get("median_us"))


def row(folder: Path, stem: str) -> dict:
    problem, kernel = _split(stem)
    correct, timed = _load(folder / f"{stem}.correct.json"), _load(folder / f"{stem}.timed.json")
    result = {"problem": problem, "kernel": kernel, "correctness": correct["status"] if correct else "missing",
              "timing": timed["status"] if timed else "missing"}
    if correct:
        result["cases_passed"] = sorted({r["case"] for r in correct.get("correctness", [])
                                         if r["passed"] and r["kernel"] == "candidate"})
        result["cases"] = list(correct.get("cases", []))
        result["findings"] = [f.get("message", "")[:300] for f in correct.get("findings", [])][:3]
    profile = (timed or {}).get("profile") or {}
    if (profile.get("ratios") or {}).get("vs_vendor"):
        contenders = profile["contenders"]
        result |= {"case": profile["case"], "vs_vendor": profile["ratios"]["vs_vendor"]["overall"], "paired": True,
                   "vs_naive": (profile["ratios"].get("vs_baseline") or {}).get("overall"),
                   "median_us": {role: c["median_us"] for role, c in contenders.items()},
                   "roofline_fraction": profile["roofline"]["fraction"].get("candidate"),
                   "settled": _settled(profile, timed["policy"]["spread_target"]),
                   "gpu": timed["environment"].get("gpu"), "verdict_key": timed["provenance"]["key"]}
    return result


def naive_timing(rows: list[dict]) -> None:
    """A naive kernel's headline ratio vs the vendor, from its expert's timed gate (the baseline contender)."""
    experts = {r["problem"]: r for r in rows if r["kernel"] != "naive" and "median_us" in r}
    for r in rows:
        expert = experts.get(r["problem"])
        if r["kernel"] == "naive" and expert and "baseline" in expert["median_us"]:
            medians = expert["median_us"]
            r |= {"case": expert["case"], "vs_vendor": medians["vendor"] / medians["baseline"], "paired": False,
                  "median_us": {"naive": medians["baseline"], "vendor": medians["vendor"]},
                  "settled": expert["settled"], "timing": expert["timing"], "verdict_key": expert["verdict_key"]}


def _split(stem: str) -> tuple[str, str]:
    """problem_kernel where both may hold underscores: the problem is the longest known corpus problem prefix."""
    from klineage import corpus

    names = sorted((p.stem for p in corpus.list_problems()), key=len, reverse=True)
    problem = next((n for n in names if stem.startswith(n + "_")), stem.split("_", 1)[0])
    return problem, stem[len(problem) + 1:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    stems = sorted({p.name.split(".")[0] for p in args.folder.glob("*.json")})
    rows = [row(args.folder, stem) for stem in stems]
    naive_timing(rows)
    experts = [r for r in rows if r["kernel"] != "naive" and r["timing"] == "passed" and "vs_vendor" in r]
    geomean = math.exp(sum(math.log(r["vs_vendor"]) for r in experts) / len(experts)) if experts else None
    document = {"unit": "vs_vendor (vs_naive): torch eager (naive kernel) time / kernel time on the headline case, "
                        "higher is faster; median_us: microseconds; roofline_fraction: the H200 roofline floor / "
                        "kernel time",
                "experts_geomean_vs_vendor": geomean, "rows": rows}
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    for r in rows:
        ratio = f"{r['vs_vendor']:.3f}x vendor" if "vs_vendor" in r else "untimed"
        settled = "" if r.get("settled", True) else " (timing not settled)"
        print(f"{r['problem']:>16} {r['kernel']:<12} correctness {r['correctness']:<9} "
              f"{len(r.get('cases_passed', []))}/{len(r.get('cases', []))} cases  {ratio}{settled}")
    if geomean:
        print(f"experts: geometric mean {geomean:.3f}x the vendor over {len(experts)} headline cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
