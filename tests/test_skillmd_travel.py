"""SKILL.md that travels: the exported bundled library passes the Agent Skills reference validator
(`skills-ref`), carries a card the reference implementation's loader accepts, survives export -> import
-> export byte for byte, and `klineage library import` reads any folder with a report per file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from skills_ref.validator import validate

from klineage.skills.card import CardStatus
from klineage.skills.library import Library, load_library, save_library
from klineage.skills.skillmd import REFERENCE_CARD, SKILL_FILE, export_skillmd, import_skillmd, read_folder

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "corpus" / "library" / "library.json"
SKILLS = Path(__file__).parent / "fixtures" / "formats" / "skills"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Library, Path, list[Path]]:
    library = load_library(BUNDLED)
    folder = tmp_path_factory.mktemp("exported")
    return library, folder, export_skillmd(list(library.cards), folder)


def test_every_exported_bundled_card_passes_the_agent_skills_validator(exported):
    library, _, files = exported
    assert len(files) == len(library.cards) == 27
    problems = {path.parent.name: validate(path.parent) for path in files}
    assert {name: errors for name, errors in problems.items() if errors} == {}


def test_the_validator_refuses_what_the_old_export_wrote(tmp_path):
    """The check is not vacuous: underscores in the name and top-level card fields are refused."""
    skill = tmp_path / "block_swizzle-53fa5120a1e7"
    skill.mkdir()
    (skill / SKILL_FILE).write_text("---\nname: block_swizzle-53fa5120a1e7\ndescription: x\nskill_id: abc\n---\n")
    errors = " ".join(validate(skill))
    assert "invalid characters" in errors and "Unexpected fields in frontmatter: skill_id" in errors


# The reference implementation's load_skill, its rules restated: the whole file is "---\n", a YAML
# mapping of exactly four fields, "\n---\n\n" and a non-empty body; scope has exactly cases,
# languages and platforms (non-empty string lists); preconditions a non-empty string list; intent one line.
REFERENCE_MARKDOWN = re.compile(r"---\n(.*?)\n---\n\n(.*)", re.DOTALL)


def reference_load(path: Path) -> dict:
    match = REFERENCE_MARKDOWN.fullmatch(path.read_text(encoding="utf-8"))
    assert match is not None, f"{path}: no front matter and sections"
    head = yaml.safe_load(match[1])
    assert set(head) == {"skill_id", "intent", "preconditions", "scope"}, sorted(head)
    assert set(head["scope"]) == {"cases", "languages", "platforms"}
    for values in (head["preconditions"], *head["scope"].values()):
        assert isinstance(values, list) and values and all(isinstance(v, str) and v.strip() for v in values)
    assert isinstance(head["intent"], str) and len(head["intent"].splitlines()) == 1
    assert match[2].strip()
    return {**head, "body": match[2]}


def test_each_card_carries_a_card_the_reference_loader_reads(exported):
    library, _, files = exported
    by_id = {c.id: c for c in library.cards}
    for path in files:
        card = reference_load(path.parent / REFERENCE_CARD)
        ours = by_id[card["skill_id"]]
        assert card["scope"]["cases"] == list(ours.scope.operators)
        for section in ("## Overview", "## Precondition", "## Scope", "## Code Change Snippet", "### Before",
                        "### After"):
            assert section in card["body"]
    theirs = reference_load(SKILLS / "reference-card" / "tile-smem" / SKILL_FILE)
    assert theirs["skill_id"] == "stage_tiles_in_shared_memory"


def test_export_import_export_is_byte_identical(exported, tmp_path):
    _, first, _ = exported
    export_skillmd(import_skillmd(first), tmp_path)
    ours = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert ours == theirs and len(ours) == 2 * 27
    assert all((first / p).read_bytes() == (tmp_path / p).read_bytes() for p in ours)


def test_read_folder_reports_every_file_and_one_bad_file_aborts_nothing(exported, tmp_path):
    library, first, files = exported
    shutil.copytree(SKILLS, tmp_path / "mixed")
    shutil.copytree(files[0].parent, tmp_path / "mixed" / files[0].parent.name)
    reports = {Path(r.path).parent.name: r for r in read_folder(tmp_path / "mixed")}
    assert {name: (r.form, r.outcome.value) for name, r in reports.items()} == {
        files[0].parent.name: ("klineage", "taken"), "tile-smem": ("reference", "refused"),
        "explain-occupancy": ("agent_skill", "refused"), "no-front": ("unreadable", "refused")}
    assert "reference card 'stage_tiles_in_shared_memory'" in reports["tile-smem"].message
    assert "nothing this gate could materialize" in reports["explain-occupancy"].message
    assert "no YAML front matter" in reports["no-front"].message


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klineage", "library", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_library_import_keeps_imported_cards_apart(exported, tmp_path):
    library, _, files = exported
    # A library without the first two cards; a folder with them, a reference card and a broken file.
    target = tmp_path / "library.json"
    save_library(Library(cards=library.cards[2:], provenance=library.provenance), target)
    folder = tmp_path / "incoming"
    for path in files[:2]:
        shutil.copytree(path.parent, folder / path.parent.name)
    shutil.copytree(SKILLS / "reference-card", folder / "reference-card")
    shutil.copytree(SKILLS / "broken", folder / "broken")
    done = run_cli("import", str(folder), "--library", str(target), "--json")
    assert done.returncode == 0, done.stderr
    outcomes = sorted((r["form"], r["outcome"]) for r in json.loads(done.stdout))
    assert outcomes == [("klineage", "taken"), ("klineage", "taken"), ("reference", "refused"),
                        ("unreadable", "refused")]
    after = load_library(target)
    imported = [c for c in after.cards if c.status is CardStatus.IMPORTED]
    assert sorted(c.id for c in imported) == sorted(c.id for c in library.cards[:2])
    assert all(c.verification_log == () for c in imported)  # trials judged elsewhere do not count here
    assert not {c.id for c in imported} & {c.id for c in after.admitted()}
    again = run_cli("import", str(folder), "--library", str(target), "--json")
    assert again.returncode == 1
    assert sum("already in the library (imported)" in r["message"] for r in json.loads(again.stdout)) == 2
