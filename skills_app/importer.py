"""Import the engine's documents into the database: the bundled corpus and recorded verdicts.

`import_corpus()` reads everything first (problems through the sandboxed probe, since a problem
file must never run in the web process; kernels through `klineage.corpus`; verdicts through
`VerdictStore`), checks every document with the engine's own parser, and only then writes, in
one transaction. A malformed document refuses the whole import with a message naming its file:
nothing is stored, not even what came before it.

Importing is idempotent: problems and kernel states are keyed by fingerprint, verdicts by key,
and a problem whose fingerprint is already stored is not probed again, so a second run with
nothing changed only reads files and compares digests.

`store_problem`, `store_kernel_state` and `store_verdict` take one document each; other code
(a job that produced a verdict) uses them inside its own transaction.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Subquery

from klineage import config
from klineage.config import GateMode
from klineage.corpus import KernelEntry, list_kernels, list_problems
from klineage.documents import document_files, read_document_text
from klineage.errors import DocumentError, KLineageError
from klineage.fingerprint import canonical_json, sha256_text
from klineage.gate.cache import GateCache, VerdictStore, load_verdict_file, verdict_file_key
from klineage.gate.execute import probe_problem, problem_fingerprint
from klineage.gate.verdict import Reason
from klineage.gate.verdict import Verdict as EngineVerdict
from klineage.kernel import KernelState as EngineKernelState
from klineage.lineage import Lineage as EngineLineage
from klineage.problem import ProblemInfo
from klineage.walk.timing_audit import DOUBTFUL, Pairing, StepPairing, step_pairings
from skills_app.models import Kernel, KernelState, Lineage, LineageStep, Problem, Verdict

_KEY = re.compile(r"[0-9a-f]{64}")
T = TypeVar("T")
CREATED, UPDATED, UNCHANGED = "created", "updated", "unchanged"


class ImportRefused(Exception):
    """A document is malformed; the import it was part of stored nothing."""

    def __init__(self, where: str, message: str):
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


@dataclass
class ImportReport:
    counts: dict[str, Counter] = field(default_factory=lambda: {k: Counter() for k in
                                                                 ("problems", "kernel states", "kernels", "verdicts",
                                                                  "lineages")})
    probed: int = 0  # problem files run through the sandboxed probe (the rest were known by fingerprint)
    unlinked: list[str] = field(default_factory=list)  # verdict keys whose kernel state is not stored here
    # ...of which these measured an earlier source of a corpus kernel (same plan name, edited since):
    # history, not a corpus error; they stay stored and unattached.
    superseded: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, kind: str, action: str) -> None:
        self.counts[kind][action] += 1

    @property
    def changed(self) -> bool:
        return any(c[CREATED] or c[UPDATED] for c in self.counts.values())

    def lines(self) -> list[str]:
        out = []
        for kind, counter in self.counts.items():
            total = sum(counter.values())
            out.append(f"{kind}: {total} ({counter[CREATED]} new, {counter[UPDATED]} updated, "
                       f"{counter[UNCHANGED]} unchanged)")
        out.append(f"new problem files read through the sandboxed probe: {self.probed}")
        if self.superseded:
            out.append(f"verdicts of earlier sources of corpus kernels: {len(self.superseded)}")
        if self.unlinked:
            out.append(f"verdicts for kernel states not stored here: {len(self.unlinked)}")
        out.append(f"took {self.seconds:.2f} s")
        return out


# ---------------------------------------------------------------------------------------------
# One document at a time. Callers hold the transaction.


def store_problem(info: dict[str, Any], *, path: str, bundled: bool, numerics: list[str] | tuple = (),
                  where: str = "problem") -> tuple[Problem, str]:
    """Store a ProblemInfo document (as the probe returned it); idempotent by fingerprint."""
    try:
        parsed = ProblemInfo.from_dict(info)
    except (KLineageError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ImportRefused(where, f"not a problem description: {_describe(exc)}") from None
    document = {**parsed.to_dict(), "path": path}
    _require_json(document, where)
    values = {"operator": parsed.operator, "info": document, "numerics": list(numerics), "path": path,
              "bundled": bundled}
    return _upsert(Problem, {"fingerprint": parsed.fingerprint}, values)


def store_kernel_state(document: dict[str, Any], *, kernel: Kernel | None = None,
                       where: str = "kernel state") -> tuple[KernelState, str]:
    """Store a KernelState document (source and plan); its fingerprint is checked, not trusted."""
    state = engine_check(lambda: EngineKernelState.from_dict(document, where), where, "kernel state")
    existing = KernelState.objects.filter(fingerprint=state.fingerprint).first()
    if existing is not None:  # content-addressed: same fingerprint, same source and plan
        if kernel is not None and existing.kernel_id is None:
            existing.kernel = kernel
            existing.save(update_fields=["kernel"])
            return existing, UPDATED
        return existing, UNCHANGED
    created = _state_row(state, kernel)
    created.save()
    return created, CREATED


def _state_row(state: EngineKernelState, kernel: Kernel | None = None) -> KernelState:
    return KernelState(fingerprint=state.fingerprint, source=state.source, plan=state.plan.to_dict(), kernel=kernel,
                       name=state.plan.name, operator=state.plan.problem, arch=state.plan.arch)


def _store_states(kernels: list[EngineKernelState]) -> dict[str, KernelState]:
    """Checked kernel states by fingerprint, the new ones stored: a lineage holds dozens, so those
    already stored are read in one query and the rest written in one batch."""
    wanted = {kernel.fingerprint: kernel for kernel in kernels}
    stored = KernelState.objects.in_bulk(list(wanted), field_name="fingerprint")
    new = [_state_row(kernel) for fingerprint, kernel in wanted.items() if fingerprint not in stored]
    stored.update((row.fingerprint, row) for row in KernelState.objects.bulk_create(new))
    return stored


def store_verdict(key: str, document: dict[str, Any], *, served_from: str = Verdict.ServedFrom.RECORDED,
                  where: str = "verdict") -> tuple[Verdict, str]:
    """Store a Verdict document under its cache key; linked to its state and problem when stored."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ImportRefused(where, f"verdict key {key!r} is not a sha256 hex digest")
    verdict = engine_check(lambda: EngineVerdict.from_dict(document), where, "verdict")
    values = _verdict_values(key, verdict, served_from, where)
    # Checked before the state and problem are looked up: a re-import finds most verdicts unchanged.
    existing = Verdict.objects.filter(key=key).first()
    if _verdict_unchanged(existing, values):
        return existing, UNCHANGED
    values["state"] = KernelState.objects.filter(fingerprint=values["kernel_fingerprint"]).first()
    values["problem"] = Problem.objects.filter(fingerprint=values["problem_fingerprint"]).first()
    return _write(Verdict, existing, {"key": key}, values)


def _verdict_values(key: str, verdict: EngineVerdict, served_from: str, where: str) -> dict[str, Any]:
    """A checked verdict's row, less its links to a stored state and problem."""
    data = verdict.to_dict()
    text = _json_text(data, where)
    provenance = data["provenance"]
    if provenance.get("key") not in (None, key):
        raise ImportRefused(where, f"stored under key {key[:12]} but its provenance names key "
                                   f"{str(provenance['key'])[:12]}")
    kernel, problem = data["kernel"], data["problem"]
    for part, fields in (("kernel", ("name", "fingerprint")), ("problem", ("operator", "fingerprint"))):
        for name in fields:
            if not isinstance(data[part].get(name), str) or not data[part][name]:
                raise ImportRefused(where, f"verdict {part} has no '{name}'")
    parts = provenance.get("key_parts") if isinstance(provenance.get("key_parts"), dict) else {}
    environment = data["environment"]
    against = parts.get("against", "")
    return {
        "kernel_fingerprint": kernel["fingerprint"],
        "kernel_name": kernel["name"],
        "problem_fingerprint": problem["fingerprint"],
        "operator": problem["operator"],
        "status": data["status"],
        "reason": data["reason"] or "",
        # A run that never reached the GPU has no environment.gpu; the key still names the GPU.
        "gpu": str(environment.get("gpu") or parts.get("gpu") or ""),
        "toolchain": str(environment.get("toolchain") or parts.get("toolchain") or ""),
        "mode": str(parts.get("mode", "")),
        "against": "" if against in ("", "none", None) else str(against),
        "cases": list(data["cases"]),
        "policy": data["policy"],
        "git_commit": str(provenance.get("git_commit", "")),
        "document": data,
        "digest": sha256_text(text),  # sha256_json(data), from the text already made
        "served_from": served_from,
        "created": _timestamp(provenance.get("created"), where),
    }


def _verdict_unchanged(row: Verdict | None, values: dict[str, Any]) -> bool:
    return row is not None and row.digest == values["digest"] and row.served_from == values["served_from"]


def _store_verdicts(verdicts: list[tuple[str, EngineVerdict, str]], served_from: str, report: ImportReport) -> None:
    """`store_verdict` for many checked verdicts at once: a corpus import meets thousands, so the rows
    they may replace and the states and problems they name are read in a few queries, and the new
    rows are written in batches rather than one statement each."""
    existing = Verdict.objects.in_bulk([key for key, _, _ in verdicts], field_name="key")
    states = dict(KernelState.objects.values_list("fingerprint", "id"))
    problems = dict(Problem.objects.values_list("fingerprint", "id"))
    new = []
    for key, verdict, where in verdicts:
        values = _verdict_values(key, verdict, served_from, where)
        row = existing.get(key)
        if _verdict_unchanged(row, values):
            report.count("verdicts", UNCHANGED)
            continue
        values["state_id"] = states.get(values["kernel_fingerprint"])
        values["problem_id"] = problems.get(values["problem_fingerprint"])
        if row is None:
            new.append(Verdict(key=key, **values))
            report.count("verdicts", CREATED)
        else:
            report.count("verdicts", _write(Verdict, row, {"key": key}, values)[1])
    Verdict.objects.bulk_create(new, batch_size=500)


# ---------------------------------------------------------------------------------------------
# The bundled corpus and the recorded store, all or nothing.


@dataclass
class _ProblemFile:
    path: Path
    display_path: str
    fingerprint: str
    info: dict[str, Any] | None  # None: already stored under this fingerprint, not probed
    numerics: tuple[str, ...] = ()


@dataclass
class _KernelFile:
    entry: KernelEntry
    adversarial: bool
    document: dict[str, Any]
    expected_reason: str = ""
    expected_why: str = ""


def import_corpus(*, corpus_root: Path | None = None, recorded_root: Path | None = None,
                  cache_dir: Path | None = None, walks_root: Path | None = None) -> ImportReport:
    """Import bundled problems and kernels (with the adversarial suite), their committed lineages
    and recorded verdicts. `walks_root`: a folder of GPU walks kept beside the corpus until its
    library is rebuilt from them (`*.gpu.json`, plain or `.gz`; by default `config.bench_walks_dir()`
    when the bundled corpus is imported, none for another corpus folder). They are shown like the
    corpus's lineages; a card's evidence names its lineage's gate mode, so it never points into them."""
    started = time.monotonic()
    if walks_root is None and corpus_root is None:
        walks_root = config.bench_walks_dir()
    corpus_root = Path(corpus_root or config.corpus_dir())
    try:
        walks = document_files(walks_root, "*.gpu.json") if walks_root is not None else []
        lineage_files = [*document_files(corpus_root / "lineages"), *walks]
    except DocumentError as exc:  # a walk stored both plain and as .gz
        raise ImportRefused(_display(Path(exc.where)), _message(exc)) from None
    recorded_root = Path(recorded_root or config.recorded_dir())
    cache_dir = Path(cache_dir or config.cache_dir())
    report = ImportReport()

    problems = _read_problems(corpus_root, cache_dir, report)
    kernels = _read_kernels(corpus_root)
    verdicts = _read_verdicts(VerdictStore(recorded_root))
    lineages = _read_lineages(lineage_files)

    with transaction.atomic():
        _store_problems(problems, report)
        _store_kernels(kernels, report)
        _store_verdicts(verdicts, Verdict.ServedFrom.RECORDED, report)
        for document, where in lineages:
            _, action = _store_lineage(document, where=where, source_path=where, recorded_root=recorded_root)
            report.count("lineages", action)
        link_verdicts()  # after the lineages: a GPU walk's verdicts name the states it reached
        unattached = Verdict.objects.filter(state__isnull=True)
        current = Kernel.objects.values_list("current_state__name", flat=True)
        report.superseded = sorted(unattached.filter(kernel_name__in=current).values_list("key", flat=True))
        report.unlinked = sorted(unattached.exclude(kernel_name__in=current).values_list("key", flat=True))
    report.seconds = time.monotonic() - started
    return report


def link_verdicts() -> int:
    """Attach verdicts to the kernel states and problems stored since they were."""
    states = KernelState.objects.filter(fingerprint=OuterRef("kernel_fingerprint")).values("id")[:1]
    problems = Problem.objects.filter(fingerprint=OuterRef("problem_fingerprint")).values("id")[:1]
    linked = Verdict.objects.filter(state__isnull=True).update(state=Subquery(states))
    linked += Verdict.objects.filter(problem__isnull=True).update(problem=Subquery(problems))
    return linked


def _read_problems(root: Path, cache_dir: Path, report: ImportReport) -> list[_ProblemFile]:
    known = set(Problem.objects.values_list("fingerprint", flat=True))
    files = []
    for path in list_problems(root):
        where = _display(path)
        try:
            fingerprint = problem_fingerprint(path)
        except KLineageError as exc:
            raise ImportRefused(where, str(exc)) from None
        if fingerprint in known:
            files.append(_ProblemFile(path, where, fingerprint, None))
            continue
        try:
            probe = probe_problem(path, cache_dir)  # runs the file in the sandbox, never here
        except KLineageError as exc:
            raise ImportRefused(where, f"the sandboxed probe refused it: {exc}") from None
        report.probed += 1
        files.append(_ProblemFile(path, where, probe.info.fingerprint, probe.info.to_dict(), probe.numerics))
    return files


def _read_kernels(root: Path) -> list[_KernelFile]:
    files = []
    for adversarial in (False, True):
        for entry in list_kernels(root, adversarial=adversarial):
            where = _display(entry.path)
            try:
                document = entry.load().to_dict()
            except KLineageError as exc:
                raise ImportRefused(where, str(exc)) from None
            reason = why = ""
            if adversarial:
                try:
                    expectation = entry.expectation
                except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                    raise ImportRefused(f"{where}/expect.toml", f"not valid TOML: {exc}") from None
                reason = expectation.get("reason", "")
                if reason not in {r.value for r in Reason}:
                    raise ImportRefused(f"{where}/expect.toml",
                                        f"expected reason {reason!r} is not one of the gate's reasons")
                why = str(expectation.get("why", ""))
            files.append(_KernelFile(entry, adversarial, document, reason, why))
    return files


def _read_verdicts(store: VerdictStore) -> list[tuple[str, EngineVerdict, str]]:
    """Every verdict file of the store, checked; a key stored both plain and as .json.gz is read once."""
    found: dict[str, tuple[str, EngineVerdict, str]] = {}
    for path in store.files():
        key, where = verdict_file_key(path), _display(path)
        if not _KEY.fullmatch(key):
            raise ImportRefused(where, "a recorded verdict's file name must be its key (64 hex digits)")
        if path.parent.name != key[:2]:
            raise ImportRefused(where, f"misplaced: a verdict with key {key[:12]} belongs in {key[:2]}/")
        try:
            verdict = load_verdict_file(path)
        except KLineageError as exc:
            raise ImportRefused(where, _message(exc)) from None
        if key in found and found[key][1] != verdict:  # two verdicts of one key: a person keeps one
            raise ImportRefused(where, f"differs from {found[key][2]}, the same key's other file: keep one "
                                       f"(`klineage recorded compact` names the pair)")
        found.setdefault(key, (key, verdict, where))
    return list(found.values())


def _store_problems(files: list[_ProblemFile], report: ImportReport) -> None:
    operators: dict[str, str] = {}
    current = []
    for item in files:
        if item.info is None:
            problem = Problem.objects.get(fingerprint=item.fingerprint)
            changed = problem.path != item.display_path or not problem.bundled
            if changed:
                problem.path, problem.bundled = item.display_path, True
                problem.info = {**problem.info, "path": item.display_path}
                problem.save(update_fields=["path", "bundled", "info", "updated_at"])
            action = UPDATED if changed else UNCHANGED
        else:
            problem, action = store_problem(item.info, path=item.display_path, bundled=True,
                                            numerics=item.numerics, where=item.display_path)
        if problem.operator in operators:
            raise ImportRefused(item.display_path, f"declares operator '{problem.operator}', as "
                                                   f"{operators[problem.operator]} does")
        operators[problem.operator] = item.display_path
        current.append(problem)
        report.count("problems", action)
    # Exactly one current problem per operator: the bundled file as it is now.
    ids = [p.id for p in current]
    Problem.objects.filter(current=True, bundled=True).exclude(id__in=ids).update(current=False)
    for problem in current:
        Problem.objects.filter(operator=problem.operator, current=True).exclude(id=problem.id).update(current=False)
        if not problem.current:
            Problem.objects.filter(id=problem.id).update(current=True)


def _store_kernels(files: list[_KernelFile], report: ImportReport) -> None:
    problems = {p.operator: p for p in Problem.objects.filter(current=True)}
    for item in files:
        where = _display(item.entry.path)
        state, state_action = store_kernel_state(item.document, where=where)
        report.count("kernel states", state_action)
        values = {
            "operator": state.operator,
            "problem": problems.get(state.operator),
            "current_state": state,
            "origin": Kernel.Origin.BUNDLED,
            "adversarial": item.adversarial,
            "expected_reason": item.expected_reason,
            "expected_why": item.expected_why,
        }
        kernel, action = _upsert(Kernel, {"name": item.entry.name}, values)
        report.count("kernels", action)
        if state.kernel_id is None:
            state.kernel = kernel
            state.save(update_fields=["kernel"])


# ---------------------------------------------------------------------------------------------
# Lineages: the whole document, its states, and one row per accepted step or rejected attempt.


def lineage_id(lineage: EngineLineage) -> str:
    """A lineage's id: the sha256 of its canonical text (equal lineages, equal ids)."""
    return hashlib.sha256(lineage.to_json().encode("utf-8")).hexdigest()


def import_lineage(document: Any, *, where: str = "lineage", source_path: str = "") -> tuple[Lineage, str]:
    """Import one lineage document, all or nothing; idempotent by content hash.

    The engine's `Lineage.from_dict` checks it first; a malformed document raises ImportRefused
    and stores nothing (not its states either)."""
    with transaction.atomic():
        return _store_lineage(document, where=where, source_path=source_path)


def export_lineage(lineage: Lineage) -> dict[str, Any]:
    """The engine document back, checked by the engine's parser on the way out."""
    return EngineLineage.from_dict(lineage.to_document()).to_dict()


def _parse_lineage(document: Any, where: str) -> EngineLineage:
    return engine_check(lambda: EngineLineage.from_dict(document), where, "lineage", "not a valid lineage: ")


def _store_lineage(document: Any, *, where: str, source_path: str = "",
                   recorded_root: Path | None = None) -> tuple[Lineage, str]:
    parsed = _parse_lineage(document, where)
    data = parsed.to_dict()
    _require_json(data, where)
    key = lineage_id(parsed)
    existing = Lineage.objects.filter(id=key).first()
    if existing is not None:
        action = UNCHANGED
        if source_path and existing.source_path != source_path:
            existing.source_path = source_path
            existing.save(update_fields=["source_path"])
            action = UPDATED
        if _reaudit_pairings(existing, parsed, recorded_root):  # imported before the audit, or a step re-timed since
            action = UPDATED
        return existing, action
    states = _store_states([state.kernel for state in parsed.states])  # checked by the parse above
    lineage = Lineage.objects.create(
        id=key,
        expert_state=states[parsed.expert.fingerprint],
        expert_name=parsed.expert.name,
        problem=Problem.objects.filter(fingerprint=parsed.problem.fingerprint).first(),
        operator=parsed.problem.operator,
        problem_fingerprint=parsed.problem.fingerprint,
        rewriter=parsed.rewriter,
        gate_mode=parsed.gate.value,
        assurance=parsed.assurance.value,
        termination_kind=parsed.termination.kind.value,
        termination_message=parsed.termination.message,
        stats=parsed.stats.to_dict(),
        accepted_count=parsed.stats.accepted,
        rejected_count=parsed.stats.rejected,
        source_path=source_path,
        document=data,
    )
    pairings = _pairings(key, parsed, recorded_root)
    steps = []
    for transition in parsed.transitions:
        forward = transition.forward
        pairing = pairings.get(transition.index)
        steps.append(LineageStep(
            lineage=lineage, kind=LineageStep.Kind.ACCEPTED, index=transition.index, branch_step=transition.index,
            transform=transition.transform, anchor=transition.anchor.to_dict(),
            parent_state=states[transition.parent], child_state=states[transition.child],
            backward_diff=transition.backward_diff, forward_diff=transition.forward_diff,
            features_removed=[f.to_dict() for f in transition.features_removed],
            features_added=[f.to_dict() for f in transition.features_added],
            forward_status=forward.status.value, forward_message=forward.message,
            forward_timing=forward.timing.to_dict() if forward.timing else None, note=transition.note,
            pairing=pairing.pairing.value if pairing else "", pairing_note=pairing.note if pairing else "",
            retimed_ratio=pairing.ratio if pairing else None))
    for position, rejection in enumerate(parsed.rejections):
        steps.append(LineageStep(
            lineage=lineage, kind=LineageStep.Kind.REJECTED, index=position, branch_step=rejection.step,
            transform=rejection.transform, anchor=rejection.anchor.to_dict() if rejection.anchor else None,
            parent_state=states[rejection.parent], rejection_category=rejection.category.value,
            rejection_reason=rejection.reason.value if rejection.reason else "",
            cases_failed=list(rejection.cases_failed), evidence=rejection.evidence.to_dict()))
    LineageStep.objects.bulk_create(steps)
    return lineage, CREATED


def _pairings(key: str, parsed: EngineLineage, recorded_root: Path | None) -> dict[int, StepPairing]:
    """A GPU walk's accepted steps by index, each marked where its parent or child timed differently
    in its two pairings (the forward ratio then measures the pairing: docs/perf-notes.md); none
    for a walk that timed nothing."""
    if parsed.gate is not GateMode.GPU:
        return {}
    root = Path(recorded_root or config.recorded_dir()).resolve()
    memo = (key, str(root))
    pairings = _PAIRINGS.get(memo) or step_pairings(parsed, GateCache(None, root))
    # Kept for the process (the corpus is imported again and again in tests): an audit that found
    # the walk's verdicts holds while they stand; one that found none is redone next time.
    if any(found.pairing is not Pairing.UNCHECKED for found in pairings):
        _PAIRINGS[memo] = pairings
    return {found.index: found for found in pairings}


def _reaudit_pairings(lineage: Lineage, parsed: EngineLineage, recorded_root: Path | None) -> bool:
    """Audit again the accepted steps of a stored GPU walk that a recording can change: those stored
    before the audit existed, and those whose timing was in doubt, the steps bench/retime.py re-times
    (one re-timed since with its kernels exchanging places becomes `exchanged`); whether any changed."""
    if parsed.gate is not GateMode.GPU:
        return False
    candidates = list(lineage.steps.filter(kind=LineageStep.Kind.ACCEPTED,
                                           pairing__in=["", *(p.value for p in DOUBTFUL)]))
    pairings = _pairings(lineage.id, parsed, recorded_root) if candidates else {}
    changed = [
        step
        for step in candidates
        if step.index in pairings
        and (step.pairing, step.retimed_ratio) != (pairings[step.index].pairing.value, pairings[step.index].ratio)
    ]
    for step in changed:
        found = pairings[step.index]
        step.pairing, step.pairing_note, step.retimed_ratio = found.pairing.value, found.note, found.ratio
    LineageStep.objects.bulk_update(changed, ["pairing", "pairing_note", "retimed_ratio"])
    return bool(changed)


_PAIRINGS: dict[tuple[str, str], list[StepPairing]] = {}  # (lineage id, recorded folder) -> its steps' pairings


def _read_lineages(paths: list[Path]) -> list[tuple[dict[str, Any], str]]:
    """Committed lineage files, each checked before anything is written."""
    found = []
    for path in paths:
        where = _display(path)
        document = read_json(path, where)
        _parse_lineage(document, where)
        found.append((document, where))
    return found


# ---------------------------------------------------------------------------------------------


def _upsert(model, lookup: dict[str, Any], values: dict[str, Any]):
    """Create, update or leave a row; says which. Compares before writing, so reruns write nothing."""
    return _write(model, model.objects.filter(**lookup).first(), lookup, values)


def _write(model, row, lookup: dict[str, Any], values: dict[str, Any]):
    """`_upsert` given the row `lookup` finds (None: there is none yet), read once by the caller."""
    if row is None:
        return model.objects.create(**lookup, **values), CREATED
    changed = [name for name, value in values.items() if _field_value(row, name) != _comparable(value)]
    if not changed:
        return row, UNCHANGED
    for name in changed:
        setattr(row, name, values[name])
    row.save()
    return row, UPDATED


def _field_value(row, name: str) -> Any:
    field = row._meta.get_field(name)
    return getattr(row, field.attname)


def _comparable(value: Any) -> Any:
    return value.pk if hasattr(value, "_meta") else value


def _require_json(document: Any, where: str) -> None:
    _json_text(document, where)


def _json_text(document: Any, where: str) -> str:
    """The document's canonical JSON text; refused where JSON (and PostgreSQL) cannot store it."""
    try:
        return canonical_json(document, allow_nan=False)
    except ValueError:
        raise ImportRefused(where, "holds NaN or Infinity, which JSON (and PostgreSQL) cannot store") from None
    except TypeError as exc:
        raise ImportRefused(where, f"holds a value JSON cannot store: {exc}") from None


def _timestamp(value: Any, where: str) -> dt.datetime | None:
    if value in (None, ""):
        return None
    try:
        stamp = dt.datetime.fromisoformat(str(value))
    except ValueError:
        raise ImportRefused(where, f"provenance.created {value!r} is not an ISO 8601 time") from None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)


def _display(path: Path) -> str:
    """A path relative to the repository when inside it: what pages show, the same on every machine."""
    path = Path(path).resolve()
    for base in (Path(settings.BASE_DIR).resolve(), config.REPO_ROOT.resolve()):
        try:
            return str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


def _message(exc: Exception) -> str:
    """An engine error's message without the absolute path it starts with."""
    text, where = str(exc), getattr(exc, "where", "")
    return text[len(where) + 2:] if where and text.startswith(f"{where}: ") else text


def _describe(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"missing {exc}"
    return f"{type(exc).__name__}: {exc}"


def engine_check(parse: Callable[[], T], where: str, what: str, lead: str = "",
                 locate: Callable[[str], str] = str) -> T:
    """What an engine parser makes of a document, its refusal as ImportRefused: the engine's own
    message (led by `lead`), or, when the parser broke on something of another shape, that the
    document is not a `what` at all. `locate` may say where in the document the message is about."""
    try:
        return parse()
    except KLineageError as exc:
        raise ImportRefused(where, lead + locate(str(exc))) from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ImportRefused(where, f"not a {what}: {locate(_describe(exc))}") from None


def read_json(path: Path, where: str) -> Any:
    """A committed document file's JSON (checked by its caller); a `.gz` file is decompressed."""
    try:
        return json.loads(read_document_text(path))
    except DocumentError as exc:  # missing, a corrupt .gz, not UTF-8
        raise ImportRefused(where, _message(exc)) from None
    except json.JSONDecodeError as exc:
        raise ImportRefused(where, f"not JSON: {exc}") from None
