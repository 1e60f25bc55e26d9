"""SKILL.md export and import: one folder per card, loadable by coding agents.

Layout: `<folder>/<transform>-<short id>/SKILL.md`. Each file has YAML front matter (`name` and
`description`, as agent skill loaders expect, then `skill_id, transform, intent, preconditions`
(sentences), `predicates` (their expressions), `scope, status, requires, provides, conflicts`
(features as `locus/name`)) and the sections Overview, Preconditions, When it pays (its timing
precondition, or what its per-case effects show: "paid on all N cases measured"), Risks (measured
failures), Diagnostics (where its transform did not apply, when any), Scope, Code Change (Before/After,
from the vector diff) and Evidence.

Lossless import (decided): the full card JSON is embedded at the end of the file in an HTML
comment (`<!-- klineage-card ... -->`, invisible when rendered), with every `>` escaped as
`\\u003e` so no diff text can close the comment early. `import_skillmd` reads the embedded card and
then checks that the front matter agrees with it on every field the front matter carries; an edit
to the front matter that the card does not carry is refused with the field named, never silently
dropped or silently applied. A SKILL.md without the embedded card is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from klineage.errors import DocumentError
from klineage.gate.policy import Placement
from klineage.skills.card import Precondition, SkillCard
from klineage.skills.when import SOURCE, card_when

SKILL_FILE = "SKILL.md"
EXCHANGED_NOTE = "; re-timed with parent and child exchanging places"
_CARD_OPEN = "<!-- klineage-card"
_CARD_BLOCK = re.compile(r"<!-- klineage-card\n(.*?)\n-->", re.DOTALL)


def _feature_list(features: Any) -> list[str]:
    return [f"{f.locus}/{f.name}" for f in sorted(features)]


def front_matter(card: SkillCard) -> dict[str, Any]:
    """The front matter of a card's SKILL.md (the fields an agent reads before the body)."""
    first = card.preconditions[0].sentence if card.preconditions else ""
    description = card.intent + (f" Only when: {first}." if first else "")
    return {
        "name": f"{card.transform}-{card.short_id}",
        "description": description,
        "skill_id": card.id,
        "transform": card.transform,
        "intent": card.intent,
        "preconditions": [p.sentence for p in card.preconditions],
        "predicates": [p.expression for p in card.preconditions],
        "scope": card.scope.to_dict(),
        "status": card.status.value,
        "requires": _feature_list(card.requires),
        "provides": _feature_list(card.provides),
        "conflicts": _feature_list(card.conflicts),
    }


def _before_after(diff: str) -> tuple[str, str]:
    before, after = [], []
    for line in diff.splitlines():
        if line.startswith(("---", "+++", "@@")):
            if line.startswith("@@") and (before or after):
                before.append("// ...")
                after.append("// ...")
            continue
        if line.startswith("-"):
            before.append(line[1:])
        elif line.startswith("+"):
            after.append(line[1:])
        elif line.startswith(" "):
            before.append(line[1:])
            after.append(line[1:])
    return "\n".join(before), "\n".join(after)


def _fence(text: str, language: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{language}\n{text.rstrip(chr(10))}\n{ticks}"


def render(card: SkillCard) -> str:
    """The SKILL.md text of one card."""
    head = yaml.safe_dump(front_matter(card), sort_keys=False, allow_unicode=True, width=100)
    parts = [f"---\n{head}---\n", f"# {card.transform} ({card.short_id})\n"]
    overview = [card.intent, "", f"Status: {card.status.value}. Acts on a `{card.anchor.kind}`"
                + (f" (e.g. `{card.anchor.key}` in `{card.anchor.function}`)." if card.anchor.key else ".")]
    if card.anchor.snippet:
        overview += ["", "Representative site:", "", _fence(card.anchor.snippet, "cuda")]
    if card.carrier:
        overview += ["", "Carrier (tuning that travels with it): "
                     + "; ".join(f"{k} = {', '.join(json.dumps(v) for v in vs)}" for k, vs in card.carrier.items())]
    if card.effects:
        overview += ["", "Measured effect (child time / parent time, > 1 is faster):"]
        overview += [f"- {e.operator}/{e.case}: {e.ratio:.3f}x (trials {', '.join(f'{r:.3f}' for r in e.per_trial)};"
                     f" spread {e.spread:.3f}{EXCHANGED_NOTE if e.placement is Placement.EXCHANGED else ''})"
                     f" from {e.source}" for e in card.effects]
    else:
        overview += ["", "No measured effect yet (untimed evidence)."]
    parts.append("## Overview\n\n" + "\n".join(overview) + "\n")
    pre = [_precondition_line(p) for p in card.preconditions] or ["- None found in the evidence."]
    if card.requires:
        pre.append(f"- Requires present: {', '.join(_feature_list(card.requires))}")
    if card.provides:
        pre.append(f"- Provides (must be absent before): {', '.join(_feature_list(card.provides))}")
    if card.conflicts:
        pre.append(f"- Conflicts with: {', '.join(_feature_list(card.conflicts))}")
    parts.append("## Preconditions\n\n" + "\n".join(pre) + "\n")
    when = card_when(card)
    paying = [f"{when.sentence[0].upper()}{when.sentence[1:]}."]
    if when.cases:
        held = set(when.precondition.holds) if when.precondition else set()
        paying += ["", f"Per case (median child time / parent time over its steps; paid: >= {when.required}x):"]
        paying += [f"- {r.case}: {r.ratio:.3f}x, {'paid' if r.paid else 'did not pay'}"
                   + (f"; the precondition {'holds' if r.case in held else 'fails'}" if when.precondition else "")
                   for r in when.cases]
    parts.append("## When it pays\n\n" + "\n".join(paying) + "\n")
    risks = [f"- {r.category}: {r.description}" for r in card.risks] + _did_not_pay(card) or ["- None recorded."]
    parts.append("## Risks\n\nMeasured failures: gate rejections, and cases where it made the kernel slower.\n\n"
                 + "\n".join(risks) + "\n")
    if card.diagnostics:
        parts.append("## Diagnostics (did not apply; not failures)\n\n"
                     + "\n".join(f"- {d.category}: {d.description}" for d in card.diagnostics) + "\n")
    scope = card.scope
    parts.append("## Scope\n\n" + "\n".join([
        f"- Operators: {', '.join(scope.operators)}", f"- Language: {scope.language}",
        f"- Platform: {scope.platform}", f"- Dtypes: {', '.join(scope.dtypes) or 'any seen'}",
        f"- Prior actions: {', '.join(scope.prior_actions) or 'none'}"]) + "\n")
    before, after = _before_after(card.vector)
    parts.append("## Code Change\n\n### Before\n\n" + _fence(before, "cuda") + "\n\n### After\n\n"
                 + _fence(after, "cuda") + "\n\n### Diff\n\n" + _fence(card.vector, "diff") + "\n")
    parts.append("## Evidence\n\n" + "\n".join(f"- {r}" for r in card.evidence) + "\n")
    embedded = card.to_json().replace(">", "\\u003e").rstrip("\n")
    parts.append(f"{_CARD_OPEN}\n{embedded}\n-->\n")
    return "\n".join(parts)


def _precondition_line(p: Precondition) -> str:
    if p.source == SOURCE:  # where it pays: its support is the cases measured on each side
        return (f"- {p.sentence[0].upper()}{p.sentence[1:]} (`{p.expression}`; holds on {len(p.holds)} case(s): "
                f"{', '.join(p.holds)}; fails on {len(p.fails)}: {', '.join(p.fails)}; from per-case timings)")
    return (f"- {p.sentence} (`{p.expression}`; sound on {len(p.holds)} case(s), refused on {len(p.fails)};"
            f" from {p.source})")


def _did_not_pay(card: SkillCard) -> list[str]:
    """Held-out trials the gate passed only slower than the card's effects ask: where the mechanism
    did not pay (each target once; a resumed admission may log the same reading again)."""
    from klineage.skills.admission import Reading, reading

    lines = []
    for trial in card.verification_log:
        if reading(trial) is Reading.SLOWER:
            first = trial.message.rsplit("first read as ", 1)[-1]  # a re-judged trial keeps its first message
            target = first.split(": ", 2)[1] if first.count(": ") >= 2 else trial.state[:12]
            line = f"- slower (did not pay) in a held-out trial on {target}: {trial.ratio:.3f}x"
            lines += [line] if line not in lines else []
    return lines


def skill_dir(card: SkillCard) -> str:
    return f"{card.transform}-{card.short_id}"


def export_skillmd(cards: list[SkillCard], folder: str | Path) -> list[Path]:
    """Write one `<transform>-<short id>/SKILL.md` per card; returns the files written."""
    folder = Path(folder)
    written = []
    for card in cards:
        path = folder / skill_dir(card) / SKILL_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(card), encoding="utf-8")
        written.append(path)
    return written


def parse(text: str, where: str = SKILL_FILE) -> SkillCard:
    """The card a SKILL.md text carries, checked against its front matter."""
    if not text.startswith("---\n"):
        raise DocumentError(where, "no YAML front matter (the file must start with '---')")
    end = text.find("\n---\n", 4)
    if end < 0:
        raise DocumentError(where, "the YAML front matter is not closed with '---'")
    try:
        head = yaml.safe_load(text[4:end + 1])
    except yaml.YAMLError as exc:
        raise DocumentError(where, f"front matter is not YAML: {exc}") from None
    if not isinstance(head, dict):
        raise DocumentError(where, "front matter must be a mapping")
    found = _CARD_BLOCK.findall(text)
    if len(found) != 1:
        raise DocumentError(where, "no embedded card (<!-- klineage-card ... -->)" if not found
                            else "more than one embedded card")
    card = SkillCard.from_json(found[0], f"{where}: embedded card")
    expected = front_matter(card)
    for key, value in expected.items():
        if key not in head:
            raise DocumentError(where, f"front matter misses '{key}'")
        if head[key] != value:
            raise DocumentError(where, f"front matter '{key}' ({head[key]!r}) disagrees with the embedded card "
                                       f"({value!r}); edit the card, not the front matter")
    return card


def import_skillmd(folder: str | Path) -> list[SkillCard]:
    """Every card under `folder` (each `*/SKILL.md`, or a single SKILL.md), sorted by transform and id."""
    folder = Path(folder)
    if folder.is_file():
        files = [folder]
    elif folder.is_dir():
        files = sorted(folder.rglob(SKILL_FILE))
    else:
        raise DocumentError(str(folder), "no such folder")
    cards = [parse(path.read_text(encoding="utf-8"), str(path)) for path in files]
    ids = [c.id for c in cards]
    duplicates = sorted({i[:12] for i in ids if ids.count(i) > 1})
    if duplicates:
        raise DocumentError(str(folder), f"the same card appears more than once: {', '.join(duplicates)}")
    return sorted(cards, key=lambda c: (c.transform, c.id))
