"""Re-time a GPU walk's doubtful steps with parent and child exchanging places (GPU host).

    python bench/retime.py WALK.gpu.json [--steps 3,5,8] [--share I/N]

A walk times each step's parent against its child in one process, each kernel where its module
landed; for kernels of 20-30 thousand instructions the place alone moved a time by up to 1.4x
(docs/perf-notes.md, sessions 13-15). Here each chosen step (by default those the timing audit
calls biased or outweighed) is timed again under the walk's forward-timing policy with
`placement = exchanged`, its verdict recorded (KLINEAGE_RECORDED_DIR), so the audit, the dashboard
and CI read the re-timed ratio with no GPU. `--share I/N`: this lane's share of the steps (I, I+N, ...).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from klineage.config import GateMode
from klineage.errors import KLineageError
from klineage.gate.pipeline import default_cache
from klineage.lineage import Lineage
from klineage.walk.timing_audit import DOUBTFUL, exchanged_ratio, retime_step, step_pairings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("walk", type=Path)
    parser.add_argument("--steps", default="", help="comma-separated step indices (default: biased and outweighed)")
    parser.add_argument("--share", default="0/1", help="I/N: this lane's share of the steps")
    args = parser.parse_args(argv)
    try:
        lane, lanes = (int(x) for x in args.share.split("/"))
        lineage = Lineage.load(args.walk)
        pairings = {p.index: p for p in step_pairings(lineage)}
        chosen = ([int(x) for x in args.steps.split(",")] if args.steps else
                  [i for i, p in sorted(pairings.items()) if p.pairing in DOUBTFUL])[lane::lanes]
    except (ValueError, KLineageError) as exc:
        print(f"retime: {exc}", file=sys.stderr)
        return 2
    ratios = {t.index: t.forward.timing.overall for t in lineage.transitions if t.forward.timing is not None}
    print(f"{args.walk.name}: {len(chosen)} step(s) re-timed with exchanged places; child time / parent time")
    print(f"{'step':>4s} {'transform':22s} {'walk':>7s} {'exchanged':>9s}  rounds; medians by place (us)", flush=True)
    cache = default_cache()
    for index in chosen:
        started, row = time.monotonic(), f"{index:4d} {lineage.transitions[index].transform:22s}"
        try:
            verdict = retime_step(lineage, index, GateMode.GPU, cache, record=True)
        except KLineageError as exc:
            print(f"{row} gate error: {exc}", flush=True)
            continue
        found = exchanged_ratio(verdict)
        if found is None:
            print(f"{row} not timed: {verdict.describe()}", flush=True)
            continue
        overall, rounds = found
        places = verdict.profile["placement"]["medians_us"]
        print(f"{row} {ratios.get(index, float('nan')):7.3f} "
              f"{overall:9.3f}  {', '.join(f'{r:.3f}' for r in rounds)}; parent "
              f"{'/'.join(f'{m:.1f}' for m in places['candidate'])} child "
              f"{'/'.join(f'{m:.1f}' for m in places['baseline'])} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
