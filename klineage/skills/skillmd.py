"""SKILL.md export and import: one folder per card, loadable by coding agents and by the reference.

Layout: `<folder>/<name>/SKILL.md`, `name` being the transform with hyphens and the short id
(`unroll-loop-1a2b3c4d5e6f`). The front matter follows the Agent Skills rules: `name` (lowercase letters,
digits and single hyphens, at most 64 characters, the folder's name) and `description` (at most 1,024
characters) at the top, everything else under `metadata` as strings (`skill_id, transform, intent, status`,
and as JSON: `preconditions` (sentences), `predicates` (their expressions), `scope`, `requires`,
`provides`, `conflicts` (features as `locus/name`)). The body has the sections Overview, Preconditions,
When it pays (its timing precondition, or what its per-case effects show: "paid on all N cases measured"),
Risks (measured failures), Diagnostics (where its transform did not apply, or a case timing that is not
evidence, when any), Scope, Code Change (Before/After, from the vector diff) and Evidence.

The reference implementation's loader (`load_skill`) wants a front matter of exactly `skill_id, intent,
preconditions, scope` - the same place the Agent Skills rules give to `name` and `description`, so no
one file satisfies both: each folder also holds `references/klineage-card.md` in the reference's card
format (those four fields, scope as `cases, languages, platforms`; sections Overview, Precondition, Scope,
Code Change Snippet), which its loader reads as it is and agents read on demand.

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
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from klineage.errors import DocumentError
from klineage.gate.policy import Placement
from klineage.skills.admission_rule import short_of_todays_rule
from klineage.skills.card import Precondition, SkillCard
from klineage.skills.facts import meaning
from klineage.skills.trial_reading import Reading, reading
from klineage.skills.when import REPEATABILITY, SOURCE, card_when

SKILL_FILE = "SKILL.md"
REFERENCE_CARD = Path("references") / "klineage-card.md"
NAME_LIMIT, DESCRIPTION_LIMIT = 64, 1024
EXCHANGED_NOTE = "; re-timed with parent and child exchanging places"
_CARD_OPEN = "<!-- klineage-card"
_CARD_BLOCK = re.compile(r"<!-- klineage-card\n(.*?)\n-->", re.DOTALL)


def _feature_list(features: Any) -> list[str]:
    return [f"{f.locus}/{f.name}" for f in sorted(features)]


def skill_name(card: SkillCard) -> str:
    """The Agent Skills name (and folder): lowercase letters, digits and single hyphens, <= 64 characters."""
    stem = re.sub(r"[^a-z0-9]+", "-", card.transform.lower()).strip("-")[:NAME_LIMIT - len(card.short_id) - 1]
    return f"{stem.rstrip('-')}-{card.short_id}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def front_matter(card: SkillCard) -> dict[str, Any]:
    """The front matter of a card's SKILL.md: `name` and `description` for agents, the rest as string metadata."""
    first = card.preconditions[0].sentence if card.preconditions else ""
    description = card.intent + (f" Only when: {first}." if first else "")
    if len(description) > DESCRIPTION_LIMIT:
        description = description[:DESCRIPTION_LIMIT - 3].rstrip() + "..."
    return {
        "name": skill_name(card),
        "description": description,
        "metadata": {
            "skill_id": card.id,
            "transform": card.transform,
            "intent": card.intent,
            "status": card.status.value,
            "preconditions": _json([p.sentence for p in card.preconditions]),
            "predicates": _json([p.expression for p in card.preconditions]),
            "scope": _json(card.scope.to_dict()),
            "requires": _json(_feature_list(card.requires)),
            "provides": _json(_feature_list(card.provides)),
            "conflicts": _json(_feature_list(card.conflicts)),
        },
    }


def reference_card(card: SkillCard) -> str:
    """The card in the reference implementation's format, which its `load_skill` reads as it is."""
    scope = card.scope
    head = {
        "skill_id": card.id,
        "intent": " ".join(card.intent.split()),
        "preconditions": [p.sentence for p in card.preconditions] or ["none found in the evidence (any case in scope)"],
        "scope": {"cases": list(scope.operators) or ["*"], "languages": [scope.language],
                  "platforms": scope.platform.split(",")},
    }
    before, after = _before_after(card.vector)
    body = "\n\n".join([
        f"## Overview\n\n{card.intent}",
        "## Precondition\n\n" + "\n".join(f"- {p}" for p in head["preconditions"]),
        "## Scope\n\n" + "\n".join(f"- {k}: {', '.join(v)}" for k, v in head["scope"].items()),
        "## Code Change Snippet\n\n### Before\n\n" + _fence(before, "cuda")
        + "\n\n### After\n\n" + _fence(after, "cuda"),
    ])
    return f"---\n{yaml.safe_dump(head, sort_keys=False, allow_unicode=True)}---\n\n{body}\n"


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
    head = yaml.safe_dump(front_matter(card), sort_keys=False, allow_unicode=True, width=float("inf"))
    parts = [f"---\n{head}---\n", f"# {card.transform} ({card.short_id})\n"]
    drift = short_of_todays_rule(card)
    overview = [card.intent, "", f"Status: {card.status.value}{f' ({drift})' if drift else ''}. Acts on a "
                f"`{card.anchor.kind}`" + (f" (e.g. `{card.anchor.key}` in `{card.anchor.function}`)."
                                           if card.anchor.key else ".")]
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
    pre = [_precondition_line(p, card.scope.operators) for p in card.preconditions] or ["- None found in the evidence."]
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
        paying += ["", f"Per case (median child time / parent time over its steps; paid: >= {when.required}x with "
                       f"room for the gate's {REPEATABILITY:.1%} run-to-run spread, undecided: above {when.required}x "
                       f"by less):"]
        paying += [f"- {r.case}: {r.ratio:.3f}x, {r.outcome.value}"
                   + _held_clause(when.precondition, r.case)
                   for r in when.cases]
    parts.append("## When it pays\n\n" + "\n".join(paying) + "\n")
    risks = [f"- {r.category}: {r.description}" for r in card.risks] + _did_not_pay(card) or ["- None recorded."]
    parts.append("## Risks\n\nMeasured failures: gate rejections, and cases where it made the kernel slower.\n\n"
                 + "\n".join(risks) + "\n")
    if card.diagnostics:
        parts.append("## Diagnostics (did not apply, or a timing that is not evidence; not failures)\n\n"
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


def _precondition_line(p: Precondition, operators: tuple[str, ...]) -> str:
    if p.source == SOURCE:  # where it pays: its support is the cases measured on each side, and what it names
        terms = "; ".join(f"{name}: {meaning(name, operators)}" for name in sorted(p.names))
        return (f"- {p.sentence[0].upper()}{p.sentence[1:]} (`{p.expression}`; holds on {len(p.holds)} case(s): "
                f"{', '.join(p.holds)}; fails on {len(p.fails)}: {', '.join(p.fails)}; from per-case timings). "
                f"Where {terms}.")
    return (f"- {p.sentence} (`{p.expression}`; sound on {len(p.holds)} case(s), refused on {len(p.fails)};"
            f" from {p.source})")


def _did_not_pay(card: SkillCard) -> list[str]:
    """Held-out trials the gate passed only slower than the card's effects ask: where the mechanism
    did not pay (each target once; a resumed admission may log the same reading again)."""
    lines = []
    for trial in card.verification_log:
        if reading(trial) is Reading.SLOWER:
            first = trial.message.rsplit("first read as ", 1)[-1]  # a re-judged trial keeps its first message
            target = first.split(": ", 2)[1] if first.count(": ") >= 2 else trial.state[:12]
            line = f"- slower (did not pay) in a held-out trial on {target}: {trial.ratio:.3f}x"
            lines += [line] if line not in lines else []
    return lines


def skill_dir(card: SkillCard) -> str:
    return skill_name(card)


def export_skillmd(cards: list[SkillCard], folder: str | Path) -> list[Path]:
    """Write one `<name>/SKILL.md` (and its `references/klineage-card.md`) per card; returns the SKILL.md files."""
    folder = Path(folder)
    written = []
    for card in cards:
        path = folder / skill_dir(card) / SKILL_FILE
        (path.parent / REFERENCE_CARD).parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(card), encoding="utf-8")
        (path.parent / REFERENCE_CARD).write_text(reference_card(card), encoding="utf-8")
        written.append(path)
    return written


def _front(text: str, where: str) -> dict[str, Any]:
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
    return head


def parse(text: str, where: str = SKILL_FILE) -> SkillCard:
    """The card a SKILL.md text carries, checked against its front matter."""
    head = _front(text, where)
    found = _CARD_BLOCK.findall(text)
    if len(found) != 1:
        raise DocumentError(where, "no embedded card (<!-- klineage-card ... -->)" if not found
                            else "more than one embedded card")
    card = SkillCard.from_json(found[0], f"{where}: embedded card")
    expected = front_matter(card)
    flat_head = {**{k: v for k, v in head.items() if k != "metadata"}, **(head.get("metadata") or {})}
    for key, value in {**{k: v for k, v in expected.items() if k != "metadata"}, **expected["metadata"]}.items():
        if key not in flat_head:
            raise DocumentError(where, f"front matter misses '{key}'")
        if flat_head[key] != value:
            raise DocumentError(where, f"front matter '{key}' ({flat_head[key]!r}) disagrees with the embedded card "
                                       f"({value!r}); edit the card, not the front matter")
    return card


class ImportOutcome(str, Enum):
    TAKEN = "taken"
    REFUSED = "refused"


@dataclass(frozen=True)
class FileReport:
    """What `read_folder` made of one SKILL.md: the card it took, or why it refused the file."""

    path: str
    form: str  # klineage | reference | agent_skill | unreadable
    outcome: ImportOutcome
    message: str
    card: SkillCard | None = None


REFERENCE_FIELDS = {"skill_id", "intent", "preconditions", "scope"}
_NOT_MATERIALIZABLE = ("carries no KLineage card (transform, anchor, code vector): nothing this gate could "
                       "materialize and trial")


def _read_one(path: Path) -> FileReport:
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
        head = _front(text, where)
        if _CARD_OPEN in text:
            card = parse(text, where)
            return FileReport(where, "klineage", ImportOutcome.TAKEN, f"card {card.short_id} ({card.transform})", card)
        if set(head) == REFERENCE_FIELDS:
            return FileReport(where, "reference", ImportOutcome.REFUSED,
                              f"reference card '{head['skill_id']}' ({head['intent']!r}, "
                              f"{len(head['preconditions'] or [])} precondition(s)) {_NOT_MATERIALIZABLE}")
        if "name" in head and "description" in head:
            return FileReport(where, "agent_skill", ImportOutcome.REFUSED,
                              f"agent skill '{head['name']}' {_NOT_MATERIALIZABLE}")
        raise DocumentError(where, f"front matter fields {sorted(map(str, head))} are neither this project's, the "
                                   "reference's (skill_id, intent, preconditions, scope) nor an agent skill's "
                                   "(name, description)")
    except (DocumentError, UnicodeDecodeError, OSError, KeyError, TypeError) as exc:
        return FileReport(where, "unreadable", ImportOutcome.REFUSED, str(exc))


def read_folder(folder: str | Path) -> list[FileReport]:
    """A report per SKILL.md under `folder` (or for one file): one bad file never stops the rest."""
    folder = Path(folder)
    if folder.is_file():
        files = [folder]
    elif folder.is_dir():
        files = sorted(folder.rglob(SKILL_FILE))
    else:
        raise DocumentError(str(folder), "no such folder")
    reports, seen = [], set()
    for path in files:
        report = _read_one(path)
        if report.card is not None and report.card.id in seen:
            report = FileReport(report.path, report.form, ImportOutcome.REFUSED,
                                f"card {report.card.short_id} appears more than once in the folder")
        seen |= {report.card.id} if report.card is not None else set()
        reports.append(report)
    return reports


def import_skillmd(folder: str | Path) -> list[SkillCard]:
    """Every card under `folder` (each `*/SKILL.md`, or a single SKILL.md), sorted by transform and id;
    the first file that is not this project's SKILL.md is an error (`read_folder` reports them all)."""
    reports = read_folder(folder)
    for report in reports:
        if report.outcome is ImportOutcome.REFUSED:
            raise DocumentError(report.path, report.message)
    return sorted((r.card for r in reports), key=lambda c: (c.transform, c.id))


def _held_clause(precondition: Precondition | None, case: str) -> str:
    held = precondition.holds_on(case) if precondition else None
    return "" if held is None else f"; the precondition {'holds' if held else 'fails'}"
