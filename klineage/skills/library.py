"""The skill library: the cards induced from a set of lineages, with how they were built.

One JSON document, `{"version": 1, "provenance": {...}, "cards": [card, ...]}`, in the canonical
form of `klineage.fingerprint.document_text` (equal libraries give equal bytes). The provenance
says what the cards rest on: the source lineage ids and their gate modes, and whatever the builder
adds (GPU, toolchain, git commit, date, a note such as "dry walks: no card was timed"). The web
app imports exactly this document; a folder of SKILL.md files (`skillmd.export_skillmd`) loads as
a library too, its provenance saying where it came from.

A library refuses two cards with one id (each card is one skill) and, when built, two lineages
with one id (the same expert walked twice under one gate mode would count its evidence twice).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klineage.documents import document_files
from klineage.errors import DocumentError, KLineageError
from klineage.files import write_atomic
from klineage.fingerprint import document_text, parse_document
from klineage.lineage import Lineage
from klineage.problem import ProblemInfo
from klineage.skills.card import CardStatus, SkillCard
from klineage.skills.induction import PerCase, Retimed, StepCode, induce, lineage_id
from klineage.skills.skillmd import import_skillmd

LIBRARY_VERSION = 1
_KEYS = ("version", "provenance", "cards")


@dataclass(frozen=True)
class Library:
    cards: tuple[SkillCard, ...]
    provenance: dict[str, Any] = field(default_factory=dict)
    version: int = LIBRARY_VERSION

    def __post_init__(self) -> None:
        if self.version != LIBRARY_VERSION:
            raise DocumentError("library", f"unsupported version {self.version!r} (this is {LIBRARY_VERSION})")
        if not isinstance(self.provenance, dict):
            raise DocumentError("library.provenance", f"must be an object, not {type(self.provenance).__name__}")
        try:
            document_text(self.provenance)
        except (TypeError, ValueError) as exc:
            raise DocumentError("library.provenance", f"must be plain JSON: {exc}") from None
        cards = tuple(self.cards)
        for i, card in enumerate(cards):
            if not isinstance(card, SkillCard):
                raise DocumentError(f"library.cards[{i}]", f"must be a SkillCard, not {card!r}")
        seen: dict[str, int] = {}
        for i, card in enumerate(cards):
            if card.id in seen:
                raise DocumentError(f"library.cards[{i}]", f"card {card.short_id} ({card.transform}) is already "
                                                           f"cards[{seen[card.id]}]")
            seen[card.id] = i
        object.__setattr__(self, "cards", cards)

    def admitted(self) -> tuple[SkillCard, ...]:
        return tuple(c for c in self.cards if c.status is CardStatus.ADMITTED)

    def by_id(self, card_id: str) -> SkillCard:
        """The card with this id, or with this unique id prefix (a short id)."""
        if not isinstance(card_id, str) or not card_id.strip():
            raise KLineageError(f"no card id given ({card_id!r})")
        found = [c for c in self.cards if c.id.startswith(card_id.strip().lower())]
        if len(found) == 1:
            return found[0]
        if not found:
            raise KLineageError(f"no card '{card_id}' in the library ({len(self.cards)} cards)")
        raise KLineageError(f"'{card_id}' names {len(found)} cards ({', '.join(c.short_id for c in found)}); "
                            f"give more of the id")

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "provenance": self.provenance, "cards": [c.to_dict() for c in self.cards]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "library") -> Library:
        if not isinstance(data, dict):
            raise DocumentError(where, f"must be an object, not {type(data).__name__}")
        missing = [k for k in _KEYS if k not in data]
        unknown = sorted(set(data) - set(_KEYS))
        if missing or unknown:
            raise DocumentError(where, f"missing {missing}" if missing else f"unknown keys {unknown}")
        if data["version"] != LIBRARY_VERSION:
            raise DocumentError(where, f"unsupported version {data['version']!r} (this is {LIBRARY_VERSION})")
        if not isinstance(data["cards"], list):
            raise DocumentError(f"{where}.cards", "must be a list")
        if not isinstance(data["provenance"], dict):
            raise DocumentError(f"{where}.provenance", "must be an object")
        cards = tuple(SkillCard.from_dict(c, f"{where}.cards[{i}]") for i, c in enumerate(data["cards"]))
        return cls(cards, dict(data["provenance"]), data["version"])


def bundled_library() -> Path:
    """The library the corpus ships (`klineage library build` writes it): what a command reads without --library."""
    from klineage import config

    return config.corpus_dir() / "library" / "library.json"


def load_library(path: str | Path) -> Library:
    """A library JSON file, or a folder of SKILL.md files (its provenance names the folder)."""
    path = Path(path)
    if path.is_dir():
        return Library(tuple(import_skillmd(path)), {"imported_from": "skillmd", "folder": str(path)})
    if not path.is_file():
        raise DocumentError(str(path), "no such library file or SKILL.md folder")
    return Library.from_dict(parse_document(path.read_text(encoding="utf-8"), str(path)), str(path))


def save_library(library: Library, path: str | Path) -> Path:
    """Write the canonical JSON of the library, whole or not at all (admission rewrites it after
    every card, and a timeout may kill it at any moment); returns the path."""
    return write_atomic(path, document_text(library.to_dict()))


def build_library(lineages: list[Lineage], problems: Mapping[str, ProblemInfo] | None,
                  provenance: dict[str, Any], retimed: Retimed | None = None,
                  percase: PerCase | None = None, step_code: StepCode | None = None) -> Library:
    """The cards `induce` lifts from `lineages` (effects re-timed where `retimed` says, per case where
    `percase` has a step timed on every case, none from a step `step_code` finds running its parent's
    machine code), with the
    caller's provenance plus the source lineage ids (`lineages`) and the gate modes they ran under
    (`gate_modes`)."""
    ids = [lineage_id(lineage) for lineage in lineages]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise KLineageError(f"the same lineage is given more than once: {', '.join(repeated)} (one walk per expert "
                            f"and gate mode; its evidence would count twice)")
    clash = sorted({"lineages", "gate_modes"} & set(provenance))
    if clash:
        raise KLineageError(f"provenance keys {clash} are filled in from the lineages; do not give them")
    facts = {"lineages": sorted(ids), "gate_modes": sorted({lineage.gate.value for lineage in lineages})}
    return Library(tuple(induce(lineages, problems, retimed, percase, step_code)), {**provenance, **facts})


def _lineage_files(folder: str | Path | None) -> list[tuple[Path, Lineage]]:
    """(path, lineage) for every JSON file of a folder (default: the bundled `corpus/lineages/`),
    plain or gzip-compressed (bench/walks/), by name."""
    from klineage import config

    folder = Path(folder) if folder is not None else config.corpus_dir() / "lineages"
    if not folder.is_dir():
        raise DocumentError(str(folder), "no such lineage folder")
    return [(path, Lineage.load(path)) for path in document_files(folder)]


def corpus_lineages(folder: str | Path | None = None) -> tuple[list[Lineage], list[Path]]:
    """The lineages of a folder (default: the bundled `corpus/lineages/`), one per expert: a walk
    that ran on a GPU is kept over a compile-only one (whose steps it verified or refuted), then
    the walk with the most transitions (ties: the first file by name); also the files left out."""
    from klineage.config import GateMode

    def rank(lineage: Lineage) -> tuple[bool, int]:
        return lineage.gate is not GateMode.COMPILE_ONLY, len(lineage.transitions)

    kept: dict[str, tuple[Lineage, Path]] = {}
    left_out: list[Path] = []
    for path, lineage in _lineage_files(folder):
        key = f"{lineage.expert.name}@{lineage.expert.fingerprint}"
        if key in kept and rank(kept[key][0]) >= rank(lineage):
            left_out.append(path)
            continue
        if key in kept:
            left_out.append(kept[key][1])
        kept[key] = (lineage, path)
    return [kept[k][0] for k in sorted(kept)], sorted(left_out)


def lineage_index(folder: str | Path | None = None) -> dict[str, Lineage]:
    """Every lineage of a folder (default: the bundled `corpus/lineages/`) by lineage id: what a
    card's evidence refs point into. {} when there is no such folder."""
    from klineage import config

    folder = Path(folder) if folder is not None else config.corpus_dir() / "lineages"
    return {lineage_id(lineage): lineage for _, lineage in _lineage_files(folder)} if folder.is_dir() else {}


def default_provenance(lineages: list[Lineage], note: str = "") -> dict[str, Any]:
    """What a build on this machine states about itself: git commit, date, toolchain, GPU (none
    when every lineage is a compile-only walk: then no card was timed) and a note."""
    import datetime as dt

    from klineage.config import GateMode
    from klineage.errors import ToolchainError
    from klineage.gate.pipeline import git_commit
    from klineage.toolchain import find_toolchain

    try:
        toolchain = find_toolchain().key
    except ToolchainError:
        toolchain = "unknown"
    dry = all(lineage.gate is GateMode.COMPILE_ONLY for lineage in lineages)
    facts = {"built_by": "klineage library build", "git_commit": git_commit(),
             "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "toolchain": toolchain,
             "gpu": "none: compile-only walks, nothing ran or was timed" if dry else "see the lineages' verdicts",
             "admission": "no roundtrip trials were run: every card is a candidate" if dry else ""}
    if note:
        facts["note"] = note
    return {k: v for k, v in facts.items() if v}


def problem_infos(operators: set[str] | list[str]) -> dict[str, ProblemInfo]:
    """operator -> ProblemInfo of the bundled problem of that name (their case parameters are what
    induction searches preconditions over, and what retrieval compares shapes with)."""
    from concurrent.futures import ThreadPoolExecutor

    from klineage import config, corpus
    from klineage.gate.execute import probe_problem

    names = sorted(set(operators))
    # Each probe not cached yet is a sandboxed process importing torch (about 1.7 s): side by side, the
    # sixteen corpus problems take a few seconds on a cold cache, not half a minute.
    with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1))) as pool:
        infos = list(pool.map(lambda name: probe_problem(corpus.problem_path(name), config.cache_dir()).info, names))
    return dict(zip(names, infos, strict=True))
