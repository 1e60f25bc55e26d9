"""Lineage documents for the dashboard's tests: the committed dry walk of row_softmax/warp_vec4,
a copy of it with rejected attempts added (the dry walk rejected nothing), and recorded verdicts that
timed the vendor, moved onto a lineage's states (a walk never times the vendor)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from django.conf import settings

from klineage.fingerprint import sha256_text
from klineage.gate.cache import VerdictStore, read_verdict_file

DRY_WALK = Path(settings.BASE_DIR) / "corpus" / "lineages" / "row_softmax_warp_vec4.dry.json"
RECORDED = VerdictStore(Path(settings.BASE_DIR) / "recorded")


def dry_walk() -> dict[str, Any]:
    return json.loads(DRY_WALK.read_text(encoding="utf-8"))


def with_rejections(document: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dry walk plus two rejected attempts: a compile error tried at step 1, an audit mismatch
    tried after the last step. Still a valid lineage (the engine checks it on import)."""
    document = copy.deepcopy(document or dry_walk())
    states = [s["fingerprint"] for s in document["states"]]
    last = len(document["transitions"])
    document["rejections"] = [
        {"step": 1, "parent": states[1], "transform": "vectorize", "category": "compile_error",
         "reason": "compile_error", "cases_failed": [],
         "anchor": {"function": "softmax_row", "kind": "loop", "key": "i#0", "snippet": "for (int i = 0; ...)"},
         "evidence": {"message": "nvcc failed: identifier \"v4\" is undefined", "stage": "compile", "case": "",
                      "log": "kernel.cu(41): error: identifier \"v4\" is undefined\n1 error detected",
                      "worst": {}, "audit": {}}},
        {"step": last, "parent": states[last], "transform": "shuffle_to_shared", "category": "audit_mismatch",
         "reason": None, "cases_failed": [], "anchor": None,
         "evidence": {"message": "the audit does not show the declared removal", "stage": "audit", "case": "",
                      "log": "", "worst": {}, "audit": {"declared": "source softmax_row:warp_shuffle",
                                                        "found": "still present"}}},
    ]
    document["stats"]["rejected"] = 2
    return document


@functools.cache
def _vendor_timed() -> str:
    """A committed passed verdict whose profile timed the vendor beside its kernel, as JSON text (each
    caller parses a copy of its own)."""
    for path in RECORDED.files():
        document = read_verdict_file(path)
        if document["status"] == "passed" and "vs_vendor" in (document.get("profile") or {}).get("ratios", {}):
            return json.dumps(document)
    raise LookupError(f"no recorded verdict under {RECORDED.root} timed the vendor")


def vendor_verdict(fingerprint: str, name: str, overall: float, per_trial: list[float], *,
                   created: str = "2026-11-30T12:00:00+00:00", rejected: bool = False) -> tuple[str, dict[str, Any]]:
    """A key and a verdict document: a recorded one that timed the vendor, moved onto the kernel state
    `fingerprint` (its plan named `name`) with vendor time / state time `overall` and `per_trial`;
    `rejected`, the same rejected by the racecheck."""
    document = json.loads(_vendor_timed())
    document["kernel"] = {"fingerprint": fingerprint, "name": name}
    document["profile"]["ratios"]["vs_vendor"] = {"overall": overall, "per_trial": list(per_trial)}
    if rejected:
        document.update(
            status="rejected",
            reason="race",
            findings=[
                {
                    "reason": "race",
                    "stage": "sanitizer",
                    "message": "racecheck: 1 hazard",
                    "case": "small",
                    "evidence": {},
                }
            ],
        )
    key = sha256_text(json.dumps([fingerprint, overall, per_trial, created, rejected]))
    document["provenance"].update(key=key, created=created)
    return key, document
