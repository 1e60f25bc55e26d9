"""Import skill library documents: `{"version": 1, "provenance": {...}, "cards": [SkillCard.to_dict(), ...]}`.

The document is checked by the engine's `Library.from_dict` (each card by `SkillCard.from_dict`,
which also checks that its id matches its content) before anything is written; a malformed
document refuses the whole import with a message naming the card and field, and stores nothing.

Each document is a library of its own, named for its file (`library_name`): the bundled
`corpus/library/library.json` is `corpus`, `bench/results/percase/library.json` is `percase`. Cards
are keyed by library and id, since two libraries built from the same walks hold the same card id
with different effects, preconditions and status. Importing the same document again changes
nothing; a card whose document changed (it gathered evidence, was admitted) is updated, unless the
document it comes from is older (`provenance.date`) than the one that stored it. A card's trials are
its `verification_log`, replaced whenever the card is updated.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils.text import slugify

from klineage import config
from klineage.errors import KLineageError
from klineage.fingerprint import sha256_json
from klineage.skills.admission_rule import card_digest
from klineage.skills.card import SHORT_ID, Trial
from klineage.skills.card import SkillCard as EngineCard
from klineage.skills.library import Library
from klineage.skills.trial_reading import reading
from klineage.skills.when import card_when, when_label
from skills_app import readmission
from skills_app.importer import (
    CREATED,
    UNCHANGED,
    UPDATED,
    ImportRefused,
    _display,
    _require_json,
    _timestamp,
    engine_check,
    read_json,
)
from skills_app.models import DEFAULT_LIBRARY, CardTrial, Review, SkillCard, SkillLibrary

STALE = "stale"  # an older library's copy of a card stored from a newer one: left as it is


def parse_library(document: Any, where: str = "library") -> Library:
    """The library a document holds, checked by the engine (`Library.from_dict`, every card by
    `SkillCard.from_dict`)."""
    return engine_check(lambda: Library.from_dict(document), where, "skill library", "not a valid skill library: ",
                        lambda message: _locate(document, message))


def _locate(document: Any, message: str) -> str:
    """The engine's message, led by the position of the card it is about where it does not say
    (a card's own checks, such as its id against its content, name the field only)."""
    cards = document.get("cards") if isinstance(document, dict) else None
    if "cards[" in message or not isinstance(cards, list):
        return message
    for position, data in enumerate(cards):
        try:
            EngineCard.from_dict(data)
        except (KLineageError, KeyError, TypeError, ValueError, AttributeError):
            return f"cards[{position}]: {message}"
    return message


def library_name(path: Path, *, in_corpus: bool = False) -> str:
    """A library's name from its file: the stem, or where the file is a folder's `library.json`, the
    folder (`bench/results/percase/library.json` is percase); the corpus's own `library.json` is corpus."""
    path = Path(path)
    if path.stem != "library":
        return slugify(path.stem)
    return DEFAULT_LIBRARY if in_corpus else slugify(path.parent.name)


def import_library(document: Any, *, where: str = "library", name: str = DEFAULT_LIBRARY) -> Counter:
    """Import one library document as the library `name`, all or nothing; counts of created / updated /
    unchanged / stale cards."""
    library = parse_library(document, where)
    created = _timestamp(library.provenance.get("date"), f"{where}: provenance")
    counts: Counter = Counter()
    with transaction.atomic():
        row = _store_library(name, library.provenance, created, where)
        for card in library.cards:
            counts[store_card(card, library=row, library_created=created,
                              where=f"{where}: card {card.short_id}")] += 1
        # a dispute may already stand behind a card, and today's rule may not admit an admitted one
        disputes = Review.objects.filter(verdict=Review.Verdict.DISPUTE).exists()
        for card in row.cards.filter(card_id__in=[card.id for card in library.cards]):
            if disputes or card.status == SkillCard.Status.ADMITTED:
                readmission.refresh_card(card)
    return counts


def _store_library(name: str, provenance: dict[str, Any], created, where: str) -> SkillLibrary:
    """The library's row, its provenance brought up to date unless the stored one is newer."""
    row, made = SkillLibrary.objects.get_or_create(name=name, defaults={"source": where})
    if made or row.created is None or (created is not None and created >= row.created):
        row.source, row.provenance, row.created = where, provenance, created
        row.note = str(provenance.get("note", ""))
        row.save()
    return row


def read_library(path: Path, where: str) -> dict[str, Any]:
    """A library file's JSON, checked (not stored)."""
    document = read_json(path, where)
    parse_library(document, where)
    return document


def store_card(card: EngineCard, *, library: SkillLibrary, library_created=None, where: str = "card") -> str:
    """Store one checked card in `library`; the caller holds the transaction."""
    data = card.to_dict()
    _require_json(data, where)
    digest = sha256_json(data)
    existing = library.cards.filter(card_id=card.id).first()
    if existing is not None:
        if existing.digest == digest:
            return UNCHANGED
        if existing.library_created and library_created and library_created < existing.library_created:
            return STALE
    values = {
        "short_id": card.id[:SHORT_ID],
        "status": card.status.value,
        "transform": card.transform,
        "intent": card.intent,
        "surface": card.anchor.kind,
        "platform": card.scope.platform,
        "operators": list(card.scope.operators),
        "dtypes": list(card.scope.dtypes),
        "requires": _features(card.requires),
        "provides": _features(card.provides),
        "conflicts": _features(card.conflicts),
        "median_gain": statistics.median(e.ratio for e in card.effects) if card.effects else None,
        "precondition_count": len(card.preconditions),
        **when_columns(card),
        "risk_count": len(card.risks),
        "search_text": " ".join((card.intent, card.anchor.snippet, card.anchor.key, card.transform)).lower(),
        "document": data,
        "digest": digest,
        "library_created": library_created,
    }
    if existing is None:
        row, action = SkillCard.objects.create(library=library, card_id=card.id, **values), CREATED
    else:
        for name, value in values.items():
            setattr(existing, name, value)
        existing.save()
        row, action = existing, UPDATED
        row.trials.all().delete()
    content = card_digest(card)
    CardTrial.objects.bulk_create([
        CardTrial(card=row, outcome=reading(t).value, target=t.state, ratio=t.ratio, message=t.message,
                  judged=_judged(t, content))
        for t in card.verification_log])
    return action


def when_columns(card: EngineCard) -> dict[str, str]:
    """What the library filters and lists of a card's *when* (klineage.skills.when.card_when)."""
    when = card_when(card)
    return {"when_kind": when.kind.value, "when_label": when_label(when)[:300]}


def _judged(trial: Trial, content: str) -> str:
    """Which content of the card the trial judged: its basis against the card's digest."""
    if trial.basis is None:
        return CardTrial.Judged.UNKNOWN
    return CardTrial.Judged.CURRENT if trial.basis.card == content else CardTrial.Judged.EARLIER


def _features(features) -> list[str]:
    return [f"{f.locus}/{f.name}" for f in sorted(features)]


def library_files(corpus_root: Path | None = None, extra: list[Path] | None = None) -> list[tuple[str, Path]]:
    """(name, file) of every `library/*.json` under the corpus, then of `extra`: by default, with the
    bundled corpus, the libraries built beside it (`config.bench_library_files`)."""
    if extra is None:
        extra = config.bench_library_files() if corpus_root is None else []
    corpus_root = Path(corpus_root or config.corpus_dir())
    return [*((library_name(path, in_corpus=True), path) for path in sorted((corpus_root / "library").glob("*.json"))),
            *((library_name(path), Path(path)) for path in extra)]


def import_library_files(corpus_root: Path | None = None, extra: list[Path] | None = None) -> Counter:
    """The libraries of `library_files`, all checked before any is stored, in one transaction. Two files
    that would share a name refuse the import."""
    named: dict[str, str] = {}
    documents = []
    for name, path in library_files(corpus_root, extra):
        where = _display(path)
        if not name:
            raise ImportRefused(where, "a library file needs a name with a letter or digit in it")
        if name in named:
            raise ImportRefused(where, f"its library name {name!r} is taken by {named[name]}: rename one")
        named[name] = where
        documents.append((read_library(path, where), where, name))
    counts: Counter = Counter()
    with transaction.atomic():
        for document, where, name in documents:
            counts.update(import_library(document, where=where, name=name))
    return counts
