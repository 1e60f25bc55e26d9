"""Which steps of the GPU walks ran their parent's machine code: compiled here, recorded for `library build`.

    python bench/step_code.py [--out corpus/step_code.json] [--jobs N] [--deadline-s S]

Every accepted step of every GPU walk in corpus/lineages and bench/walks (what a library build reads) has its
parent and child compiled with this host's toolchain and compared (klineage.walk.step_code). Steps the output
file already decides with the same toolchain are kept, so a run cut by --deadline-s is resumed by the next.
About 700 states; 15 s each on average (the MMA kernels take longest), so a many-core host, not a laptop.
Prints the steps that ran the same code, by transform.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from klineage import config  # noqa: E402
from klineage.config import GateMode  # noqa: E402
from klineage.documents import document_files  # noqa: E402
from klineage.gate.machine_code import CodeIdentity  # noqa: E402
from klineage.lineage import Lineage  # noqa: E402
from klineage.toolchain import find_toolchain  # noqa: E402
from klineage.walk.step_code import StepCodes, census, walk_steps  # noqa: E402

OUT = ROOT / "corpus" / "step_code.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--deadline-s", type=float, default=None, help="stop compiling after this many seconds")
    args = parser.parse_args(argv)
    deadline = None if args.deadline_s is None else time.monotonic() + args.deadline_s
    lineages = [lineage for folder in (config.corpus_dir() / "lineages", config.bench_walks_dir())
                for lineage in map(Lineage.load, document_files(folder)) if lineage.gate is GateMode.GPU]
    earlier = StepCodes.load(args.out) if args.out.exists() else None
    steps = [step for lineage in lineages for step in walk_steps(lineage)]
    codes = census(steps, find_toolchain().key, jobs=args.jobs, deadline=deadline, earlier=earlier)
    codes.save(args.out)
    transforms = {(t.parent, t.child): t.transform for lineage in lineages for t in lineage.transitions}
    same = Counter(transform for (parent, child), transform in transforms.items()
                   if codes.identity(parent, child) is CodeIdentity.SAME)
    print(f"{codes.decided()} of {len(transforms)} steps decided, {codes.same()} ran their parent's machine code: "
          + ", ".join(f"{t} {n}" for t, n in same.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
