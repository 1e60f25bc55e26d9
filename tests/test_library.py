"""The skill library: built from the committed dry walk of row_softmax/warp_vec4 with the real
problem's cases, saved as canonical JSON, loaded back (also from a SKILL.md folder), validated
(versions, unknown keys, duplicate cards and lineages), looked up by id, and driven through
`klineage library build|show|export|admit`. The bundled library is checked against the lineages it
names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from klineage.cli import main
from klineage.documents import document_files
from klineage.errors import DocumentError, KLineageError
from klineage.lineage import Lineage
from klineage.skills.card import CardStatus
from klineage.skills.induction import induce, lineage_id
from klineage.skills.library import (
    LIBRARY_VERSION,
    Library,
    build_library,
    corpus_lineages,
    load_library,
    problem_infos,
    save_library,
)
from klineage.skills.skillmd import export_skillmd
from klineage.walk.timing_audit import retimed_effect

ROOT = Path(__file__).resolve().parents[1]
DRY = ROOT / "corpus" / "lineages" / "row_softmax_warp_vec4.dry.json"
BUNDLED = ROOT / "corpus" / "library" / "library.json"


@pytest.fixture(scope="module")
def lineage() -> Lineage:
    return Lineage.load(DRY)


@pytest.fixture(scope="module")
def library(lineage) -> Library:
    return build_library([lineage], problem_infos({"row_softmax"}), {"gpu": "none", "note": "test"})


def test_build_is_induction_plus_provenance(lineage, library):
    assert library.cards == tuple(induce([lineage], problem_infos({"row_softmax"})))
    assert library.provenance == {"gpu": "none", "note": "test", "lineages": [lineage_id(lineage)],
                                  "gate_modes": ["compile"]}
    assert library.version == LIBRARY_VERSION
    assert library.admitted() == ()  # a dry walk admits nothing
    assert {c.status for c in library.cards} == {CardStatus.CANDIDATE}


def test_saved_json_is_canonical_and_loads_back(library, tmp_path):
    first = save_library(library, tmp_path / "a" / "library.json")
    second = save_library(load_library(first), tmp_path / "b.json")
    assert first.read_bytes() == second.read_bytes()
    data = json.loads(first.read_text())
    assert list(data) == ["cards", "provenance", "version"] and data["version"] == 1
    assert load_library(first) == library


def test_a_skillmd_folder_loads_as_a_library(library, tmp_path):
    export_skillmd(list(library.cards), tmp_path / "skills")
    loaded = load_library(tmp_path / "skills")
    assert loaded.cards == library.cards
    assert loaded.provenance["imported_from"] == "skillmd"


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(version=2), "unsupported version 2"),
    (lambda d: d.update(extra=1), "unknown keys ['extra']"),
    (lambda d: d.pop("provenance"), "missing ['provenance']"),
    (lambda d: d.update(cards={}), "must be a list"),
    (lambda d: d["cards"].append(d["cards"][0]), "is already cards[0]"),
    (lambda d: d["cards"][0].update(status="approved"), "unknown value 'approved'"),
])
def test_bad_documents_are_refused_naming_the_problem(library, change, message):
    data = json.loads(json.dumps(library.to_dict()))
    change(data)
    with pytest.raises(DocumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Library.from_dict(data)


def test_provenance_must_be_plain_json(library):
    with pytest.raises(DocumentError, match="plain JSON"):
        Library(library.cards, {"when": object()})


def test_by_id_takes_a_full_id_or_a_unique_prefix(library):
    card = library.cards[0]
    assert library.by_id(card.id) is card and library.by_id(card.short_id) is card
    with pytest.raises(KLineageError, match="no card 'zzz'"):
        library.by_id("zzz")
    many = Library(tuple(dataclasses.replace(card, id="", transform=f"t{i}") for i in range(17)), {})
    first = [c.id[0] for c in many.cards]  # 17 ids, 16 hex digits: two share a first digit
    shared = next(d for d in first if first.count(d) > 1)
    with pytest.raises(KLineageError, match="names [0-9]+ cards"):
        many.by_id(shared)


def test_the_same_lineage_twice_is_refused(lineage):
    with pytest.raises(KLineageError, match="more than once"):
        build_library([lineage, lineage], None, {})
    with pytest.raises(KLineageError, match="filled in from the lineages"):
        build_library([lineage], None, {"lineages": []})


def test_corpus_lineages_keeps_the_longest_walk_per_expert(lineage, tmp_path):
    shorter = dataclasses.replace(lineage, transitions=lineage.transitions[:3], states=lineage.states[:4],
                                  termination=dataclasses.replace(lineage.termination),
                                  limits=dataclasses.replace(lineage.limits, max_steps=3),
                                  stats=dataclasses.replace(lineage.stats, accepted=3))
    shorter.save(tmp_path / "a_short.json")
    lineage.save(tmp_path / "b_long.json")
    kept, left = corpus_lineages(tmp_path)
    assert kept == [lineage] and left == [tmp_path / "a_short.json"]


def test_cli_build_show_and_export(tmp_path, capsys):
    out = tmp_path / "library.json"
    assert main(["library", "build", str(DRY), "--out", str(out), "--note", "from a test"]) == 0
    built = load_library(out)
    assert built.provenance["note"] == "from a test" and built.provenance["gate_modes"] == ["compile"]
    assert "no roundtrip trials" in built.provenance["admission"]
    assert f"{len(built.cards)} cards" in capsys.readouterr().out
    assert main(["library", "show", "--library", str(out), built.cards[0].short_id]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == built.cards[0].id
    assert main(["library", "export", str(tmp_path / "skills"), "--library", str(out)]) == 0
    assert load_library(tmp_path / "skills").cards == built.cards
    assert main(["library", "show", "--library", str(tmp_path / "missing.json")]) == 2
    assert "no such library file" in capsys.readouterr().err


def test_the_bundled_library_matches_its_lineages():
    """The bundled library is what the H200 built and admitted: its cards are exactly those its
    named lineages induce (effects re-timed with places exchanged where a step was), each with the
    roundtrip trials the admission logged."""
    assert BUNDLED.is_file(), "no bundled library: run `klineage library build` and `admit` on a GPU host"
    bundled = load_library(BUNDLED)
    named = bundled.provenance["lineages"]
    committed = {
        lineage_id(lin): lin for lin in map(Lineage.load, document_files(ROOT / "corpus" / "lineages"))
    }
    assert set(named) <= set(committed), "the bundled library names a lineage that is not committed"
    lineages = [committed[name] for name in named]
    problems = problem_infos({lin.problem.operator for lin in lineages})
    rebuilt = build_library(lineages, problems, {}, retimed_effect).cards
    untried = [dataclasses.replace(c, verification_log=(), status=CardStatus.CANDIDATE) for c in bundled.cards]
    assert untried == list(rebuilt), "corpus/library/library.json does not match the lineages it names"
    admitted = bundled.admitted()
    assert "under the gpu gate" in bundled.provenance["admission"] and admitted
    for card in admitted:  # admitted only on a passed, timed trial
        assert any(t.passed and t.ratio for t in card.verification_log), card.short_id
    assert all(c.status in (CardStatus.CANDIDATE, CardStatus.ADMITTED) for c in bundled.cards)


def test_cli_admit_logs_every_trial_and_admits_nothing_without_timing(tmp_path, monkeypatch, capsys, gate_cache):
    monkeypatch.delenv("KLINEAGE_GATE", raising=False)
    bundled = load_library(BUNDLED)
    # an admitted restrict card: its one trial compiles a small kernel (the first admitted card's, a GEMM, took 30 s)
    card = next(c for c in bundled.cards if c.short_id == "38bb8e9bd28d")
    assert card.status is CardStatus.ADMITTED
    out = tmp_path / "admitted.json"
    assert main(["library", "admit", "--library", str(BUNDLED), "--gate", "compile", "--card", card.short_id,
                 "--limit", "1", "--out", str(out)]) == 0
    count = len(bundled.admitted())
    assert f"admitted cards {count} -> {count}" in capsys.readouterr().out
    after = load_library(out)
    *before, trial = after.by_id(card.id).verification_log
    assert tuple(before) == card.verification_log
    assert trial.message.startswith("inconclusive: ") and "compiled verdict" in trial.message
    assert after.by_id(card.id).status is CardStatus.ADMITTED  # an inconclusive trial changes nothing
    assert [c.verification_log for c in after.cards if c.id != card.id] == \
        [c.verification_log for c in bundled.cards if c.id != card.id]
    assert "under the compile gate" in after.provenance["admission"]


SESSION_5 = ROOT / "bench" / "results" / "skills-parts" / "session-5" / "library.json"


def test_a_rebuild_keeps_every_trial_and_the_status_of_unchanged_cards_only(tmp_path, capsys):
    """The corpus's lineages rebuilt with the trials of an older H200-admitted library (session 5's,
    from before conv2d's re-walk): a card unchanged, or changed only in effects that ask a trial the
    same ratio, keeps its trials and status; any other changed one keeps its trials as history and
    is a candidate again."""
    from klineage.skills.admission import carry_trials, judged_alike
    from klineage.skills.admission_rule import card_digest, when_allows

    admitted_on_gpu = load_library(SESSION_5)
    out = tmp_path / "rebuilt.json"
    assert main(["library", "build", "--keep-trials", str(SESSION_5), "--out", str(out)]) == 0
    rebuilt = load_library(out)
    earlier = {c.id: c for c in admitted_on_gpu.cards}
    tried = [c for c in rebuilt.cards if c.id in earlier and earlier[c.id].verification_log]
    same = {c.id for c in tried if card_digest(earlier[c.id]) == card_digest(c) or judged_alike(earlier[c.id], c)}
    changed = {c.id for c in tried} - same
    assert same and changed and any(card_digest(earlier[i]) != card_digest(rebuilt.by_id(i)) for i in same)
    printed = capsys.readouterr().out
    assert (f"carried the trials and status of {len(same)} card(s) over from {SESSION_5} (unchanged, or changed "
            f"only in effects under which every recorded trial reads the same); {len(changed)} changed card(s) "
            f"keep their trials as history, candidates again") in printed
    kept_out = 0
    for card in rebuilt.cards:
        old = earlier.get(card.id)
        assert card.verification_log == (old.verification_log if old else ()), card.short_id
        # a carried status stands unless the card's per-case effects keep it out of admission
        assert card.status is (when_allows(card, old.status) if card.id in same else CardStatus.CANDIDATE)
        if card.id in same and card.status is not old.status:
            kept_out += 1
            assert f"{card.short_id} {card.transform:20s} admitted -> {card.status.value}: " in printed
    assert kept_out  # the corpus's per-case timings show cards that pay on none of their cases
    assert carry_trials(rebuilt, admitted_on_gpu)[0].cards == rebuilt.cards  # carrying twice changes nothing
    twice = tmp_path / "twice.json"  # rebuilt again keeping the rebuilt library's trials: its provenance says
    assert main(["library", "build", "--keep-trials", str(out), "--out", str(twice)]) == 0  # what it carried once
    assert load_library(twice).provenance["admission"].count("carried over to this build") == 1


def test_the_bundled_library_is_the_corpus_rebuilt_with_its_own_trials(tmp_path):
    """The bundled library was built from corpus/lineages and admitted on the H200: rebuilt from
    the same lineages with its own trials kept, it comes back card for card (no card drifted from
    its lineages), and each admitted card has a passing trial of its very content."""
    from klineage.skills.admission_rule import card_digest

    out = tmp_path / "rebuilt.json"
    bundled = load_library(BUNDLED)
    per_case = bundled.provenance.get("per_case", "use")  # as it was built: with the per-case timings or not,
    step_code = [] if "step_code" in bundled.provenance else ["--step-code", "none"]  # with the step-code record or not
    assert main(["library", "build", "--keep-trials", str(BUNDLED), "--per-case", per_case, *step_code,
                 "--out", str(out)]) == 0
    assert load_library(out).cards == bundled.cards
    admitted = [c for c in bundled.cards if c.status is CardStatus.ADMITTED]
    assert admitted
    for card in admitted:
        assert any(t.passed and t.basis is not None and t.basis.gpu != "none" for t in card.verification_log)
    # Each has passed a trial of its very content, but six whose effects were re-timed (session 16)
    # and still ask a trial the same ratio, and four more whose rewriter non-matches moved from their
    # risks to their diagnostics (issue 33; no trial reads either): their trials judged the content
    # before, by the same rule.
    untried = {c.short_id for c in admitted if not any(t.passed and t.basis.card == card_digest(c)
                                                         for t in c.verification_log)}
    assert untried == {"74abd4d35370", "8b17846092fa", "d892dce4bb76", "45fdcc3630ce", "535855ae6206",
                       "3b94a2d5fa95", "11ccff40d205", "2214f1bacac9", "56b114a1419c", "9d51e86623d2"}


def test_rejudging_the_gpu_admitted_library_retires_the_cards_admitted_on_no_gain(tmp_path, capsys):
    """Session 6 admitted the library on the H200 under an earlier rule (95% of the smallest declared
    effect, later half of it with a 0.99x floor); `--rejudge` reads its recorded trial ratios under today's
    rule and runs no gate. The tensor-core card's 7.098x trial passes; the trials that showed the kernel
    only no slower (0.994x to 1.006x) reproduced no gain and fail, and the cards admitted on them alone are
    retired: "admitted" no longer stands beside an effect that was never shown on a held-out target. Two
    devectorize cards passed theirs by less than the gate's run-to-run spread (1.012x and 1.015x against 1.010x):
    inconclusive today, so they are candidates again."""
    raw = ROOT / "bench" / "results" / "skills-parts" / "session-6" / "library-before-rejudge.json"
    out = tmp_path / "rejudged.json"
    assert main(["library", "admit", "--library", str(raw), "--rejudge", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "scalarize_mma        7.098x -> passed; candidate -> admitted" in printed
    assert "53fa5120a1e7 block_swizzle        0.995x -> failed; admitted -> retired" in printed
    assert "2214f1bacac9 devectorize          1.012x -> inconclusive; admitted -> candidate" in printed
    assert "13 trial(s) of 27 card(s) judged otherwise now, 7 status(es) changed" in printed
    before, now = load_library(raw), load_library(out)
    changed = {c.short_id: c.status for c, old in zip(now.cards, before.cards) if c.status != old.status}
    assert changed == {"53fa5120a1e7": CardStatus.RETIRED, "9d51e86623d2": CardStatus.RETIRED,
                       "727dba1cdffc": CardStatus.RETIRED, "d892dce4bb76": CardStatus.RETIRED,
                       "74abd4d35370": CardStatus.ADMITTED, "2214f1bacac9": CardStatus.CANDIDATE,
                       "56b114a1419c": CardStatus.CANDIDATE}
    for card in now.cards:
        if card.status is CardStatus.ADMITTED:
            assert any(t.passed and t.ratio is not None and t.ratio >= 1.01 * 1.015 for t in card.verification_log)
    assert "13 trial(s) re-judged from their recorded ratios and 7 status(es) decided again" in \
        now.provenance["admission"] and "(no gate ran)" in now.provenance["admission"]


def test_lanes_that_trialled_different_cards_join_by_the_longest_log(tmp_path):
    """Two GPU lanes admit different cards of one library; rebuilt with both libraries' trials kept,
    each card keeps the longer log, whichever lane wrote it."""
    from klineage.skills.card import Trial

    bundled = load_library(BUNDLED)
    first, second = [c for c in bundled.cards if c.verification_log][:2]

    def trialled(card):  # one more trial of the same content, as a lane's admission appends it
        extra = Trial("f" * 64, False, None, "inconclusive: a lane's trial", card.verification_log[-1].basis)
        return dataclasses.replace(card, verification_log=card.verification_log + (extra,))

    lanes = []
    for index, card in enumerate((first, second)):
        cards = tuple(trialled(c) if c.id == card.id else c for c in bundled.cards)
        path = tmp_path / f"library-{index}.json"
        save_library(dataclasses.replace(bundled, cards=cards), path)
        lanes.append(path)
    out = tmp_path / "joined.json"
    assert main(["library", "build", "--keep-trials", str(lanes[0]), "--keep-trials", str(lanes[1]),
                 "--out", str(out)]) == 0
    joined = {c.id: c for c in load_library(out).cards}
    for card in (first, second):
        assert joined[card.id].verification_log == trialled(card).verification_log
    untouched = next(c for c in bundled.cards if c.verification_log and c.id not in (first.id, second.id))
    assert joined[untouched.id].verification_log == untouched.verification_log


def test_cli_show_lists_each_cards_median_and_when(capsys, monkeypatch):
    """A card timed per case has dozens of effects: the listing gives their median and the card's when."""
    from klineage import report

    monkeypatch.setattr(report.console, "width", 240)  # made once a process, maybe by another test first
    percase = ROOT / "bench" / "results" / "percase" / "library.json"
    assert main(["library", "show", "--library", str(percase)]) == 0
    listing = capsys.readouterr().out
    store = next(line for line in listing.splitlines() if line.startswith("│ b9f2b940a428"))
    assert "1.00x of 18" in store and "where row_align >= 32 and s >= 70" in store
    assert "paid on all 15 cases" in listing and "paid on none of 1 case " in listing
