"""Importing the engine's documents: complete, idempotent, and all-or-nothing."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from dashboard_data import clear_dashboard_rows, corpus  # noqa: F401
from klineage import config
from klineage.corpus import list_kernels, list_problems
from klineage.documents import gzip_packed
from klineage.gate.cache import PLAIN, VerdictStore, read_verdict_file, verdict_file_key
from klineage.gate.verdict import Status
from klineage.gate.verdict import Verdict as EngineVerdict
from klineage.kernel import KernelState as EngineKernelState
from klineage.problem import ProblemInfo
from skills_app.importer import ImportRefused, import_corpus, link_verdicts, store_verdict
from skills_app.models import Kernel, KernelState, Problem, Verdict

pytestmark = pytest.mark.django_db

BUNDLED_KERNELS = len(list_kernels())
ADVERSARIAL_KERNELS = len(list_kernels(adversarial=True))
RECORDED = len(VerdictStore(config.recorded_dir()).keys())


def _counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in (Problem, KernelState, Kernel, Verdict)}


def _few_recorded(tmp_path: Path, key: str, others: int = 8) -> Path:
    """A recorded store of `key`'s verdict and `others` more: enough that an all-or-nothing import refused for one
    file would otherwise have stored the rest, without reading every recorded verdict again."""
    source, target = VerdictStore(config.recorded_dir()), tmp_path / "recorded"
    for kept in {key, *source.keys()[:others]}:
        path = source.path(kept)
        (target / path.relative_to(source.root)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / path.relative_to(source.root))
    return target


def _overwrite(recorded: Path, key: str, text: str) -> None:
    """Put `text` in a recorded store's file of `key`, gzip-compressed as the store writes it."""
    VerdictStore(recorded).path(key).write_bytes(gzip_packed(text.encode("utf-8")))


def _corpus_copy(tmp_path: Path) -> Path:
    """The bundled problems, kernels and adversarial suite, to edit, with no lineages: the tests that edit them look
    at kernels and verdicts, and copying, reading and auditing the 13 MB of committed lineages was half an import."""
    target = tmp_path / "corpus"
    for part in ("problems", "kernels", "adversarial"):
        shutil.copytree(config.corpus_dir() / part, target / part)
    (target / "lineages").mkdir()
    return target


def _a_recorded_verdict() -> tuple[str, dict]:
    """The first recorded verdict of a bundled kernel (optimization candidates are states of no kernel)."""
    bundled = {entry.load().fingerprint for entry in list_kernels()}
    for path in VerdictStore(config.recorded_dir()).files():
        document = read_verdict_file(path)
        if document["kernel"]["fingerprint"] in bundled:
            return verdict_file_key(path), document
    raise AssertionError("no recorded verdict of a bundled kernel")


def test_imports_every_bundled_document(corpus):
    assert Problem.objects.filter(current=True, bundled=True).count() == len(list_problems())
    assert Kernel.objects.filter(adversarial=False).count() == BUNDLED_KERNELS
    assert Kernel.objects.filter(adversarial=True).count() == ADVERSARIAL_KERNELS
    # Committed lineages (corpus/lineages/) add the states their walks reached, which belong to no kernel.
    assert KernelState.objects.filter(kernel__isnull=False).count() == BUNDLED_KERNELS + ADVERSARIAL_KERNELS
    assert not KernelState.objects.filter(kernel__isnull=True, steps_as_child__isnull=True).exists()
    assert Verdict.objects.count() == RECORDED
    assert set(Verdict.objects.values_list("served_from", flat=True)) == {Verdict.ServedFrom.RECORDED}
    # Every recorded verdict of a bundled problem names a state in the corpus, or an earlier source of
    # a corpus kernel (an expert edited after it was measured): those stay stored, unattached, and are
    # reported. The rest are the problem-format fixtures' gates (tests/fixtures/formats), kept for replay.
    problems = dict(Problem.objects.filter(current=True).values_list("operator", "fingerprint"))
    unlinked = Verdict.objects.filter(key__in=corpus.unlinked)
    assert unlinked.count() == len(corpus.unlinked)
    assert not unlinked.filter(operator__in=problems).exists()
    current = {k.current_state.name: k.current_state.fingerprint for k in Kernel.objects.all()}
    for verdict in Verdict.objects.filter(state__isnull=True, operator__in=problems):
        assert verdict.key in corpus.superseded and current[verdict.kernel_name] != verdict.kernel_fingerprint
    # Likewise a verdict measured against an earlier version of a corpus problem (gdn gained
    # VENDOR_TIMING) keeps its problem fingerprint and has no stored problem to attach to.
    for verdict in Verdict.objects.filter(problem__isnull=True, operator__in=problems):
        assert problems[verdict.operator] != verdict.problem_fingerprint, verdict
    hang = Kernel.objects.get(name="adversarial/hang")
    assert hang.expected_reason == "timeout" and hang.expected_why
    assert hang.problem.operator == "row_softmax" and hang.current_state.kernel == hang
    naive = Kernel.objects.get(name="row_softmax/naive")
    assert naive.current_state.name == "row_softmax_naive" and naive.current_state.arch == "sm_90"


def test_documents_round_trip_through_the_engine(corpus):
    for problem in Problem.objects.all():
        info = ProblemInfo.from_dict(problem.to_document())
        assert info.fingerprint == problem.fingerprint and info.operator == problem.operator
        assert not Path(problem.path).is_absolute()  # shown the same on every machine
    for state in KernelState.objects.all():
        assert EngineKernelState.from_dict(state.to_document()).fingerprint == state.fingerprint
    for verdict in Verdict.objects.all():
        assert EngineVerdict.from_dict(verdict.to_document()).to_dict() == verdict.document
        recorded = VerdictStore(config.recorded_dir()).get(verdict.key)
        assert recorded.to_dict() == verdict.document
        assert verdict.status == recorded.status.value
        assert verdict.reason == (recorded.reason.value if recorded.reason else "")
        # GPU verdicts name the GPU of their key (the H200's, and the H100's of the held-out operators timed
        # there); the adversarial kernels the gate rejects before any GPU run were recorded by a compile-only
        # gate, which names no GPU.
        parts = verdict.document["provenance"]["key_parts"]
        assert verdict.gpu == ("none" if parts["mode"] == "compile" else parts["gpu"])
        assert verdict.gpu in ("none", "NVIDIA H200", "NVIDIA H100 80GB HBM3")
        assert verdict.toolchain == "cuda-13.0"
        assert verdict.created is not None and verdict.git_commit


def test_status_choices_follow_the_engine():
    assert [value for value, _ in Verdict.StatusChoices.choices] == [s.value for s in Status]


def test_an_edited_kernel_gets_a_new_state_and_keeps_the_old(corpus, tmp_path):
    root = _corpus_copy(tmp_path)
    source = root / "kernels" / "row_softmax" / "naive" / "kernel.cu"
    source.write_text(source.read_text(encoding="utf-8") + "\n// a comment changes the fingerprint\n",
                      encoding="utf-8")
    kernel = Kernel.objects.get(name="row_softmax/naive")
    old = kernel.current_state
    verdicts_on_old = set(old.verdicts.values_list("key", flat=True))
    assert verdicts_on_old

    report = import_corpus(corpus_root=root)
    kernel.refresh_from_db()
    assert kernel.current_state != old
    assert report.counts["kernel states"]["created"] == 1
    assert set(kernel.states.values_list("fingerprint", flat=True)) == {old.fingerprint, kernel.fingerprint}
    assert set(old.verdicts.values_list("key", flat=True)) == verdicts_on_old  # history stays where it was
    assert not Verdict.objects.filter(state=kernel.current_state).exists()
    assert Kernel.objects.with_latest_verdict().get(pk=kernel.pk).latest_status is None


BROKEN_VERDICTS = {
    "not JSON": lambda doc: "{ this is not json",
    "unknown status": lambda doc: json.dumps({**doc, "status": "maybe"}),
    "rejected without findings": lambda doc: json.dumps({**doc, "status": "rejected", "findings": []}),
    "wrong version": lambda doc: json.dumps({**doc, "version": 99}),
    "NaN": lambda doc: json.dumps({**doc, "timings": {"run": float("nan")}}),
    "bad date": lambda doc: json.dumps({**doc, "provenance": {**doc["provenance"], "created": "yesterday"}}),
}


@pytest.mark.parametrize("damage", sorted(BROKEN_VERDICTS))
def test_a_malformed_verdict_refuses_the_whole_import(tmp_path, damage):
    clear_dashboard_rows()  # an empty database: anything stored would show
    key, document = _a_recorded_verdict()
    recorded = _few_recorded(tmp_path, key)
    _overwrite(recorded, key, BROKEN_VERDICTS[damage](document))

    with pytest.raises(ImportRefused) as refused:
        import_corpus(recorded_root=recorded)
    assert key in refused.value.where  # names the file
    assert _counts() == {"Problem": 0, "KernelState": 0, "Kernel": 0, "Verdict": 0}


def test_a_misnamed_or_misplaced_verdict_is_refused(tmp_path):
    clear_dashboard_rows()
    key, document = _a_recorded_verdict()
    recorded = _few_recorded(tmp_path, key)
    other = "f" * 64
    misnamed = VerdictStore(recorded).path(other, PLAIN)  # plain files are imported too
    misnamed.parent.mkdir(parents=True, exist_ok=True)
    misnamed.write_text(json.dumps(document), encoding="utf-8")  # provenance names another key
    with pytest.raises(ImportRefused, match="provenance names key"):
        import_corpus(recorded_root=recorded)
    misnamed.unlink()
    misplaced = recorded / "verdicts" / ("01" if key.startswith("00") else "00") / f"{key}.json"
    misplaced.parent.mkdir(parents=True, exist_ok=True)
    misplaced.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(ImportRefused, match="misplaced"):
        import_corpus(recorded_root=recorded)
    assert _counts()["Verdict"] == 0


def test_a_key_stored_both_plain_and_compressed_imports_once_unless_the_two_differ(tmp_path):
    clear_dashboard_rows()
    key, document = _a_recorded_verdict()
    recorded = _few_recorded(tmp_path, key)
    store = VerdictStore(recorded)
    kept = len(store.keys())
    store.put(key, EngineVerdict.from_dict(document))
    plain = store.path(key, PLAIN)
    plain.write_text(json.dumps(document), encoding="utf-8")
    import_corpus(recorded_root=recorded)
    assert Verdict.objects.filter(key=key).count() == 1 and _counts()["Verdict"] == kept > 1

    clear_dashboard_rows()
    plain.write_text(json.dumps({**document, "timings": {**document["timings"], "run": 1.0}}), encoding="utf-8")
    with pytest.raises(ImportRefused, match="differs from .*the same key's other file: keep one"):
        import_corpus(recorded_root=recorded)
    assert _counts()["Verdict"] == 0


def test_a_malformed_kernel_refuses_the_whole_import(tmp_path):
    clear_dashboard_rows()
    root = _corpus_copy(tmp_path)
    plan = root / "kernels" / "gemm" / "naive" / "launch.toml"
    plan.write_text(plan.read_text(encoding="utf-8").replace('arch = "sm_90"', 'arch = "sm_75"'), encoding="utf-8")
    with pytest.raises(ImportRefused, match="arch must be one of"):
        import_corpus(corpus_root=root)
    assert _counts() == {"Problem": 0, "KernelState": 0, "Kernel": 0, "Verdict": 0}


def test_a_wrong_expectation_is_refused(tmp_path):
    clear_dashboard_rows()
    root = _corpus_copy(tmp_path)
    (root / "adversarial" / "hang" / "expect.toml").write_text('reason = "slow"\n', encoding="utf-8")
    with pytest.raises(ImportRefused, match="expect.toml"):
        import_corpus(corpus_root=root)
    assert _counts()["Kernel"] == 0


def test_a_refused_import_leaves_earlier_data_untouched(corpus, tmp_path):
    before = _counts()
    documents = dict(Verdict.objects.values_list("key", "digest"))
    key, document = _a_recorded_verdict()
    recorded = _few_recorded(tmp_path, key)
    _overwrite(recorded, key, json.dumps({**document, "status": "maybe"}))
    (recorded / "verdicts" / "ab").mkdir(exist_ok=True)
    with pytest.raises(ImportRefused):
        import_corpus(recorded_root=recorded)
    assert _counts() == before
    assert dict(Verdict.objects.values_list("key", "digest")) == documents


def test_a_verdict_for_an_unknown_state_attaches_once_the_state_arrives(corpus):
    key, document = _a_recorded_verdict()
    state = KernelState.objects.get(fingerprint=document["kernel"]["fingerprint"])
    saved = state.to_document(), state.kernel
    Verdict.objects.filter(key=key).delete()
    Kernel.objects.filter(current_state=state).delete()
    state.delete()

    verdict, action = store_verdict(key, document)
    assert action == "created" and verdict.state is None and verdict.kernel_fingerprint == saved[0]["fingerprint"]
    from skills_app.importer import store_kernel_state

    store_kernel_state(saved[0])
    assert link_verdicts() >= 1
    verdict.refresh_from_db()
    assert verdict.state.fingerprint == saved[0]["fingerprint"]


def test_store_verdict_is_idempotent_and_updates_changed_documents(corpus):
    key, document = _a_recorded_verdict()
    _, action = store_verdict(key, document)
    assert action == "unchanged"
    changed = {**document, "timings": {**document["timings"], "run": 1.0}}
    verdict, action = store_verdict(key, changed)
    assert action == "updated" and verdict.document["timings"]["run"] == 1.0
    assert Verdict.objects.filter(key=key).count() == 1


def test_a_second_import_by_the_command_changes_nothing(corpus, tmp_path, capsys):
    """`load_corpus` over what is stored: every document unchanged, no problem probed again (known fingerprints),
    no row added or renumbered; a recorded file that is no verdict refuses the whole import, naming its key."""
    before, ids = _counts(), dict(Verdict.objects.values_list("key", "id"))
    call_command("load_corpus")
    out = capsys.readouterr().out
    assert f"verdicts: {RECORDED} (0 new, 0 updated, {RECORDED} unchanged)" in out
    assert "new problem files read through the sandboxed probe: 0" in out
    corpus_lines = "\n".join(line for line in out.splitlines() if not line.startswith("skill"))  # cards: not yet stored
    assert not re.search(r"\b[1-9]\d* (?:new|updated)", corpus_lines)
    lineages = re.search(r"^lineages: (\d+) \(0 new, 0 updated, (\d+) unchanged\)$", out, re.MULTILINE)
    assert lineages and lineages[1] == lineages[2] != "0", out  # the committed lineages and GPU walks, every one
    assert _counts() == before
    assert dict(Verdict.objects.values_list("key", "id")) == ids
    key, document = _a_recorded_verdict()
    recorded = _few_recorded(tmp_path, key)
    _overwrite(recorded, key, "[]")
    with pytest.raises(CommandError, match=f"nothing imported: .*{key}"):
        call_command("load_corpus", "--recorded", str(recorded))
