"""`klineage recorded compact [DIR]`: rewrite the recorded store's plain `<key>.json` verdicts as the
`<key>.json.gz` the store writes, so the committed store stays small (verdicts from older checkouts
and GPU hosts come back plain). Nothing is lost: a plain file goes only once its .json.gz reads back
the same document, and one that cannot be rewritten stays, named with the reason."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from klineage import config
from klineage.errors import KLineageError
from klineage.gate.cache import VerdictStore


def add_parser(commands: argparse._SubParsersAction) -> None:
    recorded = commands.add_parser("recorded", help="the recorded verdict store that replay serves")
    actions = recorded.add_subparsers(dest="recorded_command", required=True)
    compact = actions.add_parser(
        "compact", help="rewrite plain <key>.json verdicts as <key>.json.gz (running it again changes nothing)",
        epilog="exit status: 0 no plain verdict is left; 1 some are left as they were, each named with the reason")
    compact.add_argument("folder", nargs="?", metavar="DIR",
                         help="a recorded store, the folder holding verdicts/ (default: KLINEAGE_RECORDED_DIR or "
                              "recorded/)")


def run(args: argparse.Namespace) -> int:
    folder = Path(args.folder) if args.folder else config.recorded_dir()
    if not (folder / "verdicts").is_dir():  # a mistyped folder would otherwise "compact" nothing, successfully
        raise KLineageError(f"{folder}: no verdicts/ folder in it: not a recorded store")
    converted, left = VerdictStore(folder).compact()
    print(f"{converted} plain verdict files rewritten as .json.gz under {folder}")
    for path, reason in left:
        print(f"{path}: {reason}", file=sys.stderr)
    if left:
        print(f"{len(left)} plain verdict files left as they were", file=sys.stderr)
    return 1 if left else 0
