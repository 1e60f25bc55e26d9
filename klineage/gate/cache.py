"""The content-addressed gate cache, and the recorded store that replay mode serves.

A verdict is keyed by everything that decides it: kernel, problem, cases, GPU model, toolchain,
policy, the baseline it was timed against and the gate's version. Writes are atomic (temporary
file, then rename), so concurrent workers never read half a verdict.

A live gate is served only final verdicts of its own version: an unsettled timing is stored (replay
shows what was measured) but a later call measures again. Replay also serves what an earlier gate
version recorded, and the verdict says so (`pipeline._served`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from klineage.documents import gzip_packed, unpacked_text
from klineage.errors import DocumentError, ReplayMiss
from klineage.files import write_atomic_bytes
from klineage.fingerprint import sha256_json
from klineage.gate.verdict import GATE_VERSION, Status, Verdict

KEY_VERSION = 1


def verdict_key(*, kernel: str, problem: str, cases: list[str], gpu: str, toolchain: str, policy: str,
                against: str, mode: str, gate: int = GATE_VERSION) -> tuple[str, dict[str, Any]]:
    """The cache key and the facts it was made of (stored with the verdict, for provenance). Gate
    version 1 had no gate part in its keys; leaving it out for version 1 keeps those keys, so its
    recorded verdicts stay findable for replay, and every later version's keys differ from them."""
    parts = {"version": KEY_VERSION, "kernel": kernel, "problem": problem, "cases": sorted(cases), "gpu": gpu,
             "toolchain": toolchain, "policy": policy, "against": against, "mode": mode}
    if gate != 1:
        parts["gate"] = gate
    return sha256_json(parts), parts


def earlier_gate_keys(parts: dict[str, Any]) -> list[str]:
    """The keys the same facts had under each earlier gate version, newest first."""
    facts = {k: v for k, v in parts.items() if k not in ("version", "gate")}
    return [verdict_key(**facts, gate=version)[0] for version in range(parts.get("gate", 1) - 1, 0, -1)]


SERVING_NOTES = ("served_from", "earlier_gate")  # what serving adds to a verdict's provenance; never stored


COMPRESSED, PLAIN = ".json.gz", ".json"
# The order get reads them in: the spelling put writes, then the plain one that older checkouts (and
# GPU hosts running them) write.
SPELLINGS = (COMPRESSED, PLAIN)


def verdict_file_key(path: Path) -> str:
    """The key a verdict file's name gives, whatever its spelling."""
    return next(path.name.removesuffix(s) for s in SPELLINGS if path.name.endswith(s))


def read_verdict_file(path: Path) -> Any:
    """The JSON of one verdict file, whatever its spelling. A missing file raises FileNotFoundError;
    one that is not readable JSON raises DocumentError ("corrupt verdict: ...") naming it."""
    raw = path.read_bytes()
    try:
        return json.loads(unpacked_text(raw, path))
    except DocumentError as exc:  # bad gzip, or not UTF-8
        raise DocumentError(str(path), f"corrupt verdict: {exc.message}") from None
    except json.JSONDecodeError as exc:
        raise DocumentError(str(path), f"corrupt verdict: {exc}") from None


def load_verdict_file(path: Path) -> Verdict:
    """The verdict of one verdict file, whatever its spelling; raises as `read_verdict_file` does, and
    DocumentError for JSON that is not a verdict."""
    return verdict_of(read_verdict_file(path), path)


def verdict_of(data: Any, path: Path) -> Verdict:
    """The verdict that the JSON read from `path` holds; DocumentError naming `path` if it holds none."""
    try:
        return Verdict.from_dict(data)
    except (DocumentError, KeyError, TypeError, ValueError) as exc:  # valid JSON, but not a verdict
        raise DocumentError(str(path), f"corrupt verdict: {exc}") from None


def verdict_bytes(verdict: Verdict) -> bytes:
    """What a .json.gz verdict file holds: the same bytes for the same verdict."""
    return gzip_packed((json.dumps(verdict.to_dict(), indent=1, sort_keys=True) + "\n").encode("utf-8"))


class VerdictStore:
    """One folder of verdicts: `<root>/verdicts/<ab>/<key>.json.gz`, or a plain `<key>.json` as older
    checkouts wrote them. Every reader of the folder finds its files through `files()`."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, key: str, spelling: str = COMPRESSED) -> Path:
        return self.root / "verdicts" / key[:2] / f"{key}{spelling}"

    def files(self) -> list[Path]:
        """Every verdict file, of either spelling, by path; a key stored in both has two."""
        return sorted(p for spelling in SPELLINGS for p in (self.root / "verdicts").glob(f"*/*{spelling}"))

    def keys(self) -> list[str]:
        return sorted({verdict_file_key(p) for p in self.files()})

    def get(self, key: str) -> Verdict | None:
        for spelling in SPELLINGS:
            try:
                return load_verdict_file(self.path(key, spelling))
            except FileNotFoundError:
                continue
        return None

    def put(self, key: str, verdict: Verdict) -> Path:
        """Store `verdict` as the key's verdict; a plain file of the key held an older one, so it goes."""
        path = self._write(key, verdict)
        self.path(key, PLAIN).unlink(missing_ok=True)
        return path

    def _write(self, key: str, verdict: Verdict) -> Path:
        return write_atomic_bytes(self.path(key), verdict_bytes(verdict))

    def compact(self) -> tuple[int, list[tuple[Path, str]]]:
        """Rewrite every plain verdict file as .json.gz: how many were, and each one left as it was,
        with the reason."""
        converted, left = 0, []
        for plain in (p for p in self.files() if p.name.endswith(PLAIN)):
            reason = self._compact_one(plain)
            if reason:
                left.append((plain, reason))
            else:
                converted += 1
        return converted, left

    def _compact_one(self, plain: Path) -> str | None:
        """Rewrite one plain verdict file as .json.gz, removing it only once the .json.gz reads back the
        same document; else say why it stays."""
        key = verdict_file_key(plain)
        if plain != self.path(key, PLAIN):
            return f"misplaced: a verdict with key {key[:12]} belongs in {key[:2]}/"
        try:
            data = read_verdict_file(plain)
            verdict = verdict_of(data, plain)
        except DocumentError as exc:
            return exc.message
        rewritten = verdict.to_dict()
        changed = sorted(k for k in data.keys() | rewritten.keys() if data.get(k) != rewritten.get(k))
        if changed:  # a verdict drops parts it does not know and fills in those it lacks
            return f"rewriting it through the store would change {', '.join(changed)}"
        packed = self.path(key)
        if not packed.exists():
            self._write(key, verdict)
        try:
            same = read_verdict_file(packed) == data
        except DocumentError as exc:
            return f"{packed.name} beside it: {exc.message}"
        if not same:  # get serves the .json.gz: which of the two is right is for a person to say
            return f"{packed.name} beside it holds a different verdict: keep one"
        plain.unlink()
        return None


class GateCache:
    """This machine's cache in front of the committed recorded store."""

    def __init__(self, local: Path | None, recorded: Path | None):
        self.local = VerdictStore(local) if local else None
        self.recorded = VerdictStore(recorded) if recorded else None

    def lookup(self, key: str, final_only: bool = True) -> tuple[Verdict, str] | None:
        """A verdict and where it came from ("cache" or "recorded"). An unsettled timing is not final:
        passed over unless `final_only` is off (replay serves what was measured)."""
        for origin, store in (("cache", self.local), ("recorded", self.recorded)):
            if store is not None:
                verdict = store.get(key)
                if verdict is not None and not (final_only and verdict.unsettled):
                    return verdict, origin
        return None

    def replay(self, key: str, parts: dict[str, Any]) -> tuple[Verdict, str]:
        """The verdict stored for these facts by this gate version, else by the newest earlier one."""
        found = self.lookup(key, final_only=False)
        if found is None:
            found = next(filter(None, (self.lookup(k, final_only=False) for k in earlier_gate_keys(parts))), None)
        if found is not None:
            return found
        raise ReplayMiss(f"no recorded verdict for kernel {parts['kernel'][:12]} on problem {parts['problem'][:12]} "
                         f"(cases {', '.join(parts['cases'])}, GPU {parts['gpu']}, {parts['toolchain']}, "
                         f"policy {parts['policy'][:12]}): replay never guesses; run the gate on a GPU host "
                         f"and commit the recording")

    def keep(self, verdict: Verdict) -> None:
        """Put a verdict that was measured (now or earlier on this machine) into the recorded store,
        as it was measured: the note of where it was served from is not part of it. A recorded
        unsettled timing gives way to a later measurement of the same facts."""
        if self.recorded is None or verdict.status is Status.ERROR:  # an error judged nothing and is never cached
            return
        key = verdict.provenance["key"]
        recorded = self.recorded.get(key)
        if recorded is None or recorded.unsettled:
            data = verdict.to_dict()
            data["provenance"] = {k: v for k, v in data["provenance"].items() if k not in SERVING_NOTES}
            self.recorded.put(key, Verdict.from_dict(data))
        twin = verdict.provenance.get("correctness_from")
        found = self.lookup(twin) if twin else None
        if found is not None:  # the untimed verdict whose correctness this one reports goes with it
            self.keep(found[0])

    def store(self, key: str, verdict: Verdict, record: bool = False) -> None:
        if self.local is not None:
            self.local.put(key, verdict)
        if record and self.recorded is not None:
            self.recorded.put(key, verdict)
