"""`klineage library build|show|export`: the skill library from the command line.

- build: induce cards from lineage files (default: the bundled `corpus/lineages/`, one walk per
  expert and gate mode, the longest) and write the library JSON (default:
  `corpus/library/library.json`) with its provenance;
- show: the library's cards as a table, or one card (by id or short id) as JSON;
- export: one SKILL.md folder per card, for coding agents.
Kept beside the library so that `klineage/cli.py` only wires it in.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from klineage import config
from klineage.errors import KLineageError


def default_path() -> Path:
    return config.corpus_dir() / "library" / "library.json"


def add_parser(commands: argparse._SubParsersAction) -> None:
    library = commands.add_parser("library", help="build, show or export the skill library")
    actions = library.add_subparsers(dest="library_command", required=True)
    build = actions.add_parser("build", help="induce the cards of lineage files into a library JSON")
    build.add_argument("lineages", nargs="*", help="lineage JSON files (default: corpus/lineages/, longest walk "
                                                   "per expert and gate mode)")
    build.add_argument("--out", help="library file to write (default: corpus/library/library.json)")
    build.add_argument("--note", default="", help="a sentence for the provenance")
    show = actions.add_parser("show", help="list the library's cards, or print one")
    show.add_argument("card", nargs="?", help="a card id or unique id prefix: print that card as JSON")
    show.add_argument("--library", help="library JSON file or SKILL.md folder (default: the bundled library)")
    show.add_argument("--json", action="store_true", help="print the whole library document")
    export = actions.add_parser("export", help="write one <transform>-<short id>/SKILL.md per card")
    export.add_argument("folder")
    export.add_argument("--library", help="library JSON file or SKILL.md folder (default: the bundled library)")


def run(args: argparse.Namespace) -> int:
    return {"build": _build, "show": _show, "export": _export}[args.library_command](args)


def _build(args: argparse.Namespace) -> int:
    from klineage.lineage import Lineage
    from klineage.skills.library import (build_library, corpus_lineages, default_provenance, problem_infos,
                                         save_library)

    if args.lineages:
        lineages, left_out = [Lineage.load(p) for p in args.lineages], []
    else:
        lineages, left_out = corpus_lineages()
    if not lineages:
        raise KLineageError("no lineage to build a library from")
    problems = problem_infos({lineage.problem.operator for lineage in lineages})
    library = build_library(lineages, problems, default_provenance(lineages, args.note))
    out = save_library(library, args.out or default_path())
    for path in left_out:
        print(f"left out {path.name}: a longer walk of the same expert and gate mode is used")
    statuses = {}
    for card in library.cards:
        statuses[card.status.value] = statuses.get(card.status.value, 0) + 1
    print(f"{len(library.cards)} cards ({', '.join(f'{n} {s}' for s, n in sorted(statuses.items())) or 'none'}) "
          f"from {len(lineages)} lineages written to {out}")
    return 0


def _load(path: str | None):
    from klineage.skills.library import load_library

    return load_library(path or default_path())


def _show(args: argparse.Namespace) -> int:
    library = _load(args.library)
    if args.card:
        print(library.by_id(args.card).to_json(), end="")
        return 0
    if args.json:
        print(json.dumps(library.to_dict(), indent=1, sort_keys=True))
        return 0
    from klineage.report import console, table

    table(f"Skill library ({len(library.cards)} cards)", ["id", "transform", "status", "operators", "provides",
                                                          "effects", "evidence"],
          [[c.short_id, c.transform, c.status.value, ", ".join(c.scope.operators),
            ", ".join(map(str, sorted(c.provides))) or "-",
            ", ".join(f"{e.ratio:.2f}x" for e in c.effects) or "untimed", str(len(c.evidence))]
           for c in library.cards])
    for key, value in sorted(library.provenance.items()):
        console.print(f"  {key}: {value}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from klineage.skills.skillmd import export_skillmd

    library = _load(args.library)
    written = export_skillmd(list(library.cards), args.folder)
    print(f"{len(written)} SKILL.md files written under {args.folder}")
    return 0
