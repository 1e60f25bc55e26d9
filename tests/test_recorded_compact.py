"""`klineage recorded compact`: plain verdict files rewritten as the .json.gz the store writes, with
nothing lost: a file that cannot be rewritten stays where it is, named with the reason."""

from __future__ import annotations

import json
from pathlib import Path

from klineage.cli import main
from klineage.gate.cache import PLAIN, VerdictStore, verdict_bytes
from klineage.gate.policy import QUICK
from klineage.gate.verdict import Status, Verdict


def verdict(case: str = "small") -> Verdict:
    return Verdict(status=Status.PASSED, kernel={"name": "k", "fingerprint": "a" * 64},
                   problem={"operator": "p", "fingerprint": "b" * 64}, cases=(case,), policy=QUICK.to_dict())


def plain_file(store: VerdictStore, key: str, text: str) -> Path:
    """A verdict file as older checkouts wrote them: indented JSON, uncompressed."""
    path = store.path(key, PLAIN)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def as_plain(found: Verdict) -> str:
    return json.dumps(found.to_dict(), indent=1, sort_keys=True) + "\n"


def compact(root: Path, capsys) -> tuple[int, str, str]:
    code = main(["recorded", "compact", str(root)])
    out, err = capsys.readouterr()
    return code, out, err


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_plain_files_become_the_gz_that_put_writes(tmp_path, capsys):
    store = VerdictStore(tmp_path)
    keys = ["1" * 64, "2" * 64]
    for key, case in zip(keys, ("small", "large"), strict=True):
        plain_file(store, key, as_plain(verdict(case)))
    store.put("3" * 64, verdict("big"))  # already compressed: left as it is

    code, out, err = compact(tmp_path, capsys)

    assert (code, err) == (0, "")
    assert "2 plain verdict files rewritten" in out
    assert store.files() == [store.path(k) for k in [*keys, "3" * 64]]
    for key, case in zip(keys, ("small", "large"), strict=True):
        assert store.path(key).read_bytes() == verdict_bytes(verdict(case))


def test_compacting_again_changes_nothing(tmp_path, capsys):
    store = VerdictStore(tmp_path)
    plain_file(store, "1" * 64, as_plain(verdict()))
    assert compact(tmp_path, capsys)[0] == 0
    before = tree(tmp_path)

    code, out, _ = compact(tmp_path, capsys)

    assert code == 0 and "0 plain verdict files rewritten" in out
    assert tree(tmp_path) == before


def test_a_plain_file_that_is_not_a_verdict_stays_and_is_named(tmp_path, capsys):
    store = VerdictStore(tmp_path)
    broken = plain_file(store, "1" * 64, '{"version": 1, "status": "passed"')  # cut short
    not_verdict = plain_file(store, "2" * 64, json.dumps({**verdict().to_dict(), "status": "maybe"}))
    good = plain_file(store, "3" * 64, as_plain(verdict()))

    code, out, err = compact(tmp_path, capsys)

    assert code == 1 and "1 plain verdict files rewritten" in out
    assert f"{broken}: corrupt verdict: " in err and f"{not_verdict}: corrupt verdict: " in err
    assert "2 plain verdict files left as they were" in err
    assert broken.exists() and not_verdict.exists() and not good.exists()
    assert not store.path("1" * 64).exists() and not store.path("2" * 64).exists()


def test_a_plain_file_the_store_would_rewrite_differently_stays(tmp_path, capsys):
    store = VerdictStore(tmp_path)
    plain = plain_file(store, "1" * 64, json.dumps({**verdict().to_dict(), "measured_by": "a newer gate"}))

    code, _, err = compact(tmp_path, capsys)

    assert code == 1 and f"{plain}: rewriting it through the store would change measured_by" in err
    assert plain.exists() and not store.path("1" * 64).exists()


def test_a_plain_file_beside_a_different_gz_of_its_key_stays(tmp_path, capsys):
    store = VerdictStore(tmp_path)
    packed = store.put("1" * 64, verdict("small"))
    plain = plain_file(store, "1" * 64, as_plain(verdict("large")))

    code, _, err = compact(tmp_path, capsys)

    assert code == 1 and f"{plain}: {packed.name} beside it holds a different verdict" in err
    assert plain.read_text(encoding="utf-8") == as_plain(verdict("large"))
    assert packed.read_bytes() == verdict_bytes(verdict("small"))


def test_a_plain_file_beside_the_same_gz_of_its_key_goes(tmp_path, capsys):
    store = VerdictStore(tmp_path)
    packed = store.put("1" * 64, verdict())
    plain = plain_file(store, "1" * 64, as_plain(verdict()))

    assert compact(tmp_path, capsys)[0] == 0
    assert not plain.exists() and store.files() == [packed]


def test_a_misplaced_plain_file_stays(tmp_path, capsys):
    store = VerdictStore(tmp_path)
    misplaced = tmp_path / "verdicts" / "00" / f"{'1' * 64}.json"
    misplaced.parent.mkdir(parents=True)
    misplaced.write_text(as_plain(verdict()), encoding="utf-8")

    code, _, err = compact(tmp_path, capsys)

    assert code == 1 and f"{misplaced}: misplaced" in err
    assert store.files() == [misplaced]


def test_a_folder_that_is_not_a_recorded_store_is_refused(tmp_path, capsys):
    code, _, err = compact(tmp_path / "recroded", capsys)
    assert code == 2 and "not a recorded store" in err
